//! The Lua scripts a lock client runs, each with its SHA1 computed once.
//!
//! This module owns the script texts from the spec and their digests. It
//! does not send anything: a connection loads the scripts during its
//! handshake and answers `-NOSCRIPT` itself.
//!
//! Public so that callers can see what runs on their masters: the sources
//! are the wire contract (a key this crate set can be released or checked
//! by the same script from any client), and [`FENCE_STATE_KEY`] is the key
//! a fenced acquire keeps its counter in. Which scripts a connection loads
//! is the crate's business.

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
/// A deletion is also published, the token as the message, on the
/// resource's [`release_channel`], so that waiters subscribed there try
/// again at once. An optional `ARGV[2]` names the process whose turn it
/// is to try next (a shared client's announced release: the id of a
/// waiting process, 16 hex digits of its tokens as a decimal integer): the
/// message is then the token, `:`, and that id. The compare-and-delete is the spec's: other Redlock
/// clients' releases (which do not publish) and ours exclude each other as
/// before. The publish is only a hint, made with `redis.pcall`: a user
/// without rights on the channel (Redis 7's ACL default for a new user)
/// still releases, and a multi-key release never stops halfway; where the
/// publish is refused, waiters learn of the release by the key's expiry.
/// One script for every master and user, rather than a non-publishing
/// variant chosen per master: nothing to learn or remember, and the
/// compare-and-delete is the same everywhere.
pub const RELEASE_SOURCE: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then redis.call(\"del\",KEYS[1]) local m = ARGV[1] if ARGV[2] then m = m..\":\"..ARGV[2] end redis.pcall(\"publish\",\"redlock:released:\"..KEYS[1],m) return 1 else return 0 end";

/// The prefix of a resource's release channel: see [`release_channel`].
pub const RELEASE_CHANNEL_PREFIX: &[u8] = b"redlock:released:";

/// The channel a release of `resource` is published on by
/// [`RELEASE_SOURCE`] and [`RELEASE_MANY_SOURCE`]: `redlock:released:`
/// followed by the resource, byte for byte. Derived from the key alone, so
/// that every client of the same masters agrees on it.
pub fn release_channel(resource: &[u8]) -> Vec<u8> {
    let mut channel = Vec::with_capacity(RELEASE_CHANNEL_PREFIX.len() + resource.len());
    channel.extend_from_slice(RELEASE_CHANNEL_PREFIX);
    channel.extend_from_slice(resource);
    channel
}

/// A waiting acquire's attempt: `SET KEYS[1] ARGV[1] NX PX ARGV[2]`, and,
/// when the key is held, the key's remaining time and its value,
/// atomically with the refusal, so that the waiter knows when it can
/// expire and whose it is. Returns 1 when set; else the array of minus the
/// key's `PTTL` in milliseconds (0 when the key has no expiry, or expires
/// within the millisecond) and the key's value (empty when it is not a
/// string). The value tells one holder refusing on a quorum, who will
/// release, from racers that each took a master (a split), who will each
/// clean up. With a third argument (any), a refusal is also published on
/// the resource's [`release_channel`], as [`WAITING_MARK`] followed by
/// the token (with `redis.pcall`, a hint as a release's is): every process
/// waiting there learns that the token's process waits too, and gives it
/// its turn (see [`Config::wake_spread`](crate::Config::wake_spread)). A
/// client asks for it while it does not know itself seated.
pub const ACQUIRE_WAIT_SOURCE: &str = "if redis.call(\"set\",KEYS[1],ARGV[1],\"NX\",\"PX\",ARGV[2]) then return 1 end local t = redis.call(\"pttl\",KEYS[1]) if t < 0 then t = 0 end local v = redis.pcall(\"get\",KEYS[1]) if type(v) ~= \"string\" then v = \"\" end if ARGV[3] then redis.pcall(\"publish\",\"redlock:released:\"..KEYS[1],\"?\"..ARGV[1]) end return {-t, v}";

/// The first byte of a message [`ACQUIRE_WAIT_SOURCE`] publishes when
/// refused: the rest is the refused token. No token this crate mints starts with it, so
/// its releases' messages (the bare token) are never taken for one.
pub const WAITING_MARK: u8 = b'?';

/// Compare-and-pexpire, from the spec: `KEYS[1]` resource, `ARGV[1]` token,
/// `ARGV[2]` the new TTL in milliseconds. Returns 1 when extended, else 0.
pub const EXTEND_SOURCE: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"pexpire\",KEYS[1],ARGV[2]) else return 0 end";

/// The key, on every master, holding that master's fencing state: a hash
/// with `marked` (present while the master has kept its data since it was
/// marked), `floor` (a lower bound for every fence it reports, set when it
/// was readmitted after losing its data), `high` (the largest fence ever
/// written to it, for any resource) and `since` (while unmarked: the
/// master's clock, in ms, when a fenced acquire first found it unmarked).
/// A master that loses its data loses this key with every fence, which is
/// how the loss shows.
pub const FENCE_STATE_KEY: &[u8] = b"redlock-mio:fence-state";

/// Fenced acquire, phase one. `KEYS[1]` the lock, `KEYS[2]` the resource's
/// fence, `KEYS[3]` [`FENCE_STATE_KEY`]; `ARGV[1]` the token, `ARGV[2]` the
/// TTL in ms. Does `SET KEYS[1] ARGV[1] NX PX ARGV[2]`. When the key was
/// held, returns what [`ACQUIRE_WAIT_SOURCE`] does: minus the key's `PTTL`
/// and its value (a waiter sleeps until then), and with `ARGV[3]`
/// publishes its notice as that script does. Otherwise, atomically with
/// the SET, returns what the master knows of the fence:
/// `{reading, standing, high, unmarked_ms}`.
///
/// - Marked master (standing 2): reading = max(fence, floor), `high` its
///   largest fence for any resource, `unmarked_ms` -1.
/// - Unmarked, but holding this resource's fence (standing 1): the fence,
///   written back since the master lost its data. `high` 0.
/// - Unmarked, no fence for this resource (standing 0): reading 0, which
///   may be a lost value. `high` 0.
///
/// An unmarked master's `since` is set the first time it is seen so, and
/// `unmarked_ms` is its age by the master's clock.
pub const ACQUIRE_FENCED_SOURCE: &str = r#"if not redis.call("set",KEYS[1],ARGV[1],"NX","PX",ARGV[2]) then local t = redis.call("pttl",KEYS[1]) if t < 0 then t = 0 end local v = redis.pcall("get",KEYS[1]) if type(v) ~= "string" then v = "" end if ARGV[3] then redis.pcall("publish","redlock:released:"..KEYS[1],"?"..ARGV[1]) end return {-t, v} end
local fence = tonumber(redis.call("get",KEYS[2]))
local s = redis.call("hmget",KEYS[3],"marked","floor","high","since")
if s[1] then return {math.max(fence or 0, tonumber(s[2]) or 0), 2, tonumber(s[3]) or 0, -1} end
local t = redis.call("time")
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local since = tonumber(s[4])
if not since then since = now redis.call("hset",KEYS[3],"since",now) end
if fence then return {fence, 1, 0, now - since} end
return {0, 0, 0, now - since}"#;

/// Fenced acquire, phase two. `KEYS[1]` the lock, `KEYS[2]` the resource's
/// fence, `KEYS[3]` [`FENCE_STATE_KEY`]; `ARGV[1]` the directive, `ARGV[2]`
/// the token, `ARGV[3]` the fence. (The request carries the directive as a
/// fourth "key" that is not declared as one: an ACL key pattern need not
/// match it.) While `KEYS[1]` still holds the token: raises the
/// resource's fence and the master's `high` to `ARGV[2]` (never lowers
/// them) and returns 1; else changes nothing and returns 0. On an unmarked
/// master it also applies the directive:
///
/// - `bootstrap`: marks it (the client saw every master unmarked: a fresh
///   deployment).
/// - `readmit:<ms>`: marks it with `floor` = `ARGV[2]` if it has been seen
///   unmarked for at least `<ms>` by its own clock (the client made the
///   fence larger than the `high` of a quorum of marked masters).
/// - anything else: nothing.
pub const FENCE_SOURCE: &str = r#"if redis.call("get",KEYS[1]) ~= ARGV[2] then return 0 end
local v = tonumber(ARGV[3])
local f = tonumber(redis.call("get",KEYS[2]))
if not f or v > f then redis.call("set",KEYS[2],ARGV[3]) end
local s = redis.call("hmget",KEYS[3],"marked","high","since")
if not s[1] then
local admit = ARGV[1] == "bootstrap"
local wait = tonumber(string.match(ARGV[1], "^readmit:(%d+)$"))
if wait and s[3] then
local t = redis.call("time")
admit = t[1] * 1000 + math.floor(t[2] / 1000) - tonumber(s[3]) >= wait
if admit then redis.call("hset",KEYS[3],"floor",ARGV[3]) end
end
if admit then redis.call("hset",KEYS[3],"marked","1") redis.call("hdel",KEYS[3],"since") end
end
if not tonumber(s[2]) or v > tonumber(s[2]) then redis.call("hset",KEYS[3],"high",ARGV[3]) end
return 1"#;

/// Multi-resource acquire: all of `KEYS` set to the token `ARGV[1]` with TTL
/// `ARGV[2]` ms, or none of them when any exists. Returns 1 when set; else,
/// as [`ACQUIRE_WAIT_SOURCE`] does, minus the longest `PTTL` among the keys
/// that exist (0 for one with no expiry) and that key's value (the first
/// such key's, on a tie): a waiter sleeps until the last of them expires.
pub const ACQUIRE_MANY_SOURCE: &str = "local t = -1 local h for i = 1, #KEYS do local p = redis.call(\"pttl\",KEYS[i]) if p ~= -2 then if p < 0 then p = 0 end if p > t then t = p h = KEYS[i] end end end if t >= 0 then local v = redis.pcall(\"get\",h) if type(v) ~= \"string\" then v = \"\" end return {-t, v} end for i = 1, #KEYS do redis.call(\"set\",KEYS[i],ARGV[1],\"PX\",ARGV[2]) end return 1";

/// Multi-resource release: deletes each of `KEYS` that holds the token
/// `ARGV[1]`, publishing each deletion on that key's [`release_channel`];
/// returns 1 when all of them did, else 0.
pub const RELEASE_MANY_SOURCE: &str = "local all = 1 for i = 1, #KEYS do if redis.call(\"get\",KEYS[i]) == ARGV[1] then redis.call(\"del\",KEYS[i]) redis.pcall(\"publish\",\"redlock:released:\"..KEYS[i],ARGV[1]) else all = 0 end end return all";

/// The cleanup of an acquire attempt that found the lock held elsewhere
/// (refused, or refused and failed, by a quorum): the spec's
/// compare-and-delete, publishing nothing. Such an attempt never held the
/// resource (its keys sit on a minority of masters, but for a reply lost
/// on the way back, where a waiter elsewhere then waits for this key's
/// expiry), so no waiter waits for it; a publish would wake the waiters of other processes, whose next
/// attempts would be refused as this one was, and their cleanups would
/// wake this one's process again: a storm at round-trip rate until the
/// holder's keys expire (found by the simulator).
pub const CLEANUP_SOURCE: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";

/// [`CLEANUP_SOURCE`] for a multi-resource attempt: deletes each of `KEYS`
/// that holds the token `ARGV[1]`, publishing nothing; returns 1 when all
/// of them did, else 0.
pub const CLEANUP_MANY_SOURCE: &str = "local all = 1 for i = 1, #KEYS do if redis.call(\"get\",KEYS[i]) == ARGV[1] then redis.call(\"del\",KEYS[i]) else all = 0 end end return all";

/// Multi-resource extend: when every one of `KEYS` holds the token
/// `ARGV[1]`, sets their TTL to `ARGV[2]` ms and returns 1; else changes
/// nothing and returns 0.
pub const EXTEND_MANY_SOURCE: &str = "for i = 1, #KEYS do if redis.call(\"get\",KEYS[i]) ~= ARGV[1] then return 0 end end for i = 1, #KEYS do redis.call(\"pexpire\",KEYS[i],ARGV[2]) end return 1";

/// Which of the client's scripts a request runs; indexes [`Scripts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScriptId {
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
    /// [`ACQUIRE_WAIT_SOURCE`].
    AcquireWait,
    /// [`CLEANUP_SOURCE`].
    Cleanup,
    /// [`CLEANUP_MANY_SOURCE`].
    CleanupMany,
}

