//! `redlock run`: a command under a lock.
//!
//! This module owns the child's life under the lock: it acquires, starts
//! the command with `REDLOCK_RESOURCE` and `REDLOCK_TOKEN`, keeps the lock
//! alive by extending it every third of the TTL, forwards SIGINT, SIGTERM
//! and SIGHUP, and releases when the command has exited. Its loop is
//! single-threaded: signals and the child's exit arrive through
//! [`Signals`], extensions are due at instants it computes.
//!
//! The lock is lost when no extension succeeds before the validity runs
//! out, or at once when a quorum reports that the token no longer holds
//! the key. Mutual exclusion is then over, so the command is stopped:
//! SIGTERM, and SIGKILL after `--kill-after`. It must never keep running
//! unprotected while `redlock` reports success.

use std::ffi::OsString;
use std::io;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use clap::Args;
use redlock_mio::{Error, Lock, Redlock};

use crate::exit::{self, Failure};
use crate::signals::Signals;
use crate::{AcquireOptions, acquire_lock, parse_duration, say};

/// Signals forwarded to the command.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Longest sleep of the loop: a safety net should a wake-up be missed.
const MAX_NAP: Duration = Duration::from_millis(500);

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub acquire: AcquireOptions,

    /// After the lock is lost, wait D between SIGTERM and SIGKILL
    #[arg(long, value_name = "D", default_value = "5s", value_parser = parse_duration)]
    kill_after: Duration,

    /// The lock's name (the Redis key)
    resource: String,

    /// The command and its arguments (after `--`)
    #[arg(
        value_name = "CMD",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

/// When extensions are due, and what is left of the lock.
#[derive(Debug)]
struct KeepAlive {
    ttl: Duration,
    /// When the next extension is due.
    next: Instant,
    /// Whether an extension has failed since the last success (to report
    /// the first failure once, not every retry).
    failing: bool,
}

impl KeepAlive {
    fn new(ttl: Duration, now: Instant) -> KeepAlive {
        KeepAlive {
            ttl,
            next: now + Self::interval(ttl),
            failing: false,
        }
    }

    /// Extend every third of the TTL: two more tries fit in the validity
    /// before it runs out.
    fn interval(ttl: Duration) -> Duration {
        (ttl / 3).max(Duration::from_millis(1))
    }

    /// How soon to retry a failed extension: often enough for several
    /// tries in what is left, not so often that stalled masters are
    /// hammered.
    fn retry_gap(ttl: Duration) -> Duration {
        (ttl / 30).clamp(Duration::from_millis(10), Duration::from_millis(500))
    }
}

/// Why the lock was lost.
#[derive(Debug)]
enum Lost {
    /// The validity ran out; the last extension's error, if any.
    Expired(Option<Error>),
    /// A quorum said the token no longer holds the key.
    NotHeld(Error),
}

impl Lost {
    fn describe(&self) -> String {
        match self {
            Lost::Expired(Some(e)) => format!("its validity ran out while extending failed: {e}"),
            Lost::Expired(None) => "its validity ran out before it could be extended".to_owned(),
            Lost::NotHeld(e) => e.to_string(),
        }
    }
}

/// Runs `redlock run`; the exit code is the command's.
///
/// # Errors
/// A failure to acquire, to install the signal handlers, or to start the
/// command (126/127), with its exit code.
pub fn run(mut redlock: Redlock, args: &RunArgs) -> Result<u8, Failure> {
    let lock = acquire_lock(&mut redlock, &args.resource, &args.acquire)?;
    let signals =
        match Signals::install(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGCHLD]) {
            Ok(signals) => signals,
            Err(e) => {
                let _ = redlock.release(&lock);
                return Err(Failure::new(
                    exit::OSERR,
                    format!("cannot install signal handlers: {e}"),
                ));
            }
        };
    let child = match spawn(args, &lock) {
        Ok(child) => child,
        Err(e) => {
            let _ = redlock.release(&lock);
            let code = match e.kind() {
                io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            let name = args.command[0].to_string_lossy();
            return Err(Failure::new(code, format!("cannot run {name:?}: {e}")));
        }
    };
    Supervisor {
        redlock,
        lock,
        child,
        signals,
        args,
    }
    .watch()
}

fn spawn(args: &RunArgs, lock: &Lock) -> io::Result<Child> {
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("REDLOCK_RESOURCE", &args.resource)
        .env("REDLOCK_TOKEN", lock.token().as_str());
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // If redlock dies, nobody extends the lock any more: the command
        // must not go on believing it holds it.
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    command.spawn()
}

/// The loop that watches the command while the lock is held.
struct Supervisor<'a> {
    redlock: Redlock,
    lock: Lock,
    child: Child,
    signals: Signals,
    args: &'a RunArgs,
}

