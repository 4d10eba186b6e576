//! The state of one connection to one master, without the socket.
//!
//! A [`Conn`] owns what must survive between reads and writes: the bytes
//! waiting to be written, the bytes read but not yet parsed, and the FIFO
//! of requests in flight, so that a reply arriving after its caller stopped
//! waiting is read and dropped, never matched to a later request. It also
//! owns the handshake (AUTH, SELECT, SCRIPT LOAD, queued in one write), the
//! `-NOSCRIPT` fallback (SCRIPT LOAD and EVALSHA again on this connection,
//! or EVAL where SCRIPT LOAD is refused, invisible to the caller),
//! stall detection, the in-flight bound, and the reconnect backoff. A
//! subscriber connection ([`Role::Subscriber`]) has the same bounds: each
//! SUBSCRIBE or UNSUBSCRIBE waits in the same FIFO for its confirmations.
//! It never touches a socket or reads a clock: the driver moves bytes in and
//! out and passes `now`.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::addr::ServerAddr;
use crate::native::{self, Capabilities, Delete};
use crate::resp::{self, Arg, FrameScan, Limits, ProtocolError, Reply};
use crate::script::{ScriptId, Scripts};
use crate::token::Token;

/// What a request does on one master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `SET resource token NX PX ttl`.
    Acquire,
    /// The compare-and-delete script.
    Release,
    /// The compare-and-pexpire script.
    Extend,
    /// Fenced acquire, phase one: SET NX PX and read the fence, atomically.
    AcquireFenced,
    /// Fenced acquire, phase two: raise the fence while holding the key.
    Fence,
    /// Set every key of a multi-resource lock, or none.
    AcquireMany,
    /// Release every key of a multi-resource lock.
    ReleaseMany,
    /// Extend every key of a multi-resource lock, or none.
    ExtendMany,
    /// A waiting acquire's attempt: SET NX PX, or the key's remaining time
    /// when it is held.
    AcquireWait,
    /// The cleanup of an attempt that found the lock held elsewhere
    /// (refused, or refused and failed, by a quorum): compare-and-delete,
    /// publishing nothing.
    Cleanup,
    /// [`Op::Cleanup`] for every key of a multi-resource attempt.
    CleanupMany,
}

impl Op {
    fn script(self) -> Option<ScriptId> {
        match self {
            Op::Acquire => None,
            Op::Release => Some(ScriptId::Release),
            Op::Extend => Some(ScriptId::Extend),
            Op::AcquireFenced => Some(ScriptId::AcquireFenced),
            Op::Fence => Some(ScriptId::Fence),
            Op::AcquireMany => Some(ScriptId::AcquireMany),
            Op::ReleaseMany => Some(ScriptId::ReleaseMany),
            Op::ExtendMany => Some(ScriptId::ExtendMany),
            Op::AcquireWait => Some(ScriptId::AcquireWait),
            Op::Cleanup => Some(ScriptId::Cleanup),
            Op::CleanupMany => Some(ScriptId::CleanupMany),
        }
    }

    /// Whether the operation takes a lock (sets keys), as opposed to
    /// releasing, extending or fencing one.
    pub(crate) fn sets_keys(self) -> bool {
        matches!(
            self,
            Op::Acquire | Op::AcquireFenced | Op::AcquireMany | Op::AcquireWait
        )
    }

    /// Whether a refusal reports the holder: minus its key's remaining
    /// time and its value (the waiting, fenced and multi-resource acquire
    /// scripts; the plain `SET` answers nil).
    pub(crate) fn tells_holder(self) -> bool {
        matches!(self, Op::AcquireWait | Op::AcquireFenced | Op::AcquireMany)
    }

    /// Whether a grant leaves keys of ours alive on the master for a TTL:
    /// taking a lock, extending one, or raising a held lock's fence. A
    /// restart of the master within that TTL may lose them (see
    /// [`Conn::handle_grant`]).
    pub(crate) fn keeps_keys(self) -> bool {
        self.sets_keys() || matches!(self, Op::Extend | Op::ExtendMany | Op::Fence)
    }

    /// Whether the operation only removes keys: the one kind that is still
    /// worth sending after its round ended (the spec's cleanup after a lost
    /// reply), since it can only free a resource, never hold one.
    pub(crate) fn releases(self) -> bool {
        matches!(
            self,
            Op::Release | Op::ReleaseMany | Op::Cleanup | Op::CleanupMany
        )
    }

    /// How this operation goes to a master offering `caps` (see
    /// [`Request::form`]).
    pub(crate) fn form(self, caps: Capabilities) -> Form {
        match self {
            Op::Release | Op::Cleanup if caps.delifeq => Form::Delete(Delete::DelIfEq),
            Op::Release | Op::Cleanup if caps.delex => Form::Delete(Delete::DelEx),
            Op::Extend if caps.set_ifeq => Form::Extend,
            _ => Form::Script,
        }
    }

    /// Whether the request's `arg` goes on the wire after the token.
    fn takes_arg(self) -> bool {
        !self.releases()
    }
}

/// The keys a request names: one (the common case, which allocates
/// nothing) or several, shared between the request's copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Keys {
    /// A single key.
    One(Bytes),
    /// Several keys: a multi-resource lock, or a lock key and its fence.
    Many(Arc<[Bytes]>),
}

impl Keys {
    /// The keys, in order.
    pub(crate) fn as_slice(&self) -> &[Bytes] {
        match self {
            Keys::One(key) => std::slice::from_ref(key),
            Keys::Many(keys) => keys,
        }
    }
}

/// One lock operation, as sent to every master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// What to do.
    pub(crate) op: Op,
    /// The keys: the lock key first.
    pub(crate) keys: Keys,
    /// The lock value.
    pub(crate) token: Token,
    /// The TTL in milliseconds (acquire and extend kinds), or the fence
    /// value ([`Op::Fence`]); unused by releases.
    pub(crate) arg: i64,
    /// A waiting attempt ([`Op::AcquireWait`], or a fenced acquire's phase
    /// one) that, refused, publishes the notice that its process waits
    /// ([`WAITING_MARK`](crate::script::WAITING_MARK)).
    pub(crate) notice: bool,
}

impl Request {
    /// Appends the request to `dst` as the command sent where a master has
    /// no command of its own for it: `SET ... NX PX` or `EVALSHA`.
    pub(crate) fn encode(&self, scripts: &Scripts, dst: &mut BytesMut) {
        self.encode_as(scripts, dst, false);
    }

    /// How the request goes to a master offering `caps`: one of its own
    /// commands where it has one for this operation, else the script. A
    /// key of one resource only: a multi-resource lock's scripts act on
    /// every key at once, and the waiting and fenced acquires read what a
    /// refusal leaves (the holder's time, the fence) atomically with it.
    pub(crate) fn form(&self, caps: Capabilities) -> Form {
        self.op.form(caps)
    }

    /// Appends the request in `form` to `dst`. A native release is two
    /// commands: the compare-and-delete, then the release message the
    /// script would have published ([`Form::commands`]).
    pub(crate) fn encode_form(&self, form: Form, scripts: &Scripts, dst: &mut BytesMut) {
        let key = self.keys.as_slice().first().map_or(&[][..], |k| &k[..]);
        let token = self.token.as_bytes();
        match form {
            Form::Script => self.encode(scripts, dst),
            Form::Delete(how) => {
                native::encode_delete(dst, how, key, token);
                if self.op == Op::Release {
                    native::encode_notice(dst, key, token, self.arg);
                }
            }
            Form::Extend => native::encode_extend(dst, key, token, self.arg),
        }
    }

    fn encode_as(&self, scripts: &Scripts, dst: &mut BytesMut, eval: bool) {
        let keys = self.keys.as_slice();
        let token = Arg::Bytes(self.token.as_bytes());
        let arg = Arg::Int(self.arg);
        match self.op.script().map(|id| scripts.get(id)) {
            None => {
                let key = Arg::Bytes(keys.first().map_or(&[][..], |k| k));
                let set = [
                    Arg::Bytes(b"SET"),
                    key,
                    token,
                    Arg::Bytes(b"NX"),
                    Arg::Bytes(b"PX"),
                    arg,
                ];
                resp::encode_command(dst, &set);
            }
            Some(script) => {
                let (verb, body) = if eval {
                    (Arg::Bytes(b"EVAL"), Arg::Bytes(script.source().as_bytes()))
                } else {
                    (Arg::Bytes(b"EVALSHA"), Arg::Bytes(script.sha()))
                };
                // The fence write-back's last "key" is its directive: sent
                // as its first argument, not declared as a key, so that an
                // ACL key pattern need not match it.
                let declared = match self.op {
                    Op::Fence => keys.len().saturating_sub(1),
                    _ => keys.len(),
                };
                let count = Arg::Int(i64::try_from(declared).unwrap_or(i64::MAX));
                let tail = [token, arg, Arg::Bytes(b"1")];
                // A release's argument, when it has one, names the process
                // to try next (see `Release::naming`); a waiting attempt's
                // third asks for the notice.
                let len = match self.op {
                    Op::Release if self.arg != 0 => 2,
                    Op::AcquireWait | Op::AcquireFenced if self.notice => 3,
                    op if op.takes_arg() => 2,
                    _ => 1,
                };
                let tail = &tail[..len];
                let args = [verb, body, count]
                    .into_iter()
                    .chain(keys.iter().map(|k| Arg::Bytes(k)))
                    .chain(tail.iter().copied());
                resp::encode_command_iter(dst, args);
            }
        }
    }
}

/// How one request is written on one master: the script, or the master's
/// own command (see [`Request::form`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// `SET ... NX PX` or the operation's script.
    Script,
    /// A release or quiet cleanup by `DELIFEQ` or `DELEX`; a release is
    /// followed by its `PUBLISH`.
    Delete(Delete),
    /// An extend by `SET ... IFEQ ... GET PX`.
    Extend,
}

impl Form {
    /// How many of the forms there are: [`Form::index`] is below it.
    pub(crate) const COUNT: usize = 4;

