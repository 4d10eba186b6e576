//! Deterministic tests of the sans-IO core: a fake cluster of N scripted
//! masters, in virtual time and without sockets, drives the real
//! [`Engine`] through the doors the mio driver uses (connect, bytes in,
//! bytes out, failure, time) through reply orderings, partial replies,
//! late replies, NOSCRIPT, silence, disconnects and garbage, and checks
//! every decision and validity figure.
//!
//! The fake masters answer the handshake (AUTH, SELECT, SCRIPT LOAD) as
//! Redis does and answer each lock command as their script says; behind
//! the engine's subscriber connections they confirm SUBSCRIBE and
//! UNSUBSCRIBE, unless stopped. Time is a fixed base `Instant` plus
//! virtual offsets: nothing here reads the clock after the start, so every
//! run is the same.

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use crate::addr::ServerAddr;
use crate::conn::{Cause, Keys, Op, Request, Timing};
use crate::engine::{Engine, Heard, RoundId, Wait};
use crate::quorum::{Decision, Loss, Round, Validity, Vote};
use crate::resp::{self, Limits, Reply};
use crate::script::Scripts;
use crate::token::TokenSource;
use bytes::{Bytes, BytesMut};

const MS: Duration = Duration::from_millis(1);
const TTL: Duration = Duration::from_secs(10);
const ROUND_TIMEOUT: Duration = Duration::from_millis(50);

/// What a fake master does with the next lock command it receives.
#[derive(Debug, Clone)]
enum Act {
    /// Reply with these bytes after this delay, in pieces of `chunk` bytes
    /// (each piece one more microsecond later).
    Reply(&'static [u8], Duration, usize),
    /// Never reply.
    Silent,
    /// Close the connection after this delay.
    Close(Duration),
}

fn reply(bytes: &'static [u8], delay_ms: u64) -> Act {
    Act::Reply(bytes, Duration::from_millis(delay_ms), usize::MAX)
}

const OK: &[u8] = b"+OK\r\n";
const NIL: &[u8] = b"$-1\r\n";
const ONE: &[u8] = b":1\r\n";
const ZERO: &[u8] = b":0\r\n";
const NOSCRIPT: &[u8] = b"-NOSCRIPT No matching script. Please use EVAL.\r\n";

enum Delivery {
    Bytes(Vec<u8>),
    Close,
}

/// One scripted master.
struct Master {
    up: bool,
    connect_delay: Duration,
    script: VecDeque<Act>,
    /// Bytes received and not yet parsed as commands.
    inbox: BytesMut,
    /// Every command received, first word upper-cased.
    log: Vec<String>,
    /// The key of every SET received, in order.
    set_keys: Vec<String>,
    /// Bytes to deliver to the client, at virtual instants.
    outbox: Vec<(Instant, Delivery)>,
    connect_at: Option<Instant>,
    connects: usize,
    /// When the last reply was scheduled.
    last_at: Instant,
    /// How many writes the client made to this master.
    writes: usize,
    /// What `INFO server` reports.
    uptime: u64,
    run_id: String,
    /// The reply to a `SCRIPT LOAD` after the handshake (one sent to
    /// recover from `-NOSCRIPT`), when not the sha: `-OOM`, say.
    load_refusal: Option<&'static [u8]>,
    /// The reply to the handshake's `COMMAND DOCS`: by default Redis
    /// 7.0's shape with no lock command of its own.
    docs: &'static [u8],
}

/// `COMMAND DOCS SET DELIFEQ DELEX` as Redis 7.0 answers it, cut to what
/// the client reads: `SET` without `IFEQ`.
const DOCS_REDIS_7: &[u8] = b"*2\r\n$3\r\nset\r\n*2\r\n$9\r\narguments\r\n*1\r\n*4\r\n$4\r\nname\r\n$2\r\nnx\r\n$5\r\ntoken\r\n$2\r\nNX\r\n";

/// As Redis 8.4 answers it: `SET` with `IFEQ`, and `DELEX`.
const DOCS_REDIS_84: &[u8] = b"*4\r\n$3\r\nset\r\n*2\r\n$9\r\narguments\r\n*1\r\n*4\r\n$4\r\nname\r\n$9\r\nifeq-cond\r\n$5\r\ntoken\r\n$4\r\nIFEQ\r\n$5\r\ndelex\r\n*0\r\n";

/// As Valkey 9.1 answers it: `SET` with `IFEQ`, and `DELIFEQ`.
const DOCS_VALKEY_9: &[u8] = b"*4\r\n$3\r\nset\r\n*2\r\n$9\r\narguments\r\n*1\r\n*4\r\n$4\r\nname\r\n$16\r\ncomparison-value\r\n$5\r\ntoken\r\n$4\r\nIFEQ\r\n$7\r\ndelifeq\r\n*0\r\n";

impl Master {
    fn new(script: Vec<Act>) -> Master {
        Master {
            up: true,
            connect_delay: Duration::ZERO,
            script: script.into(),
            inbox: BytesMut::new(),
            log: Vec::new(),
            set_keys: Vec::new(),
            outbox: Vec::new(),
            connect_at: None,
            connects: 0,
            last_at: Instant::now(),
            writes: 0,
            uptime: 86_400,
            run_id: "a".repeat(40),
            load_refusal: None,
            docs: DOCS_REDIS_7,
        }
    }

    fn receive(&mut self, bytes: &[u8], now: Instant) {
        self.writes += 1;
        self.inbox.extend_from_slice(bytes);
        let limits = Limits {
            max_bulk_len: 1 << 20,
            ..Limits::default()
        };
        while let Some(Reply::Array(args)) = resp::decode(&mut self.inbox, &limits).unwrap() {
            let word = |i: usize| match args.get(i) {
                Some(Reply::Bulk(b)) => String::from_utf8_lossy(b).to_uppercase(),
                _ => String::new(),
            };
            let verb = word(0);
            let name = if verb == "SCRIPT" || verb == "COMMAND" {
                format!("{verb} {}", word(1))
            } else {
                verb.clone()
            };
            self.log.push(name.clone());
            if let ("SET", Some(Reply::Bulk(key))) = (name.as_str(), args.get(1)) {
                self.set_keys
                    .push(String::from_utf8_lossy(key).into_owned());
            }
            let act = match name.as_str() {
                "AUTH" | "SELECT" => reply(OK, 0),
                "COMMAND DOCS" => {
                    self.outbox.push((now, Delivery::Bytes(self.docs.to_vec())));
                    continue;
                }
                "INFO" => {
                    let text = format!(
                        "# Server\r\nredis_version:7.0.15\r\nrun_id:{}\r\nuptime_in_seconds:{}\r\n",
                        self.run_id, self.uptime
                    );
                    let mut out = format!("${}\r\n", text.len()).into_bytes();
                    out.extend_from_slice(text.as_bytes());
                    out.extend_from_slice(b"\r\n");
                    self.outbox.push((now, Delivery::Bytes(out)));
                    continue;
                }
                "SCRIPT LOAD" => {
                    let recovering = self.log.iter().any(|c| c.starts_with("EVAL"));
                    let reply = match self.load_refusal {
                        Some(refusal) if recovering => refusal.to_vec(),
                        _ => sha_of(&args),
                    };
                    self.outbox.push((now, Delivery::Bytes(reply)));
                    continue;
                }
                _ => self.script.pop_front().unwrap_or(Act::Silent),
            };
            match act {
                Act::Reply(bytes, delay, chunk) => {
                    for (k, piece) in bytes.chunks(chunk.min(bytes.len()).max(1)).enumerate() {
                        // A stream is FIFO: no reply overtakes an earlier one.
                        let at = (now + delay + Duration::from_micros(k as u64)).max(self.last_at);
                        self.last_at = at;
                        self.outbox.push((at, Delivery::Bytes(piece.to_vec())));
                    }
                }
                Act::Silent => {}
                Act::Close(delay) => self.outbox.push((now + delay, Delivery::Close)),
            }
        }
    }

    fn next_delivery(&self) -> Option<Instant> {
        self.outbox.iter().map(|(t, _)| *t).min()
    }
}

/// The bulk reply SCRIPT LOAD gives: the SHA1 of the script source.
fn sha_of(args: &[Reply]) -> Vec<u8> {
    let Some(Reply::Bulk(source)) = args.get(2) else {
        return b"-ERR bad\r\n".to_vec();
    };
    let text = String::from_utf8_lossy(source).into_owned();
    let script = crate::script::Script::new(Box::leak(text.into_boxed_str()));
    let mut out = b"$40\r\n".to_vec();
    out.extend_from_slice(script.sha());
    out.extend_from_slice(b"\r\n");
    out
}

/// A master's publish/subscribe side, behind the engine's subscriber
/// connection to it: it confirms every channel of a SUBSCRIBE or
/// UNSUBSCRIBE as Redis does, at once. Stopped (SIGSTOP), it answers
/// nothing, while the kernel still completes its connects and takes the
/// bytes written to it, up to `window` bytes per connection (the socket
/// buffers), and no more.
struct Pubsub {
    stopped: bool,
    window: usize,
    /// Bytes taken on this connection and not yet answered.
    inbox: BytesMut,
    /// Bytes taken on this connection.
    taken: usize,
    /// Confirmations not yet delivered.
    outbox: Vec<u8>,
    /// The channels this connection is subscribed to.
    channels: Vec<Vec<u8>>,
    /// When each connection was made.
    connected_at: Vec<Instant>,
}

impl Pubsub {
    fn new() -> Pubsub {
        Pubsub {
            stopped: false,
            window: 64 * 1024,
            inbox: BytesMut::new(),
            taken: 0,
            outbox: Vec::new(),
            channels: Vec::new(),
            connected_at: Vec::new(),
        }
    }

