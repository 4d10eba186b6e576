//! One engine per process: a thread-safe client whose operations, from
//! any number of threads or tasks, are pipelined over one event loop.
//!
//! [`SharedRedlock`] is a cheap `Clone + Send + Sync` handle. Its event
//! loop thread owns a [`Hub`] (the N connections and every operation in
//! flight, and every decision about them, sans-IO) and the [`Driver`] it
//! does the I/O with: the thread only moves inputs into the hub and its
//! outputs out. Callers put operations on a queue and wake
//! the loop with a [`mio::Waker`]; at each wake-up the loop starts every
//! queued operation's round, so that one write per master carries all of
//! them (auto-pipelining: what a batch does for one caller, done for
//! independent callers), decides each operation's quorum on its own, and
//! completes each caller. The operations themselves are the same sans-IO
//! [`Job`]s the single-thread [`Redlock`](crate::Redlock) runs: one copy of
//! the spec's rules.
//!
//! Blocking calls wait on a completion reused per thread, so that they
//! allocate nothing in steady state. A blocking call that is the only one
//! under way, while the loop has nothing in flight, runs on its caller's
//! thread instead (the loop then waits on its queue, not in `epoll`, and
//! lets go of its state): no hand-off between threads, the latency of the
//! single-thread client. Async calls return futures that any
//! executor can drive (they use only `std::task::Waker`); each allocates
//! its completion once. A future dropped before it completes never leaks a
//! lock: the loop releases what its acquire took, and stops its retries.
//! Dropping the last handle stops the loop: operations in flight finish
//! (without further retries), their cleanup is sent and the late replies
//! read, within a bound, and the drop returns once the thread has ended.

use std::cell::RefCell;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::client::Parts;
use crate::clock::Stamp;
use crate::config::{Config, ConfigError, Retry};
use crate::conn::{Keys, Op};
use crate::driver::Driver;
use crate::error::Error;
use crate::health::{BoardReader, MasterState};
use crate::hub::{Hub, Order, Promise, Ran, Submission};
use crate::job::{Extend, Output};
use crate::keep::{Keeper, Shared as KeepShared};
use crate::lock::Lock;
use crate::quorum::quorum;
use crate::resource::ResourceName;

/// A thread-safe Redlock client: one event loop thread owns the
/// connections to the N masters, and every clone of the handle, on any
/// thread, submits operations to it. Operations submitted together share
/// one write per master.
///
/// Blocking calls ([`SharedRedlock::acquire`], ...) wait on the calling
/// thread; the `_async` forms return futures that work under any executor.
///
/// **In async code, use the `_async` forms.** A blocking call made on an
/// executor's thread holds that thread while it waits: on a
/// current-thread runtime nothing else runs meanwhile, so a waiting
/// `acquire` cannot see the release another task of the same runtime
/// would make, and waits out its retries. The type system cannot tell a
/// runtime's thread from any other; the names can: `acquire_async`,
/// `lock_async`, `release_async`, `extend_async`, `using_async`.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_mio::SharedRedlock;
///
/// # fn main() -> Result<(), redlock_mio::Error> {
/// let redlock = SharedRedlock::connect([
///     "redis://127.0.0.1:7000",
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
/// ])?;
/// let workers: Vec<_> = (0..8)
///     .map(|i| {
///         let redlock = redlock.clone();
///         std::thread::spawn(move || -> Result<(), redlock_mio::Error> {
///             let lock = redlock.acquire(format!("orders:{i}"), Duration::from_secs(10))?;
///             // ... work while lock.remaining() > 0 ...
///             redlock.release(&lock)
///         })
///     })
///     .collect();
/// for worker in workers {
///     worker.join().expect("worker")?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SharedRedlock {
    handle: Arc<Handle>,
}

/// A lock of a [`SharedRedlock`] that releases itself when dropped (see
/// [`SharedRedlock::lock`]). It owns a handle of its client, so it can
/// move across threads and tasks; dropped, it hands the release to the
/// event loop without waiting for it (the keys are deleted where the
/// release runs and expire by their TTL elsewhere).
#[must_use = "dropping the guard releases the lock at once"]
#[derive(Debug)]
pub struct SharedLockGuard {
    client: SharedRedlock,
    lock: Option<Lock>,
}

impl SharedLockGuard {
    /// Releases now and reports the outcome, which dropping cannot.
    ///
    /// # Errors
    /// As [`SharedRedlock::release`].
    pub fn release(mut self) -> Result<(), Error> {
        match self.lock.take() {
            Some(lock) => self.client.release(&lock),
            None => Ok(()),
        }
    }

    /// [`SharedLockGuard::release`] as a future.
    ///
    /// # Errors
    /// As [`SharedRedlock::release`].
    pub async fn release_async(mut self) -> Result<(), Error> {
        match self.lock.take() {
            Some(lock) => self.client.release_async(&lock).await,
            None => Ok(()),
        }
    }

    /// Extends the lock; see [`SharedRedlock::extend`].
    ///
    /// # Errors
    /// As [`SharedRedlock::extend`].
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        match self.lock.as_mut() {
            Some(lock) => self.client.extend(lock, ttl),
            None => Ok(()),
        }
    }

    /// [`SharedLockGuard::extend`] as a future.
    ///
    /// # Errors
    /// As [`SharedRedlock::extend`].
    pub async fn extend_async(&mut self, ttl: Duration) -> Result<(), Error> {
        match self.lock.as_mut() {
            Some(lock) => self.client.extend_async(lock, ttl).await,
            None => Ok(()),
        }
    }

    /// Stops guarding: the lock is returned and no longer released on drop.
    pub fn into_lock(mut self) -> Option<Lock> {
        self.lock.take()
    }
}

