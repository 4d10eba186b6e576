//! A wake-up finer than `epoll`'s: a Linux `timerfd` in the driver's poll.
//!
//! `epoll_wait` takes its timeout in whole milliseconds, and mio rounds a
//! shorter one up: a waiter woken 300 µs after a release (the wake spread),
//! or a racer backing off a few round trips, would sleep a whole
//! millisecond, three times what was asked and several round trips on
//! loopback. [`FineTimer`] is armed for such a short wait, its expiry ends
//! the poll on time, and the poll keeps its rounded-up timeout as the limit
//! should the timer fail.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

/// Waits at least this long go to `epoll`'s timeout alone: its rounding up
/// to the next millisecond is a small part of them.
const COARSE: Duration = Duration::from_millis(10);

/// A `timerfd` registered under one token of the driver's poll.
#[derive(Debug)]
pub(super) struct FineTimer {
    fd: OwnedFd,
    token: Token,
}

impl FineTimer {
    /// A timer whose expiry is an event for `token` in `registry`'s poll.
    ///
    /// # Errors
    /// When the OS refuses a timerfd or its registration.
    pub(super) fn new(registry: &Registry, token: Token) -> io::Result<FineTimer> {
        // SAFETY: timerfd_create takes no pointer; its result is checked.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        registry.register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
        Ok(FineTimer { fd, token })
    }

    /// Whether `event_token` is this timer's.
    pub(super) fn is_token(&self, event_token: Token) -> bool {
        event_token == self.token
    }

    /// Arms the timer to fire `after` from now when `after` is short enough
    /// for `epoll`'s rounding to matter (see [`COARSE`]). Returns whether
    /// it was armed.
    pub(super) fn arm_if_fine(&mut self, after: Duration) -> bool {
        if after.is_zero() || after >= COARSE {
            return false;
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: 0,
                // Below COARSE: fits, and is not zero (zero would disarm).
                tv_nsec: after.as_nanos().clamp(1, 999_999_999) as libc::c_long,
            },
        };
        // SAFETY: `spec` lives across the call; the old value is not asked.
        let set =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        set == 0
    }

    /// Reads the expiry count so that the next expiry is an event again.
    pub(super) fn handle_fired(&mut self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into `count`, which has 8.
        let _ = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                count.as_mut_ptr().cast::<libc::c_void>(),
                count.len(),
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll};
    use std::time::Instant;

    #[test]
    fn a_short_wait_ends_on_the_timer_not_a_rounded_up_millisecond_later() {
        let mut poll = Poll::new().expect("poll");
        let mut timer = FineTimer::new(poll.registry(), Token(7)).expect("timerfd");
        let mut events = Events::with_capacity(4);
        assert!(!timer.arm_if_fine(Duration::ZERO), "zero is no wait");
        assert!(!timer.arm_if_fine(COARSE), "long waits are epoll's");
        // Only the timer ends the poll with an event.
        // Armed after this instant: the wait is measured from before it.
        let started = Instant::now();
        assert!(timer.arm_if_fine(Duration::from_micros(200)));
        poll.poll(&mut events, Some(Duration::from_secs(60)))
            .expect("poll");
        assert!(started.elapsed() >= Duration::from_micros(200));
        assert!(
            events.iter().any(|e| timer.is_token(e.token())),
            "the timer's event"
        );
        timer.handle_fired();
        // Read: armed again, it fires again.
        assert!(timer.arm_if_fine(Duration::from_micros(50)));
        poll.poll(&mut events, Some(Duration::from_secs(60)))
            .expect("poll");
        assert!(events.iter().any(|e| timer.is_token(e.token())));
    }
}
