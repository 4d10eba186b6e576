//! The shared client's decisions, as one sans-IO state machine: orders
//! in, admission, the job table, timers, the waiters' queues and
//! subscriptions, kept locks, cancellation and shutdown.
//!
//! [`Hub`] owns the [`Engine`] (the N connections and every round in
//! flight) and everything the event loop decides about the jobs that use
//! it. Its inputs are the doors the loop's thread uses (an order
//! submitted, the last handle gone, callers gone, time passing, rounds
//! completed) and the engine's own (bytes read, connected, failed), each
//! with the time passed in; its outputs are the engine's bytes to write,
//! the instant it next needs to run ([`Hub::poll_timeout`]) and each
//! caller's output, handed to the caller's [`Promise`]. It owns no thread,
//! no mutex and no socket, and reads no clock: the thread in
//! [`shared`](crate::shared) moves inputs in and outputs out, and a
//! simulator can drive the same doors in virtual time. The one thing it
//! asks of the world is [`Links::prepare`]: open the connections a new
//! request needs before it is queued on them.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::clock::Stamp;
use crate::config::{Config, ConfigError, Retry};
use crate::conn::{Keys, Op, Request};
use crate::engine::{Engine, Wait};
use crate::error::Error;
use crate::job::{Acquire, Batch, Ctx, Extend, Job, Output, Release, SplitMix64, Step, release_op};
use crate::keep::{KeepStep, Keeper, Shared as KeepShared};
use crate::lock::Lock;
use crate::metrics::{self, OpSpan};
use crate::token::TokenSource;

/// Where a caller waits for its operation's output: the thread's
/// hand-off in the real client, a plain cell in a simulation.
pub(crate) trait Promise: fmt::Debug {
    /// Hands `output` to the caller; `Some(output)` back when the caller
    /// has gone (its future dropped), for the hub to release what it took.
    fn complete(self, output: Output) -> Option<Output>;

    /// True once the caller has gone: its job stops retrying and waiting.
    fn is_abandoned(&self) -> bool;
}

/// What the hub asks of the world around it.
pub(crate) trait Links: fmt::Debug {
    /// Gets the engine's connections ready for new requests: opens a
    /// connection for each one due for a (re)connect.
    fn prepare(&mut self, engine: &mut Engine, now: Instant);
}

/// An operation as a caller asks for it; the loop makes it a [`Job`].
#[derive(Debug)]
pub(crate) enum Order {
    Acquire {
        keys: Keys,
        op: Op,
        ttl: Duration,
        retry: Retry,
    },
    Extend {
        lock: Lock,
        ttl: Duration,
    },
    Release {
        lock: Lock,
    },
    AcquireBatch {
        resources: Vec<Bytes>,
        ttl: Duration,
    },
    ReleaseBatch {
        locks: Vec<Lock>,
    },
    /// Keep a lock alive from the loop (no caller waits).
    Keep {
        // Boxed: a rare order, and the largest by far.
        keeper: Box<Keeper>,
    },
    /// Stop keeping a lock and release it.
    Unkeep {
        shared: Arc<KeepShared>,
    },
}

impl Order {
    /// The output of this order refused before it became a job (the loop
    /// takes no more orders): `error` for each of its results.
    pub(crate) fn refused(self, error: Error) -> Output {
        match self {
            Order::Acquire { .. } | Order::AcquireBatch { .. } => Output::Lock(Err(error)),
            Order::Extend { lock, .. } => Output::Extended(lock, Err(error)),
            Order::ReleaseBatch { locks } => Output::Releases(vec![Err(error); locks.len()]),
            Order::Release { .. } | Order::Unkeep { .. } | Order::Keep { .. } => {
                Output::Released(Err(error))
            }
        }
    }
}

/// One operation submitted, and where its caller waits.
#[derive(Debug)]
pub(crate) struct Submission<P> {
    pub(crate) order: Order,
    pub(crate) completion: P,
}

/// A job on the loop and who waits for it.
#[derive(Debug)]
struct Running<P> {
    job: Job,
    waiter: Waiter<P>,
    /// The resource whose queue of waiters the job joined.
    waits_for: Option<Bytes>,
    /// The resource's epoch when the job's last attempt started: a
    /// release seen since then means try again.
    tried_at: u64,
    /// Waiting for a release (or its timer): a notification wakes it.
    awaiting: bool,
    /// Its timer in [`Hub::timers`]: older entries are stale.
    timer: u64,
    /// Waiting for a round's outcome: nothing else may move it on.
    in_round: bool,
    /// The operation's span, open until it ends.
    span: OpSpan,
}

