//! What a caller is told when an operation fails: [`Error`], with the
//! votes behind it ([`Failure`], one [`MasterVote`] per master), so that
//! "the lock is held" reads apart from "not enough masters reachable"
//! and from "a master broke the protocol".

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::config::ConfigError;
use crate::conn::{Cause, seconds_up};
use crate::quorum::Vote;

/// One master's part in a failed operation. Made by the client, read by
/// its callers: fields may be added.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MasterVote {
    /// The master's URL, password hidden.
    pub server: Arc<str>,
    /// What it answered.
    pub vote: Vote,
}

/// The detail of a failed operation: the last round's votes. Made by the
/// client, read by its callers: fields may be added.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Failure {
    /// The quorum `Q`.
    pub quorum: usize,
    /// How many masters granted.
    pub granted: usize,
    /// How many refused: the key holds another token there (or, for an
    /// extend, [`Vote::Gone`]: it holds none).
    pub refused: usize,
    /// Each master's vote, in configuration order.
    pub votes: Vec<MasterVote>,
    /// How long the operation took, retries included.
    pub elapsed: Duration,
    /// How many attempts were made.
    pub attempts: u32,
    /// See [`Failure::held_by_this_client`].
    pub(crate) held_by_this_client: Option<bool>,
}

impl Failure {
    /// Whose lock refused, as the masters said in the last attempt:
    /// `Some(true)` when every refusing master named one of this client's
    /// own locks (one it took and has not released, for this caller or
    /// another caller of the same client), `Some(false)` when every one
    /// named another client's, `None` when that is not known.
    ///
    /// Known only where every refusing master named its key's value: the
    /// refusals of a fenced acquire, of a multi-resource acquire (each
    /// master naming the holder of the key it holds longest), and of a
    /// retrying acquire's attempts once it waits for the lock
    /// ([`Config::wake_on_release`](crate::Config::wake_on_release), on by
    /// default; its first attempt may be a plain one). A plain `SET NX`
    /// refusal, such as [`Redlock::try_acquire`](crate::Redlock::try_acquire)'s,
    /// names nobody: `None`. So too when the masters named both kinds, and
    /// for a failure without refusals.
    pub fn held_by_this_client(&self) -> Option<bool> {
        self.held_by_this_client
    }

    /// How many masters are in restart quarantine: they answered, but their
    /// votes do not count yet (see [`Cause::Quarantined`]).
    pub fn quarantined(&self) -> usize {
        self.quarantine_lefts().count()
    }

    /// The longest restart quarantine left among the masters in one, `None`
    /// when none is: waiting this long lets them count again.
    pub fn quarantine_left(&self) -> Option<Duration> {
        self.quarantine_lefts().max()
    }

    fn quarantine_lefts(&self) -> impl Iterator<Item = Duration> + '_ {
        self.votes.iter().filter_map(|v| match v.vote {
            Vote::Failed(Cause::Quarantined(left)) => Some(left),
            _ => None,
        })
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} masters granted, {} needed, {} refused, after {} attempt(s) in {:?}",
            self.granted,
            self.votes.len(),
            self.quorum,
            self.refused,
            self.attempts,
            self.elapsed
        )?;
        // Where a native extend could tell: refusals that found no key.
        let gone = self.votes.iter().filter(|v| v.vote == Vote::Gone).count();
        if gone > 0 {
            write!(f, " ({gone} found the key gone)")?;
        }
        // Decided without them: a master that never answers (a port that
        // accepts and stays silent, say) must show here too.
        for MasterVote { server, vote } in &self.votes {
            match vote {
                Vote::Failed(cause) => write!(f, "; {server}: {cause}")?,
                Vote::Pending => write!(f, "; {server}: no answer yet")?,
                Vote::Granted | Vote::Refused | Vote::Gone => {}
            }
        }
        Ok(())
    }
}