    fn connect(&mut self, now: Instant) {
        self.connected_at.push(now);
        self.inbox.clear();
        self.taken = 0;
        self.outbox.clear();
        self.channels.clear();
    }

    /// Takes what it can of `bytes`; returns how many it took.
    fn receive(&mut self, bytes: &[u8]) -> usize {
        let n = if self.stopped {
            bytes.len().min(self.window.saturating_sub(self.taken))
        } else {
            bytes.len()
        };
        self.taken += n;
        self.inbox.extend_from_slice(&bytes[..n]);
        if !self.stopped {
            self.answer();
        }
        n
    }

    fn resume(&mut self) {
        self.stopped = false;
        self.answer();
    }

    fn answer(&mut self) {
        while let Some(Reply::Array(args)) =
            resp::decode(&mut self.inbox, &Limits::default()).unwrap()
        {
            let Some(Reply::Bulk(verb)) = args.first() else {
                continue;
            };
            let kind = verb.to_ascii_lowercase();
            for channel in &args[1..] {
                let Reply::Bulk(channel) = channel else {
                    continue;
                };
                self.channels.retain(|c| c[..] != channel[..]);
                if kind == b"subscribe" {
                    self.channels.push(channel.to_vec());
                }
                let frame = Reply::Array(vec![
                    Reply::Bulk(Bytes::from(kind.clone())),
                    Reply::Bulk(channel.clone()),
                    Reply::Integer(self.channels.len() as i64),
                ]);
                let mut out = BytesMut::new();
                frame.encode(&mut out);
                self.outbox.extend_from_slice(&out);
            }
        }
    }
}

/// N scripted masters, their connections and a round, in virtual time.
struct Sim {
    now: Instant,
    masters: Vec<Master>,
    engine: Engine,
    /// The last round run, readable until the next one starts.
    last: Option<RoundId>,
    idle: Round,
    tokens: TokenSource,
    /// The masters' publish/subscribe sides, when the engine subscribes.
    pubsubs: Vec<Pubsub>,
}

fn timing() -> Timing {
    Timing {
        connect: Duration::from_millis(200),
        stall: Duration::from_millis(500),
        patience: Duration::from_millis(200),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(80),
        quarantine: None,
        max_in_flight: 1024,
    }
}

impl Sim {
    fn new(scripts: Vec<Vec<Act>>) -> Sim {
        Sim::with(scripts, timing(), &[])
    }

    /// `scripts.len()` masters whose connections use `timing`; the first
    /// masters' URLs are `urls` where given.
    fn with(scripts: Vec<Vec<Act>>, timing: Timing, urls: &[&str]) -> Sim {
        Sim::build(scripts, timing, urls, false)
    }

    /// `n` masters with nothing scripted, and a subscriber connection to
    /// each, for waiters.
    fn subscribing(n: usize, timing: Timing) -> Sim {
        Sim::build(vec![Vec::new(); n], timing, &[], true)
    }

    fn build(scripts: Vec<Vec<Act>>, timing: Timing, urls: &[&str], subscribe: bool) -> Sim {
        let now = Instant::now();
        let mut masters: Vec<Master> = scripts.into_iter().map(Master::new).collect();
        // Independent masters: each its own server process.
        for (i, master) in masters.iter_mut().enumerate() {
            master.run_id = format!("{i:040}");
        }
        let servers: Vec<ServerAddr> = (0..masters.len())
            .map(|i| match urls.get(i) {
                Some(url) => url.parse().unwrap(),
                None => format!("redis://127.0.0.1:{}", 7000 + i).parse().unwrap(),
            })
            .collect();
        Sim {
            now,
            engine: Engine::new(
                &servers,
                Scripts::new(),
                Limits::default(),
                timing,
                now,
                subscribe,
            ),
            last: None,
            idle: Round::new(masters.len(), now),
            pubsubs: if subscribe {
                (0..masters.len()).map(|_| Pubsub::new()).collect()
            } else {
                Vec::new()
            },
            masters,
            tokens: TokenSource::from_seed([7; 16]),
        }
    }

    /// The last round run.
    fn round(&self) -> &Round {
        self.last
            .and_then(|id| self.engine.round(id))
            .unwrap_or(&self.idle)
    }

    /// Master `i`'s connection state.
    fn conn(&self, i: usize) -> &crate::conn::Conn {
        &self.engine.conns()[i]
    }

    fn request(&mut self, op: Op) -> Request {
        Request {
            op,
            keys: Keys::One(Bytes::from_static(b"sim:lock")),
            token: self.tokens.next_token(),
            arg: TTL.as_millis() as i64,
            notice: false,
        }
    }

    /// What the real driver's `prepare` does, with fake sockets.
    fn prepare(&mut self) {
        for (i, master) in self.masters.iter_mut().enumerate() {
            if self.engine.poll_connect(i, self.now) {
                master.connects += 1;
                if master.up {
                    self.engine.handle_connect_started(i, self.now);
                    master.connect_at = Some(self.now + master.connect_delay);
                    master.inbox.clear();
                    master.outbox.clear();
                } else {
                    let refused = Cause::Connect(io::ErrorKind::ConnectionRefused);
                    self.engine.handle_failure(i, self.now, refused);
                }
            }
        }
    }

    /// Moves queued bytes from connections to their masters.
    fn transmit(&mut self) {
        for (i, master) in self.masters.iter_mut().enumerate() {
            if self.engine.conns()[i].is_connecting()
                && master.connect_at.is_some_and(|t| t <= self.now)
            {
                self.engine.handle_connected(i);
            }
            let bytes = self.engine.poll_transmit(i).to_vec();
            if !bytes.is_empty() {
                self.engine.handle_written(i, bytes.len());
                master.receive(&bytes, self.now);
            }
        }
    }

    /// Runs one round of `request` to its decision, as the real driver does.
    /// Returns the virtual instant it ended.
    fn run(&mut self, request: &Request) -> Instant {
        self.run_for(request, ROUND_TIMEOUT)
    }

    /// As [`Sim::run`], with a round deadline of `timeout`.
    fn run_for(&mut self, request: &Request, timeout: Duration) -> Instant {
        self.run_batch(std::slice::from_ref(request), timeout)
    }

    /// Runs one round carrying all of `requests`, until every slot is
    /// decided.
    fn run_batch(&mut self, requests: &[Request], timeout: Duration) -> Instant {
        if let Some(last) = self.last.take() {
            self.engine.free(last);
        }
        let id = self.start(requests, timeout);
        self.drive(id);
        self.engine.end(id);
        while self.engine.poll_completed().is_some() {}
        self.last = Some(id);
        self.now
    }

    /// Starts a round of `requests` without waiting for it: rounds started
    /// one after another are in flight together.
    fn start(&mut self, requests: &[Request], timeout: Duration) -> RoundId {
        self.prepare();
        self.engine
            .start(requests, self.now, timeout, Wait::Decision)
    }

    /// Moves bytes and virtual time until round `id` is complete.
    fn drive(&mut self, id: RoundId) {
        loop {
            self.transmit();
            if self.engine.is_complete(id) {
                return;
            }
            let deadline = self.engine.poll_timeout().unwrap_or(self.now + TTL);
            let next = self
                .masters
                .iter()
                .filter_map(Master::next_delivery)
                .chain(
                    self.masters
                        .iter()
                        .filter_map(|m| m.connect_at.filter(|t| *t > self.now)),
                )
                .fold(deadline, Instant::min);
            self.now = self.now.max(next);
            self.deliver();
            self.engine.handle_timeout(self.now);
        }
    }

    /// Lets virtual time pass between operations. As with the real driver,
    /// nothing is read meanwhile: replies wait in the "socket" (the master's
    /// outbox) until the next round polls.
    fn advance(&mut self, by: Duration) {
        self.now += by;
    }

    fn deliver(&mut self) {
        for i in 0..self.masters.len() {
            let due: Vec<Delivery> = {
                let outbox = &mut self.masters[i].outbox;
                let (due, later): (Vec<_>, Vec<_>) =
                    outbox.drain(..).partition(|(t, _)| *t <= self.now);
                *outbox = later;
                due.into_iter().map(|(_, d)| d).collect()
            };
            for delivery in due {
                match delivery {
                    Delivery::Bytes(bytes) => {
                        if !self.conn(i).is_down() {
                            self.engine.handle_input(i, &bytes, self.now);
                        }
                    }
                    Delivery::Close => {
                        self.masters[i].outbox.clear();
                        if !self.conn(i).is_down() {
                            self.engine.handle_failure(i, self.now, Cause::Closed);
                        }
                    }
                }
            }
        }
    }

    fn votes(&self) -> Vec<Vote> {
        self.round().votes(0).to_vec()
    }

    /// One turn of the driver for the subscriber connections (links
    /// `n..2n`): connect what is due (a connect completes at once, as the
    /// kernel completes it even for a stopped master), write, read what
    /// was answered, apply the time.
    fn pump_subs(&mut self) {
        // What the hub does at the end of its turn.
        self.engine.flush_subscriptions(self.now);
        let n = self.masters.len();
        for (s, pubsub) in self.pubsubs.iter_mut().enumerate() {
            let link = n + s;
            if self.engine.poll_connect(link, self.now) {
                pubsub.connect(self.now);
                self.engine.handle_connect_started(link, self.now);
                self.engine.handle_connected(link);
            }
            let bytes = self.engine.poll_transmit(link).to_vec();
            if !bytes.is_empty() {
                let taken = pubsub.receive(&bytes);
                self.engine.handle_written(link, taken);
            }
            let answered = std::mem::take(&mut pubsub.outbox);
            if !answered.is_empty() && !self.engine.link(link).is_none_or(|c| c.is_down()) {
                self.engine.handle_input(link, &answered, self.now);
            }
        }
        self.engine.handle_timeout(self.now);
        // What the time dropped is closed, and made again when due, at the
        // next turn.
    }

