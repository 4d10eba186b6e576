//! Each master's state, readable in every build: a master that
//! refuses this client, or is not there at all, costs a vote, not the
//! locks, and `masters()` says so where nothing else would without the
//! `tracing` or `metrics` features. Real masters, started empty (restart
//! quarantine off); the missing one is a loopback port nobody listens on.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::{Options, cluster, eventually, master_with, shared_config};
use redlock_mio::{MasterState, MasterStatus, Redlock, SharedRedlock};

const TTL: Duration = Duration::from_secs(30);
const SETTLE: Duration = Duration::from_secs(10);

/// Three good masters, one that wants a password the URL does not give,
/// and a port nobody listens on: the URLs, and what keeps them alive.
fn deployment() -> (common::Cluster, common::Server, Vec<String>) {
    let good = cluster(3);
    let locked = master_with(&Options::new().requirepass("secret"));
    // A free port, closed again: connects are refused.
    let nobody = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("{e}"))
        .port();
    let mut urls = good.urls();
    urls.push(format!("redis://127.0.0.1:{}", locked.port()));
    urls.push(format!("redis://127.0.0.1:{nobody}"));
    (good, locked, urls)
}

/// What the test expects of the four masters' states at `now`.
fn check(states: &[MasterState], now: Instant) -> Result<(), String> {
    let [a, b, c, locked, nobody] = states else {
        return Err(format!("{} states", states.len()));
    };
    if !(a.can_vote(now) && b.can_vote(now) && c.can_vote(now)) {
        return Err(format!("the good masters: {a:?} {b:?} {c:?}"));
    }
    let refused = locked.refusal.as_ref().map(|c| c.to_string());
    if locked.can_vote(now) || !refused.as_deref().is_some_and(|r| r.contains("NOAUTH")) {
        return Err(format!("the master that wants a password: {locked:?}"));
    }
    if !matches!(nobody.status, MasterStatus::Down(_)) || nobody.can_vote(now) {
        return Err(format!("the port nobody listens on: {nobody:?}"));
    }
    Ok(())
}

#[test]
fn a_client_tells_which_masters_cannot_vote_while_its_locks_succeed() {
    let (_good, _locked, urls) = deployment();
    let mut config = shared_config(&urls);
    config.per_instance_timeout = Duration::from_millis(500);
    let mut client = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        client
            .masters()
            .iter()
            .all(|m| m.status == MasterStatus::NotConnected),
        "{:?}",
        client.masters()
    );
    client.warm_up(SETTLE);
    // 3 of 5 vote: a quorum, and the locks succeed as if nothing were
    // wrong. The states say what is.
    let lock = client
        .try_acquire("health", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    client.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    let mut last = Err(String::new());
    let told = eventually(SETTLE, || {
        let _ = client.try_acquire("probe", Duration::from_millis(100));
        last = check(&client.masters(), Instant::now());
        last.is_ok()
    });
    assert!(told, "{last:?}");
}

#[test]
fn a_shared_client_tells_the_same() {
    let (_good, _locked, urls) = deployment();
    let shared = SharedRedlock::new(shared_config(&urls)).unwrap_or_else(|e| panic!("{e}"));
    let mut last = Err(String::new());
    let lock = shared
        .try_acquire("health", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    shared.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    let told = eventually(SETTLE, || {
        let _ = shared.try_acquire("probe", Duration::from_millis(100));
        last = check(&shared.masters(), Instant::now());
        last.is_ok()
    });
    assert!(told, "{last:?}");
}