impl std::ops::Deref for SharedLockGuard {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        // `lock` is only taken by methods that consume the guard.
        self.lock
            .as_ref()
            .unwrap_or_else(|| unreachable!("guard without lock"))
    }
}

impl Drop for SharedLockGuard {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            // Runs on the loop to its decision, waited for or not.
            drop(self.client.release_async(&lock));
        }
    }
}

/// Dropped with the last [`SharedRedlock`]: stops the loop.
#[derive(Debug)]
struct Handle {
    queue: Arc<Queue>,
    /// The loop's state. The loop thread holds it while it works or waits
    /// in `epoll` with operations in flight; when it has nothing in
    /// flight it lets go and waits on the queue, and a blocking caller
    /// that finds it free runs its operation on its own thread, as
    /// [`Redlock`](crate::Redlock) does, with no hand-off.
    core: Arc<Mutex<EventLoop>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    config: Config,
    /// The masters' states, as the loop last saw them.
    board: BoardReader,
}

/// Where callers leave operations for the loop.
#[derive(Debug)]
struct Queue {
    orders: Mutex<Orders>,
    waker: mio::Waker,
    /// Set by a caller that woke the loop, cleared by the loop before it
    /// takes the queue: one wake-up per batch of submissions.
    woken: AtomicBool,
    closed: AtomicBool,
    /// Set (under `orders`' lock) while the loop, with nothing in flight,
    /// waits on `ready` instead of in `epoll`: a submission then notifies
    /// `ready` rather than the waker.
    idle: AtomicBool,
    /// Set by a caller that handed the loop a job directly.
    nudged: AtomicBool,
    /// Set when a future was dropped before its operation ended: the loop
    /// looks for the jobs whose caller went away.
    abandoned: AtomicBool,
    /// Set (under `orders`' lock) while the loop waits idle with no time
    /// limit: a caller that ran an operation itself and left late replies
    /// in flight nudges it then, so that it comes back for them.
    waiting_untimed: AtomicBool,
    /// Blocking calls under way: only one alone runs on its own thread
    /// (with company, the loop pipelines them all instead).
    blocking: AtomicUsize,
    ready: Condvar,
}

/// The orders the loop has yet to take, and whether it takes any more.
#[derive(Debug)]
struct Orders {
    list: Vec<Submission<Handoff>>,
    /// Set, under the lock, when the loop takes no more orders: every
    /// order submitted before was taken, and a later one is refused to its
    /// submitter (see [`Queue::submit`]).
    ended: Option<Error>,
}

/// The loop's hold on a caller's [`Completion`]: handing the output over
/// consumes it. Dropped without an output (a panic unwinding the loop's
/// turn with the submission in hand), it ends the caller's wait with
/// [`Error::Stopped`]: no caller waits forever for a loop that is gone.
#[derive(Debug)]
struct Handoff(Option<Arc<Completion>>);

impl Handoff {
    fn new(completion: Arc<Completion>) -> Handoff {
        Handoff(Some(completion))
    }
}

impl Promise for Handoff {
    /// Hands `output` to the caller; see [`Completion::complete`].
    fn complete(mut self, output: Output) -> Option<Output> {
        match self.0.take() {
            Some(completion) => completion.complete(output),
            None => Some(output),
        }
    }

    fn is_abandoned(&self) -> bool {
        self.0.as_ref().is_some_and(|c| c.is_abandoned())
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        if let Some(completion) = self.0.take() {
            let why = Arc::from("a panic on its thread");
            let _ = completion.complete(Output::Failed(Error::Stopped(why)));
        }
    }
}

/// Where one caller waits for its operation's output.
#[derive(Debug, Default)]
struct Completion {
    slot: Mutex<Slot>,
    ready: Condvar,
}

#[derive(Debug, Default)]
struct Slot {
    output: Option<Output>,
    /// The async caller to wake.
    waker: Option<Waker>,
    /// The caller went away (its future was dropped): whatever the
    /// operation takes is released.
    abandoned: bool,
}

impl Completion {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `output` to the caller. Returns it when the caller went away,
    /// for the loop to release what it holds.
    fn complete(&self, output: Output) -> Option<Output> {
        let mut slot = self.lock();
        if slot.abandoned {
            return Some(output);
        }
        slot.output = Some(output);
        let waker = slot.waker.take();
        drop(slot);
        self.ready.notify_one();
        if let Some(waker) = waker {
            waker.wake();
        }
        None
    }

    fn is_abandoned(&self) -> bool {
        self.lock().abandoned
    }

