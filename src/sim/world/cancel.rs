//! The cancellation checker: SAFETY.md's contract for a dropped acquire
//! (*Cancellation and shutdown*). Dropped while its order waits for
//! admission, for its retry delay, for its turn behind local waiters, for
//! its subscriptions or for a release, the job ends at that wait with no
//! further attempt; dropped while a round is out, that round runs to its
//! decision and no other starts. So no acquire request of a dropped job
//! leaves its client after the drop.
//!
//! The world tells one job's requests from another's by their TTL, which
//! it picks distinct among a client's unfinished acquires (every attempt
//! of a job carries its TTL; tokens change from attempt to attempt), and
//! orders what happens in the client by a sequence number: a drop, an
//! acquire's submission and its end, and each write, which a master
//! reading the request reports with the number of the write that carried
//! it. It changes nothing in the run.

use super::{Micros, TokenKey};
use crate::hash::FxMap;

/// An acquire as the checker follows it.
#[derive(Debug)]
struct Job {
    /// The sequence number of its submission, and of its end once it
    /// ended: its requests were written in between.
    from: u64,
    until: Option<u64>,
    /// When its caller dropped it: the sequence number, and the time.
    dropped: Option<(u64, Micros)>,
    /// The tokens of its requests that reached a master, written before
    /// the drop (a resend after `-NOSCRIPT` carries one of them again).
    tokens: Vec<TokenKey>,
    /// Reported once.
    reported: bool,
}

/// The cancellation checker (see the module's docs).
#[derive(Debug)]
pub(super) struct Cancels {
    /// Per client: its acquires, in the order submitted.
    jobs: Vec<Vec<Job>>,
    /// Per client: TTL (ms) -> its acquires with that TTL, latest last.
    by_ttl: Vec<FxMap<u64, Vec<usize>>>,
}

impl Cancels {
    pub(super) fn new(clients: usize) -> Cancels {
        Cancels {
            jobs: (0..clients).map(|_| Vec::new()).collect(),
            by_ttl: (0..clients).map(|_| FxMap::default()).collect(),
        }
    }

    /// Whether no unfinished acquire of `client` has TTL `ttl`: a new one
    /// may, and its requests are told from theirs.
    pub(super) fn is_free(&self, client: usize, ttl: u64) -> bool {
        self.by_ttl[client]
            .get(&ttl)
            .and_then(|jobs| jobs.last())
            .is_none_or(|&j| self.jobs[client][j].until.is_some())
    }

    /// `client` submits an acquire with TTL `ttl` (ms), at sequence
    /// number `seq`: its index, for the calls below.
    pub(super) fn handle_submit(&mut self, client: usize, ttl: u64, seq: u64) -> usize {
        let jobs = &mut self.jobs[client];
        jobs.push(Job {
            from: seq,
            until: None,
            dropped: None,
            tokens: Vec::new(),
            reported: false,
        });
        let index = jobs.len() - 1;
        self.by_ttl[client].entry(ttl).or_default().push(index);
        index
    }

    /// The caller of `client`'s acquire `index` drops it at `seq`, `now`.
    pub(super) fn handle_drop(&mut self, client: usize, index: usize, seq: u64, now: Micros) {
        if let Some(job) = self.jobs[client].get_mut(index) {
            job.dropped.get_or_insert((seq, now));
        }
    }

    /// `client`'s acquire `index` ended (its output handed over) at `seq`.
    pub(super) fn handle_end(&mut self, client: usize, index: usize, seq: u64) {
        if let Some(job) = self.jobs[client].get_mut(index) {
            job.until.get_or_insert(seq);
        }
    }

