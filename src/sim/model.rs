//! A model of one Redis master for the simulator: what a
//! redis-server 7.0 answers to everything this client sends, reply type
//! for reply type and error text for error text, and what the newer
//! servers add for locks, each as a [`Flavour`]: `SET ... IFEQ`
//! (Valkey 8.1+, Redis 8.4+), `DELIFEQ` (Valkey 9.0+) and `DELEX ... IFEQ`
//! (Redis 8.4+), and `COMMAND DOCS` telling which a master has. A command
//! a flavour lacks gets the unknown-command or syntax error every server
//! gives for it; other error texts are Redis 7.0's whatever the flavour.
//!
//! [`Master`] owns one master's state: 16 databases of strings and hashes
//! with PX expiry on the master's own clock, the script cache (each script
//! of [`crate::script`] run natively, keyed by its SHA1, step by step as
//! its Lua would, errors included), pub/sub, each connection's AUTH,
//! SELECT and subscriptions, and the faults a simulator injects (restart,
//! script flush, refusals an ACL would make, scripting or `COMMAND` denied
//! included, the EVAL script LRU of Redis 7.4+). It is sans-IO and pure: commands in, replies out, the clock
//! passed in as milliseconds with every call; it opens no socket, reads no
//! clock, and panics on no input (a malformed command gets the error reply
//! Redis gives). `tests/model.rs` keeps it honest against real servers.

mod docs;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};

use crate::resp::{Reply, format_i64};
use crate::script::{self, RELEASE_CHANNEL_PREFIX, Script, ScriptId};

/// Maps with a fixed hasher: the same run gives the same memory layout,
/// with nothing read from the OS; a fast one, as every command looks keys
/// up.
type Map<K, V> = crate::hash::FxMap<K, V>;

/// How many databases a master has (`databases 16`, the default).
pub const DATABASES: usize = 16;

/// How many EVAL-created scripts Redis 7.4+ and Valkey 8 keep before
/// evicting the least recently used one ([`Settings::eval_lru`]).
pub const EVAL_LRU_CAPACITY: usize = 500;

/// The version [`Master`] reports in `INFO server` as [`Flavour::Redis70`],
/// and answers as.
pub const REDIS_VERSION: &str = "7.0.15";

/// Which server a [`Master`] answers as: the commands for locks it has
/// beyond Redis 7.0's. Every flavour answers everything else as Redis 7.0
/// does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Flavour {
    /// Redis 7.0 (and 8.2): no compare-and-set, no compare-and-delete.
    #[default]
    Redis70,
    /// Valkey 8.1: `SET key value IFEQ cmp`.
    Valkey81,
    /// Valkey 9.1: `SET ... IFEQ` and `DELIFEQ key value`.
    Valkey91,
    /// Redis 8.4: `SET ... IFEQ|IFNE|IFDEQ|IFDNE` and `DELEX key
    /// [IFEQ|IFNE|IFDEQ|IFDNE value]`. The digest conditions get an error
    /// saying the model cannot compute digests.
    Redis84,
}

impl Flavour {
    /// Every flavour, the default first.
    pub const ALL: [Flavour; 4] = [
        Flavour::Redis70,
        Flavour::Valkey81,
        Flavour::Valkey91,
        Flavour::Redis84,
    ];

    /// Whether `SET` takes `IFEQ`.
    #[must_use]
    pub fn has_set_ifeq(self) -> bool {
        self != Flavour::Redis70
    }

    /// Whether there is `DELIFEQ`.
    #[must_use]
    pub fn has_delifeq(self) -> bool {
        self == Flavour::Valkey91
    }

    /// Whether there is `DELEX`, and `SET` takes `IFNE`, `IFDEQ` and
    /// `IFDNE`.
    #[must_use]
    pub fn has_delex(self) -> bool {
        self == Flavour::Redis84
    }

    /// The server and version it answers as, as `INFO server` names them:
    /// Valkey by its own version (and the Redis one it claims).
    #[must_use]
    pub fn version(self) -> (&'static str, &'static str) {
        match self {
            Flavour::Redis70 => ("redis", REDIS_VERSION),
            Flavour::Valkey81 => ("valkey", "8.1.8"),
            Flavour::Valkey91 => ("valkey", "9.1.2"),
            Flavour::Redis84 => ("redis", "8.4.0"),
        }
    }

    /// Whether a master of this flavour has `cmd`.
    fn knows(self, cmd: Cmd) -> bool {
        match cmd {
            Cmd::Delifeq => self.has_delifeq(),
            Cmd::Delex => self.has_delex(),
            _ => true,
        }
    }
}

/// What a `PUBLISH` run by a script whose user may not publish to the
/// channel fails with (Redis 7.0): `redis.call` raises it (the script's
/// reply is then this text, then ` script: <sha>, on @user_script:<line>.`),
/// `redis.pcall` returns it to the script as the table `{err = ...}`. The
/// release scripts publish with `pcall` and ignore the result, so a
/// refused publish still releases.
pub const SCRIPT_PUBLISH_REFUSED: &str =
    "ERR The user executing the script can't publish to the channel mentioned in the command";

/// A frame the master writes, as the model makes it: the two a master of
/// contended locks writes most, a refusal and a release message, without
/// a [`Reply`] tree to build, write and drop (the simulator writes them
/// straight to the wire); anything else as its reply.
/// [`Frame::into_reply`] is the reply a client reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A waiting script's refusal: `*2`, then minus the holder's `left`
    /// ms, then the value it holds.
    Refusal { left: i64, holder: Bytes },
    /// A pub/sub message: `*3`, then `message`, the channel, the payload.
    Message { channel: Bytes, payload: Bytes },
    /// Any other reply.
    Reply(Reply),
}

impl Frame {
    /// The reply a client reads in this frame.
    pub(crate) fn into_reply(self) -> Reply {
        match self {
            Frame::Refusal { left, holder } => {
                Reply::Array(vec![Reply::Integer(-left), Reply::Bulk(holder)])
            }
            Frame::Message { channel, payload } => Reply::Array(vec![
                Reply::Bulk(Bytes::from_static(b"message")),
                Reply::Bulk(channel),
                Reply::Bulk(payload),
            ]),
            Frame::Reply(reply) => reply,
        }
    }

    fn is_error(&self) -> bool {
        matches!(self, Frame::Reply(Reply::Error(_)))
    }
}

impl From<Reply> for Frame {
    fn from(reply: Reply) -> Frame {
        Frame::Reply(reply)
    }
}

/// One client connection to the master, numbered by the simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// How the master is configured: its password, its users, and what an ACL
/// would refuse. Plain settings, changed at any time through
/// [`Master::settings_mut`]; the refusals apply to every connection (the
/// simulator's masters each have one user).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `requirepass`: the default user's password. Connections must AUTH
    /// first (`-NOAUTH`); without it they start authenticated.
    pub requirepass: Option<Bytes>,
    /// Named users and their passwords, for `AUTH user password`.
    pub users: Vec<(Bytes, Bytes)>,
    /// No right on channels to publish: `PUBLISH` gets `-NOPERM`, and the
    /// release scripts' `redis.pcall("publish", ...)` gets
    /// [`SCRIPT_PUBLISH_REFUSED`] back (they release, publishing nothing).
    pub deny_publish: bool,
    /// No right on channels to subscribe: `SUBSCRIBE` gets `-NOPERM`.
    pub deny_subscribe: bool,
    /// `-info`: `INFO` gets `-NOPERM`.
    pub deny_info: bool,
    /// `-script|load`: `SCRIPT LOAD` gets `-NOPERM`.
    pub deny_script_load: bool,
    /// `-@scripting`: `EVAL`, `EVALSHA`, `SCRIPT LOAD`, `SCRIPT EXISTS` and
    /// `SCRIPT FLUSH` get `-NOPERM` (the least-privileged lock user of a
    /// server with native commands).
    pub deny_scripting: bool,
    /// `-command`: `COMMAND` and `COMMAND DOCS` get `-NOPERM`.
    pub deny_command: bool,
    /// The server the master answers as.
    pub flavour: Flavour,
    /// Evict EVAL-created scripts beyond [`EVAL_LRU_CAPACITY`], least
    /// recently used first, as Redis 7.4+ and Valkey 8 do; Redis 7.0 never
    /// evicts. Scripts made by `SCRIPT LOAD` are never evicted.
    pub eval_lru: bool,
}

/// Where the master copies the byte strings it keeps or sends (values,
/// key and channel names, messages): into one shared block after another,
/// so that a copy allocates once a block, not once a string, and a clone
/// (a refusal's holder, a message for each subscriber) only counts a
/// reference. A block is freed with its last string.
#[derive(Debug, Default)]
struct Arena {
    block: BytesMut,
}

/// The bytes of an arena block; a longer string is copied on its own.
const ARENA_BLOCK: usize = 4096;

impl Arena {
    /// A shared copy of `bytes`.
    fn copy(&mut self, bytes: &[u8]) -> Bytes {
        self.concat(&[bytes])
    }

    /// `parts`, one after the other, as one shared string.
    fn concat(&mut self, parts: &[&[u8]]) -> Bytes {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len == 0 {
            return Bytes::new();
        }
        if len > ARENA_BLOCK / 4 {
            return Bytes::from(parts.concat());
        }
        if self.block.capacity() < len {
            self.block = BytesMut::with_capacity(ARENA_BLOCK);
        }
        for part in parts {
            self.block.extend_from_slice(part);
        }
        self.block.split().freeze()
    }
}

/// A value stored at a key.
#[derive(Debug, Clone)]
enum Value {
    Str(Bytes),
    /// Fields in insertion order, as a small Redis hash (a listpack) keeps
    /// them.
    Hash(Vec<(Bytes, Bytes)>),
}

#[derive(Debug, Clone)]
struct Entry {
    value: Value,
    /// Unix time in ms by the master's clock, as Redis stores it.
    expires_at: Option<i64>,
}

impl Entry {
    /// Redis expires a key once its time is strictly past.
    fn expired(&self, now: i64) -> bool {
        self.expires_at.is_some_and(|at| now > at)
    }
}

/// One connection's state on the master.
#[derive(Debug, Clone, Default)]
struct Session {
    db: usize,
    authenticated: bool,
    name: Option<Bytes>,
    /// Subscribed channels, in the order subscribed.
    channels: Vec<Bytes>,
}

/// A script's SHA as the script cache keys it: 40 lowercase hex digits,
/// random ones. Its first eight hash it (the Fx hash of all forty takes
/// six rounds), and equality compares five words, with no call.
#[derive(Debug, Clone, Copy)]
struct Sha([u8; 40]);

impl Sha {
    fn words(&self) -> [u64; 5] {
        std::array::from_fn(|i| {
            let mut word = [0; 8];
            word.copy_from_slice(&self.0[i * 8..i * 8 + 8]);
            u64::from_le_bytes(word)
        })
    }
}

impl PartialEq for Sha {
    fn eq(&self, other: &Sha) -> bool {
        let differ = self
            .words()
            .iter()
            .zip(other.words())
            .fold(0, |d, (a, b)| d | (a ^ b));
        differ == 0
    }
}

impl Eq for Sha {}

impl std::hash::Hash for Sha {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.words()[0]);
    }
}

/// A script in the cache.
#[derive(Debug, Clone, Copy)]
struct Cached {
    /// Which of the client's scripts it is; `None` for one the model
    /// stores but cannot run.
    native: Option<ScriptId>,
    /// Its place in the EVAL LRU: `Some` for a script EVAL created and no
    /// SCRIPT LOAD has loaded since.
    lru: Option<u64>,
}

/// `INFO commandstats` counts for one command.
#[derive(Debug, Clone, Copy, Default)]
struct CallCount {
    calls: u64,
    rejected: u64,
    failed: u64,
}

/// The commands the model knows, container subcommands spelled out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmd {
    Auth,
    Client,
    ClientGetname,
    ClientSetname,
    Command,
    CommandDocs,
    Del,
    Delex,
    Delifeq,
    Eval,
    Evalsha,
    Exists,
    Get,
    Hgetall,
    Info,
    Pexpire,
    Ping,
    Pttl,
    Publish,
    Pubsub,
    PubsubNumsub,
    Script,
    ScriptExists,
    ScriptFlush,
    ScriptLoad,
    Select,
    Set,
    Subscribe,
    Unsubscribe,
}

const CMD_COUNT: usize = 29;

impl Cmd {
    const ALL: [Cmd; CMD_COUNT] = [
        Cmd::Auth,
        Cmd::Client,
        Cmd::ClientGetname,
        Cmd::ClientSetname,
        Cmd::Command,
        Cmd::CommandDocs,
        Cmd::Del,
        Cmd::Delex,
        Cmd::Delifeq,
        Cmd::Eval,
        Cmd::Evalsha,
        Cmd::Exists,
        Cmd::Get,
        Cmd::Hgetall,
        Cmd::Info,
        Cmd::Pexpire,
        Cmd::Ping,
        Cmd::Pttl,
        Cmd::Publish,
        Cmd::Pubsub,
        Cmd::PubsubNumsub,
        Cmd::Script,
        Cmd::ScriptExists,
        Cmd::ScriptFlush,
        Cmd::ScriptLoad,
        Cmd::Select,
        Cmd::Set,
        Cmd::Subscribe,
        Cmd::Unsubscribe,
    ];

    /// The full name Redis 7.0 reports and its arity (negative: at least).
    fn spec(self) -> (&'static str, i32) {
        match self {
            Cmd::Auth => ("auth", -2),
            Cmd::Client => ("client", -2),
            Cmd::ClientGetname => ("client|getname", 2),
            Cmd::ClientSetname => ("client|setname", 3),
            Cmd::Command => ("command", -1),
            Cmd::CommandDocs => ("command|docs", -2),
            Cmd::Del => ("del", -2),
            Cmd::Delex => ("delex", -2),
            Cmd::Delifeq => ("delifeq", 3),
            Cmd::Eval => ("eval", -3),
            Cmd::Evalsha => ("evalsha", -3),
            Cmd::Exists => ("exists", -2),
            Cmd::Get => ("get", 2),
            Cmd::Hgetall => ("hgetall", 2),
            Cmd::Info => ("info", -1),
            Cmd::Pexpire => ("pexpire", -3),
            Cmd::Ping => ("ping", -1),
            Cmd::Pttl => ("pttl", 2),
            Cmd::Publish => ("publish", 3),
            Cmd::Pubsub => ("pubsub", -2),
            Cmd::PubsubNumsub => ("pubsub|numsub", -2),
            Cmd::Script => ("script", -2),
            Cmd::ScriptExists => ("script|exists", -3),
            Cmd::ScriptFlush => ("script|flush", -2),
            Cmd::ScriptLoad => ("script|load", 3),
            Cmd::Select => ("select", 2),
            Cmd::Set => ("set", -3),
            Cmd::Subscribe => ("subscribe", -2),
            Cmd::Unsubscribe => ("unsubscribe", -1),
        }
    }
}

// Error texts, as Redis 7.0 words them.
const ERR_EMPTY: &str = "ERR empty command (Redis answers nothing to one)";
const ERR_SYNTAX: &str = "ERR syntax error";
const ERR_NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const ERR_INT_RANGE: &str =
    "ERR value is out of range, value must between -2147483648 and 2147483647";
const ERR_DB_RANGE: &str = "ERR DB index is out of range";
const ERR_WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const ERR_EXPIRE_SET: &str = "ERR invalid expire time in 'set' command";
const ERR_EXPIRE_PEXPIRE: &str = "ERR invalid expire time in 'pexpire' command";
const ERR_NOAUTH: &str = "NOAUTH Authentication required.";
const ERR_WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
const ERR_AUTH_NOPASS: &str = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?";
const ERR_NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";
const ERR_KEYS_TOO_MANY: &str = "ERR Number of keys can't be greater than number of args";
const ERR_KEYS_NEGATIVE: &str = "ERR Number of keys can't be negative";
const ERR_FLUSH_MODE: &str = "ERR SCRIPT FLUSH only support SYNC|ASYNC option";
const ERR_CLIENT_NAME: &str =
    "ERR Client names cannot contain spaces, newlines or special characters.";
const ERR_NOPERM_CHANNEL: &str =
    "NOPERM this user has no permissions to access one of the channels used as arguments";
const ERR_PEXPIRE_NX: &str = "ERR NX and XX, GT or LT options at the same time are not compatible";
const ERR_PEXPIRE_GT_LT: &str = "ERR GT and LT options at the same time are not compatible";
const ERR_SCRIPT_ARGS: &str = "ERR Lua redis lib command arguments must be strings or integers";
const ERR_DIGEST: &str =
    "ERR redlock-mio's model of a master cannot compute digests (IFDEQ, IFDNE)";
const ERR_COMMAND_LIST: &str =
    "ERR redlock-mio's model of a master answers COMMAND DOCS only, not the list of all commands";
const LUA_COMPARE_NIL: &str = "attempt to compare number with nil";
const LUA_ARITH_NIL: &str = "attempt to perform arithmetic on a nil value";
const LUA_MATCH_NIL: &str = "bad argument #1 to 'match' (string expected, got nil)";

// SET's option flags, as `parseExtendedStringArgumentsOrReply` keeps them.
const SET_NX: u8 = 1;
const SET_XX: u8 = 2;
const SET_GET: u8 = 4;
const SET_KEEPTTL: u8 = 8;
const SET_EX: u8 = 16;
const SET_PX: u8 = 32;
const SET_EXAT: u8 = 64;
const SET_PXAT: u8 = 128;

// PEXPIRE's option flags.
const EXPIRE_NX: u8 = 1;
const EXPIRE_XX: u8 = 2;
const EXPIRE_GT: u8 = 4;
const EXPIRE_LT: u8 = 8;

/// The condition of a compare-and-set (`SET ... IFEQ`) or a
/// compare-and-delete (`DELEX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compare {
    Eq,
    Ne,
    DigestEq,
    DigestNe,
}

impl Compare {
    /// The condition `word` names, if `flavour`'s `SET` takes it.
    fn parse(flavour: Flavour, word: &[u8]) -> Option<Compare> {
        if !flavour.has_set_ifeq() {
            return None;
        }
        let is = |name: &str| word.eq_ignore_ascii_case(name.as_bytes());
        if is("ifeq") {
            return Some(Compare::Eq);
        }
        if !flavour.has_delex() {
            return None;
        }
        [
            ("ifne", Compare::Ne),
            ("ifdeq", Compare::DigestEq),
            ("ifdne", Compare::DigestNe),
        ]
        .into_iter()
        .find_map(|(name, condition)| is(name).then_some(condition))
    }
}

/// The commands `COMMAND DOCS` documents, as one flavour or another has
/// them.
#[derive(Debug, Clone, Copy)]
enum CommandDoc {
    SetRedis70,
    SetValkey,
    SetRedis84,
    Delifeq,
    Delex,
}