/// Every script the client uses, hashed once per client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scripts {
    all: [Script; 10],
}

impl Scripts {
    /// Hashes every script.
    pub(crate) fn new() -> Scripts {
        Scripts {
            all: [
                Script::new(RELEASE_SOURCE),
                Script::new(EXTEND_SOURCE),
                Script::new(ACQUIRE_FENCED_SOURCE),
                Script::new(FENCE_SOURCE),
                Script::new(ACQUIRE_MANY_SOURCE),
                Script::new(RELEASE_MANY_SOURCE),
                Script::new(EXTEND_MANY_SOURCE),
                Script::new(ACQUIRE_WAIT_SOURCE),
                Script::new(CLEANUP_SOURCE),
                Script::new(CLEANUP_MANY_SOURCE),
            ],
        }
    }

    /// The script `id` names.
    pub(crate) fn get(&self, id: ScriptId) -> &Script {
        &self.all[id as usize]
    }

    /// All scripts, in the order a handshake loads them.
    pub(crate) fn all(&self) -> &[Script] {
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
        // The spec's compare-and-delete, and the publish on the channel
        // `release_channel` names: the token, and the process named to
        // try next when there is one.
        assert_eq!(
            scripts.get(ScriptId::Release).source(),
            r#"if redis.call("get",KEYS[1]) == ARGV[1] then redis.call("del",KEYS[1]) local m = ARGV[1] if ARGV[2] then m = m..":"..ARGV[2] end redis.pcall("publish","redlock:released:"..KEYS[1],m) return 1 else return 0 end"#
        );
        assert_eq!(release_channel(b"orders:42"), b"redlock:released:orders:42");
        assert!(
            RELEASE_SOURCE.contains(std::str::from_utf8(RELEASE_CHANNEL_PREFIX).unwrap())
                && RELEASE_MANY_SOURCE
                    .contains(std::str::from_utf8(RELEASE_CHANNEL_PREFIX).unwrap())
        );
        assert_ne!(
            scripts.get(ScriptId::Release).sha(),
            scripts.get(ScriptId::Extend).sha()
        );
    }
}
