//! Lock+unlock cycles against local masters: redlock-mio beside the
//! physical floor of a one-pass design, in the same run.
//!
//! The **floor** is the minimal blocking fan-out in plain std: N
//! `std::net::TcpStream`s with `TCP_NODELAY`; an acquire writes one
//! `SET key token NX PX 30000`, encoded once, to every socket (one write
//! each), then reads the N replies with blocking reads and wins on a
//! majority of `+OK`; a release does the same with `EVALSHA`. No quorum
//! early return, no timeouts, no retries: two system calls per master per
//! operation. **Ours** is [`Redlock`] with the default configuration but a
//! 200 ms per-instance timeout (the bench machine is noisy), warmed up,
//! one `try_acquire` and one `release` per cycle.
//!
//! Both clients run against the same masters, which this bench starts
//! itself ([`Cluster`], `--save "" --appendonly no`), in alternating
//! slices (floor, ours, ours, floor, ...) after a warm-up, so that noise
//! on a shared machine hits both alike. Only figures from one run are
//! compared. Acquire latency is recorded per successful cycle; failed
//! acquires are counted, never hidden.
//!
//! ```text
//! cargo bench --bench cycle                 # N = 1, 3, 5; about 40 s
//! cargo bench --bench cycle -- --quick      # a few seconds
//! cargo bench --bench cycle -- --budget 20 --slice 250 --ns 3
//! # exactly C cycles of one client, then exit (for strace -c):
//! cycle --client ours|floor --n N --cycles C [--servers URL,...]
//! ```
//!
//! Environment defaults, overridden by the flags: `CYCLE_BUDGET_SECS`,
//! `CYCLE_SLICE_MS`, `CYCLE_NS`.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use redlock_mio::resp::{Arg, Limits, Reply, decode, encode_command};
use redlock_mio::script::{RELEASE_SOURCE, Script};
use redlock_mio::{Config, Lock, Redlock};
use redlock_test::{Cluster, Options};

/// TTL of every lock: long enough that no key expires during a cycle.
const TTL_MS: i64 = 30_000;
/// Per-instance timeout of our client: the default 50 ms would count a
/// scheduling hiccup on a busy 2-core machine as a lost vote.
const PER_INSTANCE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long [`Redlock::warm_up`] may take to connect every master.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(5);
/// A safety net for the floor's blocking sockets, set once at connect (no
/// system call per cycle): a dead master fails the bench instead of
/// hanging it.
const FLOOR_IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The master counts measured by default.
const DEFAULT_NS: &[usize] = &[1, 3, 5];

/// One client able to run lock+unlock cycles.
///
/// The caller times [`Client::acquire`]; a client that succeeds holds the
/// lock until [`Client::release`].
///
/// A batched client (K resources per pass: one write per master carrying
/// K pipelined commands) has `locks_per_cycle() == K`, so that cycles/s
/// reads in locks per second, and its latency is per batch.
trait Client {
    /// Tries to take the lock once; true when it is held afterwards.
    fn acquire(&mut self) -> bool;
    /// Releases the lock taken by the last successful acquire; true when
    /// a quorum confirmed.
    fn release(&mut self) -> bool;
    /// Locks taken by one successful acquire.
    fn locks_per_cycle(&self) -> u64 {
        1
    }
}

/// Which client: the name used on the command line and in the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Floor,
    Ours,
    /// [`Ours`] busy-waiting for replies (`Config::spin`).
    Spin,
    /// K resources locked, then unlocked, per pass.
    Batch16,
    Batch128,
}

impl Kind {
    /// The clients compared by a full run, the reference first.
    fn all() -> &'static [Kind] {
        &[
            Kind::Floor,
            Kind::Ours,
            Kind::Spin,
            Kind::Batch16,
            Kind::Batch128,
        ]
    }

    fn parse(s: &str) -> Option<Kind> {
        match s {
            "floor" => Some(Kind::Floor),
            "ours" => Some(Kind::Ours),
            "spin" => Some(Kind::Spin),
            "batch16" => Some(Kind::Batch16),
            "batch128" => Some(Kind::Batch128),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Floor => "floor",
            Kind::Ours => "ours",
            Kind::Spin => "spin",
            Kind::Batch16 => "batch16",
            Kind::Batch128 => "batch128",
        }
    }

    fn connect(self, addrs: &[SocketAddr]) -> Result<Box<dyn Client>, String> {
        let key = lock_key(self);
        Ok(match self {
            Kind::Floor => Box::new(Floor::connect(addrs, key).map_err(|e| format!("floor: {e}"))?),
            Kind::Ours => Box::new(Ours::connect(addrs, key, false)?),
            Kind::Spin => Box::new(Ours::connect(addrs, key, true)?),
            Kind::Batch16 => Box::new(Batch::connect(addrs, key, 16)?),
            Kind::Batch128 => Box::new(Batch::connect(addrs, key, 128)?),
        })
    }
}

