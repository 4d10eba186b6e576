//! Keeping locks alive: the extension policy and each kept lock's state,
//! as the shared client's event loop runs them (the holder's handle is
//! [`Watchdog`](crate::Watchdog), above the client).
//!
//! This module owns the extension policy (when to extend, how soon to
//! retry, when to give the lock up) and each kept lock's state. The policy
//! is plain data in, plain data out (the private `Schedule` takes `now`);
//! the event loop runs it: a timer per kept lock, and the extensions that
//! fall due together go out in one write per master beside every other
//! operation. It must not extend a lock whose validity has run out (mutual
//! exclusion may already have ended), nor extend anything once it has been
//! told to stop: releasing the lock is the last thing done with it.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::{Duration, Instant};

use crate::clock::Stamp;
use crate::config::{Config, ConfigError};
use crate::error::Error;
use crate::job::{Extend, SplitMix64};
use crate::lock::Lock;

/// The longest wait before retrying a failed extension.
const RETRY_GAP_MAX: Duration = Duration::from_millis(50);

/// The shortest extension period and retry gap: below Redis' 1 ms expiry
/// precision, extending more often achieves nothing.
const TICK: Duration = Duration::from_millis(1);

/// How a [`Watchdog`](crate::Watchdog) keeps its lock alive. `KeepOptions::default()` extends
/// to the lock's own TTL every third of it, without limit, and reports a
/// loss only through [`Watchdog::lost`](crate::Watchdog::lost) and [`Watchdog::subscribe`](crate::Watchdog::subscribe).
/// Set with the `with_` methods and [`KeepOptions::on_lost`] (a struct
/// that may gain a setting, so not built by a literal):
///
/// ```
/// use std::time::Duration;
/// use redlock_mio::KeepOptions;
///
/// let options = KeepOptions::default()
///     .with_ttl(Duration::from_secs(30))
///     .with_every(0.25)
///     .on_lost(|lost| eprintln!("lock lost: {lost}"));
/// assert_eq!(options.every, 0.25);
/// ```
#[non_exhaustive]
pub struct KeepOptions {
    /// The TTL each extension sets. Default (`None`): the lock's TTL
    /// ([`Lock::ttl`]). Required for a lock made with [`Lock::from_parts`],
    /// whose TTL is unknown.
    pub ttl: Option<Duration>,
    /// The extension period, as a fraction of the TTL: the lock is extended
    /// once its validity has dropped to `(1 - every) * ttl`, that is every
    /// `every * ttl` while extensions succeed. Must be in `(0, 1)`.
    /// Default 1/3, which leaves a third of the TTL for retries after a
    /// failed extension and another third of warning before the validity
    /// ends (see [`Watchdog`](crate::Watchdog)). From 1/2 up there is no room for retries:
    /// the first failed extension is a loss.
    pub every: f64,
    /// Extend no further once the lock has been extended this many times
    /// in all ([`Lock::extensions`], which counts extensions made before
    /// the watchdog took the lock). [`Config::max_extensions`], when set,
    /// applies too; the smaller cap wins. Default: no cap of its own.
    pub max_extensions: Option<u32>,
    /// Called once, on the event loop thread, when the lock is lost. It
    /// runs after [`Watchdog::lost`](crate::Watchdog::lost) already reports the loss, and must
    /// return quickly: every lock and operation of the client waits for it.
    /// It must not release or drop the watchdog, nor call the client's
    /// blocking operations (they wait for the loop it runs on). A panic in
    /// it is caught (the panic hook still prints it) so that the loop goes
    /// on.
    pub on_lost: Option<Box<dyn FnOnce(Lost) + Send>>,
}

impl KeepOptions {
    /// These options with [`KeepOptions::ttl`] set to `ttl`.
    #[must_use]
    pub fn with_ttl(self, ttl: Duration) -> KeepOptions {
        KeepOptions {
            ttl: Some(ttl),
            ..self
        }
    }

    /// These options with [`KeepOptions::every`] set to `every`.
    #[must_use]
    pub fn with_every(self, every: f64) -> KeepOptions {
        KeepOptions { every, ..self }
    }

