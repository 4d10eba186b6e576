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
use crate::engine::{Engine, Heard, Wait};
use crate::error::Error;
use crate::job::{Acquire, Batch, Ctx, Extend, Job, Output, Release, SplitMix64, Step, release_op};
use crate::keep::{Keeper, Shared as KeepShared};
use crate::lock::Lock;
use crate::metrics::{self, OpSpan};
use crate::token::TokenSource;
use crate::wait::{Change, Cohort, Room, Turn};

mod inline;
mod kept;
mod linger;
mod waiters;

pub(crate) use inline::{Drive, Ran};
use kept::Kept;
use linger::Parked;
pub(crate) use waiters::patience;
use waiters::{Timers, turn_at};

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
    /// The resources a multi-resource waiting acquire listens to, once it
    /// does (see [`Job::listens_to`]).
    listening: Option<Keys>,
    /// The resource's epoch when the job's last attempt started: a
    /// release seen since then means try again.
    tried_at: u64,
    /// Waiting for a release (or its timer): a notification wakes it.
    awaiting: bool,
    /// Its timer in [`Hub::timers`]: older entries are stale.
    timer: u64,
    /// Its timer waits for another process to take its turn (see
    /// [`Turn::Theirs`]): a release that
    /// makes it this client's turn wakes it at once.
    deferred: bool,
    /// Waiting for a round's outcome: nothing else may move it on.
    in_round: bool,
    /// Waiting for room in the connections' in-flight queues, in
    /// [`Hub::ready`]: nothing else may move it on.
    blocked: bool,
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
            listening: None,
            tried_at: 0,
            awaiting: false,
            timer: 0,
            deferred: false,
            in_round: false,
            blocked: false,
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
    /// Nobody: the release of a lock whose caller went away.
    Nobody,
}

impl<P: Promise> Waiter<P> {
    fn is_abandoned(&self) -> bool {
        match self {
            Waiter::Caller(completion) => completion.is_abandoned(),
            Waiter::Keeper(_) | Waiter::Nobody => false,
        }
    }
}

