//! The watchdog against real local masters: a kept lock (single or
//! multi-resource) outlives its TTL many times over and keeps other
//! clients out; a majority going away, a refused extension and the
//! extension cap are each reported with validity left, through `lost()`,
//! the channel and the callback; nothing is extended after `release()` or
//! drop, which return at once.
//!
//! Bounds are generous so that a loaded machine slows the tests without
//! failing them: what is asserted is the order of events (reported before
//! the validity ends, gone before the TTL would have expired it), not
//! speed.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Cluster, bulk, cluster, connect, eventually};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::{
    Config, ConfigError, Error, KeepOptions, Lock, LostReason, Redlock, Retry, Token, Watchdog,
};

/// How long a round may wait for the masters: short next to the TTLs used,
/// long enough for a loaded machine.
const ROUND: Duration = Duration::from_millis(250);
/// The TTL of the kept locks: short, so that they are extended often, yet
/// long enough that a failed extension has time for retries on a loaded
/// machine (from a third of the TTL gone until a third of it plus a round
/// is left: 417 ms).
const TTL: Duration = Duration::from_secs(2);
/// How long a poll for a state change on the masters may take.
const WAIT: Duration = Duration::from_secs(5);

fn config(urls: &[String]) -> Config {
    let mut config = Config::new(urls).unwrap_or_else(|e| panic!("{e}"));
    // The test's masters start empty: no lock predates them, and restart
    // quarantine would only keep them out at first.
    config.quarantine = None;
    config.per_instance_timeout = ROUND;
    config.connect_timeout = Duration::from_secs(2);
    config.retry = Retry::default()
        .with_attempts(100)
        .with_delay(Duration::from_millis(50))
        .with_max_wait(Some(WAIT));
    config
}

fn client(urls: &[String]) -> Redlock {
    Redlock::new(config(urls)).unwrap_or_else(|e| panic!("{e}"))
}

/// Acquires `resource` for `ttl` and hands it to a watchdog.
fn keep(masters: &Cluster, resource: &str, ttl: Duration, options: KeepOptions) -> Watchdog {
    let mut redlock = client(&masters.urls());
    let lock = redlock
        .acquire(resource.to_owned(), ttl)
        .unwrap_or_else(|e| panic!("acquire {resource}: {e}"));
    Watchdog::keep(redlock.config().clone(), lock, options).unwrap_or_else(|e| panic!("{e}"))
}

fn get_all(masters: &Cluster, key: &str) -> Vec<Reply> {
    masters
        .iter()
        .map(|m| connect(m).cmd(&["GET".into(), key.into()]))
        .collect()
}

/// Checks that a quorum holds `key` with `token` and no master holds
/// another value.
fn assert_held(masters: &Cluster, key: &str, token: &Token) {
    let values = get_all(masters, key);
    assert!(
        values
            .iter()
            .all(|v| *v == Reply::Nil || *v == bulk(token.as_str())),
        "{key} holds another token: {values:?}"
    );
    let holding = values
        .iter()
        .filter(|v| **v == bulk(token.as_str()))
        .count();
    assert!(
        holding > masters.len() / 2,
        "{key} should be held by {token}: {values:?}"
    );
}

/// Waits, at most `limit`, until no master holds `key`.
fn wait_gone(masters: &Cluster, key: &str, limit: Duration) {
    assert!(
        eventually(limit, || get_all(masters, key)
            .iter()
            .all(|v| *v == Reply::Nil)),
        "{key} should be gone: {:?}",
        get_all(masters, key)
    );
}

/// Sets `key` to `value` on every master for `ttl`, as a holder of that
/// value would.
fn set_all(masters: &Cluster, key: &str, value: &str, ttl: Duration) {
    let ms = ttl.as_millis().to_string();
    for m in masters.iter() {
        let reply = connect(m).cmd(&[
            "SET".into(),
            key.into(),
            value.into(),
            "PX".into(),
            Arg::Bytes(ms.as_bytes()),
        ]);
        assert!(reply.is_ok(), "SET on {}: {reply:?}", m.url());
    }
}

/// Checks that nobody extends `key` for `token` any more: keys put back
/// with that token and a 1 s TTL expire on their own.
fn assert_not_extended(masters: &Cluster, key: &str, token: &Token) {
    set_all(masters, key, token.as_str(), Duration::from_secs(1));
    wait_gone(masters, key, WAIT);
}