    /// These options with [`KeepOptions::max_extensions`] set to `max`.
    #[must_use]
    pub fn with_max_extensions(self, max: u32) -> KeepOptions {
        KeepOptions {
            max_extensions: Some(max),
            ..self
        }
    }

    /// These options with `callback` as [`KeepOptions::on_lost`].
    #[must_use]
    pub fn on_lost(mut self, callback: impl FnOnce(Lost) + Send + 'static) -> KeepOptions {
        self.on_lost = Some(Box::new(callback));
        self
    }
}

impl Default for KeepOptions {
    fn default() -> Self {
        KeepOptions {
            ttl: None,
            every: 1.0 / 3.0,
            max_extensions: None,
            on_lost: None,
        }
    }
}

impl fmt::Debug for KeepOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeepOptions")
            .field("ttl", &self.ttl)
            .field("every", &self.every)
            .field("max_extensions", &self.max_extensions)
            .field("on_lost", &self.on_lost.as_ref().map(|_| "FnOnce(Lost)"))
            .finish()
    }
}

/// Why a kept lock was given up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// Extending failed: at once for [`Error::NotHeld`] (a quorum says the
    /// token no longer holds the key), otherwise once less than one
    /// extension period of validity was left; the last error.
    Failed(Error),
    /// The lock has been extended this many times, the cap, and less than
    /// one extension period of validity is left.
    ExtensionLimit(u32),
    /// The validity ran out before the keeper could act: its event loop was
    /// not scheduled in time (a suspended process), or the lock was handed
    /// over with no validity left.
    Expired,
}

impl LostReason {
    /// The loss as the metrics label it.
    fn as_loss(&self) -> crate::metrics::Loss<'_> {
        match self {
            LostReason::Failed(error) => crate::metrics::Loss::Failed(error),
            LostReason::ExtensionLimit(_) => crate::metrics::Loss::ExtensionLimit,
            LostReason::Expired => crate::metrics::Loss::Expired,
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Failed(e @ Error::NotHeld(_)) => write!(f, "{e}"),
            LostReason::Failed(e) => write!(f, "extending kept failing: {e}"),
            LostReason::ExtensionLimit(max) => {
                write!(f, "extension limit reached ({max} extensions)")
            }
            LostReason::Expired => f.write_str("its validity ran out before it could be extended"),
        }
    }
}

/// The report of a lost lock: why, and how much validity was left.
///
/// Mutual exclusion still holds until `deadline` (when it is later than
/// `at`): that is the time the holder has to stop its work safely.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lost {
    /// Why the lock was given up.
    pub reason: LostReason,
    /// When the keeper gave it up.
    pub at: Instant,
    /// The validity deadline at that moment: mutual exclusion ends then.
    pub deadline: Instant,
    /// How many times the lock had been extended ([`Lock::extensions`]).
    pub extensions: u32,
}

impl Lost {
    /// Validity left at `at`, when the loss was reported.
    pub fn left_when_reported(&self) -> Duration {
        self.deadline.saturating_duration_since(self.at)
    }

    /// Validity left now; zero once the deadline has passed.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}; {} ms of validity left when reported",
            self.reason,
            self.left_when_reported().as_millis()
        )
    }
}

/// What the holder and the event loop share.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
}