/// Why an operation did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A setting or argument cannot work; nothing was sent.
    Config(ConfigError),
    /// Acquire: the lock is held on `refused` masters, by another client
    /// or by this one (a lock it took and has not released):
    /// [`Failure::held_by_this_client`] says which, where the masters told.
    Held(Failure),
    /// Extend or release: this token no longer holds the key on a quorum
    /// (the lock expired, or was taken after expiring).
    NotHeld(Failure),
    /// Not enough masters answered to decide: down, stalled or refusing
    /// connections. Each master's cause is in the failure.
    NoQuorum(Failure),
    /// So many masters refuse this client for good (a wrong password, a
    /// user denied a command the client needs: see
    /// [`Cause::is_permanent`](crate::Cause::is_permanent)) that no quorum
    /// can be had until an operator grants what is missing. Each refusing
    /// master's cause names the command refused and what to grant. An
    /// acquire with retries ends with this at once.
    Denied(Failure),
    /// A master broke the protocol (malformed or unsolicited replies) and
    /// the quorum was missed because of it.
    Protocol(Failure),
    /// A quorum granted, but the round took so long that no validity was
    /// left; the keys have been released.
    ValidityExpired(Failure),
    /// Fenced acquire: a quorum granted the lock, but fewer than a quorum
    /// of the masters that granted could vouch for their fence value (they
    /// lost their data and have not been repaired for this resource, see
    /// `SAFETY.md`), so no fence could be trusted; the keys have been
    /// released. Retrying succeeds once enough intact masters answer.
    FenceUnknown {
        /// The votes of the first phase.
        failure: Failure,
        /// The masters that granted without vouching for their fence.
        untrusted: Vec<Arc<str>>,
    },
    /// Fenced acquire: the fence write-back (the second phase) was refused
    /// because the lock key was gone on too many masters between the two
    /// phases (it expired, or was deleted, or the master lost it); the
    /// keys have been released. Not a lock held by someone else.
    FenceRefused(Failure),
    /// The lock has been extended [`Config::max_extensions`](crate::Config::max_extensions) times.
    ExtensionLimit(u32),
    /// The OS refused a poll instance or random bytes.
    Os(io::ErrorKind),
    /// The client lost track of an operation: a bug in redlock-mio, never
    /// a master's doing. The text says where; please report it. Nothing
    /// more is known of the operation's effect on the masters (a lock it
    /// took expires with its TTL).
    Internal(&'static str),
    /// The shared client's event loop has stopped: it ended after its last
    /// handle was dropped, or a panic on its thread ended it (the message
    /// says which). Nothing more is sent; every operation under way or
    /// submitted later ends with this error at once.
    Stopped(Arc<str>),
}

impl Error {
    /// The votes behind a failed round, when there was one.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Error::Held(f)
            | Error::NotHeld(f)
            | Error::NoQuorum(f)
            | Error::Denied(f)
            | Error::Protocol(f)
            | Error::ValidityExpired(f)
            | Error::FenceRefused(f)
            | Error::FenceUnknown { failure: f, .. } => Some(f),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(e) => write!(f, "invalid setting: {e}"),
            Error::Held(fail) => match fail.held_by_this_client() {
                Some(true) => write!(
                    f,
                    "lock held by this client (a lock it took and has not released): {fail}"
                ),
                Some(false) => write!(f, "lock held by another client: {fail}"),
                // A plain refusal names no holder: "another client" would
                // be wrong for a caller whose own lock refused it.
                None => write!(f, "lock already held (by this client or another): {fail}"),
            },
            Error::NotHeld(fail) => write!(f, "lock no longer held: {fail}"),
            Error::NoQuorum(fail) => match fail.quarantine_left() {
                // They answer: "unreachable" would send the user looking
                // for a network fault.
                Some(left) => write!(
                    f,
                    "quorum missed: {} of {} masters in restart quarantine for up to {} s more \
                     (a master up for less than the max TTL may have lost locks in a restart; \
                     for masters started empty, or that persist every write, \
                     Config::quarantine = None turns it off): {fail}",
                    fail.quarantined(),
                    fail.votes.len(),
                    seconds_up(left)
                ),
                None => write!(f, "quorum of masters unreachable: {fail}"),
            },
            Error::Denied(fail) => write!(f, "masters refuse this client: {fail}"),
            Error::Protocol(fail) => write!(f, "a master broke the protocol: {fail}"),
            Error::ValidityExpired(fail) => write!(f, "validity used up by a slow round: {fail}"),
            Error::FenceUnknown { failure, untrusted } => {
                write!(
                    f,
                    "fence unknown: {} of the granting masters can vouch for their fence value, {} needed; without the fencing marker (lost their data, not yet repaired for this resource): ",
                    failure.granted.saturating_sub(untrusted.len()),
                    failure.quorum
                )?;
                for (i, name) in untrusted.iter().enumerate() {
                    write!(f, "{}{name}", if i == 0 { "" } else { ", " })?;
                }
                write!(f, "; {failure}")
            }
            Error::FenceRefused(fail) => write!(
                f,
                "fence write-back refused: the lock key was gone between the two phases: {fail}"
            ),
            Error::ExtensionLimit(max) => write!(f, "lock already extended {max} times"),
            Error::Os(kind) => write!(f, "operating system error: {kind}"),
            Error::Internal(what) => write!(f, "internal error in redlock-mio (a bug): {what}"),
            Error::Stopped(why) => write!(f, "the client's event loop has stopped: {why}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(votes: Vec<Vote>) -> Failure {
        Failure {
            quorum: votes.len() / 2 + 1,
            granted: votes.iter().filter(|v| **v == Vote::Granted).count(),
            refused: votes
                .iter()
                .filter(|v| matches!(v, Vote::Refused | Vote::Gone))
                .count(),
            votes: votes
                .into_iter()
                .enumerate()
                .map(|(i, vote)| MasterVote {
                    server: format!("redis://m{i}").into(),
                    vote,
                })
                .collect(),
            elapsed: Duration::from_millis(1),
            attempts: 1,
            held_by_this_client: None,
        }
    }

