//! A minimal single-thread executor for `redlock bench --tasks`: it polls
//! a set of futures on the calling thread and parks between wake-ups, with
//! nothing but `std::task`. It shows that the shared client's futures need
//! no runtime, and measures async callers without one's overhead. Its
//! futures may sleep until an instant ([`sleep_until`]): the open loop's
//! callers (`redlock bench --rate --tasks`) wait so for their
//! operation's intended start, the executor parking until shortly before
//! the earliest and spinning (yielding) the rest.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long before a deadline a waiter stops sleeping and spins
/// (yielding): the kernel's wake-up is late by tens of microseconds on a
/// busy machine, which counts as the generator's own delay. Measured on
/// 2 cores at 10,000/s (8 threads): 20 µs brought the p50 from the
/// intended start from 1.14-1.18x the service p50 to 1.10-1.12x; 40 µs
/// and more made the tail worse, the spinning taking CPU from the
/// masters.
pub(crate) const SPIN: Duration = Duration::from_micros(20);

/// The futures woken since the executor last looked.
struct Ready {
    queue: Mutex<Vec<usize>>,
    executor: Thread,
}

/// Wakes future `index`: queues it and unparks the executor.
struct TaskWaker {
    index: usize,
    ready: Arc<Ready>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.index);
        self.ready.executor.unpark();
    }
}

thread_local! {
    /// The timers of the futures of this thread's executor: (deadline,
    /// future).
    static TIMERS: RefCell<BinaryHeap<Reverse<(Instant, usize)>>> =
        const { RefCell::new(BinaryHeap::new()) };
    /// The future being polled.
    static CURRENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A future ready at `at`; only for futures run by [`run_all`].
pub(crate) fn sleep_until(at: Instant) -> SleepUntil {
    SleepUntil { at }
}

/// See [`sleep_until`].
pub(crate) struct SleepUntil {
    at: Instant,
}

impl Future for SleepUntil {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        let index = CURRENT.with(std::cell::Cell::get);
        TIMERS.with(|t| t.borrow_mut().push(Reverse((self.at, index))));
        Poll::Pending
    }
}

/// Runs every one of `futures` to completion on this thread, waking each
/// at its timers and at its wakers' calls.
pub fn run_all<'a>(mut futures: Vec<Pin<Box<dyn Future<Output = ()> + 'a>>>) {
    let n = futures.len();
    let ready = Arc::new(Ready {
        queue: Mutex::new((0..n).collect()),
        executor: thread::current(),
    });
    let wakers: Vec<Waker> = (0..n)
        .map(|index| {
            Waker::from(Arc::new(TaskWaker {
                index,
                ready: Arc::clone(&ready),
            }))
        })
        .collect();
    let mut done = vec![false; n];
    let mut left = n;
    let mut batch = Vec::with_capacity(n);
    while left > 0 {
        std::mem::swap(
            &mut batch,
            &mut *ready.queue.lock().unwrap_or_else(PoisonError::into_inner),
        );
        let now = Instant::now();
        TIMERS.with(|t| {
            let mut t = t.borrow_mut();
            while t.peek().is_some_and(|Reverse((at, _))| *at <= now) {
                if let Some(Reverse((_, index))) = t.pop() {
                    batch.push(index);
                }
            }
        });
        if batch.is_empty() {
            let next = TIMERS.with(|t| t.borrow().peek().map(|Reverse((at, _))| *at));
            match next.and_then(|at| at.checked_duration_since(now)) {
                None => thread::park(),
                Some(left) => match left.checked_sub(SPIN) {
                    Some(sleep) if !sleep.is_zero() => thread::park_timeout(sleep),
                    _ => thread::yield_now(),
                },
            }
            continue;
        }
        for index in batch.drain(..) {
            if done[index] {
                continue;
            }
            CURRENT.with(|c| c.set(index));
            let mut cx = Context::from_waker(&wakers[index]);
            if let Poll::Ready(()) = futures[index].as_mut().poll(&mut cx) {
                done[index] = true;
                left -= 1;
            }
        }
    }
    TIMERS.with(|t| t.borrow_mut().clear());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn sleepers_wake_in_deadline_order_and_not_before() {
        let start = Instant::now();
        let order = RefCell::new(Vec::new());
        let late = Cell::new(true);
        let futures: Vec<Pin<Box<dyn Future<Output = ()> + '_>>> = [30u64, 10, 20]
            .into_iter()
            .map(|ms| {
                let (order, late) = (&order, &late);
                Box::pin(async move {
                    let at = start + Duration::from_millis(ms);
                    sleep_until(at).await;
                    late.set(late.get() && Instant::now() >= at);
                    order.borrow_mut().push(ms);
                }) as Pin<Box<dyn Future<Output = ()> + '_>>
            })
            .collect();
        run_all(futures);
        assert_eq!(*order.borrow(), [10, 20, 30]);
        assert!(late.get(), "a sleeper woke before its deadline");
    }
}