    /// Blocks until the output is in.
    fn wait(&self) -> Output {
        let mut slot = self.lock();
        loop {
            if let Some(output) = slot.output.take() {
                return output;
            }
            slot = self
                .ready
                .wait(slot)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

thread_local! {
    /// The completion blocking calls on this thread reuse: no allocation
    /// per operation.
    static COMPLETION: RefCell<Option<Arc<Completion>>> = const { RefCell::new(None) };
}

/// A completion for one blocking call: this thread's. The loop may still
/// hold a reference to it from the last call for a moment, but it never
/// writes to a completion after handing its output over, so the next call
/// may reuse it at once.
fn blocking_completion() -> Arc<Completion> {
    let reused = COMPLETION
        .try_with(|c| c.borrow_mut().take())
        .ok()
        .flatten();
    match reused {
        Some(completion) => {
            let mut slot = completion.lock();
            slot.output = None;
            slot.waker = None;
            slot.abandoned = false;
            drop(slot);
            completion
        }
        None => Arc::new(Completion::default()),
    }
}

fn keep_completion(completion: Arc<Completion>) {
    let _ = COMPLETION.try_with(|c| *c.borrow_mut() = Some(completion));
}

/// The output of an operation submitted to a [`SharedRedlock`]: a future
/// that any executor can drive. Dropping it before it completes abandons
/// the operation: nothing it takes stays locked (the loop releases it),
/// and it is not retried.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled; dropping this one abandons the operation"]
pub struct Pending<T> {
    completion: Arc<Completion>,
    /// For releasing an output that arrived after the caller went away.
    queue: Arc<Queue>,
    /// For releasing such an output once the loop takes no more orders:
    /// its connections stay open while a future may still need them.
    core: Arc<Mutex<EventLoop>>,
    extract: fn(Output) -> T,
    done: bool,
}

impl<T> Future for Pending<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut slot = self.completion.lock();
        if let Some(output) = slot.output.take() {
            drop(slot);
            self.done = true;
            return Poll::Ready((self.extract)(output));
        }
        match &slot.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => slot.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut slot = self.completion.lock();
        slot.abandoned = true;
        slot.waker = None;
        // The loop hands an output over or, once `abandoned` is set (under
        // the same lock), keeps it and releases what it holds itself. An
        // output already handed over is released from here.
        let unclaimed = slot.output.take();
        drop(slot);
        if unclaimed.is_none() {
            // Still under way, perhaps waiting for a release that may be
            // long in coming: the loop ends it now.
            self.queue.abandoned.store(true, Ordering::Release);
            self.queue.nudge();
        }
        let locks: Vec<Lock> = match unclaimed {
            Some(Output::Lock(Ok(lock))) => vec![lock],
            Some(Output::Locks(results)) => results.into_iter().flatten().collect(),
            _ => return,
        };
        if locks.is_empty() {
            return;
        }
        // Nobody waits for this release: its completion is dropped.
        let order = Order::ReleaseBatch { locks };
        if let Err((Order::ReleaseBatch { locks }, _)) =
            self.queue.submit(order, Arc::new(Completion::default()))
        {
            // The loop has ended: the release is sent from here, on the
            // connections it left, without waiting for the answers.
            let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
            core.release_unclaimed(locks);
        }
    }
}

impl SharedRedlock {
    /// A shared client for the masters at `urls`, with default settings.
    /// Starts the event loop thread; masters are connected on first use.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty list or a malformed URL;
    /// [`Error::Os`] when the OS refuses a poll instance, random bytes or a
    /// thread.
    pub fn connect<I, S>(urls: I) -> Result<SharedRedlock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        SharedRedlock::new(Config::new(urls)?)
    }

    /// A shared client with the given settings ([`Config::spin`] does not
    /// apply: the loop sleeps in the kernel between events).
    ///
    /// # Errors
    /// As [`SharedRedlock::connect`].
    pub fn new(config: Config) -> Result<SharedRedlock, Error> {
        config.check()?;
        let mut event_loop = EventLoop::new(config.clone())?;
        let queue = Arc::new(Queue {
            orders: Mutex::new(Orders {
                list: Vec::with_capacity(256),
                ended: None,
            }),
            waker: event_loop
                .hub
                .io()
                .1
                .waker()
                .map_err(|e| Error::Os(e.kind()))?,
            woken: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            idle: AtomicBool::new(false),
            nudged: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            waiting_untimed: AtomicBool::new(false),
            blocking: AtomicUsize::new(0),
            ready: Condvar::new(),
        });
        let board = event_loop.hub.engine().board();
        let core = Arc::new(Mutex::new(event_loop));
        let (loop_core, loop_queue) = (Arc::clone(&core), Arc::clone(&queue));
        let thread = thread::Builder::new()
            .name("redlock-loop".into())
            .spawn(move || EventLoop::run(&loop_core, &loop_queue))
            .map_err(|e| Error::Os(e.kind()))?;
        Ok(SharedRedlock {
            handle: Arc::new(Handle {
                queue,
                core,
                thread: Mutex::new(Some(thread)),
                config,
                board,
            }),
        })
    }

    /// Each master's state as the event loop last saw it (it looks once a
    /// turn): up, connecting, or down and why; in restart quarantine, and
    /// until when; refusing this client (an ACL); the lock commands of its
    /// own it offers. A master that is down or refuses this client costs a
    /// vote, not the locks, so nothing else would say so in a build
    /// without the `tracing` or `metrics` features.
    pub fn masters(&self) -> Vec<MasterState> {
        self.handle.board.read()
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.handle.config
    }

    /// The quorum: how many masters must agree.
    pub fn quorum(&self) -> usize {
        quorum(self.handle.config.servers.len())
    }

    /// One attempt to acquire `resource` for `ttl`; see
    /// [`Redlock::try_acquire`](crate::Redlock::try_acquire).
    ///
    /// # Errors
    /// As [`Redlock::try_acquire`](crate::Redlock::try_acquire).
    pub fn try_acquire(&self, resource: impl ResourceName, ttl: Duration) -> Result<Lock, Error> {
        self.acquire_with(resource, ttl, &Retry::once())
    }

