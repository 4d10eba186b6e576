//! What a bench caller needs beside its measurements, shared by the
//! closed loop (`bench`) and the open one (`openloop`): its client (its
//! own, or a handle to the shared one) and its picks of resources. Owns no
//! timing and no report.

use std::time::Duration;

use bytes::Bytes;
use redlock_mio::{Error, Lock, Redlock, Retry, SharedRedlock};

/// xorshift64*: enough to spread picks over R resources.
pub(crate) struct Pick(pub(crate) u64);

impl Pick {
    /// Moves `k` distinct entries of `order`, drawn uniformly, to its
    /// front (a partial Fisher-Yates shuffle) and returns them.
    pub(crate) fn distinct<'a, T>(&mut self, order: &'a mut [T], k: usize) -> &'a [T] {
        let k = k.min(order.len());
        for i in 0..k {
            let j = i + self.below(order.len() - i);
            order.swap(i, j);
        }
        &order[..k]
    }

    /// One of `names`, drawn uniformly (the only one, without a draw).
    pub(crate) fn resource(&mut self, names: &[Bytes]) -> Bytes {
        let index = if names.len() == 1 {
            0
        } else {
            self.below(names.len())
        };
        names[index].clone()
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        // n fits in u64; the modulo bias is irrelevant for a benchmark.
        usize::try_from(r % n as u64).unwrap_or(0)
    }
}

/// A bench thread's client: its own, or a handle to the shared one.
// One per thread, made once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Client {
    Own(Redlock),
    Shared(SharedRedlock),
}

impl Client {
    pub(crate) fn acquire_with(
        &mut self,
        resource: Bytes,
        ttl: Duration,
        retry: &Retry,
    ) -> Result<Lock, Error> {
        match self {
            Client::Own(c) => c.acquire_with(resource, ttl, retry),
            Client::Shared(c) => c.acquire_with(resource, ttl, retry),
        }
    }

    pub(crate) fn try_acquire(&mut self, resource: Bytes, ttl: Duration) -> Result<Lock, Error> {
        match self {
            Client::Own(c) => c.try_acquire(resource, ttl),
            Client::Shared(c) => c.try_acquire(resource, ttl),
        }
    }

    pub(crate) fn release(&mut self, lock: &Lock) -> Result<(), Error> {
        match self {
            Client::Own(c) => c.release(lock),
            Client::Shared(c) => c.release(lock),
        }
    }

    pub(crate) fn try_acquire_batch(
        &mut self,
        resources: &[Bytes],
        ttl: Duration,
    ) -> Result<Vec<Result<Lock, Error>>, Error> {
        match self {
            Client::Own(c) => c.try_acquire_batch(resources.iter().cloned(), ttl),
            Client::Shared(c) => c.try_acquire_batch(resources.iter().cloned(), ttl),
        }
    }

    pub(crate) fn release_batch(&mut self, locks: &[Lock]) -> Vec<Result<(), Error>> {
        match self {
            Client::Own(c) => c.release_batch(locks),
            Client::Shared(c) => c.release_batch(locks),
        }
    }
}
