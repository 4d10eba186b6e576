//! Hostile and broken masters, from a fake server written here: garbage
//! bytes, an over-limit bulk length, replies dribbled one byte at a time,
//! replies cut off by a close, silence, replies of the wrong type, and
//! floods of bytes.
//!
//! Each fake stands as one of three masters beside two real redis-server
//! masters: it may cost its own vote and a reconnect, nothing more. The
//! client must return correct results from the others (a second client
//! contending is refused, the first one's release lets it in), never panic,
//! and keep its buffers under [`CAP`]. Alone (N = 1), each fake must turn
//! into the error that names it. After every test no key remains on the
//! real masters.
//!
//! The fake listens on 127.0.0.1 only, answers the handshake the client
//! sends in its first write (a `SCRIPT LOAD` per script, and `INFO server` with
//! restart quarantine on), and stops with its test: dropping it joins every
//! thread it started. Every loop here is bounded in count and time.

mod common;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::{Cluster, Server, cluster, connect, wait_empty};
use redlock_mio::Cause;
use redlock_mio::resp::{Arg, Limit, Limits, ProtocolError, Reply, decode};
use redlock_mio::script::{CLEANUP_SOURCE, EXTEND_SOURCE, RELEASE_SOURCE, Script};
use redlock_mio::{Config, Error, Failure, Redlock, Vote};

/// The stated bound on how far a client's buffer memory over three masters
/// ([`Redlock::buffer_capacity`]) may grow past what a new client holds,
/// whatever the masters send: a flooding master's read buffer may have to
/// hold one reply at the parser's limit.
const CAP: usize = 256 * 1024;
/// Long enough that no key expires during a test: a key that is gone was
/// released.
const TTL: Duration = Duration::from_secs(10);
/// How long a check for an empty master may take: far below the TTL.
const WAIT: Duration = Duration::from_secs(3);
/// How often the fake's threads look for the stop flag.
const POLL: Duration = Duration::from_millis(20);
/// The most bytes a flooding fake sends on one connection.
const FLOOD_LIMIT: u64 = 64 << 20;
/// The longest a flooding fake keeps one connection going.
const FLOOD_TIME: Duration = Duration::from_secs(10);

/// What a fake master does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// A working master: SET NX PX and the release, cleanup and extend
    /// scripts, in memory.
    Honest,
    /// Honest, but every reply leaves one byte per write, 300 µs apart.
    Dribble,
    /// Answers the handshake, then garbage in place of every reply to a
    /// lock command.
    Garbage,
    /// Answers the handshake, then `$999999999` in place of every reply.
    OverLimitBulk,
    /// Answers the handshake, then half of the reply, then closes.
    Cut,
    /// Accepts and reads, answers nothing, never closes.
    Silent,
    /// Answers the handshake, then `:1` where `+OK` belongs and `+OK`
    /// where an integer belongs.
    WrongType,
    /// Streams bytes from the moment the client connects, as fast as the
    /// client takes them, whatever it sends.
    Flood(Flood),
}

/// What a flooding fake streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flood {
    /// Bytes that are not RESP at all.
    Garbage,
    /// A bulk header exactly at the length limit, then its payload
    /// without end: the parser must hold the whole payload before it can
    /// tell.
    BulkAtTheLimit,
    /// A bulk header past the length limit, then payload without end.
    OverLimitBulk,
    /// A simple string without end.
    EndlessLine,
    /// Complete bulks at the length limit, one after another.
    ValidBulks,
    /// `*1` without end: nesting past the depth limit.
    DeepArrays,
    /// Arrays at the length limit, nested to the depth limit, of bulks
    /// at the length limit: every limit respected, and the reply never
    /// ends.
    WideArraysOfBulks,
}

impl Flood {
    /// Every flood whose replies, or first bad byte, come within the
    /// parser's per-item limits.
    const ITEM_LIMITED: [Flood; 6] = [
        Flood::Garbage,
        Flood::BulkAtTheLimit,
        Flood::OverLimitBulk,
        Flood::EndlessLine,
        Flood::ValidBulks,
        Flood::DeepArrays,
    ];