    /// Acquires `resource` for `ttl`, retrying as [`Config::retry`] says.
    ///
    /// # Errors
    /// As [`Redlock::acquire`](crate::Redlock::acquire).
    pub fn acquire(&self, resource: impl ResourceName, ttl: Duration) -> Result<Lock, Error> {
        let retry = self.handle.config.retry;
        self.acquire_with(resource, ttl, &retry)
    }

    /// Acquires with an explicit retry policy.
    ///
    /// # Errors
    /// As [`Redlock::acquire_with`](crate::Redlock::acquire_with).
    pub fn acquire_with(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
        retry: &Retry,
    ) -> Result<Lock, Error> {
        self.wait(
            acquire_order(Keys::One(resource.into_name()), Op::Acquire, ttl, retry),
            lock_of,
        )
    }

    /// Acquires `resource` for `ttl` and wraps it in a guard that
    /// releases it when dropped, also across an `.await` or a `?` (the
    /// release is handed to the event loop, which runs it whether or not
    /// anyone waits for its outcome). Retries as [`Config::retry`] says.
    ///
    /// # Errors
    /// As [`SharedRedlock::acquire`].
    pub fn lock(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
    ) -> Result<SharedLockGuard, Error> {
        let lock = self.acquire(resource, ttl)?;
        Ok(self.guard(lock))
    }

    /// [`SharedRedlock::lock`] as a future.
    ///
    /// # Errors
    /// As [`SharedRedlock::acquire`].
    pub async fn lock_async(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
    ) -> Result<SharedLockGuard, Error> {
        let lock = self.acquire_async(resource, ttl).await?;
        Ok(self.guard(lock))
    }

    /// Guards `lock`: it is released when the guard is dropped.
    pub fn guard(&self, lock: Lock) -> SharedLockGuard {
        SharedLockGuard {
            client: self.clone(),
            lock: Some(lock),
        }
    }

    /// A fenced lock, retrying as [`Config::retry`] says; see
    /// [`Redlock::try_acquire_fenced`](crate::Redlock::try_acquire_fenced).
    ///
    /// # Errors
    /// As [`Redlock::try_acquire_fenced`](crate::Redlock::try_acquire_fenced).
    pub fn acquire_fenced(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let retry = self.handle.config.retry;
        self.acquire_fenced_with(resource, ttl, &retry)
    }

    /// One attempt at a fenced lock; see
    /// [`Redlock::try_acquire_fenced`](crate::Redlock::try_acquire_fenced).
    ///
    /// # Errors
    /// As [`Redlock::try_acquire_fenced`](crate::Redlock::try_acquire_fenced).
    pub fn try_acquire_fenced(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        self.acquire_fenced_with(resource, ttl, &Retry::once())
    }

    /// A fenced lock with a retry policy.
    ///
    /// # Errors
    /// As [`Redlock::try_acquire_fenced`](crate::Redlock::try_acquire_fenced).
    pub fn acquire_fenced_with(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
        retry: &Retry,
    ) -> Result<Lock, Error> {
        let order = acquire_order(
            Keys::One(resource.into_name()),
            Op::AcquireFenced,
            ttl,
            retry,
        );
        self.wait(order, lock_of)
    }

    /// One attempt to lock every one of `resources` together; see
    /// [`Redlock::try_acquire_many`](crate::Redlock::try_acquire_many).
    ///
    /// # Errors
    /// As [`Redlock::try_acquire_many`](crate::Redlock::try_acquire_many).
    pub fn try_acquire_many<I>(&self, resources: I, ttl: Duration) -> Result<Lock, Error>
    where
        I: IntoIterator,
        I::Item: ResourceName,
    {
        self.acquire_many_with(resources, ttl, &Retry::once())
    }

    /// Several resources together, with a retry policy.
    ///
    /// # Errors
    /// As [`Redlock::try_acquire_many`](crate::Redlock::try_acquire_many).
    pub fn acquire_many_with<I>(
        &self,
        resources: I,
        ttl: Duration,
        retry: &Retry,
    ) -> Result<Lock, Error>
    where
        I: IntoIterator,
        I::Item: ResourceName,
    {
        let keys: Arc<[Bytes]> = resources.into_iter().map(ResourceName::into_name).collect();
        if keys.is_empty() {
            return Err(ConfigError::NoResources.into());
        }
        self.wait(
            acquire_order(Keys::Many(keys), Op::AcquireMany, ttl, retry),
            lock_of,
        )
    }

    /// One attempt to acquire each of `resources`, all in one round; see
    /// [`Redlock::try_acquire_batch`](crate::Redlock::try_acquire_batch).
    ///
    /// # Errors
    /// As [`Redlock::try_acquire_batch`](crate::Redlock::try_acquire_batch).
    pub fn try_acquire_batch<I>(
        &self,
        resources: I,
        ttl: Duration,
    ) -> Result<Vec<Result<Lock, Error>>, Error>
    where
        I: IntoIterator,
        I::Item: ResourceName,
    {
        let resources: Vec<Bytes> = resources.into_iter().map(ResourceName::into_name).collect();
        // Refused here, not queued behind others to be refused later.
        self.handle.config.checked_batch(resources.len())?;
        self.wait(Order::AcquireBatch { resources, ttl }, locks_of)
    }

