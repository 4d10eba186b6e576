//! The shared client against real masters: many threads and tasks on one
//! event loop, each caller's outcome its own; mutual exclusion between
//! callers racing on one resource; fenced, multi-resource, batch and
//! NOSCRIPT recovery through it; async futures under tokio and a plain
//! `block_on`; cancellation that leaks no lock; shutdown.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use common::{block_on, cluster, connect, eventually, wait_empty};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::{Config, Error, Retry, SharedRedlock, Vote};
use redlock_test::Server;

const TTL: Duration = Duration::from_secs(15);

/// Settings for masters the test started empty (no restart quarantine: no
/// lock predates them), with generous time limits: on a loaded machine a
/// slow reply must not become a lost vote, nor a slow master a dropped
/// connection.
fn config(urls: &[String]) -> Config {
    common::shared_config(urls)
}

fn shared(urls: &[String]) -> SharedRedlock {
    SharedRedlock::new(config(urls)).unwrap_or_else(|e| panic!("{e}"))
}

/// A shared client for keeping 2 s locks: rounds of 250 ms, as in
/// `tests/watchdog.rs`, leave a failing extension time for retries.
fn keeping(urls: &[String]) -> SharedRedlock {
    let mut config = config(urls);
    config.per_instance_timeout = Duration::from_millis(250);
    SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"))
}

fn get(server: &Server, key: &str) -> Reply {
    connect(server).cmd(&[Arg::Bytes(b"GET"), Arg::Bytes(key.as_bytes())])
}

#[test]
fn many_threads_share_one_client_and_each_gets_its_own_locks() {
    let masters = cluster(3);
    let redlock = shared(&masters.urls());
    let threads = 16;
    let cycles = 100;
    let start = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let redlock = redlock.clone();
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                for c in 0..cycles {
                    let resource = format!("shared:{t}:{}", c % 4);
                    let lock = redlock
                        .try_acquire(resource.clone(), TTL)
                        .unwrap_or_else(|e| panic!("thread {t}, cycle {c}: {e}"));
                    assert_eq!(lock.resource(), resource.as_bytes());
                    assert!(lock.is_valid());
                    redlock
                        .release(&lock)
                        .unwrap_or_else(|e| panic!("thread {t}, cycle {c}: {e}"));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker");
    }
    for server in &masters {
        assert_eq!(wait_empty(server, Duration::from_secs(10)), Ok(()));
    }
}

