//! The open loop's driver: callers that wait for each operation's intended
//! start, send it, and record what came back.
//!
//! This module owns the threads (or the one executor thread of
//! `--tasks`), the clients, the clock and the end of the run. Every
//! decision about time is the schedule's and the record's: a caller asks
//! the shared [`Schedule`] for the next start, waits for it, stamps the
//! send and the reply, and hands the three instants to its [`Recorder`].
//! A caller still busy when its next start comes sends it late, and the
//! lateness counts in the latency; starts still unsent [`DRAIN`] after the
//! end are counted as never sent, and the report says the generator fell
//! behind.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use redlock_mio::{Config, Error, Redlock, Retry, SharedRedlock};

use super::exec::{precise_timers, wait_until};
use super::handoff::Handoffs;
use super::record::{Outcome, Recorder, Timing};
use super::schedule::Schedule;
use super::{Plan, Shape};
use crate::caller::{Client, Pick};
use crate::exit::{self, Failure};
use crate::signals::Signals;
use crate::tasks::{self, sleep_until};

/// How long after the end callers still send starts that are overdue;
/// those left then are counted as never sent.
pub(crate) const DRAIN: Duration = Duration::from_secs(1);
/// Each interval of the HdrHistogram log.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);
/// The callers' lead: the schedule's origin is this far after the clients
/// are ready, so that the first start is not already late.
const LEAD: Duration = Duration::from_millis(20);
/// How often the main thread looks for a signal.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// What a run measured.
#[derive(Debug)]
pub(crate) struct Measured {
    /// The rate asked, a second.
    pub(crate) rate: f64,
    /// Every caller's record, merged.
    pub(crate) recorder: Recorder,
    /// Starts handed out or abandoned: every one the schedule had.
    pub(crate) intended: u64,
    /// Starts never sent: the generator fell behind by this many.
    pub(crate) unsent: u64,
    /// The measured window's length (shorter when interrupted).
    pub(crate) window: Duration,
    /// The wall-clock time of the schedule's origin, for the log.
    pub(crate) started: SystemTime,
    /// The signal that cut the run short.
    pub(crate) interrupted: Option<i32>,
    /// The first error's message, for the report.
    pub(crate) first_error: Option<String>,
    /// Release to the next holder's grant, with `--resources` and
    /// `--hold` (waiting acquires).
    pub(crate) handoffs: Option<hdrhistogram::Histogram<u64>>,
}

/// What the callers share.
struct Shared {
    schedule: Mutex<Schedule>,
    measured_from: Instant,
    end: Instant,
    drain_until: Instant,
    stop: AtomicBool,
    unsent: AtomicU64,
    finished: AtomicUsize,
    first_error: Mutex<Option<String>>,
    /// Shared resources and waiting acquires: hand-offs to pair.
    handoffs: Option<Mutex<Handoffs>>,
}

impl Shared {
    /// The next start, or `None` when the run is over for this caller.
    fn next(&self) -> Option<super::schedule::Intended> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        let mut schedule = self.schedule.lock().unwrap_or_else(PoisonError::into_inner);
        if Instant::now() > self.drain_until {
            let left = schedule.abandon_due(self.drain_until);
            self.unsent.fetch_add(left, Ordering::Relaxed);
            return None;
        }
        schedule.poll_next()
    }

    fn error(&self, op: &str, e: &Error) {
        let mut first = self
            .first_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if first.is_none() {
            *first = Some(format!("{op}: {e}"));
        }
    }

    /// A lock's release, as the operation's outcome.
    fn released(&self, release: Result<(), Error>) -> Outcome {
        match release {
            Ok(()) => Outcome::Done,
            Err(e) => {
                self.error("release", &e);
                Outcome::Errored
            }
        }
    }

    /// An acquire that took no lock, as the operation's outcome: held
    /// elsewhere, or an error.
    fn refused(&self, e: &Error) -> Outcome {
        if let Error::Held(_) = e {
            return Outcome::Failed;
        }
        self.error("acquire", e);
        Outcome::Errored
    }
}

