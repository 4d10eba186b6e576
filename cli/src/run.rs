//! `redlock run`: a command under a lock.
//!
//! This module owns the child's life under the lock: it acquires (waiting
//! for a held lock through a [`SharedRedlock`], see [`mod@crate::acquire`]),
//! hands the lock to a [`Watchdog`] on that shared client's event loop
//! (which extends it every third of the TTL on a thread and connections
//! of its own, apart from the command), starts the command with
//! `REDLOCK_RESOURCE`, `REDLOCK_TOKEN` and, with `--fence`,
//! `REDLOCK_FENCE`, forwards SIGINT, SIGTERM and SIGHUP, and releases when
//! the command has exited. Its loop is single-threaded: signals, the
//! child's exit and the watchdog's loss report all arrive through
//! [`Signals`].
//!
//! The command must never outlive the lock while `redlock` reports
//! success. The lock is lost when the watchdog gives it up: at once when a
//! quorum reports that the token no longer holds the key, or when
//! extending keeps failing until about a third of the TTL of validity is
//! left (see [`Watchdog`]), so that the command is told while mutual
//! exclusion still holds. It then gets SIGTERM, and SIGKILL after
//! `--kill-after` or just before the lock's deadline, whichever comes
//! first. The loop watches that deadline on its own clock as well, so
//! that a loss reported late (or not at all: a keeper thread that did not
//! run in time) still ends in SIGKILL by the deadline. A command that
//! exits after the deadline, or after a loss, makes `redlock` exit 75
//! whatever its status: part of its work was not protected.

use std::ffi::OsString;
use std::io;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use clap::Args;
use redlock_mio::{KeepOptions, Lock, Redlock, SharedRedlock, Watchdog};

use crate::acquire::{Holder, acquire_lock};
use crate::exit::{self, Failure};
use crate::signals::Signals;
use crate::{AcquireOptions, parse_duration, say};

/// Signals forwarded to the command.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Longest sleep of the loop: a safety net should a wake-up be missed, and
/// how soon failing extensions are reported on stderr.
const MAX_NAP: Duration = Duration::from_millis(500);

/// How long before the lock's deadline SIGKILL is sent: the loop's wake-up
/// may come a little late (poll(2) counts whole milliseconds, and the
/// scheduler adds its own delay), and the kill must not.
const KILL_MARGIN: Duration = Duration::from_millis(10);

/// The environment variables the command finds.
const ENV_RESOURCE: &str = "REDLOCK_RESOURCE";
const ENV_TOKEN: &str = "REDLOCK_TOKEN";
const ENV_FENCE: &str = "REDLOCK_FENCE";

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub acquire: AcquireOptions,

    /// After the lock is lost, wait at most D between SIGTERM and SIGKILL;
    /// SIGKILL comes by the lock's deadline in any case
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
pub fn run(redlock: Redlock, args: &RunArgs) -> Result<u8, Failure> {
    let (lock, mut holder) = acquire_lock(redlock, &args.resource, &args.acquire)?;
    let signals =
        match Signals::install(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGCHLD]) {
            Ok(signals) => signals,
            Err(e) => {
                let _ = holder.release(&lock);
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
    // The lock is kept alive by the event loop of a shared client: the one
    // that waited for it, or, when the first attempt won, a new one with
    // the same settings (the one-shot client has no loop to keep it on,
    // and goes here).
    let shared = match holder {
        Holder::Shared(shared) => shared,
        Holder::Single(mut redlock) => match SharedRedlock::new(redlock.config().clone()) {
            Ok(shared) => shared,
            Err(e) => {
                let _ = redlock.release(&lock);
                return Err(exit::lock_error(
                    "cannot keep the lock alive",
                    &e,
                    exit::SOFTWARE,
                ));
            }
        },
    };
    let kept = match shared.keep(lock.clone(), options) {
        Ok(kept) => kept,
        Err(e) => {
            let _ = shared.release(&lock);
            return Err(exit::lock_error(
                "cannot keep the lock alive",
                &e,
                exit::SOFTWARE,
            ));
        }
    };
    // The watchdog holds a handle to the client, and releases through it.
    drop(shared);
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
        stopper: Stopper::new(args.kill_after),
    }
    .watch()
}