#[test]
fn a_kept_lock_outlives_several_ttls_and_keeps_others_out() {
    let masters = cluster(3);
    let ttl = TTL;
    let kept = keep(&masters, "kept", ttl, KeepOptions::default());
    let token = *kept.token();
    let mut contender = client(&masters.urls());
    let started = Instant::now();
    while started.elapsed() < ttl * 7 / 2 {
        assert!(
            kept.is_held(),
            "lost after {:?}: {:?}",
            started.elapsed(),
            kept.lost()
        );
        let got = contender.try_acquire("kept", ttl);
        assert!(got.is_err(), "a second client took a kept lock: {got:?}");
        thread::sleep(Duration::from_millis(200));
    }
    assert!(kept.is_held(), "{:?}", kept.lost());
    assert_eq!(kept.lost(), None);
    assert!(
        kept.extensions() >= 3,
        "{} extensions in {:?}",
        kept.extensions(),
        ttl * 7 / 2
    );
    let remaining = kept.remaining();
    assert!(
        !remaining.is_zero() && remaining <= ttl,
        "remaining {remaining:?}"
    );
    assert_eq!(kept.deadline(), kept.lock().deadline());
    assert_held(&masters, "kept", &token);

    kept.release().expect("release");
    wait_gone(&masters, "kept", WAIT);
    let lock = contender.acquire("kept", ttl).expect("free after release");
    contender.release(&lock).expect("release");
}

#[test]
fn a_multi_resource_lock_is_kept_whole() {
    let masters = cluster(3);
    let ttl = TTL;
    let mut redlock = client(&masters.urls());
    let retry = redlock.config().retry;
    let lock = redlock
        .acquire_many_with(["set:a", "set:b"], ttl, &retry)
        .expect("acquire both");
    let kept =
        Watchdog::keep(redlock.config().clone(), lock, KeepOptions::default()).expect("keep");
    let token = *kept.token();
    // Held for more than two TTLs.
    thread::sleep(ttl * 5 / 2);
    assert!(kept.is_held(), "{:?}", kept.lost());
    assert_eq!(kept.lock().resources().len(), 2);
    assert_held(&masters, "set:a", &token);
    assert_held(&masters, "set:b", &token);
    kept.release().expect("release");
    wait_gone(&masters, "set:a", WAIT);
    wait_gone(&masters, "set:b", WAIT);
}

#[test]
fn a_majority_going_away_is_reported_with_validity_left_through_every_channel() {
    let mut masters = cluster(3);
    let ttl = Duration::from_secs(3);
    let period = ttl / 3;
    let (called, from_callback) = mpsc::channel();
    let options = KeepOptions::default().on_lost(move |lost| {
        let _ = called.send(lost);
    });
    let kept = keep(&masters, "stalled", ttl, options);
    let channel = kept.subscribe();
    assert!(
        eventually(WAIT, || kept.extensions() >= 1),
        "never extended: {:?}",
        kept.last_error()
    );

    masters[0].pause().expect("pausing master 0");
    masters[1].pause().expect("pausing master 1");
    let paused = Instant::now();
    let lost = channel.recv_timeout(ttl + WAIT);
    let took = paused.elapsed();
    masters[0].resume().expect("resuming master 0");
    masters[1].resume().expect("resuming master 1");
    let lost = lost.expect("no loss reported");

    assert!(
        matches!(lost.reason, LostReason::Failed(Error::NoQuorum(_))),
        "{lost}"
    );
    // Reported while mutual exclusion still held, with about one period to
    // spare (less a round in flight), and at most ttl - period after the
    // majority went away (plus that round, plus slack).
    assert!(lost.at < lost.deadline, "reported too late: {lost}");
    // (The slack is for a keeper thread scheduled late: reporting in time
    // is its promise only when it runs when it should.)
    assert!(lost.left_when_reported() >= period / 4, "{lost}");
    assert!(
        took <= ttl - period + ROUND + Duration::from_secs(2),
        "took {took:?}: {lost}"
    );
    assert_eq!(kept.lost().as_ref(), Some(&lost));
    assert!(!kept.is_held());
    assert!(kept.last_error().is_some());
    let called = from_callback.recv_timeout(WAIT).expect("callback not run");
    assert_eq!(called, lost);
    assert_eq!(
        kept.subscribe().recv_timeout(Duration::ZERO).as_ref(),
        Ok(&lost),
        "a late subscriber gets the report at once"
    );
    drop(kept);
    wait_gone(&masters, "stalled", ttl + WAIT);
}

#[test]
fn a_refused_extension_is_a_loss_at_once() {
    let masters = cluster(3);
    let ttl = TTL;
    let period = ttl / 3;
    let kept = keep(&masters, "taken", ttl, KeepOptions::default());
    let lost = kept.subscribe();
    assert!(
        eventually(WAIT, || kept.extensions() >= 1),
        "never extended: {:?}",
        kept.last_error()
    );
    // As if the keys had expired and another client had taken them.
    set_all(&masters, "taken", "someone-else", Duration::from_secs(30));
    let lost = lost.recv_timeout(WAIT).expect("no loss reported");
    assert!(
        matches!(lost.reason, LostReason::Failed(Error::NotHeld(_))),
        "{lost}"
    );
    // At once: not after waiting for the validity to run low.
    assert!(lost.left_when_reported() > period, "{lost}");
    assert!(!kept.is_held());
    assert!(matches!(kept.release(), Err(Error::NotHeld(_))));
    assert_eq!(get_all(&masters, "taken"), vec![bulk("someone-else"); 3]);
}

