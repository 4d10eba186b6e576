//! One caller's operation as a sans-IO state machine: its rounds, its
//! cleanup releases, its retry waits, and the rules that turn votes into
//! a [`Lock`] or an [`Error`].
//!
//! A [`Job`] says what it needs next ([`Job::poll`]: run a round, send a
//! release nobody waits for, wait until an instant, or done) and is told
//! each round's outcome ([`Job::handle_round`]). The single-thread
//! [`Redlock`](crate::Redlock) runs a job to its end on the caller's
//! thread; the shared client's event loop runs thousands at once, their
//! rounds pipelined together. Both run this one copy of the spec's rules:
//! the quorum and validity check, the release to all N masters after a
//! failed acquire, retries with jitter, the fence's two phases, the
//! extension cap, the shortening of a lock whose extend failed. Nothing
//! here does I/O or reads a clock: `now` and each round's [`Stamp`]s are
//! passed in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::clock::{Expiry, Stamp};
use crate::config::{Config, ConfigError, Retry};
use crate::conn::{Keys, Op, Request};
use crate::engine::Wait;
use crate::error::{Error, Failure, MasterVote};
use crate::lock::Lock;
use crate::metrics;
use crate::quorum::{Decision, FencePlan, Loss, Round, Vote, plan_fence};
use crate::resource::ResourceName;
use crate::script::FENCE_STATE_KEY;
use crate::token::{Token, TokenSource};
use crate::wait::Cohort;

/// What a job needs from the client it runs on, borrowed per call.
#[derive(Debug)]
pub(crate) struct Ctx<'a> {
    pub(crate) config: &'a Config,
    /// Each master's URL, password hidden, for error reports.
    pub(crate) names: &'a [Arc<str>],
    pub(crate) tokens: &'a mut TokenSource,
    pub(crate) jitter: &'a mut SplitMix64,
}

/// What a job needs next.
#[derive(Debug)]
pub(crate) enum Step<'a> {
    /// A round of `requests`, complete as `wait` says; then
    /// [`Job::handle_round`].
    Round {
        requests: &'a [Request],
        timeout: Duration,
        wait: Wait,
    },
    /// Requests sent without waiting for their replies (releases) to
    /// every master but those whose bit is set in `skip` (bit `i` for
    /// master `i`); then [`Job::poll`] again.
    Send { requests: &'a [Request], skip: u64 },
    /// Nothing until this instant (a retry's wait); then [`Job::poll`].
    Sleep(Instant),
    /// Wait for `resource` to be released: join its queue of local
    /// waiters and subscribe to its releases; once subscribed and at the
    /// head of the queue, [`Job::handle_subscribed`], then [`Job::poll`].
    /// A client that cannot subscribe calls both at once.
    Subscribe(&'a Bytes),
    /// Nothing until `until` (when the holder's key expires) or until
    /// `resource` is released, whichever comes first; then [`Job::wake`]
    /// and [`Job::poll`]. A client that cannot be told of releases sleeps
    /// until `until`.
    Await {
        resource: &'a Bytes,
        until: Instant,
        /// Backing off after a split vote: only a release heard from now
        /// on ends the wait early, not one of the messages of a release
        /// the last attempt already followed.
        backoff: bool,
    },
    /// Finished: [`Job::take_output`] has the result.
    Done,
}

/// A finished job's result.
#[derive(Debug)]
pub(crate) enum Output {
    /// An acquire's.
    Lock(Result<Lock, Error>),
    /// An extend's: the lock as it now stands (extended, or shortened by
    /// the failed attempt), and whether it was extended.
    Extended(Lock, Result<(), Error>),
    /// A release's.
    Released(Result<(), Error>),
    /// A batch acquire's, one per resource.
    Locks(Vec<Result<Lock, Error>>),
    /// A batch release's, one per lock.
    Releases(Vec<Result<(), Error>>),
    /// Any operation's, when it ended without its own output: the shared
    /// client's event loop stopped while it was under way.
    Failed(Error),
}

impl Output {
    /// The first error in it, if any: a batch's outcome is its first
    /// failure's.
    pub(crate) fn first_error(&self) -> Option<&Error> {
        match self {
            Output::Failed(error) => Some(error),
            Output::Lock(result) => result.as_ref().err(),
            Output::Extended(_, result) | Output::Released(result) => result.as_ref().err(),
            Output::Locks(results) => results.iter().find_map(|r| r.as_ref().err()),
            Output::Releases(results) => results.iter().find_map(|r| r.as_ref().err()),
        }
    }
}

/// One caller's operation.
// Held by value in the caller's frame or the loop's table: boxing the large
// variant would cost an allocation per operation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Job {
    Acquire(Acquire),
    Extend(Extend),
    Release(Release),
    AcquireBatch(Batch),
    ReleaseBatch(Batch),
}

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The (first) round is to be run.
    Round,
    /// Waiting for the round's outcome.
    Waiting,
    /// A fenced acquire's write-back is to be run.
    FenceRound,
    /// Waiting for the write-back's outcome.
    FenceWaiting,
    /// The cleanup release is to be sent, then `then`.
    Cleanup,
    /// Retrying at this instant.
    Sleep(Instant),
    /// To join the resource's waiters and subscribe to its releases.
    Subscribe,
    /// Waiting for a release, or for the holder's key to expire at this
    /// instant.
    Await(Instant),
    /// Finished.
    Done,
}

