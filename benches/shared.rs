//! Lock+unlock cycles from T caller threads: one [`SharedRedlock`] for all
//! of them (one event loop pipelining every thread's operations into one
//! write per master) beside a [`Redlock`] per thread (T loops, T x N
//! connections), at T = 1, 16 and 64, against N = 3 local masters.
//!
//! Each thread locks a resource of its own (no contention) and each cycle
//! is one `try_acquire` and one `release`. Reports are per cycle with
//! `Throughput::Elements(1)`, so that they read in cycles/s of all T
//! threads together; a failed acquire or release still counts as a cycle
//! in criterion's figures, so each case prints its failures once it ends
//! (never hidden, as in `benches/cycle.rs`).
//!
//! ```text
//! cargo bench --bench shared                    # six cases, about a minute
//! cargo bench --bench shared -- 'T=64'          # one thread count
//! cargo bench --bench shared -- 'cycle/shared'  # one client
//! ```
//!
//! A case's threads and clients are made only when criterion runs it, so
//! that a filter skips the cost of those it leaves out.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use redlock_mio::{Config, Redlock, SharedRedlock};
use redlock_test::{Cluster, Options};

/// The caller thread counts measured.
const THREADS: &[usize] = &[1, 16, 64];
/// Masters: quorum 2.
const MASTERS: usize = 3;
/// TTL of every lock: long enough that no key expires during a cycle.
const TTL: Duration = Duration::from_secs(30);
/// Per-instance timeout: the default 50 ms would count a scheduling
/// hiccup on a busy 2-core machine (64 callers, 3 masters) as a lost vote.
const PER_INSTANCE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long a thread may take to connect and lock its resource once
/// before the case starts.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// Which client the threads use: the name in the benchmark id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Shared,
    PerThread,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Shared => "shared",
            Kind::PerThread => "per-thread",
        }
    }
}

/// One caller thread's client: a handle to the shared one, or its own.
// One per thread, made once: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Client {
    Shared(SharedRedlock),
    Own(Redlock),
}

/// What one cycle came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Done,
    AcquireFailed,
    ReleaseFailed,
}

impl Client {
    /// One `try_acquire` of `resource` and, when it took the lock, one
    /// `release`.
    fn cycle(&mut self, resource: &Bytes) -> Outcome {
        let acquired = match self {
            Client::Shared(c) => c.try_acquire(resource.clone(), TTL),
            Client::Own(c) => c.try_acquire(resource.clone(), TTL),
        };
        let Ok(lock) = acquired else {
            return Outcome::AcquireFailed;
        };
        let released = match self {
            Client::Shared(c) => c.release(&lock),
            Client::Own(c) => c.release(&lock),
        };
        match released {
            Ok(()) => Outcome::Done,
            Err(_) => Outcome::ReleaseFailed,
        }
    }