    /// What is sent first, and what is repeated after it.
    fn bytes(self) -> (Vec<u8>, Vec<u8>) {
        let limits = Limits::default();
        let bulk = || {
            let mut b = format!("${}\r\n", limits.max_bulk_len).into_bytes();
            b.resize(b.len() + limits.max_bulk_len, b'x');
            b.extend_from_slice(b"\r\n");
            b
        };
        match self {
            Flood::Garbage => (Vec::new(), b"\x00\xffgarbage?!".repeat(1024)),
            Flood::BulkAtTheLimit => (
                format!("${}\r\n", limits.max_bulk_len).into_bytes(),
                vec![b'x'; 16 * 1024],
            ),
            Flood::OverLimitBulk => (b"$999999999\r\n".to_vec(), vec![b'x'; 16 * 1024]),
            Flood::EndlessLine => (b"+".to_vec(), vec![b'a'; 16 * 1024]),
            Flood::ValidBulks => (Vec::new(), bulk()),
            Flood::DeepArrays => (Vec::new(), b"*1\r\n".repeat(4096)),
            Flood::WideArraysOfBulks => {
                let header = format!("*{}\r\n", limits.max_array_len);
                (header.repeat(limits.max_depth).into_bytes(), bulk())
            }
        }
    }
}

/// The keys an honest fake holds: value and expiry by key.
type Store = HashMap<Vec<u8>, (Vec<u8>, Instant)>;

/// The state a fake's threads share.
struct FakeState {
    behaviour: Behaviour,
    stop: AtomicBool,
    accepted: AtomicUsize,
    lock_commands: AtomicUsize,
    flooded: AtomicU64,
    keys: Mutex<Store>,
    handlers: Mutex<Vec<JoinHandle<()>>>,
}

/// A fake master on 127.0.0.1: one thread accepting, one per connection.
/// Dropping it stops and joins them all.
struct Fake {
    addr: SocketAddr,
    state: Arc<FakeState>,
    acceptor: Option<JoinHandle<()>>,
}