    /// A number per form, for a round's encodings of one request.
    pub(crate) fn index(self) -> usize {
        match self {
            Form::Script => 0,
            Form::Delete(Delete::DelIfEq) => 1,
            Form::Delete(Delete::DelEx) => 2,
            Form::Extend => 3,
        }
    }

    /// The names of how requests go, as metrics label them: the plain
    /// acquire's `SET NX`, a script, and the native commands.
    pub(crate) const LABELS: [&'static str; 5] =
        ["set_nx", "script", "delifeq", "delex", "set_ifeq"];

    /// The index in [`Form::LABELS`] of `op` sent in this form.
    pub(crate) fn label_index(self, op: Op) -> usize {
        match self {
            Form::Script if op.script().is_none() => 0,
            Form::Script => 1,
            Form::Delete(Delete::DelIfEq) => 2,
            Form::Delete(Delete::DelEx) => 3,
            Form::Extend => 4,
        }
    }

    /// How many commands of `op` in this form go on the wire: two for a
    /// native release (the delete and its message), else one.
    fn commands(self, op: Op) -> usize {
        match (self, op) {
            (Form::Delete(_), Op::Release) => 2,
            _ => 1,
        }
    }
}

/// One request encoded once per form, for every master of a round: most
/// rounds write one form to all of them, masters of different servers
/// two.
#[derive(Debug)]
pub(crate) struct Wires {
    bufs: [BytesMut; Form::COUNT],
    /// Bit [`Form::index`] set when that form of the request is in `bufs`.
    encoded: u8,
}

impl Wires {
    /// Empty buffers, sized for a lock request.
    pub(crate) fn new() -> Wires {
        Wires {
            bufs: std::array::from_fn(|_| BytesMut::with_capacity(256)),
            encoded: 0,
        }
    }

    /// Forgets the request encoded: the next one is another.
    pub(crate) fn clear(&mut self) {
        self.encoded = 0;
    }

    /// `request` in `form`, encoded on first use.
    pub(crate) fn get(&mut self, request: &Request, form: Form, scripts: &Scripts) -> &[u8] {
        let i = form.index();
        let buf = &mut self.bufs[i];
        if self.encoded & (1 << i) == 0 {
            buf.clear();
            request.encode_form(form, scripts, buf);
            self.encoded |= 1 << i;
        }
        buf
    }
}

/// Names one request: the round it belongs to and its slot in the round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag {
    /// The round's number; a reply whose round is over is dropped.
    pub(crate) round: u64,
    /// The request's index within its round.
    pub(crate) slot: u32,
}

/// A step of the connection handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeStep {
    /// `AUTH`.
    Auth,
    /// `SELECT db`.
    Select,
    /// `SCRIPT LOAD`.
    ScriptLoad,
    /// `INFO server`, for restart quarantine.
    Info,
}

/// Why one master gave no usable answer. One failed vote, never by itself
/// an error of the whole operation.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// No reply within the per-instance timeout: to this request, or to
    /// an earlier one on the same connection, still unanswered (a round
    /// does not wait for a master that has not answered for that long;
    /// its reply would come after the earlier one's).
    Timeout,
    /// The host name resolved to no address, or its lookup ran past the
    /// connect timeout.
    Resolve,
    /// The host name is being looked up (off the event loop): the master
    /// cannot vote until it has an address.
    Resolving,
    /// Connecting failed.
    Connect(io::ErrorKind),
    /// Connecting took longer than the connect timeout.
    ConnectTimeout,
    /// Not connected, and the reconnect backoff has not run out; the last
    /// failure's cause is inside.
    Backoff(Box<Cause>),
    /// Reading or writing failed.
    Io(io::ErrorKind),
    /// The master closed the connection.
    Closed,
    /// The TLS handshake or a TLS record failed: the message names the
    /// problem (an untrusted or expired certificate, a name mismatch, a
    /// peer that does not speak TLS).
    Tls(Arc<str>),
    /// The master sent bytes that are not RESP2.
    Protocol(ProtocolError),
    /// The first bytes a connection received do not open as RESP does: the
    /// port serves another protocol (HTTP, TLS, ...). The parser's error,
    /// and the start of what the port sent (see [`Cause::of_first_reply`]).
    NotRedis(ProtocolError, Bytes),
    /// The master sent a reply when no request was in flight.
    Unsolicited,
    /// The oldest request in flight went unanswered past the stall limit.
    Stalled,
    /// The master is too far behind: as many requests as
    /// [`Config::max_in_flight`](crate::Config::max_in_flight) await its
    /// replies. The connection is
    /// dropped and re-established, as for [`Cause::Stalled`].
    TooFarBehind,
    /// A handshake command got an error reply.
    Handshake(HandshakeStep, Bytes),
    /// The command got an error reply (or a reply of an unexpected type,
    /// described in the message).
    Server(Bytes),
    /// The master restarted recently and stays out of the quorum for this
    /// much longer (restart quarantine).
    Quarantined(Duration),
    /// The same server process (same `run_id`) as the master at this index
    /// in the configuration: it votes once, not once per name.
    SameServer(usize),
}

impl Cause {
    /// True when the master broke the protocol, as opposed to being down,
    /// slow or refusing.
    pub fn is_protocol(&self) -> bool {
        matches!(
            self,
            Cause::Protocol(_) | Cause::NotRedis(..) | Cause::Unsolicited
        )
    }

    /// The cause for a connection's first reply, refused by the parser with
    /// `error`, `received` being the bytes from the connection's start:
    /// [`Cause::NotRedis`] when they do not open with a RESP type byte (the
    /// port speaks another protocol: "line not terminated by CRLF" would
    /// not tell a user that), else [`Cause::Protocol`].
    pub fn of_first_reply(error: ProtocolError, received: &[u8]) -> Cause {
        // RESP3's too: a server that speaks it is Redis all the same.
        const RESP_TYPES: &[u8] = b"+-:$*_,#!=(%~|>";
        match received.first() {
            Some(b) if !RESP_TYPES.contains(b) => {
                let shown = &received[..received.len().min(NOT_REDIS_SHOWN)];
                Cause::NotRedis(error, Bytes::copy_from_slice(shown))
            }
            _ => Cause::Protocol(error),
        }
    }
}

impl Cause {
    /// The restart quarantine of a master whose `INFO server` reports an
    /// `uptime_in_seconds` of `uptime_s`, under a maximum TTL of `max_ttl`
    /// ([`Config::quarantine`](crate::Config::quarantine)), as of that
    /// report: [`Cause::Quarantined`] with the time left, or `None` when it
    /// counts already. The rule the client applies on every connect (where
    /// a master that restarted while holding this client's locks waits a
    /// whole max TTL besides).
    pub fn of_uptime(uptime_s: u64, max_ttl: Duration) -> Option<Cause> {
        quarantine_after(uptime_s, max_ttl)
            .filter(|left| !left.is_zero())
            .map(Cause::Quarantined)
    }
}

/// How long after an `INFO server` that reads `uptime_s` the master stays
/// out of the quorum under `max_ttl`. Redis reports `uptime_in_seconds` as
/// the difference of two whole wall-clock seconds (now and the start, both
/// truncated), so it reads 1 a millisecond after a start just before a
/// second's end: the restart was more than `uptime - 1` s ago, and no more
/// can be assumed. Waiting out `max_ttl - (uptime - 1)` is the safe choice.
fn quarantine_after(uptime_s: u64, max_ttl: Duration) -> Option<Duration> {
    max_ttl.checked_sub(Duration::from_secs(uptime_s.saturating_sub(1)))
}

/// How many of a foreign server's first bytes [`Cause::NotRedis`] keeps.
const NOT_REDIS_SHOWN: usize = 64;

/// What [`Cause::NotRedis`] says the port answered: a TLS record named as
/// such, else its first line, escaped, at most 40 characters.
fn describe_foreign(sent: &[u8], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    // A TLS record: handshake (0x16) or alert (0x15), version 3.x.
    if let [0x15 | 0x16, 0x03, ..] = sent {
        return f.write_str(
            "not a Redis server in plain text: it answered in TLS (use rediss:// for a TLS port)",
        );
    }
    let line = sent
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or(sent);
    let mut shown = String::new();
    for b in line {
        shown.extend(std::ascii::escape_default(*b).map(char::from));
        if shown.len() >= 40 {
            shown.push_str("...");
            break;
        }
    }
    write!(f, "not a Redis server (it answered \"{shown}\")")
}

impl Cause {
    /// True when the master refuses this client for good, not for now: a
    /// handshake command refused (`WRONGPASS`, `NOAUTH`, `NOPERM`, a
    /// database that does not exist, a denied `INFO` or `SCRIPT LOAD`), or
    /// a command refused by `NOAUTH` or `NOPERM` (a password missing, a
    /// key or command the user may not use), as opposed to a master that
    /// is down, slow, loading or busy. Retrying changes nothing until an
    /// operator grants what is missing.
    pub fn is_permanent(&self) -> bool {
        match self {
            // A server's refusal (an error code), not a reply we could not
            // use (an INFO without run_id, say).
            Cause::Handshake(_, msg) => {
                error_code(msg).is_some_and(|code| !TRANSIENT_CODES.contains(&code))
            }
            Cause::Server(msg) => {
                error_code(msg).is_some_and(|code| PERMISSION_CODES.contains(&code))
            }
            Cause::Backoff(last) => last.is_permanent(),
            _ => false,
        }
    }
}

/// Error codes a healthy server sends for a while and then stops sending:
/// a handshake refused with one of these is tried again later.
const TRANSIENT_CODES: [&[u8]; 5] = [
    b"LOADING",
    b"BUSY",
    b"TRYAGAIN",
    b"MASTERDOWN",
    b"CLUSTERDOWN",
];

/// Error codes that refuse a command to this client for good.
const PERMISSION_CODES: [&[u8]; 3] = [b"NOAUTH", b"NOPERM", b"WRONGPASS"];

