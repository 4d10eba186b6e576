//! `redlock run`: a command under a lock.
//!
//! This module owns the child's life under the lock: it acquires through
//! a [`SharedRedlock`](redlock_mio::SharedRedlock) (see
//! [`mod@crate::acquire`]), hands the lock to a [`Watchdog`] on that same
//! client's event loop (which extends it every third of the TTL on a
//! thread and connections of its own, apart from the command: the client
//! that granted the lock, so that restart quarantine knows which masters
//! held it), starts the command with `REDLOCK_RESOURCE`, `REDLOCK_TOKEN`
//! and, with `--fence`, `REDLOCK_FENCE`, forwards SIGINT, SIGTERM, SIGHUP
//! and SIGQUIT, relays a stop (Ctrl-Z), and releases when the command has
//! exited. Its loop is single-threaded: signals, the child's exit and the
//! watchdog's loss report all arrive through [`Signals`].
//!
//! The command runs in a process group of its own (unless `--foreground`),
//! and every signal goes to that group (see [`Target`]): a loss must stop
//! what the command started too, as GNU timeout stops its command's group.
//! The terminal's signals then reach `redlock` alone, which passes them on.
//!
//! The command must never outlive the lock while `redlock` reports
//! success. The lock is lost when the watchdog gives it up: at once when a
//! quorum reports that the token no longer holds the key, or when
//! extending keeps failing until about a third of the TTL of validity is
//! left (see [`Watchdog`]), so that the command is told while mutual
//! exclusion still holds. Its group then gets SIGTERM, and SIGKILL after
//! `--kill-after` or just before the lock's deadline, whichever comes
//! first; a command that exits on SIGTERM leaves the loop running while
//! processes of its group remain, until they are gone or killed. The loop
//! watches that deadline on its own clock as well, so that a loss reported
//! late (or not at all: a keeper thread that did not run in time) still
//! ends in SIGKILL by the deadline. A command that exits after the
//! deadline, or after a loss, makes `redlock` exit 75 whatever its status:
//! part of its work was not protected.

use std::ffi::OsString;
use std::io;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use clap::Args;
use redlock_mio::{Config, KeepOptions, Lock, Watchdog};

use crate::acquire::{acquire_shared, shared_client};
use crate::exit::{self, Failure};
use crate::group::{self, Target};
use crate::signals::Signals;
use crate::{AcquireOptions, parse_duration, say};

/// Signals forwarded to the command.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// How often the loop looks for the processes of the command's group once
/// the command itself has exited after a loss: they are not our children,
/// and their exits send no SIGCHLD.
const OTHERS_POLL: Duration = Duration::from_millis(50);

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

    /// Keep CMD in redlock's process group, as the terminal's foreground
    /// job: it may read the terminal and gets the terminal's signals
    /// (Ctrl-C, Ctrl-Z) itself, but at a loss only CMD is signalled, not
    /// the processes it started
    #[arg(long)]
    foreground: bool,

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
/// `config` is the settings of a client that was warmed up (one server
/// named twice is refused before this is called).
pub fn run(config: Config, args: &RunArgs) -> Result<u8, Failure> {
    let shared = shared_client(config)
        .map_err(|e| exit::lock_error("cannot start the client", &e, exit::SOFTWARE))?;
    let lock = acquire_shared(&shared, &args.resource, &args.acquire)?;
    let mut caught = vec![libc::SIGCHLD];
    caught.extend(FORWARDED);
    if !args.foreground {
        // A terminal's Ctrl-Z stops redlock's group, not the command's:
        // redlock stops the command's group, then itself, and continues it
        // when continued.
        caught.extend([libc::SIGTSTP, libc::SIGCONT]);
    }
    let signals = match Signals::install(&caught) {
        Ok(signals) => signals,
        Err(e) => {
            let _ = shared.release(&lock);
            return Err(Failure::new(
                exit::OSERR,
                format!("cannot install signal handlers: {e}"),
            ));
        }
    };
    let options = KeepOptions::default()
        .with_ttl(args.acquire.ttl)
        .on_lost(|_| {
            // Wake the loop out of `Signals::wait`: SIGCHLD already means "look
            // at everything" to it, and its handler writes to the self-pipe.
            // SAFETY: raise(3) with a signal whose handler is installed.
            unsafe { libc::raise(libc::SIGCHLD) };
        });
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
    let target = match libc::pid_t::try_from(child.id()) {
        Ok(pid) if args.foreground => Target::Leader(pid),
        Ok(pid) => Target::Group(pid),
        Err(_) => {
            // No pid_t that large: cannot happen on any system we run on.
            let _ = kept.release();
            return Err(Failure::new(
                exit::OSERR,
                format!("the command's pid {} is out of range", child.id()),
            ));
        }
    };
    Supervisor {
        kept,
        child,
        target,
        signals,
        args,
        stopper: Stopper::new(args.kill_after),
    }
    .watch()
}

