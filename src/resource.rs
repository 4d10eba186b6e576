//! What a lock may be named by: [`ResourceName`], the bytes of a key.
//!
//! This module owns the conversion only. Owned names (`String`,
//! `Vec<u8>`, `Bytes`) move in without a copy, so that a caller who keeps
//! its names as [`Bytes`] allocates nothing per operation; borrowed ones
//! (`&str`, `&String`, `&[u8]`, `&Bytes`) are copied once, so that a name
//! built at run time (`format!("player:{id}")`) can be passed by
//! reference. Whether a name is acceptable (not empty) is the job's to
//! check, where every operation's inputs are.

use bytes::Bytes;

/// A lock's resource name: the key it sets on every master.
///
/// ```
/// # fn names(id: u64) {
/// use redlock_mio::ResourceName;
/// let owned = format!("player:{id}");
/// let _ = (&owned).into_name(); // copied
/// let _ = owned.into_name(); // moved
/// let _ = "ledger".into_name(); // copied
/// let _ = bytes::Bytes::from_static(b"hot").into_name(); // no copy
/// # }
/// ```
pub trait ResourceName {
    /// The name's bytes.
    fn into_name(self) -> Bytes;
}

impl ResourceName for Bytes {
    fn into_name(self) -> Bytes {
        self
    }
}

impl ResourceName for &Bytes {
    fn into_name(self) -> Bytes {
        self.clone()
    }
}

impl ResourceName for String {
    fn into_name(self) -> Bytes {
        Bytes::from(self)
    }
}

impl ResourceName for Vec<u8> {
    fn into_name(self) -> Bytes {
        Bytes::from(self)
    }
}

impl ResourceName for &str {
    fn into_name(self) -> Bytes {
        Bytes::copy_from_slice(self.as_bytes())
    }
}

impl ResourceName for &String {
    fn into_name(self) -> Bytes {
        Bytes::copy_from_slice(self.as_bytes())
    }
}

impl ResourceName for &[u8] {
    fn into_name(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

impl ResourceName for &Vec<u8> {
    fn into_name(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

impl<const N: usize> ResourceName for &[u8; N] {
    fn into_name(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_name_gives_its_bytes() {
        let text = String::from("player:7");
        let raw = b"player:7".to_vec();
        let shared = Bytes::from_static(b"player:7");
        let names = [
            (&text).into_name(),
            text.clone().into_name(),
            text.as_str().into_name(),
            (&raw).into_name(),
            raw.as_slice().into_name(),
            raw.clone().into_name(),
            b"player:7".into_name(),
            (&shared).into_name(),
            shared.clone().into_name(),
        ];
        for name in names {
            assert_eq!(name, shared);
        }
    }

    #[test]
    fn owned_names_move_in_without_a_copy() {
        let text = String::from("player:7");
        let at = text.as_ptr();
        assert_eq!(text.into_name().as_ptr(), at);
        let shared = Bytes::from(vec![1u8, 2, 3]);
        let at = shared.as_ptr();
        assert_eq!((&shared).into_name().as_ptr(), at);
    }
}