    /// Releases each of `locks` in one round; see
    /// [`Redlock::release_batch`](crate::Redlock::release_batch).
    pub fn release_batch(&self, locks: &[Lock]) -> Vec<Result<(), Error>> {
        if let Err(error) = self.handle.config.checked_batch(locks.len()) {
            return vec![Err(Error::Config(error)); locks.len()];
        }
        let n = locks.len();
        let locks = locks.to_vec();
        self.wait(Order::ReleaseBatch { locks }, releases_of)
            .unwrap_or_else(|error| vec![Err(error); n])
    }

    /// Releases `lock` on every master; see
    /// [`Redlock::release`](crate::Redlock::release).
    ///
    /// # Errors
    /// As [`Redlock::release`](crate::Redlock::release).
    pub fn release(&self, lock: &Lock) -> Result<(), Error> {
        self.wait(Order::Release { lock: lock.clone() }, released_of)
    }

    /// Extends `lock` to `ttl`; see [`Redlock::extend`](crate::Redlock::extend),
    /// including what a failed extend does to the lock's deadline.
    ///
    /// # Errors
    /// As [`Redlock::extend`](crate::Redlock::extend).
    pub fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        Extend::shorten(&self.handle.config, lock, ttl, Stamp::now())?;
        let order = Order::Extend {
            lock: lock.clone(),
            ttl,
        };
        let (standing, result) = self.wait(order, extended_of)?;
        *lock = standing;
        result
    }

    /// [`SharedRedlock::try_acquire`] as a future.
    pub fn try_acquire_async(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
    ) -> Pending<Result<Lock, Error>> {
        self.acquire_with_async(resource, ttl, &Retry::once())
    }

    /// [`SharedRedlock::acquire`] as a future: retries wait on the event
    /// loop's timer, not on a thread.
    pub fn acquire_async(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
    ) -> Pending<Result<Lock, Error>> {
        let retry = self.handle.config.retry;
        self.acquire_with_async(resource, ttl, &retry)
    }

    /// [`SharedRedlock::acquire_with`] as a future.
    pub fn acquire_with_async(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
        retry: &Retry,
    ) -> Pending<Result<Lock, Error>> {
        let order = acquire_order(Keys::One(resource.into_name()), Op::Acquire, ttl, retry);
        self.submit(order, Arc::new(Completion::default()), lock_of)
    }

    /// [`SharedRedlock::acquire_fenced_with`] as a future.
    pub fn acquire_fenced_async(
        &self,
        resource: impl ResourceName,
        ttl: Duration,
        retry: &Retry,
    ) -> Pending<Result<Lock, Error>> {
        let order = acquire_order(
            Keys::One(resource.into_name()),
            Op::AcquireFenced,
            ttl,
            retry,
        );
        self.submit(order, Arc::new(Completion::default()), lock_of)
    }

    /// [`SharedRedlock::release`] as a future.
    pub fn release_async(&self, lock: &Lock) -> Pending<Result<(), Error>> {
        let order = Order::Release { lock: lock.clone() };
        self.submit(order, Arc::new(Completion::default()), released_of)
    }

    /// [`SharedRedlock::extend`] as a future.
    ///
    /// Cancel-safe: when first polled, before anything is sent, the lock's
    /// deadline becomes no later than `now + ttl - drift` (what the masters
    /// that run the script will leave of it), and only a confirmed extend
    /// moves it later. Dropped at any point, the future leaves `lock` with
    /// a deadline the keys honour; dropped before its first poll, it sent
    /// nothing and changed nothing.
    ///
    /// # Errors
    /// As [`Redlock::extend`](crate::Redlock::extend).
    pub async fn extend_async(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        Extend::shorten(&self.handle.config, lock, ttl, Stamp::now())?;
        let order = Order::Extend {
            lock: lock.clone(),
            ttl,
        };
        let (standing, result) = self
            .submit(order, Arc::new(Completion::default()), extended_of)
            .await?;
        *lock = standing;
        result
    }

    /// Submits `order` and blocks until its output is in.
    fn wait<T>(&self, order: Order, extract: fn(Output) -> T) -> T {
        let blocking = &self.handle.queue.blocking;
        let alone = blocking.fetch_add(1, Ordering::AcqRel) == 0;
        let output = self.wait_counted(order, extract, alone);
        blocking.fetch_sub(1, Ordering::AcqRel);
        output
    }

    fn wait_counted<T>(&self, order: Order, extract: fn(Output) -> T, alone: bool) -> T {
        // The thread's completion is made on its first blocking call,
        // whichever way that call goes, so that a later call handed to a
        // busy loop finds it made: steady state allocates nothing.
        let _ = COMPLETION.try_with(|c| {
            if let Ok(mut c) = c.try_borrow_mut()
                && c.is_none()
            {
                *c = Some(Arc::new(Completion::default()));
            }
        });
        let order = if alone {
            match self.try_inline(order) {
                Inline::Done(output) => return extract(output),
                Inline::Busy(order) => order,
            }
        } else {
            order
        };
        let completion = blocking_completion();
        let mut pending = self.submit(order, Arc::clone(&completion), extract);
        let output = completion.wait();
        pending.done = true;
        drop(pending);
        keep_completion(completion);
        extract(output)
    }

    /// Hands a kept lock to the loop.
    ///
    /// # Errors
    /// [`Error::Stopped`] once the loop takes no more orders.
    pub(crate) fn submit_keep(&self, keeper: Keeper) -> Result<(), Error> {
        // Nobody waits for it: the holder reads the shared state.
        let order = Order::Keep {
            keeper: Box::new(keeper),
        };
        self.handle
            .queue
            .submit(order, Arc::new(Completion::default()))
            .map_err(|(_, error)| error)
    }

    /// Stops keeping a lock and releases it, waiting for the release.
    pub(crate) fn unkeep(&self, shared: &Arc<KeepShared>) -> Result<(), Error> {
        let order = Order::Unkeep {
            shared: Arc::clone(shared),
        };
        self.wait(order, released_of)
    }

    /// [`SharedRedlock::unkeep`] as a future.
    pub(crate) fn unkeep_async(&self, shared: &Arc<KeepShared>) -> Pending<Result<(), Error>> {
        let order = Order::Unkeep {
            shared: Arc::clone(shared),
        };
        self.submit(order, Arc::new(Completion::default()), released_of)
    }

    fn submit<T>(
        &self,
        order: Order,
        completion: Arc<Completion>,
        extract: fn(Output) -> T,
    ) -> Pending<T> {
        let queue = &self.handle.queue;
        if let Err((order, error)) = queue.submit(order, Arc::clone(&completion)) {
            completion.complete(order.refused(error));
        }
        Pending {
            completion,
            queue: Arc::clone(queue),
            core: Arc::clone(&self.handle.core),
            extract,
            done: false,
        }
    }
}

