//! The model of a master (`redlock_mio::sim::model::Master`)
//! against a real redis-server: random command sequences from fixed seeds
//! go to both, and every reply, and every frame a subscriber receives,
//! must be the same. This file owns that comparison; the model itself is
//! `src/sim/model.rs`.
//!
//! The model's clock is the test's wall clock, which is the server's too
//! (same host, same `gettimeofday`): a time the model reports (a PTTL, a
//! waiting acquire's `-PTTL`, an unmarked master's age) is compared within
//! [`CLOSE_MS`], and the TTLs drawn are minutes long, so that nothing
//! expires during a run by surprise. Expiry itself is checked on its own,
//! once the server shows the keys gone. Error texts are compared exactly,
//! except where another server words one differently from Redis 7.0,
//! whose words the model follows ([`KNOWN`]: there the codes must agree
//! and the divergence is printed; Valkey 9.1 also leaves the SHA out of a
//! script error's `script: <sha>, on @user_script:<line>.`). `REDIS_SERVER` picks the server, as for
//! every test using the kit; the model answers as the [`Flavour`] found by
//! asking the server which of the lock commands it has: `SET
//! ... IFEQ` (Valkey 8.1+), `DELIFEQ` (Valkey 9.0+), `DELEX` (Redis 8.4+).
//! The random runs send those commands to every server, so that one
//! without them is checked to refuse them as the model does, and
//! `COMMAND DOCS SET DELIFEQ DELEX` must tell the same capabilities from
//! both sides ([`Capabilities`]).

// The model is part of the simulator, compiled only under `--cfg
// redlock_sim` (the README's test command sets it).
#![cfg(redlock_sim)]

mod common;

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Plain, Server};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::script::{self, FENCE_STATE_KEY, Script};
use redlock_mio::sim::model::{ConnId, Flavour, Master, Settings};
use redlock_mio::sim::rng::Rng;
use redlock_test::Options;

/// Seeds of the random runs, each on a fresh model and a flushed server.
const SEEDS: std::ops::Range<u64> = 1..17;

/// Commands per seed.
const STEPS: usize = 500;

/// How far apart the model's and the server's readings of a time may be:
/// a few round trips on a loaded machine, far below the minutes between
/// the TTLs drawn.
const CLOSE_MS: i64 = 5_000;

/// Error texts other servers word differently from Redis 7.0: the model's
/// prefix and the other server's. A reply matches when the two texts
/// start so and agree after the prefixes.
const KNOWN: &[(&str, &str, &str)] = &[
    (
        "Valkey 8.1, 9.1",
        "NOSCRIPT No matching script. Please use EVAL.",
        "NOSCRIPT No matching script.",
    ),
    (
        "Valkey 8.1, 9.1",
        "ERR Lua redis lib command arguments must be strings or integers",
        "ERR Command arguments must be strings or integers",
    ),
    (
        "Redis 8.2, Valkey 8.1, 9.1",
        "NOPERM this user has no permissions to access one of the channels used as arguments",
        "NOPERM No permissions to access a channel",
    ),
    (
        "Redis 8.2, Valkey 8.1, 9.1",
        "NOPERM this user has no permissions to run the",
        "NOPERM User r has no permissions to run the",
    ),
];

const SCRIPTS: [(&str, &str); 10] = [
    ("RELEASE", script::RELEASE_SOURCE),
    ("ACQUIRE_WAIT", script::ACQUIRE_WAIT_SOURCE),
    ("EXTEND", script::EXTEND_SOURCE),
    ("ACQUIRE_FENCED", script::ACQUIRE_FENCED_SOURCE),
    ("FENCE", script::FENCE_SOURCE),
    ("ACQUIRE_MANY", script::ACQUIRE_MANY_SOURCE),
    ("RELEASE_MANY", script::RELEASE_MANY_SOURCE),
    ("EXTEND_MANY", script::EXTEND_MANY_SOURCE),
    ("CLEANUP", script::CLEANUP_SOURCE),
    ("CLEANUP_MANY", script::CLEANUP_MANY_SOURCE),
];

const LOCKS: [&str; 3] = ["k1", "k2", "k3"];
const FENCES: [&str; 2] = ["f1", "f2"];
const TOKENS: [&str; 3] = ["t1", "t2", "t3"];
/// Processes a release names to try next (see `notify::process_id`).
const NEXT: [&str; 2] = ["7290398201745346811", "-42"];
const TTLS: [&str; 3] = ["600000", "1200000", "3600000"];
const BAD_TTLS: [&str; 4] = ["0", "-5", "x", "9223372036854775807"];
const FENCE_VALUES: [&str; 7] = ["1", "2", "3", "5", "8", "1.5", "abc"];
const DIRECTIVES: [&str; 4] = ["bootstrap", "readmit:0", "readmit:86400000", "none"];
const CHANNELS: [&str; 4] = [
    "redlock:released:k1",
    "redlock:released:k2",
    "redlock:released:k3",
    "other",
];

/// The connections of a run: commands, the subscriber, and (with a
/// password) one that authenticates and reconnects.
const A: usize = 0;
const S: usize = 1;
const B: usize = 2;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How a reply is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Equal, error texts as [`KNOWN`] allows.
    Exact,
    /// An integer that is a time: within [`CLOSE_MS`], except the listed
    /// values (PTTL's -2 and -1, say), which must be equal.
    Close(&'static [i64]),
    /// A fenced acquire's `{reading, standing, high, unmarked_ms}`: the
    /// last a time; or its refusal, as [`Check::Close`] compares it.
    Fenced,
    /// A multi-resource acquire's refusal, where two of its keys with
    /// different values expire within [`CLOSE_MS`] of each other: the
    /// sides may read either as the longest, so only the time is compared.
    ManyTie,
    /// `HGETALL` of the fence state: its `since` a time.
    State,
    /// `PEXPIRE ... GT` or `LT` setting an expiry within [`CLOSE_MS`] of
    /// the key's own: the two sides read their clocks at different
    /// instants, so either may find the new expiry a millisecond later
    /// than the old, and 0 and 1 are both right.
    Tie,
    /// `UNSUBSCRIBE` from every channel: the server goes by its hash
    /// table's order, the model by subscription order, so the channels
    /// are compared as a set and the counts in order.
    UnsubscribeAll,
    /// `COMMAND DOCS`: the [`Capabilities`] a client reads from it, and
    /// how deep it nests. Summaries and histories differ between servers
    /// the model answers for alike (Redis 7.0 and 8.2).
    Capabilities,
}

/// What a client learns from `COMMAND DOCS SET DELIFEQ DELEX` (the
/// handshake's question), read as the client reads it
/// ([`redlock_mio::Capabilities::from_docs`]); `None` for a reply that is
/// no list of docs at all.
struct Capabilities;