fn spawn(args: &RunArgs, lock: &Lock) -> io::Result<Child> {
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env(ENV_RESOURCE, &args.resource)
        .env(ENV_TOKEN, lock.token().as_str());
    match lock.fence() {
        Some(fence) => command.env(ENV_FENCE, fence.to_string()),
        // One inherited from an outer `redlock run` belongs to another lock.
        None => command.env_remove(ENV_FENCE),
    };
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

/// Where the command stands, as far as stopping it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Running under a lock that is held.
    Running,
    /// Sent SIGTERM after a loss; SIGKILL is due at the end of
    /// `--kill-after` (`None`: later than any `Instant`) or just before
    /// the deadline, whichever comes first.
    Terminated { grace_end: Option<Instant> },
    /// Sent SIGKILL.
    Killed,
}

/// What to do to the command now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Nothing.
    Wait,
    /// The lock was lost: SIGTERM.
    Terminate,
    /// SIGKILL, for this reason.
    Kill(KillCause),
}

/// Why the command gets SIGKILL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillCause {
    /// It outlived `--kill-after` after SIGTERM.
    KillAfter,
    /// The lock's deadline is at hand.
    Deadline,
}

/// When to signal the command, as plain data: fed the time, the lock's
/// deadline and whether the watchdog gave the lock up, it says what to do.
/// SIGTERM at a loss; SIGKILL at the end of `--kill-after`, or
/// [`KILL_MARGIN`] before the deadline, whichever comes first, lost or
/// not: the deadline is the bound, the watchdog's report only the warning.
#[derive(Debug, Clone, Copy)]
struct Stopper {
    kill_after: Duration,
    stage: Stage,
}

impl Stopper {
    fn new(kill_after: Duration) -> Stopper {
        Stopper {
            kill_after,
            stage: Stage::Running,
        }
    }

    /// The latest moment to send SIGKILL for a lock valid until `deadline`.
    fn kill_by(deadline: Instant) -> Instant {
        deadline.checked_sub(KILL_MARGIN).unwrap_or(deadline)
    }

    /// True until the command has been sent a signal of ours.
    fn is_running(&self) -> bool {
        self.stage == Stage::Running
    }

    /// What to do at `now`, for a lock valid until `deadline` and given up
    /// by the watchdog when `lost`.
    #[must_use]
    fn poll(&mut self, now: Instant, deadline: Instant, lost: bool) -> Step {
        let out_of_time = now >= Stopper::kill_by(deadline);
        let step = match self.stage {
            Stage::Killed => Step::Wait,
            _ if out_of_time => Step::Kill(KillCause::Deadline),
            Stage::Running if lost => Step::Terminate,
            Stage::Running => Step::Wait,
            Stage::Terminated { grace_end } => match grace_end {
                Some(end) if now >= end => Step::Kill(KillCause::KillAfter),
                _ => Step::Wait,
            },
        };
        match step {
            Step::Wait => {}
            Step::Terminate => {
                self.stage = Stage::Terminated {
                    grace_end: now.checked_add(self.kill_after),
                }
            }
            Step::Kill(_) => self.stage = Stage::Killed,
        }
        step
    }

    /// When the next step falls due if nothing else happens; `None` when
    /// only an event (a loss, the command's exit) can bring one.
    fn next_due(&self, deadline: Instant) -> Option<Instant> {
        let kill_by = Stopper::kill_by(deadline);
        match self.stage {
            Stage::Running => Some(kill_by),
            Stage::Terminated { grace_end } => {
                Some(grace_end.map_or(kill_by, |end| end.min(kill_by)))
            }
            Stage::Killed => None,
        }
    }
}