impl SharedRedlock {
    /// Runs a blocking caller's operation on the caller's thread when it is
    /// the only blocking call under way and the loop has nothing in flight
    /// and lets go of its state: no hand-off
    /// between threads, the latency of [`Redlock`](crate::Redlock). An
    /// operation that would wait to retry is handed to the loop at that
    /// point, and its output awaited. The order comes back
    /// ([`Inline::Busy`]) when the loop is busy.
    fn try_inline(&self, order: Order) -> Inline {
        if matches!(order, Order::Keep { .. } | Order::Unkeep { .. }) {
            return Inline::Busy(order);
        }
        let Ok(mut core) = self.handle.core.try_lock() else {
            return Inline::Busy(order);
        };
        if let Some(error) = &core.stopped {
            return Inline::Done(order.refused(error.clone()));
        }
        // With a subscription kept for a lock held here, the loop runs the
        // operation: a release there ends the subscription (or hands the
        // lock over), an acquire there waits for the lock held here.
        if !core.hub.is_idle() || core.hub.engine().is_subscribed() {
            return Inline::Busy(order);
        }
        let now = Instant::now();
        let job = match core.hub.make_job(order, now) {
            Ok(job) => job,
            Err(output) => return Inline::Done(output),
        };
        match core.hub.run_inline(job) {
            Ran::Done(output) => {
                // The slowest masters' replies are still to come: the loop
                // must be awake to read them (a late -NOSCRIPT to a release
                // is answered with EVAL) if no caller comes back first.
                let late = core.hub.engine().in_flight() > 0;
                drop(core);
                let queue = &self.handle.queue;
                if late && queue.waiting_untimed.load(Ordering::Acquire) {
                    queue.nudge();
                }
                Inline::Done(output)
            }
            Ran::Waiting(job, span) => {
                let completion = blocking_completion();
                let handoff = Handoff::new(Arc::clone(&completion));
                core.hub
                    .handle_waiting_job(job, handoff, span, Stamp::now());
                drop(core);
                self.handle.queue.nudge();
                let output = completion.wait();
                keep_completion(completion);
                Inline::Done(output)
            }
        }
    }
}

impl Queue {
    fn orders(&self) -> MutexGuard<'_, Orders> {
        self.orders.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Leaves `order` for the loop and wakes it, unless a wake-up is
    /// already on its way.
    ///
    /// # Errors
    /// The loop takes no more orders (it has ended, or stopped): the
    /// order comes back, with the error it ends with.
    // Returned whole, not boxed: a submission allocates nothing.
    #[allow(clippy::result_large_err)]
    fn submit(&self, order: Order, completion: Arc<Completion>) -> Result<(), (Order, Error)> {
        let mut orders = self.orders();
        if let Some(error) = &orders.ended {
            return Err((order, error.clone()));
        }
        orders.list.push(Submission {
            order,
            completion: Handoff::new(completion),
        });
        let idle = self.idle.load(Ordering::Acquire);
        drop(orders);
        self.wake(idle);
        Ok(())
    }

    /// Ends the queue with `error` unless orders are waiting in it (they
    /// need one more turn). Returns whether it ended.
    fn end_if_empty(&self, error: Error) -> bool {
        let mut orders = self.orders();
        if !orders.list.is_empty() {
            return false;
        }
        orders.ended.get_or_insert(error);
        true
    }

    /// Ends the queue with `error`, and hands back the orders left in it.
    fn end(&self, error: Error) -> Vec<Submission<Handoff>> {
        let mut orders = self.orders();
        orders.ended.get_or_insert(error);
        std::mem::take(&mut orders.list)
    }

    /// Wakes the loop to look at jobs a caller handed it directly.
    fn nudge(&self) {
        let orders = self.orders();
        self.nudged.store(true, Ordering::Release);
        let idle = self.idle.load(Ordering::Acquire);
        drop(orders);
        self.wake(idle);
    }