impl Shared {
    /// The state of `lock`, kept from now on, nothing reported yet.
    fn new(lock: Lock) -> Shared {
        Shared {
            state: Mutex::new(State {
                lock,
                last_error: None,
                lost: None,
                subscribers: Vec::new(),
                wakers: Vec::new(),
                slot: None,
            }),
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // The state is plain values written whole: a panic elsewhere cannot
        // leave it half-updated.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
pub(crate) struct State {
    /// The lock as of the last extension attempt.
    pub(crate) lock: Lock,
    pub(crate) last_error: Option<Error>,
    pub(crate) lost: Option<Lost>,
    /// Channels waiting for the loss report.
    pub(crate) subscribers: Vec<Sender<Lost>>,
    /// Async holders waiting for the loss report.
    pub(crate) wakers: Vec<Waker>,
    /// Where the event loop keeps the lock, once it has taken it.
    pub(crate) slot: Option<usize>,
}

/// One kept lock, as the event loop holds it: the lock as of the last
/// extension, its schedule, and what the holder shares.
pub(crate) struct Keeper {
    lock: Lock,
    schedule: Schedule,
    shared: Arc<Shared>,
    on_lost: Option<Box<dyn FnOnce(Lost) + Send>>,
    lost: bool,
}

impl fmt::Debug for Keeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keeper")
            .field("lock", &self.lock)
            .field("schedule", &self.schedule)
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

/// What the event loop does next for a kept lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeepStep {
    /// Extend it now, to this TTL.
    Extend(Duration),
    /// Nothing until then.
    Wait(Instant),
    /// Nothing until told to release: the lock was lost.
    Idle,
}

impl Keeper {
    /// Keeps `lock` as `options` say, under `config`'s limits: the keeper
    /// for the event loop (its state shared with the holder through
    /// [`Keeper::shared`]), and the TTL it extends to.
    ///
    /// # Errors
    /// As [`SharedRedlock::keep`](crate::SharedRedlock::keep).
    pub(crate) fn new(
        config: &Config,
        lock: Lock,
        options: KeepOptions,
        now: Stamp,
    ) -> Result<(Keeper, Duration), Error> {
        let every = options.every;
        if !(every > 0.0 && every < 1.0) {
            return Err(ConfigError::ExtensionFraction.into());
        }
        let ttl = config.checked_ttl(options.ttl.unwrap_or(lock.ttl()))?;
        let cap = match (options.max_extensions, config.max_extensions) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // How long one extension round may take: the loop waits this long
        // for the masters.
        let round = config.per_instance_timeout.min(ttl);
        let mut schedule = Schedule::new(
            ttl,
            every,
            round,
            cap,
            lock.deadline_at(now),
            lock.extensions(),
        );
        schedule.unmeasured = !lock.validity_known();
        let shared = Arc::new(Shared::new(lock.clone()));
        let keeper = Keeper {
            lock,
            schedule,
            shared,
            on_lost: options.on_lost,
            lost: false,
        };
        Ok((keeper, ttl))
    }

    /// What to do at `now`; a loss is reported here, once, to every way
    /// the holder listens. The schedule is judged on the lock's deadline
    /// as of `now` on both clocks: after a suspend it is earlier than the
    /// monotonic instant fixed at the last extension (see [`Lock::deadline`]).
    pub(crate) fn poll(&mut self, stamp: Stamp) -> KeepStep {
        if self.lost {
            return KeepStep::Idle;
        }
        self.schedule
            .handle_shortened(self.lock.expiry.deadline(stamp));
        let now = stamp.mono;
        match self.schedule.poll_next(now) {
            Next::Extend => KeepStep::Extend(self.schedule.ttl),
            Next::Wait(until) => KeepStep::Wait(until),
            Next::Lose(reason) => {
                self.lost = true;
                crate::metrics::lost(reason.as_loss());
                let report = Lost {
                    reason,
                    at: now,
                    deadline: self.lock.deadline_at(stamp),
                    extensions: self.lock.extensions(),
                };
                let mut state = self.shared.state();
                state.lost = Some(report.clone());
                let subscribers = std::mem::take(&mut state.subscribers);
                let wakers = std::mem::take(&mut state.wakers);
                drop(state);
                for subscriber in subscribers {
                    let _ = subscriber.send(report.clone());
                }
                for waker in wakers {
                    waker.wake();
                }
                if let Some(callback) = self.on_lost.take() {
                    let _ = panic::catch_unwind(AssertUnwindSafe(|| callback(report)));
                }
                KeepStep::Idle
            }
        }
    }

    /// The lock as of the last extension: what to extend, or to release.
    pub(crate) fn lock(&self) -> &Lock {
        &self.lock
    }

    /// What the holder shares with the loop.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The loop that kept the lock has stopped (`error` says why): the loss
    /// is reported at once, as a failed extension that cannot be retried.
    pub(crate) fn handle_stopped(&mut self, error: Error, now: Stamp) {
        self.schedule.final_reason = Some(LostReason::Failed(error));
        let _ = self.poll(now);
    }

    /// An extension to `ttl` starts at `now`: the lock it extends, its
    /// deadline first made no later than the keys will keep it
    /// ([`Extend::shorten`]) and shared with the holder, so that however
    /// the attempt ends (or fails to, when the loop stops), the holder is
    /// never told of validity the keys no longer have.
    ///
    /// # Errors
    /// As [`Extend::shorten`]: nothing is sent then.
    pub(crate) fn start_extension(
        &mut self,
        config: &Config,
        ttl: Duration,
        now: Stamp,
    ) -> Result<Lock, Error> {
        Extend::shorten(config, &mut self.lock, ttl, now)?;
        self.schedule
            .handle_shortened(self.lock.expiry.deadline(now));
        self.shared.state().lock.clone_from(&self.lock);
        Ok(self.lock.clone())
    }

    /// An extension attempt ended: `lock` is the lock as it left it
    /// (extended, or shortened by a failure).
    /// A failed attempt's retry comes a random part of the retry gap early
    /// (drawn from `jitter`): the kept locks that one shared failure (a
    /// dropped connection) failed together do not all retry at one
    /// instant.
    pub(crate) fn handle_extended(
        &mut self,
        lock: Lock,
        result: Result<(), Error>,
        now: Stamp,
        jitter: &mut SplitMix64,
    ) {
        self.lock = lock;
        let deadline = self.lock.deadline_at(now);
        match result {
            Ok(()) => self
                .schedule
                .handle_extended(deadline, self.lock.extensions()),
            Err(error) => {
                self.schedule.handle_shortened(deadline);
                self.schedule.handle_failed(error, now.mono);
                let early = jitter.between(Duration::ZERO, self.schedule.retry_gap / 2);
                self.schedule.spread_retry(early);
            }
        }
        let mut state = self.shared.state();
        state.lock.clone_from(&self.lock);
        state.last_error.clone_from(&self.schedule.last_error);
    }
}

impl Shared {
    /// Where the event loop keeps the lock.
    pub(crate) fn slot(&self) -> Option<usize> {
        self.state().slot
    }

    pub(crate) fn set_slot(&self, slot: Option<usize>) {
        self.state().slot = slot;
    }
}

/// What the schedule says to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Next {
    /// Extend now.
    Extend,
    /// Nothing to do until then (or until told to stop).
    Wait(Instant),
    /// Give the lock up, for this reason.
    Lose(LostReason),
}

/// The extension policy as plain data: fed the outcome of each extension
/// and the time, it says what to do next. See [`Watchdog`](crate::Watchdog) for the rules.
#[derive(Debug, Clone)]
struct Schedule {
    ttl: Duration,
    /// `every * ttl`: how often to extend, and how much validity must be
    /// left for the lock to count as kept while extensions fail.
    period: Duration,
    /// How soon to retry a failed extension.
    retry_gap: Duration,
    /// How long an extension round may take (the per-instance timeout):
    /// a retry is started only if it ends with more than a period left.
    round: Duration,
    cap: Option<u32>,
    deadline: Instant,
    extensions: u32,
    /// The error of the latest attempt, while failing.
    last_error: Option<Error>,
    /// When to retry, while failing.
    retry_at: Option<Instant>,
    /// A reason to give up at once (a refusal, a cap met in the client).
    final_reason: Option<LostReason>,
    /// The lock's validity was never measured ([`Lock::from_parts`]):
    /// extend at once, and give up if that fails.
    unmeasured: bool,
}

impl Schedule {
    fn new(
        ttl: Duration,
        every: f64,
        round: Duration,
        cap: Option<u32>,
        deadline: Instant,
        extensions: u32,
    ) -> Schedule {
        // In whole milliseconds, as Redis counts: `ttl` is whole already.
        let period_ms = (ttl.as_millis() as f64 * every).round() as u64;
        let period = Duration::from_millis(period_ms).max(TICK);
        Schedule {
            ttl,
            period,
            retry_gap: (period / 4).clamp(TICK, RETRY_GAP_MAX),
            round,
            cap,
            deadline,
            extensions,
            last_error: None,
            retry_at: None,
            final_reason: None,
            unmeasured: false,
        }
    }

