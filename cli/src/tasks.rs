//! A minimal single-thread executor for `redlock bench --tasks`: it polls
//! a set of futures on the calling thread and parks between wake-ups, with
//! nothing but `std::task`. It shows that the shared client's futures need
//! no runtime, and measures async callers without one's overhead.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

/// The futures woken since the executor last looked (this executor's,
/// and the open loop's with timers, `openloop/exec.rs`).
pub(crate) struct Ready {
    pub(crate) queue: Mutex<Vec<usize>>,
    pub(crate) executor: Thread,
}

/// Wakes future `index`: queues it and unparks the executor.
pub(crate) struct TaskWaker {
    pub(crate) index: usize,
    pub(crate) ready: Arc<Ready>,
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

/// Runs every one of `futures` to completion on this thread.
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
        if batch.is_empty() {
            thread::park();
            continue;
        }
        for index in batch.drain(..) {
            if done[index] {
                continue;
            }
            let mut cx = Context::from_waker(&wakers[index]);
            if let Poll::Ready(()) = futures[index].as_mut().poll(&mut cx) {
                done[index] = true;
                left -= 1;
            }
        }
    }
}