    /// Runs the subscriber connections in virtual time until `until`,
    /// waking at each of the engine's deadlines and at least every
    /// millisecond, as a driver whose loop has waiters to serve does.
    fn run_subs_until(&mut self, until: Instant) {
        loop {
            self.pump_subs();
            if self.now >= until {
                return;
            }
            let next = self
                .engine
                .poll_timeout()
                .filter(|t| *t > self.now)
                .unwrap_or(self.now + MS)
                .min(self.now + MS)
                .min(until);
            self.now = next;
        }
    }

    /// The script commands (EVALSHA, EVAL) master `i` received, in order,
    /// and every SCRIPT LOAD after the first of them (one that recovers
    /// from `-NOSCRIPT`; the handshake's come before).
    fn scripts_sent(&self, i: usize) -> Vec<&str> {
        let log = &self.masters[i].log;
        let first = log
            .iter()
            .position(|c| c.starts_with("EVAL"))
            .unwrap_or(log.len());
        log[first..]
            .iter()
            .map(String::as_str)
            .filter(|c| c.starts_with("EVAL") || *c == "SCRIPT LOAD")
            .collect()
    }
}

fn acquire_round(scripts: Vec<Vec<Act>>) -> (Sim, Instant, Instant) {
    let mut sim = Sim::new(scripts);
    let started = sim.now;
    let request = sim.request(Op::Acquire);
    let ended = sim.run(&request);
    (sim, started, ended)
}

#[test]
fn a_quorum_of_grants_wins_at_the_second_reply_with_the_spec_validity() {
    let (sim, started, ended) = acquire_round(vec![
        vec![reply(OK, 1)],
        vec![reply(OK, 3)],
        vec![reply(OK, 9)],
    ]);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert_eq!(
        ended - started,
        3 * MS,
        "decided at the quorum, not the last reply"
    );
    assert_eq!(
        sim.votes(),
        vec![Vote::Granted, Vote::Granted, Vote::Pending]
    );
    // validity = ttl - elapsed - (ttl * 0.01 + 2 ms) = 10000 - 3 - 102 ms.
    let validity = Validity::compute(TTL, started, ended, 0.01).unwrap();
    assert_eq!(validity.remaining, Duration::from_millis(9_895));
    assert_eq!(validity.deadline, started + Duration::from_millis(9_898));
}

#[test]
fn every_ordering_of_replies_gives_the_same_decision() {
    /// Name, each master's reply, the decision, and why it was lost.
    type Case = (&'static str, [&'static [u8]; 3], Decision, Option<Loss>);
    let cases: &[Case] = &[
        ("three grants", [OK, OK, OK], Decision::Won, None),
        (
            "two grants and a refusal",
            [OK, OK, NIL],
            Decision::Won,
            None,
        ),
        (
            "one grant and two refusals",
            [OK, NIL, NIL],
            Decision::Lost,
            Some(Loss::Refused),
        ),
        (
            "three refusals",
            [NIL, NIL, NIL],
            Decision::Lost,
            Some(Loss::Refused),
        ),
        (
            "one grant, one refusal, one error",
            [OK, NIL, b"-OOM command not allowed\r\n"],
            Decision::Lost,
            Some(Loss::Refused),
        ),
        (
            "one grant, two errors",
            [OK, b"-ERR x\r\n", b"-ERR y\r\n"],
            Decision::Lost,
            Some(Loss::Unreachable),
        ),
    ];
    let orders = [
        [1, 2, 3],
        [1, 3, 2],
        [2, 1, 3],
        [2, 3, 1],
        [3, 1, 2],
        [3, 2, 1],
    ];
    for (name, replies, want, loss) in cases {
        for order in orders {
            let scripts = (0..3).map(|i| vec![reply(replies[i], order[i])]).collect();
            let (sim, _, _) = acquire_round(scripts);
            assert_eq!(
                sim.round().decision(0),
                Some(*want),
                "{name}, order {order:?}"
            );
            if let Some(loss) = loss {
                assert_eq!(sim.round().loss(0), *loss, "{name}, order {order:?}");
            }
        }
    }
}

#[test]
fn replies_split_into_single_bytes_decide_the_same() {
    let split = |bytes| Act::Reply(bytes, MS, 1);
    let (sim, started, ended) =
        acquire_round(vec![vec![split(OK)], vec![split(NIL)], vec![split(OK)]]);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert_eq!(
        sim.votes(),
        vec![Vote::Granted, Vote::Refused, Vote::Granted]
    );
    // The last byte of "+OK\r\n" arrives 4 µs after the first.
    assert_eq!(ended - started, MS + Duration::from_micros(4));
}

#[test]
fn silent_masters_time_out_at_the_round_deadline() {
    let (sim, started, ended) = acquire_round(vec![
        vec![reply(OK, 1)],
        vec![Act::Silent],
        vec![Act::Silent],
    ]);
    assert_eq!(sim.round().decision(0), Some(Decision::Lost));
    assert_eq!(ended - started, ROUND_TIMEOUT);
    assert_eq!(
        sim.votes(),
        vec![
            Vote::Granted,
            Vote::Failed(Cause::Timeout),
            Vote::Failed(Cause::Timeout)
        ]
    );
    assert_eq!(sim.round().loss(0), Loss::Unreachable);
}

#[test]
fn one_silent_master_does_not_hold_the_caller() {
    let (sim, started, ended) = acquire_round(vec![
        vec![Act::Silent],
        vec![reply(OK, 2)],
        vec![reply(OK, 4)],
    ]);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert_eq!(ended - started, 4 * MS);
}

#[test]
fn a_reply_after_the_decision_is_dropped_not_matched_to_the_next_request() {
    // Master 2 grants the acquire late, during the release that follows,
    // and then answers that release with 0.
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1), reply(ONE, 40)],
        vec![reply(OK, 2), reply(ONE, 40)],
        vec![reply(OK, 30), reply(ZERO, 1)],
    ]);
    let acquire = sim.request(Op::Acquire);
    sim.run(&acquire);
    assert_eq!(sim.votes()[2], Vote::Pending);
    let release = Request {
        op: Op::Release,
        ..acquire.clone()
    };
    let started = sim.now;
    let ended = sim.run(&release);
    assert_eq!(ended - started, 40 * MS);
    // Had the late +OK been matched to the release, master 2 would read as
    // a failure (an unexpected reply to a script), not as the 0 it sent.
    assert_eq!(
        sim.votes(),
        vec![Vote::Granted, Vote::Granted, Vote::Refused]
    );
    assert_eq!(sim.conn(2).in_flight(), 0);
}

/// `-NOSCRIPT` is answered on that connection by
/// `SCRIPT LOAD` and the `EVALSHA` again, in one write: the script is then
/// loaded for good (since Redis 7.4, scripts created by EVAL are evicted
/// by other clients' EVALs; loaded ones are not).
#[test]
fn noscript_is_answered_with_script_load_and_evalsha_on_that_connection_only() {
    let mut sim = Sim::new(vec![
        vec![reply(NOSCRIPT, 1), reply(ONE, 1)],
        vec![reply(ONE, 1)],
        vec![reply(ONE, 5)],
    ]);
    let release = sim.request(Op::Release);
    sim.run(&release);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert_eq!(
        sim.votes()[0],
        Vote::Granted,
        "the caller never sees NOSCRIPT"
    );
    assert_eq!(sim.scripts_sent(0), ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]);
    assert_eq!(sim.scripts_sent(1), ["EVALSHA"]);
    assert_eq!(
        sim.engine.conns()[0].in_flight(),
        0,
        "the SCRIPT LOAD's reply was consumed"
    );
}

/// Where SCRIPT LOAD is refused (`-OOM` from Valkey's
/// `maxmemory-scripts`, a user denied it), EVAL carries the script, and
/// later `-NOSCRIPT`s on that connection go straight to EVAL.
#[test]
fn a_refused_script_load_falls_back_on_eval() {
    for refusal in [
        &b"-OOM command not allowed when used memory > 'maxmemory-scripts'\r\n"[..],
        b"-NOPERM this user has no permissions to run the 'script|load' command\r\n",
    ] {
        let mut sim = Sim::new(vec![
            // The EVALSHA after a refused SCRIPT LOAD meets NOSCRIPT again.
            vec![
                reply(NOSCRIPT, 1),
                reply(NOSCRIPT, 1),
                reply(ONE, 1),
                reply(NOSCRIPT, 1),
                reply(ONE, 1),
            ],
            vec![reply(ONE, 1), reply(ONE, 1)],
            vec![reply(ONE, 5), reply(ONE, 5)],
        ]);
        sim.masters[0].load_refusal = Some(refusal);
        let release = sim.request(Op::Release);
        sim.run(&release);
        assert_eq!(sim.votes()[0], Vote::Granted);
        let next = sim.request(Op::Release);
        sim.run(&next);
        assert_eq!(sim.votes()[0], Vote::Granted);
        assert_eq!(
            sim.scripts_sent(0),
            [
                "EVALSHA",
                "SCRIPT LOAD",
                "EVALSHA",
                "EVAL",
                "EVALSHA",
                "EVAL"
            ],
            "{}",
            String::from_utf8_lossy(refusal)
        );
    }
}