/// The loop that watches the command while the lock is held.
struct Supervisor<'a> {
    kept: Watchdog,
    child: Child,
    signals: Signals,
    args: &'a RunArgs,
    stopper: Stopper,
}

impl Supervisor<'_> {
    fn watch(mut self) -> Result<u8, Failure> {
        let ttl = self.args.acquire.ttl;
        // Whether extending was failing at the last look (to report the
        // first failure once, not every retry).
        let mut failing = false;
        let (status, exited_by) = loop {
            match self.child.try_wait() {
                // The command exited before this moment.
                Ok(Some(status)) => break (status, Instant::now()),
                Ok(None) => {}
                Err(e) => {
                    // Cannot happen for our own child; stop it rather than
                    // leave it running without knowing its fate.
                    say(&format!("cannot wait for the command: {e}"));
                    self.signal(libc::SIGKILL);
                    self.stopper.stage = Stage::Killed;
                    let status = self.child.wait().map_err(|e| {
                        Failure::new(exit::OSERR, format!("cannot wait for the command: {e}"))
                    })?;
                    break (status, Instant::now());
                }
            }
            self.forward();
            let lost = self.kept.lost();
            let deadline = self.kept.deadline();
            let now = Instant::now();
            if lost.is_none() {
                failing = self.report_failing(failing);
            }
            let was_running = self.stopper.is_running();
            let step = self.stopper.poll(now, deadline, lost.is_some());
            if let (true, Some(why), Step::Terminate | Step::Kill(_)) = (was_running, &lost, step) {
                say(&format!(
                    "lost the lock on {:?}: {why}; stopping the command",
                    self.args.resource
                ));
            }
            let left = deadline.saturating_duration_since(now).as_millis();
            match step {
                Step::Wait => {}
                Step::Terminate => self.signal(libc::SIGTERM),
                Step::Kill(KillCause::KillAfter) => {
                    say("the command outlived --kill-after; sending SIGKILL");
                    self.signal(libc::SIGKILL);
                }
                Step::Kill(KillCause::Deadline) if lost.is_none() => {
                    say(&format!(
                        "the lock on {:?} reaches its deadline without an extension \
                         ({left} ms of validity left); sending SIGKILL",
                        self.args.resource
                    ));
                    self.signal(libc::SIGKILL);
                }
                Step::Kill(KillCause::Deadline) => {
                    say(&format!(
                        "the command is still running at the lock's deadline \
                         ({left} ms of validity left); sending SIGKILL"
                    ));
                    self.signal(libc::SIGKILL);
                }
            }
            let nap = self
                .stopper
                .next_due(deadline)
                .map_or(MAX_NAP, |due| due.saturating_duration_since(Instant::now()));
            self.signals.wait(nap.min(MAX_NAP));
        };
        // Read before releasing: what the command could count on.
        let deadline = self.kept.deadline();
        // A loss reported before the exit was seen may have come while the
        // command still ran.
        let lost = self.kept.lost().is_some_and(|lost| lost.at < exited_by);
        // Release also after a loss: keys still standing on some masters
        // hold our token, and compare-and-delete removes only those.
        let released = self.kept.release();
        if !self.stopper.is_running() {
            say(&format!("the command {}", describe(status)));
            return Ok(exit::LOST);
        }
        if exited_by >= deadline {
            say(&format!(
                "the command {} after the lock's deadline: part of its work was not protected",
                describe(status)
            ));
            return Ok(exit::LOST);
        }
        if lost {
            // Exited on its own before the loop could act on the loss.
            say(&format!(
                "lost the lock on {:?} as the command ended; the command {}",
                self.args.resource,
                describe(status)
            ));
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

/// How the command ended, in words: "exited with status 3", "was killed
/// by SIGKILL".
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => {
            let name = match signal {
                libc::SIGKILL => "SIGKILL".to_owned(),
                libc::SIGTERM => "SIGTERM".to_owned(),
                libc::SIGINT => "SIGINT".to_owned(),
                libc::SIGHUP => "SIGHUP".to_owned(),
                other => format!("signal {other}"),
            };
            format!("was killed by {name}")
        }
        (None, None) => format!("ended ({status})"),
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
            (0, 0, "exited with status 0"),
            (7 << 8, 7, "exited with status 7"),
            (255 << 8, 255, "exited with status 255"),
            (libc::SIGTERM, 143, "was killed by SIGTERM"),
            (libc::SIGKILL, 137, "was killed by SIGKILL"),
            (
                libc::SIGUSR1,
                128 + libc::SIGUSR1 as u8,
                "was killed by signal 10",
            ),
        ];
        for (raw, want, words) in cases {
            let status = ExitStatus::from_raw(raw);
            assert_eq!(status_code(status), want, "raw {raw}");
            assert_eq!(describe(status), words, "raw {raw}");
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_command_is_stopped_at_a_loss_and_killed_by_the_deadline() {
        // A lock valid until t0 + 1000 ms; each case feeds (at ms, lost)
        // in order and expects the steps.
        type Case = (&'static str, Duration, &'static [(u64, bool, Step)]);
        use KillCause::{Deadline, KillAfter};
        use Step::{Kill, Terminate, Wait};
        let cases: &[Case] = &[
            (
                "held: nothing until the deadline is at hand",
                ms(5000),
                &[
                    (0, false, Wait),
                    (989, false, Wait),
                    (990, false, Kill(Deadline)),
                ],
            ),
            (
                "a loss: SIGTERM, then SIGKILL after --kill-after",
                ms(200),
                &[
                    (600, true, Terminate),
                    (799, true, Wait),
                    (800, true, Kill(KillAfter)),
                    (995, true, Wait),
                ],
            ),
            (
                "a --kill-after past the deadline: SIGKILL by the deadline",
                ms(30_000),
                &[
                    (600, true, Terminate),
                    (989, true, Wait),
                    (990, true, Kill(Deadline)),
                ],
            ),
            (
                "an absurd --kill-after: the same, no overflow",
                Duration::MAX,
                &[(600, true, Terminate), (990, true, Kill(Deadline))],
            ),
            (
                "a loss seen only at the deadline: SIGKILL at once",
                ms(5000),
                &[(100, false, Wait), (995, true, Kill(Deadline))],
            ),
            (
                "a zero --kill-after: SIGKILL right after SIGTERM",
                Duration::ZERO,
                &[(600, true, Terminate), (600, true, Kill(KillAfter))],
            ),
        ];
        for (name, kill_after, steps) in cases {
            let t0 = Instant::now();
            let deadline = t0 + ms(1000);
            let mut stopper = Stopper::new(*kill_after);
            for (at, lost, want) in *steps {
                let got = stopper.poll(t0 + ms(*at), deadline, *lost);
                assert_eq!(got, *want, "{name}, at {at} ms");
            }
        }
    }

    #[test]
    fn the_loop_wakes_for_the_next_step() {
        let t0 = Instant::now();
        let deadline = t0 + ms(1000);
        let mut stopper = Stopper::new(ms(100));
        assert_eq!(stopper.next_due(deadline), Some(t0 + ms(990)));
        assert_eq!(stopper.poll(t0 + ms(500), deadline, true), Step::Terminate);
        assert_eq!(stopper.next_due(deadline), Some(t0 + ms(600)));
        assert_eq!(
            stopper.next_due(t0 + ms(550)),
            Some(t0 + ms(540)),
            "a deadline that moved earlier"
        );
        let mut patient = Stopper::new(Duration::MAX);
        assert_eq!(patient.poll(t0 + ms(500), deadline, true), Step::Terminate);
        assert_eq!(patient.next_due(deadline), Some(t0 + ms(990)));
        assert_eq!(
            patient.poll(t0 + ms(990), deadline, true),
            Step::Kill(KillCause::Deadline)
        );
        assert_eq!(patient.next_due(deadline), None);
    }
}
