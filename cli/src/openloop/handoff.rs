//! Hand-off latency in contended shapes (`--resources 1 --hold D`): the
//! time from a holder's release to the next holder's grant, apart from
//! the round trips.
//!
//! This module owns the pairing of releases with grants, as plain data:
//! a release is stamped when it is sent (the earliest the lock can be
//! free, so that a hand-off is never negative), and a grant counts as a
//! hand-off only when its acquire was already waiting at that release. A
//! grant to an acquire that started after the release took a free lock,
//! which is no hand-off. Each release is handed off at most once. It
//! reads no clock.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::record::{histogram, micros};

/// Releases and grants of the resources `0..n`, and the hand-offs they
/// make.
#[derive(Debug)]
pub(crate) struct Handoffs {
    /// Each resource's last release not yet handed off: when it was sent.
    released: Vec<Option<Instant>>,
    /// Hand-offs whose acquire began at or after this are recorded.
    measured_from: Instant,
    /// Release to grant, µs.
    pub(crate) histogram: Histogram<u64>,
}

impl Handoffs {
    pub(crate) fn new(resources: usize, measured_from: Instant) -> Handoffs {
        Handoffs {
            released: vec![None; resources],
            measured_from,
            histogram: histogram(),
        }
    }

    /// `resource`'s holder sends its release at `at`.
    pub(crate) fn handle_release(&mut self, resource: usize, at: Instant) {
        if let Some(slot) = self.released.get_mut(resource) {
            *slot = Some(at);
        }
    }

    /// An acquire of `resource` that began at `waiting_since` was granted
    /// at `at`: the hand-off it made, if it was one (and recorded when
    /// measured).
    pub(crate) fn handle_grant(
        &mut self,
        resource: usize,
        waiting_since: Instant,
        at: Instant,
    ) -> Option<Duration> {
        let slot = self.released.get_mut(resource)?;
        let released = slot.take()?;
        if waiting_since > released {
            // It found the lock free: no hand-off.
            return None;
        }
        let handoff = at.saturating_duration_since(released);
        if waiting_since >= self.measured_from {
            self.histogram.saturating_record(micros(handoff));
        }
        Some(handoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn grants_pair_with_the_release_their_acquire_waited_for() {
        let t = Instant::now();
        // (event, resource, waiting since (ms), at (ms), hand-off expected)
        enum E {
            Release(usize, u64),
            Grant(usize, u64, u64, Option<u64>),
        }
        let cases: &[(&str, &[E])] = &[
            (
                "a waiter granted 3 ms after the release",
                &[E::Release(0, 10), E::Grant(0, 5, 13, Some(3))],
            ),
            (
                "an acquire that began after the release found the lock free",
                &[E::Release(0, 10), E::Grant(0, 11, 12, None)],
            ),
            (
                "a release is handed off once",
                &[
                    E::Release(0, 10),
                    E::Grant(0, 5, 13, Some(3)),
                    E::Grant(0, 6, 14, None),
                ],
            ),
            (
                "resources are apart",
                &[
                    E::Release(1, 10),
                    E::Grant(0, 5, 13, None),
                    E::Grant(1, 5, 12, Some(2)),
                ],
            ),
            (
                "a grant with no release before it",
                &[E::Grant(0, 0, 1, None)],
            ),
        ];
        for (name, events) in cases {
            let mut h = Handoffs::new(2, t);
            for e in *events {
                match *e {
                    E::Release(r, at) => h.handle_release(r, t + ms(at)),
                    E::Grant(r, since, at, want) => {
                        let got = h.handle_grant(r, t + ms(since), t + ms(at));
                        assert_eq!(got, want.map(ms), "{name}");
                    }
                }
            }
        }
    }

    #[test]
    fn only_hand_offs_to_acquires_begun_in_the_window_are_recorded() {
        let t = Instant::now();
        let mut h = Handoffs::new(1, t + ms(100));
        h.handle_release(0, t + ms(110));
        assert_eq!(h.handle_grant(0, t + ms(90), t + ms(111)), Some(ms(1)));
        h.handle_release(0, t + ms(120));
        assert_eq!(h.handle_grant(0, t + ms(115), t + ms(122)), Some(ms(2)));
        assert_eq!(h.histogram.len(), 1);
        assert_eq!(h.histogram.max(), 2000);
    }
}
