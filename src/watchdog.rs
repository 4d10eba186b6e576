//! The watchdog: keeps held locks alive by extending them, as Redisson's
//! lock watchdog and node-redlock's `using()` do, any number of them from
//! the one event loop of a [`SharedRedlock`].
//!
//! The policy and each kept lock's state are in [`keep`](crate::keep),
//! run by the client's event loop; here is the holder's side,
//! [`Watchdog`], which answers from state shared with the loop under a
//! mutex, never with network I/O.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::clock::Stamp;
use crate::config::Config;
use crate::error::Error;
use crate::keep::{KeepOptions, Keeper, Lost, Shared};
use crate::lock::Lock;
use crate::resource::ResourceName;
use crate::shared::SharedRedlock;
use crate::token::Token;

/// A held lock kept alive by the event loop of a [`SharedRedlock`]: the
/// holder's handle.
///
/// [`SharedRedlock::keep`] takes a [`Lock`] and hands it to the client's
/// event loop, which extends it before its validity runs low: no thread per
/// lock, and the extensions of many locks that fall due together share one
/// write per master. [`Watchdog::keep`] does the same on a client of its
/// own. The holder asks at any moment, without
/// network I/O, whether the lock is still held ([`Watchdog::is_held`]) and
/// until when ([`Watchdog::deadline`]). [`Watchdog::release`] stops the
/// extensions and releases the lock on every master, returning when the
/// release is answered; dropping the watchdog does the same without
/// waiting (the event loop carries the release out), so that a drop never
/// blocks, in async code neither.
///
/// # Extension policy
/// With `ttl` and `every` from [`KeepOptions`], and the *period*
/// `every * ttl`:
/// - The lock is extended (to `ttl`) once its validity has dropped to
///   `ttl - period`: every period while extensions succeed.
/// - An extension refused with [`Error::NotHeld`] loses the lock at once.
/// - Any other failure ([`Error::NoQuorum`], [`Error::Protocol`],
///   [`Error::ValidityExpired`]) is retried every 50 ms (a quarter of the
///   period when that is shorter), as long as a retry, which may take one
///   *round* (the per-instance timeout, [`Config::per_instance_timeout`]),
///   would end with more than one period of validity left. Once it would
///   not, the lock is given up: the holder learns with one period of
///   validity still left, up to one round more, enough to stop its work
///   before mutual exclusion ends, instead of learning when it is over.
///   After a majority of masters goes away, the loss is reported at most
///   `ttl - period` later (two periods with the default `every`).
/// - A failed extension never lengthens the validity, and may shorten it
///   (an extension can shorten keys even when it fails): the schedule
///   follows the lock's deadline as the failed attempt left it.
/// - Past the extension cap ([`KeepOptions::max_extensions`],
///   [`Config::max_extensions`]) nothing more is extended, and the loss
///   ([`LostReason::ExtensionLimit`](crate::LostReason::ExtensionLimit)) is reported like any other: when
///   less than one period of validity is left. The holder keeps the full
///   use of its last extension and gets the same warning as always.
/// - A lock whose validity has run out is never extended: it is reported
///   as lost ([`LostReason::Expired`](crate::LostReason::Expired)).
///
/// A loss is final: the keeper extends nothing afterwards, and waits to
/// be told to release.
///
/// # When [`Watchdog::lost`] fires, relative to the deadline
/// With `period = every * ttl` and `round` the per-instance timeout (at
/// most the TTL), the loss is reported:
/// - after a refusal ([`Error::NotHeld`]): when that round ends, whatever
///   validity is left;
/// - while extensions fail: between `deadline - period - round` and
///   `deadline - period`;
/// - past the extension cap: at `deadline - period`;
/// - as [`LostReason::Expired`](crate::LostReason::Expired): once the keeper finds no validity left.
///
/// So, but for a refusal, the report comes with at least one period of
/// validity left, *provided the event loop runs when it should*. No
/// thread can promise that: a stopped or starved process, or a lock handed
/// over with less than a period left, gets its report late, possibly after
/// the deadline (then as [`LostReason::Expired`](crate::LostReason::Expired)). The report is a
/// warning, not the bound. The bound is [`Watchdog::deadline`], on the
/// holder's own monotonic clock: work that needs the lock must end by
/// then whether or not a loss was reported ([`Watchdog::is_held`] checks
/// both). `redlock run` does exactly that: SIGTERM at the report, SIGKILL
/// by the deadline in any case.
///
/// A watchdog keeps a slow holder's lock, not a paused one's: a process
/// stopped (GC, swap, SIGSTOP) stops its event loop too, and wakes up
/// with the same pause problem as without one (see `SAFETY.md`).
///
/// # Learning of a loss
/// Three ways, for three kinds of holder: [`Watchdog::is_held`] and
/// [`Watchdog::lost`] for a holder that checks between steps of its work;
/// [`KeepOptions::on_lost`], a callback on the event loop thread, for one
/// that must react at once (cancel a task, signal a child process);
/// [`Watchdog::subscribe`], a channel, for one that waits on it, with a
/// timeout or beside other events; [`Watchdog::lost_async`], a future, for
/// an async holder. The callback must return at once (every lock of the
/// client waits for it); the channel costs one message.
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use redlock_mio::{KeepOptions, SharedRedlock};
///
/// # fn step(_: u32) {}
/// # fn main() -> Result<(), redlock_mio::Error> {
/// let redlock = SharedRedlock::connect([
///     "redis://127.0.0.1:7000",
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
/// ])?;
/// let lock = redlock.acquire("reports:nightly", Duration::from_secs(10))?;
/// let options = KeepOptions::default().on_lost(|lost| eprintln!("lock lost: {lost}"));
/// let kept = redlock.keep(lock, options)?;
/// for part in 0..1000 {
///     if !kept.is_held() {
///         // Lost: stop now, within kept.remaining().
///         break;
///     }
///     step(part);
/// }
/// kept.release()?;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the watchdog releases the lock at once"]
#[derive(Debug)]
pub struct Watchdog {
    redlock: SharedRedlock,
    shared: Arc<Shared>,
    resource: bytes::Bytes,
    token: Token,
    ttl: Duration,
    released: bool,
}

