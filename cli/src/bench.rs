//! `redlock bench`: acquire/release cycles against N masters, with HDR
//! latency histograms.
//!
//! This module owns the measurement: T threads sharing one
//! [`SharedRedlock`] (one event loop pipelining their operations), or with
//! `--client-per-thread` each with its own [`Redlock`]; each thread has its
//! own histograms (merged at the end, so that threads share nothing else
//! but a progress counter); a warm-up that connects every client before
//! the clock starts; and the report. Without
//! `--servers` it starts local masters with [`Cluster`] and stops them at
//! the end, also when interrupted. It never reads `REDLOCK_SERVERS`: a
//! benchmark should not load a deployment because of a variable left in
//! the environment.
//!
//! The headline counts only what happened: locks taken and released.
//! Every attempt that fell short is counted beside it, never in it: failed
//! acquires (the lock held elsewhere: contention) and errors (masters
//! unreachable, slow rounds, failed releases). Only successful operations
//! enter the latency histograms. A batch locks distinct resources, so that
//! it never contends with itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, IsTerminal, Write as _};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use redlock_mio::{Config, Error, LockCommands, Redlock, Retry, SharedRedlock, TlsConfig};
use redlock_test::{Cluster, Options};

use crate::caller::{Client, Pick};
use crate::exit::{self, Failure};
use crate::signals::Signals;
use crate::{Quarantine, parse_duration, say};

pub const LONG_ABOUT: &str = "Measure acquire and release latency and throughput.\n\n\
    T threads share one client (one event loop that pipelines their operations \
    into one write per master; --client-per-thread gives each thread its own \
    client and connections instead), and each repeats: try to acquire a resource \
    (one attempt, no retry), release it. Acquire and release are timed apart into \
    HDR histograms (microseconds). Resources are drawn from R names; the default, \
    one per thread (bench:0, bench:1, ...), means no contention, and a small R \
    means a lot. The headline counts locks taken and released; failed acquires \
    (contention) and errors are counted beside it, never in it. With --batch K, \
    each batch draws K distinct resources, so R must be at least K.\n\n\
    Without --servers, N local redis-server masters are started on free loopback \
    ports (--spawn N, default 3) and stopped at the end, so that \
    `cargo run --release -- bench` works on any machine with redis-server \
    installed. REDLOCK_SERVERS is not read here.";

/// Latencies are recorded in microseconds, up to an hour.
const HIGHEST_US: u64 = 3_600_000_000;
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);
/// Pause after an error, so that an unreachable quorum is not spun on.
const ERROR_PAUSE: Duration = Duration::from_millis(5);
/// Width of the bars of the text histogram.
const BAR_WIDTH: u64 = 40;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Start N local masters [default: 3, when --servers is not given]
    #[arg(long, value_name = "N")]
    spawn: Option<usize>,

    /// How long to measure
    #[arg(short, long, value_name = "D", default_value = "5s", value_parser = parse_duration)]
    duration: Duration,

    /// Caller threads, sharing one client unless --client-per-thread
    #[arg(short, long, value_name = "T", default_value_t = 4)]
    threads: usize,

    /// Give each thread its own client and connections (no pipelining
    /// between threads) instead of one shared client
    #[arg(long, conflicts_with = "tasks")]
    client_per_thread: bool,

    /// Instead of threads, C concurrent async callers (futures) on one
    /// thread, sharing one client; resources default to one per caller
    #[arg(long, value_name = "C", conflicts_with_all = ["threads", "batch"])]
    tasks: Option<usize>,

    /// Resource names to draw from [default: one per thread, or one per
    /// batch slot]; at least --batch
    #[arg(short, long, value_name = "R")]
    resources: Option<usize>,

    /// TTL of each lock
    #[arg(long, value_name = "D", default_value = "10s", value_parser = parse_duration)]
    ttl: Duration,

    /// Print one JSON object on stdout instead of the report
    #[arg(long)]
    json: bool,

    /// Lock K resources per pass (one write per master carrying K
    /// commands), then release them in one pass; latencies are per batch
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch: u32,

    /// Hold each lock this long before releasing it, and wait for a held
    /// lock (retrying as the client's retry policy says, until the run
    /// ends) instead of counting it as contention: critical sections per
    /// second, how long each waited, and each thread's share
    #[arg(long, value_name = "D", value_parser = parse_duration, conflicts_with_all = ["batch", "tasks"])]
    hold: Option<Duration>,

    /// With --hold: the wait between attempts on a held lock with
    /// --wait-mode poll, and after an error in either mode (each wait
    /// uniform in [D/2, D])
    #[arg(long, value_name = "D", default_value = "200ms", value_parser = parse_duration)]
    retry_delay: Duration,

    /// How a waiting acquire (--hold) waits for a held lock: notify tries
    /// again when the holder's release is published or its key expires
    /// (the shared client subscribes to the release channel; a per-thread
    /// client only learns the expiry), poll every --retry-delay
    #[arg(long, value_enum, value_name = "MODE", default_value_t = WaitMode::Notify)]
    wait_mode: WaitMode,

    /// With --wait-mode notify: once woken, wait a random time in [0, D]
    /// (less the longer a waiter has waited) before trying, so that
    /// waiters in several processes do not all try at once [default: the
    /// library's, 300us]
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    wake_spread: Option<Duration>,

    /// With --wait-mode notify: how many times in a row a lock released
    /// while another thread of this process waits for it is handed over
    /// in-process before its release is announced to every process (0:
    /// never) [default: the library's, 8]
    #[arg(long, value_name = "N")]
    local_handovers: Option<u32>,

    /// With --wait-mode notify: how long a row of in-process hand-overs
    /// may last before the lock's release is announced to every process
    /// [default: the library's, 2ms]
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    local_handover_window: Option<Duration>,

    /// How long a release of a lock passing between this process's
    /// threads, with none of them waiting for it, waits for one before it
    /// is announced [default: the library's, 100us; 0 turns it off]
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    local_handover_linger: Option<Duration>,

    /// Busy-wait for replies instead of sleeping in epoll (lower latency,
    /// one core per thread; per-thread clients only)
    #[arg(long)]
    spin: bool,

    // Boxed: the open-loop flags are many, and Command's variants stay
    // of a size.
    #[command(flatten)]
    open_loop: Box<crate::openloop::RateArgs>,
}