    /// Wakes the loop where it waits: on `ready` when idle, else in epoll.
    fn wake(&self, idle: bool) {
        if idle {
            self.ready.notify_one();
        } else if !self.woken.swap(true, Ordering::AcqRel) {
            // A failed wake leaves the order to the loop's next turn.
            let _ = self.waker.wake();
        }
    }

    /// The loop, with nothing in flight, waits here (not in epoll) until
    /// an order comes, a caller hands it a job, the last handle goes, or
    /// `until`.
    fn wait_idle(&self, until: Option<Instant>) {
        let mut orders = self.orders();
        self.idle.store(true, Ordering::Release);
        self.waiting_untimed
            .store(until.is_none(), Ordering::Release);
        while orders.list.is_empty()
            && !self.closed.load(Ordering::Acquire)
            && !self.nudged.swap(false, Ordering::AcqRel)
        {
            match until.map(|t| t.checked_duration_since(Instant::now())) {
                Some(None) => break,
                Some(Some(left)) => {
                    orders = self
                        .ready
                        .wait_timeout(orders, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                None => {
                    orders = self
                        .ready
                        .wait(orders)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
        self.idle.store(false, Ordering::Release);
        self.waiting_untimed.store(false, Ordering::Release);
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        {
            let _orders = self.queue.orders();
            self.queue.closed.store(true, Ordering::Release);
        }
        self.queue.ready.notify_one();
        let _ = self.queue.waker.wake();
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // The last handle can go on the loop thread itself (one captured
        // by a kept lock's loss callback, say): the loop then ends on its
        // own, after this turn, and must not wait for itself.
        if let Some(thread) = thread
            && thread.thread().id() != thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

fn acquire_order(keys: Keys, op: Op, ttl: Duration, retry: &Retry) -> Order {
    Order::Acquire {
        keys,
        op,
        ttl,
        retry: *retry,
    }
}

/// The loop lost an output's kind: never, as each order makes its own.
fn lost() -> Error {
    Error::Internal("the loop answered an order with another kind's output")
}

fn lock_of(output: Output) -> Result<Lock, Error> {
    match output {
        Output::Lock(result) => result,
        Output::Failed(error) => Err(error),
        _ => Err(lost()),
    }
}

fn released_of(output: Output) -> Result<(), Error> {
    match output {
        Output::Released(result) => result,
        Output::Failed(error) => Err(error),
        _ => Err(lost()),
    }
}

fn extended_of(output: Output) -> Result<(Lock, Result<(), Error>), Error> {
    match output {
        Output::Extended(lock, result) => Ok((lock, result)),
        Output::Failed(error) => Err(error),
        _ => Err(lost()),
    }
}

fn locks_of(output: Output) -> Result<Vec<Result<Lock, Error>>, Error> {
    match output {
        Output::Locks(results) => Ok(results),
        Output::Lock(Err(error)) | Output::Failed(error) => Err(error),
        _ => Err(lost()),
    }
}

fn releases_of(output: Output) -> Result<Vec<Result<(), Error>>, Error> {
    match output {
        Output::Releases(results) => Ok(results),
        Output::Failed(error) => Err(error),
        _ => Err(lost()),
    }
}

/// A blocking call's attempt to run on its own thread.
#[derive(Debug)]
enum Inline {
    /// It ran (or was handed to the loop and awaited): its output.
    Done(Output),
    /// The loop is busy: the order goes to it.
    Busy(Order),
}

/// What the loop thread does after a turn.
#[derive(Debug)]
enum Turn {
    /// Turn again.
    Again,
    /// Nothing in flight: wait on the queue until then (a kept lock's
    /// timer), or until an order comes.
    Idle(Option<Instant>),
    /// The last handle is gone and everything is done.
    Exit,
}

/// The loop thread's state: the [`Hub`] that decides, with the
/// [`Driver`] it opens connections through, and the thread's own.
#[derive(Debug)]
struct EventLoop {
    hub: Hub<Handoff, Driver>,
    /// The queue's orders, swapped out each turn (both keep their storage).
    inbox: Vec<Submission<Handoff>>,
    /// Set when a panic ended the loop: nothing runs on this state again.
    stopped: Option<Error>,
}

/// How long the loop, once its last handle is gone, waits for late
/// replies and cleanup releases.
fn shutdown_grace(config: &Config) -> Duration {
    config.per_instance_timeout.max(Duration::from_millis(100))
}

impl EventLoop {
    fn new(config: Config) -> Result<EventLoop, Error> {
        let now = Stamp::now();
        let Parts {
            names,
            engine,
            driver,
            tokens,
            jitter,
        } = Parts::new(&config, now.mono, config.wake_on_release)?;
        Ok(EventLoop {
            hub: Hub::new(config, names, engine, driver, tokens, jitter, now),
            inbox: Vec::with_capacity(256),
            stopped: None,
        })
    }

    /// The loop thread: turns until the last handle is gone and what was
    /// in flight is done. With nothing in flight it lets go of its state
    /// and waits on the queue, so that a blocking caller may run its
    /// operation itself.
    ///
    /// A panic in a turn (a bug, or user code the loop calls that is not
    /// guarded where it is called) ends the loop, never silently: every
    /// operation under way and every one submitted later ends at once
    /// with [`Error::Stopped`], and every kept lock reports its loss.
    fn run(core: &Mutex<EventLoop>, queue: &Queue) {
        loop {
            let mut this = core.lock().unwrap_or_else(PoisonError::into_inner);
            match panic::catch_unwind(AssertUnwindSafe(|| this.turn(queue))) {
                Ok(Turn::Again) => {}
                Ok(Turn::Idle(until)) => {
                    drop(this);
                    queue.wait_idle(until);
                }
                Ok(Turn::Exit) => return,
                Err(payload) => {
                    let why = match payload.downcast_ref::<&str>() {
                        Some(text) => format!("a panic on its thread: {text}"),
                        None => match payload.downcast_ref::<String>() {
                            Some(text) => format!("a panic on its thread: {text}"),
                            None => "a panic on its thread".to_owned(),
                        },
                    };
                    this.stop(queue, Error::Stopped(Arc::from(why)));
                    return;
                }
            }
        }
    }

    /// Ends everything after a panic: the orders left in the queue, those
    /// waiting for room and every job end with `error`; kept locks report
    /// their loss; later orders are refused with it.
    fn stop(&mut self, queue: &Queue, error: Error) {
        self.stopped = Some(error.clone());
        let now = Stamp::now();
        for Submission { order, completion } in queue.end(error.clone()) {
            if let Order::Keep { keeper } = order {
                let mut keeper = *keeper;
                keeper.handle_stopped(error.clone(), now);
                continue;
            }
            completion.complete(order.refused(error.clone()));
        }
        self.hub.stop(&error, now);
    }

    /// One turn: takes the queue's orders, hands them to the hub, writes,
    /// then waits in epoll and hands the hub what came, unless nothing is
    /// in flight ([`Turn::Idle`]).
    fn turn(&mut self, queue: &Queue) -> Turn {
        let now = Stamp::now();
        // Read before the queue is taken: once closed is seen, every order
        // a handle submitted is in this turn's queue.
        let closed = queue.closed.load(Ordering::Acquire);
        queue.woken.store(false, Ordering::Release);
        {
            let mut orders = queue.orders();
            std::mem::swap(&mut orders.list, &mut self.inbox);
        }
        if closed {
            self.hub.handle_closing(now);
        }
        let (engine, driver) = self.hub.io();
        driver.prepare(engine, now.mono);
        // Taken and put back, so that both queues keep their storage.
        let mut inbox = std::mem::take(&mut self.inbox);
        for submission in inbox.drain(..) {
            self.hub.handle_order(submission, now);
        }
        self.inbox = inbox;
        if queue.abandoned.swap(false, Ordering::AcqRel) {
            self.hub.handle_abandoned(now);
        }
        self.hub.handle_timeout(now);
        let (engine, driver) = self.hub.io();
        driver.send(engine);
        let idle = self.hub.is_idle();
        // Idle, the loop still wakes for a kept lock's extend and to end a
        // subscription kept for a lock held here (see `Room::sweep`).
        let next_keep = match (self.hub.next_keep(), self.hub.next_sweep()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if idle {
            if let Some(since) = self.hub.closing_since() {
                // Everything answered; late replies and cleanup within the
                // grace period.
                let deadline = since + shutdown_grace(self.hub.config());
                let (engine, driver) = self.hub.io();
                driver.settle(engine, deadline);
                // Orders submitted since this turn took the queue (the
                // releases of dropped futures' locks) take one more turn;
                // with none, later ones are refused to their submitters.
                let ended = Error::Stopped(Arc::from("its last handle was dropped"));
                if queue.end_if_empty(ended) {
                    return Turn::Exit;
                }
                return Turn::Again;
            }
            if self.hub.engine().in_flight() == 0 {
                return Turn::Idle(next_keep);
            }
        }
        // Idle but for late replies (the slowest masters'): read what has
        // come without waiting, and come back for the rest a per-instance
        // timeout later, so that a late -NOSCRIPT to a release is still
        // answered with EVAL while no caller is active.
        // A round that completed as it started has no I/O to come: the
        // hub's timeout is now, and it is handled below without waiting.
        let timeout = if idle {
            Some(Duration::ZERO)
        } else {
            self.hub
                .poll_timeout()
                .map(|t| t.saturating_duration_since(Instant::now()))
        };
        let (engine, driver) = self.hub.io();
        if let Err(cause) = driver.turn(engine, timeout) {
            let now = Instant::now();
            for i in 0..engine.links() {
                engine.handle_failure(i, now, cause.clone());
            }
        }
        self.hub.handle_completed(Stamp::now());
        if idle && self.hub.is_idle() {
            let (engine, driver) = self.hub.io();
            driver.send(engine);
            let soon = Instant::now().checked_add(self.hub.config().per_instance_timeout);
            let until = match (next_keep, soon) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            return Turn::Idle(until);
        }
        Turn::Again
    }

    /// Locks whose future was dropped after the loop ended: their release
    /// is sent on the connections the loop left, nobody waiting for the
    /// answers (at least one attempt, rather than keys left for a TTL).
    fn release_unclaimed(&mut self, locks: Vec<Lock>) {
        if self.stopped.is_some() {
            // A panic ended the loop mid-turn: its state is not to be
            // trusted with a write.
            return;
        }
        let now = Instant::now();
        let output = Output::Locks(locks.into_iter().map(Ok).collect());
        self.hub.send_unclaimed(output, now);
        let (engine, driver) = self.hub.io();
        driver.send(engine);
    }
}
