//! Releases that wait a moment for a local caller: a lock passing between
//! this client's callers, released with none of them waiting for it, is
//! held a little longer (see [`Config::local_handover_linger`]), so that a
//! caller coming straight back for it is handed it rather than racing
//! every process's waiters woken by an announced release.
//!
//! [`Config::local_handover_linger`]: crate::Config::local_handover_linger

use std::time::Instant;

use bytes::Bytes;

use super::{Hub, Links, Promise, Waiter};
use crate::error::Error;
use crate::job::Job;

/// A release held back, and its caller.
#[derive(Debug)]
pub(super) struct Parked<P> {
    release: Job,
    completion: P,
    resource: Bytes,
    /// When it goes out announced if no local caller came.
    until: Instant,
}

impl<P: Promise, L: Links> Hub<P, L> {
    /// The resource whose local caller `job` waits for, when `job` is a
    /// release that lingers: its lock has been passing between this
    /// client's callers, none of them waits for it now, and its row of
    /// hand-overs is within budget (past it the release is announced,
    /// for the other processes' turn).
    pub(super) fn lingers(&self, job: &Job, now: Instant) -> Option<Bytes> {
        let Job::Release(release) = job else {
            return None;
        };
        if self.config.local_handover_linger.is_zero() || self.closing_since.is_some() {
            return None;
        }
        let resource = release.resource()?;
        (self.room.get(resource).is_some_and(|w| w.row.has_company())
            && self.is_within_budget(resource, release.cohort(now), now)
            && self.handover_head(resource).is_none())
        .then(|| resource.clone())
    }

    /// Holds `release` back until a local caller waits for `resource`, or
    /// for [`Config::local_handover_linger`](crate::Config::local_handover_linger).
    /// The lock stays held here meanwhile: a caller coming for it waits
    /// for its release instead of trying.
    pub(super) fn park(&mut self, release: Job, completion: P, resource: Bytes, now: Instant) {
        let until = now
            .checked_add(self.config.local_handover_linger)
            .unwrap_or(now);
        self.parked.push(Parked {
            release,
            completion,
            resource,
            until,
        });
    }

    /// Starts each held-back release whose local caller came (handed the
    /// lock), whose moment is over (announced; the lock's callers here are
    /// taken for one until it is next handed over), or all of them once
    /// the last handle went.
    pub(super) fn unpark(&mut self, now: Instant) {
        let mut i = 0;
        while let Some(parked) = self.parked.get(i) {
            let came = self.handover_head(&parked.resource).is_some();
            if !came && now < parked.until && self.closing_since.is_none() {
                i += 1;
                continue;
            }
            let Parked {
                release,
                completion,
                resource,
                ..
            } = self.parked.swap_remove(i);
            if !came && let Some(waited) = self.room.get_mut(&resource) {
                waited.row.handle_company(false);
            }
            self.launch(release, Waiter::Caller(completion), now);
        }
    }

    /// When the first held-back release goes out, if none comes for it.
    pub(super) fn next_unpark(&self) -> Option<Instant> {
        self.parked.iter().map(|p| p.until).min()
    }

    /// Ends every held-back release with `error` (the loop stopped).
    pub(super) fn stop_parked(&mut self, error: &Error) {
        for parked in self.parked.drain(..) {
            // A stopped loop releases nothing: the caller is told.
            let _ = parked.completion.complete(parked.release.stopped(error));
        }
    }
}