/// Runs one open loop at `rate`.
///
/// # Errors
/// A client that cannot be made, a schedule that cannot be (a rate that
/// is not above zero), a caller that panicked.
pub(crate) fn run(
    config: &Config,
    shape: &Shape,
    plan: &Plan,
    rate: f64,
    signals: &Signals,
) -> Result<Measured, Failure> {
    let made = |e: Error| exit::lock_error("cannot make a client", &e, exit::SOFTWARE);
    let callers = shape.callers();
    let mut clients: Vec<Client> = Vec::with_capacity(callers);
    let shared_client = if shape.client_per_thread {
        None
    } else {
        Some(SharedRedlock::new(config.clone()).map_err(made)?)
    };
    let names: Vec<Vec<Bytes>> = (0..callers).map(|i| names_of(shape, i)).collect();
    if shape.tasks.is_none() {
        for (i, names) in names.iter().enumerate() {
            let mut client = match &shared_client {
                Some(shared) => Client::Shared(shared.clone()),
                None => Client::Own(Redlock::new(config.clone()).map_err(made)?),
            };
            warm(&mut client, &names[i % names.len()], shape.ttl);
            clients.push(client);
        }
    } else if let Some(shared) = &shared_client {
        // Connect to every master (and load the scripts) before the clock.
        warm(&mut Client::Shared(shared.clone()), &names[0][0], shape.ttl);
    }
    // Said on stderr as the clock starts, for whoever times a fault
    // against the run (the tests stop masters during it).
    crate::say(&format!(
        "open loop at {}/s: {} of warm-up, then {} measured",
        rate,
        humantime::format_duration(plan.warm_up),
        humantime::format_duration(shape.duration)
    ));
    let origin = Instant::now() + LEAD;
    let started = SystemTime::now() + LEAD;
    let length = plan.warm_up + shape.duration;
    let schedule = Schedule::new(origin, rate, length, plan.arrivals)
        .map_err(|e| Failure::usage(e.to_string()))?;
    let end = origin + length;
    let shared = Shared {
        schedule: Mutex::new(schedule),
        measured_from: origin + plan.warm_up,
        end,
        drain_until: end + DRAIN,
        stop: AtomicBool::new(false),
        unsent: AtomicU64::new(0),
        finished: AtomicUsize::new(0),
        first_error: Mutex::new(None),
        handoffs: match (shape.resources, shape.hold) {
            (Some(r), Some(_)) => Some(Mutex::new(Handoffs::new(r, origin + plan.warm_up))),
            _ => None,
        },
    };
    let (recorders, interrupted) = thread::scope(|scope| {
        let handles: Vec<_> = if shape.tasks.is_some() {
            let shared_client = shared_client
                .clone()
                .unwrap_or_else(|| unreachable!("--tasks shares one client"));
            let (shared, names) = (&shared, &names);
            vec![scope.spawn(move || vec![tasks(&shared_client, shape, names, shared)])]
        } else {
            clients
                .into_iter()
                .zip(&names)
                .enumerate()
                .map(|(index, (client, names))| {
                    let shared = &shared;
                    scope.spawn(move || {
                        let r = caller(index, client, shape, names, shared);
                        shared.finished.fetch_add(1, Ordering::Relaxed);
                        vec![r]
                    })
                })
                .collect()
        };
        let workers = handles.len();
        let mut interrupted = None;
        while shared.finished.load(Ordering::Relaxed) < workers {
            signals.wait(LOOK_EVERY);
            let pending = signals.take();
            if let Some(&s) = [libc::SIGINT, libc::SIGTERM]
                .iter()
                .find(|&&s| pending.contains(s))
            {
                interrupted = Some(s);
                shared.stop.store(true, Ordering::Relaxed);
            }
        }
        let mut recorders = Vec::new();
        for handle in handles {
            match handle.join() {
                Ok(r) => recorders.extend(r),
                Err(_) => return Err(Failure::new(exit::SOFTWARE, "a bench caller panicked")),
            }
        }
        Ok((recorders, interrupted))
    })?;
    let mut recorder = Recorder::new(shared.measured_from, end, INTERVAL);
    for r in &recorders {
        recorder.merge(r);
    }
    let stopped_at = Instant::now().min(end);
    let window = stopped_at.saturating_duration_since(shared.measured_from);
    let unsent = shared.unsent.load(Ordering::Relaxed);
    let schedule = shared
        .schedule
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    Ok(Measured {
        rate,
        recorder,
        intended: schedule.issued(),
        unsent,
        window,
        started,
        interrupted,
        first_error: shared
            .first_error
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner),
        handoffs: shared.handoffs.map(|h| {
            h.into_inner()
                .unwrap_or_else(PoisonError::into_inner)
                .histogram
        }),
    })
}

/// The resource names caller `index` draws from: its own (one, or one
/// per batch slot) unless `--resources` names a shared set.
fn names_of(shape: &Shape, index: usize) -> Vec<Bytes> {
    let batch = shape.batch as usize;
    match shape.resources {
        None if batch == 1 => vec![Bytes::from(format!("bench:{index}"))],
        None => (0..batch)
            .map(|j| Bytes::from(format!("bench:{index}:{j}")))
            .collect(),
        Some(r) => (0..r).map(|i| Bytes::from(format!("bench:{i}"))).collect(),
    }
}

/// One acquire and release, to connect every master and load the scripts
/// before the clock starts.
fn warm(client: &mut Client, name: &Bytes, ttl: Duration) {
    if let Ok(lock) = client.try_acquire(name.clone(), ttl) {
        let _ = client.release(&lock);
    }
}