/// The shared client's decisions (see the module's docs).
#[derive(Debug)]
pub(crate) struct Hub<P, L> {
    config: Config,
    names: Vec<Arc<str>>,
    engine: Engine,
    /// What local waiters wait for, fed by the engine's subscriptions
    /// (see [`pump`]).
    room: Room,
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
    /// Jobs under way whose next step waits for room (a retry, a wake-up,
    /// a hand-over's attempt, a cleanup, a fence's write-back), oldest
    /// first. After the kept locks, before new orders: they were admitted
    /// once already.
    ready: VecDeque<usize>,
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
    /// A finished batch's request list, kept for the next batch.
    spare: Vec<Request>,
    /// Releases waiting a moment for a local caller of their lock (see
    /// `linger.rs`).
    parked: Vec<Parked<P>>,
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
        mut engine: Engine,
        links: L,
        tokens: TokenSource,
        jitter: SplitMix64,
        now: Stamp,
    ) -> Hub<P, L> {
        let mut room = Room::default();
        room.know_own_tokens(tokens.prefix());
        engine.know_own_tokens(tokens.prefix());
        Hub {
            names,
            engine,
            room,
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
            ready: VecDeque::new(),
            same_server: None,
            kept: Vec::new(),
            free_kept: Vec::new(),
            keep_timers: BinaryHeap::new(),
            generations: 0,
            closing_since: None,
            spare: Vec::new(),
            parked: Vec::new(),
            config,
        }
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The waiting room, for a simulation's checkers to read.
    #[cfg(any(test, redlock_sim))]
    pub(crate) fn room(&self) -> &Room {
        &self.room
    }

    /// When a subscription kept for a lock held here ends, unless the
    /// lock is let go before (see [`Room::sweep`]): the loop wakes for it
    /// even when idle.
    pub(crate) fn next_sweep(&self) -> Option<Instant> {
        self.room.next_sweep()
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
        hear(&mut self.room, &mut self.engine);
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
        hear(&mut self.room, &mut self.engine);
        self.wake_abandoned(now.mono);
    }

    /// Time passed (and orders may have come): admits what has room, then
    /// moves on every job and kept lock whose moment has come.
    pub(crate) fn handle_timeout(&mut self, now: Stamp) {
        self.stamp = now;
        hear(&mut self.room, &mut self.engine);
        let now = now.mono;
        self.admit(now);
        self.wake_sleepers(now);
        self.check_subscribing(now, self.closing_since.is_some());
        self.wake_waiters(now);
        self.room.sweep(now);
        pump(&mut self.room, &mut self.engine, now);
        self.fire_keep_timers(now);
        self.unpark(now);
        self.engine.flush_subscriptions(now);
    }

    /// After the engine's inputs: each completed round goes to its job,
    /// which moves on; then what waits for room is admitted.
    pub(crate) fn handle_completed(&mut self, now: Stamp) {
        self.stamp = now;
        hear(&mut self.room, &mut self.engine);
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
        self.engine.flush_subscriptions(now.mono);
    }

    /// The soonest instant the hub needs to run again: a round's limit, a
    /// job's timer, a subscription's wait, a kept lock's schedule; at once
    /// (the time of the last input) when a round completed as it started
    /// (every master down, in its reconnect backoff: no I/O is to come).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.engine.has_completed() {
            return Some(self.stamp.mono);
        }
        let waits_for_room =
            !(self.ready.is_empty() && self.admitting.is_empty() && self.kept_admitting.is_empty());
        [
            self.engine.poll_timeout(),
            waits_for_room
                .then(|| {
                    let limit = self.config.max_in_flight / 2;
                    self.engine.room_at(limit, self.stamp.mono)
                })
                .flatten(),
            self.room.next_sweep(),
            self.timers.next(),
            self.subscribing.iter().map(|(_, at)| *at).min(),
            self.next_keep(),
            self.next_unpark(),
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
        hear(&mut self.room, &mut self.engine);
        self.spawn_with(job, Waiter::Caller(completion), span, now.mono);
        self.engine.flush_subscriptions(now.mono);
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
        self.stop_parked(error);
        for kept in self.kept.iter_mut().filter_map(Option::take) {
            let mut keeper = kept.keeper;
            keeper.handle_stopped(error.clone(), now);
            keeper.shared().set_slot(None);
            if let Some(completion) = kept.stopping {
                completion.complete(Output::Released(Err(error.clone())));
            }
        }
    }

    /// A batch's request list to fill, kept from the last batch's.
    pub(crate) fn take_spare(&mut self) -> Vec<Request> {
        std::mem::take(&mut self.spare)
    }

    /// The error every acquire and extend is refused with once two masters
    /// turned out to be one server.
    pub(crate) fn same_server(&self) -> Option<&ConfigError> {
        self.same_server.as_ref()
    }

    /// Nothing in flight, nothing waiting: a caller may use the engine.
    pub(crate) fn is_idle(&self) -> bool {
        self.jobs.len() == self.free_jobs.len()
            && self.admitting.is_empty()
            && self.kept_admitting.is_empty()
            && self.ready.is_empty()
            && self.parked.is_empty()
    }

    /// Starts the orders waiting for room, oldest first, while every
    /// connection that keeps up can take their requests within half of
    /// [`Config::max_in_flight`] (see [`Engine::has_room`]): many callers
    /// at once are a burst every master shares, to be queued here, not a
    /// master lagging alone, which the connection drops as too far behind.
    fn admit(&mut self, now: Instant) {
        let limit = self.config.max_in_flight / 2;
        while let Some(&(slot, generation)) = self.kept_admitting.front() {
            if !self.engine.has_room(1, limit, now) {
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
        while let Some(&index) = self.ready.front() {
            if let Some(Some(running)) = self.jobs.get(index)
                && !has_room_for(&self.engine, &self.config, &running.job, now)
            {
                return;
            }
            self.ready.pop_front();
            if let Some(Some(running)) = self.jobs.get_mut(index) {
                running.blocked = false;
                self.advance(index, now);
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
            if !self.engine.has_room(k, limit, now) {
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
            // Dropped while its order waited for admission: no attempt.
            order @ (Order::Acquire { .. } | Order::AcquireBatch { .. })
                if completion.is_abandoned()
                    && !crate::knobs::injected(crate::knobs::Bug::DroppedWaiterTries) =>
            {
                let error = crate::job::untried(self.names.len(), now, 0, now);
                let _ = completion.complete(order.refused(error));
                return;
            }
            order => order,
        };
        match self.make_job(order, now) {
            Ok(mut job) => {
                #[cfg(any(test, redlock_sim))]
                if job.resource().is_some_and(|r| {
                    self.config.knobs.panic_on_resource.as_deref() == Some(r.as_ref())
                }) {
                    panic!("test knob: panic_on_resource");
                }
                // Closing: one attempt, no retries, as for the jobs under
                // way when the last handle went.
                if self.closing_since.is_some() {
                    job.abandon();
                }
                // Behind the local waiters already there, not racing them.
                // Nor racing the process whose turn it is.
                if job.resource().is_some_and(|r| {
                    self.room.head(r).is_some()
                        || self.room.held_here(r, now).is_some()
                        || their_turn_since(&self.room, &self.config, r, now).is_some()
                }) {
                    let _ = job.queue_first();
                }
                if let Some(resource) = self.lingers(&job, now) {
                    self.park(job, completion, resource, now);
                    return;
                }
                self.launch(job, Waiter::Caller(completion), now);
            }
            Err(output) => {
                if let Some(output) = completion.complete(output) {
                    self.release_abandoned(output, now);
                }
            }
        }
    }

    /// Runs `job`, a release handing its lock over to the head waiter
    /// here when it is planned so (see [`Hub::plan_release`]).
    fn launch(&mut self, job: Job, waiter: Waiter<P>, now: Instant) {
        let (job, head) = self.plan_release(job, now);
        self.spawn(job, waiter, now);
        // The head's attempt follows the release in the same write.
        if let Some((head, cohort)) = head
            && let Some(Some(running)) = self.jobs.get_mut(head)
            && !running.in_round
        {
            self.timers.cancel(running);
            running.awaiting = false;
            running.job.handle_handover(cohort);
            self.advance(head, now);
        }
    }

    /// How a release reaches this client's waiters for its lock: handed
    /// over to the head waiter when it waits for a release or expiry and
    /// the row of hand-overs is short of [`Config::local_handovers`] and
    /// [`Config::local_handover_window`] (the release then sent
    /// unannounced, and the head to wake returned with the row it
    /// continues); announced to every process, the local waiters told by
    /// the masters, once the row is that long; otherwise announced, the
    /// local waiters told at once. Other jobs go as they are.
    fn plan_release(&mut self, job: Job, now: Instant) -> (Job, Option<(usize, Cohort)>) {
        let Job::Release(release) = job else {
            return (job, None);
        };
        let Some(resource) = release.resource() else {
            return (Job::Release(release), None);
        };
        // The release goes as planned below: its resource is let go after.
        let resource = resource.clone();
        let current =
            (self.room.get(&resource)).is_none_or(|w| w.marks.is_current(release.token()));
        let cohort = release.cohort(now);
        let within = self.is_within_budget(&resource, cohort, now);
        let planned = match self.handover_head(&resource) {
            // Not for a lapsed lock released late, another of this
            // client's holding it now: its release frees nothing, and the
            // head's attempt behind it would go into that lock, refused.
            Some(head) if within && current && self.closing_since.is_none() => {
                let next = Cohort {
                    row: cohort.row.saturating_add(1),
                    since: cohort.since,
                };
                if let Some(waited) = self.room.get_mut(&resource) {
                    // Several callers here take this lock in turn.
                    waited.row.handle_company(true);
                    waited.row.handle_handed_over(next);
                }
                let release = release.unannounced();
                (Job::Release(release), Some((head, next)))
            }
            // This client's turn is over: its waiters hear of the release
            // from the masters, with the other processes' (and, younger,
            // tend to try after them).
            _ if cohort.row > 0 && !within => {
                if current {
                    self.room.handle_yield(&resource);
                }
                // Unless no master's message of it has reached them when
                // it is done (subscriptions refused by an ACL or their
                // connections down, PUBLISH refused, messages late): then
                // they are told, as after any release, rather than left
                // to the released key's expiry.
                let release = self.name_next(release, now);
                (Job::Release(release.yielded()), None)
            }
            _ => (Job::Release(self.name_next(release, now)), None),
        };
        // No longer held here: a new local waiter tries again. Unless
        // another lock of this client's holds it now: the released one
        // lapsed, its row long over, and whether others compete is the
        // current row's to tell. With nobody waiting here the
        // subscription ends, or, when the release named another process,
        // stays for that one's turn: a caller coming back waits for it
        // (see `their_turn_since`) and hears its release.
        if current {
            let keep = their_turn_since(&self.room, &self.config, &resource, now)
                .map(|since| turn_over_at(&self.config, since));
            self.room.let_go(&resource, keep, now);
            pump(&mut self.room, &mut self.engine, now);
        }
        planned
    }

    /// `release`, announced, names the process whose turn it is next
    /// (see [`Room::name_next`]).
    fn name_next(&mut self, release: Release, now: Instant) -> Release {
        let Some(resource) = release.resource() else {
            return release;
        };
        let waiting_here = self.room.head(resource).is_some();
        let next = self.room.name_next(resource, release.token(), waiting_here);
        if let Some(waited) = self.room.get_mut(resource) {
            waited.turns.handle_began(now);
        }
        release.naming(next)
    }

    /// Whether a row of hand-overs of the lock on `resource` at `cohort`
    /// may go on at `now`: hand-overs on, the row short of
    /// [`Config::local_handover_window`], and, while other processes
    /// compete for the lock (see [`Room::is_contended`]), short of
    /// [`Config::local_handovers`]. With nobody else heard since the last
    /// row ended, the window alone ends a row: its count would only make
    /// this client's own callers race, in vain, for their own lock.
    fn is_within_budget(&self, resource: &[u8], cohort: Cohort, now: Instant) -> bool {
        let handovers = self.config.local_handovers;
        let counted = self.room.is_contended(resource);
        (handovers > 0
            && (!counted || cohort.row < handovers)
            && now.saturating_duration_since(cohort.since) < self.config.local_handover_window)
            || crate::knobs::injected(crate::knobs::Bug::HandoverBudgetIgnored)
    }

    /// The waiter here that a release of `resource` would hand its lock
    /// to: the head of its queue, between attempts (its attempt goes right
    /// behind the release, in the same write). Not one whose attempt is
    /// under way: that attempt, sent before the release, is refused, and
    /// if it is its last (its wait over, its caller gone, attempts used
    /// up) nobody would try the lock the unannounced release freed, nor
    /// would any other process hear of it; it is announced instead, and
    /// the head, refused, hears of it as any waiter does. A fenced waiter
    /// is handed the lock as a plain one is: its attempt is its whole
    /// two-phase acquire, whose fence, read from a quorum after the
    /// release, is new and larger.
    fn handover_head(&self, resource: &[u8]) -> Option<usize> {
        let to_attempt = crate::knobs::injected(crate::knobs::Bug::HandoverToAttempt);
        self.room.head(resource).filter(|&head| {
            matches!(self.jobs.get(head), Some(Some(r))
                if (r.job.is_between_attempts() || (to_attempt && r.in_round && r.job.is_attempting()))
                    && !r.blocked
                    && !r.waiter.is_abandoned())
        })
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
            (Order::AcquireBatch { resources, ttl }, None) => Batch::acquire(
                &mut ctx,
                std::mem::take(&mut self.spare),
                resources,
                ttl,
                now,
            )
            .map(Job::AcquireBatch)
            .map_err(|e| Output::Lock(Err(e))),
            (Order::ReleaseBatch { locks }, _) => Ok(Job::ReleaseBatch(Batch::release(
                &ctx,
                std::mem::take(&mut self.spare),
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

    /// Waiter `head` is at the head of its queue for `resource` now. If
    /// the lock is held here (the waiter before it took it), it waits for
    /// that lock's release, handed over or published; otherwise it tries
    /// once its subscriptions are in place.
    fn promote(&mut self, head: usize, resource: &Bytes, now: Instant) {
        let Some(Some(running)) = self.jobs.get_mut(head) else {
            return;
        };
        // Its give-up timer is the subscription's (or the wait's) now.
        self.timers.cancel(running);
        if wait_held_or_turn(
            &self.room,
            &self.engine,
            &self.config,
            &mut self.jitter,
            running,
            resource,
            now,
        ) {
            self.advance(head, now);
        } else {
            let until = now.checked_add(self.config.connect_timeout).unwrap_or(now);
            self.subscribing.push((head, until));
        }
    }

    /// Runs job `index` until it waits for a round or a timer, or ends.
    fn advance(&mut self, index: usize, now: Instant) {
        loop {
            let Hub {
                engine,
                room,
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
            // out waits for the round's outcome; one that comes while it
            // waits for room, for the room.
            if running.in_round || running.blocked {
                return;
            }
            // Every request goes through the gate new orders go through
            // (see `admit`): a burst of waiters woken together, say by a
            // batch of releases, waits here for room instead of pushing
            // connections others use past their bound.
            if !has_room_for(engine, config, &running.job, now)
                && !crate::knobs::injected(crate::knobs::Bug::AdmissionBypassed)
            {
                timers.cancel(running);
                running.awaiting = false;
                running.blocked = true;
                self.ready.push_back(index);
                return;
            }
            if running.waiter.is_abandoned() {
                running.job.cancel();
            }
            let mut ctx = Ctx {
                config,
                names,
                tokens,
                jitter,
            };
            // A multi-resource waiter's resources, to listen to (an Arc
            // shared, nothing copied).
            let multi = running.job.listens_to().cloned();
            // A waiter's attempt, refused, tells every process it waits,
            // unless this client knows itself seated in their turns.
            if let Some(resource) = &running.waits_for {
                let needs = room.get(resource).is_none_or(|w| w.turns.needs_notice());
                running.job.ask_notice(needs);
            }
            match running.job.poll(&mut ctx, now) {
                Step::Round {
                    requests,
                    timeout,
                    wait,
                } => {
                    links.prepare(engine, now);
                    hear(room, engine);
                    if let Some(epoch) =
                        epoch_of(room, running.waits_for.as_ref(), running.listening.as_ref())
                    {
                        running.tried_at = epoch;
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
                Step::Send { requests, skip } => {
                    let listening = running.listening.iter().flat_map(Keys::as_slice);
                    for key in running.waits_for.iter().chain(listening) {
                        if let Some(waited) = room.get_mut(key) {
                            for request in requests {
                                waited.queue.handle_cleanup(request.token);
                            }
                        }
                    }
                    links.prepare(engine, now);
                    hear(room, engine);
                    engine.send(requests, now, skip);
                }
                Step::Sleep(at) => {
                    timers.set(running, index, at);
                    return;
                }
                Step::Subscribe(_) if multi.is_some() => {
                    if running.listening.is_none() {
                        for key in multi.iter().flat_map(Keys::as_slice) {
                            room.listen(key, index);
                            pump(room, engine, now);
                        }
                        running.listening = multi;
                        links.prepare(engine, now);
                        hear(room, engine);
                    }
                    if is_listening(engine, running, now) {
                        // Already told of every release (subscribed, or
                        // no subscriber connection to wait for): no turn
                        // of the loop, nor any reply, is needed to try.
                        running.job.handle_subscribed();
                        continue;
                    }
                    let until = now.checked_add(config.connect_timeout).unwrap_or(now);
                    subscribing.push((index, until));
                    return;
                }
                Step::Subscribe(resource) => {
                    let resource = resource.clone();
                    if running.waits_for.is_none() {
                        room.join(&resource, index);
                        pump(room, engine, now);
                        running.waits_for = Some(resource.clone());
                        // Subscriber connections open now, so that the
                        // SUBSCRIBEs leave in this turn's write.
                        links.prepare(engine, now);
                        hear(room, engine);
                    }
                    if room.head(&resource) == Some(index) {
                        if wait_held_or_turn(
                            room, engine, ctx.config, ctx.jitter, running, &resource, now,
                        ) {
                            continue;
                        }
                        if is_listening(engine, running, now) {
                            // As above: nothing to wait for before trying
                            // (waiting for the loop's next turn took up to
                            // the connect timeout when no reply came).
                            running.job.handle_subscribed();
                            continue;
                        }
                        let until = now.checked_add(config.connect_timeout).unwrap_or(now);
                        subscribing.push((index, until));
                    } else if let Some(at) = running.job.give_up_at() {
                        // Behind others: promoted when the head leaves,
                        // or done waiting at this instant.
                        timers.set(running, index, at);
                    }
                    return;
                }
                Step::Await {
                    resource,
                    until,
                    backoff,
                } => {
                    let epoch =
                        epoch_of(room, running.waits_for.as_ref(), running.listening.as_ref())
                            .unwrap_or_else(|| room.epoch(resource));
                    let (at, turn) = if backoff || epoch == running.tried_at {
                        running.awaiting = true;
                        (until, None)
                    } else {
                        // Released while the attempt was under way.
                        let turn = room.turn(resource);
                        let since = running.job.waiting_since();
                        (turn_at(jitter, config, turn, since, now), Some(turn))
                    };
                    timers.set(running, index, at);
                    running.deferred = turn == Some(Turn::Theirs);
                    return;
                }
                Step::Done => {
                    running
                        .job
                        .for_each_released(|key, token| room.handle_released(key, token));
                    if let Some((resource, token)) = running.job.yielded_release()
                        && !room.get(resource).is_some_and(|w| w.queue.heard(token))
                    {
                        room.handle_released(resource, token);
                    }
                    for key in running.listening.take().iter().flat_map(Keys::as_slice) {
                        room.unlisten(key, index);
                        pump(room, engine, now);
                    }
                    // Held here, whether its acquire waited or found the
                    // lock free: a new local acquire waits for its release
                    // (handed over, or heard) rather than try into a
                    // refusal (nothing, when nobody here listens for it).
                    let row = running
                        .job
                        .granted(*stamp)
                        .and_then(|(resource, until, token)| {
                            room.handle_granted(resource, until, token)
                        });
                    if let Some(row) = row {
                        running.job.go_on_with(row);
                    }
                    // Extended (or shortened, the extend failing): held
                    // here that long, no longer than the keys allow.
                    if let Some((resource, until, token)) = running.job.extended(*stamp)
                        && let Some(waited) = room.get_mut(resource)
                    {
                        waited.marks.handle_extended(until, token);
                    }
                    let waited_for = running.waits_for.take();
                    let promoted = match &waited_for {
                        Some(resource) => {
                            let head = room.leave(resource, index);
                            pump(room, engine, now);
                            head
                        }
                        None => None,
                    };
                    let output = running.job.take_output(now);
                    let finished = jobs[index].take();
                    self.free_jobs.push(index);
                    if let (Some(head), Some(resource)) = (promoted, waited_for) {
                        self.promote(head, &resource, now);
                    }
                    let (Some(output), Some(finished)) = (output, finished) else {
                        return;
                    };
                    finished.span.record(output.first_error());
                    if let Some(requests) = finished.job.into_requests() {
                        self.spare = requests;
                    }
                    match finished.waiter {
                        Waiter::Caller(completion) => {
                            if let Some(unclaimed) = completion.complete(output) {
                                self.release_abandoned(unclaimed, now);
                            }
                        }
                        Waiter::Keeper(slot) => self.handle_extended(slot, output, now),
                        Waiter::Nobody => {}
                    }
                    return;
                }
            }
        }
    }

    /// An acquire whose caller went away took locks: each is released as
    /// any release is, nobody waiting for the answer: through the
    /// admission gate, let go here (no longer "held here": a local waiter
    /// is handed it or told, and other processes by the masters).
    pub(crate) fn release_abandoned(&mut self, output: Output, now: Instant) {
        if crate::knobs::injected(crate::knobs::Bug::AbandonedStaysHeld) {
            return self.send_unclaimed(output, now);
        }
        let order = match output {
            Output::Lock(Ok(lock)) => {
                metrics::released_unclaimed(1);
                Order::Release { lock }
            }
            Output::Locks(results) => {
                let locks: Vec<Lock> = results.into_iter().flatten().collect();
                if locks.is_empty() {
                    return;
                }
                metrics::released_unclaimed(locks.len());
                Order::ReleaseBatch { locks }
            }
            _ => return,
        };
        // A release is always made a job (nothing refuses it).
        if let Ok(job) = self.make_job(order, now) {
            self.launch(job, Waiter::Nobody, now);
        }
    }

    /// Releases the locks in `output` on every master at once, nobody
    /// waiting for the answers: for locks whose future was dropped after
    /// the loop ended, which runs no job any more.
    pub(crate) fn send_unclaimed(&mut self, output: Output, now: Instant) {
        let release = |lock: &Lock| Request {
            op: release_op(&lock.keys),
            keys: lock.keys.clone(),
            token: lock.token,
            arg: 0,
            notice: false,
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

/// Whether `job`'s next step fits in the connections' in-flight queues
/// (see [`Engine::has_room`]), within the half of
/// [`Config::max_in_flight`] that admission leaves new work: the one gate
/// for new orders' jobs and every later step of a job under way. A step
/// that sends nothing always fits.
fn has_room_for(engine: &Engine, config: &Config, job: &Job, now: Instant) -> bool {
    let limit = config.max_in_flight / 2;
    let k = job.round_size().min(limit);
    k == 0 || engine.has_room(k, limit, now)
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

/// Moves the waiting room's asks (subscribe, unsubscribe) to the
/// engine's subscriptions, each followed by what they heard ([`hear`]),
/// until neither has more: the room then reads as if each change and each
/// message had reached it as it was made or read.
fn pump(room: &mut Room, engine: &mut Engine, now: Instant) {
    loop {
        hear(room, engine);
        match room.poll_change() {
            Some(Change::Subscribe(resource)) => engine.subscribe(&resource, now),
            Some(Change::Unsubscribe(resource)) => engine.unsubscribe(&resource, now),
            None => return,
        }
    }
}

/// Moves what the engine's subscriber connections heard into the waiting
/// room: called at each door before the room is read, and after anything
/// that may have dropped a subscriber connection (opening connections).
fn hear(room: &mut Room, engine: &mut Engine) {
    while let Some(heard) = engine.poll_heard() {
        match heard {
            Heard::Message { resource, payload } => room.handle_message(&resource, &payload),
            Heard::Renewed(resource) => room.handle_renewed(&resource),
            Heard::Forgotten(resource) => room.handle_forgotten(&resource),
        }
    }
}

/// The releases seen of what `running` waits for: its queue's resource,
/// or the sum over the resources it listens to; none when it waits for
/// none.
fn epoch_of(room: &Room, waits_for: Option<&Bytes>, listening: Option<&Keys>) -> Option<u64> {
    if let Some(keys) = listening {
        return Some(keys.as_slice().iter().map(|k| room.epoch(k)).sum());
    }
    waits_for.map(|r| room.epoch(r))
}

/// Whether a waiting job is told of every release it waits for: the one
/// resource it queues for and each one it listens to (see
/// [`Engine::is_listening`]).
fn is_listening<P>(engine: &Engine, running: &Running<P>, now: Instant) -> bool {
    running
        .waits_for
        .as_ref()
        .is_none_or(|r| engine.is_listening(r, now))
        && running
            .listening
            .iter()
            .flat_map(Keys::as_slice)
            .all(|k| engine.is_listening(k, now))
}

/// A waiting acquire at the head of `resource`'s queue waits for the lock
/// held here to be released (see [`Job::handle_held_here`]), if it is
/// held here and the subscriptions are in place; or, if it has not tried
/// yet, for the turn of the process the last release named, under way
/// (see [`their_turn_since`] and [`Job::handle_turn`]). Returns whether
/// it waits.
fn wait_held_or_turn<P>(
    room: &Room,
    engine: &Engine,
    config: &Config,
    jitter: &mut SplitMix64,
    running: &mut Running<P>,
    resource: &[u8],
    now: Instant,
) -> bool {
    let waits = match room.held_here(resource, now) {
        Some(until) => engine.is_listening(resource, now) && running.job.handle_held_here(until),
        None => {
            // Listening or not: the wait is short, and ends with a try.
            their_turn_since(room, config, resource, now).is_some_and(|since| {
                // When the waiters its release woke here try.
                let at = turn_at(jitter, config, Turn::Theirs, None, since);
                running.job.handle_turn(at.max(now))
            })
        }
    };
    if waits {
        running.tried_at = room.epoch(resource);
    }
    waits
}

/// When another process's turn at the lock on `resource` began, if it
/// is under way at `now`: the last release named that process, and the
/// waiters that release woke here may wait for it still (the
/// [`patience`] they give it, and up to a wake spread more). A new waiter
/// here waits for it too, rather than try at once, ahead of that
/// process: the releasing process's own callers, coming back, took the
/// lock after 28% of the releases that named another process (4 x 2
/// processes and threads, hold 0, read off a master's MONITOR).
fn their_turn_since(
    room: &Room,
    config: &Config,
    resource: &[u8],
    now: Instant,
) -> Option<Instant> {
    room.theirs_since(resource)
        .filter(|&since| turn_over_at(config, since) > now)
}

/// When a turn begun at `since` is over: the latest the waiters its
/// release woke give the named process (see `turn_at`).
fn turn_over_at(config: &Config, since: Instant) -> Instant {
    since + patience(config) + config.wake_spread
}