impl Job {
    /// What the job needs next, at `now`.
    pub(crate) fn poll(&mut self, ctx: &mut Ctx<'_>, now: Instant) -> Step<'_> {
        match self {
            Job::Acquire(job) => job.poll(ctx, now),
            Job::Extend(job) => job.stage.single_round(&job.request, job.timeout),
            Job::Release(job) => job.stage.single_round(&job.request, job.timeout),
            Job::AcquireBatch(job) | Job::ReleaseBatch(job) => job.poll(),
        }
    }

    /// The outcome of the round last asked for, which started at `started`
    /// and ended (was complete) at `ended`.
    pub(crate) fn handle_round(
        &mut self,
        ctx: &mut Ctx<'_>,
        round: &Round,
        started: Stamp,
        ended: Stamp,
    ) {
        match self {
            Job::Acquire(job) => job.handle_round(ctx, round, started, ended),
            Job::Extend(job) => job.handle_round(ctx, round, started, ended),
            Job::Release(job) => job.handle_round(ctx, round, ended),
            Job::AcquireBatch(job) => job.handle_acquired(ctx, round, started, ended),
            Job::ReleaseBatch(job) => job.handle_released(ctx, round, ended),
        }
    }

    /// The output of a job that cannot go on (its client's event loop
    /// stopped): `error` for each of its results; an extend's lock as it
    /// stands (shortened before it was sent).
    pub(crate) fn stopped(&self, error: &Error) -> Output {
        match self {
            Job::Acquire(_) | Job::AcquireBatch(_) => Output::Lock(Err(error.clone())),
            Job::Extend(job) => Output::Extended(job.lock.clone(), Err(error.clone())),
            Job::Release(_) => Output::Released(Err(error.clone())),
            Job::ReleaseBatch(job) => {
                Output::Releases(vec![Err(error.clone()); job.requests.len()])
            }
        }
    }

    /// The most requests the job's next step may send (a round's, or a
    /// cleanup's): what the admission gate makes room for; 0 when it
    /// sends nothing more (its round is out, or it is done).
    pub(crate) fn round_size(&self) -> usize {
        let sends = match self {
            Job::Acquire(job) => !matches!(
                job.stage,
                Stage::Waiting | Stage::FenceWaiting | Stage::Done
            ),
            Job::Extend(Extend { stage, .. }) | Job::Release(Release { stage, .. }) => {
                *stage == Stage::Round
            }
            Job::AcquireBatch(batch) | Job::ReleaseBatch(batch) => {
                matches!(batch.stage, Stage::Round | Stage::Cleanup)
            }
        };
        match self {
            _ if !sends => 0,
            Job::AcquireBatch(batch) | Job::ReleaseBatch(batch) => batch.requests.len(),
            _ => 1,
        }
    }

    /// Stops a job at its next wait instead of retrying (the last handle
    /// went): an acquire queued before any attempt still makes one, which
    /// says why it ends.
    pub(crate) fn abandon(&mut self) {
        if let Job::Acquire(job) = self {
            job.abandoned = true;
        }
    }

    /// Ends a job whose caller went away at its next wait, with no further
    /// attempt: not even the one a queued acquire that has not tried makes
    /// when it is [abandoned](Job::abandon) (SAFETY.md, *Cancellation and
    /// shutdown*). A round under way runs to its decision.
    pub(crate) fn cancel(&mut self) {
        if let Job::Acquire(job) = self {
            job.abandoned = true;
            job.cancelled = !crate::knobs::injected(crate::knobs::Bug::DroppedWaiterTries);
        }
    }

    /// The subscription [`Step::Subscribe`] asked for is in place and the
    /// job is at the head of its queue: it may try.
    pub(crate) fn handle_subscribed(&mut self) {
        if let Job::Acquire(job) = self
            && job.stage == Stage::Subscribe
        {
            job.stage = Stage::Round;
        }
    }

    /// The resource a [`Step::Await`] waits for was released: try now.
    pub(crate) fn wake(&mut self) {
        if let Job::Acquire(job) = self
            && matches!(job.stage, Stage::Await(_))
        {
            job.stage = Stage::Round;
        }
    }

    /// A waiting acquire's next attempt follows a release of its lock by
    /// this client in the same write, a hand-over of `cohort`: it tries at
    /// once, and its lock, if it gets it, carries the cohort on.
    pub(crate) fn handle_handover(&mut self, cohort: Cohort) {
        if let Job::Acquire(job) = self {
            job.handed = Some(cohort);
            // Right behind this client's release of the key, the attempt
            // is a plain SET NX, not the script that reports the holder:
            // no Lua for the masters to run, and a refusal (the release
            // freed nothing) is rare.
            if job.request.op == Op::AcquireWait {
                job.request.op = Op::Acquire;
            }
            if matches!(job.stage, Stage::Await(_) | Stage::Sleep(_)) {
                job.stage = Stage::Round;
            }
        }
    }

    /// A waiting acquire between attempts: waiting for a release, a key's
    /// expiry or a retry's delay (see [`Job::handle_handover`]).
    pub(crate) fn is_between_attempts(&self) -> bool {
        matches!(self, Job::Acquire(job) if matches!(job.stage, Stage::Await(_) | Stage::Sleep(_)))
    }

    /// A waiting acquire whose attempt (a fenced one's first phase) is
    /// under way: not one writing its fence back, which won its attempt.
    pub(crate) fn is_attempting(&self) -> bool {
        matches!(self, Job::Acquire(job) if job.stage == Stage::Waiting)
    }

    /// A queued waiting acquire promoted to the head of its queue while the
    /// lock is held in this client, by the waiter before it, until
    /// `deadline`: instead of trying (the masters would refuse it), it
    /// waits for that holder's release, handed over to it
    /// (see [`Job::handle_handover`]) or published, or for the deadline.
    /// Whether it waits so (only a queued acquire that has not tried does).
    pub(crate) fn handle_held_here(&mut self, deadline: Instant) -> bool {
        match self {
            Job::Acquire(job) if job.stage == Stage::Subscribe && !job.abandoned => {
                let until = job.wait_until.map_or(deadline, |w| w.min(deadline));
                job.stage = Stage::Await(until);
                true
            }
            _ => false,
        }
    }

    /// A new waiting acquire at the head of its queue while another
    /// process's turn at the lock is under way (named by the last
    /// release): instead of trying at once, ahead of that process, it
    /// waits, as the waiters that release woke do, until `until` or the
    /// next release. Whether it waits so (only a queued acquire that has
    /// not tried does).
    pub(crate) fn handle_turn(&mut self, until: Instant) -> bool {
        match self {
            Job::Acquire(job)
                if job.stage == Stage::Subscribe && job.attempt == 0 && !job.abandoned =>
            {
                let until = job.wait_until.map_or(until, |w| w.min(until));
                job.stage = Stage::Await(until);
                true
            }
            _ => false,
        }
    }

    /// The resource of the single-resource lock this job took, until when
    /// it is valid at `now`, and its token, if it took one.
    pub(crate) fn granted(&self, now: Stamp) -> Option<(&Bytes, Instant, Token)> {
        match self {
            Job::Acquire(job) => match (&job.result, &job.keys) {
                (Some(Ok(lock)), Keys::One(resource)) => {
                    Some((resource, lock.expiry.deadline(now), lock.token))
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// A finished acquire's lock goes on with `row`: the row of hand-overs
    /// this client's last unannounced release handed on, no lock taken
    /// here since (see
    /// [`Room::handle_granted`](crate::wait::Room::handle_granted)),
    /// unless it carries the row its waiter was handed already.
    pub(crate) fn go_on_with(&mut self, row: Cohort) {
        if let Job::Acquire(job) = self
            && let Some(Ok(lock)) = &mut job.result
        {
            lock.cohort.get_or_insert(row);
        }
    }

    /// A finished extend of a lock of one key: the key, the lock's
    /// deadline now (later when confirmed, shortened when not: see
    /// [`Extend::shorten`]) and its token.
    pub(crate) fn extended(&self, now: Stamp) -> Option<(&Bytes, Instant, Token)> {
        match self {
            Job::Extend(job) if job.result.is_some() => match &job.lock.keys {
                Keys::One(resource) => {
                    Some((resource, job.lock.expiry.deadline(now), job.lock.token))
                }
                Keys::Many(_) => None,
            },
            _ => None,
        }
    }

    /// A new acquire of a resource other local waiters already wait for
    /// queues behind them instead of racing them. Returns the resource
    /// when the job joined the wait.
    pub(crate) fn queue_first(&mut self) -> Option<&Bytes> {
        match self {
            Job::Acquire(job) if job.notify && job.attempt == 0 && job.op != Op::AcquireMany => {
                job.start_waiting();
                job.keys.as_slice().first()
            }
            _ => None,
        }
    }

    /// The resource a waiting acquire would wait for, before it started.
    pub(crate) fn resource(&self) -> Option<&Bytes> {
        match self {
            Job::Acquire(job) if job.notify && job.op != Op::AcquireMany => {
                job.keys.as_slice().first()
            }
            _ => None,
        }
    }

    /// The resources a multi-resource waiting acquire listens to: a
    /// release of any of them wakes it. It joins no resource's queue and
    /// is handed no lock.
    pub(crate) fn listens_to(&self) -> Option<&Keys> {
        match self {
            Job::Acquire(job) if job.notify && job.op == Op::AcquireMany => Some(&job.keys),
            _ => None,
        }
    }

    /// When an acquire made its first attempt.
    pub(crate) fn waiting_since(&self) -> Option<Instant> {
        match self {
            Job::Acquire(job) => Some(job.first),
            _ => None,
        }
    }

    /// A finished release that ended a row of hand-overs (see
    /// [`Release::yielded`]), done: the key it freed and its token. Its
    /// client's waiters are told of it unless a master's message of it
    /// has reached them first: masters that refuse this client PUBLISH
    /// (an ACL), or whose messages come late, leave them nothing else to
    /// go by but the lock's expiry, while it is free.
    pub(crate) fn yielded_release(&self) -> Option<(&Bytes, Token)> {
        match self {
            Job::Release(job) if job.yielded && matches!(job.result, Some(Ok(()))) => {
                job.resource().map(|resource| (resource, job.request.token))
            }
            _ => None,
        }
    }

    /// Whether a waiting acquire's attempts, refused, publish the notice
    /// that its process waits (see [`Request::notice`]).
    pub(crate) fn ask_notice(&mut self, notice: bool) {
        if let Job::Acquire(job) = self {
            job.request.notice = notice;
        }
    }

    /// When a waiting acquire gives up waiting.
    pub(crate) fn give_up_at(&self) -> Option<Instant> {
        match self {
            Job::Acquire(job) => job.wait_until,
            _ => None,
        }
    }

    /// What a finished release (or batch of releases) freed, to tell this
    /// client's waiters at once: each key and its token, where a quorum
    /// confirmed it;
    /// nothing for a release handed over or yielded (see
    /// [`Release::unannounced`], [`Release::yielded`]).
    pub(crate) fn for_each_released(&self, mut freed: impl FnMut(&[u8], Token)) {
        let mut each = |request: &Request| {
            for key in request.keys.as_slice() {
                freed(key, request.token);
            }
        };
        match self {
            Job::Release(job) if job.tells_locally && matches!(job.result, Some(Ok(()))) => {
                each(&job.request)
            }
            Job::ReleaseBatch(job) => {
                let results = job.releases.iter().flatten();
                for (request, result) in job.requests.iter().zip(results) {
                    if result.is_ok() {
                        each(request);
                    }
                }
            }
            _ => {}
        }
    }

    /// A batch's request list, for reuse by the next batch; none for
    /// other jobs.
    pub(crate) fn into_requests(self) -> Option<Vec<Request>> {
        match self {
            Job::AcquireBatch(batch) | Job::ReleaseBatch(batch) => Some(batch.into_requests()),
            _ => None,
        }
    }

    /// The result, once [`Step::Done`], taken at `now` (for the metrics).
    pub(crate) fn take_output(&mut self, now: Instant) -> Option<Output> {
        match self {
            Job::Acquire(job) => job.result.take().map(|r| {
                let last = job.phase_one.map(|s| s.mono);
                metrics::acquired(&r, job.first, last, job.attempt, now);
                Output::Lock(r)
            }),
            Job::Extend(job) => job.result.take().map(|r| {
                metrics::extended(&r);
                Output::Extended(job.lock.clone(), r)
            }),
            Job::Release(job) => job.result.take().map(|r| {
                metrics::released(&r);
                Output::Released(r)
            }),
            Job::AcquireBatch(job) => job.locks.take().map(|locks| {
                for r in &locks {
                    metrics::acquired(r, job.first, Some(job.first), 1, now);
                }
                Output::Locks(locks)
            }),
            Job::ReleaseBatch(job) => job.releases.take().map(|releases| {
                releases.iter().for_each(metrics::released);
                Output::Releases(releases)
            }),
        }
    }

    /// A span for this job, which is about to start (feature `tracing`).
    #[inline(always)]
    pub(crate) fn span(&self) -> metrics::OpSpan {
        let (op, resource) = self.describe();
        metrics::OpSpan::new(op, resource)
    }

    /// What the job does, and its (first) resource: for its span.
    #[inline(always)]
    fn describe(&self) -> (&'static str, Option<&Bytes>) {
        fn first(requests: &[Request]) -> Option<&Bytes> {
            requests.first().and_then(|r| r.keys.as_slice().first())
        }
        match self {
            Job::Acquire(job) => ("acquire", job.keys.as_slice().first()),
            Job::Extend(job) => ("extend", job.lock.keys.as_slice().first()),
            Job::Release(job) => ("release", job.request.keys.as_slice().first()),
            Job::AcquireBatch(job) => ("acquire_batch", first(&job.requests)),
            Job::ReleaseBatch(job) => ("release_batch", first(&job.requests)),
        }
    }
}

impl Stage {
    fn single_round<'a>(&mut self, request: &'a Request, timeout: Duration) -> Step<'a> {
        match *self {
            Stage::Round => {
                *self = Stage::Waiting;
                Step::Round {
                    requests: std::slice::from_ref(request),
                    timeout,
                    wait: Wait::Decision,
                }
            }
            _ => Step::Done,
        }
    }
}

/// An acquire of one resource, a fenced one, or several resources at
/// once, with its retries.
#[derive(Debug)]
pub(crate) struct Acquire {
    /// What the lock holds (the lock key alone for a fenced acquire).
    keys: Keys,
    op: Op,
    ttl: Duration,
    retry: Retry,
    timeout: Duration,
    first: Instant,
    give_up: Option<Instant>,
    attempt: u32,
    /// The phase-one request (its token changes per attempt).
    request: Request,
    /// A fenced acquire's write-back, once planned; then the cleanup
    /// release after a failure.
    second: Option<Request>,
    /// When the last phase one started: a fenced lock's validity counts
    /// both phases.
    phase_one: Option<Stamp>,
    stage: Stage,
    /// Where to go after the cleanup.
    after_cleanup: After,
    /// The masters the cleanup leaves out (bit `i` for master `i`): those
    /// that refused the failed attempt hold no key with its token, which
    /// no other request carries (tokens change per attempt), so a release
    /// there would do nothing.
    clean_skip: u64,
    /// The error to return if no attempt is left.
    last_error: Option<Error>,
    result: Option<Result<Lock, Error>>,
    abandoned: bool,
    /// Its caller went away: it ends at its next wait, with no attempt
    /// more (see [`Job::cancel`]).
    cancelled: bool,
    /// Waits for a held lock by release notification and key expiry
    /// ([`Config::wake_on_release`]); only a single resource's plain
    /// acquire with retries does.
    notify: bool,
    /// Has asked to be subscribed ([`Step::Subscribe`]).
    subscribed: bool,
    /// Until when a notified wait lasts: `max_wait`, else `attempts *
    /// delay` from the first attempt.
    wait_until: Option<Instant>,
    /// Attempts made after a wait for a held lock: they do not use up
    /// [`Retry::attempts`].
    waited: u32,
    /// The next attempt follows a wait for a held lock.
    after_wait: bool,
    /// The row of in-process hand-overs the lock of this attempt, if it
    /// succeeds, is the last of (none: not a hand-over).
    handed: Option<Cohort>,
    /// Waiting attempts in a row that met a split (see
    /// [`Acquire::next_wait`]): each doubles the longest delay before the
    /// next, up to [`SPLIT_DOUBLINGS`] times.
    splits: u32,
    /// The holder last seen refusing with the failed masters' help alone:
    /// seen again after a look, it is taken for a holder (see
    /// `next_wait`).
    suspect: Option<u64>,
}

/// How many times a run of splits doubles a waiting acquire's longest
/// delay before it tries again (from twice the round trip, at most the
/// retry delay): racers that split the masters again and again spread
/// apart, and none spins.
const SPLIT_DOUBLINGS: u32 = 12;

/// Where an acquire goes after the cleanup release of a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// Finish with the last error.
    Finish,
    /// Try again at this instant, whatever happens meanwhile.
    Sleep(Instant),
    /// Subscribe to the resource's releases, then try again.
    Subscribe,
    /// Wait for a release, or until this instant.
    Await(Instant),
}

impl Acquire {
    /// An acquire of `keys` (one resource, or several with
    /// [`Op::AcquireMany`], or one fenced with [`Op::AcquireFenced`]).
    ///
    /// # Errors
    /// A TTL the client refuses, or a retry policy with no attempt.
    pub(crate) fn new(
        ctx: &mut Ctx<'_>,
        keys: Keys,
        op: Op,
        ttl: Duration,
        retry: &Retry,
        now: Instant,
    ) -> Result<Acquire, Error> {
        let ttl = ctx.config.checked_ttl(ttl)?;
        retry.check()?;
        checked_names(keys.as_slice())?;
        // A fenced acquire's requests also name the fence key and the
        // master's fencing state; its lock, like its release, names the
        // lock key alone.
        let wire_keys = match (&keys, op) {
            (Keys::One(key), Op::AcquireFenced) => Keys::Many(Arc::from([
                key.clone(),
                fence_key(key),
                Bytes::from_static(FENCE_STATE_KEY),
            ])),
            _ => keys.clone(),
        };
        // A plain acquire waits for releases and learns the holder's expiry
        // from its waiting script; a fenced one, whose script does not tell
        // it, waits for a release or a retry's delay. So does a
        // multi-resource one, woken by a release of any of its resources
        // (on its first resource's alone it missed the others': the
        // simulator's waiting checker caught such waits of a retry's
        // delay).
        let notify = ctx.config.wake_on_release
            && matches!(op, Op::Acquire | Op::AcquireFenced | Op::AcquireMany)
            && retry.attempts > 1;
        let span = retry
            .delay
            .checked_mul(retry.attempts)
            .and_then(|span| now.checked_add(span));
        let give_up = retry.max_wait.and_then(|w| now.checked_add(w));
        Ok(Acquire {
            request: Request {
                op,
                keys: wire_keys,
                token: ctx.tokens.next_token(),
                arg: millis(ttl),
                notice: false,
            },
            notify,
            subscribed: false,
            wait_until: if retry.max_wait.is_some() {
                give_up
            } else {
                span
            },
            waited: 0,
            after_wait: false,
            splits: 0,
            suspect: None,
            handed: None,
            keys,
            op,
            ttl,
            retry: *retry,
            timeout: ctx.config.per_instance_timeout.min(ttl),
            first: now,
            give_up,
            attempt: 0,
            second: None,
            phase_one: None,
            stage: Stage::Round,
            after_cleanup: After::Finish,
            clean_skip: 0,
            last_error: None,
            result: None,
            abandoned: false,
            cancelled: false,
        })
    }

    /// From now on the acquire waits for releases: its attempts run the
    /// script that reports the holder's remaining time.
    fn start_waiting(&mut self) {
        self.subscribed = true;
        if self.request.op == Op::Acquire {
            self.request.op = Op::AcquireWait;
        }
        self.after_wait = true;
        self.stage = Stage::Subscribe;
    }

    fn poll(&mut self, ctx: &mut Ctx<'_>, now: Instant) -> Step<'_> {
        let waiting = matches!(
            self.stage,
            Stage::Sleep(_) | Stage::Await(_) | Stage::Subscribe
        ) || (self.stage == Stage::Round && (self.attempt > 0 || self.subscribed));
        let out_of_time = self.wait_until.is_some_and(|w| now >= w);
        if waiting && self.cancelled {
            // Its caller is gone: nobody needs to hear why it ends.
            let error = self
                .last_error
                .take()
                .unwrap_or_else(|| untried(ctx.names.len(), self.first, self.attempt, now));
            self.result = Some(Err(error));
            self.stage = Stage::Done;
            return Step::Done;
        }
        if waiting && (self.abandoned || (out_of_time && self.stage == Stage::Subscribe)) {
            if self.last_error.is_some() {
                self.result = self.last_error.take().map(Err);
                self.stage = Stage::Done;
                return Step::Done;
            }
            // Queued before any attempt: one attempt says why it ends.
            self.stage = Stage::Round;
        }
        match self.stage {
            Stage::Sleep(at) if now < at => Step::Sleep(at),
            Stage::Subscribe => match self.keys.as_slice().first() {
                Some(resource) => Step::Subscribe(resource),
                None => Step::Done,
            },
            Stage::Await(until) if now < until => match self.keys.as_slice().first() {
                Some(resource) => Step::Await {
                    resource,
                    until,
                    backoff: self.splits > 0,
                },
                None => Step::Done,
            },
            Stage::Sleep(_) | Stage::Await(_) | Stage::Round => {
                if self.attempt > 0 {
                    self.request.token = ctx.tokens.next_token();
                }
                self.attempt += 1;
                if std::mem::take(&mut self.after_wait) {
                    self.waited += 1;
                }
                self.stage = Stage::Waiting;
                // Phase one of a fenced acquire waits past its decision for
                // the reports the fence needs, within the round's time.
                let wait = match self.op {
                    Op::AcquireFenced => Wait::Fence {
                        readmit: readmit(ctx.config),
                    },
                    _ => Wait::Decision,
                };
                Step::Round {
                    requests: std::slice::from_ref(&self.request),
                    timeout: self.timeout,
                    wait,
                }
            }
            Stage::FenceRound => {
                self.stage = Stage::FenceWaiting;
                match &self.second {
                    Some(write_back) => Step::Round {
                        requests: std::slice::from_ref(write_back),
                        timeout: self.timeout,
                        wait: Wait::Decision,
                    },
                    None => Step::Done,
                }
            }
            Stage::Cleanup => {
                self.stage = match self.after_cleanup {
                    After::Sleep(at) => Stage::Sleep(at),
                    After::Await(at) => Stage::Await(at),
                    After::Subscribe => {
                        self.start_waiting();
                        Stage::Subscribe
                    }
                    After::Finish => {
                        self.result = self.last_error.take().map(Err);
                        Stage::Done
                    }
                };
                match &self.second {
                    Some(cleanup) => Step::Send {
                        requests: std::slice::from_ref(cleanup),
                        skip: std::mem::take(&mut self.clean_skip),
                    },
                    None => Step::Done,
                }
            }
            Stage::Waiting | Stage::FenceWaiting | Stage::Done => Step::Done,
        }
    }

    fn handle_round(&mut self, ctx: &mut Ctx<'_>, round: &Round, started: Stamp, ended: Stamp) {
        // A hand-over's plain attempt is over: later ones wait again.
        if self.subscribed && self.request.op == Op::Acquire {
            self.request.op = Op::AcquireWait;
        }
        match self.stage {
            Stage::Waiting => {
                self.phase_one = Some(started);
                let Some(expiry) = validity(ctx.config, round, 0, started, ended, self.ttl) else {
                    let handed = self.handed.take().is_some();
                    let error = verdict(ctx, round, self.op, 0, self.first, self.attempt, ended);
                    let next = self.next_wait(ctx, &error, round, started, ended);
                    // Held elsewhere, or split among racers (a quorum
                    // refused, or refused and failed): the attempt's keys
                    // sit on a minority, nobody waits for them (a holder's
                    // waiters wait for its release, racers try again on
                    // their own), and the cleanup publishes nothing (see
                    // `CLEANUP_SOURCE`). A hand-over's attempt follows a
                    // release nobody else heard of: the keys it got are
                    // released to all, the cleanup publishing.
                    let cleanup = if !handed && round.refused(0) + round.failed(0) >= round.quorum()
                    {
                        cleanup_op(&self.keys)
                    } else {
                        release_op(&self.keys)
                    };
                    let skip = refused_masters(round.votes(0));
                    return self.fail_then(ctx, error, ended.mono, next, cleanup, skip);
                };
                if self.op != Op::AcquireFenced {
                    return self.succeed(expiry, None);
                }
                self.plan_fence(ctx, round, ended);
            }
            Stage::FenceWaiting => {
                let fence = self.second.as_ref().map_or(0, |r| r.arg);
                if round.decision(0) == Some(Decision::Won)
                    && let Some(expiry) = self
                        .phase_one
                        .and_then(|started| expiry(ctx.config, started, ended, self.ttl))
                {
                    return self.succeed(expiry, Some(fence.unsigned_abs()));
                }
                // Refusals here mean the lock key was gone, not held
                // elsewhere.
                let error = match verdict(ctx, round, Op::Fence, 0, self.first, self.attempt, ended)
                {
                    Error::NotHeld(f) => Error::FenceRefused(f),
                    Error::NoQuorum(f) if round.loss(0) == Loss::Refused => Error::FenceRefused(f),
                    other => other,
                };
                self.fail(ctx, error, ended.mono);
            }
            _ => {}
        }
    }

    /// Phase two of a fenced acquire whose first round won with validity
    /// left: decides the fence from what the masters reported
    /// ([`plan_fence`]) and asks for the write-back to every master. The
    /// fence is valid once a quorum confirms it within the validity,
    /// counted from the start of the first round.
    fn plan_fence(&mut self, ctx: &mut Ctx<'_>, round: &Round, ended: Stamp) {
        let decided = plan_fence(
            round.votes(0),
            round.fence_reads(0),
            round.quorum(),
            readmit(ctx.config),
        );
        let (fence, directive) = match decided {
            FencePlan::Write { fence, directive } => (fence, directive),
            FencePlan::Unknown { .. } => {
                let untrusted = ctx
                    .names
                    .iter()
                    .zip(round.votes(0).iter().zip(round.fence_reads(0)))
                    .filter(|(_, (vote, read))| {
                        **vote == Vote::Granted && !read.is_some_and(|r| r.is_trusted())
                    })
                    .map(|(name, _)| Arc::clone(name))
                    .collect();
                let error = Error::FenceUnknown {
                    failure: failure(ctx, round, 0, self.first, self.attempt, ended),
                    untrusted,
                };
                return self.fail(ctx, error, ended.mono);
            }
        };
        let mut keys = self.request.keys.as_slice().to_vec();
        keys.push(directive.to_bytes());
        self.second = Some(Request {
            op: Op::Fence,
            keys: Keys::Many(Arc::from(keys)),
            token: self.request.token,
            arg: fence,
            notice: false,
        });
        self.stage = Stage::FenceRound;
    }

    fn succeed(&mut self, expiry: Expiry, fence: Option<u64>) {
        self.result = Some(Ok(Lock {
            keys: self.keys.clone(),
            token: self.request.token,
            ttl: self.ttl,
            expiry,
            extensions: 0,
            fence,
            cohort: self.handed,
        }));
        self.stage = Stage::Done;
    }

    /// An attempt failed: the keys may have been set where no reply came
    /// back, so a release goes to every master (nobody waits for it); then
    /// a retry after a jittered wait, or the error.
    fn fail(&mut self, ctx: &mut Ctx<'_>, error: Error, now: Instant) {
        let cleanup = release_op(&self.keys);
        self.fail_then(ctx, error, now, None, cleanup, 0);
    }

    /// [`Acquire::fail`] with `cleanup` as the release to send, to every
    /// master but those in `skip` (see `clean_skip`), going on as `next`
    /// says when it is given (a notified wait for a held lock), else after
    /// the retry delay.
    fn fail_then(
        &mut self,
        ctx: &mut Ctx<'_>,
        error: Error,
        now: Instant,
        next: Option<After>,
        cleanup: Op,
        skip: u64,
    ) {
        self.second = Some(Request {
            op: cleanup,
            keys: self.keys.clone(),
            token: self.request.token,
            arg: 0,
            notice: false,
        });
        self.after_cleanup = match next {
            _ if self.abandoned || matches!(error, Error::Denied(_)) => After::Finish,
            Some(next) => next,
            None => {
                let wait = ctx.jitter.between(self.retry.delay / 2, self.retry.delay);
                let at = now.checked_add(wait);
                let out_of_time = self.give_up.is_some_and(|g| at.is_none_or(|t| t >= g));
                match at {
                    Some(at)
                        if self.attempt - self.waited < self.retry.attempts && !out_of_time =>
                    {
                        After::Sleep(at)
                    }
                    _ => After::Finish,
                }
            }
        };
        self.last_error = Some(error);
        self.clean_skip = skip;
        self.stage = Stage::Cleanup;
    }

    /// How a notified acquire goes on after an attempt refused because
    /// the lock is held: `None` for the retry delay (not waiting by
    /// notification, or another kind of failure).
    ///
    /// - Not yet subscribed: subscribe, then try at once (the first attempt
    ///   was a plain `SET NX`, which says nothing of the holder).
    /// - Refused by a quorum: wait for a release, or until enough keys
    ///   have expired for a quorum to be free, as the refusing masters'
    ///   remaining times say (the retry delay where they did not say).
    /// - Refused by fewer, with the failed masters counted as refusals
    ///   still fewer than a quorum (votes split between racing waiters,
    ///   whose cleanups free the keys at once): a random back-off of up to
    ///   two round trips, notifications ignored, so that the racers fall
    ///   out of step.
    /// - Refused by fewer, but a quorum with the failed masters: a holder
    ///   may have its quorum there (a failed master cannot say it holds
    ///   no key), or racers split the masters that can say. A holder
    ///   newly seen so is looked at again after a per-instance timeout
    ///   (a racer has cleaned up by then); still refusing, it is a held
    ///   lock, waited for as one, the failed masters counted as holding:
    ///   retrying at round-trip rate would only split the votes of every
    ///   waiter of every process until the holder's keys expire.
    /// - Out of waiting time: finish.
    fn next_wait(
        &mut self,
        ctx: &mut Ctx<'_>,
        error: &Error,
        round: &Round,
        started: Stamp,
        ended: Stamp,
    ) -> Option<After> {
        if !self.notify || !matches!(error, Error::Held(_)) {
            return None;
        }
        let now = ended.mono;
        if self.wait_until.is_some_and(|w| now >= w) {
            return Some(After::Finish);
        }
        self.after_wait = true;
        if !self.subscribed {
            return Some(After::Subscribe);
        }
        let cap = |at: Instant| self.wait_until.map_or(at, |w| at.min(w));
        let votes = round.votes(0);
        let n = votes.len();
        let q = round.quorum();
        let refused = round.refused(0);
        let failed = if crate::knobs::injected(crate::knobs::Bug::FailureCountedAsSplit) {
            0
        } else {
            round.failed(0)
        };
        let round_trip = now.saturating_duration_since(started.mono);
        // Too few refusals to be anyone's lock: masters were free (and are
        // being cleaned up). Try again within two round trips.
        if refused + failed < q {
            let backoff = ctx.jitter.between(Duration::ZERO, round_trip * 2);
            return Some(After::Sleep(cap(now + backoff)));
        }
        // A split: the keys in the way are racers', each cleaned up by its
        // owner at once (no one holds a quorum, and no one will publish).
        // Try again after a short random delay, growing with each split in
        // a row (a racer that crashed leaves its key for its TTL), rather
        // than wait for keys that are mostly already going. A release
        // heard meanwhile (one racer won, and let go) ends the delay: a
        // delay grown long after splits in a row sleeps through no turn.
        if round.refused_by_one(0) + failed < q {
            let most = (round_trip * 2)
                .saturating_mul(1 << self.splits.min(SPLIT_DOUBLINGS))
                .min(self.retry.delay.max(round_trip * 2));
            self.splits += 1;
            let backoff = ctx.jitter.between(Duration::ZERO, most);
            return Some(After::Await(cap(now + backoff)));
        }
        // Held only with the failed masters' help: a holder whose quorum
        // may include a master that cannot say, or racers that split the
        // masters that can, each cleaning up at once and quietly (no
        // release is heard). Waiting for the refusing keys' expiry would
        // leave a lock that racers freed unused for up to a TTL. So a
        // holder newly seen so is looked at again once a racer would have
        // cleaned up (a per-instance timeout: its round is over by then),
        // and waited out only when it still refuses.
        if round.refused_by_one(0) < q {
            let holder = round.main_holder(0);
            if holder.is_some() && holder != self.suspect {
                self.suspect = holder;
                let look = ctx.config.per_instance_timeout.max(round_trip * 2);
                let again = ctx.jitter.between(look, look.saturating_mul(2));
                return Some(After::Await(cap(now + again)));
            }
        }
        self.splits = 0;
        // The lock is free once `needed` of the refusing masters' keys
        // have expired, beside the masters that neither refused nor failed
        // (a failed master may hold the key: it counts as holding). When
        // the failures leave too few masters for that, the last refuser's
        // expiry is the most the refusals can tell.
        let needed = q
            .saturating_sub(n - refused - failed)
            .clamp(1, refused.max(1));
        // The waiting, fenced and multi-resource scripts report the
        // holder's remaining time (the plain `SET` does not).
        let told = (self.request.op.tells_holder())
            .then(|| holder_expiry(votes, round.values(0), needed))
            .flatten();
        let expiry = match told {
            Some(expiry) => expiry,
            None => ctx.jitter.between(self.retry.delay / 2, self.retry.delay),
        };
        let spread = ctx.jitter.between(Duration::ZERO, ctx.config.wake_spread);
        // Past the clock's range (a reply no key can have): as far as the
        // wait may last.
        let at = now
            .checked_add(expiry)
            .and_then(|at| at.checked_add(spread))
            .or(self.wait_until)
            .unwrap_or(now);
        Some(After::Await(cap(at)))
    }
}

/// How long until `needed` of the refusing masters' keys have expired, as
/// their replies say (minus the key's PTTL, from the waiting script), or
/// `None` when fewer of them said. Whatever a master sent, nothing here
/// overflows: a reply is data, never a reason to panic.
fn holder_expiry(votes: &[Vote], values: &[Option<i64>], needed: usize) -> Option<Duration> {
    let mut left = [0u64; 16];
    let mut count = 0;
    for (vote, value) in votes.iter().zip(values) {
        match (vote, value) {
            (Vote::Refused, Some(v)) if *v < 0 => {
                if let Some(slot) = left.get_mut(count) {
                    *slot = v.unsigned_abs();
                    count += 1;
                }
            }
            // No expiry, or none known: the retry delay decides.
            _ => {}
        }
    }
    let left = &mut left[..count];
    left.sort_unstable();
    let ms = left.get(needed.checked_sub(1)?)?;
    // Redis expires a key within a millisecond of its PTTL.
    Some(Duration::from_millis(ms.saturating_add(1)))
}

/// An extend of one lock.
#[derive(Debug)]
pub(crate) struct Extend {
    lock: Lock,
    ttl: Duration,
    request: Request,
    timeout: Duration,
    first: Instant,
    stage: Stage,
    result: Option<Result<(), Error>>,
}

impl Extend {
    /// An extend of `lock` to `ttl`.
    ///
    /// # Errors
    /// A TTL the client refuses, or the extension cap reached.
    pub(crate) fn new(
        ctx: &Ctx<'_>,
        lock: Lock,
        ttl: Duration,
        now: Instant,
    ) -> Result<Extend, Error> {
        let ttl = Extend::checked(ctx.config, &lock, ttl)?;
        Ok(Extend {
            request: Request {
                op: extend_op(&lock.keys),
                keys: lock.keys.clone(),
                token: lock.token,
                arg: millis(ttl),
                notice: false,
            },
            lock,
            ttl,
            timeout: ctx.config.per_instance_timeout.min(ttl),
            first: now,
            stage: Stage::Round,
            result: None,
        })
    }

    /// `ttl` as the extend of `lock` would send it, or why nothing would
    /// be sent: a TTL the client refuses, or the extension cap reached.
    fn checked(config: &Config, lock: &Lock, ttl: Duration) -> Result<Duration, Error> {
        let ttl = config.checked_ttl(ttl)?;
        if let Some(max) = config.max_extensions
            && lock.extensions >= max
        {
            return Err(Error::ExtensionLimit(max));
        }
        Ok(ttl)
    }

    /// What every path that extends does to the caller's lock before
    /// anything is sent: its deadline becomes no later than `now + ttl -
    /// drift`, since every master that runs the script sets the keys' TTL
    /// to `ttl` from then on, whether or not its reply is ever read. Only a
    /// confirmed extend moves the deadline later, so a caller that stops
    /// waiting (a dropped future, a loop that ended) is left with a
    /// deadline the keys still honour. `now` must be no later than the
    /// round's start. Leaves the lock as it was when nothing would be sent.
    ///
    /// # Errors
    /// As [`Extend::new`].
    pub(crate) fn shorten(
        config: &Config,
        lock: &mut Lock,
        ttl: Duration,
        now: Stamp,
    ) -> Result<(), Error> {
        let ttl = Extend::checked(config, lock, ttl)?;
        if crate::knobs::injected(crate::knobs::Bug::ExtendNotShortened) {
            return Ok(());
        }
        let shortened = config
            .validity_span(ttl)
            .and_then(|span| Expiry::after(now, span))
            .unwrap_or(Expiry::at(now));
        lock.expiry = lock.expiry.min(shortened);
        Ok(())
    }

    fn handle_round(&mut self, ctx: &mut Ctx<'_>, round: &Round, started: Stamp, ended: Stamp) {
        self.stage = Stage::Done;
        if let Some(expiry) = validity(ctx.config, round, 0, started, ended, self.ttl) {
            self.lock.expiry = expiry;
            self.lock.ttl = self.ttl;
            self.lock.extensions += 1;
            self.result = Some(Ok(()));
            return;
        }
        // Masters that ran the script expire the keys `ttl - drift` after
        // the round's start at the latest, answered or not.
        let shortened = ctx
            .config
            .validity_span(self.ttl)
            .and_then(|span| Expiry::after(started, span))
            .unwrap_or(Expiry::at(started));
        self.lock.expiry = self.lock.expiry.min(shortened);
        self.result = Some(Err(verdict(
            ctx,
            round,
            Op::Extend,
            0,
            self.first,
            1,
            ended,
        )));
    }
}

/// A release of one lock.
#[derive(Debug)]
pub(crate) struct Release {
    request: Request,
    /// The released lock's row of in-process hand-overs.
    cohort: Option<Cohort>,
    /// This client's waiters are told of the release once it is done
    /// (see [`Job::for_each_released`]).
    tells_locally: bool,
    /// Ends a row of hand-overs: this client's waiters hear of it from the
    /// masters, and are told when it is done only if no master's message
    /// of it has reached them by then (see [`Job::yielded_release`]).
    yielded: bool,
    timeout: Duration,
    first: Instant,
    stage: Stage,
    result: Option<Result<(), Error>>,
}

impl Release {
    /// A release of `lock`.
    pub(crate) fn new(ctx: &Ctx<'_>, lock: &Lock, now: Instant) -> Release {
        Release {
            request: Request {
                op: release_op(&lock.keys),
                keys: lock.keys.clone(),
                token: lock.token,
                arg: 0,
                notice: false,
            },
            cohort: lock.cohort,
            tells_locally: true,
            yielded: false,
            timeout: ctx.config.per_instance_timeout,
            first: now,
            stage: Stage::Round,
            result: None,
        }
    }

    /// This release sent unannounced (the cleanup script: a
    /// compare-and-delete that publishes nothing), for a hand-over to a
    /// local waiter whose attempt follows it in the same write: nobody is
    /// told of it.
    pub(crate) fn unannounced(mut self) -> Release {
        self.request.op = cleanup_op(&self.request.keys);
        self.tells_locally = false;
        self
    }

    /// The release after a row of hand-overs: announced to every process,
    /// and this client's waiters hear of it from the masters, as other
    /// processes' do, not at once.
    pub(crate) fn yielded(mut self) -> Release {
        self.tells_locally = false;
        self.yielded = true;
        self
    }

    /// The release names process `next` (see
    /// [`wait::process_id`](crate::wait::process_id)) to try for the
    /// lock next, in its message to every process; 0 names none.
    pub(crate) fn naming(mut self, next: i64) -> Release {
        if self.request.op == Op::Release {
            self.request.arg = next;
        }
        self
    }

    /// The released lock's row of in-process hand-overs: a lock not
    /// handed over starts one at `now`.
    pub(crate) fn cohort(&self, now: Instant) -> Cohort {
        self.cohort.unwrap_or(Cohort { row: 0, since: now })
    }

    /// The token released.
    pub(crate) fn token(&self) -> Token {
        self.request.token
    }

    /// The resource released, for a lock of one key.
    pub(crate) fn resource(&self) -> Option<&Bytes> {
        match &self.request.keys {
            Keys::One(key) => Some(key),
            Keys::Many(_) => None,
        }
    }

    fn handle_round(&mut self, ctx: &mut Ctx<'_>, round: &Round, ended: Stamp) {
        self.stage = Stage::Done;
        self.result = Some(match round.decision(0) {
            Some(Decision::Won) => Ok(()),
            _ => Err(verdict(ctx, round, Op::Release, 0, self.first, 1, ended)),
        });
    }
}

/// K acquires or K releases in one round: one write per master, one
/// quorum decision per slot.
#[derive(Debug)]
pub(crate) struct Batch {
    requests: Vec<Request>,
    ttl: Duration,
    timeout: Duration,
    first: Instant,
    stage: Stage,
    locks: Option<Vec<Result<Lock, Error>>>,
    releases: Option<Vec<Result<(), Error>>>,
}

impl Batch {
    /// One attempt to acquire each of `resources` for `ttl`; `requests` is
    /// a reused list, cleared first.
    ///
    /// # Errors
    /// A TTL the client refuses; more resources than
    /// [`Config::max_batch`] (nothing is sent).
    pub(crate) fn acquire<I>(
        ctx: &mut Ctx<'_>,
        mut requests: Vec<Request>,
        resources: I,
        ttl: Duration,
        now: Instant,
    ) -> Result<Batch, Error>
    where
        I: IntoIterator,
        I::Item: ResourceName,
    {
        let ttl = ctx.config.checked_ttl(ttl)?;
        requests.clear();
        for resource in resources {
            let name = resource.into_name();
            checked_names(std::slice::from_ref(&name))?;
            requests.push(Request {
                op: Op::Acquire,
                keys: Keys::One(name),
                token: ctx.tokens.next_token(),
                arg: millis(ttl),
                notice: false,
            });
        }
        ctx.config.checked_batch(requests.len())?;
        Ok(Batch::new(ctx, requests, ttl, now))
    }

    /// A release of each of `locks`; `requests` is a reused list. More
    /// locks than [`Config::max_batch`] are refused, each with that error,
    /// before anything is sent.
    pub(crate) fn release(
        ctx: &Ctx<'_>,
        mut requests: Vec<Request>,
        locks: &[Lock],
        now: Instant,
    ) -> Batch {
        requests.clear();
        if let Err(error) = ctx.config.checked_batch(locks.len()) {
            let mut refused = Batch::new(ctx, requests, Duration::ZERO, now);
            refused.releases = Some(vec![Err(Error::Config(error)); locks.len()]);
            return refused;
        }
        requests.extend(locks.iter().map(|lock| Request {
            op: release_op(&lock.keys),
            keys: lock.keys.clone(),
            token: lock.token,
            arg: 0,
            notice: false,
        }));
        let mut batch = Batch::new(ctx, requests, Duration::ZERO, now);
        batch.timeout = ctx.config.per_instance_timeout;
        batch
    }

    fn new(ctx: &Ctx<'_>, requests: Vec<Request>, ttl: Duration, now: Instant) -> Batch {
        Batch {
            stage: if requests.is_empty() {
                Stage::Done
            } else {
                Stage::Round
            },
            requests,
            ttl,
            timeout: ctx.config.per_instance_timeout.min(ttl),
            first: now,
            locks: None,
            releases: None,
        }
    }

    /// The request list, for reuse by the next batch.
    pub(crate) fn into_requests(self) -> Vec<Request> {
        self.requests
    }

    fn poll(&mut self) -> Step<'_> {
        match self.stage {
            Stage::Round => {
                self.stage = Stage::Waiting;
                Step::Round {
                    requests: &self.requests,
                    timeout: self.timeout,
                    wait: Wait::Decision,
                }
            }
            Stage::Cleanup => {
                self.stage = Stage::Done;
                if self.requests.is_empty() {
                    Step::Done
                } else {
                    Step::Send {
                        requests: &self.requests,
                        skip: 0,
                    }
                }
            }
            _ => {
                if self.locks.is_none() && self.releases.is_none() {
                    // Nothing was asked: an empty batch.
                    self.locks = Some(Vec::new());
                    self.releases = Some(Vec::new());
                }
                Step::Done
            }
        }
    }

    fn handle_acquired(&mut self, ctx: &mut Ctx<'_>, round: &Round, started: Stamp, ended: Stamp) {
        let mut results = Vec::with_capacity(self.requests.len());
        for (slot, request) in self.requests.iter().enumerate() {
            results.push(
                match validity(ctx.config, round, slot, started, ended, self.ttl) {
                    Some(expiry) => Ok(Lock {
                        keys: request.keys.clone(),
                        token: request.token,
                        ttl: self.ttl,
                        expiry,
                        extensions: 0,
                        cohort: None,
                        fence: None,
                    }),
                    None => Err(verdict(ctx, round, Op::Acquire, slot, self.first, 1, ended)),
                },
            );
        }
        // Resources not acquired are released on every master.
        let mut slot = 0;
        self.requests.retain_mut(|request| {
            request.op = Op::Release;
            slot += 1;
            results[slot - 1].is_err()
        });
        self.locks = Some(results);
        self.stage = Stage::Cleanup;
    }

    fn handle_released(&mut self, ctx: &mut Ctx<'_>, round: &Round, ended: Stamp) {
        self.releases = Some(
            (0..self.requests.len())
                .map(|slot| match round.decision(slot) {
                    Some(Decision::Won) => Ok(()),
                    _ => Err(verdict(ctx, round, Op::Release, slot, self.first, 1, ended)),
                })
                .collect(),
        );
        self.stage = Stage::Done;
    }
}

/// The validity of `slot` of a round that started at `started` and ended
/// at `ended`, if it won with some left.
fn validity(
    config: &Config,
    round: &Round,
    slot: usize,
    started: Stamp,
    ended: Stamp,
    ttl: Duration,
) -> Option<Expiry> {
    if round.decision(slot) != Some(Decision::Won) {
        return None;
    }
    expiry(config, started, ended, ttl)
}

/// The end of a lock whose keys were set or extended for `ttl` by a round
/// (or two, for a fenced acquire) that started at `started`, if validity
/// was left when the last round ended (`ended`), on both clocks (a suspend
/// during the round counts). The spec's check at the decision is implied:
/// the round ended after it.
fn expiry(config: &Config, started: Stamp, ended: Stamp, ttl: Duration) -> Option<Expiry> {
    let span = config.validity_span(ttl)?;
    let expiry = Expiry::after(started, span)?;
    (!expiry.remaining(ended).is_zero()).then_some(expiry)
}

/// Turns a slot of a round that did not produce a lock into the error that
/// says why.
fn verdict(
    ctx: &Ctx<'_>,
    round: &Round,
    op: Op,
    slot: usize,
    first: Instant,
    attempts: u32,
    ended: Stamp,
) -> Error {
    let failure = failure(ctx, round, slot, first, attempts, ended);
    if round.decision(slot) == Some(Decision::Won) {
        return Error::ValidityExpired(failure);
    }
    // Refusals for good (a wrong password, a denied command) that leave
    // fewer than a quorum of usable masters: no retry can succeed.
    let denied = round
        .votes(slot)
        .iter()
        .filter(|v| matches!(v, Vote::Failed(cause) if cause.is_permanent()))
        .count();
    if denied > round.votes(slot).len() - round.quorum() {
        return Error::Denied(failure);
    }
    match round.loss(slot) {
        Loss::Protocol => Error::Protocol(failure),
        Loss::Unreachable => Error::NoQuorum(failure),
        Loss::Refused if op.sets_keys() => Error::Held(failure),
        // Not held only when refusals alone explain the loss; a refusal
        // beside a failure cannot tell whether the failed master held it.
        Loss::Refused if failure.refused > failure.votes.len() - failure.quorum => {
            Error::NotHeld(failure)
        }
        Loss::Refused => Error::NoQuorum(failure),
    }
}

/// The votes of `slot` in `round`, for an error.
fn failure(
    ctx: &Ctx<'_>,
    round: &Round,
    slot: usize,
    first: Instant,
    attempts: u32,
    ended: Stamp,
) -> Failure {
    Failure {
        quorum: round.quorum(),
        granted: round.granted(slot),
        refused: round.refused(slot),
        votes: ctx
            .names
            .iter()
            .zip(round.votes(slot))
            .map(|(server, vote)| MasterVote {
                server: Arc::clone(server),
                vote: vote.clone(),
            })
            .collect(),
        elapsed: ended.mono.saturating_duration_since(first),
        attempts,
        held_by_this_client: round.held_by_own(slot),
    }
}

/// Why an acquire whose caller went away ends before it tried (again):
/// it was waiting for the lock, held or wanted by others, and made no
/// attempt since (no votes).
pub(crate) fn untried(masters: usize, first: Instant, attempts: u32, now: Instant) -> Error {
    Error::Held(Failure {
        quorum: crate::quorum::quorum(masters),
        granted: 0,
        refused: 0,
        votes: Vec::new(),
        elapsed: now.saturating_duration_since(first),
        attempts,
        held_by_this_client: None,
    })
}

/// The release that undoes what `keys` took.
pub(crate) fn release_op(keys: &Keys) -> Op {
    match keys {
        Keys::One(_) => Op::Release,
        Keys::Many(_) => Op::ReleaseMany,
    }
}

/// The masters that refused a request (bit `i` for master `i`, up to
/// the 64th): a refusal is an answer that the request changed nothing.
fn refused_masters(votes: &[Vote]) -> u64 {
    let skips = |vote: &Vote| {
        *vote == Vote::Refused
            || (*vote == Vote::Granted
                && crate::knobs::injected(crate::knobs::Bug::CleanupSkipsGranted))
    };
    votes
        .iter()
        .take(64)
        .enumerate()
        .filter(|(_, vote)| skips(vote))
        .fold(0, |skip, (i, _)| skip | 1 << i)
}

/// Refuses an empty resource name before anything is sent.
fn checked_names(names: &[Bytes]) -> Result<(), Error> {
    if names.iter().any(Bytes::is_empty) {
        return Err(ConfigError::EmptyResource.into());
    }
    Ok(())
}

/// The quiet cleanup (no publish) of an attempt at `keys` that found the
/// lock held elsewhere.
fn cleanup_op(keys: &Keys) -> Op {
    match keys {
        Keys::One(_) => Op::Cleanup,
        Keys::Many(_) => Op::CleanupMany,
    }
}

/// The extend for what `keys` took.
fn extend_op(keys: &Keys) -> Op {
    match keys {
        Keys::One(_) => Op::Extend,
        Keys::Many(_) => Op::ExtendMany,
    }
}

/// A TTL checked by [`Config::checked_ttl`] as the `PX` argument: at most
/// [`MAX_TTL_MS`](crate::MAX_TTL_MS), so it fits.
pub(crate) fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// How long a master must have been seen unmarked before a fenced acquire
/// may readmit it (see [`readmit_after`]).
fn readmit(config: &Config) -> Option<Duration> {
    config
        .quarantine
        .map(|max| readmit_after(max, config.drift_factor))
}

/// How long a master must have been seen unmarked before a fenced acquire
/// may readmit it with a floor: long enough, by the master's clock, that
/// every write-back it confirmed before losing its data has landed on the
/// other masters of that write-back's quorum, and that the readmitting
/// acquire read them afterwards. Both spans are bounded by the largest TTL
/// in use (`max`, the restart quarantine's): twice that, stretched by the
/// clock drift allowance both ways, plus a few milliseconds.
pub(crate) fn readmit_after(max: Duration, drift_factor: f64) -> Duration {
    let drift = if (0.0..1.0).contains(&drift_factor) {
        drift_factor
    } else {
        0.0
    };
    let stretch = 2.0 * (1.0 + drift) / (1.0 - drift);
    let span = Duration::try_from_secs_f64(max.as_secs_f64() * stretch).unwrap_or(Duration::MAX);
    span.saturating_add(Duration::from_millis(10))
}

/// Where a resource's fencing counter lives: `<resource>:fence`.
fn fence_key(resource: &[u8]) -> Bytes {
    let mut key = Vec::with_capacity(resource.len() + 6);
    key.extend_from_slice(resource);
    key.extend_from_slice(b":fence");
    Bytes::from(key)
}

/// A small PRNG for retry jitter, seeded once from the OS.
#[derive(Debug)]
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[low, high]` at nanosecond resolution.
    pub(crate) fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = high
            .saturating_sub(low)
            .as_nanos()
            .min(u128::from(u64::MAX)) as u64;
        let offset = if span == 0 {
            0
        } else {
            self.next() % (span + 1)
        };
        low + Duration::from_nanos(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The waiting script's reply is a master's data; an
    /// `i64::MIN` (minus a PTTL no key has) must not overflow, in a debug
    /// build or any other.
    #[test]
    fn a_holders_expiry_is_read_without_overflow_whatever_a_master_sent() {
        let refused = [Vote::Refused, Vote::Refused, Vote::Granted];
        type Case = (&'static str, [Option<i64>; 3], usize, Option<Duration>);
        let cases: [Case; 5] = [
            (
                "the first of two keys to expire",
                [Some(-3000), Some(-1000), None],
                1,
                Some(Duration::from_millis(1001)),
            ),
            (
                "the second of two",
                [Some(-3000), Some(-1000), None],
                2,
                Some(Duration::from_millis(3001)),
            ),
            (
                "i64::MIN",
                [Some(i64::MIN), Some(-5), None],
                2,
                Some(Duration::from_millis(1 << 63) + Duration::from_millis(1)),
            ),
            ("no PTTL said", [Some(0), None, Some(-7)], 1, None),
            ("none needed", [Some(-1), Some(-1), None], 0, None),
        ];
        for (name, values, needed, want) in cases {
            assert_eq!(holder_expiry(&refused, &values, needed), want, "{name}");
        }
    }
}
