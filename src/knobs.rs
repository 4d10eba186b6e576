//! Bugs put in on purpose, to show that the simulator's checkers catch
//! them. Only under `--cfg redlock_sim` (or in the
//! crate's unit tests), and only on the thread that turned one on: the
//! simulator runs every client's core on its own thread, so one test's
//! bug never reaches another test, nor any shared client's event loop.
//! Without it, [`injected`] is `false` and compiles away.

/// A bug the code can be made to have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// A round is won with one grant fewer than a quorum.
    QuorumOffByOne,
    /// The drift term left out of every validity.
    DriftDropped,
    /// An extend leaves the caller's lock as it was until the extend
    /// completes (as the client once did): a dropped extend can leave it
    /// claiming validity the keys no longer have.
    ExtendNotShortened,
    /// A waiting acquire takes a round with a failed master and fewer than
    /// a quorum of refusals for a split vote (as the client once did), and
    /// tries again at round-trip rate.
    FailureCountedAsSplit,
    /// A late `-NOSCRIPT` to an acquire whose round was decided is
    /// answered by sending the acquire again.
    ResendDecided,
    /// Release messages read on a subscriber connection are dropped: a
    /// waiter hears of another process's release only from the holder's
    /// expiry (or a renewed subscription).
    ReleaseNoticeDropped,
    /// A shared client hands a lock over in-process however long its row
    /// of hand-overs: other processes never get their turn while its
    /// waiters keep coming.
    HandoverBudgetIgnored,
    /// Other clients' release messages do not mark a lock as contended:
    /// a shared client takes nobody else to compete for it, and its rows
    /// of hand-overs run past their count while other processes wait.
    ContentionUnheard,
    /// A failed attempt's cleanup leaves out the masters that granted it
    /// as well as those that refused it: its keys stay there until their
    /// TTL.
    CleanupSkipsGranted,
    /// Retries, wake-ups, hand-over attempts and cleanups go straight to
    /// the wire, past the admission gate new orders wait at (as the client
    /// once did): a burst of woken waiters drops connections at the
    /// in-flight bound.
    AdmissionBypassed,
    /// A release hands the lock over to a head waiter whose attempt is
    /// under way, unannounced (as the client once did): if that attempt is
    /// its last, the lock sits free, nobody told, until the old key's TTL.
    HandoverToAttempt,
    /// A lock won after its caller went away is released without letting
    /// go of its "held here" mark (as the client once did): without channel
    /// rights no message clears it, and local waiters wait out its TTL.
    AbandonedStaysHeld,
    /// A waiting acquire whose caller went away while it was queued still
    /// makes an attempt (as the client once did).
    DroppedWaiterTries,
    /// Every `-NOSCRIPT` is answered with a `SCRIPT LOAD` of its own (as
    /// the client once did): after a `SCRIPT FLUSH` a connection holds about
    /// twice what it held, past the in-flight bound.
    ScriptLoadedPerNoscript,
    /// A native extend (`SET ... IFEQ ... GET`) goes without its `PX`: the
    /// master keeps the key with no TTL at all, a lock that never expires.
    ExtendDropsPx,
}

#[cfg(any(test, redlock_sim))]
thread_local! {
    static INJECTED: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

/// Whether `bug` is on for this thread.
#[inline(always)]
pub(crate) fn injected(bug: Bug) -> bool {
    #[cfg(any(test, redlock_sim))]
    return INJECTED.with(|b| b.get() == Some(bug));
    #[cfg(not(any(test, redlock_sim)))]
    {
        let _ = bug;
        false
    }
}

/// Turns `bug` on for this thread until the guard is dropped.
#[cfg(any(test, redlock_sim))]
pub fn inject(bug: Option<Bug>) -> Injected {
    INJECTED.with(|b| b.set(bug));
    Injected(())
}

/// Turns the injected bug off when dropped.
#[cfg(any(test, redlock_sim))]
#[derive(Debug)]
pub struct Injected(());

#[cfg(any(test, redlock_sim))]
impl Drop for Injected {
    fn drop(&mut self) {
        INJECTED.with(|b| b.set(None));
    }
}