impl CommandDoc {
    /// Its name and docs, two entries of `COMMAND DOCS`'s flat array:
    /// decoded once per process from `docs.rs`.
    fn reply(self) -> Vec<Reply> {
        static DECODED: OnceLock<[Vec<Reply>; 5]> = OnceLock::new();
        let all = DECODED.get_or_init(|| {
            [
                docs::SET_REDIS_7_0,
                docs::SET_VALKEY,
                docs::SET_REDIS_8_4,
                docs::DELIFEQ_VALKEY_9_1,
                docs::DELEX_REDIS_8_4,
            ]
            .map(|text| {
                let mut buf = BytesMut::from(text.as_bytes());
                match crate::resp::decode(&mut buf, &crate::resp::Limits::default()) {
                    Ok(Some(Reply::Array(pair))) if pair.len() == 2 && buf.is_empty() => pair,
                    other => unreachable!("docs.rs holds one name-and-docs pair: {other:?}"),
                }
            })
        });
        all[self as usize].clone()
    }
}

/// A model of one Redis master: see the module docs.
///
/// ```
/// use redlock_mio::resp::Reply;
/// use redlock_mio::sim::model::{ConnId, Master};
///
/// let mut master = Master::new(7, 1_000);
/// let set = master.handle_command(1_000, ConnId(1), &[&b"SET"[..], b"k", b"t", b"NX", b"PX", b"500"]);
/// assert!(set.is_ok());
/// let get = master.handle_command(1_600, ConnId(1), &[&b"GET"[..], b"k"]);
/// assert_eq!(get, Reply::Nil);
/// ```
#[derive(Debug)]
pub struct Master {
    settings: Settings,
    run_id_seed: u64,
    /// Restarts so far: part of the run_id.
    generation: u64,
    run_id: [u8; 40],
    started_ms: i64,
    dbs: [Map<Bytes, Entry>; DATABASES],
    sessions: Map<ConnId, Session>,
    /// Each channel's subscribers, in the order they subscribed.
    channels: Map<Bytes, Vec<ConnId>>,
    pushes: VecDeque<(ConnId, Frame)>,
    scripts: Map<Sha, Cached>,
    /// EVAL-created scripts by last use, oldest first.
    lru: BTreeMap<u64, [u8; 40]>,
    lru_clock: u64,
    natives: &'static [Native; 10],
    counts: [CallCount; CMD_COUNT],
    /// `INFO errorstats`, sorted by code.
    errors: Vec<(Bytes, u64)>,
    commands_since_sweep: usize,
    /// Reused to build channel names.
    scratch: Vec<u8>,
    /// Where the values, key and channel names and messages are copied.
    arena: Arena,
}

impl Master {
    /// A master started at `now_ms` on its own clock (Unix milliseconds, as
    /// Redis reads `gettimeofday`), with default settings: no password, no
    /// refusal, no EVAL LRU (Redis 7.0). `run_id_seed` makes its `run_id`,
    /// a new one at each [`Master::restart`].
    pub fn new(run_id_seed: u64, now_ms: u64) -> Master {
        let mut master = Master {
            settings: Settings::default(),
            run_id_seed,
            generation: 0,
            run_id: [b'0'; 40],
            started_ms: clamp_ms(now_ms),
            dbs: std::array::from_fn(|_| Map::default()),
            sessions: Map::default(),
            channels: Map::default(),
            pushes: VecDeque::new(),
            scripts: Map::default(),
            lru: BTreeMap::new(),
            lru_clock: 0,
            natives: natives(),
            counts: [CallCount::default(); CMD_COUNT],
            errors: Vec::new(),
            commands_since_sweep: 0,
            scratch: Vec::new(),
            arena: Arena::default(),
        };
        master.run_id = master.make_run_id();
        master
    }

    /// This master with `settings` instead of the defaults.
    #[must_use]
    pub fn with_settings(mut self, settings: Settings) -> Master {
        self.settings = settings;
        self
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The settings, to change: they apply from the next command on.
    pub fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }

    /// The `run_id` `INFO server` reports: 40 hex digits, new at each
    /// restart.
    pub fn run_id(&self) -> &[u8; 40] {
        &self.run_id
    }

    /// The string at `key` in database `db` as GET would return it at
    /// `now_ms`, without running a command: for a simulator's checks.
    /// `None` for a missing, expired or non-string key.
    pub fn peek(&self, now_ms: u64, db: usize, key: &[u8]) -> Option<&[u8]> {
        let entry = self.dbs.get(db)?.get(key)?;
        match &entry.value {
            Value::Str(v) if !entry.expired(clamp_ms(now_ms)) => Some(v),
            _ => None,
        }
    }

    /// The string at `key` in database `db` at `now_ms`, and when it
    /// expires (ms by the master's clock; `None`: never), for checkers.
    pub fn entry(&self, now_ms: u64, db: usize, key: &[u8]) -> Option<(&[u8], Option<u64>)> {
        let entry = self.dbs.get(db)?.get(key)?;
        match &entry.value {
            Value::Str(v) if !entry.expired(clamp_ms(now_ms)) => {
                Some((v, entry.expires_at.map(|at| u64::try_from(at).unwrap_or(0))))
            }
            _ => None,
        }
    }

    /// When the key at `key` in database `db`, of any type, expires
    /// (`Some(None)`: never), or `None` when there is none at `now_ms`:
    /// for checkers.
    pub fn expiry(&self, now_ms: u64, db: usize, key: &[u8]) -> Option<Option<u64>> {
        let entry = self.dbs.get(db)?.get(key)?;
        (!entry.expired(clamp_ms(now_ms)))
            .then(|| entry.expires_at.map(|at| u64::try_from(at).unwrap_or(0)))
    }

    /// The connections subscribed to `channel`, in the order they
    /// subscribed: who a PUBLISH there would reach now (for checkers).
    pub fn subscribers(&self, channel: &[u8]) -> &[ConnId] {
        self.channels.get(channel).map_or(&[], Vec::as_slice)
    }

    /// Runs one command sent on connection `conn` at `now_ms` by the
    /// master's clock, and returns its reply: the first frame the master
    /// writes to `conn` for it. A connection is known from its first
    /// command on (database 0, authenticated unless
    /// [`Settings::requirepass`] is set).
    ///
    /// Every other frame goes to [`Master::poll_push`]: the second and
    /// later confirmations of a SUBSCRIBE or UNSUBSCRIBE naming several
    /// channels (to `conn`), and the messages a PUBLISH or a release script
    /// sends to subscribers. Drain it after every call, before the next:
    /// a frame queued there for `conn` precedes the reply of its next
    /// command on the wire.
    ///
    /// Every input gets a reply: an unknown command, a wrong number of
    /// arguments or a bad option gets the error Redis 7.0 gives. (An empty
    /// `args`, to which Redis answers nothing, gets an error naming that.)
    #[must_use]
    pub fn handle_command<A: AsRef<[u8]>>(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        args: &[A],
    ) -> Reply {
        self.handle_frame(now_ms, conn, args).into_reply()
    }

    /// [`Master::handle_command`], its reply as a [`Frame`].
    #[must_use]
    pub(crate) fn handle_frame<A: AsRef<[u8]>>(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        args: &[A],
    ) -> Frame {
        let now = clamp_ms(now_ms);
        self.sweep(now);
        let frame = self.dispatch(now, conn, args);
        if let Frame::Reply(Reply::Error(msg)) = &frame {
            self.count_error(msg);
        }
        frame
    }

    /// The next frame the master writes besides a command's first reply,
    /// and the connection it goes to, in the order written.
    #[must_use]
    pub fn poll_push(&mut self) -> Option<(ConnId, Reply)> {
        self.poll_frame()
            .map(|(to, frame)| (to, frame.into_reply()))
    }

    /// [`Master::poll_push`], the frame as a [`Frame`].
    #[must_use]
    pub(crate) fn poll_frame(&mut self) -> Option<(ConnId, Frame)> {
        self.pushes.pop_front()
    }

    /// Connection `conn` closed: its subscriptions, database and
    /// authentication are gone, and frames still queued for it with them.
    /// The same id may be used again, as a new connection.
    pub fn handle_disconnect(&mut self, conn: ConnId) {
        if let Some(session) = self.sessions.remove(&conn) {
            for channel in &session.channels {
                self.drop_subscriber(channel, conn);
            }
        }
        self.pushes.retain(|(to, _)| *to != conn);
    }

    /// The master restarts at `now_ms`: a new `run_id`, uptime from zero,
    /// the script cache empty, every connection closed (with its
    /// subscriptions and queued frames), the statistics reset, and the data
    /// kept (`keep_data`, as from an RDB or AOF written just before) or
    /// lost. Keys whose time passed meanwhile are expired on their first
    /// access, as Redis does on load.
    pub fn restart(&mut self, now_ms: u64, keep_data: bool) {
        self.generation = self.generation.wrapping_add(1);
        self.run_id = self.make_run_id();
        self.started_ms = clamp_ms(now_ms);
        self.flush_scripts();
        self.sessions.clear();
        self.channels.clear();
        self.pushes.clear();
        self.counts = [CallCount::default(); CMD_COUNT];
        self.errors.clear();
        if !keep_data {
            for db in &mut self.dbs {
                db.clear();
            }
        }
    }

    /// Empties the script cache, as `SCRIPT FLUSH` does.
    pub fn flush_scripts(&mut self) {
        self.scripts.clear();
        self.lru.clear();
    }

    fn make_run_id(&self) -> [u8; 40] {
        let mut seed = [0u8; 16];
        seed[..8].copy_from_slice(&self.run_id_seed.to_le_bytes());
        seed[8..].copy_from_slice(&self.generation.to_le_bytes());
        sha1_hex(&seed)
    }

    /// Drops expired keys now and then, so that keys nobody reads again do
    /// not pile up in a long simulation (Redis's active expiry). Every
    /// command sees expired keys as gone whether swept or not; the sweep
    /// runs after a number of commands at least twice the key count, so it
    /// costs O(1) a command.
    fn sweep(&mut self, now: i64) {
        self.commands_since_sweep += 1;
        if self.commands_since_sweep < 1024 {
            return;
        }
        let keys: usize = self.dbs.iter().map(HashMap::len).sum();
        if self.commands_since_sweep < keys.saturating_mul(2) {
            return;
        }
        self.commands_since_sweep = 0;
        for db in &mut self.dbs {
            db.retain(|_, entry| !entry.expired(now));
        }
    }

    fn dispatch<A: AsRef<[u8]>>(&mut self, now: i64, conn: ConnId, args: &[A]) -> Frame {
        if args.is_empty() {
            return error(ERR_EMPTY).into();
        }
        let cmd = match lookup(args) {
            Ok(cmd) if self.settings.flavour.knows(cmd) => cmd,
            Ok(_) => return unknown_command(args).into(),
            Err(reply) => return reply.into(),
        };
        let (name, arity) = cmd.spec();
        let argc = args.len();
        let arity_ok = match usize::try_from(arity) {
            Ok(exact) => argc == exact,
            Err(_) => argc >= arity.unsigned_abs() as usize,
        };
        if !arity_ok {
            self.counts[cmd as usize].rejected += 1;
            return wrong_arity(name).into();
        }
        let needs_auth = self.settings.requirepass.is_some();
        let session = self.sessions.entry(conn).or_insert_with(|| Session {
            authenticated: !needs_auth,
            ..Session::default()
        });
        let (db, authenticated) = (session.db, session.authenticated);
        let subscribed = !session.channels.is_empty();
        // Redis 7.0's processCommand order: authentication, then ACL,
        // then the subscriber context.
        let refusal = if needs_auth && !authenticated && cmd != Cmd::Auth {
            Some(error(ERR_NOAUTH))
        } else if let Some(refusal) = self.acl_refusal(cmd) {
            Some(refusal)
        } else if subscribed && !matches!(cmd, Cmd::Ping | Cmd::Subscribe | Cmd::Unsubscribe) {
            Some(cant_execute(name))
        } else {
            None
        };
        if let Some(refusal) = refusal {
            self.counts[cmd as usize].rejected += 1;
            return refusal.into();
        }
        self.counts[cmd as usize].calls += 1;
        let reply = match cmd {
            Cmd::Ping => ping(args, subscribed),
            Cmd::Auth => self.auth(conn, args),
            Cmd::Select => self.select(conn, arg(args, 1)),
            Cmd::Info => self.info(now, &args[1..]),
            Cmd::ClientSetname => self.client_setname(conn, arg(args, 2)),
            Cmd::ClientGetname => match self.sessions.get(&conn).and_then(|s| s.name.clone()) {
                Some(name) => Reply::Bulk(name),
                None => Reply::Nil,
            },
            Cmd::ScriptLoad => {
                let sha = script_sha(self.natives, arg(args, 2));
                self.register(*sha, false);
                // One of the client's scripts answers with its static SHA.
                Reply::Bulk(match sha {
                    Cow::Borrowed(sha) => Bytes::from_static(sha),
                    Cow::Owned(sha) => Bytes::copy_from_slice(&sha),
                })
            }
            Cmd::ScriptExists => Reply::Array(
                args[2..]
                    .iter()
                    .map(|sha| {
                        let known = lower_sha(sha.as_ref())
                            .is_some_and(|s| self.scripts.contains_key(&Sha(s)));
                        Reply::Integer(i64::from(known))
                    })
                    .collect(),
            ),
            Cmd::ScriptFlush => {
                let mode_ok = match args.get(2) {
                    None => true,
                    Some(mode) => {
                        argc == 3
                            && (word_is(mode.as_ref(), "sync") || word_is(mode.as_ref(), "async"))
                    }
                };
                if mode_ok {
                    self.flush_scripts();
                    ok()
                } else {
                    error(ERR_FLUSH_MODE)
                }
            }
            Cmd::Eval | Cmd::Evalsha => {
                let frame = self.eval(now, db, args, cmd == Cmd::Evalsha);
                return self.counted(cmd, frame);
            }
            Cmd::Set => self.set_command(now, db, args),
            Cmd::Delifeq => self.delifeq(now, db, arg(args, 1), arg(args, 2)),
            Cmd::Delex => self.delex(now, db, args),
            Cmd::CommandDocs => self.command_docs(&args[2..]),
            Cmd::Command => error(ERR_COMMAND_LIST),
            Cmd::Get => match self.get(now, db, arg(args, 1)) {
                Ok(Some(value)) => Reply::Bulk(value),
                Ok(None) => Reply::Nil,
                Err(e) => error(e),
            },
            Cmd::Del => {
                let deleted = args[1..]
                    .iter()
                    .filter(|k| self.del(now, db, k.as_ref()))
                    .count();
                Reply::Integer(count(deleted))
            }
            Cmd::Exists => {
                let found = args[1..]
                    .iter()
                    .filter(|k| self.exists(now, db, k.as_ref()))
                    .count();
                Reply::Integer(count(found))
            }
            Cmd::Pttl => Reply::Integer(self.pttl(now, db, arg(args, 1))),
            Cmd::Pexpire => self.pexpire_command(now, db, args),
            Cmd::Hgetall => self.read(now, db, arg(args, 1), |e| match e.map(|e| &e.value) {
                None => Reply::Array(Vec::new()),
                Some(Value::Str(_)) => error(ERR_WRONGTYPE),
                Some(Value::Hash(fields)) => Reply::Array(
                    fields
                        .iter()
                        .flat_map(|(f, v)| [Reply::Bulk(f.clone()), Reply::Bulk(v.clone())])
                        .collect(),
                ),
            }),
            Cmd::Publish => Reply::Integer(self.publish(arg(args, 1), arg(args, 2))),
            Cmd::Subscribe => self.subscribe(conn, &args[1..]),
            Cmd::Unsubscribe => self.unsubscribe(conn, &args[1..]),
            Cmd::PubsubNumsub => Reply::Array(
                args[2..]
                    .iter()
                    .flat_map(|ch| {
                        let n = self.channels.get(ch.as_ref()).map_or(0, Vec::len);
                        [bulk(ch.as_ref()), Reply::Integer(count(n))]
                    })
                    .collect(),
            ),
            // Containers named alone fail their arity check above.
            Cmd::Client | Cmd::Script | Cmd::Pubsub => wrong_arity(name),
        };
        self.counted(cmd, reply.into())
    }

    /// `frame`, the answer to `cmd`, counted failed if it is an error.
    fn counted(&mut self, cmd: Cmd, frame: Frame) -> Frame {
        if frame.is_error() {
            self.counts[cmd as usize].failed += 1;
        }
        frame
    }

    /// What an ACL with the configured refusals answers to `cmd`.
    fn acl_refusal(&self, cmd: Cmd) -> Option<Reply> {
        let s = &self.settings;
        let denied = match cmd {
            Cmd::Publish if s.deny_publish => return Some(error(ERR_NOPERM_CHANNEL)),
            Cmd::Subscribe if s.deny_subscribe => return Some(error(ERR_NOPERM_CHANNEL)),
            Cmd::Info => s.deny_info,
            Cmd::ScriptLoad => s.deny_script_load || s.deny_scripting,
            Cmd::Eval | Cmd::Evalsha | Cmd::ScriptExists | Cmd::ScriptFlush => s.deny_scripting,
            Cmd::Command | Cmd::CommandDocs => s.deny_command,
            _ => false,
        };
        denied.then(|| {
            error_owned(
                format!(
                    "NOPERM this user has no permissions to run the '{}' command",
                    cmd.spec().0
                )
                .into_bytes(),
            )
        })
    }