/// How a waiting acquire waits for a held lock: `Config::wake_on_release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum WaitMode {
    /// Woken by the holder's release or at its key's expiry.
    Notify,
    /// An attempt every retry delay.
    Poll,
}

impl WaitMode {
    fn name(self) -> &'static str {
        match self {
            WaitMode::Notify => "notify",
            WaitMode::Poll => "poll",
        }
    }
}

/// What one thread measured; merged into one at the end.
#[derive(Debug)]
struct Tally {
    acquire: Histogram<u64>,
    release: Histogram<u64>,
    /// Locks tried: each resource of a batch counts.
    attempts: u64,
    /// Locks taken and released: the headline.
    cycles: u64,
    /// Locks held elsewhere (contention).
    acquire_failed: u64,
    /// Errors by kind ("acquire: quorum unreachable"): count and the
    /// first message.
    errors: BTreeMap<String, (u64, String)>,
    /// With `--hold`: how long each acquire waited for the lock, from its
    /// first attempt until it was taken, or until the end of the run for
    /// a wait still open then.
    wait: Histogram<u64>,
    /// With `--hold`: waits still open when the run ended (counted in
    /// `wait` up to the end).
    open_waits: u64,
    /// Locks taken and released by each thread, in thread order.
    per_thread: Vec<u64>,
}

impl Tally {
    fn new() -> Tally {
        let histogram = || {
            Histogram::new_with_bounds(1, HIGHEST_US, 3)
                .unwrap_or_else(|e| unreachable!("constant histogram bounds: {e}"))
        };
        Tally {
            acquire: histogram(),
            release: histogram(),
            attempts: 0,
            cycles: 0,
            acquire_failed: 0,
            errors: BTreeMap::new(),
            wait: histogram(),
            open_waits: 0,
            per_thread: Vec::new(),
        }
    }

    fn error(&mut self, op: &str, error: &Error) {
        self.errors_of(op, error, 1);
    }

    /// Counts `n` attempts that failed with `error`.
    fn errors_of(&mut self, op: &str, error: &Error, n: u64) {
        let kind = match error {
            Error::Held(_) => "held",
            Error::NotHeld(_) => "not held",
            Error::NoQuorum(_) => "quorum unreachable",
            Error::Protocol(_) => "protocol error",
            Error::ValidityExpired(_) => "validity used up",
            Error::Config(_) => "invalid setting",
            Error::Os(_) => "OS error",
            _ => "other error",
        };
        self.errors
            .entry(format!("{op}: {kind}"))
            .or_insert_with(|| (0, error.to_string()))
            .0 += n;
    }

    fn error_count(&self) -> u64 {
        self.errors.values().map(|(n, _)| n).sum()
    }

