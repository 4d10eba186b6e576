//! What a cancelled or abandoned operation leaves behind, against real
//! masters: the contract SAFETY.md states for each kind of
//! operation (acquire, extend, release, keep) when its future is dropped
//! or its client goes away, at each point it can be dropped.

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use common::{cluster, connect, eventually, hold_elsewhere, within};
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

/// A lock taken for 30 s; two of three masters stalled;
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

/// Acquires submitted just before the last handle goes,
/// waiting for a lock another client holds with `Retry::until(1 h)`: the
/// drop must not block for the hour. Every order ends at shutdown, those
/// the loop takes as it closes included: one attempt, no retries.
///
/// To have the loop take those orders in the turn that sees the close, a
/// blocking call holds the loop's state meanwhile: it runs on its own
/// thread (the loop is idle) and waits for two stopped masters.
#[test]
fn dropping_the_last_handle_ends_the_orders_submitted_just_before() {
    let mut masters = cluster(3);
    hold_elsewhere(masters.iter(), "held", 600_000);
    let mut config = config(&masters.urls());
    config.per_instance_timeout = Duration::from_secs(2);
    let redlock = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    assert!(redlock.try_acquire("warm", Duration::from_secs(10)).is_ok());
    masters[1].pause().unwrap_or_else(|e| panic!("{e}"));
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    let inline = redlock.clone();
    let busy = std::thread::spawn(move || inline.try_acquire("busy", Duration::from_secs(10)));
    // Its SET reached master 0: it is in its round, holding the loop.
    assert!(eventually(Duration::from_secs(20), || pttl(
        &masters[0],
        "busy"
    ) > 0));
    let hour = redlock_mio::Retry::until(Duration::from_secs(3600));
    let waiting: Vec<_> = (0..20)
        .map(|_| redlock.acquire_with_async("held", Duration::from_secs(10), &hour))
        .collect();
    let dropped = within(Duration::from_secs(60), move || drop(redlock));
    masters[1].resume().unwrap_or_else(|e| panic!("{e}"));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        dropped.is_some(),
        "dropping the last handle blocked on an hour-long wait"
    );
    assert!(busy.join().is_ok());
    for future in waiting {
        let Poll::Ready(got) = poll_once(future) else {
            panic!("an order still pending after the loop ended");
        };
        assert!(got.is_err(), "someone else holds it: {got:?}");
    }
}

/// An acquire wins, its future is never polled again,
/// the last handle goes (the loop ends), then the future is dropped: the
/// lock it won must get a release attempt, not be left for its whole TTL
/// (60 s here). Before, the release went to a queue nobody read.
#[test]
fn a_won_lock_whose_future_is_dropped_after_the_loop_ended_is_released() {
    let masters = cluster(3);
    let redlock = SharedRedlock::new(config(&masters.urls())).unwrap_or_else(|e| panic!("{e}"));
    let won = redlock.try_acquire_async("won", Duration::from_secs(60));
    let set = eventually(Duration::from_secs(20), || {
        masters.iter().all(|m| pttl(m, "won") > 0)
    });
    assert!(set, "the acquire never took the lock");
    drop(redlock);
    drop(won);
    let released = eventually(Duration::from_secs(20), || {
        masters.iter().all(|m| pttl(m, "won") == -2)
    });
    assert!(
        released,
        "the lock is left for its TTL: PTTL {:?}",
        masters.iter().map(|m| pttl(m, "won")).collect::<Vec<_>>()
    );
}
