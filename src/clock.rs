//! The clocks a lock's validity is measured on.
//!
//! `Instant` is monotonic but, on Linux, stops while the machine is
//! suspended: a lock taken before a suspend would report validity it no
//! longer has when the machine wakes, although its keys expired on the
//! masters meanwhile. This module reads a second clock that counts
//! suspended time ([`BootInstant`], `CLOCK_BOOTTIME`, monotonic as well) and
//! keeps a lock's end on both ([`Expiry`]): the `Instant` for waiting and
//! scheduling, the boot clock to notice a suspend. It decides nothing about
//! quorums and does no I/O beyond reading the clocks.

use std::time::{Duration, Instant};

/// A reading of the boot clock: time since boot, suspended time included
/// (`CLOCK_BOOTTIME` on Linux and Android). Elsewhere it follows `Instant`,
/// and a suspend is not seen (see SAFETY.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BootInstant(Duration);

impl BootInstant {
    /// The boot clock now.
    pub(crate) fn now() -> BootInstant {
        BootInstant(boot_clock())
    }

    /// A reading of `since_boot`, for a clock that is simulated.
    #[cfg(any(test, redlock_sim))]
    pub(crate) fn from_since_boot(since_boot: Duration) -> BootInstant {
        BootInstant(since_boot)
    }

    /// `self + d`, or `None` on overflow.
    pub(crate) fn checked_add(self, d: Duration) -> Option<BootInstant> {
        self.0.checked_add(d).map(BootInstant)
    }

    /// `self - d`, or `None` before the clock's start.
    #[cfg(test)]
    pub(crate) fn checked_sub(self, d: Duration) -> Option<BootInstant> {
        self.0.checked_sub(d).map(BootInstant)
    }

    /// How long after `earlier` this is; zero if it is not later.
    pub(crate) fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// The reading as time since boot.
    #[cfg(test)]
    pub(crate) fn since_boot(self) -> Duration {
        self.0
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn boot_clock() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on
    // every Linux since 2.6.39.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        // Not reachable on a supported kernel; the monotonic clock is the
        // best left, and a suspend then goes unseen.
        return monotonic_since_start();
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(ts.tv_nsec).unwrap_or(0);
    Duration::new(secs, nanos)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boot_clock() -> Duration {
    monotonic_since_start()
}

fn monotonic_since_start() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// Both clocks, read one after the other: the boot clock first, so that a
/// pause between the two reads can only make a suspend look shorter at a
/// lock's start, never longer at a later check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// The monotonic clock.
    pub(crate) mono: Instant,
    /// The boot clock.
    pub(crate) boot: BootInstant,
}

impl Stamp {
    /// Both clocks now, read within [`SUSPEND_NOISE`] / 10 of each other:
    /// a thread preempted between the reads reads again (a few times at
    /// most), so that a pause of the reader is not taken for a suspend.
    pub(crate) fn now() -> Stamp {
        let mut stamp = Stamp::read();
        for _ in 0..4 {
            let after = BootInstant::now();
            if after.saturating_duration_since(stamp.boot) < SUSPEND_NOISE / 10 {
                break;
            }
            stamp = Stamp::read();
        }
        stamp
    }

    fn read() -> Stamp {
        let boot = BootInstant::now();
        Stamp {
            mono: Instant::now(),
            boot,
        }
    }
}

/// A suspend shorter than this is not told apart from two clock reads
/// taken a moment apart; the drift allowance (2 ms and more) covers it.
pub(crate) const SUSPEND_NOISE: Duration = Duration::from_millis(1);

/// When a lock's validity ends, on both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expiry {
    mono: Instant,
    boot: BootInstant,
}

impl Expiry {
    /// `span` after `start` on both clocks; `None` on overflow.
    pub(crate) fn after(start: Stamp, span: Duration) -> Option<Expiry> {
        Some(Expiry {
            mono: start.mono.checked_add(span)?,
            boot: start.boot.checked_add(span)?,
        })
    }

    /// Already over at `now`: a lock whose validity is unknown.
    pub(crate) fn at(now: Stamp) -> Expiry {
        Expiry {
            mono: now.mono,
            boot: now.boot,
        }
    }

