//! The public API as a new user writes it: names built at run
//! time, an empty name refused before anything is sent, a guard of the
//! shared client that releases on drop (also when a `?` leaves the
//! function early), the blocking fenced acquire of both clients, and the
//! scoped form, whose drop never blocks.
//! Real masters, started empty (restart quarantine off).

mod common;

use std::time::Duration;

use common::{block_on, cluster, command_calls, connect, eventually, shared_config};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::{ConfigError, Error, LostReason, Redlock, SharedRedlock};

const TTL: Duration = Duration::from_secs(30);
const SETTLE: Duration = Duration::from_secs(10);

fn exists(masters: &common::Cluster, key: &str) -> Vec<bool> {
    masters
        .iter()
        .map(|m| connect(m).cmd(&[Arg::Bytes(b"EXISTS"), key.into()]) == Reply::Integer(1))
        .collect()
}

#[test]
fn names_built_at_run_time_lock_as_they_are() {
    let masters = cluster(3);
    let mut client = common::client(&masters.urls(), None);
    for id in 0..3u64 {
        let name = format!("player:{id}");
        // By reference, then by value: the same key.
        let lock = client
            .try_acquire(&name, TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(lock.resource(), name.as_bytes());
        assert!(matches!(
            client.try_acquire(name.clone(), TTL),
            Err(Error::Held(_))
        ));
        client.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    }
    let raw: Vec<u8> = b"raw\xffname".to_vec();
    let lock = client
        .try_acquire(&raw[..], TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    client.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    let lock = client
        .try_acquire(raw, TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    client.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn an_empty_name_is_refused_before_anything_is_sent() {
    let masters = cluster(3);
    let mut client = common::client(&masters.urls(), None);
    let shared = SharedRedlock::new(shared_config(&masters.urls())).unwrap();
    let empty = Error::Config(ConfigError::EmptyResource);
    assert_eq!(client.try_acquire("", TTL).unwrap_err(), empty);
    assert_eq!(client.try_acquire_fenced("", TTL).unwrap_err(), empty);
    assert_eq!(client.try_acquire_many(["a", ""], TTL).unwrap_err(), empty);
    assert_eq!(shared.try_acquire("", TTL).unwrap_err(), empty);
    assert_eq!(
        block_on(shared.try_acquire_async(String::new(), TTL)).unwrap_err(),
        empty
    );
    // A batch with an empty name is refused whole.
    assert_eq!(client.try_acquire_batch(["a", ""], TTL).unwrap_err(), empty);
    for m in masters.iter() {
        assert_eq!(command_calls(m, "set"), 0, "{}", m.url());
        assert_eq!(command_calls(m, "evalsha"), 0, "{}", m.url());
    }
}

/// The guard's drop releases, also on the early return of a `?`: the keys
/// go from every master without anyone waiting for the release.
#[test]
fn a_shared_guard_releases_when_a_question_mark_leaves_early() {
    let masters = cluster(3);
    let shared = SharedRedlock::new(shared_config(&masters.urls())).unwrap();
    async fn work(shared: &SharedRedlock, fail: bool) -> Result<(), String> {
        let guard = shared
            .lock_async("guarded", TTL)
            .await
            .map_err(|e| e.to_string())?;
        assert!(guard.remaining() > Duration::ZERO);
        if fail {
            return Err("the work failed".into());
        }
        guard.release_async().await.map_err(|e| e.to_string())
    }
    assert_eq!(block_on(work(&shared, true)), Err("the work failed".into()));
    assert!(
        eventually(SETTLE, || exists(&masters, "guarded") == [false; 3]),
        "the dropped guard's release never reached every master"
    );
    assert_eq!(block_on(work(&shared, false)), Ok(()));
    let mut guard = shared.lock("guarded", TTL).unwrap();
    guard.extend(TTL).unwrap();
    drop(guard);
    assert!(eventually(SETTLE, || exists(&masters, "guarded") == [false; 3]));
}

#[test]
fn both_clients_take_a_fenced_lock_blocking_with_the_default_retry() {
    let masters = cluster(3);
    let mut client: Redlock = common::client(&masters.urls(), None);
    let shared = SharedRedlock::new(shared_config(&masters.urls())).unwrap();
    let first = client.acquire_fenced("fenced", TTL).unwrap();
    client.release(&first).unwrap();
    let second = shared.acquire_fenced("fenced", TTL).unwrap();
    assert!(
        second.fence() > first.fence(),
        "{:?} {:?}",
        first.fence(),
        second.fence()
    );
    shared.release(&second).unwrap();
}

/// The scoped form: the work runs while the lock is kept alive (here,
/// until the watchdog has extended it once), and the lock is released
/// when it returns.
#[test]
fn using_keeps_the_lock_alive_for_the_work_and_releases_after() {
    let masters = cluster(3);
    let shared = SharedRedlock::new(shared_config(&masters.urls())).unwrap();
    let ttl = Duration::from_millis(900);
    let extended = shared
        .using("scoped", ttl, |kept| {
            assert_eq!(exists(&masters, "scoped"), [true; 3]);
            eventually(SETTLE, || kept.extensions() >= 1) && kept.is_held()
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        extended,
        "the watchdog never extended the lock during the work"
    );
    assert!(eventually(SETTLE, || exists(&masters, "scoped") == [false; 3]));
}

/// The async scoped form tells the work when the lock is lost: here its
/// keys are deleted behind the client's back.
#[test]
fn using_async_tells_the_work_when_the_lock_is_lost() {
    let masters = cluster(3);
    let shared = SharedRedlock::new(shared_config(&masters.urls())).unwrap();
    let lost = common::within(SETTLE, move || {
        block_on(
            shared.using_async("scoped", Duration::from_millis(900), |lost| {
                for m in masters.iter() {
                    connect(m).cmd(&[Arg::Bytes(b"DEL"), "scoped".into()]);
                }
                lost
            }),
        )
    })
    .expect("the work never learned that the lock was lost")
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(lost.reason, LostReason::Failed(Error::NotHeld(_))),
        "{lost:?}"
    );
}

/// Dropping `using_async`'s future while the work runs hands the release
/// to the loop and returns at once, as a drop in async code must: here
/// every master is paused first, so a drop that waited for the release's
/// answer could not return before they resume (the per-instance timeout
/// is a minute). Once they resume, the key is gone: released, not
/// expired (the TTL is minutes).
#[test]
fn dropping_using_async_mid_work_hands_the_release_over_without_waiting() {
    use std::future::Future;
    use std::task::{Context, Waker};

    let mut masters = cluster(3);
    let mut config = shared_config(&masters.urls());
    config.per_instance_timeout = Duration::from_secs(60);
    let shared = SharedRedlock::new(config).unwrap();
    // Another handle stays: the last one's drop stops the loop, which
    // finishes what it has under way first.
    let _kept_open = shared.clone();
    let mut scoped = Box::pin(async move {
        shared
            .using_async("dropped", Duration::from_secs(300), |_lost| {
                std::future::pending::<()>()
            })
            .await
    });
    let mut cx = Context::from_waker(Waker::noop());
    assert!(
        eventually(SETTLE, || {
            assert!(scoped.as_mut().poll(&mut cx).is_pending());
            exists(&masters, "dropped") == [true; 3]
        }),
        "the lock was never taken"
    );
    for m in masters.servers_mut() {
        m.pause().unwrap_or_else(|e| panic!("{e}"));
    }
    let dropped = common::within(SETTLE, move || drop(scoped));
    for m in masters.servers_mut() {
        m.resume().unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(
        dropped.is_some(),
        "the drop waited for masters that could not answer"
    );
    assert!(
        eventually(SETTLE, || exists(&masters, "dropped") == [false; 3]),
        "the dropped work's lock was not released"
    );
}
