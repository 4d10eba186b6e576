//! A fast, fixed hasher: the Fx hash rustc uses. For the waiters' channel
//! table (keyed by the application's own resource names, looked up several
//! times per turn of the loop), and the simulation's tables (the model's
//! keyspace and scripts, the world's token sets). Fixed, so that a run is
//! the same whatever the process (no random seed: a simulated run replays),
//! and cheap. Not for keys a remote party chooses: nothing here resists
//! collisions made on purpose (nor did SipHash with the fixed keys the
//! channel table had before, whose collisions anyone can compute).

use std::hash::{BuildHasherDefault, Hasher};

/// Builds [`FxHasher`]s.
pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;

/// A hash map with [`FxHasher`].
pub(crate) type FxMap<K, V> = std::collections::HashMap<K, V, FxBuild>;

/// A hash set with [`FxHasher`].
#[cfg(any(test, redlock_sim))]
pub(crate) type FxSet<T> = std::collections::HashSet<T, FxBuild>;

/// The Fx hash: a rotate, a xor and a multiply per word.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const SEED: u64 = 0x517c_c1b7_2722_0a95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    /// The state folded (the two halves of its product with the seed,
    /// xored) so that every bit of it reaches the low bits a table picks
    /// its bucket with: a multiply carries a word's high bytes into the
    /// high bits only, so names that differ there (`resource-0000001`
    /// and `resource-0000002` differ in the last byte of their second
    /// word) would otherwise share a bucket and make a table a list.
    #[inline]
    fn finish(&self) -> u64 {
        let product = u128::from(self.0) * u128::from(SEED);
        (product as u64) ^ ((product >> 64) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// Names that differ only in a word's high bytes spread over the
    /// buckets (the low bits a hash table indexes by). Without the fold in
    /// `finish`, all 256 of them share one bucket of 256.
    #[test]
    fn names_differing_in_a_words_high_bytes_spread_over_the_buckets() {
        let build = FxBuild::default();
        let mut buckets = std::collections::HashSet::new();
        for n in 0..256 {
            let name = format!("resource-{n:07}");
            buckets.insert(build.hash_one(name.as_bytes()) & 255);
        }
        assert!(buckets.len() > 128, "{} buckets of 256", buckets.len());
    }

    #[test]
    fn equal_keys_hash_alike_and_near_keys_apart() {
        let build = FxBuild::default();
        let hash = |key: &[u8]| build.hash_one(key);
        assert_eq!(hash(b"redlock:r0"), hash(b"redlock:r0"));
        let keys: [&[u8]; 6] = [b"", b"r", b"r0", b"r1", b"r0\0", b"0123456789abcdef0"];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(hash(a), hash(b), "{a:?} {b:?}");
            }
        }
    }
}