    /// When the first extension is due if nothing fails.
    fn first_due(&self) -> Instant {
        self.deadline
            .checked_sub(self.ttl.saturating_sub(self.period))
            .unwrap_or(self.deadline)
    }

    /// What to do at `now`.
    #[must_use]
    fn poll_next(&self, now: Instant) -> Next {
        if let Some(reason) = &self.final_reason {
            return Next::Lose(reason.clone());
        }
        if self.unmeasured {
            return match &self.last_error {
                Some(error) => Next::Lose(LostReason::Failed(error.clone())),
                None => Next::Extend,
            };
        }
        let capped = self.cap.filter(|&max| self.extensions >= max);
        let remaining = self.deadline.saturating_duration_since(now);
        if remaining.is_zero() {
            return Next::Lose(match (&self.last_error, capped) {
                (Some(error), _) => LostReason::Failed(error.clone()),
                (None, Some(max)) => LostReason::ExtensionLimit(max),
                (None, None) => LostReason::Expired,
            });
        }
        // At most one period of validity left: time to warn the holder,
        // unless extending still works.
        let low = remaining <= self.period;
        let warn_at = self.deadline.checked_sub(self.period).unwrap_or(now);
        if let Some(max) = capped {
            return if low {
                Next::Lose(LostReason::ExtensionLimit(max))
            } else {
                Next::Wait(warn_at)
            };
        }
        if let Some(error) = &self.last_error {
            // Give up while a retry could still end with a period left: the
            // holder is then warned with at least a period to spare, not a
            // period less a round that was in flight.
            let give_up = self.period.saturating_add(self.round);
            if remaining <= give_up {
                return Next::Lose(LostReason::Failed(error.clone()));
            }
            let give_up_at = self.deadline.checked_sub(give_up).unwrap_or(now);
            return match self.retry_at {
                Some(at) if at > now => Next::Wait(at.min(give_up_at)),
                _ => Next::Extend,
            };
        }
        match self.first_due() {
            due if due > now => Next::Wait(due),
            _ => Next::Extend,
        }
    }