/// The error code of an error reply's message: its first word, when it
/// is one (Redis error codes are upper-case letters: `ERR`, `NOPERM`).
fn error_code(msg: &[u8]) -> Option<&[u8]> {
    let code = msg.split(|&b| b == b' ').next()?;
    (!code.is_empty() && code.iter().all(u8::is_ascii_uppercase)).then_some(code)
}

impl HandshakeStep {
    fn command(self) -> &'static str {
        match self {
            HandshakeStep::Auth => "AUTH",
            HandshakeStep::Select => "SELECT",
            HandshakeStep::ScriptLoad => "SCRIPT LOAD",
            HandshakeStep::Info => "INFO server",
        }
    }

    /// What an operator grants (or fixes) when this step is refused with
    /// an error code that does not say it alone (see [`code_remedy`]).
    fn remedy(self) -> &'static str {
        match self {
            HandshakeStep::Auth => "check the user name and password in the URL",
            HandshakeStep::Select => "check the URL's database number, and grant the user +select",
            HandshakeStep::ScriptLoad => "grant the user +script|load (and +evalsha, +eval)",
            HandshakeStep::Info => {
                "grant the user +info, or turn restart quarantine off (INFO reports restarts)"
            }
        }
    }
}

/// What to fix when a master refuses with this error code, where the code
/// says it whatever the command: the credentials. A missing password reads
/// `NOAUTH` on whichever command comes first (no AUTH is sent without one),
/// so the step refused says nothing of the remedy.
fn code_remedy(code: &[u8]) -> Option<&'static str> {
    match code {
        b"NOAUTH" => Some(
            "the master needs a password and the URL has none: put the password in the URL: \
             redis://:PASSWORD@host:port, or redis://USER:PASSWORD@host:port for an ACL user",
        ),
        b"WRONGPASS" => Some(
            "wrong user name or password, or the user is disabled: check the user name and \
             password in the URL",
        ),
        _ => None,
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Timeout => f.write_str("no reply within the per-instance timeout"),
            Cause::Resolve => f.write_str("host name did not resolve"),
            Cause::Resolving => f.write_str("host name lookup still running"),
            Cause::Connect(kind) => write!(f, "connect failed: {kind}"),
            Cause::ConnectTimeout => f.write_str("connect timed out"),
            Cause::Backoff(last) => write!(f, "down, reconnect pending ({last})"),
            Cause::Io(kind) => write!(f, "connection failed: {kind}"),
            Cause::Closed => f.write_str("connection closed by the master"),
            Cause::Tls(problem) => write!(f, "TLS failed: {problem}"),
            Cause::Protocol(e) => write!(f, "protocol violation: {e}"),
            Cause::NotRedis(_, sent) => describe_foreign(sent, f),
            Cause::Unsolicited => f.write_str("protocol violation: reply with no request"),
            Cause::Stalled => f.write_str("connection stalled: requests unanswered"),
            Cause::TooFarBehind => {
                f.write_str("too far behind: the in-flight bound is reached, connection dropped")
            }
            Cause::Handshake(step, msg) => {
                write!(
                    f,
                    "{} failed: {}",
                    step.command(),
                    String::from_utf8_lossy(msg)
                )?;
                if self.is_permanent() {
                    let remedy = error_code(msg).and_then(code_remedy);
                    write!(f, " ({})", remedy.unwrap_or_else(|| step.remedy()))?;
                }
                Ok(())
            }
            Cause::Server(msg) => {
                write!(f, "error reply: {}", String::from_utf8_lossy(msg))?;
                if let Some(remedy) = error_code(msg).and_then(code_remedy) {
                    write!(f, " ({remedy})")?;
                }
                Ok(())
            }
            Cause::SameServer(other) => write!(
                f,
                "the same server as master #{} (same run_id): one server votes once",
                other + 1
            ),
            Cause::Quarantined(left) => write!(
                f,
                "in restart quarantine for {} s more (up for less than the max TTL)",
                seconds_up(*left)
            ),
        }
    }
}

/// `d` in whole seconds, rounded up: a wait of 0.2 s reads 1 s, not 0 s.
pub(crate) fn seconds_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Timing rules of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// How long a connect (TCP or Unix) may take.
    pub(crate) connect: Duration,
    /// How long the oldest request in flight may go unanswered before the
    /// connection is dropped and re-established.
    pub(crate) stall: Duration,
    /// How long a request may go unanswered before the master counts as
    /// unresponsive (the per-instance timeout): a new round does not wait
    /// for a master whose earlier request has waited this long (see
    /// [`Conn::is_unresponsive`]).
    pub(crate) patience: Duration,
    /// First wait before reconnecting after a failed connect; it doubles on
    /// each further failure.
    pub(crate) backoff_min: Duration,
    /// Cap on that wait.
    pub(crate) backoff_max: Duration,
    /// Restart quarantine: the largest TTL in use. When set, each
    /// (re)connect reads `INFO server`, and a master restarted less than
    /// this long ago (or whose `run_id` changed while it held this client's
    /// locks) does not count toward the quorum until this long after its
    /// restart. `None` turns it off.
    pub(crate) quarantine: Option<Duration>,
    /// The most requests (handshake included) one connection keeps in
    /// flight; a master that lags further is [`Cause::TooFarBehind`]. The
    /// queue's storage is allocated once, when the connection is made, so
    /// that a lagging master never costs an allocation.
    pub(crate) max_in_flight: usize,
}

/// Capacity of a connection's write buffer, allocated on connect. It holds
/// a round's requests until they are written, and then only what the
/// kernel's socket buffer refused; written bytes are reclaimed by moving
/// the rest to the front, never by reallocating. It grows (once, and keeps
/// what it grew to) only for a batch whose requests take more than this,
/// or when the kernel refuses more: with at most
/// [`Timing::max_in_flight`] requests unanswered, a master that reads
/// nothing is dropped as too far behind long before its socket buffers
/// (hundreds of KiB on loopback) fill, so a lagging master does not grow
/// it.
pub(crate) const OUT_CAPACITY: usize = 16 * 1024;

/// Capacity of a connection's read buffer, allocated once: room for one
/// read of [`READ_CHUNK`] bytes beside the partial reply left from the last
/// one. Only a reply larger than [`READ_CHUNK`] grows it, up to the
/// parser's [`Limits::max_reply_len`].
pub(crate) const IN_CAPACITY: usize = 2 * READ_CHUNK;

/// The most bytes the driver reads from a socket at once.
pub(crate) const READ_CHUNK: usize = 16 * 1024;

#[derive(Debug)]
enum State {
    /// No socket. A connect may start once `retry_at` has passed.
    Down { retry_at: Instant, cause: Cause },
    /// A socket is connecting; handshake and requests are queued.
    Connecting { deadline: Instant },
    /// Connected; the handshake may still be in flight.
    Ready,
}

#[derive(Debug)]
enum Expect {
    Handshake(HandshakeStep),
    /// A subscriber's SUBSCRIBE or UNSUBSCRIBE: one confirmation is pushed
    /// per channel it names, in order.
    Confirm {
        sent_at: Instant,
        /// Confirmations still to come.
        left: usize,
    },
    Reply {
        tag: Tag,
        request: Request,
        sent_at: Instant,
        wire_len: usize,
        /// How it went: the script or the master's own command.
        form: Form,
        /// A native release: its `PUBLISH`'s reply follows this one's. It
        /// is awaited once this one is read ([`Expect::Notice`]), so that
        /// a request takes one place in the queue, as the in-flight bound
        /// and the admission gate count it.
        notice: bool,
        /// How it was re-sent after `-NOSCRIPT`, if it was.
        resent: Resent,
    },
    /// The release message behind a native release, once the release's
    /// own reply is read: its reply (how many heard it, or a refusal to a
    /// user without channel rights) is consumed here, as the script's
    /// `redis.pcall` ignores it.
    Notice {
        sent_at: Instant,
    },
    /// The handshake's capability probe ([`native::PROBE`]): never a
    /// reason to drop the connection or refuse anything.
    Probe,
    /// A `SCRIPT LOAD` sent to recover from `-NOSCRIPT`: its reply is
    /// consumed here, never a request's.
    Load {
        sent_at: Instant,
        /// The script loaded (see `Conn::loading`).
        script: ScriptId,
    },
}

/// How a script request was re-sent after `-NOSCRIPT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resent {
    /// Not re-sent.
    No,
    /// As `EVALSHA` again, behind a `SCRIPT LOAD` of its script: the
    /// script then stays (since Redis 7.4, scripts created by EVAL live in
    /// an LRU that other clients' EVALs evict; loaded ones do not).
    Loaded,
    /// As `EVAL` with the script's source: where `SCRIPT LOAD` is refused
    /// (`-OOM` from Valkey's `maxmemory-scripts`, a user denied it), or
    /// did not take.
    Eval,
}

/// How many `-NOSCRIPT`s a connection recovered from, and how.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Recoveries {
    /// By `SCRIPT LOAD` and `EVALSHA` again.
    pub(crate) script_load: u64,
    /// By `EVAL`.
    pub(crate) eval: u64,
    /// Native commands the master advertised and then refused, answered
    /// by the script.
    pub(crate) native_refused: u64,
    /// Requests sent, by how they went ([`Form::label_index`]).
    pub(crate) sent: [u64; Form::LABELS.len()],
}

/// What a connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Lock requests, each answered in order.
    Commands,
    /// Release notifications: after AUTH, only SUBSCRIBE and UNSUBSCRIBE
    /// go out, and what comes back is pushed, not answered
    /// ([`Conn::poll_push`]). Their confirmations are awaited as replies
    /// are: the same stall limit and in-flight bound apply.
    Subscriber,
}

