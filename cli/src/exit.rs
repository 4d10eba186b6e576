//! Exit codes, and the mapping from the library's errors to them.
//!
//! The codes follow `flock(1)` (1 for a conflict, changeable with `-E`)
//! and sysexits.h (69 unavailable, 71 OS error, 75 temporary failure,
//! 77 permission denied);
//! `run` passes its command's status through as a shell would (128+N for
//! a signal, 126 and 127 when it cannot be executed). The table below is
//! shown by `--help` and repeated in the README: change both together.

use redlock_mio::{ConfigError, Error};

/// Success.
pub const OK: u8 = 0;
/// The lock could not be had in time (default of `-E`), or is not held.
pub const CONFLICT: u8 = 1;
/// Bad arguments, no masters, a malformed URL or token (clap uses 2 too).
pub const USAGE: u8 = 2;
/// A quorum of masters is unreachable or broke the protocol (EX_UNAVAILABLE).
pub const UNAVAILABLE: u8 = 69;
/// The library failed in a way this binary does not know (EX_SOFTWARE).
pub const SOFTWARE: u8 = 70;
/// The OS refused something: a poll instance, random bytes, a pipe,
/// writing the output (EX_OSERR).
pub const OSERR: u8 = 71;
/// `run`: the lock was lost while the command ran, or the command ended
/// after the lock's deadline (EX_TEMPFAIL).
pub const LOST: u8 = 75;
/// Too many masters refuse this client for good: a wrong password, a user
/// denied a command the client needs (EX_NOPERM). Never retried.
pub const NOPERM: u8 = 77;
/// `run`: the command exists but cannot be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// `run`: the command was not found.
pub const NOT_FOUND: u8 = 127;

/// The exit-code table of `--help`.
pub const TABLE: &str = "\
Exit status:
  0        success; for run: the command exited 0
  N        run: the command's own exit status (128+S if killed by signal S)
  1        the lock could not be had in time (change with -E CODE), or
           release/extend: the token does not hold the lock (it expired)
  2        usage error: bad arguments, no masters, malformed URL or token
  69       a quorum of masters is unreachable (or broke the protocol);
           probe: fewer than a quorum healthy and out of restart quarantine
  70       an unexpected library error
  71       the OS refused a resource (poll, random bytes, pipe, output)
  75       run: the lock was lost while the command ran (it was terminated),
           or the command ended after the lock's deadline
  77       the masters refuse this client: wrong password, or a user denied
           a command the client needs (the message says what to grant)
  126/127  run: the command cannot be executed / was not found";

/// A failure: one line for stderr, and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// The message, without the `redlock: ` prefix.
    pub message: String,
}

impl Failure {
    /// A failure with this code and message.
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// A usage error: exit code 2.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(USAGE, message)
    }
}

/// True for errors that mean "someone else has it": waiting may help.
pub fn is_conflict(error: &Error) -> bool {
    matches!(error, Error::Held(_) | Error::ValidityExpired(_))
}

/// True for errors that mean "too few masters answered".
pub fn is_unreachable(error: &Error) -> bool {
    matches!(
        error,
        Error::NoQuorum(_) | Error::Protocol(_) | Error::FenceUnknown { .. }
    )
}

/// The exit code for a library error; `conflict` is the code for a lock
/// held elsewhere or not held any more.
pub fn code_for(error: &Error, conflict: u8) -> u8 {
    match error {
        Error::Held(_) | Error::ValidityExpired(_) | Error::NotHeld(_) => conflict,
        // The key was lost between the fenced acquire's two phases.
        Error::ExtensionLimit(_) | Error::FenceRefused(_) => conflict,
        // Too few masters that can vouch for their fence readings.
        Error::NoQuorum(_) | Error::Protocol(_) | Error::FenceUnknown { .. } => UNAVAILABLE,
        Error::Config(_) => USAGE,
        Error::Os(_) => OSERR,
        Error::Denied(_) => NOPERM,
        _ => SOFTWARE,
    }
}