impl<P: Promise> Running<P> {
    fn new(job: Job, waiter: Waiter<P>, span: OpSpan) -> Option<Running<P>> {
        Some(Running {
            job,
            waiter,
            span,
            waits_for: None,
            tried_at: 0,
            awaiting: false,
            timer: 0,
            in_round: false,
        })
    }
}

/// Who waits for a job.
#[derive(Debug)]
enum Waiter<P> {
    /// A caller, blocking or async.
    Caller(P),
    /// The kept lock in this slot of the loop's table (an extension).
    Keeper(usize),
}

impl<P: Promise> Waiter<P> {
    fn is_abandoned(&self) -> bool {
        match self {
            Waiter::Caller(completion) => completion.is_abandoned(),
            Waiter::Keeper(_) => false,
        }
    }
}

/// A kept lock in the loop's table.
#[derive(Debug)]
struct Kept<P> {
    keeper: Keeper,
    /// Tells this lock's timers from those of an earlier lock in the slot.
    generation: u64,
    /// An extension is in flight.
    extending: bool,
    /// Told to stop while extending: release once the extension ends, and
    /// hand the result to this caller.
    stopping: Option<P>,
    /// Its extension waits for room, in [`Hub::kept_admitting`].
    admitting: bool,
}

/// When a waiter woken by a release at `now` tries: after a random delay
/// within [`Config::wake_spread`], so that the waiters of several
/// processes woken together do not split the masters' votes, shorter the
/// longer it has waited (since `waiting_since`), down to a quarter of the
/// spread at 20 ms, so that the waiter that has waited longest tends to
/// send its attempt first.
fn wake_at(
    jitter: &mut SplitMix64,
    spread: Duration,
    waiting_since: Option<Instant>,
    now: Instant,
) -> Instant {
    let age = waiting_since
        .map(|t| now.saturating_duration_since(t))
        .unwrap_or_default()
        .min(AGE_PRIORITY);
    let share = 1.0 - age.as_secs_f64() / AGE_PRIORITY.as_secs_f64();
    now + jitter.between(Duration::ZERO, spread.mul_f64(share.max(MIN_SPREAD_SHARE)))
}

/// The jobs' timers: when each waiting job goes on (to retry, to stop
/// waiting for a release or its turn, or after its wake delay). A job has
/// one live timer; setting or cancelling it makes its earlier entries
/// stale.
#[derive(Debug, Default)]
struct Timers {
    /// (when, job, timer), soonest first; an entry whose timer is not the
    /// job's is stale.
    heap: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    /// The last timer handed out.
    issued: u64,
}

impl Timers {
    /// Sets job `index`'s (`running`'s) timer to `at`, replacing any other.
    fn set<P>(&mut self, running: &mut Running<P>, index: usize, at: Instant) {
        self.cancel(running);
        self.heap.push(Reverse((at, index, running.timer)));
    }

    /// Makes `running`'s timer, if it has one, stale.
    fn cancel<P>(&mut self, running: &mut Running<P>) {
        self.issued += 1;
        running.timer = self.issued;
    }

    /// The soonest entry's instant (perhaps a stale one's).
    fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }
}

/// Past this wait, a woken waiter's delay is the least share of the
/// spread (see [`wake_at`]).
const AGE_PRIORITY: Duration = Duration::from_millis(20);

/// The least share of [`Config::wake_spread`] a woken waiter's delay is
/// drawn from, however long it has waited: the waiters of several
/// processes that have all waited long are still spread apart, or they
/// would all try at once and split the votes.
const MIN_SPREAD_SHARE: f64 = 0.25;

