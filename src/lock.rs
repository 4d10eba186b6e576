//! A held lock as a value: its keys, token, TTL, validity deadline,
//! extensions and fence. Jobs make it, the clients hand it out and take it
//! back; it sends nothing by itself and knows nothing of the clients, so
//! that everything above can name it without a circle.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::clock::{Expiry, Stamp};
use crate::conn::Keys;
use crate::resource::ResourceName;
use crate::token::Token;
use crate::wait::Cohort;

/// A held lock: its resource, token and validity.
///
/// A plain value: dropping it sends nothing, and the keys expire after the
/// TTL. Release it with [`Redlock::release`](crate::Redlock::release), or use a [`LockGuard`](crate::LockGuard).
#[must_use = "a lock is held until released or expired; release it with Redlock::release"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub(crate) keys: Keys,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    /// When validity ends, on the monotonic and the boot clock.
    pub(crate) expiry: Expiry,
    pub(crate) extensions: u32,
    pub(crate) fence: Option<u64>,
    /// The row of in-process hand-overs that led to this lock (none when
    /// it was taken otherwise): see
    /// [`Config::local_handovers`](crate::Config::local_handovers).
    pub(crate) cohort: Option<Cohort>,
}

impl Lock {
    /// The lock's key; the first of them, for a multi-resource lock.
    pub fn resource(&self) -> &[u8] {
        self.keys.as_slice().first().map_or(&[], |k| k)
    }

    /// Every key the lock holds: one, or all of a multi-resource lock's.
    pub fn resources(&self) -> &[Bytes] {
        self.keys.as_slice()
    }

    /// The fencing token of a lock taken with
    /// [`Redlock::try_acquire_fenced`](crate::Redlock::try_acquire_fenced): larger than that of every fenced
    /// lock on the same resource returned before that acquire began, under
    /// the assumptions of `SAFETY.md` (*Fencing tokens*).
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// The lock's unique value.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The TTL of the last acquire or extend.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The monotonic instant at which mutual exclusion ends: `ttl - drift`
    /// after the start of the round that took or last extended the lock.
    ///
    /// `Instant` stops while the machine is suspended, but the keys' TTLs
    /// on the masters do not: validity is also kept on a clock that counts
    /// suspended time (`CLOCK_BOOTTIME` on Linux), and once a suspend is
    /// seen the deadline returned moves earlier by its length. Read it
    /// afresh rather than keeping it across a possible suspend.
    pub fn deadline(&self) -> Instant {
        self.deadline_at(Stamp::now())
    }

    /// [`Lock::deadline`] as read at `now`.
    pub(crate) fn deadline_at(&self, now: Stamp) -> Instant {
        self.expiry.deadline(now)
    }

    /// Validity left at `now`; zero once the deadline has passed.
    pub fn remaining_at(&self, now: Instant) -> Duration {
        self.deadline().saturating_duration_since(now)
    }

    /// Validity left now, suspended time counted (see [`Lock::deadline`]).
    pub fn remaining(&self) -> Duration {
        self.expiry.remaining(Stamp::now())
    }

    /// True while validity is left.
    pub fn is_valid(&self) -> bool {
        !self.remaining().is_zero()
    }

    /// How many times the lock has been extended.
    pub fn extensions(&self) -> u32 {
        self.extensions
    }

    /// A lock value for a token obtained elsewhere (printed by `redlock
    /// acquire`, say), to release or extend it.
    ///
    /// Its validity is unknown, so it counts as none: [`Lock::is_valid`] is
    /// false, [`Lock::deadline`] is the moment it was made, and
    /// [`Lock::ttl`] is zero. A successful [`Redlock::extend`](crate::Redlock::extend) gives it the
    /// extension's validity. [`Watchdog::keep`](crate::Watchdog::keep)
    /// extends such a lock at once (it needs [`KeepOptions::ttl`]) and
    /// reports it lost if that first extension fails.
    ///
    /// [`KeepOptions::ttl`]: crate::KeepOptions::ttl
    pub fn from_parts(resource: impl ResourceName, token: Token) -> Lock {
        Lock {
            keys: Keys::One(resource.into_name()),
            token,
            ttl: Duration::ZERO,
            expiry: Expiry::at(Stamp::now()),
            extensions: 0,
            fence: None,
            cohort: None,
        }
    }

    /// False for a lock made by [`Lock::from_parts`] and not extended
    /// since: nobody measured its validity.
    pub(crate) fn validity_known(&self) -> bool {
        !self.ttl.is_zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::TokenSource;

    /// A lock taken 10 s before now on the boot clock but
    /// only just now on the monotonic one, as after a 10 s suspend, has
    /// 10 s less validity than `Instant` alone would say.
    #[test]
    fn a_lock_counts_time_the_machine_spent_suspended() {
        let now = Stamp::now();
        let taken = Stamp {
            mono: now.mono,
            boot: now
                .boot
                .checked_sub(Duration::from_secs(10))
                .expect("up for 10 s"),
        };
        let lock = Lock {
            keys: Keys::One(Bytes::from_static(b"r")),
            token: TokenSource::new().expect("token").next_token(),
            ttl: Duration::from_secs(30),
            expiry: Expiry::after(taken, Duration::from_secs(30)).expect("expiry"),
            extensions: 0,
            fence: None,
            cohort: None,
        };
        assert!(lock.remaining() <= Duration::from_secs(20), "{lock:?}");
        assert!(lock.remaining() > Duration::from_secs(19), "{lock:?}");
        // About 20 s, not 30: the two clocks are read one after the other,
        // so a thread preempted between the reads of `now` sees the
        // monotonic clock run ahead of the boot clock by as long (this
        // failed once, after a full test run), and a bound of 20 s to the
        // nanosecond would not hold.
        assert!(
            lock.deadline() <= now.mono + Duration::from_secs(21),
            "{lock:?}"
        );
        assert!(lock.is_valid());
    }
}