    /// The earlier of the two ends, clock by clock.
    #[must_use]
    pub(crate) fn min(self, other: Expiry) -> Expiry {
        Expiry {
            mono: self.mono.min(other.mono),
            boot: self.boot.min(other.boot),
        }
    }

    /// The monotonic instant validity ends, as seen at `now`: the one fixed
    /// when the lock was taken, unless the boot clock shows that the
    /// machine was suspended since, by more than [`SUSPEND_NOISE`]; then
    /// earlier by the suspended time.
    pub(crate) fn deadline(&self, now: Stamp) -> Instant {
        let mono_left = self.mono.saturating_duration_since(now.mono);
        let boot_left = self.boot.saturating_duration_since(now.boot);
        match mono_left.checked_sub(boot_left) {
            Some(suspended) if suspended > SUSPEND_NOISE => now.mono + boot_left,
            _ => self.mono,
        }
    }

    /// Validity left at `now`; zero once over on either clock.
    pub(crate) fn remaining(&self, now: Stamp) -> Duration {
        self.deadline(now).saturating_duration_since(now.mono)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_clock_is_monotonic_and_counts_like_the_monotonic_one() {
        let a = Stamp::now();
        let mut last = a.boot;
        for _ in 0..1000 {
            let b = BootInstant::now();
            assert!(b >= last, "the boot clock went back");
            last = b;
        }
        // The monotonic clock read before the boot clock: however long this
        // thread is paused in between, the boot clock has run at least as
        // far (further, by any suspend).
        let mono_b = Instant::now();
        let boot_b = BootInstant::now();
        let mono = mono_b.saturating_duration_since(a.mono);
        let boot = boot_b.saturating_duration_since(a.boot);
        assert!(boot >= mono, "boot {boot:?} < mono {mono:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_boot_clock_is_the_kernels_uptime_clock() {
        // /proc/uptime is CLOCK_BOOTTIME in centiseconds: suspended time
        // counted, which CLOCK_MONOTONIC (and `Instant`) leave out.
        let uptime = std::fs::read_to_string("/proc/uptime").expect("read /proc/uptime");
        let secs: f64 = uptime
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .expect("uptime seconds");
        let ours = BootInstant::now().since_boot().as_secs_f64();
        assert!((ours - secs).abs() < 5.0, "ours {ours} s, uptime {secs} s");
    }

    /// A lock taken at `start` for 10 s, checked `after` on the monotonic
    /// clock and `after + suspended` on the boot clock.
    fn seen(after: Duration, suspended: Duration) -> (Expiry, Stamp) {
        let start = Stamp::now();
        let expiry = Expiry::after(start, Duration::from_secs(10)).unwrap();
        let now = Stamp {
            mono: start.mono + after,
            boot: start.boot.checked_add(after + suspended).unwrap(),
        };
        (expiry, now)
    }

    #[test]
    fn a_suspend_is_taken_off_the_validity() {
        let cases = [
            // (after, suspended, remaining)
            ("no suspend", 1_000, 0, 9_000),
            ("a suspend of 3 s", 1_000, 3_000, 6_000),
            ("a suspend past the end", 1_000, 60_000, 0),
            ("a suspend within the noise", 1_000, 1, 9_000),
        ];
        for (name, after, suspended, want) in cases {
            let (expiry, now) = seen(
                Duration::from_millis(after),
                Duration::from_millis(suspended),
            );
            assert_eq!(expiry.remaining(now), Duration::from_millis(want), "{name}");
            assert_eq!(
                expiry.deadline(now),
                now.mono + Duration::from_millis(want),
                "{name}"
            );
        }
    }

    #[test]
    fn min_takes_each_clock_s_earlier_end() {
        let start = Stamp::now();
        let long = Expiry::after(start, Duration::from_secs(30)).unwrap();
        let short = Expiry::after(start, Duration::from_secs(2)).unwrap();
        assert_eq!(long.min(short), short);
        assert_eq!(short.min(long), short);
        assert_eq!(Expiry::at(start).remaining(start), Duration::ZERO);
    }
}
