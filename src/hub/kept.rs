//! The hub's kept locks: the table of locks the loop keeps alive for
//! their holders ([`Keeper`] decides when to extend), their extensions,
//! their timers, and their release when told to stop.

use std::cmp::Reverse;
use std::sync::Arc;
use std::time::Instant;

use super::{Hub, Links, Promise, Waiter, place};
use crate::error::Error;
use crate::job::{Ctx, Extend, Job, Output, Release};
use crate::keep::{KeepStep, Keeper, Shared as KeepShared};

/// A kept lock in the loop's table.
#[derive(Debug)]
pub(super) struct Kept<P> {
    pub(super) keeper: Keeper,
    /// Tells this lock's timers from those of an earlier lock in the slot.
    pub(super) generation: u64,
    /// An extension is in flight.
    pub(super) extending: bool,
    /// Told to stop while extending: release once the extension ends, and
    /// hand the result to this caller.
    pub(super) stopping: Option<P>,
    /// Its extension waits for room, in [`Hub::kept_admitting`].
    pub(super) admitting: bool,
}

impl<P: Promise, L: Links> Hub<P, L> {
    /// When the next kept lock's schedule needs the hub.
    pub(crate) fn next_keep(&self) -> Option<Instant> {
        self.keep_timers.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Takes a lock to keep, and runs its schedule.
    pub(super) fn keep(&mut self, keeper: Keeper, now: Instant) {
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
    pub(super) fn drive_kept(&mut self, slot: usize, now: Instant) {
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
                    if !self.engine.has_room(1, limit, now) {
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
    pub(super) fn handle_extended(&mut self, slot: usize, output: Output, now: Instant) {
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
    pub(super) fn fire_keep_timers(&mut self, now: Instant) {
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
    pub(super) fn unkeep(&mut self, shared: &Arc<KeepShared>, completion: P, now: Instant) {
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
    pub(super) fn release_kept(&mut self, slot: usize, completion: P, now: Instant) {
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
}