impl Fake {
    fn start(behaviour: Behaviour) -> Fake {
        let listener = expect(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)));
        let addr = expect(listener.local_addr());
        let state = Arc::new(FakeState {
            behaviour,
            stop: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
            lock_commands: AtomicUsize::new(0),
            flooded: AtomicU64::new(0),
            keys: Mutex::new(HashMap::new()),
            handlers: Mutex::new(Vec::new()),
        });
        let shared = Arc::clone(&state);
        let acceptor = thread::spawn(move || accept_loop(&listener, &shared));
        Fake {
            addr,
            state,
            acceptor: Some(acceptor),
        }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Keys the fake holds that have not expired.
    fn keys_held(&self) -> usize {
        let now = Instant::now();
        lock(&self.state.keys)
            .values()
            .filter(|(_, expiry)| *expiry > now)
            .count()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept; it sees `stop` and returns.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for handler in std::mem::take(&mut *lock(&self.state.handlers)) {
            let _ = handler.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn expect<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

fn accept_loop(listener: &TcpListener, state: &Arc<FakeState>) {
    for conn in listener.incoming() {
        if state.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else {
            thread::sleep(POLL);
            continue;
        };
        state.accepted.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::clone(state);
        let mut handlers = lock(&state.handlers);
        handlers.retain(|h| !h.is_finished());
        handlers.push(thread::spawn(move || serve(stream, &shared)));
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// One connection: reads commands and answers them as the behaviour says.
fn serve(mut stream: TcpStream, state: &FakeState) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(POLL));
    let _ = stream.set_write_timeout(Some(POLL));
    if let Behaviour::Flood(flood) = state.behaviour {
        return serve_flood(stream, flood, state);
    }
    let limits = Limits {
        max_bulk_len: 1 << 20,
        ..Limits::default()
    };
    let mut inbuf = BytesMut::new();
    let mut chunk = [0u8; 4096];
    while !state.stop.load(Ordering::SeqCst) {
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => inbuf.extend_from_slice(&chunk[..n]),
            Err(e) if is_transient(&e) => continue,
            Err(_) => return,
        }
        loop {
            let items = match decode(&mut inbuf, &limits) {
                Ok(None) => break,
                Ok(Some(Reply::Array(items))) => items,
                Ok(Some(_)) | Err(_) => return,
            };
            let args: Vec<&[u8]> = items
                .iter()
                .map(|item| match item {
                    Reply::Bulk(b) => b.as_ref(),
                    _ => b"".as_slice(),
                })
                .collect();
            let honest = honest_reply(state, &args);
            let lock_command = matches!(
                args.first().map(|a| a.to_ascii_uppercase()).as_deref(),
                Some(b"SET" | b"EVALSHA" | b"EVAL")
            );
            if lock_command {
                state.lock_commands.fetch_add(1, Ordering::SeqCst);
            }
            let sent = match state.behaviour {
                Behaviour::Silent => Ok(()),
                Behaviour::Dribble => dribble(&mut stream, &honest, state),
                Behaviour::Honest => write_all(&mut stream, &honest, state),
                _ if !lock_command => write_all(&mut stream, &honest, state),
                Behaviour::Garbage => write_all(&mut stream, b"?garbage\x00\xff\r\n", state),
                Behaviour::OverLimitBulk => write_all(&mut stream, b"$999999999\r\n", state),
                Behaviour::WrongType if args[0].eq_ignore_ascii_case(b"SET") => {
                    write_all(&mut stream, b":1\r\n", state)
                }
                Behaviour::WrongType => write_all(&mut stream, b"+OK\r\n", state),
                Behaviour::Cut => {
                    let _ = write_all(&mut stream, &honest[..honest.len() / 2], state);
                    let _ = stream.shutdown(Shutdown::Both);
                    return;
                }
                Behaviour::Flood(_) => unreachable!("served by serve_flood"),
            };
            if sent.is_err() {
                return;
            }
        }
    }
}

/// Writes all of `bytes`, retrying write timeouts until the fake stops.
fn write_all(stream: &mut TcpStream, mut bytes: &[u8], state: &FakeState) -> io::Result<()> {
    while !bytes.is_empty() {
        if state.stop.load(Ordering::SeqCst) {
            return Err(io::ErrorKind::Interrupted.into());
        }
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if is_transient(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn dribble(stream: &mut TcpStream, bytes: &[u8], state: &FakeState) -> io::Result<()> {
    for byte in bytes {
        write_all(stream, std::slice::from_ref(byte), state)?;
        thread::sleep(Duration::from_micros(300));
    }
    Ok(())
}

fn serve_flood(mut stream: TcpStream, flood: Flood, state: &FakeState) {
    let (head, body) = flood.bytes();
    let started = Instant::now();
    let mut sent = 0u64;
    let mut next = if head.is_empty() { body.clone() } else { head };
    while sent < FLOOD_LIMIT && started.elapsed() < FLOOD_TIME && !state.stop.load(Ordering::SeqCst)
    {
        match stream.write(&next) {
            Ok(0) => return,
            Ok(n) => {
                sent += n as u64;
                state.flooded.fetch_add(n as u64, Ordering::SeqCst);
                next.drain(..n);
                if next.is_empty() {
                    next.extend_from_slice(&body);
                }
            }
            Err(e) if is_transient(&e) => {}
            Err(_) => return,
        }
    }
}

/// What a working master answers.
fn honest_reply(state: &FakeState, args: &[&[u8]]) -> Vec<u8> {
    let release = Script::new(RELEASE_SOURCE);
    let cleanup = Script::new(CLEANUP_SOURCE);
    let extend = Script::new(EXTEND_SOURCE);
    let upper = |i: usize| args.get(i).map(|a| a.to_ascii_uppercase());
    let int = |i: usize| -> Option<i64> { std::str::from_utf8(args.get(i)?).ok()?.parse().ok() };
    let script = |body: &[u8], by_sha: bool| {
        [release, cleanup, extend].into_iter().find(|s| {
            if by_sha {
                body == s.sha()
            } else {
                body == s.source().as_bytes()
            }
        })
    };
    let bulk = |b: &[u8]| {
        let mut out = format!("${}\r\n", b.len()).into_bytes();
        out.extend_from_slice(b);
        out.extend_from_slice(b"\r\n");
        out
    };
    let mut keys = lock(&state.keys);
    let now = Instant::now();
    keys.retain(|_, (_, expiry)| *expiry > now);
    match upper(0).as_deref() {
        Some(b"PING") => b"+PONG\r\n".to_vec(),
        // Up for a day, for a client with restart quarantine on.
        Some(b"INFO") => bulk(
            b"# Server\r\nredis_version:7.0.0\r\n\
              run_id:0123456789abcdef0123456789abcdef01234567\r\n\
              uptime_in_seconds:86400\r\n",
        ),
        // As Redis does: any script loads, answered with its SHA1 (the
        // fake runs only the release, cleanup and extend scripts, below).
        Some(b"SCRIPT") if upper(1).as_deref() == Some(b"LOAD") && args.len() == 3 => {
            let source = String::from_utf8_lossy(args[2]).into_owned();
            bulk(Script::new(Box::leak(source.into_boxed_str())).sha())
        }
        Some(b"SET")
            if args.len() == 6
                && upper(3).as_deref() == Some(b"NX")
                && upper(4).as_deref() == Some(b"PX") =>
        {
            let Some(ms) = int(5).filter(|ms| *ms > 0) else {
                return b"-ERR invalid expire time\r\n".to_vec();
            };
            if keys.contains_key(args[1]) {
                return b"$-1\r\n".to_vec();
            }
            let expiry = now + Duration::from_millis(ms as u64);
            keys.insert(args[1].to_vec(), (args[2].to_vec(), expiry));
            b"+OK\r\n".to_vec()
        }
        Some(verb @ (b"EVALSHA" | b"EVAL")) if args.len() >= 5 && int(2) == Some(1) => {
            let Some(s) = script(args[1], verb == b"EVALSHA") else {
                return b"-NOSCRIPT No matching script.\r\n".to_vec();
            };
            let held = keys.get(args[3]).is_some_and(|(token, _)| token == args[4]);
            if !held {
                return b":0\r\n".to_vec();
            }
            if s == release || s == cleanup {
                keys.remove(args[3]);
            } else {
                let Some(ms) = int(5).filter(|ms| *ms > 0) else {
                    return b"-ERR invalid expire time\r\n".to_vec();
                };
                if let Some(entry) = keys.get_mut(args[3]) {
                    entry.1 = now + Duration::from_millis(ms as u64);
                }
            }
            b":1\r\n".to_vec()
        }
        _ => b"-ERR unknown command\r\n".to_vec(),
    }
}

// ---------------------------------------------------------------------------
// The checks.

/// Settings for the client: a per-instance timeout of 500 ms (a fake that
/// dribbles must finish a reply within it on a loaded machine), a 1 s stall
/// limit, and a short reconnect backoff. Connects and waits for the
/// handshakes, so that a dribbled handshake is done before the first
/// round: at most 10 s (a dribble on a loaded machine is slow; warming up
/// ends as soon as every handshake is done); 1 s with a silent master,
/// which never answers it.
fn client(urls: &[String], silent: bool) -> Redlock {
    let mut config = expect(Config::new(urls));
    config.per_instance_timeout = Duration::from_millis(500);
    config.connect_timeout = Duration::from_secs(1);
    config.reconnect_backoff_max = Duration::from_millis(200);
    // The real masters were started empty by the test: no lock predates
    // them, and restart quarantine would only keep them out at first.
    config.quarantine = None;
    let mut redlock = expect(Redlock::new(config));
    redlock.warm_up(Duration::from_secs(if silent { 1 } else { 10 }));
    redlock
}

/// What a client over `n` masters holds in buffers from its start: read
/// and write buffers and an in-flight queue per master, allocated once.
fn baseline(n: usize) -> usize {
    let urls: Vec<String> = (0..n)
        .map(|i| format!("redis://127.0.0.1:{}", i + 1))
        .collect();
    expect(Redlock::connect(&urls)).buffer_capacity()
}

fn assert_capped(redlock: &Redlock, what: &str) -> usize {
    let used = redlock.buffer_capacity();
    let cap = baseline(redlock.config().servers.len()) + CAP;
    assert!(used < cap, "{what}: {used} bytes of buffers, cap {cap}");
    used
}

fn failure(err: &Error) -> &Failure {
    err.failure()
        .unwrap_or_else(|| panic!("expected a failed round, got {err:?}"))
}

/// Sets `key` on `server` with a token no client holds.
fn block(server: &Server, key: &str) {
    let reply = connect(server).cmd(&[
        "SET".into(),
        key.into(),
        "blocker".into(),
        "PX".into(),
        Arg::Int(60_000),
    ]);
    assert!(reply.is_ok(), "{reply:?}");
}

fn unblock(server: &Server, key: &str) {
    let reply = connect(server).cmd(&["DEL".into(), key.into()]);
    assert_eq!(reply, Reply::Integer(1), "the blocker of {key}");
}

/// Nothing left behind on the real masters, well before any TTL.
fn assert_nothing_left(masters: &Cluster) {
    for server in masters {
        if let Err(left) = wait_empty(server, WAIT) {
            panic!("{} still holds {left:?}", server.url());
        }
    }
}

/// What the fake's vote in a round may be: its failure when its answer
/// came before the decision, `Pending` when the others decided first.
fn fake_vote_ok(behaviour: Behaviour, vote: &Vote) -> bool {
    match (behaviour, vote) {
        (_, Vote::Pending) => true,
        (Behaviour::Honest | Behaviour::Dribble, v) => *v == Vote::Refused,
        (Behaviour::Garbage, Vote::Failed(Cause::Protocol(ProtocolError::UnknownType(_)))) => true,
        (
            Behaviour::OverLimitBulk,
            Vote::Failed(Cause::Protocol(ProtocolError::LimitExceeded(Limit::BulkLength))),
        ) => true,
        (Behaviour::Cut, Vote::Failed(Cause::Closed | Cause::Backoff(_) | Cause::Io(_))) => true,
        (
            Behaviour::Silent,
            Vote::Failed(Cause::Timeout | Cause::Stalled | Cause::TooFarBehind | Cause::Backoff(_)),
        ) => true,
        (Behaviour::WrongType, Vote::Failed(Cause::Server(_))) => true,
        _ => false,
    }
}

/// The fake as one of three masters, beside two real ones: three times,
/// client A acquires; client B contending is refused by the real masters;
/// A releases; B acquires and releases. For a fake that answers correctly
/// (honest or dribbling), one real master holds the key with a foreign
/// token, so that every grant needs the fake's vote.
fn one_of_three(behaviour: Behaviour) {
    let masters = cluster(2);
    let fake = Fake::start(behaviour);
    let urls = [masters[0].url(), fake.url(), masters[1].url()];
    let needs_fake = matches!(behaviour, Behaviour::Honest | Behaviour::Dribble);
    let key = "hostile";
    if needs_fake {
        block(&masters[0], key);
    }
    let silent = behaviour == Behaviour::Silent;
    let mut a = client(&urls, silent);
    let mut b = client(&urls, silent);
    let mut ops = 0;
    for round in 0..3 {
        let what = format!("{behaviour:?}, round {round}");
        let lock = a
            .try_acquire(key, TTL)
            .unwrap_or_else(|e| panic!("{what}: A: {e}"));
        ops += 1;
        assert_capped(&a, &what);

        let err = b
            .try_acquire(key, TTL)
            .expect_err("A holds the lock on both real masters");
        ops += 2;
        assert!(matches!(err, Error::Held(_)), "{what}: B: {err:?}");
        let fail = failure(&err);
        // Decided as soon as a quorum was out of reach: a real master
        // refused, and the other real one or the fake refused or failed
        // too; a master still to answer then is `Pending`.
        assert_eq!(fail.granted, 0, "{what}: {fail}");
        assert!(fail.refused >= 1, "{what}: {fail}");
        for real in [0, 2] {
            assert!(
                matches!(fail.votes[real].vote, Vote::Refused | Vote::Pending),
                "{what}: a real master's vote: {fail}"
            );
        }
        assert!(
            fake_vote_ok(behaviour, &fail.votes[1].vote),
            "{what}: the fake's vote: {fail}"
        );
        assert_capped(&b, &what);

        a.release(&lock)
            .unwrap_or_else(|e| panic!("{what}: A's release: {e}"));
        ops += 1;
        assert_capped(&a, &what);

        let lock = b
            .try_acquire(key, TTL)
            .unwrap_or_else(|e| panic!("{what}: B after A released: {e}"));
        b.release(&lock)
            .unwrap_or_else(|e| panic!("{what}: B's release: {e}"));
        ops += 2;
        assert_capped(&b, &what);
    }
    a.settle(WAIT);
    b.settle(WAIT);
    let used = assert_capped(&a, "after settling").max(assert_capped(&b, "after settling"));
    // Each operation costs the fake's connection at most one reconnect,
    // besides each client's first connect.
    assert!(
        fake.accepted() <= ops + 2,
        "{behaviour:?}: {} connections for {ops} operations",
        fake.accepted()
    );
    eprintln!(
        "hostile {behaviour:?} as 1 of 3: {ops} operations, {} connections to the fake, \
         {} lock commands it saw, buffers at most {used} bytes",
        fake.accepted(),
        fake.state.lock_commands.load(Ordering::SeqCst)
    );
    if needs_fake {
        unblock(&masters[0], key);
        assert!(
            common::eventually(WAIT, || fake.keys_held() == 0),
            "the fake still holds {} keys",
            fake.keys_held()
        );
    }
    assert_nothing_left(&masters);
}

/// The fake alone (N = 1): what one attempt returns.
fn alone(behaviour: Behaviour) -> Result<(), Error> {
    let fake = Fake::start(behaviour);
    let mut redlock = client(&[fake.url()], behaviour == Behaviour::Silent);
    let started = Instant::now();
    let result = redlock.try_acquire("alone", TTL);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "{behaviour:?}: took {took:?}"
    );
    assert_capped(&redlock, &format!("{behaviour:?} alone"));
    let outcome = match result {
        Ok(lock) => {
            redlock
                .release(&lock)
                .unwrap_or_else(|e| panic!("{behaviour:?} alone: release: {e}"));
            assert_eq!(fake.keys_held(), 0, "{behaviour:?}: released");
            Ok(())
        }
        Err(e) => {
            eprintln!("hostile {behaviour:?} alone: {e}");
            assert_eq!(failure(&e).votes.len(), 1);
            Err(e)
        }
    };
    redlock.settle(Duration::from_secs(2));
    assert_capped(&redlock, &format!("{behaviour:?} alone, settled"));
    outcome
}

fn alone_fails_with(behaviour: Behaviour) -> (Error, Cause) {
    let err = alone(behaviour).expect_err("a broken master alone cannot grant");
    let Vote::Failed(cause) = failure(&err).votes[0].vote.clone() else {
        panic!("{behaviour:?}: the fake's vote should have failed: {err}");
    };
    (err, cause)
}

#[test]
fn an_honest_fake_master_works_as_one_of_three_and_alone() {
    // The fake itself, checked against the real thing's behaviour.
    one_of_three(Behaviour::Honest);
    alone(Behaviour::Honest).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_reply_dribbled_one_byte_at_a_time_still_counts() {
    one_of_three(Behaviour::Dribble);
    alone(Behaviour::Dribble).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn garbage_bytes_cost_one_vote_and_alone_are_a_protocol_error() {
    one_of_three(Behaviour::Garbage);
    let (err, cause) = alone_fails_with(Behaviour::Garbage);
    assert!(matches!(err, Error::Protocol(_)), "{err:?}");
    assert_eq!(cause, Cause::Protocol(ProtocolError::UnknownType(b'?')));
}

#[test]
fn an_over_limit_bulk_length_costs_one_vote_and_alone_is_a_protocol_error() {
    one_of_three(Behaviour::OverLimitBulk);
    let (err, cause) = alone_fails_with(Behaviour::OverLimitBulk);
    assert!(matches!(err, Error::Protocol(_)), "{err:?}");
    assert_eq!(
        cause,
        Cause::Protocol(ProtocolError::LimitExceeded(Limit::BulkLength))
    );
}

#[test]
fn a_reply_cut_off_by_a_close_costs_one_vote_and_alone_is_no_quorum() {
    one_of_three(Behaviour::Cut);
    let (err, cause) = alone_fails_with(Behaviour::Cut);
    assert!(matches!(err, Error::NoQuorum(_)), "{err:?}");
    assert_eq!(cause, Cause::Closed);
}

#[test]
fn a_silent_master_costs_one_vote_and_alone_times_out() {
    one_of_three(Behaviour::Silent);
    let (err, cause) = alone_fails_with(Behaviour::Silent);
    assert!(matches!(err, Error::NoQuorum(_)), "{err:?}");
    assert_eq!(cause, Cause::Timeout);
}

/// A master that reads every request and never answers, beside
/// two real masters, while the client keeps locking through the real ones.
/// Its requests pile up in flight until the bound
/// ([`Config::max_in_flight`]); then its vote fails as too far behind, the
/// connection is dropped and made again, and the client's memory never
/// grows: not one byte past what it held when it was created.
#[test]
fn a_master_that_never_answers_costs_bounded_memory() {
    let masters = cluster(2);
    let fake = Fake::start(Behaviour::Silent);
    let urls = [masters[0].url(), fake.url(), masters[1].url()];
    let mut config = expect(Config::new(urls));
    config.quarantine = None;
    // The stall limit must not drop the connection first: the bound is
    // what this test is about.
    config.connect_timeout = Duration::from_secs(600);
    let max_in_flight = config.max_in_flight;
    let mut redlock = expect(Redlock::new(config));
    let held = redlock.buffer_capacity();
    // Each cycle puts two requests in flight on the fake; each time the
    // bound is reached the client connects again. Three connections show
    // the bound reached twice; the cycle cap only ends a broken run.
    let mut cycles = 0;
    while fake.accepted() < 3 && cycles < 50 * max_in_flight {
        cycles += 1;
        let lock = redlock
            .try_acquire("silent:bound", TTL)
            .unwrap_or_else(|e| panic!("cycle {cycles}: {e}"));
        if let Err(e) = redlock.release(&lock) {
            panic!("cycle {cycles}: release: {e}");
        }
        let used = redlock.buffer_capacity();
        assert!(
            used <= held,
            "cycle {cycles}: buffers grew to {used} bytes past the {held} held from the start"
        );
    }
    eprintln!(
        "silent master as 1 of 3, at most {max_in_flight} requests in flight: client buffers \
         and queues {held} bytes from the start, never more over {cycles} cycles; \
         {} connections to the silent master",
        fake.accepted()
    );
    assert!(
        fake.accepted() >= 3,
        "the in-flight bound never dropped the connection in {cycles} cycles"
    );
    assert_nothing_left(&masters);
}

#[test]
fn a_reply_of_the_wrong_type_costs_one_vote_and_alone_is_a_server_error() {
    one_of_three(Behaviour::WrongType);
    let (err, cause) = alone_fails_with(Behaviour::WrongType);
    assert!(matches!(err, Error::NoQuorum(_)), "{err:?}");
    let Cause::Server(msg) = &cause else {
        panic!("a server error cause, got {cause}");
    };
    assert!(
        String::from_utf8_lossy(msg).contains("Integer(1)"),
        "{cause}"
    );
}

/// One flood, beside two real masters: the client keeps locking through
/// the real ones, for at most `rounds` acquire-release pairs or `limit`,
/// and its buffers stay under the cap. Returns the largest buffer size
/// seen and the bytes the fake sent.
fn flood_beside_real_masters(masters: &Cluster, flood: Flood) -> (usize, u64) {
    let fake = Fake::start(Behaviour::Flood(flood));
    let urls = [masters[0].url(), fake.url(), masters[1].url()];
    let mut redlock = client(&urls, false);
    let key = format!("flood-{flood:?}");
    let started = Instant::now();
    let mut most = 0;
    for round in 0..30 {
        if started.elapsed() > Duration::from_secs(2) {
            break;
        }
        let what = format!("{flood:?}, round {round}");
        let lock = redlock
            .try_acquire(key.clone(), TTL)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        most = most.max(assert_capped(&redlock, &what));
        redlock
            .release(&lock)
            .unwrap_or_else(|e| panic!("{what}: release: {e}"));
        most = most.max(assert_capped(&redlock, &what));
    }
    redlock.settle(Duration::from_secs(1));
    most = most.max(assert_capped(&redlock, &format!("{flood:?}, settled")));
    (most, fake.state.flooded.load(Ordering::SeqCst))
}

/// One flood, alone: the round waits the whole per-instance timeout for
/// the fake, reading all it sends meanwhile. Returns the largest buffer
/// size seen and the bytes the fake sent.
fn flood_alone(flood: Flood) -> (usize, u64) {
    let fake = Fake::start(Behaviour::Flood(flood));
    let mut redlock = client(&[fake.url()], false);
    let mut most = assert_capped(&redlock, &format!("{flood:?} alone, warmed up"));
    for attempt in 0..3 {
        let what = format!("{flood:?} alone, attempt {attempt}");
        let err = redlock
            .try_acquire("flood", TTL)
            .expect_err("a flooding master cannot grant");
        assert!(
            matches!(err, Error::Protocol(_) | Error::NoQuorum(_)),
            "{what}: {err:?}"
        );
        most = most.max(assert_capped(&redlock, &what));
    }
    (most, fake.state.flooded.load(Ordering::SeqCst))
}

/// Each flood beside two real masters, then alone.
fn floods_stay_under_the_cap(floods: &[Flood]) {
    let masters = cluster(2);
    for &flood in floods {
        let (beside, sent_beside) = flood_beside_real_masters(&masters, flood);
        eprintln!(
            "hostile flood {flood:?} as 1 of 3: fake sent {sent_beside} bytes, \
             client buffers at most {beside} bytes (cap {CAP})"
        );
        let (alone, sent_alone) = flood_alone(flood);
        eprintln!(
            "hostile flood {flood:?} alone: fake sent {sent_alone} bytes, \
             client buffers at most {alone} bytes (cap {CAP})"
        );
    }
    assert_nothing_left(&masters);
}

#[test]
fn a_flood_of_bytes_keeps_buffers_under_the_cap() {
    floods_stay_under_the_cap(&Flood::ITEM_LIMITED);
}

#[test]
fn a_reply_within_every_limit_that_never_ends_keeps_buffers_under_the_cap() {
    floods_stay_under_the_cap(&[Flood::WideArraysOfBulks]);
}