    fn auth<A: AsRef<[u8]>>(&mut self, conn: ConnId, args: &[A]) -> Reply {
        if args.len() > 3 {
            return error(ERR_SYNTAX);
        }
        let (user, password) = if args.len() == 2 {
            if self.settings.requirepass.is_none() {
                return error(ERR_AUTH_NOPASS);
            }
            (&b"default"[..], arg(args, 1))
        } else {
            (arg(args, 1), arg(args, 2))
        };
        let valid = if user == b"default" {
            self.settings
                .requirepass
                .as_ref()
                .is_none_or(|p| p.as_ref() == password)
        } else {
            self.settings
                .users
                .iter()
                .any(|(u, p)| u.as_ref() == user && p.as_ref() == password)
        };
        if !valid {
            // A failed AUTH leaves an authenticated connection as it was.
            return error(ERR_WRONGPASS);
        }
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.authenticated = true;
        }
        ok()
    }

    fn select(&mut self, conn: ConnId, index: &[u8]) -> Reply {
        let Some(n) = parse_i64(index) else {
            return error(ERR_NOT_INTEGER);
        };
        if i32::try_from(n).is_err() {
            return error(ERR_INT_RANGE);
        }
        let Some(db) = usize::try_from(n).ok().filter(|db| *db < DATABASES) else {
            return error(ERR_DB_RANGE);
        };
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.db = db;
        }
        ok()
    }

    fn client_setname(&mut self, conn: ConnId, name: &[u8]) -> Reply {
        if name.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
            return error(ERR_CLIENT_NAME);
        }
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.name = (!name.is_empty()).then(|| Bytes::copy_from_slice(name));
        }
        ok()
    }

    /// `INFO [section ...]`: the sections the model keeps (`server`,
    /// `commandstats`, `errorstats`), named alone or through `default`,
    /// `all` or `everything`; other names add nothing. The statistics
    /// count top-level commands only (Redis also counts the commands a
    /// script calls), with `usec` 0.
    fn info<A: AsRef<[u8]>>(&self, now: i64, sections: &[A]) -> Reply {
        let (mut server, mut commandstats, mut errorstats) =
            (sections.is_empty(), false, sections.is_empty());
        for section in sections {
            let s = section.as_ref();
            if word_is(s, "server") {
                server = true;
            } else if word_is(s, "commandstats") {
                commandstats = true;
            } else if word_is(s, "errorstats") {
                errorstats = true;
            } else if word_is(s, "default") {
                server = true;
                errorstats = true;
            } else if word_is(s, "all") || word_is(s, "everything") {
                (server, commandstats, errorstats) = (true, true, true);
            }
        }
        let mut text = String::new();
        let section = |text: &mut String, title: &str| {
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            text.push_str("# ");
            text.push_str(title);
            text.push_str("\r\n");
        };
        if server {
            section(&mut text, "Server");
            // Redis subtracts two whole seconds of the wall clock.
            let uptime = now.div_euclid(1000) - self.started_ms.div_euclid(1000);
            let run_id = String::from_utf8_lossy(&self.run_id);
            let version = match self.settings.flavour.version() {
                ("valkey", version) => {
                    format!("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:{version}")
                }
                (_, version) => format!("redis_version:{version}"),
            };
            text.push_str(&format!(
                "{version}\r\nredis_mode:standalone\r\nrun_id:{run_id}\r\nserver_time_usec:{}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\n",
                now.saturating_mul(1000),
                uptime / 86_400,
            ));
        }
        if commandstats {
            section(&mut text, "Commandstats");
            for cmd in Cmd::ALL {
                let c = self.counts[cmd as usize];
                if c.calls + c.rejected + c.failed > 0 {
                    text.push_str(&format!(
                        "cmdstat_{}:calls={},usec=0,usec_per_call=0.00,rejected_calls={},failed_calls={}\r\n",
                        cmd.spec().0,
                        c.calls,
                        c.rejected,
                        c.failed
                    ));
                }
            }
        }
        if errorstats {
            section(&mut text, "Errorstats");
            for (code, n) in &self.errors {
                text.push_str(&format!(
                    "errorstat_{}:count={n}\r\n",
                    String::from_utf8_lossy(code)
                ));
            }
        }
        Reply::Bulk(Bytes::from(text))
    }

    /// Counts an error reply under its code (`INFO errorstats`): the first
    /// word when a space comes within Redis's 32 bytes, else `ERR`.
    fn count_error(&mut self, msg: &[u8]) {
        let head = &msg[..msg.len().min(31)];
        let code = match memchr::memchr(b' ', head) {
            Some(end) => &msg[..end],
            None => b"ERR",
        };
        match self.errors.binary_search_by(|(c, _)| c.as_ref().cmp(code)) {
            Ok(i) => self.errors[i].1 += 1,
            Err(i) => self.errors.insert(i, (Bytes::copy_from_slice(code), 1)),
        }
    }

    // --- the keyspace ---

    /// The live entry at `key`, to change, dropping it first when it has
    /// expired.
    fn live(&mut self, now: i64, db: usize, key: &[u8]) -> Option<&mut Entry> {
        let map = self.dbs.get_mut(db)?;
        if map.get(key)?.expired(now) {
            map.remove(key);
            return None;
        }
        map.get_mut(key)
    }

    /// What `read` makes of the live entry at `key` (`None`: there is
    /// none), dropping an expired one first as [`Master::live`] does, with
    /// one lookup for a live key.
    fn read<T>(
        &mut self,
        now: i64,
        db: usize,
        key: &[u8],
        read: impl FnOnce(Option<&Entry>) -> T,
    ) -> T {
        let Some(map) = self.dbs.get_mut(db) else {
            return read(None);
        };
        match map.get(key) {
            Some(entry) if entry.expired(now) => {
                map.remove(key);
                read(None)
            }
            entry => read(entry),
        }
    }

    /// What `read` makes of the string at `key` (`None`: there is none).
    fn read_string<T>(
        &mut self,
        now: i64,
        db: usize,
        key: &[u8],
        read: impl FnOnce(Option<&Bytes>) -> T,
    ) -> Result<T, &'static str> {
        self.read(now, db, key, |entry| match entry.map(|e| &e.value) {
            None => Ok(read(None)),
            Some(Value::Str(v)) => Ok(read(Some(v))),
            Some(Value::Hash(_)) => Err(ERR_WRONGTYPE),
        })
    }

    fn get(&mut self, now: i64, db: usize, key: &[u8]) -> Result<Option<Bytes>, &'static str> {
        self.read_string(now, db, key, |v| v.cloned())
    }

    /// Lua's `redis.call("get", key) == token`, without copying the value:
    /// false (a missing key) equals no string.
    fn holds(
        &mut self,
        now: i64,
        db: usize,
        key: &[u8],
        token: Option<&[u8]>,
    ) -> Result<bool, &'static str> {
        self.read_string(now, db, key, |held| {
            token.is_some_and(|token| held.is_some_and(|held| held.as_ref() == token))
        })
    }

    fn exists(&mut self, now: i64, db: usize, key: &[u8]) -> bool {
        self.read(now, db, key, |e| e.is_some())
    }

    /// Deletes `key`; whether it lived (an expired one goes too).
    fn del(&mut self, now: i64, db: usize, key: &[u8]) -> bool {
        self.dbs
            .get_mut(db)
            .and_then(|m| m.remove(key))
            .is_some_and(|e| !e.expired(now))
    }

    fn pttl(&mut self, now: i64, db: usize, key: &[u8]) -> i64 {
        self.read(now, db, key, |entry| pttl_of(entry, now))
    }

    /// Stores `value` at `key` as SET does once its options are parsed:
    /// refused by NX when the key lives or XX when it does not; the expiry
    /// replaced by `expires_at`, kept with [`SET_KEEPTTL`], else removed.
    /// Returns whether it stored.
    fn store(
        &mut self,
        now: i64,
        db: usize,
        key: &[u8],
        value: &[u8],
        flags: u8,
        expires_at: Option<i64>,
    ) -> bool {
        let Some(map) = self.dbs.get_mut(db) else {
            return flags & SET_XX == 0;
        };
        // One lookup: an expired entry is as good as none, and is
        // overwritten in place.
        let slot = map.get_mut(key);
        let old = slot
            .as_ref()
            .filter(|e| !e.expired(now))
            .map(|e| e.expires_at);
        if (flags & SET_NX != 0 && old.is_some()) || (flags & SET_XX != 0 && old.is_none()) {
            return false;
        }
        let kept = if flags & SET_KEEPTTL != 0 {
            old.flatten()
        } else {
            None
        };
        let entry = Entry {
            value: Value::Str(self.arena.copy(value)),
            expires_at: expires_at.or(kept),
        };
        // An overwrite reuses the key: no copy of it.
        match slot {
            Some(slot) => *slot = entry,
            None => {
                map.insert(self.arena.copy(key), entry);
            }
        }
        true
    }

    fn set_command<A: AsRef<[u8]>>(&mut self, now: i64, db: usize, args: &[A]) -> Reply {
        const EXPIRING: u8 = SET_EX | SET_PX | SET_EXAT | SET_PXAT;
        let flavour = self.settings.flavour;
        let mut flags = 0u8;
        let mut expire: Option<&[u8]> = None;
        // A compare-and-set's condition and the value it compares with:
        // one at most, and neither NX nor XX beside it.
        let mut compare: Option<(Compare, &[u8])> = None;
        let mut j = 3;
        while j < args.len() {
            let opt = c_str(arg(args, j));
            let next = args.get(j + 1).map(AsRef::as_ref);
            let is = |name: &str| opt.eq_ignore_ascii_case(name.as_bytes());
            let timed = [
                ("ex", SET_EX),
                ("px", SET_PX),
                ("exat", SET_EXAT),
                ("pxat", SET_PXAT),
            ];
            let condition = Compare::parse(flavour, opt);
            // Redis 7.0's parseExtendedStringArgumentsOrReply: an option
            // that conflicts with one before it is a syntax error.
            if is("nx") && flags & SET_XX == 0 && compare.is_none() {
                flags |= SET_NX;
            } else if is("xx") && flags & SET_NX == 0 && compare.is_none() {
                flags |= SET_XX;
            } else if let Some(condition) = condition
                && flags & (SET_NX | SET_XX) == 0
                && compare.is_none()
                && let Some(next) = next
            {
                compare = Some((condition, next));
                j += 1;
            } else if is("get") {
                flags |= SET_GET;
            } else if is("keepttl") && flags & EXPIRING == 0 {
                flags |= SET_KEEPTTL;
            } else if let Some(&(_, flag)) = timed.iter().find(|(name, _)| is(name))
                && flags & (SET_KEEPTTL | (EXPIRING & !flag)) == 0
                && let Some(next) = next
            {
                flags |= flag;
                expire = Some(next);
                j += 1;
            } else {
                return error(ERR_SYNTAX);
            }
            j += 1;
        }
        let expires_at = match expire {
            None => None,
            Some(text) => match expire_at(now, text, flags) {
                Ok(at) => Some(at),
                Err(e) => return error(e),
            },
        };
        if matches!(compare, Some((Compare::DigestEq | Compare::DigestNe, _))) {
            return error(ERR_DIGEST);
        }
        let (key, value) = (arg(args, 1), arg(args, 2));
        let old = if flags & SET_GET != 0 {
            match self.get(now, db, key) {
                Ok(old) => Some(old),
                Err(e) => return error(e),
            }
        } else {
            None
        };
        let pass = match compare {
            None => true,
            // Valkey's and Redis 8.4's: a key that is not a string is
            // WRONGTYPE, with GET or without.
            Some((condition, cmp)) => match self.read_string(now, db, key, |held| {
                let same = held.is_some_and(|held| held.as_ref() == cmp);
                match condition {
                    Compare::Eq => same,
                    _ => held.is_none() || !same,
                }
            }) {
                Ok(pass) => pass,
                Err(e) => return error(e),
            },
        };
        let stored = pass && self.store(now, db, key, value, flags, expires_at);
        match old {
            Some(Some(old)) => Reply::Bulk(old),
            Some(None) => Reply::Nil,
            None if stored => ok(),
            None => Reply::Nil,
        }
    }

    /// `DELIFEQ key value` (Valkey 9.0+): 1 when the key held exactly
    /// `value` and is deleted, 0 when it is missing or holds another.
    fn delifeq(&mut self, now: i64, db: usize, key: &[u8], value: &[u8]) -> Reply {
        match self.holds(now, db, key, Some(value)) {
            Ok(true) => Reply::Integer(i64::from(self.del(now, db, key))),
            Ok(false) => Reply::Integer(0),
            Err(e) => error(e),
        }
    }

    /// `DELEX key [IFEQ value | IFNE value | IFDEQ digest | IFDNE digest]`
    /// (Redis 8.4+), by its docs: without a condition it deletes as `DEL`
    /// does; with one, 1 when the condition held and the key is deleted,
    /// 0 when not or when the key is missing; WRONGTYPE for a key that is
    /// not a string. Anything else after the key is a syntax error.
    fn delex<A: AsRef<[u8]>>(&mut self, now: i64, db: usize, args: &[A]) -> Reply {
        let key = arg(args, 1);
        let condition = match args.len() {
            2 => return Reply::Integer(i64::from(self.del(now, db, key))),
            4 => Compare::parse(Flavour::Redis84, arg(args, 2)),
            _ => None,
        };
        let (condition, cmp) = match condition {
            Some(Compare::DigestEq | Compare::DigestNe) => return error(ERR_DIGEST),
            Some(condition) => (condition, arg(args, 3)),
            None => return error(ERR_SYNTAX),
        };
        let held = self.read_string(now, db, key, |held| {
            held.map(|held| (held.as_ref() == cmp) == (condition == Compare::Eq))
        });
        match held {
            Ok(Some(true)) => Reply::Integer(i64::from(self.del(now, db, key))),
            Ok(_) => Reply::Integer(0),
            Err(e) => error(e),
        }
    }

    /// `COMMAND DOCS [name ...]`: the docs of each command named that the
    /// model documents and the flavour has, in the order named (twice if
    /// named twice, as the servers do), or of all of them when none is
    /// named. Only `SET`, `DELIFEQ` and `DELEX` are documented (see
    /// `docs.rs`): every other name is left out, as a server leaves out a
    /// command it does not have.
    fn command_docs<A: AsRef<[u8]>>(&self, names: &[A]) -> Reply {
        let flavour = self.settings.flavour;
        let mut out = Vec::new();
        let mut add = |name: &[u8]| {
            let is = |word: &str| name.eq_ignore_ascii_case(word.as_bytes());
            let doc = if is("set") {
                match flavour {
                    Flavour::Redis70 => CommandDoc::SetRedis70,
                    Flavour::Valkey81 | Flavour::Valkey91 => CommandDoc::SetValkey,
                    Flavour::Redis84 => CommandDoc::SetRedis84,
                }
            } else if is("delifeq") && flavour.has_delifeq() {
                CommandDoc::Delifeq
            } else if is("delex") && flavour.has_delex() {
                CommandDoc::Delex
            } else {
                return;
            };
            out.extend(doc.reply());
        };
        if names.is_empty() {
            for name in ["set", "delifeq", "delex"] {
                add(name.as_bytes());
            }
        }
        for name in names {
            add(name.as_ref());
        }
        Reply::Array(out)
    }

    fn pexpire_command<A: AsRef<[u8]>>(&mut self, now: i64, db: usize, args: &[A]) -> Reply {
        let mut flags = 0u8;
        for opt in &args[3..] {
            let opt = c_str(opt.as_ref());
            flags |= match () {
                () if opt.eq_ignore_ascii_case(b"nx") => EXPIRE_NX,
                () if opt.eq_ignore_ascii_case(b"xx") => EXPIRE_XX,
                () if opt.eq_ignore_ascii_case(b"gt") => EXPIRE_GT,
                () if opt.eq_ignore_ascii_case(b"lt") => EXPIRE_LT,
                () => {
                    let mut msg = b"ERR Unsupported option ".to_vec();
                    msg.extend_from_slice(opt);
                    return error_owned(msg);
                }
            };
        }
        if flags & EXPIRE_NX != 0 && flags & (EXPIRE_XX | EXPIRE_GT | EXPIRE_LT) != 0 {
            return error(ERR_PEXPIRE_NX);
        }
        if flags & EXPIRE_GT != 0 && flags & EXPIRE_LT != 0 {
            return error(ERR_PEXPIRE_GT_LT);
        }
        match self.pexpire(now, db, arg(args, 1), arg(args, 2), flags) {
            Ok(n) => Reply::Integer(n),
            Err(e) => error(e),
        }
    }

    /// PEXPIRE once its flags are parsed: 1 when the expiry was set (or
    /// the key deleted, for a time not in the future), 0 when the key is
    /// missing or a flag refused.
    fn pexpire(
        &mut self,
        now: i64,
        db: usize,
        key: &[u8],
        ms: &[u8],
        flags: u8,
    ) -> Result<i64, &'static str> {
        let when = parse_i64(ms).ok_or(ERR_NOT_INTEGER)?;
        let when = when.checked_add(now).ok_or(ERR_EXPIRE_PEXPIRE)?;
        let Some(entry) = self.live(now, db, key) else {
            return Ok(0);
        };
        if flags != 0 {
            let current = entry.expires_at;
            let refused = (flags & EXPIRE_NX != 0 && current.is_some())
                || (flags & EXPIRE_XX != 0 && current.is_none())
                || (flags & EXPIRE_GT != 0 && current.is_none_or(|c| when <= c))
                || (flags & EXPIRE_LT != 0 && current.is_some_and(|c| when >= c));
            if refused {
                return Ok(0);
            }
        }
        if when <= now {
            if let Some(map) = self.dbs.get_mut(db) {
                map.remove(key);
            }
        } else {
            entry.expires_at = Some(when);
        }
        Ok(1)
    }

    /// HMGET of `fields` at `key`.
    fn hmget<const N: usize>(
        &mut self,
        now: i64,
        db: usize,
        key: &[u8],
        fields: [&[u8]; N],
    ) -> Result<[Option<Bytes>; N], &'static str> {
        self.read(now, db, key, |e| match e.map(|e| &e.value) {
            None => Ok(std::array::from_fn(|_| None)),
            Some(Value::Str(_)) => Err(ERR_WRONGTYPE),
            Some(Value::Hash(pairs)) => Ok(fields.map(|field| {
                pairs
                    .iter()
                    .find(|(f, _)| f.as_ref() == field)
                    .map(|(_, v)| v.clone())
            })),
        })
    }

    /// HSET of one field, making the hash when the key is missing.
    fn hset(
        &mut self,
        now: i64,
        db: usize,
        key: &[u8],
        field: &[u8],
        value: &[u8],
    ) -> Result<(), &'static str> {
        let value = Bytes::copy_from_slice(value);
        match self.live(now, db, key).map(|e| &mut e.value) {
            Some(Value::Str(_)) => Err(ERR_WRONGTYPE),
            Some(Value::Hash(pairs)) => {
                match pairs.iter_mut().find(|(f, _)| f.as_ref() == field) {
                    Some(pair) => pair.1 = value,
                    None => pairs.push((Bytes::copy_from_slice(field), value)),
                }
                Ok(())
            }
            None => {
                let entry = Entry {
                    value: Value::Hash(vec![(Bytes::copy_from_slice(field), value)]),
                    expires_at: None,
                };
                if let Some(map) = self.dbs.get_mut(db) {
                    map.insert(Bytes::copy_from_slice(key), entry);
                }
                Ok(())
            }
        }
    }

    /// HDEL of one field; a hash left empty is deleted, as Redis does.
    fn hdel(&mut self, now: i64, db: usize, key: &[u8], field: &[u8]) -> Result<(), &'static str> {
        let emptied = match self.live(now, db, key).map(|e| &mut e.value) {
            None => false,
            Some(Value::Str(_)) => return Err(ERR_WRONGTYPE),
            Some(Value::Hash(pairs)) => {
                pairs.retain(|(f, _)| f.as_ref() != field);
                pairs.is_empty()
            }
        };
        if emptied && let Some(map) = self.dbs.get_mut(db) {
            map.remove(key);
        }
        Ok(())
    }

    // --- pub/sub ---

    /// Sends `message` to every subscriber of `channel`; returns how many.
    fn publish(&mut self, channel: &[u8], message: &[u8]) -> i64 {
        self.publish_parts(channel, &[message])
    }

    /// Sends the message made of `parts`, one after the other, to every
    /// subscriber of `channel`; returns how many. The message is made
    /// only when someone listens, in the arena; the channel's name is the
    /// channel table's own (shared, not copied).
    fn publish_parts(&mut self, channel: &[u8], parts: &[&[u8]]) -> i64 {
        let Some((channel, subscribers)) = self.channels.get_key_value(channel) else {
            return 0;
        };
        let Some((&last, others)) = subscribers.split_last() else {
            return 0;
        };
        let payload = self.arena.concat(parts);
        for &to in others {
            let frame = Frame::Message {
                channel: channel.clone(),
                payload: payload.clone(),
            };
            self.pushes.push_back((to, frame));
        }
        // The last one takes the message itself: one reference fewer to
        // count.
        let channel = channel.clone();
        self.pushes
            .push_back((last, Frame::Message { channel, payload }));
        count(subscribers.len())
    }

    /// A release script's `redis.pcall("publish", "redlock:released:" ..
    /// resource, message)`, the message made of `parts`: what it returns
    /// to the script, which the scripts ignore.
    fn pcall_publish(&mut self, resource: &[u8], parts: &[&[u8]]) -> Result<i64, &'static str> {
        if self.settings.deny_publish {
            return Err(SCRIPT_PUBLISH_REFUSED);
        }
        if self.channels.is_empty() {
            return Ok(0);
        }
        let mut channel = std::mem::take(&mut self.scratch);
        channel.clear();
        channel.extend_from_slice(RELEASE_CHANNEL_PREFIX);
        channel.extend_from_slice(resource);
        let n = self.publish_parts(&channel, parts);
        self.scratch = channel;
        Ok(n)
    }

    /// Queues `frame` for `conn` after `first`, or makes it the first.
    fn reply_or_push(&mut self, first: &mut Option<Reply>, conn: ConnId, frame: Reply) {
        if first.is_none() {
            *first = Some(frame);
        } else {
            self.pushes.push_back((conn, frame.into()));
        }
    }

    fn subscribe<A: AsRef<[u8]>>(&mut self, conn: ConnId, channels: &[A]) -> Reply {
        let mut first = None;
        for channel in channels {
            let channel = channel.as_ref();
            let Some(session) = self.sessions.get_mut(&conn) else {
                break;
            };
            let name = self.arena.copy(channel);
            if !session.channels.iter().any(|c| c.as_ref() == channel) {
                session.channels.push(name.clone());
                self.channels.entry(name.clone()).or_default().push(conn);
            }
            let n = count(session.channels.len());
            let frame = confirmation("subscribe", Reply::Bulk(name), n);
            self.reply_or_push(&mut first, conn, frame);
        }
        first.unwrap_or_else(|| wrong_arity("subscribe"))
    }

    /// UNSUBSCRIBE: from `channels`, or from every channel (in the order
    /// subscribed; Redis goes by its hash table's order) when none is
    /// named.
    fn unsubscribe<A: AsRef<[u8]>>(&mut self, conn: ConnId, channels: &[A]) -> Reply {
        let mut first = None;
        let named: Vec<Bytes> = if channels.is_empty() {
            self.sessions
                .get(&conn)
                .map(|s| s.channels.clone())
                .unwrap_or_default()
        } else {
            channels
                .iter()
                .map(|c| self.arena.copy(c.as_ref()))
                .collect()
        };
        if named.is_empty() {
            return confirmation("unsubscribe", Reply::Nil, 0);
        }
        for channel in named {
            let Some(session) = self.sessions.get_mut(&conn) else {
                break;
            };
            let before = session.channels.len();
            session.channels.retain(|c| *c != channel);
            let (removed, n) = (
                session.channels.len() < before,
                count(session.channels.len()),
            );
            if removed {
                self.drop_subscriber(&channel, conn);
            }
            let frame = confirmation("unsubscribe", Reply::Bulk(channel), n);
            self.reply_or_push(&mut first, conn, frame);
        }
        first.unwrap_or_else(|| confirmation("unsubscribe", Reply::Nil, 0))
    }

    fn drop_subscriber(&mut self, channel: &[u8], conn: ConnId) {
        if let Some(subscribers) = self.channels.get_mut(channel) {
            subscribers.retain(|c| *c != conn);
            if subscribers.is_empty() {
                self.channels.remove(channel);
            }
        }
    }

    // --- scripts ---

    /// Adds a script to the cache: by EVAL (`from_eval`, in the LRU) or by
    /// SCRIPT LOAD, which also takes an EVAL-created one out of the LRU for
    /// good, as Redis 7.4 does.
    fn register(&mut self, sha: [u8; 40], from_eval: bool) {
        if let Some(cached) = self.scripts.get_mut(&Sha(sha)) {
            if !from_eval && let Some(tick) = cached.lru.take() {
                self.lru.remove(&tick);
            }
            return;
        }
        let lru = if from_eval {
            while self.settings.eval_lru && self.lru.len() >= EVAL_LRU_CAPACITY {
                let Some((_, oldest)) = self.lru.pop_first() else {
                    break;
                };
                self.scripts.remove(&Sha(oldest));
            }
            self.lru_clock += 1;
            self.lru.insert(self.lru_clock, sha);
            Some(self.lru_clock)
        } else {
            None
        };
        let native = self.natives.iter().find(|n| n.sha == sha).map(|n| n.id);
        self.scripts.insert(Sha(sha), Cached { native, lru });
    }

    /// A script was run: an EVAL-created one becomes the most recently
    /// used.
    fn touch(&mut self, sha: &[u8; 40]) {
        let Some(cached) = self.scripts.get_mut(&Sha(*sha)) else {
            return;
        };
        if let Some(tick) = cached.lru {
            self.lru.remove(&tick);
            self.lru_clock += 1;
            cached.lru = Some(self.lru_clock);
            self.lru.insert(self.lru_clock, *sha);
        }
    }

    fn eval<A: AsRef<[u8]>>(&mut self, now: i64, db: usize, args: &[A], by_sha: bool) -> Frame {
        if by_sha && arg(args, 1).len() != 40 {
            return error(ERR_NOSCRIPT).into();
        }
        let Some(numkeys) = parse_i64(arg(args, 2)) else {
            return error(ERR_NOT_INTEGER).into();
        };
        let rest = &args[3..];
        let Ok(numkeys) = usize::try_from(numkeys) else {
            return error(ERR_KEYS_NEGATIVE).into();
        };
        if numkeys > rest.len() {
            return error(ERR_KEYS_TOO_MANY).into();
        }
        let sha = if by_sha {
            match lower_sha(arg(args, 1)) {
                Some(sha) => sha,
                None => return error(ERR_NOSCRIPT).into(),
            }
        } else {
            let sha = *script_sha(self.natives, arg(args, 1));
            if !self.scripts.contains_key(&Sha(sha)) {
                self.register(sha, true);
            }
            sha
        };
        let Some(&Cached { native, lru }) = self.scripts.get(&Sha(sha)) else {
            return error(ERR_NOSCRIPT).into();
        };
        let (keys, argv) = rest.split_at(numkeys);
        let run = Run {
            db,
            now,
            keys,
            argv,
        };
        let reply = match native {
            Some(id) => self
                .run_native(id, &run)
                .unwrap_or_else(|fail| fail.reply(&sha).into()),
            None => {
                let mut msg = b"ERR redlock-mio's model of a master cannot run script ".to_vec();
                msg.extend_from_slice(&sha);
                msg.extend_from_slice(b": it runs only the scripts of src/script.rs");
                error_owned(msg).into()
            }
        };
        if lru.is_some() {
            self.touch(&sha);
        }
        reply
    }

    fn run_native<A: AsRef<[u8]>>(
        &mut self,
        id: ScriptId,
        run: &Run<'_, A>,
    ) -> Result<Frame, Fail> {
        match id {
            ScriptId::Release => self.release(run).map(Frame::from),
            ScriptId::AcquireWait => self.acquire_wait(run),
            ScriptId::Extend => self.extend(run).map(Frame::from),
            ScriptId::AcquireFenced => self.acquire_fenced(run),
            ScriptId::Fence => self.fence(run).map(Frame::from),
            ScriptId::AcquireMany => self.acquire_many(run),
            ScriptId::ReleaseMany => self.release_many(run).map(Frame::from),
            ScriptId::ExtendMany => self.extend_many(run).map(Frame::from),
            ScriptId::Cleanup => self.cleanup(run).map(Frame::from),
            ScriptId::CleanupMany => self.cleanup_many(run).map(Frame::from),
        }
    }

    /// [`script::RELEASE_SOURCE`].
    fn release<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>) -> Result<Reply, Fail> {
        self.compare_and_delete(r, true)
    }

    /// [`script::CLEANUP_SOURCE`]: the release, publishing nothing.
    fn cleanup<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>) -> Result<Reply, Fail> {
        self.compare_and_delete(r, false)
    }

    fn compare_and_delete<A: AsRef<[u8]>>(
        &mut self,
        r: &Run<'_, A>,
        publish: bool,
    ) -> Result<Reply, Fail> {
        let key = need(r.key(1), 1)?;
        let held = self
            .holds(r.now, r.db, key, r.arg(1))
            .map_err(|e| raised(1, e))?;
        match r.arg(1) {
            Some(token) if held => {
                self.del(r.now, r.db, key);
                if publish {
                    // The script ignores what pcall returns.
                    let _ = match r.arg(2) {
                        Some(next) => self.pcall_publish(key, &[token, b":", next]),
                        None => self.pcall_publish(key, &[token]),
                    };
                }
                Ok(Reply::Integer(1))
            }
            _ => Ok(Reply::Integer(0)),
        }
    }

    /// [`script::ACQUIRE_WAIT_SOURCE`].
    fn acquire_wait<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>) -> Result<Frame, Fail> {
        let (key, token, ttl) = (need(r.key(1), 1)?, need(r.arg(1), 1)?, need(r.arg(2), 1)?);
        let at = expire_at(r.now, ttl, SET_PX).map_err(|e| raised(1, e))?;
        if self.store(r.now, r.db, key, token, SET_NX, Some(at)) {
            return Ok(Reply::Integer(1).into());
        }
        let refusal = self.refusal(r, key);
        self.notice(r, key, token);
        Ok(refusal)
    }

    /// A waiting script's refusal notice, when its `ARGV[3]` asks for it:
    /// `redis.pcall("publish", "redlock:released:" .. key, "?" .. token)`.
    fn notice<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>, key: &[u8], token: &[u8]) {
        if r.arg(3).is_some() {
            let _ = self.pcall_publish(key, &[&[script::WAITING_MARK], token]);
        }
    }

    /// The waiting scripts' refusal by `key`, read once: minus the
    /// holder's remaining ms (its PTTL, at least 0) and its value
    /// (`redis.pcall("get")`: a key that is not a string reads as "").
    fn refusal<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>, key: &[u8]) -> Frame {
        self.read(r.now, r.db, key, |entry| {
            let left = pttl_of(entry, r.now).max(0);
            let holder = match entry.map(|e| &e.value) {
                Some(Value::Str(value)) => value.clone(),
                Some(Value::Hash(_)) | None => Bytes::new(),
            };
            Frame::Refusal { left, holder }
        })
    }

    /// [`script::EXTEND_SOURCE`].
    fn extend<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>) -> Result<Reply, Fail> {
        let key = need(r.key(1), 1)?;
        let held = self
            .holds(r.now, r.db, key, r.arg(1))
            .map_err(|e| raised(1, e))?;
        if !held {
            return Ok(Reply::Integer(0));
        }
        let ttl = need(r.arg(2), 1)?;
        let n = self
            .pexpire(r.now, r.db, key, ttl, 0)
            .map_err(|e| raised(1, e))?;
        Ok(Reply::Integer(n))
    }

    /// [`script::ACQUIRE_FENCED_SOURCE`], line by line.
    fn acquire_fenced<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>) -> Result<Frame, Fail> {
        let (key, token, ttl) = (need(r.key(1), 1)?, need(r.arg(1), 1)?, need(r.arg(2), 1)?);
        let at = expire_at(r.now, ttl, SET_PX).map_err(|e| raised(1, e))?;
        if !self.store(r.now, r.db, key, token, SET_NX, Some(at)) {
            let refusal = self.refusal(r, key);
            self.notice(r, key, token);
            return Ok(refusal);
        }
        let fence_key = need(r.key(2), 2)?;
        let fence = self.get(r.now, r.db, fence_key).map_err(|e| raised(2, e))?;
        let fence = fence.as_deref().and_then(tonumber);
        let state_key = need(r.key(3), 3)?;
        let fields: [&[u8]; 4] = [b"marked", b"floor", b"high", b"since"];
        let [marked, floor, high, since] = self
            .hmget(r.now, r.db, state_key, fields)
            .map_err(|e| raised(3, e))?;
        let number = |v: &Option<Bytes>| v.as_deref().and_then(tonumber);
        if marked.is_some() {
            let reading = lua_max(fence.unwrap_or(0.0), number(&floor).unwrap_or(0.0));
            let high = number(&high).unwrap_or(0.0);
            return Ok(integers([lua_int(reading), 2, lua_int(high), -1]).into());
        }
        let now = r.now as f64;
        let since = match number(&since) {
            Some(since) => since,
            None => {
                let mut digits = [0u8; 20];
                let text = format_i64(r.now, &mut digits);
                self.hset(r.now, r.db, state_key, b"since", text)
                    .map_err(|e| raised(8, e))?;
                now
            }
        };
        Ok(match fence {
            Some(fence) => integers([lua_int(fence), 1, 0, lua_int(now - since)]),
            None => integers([0, 0, 0, lua_int(now - since)]),
        }
        .into())
    }

    /// [`script::FENCE_SOURCE`], line by line (the directive is `ARGV[1]`).
    fn fence<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>) -> Result<Reply, Fail> {
        let key = need(r.key(1), 1)?;
        let held = self
            .holds(r.now, r.db, key, r.arg(2))
            .map_err(|e| raised(1, e))?;
        if !held {
            return Ok(Reply::Integer(0));
        }
        let v = r.arg(3).and_then(tonumber);
        let fence_key = need(r.key(2), 3)?;
        let f = self.get(r.now, r.db, fence_key).map_err(|e| raised(3, e))?;
        let raise = match (f.as_deref().and_then(tonumber), v) {
            (None, _) => true,
            (Some(_), None) => return Err(Fail::lua(4, LUA_COMPARE_NIL)),
            (Some(f), Some(v)) => v > f,
        };
        if raise {
            let value = need(r.arg(3), 4)?;
            self.store(r.now, r.db, fence_key, value, 0, None);
        }
        let state_key = need(r.key(3), 5)?;
        let fields: [&[u8]; 3] = [b"marked", b"high", b"since"];
        let [marked, high, since] = self
            .hmget(r.now, r.db, state_key, fields)
            .map_err(|e| raised(5, e))?;
        if marked.is_none() {
            let directive = r.arg(1);
            let mut admit = directive == Some(&b"bootstrap"[..]);
            let Some(directive) = directive else {
                return Err(Fail::lua(8, LUA_MATCH_NIL));
            };
            if let (Some(wait), Some(since)) = (readmit_wait(directive), since) {
                let Some(since) = tonumber(&since) else {
                    return Err(Fail::lua(11, LUA_ARITH_NIL));
                };
                admit = r.now as f64 - since >= wait;
                if admit {
                    let value = need(r.arg(3), 12)?;
                    self.hset(r.now, r.db, state_key, b"floor", value)
                        .map_err(|e| raised(12, e))?;
                }
            }
            if admit {
                self.hset(r.now, r.db, state_key, b"marked", b"1")
                    .map_err(|e| raised(14, e))?;
                self.hdel(r.now, r.db, state_key, b"since")
                    .map_err(|e| raised(14, e))?;
            }
        }
        let write_high = match (high.as_deref().and_then(tonumber), v) {
            (None, _) => true,
            (Some(_), None) => return Err(Fail::lua(16, LUA_COMPARE_NIL)),
            (Some(high), Some(v)) => v > high,
        };
        if write_high {
            let value = need(r.arg(3), 16)?;
            self.hset(r.now, r.db, state_key, b"high", value)
                .map_err(|e| raised(16, e))?;
        }
        Ok(Reply::Integer(1))
    }

    /// [`script::ACQUIRE_MANY_SOURCE`].
    fn acquire_many<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>) -> Result<Frame, Fail> {
        // The longest PTTL among the keys that exist, the first on a tie.
        let mut longest: Option<(i64, &[u8])> = None;
        for key in r.keys {
            let left = self.pttl(r.now, r.db, key.as_ref());
            if left != -2 && longest.is_none_or(|(most, _)| left.max(0) > most) {
                longest = Some((left.max(0), key.as_ref()));
            }
        }
        // The key just read, read again: the same PTTL.
        if let Some((_, key)) = longest {
            return Ok(self.refusal(r, key));
        }
        if r.keys.is_empty() {
            return Ok(Reply::Integer(1).into());
        }
        let (token, ttl) = (need(r.arg(1), 1)?, need(r.arg(2), 1)?);
        let at = expire_at(r.now, ttl, SET_PX).map_err(|e| raised(1, e))?;
        for key in r.keys {
            self.store(r.now, r.db, key.as_ref(), token, 0, Some(at));
        }
        Ok(Reply::Integer(1).into())
    }

    /// [`script::RELEASE_MANY_SOURCE`]: deletions before a failing key
    /// stay, as Redis does not roll a script back.
    fn release_many<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>) -> Result<Reply, Fail> {
        self.compare_and_delete_many(r, true)
    }

    /// [`script::CLEANUP_MANY_SOURCE`]: the release of many, publishing
    /// nothing.
    fn cleanup_many<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>) -> Result<Reply, Fail> {
        self.compare_and_delete_many(r, false)
    }

    fn compare_and_delete_many<A: AsRef<[u8]>>(
        &mut self,
        r: &Run<'_, A>,
        publish: bool,
    ) -> Result<Reply, Fail> {
        let mut all = 1;
        for key in r.keys {
            let key = key.as_ref();
            let held = self
                .holds(r.now, r.db, key, r.arg(1))
                .map_err(|e| raised(1, e))?;
            match r.arg(1) {
                Some(token) if held => {
                    self.del(r.now, r.db, key);
                    if publish {
                        let _ = self.pcall_publish(key, &[token]);
                    }
                }
                _ => all = 0,
            }
        }
        Ok(Reply::Integer(all))
    }

    /// [`script::EXTEND_MANY_SOURCE`].
    fn extend_many<A: AsRef<[u8]>>(&mut self, r: &Run<'_, A>) -> Result<Reply, Fail> {
        for key in r.keys {
            let held = self
                .holds(r.now, r.db, key.as_ref(), r.arg(1))
                .map_err(|e| raised(1, e))?;
            if !held {
                return Ok(Reply::Integer(0));
            }
        }
        if let Some(first) = r.keys.first() {
            // Every call takes the same TTL: the first one fails or none.
            let ttl = need(r.arg(2), 1)?;
            self.pexpire(r.now, r.db, first.as_ref(), ttl, 0)
                .map_err(|e| raised(1, e))?;
            for key in &r.keys[1..] {
                self.pexpire(r.now, r.db, key.as_ref(), ttl, 0)
                    .map_err(|e| raised(1, e))?;
            }
        }
        Ok(Reply::Integer(1))
    }
}

