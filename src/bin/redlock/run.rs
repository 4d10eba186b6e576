//! `redlock run`: a command under a lock.
//!
//! This module owns the child's life under the lock: it acquires, hands
//! the lock to a [`Watchdog`] (which extends it every third of the TTL on
//! a thread and connections of its own), starts the command with
//! `REDLOCK_RESOURCE` and `REDLOCK_TOKEN`, forwards SIGINT, SIGTERM and
//! SIGHUP, and releases when the command has exited. Its loop is
//! single-threaded: signals, the child's exit and the watchdog's loss
//! report all arrive through [`Signals`].
//!
//! The lock is lost when the watchdog gives it up: at once when a quorum
//! reports that the token no longer holds the key, or when extending keeps
//! failing until less than a third of the TTL of validity is left (see
//! [`Watchdog`]), so that the command is told while mutual exclusion still
//! holds. It is then stopped: SIGTERM, and SIGKILL after `--kill-after`.
//! It must never keep running unprotected while `redlock` reports success.

use std::ffi::OsString;
use std::io;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use clap::Args;
use redlock_mio::{KeepOptions, Lock, Redlock, Watchdog};

use crate::exit::{self, Failure};
use crate::signals::Signals;
use crate::{AcquireOptions, acquire_lock, parse_duration, say};

/// Signals forwarded to the command.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Longest sleep of the loop: a safety net should a wake-up be missed, and
/// how soon failing extensions are reported on stderr.
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

/// Runs `redlock run`; the exit code is the command's.
///
/// # Errors
/// A failure to acquire, to install the signal handlers, to start the
/// watchdog, or to start the command (126/127), with its exit code.
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
    let options = KeepOptions {
        ttl: Some(args.acquire.ttl),
        ..KeepOptions::default()
    }
    .on_lost(|_| {
        // Wake the loop out of `Signals::wait`: SIGCHLD already means "look
        // at everything" to it, and its handler writes to the self-pipe.
        // SAFETY: raise(3) with a signal whose handler is installed.
        unsafe { libc::raise(libc::SIGCHLD) };
    });
    let kept = match Watchdog::keep(redlock.config().clone(), lock.clone(), options) {
        Ok(kept) => kept,
        Err(e) => {
            let _ = redlock.release(&lock);
            return Err(exit::lock_error(
                "cannot keep the lock alive",
                &e,
                exit::SOFTWARE,
            ));
        }
    };
    // The watchdog has its own client, and releases through it.
    drop(redlock);
    let child = match spawn(args, &lock) {
        Ok(child) => child,
        Err(e) => {
            let _ = kept.release();
            let code = match e.kind() {
                io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            let name = args.command[0].to_string_lossy();
            return Err(Failure::new(code, format!("cannot run {name:?}: {e}")));
        }
    };
    Supervisor {
        kept,
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
    kept: Watchdog,
    child: Child,
    signals: Signals,
    args: &'a RunArgs,
}

impl Supervisor<'_> {
    fn watch(mut self) -> Result<u8, Failure> {
        let ttl = self.args.acquire.ttl;
        // Whether extending was failing at the last look (to report the
        // first failure once, not every retry).
        let mut failing = false;
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
            if lost.is_none() {
                if let Some(why) = self.kept.lost() {
                    say(&format!(
                        "lost the lock on {:?}: {why}; stopping the command",
                        self.args.resource
                    ));
                    self.signal(libc::SIGTERM);
                    lost = Some(Some(Instant::now() + self.args.kill_after));
                } else {
                    failing = self.report_failing(failing);
                }
            }
            if let Some(Some(kill_at)) = lost
                && Instant::now() >= kill_at
            {
                say("the command outlived --kill-after; sending SIGKILL");
                self.signal(libc::SIGKILL);
                lost = Some(None);
            }
            let nap = match lost {
                Some(Some(kill_at)) => kill_at.saturating_duration_since(Instant::now()),
                _ => MAX_NAP,
            };
            self.signals.wait(nap.min(MAX_NAP));
        };
        // Release also after a loss: keys still standing on some masters
        // hold our token, and compare-and-delete removes only those.
        let released = self.kept.release();
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

    /// Says when extending starts failing and when it works again;
    /// returns whether it is failing now.
    fn report_failing(&self, was_failing: bool) -> bool {
        match self.kept.last_error() {
            Some(e) if !was_failing => {
                say(&format!(
                    "cannot extend the lock on {:?}, retrying while validity is left: {e}",
                    self.args.resource
                ));
                true
            }
            None if was_failing => {
                say(&format!(
                    "extended the lock on {:?} again",
                    self.args.resource
                ));
                false
            }
            now => now.is_some(),
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
}