impl Capabilities {
    /// Read from a `COMMAND DOCS` reply; `None` for anything else.
    fn of(reply: &Reply) -> Option<redlock_mio::Capabilities> {
        let Reply::Array(items) = reply else {
            return None;
        };
        let named = items
            .chunks(2)
            .all(|pair| matches!(pair, [Reply::Bulk(_), _]));
        named.then(|| redlock_mio::Capabilities::from_docs(reply))
    }

    /// What a master of `flavour` has.
    fn of_flavour(flavour: Flavour) -> redlock_mio::Capabilities {
        let mut caps = redlock_mio::Capabilities::NONE;
        caps.delifeq = flavour.has_delifeq();
        caps.delex = flavour.has_delex();
        caps.set_ifeq = flavour.has_set_ifeq();
        caps
    }
}

/// A script error's text with its SHA left out (`script: <sha>, on` made
/// `script: on`), as Valkey 9.1 words it; `None` when it names none.
fn without_script_sha(text: &[u8]) -> Option<Vec<u8>> {
    const AT: &[u8] = b" script: ";
    let start = text.windows(AT.len()).position(|w| w == AT)? + AT.len();
    let sha = text.get(start..start + 40)?;
    if !sha.iter().all(u8::is_ascii_hexdigit) || text.get(start + 40..start + 42)? != b", " {
        return None;
    }
    Some([&text[..start], &text[start + 42..]].concat())
}