/// One script run: its KEYS and ARGV, database and time.
struct Run<'a, A> {
    db: usize,
    now: i64,
    keys: &'a [A],
    argv: &'a [A],
}

impl<A: AsRef<[u8]>> Run<'_, A> {
    /// `KEYS[i]`, 1-based as in Lua.
    fn key(&self, i: usize) -> Option<&[u8]> {
        self.keys.get(i.wrapping_sub(1)).map(AsRef::as_ref)
    }

    /// `ARGV[i]`, 1-based as in Lua.
    fn arg(&self, i: usize) -> Option<&[u8]> {
        self.argv.get(i.wrapping_sub(1)).map(AsRef::as_ref)
    }
}

/// Why a script stopped, and on which line of its Lua.
#[derive(Debug)]
struct Fail {
    line: u32,
    raise: Raise,
}

#[derive(Debug)]
enum Raise {
    /// A `redis.call` replied with this error.
    Call(&'static str),
    /// A `redis.call` argument was nil.
    Args,
    /// A Lua runtime error.
    Lua(&'static str),
}

impl Fail {
    fn lua(line: u32, msg: &'static str) -> Fail {
        Fail {
            line,
            raise: Raise::Lua(msg),
        }
    }

    /// The error reply Redis 7.0 gives for it.
    fn reply(&self, sha: &[u8; 40]) -> Reply {
        let mut line = [0u8; 20];
        let line = format_i64(i64::from(self.line), &mut line);
        let mut msg = Vec::with_capacity(192);
        match self.raise {
            Raise::Call(text) => msg.extend_from_slice(text.as_bytes()),
            Raise::Args => msg.extend_from_slice(ERR_SCRIPT_ARGS.as_bytes()),
            Raise::Lua(text) => {
                msg.extend_from_slice(b"ERR user_script:");
                msg.extend_from_slice(line);
                msg.extend_from_slice(b": ");
                msg.extend_from_slice(text.as_bytes());
            }
        }
        msg.extend_from_slice(b" script: ");
        msg.extend_from_slice(sha);
        msg.extend_from_slice(b", on @user_script:");
        msg.extend_from_slice(line);
        msg.push(b'.');
        error_owned(msg)
    }
}

/// A `redis.call` argument that must not be nil.
fn need(value: Option<&[u8]>, line: u32) -> Result<&[u8], Fail> {
    value.ok_or(Fail {
        line,
        raise: Raise::Args,
    })
}

fn raised(line: u32, error: &'static str) -> Fail {
    Fail {
        line,
        raise: Raise::Call(error),
    }
}

/// PTTL of the live entry `entry` at `now`: -2 for none, -1 for one
/// without an expiry.
fn pttl_of(entry: Option<&Entry>, now: i64) -> i64 {
    match entry.map(|e| e.expires_at) {
        None => -2,
        Some(None) => -1,
        Some(Some(at)) => at.saturating_sub(now).max(0),
    }
}

/// The time SET stores for its EX/PX/EXAT/PXAT argument `text`, as Redis
/// 7.0's `getExpireMillisecondsOrReply` computes it.
fn expire_at(now: i64, text: &[u8], flags: u8) -> Result<i64, &'static str> {
    let n = parse_i64(text).ok_or(ERR_NOT_INTEGER)?;
    let seconds = flags & (SET_EX | SET_EXAT) != 0;
    if n <= 0 {
        return Err(ERR_EXPIRE_SET);
    }
    let ms = if seconds {
        n.checked_mul(1000).ok_or(ERR_EXPIRE_SET)?
    } else {
        n
    };
    if flags & (SET_EX | SET_PX) != 0 {
        ms.checked_add(now).ok_or(ERR_EXPIRE_SET)
    } else {
        Ok(ms)
    }
}

/// The part of `FENCE_SOURCE`'s directive `readmit:<ms>` Lua reads:
/// `tonumber(string.match(d, "^readmit:(%d+)$"))`.
fn readmit_wait(directive: &[u8]) -> Option<f64> {
    let digits = directive.strip_prefix(b"readmit:")?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Lua 5.1's `tonumber` of a string: the C string up to its first NUL,
/// blanks around it, a decimal number as `strtod` reads it (`inf` and
/// `nan` too) or a hexadecimal integer. (Hexadecimal fractions, which
/// `strtod` also reads, are not numbers here.)
fn tonumber(s: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(c_str(s)).ok()?;
    let text = text.trim_matches(|c: char| c == ' ' || ('\t'..='\r').contains(&c));
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if body.starts_with(['+', '-']) {
        return None;
    }
    let value = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        Some(hex) if !hex.starts_with('+') => u64::from_str_radix(hex, 16).ok()? as f64,
        Some(_) => return None,
        None => body.parse::<f64>().ok()?,
    };
    Some(if negative { -value } else { value })
}

/// Lua's `math.max(a, b)`.
fn lua_max(a: f64, b: f64) -> f64 {
    if b > a { b } else { a }
}

/// A Lua number as a script's integer reply: C's `(long long)` cast,
/// truncating, with x86-64's answer for what does not fit.
fn lua_int(n: f64) -> i64 {
    // NaN is in no range.
    if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&n) {
        i64::MIN
    } else {
        n as i64
    }
}