/// The shared client's decisions (see the module's docs).
#[derive(Debug)]
pub(crate) struct Hub<P, L> {
    config: Config,
    names: Vec<Arc<str>>,
    engine: Engine,
    links: L,
    tokens: TokenSource,
    jitter: SplitMix64,
    /// The time of the input being handled.
    stamp: Stamp,
    jobs: Vec<Option<Running<P>>>,
    free_jobs: Vec<usize>,
    /// Per engine round index: the job it belongs to and when it started.
    owners: Vec<(usize, Stamp)>,
    /// When the jobs waiting to retry or for a release go on.
    timers: Timers,
    /// Jobs at the head of a resource's queue waiting for their
    /// subscriptions, each with the instant it stops waiting for them.
    subscribing: Vec<(usize, Instant)>,
    /// Orders waiting for room in the connections' in-flight queues.
    admitting: VecDeque<Submission<P>>,
    /// Kept locks whose extension waits for room: (slot, generation).
    /// They go before the orders: an extension is due.
    kept_admitting: VecDeque<(usize, u64)>,
    /// Set once two masters turned out to be one server.
    same_server: Option<ConfigError>,
    /// Kept locks, by slot.
    kept: Vec<Option<Kept<P>>>,
    free_kept: Vec<usize>,
    /// When each kept lock next needs the loop: (when, slot, generation).
    keep_timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    generations: u64,
    /// When the last handle went: from then on no job retries.
    closing_since: Option<Instant>,
}

/// A hub's parts for running one job on a caller's thread, while the hub
/// is idle (see [`Hub::split`]).
pub(crate) struct Split<'a, L> {
    pub(crate) engine: &'a mut Engine,
    pub(crate) links: &'a mut L,
    pub(crate) ctx: Ctx<'a>,
}

impl<P: Promise, L: Links> Hub<P, L> {
    /// A hub over `engine`, whose connections `links` opens, for masters
    /// `names`, under `config`.
    pub(crate) fn new(
        config: Config,
        names: Vec<Arc<str>>,
        engine: Engine,
        links: L,
        tokens: TokenSource,
        jitter: SplitMix64,
        now: Stamp,
    ) -> Hub<P, L> {
        Hub {
            names,
            engine,
            links,
            tokens,
            jitter,
            stamp: now,
            jobs: Vec::new(),
            free_jobs: Vec::new(),
            owners: Vec::new(),
            timers: Timers::default(),
            subscribing: Vec::new(),
            admitting: VecDeque::with_capacity(256),
            kept_admitting: VecDeque::new(),
            same_server: None,
            kept: Vec::new(),
            free_kept: Vec::new(),
            keep_timers: BinaryHeap::new(),
            generations: 0,
            closing_since: None,
            config,
        }
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine and the links, for the thread's I/O.
    pub(crate) fn io(&mut self) -> (&mut Engine, &mut L) {
        (&mut self.engine, &mut self.links)
    }

    /// The parts a job run on a caller's thread needs.
    pub(crate) fn split(&mut self) -> Split<'_, L> {
        Split {
            engine: &mut self.engine,
            links: &mut self.links,
            ctx: Ctx {
                config: &self.config,
                names: &self.names,
                tokens: &mut self.tokens,
                jitter: &mut self.jitter,
            },
        }
    }

    /// When the last handle went, if it has.
    pub(crate) fn closing_since(&self) -> Option<Instant> {
        self.closing_since
    }

    /// An order submitted: a lock to keep is taken at once; any other
    /// waits for room (see [`Hub::handle_timeout`]).
    pub(crate) fn handle_order(&mut self, submission: Submission<P>, now: Stamp) {
        self.stamp = now;
        match submission.order {
            // Taking a lock to keep sends nothing by itself; its
            // extensions are admitted ahead of the orders (see `admit`),
            // and its release is an order like any other.
            Order::Keep { keeper } => self.keep(*keeper, now.mono),
            order => self.admitting.push_back(Submission {
                order,
                completion: submission.completion,
            }),
        }
    }

    /// The last handle went: no retries from now on. Each job ends with
    /// its current round, and one waiting (to retry, for a release, for
    /// its turn) ends now, not at its retry delay or key's expiry. Orders
    /// admitted from now on are made so too (`start`).
    pub(crate) fn handle_closing(&mut self, now: Stamp) {
        self.stamp = now;
        if self.closing_since.is_some() {
            return;
        }
        self.closing_since = Some(now.mono);
        for (index, running) in self.jobs.iter_mut().enumerate() {
            let Some(running) = running else { continue };
            running.job.abandon();
            if !running.in_round {
                self.timers.set(running, index, now.mono);
            }
        }
    }

    /// Some caller has gone: jobs whose caller went away, waiting for a
    /// timer, a release or their turn, end now.
    pub(crate) fn handle_abandoned(&mut self, now: Stamp) {
        self.stamp = now;
        self.wake_abandoned(now.mono);
    }