/// How deep `reply` nests: a flat array is 1.
fn depth(reply: &Reply) -> usize {
    match reply {
        Reply::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn args(words: &[&str]) -> Vec<Vec<u8>> {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

/// A command as a failure shows it: scripts by name.
fn show(args: &[Vec<u8>]) -> String {
    let word = |a: &Vec<u8>| {
        for (name, source) in SCRIPTS {
            if a.as_slice() == source.as_bytes() {
                return format!("${name}");
            }
            if a.as_slice() == Script::new(source).sha() {
                return format!("@{name}");
            }
        }
        format!("{:?}", String::from_utf8_lossy(a))
    };
    args.iter().map(word).collect::<Vec<_>>().join(" ")
}

fn is_pong(reply: &Reply) -> bool {
    match reply {
        Reply::Status(s) => s.as_ref() == b"PONG",
        Reply::Array(items) => {
            matches!(items.first(), Some(Reply::Bulk(k)) if k.as_ref() == b"pong")
        }
        _ => false,
    }
}

/// The comparisons of one run, and the known divergences it met.
#[derive(Default)]
struct Verdict {
    divergences: Vec<String>,
}

impl Verdict {
    fn same(&mut self, check: Check, model: &Reply, real: &Reply) -> bool {
        match (check, model, real) {
            (_, Reply::Error(m), Reply::Error(r)) => self.same_error(m, r),
            (Check::Tie, Reply::Integer(m), Reply::Integer(r)) => {
                matches!(m, 0 | 1) && matches!(r, 0 | 1)
            }
            (Check::Close(exact), Reply::Integer(m), Reply::Integer(r)) => {
                if exact.contains(m) || exact.contains(r) {
                    m == r
                } else {
                    (m - r).abs() <= CLOSE_MS
                }
            }
            // The waiting acquire's refusal: minus the key's PTTL, close,
            // and its value, exact.
            (Check::Close(_), Reply::Array(m), Reply::Array(r)) if m.len() == 2 && r.len() == 2 => {
                self.same(check, &m[0], &r[0]) && m[1] == r[1]
            }
            (Check::Fenced, Reply::Array(m), Reply::Array(r)) if m.len() == 2 && r.len() == 2 => {
                self.same(Check::Close(&[1]), model, real)
            }
            (Check::ManyTie, Reply::Array(m), Reply::Array(r)) if m.len() == 2 && r.len() == 2 => {
                self.same(Check::Close(&[1]), &m[0], &r[0])
            }
            (Check::Fenced, Reply::Array(m), Reply::Array(r)) if m.len() == 4 && r.len() == 4 => {
                m[..3] == r[..3] && self.same(Check::Close(&[-1]), &m[3], &r[3])
            }
            (Check::State, Reply::Array(m), Reply::Array(r)) if m.len() == r.len() => {
                m.chunks(2).zip(r.chunks(2)).all(|(m, r)| match (m, r) {
                    ([mk, Reply::Bulk(mv)], [rk, Reply::Bulk(rv)])
                        if mk == rk && *mk == Reply::Bulk("since".into()) =>
                    {
                        let time = |v: &[u8]| String::from_utf8_lossy(v).parse::<i64>().ok();
                        matches!((time(mv), time(rv)), (Some(m), Some(r)) if (m - r).abs() <= CLOSE_MS)
                    }
                    _ => m == r,
                })
            }
            (Check::Capabilities, m, r) => {
                Capabilities::of(m).is_some()
                    && Capabilities::of(m) == Capabilities::of(r)
                    && depth(m) == depth(r)
            }
            (Check::Exact | Check::UnsubscribeAll, Reply::Array(m), Reply::Array(r)) => {
                m.len() == r.len() && m.iter().zip(r).all(|(m, r)| self.same(Check::Exact, m, r))
            }
            _ => model == real,
        }
    }

    fn same_error(&mut self, model: &[u8], real: &[u8]) -> bool {
        if model == real {
            return true;
        }
        // Valkey 9.1 (Lua a module) names no SHA where a script's error
        // says where it was raised; the rest is compared as any error.
        if let Some(model) = without_script_sha(model)
            && self.same_known_error(&model, real)
        {
            self.note(
                "Valkey 9.1: \"script: on @user_script\" for \"script: <sha>, on @user_script\""
                    .to_owned(),
            );
            return true;
        }
        self.same_known_error(model, real)
    }

    fn note(&mut self, note: String) {
        if !self.divergences.contains(&note) {
            self.divergences.push(note);
        }
    }

    /// The same error, or the same once a [`KNOWN`] divergence is taken
    /// into account.
    fn same_known_error(&mut self, model: &[u8], real: &[u8]) -> bool {
        if model == real {
            return true;
        }
        for (server, ours, theirs) in KNOWN {
            if let (Some(m), Some(r)) = (
                model.strip_prefix(ours.as_bytes()),
                real.strip_prefix(theirs.as_bytes()),
            ) && m == r
            {
                self.note(format!("{server}: {theirs:?} for {ours:?}"));
                return true;
            }
        }
        false
    }

    /// `UNSUBSCRIBE` with no channel: the same channels, and the same
    /// counts in order.
    fn same_unsubscribe_all(&mut self, model: &[Reply], real: &[Reply]) -> bool {
        let split = |frames: &[Reply]| {
            let mut channels = Vec::new();
            let mut counts = Vec::new();
            for frame in frames {
                match frame {
                    Reply::Array(items) if items.len() == 3 => {
                        channels.push(items[1].clone());
                        counts.push(items[2].clone());
                    }
                    other => channels.push(other.clone()),
                }
            }
            channels.sort_by_key(|c| format!("{c:?}"));
            (channels, counts)
        };
        split(model) == split(real)
    }
}

/// A real server and the model, driven side by side.
struct Pair<'a> {
    server: &'a Server,
    real: Vec<Plain>,
    model: Master,
    ids: Vec<ConnId>,
    next_id: u64,
    verdict: Verdict,
    /// The last commands, for a failure's report.
    history: VecDeque<String>,
}

impl<'a> Pair<'a> {
    /// `conns` new connections on each side.
    fn new(server: &'a Server, conns: usize, model: Master) -> Pair<'a> {
        let real = (0..conns).map(|_| common::connect(server)).collect();
        Pair::with(server, real, model)
    }

    /// The server's connections `real`, and as many new ones on the
    /// model.
    fn with(server: &'a Server, real: Vec<Plain>, model: Master) -> Pair<'a> {
        let conns = real.len();
        Pair {
            server,
            real,
            model,
            ids: (0..conns as u64).map(ConnId).collect(),
            next_id: conns as u64,
            verdict: Verdict::default(),
            history: VecDeque::new(),
        }
    }

    /// Closes connection `conn` and opens it again, on both sides.
    fn reconnect(&mut self, conn: usize) {
        self.real[conn] = common::connect(self.server);
        self.model.handle_disconnect(self.ids[conn]);
        self.ids[conn] = ConnId(self.next_id);
        self.next_id += 1;
        self.note(format!("(reconnect {conn})"));
    }

    fn note(&mut self, line: String) {
        if self.history.len() == 12 {
            self.history.pop_front();
        }
        self.history.push_back(line);
    }

    fn send_real(&mut self, conn: usize, args: &[Vec<u8>]) -> Reply {
        let args: Vec<Arg<'_>> = args.iter().map(|a| Arg::Bytes(a)).collect();
        self.real[conn].cmd(&args)
    }

    /// Sends `args` on connection `conn` of both sides and compares the
    /// replies, then the frames the subscriber received.
    fn step(&mut self, conn: usize, args: &[Vec<u8>], check: Check) -> Result<(), String> {
        self.note(format!("conn {conn}: {}", show(args)));
        let now = now_ms();
        let check = if self.is_expiry_tie(now, args) {
            Check::Tie
        } else if self.is_many_tie(now, args) {
            Check::ManyTie
        } else {
            check
        };
        let real = self.send_real(conn, args);
        let model = self.model.handle_command(now, self.ids[conn], args);
        if check == Check::UnsubscribeAll {
            return self.barrier(Some((model, real)));
        }
        if !self.verdict.same(check, &model, &real) {
            return Err(format!(
                "reply to {}\n  model:  {model:?}\n  server: {real:?}",
                show(args)
            ));
        }
        self.barrier(None)
    }

    /// Whether `args` is a `PEXPIRE key ms GT|LT` whose new expiry is
    /// within [`CLOSE_MS`] of the key's own in the model (in any
    /// database: which one the connection selected is the model's to
    /// know).
    fn is_expiry_tie(&self, now: u64, args: &[Vec<u8>]) -> bool {
        let [command, key, ms, flag] = args else {
            return false;
        };
        let flag = flag.to_ascii_uppercase();
        if !command.eq_ignore_ascii_case(b"PEXPIRE") || (flag != b"GT" && flag != b"LT") {
            return false;
        }
        let Some(new) = std::str::from_utf8(ms)
            .ok()
            .and_then(|ms| ms.parse::<u64>().ok())
            .and_then(|ms| now.checked_add(ms))
        else {
            return false;
        };
        (0..16).any(|db| {
            matches!(self.model.entry(now, db, key), Some((_, Some(at))) if at.abs_diff(new) <= CLOSE_MS.unsigned_abs())
        })
    }

    /// Whether `args` runs [`script::ACQUIRE_MANY_SOURCE`] on keys of
    /// which two, with different values (or not strings), expire within
    /// [`CLOSE_MS`] of each other in the model (in any database).
    fn is_many_tie(&self, now: u64, args: &[Vec<u8>]) -> bool {
        let script = Script::new(script::ACQUIRE_MANY_SOURCE);
        let [command, body, numkeys, rest @ ..] = args else {
            return false;
        };
        let runs = (command.eq_ignore_ascii_case(b"EVALSHA") && body.as_slice() == script.sha())
            || (command.eq_ignore_ascii_case(b"EVAL")
                && body.as_slice() == script.source().as_bytes());
        let Some(keys) = std::str::from_utf8(numkeys)
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| rest.get(..n))
        else {
            return false;
        };
        if !runs {
            return false;
        }
        let close = CLOSE_MS.unsigned_abs();
        (0..16).any(|db| {
            let held: Vec<(u64, Option<&[u8]>)> = keys
                .iter()
                .filter_map(|k| {
                    let expiry = self.model.expiry(now, db, k)?;
                    Some((
                        expiry.map_or(0, |at| at.saturating_sub(now)),
                        self.model.peek(now, db, k),
                    ))
                })
                .collect();
            held.iter().enumerate().any(|(i, (left, value))| {
                held[i + 1..].iter().any(|(other, other_value)| {
                    left.abs_diff(*other) <= close && (value.is_none() || value != other_value)
                })
            })
        })
    }

    /// PING on the subscriber, both sides, and compares every frame the
    /// subscriber received up to the pong (`carried`: the first frames
    /// of an `UNSUBSCRIBE` from all channels). Frames for any other
    /// connection are a failure: only the subscriber subscribes.
    fn barrier(&mut self, carried: Option<(Reply, Reply)>) -> Result<(), String> {
        let mut model = Vec::new();
        let mut real = Vec::new();
        if let Some((m, r)) = carried.clone() {
            model.push(m);
            real.push(r);
        }
        while let Some((to, frame)) = self.model.poll_push() {
            if to != self.ids[S] {
                return Err(format!("the model sent {frame:?} to {to:?}"));
            }
            model.push(frame);
        }
        let ping = args(&["PING"]);
        model.push(self.model.handle_command(now_ms(), self.ids[S], &ping));
        let ping: Vec<Arg<'_>> = vec![Arg::Bytes(b"PING")];
        self.real[S]
            .send(&ping)
            .unwrap_or_else(|e| panic!("PING the subscriber: {e}"));
        loop {
            let frame = self.real[S]
                .read_reply()
                .unwrap_or_else(|e| panic!("reading the subscriber: {e}"));
            // Only the PING's reply is a pong or, on a connection that
            // must authenticate first, an error.
            let done = is_pong(&frame) || matches!(frame, Reply::Error(_));
            real.push(frame);
            if done {
                break;
            }
        }
        let same = if carried.is_some() {
            self.verdict.same_unsubscribe_all(&model, &real)
        } else {
            model.len() == real.len()
                && model
                    .iter()
                    .zip(&real)
                    .all(|(m, r)| self.verdict.same(Check::Exact, m, r))
        };
        if same {
            Ok(())
        } else {
            Err(format!(
                "the subscriber's frames\n  model:  {model:?}\n  server: {real:?}"
            ))
        }
    }

    /// Runs `step` and panics with the seed, the step, the command and
    /// both replies when they differ.
    fn check(&mut self, seed: u64, i: usize, conn: usize, args: &[Vec<u8>], check: Check) {
        if let Err(why) = self.step(conn, args, check) {
            let history: Vec<&str> = self.history.iter().map(String::as_str).collect();
            panic!(
                "seed {seed}, step {i}: the model and {} differ on {why}\n  last commands:\n    {}",
                self.server.url(),
                history.join("\n    ")
            );
        }
    }
}

/// What a run draws commands from, and whether it has connection `B`
/// (a password is set: it authenticates, and reconnects).
struct Draw {
    rng: Rng,
    with_b: bool,
}

impl Draw {
    fn ttl(&mut self) -> &'static str {
        if self.rng.one_in(15) {
            self.rng.pick(&BAD_TTLS)
        } else {
            self.rng.pick(&TTLS)
        }
    }

    fn any_key(&mut self) -> &'static str {
        match self.rng.below(8) {
            0 => "STATE",
            1 | 2 => self.rng.pick(&FENCES),
            _ => self.rng.pick(&LOCKS),
        }
    }

    fn key_arg(key: &str) -> Vec<u8> {
        if key == "STATE" {
            FENCE_STATE_KEY.to_vec()
        } else {
            key.as_bytes().to_vec()
        }
    }

    /// One script call, by EVALSHA (loaded or not) or EVAL; now and then
    /// with one key too few, for the script's error paths.
    fn script(&mut self) -> (Vec<Vec<u8>>, Check) {
        let (name, source) = SCRIPTS[self.rng.below(SCRIPTS.len())];
        let lock = self.rng.pick(&LOCKS);
        let token = self.rng.pick(&TOKENS);
        let many = |rng: &mut Rng| -> Vec<&'static str> {
            (0..1 + rng.below(3)).map(|_| rng.pick(&LOCKS)).collect()
        };
        let (keys, argv, check): (Vec<&str>, Vec<&str>, Check) = match name {
            // Now and then naming the process to try next, as an
            // announced release does.
            "RELEASE" => match self.rng.below(2) {
                0 => (vec![lock], vec![token], Check::Exact),
                _ => (vec![lock], vec![token, self.rng.pick(&NEXT)], Check::Exact),
            },
            // Now and then asking for the notice a refusal publishes.
            "ACQUIRE_WAIT" => match self.rng.below(2) {
                0 => (vec![lock], vec![token, self.ttl()], Check::Close(&[1])),
                _ => (vec![lock], vec![token, self.ttl(), "1"], Check::Close(&[1])),
            },
            "EXTEND" => (vec![lock], vec![token, self.ttl()], Check::Exact),
            "ACQUIRE_FENCED" => {
                let fence = self.rng.pick(&FENCES);
                let mut argv = vec![token, self.ttl()];
                // Now and then asking for the refusal's notice.
                if self.rng.below(2) == 1 {
                    argv.push("1");
                }
                (vec![lock, fence, "STATE"], argv, Check::Fenced)
            }
            "FENCE" => {
                let fence = self.rng.pick(&FENCES);
                let directive = self.rng.pick(&DIRECTIVES);
                let value = self.rng.pick(&FENCE_VALUES);
                (
                    vec![lock, fence, "STATE"],
                    vec![directive, token, value],
                    Check::Exact,
                )
            }
            "ACQUIRE_MANY" => (
                many(&mut self.rng),
                vec![token, self.ttl()],
                Check::Close(&[1]),
            ),
            "RELEASE_MANY" => (many(&mut self.rng), vec![token], Check::Exact),
            _ => (many(&mut self.rng), vec![token, self.ttl()], Check::Exact),
        };
        let numkeys = if self.rng.one_in(25) {
            keys.len() - 1
        } else {
            keys.len()
        };
        let head = if self.rng.below(10) < 7 {
            vec![b"EVALSHA".to_vec(), Script::new(source).sha().to_vec()]
        } else {
            vec![b"EVAL".to_vec(), source.as_bytes().to_vec()]
        };
        let mut command = head;
        command.push(numkeys.to_string().into_bytes());
        command.extend(keys.iter().map(|k| Self::key_arg(k)));
        command.extend(argv.iter().map(|a| a.as_bytes().to_vec()));
        (command, check)
    }

    /// One of the lock commands the client uses where a server has them, or a
    /// mistake with one (a digest condition, NX beside IFEQ, IFEQ without
    /// PX, a key that is not a string, a wrong count): every server gets
    /// them, so that one without them is checked to refuse them as the
    /// model does.
    fn native(&mut self) -> (usize, Vec<Vec<u8>>, Check) {
        let lock = self.rng.pick(&LOCKS);
        let token = self.rng.pick(&TOKENS);
        let held = self.rng.pick(&TOKENS);
        let ttl = self.ttl();
        let words: Vec<&str> = match self.rng.below(20) {
            0..=3 => vec!["SET", lock, token, "IFEQ", held, "PX", ttl],
            4..=5 => vec!["SET", lock, token, "IFEQ", held, "GET", "PX", ttl],
            6 => vec!["SET", lock, token, "IFEQ", held],
            7 => {
                let other = self.rng.pick(&["NX", "XX", "IFEQ", "KEEPTTL", "GET"]);
                vec!["SET", lock, token, "IFEQ", held, other, "PX", ttl]
            }
            8 => vec!["SET", lock, token, "ifeq", held, "px", ttl],
            9 => vec!["SET", lock, token, self.rng.pick(&["IFNE", "IFDEQ"]), held],
            10..=12 => vec!["DELIFEQ", lock, token],
            13 => match self.rng.below(2) {
                0 => vec!["DELIFEQ", lock],
                _ => vec!["DELIFEQ", lock, token, held],
            },
            14..=15 => vec!["DELEX", lock, "IFEQ", token],
            16 => vec!["DELEX", lock, self.rng.pick(&["IFNE", "IFEQ", "FOO"])],
            _ => {
                let names = self.rng.pick(&[
                    "SET DELIFEQ DELEX",
                    "DELIFEQ set",
                    "delex nosuch SET",
                    "SET",
                ]);
                let mut words = vec!["COMMAND", "DOCS"];
                words.extend(names.split(' '));
                return (A, args(&words), Check::Capabilities);
            }
        };
        // Now and then on a key that is not a string (the fence state).
        let mut command = args(&words);
        if self.rng.one_in(12) {
            command[1] = FENCE_STATE_KEY.to_vec();
        }
        (A, command, Check::Exact)
    }

    /// The next command: on which connection, what, compared how.
    fn next(&mut self) -> (usize, Vec<Vec<u8>>, Check) {
        if self.rng.one_in(8) {
            return self.native();
        }
        let lock = self.rng.pick(&LOCKS);
        let token = self.rng.pick(&TOKENS);
        let on_a = |words: &[&str]| (A, args(words), Check::Exact);
        let roll = self.rng.below(if self.with_b { 112 } else { 100 });
        let rare = self.rng.one_in(4);
        match roll {
            0..=11 => {
                let ttl = self.ttl();
                on_a(&["SET", lock, token, "NX", "PX", ttl])
            }
            12..=13 => {
                let ttl = self.ttl();
                on_a(&["SET", lock, token, "PX", ttl])
            }
            14 => on_a(&["SET", lock, token]),
            15..=19 => {
                let key = self.any_key();
                (A, vec![b"GET".to_vec(), Self::key_arg(key)], Check::Exact)
            }
            20..=22 => {
                let (k1, k2) = (self.any_key(), self.any_key());
                (
                    A,
                    vec![b"DEL".to_vec(), Self::key_arg(k1), Self::key_arg(k2)],
                    Check::Exact,
                )
            }
            23..=24 => {
                let (k1, k2) = (self.any_key(), self.any_key());
                (
                    A,
                    vec![b"EXISTS".to_vec(), Self::key_arg(k1), Self::key_arg(k2)],
                    Check::Exact,
                )
            }
            25..=28 => {
                let key = self.any_key();
                (
                    A,
                    vec![b"PTTL".to_vec(), Self::key_arg(key)],
                    Check::Close(&[-2, -1]),
                )
            }
            29..=31 => {
                let ttl = if self.rng.one_in(4) {
                    self.rng.pick(&["0", "-1"])
                } else {
                    self.ttl()
                };
                let flag = self.rng.pick(&["", "", "NX", "XX", "GT", "LT"]);
                let mut words = vec!["PEXPIRE", lock, ttl];
                if !flag.is_empty() {
                    words.push(flag);
                }
                on_a(&words)
            }
            32..=63 => {
                let (command, check) = self.script();
                (A, command, check)
            }
            64..=67 => {
                let (_, source) = SCRIPTS[self.rng.below(SCRIPTS.len())];
                on_a(&["SCRIPT", "LOAD", source])
            }
            68..=69 => {
                let mut words = vec!["SCRIPT".to_string(), "EXISTS".to_string()];
                words.extend(
                    SCRIPTS
                        .iter()
                        .map(|(_, s)| String::from_utf8_lossy(Script::new(s).sha()).into_owned()),
                );
                (
                    A,
                    words.iter().map(|w| w.as_bytes().to_vec()).collect(),
                    Check::Exact,
                )
            }
            70 => on_a(&["SCRIPT", "FLUSH"]),
            71..=73 => {
                let channel = self.rng.pick(&CHANNELS);
                on_a(&["PUBLISH", channel, token])
            }
            74..=76 => {
                let mut words = vec!["SUBSCRIBE"];
                for _ in 0..1 + self.rng.below(3) {
                    words.push(self.rng.pick(&CHANNELS));
                }
                (S, args(&words), Check::Exact)
            }
            77..=78 => {
                let mut words = vec!["UNSUBSCRIBE"];
                for _ in 0..1 + self.rng.below(2) {
                    words.push(self.rng.pick(&CHANNELS));
                }
                (S, args(&words), Check::Exact)
            }
            79 => (S, args(&["UNSUBSCRIBE"]), Check::UnsubscribeAll),
            80 => (S, args(&["GET", lock]), Check::Exact),
            81 => (S, args(&["PING", token]), Check::Exact),
            82 => on_a(&["PUBSUB", "NUMSUB", CHANNELS[0], CHANNELS[1], "other"]),
            83 => on_a(&["AUTH", "wrong"]),
            84 => on_a(&["AUTH", "nobody", "wrong"]),
            85..=86 => {
                let db = self.rng.pick(&["0", "0", "1", "16", "x"]);
                on_a(&["SELECT", db])
            }
            87..=90 => (
                A,
                vec![b"HGETALL".to_vec(), FENCE_STATE_KEY.to_vec()],
                Check::State,
            ),
            91 => (
                A,
                vec![b"DEL".to_vec(), FENCE_STATE_KEY.to_vec()],
                Check::Exact,
            ),
            92 if rare => (
                A,
                vec![b"SET".to_vec(), FENCE_STATE_KEY.to_vec(), b"junk".to_vec()],
                Check::Exact,
            ),
            93 => on_a(&["FOO", lock]),
            94 => on_a(&["GET"]),
            95 => on_a(&["SET", lock, token, "NX", "XX"]),
            96 => on_a(&["PING"]),
            97 => on_a(&["EVALSHA", "0000000000000000000000000000000000000000", "0"]),
            98 => on_a(&["CLIENT", "SETNAME", token]),
            99 => on_a(&["INFO", "foo"]),
            // Connection B, with a password set.
            100..=103 => {
                let auth = self.rng.pick(&[
                    "AUTH pw",
                    "AUTH bad",
                    "AUTH default pw",
                    "AUTH default bad",
                    "AUTH u up",
                    "AUTH u bad",
                ]);
                (B, args(&auth.split(' ').collect::<Vec<_>>()), Check::Exact)
            }
            104..=105 => (B, args(&["GET", lock]), Check::Exact),
            106 => {
                let ttl = self.ttl();
                (
                    B,
                    args(&["SET", lock, token, "NX", "PX", ttl]),
                    Check::Exact,
                )
            }
            107 => (B, args(&["SELECT", "1"]), Check::Exact),
            108 => (B, args(&["PING"]), Check::Exact),
            109..=110 => (B, Vec::new(), Check::Exact),
            _ => on_a(&["PING", "a", "b"]),
        }
    }
}

