//! One engine per process: a thread-safe client whose operations, from
//! any number of threads or tasks, are pipelined over one event loop.
//!
//! [`SharedRedlock`] is a cheap `Clone + Send + Sync` handle. Its event
//! loop thread owns the N connections (an [`Engine`] and a [`Driver`]) and
//! every operation in flight. Callers put operations on a queue and wake
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
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::io;
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
use crate::conn::{Keys, Op, Request};
use crate::driver::Driver;
use crate::engine::{Engine, Wait};
use crate::error::Error;
use crate::job::{Acquire, Batch, Ctx, Extend, Job, Output, Release, SplitMix64, Step, release_op};
use crate::keep::{KeepStep, Keeper, Shared as KeepShared};
use crate::lock::Lock;
use crate::metrics::{self, OpSpan};
use crate::quorum::quorum;
use crate::token::TokenSource;

/// A thread-safe Redlock client: one event loop thread owns the
/// connections to the N masters, and every clone of the handle, on any
/// thread, submits operations to it. Operations submitted together share
/// one write per master.
///
/// Blocking calls ([`SharedRedlock::acquire`], ...) wait on the calling
/// thread; the `_async` forms return futures that work under any executor.
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
    list: Vec<Submission>,
    /// Set, under the lock, when the loop takes no more orders: every
    /// order submitted before was taken, and a later one is refused to its
    /// submitter (see [`Queue::submit`]).
    ended: Option<Error>,
}

/// One operation submitted, and where its caller waits.
#[derive(Debug)]
struct Submission {
    order: Order,
    completion: Promise,
}

/// The loop's hold on a caller's [`Completion`]: handing the output over
/// consumes it. Dropped without an output (a panic unwinding the loop's
/// turn with the submission in hand), it ends the caller's wait with
/// [`Error::Stopped`]: no caller waits forever for a loop that is gone.
#[derive(Debug)]
struct Promise(Option<Arc<Completion>>);