/// Starts the command: in a process group of its own (unless
/// `--foreground`), so that a loss stops whatever it started too (a shell
/// script's workers), as GNU timeout does; and, on Linux, with SIGTERM
/// as its parent-death signal.
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
    use std::os::unix::process::CommandExt;
    if !args.foreground {
        // Set in the child before exec, so that the group exists once
        // spawn returns.
        command.process_group(0);
    }
    #[cfg(target_os = "linux")]
    {
        // If redlock dies, nobody extends the lock any more: the command
        // must not go on believing it holds it.
        // SAFETY: getpid(2) cannot fail.
        let parent = unsafe { libc::getpid() };
        // SAFETY: prctl and getppid are async-signal-safe and touch no
        // memory of ours; the error is made from a number, not allocated.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // A parent that died before prctl sends no death signal:
                // the child was handed to another parent already. Not
                // running the command is what the signal would have led
                // to (the error ends the child; nobody is left to read it).
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
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
    /// Where signals go: the command's process group, or the command.
    target: Target,
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
        // When the command (the group's leader) was seen to have exited;
        // it stays unreaped until the loop is done with its group.
        let mut exited: Option<Instant> = None;
        let exited_by = loop {
            if exited.is_none() {
                exited = match group::leader_exited(self.target.leader()) {
                    Ok(seen) => seen,
                    Err(e) => {
                        // Cannot happen for our own child; stop it rather
                        // than leave it running without knowing its fate.
                        say(&format!("cannot wait for the command: {e}"));
                        self.target.signal(libc::SIGKILL);
                        self.stopper.stage = Stage::Killed;
                        Some(Instant::now())
                    }
                };
            }
            if let Some(at) = exited
                && !self.waits_for_others()
            {
                break at;
            }
            let deadline = self.kept.deadline();
            self.forward(deadline);
            let lost = self.kept.lost();
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
            // Once the command has exited, only processes it started are
            // left to stop.
            let who = match exited {
                None => "the command",
                Some(_) => "processes the command started",
            };
            match step {
                Step::Wait => {}
                Step::Terminate => {
                    self.target.signal(libc::SIGTERM);
                    // A stopped process acts on SIGTERM once continued.
                    self.target.signal(libc::SIGCONT);
                }
                Step::Kill(KillCause::KillAfter) => {
                    say(&format!("{who} outlived --kill-after; sending SIGKILL"));
                    self.target.signal(libc::SIGKILL);
                }
                Step::Kill(KillCause::Deadline) if lost.is_none() => {
                    say(&format!(
                        "the lock on {:?} reaches its deadline without an extension \
                         ({left} ms of validity left); sending SIGKILL",
                        self.args.resource
                    ));
                    self.target.signal(libc::SIGKILL);
                }
                Step::Kill(KillCause::Deadline) => {
                    say(&format!(
                        "{who} still running at the lock's deadline \
                         ({left} ms of validity left); sending SIGKILL"
                    ));
                    self.target.signal(libc::SIGKILL);
                }
            }
            let mut nap = self
                .stopper
                .next_due(deadline)
                .map_or(MAX_NAP, |due| due.saturating_duration_since(Instant::now()))
                .min(MAX_NAP);
            if exited.is_some() {
                nap = nap.min(OTHERS_POLL);
            }
            self.signals.wait(nap);
        };
        // Reaped only now: the group's id stayed the leader's until here.
        let status = self
            .child
            .wait()
            .map_err(|e| Failure::new(exit::OSERR, format!("cannot wait for the command: {e}")))?;
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

    /// Whether the loop must go on after the command exited: it was sent
    /// SIGTERM for a loss, and processes it started, in its group, may
    /// still run (they get SIGKILL when it is due). A command that exits
    /// on its own, or after SIGKILL, ends the loop: what it leaves running
    /// is not waited for.
    fn waits_for_others(&self) -> bool {
        matches!(self.stopper.stage, Stage::Terminated { .. })
            && self.target.others_alive() != Some(false)
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

    /// Passes on the signals that redlock received. In a process group of
    /// its own the command gets nothing from the terminal (whose signals
    /// go to the foreground group, redlock's), so everything is forwarded,
    /// and a stop (Ctrl-Z) stops the command's group before redlock, which
    /// continues the group when it is continued, unless the lock's
    /// deadline passed meanwhile (the loop then kills it). With
    /// `--foreground` the command shares redlock's group: what a terminal
    /// sent it got already, and is not sent twice.
    fn forward(&mut self, deadline: Instant) {
        let pending = self.signals.take();
        let grouped = matches!(self.target, Target::Group(_));
        for signal in FORWARDED {
            if pending.contains(signal) && (grouped || !pending.only_from_terminal(signal)) {
                self.target.signal(signal);
            }
        }
        if !grouped {
            return;
        }
        if pending.contains(libc::SIGTSTP) && !pending.contains(libc::SIGCONT) {
            // SIGSTOP, which cannot be caught: the command must not run on
            // while nobody extends the lock or watches its deadline.
            self.target.signal(libc::SIGSTOP);
            // SAFETY: raise(3) with a signal that stops the process.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        if pending.contains(libc::SIGCONT) && Instant::now() < Stopper::kill_by(deadline) {
            self.target.signal(libc::SIGCONT);
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