/// A key per client and process, so that the two clients never contend
/// and a leftover key from an earlier run cannot refuse this one. Leaked
/// once, so that handing it to `try_acquire` is a pointer copy.
fn lock_key(kind: Kind) -> Bytes {
    let key = format!("cycle:{}:{}", kind.name(), std::process::id());
    Bytes::from_static(Box::leak(key.into_bytes().into_boxed_slice()))
}

/// The minimal blocking fan-out over std sockets.
struct Floor {
    socks: Vec<TcpStream>,
    /// Bytes read and not yet parsed, per master.
    bufs: Vec<BytesMut>,
    /// The command of the current operation, encoded once for all masters.
    out: BytesMut,
    chunk: [u8; 512],
    limits: Limits,
    sha: [u8; 40],
    key: Bytes,
    token: CounterToken,
}

impl Floor {
    fn connect(addrs: &[SocketAddr], key: Bytes) -> io::Result<Floor> {
        let script = Script::new(RELEASE_SOURCE);
        let mut floor = Floor {
            socks: Vec::with_capacity(addrs.len()),
            bufs: Vec::with_capacity(addrs.len()),
            out: BytesMut::with_capacity(256),
            chunk: [0; 512],
            limits: Limits::default(),
            sha: *script.sha(),
            key,
            token: CounterToken::new()?,
        };
        for addr in addrs {
            let sock = TcpStream::connect_timeout(addr, FLOOR_IO_TIMEOUT)?;
            sock.set_nodelay(true)?;
            sock.set_read_timeout(Some(FLOOR_IO_TIMEOUT))?;
            sock.set_write_timeout(Some(FLOOR_IO_TIMEOUT))?;
            floor.socks.push(sock);
            floor.bufs.push(BytesMut::with_capacity(4096));
        }
        let load = [
            Arg::Bytes(b"SCRIPT"),
            Arg::Bytes(b"LOAD"),
            RELEASE_SOURCE.into(),
        ];
        floor.out.clear();
        encode_command(&mut floor.out, &load);
        floor.fan_out()?;
        for i in 0..floor.socks.len() {
            match floor.read_reply(i)? {
                Reply::Bulk(sha) if sha.as_ref() == floor.sha.as_slice() => {}
                other => return Err(invalid(format!("SCRIPT LOAD answered {other:?}"))),
            }
        }
        Ok(floor)
    }

    /// Writes `out` to every master: one `write` each.
    fn fan_out(&mut self) -> io::Result<()> {
        for sock in &mut self.socks {
            sock.write_all(&self.out)?;
        }
        Ok(())
    }