/// After a `SCRIPT FLUSH` every script request in flight comes
/// back `-NOSCRIPT`. Each is sent again behind the one `SCRIPT LOAD` of its
/// script in flight, not behind a load of its own, which about doubled
/// what the connection held, past the in-flight bound the admission keeps
/// it under.
#[test]
fn noscripts_of_one_script_are_sent_again_behind_one_script_load() {
    let shared = [
        "EVALSHA",
        "EVALSHA",
        "EVALSHA",
        "SCRIPT LOAD",
        "EVALSHA",
        "EVALSHA",
        "EVALSHA",
    ];
    // The old way, put back by its knob: a load for each.
    let each = [
        "EVALSHA",
        "EVALSHA",
        "EVALSHA",
        "SCRIPT LOAD",
        "EVALSHA",
        "SCRIPT LOAD",
        "EVALSHA",
        "SCRIPT LOAD",
        "EVALSHA",
    ];
    for (bug, expected) in [
        (None, &shared[..]),
        (Some(crate::knobs::Bug::ScriptLoadedPerNoscript), &each[..]),
    ] {
        let _bug = crate::knobs::inject(bug);
        let mut sim = Sim::new(vec![
            vec![
                reply(NOSCRIPT, 1),
                reply(NOSCRIPT, 1),
                reply(NOSCRIPT, 1),
                reply(ONE, 1),
                reply(ONE, 1),
                reply(ONE, 1),
            ],
            vec![reply(ONE, 1), reply(ONE, 1), reply(ONE, 1)],
            vec![reply(ONE, 1), reply(ONE, 1), reply(ONE, 1)],
        ]);
        let releases: Vec<Request> = (0..3).map(|_| sim.request(Op::Release)).collect();
        sim.run_batch(&releases, Duration::from_secs(1));
        for slot in 0..3 {
            assert_eq!(sim.round().decision(slot), Some(Decision::Won), "{slot}");
        }
        assert_eq!(sim.scripts_sent(0), expected, "{bug:?}");
    }
}

#[test]
fn a_second_noscript_is_a_failed_vote_not_a_loop() {
    // A broken master that answers NOSCRIPT even to EVAL.
    let mut sim = Sim::new(vec![
        vec![reply(NOSCRIPT, 1), reply(NOSCRIPT, 1), reply(NOSCRIPT, 1)],
        vec![reply(ONE, 10)],
        vec![reply(ONE, 10)],
    ]);
    let extend = sim.request(Op::Extend);
    sim.run(&extend);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert!(
        matches!(&sim.votes()[0], Vote::Failed(Cause::Server(msg)) if msg.starts_with(b"NOSCRIPT")),
        "{:?}",
        sim.votes()
    );
    let sent = sim.scripts_sent(0);
    assert_eq!(sent, ["EVALSHA", "SCRIPT LOAD", "EVALSHA", "EVAL"]);
}

#[test]
fn the_handshake_goes_out_in_the_first_write_with_the_request() {
    let (sim, _, _) = acquire_round(vec![vec![reply(OK, 1)]]);
    let loads = [
        vec!["SCRIPT LOAD"; Scripts::new().all().len()],
        vec!["COMMAND DOCS", "INFO"],
    ]
    .concat();
    assert_eq!(sim.masters[0].log, [loads.clone(), vec!["SET"]].concat());
    let mut with_auth = Sim::with(
        vec![vec![reply(OK, 1)]],
        timing(),
        &["redis://alice:pw@127.0.0.1:7000/3"],
    );
    let request = with_auth.request(Op::Acquire);
    with_auth.run(&request);
    assert_eq!(
        with_auth.masters[0].log,
        [vec!["AUTH", "SELECT"], loads, vec!["SET"]].concat()
    );
    assert_eq!(with_auth.round().decision(0), Some(Decision::Won));
}

#[test]
fn a_disconnect_is_one_failed_vote_and_the_next_use_reconnects() {
    let mut sim = Sim::new(vec![
        vec![Act::Close(MS), reply(OK, 1)],
        vec![reply(OK, 2)],
        vec![reply(OK, 3)],
    ]);
    let first = sim.request(Op::Acquire);
    sim.run(&first);
    assert_eq!(
        sim.votes(),
        vec![Vote::Failed(Cause::Closed), Vote::Granted, Vote::Granted]
    );
    assert!(sim.conn(0).is_down());
    let second = sim.request(Op::Acquire);
    sim.run(&second);
    assert_eq!(
        sim.masters[0].connects, 2,
        "reconnected at once: it had been healthy"
    );
    assert_eq!(sim.votes()[0], Vote::Granted);
}

#[test]
fn a_dead_master_costs_no_connect_attempt_during_its_backoff() {
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1); 8],
        vec![reply(OK, 1); 8],
        vec![reply(OK, 1); 8],
    ]);
    sim.masters[2].up = false;
    for _ in 0..4 {
        let request = sim.request(Op::Acquire);
        sim.run(&request);
        assert_eq!(sim.round().decision(0), Some(Decision::Won));
        sim.advance(MS);
    }
    // Four rounds within the first 10 ms backoff: one connect attempt.
    assert_eq!(sim.masters[2].connects, 1);
    assert!(
        matches!(sim.votes()[2], Vote::Failed(Cause::Backoff(_))),
        "{:?}",
        sim.votes()[2]
    );
    // Once the backoff has run out the master is tried again, and it is back.
    sim.masters[2].up = true;
    sim.advance(20 * MS);
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.masters[2].connects, 2);
    assert_eq!(sim.votes()[2], Vote::Granted);
}

#[test]
fn garbage_from_a_master_is_a_protocol_failure() {
    let garbage = Act::Reply(b"HTTP/1.1 400 Bad Request\r\n", MS, usize::MAX);
    let (sim, _, _) = acquire_round(vec![
        vec![garbage.clone()],
        vec![reply(OK, 2)],
        vec![reply(OK, 3)],
    ]);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert!(matches!(&sim.votes()[0], Vote::Failed(Cause::Protocol(_))));
    assert!(sim.conn(0).is_down());
    let (sim, _, _) = acquire_round(vec![vec![garbage], vec![Act::Silent]]);
    assert_eq!(sim.round().decision(0), Some(Decision::Lost));
    assert_eq!(sim.round().loss(0), Loss::Protocol);
}

#[test]
fn requests_queued_on_a_connection_still_connecting_are_dropped_when_the_round_ends() {
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1)],
        vec![reply(OK, 1)],
        vec![reply(OK, 1)],
    ]);
    sim.masters[2].connect_delay = 100 * MS;
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    // The connect finishes long after the round: only the handshake goes out.
    sim.advance(150 * MS);
    sim.transmit();
    assert_eq!(
        sim.masters[2].log,
        [
            vec!["SCRIPT LOAD"; Scripts::new().all().len()],
            vec!["COMMAND DOCS", "INFO"]
        ]
        .concat()
    );
}

#[test]
fn a_connect_slower_than_the_connect_timeout_fails() {
    let mut sim = Sim::new(vec![vec![reply(OK, 1)]]);
    sim.masters[0].connect_delay = 10 * ROUND_TIMEOUT;
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.votes(), vec![Vote::Failed(Cause::Timeout)]);
    sim.advance(timing().connect);
    // The limit is applied within the next round, after a poll.
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.votes(), vec![Vote::Failed(Cause::ConnectTimeout)]);
    // The round after that finds the master in backoff, and tries nothing.
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.masters[0].connects, 1);
    assert!(
        matches!(&sim.votes()[0], Vote::Failed(Cause::Backoff(c)) if **c == Cause::ConnectTimeout),
        "{:?}",
        sim.votes()
    );
}

#[test]
fn a_stalled_connection_is_dropped_after_the_stall_limit() {
    let mut sim = Sim::new(vec![vec![Act::Silent, reply(OK, 1), reply(OK, 1)]]);
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.votes(), vec![Vote::Failed(Cause::Timeout)]);
    assert!(
        !sim.conn(0).is_down(),
        "one timeout alone keeps the connection"
    );
    sim.advance(timing().stall);
    // The next round finds the first request still unanswered past the
    // stall limit: that connection is dropped...
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.votes(), vec![Vote::Failed(Cause::Stalled)]);
    // ... and the one after reconnects at once and is answered.
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(
        sim.masters[0].connects, 2,
        "the stalled connection was replaced"
    );
    assert_eq!(sim.votes(), vec![Vote::Granted]);
}

#[test]
fn a_master_unanswered_past_the_per_instance_timeout_is_not_waited_for() {
    // Master 2 stops answering (a SIGSTOP, say). The first round is won
    // without it; the second, a split of the other two, is decided at
    // their replies: master 2's request of the first round has gone
    // unanswered past the per-instance timeout, and this round's reply
    // would come after that one's. Waiting for it to the round's deadline
    // would keep this racer's key in the other racer's way that long.
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1), reply(OK, 1)],
        vec![reply(OK, 1), reply(NIL, 1)],
        vec![Act::Silent, Act::Silent],
    ]);
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    sim.advance(timing().patience + MS);
    assert!(timing().patience + MS < timing().stall, "not yet stalled");
    let started = sim.now;
    let request = sim.request(Op::Acquire);
    let ended = sim.run(&request);
    assert_eq!(
        sim.votes(),
        vec![Vote::Granted, Vote::Refused, Vote::Failed(Cause::Timeout)]
    );
    assert!(
        ended - started < ROUND_TIMEOUT,
        "decided at the replies, not the deadline: {:?}",
        ended - started
    );
    assert!(!sim.conn(2).is_down(), "not dropped before the stall limit");
}