impl Promise {
    fn new(completion: Arc<Completion>) -> Promise {
        Promise(Some(completion))
    }

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

impl Drop for Promise {
    fn drop(&mut self) {
        if let Some(completion) = self.0.take() {
            let why = Arc::from("a panic on its thread");
            let _ = completion.complete(Output::Failed(Error::Stopped(why)));
        }
    }
}

/// An operation as a caller asks for it; the loop makes it a [`Job`].
#[derive(Debug)]
enum Order {
    Acquire {
        keys: Keys,
        op: Op,
        ttl: Duration,
        retry: Retry,
    },
    Extend {
        lock: Lock,
        ttl: Duration,
    },
    Release {
        lock: Lock,
    },
    AcquireBatch {
        resources: Vec<Bytes>,
        ttl: Duration,
    },
    ReleaseBatch {
        locks: Vec<Lock>,
    },
    /// Keep a lock alive from the loop (no caller waits).
    Keep {
        // Boxed: a rare order, and the largest by far.
        keeper: Box<Keeper>,
    },
    /// Stop keeping a lock and release it.
    Unkeep {
        shared: Arc<KeepShared>,
    },
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
        let event_loop = EventLoop::new(config.clone())?;
        let queue = Arc::new(Queue {
            orders: Mutex::new(Orders {
                list: Vec::with_capacity(256),
                ended: None,
            }),
            waker: event_loop.driver.waker().map_err(|e| Error::Os(e.kind()))?,
            woken: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            idle: AtomicBool::new(false),
            nudged: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            waiting_untimed: AtomicBool::new(false),
            blocking: AtomicUsize::new(0),
            ready: Condvar::new(),
        });
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
            }),
        })
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
    pub fn try_acquire(&self, resource: impl Into<Bytes>, ttl: Duration) -> Result<Lock, Error> {
        self.acquire_with(resource, ttl, &Retry::once())
    }

    /// Acquires `resource` for `ttl`, retrying as [`Config::retry`] says.
    ///
    /// # Errors
    /// As [`Redlock::acquire`](crate::Redlock::acquire).
    pub fn acquire(&self, resource: impl Into<Bytes>, ttl: Duration) -> Result<Lock, Error> {
        let retry = self.handle.config.retry;
        self.acquire_with(resource, ttl, &retry)
    }

    /// Acquires with an explicit retry policy.
    ///
    /// # Errors
    /// As [`Redlock::acquire_with`](crate::Redlock::acquire_with).
    pub fn acquire_with(
        &self,
        resource: impl Into<Bytes>,
        ttl: Duration,
        retry: &Retry,
    ) -> Result<Lock, Error> {
        self.wait(
            acquire_order(Keys::One(resource.into()), Op::Acquire, ttl, retry),
            lock_of,
        )
    }

    /// One attempt at a fenced lock; see
    /// [`Redlock::try_acquire_fenced`](crate::Redlock::try_acquire_fenced).
    ///
    /// # Errors
    /// As [`Redlock::try_acquire_fenced`](crate::Redlock::try_acquire_fenced).
    pub fn try_acquire_fenced(
        &self,
        resource: impl Into<Bytes>,
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
        resource: impl Into<Bytes>,
        ttl: Duration,
        retry: &Retry,
    ) -> Result<Lock, Error> {
        let order = acquire_order(Keys::One(resource.into()), Op::AcquireFenced, ttl, retry);
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
        I::Item: Into<Bytes>,
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
        I::Item: Into<Bytes>,
    {
        let keys: Arc<[Bytes]> = resources.into_iter().map(Into::into).collect();
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
        I::Item: Into<Bytes>,
    {
        let resources: Vec<Bytes> = resources.into_iter().map(Into::into).collect();
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
        resource: impl Into<Bytes>,
        ttl: Duration,
    ) -> Pending<Result<Lock, Error>> {
        self.acquire_with_async(resource, ttl, &Retry::once())
    }

    /// [`SharedRedlock::acquire`] as a future: retries wait on the event
    /// loop's timer, not on a thread.
    pub fn acquire_async(
        &self,
        resource: impl Into<Bytes>,
        ttl: Duration,
    ) -> Pending<Result<Lock, Error>> {
        let retry = self.handle.config.retry;
        self.acquire_with_async(resource, ttl, &retry)
    }

    /// [`SharedRedlock::acquire_with`] as a future.
    pub fn acquire_with_async(
        &self,
        resource: impl Into<Bytes>,
        ttl: Duration,
        retry: &Retry,
    ) -> Pending<Result<Lock, Error>> {
        let order = acquire_order(Keys::One(resource.into()), Op::Acquire, ttl, retry);
        self.submit(order, Arc::new(Completion::default()), lock_of)
    }

    /// [`SharedRedlock::acquire_fenced_with`] as a future.
    pub fn acquire_fenced_async(
        &self,
        resource: impl Into<Bytes>,
        ttl: Duration,
        retry: &Retry,
    ) -> Pending<Result<Lock, Error>> {
        let order = acquire_order(Keys::One(resource.into()), Op::AcquireFenced, ttl, retry);
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
        if !core.is_idle() {
            return Inline::Busy(order);
        }
        let now = Instant::now();
        let job = match core.make_job(order, now) {
            Ok(job) => job,
            Err(output) => return Inline::Done(output),
        };
        match core.run_inline(job) {
            Ran::Done(output) => {
                // The slowest masters' replies are still to come: the loop
                // must be awake to read them (a late -NOSCRIPT to a release
                // is answered with EVAL) if no caller comes back first.
                let late = core.engine.in_flight() > 0;
                drop(core);
                let queue = &self.handle.queue;
                if late && queue.waiting_untimed.load(Ordering::Acquire) {
                    queue.nudge();
                }
                Inline::Done(output)
            }
            Ran::Waiting(job, span) => {
                let completion = blocking_completion();
                let waiter = Waiter::Caller(Promise::new(Arc::clone(&completion)));
                core.spawn_with(job, waiter, span, Instant::now());
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
            completion: Promise::new(completion),
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
    fn end(&self, error: Error) -> Vec<Submission> {
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

impl Order {
    /// The output of this order refused before it became a job (the loop
    /// takes no more orders): `error` for each of its results.
    fn refused(self, error: Error) -> Output {
        match self {
            Order::Acquire { .. } | Order::AcquireBatch { .. } => Output::Lock(Err(error)),
            Order::Extend { lock, .. } => Output::Extended(lock, Err(error)),
            Order::ReleaseBatch { locks } => Output::Releases(vec![Err(error); locks.len()]),
            Order::Release { .. } | Order::Unkeep { .. } | Order::Keep { .. } => {
                Output::Released(Err(error))
            }
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
    Error::Os(io::ErrorKind::Other)
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

/// A job on the loop and who waits for it.
#[derive(Debug)]
struct Running {
    job: Job,
    waiter: Waiter,
    /// The resource whose queue of waiters the job joined.
    waits_for: Option<Bytes>,
    /// The resource's epoch when the job's last attempt started: a
    /// release seen since then means try again.
    tried_at: u64,
    /// Waiting for a release (or its timer): a notification wakes it.
    awaiting: bool,
    /// Its timer in [`EventLoop::timers`]: older entries are stale.
    timer: u64,
    /// Waiting for a round's outcome: nothing else may move it on.
    in_round: bool,
    /// The operation's span, open until it ends.
    span: OpSpan,
}

impl Running {
    fn new(job: Job, waiter: Waiter, span: OpSpan) -> Option<Running> {
        Some(Running {
            job,
            waiter,
            span,
            waits_for: None,
            tried_at: 0,
            awaiting: false,
            timer: 0,
            in_round: false,
        })
    }
}

/// Who waits for a job.
#[derive(Debug)]
enum Waiter {
    /// A caller, blocking or async.
    Caller(Promise),
    /// The kept lock in this slot of the loop's table (an extension).
    Keeper(usize),
}

impl Waiter {
    fn is_abandoned(&self) -> bool {
        match self {
            Waiter::Caller(completion) => completion.is_abandoned(),
            Waiter::Keeper(_) => false,
        }
    }
}

/// A kept lock in the loop's table.
#[derive(Debug)]
struct Kept {
    keeper: Keeper,
    /// Tells this lock's timers from those of an earlier lock in the slot.
    generation: u64,
    /// An extension is in flight.
    extending: bool,
    /// Told to stop while extending: release once the extension ends, and
    /// hand the result to this caller.
    stopping: Option<Promise>,
    /// Its extension waits for room, in [`EventLoop::kept_admitting`].
    admitting: bool,
}

/// A blocking call's attempt to run on its own thread.
#[derive(Debug)]
enum Inline {
    /// It ran (or was handed to the loop and awaited): its output.
    Done(Output),
    /// The loop is busy: the order goes to it.
    Busy(Order),
}

/// How a job run on a caller's thread ended.
// Held for a moment on the stack: boxing the job would allocate.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Ran {
    /// Done: its output.
    Done(Output),
    /// It waits (to retry, or for a release): the loop takes it over,
    /// with its span.
    Waiting(Job, OpSpan),
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

/// The loop thread's state: the engine, the driver, every job and every
/// kept lock.
#[derive(Debug)]
struct EventLoop {
    config: Config,
    names: Vec<Arc<str>>,
    engine: Engine,
    driver: Driver,
    tokens: TokenSource,
    jitter: SplitMix64,
    jobs: Vec<Option<Running>>,
    free_jobs: Vec<usize>,
    /// Per engine round index: the job it belongs to and when it started.
    owners: Vec<(usize, Stamp)>,
    /// When the jobs waiting to retry or for a release go on.
    timers: Timers,
    /// Jobs at the head of a resource's queue waiting for their
    /// subscriptions, each with the instant it stops waiting for them.
    subscribing: Vec<(usize, Instant)>,
    /// The queue's orders, swapped out each turn (both keep their storage).
    inbox: Vec<Submission>,
    /// Orders waiting for room in the connections' in-flight queues.
    admitting: VecDeque<Submission>,
    /// Kept locks whose extension waits for room: (slot, generation).
    /// They go before the orders: an extension is due.
    kept_admitting: VecDeque<(usize, u64)>,
    /// Set once two masters turned out to be one server.
    same_server: Option<ConfigError>,
    /// Kept locks, by slot.
    kept: Vec<Option<Kept>>,
    free_kept: Vec<usize>,
    /// When each kept lock next needs the loop: (when, slot, generation).
    keep_timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    generations: u64,
    /// When the last handle went: from then on no job retries.
    closing_since: Option<Instant>,
    /// Set when a panic ended the loop: nothing runs on this state again.
    stopped: Option<Error>,
}

/// When a waiter woken by a release at `now` tries: after a random delay
/// within [`Config::wake_spread`], so that the waiters of several
/// processes woken together do not split the masters' votes, shorter the
/// longer it has waited (since `waiting_since`), down to a quarter of the
/// spread at 20 ms, so that the waiter that has waited longest tends to
/// send its attempt first.
fn wake_at(
    jitter: &mut SplitMix64,
    spread: Duration,
    waiting_since: Option<Instant>,
    now: Instant,
) -> Instant {
    let age = waiting_since
        .map(|t| now.saturating_duration_since(t))
        .unwrap_or_default()
        .min(AGE_PRIORITY);
    let share = 1.0 - age.as_secs_f64() / AGE_PRIORITY.as_secs_f64();
    now + jitter.between(Duration::ZERO, spread.mul_f64(share.max(MIN_SPREAD_SHARE)))
}

/// The jobs' timers: when each waiting job goes on (to retry, to stop
/// waiting for a release or its turn, or after its wake delay). A job has
/// one live timer; setting or cancelling it makes its earlier entries
/// stale.
#[derive(Debug, Default)]
struct Timers {
    /// (when, job, timer), soonest first; an entry whose timer is not the
    /// job's is stale.
    heap: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    /// The last timer handed out.
    issued: u64,
}

impl Timers {
    /// Sets job `index`'s (`running`'s) timer to `at`, replacing any other.
    fn set(&mut self, running: &mut Running, index: usize, at: Instant) {
        self.cancel(running);
        self.heap.push(Reverse((at, index, running.timer)));
    }

    /// Makes `running`'s timer, if it has one, stale.
    fn cancel(&mut self, running: &mut Running) {
        self.issued += 1;
        running.timer = self.issued;
    }

    /// The soonest entry's instant (perhaps a stale one's).
    fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }
}

/// Past this wait, a woken waiter's delay is the least share of the
/// spread (see [`wake_at`]).
const AGE_PRIORITY: Duration = Duration::from_millis(20);

/// The least share of [`Config::wake_spread`] a woken waiter's delay is
/// drawn from, however long it has waited: the waiters of several
/// processes that have all waited long are still spread apart, or they
/// would all try at once and split the votes.
const MIN_SPREAD_SHARE: f64 = 0.25;

/// How long the loop, once its last handle is gone, waits for late
/// replies and cleanup releases.
fn shutdown_grace(config: &Config) -> Duration {
    config.per_instance_timeout.max(Duration::from_millis(100))
}

impl EventLoop {
    fn new(config: Config) -> Result<EventLoop, Error> {
        let Parts {
            names,
            engine,
            driver,
            tokens,
            jitter,
        } = Parts::new(&config, Instant::now(), config.wake_on_release)?;
        Ok(EventLoop {
            names,
            engine,
            driver,
            tokens,
            jitter,
            jobs: Vec::new(),
            free_jobs: Vec::new(),
            owners: Vec::new(),
            timers: Timers::default(),
            subscribing: Vec::new(),
            inbox: Vec::with_capacity(256),
            admitting: VecDeque::with_capacity(256),
            kept_admitting: VecDeque::new(),
            same_server: None,
            kept: Vec::new(),
            free_kept: Vec::new(),
            keep_timers: BinaryHeap::new(),
            generations: 0,
            closing_since: None,
            stopped: None,
            config,
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
        let orders = queue.end(error.clone());
        for Submission { order, completion } in orders.into_iter().chain(self.admitting.drain(..)) {
            if let Order::Keep { keeper } = order {
                let mut keeper = *keeper;
                keeper.handle_stopped(error.clone(), Stamp::now());
                continue;
            }
            completion.complete(order.refused(error.clone()));
        }
        for running in self.jobs.iter_mut().filter_map(Option::take) {
            if let Waiter::Caller(completion) = running.waiter {
                completion.complete(running.job.stopped(&error));
            }
        }
        for kept in self.kept.iter_mut().filter_map(Option::take) {
            let mut keeper = kept.keeper;
            keeper.handle_stopped(error.clone(), Stamp::now());
            keeper.shared().set_slot(None);
            if let Some(completion) = kept.stopping {
                completion.complete(Output::Released(Err(error.clone())));
            }
        }
    }

    /// Nothing in flight, nothing waiting: a caller may use the engine.
    fn is_idle(&self) -> bool {
        self.jobs.len() == self.free_jobs.len()
            && self.admitting.is_empty()
            && self.kept_admitting.is_empty()
    }

    /// One turn: takes the queue's orders, starts what it can, writes,
    /// then waits in epoll and handles what came, unless nothing is in
    /// flight ([`Turn::Idle`]).
    fn turn(&mut self, queue: &Queue) -> Turn {
        let now = Instant::now();
        // Read before the queue is taken: once closed is seen, every order
        // a handle submitted is in this turn's queue.
        let closed = queue.closed.load(Ordering::Acquire);
        queue.woken.store(false, Ordering::Release);
        {
            let mut orders = queue.orders();
            std::mem::swap(&mut orders.list, &mut self.inbox);
        }
        if closed && self.closing_since.is_none() {
            self.closing_since = Some(now);
            // No retries once closing: each job ends with its current
            // round, and one waiting (to retry, for a release, for its
            // turn) ends now, not at its retry delay or key's expiry.
            // Orders admitted from now on are made so too (`start`).
            for (index, running) in self.jobs.iter_mut().enumerate() {
                let Some(running) = running else { continue };
                running.job.abandon();
                if !running.in_round {
                    self.timers.set(running, index, now);
                }
            }
        }
        self.driver.prepare(&mut self.engine, now);
        // Taken and put back, so that both queues keep their storage.
        let mut inbox = std::mem::take(&mut self.inbox);
        for submission in inbox.drain(..) {
            match submission.order {
                // Taking a lock to keep sends nothing by itself; its
                // extensions are admitted ahead of the orders (see
                // `admit`), and its release is an order like any other.
                Order::Keep { keeper } => self.keep(*keeper, now),
                order => self.admitting.push_back(Submission {
                    order,
                    completion: submission.completion,
                }),
            }
        }
        self.inbox = inbox;
        self.admit(now);
        if queue.abandoned.swap(false, Ordering::AcqRel) {
            self.wake_abandoned(now);
        }
        self.wake_sleepers(now);
        self.check_subscribing(now, self.closing_since.is_some());
        self.wake_waiters(now);
        self.fire_keep_timers(now);
        self.driver.send(&mut self.engine);
        let idle = self.is_idle();
        let next_keep = self.keep_timers.peek().map(|Reverse((at, _, _))| *at);
        if idle {
            if let Some(since) = self.closing_since {
                // Everything answered; late replies and cleanup within the
                // grace period.
                let deadline = since + shutdown_grace(&self.config);
                self.driver.settle(&mut self.engine, deadline);
                // Orders submitted since this turn took the queue (the
                // releases of dropped futures' locks) take one more turn;
                // with none, later ones are refused to their submitters.
                let ended = Error::Stopped(Arc::from("its last handle was dropped"));
                if queue.end_if_empty(ended) {
                    return Turn::Exit;
                }
                return Turn::Again;
            }
            if self.engine.in_flight() == 0 {
                return Turn::Idle(next_keep);
            }
        }
        let wake = [
            self.engine.poll_timeout(),
            self.timers.next(),
            self.subscribing.iter().map(|(_, at)| *at).min(),
            self.keep_timers.peek().map(|Reverse((at, _, _))| *at),
        ]
        .into_iter()
        .flatten()
        .min();
        // Idle but for late replies (the slowest masters'): read what has
        // come without waiting, and come back for the rest a per-instance
        // timeout later, so that a late -NOSCRIPT to a release is still
        // answered with EVAL while no caller is active.
        // A round that completed as it started (every master down, in its
        // reconnect backoff) has no I/O to come: it is handled below
        // without waiting.
        let timeout = if idle || self.engine.has_completed() {
            Some(Duration::ZERO)
        } else {
            wake.map(|t| t.saturating_duration_since(Instant::now()))
        };
        if let Err(cause) = self.driver.turn(&mut self.engine, timeout) {
            let now = Instant::now();
            for i in 0..self.engine.links() {
                self.engine.handle_failure(i, now, cause.clone());
            }
        }
        self.check_distinct();
        while let Some(id) = self.engine.poll_completed() {
            let Some(&(index, started)) = self.owners.get(id.index()) else {
                continue;
            };
            let ended = Stamp::now();
            let EventLoop {
                engine,
                jobs,
                config,
                names,
                tokens,
                jitter,
                ..
            } = self;
            let (Some(round), Some(Some(running))) = (engine.round(id), jobs.get_mut(index)) else {
                continue;
            };
            let mut ctx = Ctx {
                config,
                names,
                tokens,
                jitter,
            };
            running.in_round = false;
            running.job.handle_round(&mut ctx, round, started, ended);
            self.engine.finish(id);
            self.advance(index, ended.mono);
        }
        self.admit(Instant::now());
        if idle && self.is_idle() {
            self.driver.send(&mut self.engine);
            let soon = Instant::now().checked_add(self.config.per_instance_timeout);
            let until = match (next_keep, soon) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            return Turn::Idle(until);
        }
        Turn::Again
    }

    /// Runs `job` on the calling thread, with the loop idle: its rounds,
    /// sends and outcome, as [`Redlock`](crate::Redlock) runs a job.
    /// [`Ran::Waiting`] when the job would wait to retry: it goes to the
    /// loop then, with the instant it waits for.
    fn run_inline(&mut self, mut job: Job) -> Ran {
        let span = job.span();
        loop {
            let now = Instant::now();
            let EventLoop {
                engine,
                driver,
                config,
                names,
                tokens,
                jitter,
                ..
            } = self;
            let mut ctx = Ctx {
                config,
                names,
                tokens,
                jitter,
            };
            match job.poll(&mut ctx, now) {
                Step::Round {
                    requests,
                    timeout,
                    wait,
                } => {
                    driver.prepare(engine, now);
                    let started = Stamp::now();
                    let id = engine.start(requests, started.mono, timeout, wait);
                    driver.run(engine, id, false);
                    let ended = Stamp::now();
                    engine.end(id);
                    if let Some(round) = engine.round(id) {
                        job.handle_round(&mut ctx, round, started, ended);
                    }
                    engine.free(id);
                    // Idle: the only rounds completed are this one and
                    // releases nobody waits for.
                    while engine.poll_completed().is_some() {}
                    self.check_distinct();
                }
                Step::Send(requests) => {
                    driver.prepare(engine, now);
                    let id = engine.start(requests, now, Duration::ZERO, Wait::Decision);
                    driver.send(engine);
                    engine.finish(id);
                    while engine.poll_completed().is_some() {}
                }
                Step::Sleep(_) | Step::Subscribe(_) | Step::Await { .. } => {
                    return Ran::Waiting(job, span);
                }
                Step::Done => {
                    return match job.take_output(now) {
                        Some(output) => {
                            span.record(output.first_error());
                            Ran::Done(output)
                        }
                        None => Ran::Done(Output::Released(Err(lost()))),
                    };
                }
            }
        }
    }

    /// Starts the orders waiting for room, oldest first, while every
    /// connection that keeps up can take their requests within half of
    /// [`Config::max_in_flight`] (see [`Engine::has_room`]): many callers
    /// at once are a burst every master shares, to be queued here, not a
    /// master lagging alone, which the connection drops as too far behind.
    fn admit(&mut self, now: Instant) {
        let limit = self.config.max_in_flight / 2;
        let patience = self.config.per_instance_timeout;
        while let Some(&(slot, generation)) = self.kept_admitting.front() {
            if !self.engine.has_room(1, limit, now, patience) {
                return;
            }
            self.kept_admitting.pop_front();
            if let Some(Some(kept)) = self.kept.get_mut(slot)
                && kept.generation == generation
            {
                kept.admitting = false;
                self.drive_kept(slot, now);
            }
        }
        while let Some(submission) = self.admitting.front() {
            // A batch over the limit is refused when it is made a job.
            let k = match &submission.order {
                Order::AcquireBatch { resources, .. } => resources.len(),
                Order::ReleaseBatch { locks } => locks.len(),
                _ => 1,
            }
            .min(limit);
            if !self
                .engine
                .has_room(k, limit, now, self.config.per_instance_timeout)
            {
                return;
            }
            if let Some(submission) = self.admitting.pop_front() {
                self.start(submission, now);
            }
        }
    }

    /// Makes `submission` a job and runs it to its first wait.
    fn start(&mut self, submission: Submission, now: Instant) {
        let Submission { order, completion } = submission;
        let order = match order {
            Order::Keep { keeper } => return self.keep(*keeper, now),
            Order::Unkeep { shared } => return self.unkeep(&shared, completion, now),
            order => order,
        };
        match self.make_job(order, now) {
            Ok(mut job) => {
                #[cfg(feature = "test-knobs")]
                if job
                    .resource()
                    .is_some_and(|r| self.config.panic_on_resource.as_deref() == Some(r.as_ref()))
                {
                    panic!("test knob: panic_on_resource");
                }
                // Closing: one attempt, no retries, as for the jobs under
                // way when the last handle went.
                if self.closing_since.is_some() {
                    job.abandon();
                }
                // Behind the local waiters already there, not racing them.
                if job
                    .resource()
                    .is_some_and(|r| self.engine.head(r).is_some())
                {
                    let _ = job.queue_first();
                }
                self.spawn(job, Waiter::Caller(completion), now);
            }
            Err(output) => {
                if let Some(output) = completion.complete(output) {
                    self.release_abandoned(output, now);
                }
            }
        }
    }

    /// The job for `order` (not a keep or unkeep), or the output it ends
    /// with before anything is sent (a setting or argument refused).
    // Both sides are large and short-lived: boxing would allocate per call.
    #[allow(clippy::result_large_err)]
    fn make_job(&mut self, order: Order, now: Instant) -> Result<Job, Output> {
        let mut ctx = Ctx {
            config: &self.config,
            names: &self.names,
            tokens: &mut self.tokens,
            jitter: &mut self.jitter,
        };
        let takes_keys = !matches!(order, Order::Release { .. } | Order::ReleaseBatch { .. });
        let refused = match (&self.same_server, takes_keys) {
            (Some(error), true) => Some(Error::Config(error.clone())),
            _ => None,
        };
        match (order, refused) {
            (Order::Acquire { .. } | Order::AcquireBatch { .. }, Some(error)) => {
                Err(Output::Lock(Err(error)))
            }
            (Order::Extend { lock, .. }, Some(error)) => Err(Output::Extended(lock, Err(error))),
            (
                Order::Acquire {
                    keys,
                    op,
                    ttl,
                    retry,
                },
                None,
            ) => Acquire::new(&mut ctx, keys, op, ttl, &retry, now)
                .map(Job::Acquire)
                .map_err(|e| Output::Lock(Err(e))),
            (Order::Extend { lock, ttl }, None) => {
                match Extend::new(&ctx, lock.clone(), ttl, now) {
                    Ok(extend) => Ok(Job::Extend(extend)),
                    Err(error) => Err(Output::Extended(lock, Err(error))),
                }
            }
            (Order::Release { lock }, _) => Ok(Job::Release(Release::new(&ctx, &lock, now))),
            (Order::AcquireBatch { resources, ttl }, None) => {
                Batch::acquire(&mut ctx, Vec::new(), resources, ttl, now)
                    .map(Job::AcquireBatch)
                    .map_err(|e| Output::Lock(Err(e)))
            }
            (Order::ReleaseBatch { locks }, _) => Ok(Job::ReleaseBatch(Batch::release(
                &ctx,
                Vec::new(),
                &locks,
                now,
            ))),
            // Never made into jobs (see `start`): nothing to do.
            (Order::Keep { .. } | Order::Unkeep { .. }, _) => Err(Output::Released(Ok(()))),
        }
    }

    /// Puts `job` in the table and runs it to its first wait.
    fn spawn(&mut self, job: Job, waiter: Waiter, now: Instant) {
        let span = job.span();
        self.spawn_with(job, waiter, span, now);
    }

    /// [`EventLoop::spawn`] for a job whose span is open already.
    fn spawn_with(&mut self, job: Job, waiter: Waiter, span: OpSpan, now: Instant) {
        let running = Running::new(job, waiter, span);
        let index = match self.free_jobs.pop() {
            Some(index) => {
                self.jobs[index] = running;
                index
            }
            None => {
                self.jobs.push(running);
                self.jobs.len() - 1
            }
        };
        self.advance(index, now);
    }

    /// Runs job `index` until it waits for a round or a timer, or ends.
    fn advance(&mut self, index: usize, now: Instant) {
        loop {
            let EventLoop {
                engine,
                driver,
                jobs,
                config,
                names,
                tokens,
                jitter,
                owners,
                timers,
                subscribing,
                ..
            } = self;
            let Some(Some(running)) = jobs.get_mut(index) else {
                return;
            };
            // A timer or a promotion that comes while the job's round is
            // out waits for the round's outcome.
            if running.in_round {
                return;
            }
            if running.waiter.is_abandoned() {
                running.job.abandon();
            }
            let mut ctx = Ctx {
                config,
                names,
                tokens,
                jitter,
            };
            match running.job.poll(&mut ctx, now) {
                Step::Round {
                    requests,
                    timeout,
                    wait,
                } => {
                    driver.prepare(engine, now);
                    if let Some(resource) = &running.waits_for {
                        running.tried_at = engine.epoch(resource);
                    }
                    let started = Stamp::now();
                    let id = engine.start(requests, started.mono, timeout, wait);
                    if owners.len() <= id.index() {
                        owners.resize(id.index() + 1, (usize::MAX, started));
                    }
                    owners[id.index()] = (index, started);
                    running.in_round = true;
                    return;
                }
                Step::Send(requests) => {
                    if let Some(resource) = &running.waits_for {
                        for request in requests {
                            engine.handle_cleanup(resource, request.token);
                        }
                    }
                    driver.prepare(engine, now);
                    let id = engine.start(requests, now, Duration::ZERO, Wait::Decision);
                    engine.finish(id);
                }
                Step::Sleep(at) => {
                    timers.set(running, index, at);
                    return;
                }
                Step::Subscribe(resource) => {
                    let resource = resource.clone();
                    if running.waits_for.is_none() {
                        engine.join(&resource, index, now);
                        running.waits_for = Some(resource.clone());
                        // Subscriber connections open now, so that the
                        // SUBSCRIBEs leave in this turn's write.
                        driver.prepare(engine, now);
                    }
                    if engine.head(&resource) == Some(index) {
                        let until = now.checked_add(config.connect_timeout).unwrap_or(now);
                        subscribing.push((index, until));
                    } else if let Some(at) = running.job.give_up_at() {
                        // Behind others: promoted when the head leaves,
                        // or done waiting at this instant.
                        timers.set(running, index, at);
                    }
                    return;
                }
                Step::Await { resource, until } => {
                    let at = if engine.epoch(resource) == running.tried_at {
                        running.awaiting = true;
                        until
                    } else {
                        // Released while the attempt was under way.
                        let since = running.job.waiting_since();
                        wake_at(jitter, config.wake_spread, since, now)
                    };
                    timers.set(running, index, at);
                    return;
                }
                Step::Done => {
                    running
                        .job
                        .for_each_released(|key, token| engine.handle_released(key, token));
                    let promoted = match running.waits_for.take() {
                        Some(resource) => engine.leave(&resource, index, now),
                        None => None,
                    };
                    let output = running.job.take_output(now);
                    let finished = jobs[index].take();
                    if let Some(head) = promoted {
                        let until = now.checked_add(config.connect_timeout).unwrap_or(now);
                        subscribing.push((head, until));
                        // Its give-up timer is the subscription's now.
                        if let Some(Some(head)) = jobs.get_mut(head) {
                            timers.cancel(head);
                        }
                    }
                    self.free_jobs.push(index);
                    let (Some(output), Some(finished)) = (output, finished) else {
                        return;
                    };
                    finished.span.record(output.first_error());
                    match finished.waiter {
                        Waiter::Caller(completion) => {
                            if let Some(unclaimed) = completion.complete(output) {
                                self.release_abandoned(unclaimed, now);
                            }
                        }
                        Waiter::Keeper(slot) => self.handle_extended(slot, output, now),
                    }
                    return;
                }
            }
        }
    }

    /// Jobs whose retry wait is over (all of them once closing) go on.
    fn wake_sleepers(&mut self, now: Instant) {
        while let Some(Reverse((at, index, timer))) = self.timers.heap.peek().copied() {
            let abandoned = self
                .jobs
                .get(index)
                .and_then(Option::as_ref)
                .is_some_and(|r| r.waiter.is_abandoned());
            if at > now && !abandoned {
                break;
            }
            self.timers.heap.pop();
            let Some(Some(running)) = self.jobs.get_mut(index) else {
                continue;
            };
            if running.timer != timer {
                continue;
            }
            running.awaiting = false;
            running.job.wake();
            self.advance(index, now);
        }
    }

    /// Jobs whose caller went away, waiting for a timer, a release or
    /// their turn, end now (in the next [`EventLoop::wake_sleepers`]).
    fn wake_abandoned(&mut self, now: Instant) {
        for (index, running) in self.jobs.iter_mut().enumerate() {
            if let Some(running) = running
                && !running.in_round
                && running.waiter.is_abandoned()
            {
                self.timers.set(running, index, now);
            }
        }
    }

    /// Heads of queues whose subscriptions are in place (or past waiting
    /// for) make their attempt.
    fn check_subscribing(&mut self, now: Instant, closing: bool) {
        let mut i = 0;
        while let Some(&(index, until)) = self.subscribing.get(i) {
            let ready = match self.jobs.get(index) {
                Some(Some(running)) => {
                    closing
                        || now >= until
                        || running.waiter.is_abandoned()
                        || running
                            .waits_for
                            .as_ref()
                            .is_none_or(|r| self.engine.is_listening(r, now))
                }
                _ => true,
            };
            if !ready {
                i += 1;
                continue;
            }
            self.subscribing.swap_remove(i);
            if let Some(Some(running)) = self.jobs.get_mut(index) {
                running.job.handle_subscribed();
                self.advance(index, now);
            }
        }
    }

    /// Releases seen since the last call wake the head of each resource's
    /// queue, if it waits for one (one waiting in an attempt compares
    /// epochs when the attempt ends).
    fn wake_waiters(&mut self, now: Instant) {
        while let Some(resource) = self.engine.poll_notified() {
            let Some(head) = self.engine.head(&resource) else {
                continue;
            };
            if let Some(Some(running)) = self.jobs.get_mut(head)
                && running.awaiting
            {
                running.awaiting = false;
                let since = running.job.waiting_since();
                let at = wake_at(&mut self.jitter, self.config.wake_spread, since, now);
                self.timers.set(running, head, at);
            }
        }
    }

    /// Takes a lock to keep, and runs its schedule.
    fn keep(&mut self, keeper: Keeper, now: Instant) {
        self.generations += 1;
        let kept = Some(Kept {
            keeper,
            generation: self.generations,
            extending: false,
            stopping: None,
            admitting: false,
        });
        let slot = match self.free_kept.pop() {
            Some(slot) => {
                self.kept[slot] = kept;
                slot
            }
            None => {
                self.kept.push(kept);
                self.kept.len() - 1
            }
        };
        if let Some(Some(kept)) = self.kept.get(slot) {
            kept.keeper.shared().set_slot(Some(slot));
        }
        self.drive_kept(slot, now);
    }

    /// Runs kept lock `slot`'s schedule: extend it now, or set its timer.
    fn drive_kept(&mut self, slot: usize, now: Instant) {
        // Both clocks: a kept lock's deadline counts suspended time.
        let stamp = Stamp::now();
        loop {
            let Some(Some(kept)) = self.kept.get_mut(slot) else {
                return;
            };
            if kept.extending {
                return;
            }
            match kept.keeper.poll(stamp) {
                KeepStep::Idle => return,
                KeepStep::Wait(at) => {
                    self.keep_timers.push(Reverse((at, slot, kept.generation)));
                    return;
                }
                KeepStep::Extend(ttl) => {
                    // Through the admission every order goes through: a
                    // burst of extensions falling due together must not
                    // push a connection others use past its bound.
                    let limit = self.config.max_in_flight / 2;
                    let patience = self.config.per_instance_timeout;
                    if !self.engine.has_room(1, limit, now, patience) {
                        if !kept.admitting {
                            kept.admitting = true;
                            self.kept_admitting.push_back((slot, kept.generation));
                        }
                        return;
                    }
                    let ctx = Ctx {
                        config: &self.config,
                        names: &self.names,
                        tokens: &mut self.tokens,
                        jitter: &mut self.jitter,
                    };
                    let lock = kept.keeper.lock().clone();
                    let refused = self.same_server.clone().map(Error::Config);
                    let extend = match refused {
                        Some(error) => Err(error),
                        None => kept
                            .keeper
                            .start_extension(ctx.config, ttl, stamp)
                            .and_then(|lock| Extend::new(&ctx, lock, ttl, now)),
                    };
                    match extend {
                        Ok(extend) => {
                            kept.extending = true;
                            self.spawn(Job::Extend(extend), Waiter::Keeper(slot), now);
                            return;
                        }
                        // Refused before anything was sent (the cap, say):
                        // the schedule decides again.
                        Err(error) => {
                            kept.keeper
                                .handle_extended(lock, Err(error), now, ctx.jitter)
                        }
                    }
                }
            }
        }
    }

    /// Kept lock `slot`'s extension ended.
    fn handle_extended(&mut self, slot: usize, output: Output, now: Instant) {
        let Some(Some(kept)) = self.kept.get_mut(slot) else {
            return;
        };
        kept.extending = false;
        if let Output::Extended(lock, result) = output {
            kept.keeper
                .handle_extended(lock, result, now, &mut self.jitter);
        }
        match kept.stopping.take() {
            Some(completion) => self.release_kept(slot, completion, now),
            None => self.drive_kept(slot, now),
        }
    }

    /// Kept locks whose timer is due run their schedule.
    fn fire_keep_timers(&mut self, now: Instant) {
        while let Some(Reverse((at, slot, generation))) = self.keep_timers.peek().copied() {
            if at > now {
                return;
            }
            self.keep_timers.pop();
            let current = self
                .kept
                .get(slot)
                .and_then(Option::as_ref)
                .is_some_and(|k| k.generation == generation);
            if current {
                self.drive_kept(slot, now);
            }
        }
    }

    /// Stops keeping a lock and releases it for `completion`; after the
    /// extension in flight, if one is.
    fn unkeep(&mut self, shared: &Arc<KeepShared>, completion: Promise, now: Instant) {
        let Some(slot) = shared.slot() else {
            // Never kept (or already released): nothing to release.
            completion.complete(Output::Released(Ok(())));
            return;
        };
        match self.kept.get_mut(slot) {
            Some(Some(kept)) if kept.extending => kept.stopping = Some(completion),
            Some(Some(_)) => self.release_kept(slot, completion, now),
            _ => {
                completion.complete(Output::Released(Ok(())));
            }
        }
    }

    /// Forgets kept lock `slot` and releases it for `completion`.
    fn release_kept(&mut self, slot: usize, completion: Promise, now: Instant) {
        let Some(kept) = self.kept.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.free_kept.push(slot);
        kept.keeper.shared().set_slot(None);
        let release = Release::new(
            &Ctx {
                config: &self.config,
                names: &self.names,
                tokens: &mut self.tokens,
                jitter: &mut self.jitter,
            },
            kept.keeper.lock(),
            now,
        );
        self.spawn(Job::Release(release), Waiter::Caller(completion), now);
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
        self.release_abandoned(output, now);
        self.driver.send(&mut self.engine);
    }

    /// An acquire whose caller went away took locks: release them on every
    /// master, nobody waiting for the answers.
    fn release_abandoned(&mut self, output: Output, now: Instant) {
        let release = |lock: &Lock| Request {
            op: release_op(&lock.keys),
            keys: lock.keys.clone(),
            token: lock.token,
            arg: 0,
        };
        let requests: Vec<Request> = match &output {
            Output::Lock(Ok(lock)) => vec![release(lock)],
            Output::Locks(results) => results.iter().flatten().map(release).collect(),
            _ => return,
        };
        metrics::released_unclaimed(requests.len());
        self.driver.prepare(&mut self.engine, now);
        let id = self
            .engine
            .start(&requests, now, Duration::ZERO, Wait::Decision);
        self.engine.finish(id);
    }

    fn check_distinct(&mut self) {
        if let Some((first, second)) = self.engine.poll_same_server()
            && self.same_server.is_none()
        {
            self.same_server = Some(ConfigError::SameServer {
                first: Arc::clone(&self.names[first]),
                second: Arc::clone(&self.names[second]),
            });
        }
    }
}
