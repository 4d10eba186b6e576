//! The shared client's event loop never dies silently,
//! against real masters: a panic in user code the loop calls (here, the
//! application's metrics recorder) costs a metric, not the client; and a
//! panic the loop cannot catch where it happens (a test knob stands for a
//! bug) ends every operation under way and every later one at once with
//! `Error::Stopped`, reports every kept lock lost, and lets every handle,
//! future and watchdog be dropped.
//!
//! Its own test binary: the recorder is process-wide.

mod common;

use std::sync::Once;
use std::time::Duration;

use common::{block_on, cluster, shared_config as config, within};
use metrics::{Key, KeyName, Metadata, Recorder, SharedString, Unit};
use redlock_mio::SharedRedlock;

/// A recorder that panics whenever the client registers a metric.
struct Panicking;

impl Recorder for Panicking {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> metrics::Counter {
        panic!("the application's recorder panics")
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> metrics::Gauge {
        panic!("the application's recorder panics")
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> metrics::Histogram {
        panic!("the application's recorder panics")
    }
}

fn install_panicking_recorder() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if metrics::set_global_recorder(Panicking).is_err() {
            panic!("another recorder is installed");
        }
    });
}

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn a_panicking_metrics_recorder_costs_a_metric_not_the_client() {
    install_panicking_recorder();
    let masters = cluster(3);
    let redlock = SharedRedlock::new(config(&masters.urls())).unwrap_or_else(|e| panic!("{e}"));
    let on_loop = redlock.clone();
    // Futures run on the loop thread; blocking calls alone run inline.
    let done = within(LIMIT, move || {
        let lock = block_on(on_loop.acquire_async("recorded", Duration::from_secs(10)))?;
        block_on(on_loop.release_async(&lock))?;
        let lock = on_loop.acquire("recorded", Duration::from_secs(10))?;
        on_loop.release(&lock)
    });
    match done {
        Some(result) => result.unwrap_or_else(|e| panic!("{e}")),
        None => panic!("the client hung after its recorder panicked"),
    }
}

#[cfg(redlock_sim)]
#[test]
fn a_panic_on_the_loop_ends_every_call_at_once_and_is_never_silent() {
    use common::hold_elsewhere;
    use redlock_mio::{Error, KeepOptions, LostReason, Retry};

    install_panicking_recorder();
    let masters = cluster(3);
    hold_elsewhere(masters.iter(), "held", 600_000);
    let mut config = config(&masters.urls());
    redlock_mio::sim::knobs::panic_on_resource(&mut config, bytes::Bytes::from_static(b"boom"));
    let redlock = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let kept = redlock
        .try_acquire("kept", Duration::from_secs(30))
        .and_then(|lock| redlock.keep(lock, KeepOptions::default()))
        .unwrap_or_else(|e| panic!("{e}"));
    let waiting = redlock.acquire_with_async(
        "held",
        Duration::from_secs(10),
        &Retry::until(Duration::from_secs(3600)),
    );
    let boom = redlock.acquire_async("boom", Duration::from_secs(10));
    let stopped =
        |got: &Result<_, Error>| matches!(got, Err(Error::Stopped(why)) if why.contains("panic"));
    let got =
        within(LIMIT, move || block_on(boom)).expect("the order that panicked the loop ended");
    assert!(stopped(&got), "{got:?}");
    let got = within(LIMIT, move || block_on(waiting)).expect("a waiting order ended at once");
    assert!(stopped(&got), "{got:?}");
    // Reported as the loop ends, which may be a moment after the futures
    // it was running learnt of it.
    let reported = common::eventually(LIMIT, || kept.lost().is_some());
    let lost = kept.lost();
    assert!(
        reported
            && matches!(&lost, Some(l) if matches!(&l.reason, LostReason::Failed(Error::Stopped(_)))),
        "{lost:?}"
    );
    let later = redlock.clone();
    let got = within(LIMIT, move || {
        later.try_acquire("later", Duration::from_secs(10))
    })
    .expect("a later blocking call ended at once");
    assert!(stopped(&got), "{got:?}");
    let later = redlock.clone();
    let got = within(LIMIT, move || {
        block_on(later.acquire_async("later", Duration::from_secs(10)))
    })
    .expect("a later future ended at once");
    assert!(stopped(&got), "{got:?}");
    assert!(
        within(LIMIT, move || drop(kept)).is_some(),
        "dropping the watchdog hung"
    );
    assert!(
        within(LIMIT, move || drop(redlock)).is_some(),
        "dropping the client hung"
    );
}