#[test]
fn a_late_reply_waiting_in_the_socket_keeps_its_master_counted() {
    // Master 2 answered the first round after its decision; nothing read
    // the reply before the next round, long after. It is read first: the
    // master is not taken for unresponsive.
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1), reply(ONE, 5)],
        vec![reply(OK, 1), reply(ONE, 5)],
        vec![reply(OK, 20), reply(ONE, 5)],
    ]);
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    sim.advance(timing().patience * 2);
    let release = Request {
        op: Op::Release,
        ..request
    };
    sim.run(&release);
    assert_eq!(sim.votes(), vec![Vote::Granted; 3]);
}

#[test]
fn replies_waiting_in_the_socket_are_read_before_the_stall_limit_is_applied() {
    // The late reply arrives while the client is idle; the next round comes
    // after the stall limit, and must read it rather than drop the
    // connection as stalled.
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1), reply(ONE, 1)],
        vec![reply(OK, 1), reply(ONE, 1)],
        vec![reply(OK, 20), reply(ONE, 1)],
    ]);
    let acquire = sim.request(Op::Acquire);
    sim.run(&acquire);
    sim.advance(2 * timing().stall);
    let release = Request {
        op: Op::Release,
        ..acquire
    };
    sim.run(&release);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert_eq!(
        sim.masters.iter().map(|m| m.connects).collect::<Vec<_>>(),
        vec![1, 1, 1]
    );
}

#[test]
fn a_quorum_that_arrives_too_late_leaves_no_validity() {
    // ttl 10 s, drift 102 ms: replies after 9898 ms leave nothing. The
    // round's own deadline is the per-instance timeout, so use one as long
    // as the TTL to let the slow replies count.
    let patient = Timing {
        stall: 2 * TTL,
        ..timing()
    };
    let mut sim = Sim::with(
        vec![
            vec![reply(OK, 9_899)],
            vec![reply(OK, 9_899)],
            vec![Act::Silent],
        ],
        patient,
        &[],
    );
    let started = sim.now;
    let request = sim.request(Op::Acquire);
    sim.run_for(&request, TTL);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert_eq!(Validity::compute(TTL, started, sim.now, 0.01), None);
    assert!(Validity::compute(TTL, started, sim.now - 2 * MS, 0.01).is_some());
}

#[test]
fn five_masters_need_three() {
    let (sim, _, _) = acquire_round(vec![
        vec![reply(OK, 1)],
        vec![reply(NIL, 1)],
        vec![Act::Silent],
        vec![reply(OK, 2)],
        vec![reply(OK, 5)],
    ]);
    assert_eq!(sim.round().quorum(), 3);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    let (sim, _, _) = acquire_round(vec![
        vec![reply(OK, 1)],
        vec![reply(NIL, 1)],
        vec![Act::Close(MS)],
        vec![reply(OK, 2)],
        vec![reply(NIL, 5)],
    ]);
    assert_eq!(sim.round().decision(0), Some(Decision::Lost));
    assert_eq!(sim.round().loss(0), Loss::Refused);
}

#[test]
fn a_batch_goes_out_in_one_write_per_master_and_decides_each_resource_alone() {
    // Each master's first act answers the warm-up; then one act per slot:
    // slot 0 granted by masters 0 and 1 (the latter at 2 ms), slot 1
    // refused by two, slot 2 granted by masters 0 and 2 while 1 is silent.
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1), reply(OK, 1), reply(NIL, 1), reply(OK, 1)],
        vec![reply(OK, 1), reply(OK, 2), reply(NIL, 1), Act::Silent],
        vec![reply(OK, 1), reply(NIL, 1), reply(OK, 1), reply(OK, 1)],
    ]);
    let warm = sim.request(Op::Acquire);
    sim.run(&warm);
    let writes: Vec<usize> = sim.masters.iter().map(|m| m.writes).collect();
    let batch: Vec<Request> = (0..3).map(|_| sim.request(Op::Acquire)).collect();
    let started = sim.now;
    sim.run_batch(&batch, ROUND_TIMEOUT);
    for (master, before) in sim.masters.iter().zip(writes) {
        assert_eq!(
            master.writes,
            before + 1,
            "one write carries the whole batch"
        );
    }
    assert_eq!(sim.round().slots(), 3);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert_eq!(sim.round().votes(0)[2], Vote::Refused);
    assert_eq!(sim.round().decision(1), Some(Decision::Lost));
    assert_eq!(sim.round().loss(1), Loss::Refused);
    assert_eq!(sim.round().decision(2), Some(Decision::Won));
    assert_eq!(
        sim.round().votes(2)[1],
        Vote::Pending,
        "decided without the silent master"
    );
    // Each slot's validity runs to its own decision: slot 0 waited for
    // master 1's reply at 2 ms, slot 2 had its two grants at 1 ms.
    assert_eq!(sim.round().decided_at(0), Some(started + 2 * MS));
    assert_eq!(sim.round().decided_at(2), Some(started + MS));
}

#[test]
fn a_connection_failure_fails_every_pending_slot_of_that_master() {
    let mut sim = Sim::new(vec![
        vec![Act::Close(MS)],
        vec![reply(OK, 2), reply(OK, 2)],
        vec![reply(NIL, 2), reply(OK, 2)],
    ]);
    let batch: Vec<Request> = (0..2).map(|_| sim.request(Op::Acquire)).collect();
    sim.run_batch(&batch, ROUND_TIMEOUT);
    for slot in 0..2 {
        assert_eq!(
            sim.round().votes(slot)[0],
            Vote::Failed(Cause::Closed),
            "slot {slot}"
        );
    }
    assert_eq!(sim.round().decision(0), Some(Decision::Lost));
    assert_eq!(sim.round().decision(1), Some(Decision::Won));
}

/// A simulation whose connections run restart quarantine with `max_ttl`.
fn quarantined(scripts: Vec<Vec<Act>>, max_ttl: Duration) -> Sim {
    let careful = Timing {
        quarantine: Some(max_ttl),
        stall: 10 * max_ttl,
        ..timing()
    };
    Sim::with(scripts, careful, &[])
}

#[test]
fn a_master_up_for_less_than_the_max_ttl_does_not_count_until_it_has_been() {
    let max_ttl = Duration::from_secs(60);
    let mut sim = quarantined(
        vec![
            vec![reply(OK, 1); 4],
            vec![reply(OK, 1); 4],
            vec![reply(OK, 1); 4],
        ],
        max_ttl,
    );
    sim.masters[1].uptime = 5;
    sim.masters[2].uptime = 59;
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    let loads = Scripts::new().all().len();
    assert_eq!(
        sim.masters[0].log[loads - 1..loads + 2],
        ["SCRIPT LOAD", "COMMAND DOCS", "INFO"]
    );
    assert_eq!(sim.round().decision(0), Some(Decision::Lost));
    assert_eq!(sim.round().loss(0), Loss::Unreachable);
    assert_eq!(sim.round().votes(0)[0], Vote::Granted);
    assert_eq!(
        sim.round().votes(0)[1],
        // An uptime of 5 may mean 4.001 s: 56 s to go, less the round's 1 ms.
        Vote::Failed(Cause::Quarantined(Duration::from_secs(56) - MS))
    );
    assert!(matches!(
        sim.round().votes(0)[2],
        Vote::Failed(Cause::Quarantined(_))
    ));
    // Two seconds later master 2 (uptime 59, so more than 58 s) has surely
    // been up for 60 s: it counts again.
    sim.advance(Duration::from_secs(1));
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert!(matches!(
        sim.round().votes(0)[2],
        Vote::Failed(Cause::Quarantined(_))
    ));
    sim.advance(Duration::from_secs(1));
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert!(matches!(
        sim.round().votes(0)[1],
        Vote::Failed(Cause::Quarantined(_))
    ));
    sim.advance(Duration::from_secs(54));
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(
        sim.round().votes(0),
        [Vote::Granted, Vote::Granted, Vote::Granted]
    );
}

#[test]
fn a_run_id_that_changed_while_it_held_our_locks_quarantines_for_the_max_ttl() {
    let max_ttl = Duration::from_secs(30);
    let mut sim = quarantined(
        vec![
            vec![reply(OK, 1), Act::Close(MS), reply(OK, 1)],
            vec![reply(OK, 1); 3],
            vec![reply(OK, 1); 3],
        ],
        max_ttl,
    );
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.round().votes(0)[0], Vote::Granted);
    // Master 0 crashes and comes back with a new run_id and (as a clock
    // glitch or a replica promoted in its place would show) a long uptime.
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.round().votes(0)[0], Vote::Failed(Cause::Closed));
    sim.masters[0].run_id = "b".repeat(40);
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert!(
        matches!(sim.round().votes(0)[0], Vote::Failed(Cause::Quarantined(left)) if left >= max_ttl - MS),
        "{:?}",
        sim.round().votes(0)
    );
}

#[test]
fn a_new_run_id_on_a_master_that_held_nothing_of_ours_is_no_reason_to_wait() {
    let mut sim = quarantined(
        vec![
            vec![Act::Close(MS), reply(NIL, 1)],
            vec![reply(OK, 1); 2],
            vec![reply(OK, 1); 2],
        ],
        Duration::from_secs(30),
    );
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    sim.masters[0].run_id = "c".repeat(40);
    let request = sim.request(Op::Acquire);
    sim.run(&request);
    assert_eq!(sim.round().votes(0)[0], Vote::Refused);
}