    /// An extension succeeded: the lock is valid until `deadline`.
    fn handle_extended(&mut self, deadline: Instant, extensions: u32) {
        self.unmeasured = false;
        self.deadline = deadline;
        self.extensions = extensions;
        self.last_error = None;
        self.retry_at = None;
    }

    /// A failed extension left the lock valid until `deadline`: no later
    /// than before, and earlier when the attempt shortened some keys.
    fn handle_shortened(&mut self, deadline: Instant) {
        self.deadline = self.deadline.min(deadline);
    }

    /// Moves a pending retry `early` (at most half the retry gap) earlier.
    fn spread_retry(&mut self, early: Duration) {
        let early = early.min(self.retry_gap / 2);
        if let Some(at) = self.retry_at {
            self.retry_at = Some(at.checked_sub(early).unwrap_or(at));
        }
    }

    /// An extension attempt failed at `now`: retry a retry gap later.
    fn handle_failed(&mut self, error: Error, now: Instant) {
        match error {
            Error::NotHeld(_) => self.final_reason = Some(LostReason::Failed(error)),
            // The client's own cap (Config::max_extensions) was met first.
            Error::ExtensionLimit(max) => {
                self.cap = Some(self.cap.map_or(max, |cap| cap.min(max)));
            }
            error => {
                self.last_error = Some(error);
                self.retry_at = now.checked_add(self.retry_gap);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Failure;
    use crate::MAX_TTL_MS;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn failure() -> Failure {
        Failure {
            quorum: 2,
            granted: 1,
            refused: 0,
            votes: Vec::new(),
            elapsed: Duration::ZERO,
            attempts: 1,
            held_by_this_client: None,
        }
    }

    /// A schedule for a lock acquired at `t0` with 900 ms of validity, kept
    /// at a TTL of 900 ms every third (period 300 ms, retries every 50 ms)
    /// by rounds of at most 20 ms: failing, it gives up at 580 ms.
    fn schedule(t0: Instant, cap: Option<u32>) -> Schedule {
        Schedule::new(ms(900), 1.0 / 3.0, ms(20), cap, t0 + ms(900), 0)
    }

    #[test]
    fn the_schedule_extends_every_period_retries_failures_and_gives_up_with_a_period_left() {
        type Setup = fn(&mut Schedule, Instant);
        let t0 = Instant::now();
        let no_quorum = || Error::NoQuorum(failure());
        let cases: [(&str, Setup, u64, Next); 19] = [
            (
                "a fresh lock waits until a period has passed",
                |_, _| {},
                0,
                Next::Wait(t0 + ms(300)),
            ),
            (
                "it extends once a period has passed",
                |_, _| {},
                300,
                Next::Extend,
            ),
            (
                "a lock found with little validity left is extended at once",
                |_, _| {},
                850,
                Next::Extend,
            ),
            (
                "a lock with no validity left is lost, not extended",
                |_, _| {},
                900,
                Next::Lose(LostReason::Expired),
            ),
            (
                "a success moves the next extension a period on",
                |s, t0| s.handle_extended(t0 + ms(1200), 1),
                350,
                Next::Wait(t0 + ms(600)),
            ),
            (
                "a failure waits for its retry",
                |s, t0| s.handle_failed(Error::NoQuorum(failure()), t0 + ms(300)),
                310,
                Next::Wait(t0 + ms(350)),
            ),
            (
                "a failure is retried when its gap has passed",
                |s, t0| s.handle_failed(Error::NoQuorum(failure()), t0 + ms(300)),
                350,
                Next::Extend,
            ),
            (
                "a retry is not scheduled past the point of giving up",
                |s, t0| s.handle_failed(Error::NoQuorum(failure()), t0 + ms(560)),
                565,
                Next::Wait(t0 + ms(580)),
            ),
            (
                "failing with one period and one round left gives the lock up",
                |s, t0| s.handle_failed(Error::NoQuorum(failure()), t0 + ms(550)),
                580,
                Next::Lose(LostReason::Failed(no_quorum())),
            ),
            (
                "a retry that could end with less than a period left is not started",
                |s, t0| s.handle_failed(Error::NoQuorum(failure()), t0 + ms(540)),
                590,
                Next::Lose(LostReason::Failed(no_quorum())),
            ),
            (
                "a failed extension that shortened the keys brings the loss forward",
                |s, t0| {
                    s.handle_shortened(t0 + ms(700));
                    s.handle_failed(Error::NoQuorum(failure()), t0 + ms(300));
                },
                380,
                Next::Lose(LostReason::Failed(no_quorum())),
            ),
            (
                "a failed extension never moves the deadline later",
                |s, t0| {
                    s.handle_shortened(t0 + ms(5000));
                    s.handle_failed(Error::NoQuorum(failure()), t0 + ms(300));
                },
                350,
                Next::Extend,
            ),
            (
                "failing past the deadline reports the last error",
                |s, t0| s.handle_failed(Error::NoQuorum(failure()), t0 + ms(550)),
                1000,
                Next::Lose(LostReason::Failed(no_quorum())),
            ),
            (
                "a refusal gives the lock up at once",
                |s, t0| s.handle_failed(Error::NotHeld(failure()), t0 + ms(300)),
                301,
                Next::Lose(LostReason::Failed(Error::NotHeld(failure()))),
            ),
            (
                "a success clears the failure",
                |s, t0| {
                    s.handle_failed(Error::NoQuorum(failure()), t0 + ms(300));
                    s.handle_extended(t0 + ms(1250), 1);
                },
                360,
                Next::Wait(t0 + ms(650)),
            ),
            (
                "the client's own cap stops extending like the watchdog's",
                |s, t0| s.handle_failed(Error::ExtensionLimit(0), t0 + ms(300)),
                301,
                Next::Wait(t0 + ms(600)),
            ),
            (
                "the client's cap is reported with a period left",
                |s, t0| s.handle_failed(Error::ExtensionLimit(0), t0 + ms(300)),
                600,
                Next::Lose(LostReason::ExtensionLimit(0)),
            ),
            (
                "a lock of unmeasured validity is extended at once",
                |s, _| s.unmeasured = true,
                0,
                Next::Extend,
            ),
            (
                "a lock of unmeasured validity whose first extension fails is lost",
                |s, t0| {
                    s.unmeasured = true;
                    s.handle_failed(Error::NoQuorum(failure()), t0 + ms(1));
                },
                2,
                Next::Lose(LostReason::Failed(no_quorum())),
            ),
        ];
        for (name, setup, at, want) in cases {
            let mut s = schedule(t0, None);
            setup(&mut s, t0);
            assert_eq!(s.poll_next(t0 + ms(at)), want, "{name}");
        }
    }

    #[test]
    fn past_the_cap_nothing_is_extended_and_the_loss_comes_with_a_period_left() {
        let t0 = Instant::now();
        let mut s = schedule(t0, Some(1));
        assert_eq!(s.poll_next(t0 + ms(300)), Next::Extend);
        s.handle_extended(t0 + ms(1200), 1);
        assert_eq!(s.poll_next(t0 + ms(600)), Next::Wait(t0 + ms(900)));
        assert_eq!(
            s.poll_next(t0 + ms(900)),
            Next::Lose(LostReason::ExtensionLimit(1))
        );
        assert_eq!(
            s.poll_next(t0 + ms(1300)),
            Next::Lose(LostReason::ExtensionLimit(1)),
            "past the deadline"
        );
    }

    #[test]
    fn periods_and_retry_gaps_follow_the_ttl_within_bounds() {
        let t0 = Instant::now();
        // (ttl, every, period, retry gap)
        let cases = [
            (ms(30_000), 1.0 / 3.0, ms(10_000), ms(50)),
            (ms(1000), 0.5, ms(500), ms(50)),
            (ms(90), 1.0 / 3.0, ms(30), Duration::from_micros(7500)),
            (ms(2), 0.1, ms(1), ms(1)),
        ];
        for (ttl, every, period, gap) in cases {
            let s = Schedule::new(ttl, every, ms(50), None, t0 + ttl, 0);
            assert_eq!((s.period, s.retry_gap), (period, gap), "{ttl:?} x {every}");
        }
    }

    #[test]
    fn ttls_are_checked_as_the_client_checks_them() {
        let cases = [
            (Duration::ZERO, None, Err(ConfigError::ZeroTtl)),
            (Duration::from_micros(999), None, Err(ConfigError::ZeroTtl)),
            (Duration::from_micros(1500), None, Ok(ms(1))),
            (ms(MAX_TTL_MS + 1), None, Err(ConfigError::TtlTooLarge)),
            (
                ms(61_000),
                Some(ms(60_000)),
                Err(ConfigError::TtlOverQuarantine(ms(60_000))),
            ),
            (ms(60_000), Some(ms(60_000)), Ok(ms(60_000))),
        ];
        for (ttl, quarantine, want) in cases {
            let mut config = Config::new(["redis://127.0.0.1:1"]).unwrap();
            config.quarantine = quarantine;
            assert_eq!(config.checked_ttl(ttl), want, "{ttl:?}");
        }
    }

    #[test]
    fn a_loss_reads_as_its_reason_and_the_validity_left() {
        let at = Instant::now();
        let lost = Lost {
            reason: LostReason::ExtensionLimit(3),
            at,
            deadline: at + ms(250),
            extensions: 3,
        };
        assert_eq!(
            lost.to_string(),
            "extension limit reached (3 extensions); 250 ms of validity left when reported"
        );
        assert_eq!(lost.left_when_reported(), ms(250));
    }

    /// A kept lock as the loop holds it: 900 ms of validity from `at`, on
    /// both clocks, kept at 900 ms every third.
    fn kept_for_900ms(at: crate::clock::Stamp) -> Keeper {
        let mut lock = Lock::from_parts(
            "r",
            crate::token::TokenSource::from_seed([7; 16]).next_token(),
        );
        lock.ttl = ms(900);
        lock.expiry = crate::clock::Expiry::after(at, ms(900)).unwrap();
        let schedule = Schedule::new(ms(900), 1.0 / 3.0, ms(20), None, at.mono + ms(900), 0);
        let shared = Arc::new(Shared::new(lock.clone()));
        Keeper {
            lock,
            schedule,
            shared,
            on_lost: None,
            lost: false,
        }
    }

    /// After a suspend longer than the validity left,
    /// the keys are gone on the masters; the schedule must see it at once
    /// (the boot clock counts the suspend), not wait for the monotonic
    /// deadline fixed before the suspend.
    #[test]
    fn a_suspend_past_the_deadline_is_a_loss_at_once() {
        use crate::clock::{BootInstant, Stamp};
        let at = Stamp {
            mono: Instant::now(),
            boot: BootInstant::now(),
        };
        let mut keeper = kept_for_900ms(at);
        // 100 ms later on the monotonic clock, 10 s later on the boot clock.
        let woke = Stamp {
            mono: at.mono + ms(100),
            boot: at.boot.checked_add(Duration::from_secs(10)).unwrap(),
        };
        assert_eq!(keeper.poll(woke), KeepStep::Idle, "lost at once");
        assert!(
            matches!(
                keeper.shared.state().lost,
                Some(Lost {
                    reason: LostReason::Expired,
                    ..
                })
            ),
            "{:?}",
            keeper.shared.state().lost
        );
        // Without a suspend, the same instant waits for the first extension.
        let mut keeper = kept_for_900ms(at);
        let awake = Stamp {
            mono: at.mono + ms(100),
            boot: at.boot.checked_add(ms(100)).unwrap(),
        };
        assert_eq!(keeper.poll(awake), KeepStep::Wait(at.mono + ms(300)));
    }

    /// For kept locks: an extension shortens the lock the
    /// holder sees before it is sent, so that a loop that never hears back
    /// leaves no claim beyond what the keys keep.
    #[test]
    fn an_extension_to_a_shorter_ttl_shortens_the_holders_lock_before_it_is_sent() {
        use crate::clock::{BootInstant, Stamp};
        let at = Stamp {
            mono: Instant::now(),
            boot: BootInstant::now(),
        };
        let mut keeper = kept_for_900ms(at);
        let config = Config::new(["redis://127.0.0.1:1"]).unwrap();
        let sent = keeper.start_extension(&config, ms(100), at).unwrap();
        let span = config.validity_span(ms(100)).unwrap();
        assert!(sent.expiry.deadline(at) <= at.mono + span);
        assert!(keeper.shared.state().lock.expiry.deadline(at) <= at.mono + span);
        // A TTL the client refuses sends nothing and changes nothing.
        let before = keeper.shared.state().lock.clone();
        assert!(keeper.start_extension(&config, Duration::ZERO, at).is_err());
        assert_eq!(keeper.shared.state().lock, before);
    }

    /// Kept locks that one shared failure (a dropped
    /// connection) failed at one instant retry at different instants,
    /// each within the second half of the retry gap.
    #[test]
    fn retries_after_one_shared_failure_are_spread() {
        use crate::clock::{BootInstant, Stamp};
        let at = Stamp {
            mono: Instant::now(),
            boot: BootInstant::now(),
        };
        let mut jitter = SplitMix64(42);
        let retries: Vec<Instant> = (0..16)
            .map(|_| {
                let mut keeper = kept_for_900ms(at);
                let lock = keeper.lock.clone();
                keeper.handle_extended(lock, Err(Error::NoQuorum(failure())), at, &mut jitter);
                keeper.schedule.retry_at.unwrap()
            })
            .collect();
        let gap = kept_for_900ms(at).schedule.retry_gap;
        assert!(
            retries
                .iter()
                .all(|r| *r >= at.mono + gap / 2 && *r <= at.mono + gap),
            "{retries:?}"
        );
        let mut distinct = retries.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 8, "{retries:?}");
    }
}
