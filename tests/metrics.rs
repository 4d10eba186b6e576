//! The `metrics` feature against real masters: a recorder installed for
//! this test binary keeps every value, and each test reads them after
//! known operations: acquires by outcome with their attempts, duration
//! and wait, extends and releases, the locks-held gauge back to zero, a
//! kept lock lost behind its back under its reason, a killed master's
//! connection failures under its own name, and the restart quarantine
//! gauge per master.
//!
//! The recorder is global (the shared client records on its event loop
//! thread), so the tests take turns ([`serial`]) and compare values before
//! and after.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use common::{cluster, connect, eventually};
use metrics::{CounterFn, GaugeFn, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString};
use metrics::{Unit, set_global_recorder};
use redlock_mio::resp::Arg;
use redlock_mio::{Config, Error, KeepOptions, Redlock, Retry, SharedRedlock};

/// Every metric recorded in this process, by name and sorted labels.
#[derive(Default)]
struct Values {
    counters: Mutex<HashMap<String, Arc<Counter>>>,
    gauges: Mutex<HashMap<String, Arc<Gauge>>>,
    histograms: Mutex<HashMap<String, Arc<Histogram>>>,
}

#[derive(Default)]
struct Counter(AtomicU64);

impl CounterFn for Counter {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Gauge(Mutex<f64>);

impl GaugeFn for Gauge {
    fn increment(&self, value: f64) {
        *lock(&self.0) += value;
    }
    fn decrement(&self, value: f64) {
        *lock(&self.0) -= value;
    }
    fn set(&self, value: f64) {
        *lock(&self.0) = value;
    }
}

#[derive(Default)]
struct Histogram(Mutex<Vec<f64>>);

impl HistogramFn for Histogram {
    fn record(&self, value: f64) {
        lock(&self.0).push(value);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `name{a=1,b=2}`, labels sorted: how a test names a metric.
fn render(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

fn render_key(key: &Key) -> String {
    let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
    render(key.name(), &labels)
}

fn entry<T: Default>(map: &Mutex<HashMap<String, Arc<T>>>, key: &Key) -> Arc<T> {
    Arc::clone(lock(map).entry(render_key(key)).or_default())
}

/// The recorder: hands out handles to [`Values`].
struct Keeping(&'static Values);

impl Recorder for Keeping {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(entry(&self.0.counters, key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(entry(&self.0.gauges, key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::from_arc(entry(&self.0.histograms, key))
    }
}

/// The values, the recorder installed on first use.
fn values() -> &'static Values {
    static VALUES: OnceLock<&'static Values> = OnceLock::new();
    VALUES.get_or_init(|| {
        let values: &'static Values = Box::leak(Box::default());
        if set_global_recorder(Keeping(values)).is_err() {
            panic!("another recorder is installed");
        }
        values
    })
}

impl Values {
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        lock(&self.counters)
            .get(&render(name, labels))
            .map_or(0, |c| c.0.load(Ordering::Relaxed))
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        lock(&self.gauges)
            .get(&render(name, labels))
            .map_or(0.0, |g| *lock(&g.0))
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        lock(&self.histograms)
            .get(&render(name, labels))
            .map_or_else(Vec::new, |h| lock(&h.0).clone())
    }

    /// The sum of counter `name` over every series whose labels include
    /// `labels`.
    fn counter_sum(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        lock(&self.counters)
            .iter()
            .filter(|(key, _)| {
                let Some(rest) = key.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else {
                    return false;
                };
                let have: Vec<&str> = rest.trim_end_matches('}').split(',').collect();
                wanted.iter().all(|w| have.contains(&w.as_str()))
            })
            .map(|(_, c)| c.0.load(Ordering::Relaxed))
            .sum()
    }
}

/// One test at a time: the recorder is the process's.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    lock(&SERIAL)
}

const ACQUIRES: &str = "redlock_acquires_total";
const DURATION: &str = "redlock_acquire_duration_seconds";
const WAIT: &str = "redlock_acquire_wait_seconds";
const ATTEMPTS: &str = "redlock_acquire_attempts";
const EXTENDS: &str = "redlock_extends_total";
const RELEASES: &str = "redlock_releases_total";
const HELD: &str = "redlock_locks_held";
const LOST: &str = "redlock_locks_lost_total";
const FAILURES: &str = "redlock_master_failures_total";
const QUARANTINED: &str = "redlock_master_quarantined";

const OK: &[(&str, &str)] = &[("outcome", "ok")];
const HELD_ELSEWHERE: &[(&str, &str)] = &[("outcome", "held")];

/// Settings for masters the test started empty: no restart quarantine (no
/// lock predates them), generous time limits for a loaded machine, and no
/// wait for release notifications, so that a retrying acquire makes
/// exactly its attempts.
fn config(urls: &[String]) -> Config {
    let mut config = Config::new(urls).unwrap_or_else(|e| panic!("{e}"));
    config.quarantine = None;
    config.per_instance_timeout = Duration::from_millis(300);
    config.connect_timeout = Duration::from_secs(2);
    config.wake_on_release = false;
    config
}

fn client(config: Config) -> Redlock {
    let mut client = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    client.warm_up(Duration::from_secs(5));
    client
}

/// Each master's name as the `master` label gives it: its URL, password
/// hidden.
fn names(config: &Config) -> Vec<String> {
    config.servers.iter().map(ToString::to_string).collect()
}

#[test]
fn acquires_extends_and_releases_are_counted_by_outcome_with_attempts_and_times() {
    let _serial = serial();
    let v = values();
    let masters = cluster(3);
    let mut redlock = client(config(&masters.urls()));
    let held_before = v.gauge(HELD, &[]);
    let (ok, refused) = (v.counter(ACQUIRES, OK), v.counter(ACQUIRES, HELD_ELSEWHERE));
    let ok_attempts = v.histogram(ATTEMPTS, OK).len();
    let waits = v.histogram(WAIT, &[]).len();

    let mut lock = redlock
        .try_acquire("metrics:a", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v.counter(ACQUIRES, OK), ok + 1);
    assert_eq!(v.histogram(ATTEMPTS, OK)[ok_attempts..], [1.0]);
    let duration = *v.histogram(DURATION, OK).last().expect("a duration");
    assert!(duration > 0.0 && duration < 5.0, "duration {duration} s");
    let wait = v.histogram(WAIT, &[])[waits..].to_vec();
    assert!(
        wait.len() == 1 && wait[0] <= duration,
        "a first attempt that wins waits (next to) nothing: {wait:?}, duration {duration} s"
    );
    assert_eq!(v.gauge(HELD, &[]), held_before + 1.0);

    // Refused at once, then after three attempts.
    let refused_attempts = v.histogram(ATTEMPTS, HELD_ELSEWHERE).len();
    let got = redlock.try_acquire("metrics:a", Duration::from_secs(10));
    assert!(matches!(got, Err(Error::Held(_))), "{got:?}");
    let retry = Retry::default()
        .with_attempts(3)
        .with_delay(Duration::from_millis(20))
        .with_max_wait(None);
    let got = redlock.acquire_with("metrics:a", Duration::from_secs(10), &retry);
    assert!(matches!(got, Err(Error::Held(_))), "{got:?}");
    assert_eq!(v.counter(ACQUIRES, HELD_ELSEWHERE), refused + 2);
    assert_eq!(
        v.histogram(ATTEMPTS, HELD_ELSEWHERE)[refused_attempts..],
        [1.0, 3.0]
    );
    assert_eq!(
        v.gauge(HELD, &[]),
        held_before + 1.0,
        "refusals hold nothing"
    );

    // An acquire that waits for a short lock to expire: several attempts,
    // and a wait of most of the lock's TTL.
    let short = redlock
        .try_acquire("metrics:b", Duration::from_millis(300))
        .unwrap_or_else(|e| panic!("{e}"));
    let patient = Retry::default()
        .with_attempts(100)
        .with_delay(Duration::from_millis(20))
        .with_max_wait(Some(Duration::from_secs(5)));
    let after = redlock
        .acquire_with("metrics:b", Duration::from_secs(10), &patient)
        .unwrap_or_else(|e| panic!("{e}"));
    let attempts = *v.histogram(ATTEMPTS, OK).last().expect("attempts");
    let wait = *v.histogram(WAIT, &[]).last().expect("a wait");
    assert!(attempts > 1.0, "{attempts} attempts");
    assert!(wait >= 0.1, "waited {wait} s for a 300 ms lock");
    assert_eq!(v.gauge(HELD, &[]), held_before + 3.0);

    let extended = v.counter(EXTENDS, OK);
    redlock
        .extend(&mut lock, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v.counter(EXTENDS, OK), extended + 1);

    // The expired lock's release finds it taken: not held, and not held
    // any more by this process either.
    let (released, not_held) = (
        v.counter(RELEASES, OK),
        v.counter(RELEASES, &[("outcome", "not_held")]),
    );
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&after).unwrap_or_else(|e| panic!("{e}"));
    let got = redlock.release(&short);
    assert!(matches!(got, Err(Error::NotHeld(_))), "{got:?}");
    assert_eq!(v.counter(RELEASES, OK), released + 2);
    assert_eq!(
        v.counter(RELEASES, &[("outcome", "not_held")]),
        not_held + 1
    );
    assert_eq!(v.gauge(HELD, &[]), 0.0, "every lock released");
}

#[test]
fn batches_count_each_resource() {
    let _serial = serial();
    let v = values();
    let masters = cluster(3);
    let mut redlock = client(config(&masters.urls()));
    let (ok, refused) = (v.counter(ACQUIRES, OK), v.counter(ACQUIRES, HELD_ELSEWHERE));
    let released = v.counter(RELEASES, OK);
    let first = redlock
        .try_acquire("metrics:batch:1", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    let results = redlock
        .try_acquire_batch(
            ["metrics:batch:1", "metrics:batch:2", "metrics:batch:3"],
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v.counter(ACQUIRES, OK), ok + 3);
    assert_eq!(v.counter(ACQUIRES, HELD_ELSEWHERE), refused + 1);
    let mut locks: Vec<_> = results.into_iter().flatten().collect();
    locks.push(first);
    assert!(redlock.release_batch(&locks).iter().all(Result::is_ok));
    assert_eq!(v.counter(RELEASES, OK), released + 3);
    assert_eq!(v.gauge(HELD, &[]), 0.0, "every lock released");
}

#[test]
fn a_kept_lock_lost_behind_its_back_is_counted_under_its_reason() {
    let _serial = serial();
    let v = values();
    let masters = cluster(3);
    let mut config = config(&masters.urls());
    config.per_instance_timeout = Duration::from_millis(250);
    let redlock = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let not_held = [("reason", "not_held")];
    let (lost, extends_refused) = (
        v.counter(LOST, &not_held),
        v.counter(EXTENDS, &[("outcome", "not_held")]),
    );
    let lock = redlock
        .acquire("metrics:kept", Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("{e}"));
    let kept = redlock
        .keep(lock, KeepOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    for master in masters.iter() {
        connect(master).cmd(&[Arg::Bytes(b"DEL"), Arg::Bytes(b"metrics:kept")]);
    }
    assert!(
        eventually(Duration::from_secs(5), || kept.lost().is_some()),
        "never lost"
    );
    assert_eq!(v.counter(LOST, &not_held), lost + 1);
    assert_eq!(
        v.counter(EXTENDS, &[("outcome", "not_held")]),
        extends_refused + 1
    );
    let got = kept.release();
    assert!(matches!(got, Err(Error::NotHeld(_))), "{got:?}");
    assert_eq!(v.gauge(HELD, &[]), 0.0, "the lost lock was released");
}

#[test]
fn a_killed_master_counts_its_failures_under_its_own_name() {
    let _serial = serial();
    let v = values();
    let mut masters = cluster(3);
    let config = config(&masters.urls());
    let names = names(&config);
    let mut redlock = client(config);
    let failures = |i: usize| v.counter_sum(FAILURES, &[("master", &names[i])]);
    let before: Vec<u64> = (0..3).map(failures).collect();
    masters[2].kill().unwrap_or_else(|e| panic!("{e}"));
    // Two of three still make a quorum; the third's vote fails.
    let lock = redlock
        .try_acquire("metrics:down", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(failures(0), before[0]);
    assert_eq!(failures(1), before[1]);
    // The round may be decided before the killed master's connection is
    // seen to fail: its late replies are read here.
    assert!(
        eventually(Duration::from_secs(5), || {
            redlock.settle(Duration::from_millis(50));
            failures(2) > before[2]
        }),
        "no failure counted for {}",
        names[2]
    );
    // Every failure of the killed master has a cause the label names.
    let by_cause: u64 = ["closed", "io", "connect", "connect_timeout", "stalled"]
        .iter()
        .map(|cause| v.counter(FAILURES, &[("master", &names[2]), ("cause", cause)]))
        .sum();
    assert_eq!(by_cause, failures(2));
}

#[test]
fn restart_quarantine_is_a_gauge_per_master() {
    let _serial = serial();
    let v = values();
    let masters = cluster(3);
    let base = config(&masters.urls());
    let names = names(&base);
    let gauges = || -> Vec<f64> {
        (0..3)
            .map(|i| v.gauge(QUARANTINED, &[("master", &names[i])]))
            .collect()
    };
    let with_quarantine = |max_ttl: u64| {
        let mut config = base.clone();
        config.quarantine = Some(Duration::from_secs(max_ttl));
        client(config)
    };
    // The masters have just started: a client with restart quarantine
    // keeps each out until the largest TTL has passed since its start.
    // The gauge counts the clients that do.
    let long = with_quarantine(60);
    assert_eq!(gauges(), [1.0; 3], "after the first client's handshakes");
    let mut short = with_quarantine(4);
    assert_eq!(gauges(), [2.0; 3], "after the second client's");
    // The short quarantine ends with time, seen at the client's next
    // round; the long one goes on.
    let ended = eventually(Duration::from_secs(10), || {
        if let Ok(lock) = short.try_acquire("metrics:quarantine", Duration::from_secs(1)) {
            let _ = short.release(&lock);
        }
        gauges() == [1.0; 3]
    });
    assert!(ended, "{:?}", gauges());
    // A client that goes away stops counting its masters.
    drop(long);
    assert_eq!(gauges(), [0.0; 3], "gone with its client");
    drop(short);
    assert_eq!(gauges(), [0.0; 3]);
}

/// Each `-NOSCRIPT` recovered from is counted, by how.
#[test]
fn noscript_recoveries_are_counted_by_how() {
    let _serial = serial();
    let v = values();
    let masters = cluster(3);
    let mut redlock = client(config(&masters.urls()));
    const RECOVERIES: &str = "redlock_noscript_recoveries_total";
    let before = v.counter(RECOVERIES, &[("via", "script_load")]);
    let evals = v.counter(RECOVERIES, &[("via", "eval")]);
    for m in masters.iter() {
        connect(m).cmd(&[Arg::Bytes(b"SCRIPT"), Arg::Bytes(b"FLUSH")]);
    }
    let lock = redlock
        .try_acquire("metrics:noscript", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    redlock.settle(Duration::from_secs(10));
    assert_eq!(
        v.counter(RECOVERIES, &[("via", "script_load")]),
        before + 3,
        "one per master"
    );
    assert_eq!(v.counter(RECOVERIES, &[("via", "eval")]), evals);
}