/// Which [`Flavour`] the server is, asked of it by probes on a key no
/// run uses: a command it lacks is an unknown command, an option its `SET`
/// lacks a syntax error. Version numbers are not asked: they lie.
fn server_flavour(server: &Server, password: Option<&str>) -> Flavour {
    let mut conn = common::connect(server);
    if let Some(password) = password {
        assert!(conn.cmd(&["AUTH".into(), password.into()]).is_ok());
    }
    let mut has = |words: &[&str]| {
        let words: Vec<Arg<'_>> = words.iter().map(|w| Arg::from(*w)).collect();
        match conn.cmd(&words) {
            Reply::Error(e) => {
                !e.starts_with(b"ERR unknown command") && e.as_ref() != b"ERR syntax error"
            }
            _ => true,
        }
    };
    let (delifeq, delex, ifeq) = (
        has(&["DELIFEQ", "model:probe", "x"]),
        has(&["DELEX", "model:probe", "IFEQ", "x"]),
        has(&["SET", "model:probe", "x", "IFEQ", "y"]),
    );
    match (delifeq, delex, ifeq) {
        (true, false, true) => Flavour::Valkey91,
        (false, true, true) => Flavour::Redis84,
        (false, false, true) => Flavour::Valkey81,
        (false, false, false) => Flavour::Redis70,
        other => panic!(
            "{}: no flavour has (DELIFEQ, DELEX, SET IFEQ) = {other:?}",
            server.url()
        ),
    }
}