    /// Time passed (and orders may have come): admits what has room, then
    /// moves on every job and kept lock whose moment has come.
    pub(crate) fn handle_timeout(&mut self, now: Stamp) {
        self.stamp = now;
        let now = now.mono;
        self.admit(now);
        self.wake_sleepers(now);
        self.check_subscribing(now, self.closing_since.is_some());
        self.wake_waiters(now);
        self.fire_keep_timers(now);
    }

    /// After the engine's inputs: each completed round goes to its job,
    /// which moves on; then what waits for room is admitted.
    pub(crate) fn handle_completed(&mut self, now: Stamp) {
        self.stamp = now;
        self.check_distinct();
        while let Some(id) = self.engine.poll_completed() {
            let Some(&(index, started)) = self.owners.get(id.index()) else {
                continue;
            };
            let Hub {
                engine,
                jobs,
                config,
                names,
                tokens,
                jitter,
                ..
            } = self;
            let (Some(round), Some(Some(running))) = (engine.round(id), jobs.get_mut(index)) else {
                continue;
            };
            let mut ctx = Ctx {
                config,
                names,
                tokens,
                jitter,
            };
            running.in_round = false;
            running.job.handle_round(&mut ctx, round, started, now);
            self.engine.finish(id);
            self.advance(index, now.mono);
        }
        self.admit(now.mono);
    }

