//! Waiting on time for the open loop's thread callers: the precise wait
//! until an operation's intended start (a sleep until shortly before it,
//! then a yielding spin, on a thread whose timer slack is 1 ns). Async
//! callers sleep with [`crate::tasks::sleep_until`] on the executor of
//! `crate::tasks`, which waits for its earliest timer the same way. It
//! knows nothing of locks.

use std::thread;
use std::time::Instant;

use crate::tasks::SPIN;

/// Waits on this thread until `at`: a sleep until `SPIN` before, then a
/// yielding spin.
pub(crate) fn wait_until(at: Instant) {
    loop {
        let now = Instant::now();
        let Some(left) = at.checked_duration_since(now).filter(|l| !l.is_zero()) else {
            return;
        };
        match left.checked_sub(SPIN) {
            Some(sleep) if !sleep.is_zero() => thread::sleep(sleep),
            _ => thread::yield_now(),
        }
    }
}

/// Asks the kernel to wake this thread's sleeps on time rather than up to
/// 50 µs late (its default timer slack). Best effort.
pub(crate) fn precise_timers() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer and affects only this
    // thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn waiting_until_a_past_instant_returns_at_once() {
        let t = Instant::now();
        wait_until(t);
        let soon = Instant::now() + Duration::from_millis(2);
        wait_until(soon);
        assert!(Instant::now() >= soon);
    }
}