/// What the server is, from `INFO server`: its name and version, and
/// whether it evicts EVAL scripts (Redis 7.4+, Valkey 8).
fn server_kind(server: &Server, password: Option<&str>) -> (String, bool) {
    let mut conn = common::connect(server);
    if let Some(password) = password {
        assert!(conn.cmd(&["AUTH".into(), password.into()]).is_ok());
    }
    let Reply::Bulk(info) = conn.cmd(&[Arg::Bytes(b"INFO"), Arg::Bytes(b"server")]) else {
        panic!("INFO server from {}", server.url());
    };
    let info = String::from_utf8_lossy(&info).into_owned();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
            .map(|v| v.trim().to_owned())
    };
    if let Some(valkey) = field("valkey_version") {
        return (format!("Valkey {valkey}"), true);
    }
    let version = field("redis_version").unwrap_or_default();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (format!("Redis {version}"), (major, minor) >= (7, 4))
}

/// Runs every seed against `server`: each on a fresh model with
/// `settings`, the server flushed, connections authenticated with
/// `password` when one is set. Returns the commands sent and the
/// divergences met.
fn run_seeds(server: &Server, settings: &Settings, password: Option<&str>) -> (usize, Vec<String>) {
    let conns = if password.is_some() { 3 } else { 2 };
    let (_, eval_lru) = server_kind(server, password);
    let flavour = server_flavour(server, password);
    let mut commands = 0;
    let mut divergences = Vec::new();
    // The same server connections for every seed; the model anew.
    let mut real: Option<Vec<Plain>> = None;
    for seed in SEEDS {
        let model = Master::new(seed, now_ms()).with_settings(Settings {
            eval_lru,
            flavour,
            ..settings.clone()
        });
        let connections = real
            .take()
            .unwrap_or_else(|| (0..conns).map(|_| common::connect(server)).collect());
        let mut pair = Pair::with(server, connections, model);
        if let Some(password) = password {
            for conn in [S, A, B] {
                pair.check(seed, 0, conn, &args(&["AUTH", password]), Check::Exact);
            }
        }
        let mut draw = Draw {
            rng: Rng::new(seed),
            with_b: password.is_some(),
        };
        for i in 0..STEPS {
            let (conn, command, check) = draw.next();
            if command.is_empty() {
                pair.reconnect(conn);
                continue;
            }
            pair.check(seed, i, conn, &command, check);
            commands += 1;
        }
        divergences.append(&mut pair.verdict.divergences);
        // Leave the server as a fresh one for the next seed.
        pair.send_real(S, &args(&["UNSUBSCRIBE"]));
        pair.barrier(None).ok();
        if password.is_some() {
            pair.reconnect(B);
            pair.send_real(B, &args(&["AUTH", "pw"]));
        }
        for words in [&["SELECT", "0"][..], &["FLUSHALL"], &["SCRIPT", "FLUSH"]] {
            pair.send_real(A, &args(words));
        }
        real = Some(std::mem::take(&mut pair.real));
    }
    divergences.sort();
    divergences.dedup();
    (commands, divergences)
}

