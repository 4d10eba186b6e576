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

/// Fenced acquire, phase one: `SET KEYS[1] ARGV[1] NX PX ARGV[2]` and,
/// atomically with it, the fence value stored at `KEYS[2]` (0 when none).
/// Returns that value when the lock key was set, -1 when it was held.
pub const ACQUIRE_FENCED_SOURCE: &str = "if redis.call(\"set\",KEYS[1],ARGV[1],\"NX\",\"PX\",ARGV[2]) then return tonumber(redis.call(\"get\",KEYS[2]) or \"0\") end return -1";

/// Fenced acquire, phase two: while `KEYS[1]` still holds the token
/// `ARGV[1]`, raises the fence at `KEYS[2]` to `ARGV[2]` (never lowers it)
/// and returns 1; else 0.
pub const FENCE_SOURCE: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then local f = tonumber(redis.call(\"get\",KEYS[2]) or \"0\") if f == nil or tonumber(ARGV[2]) > f then redis.call(\"set\",KEYS[2],ARGV[2]) end return 1 end return 0";

/// Multi-resource acquire: all of `KEYS` set to the token `ARGV[1]` with TTL
/// `ARGV[2]` ms, or none of them when any exists. Returns 1 or 0.
pub const ACQUIRE_MANY_SOURCE: &str = "for i = 1, #KEYS do if redis.call(\"exists\",KEYS[i]) == 1 then return 0 end end for i = 1, #KEYS do redis.call(\"set\",KEYS[i],ARGV[1],\"PX\",ARGV[2]) end return 1";

/// Multi-resource release: deletes each of `KEYS` that holds the token
/// `ARGV[1]`; returns 1 when all of them did, else 0.
pub const RELEASE_MANY_SOURCE: &str = "local all = 1 for i = 1, #KEYS do if redis.call(\"get\",KEYS[i]) == ARGV[1] then redis.call(\"del\",KEYS[i]) else all = 0 end end return all";

/// Multi-resource extend: when every one of `KEYS` holds the token
/// `ARGV[1]`, sets their TTL to `ARGV[2]` ms and returns 1; else changes
/// nothing and returns 0.
pub const EXTEND_MANY_SOURCE: &str = "for i = 1, #KEYS do if redis.call(\"get\",KEYS[i]) ~= ARGV[1] then return 0 end end for i = 1, #KEYS do redis.call(\"pexpire\",KEYS[i],ARGV[2]) end return 1";

/// Which of the client's scripts a request runs; indexes [`Scripts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptId {
    /// [`RELEASE_SOURCE`].
    Release,
    /// [`EXTEND_SOURCE`].
    Extend,
    /// [`ACQUIRE_FENCED_SOURCE`].
    AcquireFenced,
    /// [`FENCE_SOURCE`].
    Fence,
    /// [`ACQUIRE_MANY_SOURCE`].
    AcquireMany,
    /// [`RELEASE_MANY_SOURCE`].
    ReleaseMany,
    /// [`EXTEND_MANY_SOURCE`].
    ExtendMany,
}

/// Every script the client uses, hashed once per client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scripts {
    all: [Script; 7],
}

impl Scripts {
    /// Hashes every script.
    pub fn new() -> Scripts {
        Scripts {
            all: [
                Script::new(RELEASE_SOURCE),
                Script::new(EXTEND_SOURCE),
                Script::new(ACQUIRE_FENCED_SOURCE),
                Script::new(FENCE_SOURCE),
                Script::new(ACQUIRE_MANY_SOURCE),
                Script::new(RELEASE_MANY_SOURCE),
                Script::new(EXTEND_MANY_SOURCE),
            ],
        }
    }

    /// The script `id` names.
    pub fn get(&self, id: ScriptId) -> &Script {
        &self.all[id as usize]
    }

    /// All scripts, in the order a handshake loads them.
    pub fn all(&self) -> &[Script] {
        &self.all
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