fn integers<const N: usize>(values: [i64; N]) -> Reply {
    Reply::Array(values.into_iter().map(Reply::Integer).collect())
}

/// Redis's `string2ll`: a decimal integer with an optional minus sign, no
/// blanks, no plus sign and no leading zero.
fn parse_i64(s: &[u8]) -> Option<i64> {
    if s == b"0" {
        return Some(0);
    }
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if !matches!(digits.first(), Some(b'1'..=b'9')) || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: u64 = 0;
    for &d in digits {
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative {
        0i64.checked_sub_unsigned(n)
    } else {
        i64::try_from(n).ok()
    }
}

/// One of the client's scripts, which the model runs natively.
#[derive(Debug)]
struct Native {
    sha: [u8; 40],
    id: ScriptId,
    source: &'static str,
}

/// The SHA1 of script `source`: the client's own scripts are known by
/// their text, with no SHA1 to work out each time one is loaded or sent
/// (theirs is borrowed from `natives`).
fn script_sha(natives: &'static [Native], source: &[u8]) -> Cow<'static, [u8; 40]> {
    match natives.iter().find(|n| n.source.as_bytes() == source) {
        Some(native) => Cow::Borrowed(&native.sha),
        None => Cow::Owned(sha1_hex(source)),
    }
}

/// The client's scripts, their SHA1s worked out once per process.
fn natives() -> &'static [Native; 10] {
    static NATIVES: OnceLock<[Native; 10]> = OnceLock::new();
    NATIVES.get_or_init(|| {
        let native = |id: ScriptId, source: &'static str| Native {
            sha: *Script::new(source).sha(),
            id,
            source,
        };
        [
            native(ScriptId::Release, script::RELEASE_SOURCE),
            native(ScriptId::Extend, script::EXTEND_SOURCE),
            native(ScriptId::AcquireFenced, script::ACQUIRE_FENCED_SOURCE),
            native(ScriptId::Fence, script::FENCE_SOURCE),
            native(ScriptId::AcquireMany, script::ACQUIRE_MANY_SOURCE),
            native(ScriptId::ReleaseMany, script::RELEASE_MANY_SOURCE),
            native(ScriptId::ExtendMany, script::EXTEND_MANY_SOURCE),
            native(ScriptId::AcquireWait, script::ACQUIRE_WAIT_SOURCE),
            native(ScriptId::Cleanup, script::CLEANUP_SOURCE),
            native(ScriptId::CleanupMany, script::CLEANUP_MANY_SOURCE),
        ]
    })
}

/// The lowercase hex SHA1 of `data`.
fn sha1_hex(data: &[u8]) -> [u8; 40] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = sha1_smol::Sha1::from(data).digest().bytes();
    let mut sha = [0u8; 40];
    for (pair, byte) in sha.chunks_exact_mut(2).zip(digest) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
    sha
}

/// A 40-byte SHA as the script cache keys it: lowercased (its lookups
/// ignore case). `None` for any other length.
fn lower_sha(sha: &[u8]) -> Option<[u8; 40]> {
    let sha: [u8; 40] = sha.try_into().ok()?;
    Some(sha.map(|c| c.to_ascii_lowercase()))
}

/// The master's clock as Redis keeps it: signed milliseconds.
fn clamp_ms(now_ms: u64) -> i64 {
    i64::try_from(now_ms).unwrap_or(i64::MAX)
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn arg<A: AsRef<[u8]>>(args: &[A], i: usize) -> &[u8] {
    args.get(i).map_or(&[][..], AsRef::as_ref)
}

/// The bytes C sees of an argument: up to its first NUL.
fn c_str(s: &[u8]) -> &[u8] {
    memchr::memchr(0, s).map_or(s, |end| &s[..end])
}

/// True when `s` is `word`, ignoring ASCII case, as `strcasecmp` sees it.
fn word_is(s: &[u8], word: &str) -> bool {
    c_str(s).eq_ignore_ascii_case(word.as_bytes())
}

/// Finds the command `args` names, or the error Redis 7.0 gives for an
/// unknown command or subcommand.
fn lookup<A: AsRef<[u8]>>(args: &[A]) -> Result<Cmd, Reply> {
    let name = arg(args, 0);
    let is = |word: &str| name.eq_ignore_ascii_case(word.as_bytes());
    let base = match () {
        () if is("auth") => Cmd::Auth,
        () if is("client") => Cmd::Client,
        () if is("command") => Cmd::Command,
        () if is("del") => Cmd::Del,
        () if is("delex") => Cmd::Delex,
        () if is("delifeq") => Cmd::Delifeq,
        () if is("eval") => Cmd::Eval,
        () if is("evalsha") => Cmd::Evalsha,
        () if is("exists") => Cmd::Exists,
        () if is("get") => Cmd::Get,
        () if is("hgetall") => Cmd::Hgetall,
        () if is("info") => Cmd::Info,
        () if is("pexpire") => Cmd::Pexpire,
        () if is("ping") => Cmd::Ping,
        () if is("pttl") => Cmd::Pttl,
        () if is("publish") => Cmd::Publish,
        () if is("pubsub") => Cmd::Pubsub,
        () if is("script") => Cmd::Script,
        () if is("select") => Cmd::Select,
        () if is("set") => Cmd::Set,
        () if is("subscribe") => Cmd::Subscribe,
        () if is("unsubscribe") => Cmd::Unsubscribe,
        () => return Err(unknown_command(args)),
    };
    if args.len() < 2 || !matches!(base, Cmd::Client | Cmd::Command | Cmd::Script | Cmd::Pubsub) {
        return Ok(base);
    }
    let sub = arg(args, 1);
    let is = |word: &str| sub.eq_ignore_ascii_case(word.as_bytes());
    match base {
        Cmd::Client if is("setname") => Ok(Cmd::ClientSetname),
        Cmd::Client if is("getname") => Ok(Cmd::ClientGetname),
        Cmd::Script if is("load") => Ok(Cmd::ScriptLoad),
        Cmd::Script if is("exists") => Ok(Cmd::ScriptExists),
        Cmd::Script if is("flush") => Ok(Cmd::ScriptFlush),
        Cmd::Pubsub if is("numsub") => Ok(Cmd::PubsubNumsub),
        Cmd::Command if is("docs") => Ok(Cmd::CommandDocs),
        _ => Err(unknown_subcommand(name, sub)),
    }
}

fn unknown_command<A: AsRef<[u8]>>(args: &[A]) -> Reply {
    let mut msg = b"ERR unknown command '".to_vec();
    msg.extend_from_slice(truncate(c_str(arg(args, 0)), 128));
    msg.extend_from_slice(b"', with args beginning with: ");
    let mut list = Vec::new();
    for a in &args[1..] {
        if list.len() >= 128 {
            break;
        }
        let room = 128 - list.len();
        list.push(b'\'');
        list.extend_from_slice(truncate(c_str(a.as_ref()), room));
        list.extend_from_slice(b"' ");
    }
    msg.extend_from_slice(&list);
    error_owned(msg)
}

fn unknown_subcommand(name: &[u8], sub: &[u8]) -> Reply {
    let mut msg = b"ERR unknown subcommand '".to_vec();
    msg.extend_from_slice(truncate(c_str(sub), 128));
    msg.extend_from_slice(b"'. Try ");
    msg.extend(c_str(name).iter().map(u8::to_ascii_uppercase));
    msg.extend_from_slice(b" HELP.");
    error_owned(msg)
}

fn truncate(s: &[u8], max: usize) -> &[u8] {
    &s[..s.len().min(max)]
}

fn ping<A: AsRef<[u8]>>(args: &[A], subscribed: bool) -> Reply {
    if args.len() > 2 {
        return wrong_arity("ping");
    }
    match (subscribed, args.get(1)) {
        (true, message) => Reply::Array(vec![
            Reply::Bulk(Bytes::from_static(b"pong")),
            bulk(message.map_or(&[][..], AsRef::as_ref)),
        ]),
        (false, None) => Reply::Status(Bytes::from_static(b"PONG")),
        (false, Some(message)) => bulk(message.as_ref()),
    }
}

fn confirmation(kind: &'static str, channel: Reply, n: i64) -> Reply {
    Reply::Array(vec![
        Reply::Bulk(Bytes::from_static(kind.as_bytes())),
        channel,
        Reply::Integer(n),
    ])
}

fn wrong_arity(name: &str) -> Reply {
    error_owned(format!("ERR wrong number of arguments for '{name}' command").into_bytes())
}

fn cant_execute(name: &str) -> Reply {
    error_owned(
        format!("ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context")
            .into_bytes(),
    )
}

fn ok() -> Reply {
    Reply::Status(Bytes::from_static(b"OK"))
}

fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(Bytes::copy_from_slice(b))
}

fn error(text: &'static str) -> Reply {
    Reply::Error(Bytes::from_static(text.as_bytes()))
}