fn report(
    test: &str,
    server: &Server,
    password: Option<&str>,
    started: Instant,
    commands: usize,
    divergences: &[String],
) {
    let (kind, _) = server_kind(server, password);
    let flavour = server_flavour(server, password);
    eprintln!(
        "{test}: {} seeds, {commands} commands against {kind} ({flavour:?}) in {:.1?}",
        SEEDS.end - SEEDS.start,
        started.elapsed()
    );
    for d in divergences {
        eprintln!("  known divergence, compared by code: {d}");
    }
}

#[test]
fn the_model_answers_every_command_as_the_server_does() {
    let server = common::master();
    let started = Instant::now();
    let (commands, divergences) = run_seeds(&server, &Settings::default(), None);
    report(
        "no password",
        &server,
        None,
        started,
        commands,
        &divergences,
    );
}

#[test]
fn the_model_authenticates_and_reconnects_as_the_server_does() {
    let server = common::master_with(&Options::new().requirepass("pw"));
    let mut admin = common::connect(&server);
    assert_eq!(
        admin.cmd(&["AUTH".into(), "pw".into()]),
        common::status("OK")
    );
    let user = ["ACL", "SETUSER", "u", "on", ">up", "~*", "&*", "+@all"];
    let user: Vec<Arg<'_>> = user.iter().map(|w| Arg::from(*w)).collect();
    assert_eq!(admin.cmd(&user), common::status("OK"));
    let settings = Settings {
        requirepass: Some("pw".into()),
        users: vec![("u".into(), "up".into())],
        ..Settings::default()
    };
    let started = Instant::now();
    let (commands, divergences) = run_seeds(&server, &settings, Some("pw"));
    report(
        "requirepass",
        &server,
        Some("pw"),
        started,
        commands,
        &divergences,
    );
}

