//! Real deployments' users, against real masters: the
//! least-privilege ACL user docs/deployment.md gives runs every operation; a user
//! without channel rights still releases (the publish is a hint) and its
//! waiters fall back on expiry without redialling; a wrong password or a
//! user denied INFO (with restart quarantine on) fails fast with an error
//! that names the command and what to grant.

mod common;

use std::time::Duration;

use common::{
    block_on, cluster, connect, connections_received, eventually, set_user, shared_config, urls_as,
};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::{Config, Error, KeepOptions, Redlock, Retry, SharedRedlock};
use redlock_test::{Cluster, Server};

const TTL: Duration = Duration::from_secs(10);

/// docs/deployment.md's rule for a lock user whose resources are named
/// `locks:*`, word for word (a test below checks that the page quotes it).
const LOCKER_RULE: &str = "on >secret resetkeys ~locks:* ~redlock-mio:fence-state \
    resetchannels &redlock:released:locks:* -@all +set +get +del +exists +pexpire +pttl \
    +publish +hset +hmget +hdel +time +evalsha +eval +script|load +info +select \
    +subscribe +unsubscribe";

fn config_as(masters: &Cluster, user: &str, password: &str) -> Config {
    shared_config(&urls_as(masters.iter(), user, password))
}

fn exists(server: &Server, key: &str) -> bool {
    connect(server).cmd(&[Arg::Bytes(b"EXISTS"), Arg::Bytes(key.as_bytes())]) == Reply::Integer(1)
}

fn gone_everywhere(masters: &Cluster, keys: &[&str]) -> bool {
    masters.iter().all(|m| keys.iter().all(|k| !exists(m, k)))
}

/// Connections the masters have accepted so far, together.
fn connections(masters: &Cluster) -> u64 {
    masters.iter().map(connections_received).sum()
}

#[test]
fn the_deployment_page_gives_the_rule_this_test_runs() {
    let page = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/deployment.md");
    let readme = std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{page}: {e}"));
    let rule = LOCKER_RULE.split_whitespace().collect::<Vec<_>>().join(" ");
    let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains(&rule), "{page} must quote the rule: {rule}");
}

/// Every operation, with exactly docs/deployment.md's least-privilege user.
#[test]
fn the_least_privilege_user_runs_every_operation() {
    let masters = cluster(3);
    set_user(masters.iter(), "locker", LOCKER_RULE);
    let mut config = config_as(&masters, "locker", "secret");
    config.quarantine = Some(TTL);
    // The masters are new: their restart quarantine would keep them out.
    common::wait_for_uptime(&masters, TTL);
    let mut single = Redlock::new(config.clone()).unwrap_or_else(|e| panic!("{e}"));
    let mut lock = single
        .try_acquire("locks:a", TTL)
        .unwrap_or_else(|e| panic!("acquire: {e}"));
    single
        .extend(&mut lock, TTL)
        .unwrap_or_else(|e| panic!("extend: {e}"));
    single
        .release(&lock)
        .unwrap_or_else(|e| panic!("release: {e}"));
    let fenced = single
        .try_acquire_fenced("locks:f", TTL)
        .unwrap_or_else(|e| panic!("fenced: {e}"));
    assert!(fenced.fence().is_some());
    single
        .release(&fenced)
        .unwrap_or_else(|e| panic!("release fenced: {e}"));
    let many = single
        .try_acquire_many(["locks:m1", "locks:m2"], TTL)
        .unwrap_or_else(|e| panic!("many: {e}"));
    single
        .release(&many)
        .unwrap_or_else(|e| panic!("release many: {e}"));
    let batch = single
        .try_acquire_batch(["locks:b1", "locks:b2", "locks:b3"], TTL)
        .unwrap_or_else(|e| panic!("batch: {e}"));
    let batch: Vec<_> = batch
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("batch: {e}")))
        .collect();
    assert!(single.release_batch(&batch).iter().all(Result::is_ok));

    let shared = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let kept = shared
        .try_acquire("locks:k", Duration::from_secs(3))
        .and_then(|l| shared.keep(l, KeepOptions::default()))
        .unwrap_or_else(|e| panic!("keep: {e}"));
    assert!(
        eventually(Duration::from_secs(30), || kept.extensions() >= 1),
        "{:?}",
        kept.last_error()
    );
    kept.release()
        .unwrap_or_else(|e| panic!("release kept: {e}"));
    // Waiting: the holder's release is published on a channel the user
    // may read, and wakes the waiter.
    let held = single
        .try_acquire("locks:w", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    let waiter = shared.acquire_with_async("locks:w", TTL, &Retry::until(Duration::from_secs(60)));
    single.release(&held).unwrap_or_else(|e| panic!("{e}"));
    let got = block_on(waiter).unwrap_or_else(|e| panic!("waiting acquire: {e}"));
    shared.release(&got).unwrap_or_else(|e| panic!("{e}"));
    assert!(gone_everywhere(
        &masters,
        &[
            "locks:a", "locks:f", "locks:m1", "locks:m2", "locks:b1", "locks:k", "locks:w"
        ]
    ));
}