impl Watchdog {
    /// Hands `lock` to the event loop of a new [`SharedRedlock`] made from
    /// `config` (pass `redlock.config().clone()` for the holder's
    /// settings): a thread and connections for this one lock. To keep many
    /// locks from one thread, make one [`SharedRedlock`] and call
    /// [`SharedRedlock::keep`] for each.
    ///
    /// # Errors
    /// As [`SharedRedlock::new`] and [`SharedRedlock::keep`].
    pub fn keep(config: Config, lock: Lock, options: KeepOptions) -> Result<Watchdog, Error> {
        SharedRedlock::new(config)?.keep(lock, options)
    }

    /// The lock's key; the first of them, for a multi-resource lock
    /// ([`Watchdog::lock`] has them all).
    pub fn resource(&self) -> &[u8] {
        &self.resource
    }

    /// The lock's unique value.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The TTL each extension sets.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// True while the lock is held: validity is left and the keeper has not
    /// given it up. False once it is lost, even while some validity is
    /// left: that is the time to stop working ([`Watchdog::remaining`]).
    pub fn is_held(&self) -> bool {
        let state = self.shared.state();
        state.lost.is_none() && state.lock.is_valid()
    }

    /// The monotonic instant at which mutual exclusion ends, as of the last
    /// extension attempt (or the acquire): later after a success, never
    /// later after a failure, and earlier when a failed attempt shortened
    /// the keys. Work that needs the lock must end by then, lost or not
    /// (see "When lost() fires" on [`Watchdog`]).
    pub fn deadline(&self) -> Instant {
        self.shared.state().lock.deadline()
    }

    /// Validity left now; zero once the deadline has passed.
    pub fn remaining(&self) -> Duration {
        self.shared.state().lock.remaining()
    }

