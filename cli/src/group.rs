//! The command of `redlock run` as a process group: its leader (the
//! process `run` started) and whatever it started that stayed in its
//! group.
//!
//! This module owns the system calls that touch the group: the signals
//! sent to it, whether its leader has exited (without reaping it), and
//! whether other processes of the group are still alive. It decides
//! nothing: when to signal is `run`'s [`Stopper`](crate::run). The leader
//! stays unreaped (a zombie) until the caller is done with the group, so
//! that the group's id, the leader's pid, cannot be reused by another
//! process group while signals may still be sent to it.

use std::io;
use std::time::Instant;

/// Where `run`'s signals go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The command's own process group (its id is the leader's pid).
    Group(libc::pid_t),
    /// The command alone, which shares `redlock`'s process group
    /// (`--foreground`).
    Leader(libc::pid_t),
}

impl Target {
    /// The leader's pid.
    pub fn leader(self) -> libc::pid_t {
        match self {
            Target::Group(pid) | Target::Leader(pid) => pid,
        }
    }

    /// Sends `signal` to the group, or to the leader alone. The caller
    /// must not have reaped the leader.
    pub fn signal(self, signal: libc::c_int) {
        // SAFETY: kill(2) and killpg(2) with the pid of our own unreaped
        // child, which is also the id of the group it leads.
        unsafe {
            match self {
                Target::Group(pgid) => libc::killpg(pgid, signal),
                Target::Leader(pid) => libc::kill(pid, signal),
            };
        }
    }

    /// Whether processes of the group other than the leader may still run:
    /// `Some(false)` once none is alive (zombies do not count), `None`
    /// where that cannot be told (no `/proc`). Always `Some(false)` for
    /// [`Target::Leader`], whose group is not the command's.
    pub fn others_alive(self) -> Option<bool> {
        match self {
            Target::Group(pgid) => others_alive(pgid),
            Target::Leader(_) => Some(false),
        }
    }
}

/// Whether process `pid`, a child of ours, has exited, and when that was
/// seen; it is not reaped (see the module's comment).
///
/// # Errors
/// As waitid(2), which cannot fail for our own child.
pub fn leader_exited(pid: libc::pid_t) -> io::Result<Option<Instant>> {
    let id = libc::id_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    loop {
        // SAFETY: a zeroed siginfo_t is a valid value for waitid to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        // SAFETY: waitid(2) on our own child, with a valid siginfo_t.
        if unsafe { libc::waitid(libc::P_PID, id, &mut info, flags) } == 0 {
            // With WNOHANG and no exit to report, si_pid stays zero.
            // SAFETY: waitid filled (or left zeroed) the siginfo_t.
            let exited = unsafe { info.si_pid() } != 0;
            return Ok(exited.then(Instant::now));
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Whether a process other than the leader `pgid` is alive in process
/// group `pgid`, read from `/proc`; `None` without `/proc`.
fn others_alive(pgid: libc::pid_t) -> Option<bool> {
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<libc::pid_t>().ok()) else {
            continue;
        };
        if pid == pgid {
            continue;
        }
        // A process that went away meanwhile is not alive.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some((state, group)) = state_and_group(&stat)
            && group == pgid
            && !matches!(state, 'Z' | 'X' | 'x')
        {
            return Some(true);
        }
    }
    Some(false)
}

/// The state letter and the process group from a `/proc/PID/stat` line:
/// `pid (comm) state ppid pgrp ...`, where comm may hold spaces and
/// parentheses, so the fields are counted from the last `)`.
fn state_and_group(stat: &str) -> Option<(char, libc::pid_t)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_their_state_and_group() {
        let cases = [
            ("42 (sh) S 1 42 42 0 -1", Some(('S', 42))),
            ("43 (a) b) (c) Z 42 42 42 0", Some(('Z', 42))),
            ("44 (worker 2) R 43 7 7", Some(('R', 7))),
            ("45 (cut", None),
            ("46 (x) S 1", None),
        ];
        for (line, want) in cases {
            assert_eq!(state_and_group(line), want, "{line:?}");
        }
    }

    #[test]
    fn a_group_that_cannot_exist_has_nobody_alive() {
        // No process has a pid, nor a group id, this large.
        assert_eq!(others_alive(libc::pid_t::MAX), Some(false));
    }
}