    /// Connects (a [`Redlock`] only: the shared client's loop connects on
    /// first use) and runs cycles until one succeeds, so that the first
    /// measured cycle finds connections up, scripts loaded and, for the
    /// shared client, this thread's reusable completion made.
    fn warm_up(&mut self, resource: &Bytes) -> Result<(), String> {
        let start = Instant::now();
        if let Client::Own(c) = self {
            let connected = c.warm_up(WARM_UP_TIMEOUT);
            if connected != MASTERS {
                return Err(format!(
                    "{connected} of {MASTERS} masters connected after {WARM_UP_TIMEOUT:?}"
                ));
            }
        }
        loop {
            let outcome = self.cycle(resource);
            if outcome == Outcome::Done {
                return Ok(());
            }
            if start.elapsed() > WARM_UP_TIMEOUT {
                return Err(format!(
                    "no clean acquire+release within {WARM_UP_TIMEOUT:?} (last: {outcome:?})"
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What the threads of a case share: the batch they work on and the
/// failure counts.
struct Work {
    /// Cycles of the current batch that no thread has claimed yet; below
    /// zero once all are claimed.
    left: AtomicI64,
    /// Tells the threads to exit at the next start instead of working.
    stop: AtomicBool,
    /// A thread's cycle panicked: it still reached the end of the batch
    /// (so that the measuring thread does not wait forever), and the
    /// measuring thread panics in turn.
    panicked: AtomicBool,
    /// T threads and the measuring thread: a batch starts...
    start: Barrier,
    /// ...and ends when every thread has found nothing left to claim.
    done: Barrier,
    cycles: AtomicU64,
    failed_acquires: AtomicU64,
    failed_releases: AtomicU64,
}

impl Work {
    /// Claims one cycle of the current batch.
    fn claim(&self) -> bool {
        self.left.fetch_sub(1, Ordering::Relaxed) > 0
    }

    fn count(&self, outcome: Outcome) {
        self.cycles.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Done => {}
            Outcome::AcquireFailed => {
                self.failed_acquires.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::ReleaseFailed => {
                self.failed_releases.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The T caller threads of one case, started once and kept for all of its
/// samples, each with its client and its resource.
///
/// Started once rather than spawned per sample: spawning 64 threads (and,
/// per thread, connecting 3 masters) inside a measured batch would time
/// thread creation and cold connections, not cycles; kept, the threads
/// and clients stay warm, and a batch costs two barrier crossings,
/// amortised over its `iters` cycles.
///
/// Threads claim a batch's cycles one at a time from one counter instead
/// of taking `iters / T` each: with fixed shares a batch lasts as long as
/// its slowest thread, and on 2 cores the scheduler leaves some of 64
/// threads waiting long enough that the others would sit idle at the end.
struct Crew {
    work: Arc<Work>,
    threads: Vec<JoinHandle<()>>,
    label: String,
}

impl Crew {
    /// Starts `t` threads with clients of `kind` for the masters at
    /// `urls`, each warmed up; panics with the case's name when one
    /// cannot be.
    fn start(kind: Kind, t: usize, urls: &[String], label: String) -> Crew {
        let mut config =
            Config::new(urls).unwrap_or_else(|e| panic!("{label}: bad master URLs: {e}"));
        config.per_instance_timeout = PER_INSTANCE_TIMEOUT;
        // The masters were started empty by this bench: no lock predates
        // them, so there is nothing for restart quarantine to protect.
        config.quarantine = None;
        let shared = match kind {
            Kind::Shared => Some(
                SharedRedlock::new(config.clone())
                    .unwrap_or_else(|e| panic!("{label}: cannot make the shared client: {e}")),
            ),
            Kind::PerThread => None,
        };
        let work = Arc::new(Work {
            left: AtomicI64::new(0),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            start: Barrier::new(t + 1),
            done: Barrier::new(t + 1),
            cycles: AtomicU64::new(0),
            failed_acquires: AtomicU64::new(0),
            failed_releases: AtomicU64::new(0),
        });
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let threads = (0..t)
            .map(|index| {
                let client = match &shared {
                    Some(shared) => Client::Shared(shared.clone()),
                    None => Client::Own(Redlock::new(config.clone()).unwrap_or_else(|e| {
                        panic!("{label}: cannot make the client of thread {index}: {e}")
                    })),
                };
                // A name per case and thread: a lock left behind by a
                // failed release in one case cannot refuse another.
                let resource = Bytes::from(format!("bench:{}:{t}:{index}", kind.name()));
                let (work, ready) = (Arc::clone(&work), ready_tx.clone());
                thread::Builder::new()
                    .name(format!("caller-{index}"))
                    .spawn(move || caller(client, &resource, &work, &ready))
                    .unwrap_or_else(|e| panic!("{label}: cannot start thread {index}: {e}"))
            })
            .collect();
        // The threads hold their own handles; the loop lives until the last
        // of them is dropped.
        drop(shared);
        drop(ready_tx);
        for _ in 0..t {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("{label}: warm-up failed: {e}"),
                Err(_) => panic!("{label}: a caller thread ended before it was warm"),
            }
        }
        Crew {
            work,
            threads,
            label,
        }
    }

    /// Runs `iters` cycles spread over the threads; the wall time of the
    /// whole batch.
    fn run(&self, iters: u64) -> Duration {
        let iters = i64::try_from(iters).unwrap_or(i64::MAX);
        self.work.left.store(iters, Ordering::Relaxed);
        let began = Instant::now();
        // The barrier orders the store above before every thread's claims.
        self.work.start.wait();
        self.work.done.wait();
        let elapsed = began.elapsed();
        assert!(
            !self.work.panicked.load(Ordering::Relaxed),
            "{}: a caller thread panicked (its message is above)",
            self.label
        );
        elapsed
    }

    /// Stops and joins the threads, and prints what the case counted.
    fn finish(self) {
        self.work.stop.store(true, Ordering::Relaxed);
        self.work.start.wait();
        for handle in self.threads {
            if handle.join().is_err() {
                panic!("{}: a caller thread panicked", self.label);
            }
        }
        eprintln!(
            "{}: {} cycles measured (criterion's warm-up included), {} failed acquires, {} \
             failed releases",
            self.label,
            self.work.cycles.load(Ordering::Relaxed),
            self.work.failed_acquires.load(Ordering::Relaxed),
            self.work.failed_releases.load(Ordering::Relaxed),
        );
    }
}

/// One caller thread: warms its client up, says so, then runs the cycles
/// it claims from each batch until told to stop.
fn caller(
    mut client: Client,
    resource: &Bytes,
    work: &Work,
    ready: &mpsc::Sender<Result<(), String>>,
) {
    let warm = client.warm_up(resource);
    let failed = warm.is_err();
    // The receiver outlives the warm-up: a failed send means it panicked.
    let _ = ready.send(warm.map_err(|e| format!("{}: {e}", String::from_utf8_lossy(resource))));
    if failed {
        return;
    }
    loop {
        work.start.wait();
        if work.stop.load(Ordering::Relaxed) {
            return;
        }
        let batch = panic::catch_unwind(AssertUnwindSafe(|| {
            while work.claim() {
                work.count(client.cycle(resource));
            }
        }));
        if batch.is_err() {
            work.panicked.store(true, Ordering::Relaxed);
        }
        work.done.wait();
    }
}

fn cycles(c: &mut Criterion) {
    let cluster = Cluster::start(MASTERS, &Options::new())
        .unwrap_or_else(|e| panic!("cannot start {MASTERS} local redis-server masters: {e}"));
    let urls = cluster.urls();
    let mut group = c.benchmark_group("cycle");
    group.throughput(Throughput::Elements(1));
    for &t in THREADS {
        for kind in [Kind::Shared, Kind::PerThread] {
            let id = BenchmarkId::new(kind.name(), format!("T={t}"));
            let label = format!("cycle/{}/T={t}", kind.name());
            let mut crew = None;
            group.bench_function(id, |b| {
                let crew = crew.get_or_insert_with(|| Crew::start(kind, t, &urls, label.clone()));
                b.iter_custom(|iters| crew.run(iters));
            });
            if let Some(crew) = crew {
                crew.finish();
            }
        }
    }
    group.finish();
    drop(cluster);
}

criterion_group! {
    name = benches;
    // Six cases, each with a thread pool and masters to set up, on a
    // 2-core machine: about 7 s a case.
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = cycles
}
criterion_main!(benches);