/// Mutual exclusion between callers of one client: every holder sets a
/// flag that must have been clear, and clears it before releasing.
#[test]
fn callers_racing_on_one_resource_never_hold_it_together() {
    let masters = cluster(3);
    let redlock = shared(&masters.urls());
    let held = Arc::new(AtomicBool::new(false));
    let wins = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(8));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (redlock, held, wins, start) = (
                redlock.clone(),
                Arc::clone(&held),
                Arc::clone(&wins),
                Arc::clone(&start),
            );
            thread::spawn(move || {
                start.wait();
                for _ in 0..150 {
                    match redlock.try_acquire("race", TTL) {
                        Ok(lock) => {
                            assert!(!held.swap(true, Ordering::SeqCst), "two holders at once");
                            wins.fetch_add(1, Ordering::SeqCst);
                            thread::yield_now();
                            held.store(false, Ordering::SeqCst);
                            redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
                        }
                        Err(Error::Held(_)) => {}
                        Err(other) => panic!("{other}"),
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker");
    }
    assert!(wins.load(Ordering::SeqCst) > 0);
    for server in &masters {
        assert_eq!(get(server, "race"), Reply::Nil);
    }
}

/// A killed master is one failed vote in each caller's round; a second one
/// fails every caller with its own error naming both.
#[test]
fn callers_on_different_resources_each_get_their_own_outcome_under_master_failure() {
    let mut masters = cluster(3);
    let urls = masters.urls();
    let redlock = shared(&urls);
    masters[2].kill().unwrap_or_else(|e| panic!("{e}"));
    let outcomes: Vec<_> = (0..8)
        .map(|t| {
            let redlock = redlock.clone();
            thread::spawn(move || {
                let lock = redlock.try_acquire(format!("fail:{t}"), TTL)?;
                redlock.release(&lock).map(|()| lock)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .collect();
    for (t, outcome) in outcomes.iter().enumerate() {
        let lock = outcome
            .as_ref()
            .unwrap_or_else(|e| panic!("caller {t}: {e}"));
        assert_eq!(lock.resource(), format!("fail:{t}").as_bytes());
    }
    masters[1].kill().unwrap_or_else(|e| panic!("{e}"));
    for t in 0..4 {
        match redlock.try_acquire(format!("fail2:{t}"), TTL) {
            Err(Error::NoQuorum(failure)) => {
                // Two failed votes decide at once: the live master's
                // grant counts only if it came first.
                assert!(failure.granted <= 1, "{failure}");
                assert!(
                    matches!(failure.votes[1].vote, Vote::Failed(_)),
                    "{failure}"
                );
                assert!(
                    matches!(failure.votes[2].vote, Vote::Failed(_)),
                    "{failure}"
                );
            }
            other => panic!("caller {t}: {other:?}"),
        }
    }
}

/// With every master down, each attempt's round is decided as it starts
/// (every vote a failed connection in its reconnect backoff), with no I/O
/// left to wake the loop: an acquire with retries still makes all its
/// attempts and ends, blocking or as a future (it waited in epoll forever).
#[test]
fn an_acquire_with_retries_ends_when_every_master_is_down() {
    let mut masters = cluster(3);
    let urls = masters.urls();
    for i in 0..3 {
        masters[i].kill().unwrap_or_else(|e| panic!("{e}"));
    }
    // Enough attempts that the later ones find every master in its
    // reconnect backoff (doubling from 10 ms), past the delay between them.
    let retry = Retry::default()
        .with_attempts(8)
        .with_delay(Duration::from_millis(100))
        .with_max_wait(None);
    // Polling, and waiting for releases (whose subscriptions fail too).
    for wake_on_release in [false, true] {
        let mut config = config(&urls);
        config.wake_on_release = wake_on_release;
        let redlock = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
        for blocking in [true, false] {
            let how = format!("wake_on_release {wake_on_release}, blocking {blocking}");
            // On a thread of its own, so that a hang fails the test instead
            // of stalling it (the stuck thread ends with the test process).
            let (done, outcome) = std::sync::mpsc::channel();
            let caller = redlock.clone();
            thread::spawn(move || {
                let result = if blocking {
                    caller.acquire_with("down:all", TTL, &retry)
                } else {
                    block_on(caller.acquire_with_async("down:all", TTL, &retry))
                };
                let _ = done.send(result);
            });
            let limit = Duration::from_secs(60);
            match outcome.recv_timeout(limit) {
                Ok(Err(Error::NoQuorum(failure))) => {
                    assert_eq!(
                        (failure.granted, failure.refused),
                        (0, 0),
                        "{how}: {failure}"
                    );
                    assert_eq!(failure.attempts, retry.attempts, "{how}: {failure}");
                }
                Ok(other) => panic!("{how}: every master down gave {other:?}"),
                Err(_) => panic!(
                    "{how}: an acquire of {} attempts {:?} apart, every master down, has not \
                     returned in {limit:?}",
                    retry.attempts, retry.delay
                ),
            }
        }
    }
}

#[test]
fn fenced_many_batch_and_extend_work_through_the_shared_client() {
    let masters = cluster(3);
    let redlock = shared(&masters.urls());
    let first = redlock
        .try_acquire_fenced("fenced", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&first).unwrap_or_else(|e| panic!("{e}"));
    let second = redlock
        .try_acquire_fenced("fenced", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        second.fence() > first.fence(),
        "{:?} then {:?}",
        first.fence(),
        second.fence()
    );
    redlock.release(&second).unwrap_or_else(|e| panic!("{e}"));

    let many = redlock
        .try_acquire_many(["m:a", "m:b"], TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        redlock.try_acquire("m:b", TTL),
        Err(Error::Held(_))
    ));
    let mut many = many;
    redlock
        .extend(&mut many, 2 * TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(many.extensions(), 1);
    assert!(many.remaining() > TTL);
    redlock.release(&many).unwrap_or_else(|e| panic!("{e}"));

    let results = redlock
        .try_acquire_batch(["b:0", "b:1", "b:2"], TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    let locks: Vec<_> = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    assert!(redlock.release_batch(&locks).iter().all(Result::is_ok));
    for server in &masters {
        for key in ["m:a", "m:b", "b:0", "b:1", "b:2"] {
            assert_eq!(get(server, key), Reply::Nil, "{key}");
        }
    }
}

/// After SCRIPT FLUSH every EVALSHA meets -NOSCRIPT, answered with EVAL on
/// the connection that met it, invisibly to the callers.
#[test]
fn noscript_is_recovered_for_every_caller() {
    let masters = cluster(3);
    let redlock = shared(&masters.urls());
    let locks: Vec<_> = (0..8)
        .map(|i| {
            redlock
                .try_acquire(format!("ns:{i}"), TTL)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    for server in &masters {
        let reply = connect(server).cmd(&["SCRIPT".into(), "FLUSH".into()]);
        assert!(reply.is_ok(), "{reply:?}");
    }
    let workers: Vec<_> = locks
        .into_iter()
        .map(|mut lock| {
            let redlock = redlock.clone();
            thread::spawn(move || {
                redlock.extend(&mut lock, TTL)?;
                redlock.release(&lock)
            })
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .expect("worker")
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for server in &masters {
        assert_eq!(wait_empty(server, Duration::from_secs(10)), Ok(()));
    }
}

#[test]
fn futures_complete_under_a_plain_block_on() {
    let masters = cluster(3);
    let redlock = shared(&masters.urls());
    let lock =
        block_on(redlock.try_acquire_async("async:plain", TTL)).unwrap_or_else(|e| panic!("{e}"));
    let mut lock = lock;
    block_on(redlock.extend_async(&mut lock, TTL)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lock.extensions(), 1);
    let held = block_on(redlock.try_acquire_async("async:plain", TTL));
    assert!(matches!(held, Err(Error::Held(_))), "{held:?}");
    block_on(redlock.release_async(&lock)).unwrap_or_else(|e| panic!("{e}"));
    for server in &masters {
        assert_eq!(get(server, "async:plain"), Reply::Nil);
    }
}

#[test]
fn a_thousand_tokio_tasks_share_one_client() {
    let masters = cluster(3);
    let redlock = shared(&masters.urls());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    let done = runtime.block_on(async {
        let tasks: Vec<_> = (0..1000)
            .map(|i| {
                let redlock = redlock.clone();
                tokio::spawn(async move {
                    let lock = redlock.try_acquire_async(format!("tokio:{i}"), TTL).await?;
                    redlock.release_async(&lock).await
                })
            })
            .collect();
        let mut done = 0;
        for task in tasks {
            task.await.expect("task").unwrap_or_else(|e| panic!("{e}"));
            done += 1;
        }
        done
    });
    assert_eq!(done, 1000);
    for server in &masters {
        assert_eq!(wait_empty(server, Duration::from_secs(10)), Ok(()));
    }
}

/// A future dropped before it completes leaks no lock: whether its acquire
/// won before or after the drop, the keys are released (long before their
/// TTL), and its retries stop.
#[test]
fn a_dropped_acquire_future_never_leaks_its_lock() {
    let masters = cluster(3);
    let redlock = shared(&masters.urls());
    let long = Duration::from_secs(60);
    for i in 0..50 {
        let pending = redlock.try_acquire_async(format!("cancel:{i}"), long);
        if i % 2 == 1 {
            // Let some of them win before the drop.
            thread::yield_now();
        }
        drop(pending);
    }
    // A waiter that retries forever, dropped while it waits: it stops.
    let holder = redlock
        .try_acquire("cancel:held", long)
        .unwrap_or_else(|e| panic!("{e}"));
    let waiting = redlock.acquire_with_async("cancel:held", long, &Retry::forever());
    drop(waiting);
    redlock.release(&holder).unwrap_or_else(|e| panic!("{e}"));
    for server in &masters {
        assert_eq!(wait_empty(server, Duration::from_secs(10)), Ok(()));
    }
}

/// Dropping the last handle stops the loop, but an operation in flight
/// still completes, and its cleanup still reaches the masters.
#[test]
fn dropping_the_last_handle_finishes_what_is_in_flight() {
    let masters = cluster(3);
    let redlock = shared(&masters.urls());
    let lock = redlock
        .try_acquire("shutdown:held", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    let release = redlock.release_async(&lock);
    drop(redlock);
    // The loop has ended: the release was answered before it did.
    block_on(release).unwrap_or_else(|e| panic!("{e}"));
    for server in &masters {
        assert!(eventually(Duration::from_secs(5), || get(
            server,
            "shutdown:held"
        ) == Reply::Nil));
    }
}

/// More callers at once than a connection may leave unanswered
/// ([`Config::max_in_flight`]) is a burst every master shares: the loop
/// admits operations as room frees instead of dropping every master as too
/// far behind, so each caller succeeds and nothing is left behind.
#[test]
fn a_burst_larger_than_the_in_flight_bound_waits_its_turn() {
    let masters = cluster(3);
    let mut config = config(&masters.urls());
    config.max_in_flight = 32;
    let redlock = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let tasks: Vec<_> = (0..500)
            .map(|i| {
                let redlock = redlock.clone();
                tokio::spawn(async move {
                    let lock = redlock.try_acquire_async(format!("burst:{i}"), TTL).await?;
                    redlock.release_async(&lock).await
                })
            })
            .collect();
        for (i, task) in tasks.into_iter().enumerate() {
            task.await
                .expect("task")
                .unwrap_or_else(|e| panic!("caller {i}: {e}"));
        }
    });
    for server in &masters {
        assert_eq!(wait_empty(server, Duration::from_secs(10)), Ok(()));
    }
}

/// Many locks kept alive by the one event loop thread,
/// no thread per lock: each outlives its TTL several times over, and all
/// are released at the end.
#[test]
fn many_locks_are_kept_alive_from_the_one_event_loop() {
    let masters = cluster(3);
    let redlock = keeping(&masters.urls());
    let ttl = Duration::from_secs(2);
    let kept: Vec<_> = (0..200)
        .map(|i| {
            let lock = redlock
                .try_acquire(format!("kept:{i}"), ttl)
                .unwrap_or_else(|e| panic!("{e}"));
            redlock
                .keep(lock, redlock_mio::KeepOptions::default())
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    // Three extensions each: the locks outlived their TTL at least twice.
    assert!(
        eventually(Duration::from_secs(30), || kept
            .iter()
            .all(|k| k.extensions() >= 3)),
        "extensions: {:?}",
        kept.iter().map(|k| k.extensions()).collect::<Vec<_>>()
    );
    for k in &kept {
        assert!(k.is_held(), "{:?}", k.lost());
    }
    for k in kept {
        k.release().unwrap_or_else(|e| panic!("{e}"));
    }
    for server in &masters {
        assert_eq!(wait_empty(server, Duration::from_secs(10)), Ok(()));
    }
}

/// The async form of the loss report: a future that completes when a
/// majority of masters goes away and the kept lock is given up.
#[test]
fn a_lost_kept_lock_completes_its_future() {
    let mut masters = cluster(3);
    let redlock = keeping(&masters.urls());
    let lock = redlock
        .try_acquire("kept:lost", Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("{e}"));
    let kept = redlock
        .keep(lock, redlock_mio::KeepOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let lost = kept.lost_async();
    masters[0].kill().unwrap_or_else(|e| panic!("{e}"));
    masters[1].kill().unwrap_or_else(|e| panic!("{e}"));
    let report = block_on(lost);
    assert!(report.deadline >= report.at, "{report}");
    assert!(!kept.is_held());
    drop(kept);
}

/// A master that stops answering (SIGSTOP) lags alone: it holds no caller
/// back (admission waits only for the masters that keep up), its votes
/// fail, the other two decide every operation, and once it is dropped as
/// too far behind and resumed, it is reconnected.
#[test]
fn a_stalled_master_holds_no_caller_back() {
    let mut masters = cluster(3);
    let mut config = config(&masters.urls());
    config.per_instance_timeout = Duration::from_millis(200);
    config.max_in_flight = 32;
    let redlock = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let warm = redlock
        .try_acquire("stall:warm", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&warm).unwrap_or_else(|e| panic!("{e}"));
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    let workers: Vec<_> = (0..8)
        .map(|t| {
            let redlock = redlock.clone();
            thread::spawn(move || {
                for c in 0..20 {
                    let lock = redlock
                        .try_acquire(format!("stall:{t}"), TTL)
                        .unwrap_or_else(|e| panic!("thread {t}, cycle {c}: {e}"));
                    redlock
                        .release(&lock)
                        .unwrap_or_else(|e| panic!("thread {t}, cycle {c}: {e}"));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker");
    }
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    // Reconnected: a round in which all three grant.
    assert!(eventually(Duration::from_secs(10), || {
        match redlock.try_acquire("stall:after", TTL) {
            Ok(lock) => {
                let all = masters.iter().all(|m| {
                    get(m, "stall:after")
                        == Reply::Bulk(lock.token().as_str().as_bytes().to_vec().into())
                });
                let _ = redlock.release(&lock);
                all
            }
            Err(_) => false,
        }
    }));
}

/// Restart quarantine works through the shared client as through
/// `Redlock`: masters started a moment ago do not count toward the quorum
/// (they may have lost keys in a restart), whatever thread asks.
#[test]
fn freshly_started_masters_are_quarantined_for_every_caller() {
    let masters = cluster(3);
    let mut config = config(&masters.urls());
    config.quarantine = Some(Duration::from_secs(60));
    let redlock = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let outcomes: Vec<_> = (0..4)
        .map(|t| {
            let redlock = redlock.clone();
            thread::spawn(move || redlock.try_acquire(format!("fresh:{t}"), TTL))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|w| w.join().expect("caller"))
        .collect();
    for outcome in outcomes {
        match outcome {
            Err(Error::NoQuorum(failure)) => {
                // Two quarantined votes decide: the third may be pending.
                let answered: Vec<_> = failure
                    .votes
                    .iter()
                    .filter(|v| v.vote != Vote::Pending)
                    .collect();
                assert!(answered.len() >= 2, "{failure}");
                assert!(
                    answered.iter().all(|v| matches!(
                        v.vote,
                        Vote::Failed(redlock_mio::Cause::Quarantined(_))
                    )),
                    "{failure}"
                );
            }
            other => panic!("a fresh master counted: {other:?}"),
        }
    }
}

/// How many EVALSHA commands `server` has run.
fn evalsha_calls(server: &Server) -> u64 {
    let Reply::Bulk(info) = connect(server).cmd(&["INFO".into(), "commandstats".into()]) else {
        panic!("INFO commandstats");
    };
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A blocking acquire runs on the caller's thread while the loop is idle;
/// once it must wait to retry (the resource is held), the loop takes it
/// over, retries it, and hands the lock to the waiting caller when the
/// holder lets go.
#[test]
fn a_blocking_acquire_that_must_wait_is_handed_to_the_loop() {
    let masters = cluster(3);
    let redlock = shared(&masters.urls());
    let held = redlock
        .try_acquire("handover", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    let before = evalsha_calls(&masters[0]);
    let waiter = {
        let redlock = redlock.clone();
        thread::spawn(move || {
            let retry = Retry::default()
                .with_attempts(u32::MAX)
                .with_delay(Duration::from_millis(20))
                .with_max_wait(Some(Duration::from_secs(20)));
            redlock.acquire_with("handover", TTL, &retry)
        })
    };
    // The waiter is waiting: its first attempt was refused, and its
    // waiting attempt (a script, where the first is a plain SET) ran.
    assert!(eventually(Duration::from_secs(10), || evalsha_calls(
        &masters[0]
    ) > before));
    redlock.release(&held).unwrap_or_else(|e| panic!("{e}"));
    let lock = waiter
        .join()
        .expect("waiter")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(lock.token(), held.token());
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    for server in &masters {
        assert_eq!(get(server, "handover"), Reply::Nil);
    }
}

/// A release whose reply from the slowest master comes after the quorum
/// decided, as `-NOSCRIPT` (after SCRIPT FLUSH), is answered with EVAL by
/// the event loop even while no caller is active: the key goes from that
/// master too, without another operation.
#[test]
fn a_late_noscript_to_a_release_is_answered_while_the_client_is_idle() {
    let mut masters = cluster(3);
    let redlock = shared(&masters.urls());
    let lock = redlock
        .try_acquire("late:noscript", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    for server in &masters {
        let reply = connect(server).cmd(&["SCRIPT".into(), "FLUSH".into()]);
        assert!(reply.is_ok(), "{reply:?}");
    }
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    // No further operation: the loop reads the late -NOSCRIPT itself.
    assert_eq!(wait_empty(&masters[2], Duration::from_secs(10)), Ok(()));
}