    /// What a user reads first says why the quorum was missed.
    #[test]
    fn the_top_line_names_what_the_votes_say() {
        let quarantined = |ms| Vote::Failed(Cause::Quarantined(Duration::from_millis(ms)));
        let cases = [
            (
                "masters in restart quarantine answer: not unreachable",
                Error::NoQuorum(failure(vec![
                    quarantined(59_001),
                    quarantined(60_000),
                    Vote::Failed(Cause::Timeout),
                ])),
                "quorum missed: 2 of 3 masters in restart quarantine for up to 60 s more (",
            ),
            (
                "a part of a second left reads as a second",
                Error::NoQuorum(failure(vec![
                    quarantined(200),
                    Vote::Failed(Cause::Closed),
                    Vote::Failed(Cause::Closed),
                ])),
                "quorum missed: 1 of 3 masters in restart quarantine for up to 1 s more (",
            ),
            (
                "down masters are unreachable",
                Error::NoQuorum(failure(vec![
                    Vote::Granted,
                    Vote::Failed(Cause::Closed),
                    Vote::Failed(Cause::Timeout),
                ])),
                "quorum of masters unreachable: 1 of 3 masters granted",
            ),
        ];
        for (name, error, starts) in cases {
            let text = error.to_string();
            assert!(text.starts_with(starts), "{name}: {text}");
        }
    }

    /// A held lock is said to be this client's or another's
    /// only when the masters told whose it is.
    #[test]
    fn a_held_lock_names_its_holder_only_when_the_masters_told() {
        let cases = [
            (
                Some(true),
                "lock held by this client (a lock it took and has not released): 0 of 3",
            ),
            (Some(false), "lock held by another client: 0 of 3"),
            (
                None,
                "lock already held (by this client or another): 0 of 3",
            ),
        ];
        for (held_by_this_client, starts) in cases {
            let mut fail = failure(vec![Vote::Refused, Vote::Refused, Vote::Refused]);
            fail.held_by_this_client = held_by_this_client;
            assert_eq!(fail.held_by_this_client(), held_by_this_client);
            let text = Error::Held(fail).to_string();
            assert!(text.starts_with(starts), "{held_by_this_client:?}: {text}");
        }
    }

    /// Each master that did not grant or refuse is listed, in order: a
    /// failed one with its cause, one that had not answered when the round
    /// was decided as such.
    #[test]
    fn the_masters_that_did_not_vote_are_listed() {
        let fail = failure(vec![
            Vote::Refused,
            Vote::Pending,
            Vote::Failed(Cause::Closed),
            Vote::Refused,
            Vote::Granted,
        ]);
        let text = Error::Held(fail).to_string();
        assert!(
            text.ends_with(
                "; redis://m1: no answer yet; redis://m2: connection closed by the master"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_quarantined_master_says_how_long_it_has_left() {
        let text = Cause::Quarantined(Duration::from_millis(59_998)).to_string();
        assert!(
            text.starts_with("in restart quarantine for 60 s more"),
            "{text}"
        );
    }
}
