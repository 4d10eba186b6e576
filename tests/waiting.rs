//! How a waiting acquire waits for a held lock, against real masters:
//! what it takes for a split vote and what it takes for a held lock.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::{cluster, command_calls, connect, eventually, hold_elsewhere};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::{Config, Retry, SharedRedlock};
use redlock_test::Server;

/// How many lock commands (SET, and scripts by EVALSHA or EVAL) `server`
/// has run.
fn lock_commands(server: &Server) -> u64 {
    ["set", "evalsha", "eval"]
        .iter()
        .map(|command| command_calls(server, command))
        .sum()
}

/// N = 5, a holder whose keys sit on exactly three
/// masters, one of which is down: a waiter's attempt is refused by two,
/// failed by one, granted by two. That is a held lock (the down master
/// may hold the key), not a split between racers: the waiter must wait
/// for the refusing masters' keys to expire, not retry every couple of
/// round trips (each retry's cleanup publishing a release that wakes
/// every other waiter into the same split) until they do.
#[test]
fn refusals_short_of_a_quorum_beside_a_down_master_are_waited_out_not_retried() {
    let mut masters = cluster(5);
    let ttl_ms = 3000;
    hold_elsewhere(masters.iter().take(3), "split", ttl_ms);
    masters[2].kill().unwrap_or_else(|e| panic!("{e}"));
    let mut config = Config::new(masters.urls()).unwrap_or_else(|e| panic!("{e}"));
    config.per_instance_timeout = Duration::from_secs(2);
    config.quarantine = None;
    let waiter = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let before = lock_commands(&masters[3]);
    let retry = Retry::default()
        .with_attempts(3)
        .with_delay(Duration::from_millis(200))
        .with_max_wait(Some(Duration::from_secs(60)));
    let lock = waiter
        .acquire_with("split", Duration::from_secs(10), &retry)
        .unwrap_or_else(|e| panic!("the holder's keys expire in 3 s: {e}"));
    let sent = lock_commands(&masters[3]) - before;
    // Mutual exclusion: the waiter's token replaced the holder's.
    let Reply::Bulk(now) = connect(&masters[0]).cmd(&[Arg::Bytes(b"GET"), Arg::Bytes(b"split")])
    else {
        panic!("the waiter's key on master 0");
    };
    assert_eq!(&now[..], lock.token().as_bytes());
    // A first SET, a waiting attempt and its cleanup, a few more around
    // the expiry (a woken attempt can still meet the last key): a handful,
    // where retrying every two round trips for 3 s sends thousands.
    assert!(
        sent <= 40,
        "the waiter sent {sent} lock commands to one master while the lock was held"
    );
    println!("{sent} lock commands to master 3 while waiting");
    waiter.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

/// N = 3 with one master down: a waiter refused by one key (a racer's,
/// which split the two live masters with it) beside the down master
/// cannot tell it from a holder's. The racer cleans up at once and
/// quietly (no release is published): the waiter looks again after a
/// per-instance timeout, finds the lock free and takes it, rather than
/// waiting for that key's expiry (two minutes here, past the test's
/// patience).
#[test]
fn a_refusal_beside_a_down_master_is_looked_at_again_before_it_is_waited_out() {
    let mut masters = cluster(3);
    hold_elsewhere(masters.iter().take(1), "racer", 120_000);
    masters[2].kill().unwrap_or_else(|e| panic!("{e}"));
    let mut config = Config::new(masters.urls()).unwrap_or_else(|e| panic!("{e}"));
    // The look comes this long after the refusal: time for the racer's
    // cleanup below, on a loaded machine.
    config.per_instance_timeout = Duration::from_secs(2);
    config.quarantine = None;
    let waiter = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    // The waiting script runs a PTTL when it is refused.
    let refused = || command_calls(&masters[0], "pttl");
    let before = refused();
    let (tx, outcome) = mpsc::channel();
    let thread = {
        let waiter = waiter.clone();
        thread::spawn(move || {
            let retry = Retry::default()
                .with_attempts(3)
                .with_delay(Duration::from_secs(200))
                .with_max_wait(None);
            let _ = tx.send(waiter.acquire_with("racer", Duration::from_secs(10), &retry));
        })
    };
    // Its waiting attempt refused by the racer's key: the racer lets go.
    assert!(
        eventually(Duration::from_secs(10), || refused() > before),
        "the waiter's waiting attempt reached master 0"
    );
    let deleted = connect(&masters[0]).cmd(&[Arg::Bytes(b"DEL"), Arg::Bytes(b"racer")]);
    assert_eq!(deleted, Reply::Integer(1));
    let lock = outcome
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the waiter still waits for a key deleted long ago"))
        .unwrap_or_else(|e| panic!("the waiter: {e}"));
    let _ = thread.join();
    waiter.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}