/// Keys with short TTLs, compared once the server shows them gone: the
/// model, on the same clock, must have them gone too, and before that
/// both must still have them.
#[test]
fn keys_expire_on_the_model_when_they_expire_on_the_server() {
    let server = common::master();
    let mut pair = Pair::new(&server, 2, Master::new(1, now_ms()));
    let acquire_wait = Script::new(script::ACQUIRE_WAIT_SOURCE);
    let wait = |token: &str, ttl: &str| {
        vec![
            b"EVAL".to_vec(),
            acquire_wait.source().as_bytes().to_vec(),
            b"1".to_vec(),
            b"w".to_vec(),
            token.as_bytes().to_vec(),
            ttl.as_bytes().to_vec(),
        ]
    };
    let set_at = Instant::now();
    let setup: [(Vec<Vec<u8>>, Check); 5] = [
        (args(&["SET", "e", "v", "NX", "PX", "1500"]), Check::Exact),
        (wait("t", "1500"), Check::Exact),
        (args(&["SET", "p", "v"]), Check::Exact),
        (args(&["PEXPIRE", "p", "1500"]), Check::Exact),
        (args(&["PTTL", "e"]), Check::Close(&[-2, -1])),
    ];
    for (i, (command, check)) in setup.iter().enumerate() {
        pair.check(0, i, A, command, *check);
    }
    // Well before the 1.5 s are up both still hold the keys; on a
    // machine so loaded that this comes late, the check is skipped
    // rather than raced.
    if set_at.elapsed() < Duration::from_millis(500) {
        pair.check(0, 5, A, &args(&["EXISTS", "e", "w", "p"]), Check::Exact);
        pair.check(0, 6, A, &wait("u", "600000"), Check::Close(&[1]));
    }
    let mut probe = common::connect(&server);
    let gone = common::eventually(Duration::from_secs(10), || {
        probe.cmd(&["EXISTS".into(), "e".into(), "w".into(), "p".into()]) == Reply::Integer(0)
    });
    assert!(gone, "the server never expired the keys");
    let after: [(Vec<Vec<u8>>, Check); 7] = [
        (args(&["EXISTS", "e", "w", "p"]), Check::Exact),
        (args(&["GET", "e"]), Check::Exact),
        (args(&["PTTL", "p"]), Check::Exact),
        (args(&["PEXPIRE", "e", "600000"]), Check::Exact),
        (args(&["SET", "e", "u", "NX", "PX", "600000"]), Check::Exact),
        (wait("u", "600000"), Check::Exact),
        (args(&["PTTL", "w"]), Check::Close(&[-2, -1])),
    ];
    for (i, (command, check)) in after.iter().enumerate() {
        pair.check(0, 10 + i, A, command, *check);
    }
}

/// An ACL user without channel rights, `INFO` or `SCRIPT LOAD` on the
/// server; the model's refusals on the model.
#[test]
fn refusals_answer_as_an_acl_user_is_answered() {
    let server = common::master();
    let rule = [
        "ACL",
        "SETUSER",
        "r",
        "on",
        ">pw",
        "~*",
        "resetchannels",
        "+@all",
        "-info",
        "-script|load",
    ];
    let rule: Vec<Arg<'_>> = rule.iter().map(|w| Arg::from(*w)).collect();
    assert_eq!(common::connect(&server).cmd(&rule), common::status("OK"));
    let settings = Settings {
        users: vec![("r".into(), "pw".into())],
        deny_publish: true,
        deny_info: true,
        deny_script_load: true,
        ..Settings::default()
    };
    // A (0) is the restricted user; the subscriber (1) the default user,
    // which the model's refusals spare as long as `deny_subscribe` is off.
    let mut pair = Pair::new(&server, 2, Master::new(1, now_ms()).with_settings(settings));
    let release = |name: &str, source: &str| {
        let mut c = args(&["EVAL", source, "1", "r1", "t"]);
        c[0] = name.as_bytes().to_vec();
        c
    };
    let steps: Vec<(usize, Vec<Vec<u8>>)> = vec![
        (A, args(&["AUTH", "r", "pw"])),
        (S, args(&["SUBSCRIBE", "redlock:released:r1"])),
        (A, args(&["PUBLISH", "redlock:released:r1", "x"])),
        (A, args(&["INFO"])),
        (A, args(&["INFO", "server"])),
        (A, args(&["SCRIPT", "LOAD", script::RELEASE_SOURCE])),
        (A, args(&["SET", "r1", "t"])),
        // Releases, and publishes nothing.
        (A, release("EVAL", script::RELEASE_SOURCE)),
        (A, args(&["SET", "r1", "t"])),
        (A, release("EVAL", script::RELEASE_MANY_SOURCE)),
        (A, args(&["EXISTS", "r1"])),
        (A, args(&["SUBSCRIBE", "redlock:released:r1"])),
    ];
    for (i, (conn, command)) in steps.iter().enumerate() {
        if i == steps.len() - 1 {
            pair.model.settings_mut().deny_subscribe = true;
        }
        pair.check(0, i, *conn, command, Check::Exact);
    }
    let (kind, _) = server_kind(&server, None);
    eprintln!("refusals against {kind}");
    for d in &pair.verdict.divergences {
        eprintln!("  known divergence, compared by code: {d}");
    }
}

/// EVAL-created scripts beyond 500 are evicted on Redis 7.4+ and Valkey
/// 8, and the model with its LRU on evicts the same ones; on Redis 7.0
/// neither evicts. The model cannot run the filler scripts, so their
/// replies are not compared; `SCRIPT EXISTS` and `EVALSHA` are.
#[test]
fn eval_scripts_are_evicted_as_the_server_evicts_them() {
    let server = common::master();
    let (kind, eval_lru) = server_kind(&server, None);
    let mut model = Master::new(1, now_ms());
    model.settings_mut().eval_lru = eval_lru;
    let mut pair = Pair::new(&server, 2, model);
    let eval = |source: &str| args(&["EVAL", source, "1", "k", "t"]);
    let exists = || {
        let mut words = vec!["SCRIPT".to_string(), "EXISTS".to_string()];
        for source in [
            script::EXTEND_SOURCE,
            script::RELEASE_SOURCE,
            script::FENCE_SOURCE,
            "return 0",
            "return 1",
        ] {
            words.push(String::from_utf8_lossy(Script::new(source).sha()).into_owned());
        }
        words
            .iter()
            .map(|w| w.as_bytes().to_vec())
            .collect::<Vec<_>>()
    };
    let mut i = 0;
    let mut step = |pair: &mut Pair<'_>, command: Vec<Vec<u8>>| {
        pair.check(0, i, A, &command, Check::Exact);
        i += 1;
    };
    step(&mut pair, eval(script::EXTEND_SOURCE));
    step(&mut pair, args(&["SCRIPT", "LOAD", script::FENCE_SOURCE]));
    step(&mut pair, eval(script::RELEASE_SOURCE));
    for n in 0..498 {
        let filler = args(&["EVAL", &format!("return {n}"), "0"]);
        pair.send_real(A, &filler);
        let _ = pair.model.handle_command(now_ms(), pair.ids[A], &filler);
    }
    step(&mut pair, eval(script::RELEASE_SOURCE));
    step(&mut pair, exists());
    let one_more = args(&["EVAL", "return 'one more'", "0"]);
    pair.send_real(A, &one_more);
    let _ = pair.model.handle_command(now_ms(), pair.ids[A], &one_more);
    step(&mut pair, exists());
    step(
        &mut pair,
        args(&[
            "EVALSHA",
            &String::from_utf8_lossy(Script::new(script::EXTEND_SOURCE).sha()),
            "1",
            "k",
            "t",
            "5",
        ]),
    );
    eprintln!(
        "EVAL LRU against {kind}: {}",
        if eval_lru { "evicts" } else { "keeps" }
    );
}