    /// The soonest instant the hub needs to run again: a round's limit, a
    /// job's timer, a subscription's wait, a kept lock's schedule; at once
    /// (the time of the last input) when a round completed as it started
    /// (every master down, in its reconnect backoff: no I/O is to come).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.engine.has_completed() {
            return Some(self.stamp.mono);
        }
        [
            self.engine.poll_timeout(),
            self.timers.next(),
            self.subscribing.iter().map(|(_, at)| *at).min(),
            self.next_keep(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// A job that a caller's thread started (the hub idle) and that now
    /// waits, to retry or for a release: the hub takes it over, span and
    /// all, and hands its output to `completion`.
    pub(crate) fn handle_waiting_job(&mut self, job: Job, completion: P, span: OpSpan, now: Stamp) {
        self.stamp = now;
        self.spawn_with(job, Waiter::Caller(completion), span, now.mono);
    }

    /// When the next kept lock's schedule needs the hub.
    pub(crate) fn next_keep(&self) -> Option<Instant> {
        self.keep_timers.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Ends every job, every order waiting for room and every kept lock
    /// with `error` (the loop stopped): callers get it, kept locks report
    /// their loss.
    pub(crate) fn stop(&mut self, error: &Error, now: Stamp) {
        for Submission { order, completion } in self.admitting.drain(..) {
            if let Order::Keep { keeper } = order {
                let mut keeper = *keeper;
                keeper.handle_stopped(error.clone(), now);
                continue;
            }
            completion.complete(order.refused(error.clone()));
        }
        for running in self.jobs.iter_mut().filter_map(Option::take) {
            if let Waiter::Caller(completion) = running.waiter {
                completion.complete(running.job.stopped(error));
            }
        }
        for kept in self.kept.iter_mut().filter_map(Option::take) {
            let mut keeper = kept.keeper;
            keeper.handle_stopped(error.clone(), now);
            keeper.shared().set_slot(None);
            if let Some(completion) = kept.stopping {
                completion.complete(Output::Released(Err(error.clone())));
            }
        }
    }

    /// Nothing in flight, nothing waiting: a caller may use the engine.
    pub(crate) fn is_idle(&self) -> bool {
        self.jobs.len() == self.free_jobs.len()
            && self.admitting.is_empty()
            && self.kept_admitting.is_empty()
    }

    /// Starts the orders waiting for room, oldest first, while every
    /// connection that keeps up can take their requests within half of
    /// [`Config::max_in_flight`] (see [`Engine::has_room`]): many callers
    /// at once are a burst every master shares, to be queued here, not a
    /// master lagging alone, which the connection drops as too far behind.
    fn admit(&mut self, now: Instant) {
        let limit = self.config.max_in_flight / 2;
        let patience = self.config.per_instance_timeout;
        while let Some(&(slot, generation)) = self.kept_admitting.front() {
            if !self.engine.has_room(1, limit, now, patience) {
                return;
            }
            self.kept_admitting.pop_front();
            if let Some(Some(kept)) = self.kept.get_mut(slot)
                && kept.generation == generation
            {
                kept.admitting = false;
                self.drive_kept(slot, now);
            }
        }
        while let Some(submission) = self.admitting.front() {
            // A batch over the limit is refused when it is made a job.
            let k = match &submission.order {
                Order::AcquireBatch { resources, .. } => resources.len(),
                Order::ReleaseBatch { locks } => locks.len(),
                _ => 1,
            }
            .min(limit);
            if !self
                .engine
                .has_room(k, limit, now, self.config.per_instance_timeout)
            {
                return;
            }
            if let Some(submission) = self.admitting.pop_front() {
                self.start(submission, now);
            }
        }
    }

    /// Makes `submission` a job and runs it to its first wait.
    fn start(&mut self, submission: Submission<P>, now: Instant) {
        let Submission { order, completion } = submission;
        let order = match order {
            Order::Keep { keeper } => return self.keep(*keeper, now),
            Order::Unkeep { shared } => return self.unkeep(&shared, completion, now),
            order => order,
        };
        match self.make_job(order, now) {
            Ok(mut job) => {
                #[cfg(feature = "test-knobs")]
                if job
                    .resource()
                    .is_some_and(|r| self.config.panic_on_resource.as_deref() == Some(r.as_ref()))
                {
                    panic!("test knob: panic_on_resource");
                }
                // Closing: one attempt, no retries, as for the jobs under
                // way when the last handle went.
                if self.closing_since.is_some() {
                    job.abandon();
                }
                // Behind the local waiters already there, not racing them.
                if job
                    .resource()
                    .is_some_and(|r| self.engine.head(r).is_some())
                {
                    let _ = job.queue_first();
                }
                self.spawn(job, Waiter::Caller(completion), now);
            }
            Err(output) => {
                if let Some(output) = completion.complete(output) {
                    self.release_abandoned(output, now);
                }
            }
        }
    }

    /// The job for `order` (not a keep or unkeep), or the output it ends
    /// with before anything is sent (a setting or argument refused).
    // Both sides are large and short-lived: boxing would allocate per call.
    #[allow(clippy::result_large_err)]
    pub(crate) fn make_job(&mut self, order: Order, now: Instant) -> Result<Job, Output> {
        let mut ctx = Ctx {
            config: &self.config,
            names: &self.names,
            tokens: &mut self.tokens,
            jitter: &mut self.jitter,
        };
        let takes_keys = !matches!(order, Order::Release { .. } | Order::ReleaseBatch { .. });
        let refused = match (&self.same_server, takes_keys) {
            (Some(error), true) => Some(Error::Config(error.clone())),
            _ => None,
        };
        match (order, refused) {
            (Order::Acquire { .. } | Order::AcquireBatch { .. }, Some(error)) => {
                Err(Output::Lock(Err(error)))
            }
            (Order::Extend { lock, .. }, Some(error)) => Err(Output::Extended(lock, Err(error))),
            (
                Order::Acquire {
                    keys,
                    op,
                    ttl,
                    retry,
                },
                None,
            ) => Acquire::new(&mut ctx, keys, op, ttl, &retry, now)
                .map(Job::Acquire)
                .map_err(|e| Output::Lock(Err(e))),
            (Order::Extend { lock, ttl }, None) => {
                match Extend::new(&ctx, lock.clone(), ttl, now) {
                    Ok(extend) => Ok(Job::Extend(extend)),
                    Err(error) => Err(Output::Extended(lock, Err(error))),
                }
            }
            (Order::Release { lock }, _) => Ok(Job::Release(Release::new(&ctx, &lock, now))),
            (Order::AcquireBatch { resources, ttl }, None) => {
                Batch::acquire(&mut ctx, Vec::new(), resources, ttl, now)
                    .map(Job::AcquireBatch)
                    .map_err(|e| Output::Lock(Err(e)))
            }
            (Order::ReleaseBatch { locks }, _) => Ok(Job::ReleaseBatch(Batch::release(
                &ctx,
                Vec::new(),
                &locks,
                now,
            ))),
            // Never made into jobs (see `start`): nothing to do.
            (Order::Keep { .. } | Order::Unkeep { .. }, _) => Err(Output::Released(Ok(()))),
        }
    }

    /// Puts `job` in the table and runs it to its first wait.
    fn spawn(&mut self, job: Job, waiter: Waiter<P>, now: Instant) {
        let span = job.span();
        self.spawn_with(job, waiter, span, now);
    }

    /// [`Hub::spawn`] for a job whose span is open already.
    fn spawn_with(&mut self, job: Job, waiter: Waiter<P>, span: OpSpan, now: Instant) {
        let running = Running::new(job, waiter, span);
        let index = place(&mut self.jobs, &mut self.free_jobs, running);
        self.advance(index, now);
    }

    /// Runs job `index` until it waits for a round or a timer, or ends.
    fn advance(&mut self, index: usize, now: Instant) {
        loop {
            let Hub {
                engine,
                links,
                jobs,
                config,
                names,
                tokens,
                jitter,
                owners,
                timers,
                subscribing,
                stamp,
                ..
            } = self;
            let Some(Some(running)) = jobs.get_mut(index) else {
                return;
            };
            // A timer or a promotion that comes while the job's round is
            // out waits for the round's outcome.
            if running.in_round {
                return;
            }
            if running.waiter.is_abandoned() {
                running.job.abandon();
            }
            let mut ctx = Ctx {
                config,
                names,
                tokens,
                jitter,
            };
            match running.job.poll(&mut ctx, now) {
                Step::Round {
                    requests,
                    timeout,
                    wait,
                } => {
                    links.prepare(engine, now);
                    if let Some(resource) = &running.waits_for {
                        running.tried_at = engine.epoch(resource);
                    }
                    let started = *stamp;
                    let id = engine.start(requests, started.mono, timeout, wait);
                    if owners.len() <= id.index() {
                        owners.resize(id.index() + 1, (usize::MAX, started));
                    }
                    owners[id.index()] = (index, started);
                    running.in_round = true;
                    return;
                }
                Step::Send(requests) => {
                    if let Some(resource) = &running.waits_for {
                        for request in requests {
                            engine.handle_cleanup(resource, request.token);
                        }
                    }
                    links.prepare(engine, now);
                    let id = engine.start(requests, now, Duration::ZERO, Wait::Decision);
                    engine.finish(id);
                }
                Step::Sleep(at) => {
                    timers.set(running, index, at);
                    return;
                }
                Step::Subscribe(resource) => {
                    let resource = resource.clone();
                    if running.waits_for.is_none() {
                        engine.join(&resource, index, now);
                        running.waits_for = Some(resource.clone());
                        // Subscriber connections open now, so that the
                        // SUBSCRIBEs leave in this turn's write.
                        links.prepare(engine, now);
                    }
                    if engine.head(&resource) == Some(index) {
                        let until = now.checked_add(config.connect_timeout).unwrap_or(now);
                        subscribing.push((index, until));
                    } else if let Some(at) = running.job.give_up_at() {
                        // Behind others: promoted when the head leaves,
                        // or done waiting at this instant.
                        timers.set(running, index, at);
                    }
                    return;
                }
                Step::Await { resource, until } => {
                    let at = if engine.epoch(resource) == running.tried_at {
                        running.awaiting = true;
                        until
                    } else {
                        // Released while the attempt was under way.
                        let since = running.job.waiting_since();
                        wake_at(jitter, config.wake_spread, since, now)
                    };
                    timers.set(running, index, at);
                    return;
                }
                Step::Done => {
                    running
                        .job
                        .for_each_released(|key, token| engine.handle_released(key, token));
                    let promoted = match running.waits_for.take() {
                        Some(resource) => engine.leave(&resource, index, now),
                        None => None,
                    };
                    let output = running.job.take_output(now);
                    let finished = jobs[index].take();
                    if let Some(head) = promoted {
                        let until = now.checked_add(config.connect_timeout).unwrap_or(now);
                        subscribing.push((head, until));
                        // Its give-up timer is the subscription's now.
                        if let Some(Some(head)) = jobs.get_mut(head) {
                            timers.cancel(head);
                        }
                    }
                    self.free_jobs.push(index);
                    let (Some(output), Some(finished)) = (output, finished) else {
                        return;
                    };
                    finished.span.record(output.first_error());
                    match finished.waiter {
                        Waiter::Caller(completion) => {
                            if let Some(unclaimed) = completion.complete(output) {
                                self.release_abandoned(unclaimed, now);
                            }
                        }
                        Waiter::Keeper(slot) => self.handle_extended(slot, output, now),
                    }
                    return;
                }
            }
        }
    }

    /// Jobs whose retry wait is over (all of them once closing) go on.
    fn wake_sleepers(&mut self, now: Instant) {
        while let Some(Reverse((at, index, timer))) = self.timers.heap.peek().copied() {
            let abandoned = self
                .jobs
                .get(index)
                .and_then(Option::as_ref)
                .is_some_and(|r| r.waiter.is_abandoned());
            if at > now && !abandoned {
                break;
            }
            self.timers.heap.pop();
            let Some(Some(running)) = self.jobs.get_mut(index) else {
                continue;
            };
            if running.timer != timer {
                continue;
            }
            running.awaiting = false;
            running.job.wake();
            self.advance(index, now);
        }
    }

    /// Jobs whose caller went away, waiting for a timer, a release or
    /// their turn, end now (in the next [`Hub::wake_sleepers`]).
    fn wake_abandoned(&mut self, now: Instant) {
        for (index, running) in self.jobs.iter_mut().enumerate() {
            if let Some(running) = running
                && !running.in_round
                && running.waiter.is_abandoned()
            {
                self.timers.set(running, index, now);
            }
        }
    }

    /// Heads of queues whose subscriptions are in place (or past waiting
    /// for) make their attempt.
    fn check_subscribing(&mut self, now: Instant, closing: bool) {
        let mut i = 0;
        while let Some(&(index, until)) = self.subscribing.get(i) {
            let ready = match self.jobs.get(index) {
                Some(Some(running)) => {
                    closing
                        || now >= until
                        || running.waiter.is_abandoned()
                        || running
                            .waits_for
                            .as_ref()
                            .is_none_or(|r| self.engine.is_listening(r, now))
                }
                _ => true,
            };
            if !ready {
                i += 1;
                continue;
            }
            self.subscribing.swap_remove(i);
            if let Some(Some(running)) = self.jobs.get_mut(index) {
                running.job.handle_subscribed();
                self.advance(index, now);
            }
        }
    }

    /// Releases seen since the last call wake the head of each resource's
    /// queue, if it waits for one (one waiting in an attempt compares
    /// epochs when the attempt ends).
    fn wake_waiters(&mut self, now: Instant) {
        while let Some(resource) = self.engine.poll_notified() {
            let Some(head) = self.engine.head(&resource) else {
                continue;
            };
            if let Some(Some(running)) = self.jobs.get_mut(head)
                && running.awaiting
            {
                running.awaiting = false;
                let since = running.job.waiting_since();
                let at = wake_at(&mut self.jitter, self.config.wake_spread, since, now);
                self.timers.set(running, head, at);
            }
        }
    }

    /// Takes a lock to keep, and runs its schedule.
    fn keep(&mut self, keeper: Keeper, now: Instant) {
        self.generations += 1;
        let kept = Some(Kept {
            keeper,
            generation: self.generations,
            extending: false,
            stopping: None,
            admitting: false,
        });
        let slot = place(&mut self.kept, &mut self.free_kept, kept);
        if let Some(Some(kept)) = self.kept.get(slot) {
            kept.keeper.shared().set_slot(Some(slot));
        }
        self.drive_kept(slot, now);
    }

    /// Runs kept lock `slot`'s schedule: extend it now, or set its timer.
    fn drive_kept(&mut self, slot: usize, now: Instant) {
        // Both clocks: a kept lock's deadline counts suspended time.
        let stamp = self.stamp;
        loop {
            let Some(Some(kept)) = self.kept.get_mut(slot) else {
                return;
            };
            if kept.extending {
                return;
            }
            match kept.keeper.poll(stamp) {
                KeepStep::Idle => return,
                KeepStep::Wait(at) => {
                    self.keep_timers.push(Reverse((at, slot, kept.generation)));
                    return;
                }
                KeepStep::Extend(ttl) => {
                    // Through the admission every order goes through: a
                    // burst of extensions falling due together must not
                    // push a connection others use past its bound.
                    let limit = self.config.max_in_flight / 2;
                    let patience = self.config.per_instance_timeout;
                    if !self.engine.has_room(1, limit, now, patience) {
                        if !kept.admitting {
                            kept.admitting = true;
                            self.kept_admitting.push_back((slot, kept.generation));
                        }
                        return;
                    }
                    let ctx = Ctx {
                        config: &self.config,
                        names: &self.names,
                        tokens: &mut self.tokens,
                        jitter: &mut self.jitter,
                    };
                    let lock = kept.keeper.lock().clone();
                    let refused = self.same_server.clone().map(Error::Config);
                    let extend = match refused {
                        Some(error) => Err(error),
                        None => kept
                            .keeper
                            .start_extension(ctx.config, ttl, stamp)
                            .and_then(|lock| Extend::new(&ctx, lock, ttl, now)),
                    };
                    match extend {
                        Ok(extend) => {
                            kept.extending = true;
                            self.spawn(Job::Extend(extend), Waiter::Keeper(slot), now);
                            return;
                        }
                        // Refused before anything was sent (the cap, say):
                        // the schedule decides again.
                        Err(error) => {
                            kept.keeper
                                .handle_extended(lock, Err(error), stamp, ctx.jitter)
                        }
                    }
                }
            }
        }
    }

    /// Kept lock `slot`'s extension ended.
    fn handle_extended(&mut self, slot: usize, output: Output, now: Instant) {
        let Some(Some(kept)) = self.kept.get_mut(slot) else {
            return;
        };
        kept.extending = false;
        if let Output::Extended(lock, result) = output {
            kept.keeper
                .handle_extended(lock, result, self.stamp, &mut self.jitter);
        }
        match kept.stopping.take() {
            Some(completion) => self.release_kept(slot, completion, now),
            None => self.drive_kept(slot, now),
        }
    }

    /// Kept locks whose timer is due run their schedule.
    fn fire_keep_timers(&mut self, now: Instant) {
        while let Some(Reverse((at, slot, generation))) = self.keep_timers.peek().copied() {
            if at > now {
                return;
            }
            self.keep_timers.pop();
            let current = self
                .kept
                .get(slot)
                .and_then(Option::as_ref)
                .is_some_and(|k| k.generation == generation);
            if current {
                self.drive_kept(slot, now);
            }
        }
    }

    /// Stops keeping a lock and releases it for `completion`; after the
    /// extension in flight, if one is.
    fn unkeep(&mut self, shared: &Arc<KeepShared>, completion: P, now: Instant) {
        let Some(slot) = shared.slot() else {
            // Never kept (or already released): nothing to release.
            completion.complete(Output::Released(Ok(())));
            return;
        };
        match self.kept.get_mut(slot) {
            Some(Some(kept)) if kept.extending => kept.stopping = Some(completion),
            Some(Some(_)) => self.release_kept(slot, completion, now),
            _ => {
                completion.complete(Output::Released(Ok(())));
            }
        }
    }

    /// Forgets kept lock `slot` and releases it for `completion`.
    fn release_kept(&mut self, slot: usize, completion: P, now: Instant) {
        let Some(kept) = self.kept.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.free_kept.push(slot);
        kept.keeper.shared().set_slot(None);
        let release = Release::new(
            &Ctx {
                config: &self.config,
                names: &self.names,
                tokens: &mut self.tokens,
                jitter: &mut self.jitter,
            },
            kept.keeper.lock(),
            now,
        );
        self.spawn(Job::Release(release), Waiter::Caller(completion), now);
    }

    /// An acquire whose caller went away took locks: release them on every
    /// master, nobody waiting for the answers.
    pub(crate) fn release_abandoned(&mut self, output: Output, now: Instant) {
        let release = |lock: &Lock| Request {
            op: release_op(&lock.keys),
            keys: lock.keys.clone(),
            token: lock.token,
            arg: 0,
        };
        let requests: Vec<Request> = match &output {
            Output::Lock(Ok(lock)) => vec![release(lock)],
            Output::Locks(results) => results.iter().flatten().map(release).collect(),
            _ => return,
        };
        metrics::released_unclaimed(requests.len());
        self.links.prepare(&mut self.engine, now);
        let id = self
            .engine
            .start(&requests, now, Duration::ZERO, Wait::Decision);
        self.engine.finish(id);
    }

    /// Notes two masters found to be one server: later acquires are
    /// refused with [`ConfigError::SameServer`].
    pub(crate) fn check_distinct(&mut self) {
        if let Some((first, second)) = self.engine.poll_same_server()
            && self.same_server.is_none()
        {
            self.same_server = Some(ConfigError::SameServer {
                first: Arc::clone(&self.names[first]),
                second: Arc::clone(&self.names[second]),
            });
        }
    }
}

/// Puts `item` in a free slot of `table` (from `free`), or a new one at
/// the end, and returns its index: a table whose indices stay put.
fn place<T>(table: &mut Vec<Option<T>>, free: &mut Vec<usize>, item: Option<T>) -> usize {
    match free.pop() {
        Some(index) => {
            table[index] = item;
            index
        }
        None => {
            table.push(item);
            table.len() - 1
        }
    }
}