/// Redis 7's default for a new user: no channel rights. Releases (single
/// and multi-key) still succeed and remove every key; a waiting acquire
/// gets the lock when the holder releases, by its expiry timer, and its
/// refused subscriptions cost no redial.
#[test]
fn a_user_without_channel_rights_releases_and_waits_without_redialling() {
    let masters = cluster(3);
    set_user(masters.iter(), "locker", "on >pw ~* +@all resetchannels");
    let config = config_as(&masters, "locker", "pw");
    let mut holder = Redlock::new(config.clone()).unwrap_or_else(|e| panic!("{e}"));
    let lock = holder
        .try_acquire("solo", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    holder
        .release(&lock)
        .unwrap_or_else(|e| panic!("release without channel rights: {e}"));
    let many = holder
        .try_acquire_many(["m1", "m2", "m3"], TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    holder
        .release(&many)
        .unwrap_or_else(|e| panic!("multi-key release: {e}"));
    assert!(
        gone_everywhere(&masters, &["solo", "m1", "m2", "m3"]),
        "every key released"
    );

    let held = holder
        .try_acquire("waited", Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("{e}"));
    let waiter = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let before = connections(&masters);
    let pending = waiter.acquire_with_async("waited", TTL, &Retry::until(Duration::from_secs(60)));
    holder.release(&held).unwrap_or_else(|e| panic!("{e}"));
    let got = block_on(pending).unwrap_or_else(|e| panic!("waiting acquire: {e}"));
    let opened = connections(&masters) - before;
    // The waiter's command and subscriber connection to each master, and
    // this test's INFO connections: a handful, not one per round trip.
    assert!(opened <= 12, "{opened} connections opened while waiting");
    waiter.release(&got).unwrap_or_else(|e| panic!("{e}"));
}

/// A wrong password on every master: an acquire with retries ends at once
/// with `Error::Denied`, naming AUTH and what to check.
#[test]
fn a_wrong_password_fails_fast_naming_the_authentication_failure() {
    let masters = cluster(3);
    set_user(masters.iter(), "locker", "on >right ~* &* +@all");
    let mut client =
        Redlock::new(config_as(&masters, "locker", "wrong")).unwrap_or_else(|e| panic!("{e}"));
    let got = client.acquire_with("r", TTL, &Retry::until(Duration::from_secs(600)));
    let Err(Error::Denied(failure)) = &got else {
        panic!("a wrong password is not worth retrying: {got:?}");
    };
    assert_eq!(failure.attempts, 1, "{failure}");
    let message = got.unwrap_err().to_string();
    assert!(message.contains("AUTH failed: WRONGPASS"), "{message}");
    assert!(
        message.contains("check the user name and password"),
        "{message}"
    );
    // The shared client too.
    let shared = SharedRedlock::new(config_as(&masters, "locker", "wrong"))
        .unwrap_or_else(|e| panic!("{e}"));
    let got = shared.acquire_with("r", TTL, &Retry::until(Duration::from_secs(600)));
    assert!(matches!(got, Err(Error::Denied(_))), "{got:?}");
}

/// A user denied INFO, common least-privilege advice: with restart
/// quarantine on it cannot be enforced, so acquiring fails fast naming
/// INFO; with quarantine off the user locks.
#[test]
fn a_user_denied_info_is_refused_with_quarantine_on_and_locks_with_it_off() {
    let masters = cluster(3);
    set_user(masters.iter(), "locker", "on >pw ~* &* +@all -info");
    let mut config = config_as(&masters, "locker", "pw");
    config.quarantine = Some(TTL);
    let mut client = Redlock::new(config.clone()).unwrap_or_else(|e| panic!("{e}"));
    let got = client.acquire_with("r", TTL, &Retry::until(Duration::from_secs(600)));
    let Err(error @ Error::Denied(failure)) = &got else {
        panic!("quarantine cannot be enforced without INFO: {got:?}");
    };
    assert_eq!(failure.attempts, 1, "{failure}");
    let message = error.to_string();
    assert!(
        message.contains("INFO server failed: NOPERM") && message.contains("grant the user +info"),
        "{message}"
    );
    config.quarantine = None;
    let mut client = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let lock = client
        .try_acquire("r", TTL)
        .unwrap_or_else(|e| panic!("without quarantine: {e}"));
    client.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}