#[test]
fn a_fenced_acquire_takes_the_largest_fence_among_the_granting_masters_only() {
    let mut sim = Sim::new(vec![
        vec![reply(b":5\r\n", 1)],
        vec![reply(b":7\r\n", 2)],
        vec![reply(b":-1\r\n", 3)],
    ]);
    let request = sim.request(Op::AcquireFenced);
    sim.run_for(&request, ROUND_TIMEOUT);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert_eq!(sim.round().max_granted_value(0), Some(7));
    // A refusing master's -1 (and a higher fence it might report) counts
    // for nothing.
    let mut sim = Sim::new(vec![
        vec![reply(b":3\r\n", 1)],
        vec![reply(b":-1\r\n", 1)],
        vec![reply(b":4\r\n", 5)],
    ]);
    let request = sim.request(Op::AcquireFenced);
    sim.run_for(&request, ROUND_TIMEOUT);
    assert_eq!(
        sim.round().votes(0),
        [Vote::Granted, Vote::Refused, Vote::Granted]
    );
    assert_eq!(sim.round().max_granted_value(0), Some(4));
}

/// A multi-resource acquire that was decided lost (two
/// refusals) while one master's `-NOSCRIPT` was still on its way. The
/// cleanup release goes out first; the late `-NOSCRIPT` must not be
/// answered by re-sending the acquire as EVAL, which would set the keys
/// again, with a token nobody holds, for a whole TTL.
#[test]
fn a_late_noscript_never_re_sets_a_key_after_its_round_is_decided() {
    let mut sim = Sim::new(vec![
        vec![reply(NOSCRIPT, 30), reply(ONE, 1)],
        vec![reply(ZERO, 1), reply(ZERO, 1)],
        vec![reply(ZERO, 2), reply(ZERO, 1)],
    ]);
    let acquire = Request {
        keys: Keys::Many(vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")].into()),
        ..sim.request(Op::AcquireMany)
    };
    sim.run(&acquire);
    assert_eq!(sim.round().decision(0), Some(Decision::Lost));
    let cleanup = Request {
        op: Op::ReleaseMany,
        ..acquire
    };
    sim.run(&cleanup);
    // The late NOSCRIPT was read during the cleanup round; settle the rest.
    sim.advance(100 * MS);
    let next = sim.request(Op::Release);
    sim.run(&next);
    let sent = sim.scripts_sent(0);
    // Acquire, cleanup, next release; then the late NOSCRIPT is answered
    // by loading the acquire's script (not running it), so that the next
    // acquire here pays no NOSCRIPT.
    assert_eq!(
        sent,
        ["EVALSHA", "EVALSHA", "EVALSHA", "SCRIPT LOAD"],
        "the decided acquire was not re-sent, as EVALSHA or EVAL"
    );
}

/// A late `-NOSCRIPT` to a release is still answered with EVAL: a release
/// can only free a resource, and it may be the cleanup of a lost reply.
#[test]
fn a_late_noscript_to_a_release_is_still_answered_with_eval() {
    let mut sim = Sim::new(vec![
        vec![reply(NOSCRIPT, 30), reply(ONE, 1), reply(ONE, 1)],
        vec![reply(ONE, 1), reply(ONE, 1)],
        vec![reply(ONE, 2), reply(ONE, 1)],
    ]);
    let release = sim.request(Op::Release);
    sim.run(&release);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    sim.advance(100 * MS);
    let next = sim.request(Op::Release);
    sim.run(&next);
    let sent = sim.scripts_sent(0);
    // The late NOSCRIPT is read in the next round, after its EVALSHA went
    // out; the first release is then loaded and re-sent.
    assert_eq!(sent, ["EVALSHA", "EVALSHA", "SCRIPT LOAD", "EVALSHA"]);
}

/// A release queued on a connection that is still
/// connecting when its round ends is kept and sent once connected (the
/// spec's case: the SET may have taken effect with its reply lost); the
/// acquire queued beside it in an earlier round is dropped.
#[test]
fn a_release_queued_while_connecting_is_sent_once_connected() {
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1), reply(ONE, 1)],
        vec![reply(NIL, 1), reply(ZERO, 1)],
        vec![reply(ONE, 1)],
    ]);
    sim.masters[2].connect_delay = 500 * MS;
    let acquire = sim.request(Op::Acquire);
    sim.run(&acquire);
    assert_eq!(sim.round().decision(0), Some(Decision::Lost));
    let release = Request {
        op: Op::Release,
        ..acquire
    };
    sim.run(&release);
    sim.advance(600 * MS);
    sim.transmit();
    let sent: Vec<&String> = sim.masters[2]
        .log
        .iter()
        .filter(|c| !c.starts_with("SCRIPT") && !c.starts_with("COMMAND") && *c != "INFO")
        .collect();
    assert_eq!(sent, ["EVALSHA"], "the release only, not the acquire");
}

/// Two connections to one server process (the same
/// run_id in INFO, as when one server is named twice) vote once. Here the
/// extend script answers 1 on both: two votes would be a fake quorum while
/// the third master is silent.
#[test]
fn one_server_behind_two_connections_votes_once() {
    let mut sim = Sim::new(vec![vec![reply(ONE, 1)], vec![reply(ONE, 2)], vec![]]);
    sim.masters[1].run_id = sim.masters[0].run_id.clone();
    let extend = sim.request(Op::Extend);
    sim.run(&extend);
    assert_eq!(sim.round().decision(0), Some(Decision::Lost));
    // Both handshakes were read before either reply: neither counts. (Had
    // one reply come before the other's handshake, it alone would.)
    assert_eq!(sim.votes()[0], Vote::Failed(Cause::SameServer(1)));
    assert_eq!(sim.votes()[1], Vote::Failed(Cause::SameServer(0)));
}

/// Rounds started one after another are in flight together on
/// the same connections, and each is decided by its own replies: every
/// connection's FIFO matches replies to (round, slot) across rounds, and a
/// round's completion is reported once.
#[test]
fn concurrent_rounds_are_each_decided_by_their_own_replies() {
    // Per master, the replies in request order: round A (acquire), round B
    // (extend), round C (acquire).
    let mut sim = Sim::new(vec![
        vec![reply(OK, 3), reply(ZERO, 1), reply(NIL, 1)],
        vec![reply(NIL, 1), reply(ONE, 1), reply(OK, 1)],
        vec![reply(OK, 1), reply(ONE, 1), reply(OK, 1)],
    ]);
    let a = sim.request(Op::Acquire);
    let b = sim.request(Op::Extend);
    let c = sim.request(Op::Acquire);
    let a = sim.start(std::slice::from_ref(&a), ROUND_TIMEOUT);
    let b = sim.start(std::slice::from_ref(&b), ROUND_TIMEOUT);
    let c = sim.start(std::slice::from_ref(&c), ROUND_TIMEOUT);
    assert_eq!(sim.engine.live_rounds(), 3);
    sim.drive(a);
    sim.drive(b);
    sim.drive(c);
    // All three went out in one write per master.
    assert!(sim.masters.iter().all(|m| m.writes == 1));
    let votes = |id| sim.engine.round(id).unwrap().votes(0).to_vec();
    assert_eq!(votes(a), [Vote::Granted, Vote::Refused, Vote::Granted]);
    assert_eq!(votes(b), [Vote::Refused, Vote::Granted, Vote::Granted]);
    assert_eq!(votes(c), [Vote::Refused, Vote::Granted, Vote::Granted]);
    let mut completed = Vec::new();
    while let Some(id) = sim.engine.poll_completed() {
        completed.push(id);
    }
    completed.sort_by_key(|id| [a, b, c].iter().position(|x| x == id));
    assert_eq!(completed, [a, b, c]);
    // A freed round's late replies are dropped, and its slot's next round
    // is a new id.
    sim.engine.finish(a);
    assert!(sim.engine.round(a).is_none());
    let d = sim.request(Op::Acquire);
    let d = sim.start(std::slice::from_ref(&d), ROUND_TIMEOUT);
    assert_ne!(d, a);
}

/// Ending a round while the connection is still connecting drops
/// that round's unsent requests only, wherever they sit in the queue among
/// other rounds' (releases are kept).
#[test]
fn ending_a_round_while_connecting_drops_only_its_own_requests() {
    let mut sim = Sim::new(vec![vec![reply(ONE, 1), reply(OK, 1)]]);
    sim.masters[0].connect_delay = 10 * MS;
    let first = sim.request(Op::Acquire);
    let release = sim.request(Op::Release);
    let dropped = sim.request(Op::Acquire);
    let last = sim.request(Op::Acquire);
    let a = sim.start(std::slice::from_ref(&first), ROUND_TIMEOUT);
    let b = sim.start(&[release, dropped], ROUND_TIMEOUT);
    let c = sim.start(std::slice::from_ref(&last), ROUND_TIMEOUT);
    sim.engine.end(a);
    sim.engine.end(b);
    sim.drive(c);
    let commands: Vec<&str> = sim.masters[0]
        .log
        .iter()
        .map(String::as_str)
        .filter(|c| !c.starts_with("SCRIPT") && !c.starts_with("COMMAND") && *c != "INFO")
        .collect();
    assert_eq!(commands, ["EVALSHA", "SET"]);
    assert_eq!(sim.engine.round(c).unwrap().votes(0), [Vote::Granted]);
}

