//! The hub's waiting jobs: their timers (a retry's delay, the end of a
//! wait for a release, a woken waiter's spread), their subscriptions, and
//! the release notifications that wake the head of a resource's queue.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use super::{Hub, Links, Promise, Running};
use crate::config::Config;
use crate::job::SplitMix64;
use crate::wait::Turn;

/// When a waiter woken by a release at `now` tries: after a random delay
/// within [`Config::wake_spread`], so that the waiters of several
/// processes woken together do not split the masters' votes, shorter the
/// longer it has waited (since `waiting_since`), down to a quarter of the
/// spread at 20 ms, so that the waiter that has waited longest tends to
/// send its attempt first; past that, the share shrinks in proportion to
/// the wait (an eighth at 40 ms, a fortieth at 200 ms), so that a waiter
/// that lost several turns in a row to other processes' tries before
/// those that have waited less, and a long wait stays rare.
pub(super) fn wake_at(
    jitter: &mut SplitMix64,
    spread: Duration,
    waiting_since: Option<Instant>,
    now: Instant,
) -> Instant {
    let age = waiting_since
        .map(|t| now.saturating_duration_since(t))
        .unwrap_or_default();
    let share = if age <= AGE_PRIORITY {
        (1.0 - age.as_secs_f64() / AGE_PRIORITY.as_secs_f64()).max(MIN_SPREAD_SHARE)
    } else {
        MIN_SPREAD_SHARE * AGE_PRIORITY.as_secs_f64() / age.as_secs_f64()
    };
    now + jitter.between(Duration::ZERO, spread.mul_f64(share))
}

/// When a waiter woken by a release at `now` tries, its process's
/// [`Turn`] being `turn`: at once on its turn; on another's, after the
/// [`patience`] it gives that one and up to one spread more, should that
/// one not have taken the lock by then (gone, or its attempt lost); else
/// as [`wake_at`].
pub(super) fn turn_at(
    jitter: &mut SplitMix64,
    config: &Config,
    turn: Turn,
    waiting_since: Option<Instant>,
    now: Instant,
) -> Instant {
    let spread = config.wake_spread;
    match turn {
        Turn::Mine => now,
        Turn::Theirs => now + patience(config) + jitter.between(Duration::ZERO, spread),
        Turn::Open => wake_at(jitter, spread, waiting_since, now),
    }
}

/// How long a waiter gives the process whose turn it is before it tries
/// itself: [`PATIENCE`] wake spreads, for that one to hear of the release
/// and its attempt to reach the masters first, and that one's row of
/// hand-overs ([`Config::local_handover_window`], at most
/// [`MAX_ROW_PATIENCE`]), for an attempt within it would only be refused.
/// A process named that is gone costs its lock this long once.
pub(crate) fn patience(config: &Config) -> Duration {
    config.wake_spread * PATIENCE + config.local_handover_window.min(MAX_ROW_PATIENCE)
}

/// How many wake spreads of [`patience`] a waiter gives the process whose
/// turn it is.
const PATIENCE: u32 = 4;

/// The most of a row of hand-overs [`patience`] waits out.
const MAX_ROW_PATIENCE: Duration = Duration::from_millis(10);

/// The jobs' timers: when each waiting job goes on (to retry, to stop
/// waiting for a release or its turn, or after its wake delay). A job has
/// one live timer; setting or cancelling it makes its earlier entries
/// stale.
#[derive(Debug, Default)]
pub(super) struct Timers {
    /// (when, job, timer), soonest first; an entry whose timer is not the
    /// job's is stale.
    pub(super) heap: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    /// The last timer handed out.
    pub(super) issued: u64,
}

impl Timers {
    /// Sets job `index`'s (`running`'s) timer to `at`, replacing any other.
    pub(super) fn set<P>(&mut self, running: &mut Running<P>, index: usize, at: Instant) {
        self.cancel(running);
        running.deferred = false;
        self.heap.push(Reverse((at, index, running.timer)));
    }

    /// Makes `running`'s timer, if it has one, stale.
    pub(super) fn cancel<P>(&mut self, running: &mut Running<P>) {
        self.issued += 1;
        running.timer = self.issued;
    }

    /// The soonest entry's instant (perhaps a stale one's).
    pub(super) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }
}

/// Past this wait, a woken waiter's delay is the least share of the
/// spread (see [`wake_at`]).
const AGE_PRIORITY: Duration = Duration::from_millis(20);

/// The share of [`Config::wake_spread`] a woken waiter's delay is drawn
/// from at [`AGE_PRIORITY`]: waiters of several processes that have all
/// waited about as long are still spread apart, or they would all try at
/// once and split the votes.
const MIN_SPREAD_SHARE: f64 = 0.25;

impl<P: Promise, L: Links> Hub<P, L> {
    /// Jobs whose retry wait is over (all of them once closing) go on.
    pub(super) fn wake_sleepers(&mut self, now: Instant) {
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
    pub(super) fn wake_abandoned(&mut self, now: Instant) {
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
    pub(super) fn check_subscribing(&mut self, now: Instant, closing: bool) {
        let mut i = 0;
        while let Some(&(index, until)) = self.subscribing.get(i) {
            let ready = match self.jobs.get(index) {
                Some(Some(running)) => {
                    closing
                        || now >= until
                        || running.waiter.is_abandoned()
                        || super::is_listening(&self.engine, running, now)
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
    pub(super) fn wake_waiters(&mut self, now: Instant) {
        while let Some(resource) = self.room.poll_notified() {
            let Some(waited) = self.room.get_mut(&resource) else {
                continue;
            };
            waited.turns.handle_began(now);
            if let Some(head) = self.room.head(&resource) {
                let turn = self.room.turn(&resource);
                self.wake(head, turn, now);
            }
            // Every multi-resource waiter listening to it: none is a head.
            let mut i = 0;
            while let Some(&listener) =
                (self.room.get(&resource)).and_then(|w| w.queue.listeners().get(i))
            {
                self.wake(listener, Turn::Open, now);
                i += 1;
            }
        }
    }

    /// Waiter `index`, woken by a release, tries after its share of the
    /// wake spread, if it waits for one.
    fn wake(&mut self, index: usize, turn: Turn, now: Instant) {
        if let Some(Some(running)) = self.jobs.get_mut(index)
            && (running.awaiting || (running.deferred && turn == Turn::Mine))
        {
            running.awaiting = false;
            let since = running.job.waiting_since();
            let at = turn_at(&mut self.jitter, &self.config, turn, since, now);
            self.timers.set(running, index, at);
            running.deferred = turn == Turn::Theirs;
        }
    }
}