#[test]
fn nothing_is_extended_after_release() {
    let masters = cluster(3);
    let kept = keep(&masters, "done", TTL, KeepOptions::default());
    let token = *kept.token();
    assert!(
        eventually(WAIT, || kept.extensions() >= 1),
        "never extended: {:?}",
        kept.last_error()
    );
    let started = Instant::now();
    kept.release().expect("release");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "release took {:?}",
        started.elapsed()
    );
    wait_gone(&masters, "done", WAIT);
    assert_not_extended(&masters, "done", &token);
}

#[test]
fn dropping_the_watchdog_releases_at_once() {
    let masters = cluster(3);
    // Long: a key that goes away was released, not expired, and the keeper
    // is asleep until its first extension, seconds away.
    let ttl = Duration::from_secs(15);
    let kept = keep(&masters, "dropped", ttl, KeepOptions::default());
    let token = *kept.token();
    assert_held(&masters, "dropped", &token);
    let started = Instant::now();
    drop(kept);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "drop took {:?}: the keeper was not woken",
        started.elapsed()
    );
    wait_gone(&masters, "dropped", WAIT);
    assert_not_extended(&masters, "dropped", &token);
}

#[test]
fn the_extension_cap_is_honoured_and_reported_with_validity_left() {
    let masters = cluster(3);
    let ttl = TTL;
    let options = KeepOptions::default().with_max_extensions(2);
    let kept = keep(&masters, "capped", ttl, options);
    let lost = kept
        .subscribe()
        .recv_timeout(ttl * 3 + WAIT)
        .expect("no loss reported");
    assert_eq!(lost.reason, LostReason::ExtensionLimit(2), "{lost}");
    assert_eq!(lost.extensions, 2);
    assert_eq!(kept.extensions(), 2);
    assert!(lost.at < lost.deadline, "reported too late: {lost}");
    assert!(!kept.is_held());
    // Not extended again: the keys expire while the watchdog still lives.
    wait_gone(&masters, "capped", WAIT);
    assert_eq!(kept.extensions(), 2);
    assert!(matches!(kept.release(), Err(Error::NotHeld(_))));
}

#[test]
fn the_clients_own_extension_cap_applies_too() {
    let masters = cluster(3);
    let mut config = config(&masters.urls());
    config.max_extensions = Some(1);
    let mut redlock = Redlock::new(config).expect("client");
    let lock = redlock.acquire("config-capped", TTL).expect("acquire");
    let kept =
        Watchdog::keep(redlock.config().clone(), lock, KeepOptions::default()).expect("keep");
    let lost = kept
        .subscribe()
        .recv_timeout(TTL * 3 + WAIT)
        .expect("no loss reported");
    assert_eq!(lost.reason, LostReason::ExtensionLimit(1), "{lost}");
    assert_eq!(kept.extensions(), 1);
}

#[test]
fn a_lock_without_validity_or_ttl_is_refused_or_lost_at_once() {
    let masters = cluster(1);
    let mut config = config(&masters.urls());
    // One attempt each, on one master (the acquire, and the first
    // extension of a lock from parts): a round that a loaded machine
    // slows down must not fail them.
    config.per_instance_timeout = Duration::from_secs(1);
    let token = Redlock::new(config.clone())
        .unwrap_or_else(|e| panic!("{e}"))
        .try_acquire("parts", Duration::from_secs(5))
        .expect("acquire")
        .token()
        .to_owned();
    let parts = || Lock::from_parts("parts", token);

    // A lock from parts has no known TTL.
    let got = Watchdog::keep(config.clone(), parts(), KeepOptions::default());
    assert_eq!(got.err(), Some(Error::Config(ConfigError::ZeroTtl)));
    config.quarantine = Some(Duration::from_secs(60));
    let over = KeepOptions::default().with_ttl(Duration::from_secs(61));
    let got = Watchdog::keep(config.clone(), parts(), over);
    assert_eq!(
        got.err(),
        Some(Error::Config(ConfigError::TtlOverQuarantine(
            Duration::from_secs(60)
        )))
    );

    // Its validity is unknown (none counted), so it is extended at once,
    // and kept from then on like any lock.
    config.quarantine = None;
    let with_ttl = || KeepOptions::default().with_ttl(Duration::from_secs(5));
    assert!(!parts().is_valid(), "a lock from parts has no validity");
    let kept = Watchdog::keep(config.clone(), parts(), with_ttl()).expect("keep");
    assert!(
        eventually(WAIT, || kept.extensions() >= 1),
        "the first extension came at once: {:?}",
        kept.lost()
    );
    assert!(kept.is_held() && kept.lost().is_none());
    assert!(kept.remaining() > Duration::ZERO);
    // Releasing removes the key: it holds this token.
    kept.release().expect("release");
    wait_gone(&masters, "parts", WAIT);

    // A token that no longer holds the key: the first extension is refused
    // and the lock is lost at once.
    let kept = Watchdog::keep(config, parts(), with_ttl()).expect("keep");
    let lost = kept.subscribe().recv_timeout(WAIT).expect("no loss");
    assert!(
        matches!(lost.reason, LostReason::Failed(Error::NotHeld(_))),
        "{lost}"
    );
    assert_eq!(lost.extensions, 0);
    wait_gone(&masters, "parts", WAIT);
}