/// Many rounds in flight while the masters fall behind: a master
/// past the in-flight bound is dropped and reconnected, and rounds end
/// while it connects. A vote that counts (granted or refused) must come
/// from the master's reply to that round's own request: the master must
/// have received that round's key.
#[test]
fn votes_come_only_from_replies_to_the_rounds_own_requests_when_masters_fall_behind() {
    let small = Timing {
        max_in_flight: 32,
        ..timing()
    };
    let script = || (0..2000).map(|_| reply(OK, 3)).collect::<Vec<_>>();
    let mut sim = Sim::with(vec![script(), script(), script()], small, &[]);
    let mut live: Vec<(RoundId, String)> = Vec::new();
    let mut done: Vec<(Vec<Vote>, String)> = Vec::new();
    for k in 0..400 {
        let key = format!("k{k}");
        let request = Request {
            op: Op::Acquire,
            keys: Keys::One(Bytes::from(key.clone())),
            token: sim.tokens.next_token(),
            arg: 10_000,
            notice: false,
        };
        let id = sim.start(std::slice::from_ref(&request), ROUND_TIMEOUT);
        live.push((id, key));
        // Now and then, let time pass and finish what completed, as the
        // shared client's loop does.
        if k % 7 == 6 {
            sim.transmit();
            sim.now += MS;
            sim.deliver();
            sim.engine.handle_timeout(sim.now);
            while let Some(id) = sim.engine.poll_completed() {
                if let Some(pos) = live.iter().position(|(l, _)| *l == id) {
                    let (id, key) = live.remove(pos);
                    done.push((sim.engine.round(id).unwrap().votes(0).to_vec(), key));
                    sim.engine.finish(id);
                }
            }
        }
    }
    for (id, key) in std::mem::take(&mut live) {
        sim.drive(id);
        done.push((sim.engine.round(id).unwrap().votes(0).to_vec(), key));
        sim.engine.finish(id);
    }
    let mut counted = 0;
    for (votes, key) in &done {
        for (i, vote) in votes.iter().enumerate() {
            if matches!(vote, Vote::Granted | Vote::Refused) {
                counted += 1;
                assert!(
                    sim.masters[i].set_keys.contains(key),
                    "master {i} voted {vote:?} on {key}, which it never received"
                );
            }
        }
    }
    assert!(counted > 0);
}

/// A send that finds a master too far behind drops its
/// connection, and with it the requests of every round in flight there:
/// their votes fail at once, not at their deadlines.
#[test]
fn a_connection_dropped_as_too_far_behind_fails_every_rounds_pending_vote_at_once() {
    let small = Timing {
        max_in_flight: 32,
        ..timing()
    };
    let ok = || (0..100).map(|_| reply(OK, 1)).collect::<Vec<_>>();
    let mut sim = Sim::with(vec![ok(), ok(), vec![]], small, &[]);
    let first = sim.request(Op::Acquire);
    let first = sim.start(std::slice::from_ref(&first), ROUND_TIMEOUT);
    sim.transmit();
    let started = sim.now;
    let mut ids = vec![first];
    while !sim.conn(2).is_down() {
        let request = sim.request(Op::Acquire);
        ids.push(sim.start(std::slice::from_ref(&request), ROUND_TIMEOUT));
    }
    assert_eq!(sim.now, started, "no time passed");
    for id in &ids {
        assert!(
            matches!(
                sim.engine.round(*id).unwrap().votes(0)[2],
                Vote::Failed(Cause::TooFarBehind | Cause::Backoff(_))
            ),
            "{:?}",
            sim.engine.round(*id).unwrap().votes(0)
        );
    }
}

/// The EVAL that answers a `-NOSCRIPT` is a new send,
/// and the stall limit counts from it. A release answered `-NOSCRIPT` at
/// 0.9 of the stall limit, its EVAL not yet answered at 1.1 of it, is no
/// stalled connection.
#[test]
fn an_eval_sent_after_noscript_is_judged_stalled_from_its_own_send() {
    let stall = timing().stall;
    let late = u64::try_from((stall * 9 / 10).as_millis()).unwrap();
    let mut sim = Sim::new(vec![
        vec![reply(NOSCRIPT, late), reply(ONE, 1000)],
        vec![reply(ONE, 1)],
        vec![reply(ONE, 1)],
    ]);
    let started = sim.now;
    let release = sim.request(Op::Release);
    sim.run(&release);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    // Idle, but for the late reply: the driver reads it when it comes and
    // writes the EVAL.
    sim.now = started + stall * 9 / 10;
    sim.deliver();
    sim.transmit();
    assert_eq!(sim.scripts_sent(0), ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]);
    sim.now = started + stall * 11 / 10;
    sim.engine.handle_timeout(sim.now);
    assert!(
        !sim.conn(0).is_down(),
        "an EVAL sent {:?} ago is not stalled (limit {stall:?})",
        stall * 2 / 10
    );
    assert_eq!(
        sim.conn(0).in_flight(),
        2,
        "the SCRIPT LOAD and the EVALSHA"
    );
    // Past the limit counted from their send, it is.
    sim.now = started + stall * 9 / 10 + stall;
    sim.engine.handle_timeout(sim.now);
    assert!(sim.conn(0).is_down());
}

/// A subscriber connection whose master stops answering
/// (SIGSTOP: the socket stays open and the kernel takes the bytes) is
/// dropped once a SUBSCRIBE has gone unconfirmed for the stall limit. Its
/// channels no longer count toward a waiter's `N - Q + 1` until a new
/// connection confirms them; while the master stays stopped, connections
/// that never hear from it are made again only after a backoff; once it
/// answers, the renewed subscriptions count as releases (one may have been
/// missed).
#[test]
fn a_subscriber_connection_to_a_master_that_stops_answering_is_dropped_at_the_stall_limit() {
    let stall = timing().stall;
    let mut sim = Sim::subscribing(3, timing());
    let (r0, r1) = (Bytes::from_static(b"r0"), Bytes::from_static(b"r1"));
    sim.engine.subscribe(&r0, sim.now);
    sim.pump_subs();
    let confirmed =
        |sim: &Sim, r: &Bytes| (sim.engine.subscriptions).confirmed(&sim.engine.subs, r);
    assert_eq!(confirmed(&sim, &r0), [0, 1, 2]);
    sim.pubsubs[2].stopped = true;
    let stopped = sim.now;
    sim.engine.subscribe(&r1, sim.now);
    sim.pump_subs();
    assert_eq!(confirmed(&sim, &r1), [0, 1]);
    assert!(
        sim.engine.is_listening(&r1, sim.now),
        "two masters of three confirmed: every release reaches one"
    );
    // A master that confirmed once and then stopped: until the stall limit,
    // r0 still counts there.
    sim.run_subs_until(stopped + stall - MS);
    assert_eq!(sim.pubsubs[2].connected_at.len(), 1);
    sim.run_subs_until(stopped + stall + MS);
    assert!(
        sim.pubsubs[2].connected_at.len() >= 2,
        "the connection to the stopped master was not dropped at the stall limit ({stall:?})"
    );
    assert_eq!(
        confirmed(&sim, &r0),
        [0, 1],
        "r0 counts on the stopped master again before it confirmed anything"
    );
    // It stays stopped: each new connection is dropped in turn, and one
    // that heard nothing waits out a backoff before the next.
    sim.run_subs_until(stopped + 20 * stall);
    let connects = &sim.pubsubs[2].connected_at;
    assert!(connects.len() >= 10, "{connects:?}");
    assert!(connects.len() <= 21, "{} connects", connects.len());
    for pair in connects[1..].windows(2) {
        assert!(
            pair[1] - pair[0] >= stall + timing().backoff_min,
            "made again {:?} after the last connect, with no backoff",
            pair[1] - pair[0]
        );
    }
    assert_eq!(confirmed(&sim, &r0), [0, 1]);
    assert_eq!(confirmed(&sim, &r1), [0, 1]);
    // It answers again: the subscriptions it confirms are renewed ones,
    // each heard as such once (a release may have been missed).
    while sim.engine.poll_heard().is_some() {}
    sim.pubsubs[2].resume();
    sim.pump_subs();
    assert_eq!(confirmed(&sim, &r0), [0, 1, 2]);
    assert_eq!(confirmed(&sim, &r1), [0, 1, 2]);
    let mut renewed = Vec::new();
    while let Some(heard) = sim.engine.poll_heard() {
        match heard {
            Heard::Renewed(r) => renewed.push(r),
            other => panic!("heard {other:?}"),
        }
    }
    renewed.sort();
    assert_eq!(renewed, [r0, r1]);
}

/// A burst of waiters on more resources than a subscriber
/// connection may leave unconfirmed (one `release_batch` can wake a
/// thousand) is not a lagging master: what finds no room waits, and goes
/// as one SUBSCRIBE once confirmations come back. No connection is
/// dropped, and every subscription is in place.
#[test]
fn a_burst_of_subscriptions_past_the_bound_waits_for_room_and_drops_nothing() {
    let small = Timing {
        max_in_flight: 32,
        ..timing()
    };
    let mut sim = Sim::subscribing(3, small);
    let first = Bytes::from_static(b"first");
    sim.engine.subscribe(&first, sim.now);
    sim.pump_subs();
    assert!(sim.engine.is_listening(&first, sim.now));
    let burst: Vec<Bytes> = (0..200)
        .map(|k| Bytes::from(format!("burst:{k}")))
        .collect();
    for resource in &burst {
        sim.engine.subscribe(resource, sim.now);
    }
    for link in 3..6 {
        let held = sim.engine.link(link).unwrap().in_flight();
        assert!(
            held <= 16,
            "link {link}: {held} unconfirmed, past half the bound"
        );
    }
    for _ in 0..4 {
        sim.pump_subs();
    }
    for resource in &burst {
        assert!(sim.engine.is_listening(resource, sim.now), "{resource:?}");
        assert_eq!(
            (sim.engine.subscriptions).confirmed(&sim.engine.subs, resource),
            [0, 1, 2]
        );
    }
    for pubsub in &sim.pubsubs {
        assert_eq!(pubsub.connected_at.len(), 1, "a connection was dropped");
    }
}