    /// Reads one whole reply from master `i`: one `read` when it arrives
    /// in one segment, as these small replies do.
    fn read_reply(&mut self, i: usize) -> io::Result<Reply> {
        loop {
            match decode(&mut self.bufs[i], &self.limits) {
                Ok(Some(reply)) => return Ok(reply),
                Ok(None) => {}
                Err(e) => return Err(invalid(e.to_string())),
            }
            match self.socks[i].read(&mut self.chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.bufs[i].extend_from_slice(&self.chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Fans `out` out and counts the replies that `wins`.
    fn round(&mut self, wins: fn(&Reply) -> bool) -> io::Result<bool> {
        self.fan_out()?;
        let mut won = 0;
        for i in 0..self.socks.len() {
            if wins(&self.read_reply(i)?) {
                won += 1;
            }
        }
        Ok(won > self.socks.len() / 2)
    }

    fn try_acquire(&mut self) -> io::Result<bool> {
        self.token.advance();
        self.out.clear();
        let set = [
            Arg::Bytes(b"SET"),
            Arg::Bytes(&self.key),
            Arg::Bytes(self.token.as_bytes()),
            Arg::Bytes(b"NX"),
            Arg::Bytes(b"PX"),
            Arg::Int(TTL_MS),
        ];
        encode_command(&mut self.out, &set);
        self.round(Reply::is_ok)
    }

    fn try_release(&mut self) -> io::Result<bool> {
        self.out.clear();
        let evalsha = [
            Arg::Bytes(b"EVALSHA"),
            Arg::Bytes(&self.sha),
            Arg::Int(1),
            Arg::Bytes(&self.key),
            Arg::Bytes(self.token.as_bytes()),
        ];
        encode_command(&mut self.out, &evalsha);
        self.round(|reply| *reply == Reply::Integer(1))
    }
}

impl Client for Floor {
    fn acquire(&mut self) -> bool {
        self.try_acquire()
            .unwrap_or_else(|e| panic!("floor acquire: {e}"))
    }

    fn release(&mut self) -> bool {
        self.try_release()
            .unwrap_or_else(|e| panic!("floor release: {e}"))
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The floor's tokens: 32 random hex digits drawn once, then a 16-digit
/// counter rewritten in place; 48 bytes, as long as redlock-mio's.
struct CounterToken {
    bytes: [u8; 48],
    counter: u64,
}

impl CounterToken {
    fn new() -> io::Result<CounterToken> {
        let mut seed = [0u8; 16];
        getrandom::fill(&mut seed).map_err(|e| io::Error::other(e.to_string()))?;
        let mut bytes = [b'0'; 48];
        put_hex(&mut bytes[..32], &seed);
        Ok(CounterToken { bytes, counter: 0 })
    }

    fn advance(&mut self) {
        self.counter += 1;
        put_hex(&mut self.bytes[32..], &self.counter.to_be_bytes());
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

fn put_hex(dst: &mut [u8], src: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in dst.chunks_exact_mut(2).zip(src) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
}

/// redlock-mio, one attempt per acquire.
struct Ours {
    client: Redlock,
    key: Bytes,
    held: Option<Lock>,
}

/// A warmed-up client of the masters at `addrs`.
fn redlock(addrs: &[SocketAddr], spin: bool) -> Result<Redlock, String> {
    let urls = addrs.iter().map(|a| format!("redis://{a}"));
    let mut config = Config::new(urls).map_err(|e| format!("ours: {e}"))?;
    config.per_instance_timeout = PER_INSTANCE_TIMEOUT;
    // Masters the bench started empty: no lock predates them.
    config.quarantine = None;
    config.spin = spin;
    let mut client = Redlock::new(config).map_err(|e| format!("ours: {e}"))?;
    let connected = client.warm_up(WARM_UP_TIMEOUT);
    if connected != addrs.len() {
        return Err(format!(
            "ours: {connected} of {} masters connected after {WARM_UP_TIMEOUT:?}",
            addrs.len()
        ));
    }
    Ok(client)
}

/// redlock-mio locking K resources per pass.
struct Batch {
    client: Redlock,
    keys: Vec<Bytes>,
    held: Vec<Lock>,
}

impl Batch {
    fn connect(addrs: &[SocketAddr], key: Bytes, k: usize) -> Result<Batch, String> {
        let keys = (0..k)
            .map(|i| {
                let name = format!("{}:{i}", String::from_utf8_lossy(&key));
                Bytes::from_static(Box::leak(name.into_bytes().into_boxed_slice()))
            })
            .collect();
        Ok(Batch {
            client: redlock(addrs, false)?,
            keys,
            held: Vec::with_capacity(k),
        })
    }
}

impl Client for Batch {
    fn acquire(&mut self) -> bool {
        let ttl = Duration::from_millis(TTL_MS as u64);
        self.held.clear();
        match self
            .client
            .try_acquire_batch(self.keys.iter().cloned(), ttl)
        {
            Ok(results) => self.held.extend(results.into_iter().flatten()),
            Err(_) => return false,
        }
        // A batch counts when every resource was taken.
        self.held.len() == self.keys.len()
    }

    fn release(&mut self) -> bool {
        let all = self
            .client
            .release_batch(&self.held)
            .iter()
            .all(Result::is_ok);
        self.held.clear();
        all
    }

    fn locks_per_cycle(&self) -> u64 {
        self.keys.len() as u64
    }
}

impl Ours {
    fn connect(addrs: &[SocketAddr], key: Bytes, spin: bool) -> Result<Ours, String> {
        Ok(Ours {
            client: redlock(addrs, spin)?,
            key,
            held: None,
        })
    }
}

impl Client for Ours {
    fn acquire(&mut self) -> bool {
        let ttl = Duration::from_millis(TTL_MS as u64);
        self.held = self.client.try_acquire(self.key.clone(), ttl).ok();
        self.held.is_some()
    }

    fn release(&mut self) -> bool {
        match self.held.take() {
            Some(lock) => self.client.release(&lock).is_ok(),
            None => false,
        }
    }
}

/// What one client measured over all its slices.
struct Tally {
    /// Acquire latency of each successful cycle, in nanoseconds.
    acquire_ns: Vec<u64>,
    cycles: u64,
    failed_acquires: u64,
    failed_releases: u64,
    /// Time spent in this client's slices, releases included.
    busy: Duration,
    locks_per_cycle: u64,
}

impl Tally {
    fn new(locks_per_cycle: u64) -> Tally {
        Tally {
            acquire_ns: Vec::with_capacity(1 << 16),
            cycles: 0,
            failed_acquires: 0,
            failed_releases: 0,
            busy: Duration::ZERO,
            locks_per_cycle,
        }
    }

    /// Successful lock+unlock cycles per second of this client's own time,
    /// counted in locks.
    fn cycles_per_sec(&self) -> f64 {
        let ok = self.cycles.saturating_sub(self.failed_acquires);
        (ok * self.locks_per_cycle) as f64 / self.busy.as_secs_f64().max(1e-9)
    }

    /// Nearest-rank percentile of the acquire latency; sorts on first use.
    fn percentile(&mut self, p: f64) -> Duration {
        if self.acquire_ns.is_empty() {
            return Duration::ZERO;
        }
        if !self.acquire_ns.is_sorted() {
            self.acquire_ns.sort_unstable();
        }
        let rank = (p / 100.0 * self.acquire_ns.len() as f64).ceil() as usize;
        Duration::from_nanos(self.acquire_ns[rank.clamp(1, self.acquire_ns.len()) - 1])
    }
}

/// Runs cycles until `stop` says so; records them when `tally` is given.
fn run_cycles(
    client: &mut dyn Client,
    mut tally: Option<&mut Tally>,
    mut stop: impl FnMut(u64, Instant) -> bool,
) {
    let mut done = 0;
    let started = Instant::now();
    let mut now = started;
    while !stop(done, now) {
        let t0 = Instant::now();
        let won = client.acquire();
        let t1 = Instant::now();
        let released = won && client.release();
        now = Instant::now();
        done += 1;
        if let Some(t) = tally.as_deref_mut() {
            t.cycles += 1;
            if won {
                t.acquire_ns.push((t1 - t0).as_nanos() as u64);
                t.failed_releases += u64::from(!released);
            } else {
                t.failed_acquires += 1;
            }
        }
    }
    if let Some(t) = tally {
        t.busy += now - started;
    }
}

/// How a full comparison runs.
#[derive(Debug, Clone)]
struct Plan {
    ns: Vec<usize>,
    /// Measured time per N, shared by the clients.
    budget: Duration,
    slice: Duration,
    /// Unrecorded cycles of each client before measuring.
    warm: Duration,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            ns: DEFAULT_NS.to_vec(),
            budget: Duration::from_secs(20),
            slice: Duration::from_millis(500),
            warm: Duration::from_millis(500),
        }
    }

    fn quick() -> Plan {
        Plan {
            ns: DEFAULT_NS.to_vec(),
            budget: Duration::from_millis(1500),
            slice: Duration::from_millis(250),
            warm: Duration::from_millis(100),
        }
    }
}

/// One N's figures, for the summary.
struct Row {
    n: usize,
    figures: Vec<(Kind, f64, Duration, Duration, u64)>,
}

fn compare(plan: &Plan) -> Result<(), String> {
    let kinds = Kind::all();
    let rounds = (plan.budget.as_secs_f64() / (plan.slice.as_secs_f64() * kinds.len() as f64))
        .round()
        .max(1.0) as usize;
    println!(
        "lock+unlock cycles, {} client(s) interleaved in {} ms slices, {} rounds per N \
         ({:.1} s measured per client), after {} ms warm-up each; acquire latency of \
         successful cycles",
        kinds.len(),
        plan.slice.as_millis(),
        rounds,
        rounds as f64 * plan.slice.as_secs_f64(),
        plan.warm.as_millis()
    );
    let mut rows = Vec::new();
    for &n in &plan.ns {
        let cluster = Cluster::start(n, &Options::new()).map_err(|e| e.to_string())?;
        let addrs = cluster.addrs();
        let mut clients = kinds
            .iter()
            .map(|k| k.connect(&addrs))
            .collect::<Result<Vec<_>, _>>()?;
        let mut tallies: Vec<Tally> = clients
            .iter()
            .map(|c| Tally::new(c.locks_per_cycle()))
            .collect();
        for client in &mut clients {
            let (warm, start) = (plan.warm, Instant::now());
            run_cycles(client.as_mut(), None, |_, now| {
                now.duration_since(start) >= warm
            });
        }
        for round in 0..rounds {
            // Alternate the order (ABBA), so that neither client always
            // follows the other.
            let order: Vec<usize> = if round % 2 == 0 {
                (0..kinds.len()).collect()
            } else {
                (0..kinds.len()).rev().collect()
            };
            for i in order {
                let slice = plan.slice;
                let start = Instant::now();
                run_cycles(clients[i].as_mut(), Some(&mut tallies[i]), |_, now| {
                    now.duration_since(start) >= slice
                });
            }
        }
        drop(clients);
        drop(cluster);
        rows.push(report(n, kinds, &mut tallies));
    }
    summary(&rows);
    Ok(())
}

fn report(n: usize, kinds: &[Kind], tallies: &mut [Tally]) -> Row {
    println!();
    println!("N = {n} (quorum {})", n / 2 + 1);
    println!(
        "  {:<8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "client", "cycles", "cycles/s", "acq p50", "acq p99", "acq max", "acq err", "rel err"
    );
    let mut figures = Vec::new();
    for (kind, t) in kinds.iter().zip(tallies.iter_mut()) {
        let (p50, p99, max) = (t.percentile(50.0), t.percentile(99.0), t.percentile(100.0));
        println!(
            "  {:<8} {:>9} {:>10.0} {:>10} {:>10} {:>10} {:>8} {:>8}",
            kind.name(),
            t.cycles,
            t.cycles_per_sec(),
            Micros(p50),
            Micros(p99),
            Micros(max),
            t.failed_acquires,
            t.failed_releases
        );
        figures.push((*kind, t.cycles_per_sec(), p50, p99, t.cycles));
    }
    let floor = &figures[0];
    for other in &figures[1..] {
        println!(
            "  {:<19} {:>9.2}x {:>9.2}x {:>9.2}x   (cycles/s: higher is better; latency: lower)",
            format!("{}/{}", other.0.name(), floor.0.name()),
            other.1 / floor.1,
            ratio(other.2, floor.2),
            ratio(other.3, floor.3),
        );
    }
    Row { n, figures }
}

fn summary(rows: &[Row]) {
    println!();
    println!("summary (client/floor: cycles/s ratio, acquire p50 and p99 ratios)");
    println!(
        "  {:>2} {:<9} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "N",
        "client",
        "floor cyc/s",
        "cyc/s",
        "floor p50",
        "p50",
        "floor p99",
        "p99",
        "cyc/s x",
        "p50 x",
        "p99 x"
    );
    for row in rows {
        let floor = &row.figures[0];
        for ours in &row.figures[1..] {
            println!(
                "  {:>2} {:<9} {:>12.0} {:>12.0} {:>10} {:>10} {:>10} {:>10} {:>7.2}x {:>7.2}x {:>7.2}x",
                row.n,
                ours.0.name(),
                floor.1,
                ours.1,
                Micros(floor.2),
                Micros(ours.2),
                Micros(floor.3),
                Micros(ours.3),
                ours.1 / floor.1,
                ratio(ours.2, floor.2),
                ratio(ours.3, floor.3),
            );
        }
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-12)
}

/// A duration in microseconds with one decimal.
struct Micros(Duration);

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = format!("{:.1} µs", self.0.as_secs_f64() * 1e6);
        f.pad(&text)
    }
}

/// `--client X --n N --cycles C`: exactly C cycles of one client, for
/// `strace -c`. With `--servers` nothing is spawned and no thread is
/// started, so that the process's own system calls are all there is.
fn single(kind: Kind, n: usize, cycles: u64, servers: Option<Vec<SocketAddr>>) -> ExitCode {
    let (cluster, addrs) = match servers {
        Some(addrs) => (None, addrs),
        None => match Cluster::start(n, &Options::new()) {
            Ok(c) => {
                let addrs = c.addrs();
                (Some(c), addrs)
            }
            Err(e) => return fail(&e.to_string()),
        },
    };
    if addrs.len() != n {
        return fail(&format!("--n {n} but {} servers given", addrs.len()));
    }
    let mut client = match kind.connect(&addrs) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let mut tally = Tally::new(client.locks_per_cycle());
    run_cycles(client.as_mut(), Some(&mut tally), |done, _| done >= cycles);
    drop(client);
    drop(cluster);
    eprintln!(
        "{}: {} cycles against {n} masters in {:.3} s, {} failed acquires, {} failed \
         releases, {} thread(s)",
        kind.name(),
        tally.cycles,
        tally.busy.as_secs_f64(),
        tally.failed_acquires,
        tally.failed_releases,
        thread_count().map_or_else(|| "?".to_string(), |t| t.to_string()),
    );
    if tally.failed_acquires + tally.failed_releases > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Threads of this process, from `/proc/self/task`.
fn thread_count() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/task").ok()?.count())
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("cycle: {msg}");
    ExitCode::FAILURE
}

/// `redis://host:port` or `host:port`.
fn parse_server(s: &str) -> Result<SocketAddr, String> {
    let hostport = s.strip_prefix("redis://").unwrap_or(s);
    hostport
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("bad server {s:?}: want redis://host:port"))
}

fn parse_ns(s: &str) -> Result<Vec<usize>, String> {
    let ns = s
        .split(',')
        .map(|n| n.trim().parse::<usize>().ok().filter(|&n| n > 0))
        .collect::<Option<Vec<_>>>();
    ns.filter(|v| !v.is_empty())
        .ok_or_else(|| format!("bad master counts {s:?}: want e.g. 1,3,5"))
}

const USAGE: &str = "usage: cycle [--quick] [--budget SECS] [--slice MS] [--ns 1,3,5]\n       \
    cycle --client ours|floor --n N --cycles C [--servers URL,...]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("cycle: {msg}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> Result<ExitCode, String> {
    let mut plan = Plan::full();
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut budget = env("CYCLE_BUDGET_SECS");
    let mut slice = env("CYCLE_SLICE_MS");
    let mut ns = env("CYCLE_NS");
    let (mut client, mut n, mut cycles, mut servers) = (None, None, None, None);
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            // `cargo bench` passes --bench to every harness=false target.
            "--bench" => {}
            "--quick" => plan = Plan::quick(),
            "--budget" => budget = Some(value()?),
            "--slice" => slice = Some(value()?),
            "--ns" => ns = Some(value()?),
            "--client" => {
                let v = value()?;
                client = Some(Kind::parse(&v).ok_or_else(|| format!("unknown client {v:?}"))?);
            }
            "--n" => n = Some(value()?.parse::<usize>().map_err(|e| format!("--n: {e}"))?),
            "--cycles" => {
                cycles = Some(
                    value()?
                        .parse::<u64>()
                        .map_err(|e| format!("--cycles: {e}"))?,
                );
            }
            "--servers" => {
                let list = value()?;
                servers = Some(
                    list.split(',')
                        .map(parse_server)
                        .collect::<Result<Vec<_>, _>>()?,
                );
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if let Some(kind) = client {
        let n = n
            .or_else(|| servers.as_ref().map(Vec::len))
            .ok_or("--client needs --n")?;
        let cycles = cycles.ok_or("--client needs --cycles")?;
        return Ok(single(kind, n, cycles, servers));
    }
    if n.is_some() || cycles.is_some() || servers.is_some() {
        return Err("--n, --cycles and --servers go with --client".into());
    }
    if let Some(b) = budget {
        let secs: f64 = b.parse().map_err(|e| format!("budget {b:?}: {e}"))?;
        plan.budget = Duration::try_from_secs_f64(secs).map_err(|e| format!("budget: {e}"))?;
    }
    if let Some(s) = slice {
        let ms: u64 = s.parse().map_err(|e| format!("slice {s:?}: {e}"))?;
        plan.slice = Duration::from_millis(ms.max(1));
    }
    if let Some(list) = ns {
        plan.ns = parse_ns(&list)?;
    }
    compare(&plan)?;
    Ok(ExitCode::SUCCESS)
}
