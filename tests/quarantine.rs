//! Restart quarantine against real masters: the crash-recovery hazard of
//! the spec, reproduced with quarantine off and prevented with it on.
//!
//! The scenario: client A holds a lock on exactly a quorum (2 of 3) of
//! masters; one of those crashes and comes back empty (no persistence);
//! client B then finds the key on one master only and is granted by the
//! two that hold nothing. Without quarantine B gets the lock while A's
//! validity is still running: two holders. With quarantine, the restarted
//! masters do not count toward B's quorum until the maximum TTL has passed
//! since their restart, by which time A's lock has expired.

mod common;

use std::time::{Duration, Instant};

use common::{client, cluster, wait_for_uptime};
use redlock_mio::Cause;
use redlock_mio::{Error, Redlock, Vote};
use redlock_test::Cluster;

/// The largest TTL in use, and the TTL of the locks: short, so that the
/// test waits little.
const MAX_TTL: Duration = Duration::from_secs(2);

/// A takes the lock for `ttl` on masters 0 and 1 only (2 is down), then
/// master 1 crashes and restarts empty and master 2 comes back empty.
/// Returns A's lock and the instant the restarts were done.
fn stage_crash_restart(
    masters: &mut Cluster,
    a: &mut Redlock,
    ttl: Duration,
) -> (redlock_mio::Lock, Instant) {
    wait_for_uptime(masters, MAX_TTL);
    assert_eq!(a.warm_up(Duration::from_secs(5)), 3);
    masters[2].kill().unwrap_or_else(|e| panic!("{e}"));
    let lock = a
        .try_acquire("crash", ttl)
        .unwrap_or_else(|e| panic!("A's acquire on two masters: {e}"));
    masters[1].restart().unwrap_or_else(|e| panic!("{e}"));
    masters[2].restart().unwrap_or_else(|e| panic!("{e}"));
    (lock, Instant::now())
}

#[test]
fn without_quarantine_a_crash_restart_grants_the_lock_twice() {
    let mut masters = cluster(3);
    let urls = masters.urls();
    let mut a = client(&urls, None);
    // Quarantine is off, so any TTL goes: long enough that A's lock
    // outlasts two restarts and B's first round on a loaded machine.
    let ttl = Duration::from_secs(10);
    let (held, _) = stage_crash_restart(&mut masters, &mut a, ttl);
    let mut b = client(&urls, None);
    let second = b.try_acquire("crash", ttl);
    let now = Instant::now();
    let both = held.deadline() > now && second.as_ref().is_ok_and(|l| l.deadline() > now);
    assert!(
        both,
        "expected the spec's double grant: A valid for {:?}, B got {second:?}",
        held.remaining_at(now)
    );
}

