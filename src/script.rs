//! The Lua scripts a lock client runs, each with its SHA1 computed once.
//!
//! This module owns the script texts from the spec and their digests. It
//! does not send anything: a connection loads the scripts during its
//! handshake and answers `-NOSCRIPT` itself (see [`crate::conn`]).

/// A Lua script and the hex SHA1 that `EVALSHA` names it by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    source: &'static str,
    sha: [u8; 40],
}

impl Script {
    /// Hashes `source` once.
    pub fn new(source: &'static str) -> Script {
        let digest = sha1_smol::Sha1::from(source).digest().bytes();
        let mut sha = [0u8; 40];
        for (pair, byte) in sha.chunks_exact_mut(2).zip(digest) {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            pair[0] = HEX[usize::from(byte >> 4)];
            pair[1] = HEX[usize::from(byte & 0x0f)];
        }
        Script { source, sha }
    }

    /// The Lua text, as sent by `EVAL` and `SCRIPT LOAD`.
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// The lowercase hex SHA1 of the source, as `EVALSHA` takes it and
    /// `SCRIPT LOAD` returns it.
    pub fn sha(&self) -> &[u8; 40] {
        &self.sha
    }
}

/// Compare-and-delete, from the spec: `KEYS[1]` resource, `ARGV[1]` token.
/// Returns 1 when this token held the key and it was deleted, else 0.
pub const RELEASE_SOURCE: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";

/// Compare-and-pexpire, from the spec: `KEYS[1]` resource, `ARGV[1]` token,
/// `ARGV[2]` the new TTL in milliseconds. Returns 1 when extended, else 0.
pub const EXTEND_SOURCE: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"pexpire\",KEYS[1],ARGV[2]) else return 0 end";

/// Which of the client's scripts a request runs; indexes [`Scripts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptId {
    /// [`RELEASE_SOURCE`].
    Release,
    /// [`EXTEND_SOURCE`].
    Extend,
}

/// Every script the client uses, hashed once per client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scripts {
    release: Script,
    extend: Script,
}

impl Scripts {
    /// Hashes the release and extend scripts.
    pub fn new() -> Scripts {
        Scripts {
            release: Script::new(RELEASE_SOURCE),
            extend: Script::new(EXTEND_SOURCE),
        }
    }

    /// The script `id` names.
    pub fn get(&self, id: ScriptId) -> &Script {
        match id {
            ScriptId::Release => &self.release,
            ScriptId::Extend => &self.extend,
        }
    }

    /// All scripts, in the order a handshake loads them.
    pub fn all(&self) -> [&Script; 2] {
        [&self.release, &self.extend]
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_is_the_lowercase_hex_sha1_of_the_source() {
        // sha1("abc"), a published test vector.
        let script = Script::new("abc");
        assert_eq!(script.sha(), b"a9993e364706816aba3e25717850c26c9cd0d89d");
    }

    #[test]
    fn scripts_are_the_spec_text() {
        let scripts = Scripts::new();
        assert_eq!(
            scripts.get(ScriptId::Release).source(),
            r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end"#
        );
        assert_ne!(
            scripts.get(ScriptId::Release).sha(),
            scripts.get(ScriptId::Extend).sha()
        );
    }
}