/// One master's connection state (sans-IO).
#[derive(Debug)]
pub(crate) struct Conn {
    addr: ServerAddr,
    role: Role,
    limits: Limits,
    scripts: Scripts,
    timing: Timing,
    state: State,
    out: BytesMut,
    /// How much of `out` the socket has taken. Kept apart rather than
    /// advancing `out`, so that the buffer is compacted in place and never
    /// reallocated.
    written: usize,
    inbuf: BytesMut,
    /// How far the reply at the front of `inbuf` has been scanned, so that
    /// a reply arriving in pieces is not re-scanned from its start.
    scan: FrameScan,
    in_flight: VecDeque<Expect>,
    /// When the oldest request in `in_flight` that awaits an answer in
    /// time (not a handshake step) was sent: kept as requests come and
    /// go, as every turn reads it (see [`Conn::poll_timeout`]).
    oldest: Option<Instant>,
    /// What every turn asks of `oldest`, worked out when it changes (see
    /// [`Conn::set_oldest`]): when it passes the stall limit, and when
    /// the per-instance timeout, if those instants can be told.
    stall_at: Option<Instant>,
    patient_until: Option<Instant>,
    handshake_left: usize,
    /// A frame arrived since the connection was made: it reached a live
    /// master, and a failure now is no reason to back off.
    heard: bool,
    backoff: Duration,
    /// The master's `run_id`, as last read.
    run_id: Option<Bytes>,
    /// Until when the master does not count toward the quorum.
    quarantined_until: Option<Instant>,
    /// When the master last granted a lock to this client.
    last_grant: Option<Instant>,
    /// Set when `run_id` changed (or was first read), until taken.
    new_run_id: bool,
    /// The master refused a handshake step after AUTH for good (a denied
    /// `INFO`, `SCRIPT LOAD` or `SELECT`): the connection stays, but only
    /// releases go out on it (they are safe, and undo what the requests
    /// pipelined behind the handshake may have set); every other request
    /// fails with this cause without being sent. A permission is an
    /// answer, not a broken connection: nothing is redialled for it.
    refused: Option<Cause>,
    /// This master refused a `SCRIPT LOAD` sent to recover from
    /// `-NOSCRIPT`: later ones go straight to `EVAL`.
    script_load_refused: bool,
    /// `-NOSCRIPT`s recovered from since [`Conn::take_recoveries`].
    recoveries: Recoveries,
    /// Whether the handshake asks the master for its own lock commands
    /// ([`native::PROBE`]); off where the settings force the scripts.
    probe: bool,
    /// The probe's reply broke the parser's limits once: later handshakes
    /// leave it out, and the connection runs the scripts.
    probe_broke: bool,
    /// The lock commands the master offers, as its last handshake told,
    /// less any it then refused: until the next handshake, those go as
    /// scripts again.
    caps: Capabilities,
    /// How many connects were started.
    connects: u64,
    /// The master refused the handshake's `SCRIPT LOAD` for good (a user
    /// without scripting rights): the requests that need a script fail
    /// with this cause unsent, and so does a plain acquire where no
    /// native release could undo it. Releases go (see `refused`).
    scripts_refused: Option<Cause>,
    /// The scripts a `SCRIPT LOAD` is in flight for (bit `id` for
    /// [`ScriptId`] `id`): a request answered `-NOSCRIPT` behind one is
    /// sent again behind it, without another. After a `SCRIPT FLUSH`
    /// every request in flight comes back `-NOSCRIPT`: one load each
    /// would about double what the connection holds, past the in-flight
    /// bound the admission gate keeps it under.
    loading: u32,
}

impl Conn {
    /// A connection for lock requests, not yet connected, that may connect
    /// at once.
    pub(crate) fn new(
        addr: ServerAddr,
        scripts: Scripts,
        limits: Limits,
        timing: Timing,
        now: Instant,
    ) -> Conn {
        Conn::with_role(Role::Commands, addr, scripts, limits, timing, now)
    }

    /// A connection carrying `role`'s traffic, not yet connected. A
    /// subscriber's queue and write buffer start small, and grow with the
    /// commands awaiting confirmation, never past
    /// [`Timing::max_in_flight`] of them (see [`Conn::queue_command`]).
    pub(crate) fn with_role(
        role: Role,
        addr: ServerAddr,
        scripts: Scripts,
        limits: Limits,
        timing: Timing,
        now: Instant,
    ) -> Conn {
        let (out, queue) = match role {
            Role::Commands => (OUT_CAPACITY, timing.max_in_flight),
            Role::Subscriber => (512, 2),
        };
        Conn {
            addr,
            role,
            limits,
            scripts,
            timing,
            state: State::Down {
                retry_at: now,
                cause: Cause::Closed,
            },
            out: BytesMut::with_capacity(out),
            written: 0,
            inbuf: BytesMut::with_capacity(IN_CAPACITY),
            scan: FrameScan::new(),
            in_flight: VecDeque::with_capacity(queue),
            oldest: None,
            stall_at: None,
            patient_until: None,
            handshake_left: 0,
            heard: false,
            backoff: timing.backoff_min,
            run_id: None,
            quarantined_until: None,
            last_grant: None,
            new_run_id: false,
            refused: None,
            script_load_refused: false,
            recoveries: Recoveries::default(),
            probe: true,
            probe_broke: false,
            caps: Capabilities::NONE,
            scripts_refused: None,
            connects: 0,
            loading: 0,
        }
    }

    /// Turns the capability probe off from the next handshake: every lock
    /// operation runs its script on this master (for proxies that refuse
    /// commands they do not know; see
    /// [`LockCommands`](crate::LockCommands)).
    pub(crate) fn set_probe(&mut self, on: bool) {
        self.probe = on;
    }

    /// How `request` goes to this master now.
    pub(crate) fn form(&self, request: &Request) -> Form {
        request.form(self.caps)
    }

    /// What the connection carries.
    pub(crate) fn role(&self) -> Role {
        self.role
    }

    /// The master's address.
    pub(crate) fn addr(&self) -> &ServerAddr {
        &self.addr
    }

    /// True when the driver should open a socket now.
    #[must_use]
    pub(crate) fn poll_connect(&self, now: Instant) -> bool {
        matches!(self.state, State::Down { retry_at, .. } if now >= retry_at)
    }

    /// While there is no socket, the instant from which one may be opened.
    pub(crate) fn retry_at(&self) -> Option<Instant> {
        match self.state {
            State::Down { retry_at, .. } => Some(retry_at),
            _ => None,
        }
    }

    /// True while there is no socket.
    pub(crate) fn is_down(&self) -> bool {
        matches!(self.state, State::Down { .. })
    }

    /// True while the connection waits for its host name's lookup.
    pub(crate) fn is_resolving(&self) -> bool {
        matches!(
            self.state,
            State::Down {
                cause: Cause::Resolving,
                ..
            }
        )
    }

    /// True while a connect is in progress.
    pub(crate) fn is_connecting(&self) -> bool {
        matches!(self.state, State::Connecting { .. })
    }

    /// Bytes of memory this connection's buffers hold: the read and write
    /// buffers and the in-flight queue. Bounded, whatever the master does:
    /// replies are parsed as they arrive and a partial one cannot exceed the
    /// parser's limits, and the queue, and with it what the write buffer
    /// can hold, by [`Timing::max_in_flight`] (see [`OUT_CAPACITY`]); for
    /// a subscriber, commands awaiting confirmation count as requests.
    pub(crate) fn buffer_capacity(&self) -> usize {
        self.inbuf.capacity()
            + self.out.capacity()
            + self.in_flight.capacity() * std::mem::size_of::<Expect>()
    }

    /// Whether one more command may be queued within half the in-flight
    /// bound (the share the shared client's admission leaves new work).
    pub(crate) fn has_room_for_command(&self) -> bool {
        self.in_flight.len() < (self.timing.max_in_flight / 2).max(1)
    }

    /// How many requests (handshake included) await a reply.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The driver opened a socket: queue the handshake so it leaves in the
    /// first write, together with whatever requests follow.
    pub(crate) fn handle_connect_started(&mut self, now: Instant) {
        self.clear_out();
        self.inbuf.clear();
        self.scan.reset();
        self.in_flight.clear();
        self.loading = 0;
        self.set_oldest(None);
        self.heard = false;
        self.connects += 1;
        self.refused = None;
        self.scripts_refused = None;
        self.caps = Capabilities::NONE;
        let deadline = now.checked_add(self.timing.connect).unwrap_or(now);
        self.state = State::Connecting { deadline };
        if let Some(password) = &self.addr.password {
            let password = Arg::Bytes(password.expose().as_bytes());
            match &self.addr.user {
                Some(user) => resp::encode_command(
                    &mut self.out,
                    &[Arg::Bytes(b"AUTH"), Arg::Bytes(user.as_bytes()), password],
                ),
                None => resp::encode_command(&mut self.out, &[Arg::Bytes(b"AUTH"), password]),
            }
            self.in_flight
                .push_back(Expect::Handshake(HandshakeStep::Auth));
        }
        // Channels are not per database, and a subscriber runs no script.
        if self.role == Role::Subscriber {
            self.handshake_left = self.in_flight.len();
            return;
        }
        if self.addr.db != 0 {
            resp::encode_command(
                &mut self.out,
                &[Arg::Bytes(b"SELECT"), Arg::Int(i64::from(self.addr.db))],
            );
            self.in_flight
                .push_back(Expect::Handshake(HandshakeStep::Select));
        }
        for script in self.scripts.all() {
            resp::encode_command(
                &mut self.out,
                &[
                    Arg::Bytes(b"SCRIPT"),
                    Arg::Bytes(b"LOAD"),
                    Arg::Bytes(script.source().as_bytes()),
                ],
            );
            self.in_flight
                .push_back(Expect::Handshake(HandshakeStep::ScriptLoad));
        }
        // Asked again on every connect: the address may reach another
        // server now.
        if self.probe && !self.probe_broke && native::probe_fits(&self.limits) {
            let probe = native::PROBE.map(Arg::Bytes);
            resp::encode_command(&mut self.out, &probe);
            self.in_flight.push_back(Expect::Probe);
        }
        // Always: the run_id tells one server named twice (it must not vote
        // twice), and the uptime drives restart quarantine.
        resp::encode_command(&mut self.out, &[Arg::Bytes(b"INFO"), Arg::Bytes(b"server")]);
        self.in_flight
            .push_back(Expect::Handshake(HandshakeStep::Info));
        self.handshake_left = self.in_flight.len();
    }