    fn merge(&mut self, other: Tally) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.acquire.add(&other.acquire);
        let _ = self.release.add(&other.release);
        let _ = self.wait.add(&other.wait);
        self.attempts += other.attempts;
        self.cycles += other.cycles;
        self.acquire_failed += other.acquire_failed;
        self.open_waits += other.open_waits;
        self.per_thread.extend(other.per_thread);
        for (kind, (n, message)) in other.errors {
            self.errors.entry(kind).or_insert((0, message)).0 += n;
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Where the masters came from, for the report.
struct Setup {
    masters: usize,
    spawned: bool,
    /// Masters spoken to over TLS (`rediss://`).
    tls_masters: usize,
    quorum: usize,
    /// The woken waiters' spread in force (`--wake-spread`, else the
    /// library's default); `None` when waiters poll.
    wake_spread: Option<Duration>,
}

/// Runs `redlock bench`.
///
/// # Errors
/// Usage errors, masters that cannot be started, a client that cannot be
/// made, or a report that cannot be written.
/// `timeout` replaces the library's per-master timeout when given, and
/// `connect_timeout` its connect timeout.
pub fn bench(
    servers: &[String],
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    quarantine: Quarantine,
    tls: &TlsConfig,
    lock_commands: LockCommands,
    args: &BenchArgs,
) -> Result<u8, Failure> {
    if args.threads == 0
        || args.resources == Some(0)
        || args.spawn == Some(0)
        || args.tasks == Some(0)
    {
        return Err(Failure::usage(
            "--threads, --tasks, --resources and --spawn must be at least 1",
        ));
    }
    if args.duration.is_zero() {
        return Err(Failure::usage("--duration must be more than zero"));
    }
    if let Some(r) = args.resources
        && r < args.batch as usize
    {
        // Refused rather than clamped: a batch locks distinct resources,
        // and quietly measuring smaller batches than asked would mislead.
        return Err(Failure::usage(format!(
            "--resources {r} is fewer than --batch {}: a batch locks distinct resources; \
             give --resources {} or more, or a smaller --batch",
            args.batch, args.batch
        )));
    }
    if args.wait_mode == WaitMode::Poll && args.wake_spread.is_some() {
        return Err(Failure::usage(
            "--wake-spread applies to --wait-mode notify: a polling waiter is never woken",
        ));
    }
    if args.wait_mode == WaitMode::Poll
        && (args.local_handovers.is_some()
            || args.local_handover_window.is_some()
            || args.local_handover_linger.is_some())
    {
        return Err(Failure::usage(
            "--local-handovers, --local-handover-window and --local-handover-linger apply to \
             --wait-mode notify: a polling waiter is never handed a lock",
        ));
    }
    let given: Vec<String> = servers
        .iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if !given.is_empty() && args.spawn.is_some() {
        return Err(Failure::usage("give --servers or --spawn, not both"));
    }
    // Before any master is started: an interrupted bench must still stop
    // the masters it started, which happens when `cluster` is dropped.
    let signals = Signals::install(&[libc::SIGINT, libc::SIGTERM])
        .map_err(|e| Failure::new(exit::OSERR, format!("cannot install signal handlers: {e}")))?;
    let (cluster, urls) = if given.is_empty() {
        let n = args.spawn.unwrap_or(3);
        say(&format!("starting {n} local redis-server masters"));
        let cluster = Cluster::start(n, &Options::new()).map_err(|e| {
            Failure::new(
                exit::UNAVAILABLE,
                format!("cannot start local masters: {}", one_line(&e.to_string())),
            )
        })?;
        let urls = cluster.urls();
        (Some(cluster), urls)
    } else {
        (None, given)
    };
    let mut config = crate::config(&urls, tls, lock_commands)?;
    if cluster.is_some() && config.tls != TlsConfig::default() {
        // Said rather than refused: the flags may come from the
        // environment, set for other commands.
        say("the TLS flags apply to rediss:// masters; the local masters speak plain TCP");
    }
    if let Some(timeout) = timeout {
        config.per_instance_timeout = timeout;
    }
    if let Some(connect_timeout) = connect_timeout {
        config.connect_timeout = connect_timeout;
    }
    config.spin = args.spin;
    config.wake_on_release = args.wait_mode == WaitMode::Notify;
    if let Some(spread) = args.wake_spread {
        config.wake_spread = spread;
    }
    if let Some(handovers) = args.local_handovers {
        config.local_handovers = handovers;
    }
    if let Some(window) = args.local_handover_window {
        config.local_handover_window = window;
    }
    if let Some(linger) = args.local_handover_linger {
        config.local_handover_linger = linger;
    }
    quarantine.apply(&mut config);
    if cluster.is_some() {
        // Masters this run started empty hold no lock from before their
        // start: there is nothing for restart quarantine to protect.
        config.quarantine = None;
    }
    let setup = Setup {
        masters: urls.len(),
        spawned: cluster.is_some(),
        tls_masters: config.servers.iter().filter(|s| s.tls).count(),
        quorum: urls.len() / 2 + 1,
        wake_spread: config.wake_on_release.then_some(config.wake_spread),
    };
    if let Some(plan) = args.open_loop.plan()? {
        let shape = crate::openloop::Shape {
            threads: args.threads,
            client_per_thread: args.client_per_thread,
            tasks: args.tasks,
            resources: args.resources,
            ttl: args.ttl,
            hold: args.hold,
            retry_delay: args.retry_delay,
            batch: args.batch,
            duration: args.duration,
            json: args.json,
        };
        let masters = crate::openloop::Masters {
            count: setup.masters,
            spawned: setup.spawned,
            tls: setup.tls_masters,
            quorum: setup.quorum,
        };
        let outcome = crate::openloop::bench(&config, &shape, &plan, &masters, &signals);
        drop(cluster);
        let (report, code) = outcome?;
        io::stdout()
            .lock()
            .write_all(report.as_bytes())
            .map_err(|e| Failure::new(exit::OSERR, format!("cannot write the report: {e}")))?;
        return Ok(code);
    }
    let (tally, elapsed, interrupted) = match args.tasks {
        Some(tasks) => measure_tasks(&config, args, tasks, &signals)?,
        None => measure(&config, args, &signals)?,
    };
    drop(cluster);
    let report = if args.json {
        json_report(&setup, args, &tally, elapsed, interrupted)
    } else {
        text_report(&setup, args, &tally, elapsed, interrupted)
    };
    io::stdout()
        .lock()
        .write_all(report.as_bytes())
        .map_err(|e| Failure::new(exit::OSERR, format!("cannot write the report: {e}")))?;
    if let Some(signal) = interrupted {
        return Ok(u8::try_from(128 + signal).unwrap_or(exit::SOFTWARE));
    }
    if tally.cycles == 0 && tally.error_count() > 0 {
        return Ok(exit::UNAVAILABLE);
    }
    Ok(exit::OK)
}

/// The first line of a multi-line message, with the last line of what
/// followed (a server log's tail, say) appended.
fn one_line(message: &str) -> String {
    let mut lines = message.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or_default().to_owned();
    match lines.next_back() {
        Some(last) => format!("{first} {last}"),
        None => first,
    }
}

/// Runs the threads; the merged tally, the time measured, and the signal
/// that cut it short, if one did.
fn measure(
    config: &Config,
    args: &BenchArgs,
    signals: &Signals,
) -> Result<(Tally, Duration, Option<i32>), Failure> {
    let stop = AtomicBool::new(false);
    let progress = AtomicU64::new(0);
    let start = Barrier::new(args.threads + 1);
    let draw = io::stderr().is_terminal();
    let shared = if args.client_per_thread {
        None
    } else {
        let shared = SharedRedlock::new(config.clone())
            .map_err(|e| exit::lock_error("cannot make a client", &e, exit::SOFTWARE))?;
        Some(shared)
    };
    thread::scope(|scope| {
        let workers: Vec<_> = (0..args.threads)
            .map(|index| {
                let (stop, progress, start) = (&stop, &progress, &start);
                let client = match &shared {
                    Some(shared) => Ok(Client::Shared(shared.clone())),
                    None => Redlock::new(config.clone()).map(Client::Own),
                };
                scope.spawn(move || worker(index, client, args, start, stop, progress))
            })
            .collect();
        start.wait();
        let began = Instant::now();
        let interrupted = wait_for_the_end(args, signals, began, &progress, draw);
        stop.store(true, Ordering::Relaxed);
        let mut total = Tally::new();
        let mut failure = None;
        for handle in workers {
            match handle.join() {
                Ok(Ok(mut tally)) => {
                    tally.per_thread.push(tally.cycles);
                    total.merge(tally);
                }
                Ok(Err(e)) => failure = Some(e),
                Err(_) => failure = Some(Failure::new(exit::SOFTWARE, "a bench thread panicked")),
            }
        }
        let elapsed = began.elapsed();
        if draw {
            let _ = write!(io::stderr().lock(), "\r{:78}\r", "");
        }
        match failure {
            Some(e) => Err(e),
            None => Ok((total, elapsed, interrupted)),
        }
    })
}

/// Runs `tasks` async callers on one executor thread sharing one client:
/// each loops as a thread of [`measure`] does, awaiting the client's
/// futures. The merged tally, the time measured, and the signal that cut
/// it short, if one did.
fn measure_tasks(
    config: &Config,
    args: &BenchArgs,
    tasks: usize,
    signals: &Signals,
) -> Result<(Tally, Duration, Option<i32>), Failure> {
    let shared = SharedRedlock::new(config.clone())
        .map_err(|e| exit::lock_error("cannot make a client", &e, exit::SOFTWARE))?;
    let names: Vec<Bytes> = match args.resources {
        None => (0..tasks)
            .map(|i| Bytes::from(format!("bench:{i}")))
            .collect(),
        Some(r) => (0..r).map(|i| Bytes::from(format!("bench:{i}"))).collect(),
    };
    // Warm-up: connect to every master (and load the scripts).
    if let Ok(lock) = shared.try_acquire(names[0].clone(), args.ttl) {
        let _ = shared.release(&lock);
    }
    let stop = AtomicBool::new(false);
    let progress = AtomicU64::new(0);
    let draw = io::stderr().is_terminal();
    let began = Instant::now();
    thread::scope(|scope| {
        let executor = scope.spawn(|| {
            let tally = std::cell::RefCell::new(Tally::new());
            let futures: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>> = (0
                ..tasks)
                .map(|index| {
                    let (shared, names, tally, stop, progress) =
                        (&shared, &names, &tally, &stop, &progress);
                    Box::pin(async move {
                        let mut pick = Pick((index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                        while !stop.load(Ordering::Relaxed) {
                            let resource = if args.resources.is_none() {
                                names[index % names.len()].clone()
                            } else {
                                names[pick.below(names.len())].clone()
                            };
                            let t0 = Instant::now();
                            let acquired = shared.try_acquire_async(resource, args.ttl).await;
                            let t1 = Instant::now();
                            tally.borrow_mut().attempts += 1;
                            match acquired {
                                Ok(lock) => {
                                    let released = shared.release_async(&lock).await;
                                    let t2 = Instant::now();
                                    let mut tally = tally.borrow_mut();
                                    tally.acquire.saturating_record(micros(t1 - t0));
                                    match released {
                                        Ok(()) => {
                                            tally.release.saturating_record(micros(t2 - t1));
                                            tally.cycles += 1;
                                            progress.fetch_add(1, Ordering::Relaxed);
                                        }
                                        Err(e) => tally.error("release", &e),
                                    }
                                }
                                Err(Error::Held(_)) => tally.borrow_mut().acquire_failed += 1,
                                Err(e) => tally.borrow_mut().error("acquire", &e),
                            }
                        }
                    })
                        as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>
                })
                .collect();
            crate::tasks::run_all(futures);
            tally.into_inner()
        });
        let interrupted = wait_for_the_end(args, signals, began, &progress, draw);
        stop.store(true, Ordering::Relaxed);
        let tally = executor
            .join()
            .map_err(|_| Failure::new(exit::SOFTWARE, "the bench executor panicked"))?;
        let elapsed = began.elapsed();
        if draw {
            let _ = write!(io::stderr().lock(), "\r{:78}\r", "");
        }
        Ok((tally, elapsed, interrupted))
    })
}

/// Waits until `--duration` has passed since `began` or SIGINT/SIGTERM
/// came (returned), redrawing the progress line meanwhile when `draw`.
fn wait_for_the_end(
    args: &BenchArgs,
    signals: &Signals,
    began: Instant,
    progress: &AtomicU64,
    draw: bool,
) -> Option<i32> {
    // No end an Instant can hold: measure until interrupted.
    let deadline = began.checked_add(args.duration);
    loop {
        let now = Instant::now();
        let left = deadline.map_or(PROGRESS_EVERY, |d| d.saturating_duration_since(now));
        if left.is_zero() {
            return None;
        }
        signals.wait(PROGRESS_EVERY.min(left));
        let pending = signals.take();
        if let Some(&signal) = [libc::SIGINT, libc::SIGTERM]
            .iter()
            .find(|&&s| pending.contains(s))
        {
            return Some(signal);
        }
        if draw {
            draw_progress(
                began.elapsed(),
                args.duration,
                progress.load(Ordering::Relaxed),
            );
        }
    }
}

fn draw_progress(elapsed: Duration, total: Duration, cycles: u64) {
    let done = (elapsed.as_secs_f64() / total.as_secs_f64()).clamp(0.0, 1.0);
    let width = 30;
    let filled = (done * f64::from(width)).round() as usize;
    let rate = cycles as f64 / elapsed.as_secs_f64().max(1e-9);
    let _ = write!(
        io::stderr().lock(),
        "\r[{}{}] {:5.1}s/{:.1}s {:>10} locks {:>9.0}/s ",
        "#".repeat(filled),
        ".".repeat(width as usize - filled),
        elapsed.as_secs_f64(),
        total.as_secs_f64(),
        cycles,
        rate
    );
}

fn worker(
    index: usize,
    client: Result<Client, Error>,
    args: &BenchArgs,
    start: &Barrier,
    stop: &AtomicBool,
    progress: &AtomicU64,
) -> Result<Tally, Failure> {
    // Every thread must reach the barrier, even one that cannot work.
    let batch = args.batch as usize;
    let names: Vec<Bytes> = match args.resources {
        None if batch == 1 => vec![Bytes::from(format!("bench:{index}"))],
        None => (0..batch)
            .map(|j| Bytes::from(format!("bench:{index}:{j}")))
            .collect(),
        Some(r) => (0..r).map(|i| Bytes::from(format!("bench:{i}"))).collect(),
    };
    let mut client = match client {
        Ok(mut client) => {
            // Warm-up: connect to every master (and load the scripts)
            // before the clock starts.
            if let Ok(lock) = client.try_acquire(names[index % names.len()].clone(), args.ttl) {
                let _ = client.release(&lock);
            }
            start.wait();
            client
        }
        Err(e) => {
            start.wait();
            return Err(exit::lock_error("cannot make a client", &e, exit::SOFTWARE));
        }
    };
    let mut tally = Tally::new();
    // Odd, hence never the all-zero state xorshift cannot leave.
    let mut pick = Pick((index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    if let Some(hold) = args.hold {
        hold_cycles(
            &mut client,
            &names,
            &mut pick,
            hold,
            args,
            &mut tally,
            stop,
            progress,
        );
        return Ok(tally);
    }
    if batch > 1 {
        // A batch never names one resource twice: it would contend with
        // itself, and count as contention what no other client caused.
        let mut order = names;
        while !stop.load(Ordering::Relaxed) {
            let chosen = pick.distinct(&mut order, batch);
            batch_cycle(&mut client, chosen, args.ttl, &mut tally, progress);
        }
        return Ok(tally);
    }
    while !stop.load(Ordering::Relaxed) {
        let resource = pick.resource(&names);
        tally.attempts += 1;
        let t0 = Instant::now();
        let acquired = client.try_acquire(resource, args.ttl);
        let t1 = Instant::now();
        match acquired {
            Ok(lock) => {
                tally.acquire.saturating_record(micros(t1 - t0));
                let released = client.release(&lock);
                let t2 = Instant::now();
                match released {
                    Ok(()) => {
                        tally.release.saturating_record(micros(t2 - t1));
                        tally.cycles += 1;
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        tally.error("release", &e);
                        thread::sleep(ERROR_PAUSE);
                    }
                }
            }
            Err(Error::Held(_)) => tally.acquire_failed += 1,
            Err(e) => {
                tally.error("acquire", &e);
                thread::sleep(ERROR_PAUSE);
            }
        }
    }
    Ok(tally)
}

/// `--hold D`: acquire (waiting for a held lock, retrying as the client's
/// policy says, until the run ends), hold D, release; each wait recorded
/// from the first attempt. A wait the end of the run cuts short is
/// recorded up to then and counted as open.
#[allow(clippy::too_many_arguments)]
fn hold_cycles(
    client: &mut Client,
    names: &[Bytes],
    pick: &mut Pick,
    hold: Duration,
    args: &BenchArgs,
    tally: &mut Tally,
    stop: &AtomicBool,
    progress: &AtomicU64,
) {
    // The run's end, as this thread sees it (it starts with the others).
    let end = Instant::now().checked_add(args.duration);
    let delay = args.retry_delay;
    while !stop.load(Ordering::Relaxed) {
        let resource = pick.resource(names);
        tally.attempts += 1;
        let t0 = Instant::now();
        let retry = Retry::default()
            .with_attempts(u32::MAX)
            .with_delay(delay)
            .with_max_wait(end.map(|end| end.saturating_duration_since(t0)));
        let acquired = client.acquire_with(resource, args.ttl, &retry);
        let t1 = Instant::now();
        match acquired {
            Ok(lock) => {
                tally.wait.saturating_record(micros(t1 - t0));
                tally.acquire.saturating_record(micros(t1 - t0));
                thread::sleep(hold);
                let t2 = Instant::now();
                match client.release(&lock) {
                    Ok(()) => {
                        tally.release.saturating_record(micros(t2.elapsed()));
                        tally.cycles += 1;
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tally.error("release", &e),
                }
            }
            // Still waiting when the run ended, or when its next retry
            // would come after the end: an open wait, and this thread's
            // last.
            Err(_)
                if stop.load(Ordering::Relaxed)
                    || end.is_some_and(|end| t1.checked_add(delay).is_none_or(|t| t >= end)) =>
            {
                tally.wait.saturating_record(micros(t1 - t0));
                tally.open_waits += 1;
                return;
            }
            Err(Error::Held(_)) => tally.acquire_failed += 1,
            Err(e) => {
                tally.error("acquire", &e);
                thread::sleep(ERROR_PAUSE);
            }
        }
    }
}

/// One batch: lock every resource in one pass, release those taken in one
/// pass. Each resource is an attempt, and each lock taken and released one
/// cycle; latencies are per batch.
fn batch_cycle(
    client: &mut Client,
    resources: &[Bytes],
    ttl: Duration,
    tally: &mut Tally,
    progress: &AtomicU64,
) {
    let tries = resources.len() as u64;
    tally.attempts += tries;
    let t0 = Instant::now();
    let acquired = client.try_acquire_batch(resources, ttl);
    let t1 = Instant::now();
    let results = match acquired {
        Ok(results) => results,
        Err(e) => {
            tally.errors_of("acquire", &e, tries);
            thread::sleep(ERROR_PAUSE);
            return;
        }
    };
    tally.acquire.saturating_record(micros(t1 - t0));
    let mut locks = Vec::with_capacity(results.len());
    let mut failed = false;
    for result in results {
        match result {
            Ok(lock) => locks.push(lock),
            Err(Error::Held(_)) => tally.acquire_failed += 1,
            Err(e) => {
                tally.error("acquire", &e);
                failed = true;
            }
        }
    }
    if !locks.is_empty() {
        let released = client.release_batch(&locks);
        tally.release.saturating_record(micros(t1.elapsed()));
        for result in released {
            match result {
                Ok(()) => {
                    tally.cycles += 1;
                    progress.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tally.error("release", &e);
                    failed = true;
                }
            }
        }
    }
    if failed {
        thread::sleep(ERROR_PAUSE);
    }
}

/// p50, p90, p99, p99.9, max.
fn percentiles(h: &Histogram<u64>) -> [u64; 5] {
    if h.is_empty() {
        return [0; 5];
    }
    [
        h.value_at_quantile(0.50),
        h.value_at_quantile(0.90),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max(),
    ]
}

fn rate(cycles: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        cycles as f64 / secs
    } else {
        0.0
    }
}

/// How many resource names the threads draw from: `--resources`, else
/// one per thread (one per batch slot with `--batch`), as `worker` names
/// them.
fn resource_count(args: &BenchArgs) -> usize {
    let callers = args.tasks.unwrap_or(args.threads);
    args.resources.unwrap_or(callers * args.batch as usize)
}

fn json_report(
    setup: &Setup,
    args: &BenchArgs,
    tally: &Tally,
    elapsed: Duration,
    interrupted: Option<i32>,
) -> String {
    let latency = |h: &Histogram<u64>| {
        let [p50, p90, p99, p999, max] = percentiles(h);
        serde_json::json!({
            "count": h.len(), "p50": p50, "p90": p90, "p99": p99, "p999": p999, "max": max,
            "mean": if h.is_empty() { 0.0 } else { h.mean() },
        })
    };
    let errors: serde_json::Map<String, serde_json::Value> = tally
        .errors
        .iter()
        .map(|(kind, (n, _))| (kind.clone(), serde_json::Value::from(*n)))
        .collect();
    let value = serde_json::json!({
        "masters": setup.masters,
        "spawned": setup.spawned,
        "tls_masters": setup.tls_masters,
        "quorum": setup.quorum,
        "threads": args.threads,
        "client": if args.client_per_thread { "per-thread" } else { "shared" },
        "tasks": args.tasks,
        "resources": resource_count(args),
        "ttl_ms": u64::try_from(args.ttl.as_millis()).unwrap_or(u64::MAX),
        "batch": args.batch,
        "spin": args.spin,
        "duration_s": elapsed.as_secs_f64(),
        "interrupted": interrupted.is_some(),
        "attempts": tally.attempts,
        "cycles": tally.cycles,
        "cycles_per_sec": rate(tally.cycles, elapsed),
        "failed_attempts": tally.attempts.saturating_sub(tally.cycles),
        "acquire_failed": tally.acquire_failed,
        "errors": tally.error_count(),
        "errors_by_kind": errors,
        "acquire_us": latency(&tally.acquire),
        "release_us": latency(&tally.release),
        "hold_ms": args.hold.map(|h| h.as_secs_f64() * 1000.0),
        "wait_mode": args.wait_mode.name(),
        "wake_spread_us": setup.wake_spread.map(micros),
        "wait_us": args.hold.map(|_| {
            let mut wait = latency(&tally.wait);
            wait["open"] = serde_json::Value::from(tally.open_waits);
            wait
        }),
        "shares": shares(tally),
    });
    format!("{value}\n")
}

/// Each thread's share of the locks taken and released, in thread order.
fn shares(tally: &Tally) -> Vec<f64> {
    let total = tally.per_thread.iter().sum::<u64>().max(1) as f64;
    tally.per_thread.iter().map(|&n| n as f64 / total).collect()
}

fn text_report(
    setup: &Setup,
    args: &BenchArgs,
    tally: &Tally,
    elapsed: Duration,
    interrupted: Option<i32>,
) -> String {
    let mut out = String::new();
    let all = counted(resource_count(args), "resource");
    let resources = match args.resources {
        None if args.batch == 1 => format!("{all} (one per thread)"),
        None => format!("{all} ({} per thread)", args.batch),
        Some(_) => format!("{all} shared by the threads"),
    };
    let origin = if setup.spawned {
        "local, started for this run"
    } else {
        "from --servers"
    };
    let origin = match setup.tls_masters {
        0 => origin.to_owned(),
        k if k == setup.masters => format!("{origin}, over TLS"),
        k => format!("{origin}, {k} over TLS"),
    };
    let _ = writeln!(
        out,
        "redlock bench: {} ({origin}), quorum {}, {}, {}, ttl {}",
        counted(setup.masters, "master"),
        setup.quorum,
        counted(args.threads, "thread"),
        resources,
        humantime::format_duration(args.ttl),
    );
    let mut modes = vec![if let Some(tasks) = args.tasks {
        format!("{tasks} async callers on one thread, one shared client")
    } else if args.client_per_thread {
        "one client per thread".to_owned()
    } else {
        "one shared client (one event loop) for all threads".to_owned()
    }];
    if args.batch > 1 {
        modes.push(format!(
            "batches of {} locks per pass; latencies are per batch",
            args.batch
        ));
    }
    if args.spin && args.client_per_thread {
        modes.push("spin mode (busy-wait for replies)".to_owned());
    }
    let _ = writeln!(out, "{}", modes.join("; "));
    if interrupted.is_some() {
        let _ = writeln!(
            out,
            "interrupted: the figures cover the time measured until then"
        );
    }
    let _ = writeln!(
        out,
        "{:.2} s: {} locks taken and released, {:.0}/s",
        elapsed.as_secs_f64(),
        tally.cycles,
        rate(tally.cycles, elapsed)
    );
    let _ = writeln!(
        out,
        "failed attempts: {} of {} (held elsewhere: {}; errors: {})",
        tally.attempts.saturating_sub(tally.cycles),
        tally.attempts,
        tally.acquire_failed,
        tally.error_count()
    );
    for (kind, (n, message)) in &tally.errors {
        let _ = writeln!(out, "  {kind}: {n}, first: {message}");
    }
    if let Some(hold) = args.hold {
        let [p50, p90, p99, _, max] = percentiles(&tally.wait);
        let waiting = match setup.wake_spread {
            Some(spread) if spread.is_zero() => {
                "notify (woken by the holder's release or its key's expiry)".to_owned()
            }
            Some(spread) => format!(
                "notify (woken by the holder's release or its key's expiry, then a random \
                 wait of up to {})",
                humantime::format_duration(spread)
            ),
            None => format!(
                "poll (an attempt every {} or so)",
                humantime::format_duration(args.retry_delay)
            ),
        };
        let _ = writeln!(out, "waiting for a held lock: {waiting}");
        let _ = writeln!(
            out,
            "each lock held {}; wait for the lock (µs): p50 {p50}, p90 {p90}, p99 {p99}, max {max} \
             ({} waits still open at the end, counted until then)",
            humantime::format_duration(hold),
            tally.open_waits
        );
        let shares: Vec<String> = shares(tally)
            .iter()
            .enumerate()
            .map(|(i, share)| format!("thread {i} {:.1}%", share * 100.0))
            .collect();
        let _ = writeln!(out, "shares of the locks taken: {}", shares.join(", "));
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "latency (µs)   {:>8} {:>8} {:>8} {:>8} {:>8}",
        "p50", "p90", "p99", "p99.9", "max"
    );
    for (name, h) in [("acquire", &tally.acquire), ("release", &tally.release)] {
        let [p50, p90, p99, p999, max] = percentiles(h);
        let _ = writeln!(
            out,
            "{name:<14} {p50:>8} {p90:>8} {p99:>8} {p999:>8} {max:>8}"
        );
    }
    for (name, h) in [("acquire", &tally.acquire), ("release", &tally.release)] {
        let _ = writeln!(out);
        let _ = writeln!(out, "{name} latency (µs)");
        out.push_str(&text_histogram(h));
    }
    out
}

/// "1 thread", "4 threads".
fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// One row per power-of-two range of microseconds, from the lowest to the
/// highest value recorded.
fn text_histogram(h: &Histogram<u64>) -> String {
    let mut out = String::new();
    if h.is_empty() {
        out.push_str("  (no samples)\n");
        return out;
    }
    let exponent = |v: u64| 63 - v.max(1).leading_zeros();
    let rows: Vec<(u64, u64, u64)> = (exponent(h.min())..=exponent(h.max()))
        .map(|k| {
            let low = if k == 0 { 0 } else { 1u64 << k };
            let high = (1u64 << k).saturating_mul(2) - 1;
            (low, high, h.count_between(low, high))
        })
        .collect();
    let peak = rows.iter().map(|r| r.2).max().unwrap_or(1).max(1);
    let total = h.len().max(1);
    for (low, high, count) in rows {
        let bar = usize::try_from((count * BAR_WIDTH).div_ceil(peak)).unwrap_or(0);
        let _ = writeln!(
            out,
            "  {low:>8} .. {high:>8} | {:<width$} {count:>9} {:>5.1}%",
            "#".repeat(bar),
            count as f64 * 100.0 / total as f64,
            width = BAR_WIDTH as usize,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(values: &[u64]) -> Histogram<u64> {
        let mut h = Tally::new().acquire;
        for &v in values {
            h.saturating_record(v);
        }
        h
    }

    #[test]
    fn the_text_histogram_has_one_row_per_power_of_two_between_min_and_max() {
        let text = text_histogram(&histogram(&[100, 110, 120, 300, 1000]));
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows.len(), 4, "{text}");
        assert!(rows[0].contains("64 ..      127"), "{text}");
        assert!(rows[0].contains(" 3 "), "{text}");
        assert!(rows[3].contains("512 ..     1023"), "{text}");
        assert_eq!(text_histogram(&histogram(&[])), "  (no samples)\n");
    }

    #[test]
    fn percentiles_of_an_empty_histogram_are_zero() {
        assert_eq!(percentiles(&histogram(&[])), [0; 5]);
        let [p50, .., max] = percentiles(&histogram(&[5, 5, 5, 9]));
        assert_eq!((p50, max), (5, 9));
    }

    #[test]
    fn a_merged_tally_adds_everything() {
        let mut a = Tally::new();
        a.cycles = 2;
        a.acquire.saturating_record(10);
        let mut b = Tally::new();
        b.cycles = 3;
        b.attempts = 6;
        b.acquire_failed = 1;
        b.acquire.saturating_record(20);
        b.error("acquire", &Error::Os(io::ErrorKind::Other));
        b.error("acquire", &Error::Os(io::ErrorKind::Other));
        a.merge(b);
        assert_eq!((a.cycles, a.acquire_failed, a.error_count()), (5, 1, 2));
        assert_eq!(a.attempts, 6);
        assert_eq!(a.acquire.len(), 2);
        assert_eq!(a.errors.keys().collect::<Vec<_>>(), ["acquire: OS error"]);
    }

    #[test]
    fn picks_stay_below_their_bound() {
        let mut pick = Pick(42);
        let draws: Vec<usize> = (0..1000).map(|_| pick.below(7)).collect();
        assert!(draws.iter().all(|&d| d < 7));
        assert!((0..7).all(|v| draws.contains(&v)));
    }

    #[test]
    fn a_batch_draws_distinct_resources_and_all_of_them_over_time() {
        let mut pick = Pick(42);
        let mut order: Vec<usize> = (0..10).collect();
        let mut seen = [false; 10];
        for k in [1, 4, 10] {
            for _ in 0..100 {
                let mut chosen = pick.distinct(&mut order, k).to_vec();
                assert_eq!(chosen.len(), k);
                chosen.iter().for_each(|&c| seen[c] = true);
                chosen.sort_unstable();
                chosen.dedup();
                assert_eq!(chosen.len(), k, "a resource drawn twice");
            }
        }
        assert!(seen.iter().all(|s| *s));
        assert_eq!(pick.distinct(&mut order, 99).len(), 10);
    }

    #[test]
    fn multi_line_messages_become_one_line() {
        assert_eq!(one_line("a\nb\n\nc\n"), "a c");
        assert_eq!(one_line("just one"), "just one");
    }
}