/// A subscriber connection has the
/// command connection's bounds, and a burst is not a lagging master. With
/// its master stopped (no time passing: no stall limit involved), waiters
/// that come and go on ever new resources send it commands until half its
/// in-flight bound is unconfirmed; past that each SUBSCRIBE waits in its
/// outbox, where the UNSUBSCRIBE after it takes it out. Neither the
/// channels kept for unconfirmed commands nor the connection's buffers
/// grow with the resources waited for, and the connection is not dropped
/// (it would be at the stall limit). The other masters' subscriptions
/// keep working.
#[test]
fn a_stopped_subscriber_master_costs_bounded_memory_however_many_resources_come_and_go() {
    let small = Timing {
        max_in_flight: 32,
        ..timing()
    };
    let mut sim = Sim::subscribing(3, small);
    let r0 = Bytes::from_static(b"r0");
    sim.engine.subscribe(&r0, sim.now);
    sim.pump_subs();
    let link = 3 + 2;
    let fresh = sim.engine.link(link).unwrap().buffer_capacity();
    sim.pubsubs[2].stopped = true;
    let stopped = sim.now;
    // Kept beside r0: at most one per unconfirmed command on the stopped
    // master's connection.
    let most_channels = 1 + small.max_in_flight;
    // Its queue, at most `max_in_flight` entries, and its write buffer,
    // at most that many commands of under 64 bytes.
    let most_bytes = fresh + small.max_in_flight * (512 + 64);
    for k in 0..5_000 {
        let r = Bytes::from(format!("resource:{k:08}"));
        sim.engine.subscribe(&r, sim.now);
        sim.pump_subs();
        sim.engine.unsubscribe(&r, sim.now);
        sim.pump_subs();
        // Read as the hub reads them, every turn.
        while sim.engine.poll_heard().is_some() {}
        let channels = sim.engine.subscriptions.len();
        let bytes = sim.engine.link(link).unwrap().buffer_capacity();
        assert!(
            channels <= most_channels,
            "after {k} resources: {channels} channels kept"
        );
        assert!(
            bytes <= most_bytes,
            "after {k} resources: {bytes} bytes of buffers (new: {fresh})"
        );
    }
    assert_eq!(sim.now, stopped, "no time passed: no stall limit involved");
    assert_eq!(sim.pubsubs[2].connected_at.len(), 1, "dropped");
    // The live masters confirm a new waiter's subscription.
    let r = Bytes::from_static(b"last");
    sim.engine.subscribe(&r, sim.now);
    sim.pump_subs();
    assert!(sim.engine.is_listening(&r, sim.now));
    assert_eq!(
        (sim.engine.subscriptions).confirmed(&sim.engine.subs, &r),
        [0, 1]
    );
}

/// A bulk reply of `text`, for a test that builds it at run time.
fn bulk_of(text: &[u8]) -> &'static [u8] {
    let mut out = format!("${}\r\n", text.len()).into_bytes();
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
    Box::leak(out.into_boxed_slice())
}

/// The lock commands master `i` received after the handshake: neither
/// SCRIPT LOAD, COMMAND nor INFO.
fn lock_commands(sim: &Sim, i: usize) -> Vec<&str> {
    sim.masters[i]
        .log
        .iter()
        .map(String::as_str)
        .filter(|c| !c.starts_with("SCRIPT") && !c.starts_with("COMMAND") && *c != "INFO")
        .collect()
}

/// Masters of different servers in one client each go their own
/// way. Two that offer `DELIFEQ` (Valkey 9.1) release by it, the release
/// message pipelined behind it; the Redis 7.0 one by the script. The first
/// round, sent before the handshake's probe was answered, runs as before.
#[test]
fn masters_with_their_own_compare_and_delete_release_without_a_script() {
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1), reply(ONE, 1), reply(b":0\r\n", 1)],
        vec![reply(OK, 1), reply(ONE, 1), reply(b":0\r\n", 1)],
        vec![reply(OK, 1), reply(ONE, 1)],
    ]);
    sim.masters[0].docs = DOCS_VALKEY_9;
    sim.masters[1].docs = DOCS_VALKEY_9;
    let acquire = sim.request(Op::Acquire);
    sim.run(&acquire);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    let release = Request {
        op: Op::Release,
        ..acquire
    };
    sim.run(&release);
    assert_eq!(sim.round().decision(0), Some(Decision::Won));
    assert_eq!(sim.votes(), [Vote::Granted, Vote::Granted, Vote::Granted]);
    assert_eq!(lock_commands(&sim, 0), ["SET", "DELIFEQ", "PUBLISH"]);
    assert_eq!(lock_commands(&sim, 1), ["SET", "DELIFEQ", "PUBLISH"]);
    assert_eq!(lock_commands(&sim, 2), ["SET", "EVALSHA"]);
    // The message's reply is consumed with its release: nothing is left
    // awaited on the connection, and the next round reads its own.
    for i in 0..3 {
        assert_eq!(sim.conn(i).in_flight(), 0, "master {i}");
    }
}

/// The native extend reads its three outcomes apart: this
/// token's old value (extended), nil (gone), another's (taken).
#[test]
fn a_native_extend_tells_extended_gone_and_taken_apart() {
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1)],
        vec![reply(OK, 1)],
        vec![reply(OK, 1)],
    ]);
    for master in &mut sim.masters {
        master.docs = DOCS_VALKEY_9;
    }
    let acquire = sim.request(Op::Acquire);
    sim.run(&acquire);
    let mine = bulk_of(acquire.token.as_bytes());
    sim.masters[0].script.push_back(reply(mine, 1));
    sim.masters[1].script.push_back(reply(NIL, 1));
    sim.masters[2]
        .script
        .push_back(reply(bulk_of(b"another"), 1));
    let extend = Request {
        op: Op::Extend,
        ..acquire
    };
    sim.run(&extend);
    assert_eq!(sim.votes(), [Vote::Granted, Vote::Gone, Vote::Refused]);
    assert_eq!(sim.round().decision(0), Some(Decision::Lost));
    for i in 0..3 {
        assert_eq!(lock_commands(&sim, i), ["SET", "SET"], "master {i}");
    }
}

/// A master that advertised `DELIFEQ` and then refuses it (a
/// proxy, an ACL) has the release done by the script instead, unseen by
/// the caller, and runs the script from then on, until it reconnects.
#[test]
fn a_command_advertised_then_refused_falls_back_to_the_script() {
    let unknown: &[u8] =
        b"-ERR unknown command 'DELIFEQ', with args beginning with: 'sim:lock'\r\n";
    let mut sim = Sim::new(vec![
        vec![
            reply(OK, 1),
            reply(unknown, 1),
            reply(b":0\r\n", 1),
            reply(ONE, 1),
            reply(OK, 1),
            reply(ONE, 1),
        ],
        // Slower, so that the round waits for master 0's vote.
        vec![reply(OK, 1), reply(ONE, 10), reply(OK, 1), reply(ONE, 1)],
        vec![reply(OK, 1), reply(ONE, 10), reply(OK, 1), reply(ONE, 1)],
    ]);
    sim.masters[0].docs = DOCS_VALKEY_9;
    let acquire = sim.request(Op::Acquire);
    sim.run(&acquire);
    let release = Request {
        op: Op::Release,
        ..acquire
    };
    sim.run(&release);
    assert_eq!(sim.votes()[0], Vote::Granted, "the caller never sees it");
    let again = sim.request(Op::Acquire);
    sim.run(&again);
    let release = Request {
        op: Op::Release,
        ..again
    };
    sim.run(&release);
    assert_eq!(sim.votes()[0], Vote::Granted);
    assert_eq!(
        lock_commands(&sim, 0),
        ["SET", "DELIFEQ", "PUBLISH", "EVALSHA", "SET", "EVALSHA"]
    );
}

/// A Redis 8.4 master releases by `DELEX key IFEQ token`, its
/// message behind it, and extends by `SET ... IFEQ ... GET PX`; a quiet
/// cleanup is the delete alone.
#[test]
fn a_master_with_delex_releases_and_extends_by_its_own_commands() {
    let mut sim = Sim::new(vec![
        vec![reply(OK, 1)],
        vec![reply(OK, 1)],
        vec![reply(OK, 1)],
    ]);
    for master in &mut sim.masters {
        master.docs = DOCS_REDIS_84;
    }
    let acquire = sim.request(Op::Acquire);
    sim.run(&acquire);
    let mine = bulk_of(acquire.token.as_bytes());
    for master in &mut sim.masters {
        master.script.extend([
            reply(mine, 1),
            reply(ONE, 1),
            reply(b":0\r\n", 1),
            reply(ONE, 1),
        ]);
    }
    for op in [Op::Extend, Op::Release, Op::Cleanup] {
        let request = Request {
            op,
            ..acquire.clone()
        };
        sim.run(&request);
        assert_eq!(sim.round().decision(0), Some(Decision::Won), "{op:?}");
    }
    for i in 0..3 {
        assert_eq!(
            lock_commands(&sim, i),
            ["SET", "SET", "DELEX", "PUBLISH", "DELEX"],
            "master {i}"
        );
        assert_eq!(sim.conn(i).in_flight(), 0, "master {i}");
    }
}