    /// The connect finished: queued bytes may be written.
    pub(crate) fn handle_connected(&mut self) {
        if self.is_connecting() {
            self.state = State::Ready;
        }
    }

    /// The connection failed: forget everything in flight and schedule the
    /// reconnect. A connection that had completed its handshake, and heard
    /// from its master, may reconnect on next use; one that never did
    /// waits out a doubling backoff, so that a dead master costs no system
    /// call per operation. (A subscriber with no AUTH has no handshake: a
    /// stopped master, whose kernel still completes connects, is retried
    /// after a backoff, not at once after each stall.)
    pub(crate) fn handle_failure(&mut self, now: Instant, cause: Cause) {
        let healthy = matches!(self.state, State::Ready) && self.handshake_left == 0 && self.heard;
        let retry_at = if healthy {
            self.backoff = self.timing.backoff_min;
            now
        } else {
            let at = now.checked_add(self.backoff).unwrap_or(now);
            self.backoff = (self.backoff * 2).min(self.timing.backoff_max);
            at
        };
        self.state = State::Down { retry_at, cause };
        self.clear_out();
        self.inbuf.clear();
        self.scan.reset();
        self.in_flight.clear();
        self.loading = 0;
        self.set_oldest(None);
        self.handshake_left = 0;
    }

    /// The next instant at which [`Conn::handle_timeout`] has work to do.
    #[inline]
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Down { .. } => None,
            State::Connecting { deadline } => Some(deadline),
            State::Ready => self.stall_at,
        }
    }

    /// Fails the connection when its connect or its oldest request has taken
    /// too long. Returns the cause when it did.
    #[inline]
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Option<Cause> {
        let cause = match self.state {
            State::Connecting { deadline } if now >= deadline => Cause::ConnectTimeout,
            State::Ready if self.poll_timeout().is_some_and(|t| now >= t) => Cause::Stalled,
            _ => return None,
        };
        self.handle_failure(now, cause.clone());
        Some(cause)
    }

    /// Whether the master is unresponsive: the oldest request in flight
    /// on this connection (queued while connecting, or sent) has waited
    /// longer than [`Timing::patience`] (the per-instance timeout) for its
    /// reply. A reply to a request sent now comes after that one's, so a
    /// round does not wait for it.
    pub(crate) fn is_unresponsive(&self, now: Instant) -> bool {
        debug_assert_eq!(self.oldest, self.scan_oldest(), "the kept oldest request");
        // `now - oldest > patience`, without the subtraction.
        self.patient_until.is_some_and(|until| now > until)
    }

    /// The instant after which [`Conn::is_unresponsive`] says so, if
    /// nothing is answered before: none with nothing awaited.
    pub(crate) fn unresponsive_after(&self) -> Option<Instant> {
        self.patient_until
    }

    /// A request that awaits an answer in time was queued at `now`.
    fn handle_timed(&mut self, now: Instant) {
        if self.oldest.is_none() {
            self.set_oldest(Some(now));
        }
    }

    /// Finds the oldest timed request again, after one left `in_flight`.
    fn refresh_oldest(&mut self) {
        self.set_oldest(self.scan_oldest());
    }

    /// The oldest timed request is now `oldest`: the instants every turn
    /// compares with are worked out here, once.
    fn set_oldest(&mut self, oldest: Option<Instant>) {
        if oldest == self.oldest {
            return;
        }
        self.oldest = oldest;
        self.stall_at = oldest.and_then(|t| t.checked_add(self.timing.stall));
        self.patient_until = oldest.and_then(|t| t.checked_add(self.timing.patience));
    }

    fn scan_oldest(&self) -> Option<Instant> {
        self.in_flight.iter().find_map(|e| match e {
            Expect::Reply { sent_at, .. }
            | Expect::Confirm { sent_at, .. }
            | Expect::Load { sent_at, .. }
            | Expect::Notice { sent_at } => Some(*sent_at),
            Expect::Handshake(_) | Expect::Probe => None,
        })
    }

    /// Queues a request, in the form this master takes it
    /// ([`Conn::form`]), encoded in `wires` once per form for all the
    /// round's masters.
    ///
    /// # Errors
    /// The cause of the last failure when the connection is down, or
    /// [`Cause::TooFarBehind`] when too many requests are unanswered (the
    /// connection is then dropped).
    pub(crate) fn send(
        &mut self,
        tag: Tag,
        request: &Request,
        wires: &mut Wires,
        now: Instant,
    ) -> Result<(), Cause> {
        if let Some(cause) = self.refusal_for(request.op) {
            return Err(cause.clone());
        }
        self.admit(now)?;
        let form = self.form(request);
        let wire = wires.get(request, form, &self.scripts);
        self.make_room(wire.len());
        self.out.extend_from_slice(wire);
        self.push_reply(tag, request.clone(), form, wire.len(), Resent::No, now);
        Ok(())
    }

    /// Awaits the reply (or, for a native release, the two replies) of a
    /// request just queued, `wire_len` bytes in `form`.
    fn push_reply(
        &mut self,
        tag: Tag,
        request: Request,
        form: Form,
        wire_len: usize,
        resent: Resent,
        now: Instant,
    ) {
        self.recoveries.sent[form.label_index(request.op)] += 1;
        let notice = form.commands(request.op) > 1;
        self.in_flight.push_back(Expect::Reply {
            tag,
            request,
            sent_at: now,
            wire_len,
            form,
            notice,
            resent,
        });
        self.handle_timed(now);
    }

    /// Whether one more request or command may be queued: not while down,
    /// and not past the in-flight bound, which drops the connection.
    fn admit(&mut self, now: Instant) -> Result<(), Cause> {
        match &self.state {
            // Not a failure to back off from: the name is being looked up.
            State::Down {
                cause: Cause::Resolving,
                ..
            } => return Err(Cause::Resolving),
            State::Down { cause, .. } => return Err(Cause::Backoff(Box::new(cause.clone()))),
            _ => {}
        }
        if self.in_flight.len() >= self.timing.max_in_flight {
            self.handle_failure(now, Cause::TooFarBehind);
            return Err(Cause::TooFarBehind);
        }
        Ok(())
    }

    /// Drops the requests of a round that is over but were never written,
    /// because the connect has not finished: sending an acquire, extend or
    /// fence late could set or lengthen a key that nobody waits for.
    /// Releases stay queued and go out once connected: a release after a
    /// lost reply is the spec's cleanup, and it can only free a resource.
    /// Nothing is written while connecting, so the bytes queued are the
    /// handshake's followed by each request's, in queue order; other
    /// rounds' requests may sit before and after this round's.
    pub(crate) fn handle_round_end(&mut self, round: u64) {
        if !self.is_connecting() {
            return;
        }
        // The handshake's bytes come first, then each request's.
        let mut start = self.out.len().saturating_sub(self.queued_request_bytes());
        let mut index = 0;
        while let Some(expect) = self.in_flight.get(index) {
            let Expect::Reply {
                tag,
                request,
                wire_len,
                ..
            } = expect
            else {
                index += 1;
                continue;
            };
            let end = (start + wire_len).min(self.out.len());
            if tag.round == round && !request.op.releases() {
                let total = self.out.len();
                self.out.copy_within(end..total, start);
                self.out.truncate(total - (end - start));
                self.in_flight.remove(index);
                self.refresh_oldest();
            } else {
                start = end;
                index += 1;
            }
        }
    }

    /// Bytes of `out` taken by queued requests (not the handshake).
    fn queued_request_bytes(&self) -> usize {
        self.in_flight
            .iter()
            .map(|e| match e {
                Expect::Reply { wire_len, .. } => *wire_len,
                Expect::Handshake(_)
                | Expect::Confirm { .. }
                | Expect::Load { .. }
                | Expect::Notice { .. }
                | Expect::Probe => 0,
            })
            .sum()
    }

    /// The cause for bytes the parser refused: on the first reply of a
    /// connection, the bytes it received tell another protocol apart.
    fn unparsable(&self, error: ProtocolError) -> Cause {
        if self.heard {
            Cause::Protocol(error)
        } else {
            Cause::of_first_reply(error, &self.inbuf)
        }
    }

    /// Reads `uptime_in_seconds` and `run_id` from an `INFO server` reply
    /// and starts the quarantine they call for.
    fn handle_info(&mut self, info: &Bytes, now: Instant) -> Result<(), Cause> {
        let mut uptime = None;
        let mut run_id = None;
        for line in info.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(v) = line.strip_prefix(b"uptime_in_seconds:") {
                uptime = std::str::from_utf8(v)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok());
            } else if let Some(v) = line.strip_prefix(b"run_id:") {
                // A copy: a slice would keep the read buffer shared, and a
                // shared buffer is reallocated instead of reused.
                run_id = Some(Bytes::copy_from_slice(v));
            }
        }
        let (Some(uptime), Some(run_id)) = (uptime, run_id) else {
            let msg = Bytes::from_static(b"no uptime_in_seconds or run_id in INFO server");
            return Err(Cause::Handshake(HandshakeStep::Info, msg));
        };
        if self.run_id.as_ref() != Some(&run_id) {
            self.new_run_id = true;
        }
        let Some(max_ttl) = self.timing.quarantine else {
            self.run_id = Some(run_id);
            return Ok(());
        };
        let mut until = quarantine_after(uptime, max_ttl).and_then(|left| now.checked_add(left));
        let restarted = self.run_id.as_ref().is_some_and(|old| *old != run_id);
        let held = self
            .last_grant
            .is_some_and(|t| now.saturating_duration_since(t) < max_ttl);
        if restarted && held {
            until = until.max(now.checked_add(max_ttl));
        }
        self.quarantined_until = until.max(self.quarantined_until.filter(|t| *t > now));
        self.run_id = Some(run_id);
        Ok(())
    }

    /// The `-NOSCRIPT`s recovered from since the last call, and how.
    pub(crate) fn take_recoveries(&mut self) -> Recoveries {
        std::mem::take(&mut self.recoveries)
    }

    /// Why the master refuses requests of `op` on this connection, if it
    /// does: every one but releases after a handshake step refused for
    /// good (see `refused`); where scripts are refused, those that need
    /// one here, and plain acquires where no native release could undo
    /// them (see `scripts_refused`).
    pub(crate) fn refusal_for(&self, op: Op) -> Option<&Cause> {
        if op.releases() {
            return None;
        }
        if let Some(cause) = &self.refused {
            return Some(cause);
        }
        let cause = self.scripts_refused.as_ref()?;
        let needs_script = op.script().is_some() && op.form(self.caps) == Form::Script;
        let undoable = !op.sets_keys() || self.caps.deletes();
        (needs_script || !undoable).then_some(cause)
    }

    /// The server's `run_id`, as last read in a handshake: the same for
    /// every connection to one server process.
    pub(crate) fn run_id(&self) -> Option<&Bytes> {
        self.run_id.as_ref()
    }

    /// Whether a new `run_id` was read since the last call.
    #[must_use]
    pub(crate) fn take_new_run_id(&mut self) -> bool {
        std::mem::take(&mut self.new_run_id)
    }

    /// Until when the master stays out of the quorum, as last set (past
    /// instants included: see [`Conn::quarantine_left`]); it is in
    /// quarantine at `now` while this is later. For the metrics and the
    /// simulator, which compare it with the time on every turn.
    pub(crate) fn quarantined_until(&self) -> Option<Instant> {
        self.quarantined_until
    }

    /// How much longer the master stays out of the quorum, if at all.
    pub(crate) fn quarantine_left(&self, now: Instant) -> Option<Duration> {
        self.quarantined_until
            .and_then(|until| until.checked_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    /// The master granted a lock: a restart from now on may lose it.
    pub(crate) fn handle_grant(&mut self, now: Instant) {
        self.last_grant = Some(now);
    }

    /// Queues a subscriber's SUBSCRIBE or UNSUBSCRIBE (`args`: the verb,
    /// then the channels), whose confirmations are pushed, one per channel.
    /// It is awaited as a request is: unconfirmed past the stall limit,
    /// the connection is stalled, and as many commands as
    /// [`Timing::max_in_flight`] unconfirmed is too far behind. That bounds
    /// the queue, and the write buffer to that many commands, whatever the
    /// master does.
    ///
    /// # Errors
    /// The cause of the last failure when the connection is down (nothing
    /// queued), or [`Cause::TooFarBehind`] when the bound is reached: the
    /// connection is then dropped, with every subscription on it.
    pub(crate) fn queue_command(&mut self, args: &[Arg<'_>], now: Instant) -> Result<(), Cause> {
        self.admit(now)?;
        self.make_room(resp::command_len(args));
        resp::encode_command(&mut self.out, args);
        self.in_flight.push_back(Expect::Confirm {
            sent_at: now,
            left: args.len().saturating_sub(1),
        });
        self.handle_timed(now);
        Ok(())
    }

    /// The next frame a subscriber connection received after its
    /// handshake: a subscription's confirmation, a message, or an error
    /// reply. The handshake's replies are checked and consumed here, and
    /// each confirmation (or error reply) answers the oldest command
    /// awaiting one.
    ///
    /// # Errors
    /// A [`Cause`] when the connection must be dropped: malformed bytes, a
    /// failed handshake step, or a confirmation nothing awaits
    /// ([`Cause::Unsolicited`]).
    pub(crate) fn poll_push(&mut self) -> Result<Option<Reply>, Cause> {
        loop {
            let Some(reply) = resp::decode_resumed(&mut self.inbuf, &mut self.scan, &self.limits)
                .map_err(|e| self.unparsable(e))?
            else {
                return Ok(None);
            };
            self.heard = true;
            if self.handshake_left == 0 {
                self.handle_confirmation(&reply)?;
                return Ok(Some(reply));
            }
            let step = self.in_flight.pop_front();
            self.refresh_oldest();
            if let Some(Expect::Handshake(step)) = step
                && let Reply::Error(msg) = reply
            {
                return Err(Cause::Handshake(step, msg));
            }
            self.handshake_left -= 1;
        }
    }

    /// Counts `reply`, pushed to a subscriber, against the oldest command
    /// awaiting confirmation: a confirmation answers one of its channels,
    /// an error reply the whole command. Messages answer nothing.
    fn handle_confirmation(&mut self, reply: &Reply) -> Result<(), Cause> {
        let error = matches!(reply, Reply::Error(_));
        let confirms = match reply {
            Reply::Array(items) => match items.first() {
                Some(Reply::Bulk(kind)) => {
                    kind[..] == b"subscribe"[..] || kind[..] == b"unsubscribe"[..]
                }
                _ => false,
            },
            _ => false,
        };
        if !error && !confirms {
            return Ok(());
        }
        let Some(Expect::Confirm { left, .. }) = self.in_flight.front_mut() else {
            return Err(Cause::Unsolicited);
        };
        *left = if error { 0 } else { left.saturating_sub(1) };
        if *left == 0 {
            self.in_flight.pop_front();
            self.refresh_oldest();
        }
        Ok(())
    }

    /// How many bytes are queued and unwritten, connecting or not (the
    /// simulator tells from it which requests were queued together).
    #[cfg(any(test, redlock_sim))]
    pub(crate) fn unwritten(&self) -> usize {
        self.out.len().saturating_sub(self.written)
    }

    /// Bytes waiting to be written; empty while connecting.
    pub(crate) fn poll_transmit(&self) -> &[u8] {
        match self.state {
            State::Ready => self.out.get(self.written..).unwrap_or_default(),
            _ => &[],
        }
    }

    /// The driver wrote the first `n` bytes of [`Conn::poll_transmit`].
    pub(crate) fn handle_written(&mut self, n: usize) {
        self.written = self.written.saturating_add(n).min(self.out.len());
        if self.written == self.out.len() {
            self.clear_out();
        }
    }

    fn clear_out(&mut self) {
        self.out.clear();
        self.written = 0;
    }

    /// Makes room for `len` more bytes in the write buffer by moving the
    /// unwritten bytes to its start when the written ones are in the way,
    /// so that partial writes never make it reallocate.
    fn make_room(&mut self, len: usize) {
        if self.written > 0 && self.out.len() + len > self.out.capacity() {
            self.out.copy_within(self.written.., 0);
            self.out.truncate(self.out.len() - self.written);
            self.written = 0;
        }
    }

    /// Queues `SCRIPT LOAD` of script `id`, whose reply
    /// [`Conn::poll_reply`] consumes (a refusal turns later recoveries to
    /// EVAL), unless one is in flight already (see `loading`).
    fn load_script(&mut self, id: ScriptId, now: Instant) {
        let bit = 1u32 << (id as u32);
        if self.loading & bit != 0
            && !crate::knobs::injected(crate::knobs::Bug::ScriptLoadedPerNoscript)
        {
            return;
        }
        self.loading |= bit;
        let source = self.scripts.get(id).source();
        resp::encode_command(
            &mut self.out,
            &[
                Arg::Bytes(b"SCRIPT"),
                Arg::Bytes(b"LOAD"),
                Arg::Bytes(source.as_bytes()),
            ],
        );
        self.in_flight.push_back(Expect::Load {
            sent_at: now,
            script: id,
        });
        self.handle_timed(now);
    }

    /// The driver read `bytes` from the socket.
    pub(crate) fn handle_input(&mut self, bytes: &[u8]) {
        self.inbuf.extend_from_slice(bytes);
    }

    /// The next reply to a request, with its tag. Handshake replies are
    /// checked and consumed here; a `-NOSCRIPT` reply to a script is
    /// answered, when `resend` says the request still matters (its round
    /// is undecided, or it is a release), by `SCRIPT LOAD` of the script
    /// and the `EVALSHA` again, in one write (one round trip, as EVAL was),
    /// or by EVAL where SCRIPT LOAD is refused or did not take; the caller
    /// sees only the last reply. A late `-NOSCRIPT` to an
    /// acquire or extend whose round was decided is returned as it is:
    /// re-sent, it could set a key again after its cleanup release. Its
    /// script is loaded all the same (not run), so that the connection's
    /// next use of it pays no NOSCRIPT.
    /// Replies to rounds that are over are returned too: the round drops
    /// tags that are not its own.
    ///
    /// # Errors
    /// A [`Cause`] when the connection must be dropped: malformed bytes, a
    /// reply with nothing in flight, or a failed handshake step. The caller
    /// then calls [`Conn::handle_failure`].
    pub(crate) fn poll_reply(
        &mut self,
        now: Instant,
        resend: impl Fn(Tag, Op) -> bool,
    ) -> Result<Option<(Tag, Reply)>, Cause> {
        loop {
            let decoded = resp::decode_resumed(&mut self.inbuf, &mut self.scan, &self.limits);
            let Some(reply) = decoded.map_err(|e| {
                // Past the parser's limits: the next handshakes leave the
                // probe out, rather than break every connection on it.
                if matches!(self.in_flight.front(), Some(Expect::Probe)) {
                    self.probe_broke = true;
                }
                self.unparsable(e)
            })?
            else {
                return Ok(None);
            };
            self.heard = true;
            let expect = self.in_flight.pop_front();
            self.refresh_oldest();
            match expect {
                // A command connection queues no subscriber command.
                None | Some(Expect::Confirm { .. }) => return Err(Cause::Unsolicited),
                // An error too offers nothing: the scripts run.
                Some(Expect::Probe) => {
                    self.caps = Capabilities::from_docs(&reply);
                    self.handshake_left = self.handshake_left.saturating_sub(1);
                }
                Some(Expect::Notice { .. }) => {}
                Some(Expect::Handshake(step)) => {
                    match reply {
                        // INFO serves restart quarantine and one server,
                        // one vote: a user denied it may still lock with
                        // quarantine off, without the second check.
                        Reply::Error(msg)
                            if step == HandshakeStep::Info
                                && self.timing.quarantine.is_none()
                                && error_code(&msg) == Some(b"NOPERM") => {}
                        // Scripts over Valkey's `maxmemory-scripts`: they
                        // run by EVAL instead (see `script_load_refused`).
                        Reply::Error(msg)
                            if step == HandshakeStep::ScriptLoad
                                && error_code(&msg) == Some(b"OOM") =>
                        {
                            self.script_load_refused = true;
                        }
                        Reply::Error(msg) => {
                            if step == HandshakeStep::ScriptLoad {
                                self.script_load_refused = true;
                            }
                            let cause = Cause::Handshake(step, msg);
                            // After AUTH, the requests behind the refused
                            // step run anyway: the connection stays, for
                            // releases (see `refused`), and where scripts
                            // are refused, for what the master's own
                            // commands do (see `scripts_refused`).
                            if step == HandshakeStep::Auth || !cause.is_permanent() {
                                return Err(cause);
                            }
                            if step == HandshakeStep::ScriptLoad {
                                self.scripts_refused = Some(cause);
                            } else {
                                self.refused = Some(cause);
                            }
                        }
                        Reply::Bulk(info) if step == HandshakeStep::Info => {
                            self.handle_info(&info, now)?
                        }
                        _ => {}
                    }
                    self.handshake_left = self.handshake_left.saturating_sub(1);
                }
                Some(Expect::Load { script, .. }) => {
                    self.loading &= !(1u32 << (script as u32));
                    // The sha, or a refusal: EVAL from now on.
                    if matches!(reply, Reply::Error(_)) {
                        self.script_load_refused = true;
                    }
                }
                Some(Expect::Reply {
                    tag,
                    request,
                    form,
                    resent,
                    notice,
                    sent_at,
                    ..
                }) => {
                    if notice {
                        self.in_flight.push_front(Expect::Notice { sent_at });
                        self.refresh_oldest();
                    }
                    if form != Form::Script {
                        // Advertised, then refused (a proxy, an ACL, a
                        // server that lied): the script from now on, and
                        // this request again by it while it matters. The
                        // refused command did nothing.
                        if !is_unavailable(&reply) {
                            return Ok(Some((tag, read_native(form, &request, reply))));
                        }
                        self.drop_capability(form);
                        if !resend(tag, request.op) {
                            return Ok(Some((tag, reply)));
                        }
                        self.recoveries.native_refused += 1;
                        self.resend_as(tag, request, Form::Script, now);
                        continue;
                    }
                    // Sent as a script before the probe was answered, to a
                    // user without scripting rights: the master's own
                    // command, now known, does it.
                    let native = request.form(self.caps);
                    if native != Form::Script
                        && resent == Resent::No
                        && reply.is_error_code(b"NOPERM")
                        && resend(tag, request.op)
                    {
                        self.resend_as(tag, request, native, now);
                        continue;
                    }
                    let next = match resent {
                        Resent::No if self.script_load_refused => Resent::Eval,
                        Resent::No => Resent::Loaded,
                        Resent::Loaded => Resent::Eval,
                        Resent::Eval => return Ok(Some((tag, reply))),
                    };
                    let Some(id) = request.op.script() else {
                        return Ok(Some((tag, reply)));
                    };
                    let script = *self.scripts.get(id);
                    if !reply.is_error_code(b"NOSCRIPT") {
                        return Ok(Some((tag, reply)));
                    }
                    // A rare path (after SCRIPT FLUSH or a restart), and
                    // new sends: the stall limit counts from now, not from
                    // the EVALSHA they replace.
                    self.make_room(script.source().len() + 256);
                    if !resend(tag, request.op) {
                        // Decided: not run again, but loaded, so that the
                        // next use of the script here pays no NOSCRIPT.
                        if next == Resent::Loaded {
                            self.load_script(id, now);
                        }
                        return Ok(Some((tag, reply)));
                    }
                    if next == Resent::Loaded {
                        self.load_script(id, now);
                        self.recoveries.script_load += 1;
                    } else {
                        self.recoveries.eval += 1;
                    }
                    let before = self.out.len();
                    request.encode_as(&self.scripts, &mut self.out, next == Resent::Eval);
                    let wire_len = self.out.len() - before;
                    self.push_reply(tag, request, Form::Script, wire_len, next, now);
                }
            }
        }
    }

    /// Sends `request` again, in `form`, for the reply its first send did
    /// not give: new bytes, so the stall limit counts from now.
    fn resend_as(&mut self, tag: Tag, request: Request, form: Form, now: Instant) {
        self.make_room(
            256 + request
                .keys
                .as_slice()
                .iter()
                .map(|k| k.len())
                .sum::<usize>(),
        );
        let before = self.out.len();
        request.encode_form(form, &self.scripts, &mut self.out);
        let wire_len = self.out.len() - before;
        self.push_reply(tag, request, form, wire_len, Resent::No, now);
    }

    /// The master refused its own command in `form`: the script instead,
    /// until the next handshake asks again.
    fn drop_capability(&mut self, form: Form) {
        match form {
            Form::Script => {}
            Form::Delete(Delete::DelIfEq) => self.caps.delifeq = false,
            Form::Delete(Delete::DelEx) => self.caps.delex = false,
            Form::Extend => self.caps.set_ifeq = false,
        }
    }
}

/// Whether an error reply to a native command says the master cannot run
/// it (unknown, a syntax it does not take, an ACL denying it), rather
/// than what it found: such a command did nothing, and the script can
/// do it instead.
fn is_unavailable(reply: &Reply) -> bool {
    reply.is_error_code(b"ERR") || reply.is_error_code(b"NOPERM")
}

/// A native reply, read as its script's would be (see
/// [`native::read_extend`]).
fn read_native(form: Form, request: &Request, reply: Reply) -> Reply {
    match form {
        Form::Extend => native::read_extend(reply, request.token.as_bytes()),
        _ => reply,
    }
}

/// What the masters' health board and the simulator's checkers read of a
/// connection: none of it decides anything.
impl Conn {
    /// Why the connection is down, while it is: a drop at the in-flight
    /// bound reads [`Cause::TooFarBehind`] until the next connect.
    pub(crate) fn down_cause(&self) -> Option<&Cause> {
        match &self.state {
            State::Down { cause, .. } => Some(cause),
            _ => None,
        }
    }

    /// Whether a connect was ever started.
    pub(crate) fn was_connected(&self) -> bool {
        self.connects > 0
    }

    /// Whether the connection is up with its handshake answered.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready) && self.handshake_left == 0
    }

    /// The lock commands the master offers, as its last handshake told,
    /// less any it refused since.
    pub(crate) fn capabilities(&self) -> Capabilities {
        self.caps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::TokenSource;

    fn timing() -> Timing {
        Timing {
            connect: Duration::from_secs(1),
            stall: Duration::from_secs(1),
            patience: Duration::from_millis(200),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
            quarantine: None,
            max_in_flight: 1024,
        }
    }

    /// The commands in the write buffer, each as its key (the second
    /// word; the fourth for EVALSHA), after the handshake's.
    fn queued_keys(conn: &Conn) -> Vec<Bytes> {
        let mut buf = BytesMut::from(&conn.out[conn.written..]);
        let mut keys = Vec::new();
        while let Some(Reply::Array(words)) = resp::decode(&mut buf, &Limits::default()).unwrap() {
            let word = |i: usize| match words.get(i) {
                Some(Reply::Bulk(b)) => b.clone(),
                _ => Bytes::new(),
            };
            match &word(0)[..] {
                b"SET" => keys.push(word(1)),
                b"EVALSHA" => keys.push(word(3)),
                _ => {}
            }
        }
        assert!(buf.is_empty(), "a partial command is left: {buf:?}");
        keys
    }

    fn expected_keys(conn: &Conn) -> Vec<Bytes> {
        conn.in_flight
            .iter()
            .filter_map(|e| match e {
                Expect::Reply { request, .. } => request.keys.as_slice().first().cloned(),
                Expect::Handshake(_)
                | Expect::Confirm { .. }
                | Expect::Load { .. }
                | Expect::Notice { .. }
                | Expect::Probe => None,
            })
            .collect()
    }

    /// A subscriber's command is awaited as a request
    /// is. A SUBSCRIBE naming two channels waits for two confirmations,
    /// messages between them answer nothing, the stall limit runs until
    /// the last one, and a confirmation nothing awaits breaks the
    /// protocol.
    #[test]
    fn a_subscriber_command_is_answered_by_one_confirmation_per_channel() {
        let now = Instant::now();
        let addr: ServerAddr = "redis://127.0.0.1:7000".parse().unwrap();
        let mut conn = Conn::with_role(
            Role::Subscriber,
            addr,
            Scripts::new(),
            Limits::default(),
            timing(),
            now,
        );
        conn.handle_connect_started(now);
        conn.handle_connected();
        let subscribe = [Arg::Bytes(b"SUBSCRIBE"), Arg::Bytes(b"a"), Arg::Bytes(b"b")];
        conn.queue_command(&subscribe, now).unwrap();
        let stall = now + timing().stall;
        let frame = |kind: &str, channel: &str| {
            let mut out = BytesMut::new();
            let words = [kind, channel].map(|w| Reply::Bulk(Bytes::copy_from_slice(w.as_bytes())));
            Reply::Array(words.into_iter().chain([Reply::Integer(1)]).collect()).encode(&mut out);
            out
        };
        let steps: [(&str, &str, usize); 4] = [
            ("subscribe", "a", 1),
            ("message", "a", 1),
            ("message", "elsewhere", 1),
            ("subscribe", "b", 0),
        ];
        for (kind, channel, left) in steps {
            conn.handle_input(&frame(kind, channel));
            assert!(conn.poll_push().unwrap().is_some(), "{kind} {channel}");
            assert_eq!(conn.in_flight(), left, "after {kind} {channel}");
            let deadline = (left > 0).then_some(stall);
            assert_eq!(conn.poll_timeout(), deadline, "after {kind} {channel}");
        }
        conn.handle_input(&frame("unsubscribe", "a"));
        assert_eq!(conn.poll_push(), Err(Cause::Unsolicited));
    }

    /// With many rounds in flight, ending rounds while the
    /// connection is still connecting must drop exactly their unsent
    /// requests: the bytes and the in-flight queue stay in step, request by
    /// request, or a reply would be matched to another request.
    #[test]
    fn ending_rounds_while_connecting_keeps_the_bytes_and_the_queue_in_step() {
        let now = Instant::now();
        let scripts = Scripts::new();
        let mut tokens = TokenSource::from_seed([3; 16]);
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for trial in 0..500 {
            let addr: ServerAddr = "redis://127.0.0.1:7000".parse().unwrap();
            let mut conn = Conn::new(addr, scripts, Limits::default(), timing(), now);
            conn.handle_connect_started(now);
            for step in 0..40 {
                if next(4) == 0 {
                    conn.handle_round_end(next(6));
                } else {
                    let op = if next(3) == 0 {
                        Op::Release
                    } else {
                        Op::Acquire
                    };
                    let request = Request {
                        op,
                        keys: Keys::One(Bytes::from(format!("t{trial}:s{step}"))),
                        token: tokens.next_token(),
                        arg: 1000,
                        notice: false,
                    };
                    let mut wires = Wires::new();
                    let tag = Tag {
                        round: next(6),
                        slot: 0,
                    };
                    conn.send(tag, &request, &mut wires, now).unwrap();
                }
                assert_eq!(
                    queued_keys(&conn),
                    expected_keys(&conn),
                    "trial {trial}, step {step}"
                );
            }
        }
    }

    /// A release names the process to try next only when it has one, and
    /// a waiting attempt asks for its refusal's notice only when told.
    #[test]
    fn optional_script_arguments_are_sent_only_when_set() {
        let scripts = Scripts::new();
        let encoded = |op: Op, arg: i64, notice: bool| {
            let request = Request {
                op,
                keys: Keys::One(Bytes::from_static(b"k")),
                token: Token::parse("t").unwrap(),
                arg,
                notice,
            };
            let mut dst = BytesMut::new();
            request.encode(&scripts, &mut dst);
            String::from_utf8(dst.to_vec()).unwrap()
        };
        let head = |n: usize, id: ScriptId| {
            let sha = std::str::from_utf8(scripts.get(id).sha()).unwrap();
            format!("*{n}\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n1\r\n$1\r\nk\r\n$1\r\nt\r\n")
        };
        let release = head(5, ScriptId::Release);
        assert_eq!(encoded(Op::Release, 0, false), release);
        assert_eq!(encoded(Op::Release, 0, true), release);
        assert_eq!(
            encoded(Op::Release, -42, false),
            format!("{}$3\r\n-42\r\n", head(6, ScriptId::Release))
        );
        let attempt = head(6, ScriptId::AcquireWait);
        assert_eq!(
            encoded(Op::AcquireWait, 500, false),
            format!("{attempt}$3\r\n500\r\n")
        );
        assert_eq!(
            encoded(Op::AcquireWait, 500, true),
            format!("{}$3\r\n500\r\n$1\r\n1\r\n", head(7, ScriptId::AcquireWait))
        );
        // A fenced acquire's phase one asks the same way.
        assert!(encoded(Op::AcquireFenced, 500, true).ends_with("$3\r\n500\r\n$1\r\n1\r\n"));
        assert!(encoded(Op::AcquireFenced, 500, false).ends_with("$3\r\n500\r\n"));
    }

    /// Which refusals are for good (fail fast) and which are a
    /// master that is busy for now (retried).
    #[test]
    fn permanent_refusals_are_told_from_transient_ones() {
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        let cases: [(&str, Cause, bool); 11] = [
            (
                "wrong password",
                Cause::Handshake(
                    HandshakeStep::Auth,
                    b("WRONGPASS invalid username-password pair"),
                ),
                true,
            ),
            (
                "no INFO right",
                Cause::Handshake(
                    HandshakeStep::Info,
                    b("NOPERM this user has no permissions to run the 'info' command"),
                ),
                true,
            ),
            (
                "no such database",
                Cause::Handshake(HandshakeStep::Select, b("ERR DB index is out of range")),
                true,
            ),
            (
                "no SCRIPT right",
                Cause::Handshake(HandshakeStep::ScriptLoad, b("NOPERM no")),
                true,
            ),
            (
                "loading",
                Cause::Handshake(
                    HandshakeStep::Info,
                    b("LOADING Redis is loading the dataset in memory"),
                ),
                false,
            ),
            (
                "busy",
                Cause::Handshake(
                    HandshakeStep::ScriptLoad,
                    b("BUSY Redis is busy running a script"),
                ),
                false,
            ),
            (
                "our own complaint",
                Cause::Handshake(
                    HandshakeStep::Info,
                    b("no uptime_in_seconds or run_id in INFO server"),
                ),
                false,
            ),
            (
                "a key refused",
                Cause::Server(b(
                    "NOPERM this user has no permissions to access one of the keys",
                )),
                true,
            ),
            (
                "no password sent",
                Cause::Server(b("NOAUTH Authentication required.")),
                true,
            ),
            ("another error", Cause::Server(b("ERR something")), false),
            (
                "in backoff after a refusal",
                Cause::Backoff(Box::new(Cause::Handshake(
                    HandshakeStep::Auth,
                    b("WRONGPASS x"),
                ))),
                true,
            ),
        ];
        for (name, cause, permanent) in cases {
            assert_eq!(cause.is_permanent(), permanent, "{name}: {cause}");
        }
        assert!(!Cause::Timeout.is_permanent() && !Cause::Closed.is_permanent());
    }

    /// A port that speaks another protocol reads as not Redis,
    /// quoting what it sent, from its first bytes only; bytes that open
    /// as RESP keep the parser's error.
    #[test]
    fn a_first_reply_that_is_not_resp_reads_as_not_a_redis_server() {
        let error = ProtocolError::UnknownType(b'H');
        let long = format!("{}\r\n", "x".repeat(100));
        let cases: [(&str, &[u8], &str); 6] = [
            (
                "an HTTP answer",
                b"HTTP/1.1 400 Bad Request\r\n\r\n",
                "not a Redis server (it answered \"HTTP/1.1 400 Bad Request\")",
            ),
            (
                "a TLS alert to plain text",
                b"\x15\x03\x03\x00\x02\x02\x46",
                "not a Redis server in plain text: it answered in TLS (use rediss://",
            ),
            (
                "a binary banner is escaped",
                b"\x00\x01ssh\n",
                "not a Redis server (it answered \"\\x00\\x01ssh\")",
            ),
            (
                "a long line is cut",
                long.as_bytes(),
                "not a Redis server (it answered \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...\")",
            ),
            (
                "RESP with a bad line ending stays a protocol violation",
                b"+OK\rx",
                "protocol violation: unknown RESP type byte 0x48",
            ),
            (
                "RESP3 opens as RESP",
                b"%1\r\n",
                "protocol violation: unknown RESP type byte 0x48",
            ),
        ];
        for (name, received, says) in cases {
            let cause = Cause::of_first_reply(error, received);
            assert!(cause.is_protocol(), "{name}");
            let text = cause.to_string();
            assert!(text.starts_with(says), "{name}: {text}");
        }
    }

    /// The rule `redlock probe` shows is the one a connection applies.
    #[test]
    fn a_master_is_quarantined_until_its_uptime_passes_the_max_ttl() {
        let s = Duration::from_secs;
        let cases = [
            ("just started", 0, Some(s(60))),
            ("a second may be a millisecond", 1, Some(s(60))),
            ("up 2 s: more than 1 s", 2, Some(s(59))),
            ("the last second", 60, Some(s(1))),
            ("over", 61, None),
            ("long over", 86_400, None),
        ];
        for (name, uptime, left) in cases {
            let want = left.map(Cause::Quarantined);
            assert_eq!(Cause::of_uptime(uptime, s(60)), want, "{name}");
        }
    }

    /// A refusal's advice follows the server's error code where
    /// the code says it (credentials), whichever command was refused; the
    /// step's own advice otherwise.
    #[test]
    fn a_refusal_advises_from_its_error_code_before_its_step() {
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        let noauth = b("NOAUTH Authentication required.");
        let cases: [(&str, Cause, &str, &str); 6] = [
            (
                "no password, INFO refused first",
                Cause::Handshake(HandshakeStep::Info, noauth.clone()),
                "put the password in the URL: redis://:PASSWORD@host:port",
                "quarantine",
            ),
            (
                "no password, SCRIPT LOAD refused first",
                Cause::Handshake(HandshakeStep::ScriptLoad, noauth.clone()),
                "the master needs a password and the URL has none",
                "+script",
            ),
            (
                "no password, a command refused",
                Cause::Server(noauth),
                "put the password in the URL",
                "grant",
            ),
            (
                "a wrong password",
                Cause::Handshake(
                    HandshakeStep::Auth,
                    b("WRONGPASS invalid username-password pair or user is disabled."),
                ),
                "wrong user name or password, or the user is disabled: check the user name and password in the URL",
                "PASSWORD@",
            ),
            (
                "INFO denied",
                Cause::Handshake(HandshakeStep::Info, b("NOPERM no 'info'")),
                "grant the user +info, or turn restart quarantine off",
                "password",
            ),
            (
                "no such database",
                Cause::Handshake(HandshakeStep::Select, b("ERR DB index is out of range")),
                "check the URL's database number",
                "password",
            ),
        ];
        for (name, cause, says, not) in cases {
            let text = cause.to_string();
            assert!(text.contains(says), "{name}: {text}");
            assert!(!text.contains(not), "{name}: {text}");
        }
    }
}