/// A caller thread: take the next start, wait for it, send, record.
fn caller(
    index: usize,
    mut client: Client,
    shape: &Shape,
    names: &[Bytes],
    shared: &Shared,
) -> Recorder {
    precise_timers();
    let mut recorder = Recorder::new(shared.measured_from, shared.end, INTERVAL);
    // Odd, hence never the all-zero state xorshift cannot leave.
    let mut pick = Pick((index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut order = names.to_vec();
    while let Some(op) = shared.next() {
        wait_until(op.at);
        let sent = Instant::now();
        let (outcome, done) = match (shape.hold, shape.batch) {
            (Some(hold), _) => {
                let resource = pick.resource(names);
                // The resource's place among the shared names, for the
                // hand-offs (names are few where they are shared).
                let place = names.iter().position(|n| *n == resource).unwrap_or(0);
                hold_once(&mut client, resource, place, hold, shape, shared)
            }
            (None, 1) => {
                let resource = pick.resource(names);
                cycle(&mut client, resource, shape.ttl, shared)
            }
            (None, k) => {
                let chosen = pick.distinct(&mut order, k as usize);
                batch(&mut client, chosen, shape.ttl, shared)
            }
        };
        let timing = Timing {
            intended: op.at,
            sent,
            done,
        };
        recorder.handle_done(timing, outcome);
    }
    recorder
}

/// Acquire once (no retry), release at once; timed to the release's
/// reply.
fn cycle(
    client: &mut Client,
    resource: Bytes,
    ttl: Duration,
    shared: &Shared,
) -> (Outcome, Instant) {
    let outcome = match client.try_acquire(resource, ttl) {
        Ok(lock) => shared.released(client.release(&lock)),
        Err(e) => shared.refused(&e),
    };
    (outcome, Instant::now())
}

/// Acquire, waiting for a held lock as the retry policy says (until the
/// drain ends), hold, release; timed to the grant, since the hold is the
/// caller's own time. The grant and the release's send go to the
/// hand-offs when resources are shared.
fn hold_once(
    client: &mut Client,
    resource: Bytes,
    place: usize,
    hold: Duration,
    shape: &Shape,
    shared: &Shared,
) -> (Outcome, Instant) {
    let began = Instant::now();
    let retry = Retry::default()
        .with_attempts(u32::MAX)
        .with_delay(shape.retry_delay)
        .with_max_wait(Some(shared.drain_until.saturating_duration_since(began)));
    match client.acquire_with(resource, shape.ttl, &retry) {
        Ok(lock) => {
            let granted = Instant::now();
            if let Some(h) = &shared.handoffs {
                let mut h = h.lock().unwrap_or_else(PoisonError::into_inner);
                let _ = h.handle_grant(place, began, granted);
            }
            thread::sleep(hold);
            if let Some(h) = &shared.handoffs {
                h.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .handle_release(place, Instant::now());
            }
            (shared.released(client.release(&lock)), granted)
        }
        Err(e) => {
            let at = Instant::now();
            (shared.refused(&e), at)
        }
    }
}

/// Lock every resource in one pass, release those taken in one pass; the
/// batch is one operation, done when every lock was taken and released.
fn batch(
    client: &mut Client,
    resources: &[Bytes],
    ttl: Duration,
    shared: &Shared,
) -> (Outcome, Instant) {
    let results = match client.try_acquire_batch(resources, ttl) {
        Ok(results) => results,
        Err(e) => {
            shared.error("acquire", &e);
            return (Outcome::Errored, Instant::now());
        }
    };
    let mut outcome = Outcome::Done;
    let mut locks = Vec::with_capacity(results.len());
    for result in results {
        match result {
            Ok(lock) => locks.push(lock),
            Err(Error::Held(_)) if outcome == Outcome::Done => outcome = Outcome::Failed,
            Err(Error::Held(_)) => {}
            Err(e) => {
                shared.error("acquire", &e);
                outcome = Outcome::Errored;
            }
        }
    }
    if !locks.is_empty() {
        for released in client.release_batch(&locks) {
            if let Err(e) = released {
                shared.error("release", &e);
                outcome = Outcome::Errored;
            }
        }
    }
    (outcome, Instant::now())
}

/// `--tasks C`: C async callers on this thread sharing one client, each
/// taking the next start, sleeping until it, and awaiting an acquire and
/// a release.
fn tasks(client: &SharedRedlock, shape: &Shape, names: &[Vec<Bytes>], shared: &Shared) -> Recorder {
    let recorder = RefCell::new(Recorder::new(shared.measured_from, shared.end, INTERVAL));
    let futures: Vec<Pin<Box<dyn Future<Output = ()> + '_>>> = names
        .iter()
        .enumerate()
        .map(|(index, names)| {
            let recorder = &recorder;
            Box::pin(async move {
                let mut pick = Pick((index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                while let Some(op) = shared.next() {
                    sleep_until(op.at).await;
                    let sent = Instant::now();
                    let outcome = match client
                        .try_acquire_async(pick.resource(names), shape.ttl)
                        .await
                    {
                        Ok(lock) => shared.released(client.release_async(&lock).await),
                        Err(e) => shared.refused(&e),
                    };
                    let timing = Timing {
                        intended: op.at,
                        sent,
                        done: Instant::now(),
                    };
                    recorder.borrow_mut().handle_done(timing, outcome);
                }
            }) as Pin<Box<dyn Future<Output = ()> + '_>>
        })
        .collect();
    precise_timers();
    tasks::run_all(futures);
    shared.finished.fetch_add(1, Ordering::Relaxed);
    recorder.into_inner()
}