/// An error reply made of user bytes: CR and LF become spaces, as Redis
/// makes them, so that the reply stays one line.
fn error_owned(mut msg: Vec<u8>) -> Reply {
    for b in &mut msg {
        if *b == b'\r' || *b == b'\n' {
            *b = b' ';
        }
    }
    Reply::Error(Bytes::from(msg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::{
        ACQUIRE_FENCED_SOURCE, ACQUIRE_MANY_SOURCE, ACQUIRE_WAIT_SOURCE, CLEANUP_MANY_SOURCE,
        CLEANUP_SOURCE, EXTEND_MANY_SOURCE, EXTEND_SOURCE, FENCE_SOURCE, FENCE_STATE_KEY,
        RELEASE_MANY_SOURCE, RELEASE_SOURCE,
    };
    use crate::sim::rng::Rng;

    /// A start time 300 ms into a second, so that uptime's whole-second
    /// arithmetic shows.
    const T0: u64 = 1_700_000_000_300;

    const SCRIPTS: [(&str, &str); 10] = [
        ("RELEASE", RELEASE_SOURCE),
        ("ACQUIRE_WAIT", ACQUIRE_WAIT_SOURCE),
        ("EXTEND", EXTEND_SOURCE),
        ("ACQUIRE_FENCED", ACQUIRE_FENCED_SOURCE),
        ("FENCE", FENCE_SOURCE),
        ("ACQUIRE_MANY", ACQUIRE_MANY_SOURCE),
        ("RELEASE_MANY", RELEASE_MANY_SOURCE),
        ("EXTEND_MANY", EXTEND_MANY_SOURCE),
        ("CLEANUP", CLEANUP_SOURCE),
        ("CLEANUP_MANY", CLEANUP_MANY_SOURCE),
    ];

    /// One command of a case: `$NAME` stands for a script's source,
    /// `@NAME` for its SHA1, `STATE` for [`FENCE_STATE_KEY`].
    struct Step {
        at: u64,
        conn: u64,
        args: Vec<Vec<u8>>,
        want: Reply,
    }

    fn s(args: &[&str], want: Reply) -> Step {
        let args = args
            .iter()
            .map(|a| {
                let named = |prefix: char| {
                    a.strip_prefix(prefix)
                        .and_then(|name| SCRIPTS.iter().find(|(n, _)| *n == name))
                };
                if let Some((_, source)) = named('$') {
                    source.as_bytes().to_vec()
                } else if let Some((_, source)) = named('@') {
                    Script::new(source).sha().to_vec()
                } else if *a == "STATE" {
                    FENCE_STATE_KEY.to_vec()
                } else {
                    a.as_bytes().to_vec()
                }
            })
            .collect();
        Step {
            at: 0,
            conn: 1,
            args,
            want,
        }
    }

    impl Step {
        /// Run `ms` after [`T0`].
        fn at(mut self, ms: u64) -> Step {
            self.at = ms;
            self
        }

        /// Run on connection `conn` (1 by default).
        fn on(mut self, conn: u64) -> Step {
            self.conn = conn;
            self
        }
    }

    fn ok() -> Reply {
        super::ok()
    }

    fn nil() -> Reply {
        Reply::Nil
    }

    fn int(n: i64) -> Reply {
        Reply::Integer(n)
    }

    fn b(text: &str) -> Reply {
        bulk(text.as_bytes())
    }

    fn e(text: &str) -> Reply {
        Reply::Error(Bytes::copy_from_slice(text.as_bytes()))
    }

    fn arr(items: Vec<Reply>) -> Reply {
        Reply::Array(items)
    }

    fn ints(items: &[i64]) -> Reply {
        arr(items.iter().map(|n| int(*n)).collect())
    }

    fn sha(name: &str) -> String {
        let (_, source) = SCRIPTS.iter().find(|(n, _)| *n == name).expect("a script");
        String::from_utf8_lossy(Script::new(source).sha()).into_owned()
    }

    /// The error a script raises from `redis.call`, Redis 7.0's words.
    fn script_err(text: &str, name: &str, line: u32) -> Reply {
        e(&format!(
            "{text} script: {}, on @user_script:{line}.",
            sha(name)
        ))
    }

    fn lua_err(text: &str, name: &str, line: u32) -> Reply {
        e(&format!(
            "ERR user_script:{line}: {text} script: {}, on @user_script:{line}.",
            sha(name)
        ))
    }

    fn run_case(name: &str, master: &mut Master, steps: Vec<Step>) {
        for (i, step) in steps.into_iter().enumerate() {
            let got = master.handle_command(T0 + step.at, ConnId(step.conn), &step.args);
            let shown: Vec<_> = step
                .args
                .iter()
                .map(|a| String::from_utf8_lossy(a))
                .collect();
            assert_eq!(got, step.want, "{name}: step {i}, {shown:?}");
        }
    }

    fn run_cases(cases: Vec<(&str, Vec<Step>)>) {
        for (name, steps) in cases {
            run_case(name, &mut Master::new(1, T0), steps);
        }
    }

    #[test]
    fn strings_and_expiry_answer_as_redis_7_0() {
        const WRONG: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
        run_cases(vec![
            (
                "SET NX PX stores once, and the key is gone only strictly after its time",
                vec![
                    s(&["SET", "k", "t", "NX", "PX", "100"], ok()),
                    s(&["set", "k", "u", "nx", "px", "100"], nil()),
                    s(&["GET", "k"], b("t")).at(100),
                    s(&["PTTL", "k"], int(0)).at(100),
                    s(&["GET", "k"], nil()).at(101),
                    s(&["PTTL", "k"], int(-2)).at(101),
                    s(&["SET", "k", "u", "NX", "PX", "100"], ok()).at(101),
                    s(&["PTTL", "k"], int(90)).at(111),
                ],
            ),
            (
                "SET refuses conflicting options and bad expiry times as Redis 7.0 does",
                vec![
                    s(&["SET", "k", "v", "NX", "XX"], e("ERR syntax error")),
                    s(
                        &["SET", "k", "v", "PX", "1", "EX", "1"],
                        e("ERR syntax error"),
                    ),
                    s(&["SET", "k", "v", "PX"], e("ERR syntax error")),
                    s(&["SET", "k", "v", "FOO"], e("ERR syntax error")),
                    s(
                        &["SET", "k", "v", "KEEPTTL", "PX", "5"],
                        e("ERR syntax error"),
                    ),
                    s(
                        &["SET", "k", "v", "PX", "0"],
                        e("ERR invalid expire time in 'set' command"),
                    ),
                    s(
                        &["SET", "k", "v", "PX", "-1"],
                        e("ERR invalid expire time in 'set' command"),
                    ),
                    s(
                        &["SET", "k", "v", "PX", "abc"],
                        e("ERR value is not an integer or out of range"),
                    ),
                    s(
                        &["SET", "k", "v", "PX", "05"],
                        e("ERR value is not an integer or out of range"),
                    ),
                    s(
                        &["SET", "k", "v", "PX", "+5"],
                        e("ERR value is not an integer or out of range"),
                    ),
                    s(
                        &["SET", "k", "v", "PX", "9223372036854775807"],
                        e("ERR invalid expire time in 'set' command"),
                    ),
                    s(
                        &["SET", "k", "v", "EX", "9223372036854775"],
                        e("ERR invalid expire time in 'set' command"),
                    ),
                    s(
                        &["SET", "k"],
                        e("ERR wrong number of arguments for 'set' command"),
                    ),
                    s(&["SET", "k", "v", "PX", "5", "PX", "100000"], ok()),
                    s(&["PTTL", "k"], int(100_000)),
                    s(&["SET", "k", "v", "NX", "NX"], nil()),
                ],
            ),
            (
                "KEEPTTL keeps the TTL, a plain SET drops it, and GET returns the old value",
                vec![
                    s(&["SET", "k", "v", "PX", "1000"], ok()),
                    s(&["SET", "k", "w", "KEEPTTL"], ok()),
                    s(&["PTTL", "k"], int(1000)),
                    s(&["SET", "k", "x", "GET"], b("w")),
                    s(&["PTTL", "k"], int(-1)),
                    s(&["SET", "k", "y", "NX", "GET"], b("x")),
                    s(&["GET", "k"], b("x")),
                    s(&["SET", "n", "y", "XX", "GET"], nil()),
                    s(&["EXISTS", "n"], int(0)),
                    s(&["SET", "k", "z", "PXAT", &(T0 + 50).to_string()], ok()),
                    s(&["PTTL", "k"], int(40)).at(10),
                ],
            ),
            (
                "PEXPIRE sets, refuses by its flags, and deletes for a time not in the future",
                vec![
                    s(&["SET", "k", "v"], ok()),
                    s(&["PEXPIRE", "k", "500", "LT"], int(1)),
                    s(&["PEXPIRE", "k", "400", "GT"], int(0)),
                    s(&["PEXPIRE", "k", "600", "gt"], int(1)),
                    s(&["PTTL", "k"], int(600)),
                    s(&["PEXPIRE", "k", "500", "NX"], int(0)),
                    s(&["PEXPIRE", "k", "500", "XX"], int(1)),
                    s(
                        &["PEXPIRE", "k", "1", "NX", "XX"],
                        e("ERR NX and XX, GT or LT options at the same time are not compatible"),
                    ),
                    s(
                        &["PEXPIRE", "k", "1", "GT", "LT"],
                        e("ERR GT and LT options at the same time are not compatible"),
                    ),
                    s(
                        &["PEXPIRE", "k", "x", "FOO"],
                        e("ERR Unsupported option FOO"),
                    ),
                    s(
                        &["PEXPIRE", "k", "x"],
                        e("ERR value is not an integer or out of range"),
                    ),
                    s(
                        &["PEXPIRE", "k", "9223372036854775807"],
                        e("ERR invalid expire time in 'pexpire' command"),
                    ),
                    s(&["PEXPIRE", "k", "0"], int(1)),
                    s(&["EXISTS", "k"], int(0)),
                    s(&["PEXPIRE", "k", "100"], int(0)),
                    s(
                        &["PEXPIRE", "k"],
                        e("ERR wrong number of arguments for 'pexpire' command"),
                    ),
                ],
            ),
            (
                "DEL and EXISTS count each key named, live keys only",
                vec![
                    s(&["SET", "a", "1"], ok()),
                    s(&["SET", "b", "2", "PX", "10"], ok()),
                    s(&["EXISTS", "a", "a", "b", "c"], int(3)),
                    s(&["EXISTS", "a", "a", "b", "c"], int(2)).at(11),
                    s(&["DEL", "a", "b", "c"], int(1)).at(11),
                    s(
                        &["DEL"],
                        e("ERR wrong number of arguments for 'del' command"),
                    ),
                ],
            ),
            (
                "a hash is WRONGTYPE to GET and SET GET, and any key to DEL, EXISTS and PTTL",
                vec![
                    s(
                        &[
                            "EVAL",
                            "$ACQUIRE_FENCED",
                            "3",
                            "l",
                            "f",
                            "STATE",
                            "t",
                            "1000",
                        ],
                        ints(&[0, 0, 0, 0]),
                    ),
                    s(&["GET", "STATE"], e(WRONG)),
                    s(&["SET", "STATE", "x", "GET"], e(WRONG)),
                    s(&["PTTL", "STATE"], int(-1)),
                    s(
                        &["HGETALL", "STATE"],
                        arr(vec![b("since"), b(&T0.to_string())]),
                    ),
                    s(&["EXISTS", "STATE"], int(1)),
                    s(&["DEL", "STATE"], int(1)),
                    s(&["HGETALL", "STATE"], arr(vec![])),
                    s(&["HGETALL", "l"], e(WRONG)),
                ],
            ),
            (
                "SELECT keeps each database apart and refuses what Redis refuses",
                vec![
                    s(&["SET", "k", "0"], ok()),
                    s(&["SELECT", "1"], ok()),
                    s(&["GET", "k"], nil()),
                    s(&["SELECT", "16"], e("ERR DB index is out of range")),
                    s(&["SELECT", "-1"], e("ERR DB index is out of range")),
                    s(
                        &["SELECT", "x"],
                        e("ERR value is not an integer or out of range"),
                    ),
                    s(
                        &["SELECT", "99999999999"],
                        e(
                            "ERR value is out of range, value must between -2147483648 and 2147483647",
                        ),
                    ),
                    s(&["GET", "k"], nil()),
                    s(&["GET", "k"], b("0")).on(2),
                    s(&["SELECT", "15"], ok()).on(2),
                ],
            ),
        ]);
    }

    #[test]
    fn commands_and_connections_answer_as_redis_7_0() {
        run_cases(vec![
            (
                "unknown commands and subcommands, and wrong arities, are named as Redis names them",
                vec![
                    s(
                        &["FOO", "a", "b"],
                        e("ERR unknown command 'FOO', with args beginning with: 'a' 'b' "),
                    ),
                    s(
                        &["FOO"],
                        e("ERR unknown command 'FOO', with args beginning with: "),
                    ),
                    s(
                        &["FOO", "a\r\nb"],
                        e("ERR unknown command 'FOO', with args beginning with: 'a  b' "),
                    ),
                    s(
                        &["script", "foo"],
                        e("ERR unknown subcommand 'foo'. Try SCRIPT HELP."),
                    ),
                    s(
                        &["CLIENT", "FOO"],
                        e("ERR unknown subcommand 'FOO'. Try CLIENT HELP."),
                    ),
                    s(
                        &["SCRIPT"],
                        e("ERR wrong number of arguments for 'script' command"),
                    ),
                    s(
                        &["CLIENT"],
                        e("ERR wrong number of arguments for 'client' command"),
                    ),
                    s(
                        &["SCRIPT", "LOAD"],
                        e("ERR wrong number of arguments for 'script|load' command"),
                    ),
                    s(
                        &["SCRIPT", "EXISTS"],
                        e("ERR wrong number of arguments for 'script|exists' command"),
                    ),
                    s(
                        &["GET"],
                        e("ERR wrong number of arguments for 'get' command"),
                    ),
                    s(
                        &["PING", "a", "b"],
                        e("ERR wrong number of arguments for 'ping' command"),
                    ),
                    s(
                        &["EVAL", "return 1"],
                        e("ERR wrong number of arguments for 'eval' command"),
                    ),
                    s(&["PING"], Reply::Status(Bytes::from_static(b"PONG"))),
                    s(&["PING", "hi"], b("hi")),
                ],
            ),
            (
                "AUTH without requirepass: one argument is an error, default takes any password",
                vec![
                    s(
                        &["AUTH", "pw"],
                        e(
                            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
                        ),
                    ),
                    s(&["AUTH", "default", "x"], ok()),
                    s(
                        &["AUTH", "u", "p"],
                        e("WRONGPASS invalid username-password pair or user is disabled."),
                    ),
                    s(&["AUTH", "a", "b", "c"], e("ERR syntax error")),
                    s(
                        &["AUTH"],
                        e("ERR wrong number of arguments for 'auth' command"),
                    ),
                ],
            ),
            (
                "CLIENT SETNAME takes printable names only, and an empty one clears it",
                vec![
                    s(
                        &["CLIENT", "SETNAME", "a b"],
                        e(
                            "ERR Client names cannot contain spaces, newlines or special characters.",
                        ),
                    ),
                    s(&["CLIENT", "GETNAME"], nil()),
                    s(&["CLIENT", "SETNAME", "ab"], ok()),
                    s(&["client", "getname"], b("ab")),
                    s(&["CLIENT", "GETNAME"], nil()).on(2),
                    s(&["CLIENT", "SETNAME", ""], ok()),
                    s(&["CLIENT", "GETNAME"], nil()),
                ],
            ),
            (
                "PUBSUB NUMSUB counts subscribers per channel, and PUBLISH how many got it",
                vec![
                    s(
                        &["SUBSCRIBE", "a"],
                        arr(vec![b("subscribe"), b("a"), int(1)]),
                    )
                    .on(2),
                    s(
                        &["SUBSCRIBE", "a"],
                        arr(vec![b("subscribe"), b("a"), int(1)]),
                    )
                    .on(3),
                    s(
                        &["PUBSUB", "NUMSUB", "a", "b"],
                        arr(vec![b("a"), int(2), b("b"), int(0)]),
                    ),
                    s(&["PUBSUB", "NUMSUB"], arr(vec![])),
                    s(&["PUBLISH", "a", "m"], int(2)),
                    s(&["PUBLISH", "b", "m"], int(0)),
                    s(
                        &["PUBLISH", "a"],
                        e("ERR wrong number of arguments for 'publish' command"),
                    ),
                ],
            ),
        ]);
    }

    #[test]
    fn requirepass_makes_connections_authenticate_first() {
        let settings = Settings {
            requirepass: Some(Bytes::from_static(b"pw")),
            users: vec![(Bytes::from_static(b"u"), Bytes::from_static(b"up"))],
            ..Settings::default()
        };
        let mut master = Master::new(1, T0).with_settings(settings);
        let noauth = || e("NOAUTH Authentication required.");
        let wrongpass = || e("WRONGPASS invalid username-password pair or user is disabled.");
        run_case(
            "requirepass",
            &mut master,
            vec![
                s(&["GET", "k"], noauth()),
                s(&["PING"], noauth()),
                s(&["SELECT", "1"], noauth()),
                // Existence and arity are checked before authentication.
                s(
                    &["FOO"],
                    e("ERR unknown command 'FOO', with args beginning with: "),
                ),
                s(
                    &["GET"],
                    e("ERR wrong number of arguments for 'get' command"),
                ),
                s(&["AUTH", "bad"], wrongpass()),
                s(&["AUTH", "default", "bad"], wrongpass()),
                s(&["GET", "k"], noauth()),
                s(&["AUTH", "pw"], ok()),
                // A failed AUTH leaves the connection authenticated.
                s(&["AUTH", "bad"], wrongpass()),
                s(&["GET", "k"], nil()),
                s(&["GET", "k"], noauth()).on(2),
                s(&["AUTH", "u", "up"], ok()).on(2),
                s(&["GET", "k"], nil()).on(2),
                s(&["AUTH", "default", "pw"], ok()).on(3),
            ],
        );
        master.handle_disconnect(ConnId(1));
        run_case(
            "requirepass after a reconnect",
            &mut master,
            vec![s(&["GET", "k"], noauth())],
        );
        master.settings_mut().requirepass = None;
        run_case(
            "requirepass removed",
            &mut master,
            vec![s(&["GET", "k"], nil())],
        );
    }

    #[test]
    fn the_script_cache_answers_as_redis_7_0() {
        let cannot = "ERR redlock-mio's model of a master cannot run script e0e1f9fabfc9d4800c877a703b823ac0578ff8db: it runs only the scripts of src/script.rs";
        run_cases(vec![(
            "SCRIPT LOAD returns the SHA1, EXISTS ignores case, FLUSH empties, EVALSHA before a load is NOSCRIPT",
            vec![
                s(
                    &["EVALSHA", "@RELEASE", "1", "k", "t"],
                    e("NOSCRIPT No matching script. Please use EVAL."),
                ),
                s(
                    &["SCRIPT", "LOAD", "return 1"],
                    b("e0e1f9fabfc9d4800c877a703b823ac0578ff8db"),
                ),
                s(
                    &[
                        "SCRIPT",
                        "EXISTS",
                        "E0E1F9FABFC9D4800C877A703B823AC0578FF8DB",
                        "e0e1f9fabfc9d4800c877a703b823ac0578ff8db",
                        "zz",
                    ],
                    ints(&[1, 1, 0]),
                ),
                s(
                    &["EVALSHA", "E0E1F9FABFC9D4800C877A703B823AC0578FF8DB", "0"],
                    e(cannot),
                ),
                s(&["EVAL", "return 1", "0"], e(cannot)),
                s(
                    &["EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8dbX", "0"],
                    e("NOSCRIPT No matching script. Please use EVAL."),
                ),
                s(
                    &["EVALSHA", "ffffffffbfc9d4800c877a703b823ac0578ff8db", "x"],
                    e("ERR value is not an integer or out of range"),
                ),
                s(
                    &[
                        "EVALSHA",
                        "e0e1f9fabfc9d4800c877a703b823ac0578ff8db",
                        "2",
                        "a",
                    ],
                    e("ERR Number of keys can't be greater than number of args"),
                ),
                s(
                    &["EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "-1"],
                    e("ERR Number of keys can't be negative"),
                ),
                s(
                    &["EVALSHA", "x"],
                    e("ERR wrong number of arguments for 'evalsha' command"),
                ),
                s(
                    &["SCRIPT", "FLUSH", "x"],
                    e("ERR SCRIPT FLUSH only support SYNC|ASYNC option"),
                ),
                s(
                    &["SCRIPT", "FLUSH", "SYNC", "ASYNC"],
                    e("ERR SCRIPT FLUSH only support SYNC|ASYNC option"),
                ),
                s(&["SCRIPT", "FLUSH", "async"], ok()),
                s(
                    &[
                        "SCRIPT",
                        "EXISTS",
                        "e0e1f9fabfc9d4800c877a703b823ac0578ff8db",
                    ],
                    ints(&[0]),
                ),
                s(&["EVAL", "$RELEASE", "1", "k", "t"], int(0)),
                s(&["EVALSHA", "@RELEASE", "1", "k", "t"], int(0)),
                s(&["SCRIPT", "FLUSH"], ok()),
                s(
                    &["EVALSHA", "@RELEASE", "1", "k", "t"],
                    e("NOSCRIPT No matching script. Please use EVAL."),
                ),
            ],
        )]);
    }

    /// Each script's cases, with what Redis 7.0 answered to the same
    /// commands (times fixed here: the master's clock does not move).
    #[test]
    fn each_script_answers_as_its_lua_does_on_redis_7_0() {
        let args_err = "ERR Lua redis lib command arguments must be strings or integers";
        let wrong = "WRONGTYPE Operation against a key holding the wrong kind of value";
        let not_int = "ERR value is not an integer or out of range";
        let bad_set = "ERR invalid expire time in 'set' command";
        run_cases(vec![
            (
                "RELEASE deletes only its own token's key",
                vec![
                    s(
                        &["EVAL", "$RELEASE", "0"],
                        script_err(args_err, "RELEASE", 1),
                    ),
                    s(&["EVAL", "$RELEASE", "1", "k"], int(0)),
                    s(&["SET", "k", "t"], ok()),
                    s(&["EVALSHA", "@RELEASE", "1", "k", "u"], int(0)),
                    s(&["EVAL", "$RELEASE", "1", "k"], int(0)),
                    s(&["EVALSHA", "@RELEASE", "1", "k", "t"], int(1)),
                    s(&["GET", "k"], nil()),
                    s(
                        &["EVAL", "$ACQUIRE_FENCED", "3", "l", "f", "h", "t", "100"],
                        ints(&[0, 0, 0, 0]),
                    ),
                    s(
                        &["EVAL", "$RELEASE", "1", "h", "t"],
                        script_err(wrong, "RELEASE", 1),
                    ),
                ],
            ),
            (
                "ACQUIRE_WAIT sets, or answers minus the holder's PTTL and its value",
                vec![
                    s(
                        &["EVAL", "$ACQUIRE_WAIT", "1", "k", "t"],
                        script_err(args_err, "ACQUIRE_WAIT", 1),
                    ),
                    s(
                        &["EVAL", "$ACQUIRE_WAIT", "1", "k", "t", "x"],
                        script_err(not_int, "ACQUIRE_WAIT", 1),
                    ),
                    s(
                        &["EVAL", "$ACQUIRE_WAIT", "1", "k", "t", "0"],
                        script_err(bad_set, "ACQUIRE_WAIT", 1),
                    ),
                    s(&["EVAL", "$ACQUIRE_WAIT", "1", "k", "t", "100000"], int(1)),
                    s(
                        &["EVAL", "$ACQUIRE_WAIT", "1", "k", "u", "100000"],
                        arr(vec![int(-99_980), b("t")]),
                    )
                    .at(20),
                    s(&["SET", "p", "v"], ok()),
                    s(
                        &["EVAL", "$ACQUIRE_WAIT", "1", "p", "u", "100000"],
                        arr(vec![int(0), b("v")]),
                    ),
                    s(&["EVAL", "$ACQUIRE_WAIT", "1", "k", "u", "100000"], int(1)).at(100_001),
                ],
            ),
            (
                "EXTEND sets the TTL of its own token's key, and deletes it for a TTL not in the future",
                vec![
                    s(&["SET", "k", "t", "PX", "100"], ok()),
                    s(
                        &["EVAL", "$EXTEND", "1", "k", "t", "x"],
                        script_err(not_int, "EXTEND", 1),
                    ),
                    s(
                        &["EVAL", "$EXTEND", "1", "k", "t", "9223372036854775807"],
                        script_err("ERR invalid expire time in 'pexpire' command", "EXTEND", 1),
                    ),
                    s(
                        &["EVAL", "$EXTEND", "1", "k", "t"],
                        script_err(args_err, "EXTEND", 1),
                    ),
                    s(&["EVAL", "$EXTEND", "1", "k", "u", "5000"], int(0)),
                    s(&["EVAL", "$EXTEND", "1", "k", "t", "5000"], int(1)),
                    s(&["PTTL", "k"], int(5000)),
                    s(&["EVAL", "$EXTEND", "1", "k", "t", "-5"], int(1)),
                    s(&["EXISTS", "k"], int(0)),
                ],
            ),
            (
                "ACQUIRE_FENCED and FENCE keep the fence state as their Lua does",
                vec![
                    s(
                        &[
                            "EVAL",
                            "$ACQUIRE_FENCED",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "t",
                            "100000",
                        ],
                        ints(&[0, 0, 0, 0]),
                    ),
                    s(
                        &[
                            "EVAL",
                            "$ACQUIRE_FENCED",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "t",
                            "100000",
                        ],
                        arr(vec![int(-100_000), b("t")]),
                    ),
                    s(
                        &[
                            "EVAL",
                            "$FENCE",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "bootstrap",
                            "t",
                            "1.5",
                        ],
                        int(1),
                    ),
                    s(&["GET", "ff"], b("1.5")),
                    s(
                        &["HGETALL", "STATE"],
                        arr(vec![b("marked"), b("1"), b("high"), b("1.5")]),
                    ),
                    s(
                        &[
                            "EVAL",
                            "$FENCE",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "bootstrap",
                            "t",
                            "abc",
                        ],
                        lua_err("attempt to compare number with nil", "FENCE", 4),
                    ),
                    s(
                        &["EVAL", "$FENCE", "3", "fk", "ff", "STATE", "bootstrap", "t"],
                        lua_err("attempt to compare number with nil", "FENCE", 4),
                    ),
                    s(&["DEL", "fk"], int(1)),
                    s(
                        &[
                            "EVAL",
                            "$ACQUIRE_FENCED",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "t",
                            "100000",
                        ],
                        ints(&[1, 2, 1, -1]),
                    ),
                    s(&["DEL", "fk", "STATE"], int(2)),
                    s(&["SET", "STATE", "x"], ok()),
                    s(
                        &[
                            "EVAL",
                            "$ACQUIRE_FENCED",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "t",
                            "100000",
                        ],
                        script_err(wrong, "ACQUIRE_FENCED", 3),
                    ),
                    s(&["PTTL", "fk"], int(100_000)),
                    s(&["DEL", "fk", "STATE"], int(2)),
                    s(
                        &[
                            "EVAL",
                            "$ACQUIRE_FENCED",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "t",
                            "100000",
                        ],
                        ints(&[1, 1, 0, 0]),
                    ),
                    // What HSET STATE since zzz did on Redis.
                    s(
                        &[
                            "EVAL",
                            "$FENCE",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "readmit:5",
                            "t",
                            "7",
                        ],
                        int(1),
                    )
                    .at(0),
                    s(
                        &[
                            "EVAL", "$FENCE", "3", "fk", "ff", "STATE", "readmit:", "t", "7",
                        ],
                        int(1),
                    ),
                    s(
                        &["EVAL", "$FENCE", "2", "fk", "ff", "STATE", "t", "7"],
                        script_err(args_err, "FENCE", 5),
                    ),
                    s(&["EVAL", "$FENCE", "3", "fk", "ff", "STATE"], int(0)),
                ],
            ),
            (
                "FENCE readmits a master seen unmarked for long enough, by its own clock",
                vec![
                    s(
                        &[
                            "EVAL",
                            "$ACQUIRE_FENCED",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "t",
                            "100000",
                        ],
                        ints(&[0, 0, 0, 0]),
                    ),
                    s(
                        &[
                            "EVAL",
                            "$FENCE",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "readmit:1000",
                            "t",
                            "4",
                        ],
                        int(1),
                    )
                    .at(999),
                    s(
                        &["HGETALL", "STATE"],
                        arr(vec![b("since"), b(&T0.to_string()), b("high"), b("4")]),
                    ),
                    s(
                        &[
                            "EVAL",
                            "$FENCE",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "readmit:1000",
                            "t",
                            "9",
                        ],
                        int(1),
                    )
                    .at(1000),
                    s(
                        &["HGETALL", "STATE"],
                        arr(vec![
                            b("high"),
                            b("9"),
                            b("floor"),
                            b("9"),
                            b("marked"),
                            b("1"),
                        ]),
                    ),
                    s(&["GET", "ff"], b("9")),
                    s(
                        &["EVAL", "$FENCE", "3", "fk", "ff", "STATE", "none", "t", "3"],
                        int(1),
                    ),
                    s(&["GET", "ff"], b("9")),
                    s(&["DEL", "fk"], int(1)),
                    s(
                        &[
                            "EVAL",
                            "$ACQUIRE_FENCED",
                            "3",
                            "fk",
                            "ff",
                            "STATE",
                            "t",
                            "100000",
                        ],
                        ints(&[9, 2, 9, -1]),
                    ),
                ],
            ),
            (
                "ACQUIRE_MANY, RELEASE_MANY and EXTEND_MANY go key by key as their Lua does",
                vec![
                    s(&["EVAL", "$ACQUIRE_MANY", "0", "t", "100"], int(1)),
                    s(
                        &["EVAL", "$ACQUIRE_MANY", "2", "m1", "m1", "t", "100000"],
                        int(1),
                    ),
                    s(
                        &["EVAL", "$ACQUIRE_MANY", "2", "m2", "m1", "t", "100000"],
                        arr(vec![int(-100_000), b("t")]),
                    ),
                    // The longest PTTL of those that exist, the first on a
                    // tie; a key with no expiry counts as 0.
                    s(&["SET", "m3", "u", "PX", "200000"], ok()),
                    s(&["SET", "m4", "v"], ok()),
                    s(
                        &[
                            "EVAL",
                            "$ACQUIRE_MANY",
                            "4",
                            "m4",
                            "m2",
                            "m1",
                            "m3",
                            "t",
                            "100000",
                        ],
                        arr(vec![int(-200_000), b("u")]),
                    ),
                    s(
                        &["EVAL", "$ACQUIRE_MANY", "2", "m4", "m2", "t", "100000"],
                        arr(vec![int(0), b("v")]),
                    ),
                    s(&["SET", "m5", "w", "PX", "200000"], ok()),
                    s(
                        &[
                            "EVAL",
                            "$ACQUIRE_MANY",
                            "3",
                            "m1",
                            "m3",
                            "m5",
                            "t",
                            "100000",
                        ],
                        arr(vec![int(-200_000), b("u")]),
                    ),
                    s(
                        &["EVAL", "$ACQUIRE_MANY", "1", "m2", "t", "-5"],
                        script_err(bad_set, "ACQUIRE_MANY", 1),
                    ),
                    s(
                        &["EVAL", "$ACQUIRE_MANY", "1", "m2", "t"],
                        script_err(args_err, "ACQUIRE_MANY", 1),
                    ),
                    s(
                        &["EVAL", "$ACQUIRE_FENCED", "3", "l", "f", "h", "t", "100"],
                        ints(&[0, 0, 0, 0]),
                    ),
                    s(
                        &["EVAL", "$EXTEND_MANY", "2", "m1", "h", "t", "5"],
                        script_err(wrong, "EXTEND_MANY", 1),
                    ),
                    s(&["EVAL", "$EXTEND_MANY", "2", "m1", "l", "u", "5"], int(0)),
                    s(
                        &["EVAL", "$EXTEND_MANY", "2", "m1", "l", "t", "5000"],
                        int(1),
                    ),
                    s(&["PTTL", "l"], int(5000)),
                    s(
                        &["EVAL", "$RELEASE_MANY", "3", "m1", "m1", "h", "t"],
                        script_err(wrong, "RELEASE_MANY", 1),
                    ),
                    s(&["EXISTS", "m1"], int(0)),
                    s(&["EVAL", "$RELEASE_MANY", "2", "l", "m1", "t"], int(0)),
                    s(&["EVAL", "$EXTEND_MANY", "0", "t", "5"], int(1)),
                ],
            ),
        ]);
    }

    /// Drains the frames queued for other connections or after a reply.
    fn pushes(master: &mut Master) -> Vec<(u64, Reply)> {
        std::iter::from_fn(|| master.poll_push())
            .map(|(c, r)| (c.0, r))
            .collect()
    }

    fn message(channel: &str, payload: &str) -> Reply {
        arr(vec![b("message"), b(channel), b(payload)])
    }

    #[test]
    fn subscribers_get_confirmations_and_messages_as_resp2_frames() {
        let mut m = Master::new(1, T0);
        let cmd = |m: &mut Master, conn: u64, args: &[&str]| {
            let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            m.handle_command(T0, ConnId(conn), &args)
        };
        let confirm = |kind: &str, channel: Option<&str>, n: i64| {
            arr(vec![b(kind), channel.map_or(Reply::Nil, b), int(n)])
        };
        assert_eq!(
            cmd(&mut m, 2, &["SUBSCRIBE", "a", "b", "a"]),
            confirm("subscribe", Some("a"), 1)
        );
        assert_eq!(
            pushes(&mut m),
            [
                (2, confirm("subscribe", Some("b"), 2)),
                (2, confirm("subscribe", Some("a"), 2))
            ]
        );
        // A subscriber refuses everything but (UN)SUBSCRIBE and PING.
        let refused = |name: &str| {
            e(&format!(
                "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
            ))
        };
        assert_eq!(cmd(&mut m, 2, &["GET", "k"]), refused("get"));
        assert_eq!(
            cmd(&mut m, 2, &["SCRIPT", "LOAD", "x"]),
            refused("script|load")
        );
        assert_eq!(
            cmd(&mut m, 2, &["SET", "k"]),
            e("ERR wrong number of arguments for 'set' command")
        );
        assert_eq!(cmd(&mut m, 2, &["PING"]), arr(vec![b("pong"), b("")]));
        assert_eq!(cmd(&mut m, 2, &["PING", "x"]), arr(vec![b("pong"), b("x")]));
        // A release publishes its token on the resource's channel.
        assert_eq!(
            cmd(&mut m, 3, &["SUBSCRIBE", "redlock:released:r"]),
            confirm("subscribe", Some("redlock:released:r"), 1)
        );
        assert_eq!(cmd(&mut m, 1, &["SET", "r", "t"]), ok());
        let release = [RELEASE_SOURCE, "1", "r", "t"];
        assert_eq!(cmd(&mut m, 1, &[&["EVAL"][..], &release].concat()), int(1));
        assert_eq!(pushes(&mut m), [(3, message("redlock:released:r", "t"))]);
        assert_eq!(cmd(&mut m, 1, &["PUBLISH", "a", "hello"]), int(1));
        assert_eq!(pushes(&mut m), [(2, message("a", "hello"))]);
        assert_eq!(
            cmd(&mut m, 2, &["UNSUBSCRIBE", "c"]),
            confirm("unsubscribe", Some("c"), 2)
        );
        assert_eq!(
            cmd(&mut m, 2, &["UNSUBSCRIBE"]),
            confirm("unsubscribe", Some("a"), 1)
        );
        assert_eq!(pushes(&mut m), [(2, confirm("unsubscribe", Some("b"), 0))]);
        assert_eq!(
            cmd(&mut m, 2, &["UNSUBSCRIBE"]),
            confirm("unsubscribe", None, 0)
        );
        assert_eq!(cmd(&mut m, 2, &["GET", "k"]), nil());
        assert_eq!(
            cmd(&mut m, 2, &["PING"]),
            Reply::Status(Bytes::from_static(b"PONG"))
        );
        // A disconnect drops the subscriptions and the frames queued.
        assert_eq!(
            cmd(&mut m, 1, &["PUBLISH", "redlock:released:r", "x"]),
            int(1)
        );
        m.handle_disconnect(ConnId(3));
        assert_eq!(pushes(&mut m), []);
        assert_eq!(
            cmd(&mut m, 1, &["PUBSUB", "NUMSUB", "redlock:released:r"]),
            arr(vec![b("redlock:released:r"), int(0)])
        );
    }

    #[test]
    fn refusals_answer_as_an_acl_on_redis_7_0() {
        let settings = Settings {
            deny_publish: true,
            deny_subscribe: true,
            deny_info: true,
            deny_script_load: true,
            ..Settings::default()
        };
        let mut m = Master::new(1, T0).with_settings(settings);
        let channel =
            "NOPERM this user has no permissions to access one of the channels used as arguments";
        run_case(
            "every refusal on",
            &mut m,
            vec![
                s(&["PUBLISH", "c", "m"], e(channel)),
                s(&["SUBSCRIBE", "c"], e(channel)),
                s(&["PING"], Reply::Status(Bytes::from_static(b"PONG"))),
                s(
                    &["INFO"],
                    e("NOPERM this user has no permissions to run the 'info' command"),
                ),
                s(
                    &["INFO", "server"],
                    e("NOPERM this user has no permissions to run the 'info' command"),
                ),
                s(
                    &["SCRIPT", "LOAD", "return 1"],
                    e("NOPERM this user has no permissions to run the 'script|load' command"),
                ),
                s(&["SET", "r", "t"], ok()),
                // The release still releases, and publishes nothing.
                s(&["EVAL", "$RELEASE", "1", "r", "t"], int(1)),
                s(&["GET", "r"], nil()),
            ],
        );
        m.settings_mut().deny_subscribe = false;
        run_case(
            "subscribing allowed",
            &mut m,
            vec![
                s(
                    &["SUBSCRIBE", "redlock:released:r"],
                    arr(vec![b("subscribe"), b("redlock:released:r"), int(1)]),
                )
                .on(2),
                s(&["SET", "r", "t"], ok()),
                s(&["EVAL", "$RELEASE_MANY", "1", "r", "t"], int(1)),
            ],
        );
        assert_eq!(pushes(&mut m), []);
        assert_eq!(m.pcall_publish(b"r", &[b"t"]), Err(SCRIPT_PUBLISH_REFUSED));
        m.settings_mut().deny_publish = false;
        assert_eq!(m.pcall_publish(b"r", &[b"t"]), Ok(1));
        assert_eq!(pushes(&mut m), [(2, message("redlock:released:r", "t"))]);
    }

    fn info_field(info: &Reply, field: &str) -> Option<String> {
        let Reply::Bulk(text) = info else {
            return None;
        };
        String::from_utf8_lossy(text).lines().find_map(|l| {
            l.strip_prefix(field)
                .and_then(|v| v.strip_prefix(':'))
                .map(str::to_owned)
        })
    }

    #[test]
    fn info_reports_the_run_id_and_uptime_as_redis_computes_them() {
        let mut m = Master::new(9, T0);
        let info = |m: &mut Master, at: u64, args: &[&str]| {
            m.handle_command(
                T0 + at,
                ConnId(1),
                &args.iter().map(|a| a.as_bytes()).collect::<Vec<_>>(),
            )
        };
        let first = info(&mut m, 0, &["INFO", "server"]);
        let run_id = info_field(&first, "run_id").expect("run_id");
        assert_eq!(run_id.len(), 40);
        assert!(
            run_id
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(run_id.as_bytes(), m.run_id());
        assert_eq!(
            info_field(&first, "redis_version").as_deref(),
            Some(REDIS_VERSION)
        );
        // Started 300 ms into a second: 700 ms later is the next second.
        let cases = [
            ("the same second", 699, "0"),
            ("the next second", 700, "1"),
            ("a day on", 86_400_000, "86400"),
        ];
        for (name, at, want) in cases {
            let reply = info(&mut m, at, &["INFO"]);
            assert_eq!(
                info_field(&reply, "uptime_in_seconds").as_deref(),
                Some(want),
                "{name}"
            );
        }
        assert_eq!(info(&mut m, 0, &["INFO", "foo"]), b(""));
        let all = info(&mut m, 0, &["INFO", "everything"]);
        assert_eq!(
            info_field(&all, "cmdstat_info").as_deref(),
            Some("calls=6,usec=0,usec_per_call=0.00,rejected_calls=0,failed_calls=0")
        );
        assert_eq!(
            info(&mut m, 0, &["EVALSHA", &"0".repeat(40), "0"]),
            e("NOSCRIPT No matching script. Please use EVAL.")
        );
        let errors = info(&mut m, 0, &["INFO", "errorstats"]);
        assert_eq!(
            info_field(&errors, "errorstat_NOSCRIPT").as_deref(),
            Some("count=1")
        );
        m.restart(T0 + 5_000, true);
        let after = info(&mut m, 5_000, &["INFO", "server"]);
        assert_ne!(info_field(&after, "run_id"), Some(run_id));
        assert_eq!(
            info_field(&after, "uptime_in_seconds").as_deref(),
            Some("0")
        );
        assert_eq!(
            info_field(
                &info(&mut m, 5_000, &["INFO", "errorstats"]),
                "errorstat_NOSCRIPT"
            ),
            None
        );
    }

    #[test]
    fn a_restart_keeps_or_loses_the_data_and_always_the_scripts_and_connections() {
        for keep_data in [true, false] {
            let mut m = Master::new(1, T0);
            let settings = Settings {
                requirepass: Some(Bytes::from_static(b"pw")),
                ..Settings::default()
            };
            *m.settings_mut() = settings;
            run_case(
                "before the restart",
                &mut m,
                vec![
                    s(&["AUTH", "pw"], ok()),
                    s(&["SELECT", "2"], ok()),
                    s(&["SET", "k", "t", "PX", "1000"], ok()),
                    s(&["SCRIPT", "LOAD", "$RELEASE"], b(&sha("RELEASE"))),
                    s(&["AUTH", "pw"], ok()).on(2),
                    s(
                        &["SUBSCRIBE", "c"],
                        arr(vec![b("subscribe"), b("c"), int(1)]),
                    )
                    .on(2),
                ],
            );
            m.restart(T0 + 500, keep_data);
            let held = if keep_data { b("t") } else { nil() };
            run_case(
                "after the restart",
                &mut m,
                vec![
                    s(&["GET", "k"], e("NOAUTH Authentication required.")).at(500),
                    s(&["AUTH", "pw"], ok()).at(500),
                    s(&["SELECT", "2"], ok()).at(500),
                    s(&["GET", "k"], held).at(500),
                    s(&["GET", "k"], nil()).at(1001),
                    s(
                        &["EVALSHA", "@RELEASE", "1", "k", "t"],
                        e("NOSCRIPT No matching script. Please use EVAL."),
                    )
                    .at(500),
                    s(&["PUBSUB", "NUMSUB", "c"], arr(vec![b("c"), int(0)])).at(500),
                ],
            );
            assert_eq!(m.peek(T0 + 900, 2, b"k"), None, "peek after GET expired it");
        }
    }

    #[test]
    fn eval_scripts_beyond_500_are_evicted_least_recently_used_first_when_the_lru_is_on() {
        for lru in [true, false] {
            let mut m = Master::new(1, T0);
            m.settings_mut().eval_lru = lru;
            let eval = |m: &mut Master, source: &str| {
                m.handle_command(
                    T0,
                    ConnId(1),
                    &[&b"EVAL"[..], source.as_bytes(), b"1", b"k", b"t"],
                )
            };
            let exists = |m: &mut Master, source: &str| {
                let sha = sha1_hex(source.as_bytes());
                m.handle_command(T0, ConnId(1), &[&b"SCRIPT"[..], b"EXISTS", &sha]) == ints(&[1])
            };
            // The release script made by EVAL and used again late stays;
            // the extend script made by EVAL first and never used again
            // goes; one made by SCRIPT LOAD never goes.
            assert_eq!(eval(&mut m, EXTEND_SOURCE), int(0));
            let load = m.handle_command(
                T0,
                ConnId(1),
                &[&b"SCRIPT"[..], b"LOAD", b"return 'loaded'"],
            );
            assert!(matches!(load, Reply::Bulk(_)));
            assert_eq!(eval(&mut m, RELEASE_SOURCE), int(0));
            for i in 0..(EVAL_LRU_CAPACITY - 2) {
                let _ = eval(&mut m, &format!("return {i}"));
            }
            assert_eq!(eval(&mut m, RELEASE_SOURCE), int(0));
            let _ = eval(&mut m, "return 'one more'");
            assert_eq!(exists(&mut m, EXTEND_SOURCE), !lru, "lru {lru}: the oldest");
            assert!(exists(&mut m, RELEASE_SOURCE), "lru {lru}: used again");
            assert!(exists(&mut m, "return 'loaded'"), "lru {lru}: loaded");
            assert!(exists(&mut m, "return 0"), "lru {lru}: only one evicted");
            let _ = eval(&mut m, "return 'and another'");
            assert_eq!(
                exists(&mut m, "return 0"),
                !lru,
                "lru {lru}: the next oldest"
            );
            // SCRIPT LOAD of an EVAL script takes it out of the LRU.
            let load = m.handle_command(T0, ConnId(1), &[&b"SCRIPT"[..], b"LOAD", b"return 1"]);
            assert!(matches!(load, Reply::Bulk(_)));
            for i in 0..EVAL_LRU_CAPACITY {
                let _ = eval(&mut m, &format!("return 'later {i}'"));
            }
            assert!(
                exists(&mut m, "return 1"),
                "lru {lru}: promoted by SCRIPT LOAD"
            );
            assert_eq!(exists(&mut m, "return 2"), !lru, "lru {lru}: not promoted");
        }
    }

    #[test]
    fn every_script_of_src_script_rs_runs_natively() {
        let source = include_str!("../script.rs");
        let declared = source.matches("_SOURCE: &str =").count();
        let master = Master::new(1, T0);
        assert_eq!(
            declared,
            master.natives.len(),
            "a script the model does not run"
        );
        assert_eq!(declared, SCRIPTS.len());
        for (name, text) in SCRIPTS {
            let sha = *Script::new(text).sha();
            assert!(master.natives.iter().any(|n| n.sha == sha), "{name}");
        }
    }

    #[test]
    fn arena_copies_read_back_as_given_across_blocks() {
        let mut arena = Arena::default();
        let long = vec![b'x'; ARENA_BLOCK];
        let cases: [(&str, &[&[u8]]); 5] = [
            ("empty", &[]),
            (
                "a token",
                &[b"0123456789abcdef0123456789abcdef0123456789abcdef"],
            ),
            ("in parts", &[b"?", b"t", b"", b":next"]),
            ("an empty part alone", &[b""]),
            ("longer than a block", &[&long]),
        ];
        let mut kept = Vec::new();
        // Enough rounds to fill several blocks; what was cut before stays.
        for _ in 0..200 {
            for (name, parts) in cases {
                let copy = arena.concat(parts);
                assert_eq!(copy, parts.concat(), "{name}");
                kept.push((copy, parts.concat()));
            }
        }
        for (copy, want) in kept {
            assert_eq!(copy, want);
        }
        assert_eq!(arena.copy(b"r0"), &b"r0"[..]);
    }

    #[test]
    fn lua_numbers_read_and_convert_as_redis_lua_does() {
        let cases: [(&str, &[u8], Option<f64>); 12] = [
            ("an integer", b"42", Some(42.0)),
            ("a fraction", b"1.5", Some(1.5)),
            ("blanks around", b" \t7\n", Some(7.0)),
            ("an exponent", b"1e3", Some(1000.0)),
            ("hexadecimal", b"0x10", Some(16.0)),
            ("a negative hexadecimal", b"-0x10", Some(-16.0)),
            ("stops at a NUL", b"12\0ab", Some(12.0)),
            ("a plus sign", b"+5", Some(5.0)),
            ("two signs", b"-+5", None),
            ("a word", b"abc", None),
            ("trailing garbage", b"5x", None),
            ("nothing", b"", None),
        ];
        for (name, text, want) in cases {
            assert_eq!(tonumber(text), want, "{name}");
        }
        let ints = [
            ("truncates toward zero", -2.5, -2),
            ("a huge number", 1e30, i64::MIN),
            ("not a number", f64::NAN, i64::MIN),
        ];
        for (name, n, want) in ints {
            assert_eq!(lua_int(n), want, "{name}");
        }
        let parsed = [
            ("zero", &b"0"[..], Some(0)),
            ("minus zero", b"-0", None),
            ("a leading zero", b"05", None),
            ("the smallest", b"-9223372036854775808", Some(i64::MIN)),
            ("the largest", b"9223372036854775807", Some(i64::MAX)),
            ("one past the largest", b"9223372036854775808", None),
            ("a blank", b" 5", None),
        ];
        for (name, text, want) in parsed {
            assert_eq!(parse_i64(text), want, "{name}");
        }
    }

    /// Each case on a master of each flavour listed.
    fn run_flavoured(cases: Vec<(&str, &[Flavour], Vec<Step>)>) {
        for (name, flavours, steps) in cases {
            for &flavour in flavours {
                let mut master = Master::new(1, T0);
                master.settings_mut().flavour = flavour;
                let steps = steps
                    .iter()
                    .map(|st| Step {
                        at: st.at,
                        conn: st.conn,
                        args: st.args.clone(),
                        want: st.want.clone(),
                    })
                    .collect();
                run_case(&format!("{name} ({flavour:?})"), &mut master, steps);
            }
        }
    }

    #[test]
    fn the_native_commands_answer_as_each_flavour_does() {
        use Flavour::{Redis70, Redis84, Valkey81, Valkey91};
        const WRONG: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
        // The fence state, a hash, made by the fenced acquire.
        let hash = || {
            s(
                &[
                    "EVAL",
                    "$ACQUIRE_FENCED",
                    "3",
                    "l",
                    "f",
                    "STATE",
                    "t",
                    "1000",
                ],
                ints(&[0, 0, 0, 0]),
            )
        };
        let unknown = |cmd: &str, rest: &str| {
            e(&format!(
                "ERR unknown command '{cmd}', with args beginning with: {rest}"
            ))
        };
        run_flavoured(vec![
            (
                "SET IFEQ sets value and TTL on a match, and never creates the key",
                &[Valkey81, Valkey91, Redis84],
                vec![
                    s(&["SET", "k", "t", "PX", "1000"], ok()),
                    s(&["SET", "k", "t", "IFEQ", "t", "PX", "5000"], ok()),
                    s(&["PTTL", "k"], int(5000)),
                    s(&["SET", "k", "u", "IFEQ", "x", "PX", "9000"], nil()),
                    s(&["GET", "k"], b("t")),
                    s(&["SET", "k", "u", "ifeq", "t", "GET", "px", "7000"], b("t")),
                    s(&["SET", "k", "v", "IFEQ", "x", "GET", "PX", "7000"], b("u")),
                    s(&["GET", "k"], b("u")),
                    s(&["SET", "gone", "v", "IFEQ", "x"], nil()),
                    s(&["SET", "gone", "v", "IFEQ", "x", "GET"], nil()),
                    s(&["EXISTS", "gone"], int(0)),
                    // Without PX the TTL goes: a lock that never expires.
                    s(&["SET", "k", "u", "IFEQ", "u"], ok()),
                    s(&["PTTL", "k"], int(-1)),
                    s(
                        &["SET", "k", "u", "IFEQ", "u", "PX", "100", "KEEPTTL"],
                        e(ERR_SYNTAX),
                    ),
                    s(&["SET", "k", "u", "IFEQ", "u", "NX"], e(ERR_SYNTAX)),
                    s(&["SET", "k", "u", "XX", "IFEQ", "u"], e(ERR_SYNTAX)),
                    s(&["SET", "k", "u", "IFEQ", "a", "IFEQ", "b"], e(ERR_SYNTAX)),
                    s(&["SET", "k", "u", "IFEQ"], e(ERR_SYNTAX)),
                    s(
                        &["SET", "k", "u", "IFEQ", "u", "PX", "0"],
                        e(ERR_EXPIRE_SET),
                    ),
                    hash(),
                    s(&["SET", "STATE", "u", "IFEQ", "u"], e(WRONG)),
                    s(
                        &["SET", "STATE", "u", "IFEQ", "u", "PX", "x"],
                        e(ERR_NOT_INTEGER),
                    ),
                ],
            ),
            (
                "Redis 7.0 and Valkey 8.1 have no DELIFEQ, Redis 7.0 no SET IFEQ",
                &[Redis70],
                vec![
                    s(&["SET", "k", "t", "IFEQ", "t", "PX", "5000"], e(ERR_SYNTAX)),
                    s(&["DELIFEQ", "k", "t"], unknown("DELIFEQ", "'k' 't' ")),
                    s(
                        &["DELEX", "k", "IFEQ", "t"],
                        unknown("DELEX", "'k' 'IFEQ' 't' "),
                    ),
                    s(
                        &["COMMAND", "DOCS", "DELIFEQ", "DELEX", "nosuch"],
                        arr(vec![]),
                    ),
                ],
            ),
            (
                "DELIFEQ deletes only the value it names",
                &[Valkey91],
                vec![
                    s(&["SET", "k", "t", "PX", "1000"], ok()),
                    s(&["DELIFEQ", "k", "x"], int(0)),
                    s(&["DELIFEQ", "k", "t"], int(1)),
                    s(&["DELIFEQ", "k", "t"], int(0)),
                    s(
                        &["DELIFEQ", "k"],
                        e("ERR wrong number of arguments for 'delifeq' command"),
                    ),
                    hash(),
                    s(&["DELIFEQ", "STATE", "t"], e(WRONG)),
                    s(
                        &["DELEX", "k", "IFEQ", "t"],
                        unknown("DELEX", "'k' 'IFEQ' 't' "),
                    ),
                    s(&["SET", "k", "t", "IFNE", "t"], e(ERR_SYNTAX)),
                ],
            ),
            (
                "DELEX IFEQ and IFNE compare, DELEX alone deletes",
                &[Redis84],
                vec![
                    s(&["SET", "k", "t", "PX", "1000"], ok()),
                    s(&["DELEX", "k", "IFEQ", "x"], int(0)),
                    s(&["DELEX", "k", "IFNE", "t"], int(0)),
                    s(&["DELEX", "k", "IFEQ", "t"], int(1)),
                    s(&["DELEX", "k", "IFEQ", "t"], int(0)),
                    s(&["SET", "k", "t", "IFNE", "x"], ok()),
                    s(&["DELEX", "k"], int(1)),
                    s(&["DELEX", "k", "IFEQ"], e(ERR_SYNTAX)),
                    s(&["DELEX", "k", "FOO", "t"], e(ERR_SYNTAX)),
                    s(&["DELEX", "k", "IFDEQ", "t"], e(ERR_DIGEST)),
                    hash(),
                    s(&["DELEX", "STATE", "IFEQ", "t"], e(WRONG)),
                    s(&["DELIFEQ", "k", "t"], unknown("DELIFEQ", "'k' 't' ")),
                ],
            ),
            (
                "COMMAND DOCS names each command the flavour has, in the order asked",
                &[Valkey91],
                vec![s(
                    &["COMMAND", "DOCS", "nosuch", "Delifeq", "delex"],
                    arr(CommandDoc::Delifeq.reply()),
                )],
            ),
        ]);
    }

    #[test]
    fn scripting_and_command_denied_answer_noperm() {
        let mut master = Master::new(1, T0).with_settings(Settings {
            deny_scripting: true,
            deny_command: true,
            flavour: Flavour::Valkey91,
            ..Settings::default()
        });
        let noperm = |name: &str| {
            e(&format!(
                "NOPERM this user has no permissions to run the '{name}' command"
            ))
        };
        run_case(
            "no scripting, no COMMAND",
            &mut master,
            vec![
                s(&["EVAL", "$RELEASE", "1", "k", "t"], noperm("eval")),
                s(&["EVALSHA", "@RELEASE", "1", "k", "t"], noperm("evalsha")),
                s(&["SCRIPT", "LOAD", "$RELEASE"], noperm("script|load")),
                s(&["SCRIPT", "EXISTS", "@RELEASE"], noperm("script|exists")),
                s(&["SCRIPT", "FLUSH"], noperm("script|flush")),
                s(
                    &["SCRIPT"],
                    e("ERR wrong number of arguments for 'script' command"),
                ),
                s(&["COMMAND", "DOCS", "SET"], noperm("command|docs")),
                s(&["COMMAND"], noperm("command")),
                s(&["SET", "k", "t", "NX", "PX", "100"], ok()),
                s(&["DELIFEQ", "k", "t"], int(1)),
            ],
        );
    }

    #[test]
    fn every_command_doc_decodes_as_a_pair_six_deep() {
        for doc in [
            CommandDoc::SetRedis70,
            CommandDoc::SetValkey,
            CommandDoc::SetRedis84,
            CommandDoc::Delifeq,
            CommandDoc::Delex,
        ] {
            let pair = doc.reply();
            assert!(matches!(pair[0], Reply::Bulk(_)), "{doc:?}");
            let Reply::Array(docs) = &pair[1] else {
                panic!("{doc:?}: {pair:?}");
            };
            assert_eq!(docs[0], b("summary"), "{doc:?}");
        }
    }

    #[test]
    fn no_command_panics_and_every_error_stays_one_line() {
        let words: [&[u8]; 40] = [
            b"SET",
            b"GET",
            b"DEL",
            b"EXISTS",
            b"PTTL",
            b"PEXPIRE",
            b"EVAL",
            b"EVALSHA",
            b"SCRIPT",
            b"LOAD",
            b"EXISTS",
            b"FLUSH",
            b"SUBSCRIBE",
            b"UNSUBSCRIBE",
            b"PUBLISH",
            b"PUBSUB",
            b"NUMSUB",
            b"AUTH",
            b"SELECT",
            b"INFO",
            b"CLIENT",
            b"SETNAME",
            b"PING",
            b"HGETALL",
            b"NX",
            b"XX",
            b"PX",
            b"EX",
            b"KEEPTTL",
            b"GET",
            b"GT",
            b"-1",
            b"0",
            b"3",
            b"99999999999999999999",
            b"k",
            b"STATE",
            b"\r\n\0",
            b"bootstrap",
            b"readmit:5",
        ];
        let scripts: Vec<Vec<u8>> = SCRIPTS
            .iter()
            .flat_map(|(_, src)| [src.as_bytes().to_vec(), Script::new(src).sha().to_vec()])
            .collect();
        let mut rng = Rng::new(22);
        let mut m = Master::new(3, T0);
        let mut now = T0;
        for step in 0..30_000 {
            let len = rng.below(8);
            let args: Vec<Vec<u8>> = (0..len)
                .map(|i| match rng.below(10) {
                    0 if i == 1 => scripts[rng.below(scripts.len())].clone(),
                    1 => (0..rng.below(6)).map(|_| rng.next_u64() as u8).collect(),
                    2 => FENCE_STATE_KEY.to_vec(),
                    _ => words[rng.below(words.len())].to_vec(),
                })
                .collect();
            now += rng.below(50) as u64;
            let conn = ConnId(rng.below(4) as u64);
            match rng.below(200) {
                0 => m.restart(now, rng.below(2) == 0),
                1 => m.handle_disconnect(conn),
                2 => m.settings_mut().eval_lru ^= true,
                _ => {}
            }
            let reply = m.handle_command(now, conn, &args);
            for frame in std::iter::once(reply).chain(pushes(&mut m).into_iter().map(|(_, r)| r)) {
                if let Reply::Error(msg) = frame {
                    assert!(
                        !msg.contains(&b'\n') && !msg.contains(&b'\r'),
                        "step {step}: {msg:?}"
                    );
                }
            }
        }
    }
}
