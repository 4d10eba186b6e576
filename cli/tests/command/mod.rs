//! `redlock` commands for the CLI's integration tests: built for given
//! masters, run to completion within a deadline (killed and the test
//! failed past it), and their exit code and output read.

#![allow(dead_code)] // each test file uses its own subset

use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// How long any one `redlock` may take to exit before a test fails.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(60);
/// How long a command under a lock may take to start.
pub const START_DEADLINE: Duration = Duration::from_secs(30);

/// A `redlock` command for these masters, with `REDLOCK_SERVERS` cleared.
pub fn redlock(servers: &[String]) -> Command {
    let mut command = shipped(servers);
    // The tests' masters start empty: restart quarantine (on by default,
    // see restart_quarantine_is_on_by_default) would keep them out at first.
    command.arg("--no-quarantine");
    command
}

/// A `redlock` command whose lock commands wait long for each master: a
/// one-shot command (a single attempt) must not fail for a slow first round
/// (connect and handshake included) on a loaded machine, which would turn
/// the exit code a test expects into 69. Not for tests of timeouts or
/// unreachable masters.
pub fn one_shot(servers: &[String]) -> Command {
    let mut command = redlock(servers);
    command.args(["--timeout", "5s"]);
    command
}

/// The command with its defaults, restart quarantine included.
pub fn shipped(servers: &[String]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redlock"));
    command.env_remove("REDLOCK_SERVERS").stdin(Stdio::null());
    if !servers.is_empty() {
        command.arg("--servers").arg(servers.join(","));
    }
    command
}

/// Runs a command to completion, killing it if it outlives the deadline.
pub fn finish(command: Command) -> Output {
    finish_within(command, EXIT_DEADLINE)
}

/// Runs a command to completion, killing it (and failing the test) if it
/// outlives `deadline`.
pub fn finish_within(mut command: Command, deadline: Duration) -> Output {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = command.spawn().expect("starting redlock");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(output) => {
            let _ = waiter.join();
            output.expect("waiting for redlock")
        }
        Err(_) => {
            // Not reaped yet, so the pid is still ours.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            let _ = waiter.join();
            panic!("{command:?} did not exit within {deadline:?}");
        }
    }
}

pub fn code(output: &Output) -> i32 {
    output
        .status
        .code()
        .unwrap_or_else(|| panic!("killed by a signal: {output:?}"))
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