    /// How many times the lock has been extended in all
    /// ([`Lock::extensions`]), by the keeper and before it.
    pub fn extensions(&self) -> u32 {
        self.shared.state().lock.extensions()
    }

    /// A copy of the lock as of the last extension attempt: its current
    /// deadline and extension count.
    pub fn lock(&self) -> Lock {
        self.shared.state().lock.clone()
    }

    /// The error of the latest extension attempt while extensions are
    /// failing; `None` after a success. An early warning: the keeper is
    /// retrying, and the lock is lost if no retry succeeds in time.
    pub fn last_error(&self) -> Option<Error> {
        self.shared.state().last_error.clone()
    }

    /// Why the lock was lost, once it is; `None` while it is kept.
    ///
    /// It becomes `Some` (and stays so) when the keeper gives the lock up:
    /// at once after a quorum refused an extension; with at least one
    /// extension period of validity left when extensions keep failing or
    /// the cap is reached, provided the event loop runs on time; after
    /// the deadline only when it did not (see "When lost() fires" on
    /// [`Watchdog`] for the exact bounds). `None` therefore does not mean
    /// that the lock is valid: compare [`Watchdog::deadline`] with the
    /// time, or ask [`Watchdog::is_held`].
    pub fn lost(&self) -> Option<Lost> {
        self.shared.state().lost.clone()
    }

    /// A channel that receives the loss report once, when the lock is lost
    /// (at once if it already is). Each call makes a new channel; a
    /// receiver dropped early costs nothing. The channel is closed without
    /// a message when the watchdog is released or dropped before a loss.
    pub fn subscribe(&self) -> Receiver<Lost> {
        let (tx, rx) = mpsc::channel();
        let mut state = self.shared.state();
        match &state.lost {
            Some(lost) => {
                // The receiver is alive: it is in our hands.
                let _ = tx.send(lost.clone());
            }
            None => state.subscribers.push(tx),
        }
        rx
    }