/// A failure from a library error, its Display prefixed with `context`;
/// where the library names a setting, the message names the flag instead.
pub fn lock_error(context: &str, error: &Error, conflict: u8) -> Failure {
    let message = match error {
        Error::Config(ConfigError::TtlOverQuarantine(max)) => format!(
            "{context}: the TTL exceeds restart quarantine's maximum TTL of {}: raise it with \
             --max-ttl (on every client of these masters; a master up for less than that \
             stays out of the quorum), or turn quarantine off with --no-quarantine for \
             masters that persist every write (appendfsync always)",
            humantime::format_duration(*max)
        ),
        // The library names its setting; a user of the command needs the
        // flags.
        Error::NoQuorum(failure) if failure.quarantined() > 0 => {
            let left = failure.quarantine_left().unwrap_or_default();
            format!(
                "{context}: quorum missed: {} of {} masters in restart quarantine for up to {} \
                 s more (a master up for less than the max TTL, --max-ttl, may have lost locks \
                 in a restart; for masters started empty, or that persist every write \
                 (appendfsync always), --no-quarantine turns it off): {failure}",
                failure.quarantined(),
                failure.votes.len(),
                left.as_secs() + u64::from(left.subsec_nanos() > 0)
            )
        }
        // The library cannot tell whose lock a plain refusal is; the
        // command can: each takes at most one lock, on a client of its own,
        // so a lock it finds held is another process's.
        Error::Held(failure) if failure.held_by_this_client().is_none() => {
            format!("{context}: lock held by another client: {failure}")
        }
        _ => format!("{context}: {error}"),
    };
    Failure::new(code_for(error, conflict), message)
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::Duration;

    use redlock_mio::Failure as Votes;

    use super::*;

    /// The votes of a failed acquire, as the library reports them (it
    /// alone makes them): one master, a socket path that does not exist,
    /// so that nothing is reached and nothing waits.
    fn votes() -> Votes {
        let mut client = redlock_mio::Redlock::connect(["unix:///nonexistent/redlock-cli.sock"])
            .unwrap_or_else(|e| panic!("{e}"));
        match client.try_acquire("r", Duration::from_secs(1)) {
            Err(error) => error.failure().cloned().expect("an acquire's votes"),
            Ok(lock) => panic!("no master, yet a lock: {lock:?}"),
        }
    }

    #[test]
    fn each_library_error_has_its_exit_code() {
        let cases = [
            (Error::Held(votes()), 9),
            (Error::ValidityExpired(votes()), 9),
            (Error::NotHeld(votes()), 9),
            (Error::NoQuorum(votes()), UNAVAILABLE),
            (Error::Protocol(votes()), UNAVAILABLE),
            (Error::Denied(votes()), NOPERM),
            (Error::Config(ConfigError::ZeroTtl), USAGE),
            (Error::Os(io::ErrorKind::Other), OSERR),
        ];
        for (error, want) in cases {
            assert_eq!(code_for(&error, 9), want, "{error}");
        }
    }

    #[test]
    fn a_failure_message_is_one_line_with_its_context() {
        let failure = lock_error("cannot acquire \"r\"", &Error::NoQuorum(votes()), 1);
        assert_eq!(failure.code, UNAVAILABLE);
        assert!(
            failure
                .message
                .starts_with("cannot acquire \"r\": quorum of masters unreachable")
        );
        assert!(!failure.message.contains('\n'));
    }

    /// A command's client holds no other lock: one it finds held, by
    /// whomever the masters did not say, is another client's.
    #[test]
    fn a_held_lock_is_another_clients() {
        let failure = lock_error("cannot acquire \"r\"", &Error::Held(votes()), 1);
        assert_eq!(failure.code, 1);
        assert!(
            failure
                .message
                .starts_with("cannot acquire \"r\": lock held by another client: "),
            "{}",
            failure.message
        );
    }

    #[test]
    fn masters_in_restart_quarantine_name_the_flag_that_turns_it_off() {
        use redlock_mio::{Cause, Vote};
        let mut failure = votes();
        let vote = |server: &str, vote| {
            let mut master = failure.votes[0].clone();
            master.server = server.into();
            master.vote = vote;
            master
        };
        let mut masters = Vec::new();
        for left in [Duration::from_millis(59_500), Duration::from_secs(3)] {
            masters.push(vote("redis://m", Vote::Failed(Cause::Quarantined(left))));
        }
        masters.push(vote("redis://n", Vote::Failed(Cause::Timeout)));
        failure.votes = masters;
        let failure = lock_error("cannot acquire \"r\"", &Error::NoQuorum(failure), 1);
        assert_eq!(failure.code, UNAVAILABLE);
        let message = failure.message;
        assert!(
            message.starts_with(
                "cannot acquire \"r\": quorum missed: 2 of 3 masters in restart quarantine \
                 for up to 60 s more ("
            ),
            "{message}"
        );
        assert!(
            message.contains("--no-quarantine turns it off"),
            "{message}"
        );
        assert!(!message.contains("Config::"), "{message}");
        assert!(
            message.ends_with("; redis://n: no reply within the per-instance timeout"),
            "{message}"
        );
    }

    #[test]
    fn a_ttl_over_the_quarantine_names_the_flags_that_change_it() {
        let over = Error::Config(ConfigError::TtlOverQuarantine(Duration::from_secs(60)));
        let failure = lock_error("cannot acquire \"r\"", &over, 1);
        assert_eq!(failure.code, USAGE);
        assert!(
            failure.message.starts_with(
                "cannot acquire \"r\": the TTL exceeds restart quarantine's maximum TTL of 1m:"
            ),
            "{}",
            failure.message
        );
        assert!(failure.message.contains("--max-ttl"), "{}", failure.message);
        assert!(
            failure.message.contains("--no-quarantine"),
            "{}",
            failure.message
        );
        assert!(!failure.message.contains("Config::"), "{}", failure.message);
    }
}