impl Supervisor<'_> {
    fn watch(mut self) -> Result<u8, Failure> {
        let ttl = self.args.acquire.ttl;
        let mut keep = KeepAlive::new(ttl, Instant::now());
        let mut last_error = None;
        // Set once the lock is lost: when SIGKILL is due, if not yet sent.
        let mut lost: Option<Option<Instant>> = None;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) => {}
                Err(e) => {
                    // Cannot happen for our own child; stop it rather than
                    // leave it running without knowing its fate.
                    say(&format!("cannot wait for the command: {e}"));
                    self.signal(libc::SIGKILL);
                    break self.child.wait().map_err(|e| {
                        Failure::new(exit::OSERR, format!("cannot wait for the command: {e}"))
                    })?;
                }
            }
            self.forward();
            let now = Instant::now();
            if lost.is_none() {
                let verdict = if self.lock.remaining_at(now).is_zero() {
                    Some(Lost::Expired(last_error.take()))
                } else if now >= keep.next {
                    self.extend(&mut keep, &mut last_error)
                } else {
                    None
                };
                if let Some(why) = verdict {
                    say(&format!(
                        "lost the lock on {:?}: {}; stopping the command",
                        self.args.resource,
                        why.describe()
                    ));
                    self.signal(libc::SIGTERM);
                    lost = Some(Some(Instant::now() + self.args.kill_after));
                }
            }
            if let Some(Some(kill_at)) = lost
                && Instant::now() >= kill_at
            {
                say("the command outlived --kill-after; sending SIGKILL");
                self.signal(libc::SIGKILL);
                lost = Some(None);
            }
            let due = match lost {
                None => keep.next.min(self.lock.deadline()),
                Some(Some(kill_at)) => kill_at,
                Some(None) => Instant::now() + MAX_NAP,
            };
            let nap = due.saturating_duration_since(Instant::now()).min(MAX_NAP);
            self.signals.wait(nap);
        };
        // Release also after a loss: keys still standing on some masters
        // hold our token, and compare-and-delete removes only those.
        let released = self.redlock.release(&self.lock);
        if lost.is_some() {
            return Ok(exit::LOST);
        }
        if let Err(e) = released {
            say(&format!(
                "cannot release {:?}: {e}; its keys expire within {}",
                self.args.resource,
                humantime::format_duration(ttl)
            ));
        }
        Ok(status_code(status))
    }

    /// One extension attempt; `Some` when the lock is lost for good.
    fn extend(&mut self, keep: &mut KeepAlive, last_error: &mut Option<Error>) -> Option<Lost> {
        match self.redlock.extend(&mut self.lock, keep.ttl) {
            Ok(()) => {
                if keep.failing {
                    say(&format!(
                        "extended the lock on {:?} again",
                        self.args.resource
                    ));
                }
                keep.failing = false;
                *last_error = None;
                keep.next = Instant::now() + KeepAlive::interval(keep.ttl);
                None
            }
            Err(e @ Error::NotHeld(_)) => Some(Lost::NotHeld(e)),
            Err(e) => {
                if !keep.failing {
                    say(&format!(
                        "cannot extend the lock on {:?}, retrying until its validity ends: {e}",
                        self.args.resource
                    ));
                }
                keep.failing = true;
                *last_error = Some(e);
                keep.next = Instant::now() + KeepAlive::retry_gap(keep.ttl);
                None
            }
        }
    }

    /// Forwards the signals that redlock received to the command, except
    /// those a terminal sent to the whole process group (the command got
    /// them already).
    fn forward(&mut self) {
        let pending = self.signals.take();
        for signal in FORWARDED {
            if pending.contains(signal) && !pending.only_from_terminal(signal) {
                self.signal(signal);
            }
        }
    }

    fn signal(&mut self, signal: libc::c_int) {
        // The child is not reaped until try_wait reports it, so its pid
        // cannot have been reused.
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) with our own child's pid.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

/// The exit code a shell would give: the status, or 128 + the signal.
fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::SOFTWARE),
        (None, Some(signal)) => u8::try_from((128 + signal) & 0xff).unwrap_or(exit::SOFTWARE),
        (None, None) => exit::SOFTWARE,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    #[test]
    fn exit_statuses_map_as_a_shell_maps_them() {
        // Raw wait statuses: exit code in the second byte, signal in the first.
        let cases = [
            (0, 0),
            (7 << 8, 7),
            (255 << 8, 255),
            (libc::SIGTERM, 143),
            (libc::SIGKILL, 137),
        ];
        for (raw, want) in cases {
            assert_eq!(status_code(ExitStatus::from_raw(raw)), want, "raw {raw}");
        }
    }

    #[test]
    fn extensions_are_due_every_third_of_the_ttl_and_retried_sooner() {
        let ms = Duration::from_millis;
        let cases = [
            (Duration::from_secs(30), Duration::from_secs(10), ms(500)),
            (
                Duration::from_secs(2),
                Duration::from_nanos(666_666_666),
                Duration::from_nanos(66_666_666),
            ),
            (ms(3), ms(1), ms(10)),
            (ms(1), ms(1), ms(10)),
        ];
        for (ttl, interval, gap) in cases {
            assert_eq!(KeepAlive::interval(ttl), interval, "{ttl:?}");
            assert_eq!(KeepAlive::retry_gap(ttl), gap, "{ttl:?}");
        }
    }
}
