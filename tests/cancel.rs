//! What a cancelled or abandoned operation leaves behind, against real
//! masters: the contract README and SAFETY.md state for each kind of
//! operation (acquire, extend, release, keep) when its future is dropped
//! or its client goes away, at each point it can be dropped.

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use common::{cluster, connect, eventually};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::{Config, SharedRedlock};

/// Settings for masters the test started empty (no restart quarantine),
/// with time limits a loaded machine cannot reach.
fn config(urls: &[String]) -> Config {
    let mut config = Config::new(urls).unwrap_or_else(|e| panic!("{e}"));
    config.per_instance_timeout = Duration::from_secs(10);
    config.connect_timeout = Duration::from_secs(10);
    config.quarantine = None;
    config
}

struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// Polls `future` once, as an executor would before a timeout fires.
fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    let waker = Waker::from(Arc::new(Noop));
    pin!(future).as_mut().poll(&mut Context::from_waker(&waker))
}

fn pttl(server: &redlock_test::Server, key: &str) -> i64 {
    match connect(server).cmd(&[Arg::Bytes(b"PTTL"), Arg::Bytes(key.as_bytes())]) {
        Reply::Integer(ms) => ms,
        other => panic!("PTTL {key}: {other:?}"),
    }
}

/// Issue 20, item 1: a lock taken for 30 s; two of three masters stalled;
/// `extend_async(&mut lock, 2 s)` polled once, then dropped (as
/// `tokio::time::timeout` drops it). Once the masters resume they run the
/// script and the keys expire within 2 s, so the lock must not claim more:
/// the extend shortened it before anything was sent.
#[test]
fn a_dropped_extend_leaves_the_lock_no_longer_than_the_keys() {
    let mut masters = cluster(3);
    let redlock = SharedRedlock::new(config(&masters.urls())).unwrap_or_else(|e| panic!("{e}"));
    let mut lock = redlock
        .try_acquire("cancelled-extend", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    masters[1].pause().unwrap_or_else(|e| panic!("{e}"));
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    let polled = poll_once(redlock.extend_async(&mut lock, Duration::from_secs(2)));
    assert!(polled.is_pending(), "two of three masters are stopped");
    masters[1].resume().unwrap_or_else(|e| panic!("{e}"));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    // The masters ran the script after all: the keys now expire within 2 s.
    let ran = eventually(Duration::from_secs(20), || {
        masters.iter().all(|m| pttl(m, "cancelled-extend") <= 2000)
    });
    assert!(ran, "the stopped masters never ran the extend");
    assert!(
        lock.remaining() <= Duration::from_secs(2),
        "the lock claims {:?} of validity; its keys expire within 2 s",
        lock.remaining()
    );
}