    /// A master read an acquire request of `client` with TTL `ttl` and
    /// `token`, written at sequence number `written` (at `sent`): a
    /// violation, in one line, when it belongs to an acquire dropped
    /// before that write and is no resend of a request written before.
    pub(super) fn handle_attempt(
        &mut self,
        client: usize,
        ttl: u64,
        token: TokenKey,
        written: u64,
        sent: Micros,
    ) -> Option<String> {
        let jobs = &mut self.jobs[client];
        // The acquire with this TTL unfinished when the write was made.
        let index = *self.by_ttl[client].get(&ttl)?.iter().rev().find(|&&j| {
            let job = &jobs[j];
            job.from < written && job.until.is_none_or(|until| written < until)
        })?;
        let job = &mut jobs[index];
        let Some((_, at)) = job.dropped.filter(|&(dropped, _)| dropped < written) else {
            if job.tokens.len() < 64 && !job.tokens.contains(&token) {
                job.tokens.push(token);
            }
            return None;
        };
        if job.tokens.contains(&token) || std::mem::replace(&mut job.reported, true) {
            return None;
        }
        let before = match job.tokens.len() {
            0 => "no attempt of it had reached a master before (it was queued, or waited for \
                  admission)"
                .to_owned(),
            n => format!("after {n} attempt(s) that reached a master before"),
        };
        Some(format!(
            "cancel: client {client}'s acquire (TTL {ttl} ms) was dropped by its caller at \
             {:.3} ms, and its client sent an attempt of it after (token {:?}, queued at {:.3} \
             ms): {before}",
            at as f64 / 1e3,
            token.text(),
            sent as f64 / 1e3,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(n: u8) -> TokenKey {
        TokenKey::new(&[b'a' + n; 48])
    }

    #[test]
    fn an_attempt_written_after_the_drop_of_a_queued_acquire_is_a_violation() {
        let mut cancels = Cancels::new(2);
        let job = cancels.handle_submit(1, 700, 10);
        cancels.handle_drop(1, job, 20, 5_000);
        let found = cancels.handle_attempt(1, 700, token(0), 21, 5_000);
        assert!(
            found
                .as_deref()
                .is_some_and(|v| v.contains("no attempt of it")),
            "{found:?}"
        );
        // Once per acquire.
        assert!(
            cancels
                .handle_attempt(1, 700, token(1), 22, 5_010)
                .is_none()
        );
    }

    #[test]
    fn the_round_out_at_the_drop_runs_to_its_decision() {
        let mut cancels = Cancels::new(1);
        let job = cancels.handle_submit(0, 700, 10);
        // Written before the drop, read after it: no new attempt.
        cancels.handle_drop(0, job, 20, 5_000);
        assert!(
            cancels
                .handle_attempt(0, 700, token(0), 15, 4_000)
                .is_none()
        );
        // Its resend after -NOSCRIPT, written after the drop: the same
        // request again.
        assert!(
            cancels
                .handle_attempt(0, 700, token(0), 25, 5_100)
                .is_none()
        );
        // A new attempt after it.
        let found = cancels.handle_attempt(0, 700, token(1), 26, 5_200);
        assert!(
            found
                .as_deref()
                .is_some_and(|v| v.contains("after 1 attempt")),
            "{found:?}"
        );
    }

    #[test]
    fn acquires_are_told_apart_by_their_ttl_and_lifetime() {
        let mut cancels = Cancels::new(1);
        let first = cancels.handle_submit(0, 700, 10);
        assert!(!cancels.is_free(0, 700));
        assert!(cancels.is_free(0, 701));
        let other = cancels.handle_submit(0, 701, 11);
        cancels.handle_drop(0, other, 12, 1_000);
        // The first acquire's attempts are its own, dropped or not.
        assert!(
            cancels
                .handle_attempt(0, 700, token(0), 13, 1_000)
                .is_none()
        );
        cancels.handle_end(0, first, 14);
        assert!(cancels.is_free(0, 700));
        // A later acquire with the same TTL: its attempts are its own.
        let later = cancels.handle_submit(0, 700, 15);
        cancels.handle_drop(0, first, 16, 1_100);
        assert!(
            cancels
                .handle_attempt(0, 700, token(2), 17, 1_100)
                .is_none()
        );
        cancels.handle_drop(0, later, 18, 1_200);
        assert!(
            cancels
                .handle_attempt(0, 700, token(3), 19, 1_200)
                .is_some()
        );
        // A TTL nobody used: nobody's.
        assert!(
            cancels
                .handle_attempt(0, 999, token(4), 20, 1_200)
                .is_none()
        );
    }
}