    /// A future that completes with the loss report when the lock is lost
    /// (at once if it already is), under any executor. It never completes
    /// while the lock is kept: race it against the work it guards.
    pub fn lost_async(&self) -> LostFuture {
        LostFuture {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stops the extensions, at once even in the middle of a wait, and
    /// releases the lock on every master; returns when the release is
    /// answered, so that nothing is extended afterwards. An extension
    /// already in flight finishes first (within one per-instance timeout).
    ///
    /// # Errors
    /// As [`Redlock::release`](crate::Redlock::release): [`Error::NotHeld`]
    /// when no quorum held the token any more (after a loss, say);
    /// [`Error::NoQuorum`] or [`Error::Protocol`] when too few masters
    /// answered. Keys not released expire after their TTL.
    pub fn release(mut self) -> Result<(), Error> {
        self.released = true;
        let result = self.redlock.unkeep(&self.shared);
        // Channels still waiting learn that no loss will come.
        self.shared.state().subscribers.clear();
        result
    }
}

impl Watchdog {
    /// [`Watchdog::release`] as a future, for async holders: nothing
    /// blocks.
    ///
    /// # Errors
    /// As [`Watchdog::release`].
    pub async fn release_async(mut self) -> Result<(), Error> {
        self.released = true;
        let result = self.redlock.unkeep_async(&self.shared).await;
        self.shared.state().subscribers.clear();
        result
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if !self.released {
            // Handed to the loop, which stops the extensions and releases
            // the lock whether or not anyone waits for it; nothing to
            // report to (keys not released expire after the TTL).
            drop(self.redlock.unkeep_async(&self.shared));
            self.shared.state().subscribers.clear();
        }
    }
}

/// The future of [`Watchdog::lost_async`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct LostFuture {
    shared: Arc<Shared>,
}

impl Future for LostFuture {
    type Output = Lost;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Lost> {
        let mut state = self.shared.state();
        if let Some(lost) = &state.lost {
            return Poll::Ready(lost.clone());
        }
        if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            state.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl SharedRedlock {
    /// Keeps `lock` alive from this client's event loop until the returned
    /// [`Watchdog`] is released or dropped: extended as [`Watchdog`]
    /// describes, with no thread of its own. Any number of locks can be
    /// kept this way; their extensions share the loop's writes.
    ///
    /// # Errors
    /// [`Error::Config`] for a TTL under 1 ms (also when
    /// [`KeepOptions::ttl`] is `None` and the lock's TTL is unknown), over
    /// [`MAX_TTL_MS`](crate::MAX_TTL_MS) or over [`Config::quarantine`];
    /// [`ConfigError::ExtensionFraction`](crate::ConfigError::ExtensionFraction) when [`KeepOptions::every`] is
    /// not in `(0, 1)`. Nothing is sent then, and the lock is left as it
    /// was.
    pub fn keep(&self, lock: Lock, options: KeepOptions) -> Result<Watchdog, Error> {
        let (keeper, ttl) = Keeper::new(self.config(), lock, options, Stamp::now())?;
        let watchdog = Watchdog {
            redlock: self.clone(),
            shared: Arc::clone(keeper.shared()),
            resource: bytes::Bytes::copy_from_slice(keeper.lock().resource()),
            token: *keeper.lock().token(),
            ttl,
            released: false,
        };
        self.submit_keep(keeper)?;
        Ok(watchdog)
    }

    /// Runs `work` while `resource` is held and kept alive, then releases
    /// it: the scoped form (node-redlock's `using`). The lock is taken as
    /// [`SharedRedlock::acquire`] takes it, extended every third of `ttl`
    /// by a [`Watchdog`] (see [`SharedRedlock::keep`]),
    /// and released when `work` returns. `work` gets the watchdog, to ask
    /// [`Watchdog::is_held`](crate::Watchdog::is_held) between steps or
    /// [`Watchdog::remaining`](crate::Watchdog::remaining) before a write.
    ///
    /// A release that fails after `work` returned (a lock already lost, a
    /// master unreachable) is not reported: `work` learned of a loss from
    /// the watchdog, and keys not released expire after their TTL.
    ///
    /// # Errors
    /// As [`SharedRedlock::acquire`] and [`SharedRedlock::keep`]: `work`
    /// did not run.
    pub fn using<T>(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
        work: impl FnOnce(&Watchdog) -> T,
    ) -> Result<T, Error> {
        let lock = self.acquire(resource, ttl)?;
        let kept = self.keep(lock, KeepOptions::default())?;
        let out = work(&kept);
        let _ = kept.release();
        Ok(out)
    }

    /// [`SharedRedlock::using`] for async work: `work` gets a
    /// [`LostFuture`] that completes if the lock is
    /// lost, to race against its own steps (with `select!`, say). Nothing
    /// blocks, the release included. Dropped while `work` runs, the future
    /// drops the watchdog, which hands the release to the event loop
    /// without waiting for it.
    ///
    /// # Errors
    /// As [`SharedRedlock::using`].
    pub async fn using_async<T, F, Fut>(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
        work: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LostFuture) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let lock = self.acquire_async(resource, ttl).await?;
        let kept = self.keep(lock, KeepOptions::default())?;
        let out = work(kept.lost_async()).await;
        let _ = kept.release_async().await;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigError;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_watchdog_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Watchdog>();
        shareable::<Lost>();
        fn sendable<T: Send>() {}
        sendable::<KeepOptions>();
    }

    #[test]
    fn an_extension_fraction_outside_zero_to_one_is_a_config_error() {
        for every in [0.0, 1.0, -0.5, 2.0, f64::NAN] {
            let config = Config::new(["redis://127.0.0.1:1"]).unwrap();
            let lock =
                Lock::from_parts("r", crate::token::TokenSource::new().unwrap().next_token());
            let options = KeepOptions {
                every,
                ttl: Some(ms(1000)),
                ..KeepOptions::default()
            };
            let got = Watchdog::keep(config, lock, options).err();
            assert_eq!(
                got,
                Some(Error::Config(ConfigError::ExtensionFraction)),
                "{every}"
            );
        }
    }
}