/// `INFO server` has what the client reads (the restart quarantine's
/// `run_id` and `uptime_in_seconds`) on both, in the same form; the
/// values differ (another process, started at another time).
#[test]
fn info_server_has_what_the_client_reads_in_the_same_form() {
    let server = common::master();
    let mut model = Master::new(1, now_ms());
    let info = args(&["INFO", "server"]);
    let real = common::connect(&server).cmd(&[Arg::Bytes(b"INFO"), Arg::Bytes(b"server")]);
    let model = model.handle_command(now_ms(), ConnId(0), &info);
    for (side, reply) in [("model", &model), ("server", &real)] {
        let Reply::Bulk(text) = reply else {
            panic!("{side}: INFO server answered {reply:?}");
        };
        let text = String::from_utf8_lossy(text);
        let field = |name: &str| {
            text.split("\r\n")
                .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
        };
        assert!(text.starts_with("# Server\r\n"), "{side}: {text}");
        let run_id = field("run_id").unwrap_or_default();
        assert!(
            run_id.len() == 40
                && run_id
                    .bytes()
                    .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
            "{side}: run_id {run_id:?}"
        );
        let uptime = field("uptime_in_seconds").and_then(|v| v.parse::<u64>().ok());
        assert!(uptime.is_some(), "{side}: {text}");
        assert!(field("redis_version").is_some(), "{side}: {text}");
    }
}

/// The handshake's `COMMAND DOCS SET DELIFEQ DELEX`: the capabilities a
/// client reads from the model's answer are the server's, nest as deep,
/// and are what the flavour found by probing has. Then every flavour's
/// model, whatever the server: each tells its own capabilities.
#[test]
fn command_docs_tell_the_capabilities_the_server_has() {
    let server = common::master();
    let flavour = server_flavour(&server, None);
    let mut model = Master::new(1, now_ms());
    model.settings_mut().flavour = flavour;
    let mut pair = Pair::new(&server, 2, model);
    let docs = args(&["COMMAND", "DOCS", "SET", "DELIFEQ", "DELEX"]);
    pair.check(0, 0, A, &docs, Check::Capabilities);
    let real = pair.send_real(A, &docs);
    let caps = Capabilities::of(&real);
    assert_eq!(
        caps,
        Some(Capabilities::of_flavour(flavour)),
        "{}: {real:?}",
        server.url()
    );
    for other in Flavour::ALL {
        let mut model = Master::new(1, now_ms());
        model.settings_mut().flavour = other;
        let reply = model.handle_command(now_ms(), ConnId(0), &docs);
        assert_eq!(
            Capabilities::of(&reply),
            Some(Capabilities::of_flavour(other)),
            "{other:?}: {reply:?}"
        );
        assert_eq!(depth(&reply), 6, "{other:?}: SET's IFEQ sits six deep");
    }
    let (kind, _) = server_kind(&server, None);
    eprintln!("COMMAND DOCS against {kind}: {flavour:?}, {caps:?}");
}

/// The least-privileged lock user: no scripting (`-@scripting`)
/// and no `COMMAND`, on the server and on the model as the flavour the
/// server is. Scripts and `COMMAND DOCS` are refused; plain acquires, the
/// native commands where the server has them, and publishing are not.
#[test]
fn a_user_without_scripting_or_command_is_refused_as_on_the_server() {
    let server = common::master();
    let flavour = server_flavour(&server, None);
    let rule = [
        "ACL",
        "SETUSER",
        "r",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-@scripting",
        "-command",
    ];
    let rule: Vec<Arg<'_>> = rule.iter().map(|w| Arg::from(*w)).collect();
    assert_eq!(common::connect(&server).cmd(&rule), common::status("OK"));
    let settings = Settings {
        users: vec![("r".into(), "pw".into())],
        deny_scripting: true,
        deny_command: true,
        flavour,
        ..Settings::default()
    };
    let mut pair = Pair::new(&server, 2, Master::new(1, now_ms()).with_settings(settings));
    let release = Script::new(script::RELEASE_SOURCE);
    let sha = String::from_utf8_lossy(release.sha()).into_owned();
    let steps: Vec<(usize, Vec<Vec<u8>>)> = vec![
        (A, args(&["AUTH", "r", "pw"])),
        (S, args(&["SUBSCRIBE", "redlock:released:r1"])),
        (A, args(&["COMMAND", "DOCS", "SET", "DELIFEQ", "DELEX"])),
        (A, args(&["COMMAND"])),
        (A, args(&["SET", "r1", "t", "NX", "PX", "600000"])),
        (A, args(&["EVAL", script::RELEASE_SOURCE, "1", "r1", "t"])),
        (A, args(&["EVALSHA", &sha, "1", "r1", "t"])),
        (A, args(&["SCRIPT", "LOAD", script::RELEASE_SOURCE])),
        (A, args(&["SCRIPT", "EXISTS", &sha])),
        (A, args(&["SCRIPT", "FLUSH"])),
        (A, args(&["SCRIPT"])),
        (
            A,
            args(&["SET", "r1", "t", "IFEQ", "t", "GET", "PX", "900000"]),
        ),
        (A, args(&["PTTL", "r1"])),
        (A, args(&["DELIFEQ", "r1", "t"])),
        (A, args(&["DELEX", "r1", "IFEQ", "t"])),
        (A, args(&["PUBLISH", "redlock:released:r1", "t"])),
        (A, args(&["DEL", "r1"])),
    ];
    for (i, (conn, command)) in steps.iter().enumerate() {
        let check = if command[0] == b"PTTL" {
            Check::Close(&[-2, -1])
        } else {
            Check::Exact
        };
        pair.check(0, i, *conn, command, check);
    }
    let (kind, _) = server_kind(&server, None);
    eprintln!("no scripting, no COMMAND, against {kind} ({flavour:?})");
    for d in &pair.verdict.divergences {
        eprintln!("  known divergence, compared by code: {d}");
    }
}