#[test]
fn with_quarantine_the_restarted_masters_do_not_count_until_the_max_ttl_has_passed() {
    let mut masters = cluster(3);
    let urls = masters.urls();
    let mut a = client(&urls, Some(MAX_TTL));
    let (held, restarted) = stage_crash_restart(&mut masters, &mut a, MAX_TTL);
    let mut b = client(&urls, Some(MAX_TTL));
    let refused = b.try_acquire("crash", MAX_TTL);
    // Held or NoQuorum, depending on whether master 0's refusal or the
    // second quarantined vote came first: either way, no lock, and the
    // quarantine is named.
    let Err(error @ (Error::NoQuorum(failure) | Error::Held(failure))) = &refused else {
        panic!("B must not get the lock while A holds it: {refused:?}");
    };
    let quarantined: Vec<Duration> = failure
        .votes
        .iter()
        .filter_map(|v| match v.vote {
            Vote::Failed(Cause::Quarantined(left)) => Some(left),
            _ => None,
        })
        .collect();
    assert!(!quarantined.is_empty(), "{error}");
    assert!(quarantined.iter().all(|left| *left <= MAX_TTL), "{error}");
    let message = error.to_string();
    assert!(message.contains("restart quarantine"), "{message}");
    // The availability cost: B waits for the quarantine, which also
    // outlasts A's lock.
    let got = b
        .acquire_with(
            "crash",
            MAX_TTL,
            &redlock_mio::Retry::default()
                .with_attempts(u32::MAX)
                .with_delay(Duration::from_millis(100))
                .with_max_wait(Some(MAX_TTL + Duration::from_secs(10))),
        )
        .unwrap_or_else(|e| panic!("B after the quarantine: {e}"));
    let waited = restarted.elapsed();
    assert!(
        Instant::now() >= held.deadline(),
        "B's lock began only after A's ended"
    );
    println!("B acquired {waited:?} after the restarts (max TTL {MAX_TTL:?})");
    b.release(&got).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_freshly_started_deployment_is_out_of_the_quorum_for_the_max_ttl_and_says_so() {
    let masters = cluster(3);
    let mut redlock = client(&masters.urls(), Some(MAX_TTL));
    let got = redlock.try_acquire("fresh", MAX_TTL);
    let Err(error @ Error::NoQuorum(failure)) = &got else {
        panic!("masters up for less than the max TTL must not count: {got:?}");
    };
    assert!(
        failure
            .votes
            .iter()
            .filter(|v| matches!(v.vote, Vote::Failed(Cause::Quarantined(_))))
            .count()
            >= 2,
        "{error}"
    );
    assert!(error.to_string().contains("restart quarantine"), "{error}");
    // Once they have been up for the max TTL (as the client reckons it,
    // rounding uptime_in_seconds down: up to a second late), they count.
    let lock = redlock
        .acquire_with(
            "fresh",
            MAX_TTL,
            &redlock_mio::Retry::default()
                .with_attempts(u32::MAX)
                .with_delay(Duration::from_millis(100))
                .with_max_wait(Some(MAX_TTL + Duration::from_secs(10))),
        )
        .unwrap_or_else(|e| panic!("after the quarantine: {e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_ttl_over_the_quarantine_maximum_is_refused_before_anything_is_sent() {
    let mut redlock = client(&["redis://127.0.0.1:1".to_owned()], Some(MAX_TTL));
    let got = redlock.try_acquire("long", MAX_TTL + Duration::from_millis(1));
    assert!(
        matches!(
            got,
            Err(Error::Config(
                redlock_mio::ConfigError::TtlOverQuarantine(max)
            )) if max == MAX_TTL
        ),
        "{got:?}"
    );
}

/// A lock kept alive by extends for longer than the
/// max TTL after its acquire, when one master's name starts reaching
/// another, long-running server: that server may hold none of our keys,
/// so its answers must not count for a max TTL, exactly as after a grant
/// by SET. Before extends counted as grants, the quarantine looked at the
/// acquire's grant only, older than the max TTL by then, and counted the
/// new server's vote at once.
#[test]
fn a_master_replaced_while_extends_keep_our_lock_is_quarantined() {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    let mut masters = cluster(3);
    let spare = common::master();
    // Long-running, all of them: only the swap may quarantine.
    let all_up = || {
        masters
            .iter()
            .chain(std::iter::once(&spare))
            .all(|s| Duration::from_secs(common::uptime(s).saturating_sub(1)) >= MAX_TTL)
    };
    assert!(
        common::eventually(MAX_TTL + Duration::from_secs(10), all_up),
        "masters never reached the max TTL of uptime"
    );
    // Master 1 is named `swapped.test`, which the test's resolver points
    // at master 1, then at the spare.
    let target: Arc<Mutex<SocketAddr>> = Arc::new(Mutex::new(masters[1].addr()));
    let answer = Arc::clone(&target);
    let mut config = redlock_mio::Config::new([
        masters[0].url(),
        format!("redis://swapped.test:{}", masters[1].port()),
        masters[2].url(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    config.per_instance_timeout = Duration::from_secs(1);
    config.quarantine = Some(MAX_TTL);
    config.resolver = redlock_mio::Resolver::new(move |_, _| {
        Ok(vec![*answer.lock().unwrap_or_else(|e| e.into_inner())])
    });
    let mut a = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.warm_up(Duration::from_secs(5)), 3);
    let acquired = Instant::now();
    let mut lock = a
        .try_acquire("kept", MAX_TTL)
        .unwrap_or_else(|e| panic!("acquire: {e}"));
    // Kept alive by extends until the acquire is more than a max TTL ago.
    while acquired.elapsed() <= MAX_TTL + Duration::from_millis(500) {
        a.extend(&mut lock, MAX_TTL)
            .unwrap_or_else(|e| panic!("extend: {e}"));
        // Pacing, not waiting for a condition.
        std::thread::sleep(Duration::from_millis(200));
    }
    // The name now reaches the spare: the old server goes away, and the
    // reconnect looks the name up again.
    *target.lock().unwrap_or_else(|e| e.into_inner()) = spare.addr();
    masters[1].kill().unwrap_or_else(|e| panic!("{e}"));
    // Another resource, held elsewhere on masters 0 and 2, shows master
    // 1's vote in the refusal once it has reconnected (to the spare).
    for i in [0, 2] {
        common::connect(&masters[i]).cmd(&[
            redlock_mio::resp::Arg::Bytes(b"SET"),
            redlock_mio::resp::Arg::Bytes(b"probe"),
            redlock_mio::resp::Arg::Bytes(b"someone-else"),
        ]);
    }
    let mut vote = None;
    let reconnected = common::eventually(Duration::from_secs(20), || {
        match a.try_acquire("probe", MAX_TTL) {
            Err(Error::Held(failure) | Error::NoQuorum(failure)) => {
                vote = failure.votes.get(1).map(|v| v.vote.clone());
            }
            other => panic!("master 0 and 2 hold `probe` for someone else: {other:?}"),
        }
        matches!(
            vote,
            Some(Vote::Granted | Vote::Refused | Vote::Failed(Cause::Quarantined(_)))
        )
    });
    assert!(
        reconnected,
        "master 1's name never reached the spare: {vote:?}"
    );
    assert!(
        matches!(vote, Some(Vote::Failed(Cause::Quarantined(left))) if left <= MAX_TTL),
        "a new server behind a name that granted our extend {:?} ago must be quarantined: {vote:?}",
        acquired.elapsed()
    );
}
