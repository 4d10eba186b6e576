//! Waiting for a held lock with release notifications, against
//! real masters.
//!
//! A release publishes its token on `redlock:released:<resource>`
//! ([`release_channel`]) on every master. A [`SharedRedlock`] acquire with
//! retries left subscribes there while it waits, and tries again when a
//! release is published, when a lock is released through the same client,
//! or when the holder's key expires (its PTTL, read by the refused
//! attempt); a [`Redlock`] waits for that expiry. These tests check that a
//! released lock is handed over within a few commands, that a dead holder
//! is replaced at its expiry, that a down master, a dropped subscriber
//! connection and clients that do not publish change none of that, that
//! the subscription ends with the last waiter, and that woken waiters never
//! hold a lock together.
//!
//! The waiters retry with a delay of [`DELAY`] and give up after
//! [`MAX_WAIT`], while the holders' keys live [`HOLD_TTL`]. A polling
//! waiter's first retry would come at least `DELAY / 2` after its first
//! attempt, past its `MAX_WAIT`, so it gives up at once; and the holder's
//! key outlives `MAX_WAIT`. So a waiter that gets the lock got it from a
//! notification (or, where the test says so, from the key's expiry):
//! nothing else here is timed. Every wait on the masters polls against a
//! generous deadline, and every process a test starts stops when the test
//! ends, also when it fails.

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use common::{Plain, bulk, cluster, connect, eventually};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::script::release_channel;
use redlock_mio::{Config, Error, Lock, Redlock, Retry, SharedRedlock};
use redlock_test::Server;

/// The resource every test contends for.
const R: &str = "notify:r";
/// The holders' TTL: longer than [`MAX_WAIT`], so that a waiter that gets
/// the lock in time cannot have got it by the key's expiry.
const HOLD_TTL: Duration = Duration::from_secs(30);
/// How long a waiter waits before giving up: generous for a loaded
/// machine, and far below both [`HOLD_TTL`] and a polling waiter's first
/// retry.
const MAX_WAIT: Duration = Duration::from_secs(20);
/// The waiters' retry delay. Polling waits uniformly in
/// `[DELAY / 2, DELAY]` and gives up when that would end past
/// [`MAX_WAIT`]: with `DELAY / 2 > MAX_WAIT` a polling waiter gives up
/// after its first attempt.
const DELAY: Duration = Duration::from_secs(60);
/// How long a test polls the masters for a state it waits for.
const SETTLE: Duration = Duration::from_secs(10);
/// How long past [`MAX_WAIT`] a test waits for a waiter's thread before
/// calling it hung (the waiter should have given up by then).
const HUNG: Duration = Duration::from_secs(30);
/// The spec's compare-and-delete, as clients that do not publish send it.
const SPEC_RELEASE: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";

/// Settings for masters the test started empty: no lock predates them, so
/// restart quarantine is off (it would keep them out of the quorum at
/// first). Time limits are generous, so that a loaded machine turns no
/// slow reply into a lost vote. `wake_on_release` is the default (on).
fn config(urls: &[String]) -> Config {
    common::shared_config(urls)
}

fn shared(urls: &[String]) -> SharedRedlock {
    SharedRedlock::new(config(urls)).unwrap_or_else(|e| panic!("{e}"))
}

/// A single-thread client with the same settings, connected.
fn single(urls: &[String]) -> Redlock {
    let mut redlock = Redlock::new(config(urls)).unwrap_or_else(|e| panic!("{e}"));
    redlock.warm_up(Duration::from_secs(5));
    redlock
}

/// The waiters' retry policy: see [`DELAY`] and [`MAX_WAIT`].
fn waiting() -> Retry {
    Retry::default()
        .with_attempts(u32::MAX)
        .with_delay(DELAY)
        .with_max_wait(Some(MAX_WAIT))
}

/// `R` taken for [`HOLD_TTL`] by a client of its own, the holder.
fn hold(urls: &[String]) -> (Redlock, Lock) {
    let mut holder = single(urls);
    let lock = holder
        .try_acquire(R, HOLD_TTL)
        .unwrap_or_else(|e| panic!("the holder takes {R}: {e}"));
    (holder, lock)
}

/// A holder takes `R` for 2 s and dies: neither its lock nor its client
/// sends anything when dropped.
fn die_holding(urls: &[String]) {
    let mut dead = single(urls);
    let lock = dead
        .try_acquire(R, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("the holder takes {R}: {e}"));
    drop((lock, dead));
}

/// An acquire running on a thread of its own.
struct Waiter {
    outcome: mpsc::Receiver<Result<Lock, Error>>,
    thread: thread::JoinHandle<()>,
}

impl Waiter {
    fn spawn(acquire: impl FnOnce() -> Result<Lock, Error> + Send + 'static) -> Waiter {
        let (tx, outcome) = mpsc::channel();
        let thread = thread::spawn(move || {
            let _ = tx.send(acquire());
        });
        Waiter { outcome, thread }
    }

    /// A [`SharedRedlock`] waiting for `R` with [`waiting`].
    fn shared(redlock: &SharedRedlock) -> Waiter {
        let redlock = redlock.clone();
        Waiter::spawn(move || redlock.acquire_with(R, HOLD_TTL, &waiting()))
    }

    /// Still inside its acquire.
    fn is_waiting(&self) -> bool {
        !self.thread.is_finished()
    }

    /// What the acquire returned; it must return within [`MAX_WAIT`] and
    /// [`HUNG`] of now, having given up by then if nothing else.
    fn outcome(self) -> Result<Lock, Error> {
        match self.outcome.recv_timeout(MAX_WAIT + HUNG) {
            Ok(outcome) => {
                let _ = self.thread.join();
                outcome
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => match self.thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => panic!("the waiter ended without an outcome"),
            },
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!(
                    "the waiter is hung: no outcome {:?} after {MAX_WAIT:?}",
                    HUNG
                )
            }
        }
    }
}

/// How many connections are subscribed to `resource`'s release channel on
/// `server`.
fn numsub(server: &Server, resource: &str) -> i64 {
    let channel = release_channel(resource.as_bytes());
    let reply = connect(server).cmd(&["PUBSUB".into(), "NUMSUB".into(), Arg::Bytes(&channel)]);
    match &reply {
        Reply::Array(items) => match items.as_slice() {
            [_, Reply::Integer(n)] => *n,
            _ => panic!("PUBSUB NUMSUB on {}: {reply:?}", server.url()),
        },
        _ => panic!("PUBSUB NUMSUB on {}: {reply:?}", server.url()),
    }
}

/// Polls until `want` connections are subscribed to `R`'s release channel
/// on every one of `servers`.
fn wait_numsub(servers: &[Server], want: i64, when: &str) {
    wait_numsub_of(servers, &[R], want, when);
}

/// Polls until `want` connections are subscribed to the release channel
/// of each of `resources` on every one of `servers`.
fn wait_numsub_of<S: AsRef<str>>(servers: &[Server], resources: &[S], want: i64, when: &str) {
    let seen = || -> Vec<Vec<i64>> {
        servers
            .iter()
            .map(|s| resources.iter().map(|r| numsub(s, r.as_ref())).collect())
            .collect()
    };
    let reached = eventually(SETTLE, || seen().iter().flatten().all(|&n| n == want));
    assert!(
        reached,
        "{when}: subscribers to the release channels per master {:?}, want {want} each \
         within {SETTLE:?}",
        seen()
    );
}

/// A master's command counts (`INFO commandstats`) that matter here. A
/// command a Lua script runs counts as well as the script.
#[derive(Debug, Clone, Copy, Default)]
struct Calls {
    /// Every acquire attempt runs one SET on a master: plain, or inside the
    /// waiting script.
    set: u64,
    /// EVALSHA and EVAL: releases, waiting attempts, clean-ups; and the
    /// masters' own compare-and-delete (`DELIFEQ`, `DELEX`), which
    /// releases and cleans up where they have it.
    scripts: u64,
    /// Run by a waiting attempt the masters refused, to read the holder's
    /// remaining time.
    pttl: u64,
    /// Run by a release that deleted its key: a notification.
    publish: u64,
}

fn calls(server: &Server) -> Calls {
    let reply = connect(server).cmd(&["INFO".into(), "commandstats".into()]);
    let Reply::Bulk(info) = &reply else {
        panic!("INFO commandstats on {}: {reply:?}", server.url());
    };
    let mut calls = Calls::default();
    for line in String::from_utf8_lossy(info).lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let n: u64 = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line:?} from {}", server.url()));
        match name {
            "set" => calls.set += n,
            // A master's own compare-and-delete does a release's part.
            "evalsha" | "eval" | "delifeq" | "delex" => calls.scripts += n,
            "pttl" => calls.pttl += n,
            "publish" => calls.publish += n,
            _ => {}
        }
    }
    calls
}

/// Polls until every one of `servers` has run a PTTL since `before`: the
/// waiter's attempt with the waiting script was refused there, so it is
/// waiting. (Nothing else in these tests runs PTTL.)
fn wait_refused(servers: &[Server], before: &[Calls], when: &str) {
    let refused = || {
        servers
            .iter()
            .zip(before)
            .all(|(s, b)| calls(s).pttl > b.pttl)
    };
    assert!(
        eventually(SETTLE, refused),
        "{when}: the waiter's waiting attempt was not refused on every master within {SETTLE:?}"
    );
}

/// Every master's calls now.
fn calls_now(servers: &[Server]) -> Vec<Calls> {
    servers.iter().map(calls).collect()
}

/// How many PUBLISHes each of `servers` ran since `before`.
fn published_since(servers: &[Server], before: &[Calls]) -> Vec<u64> {
    servers
        .iter()
        .zip(before)
        .map(|(s, b)| calls(s).publish - b.publish)
        .collect()
}

/// A waiter in `redlock` for `R`, started once the masters hold `R`, and
/// waited for until its waiting attempt was refused on every master: it
/// waits for a release (or is in the attempt whose refusal makes it wait).
fn refused_waiter(servers: &[Server], redlock: &SharedRedlock) -> Waiter {
    let before = calls_now(servers);
    let waiter = Waiter::shared(redlock);
    wait_refused(servers, &before, "a waiter for a held lock");
    waiter
}

/// `R` for `ttl`, taken by a waiter in `b` (B) when a holder of its own
/// releases it: B's only waiter, woken by the release.
fn waited_for(servers: &[Server], urls: &[String], b: &SharedRedlock, ttl: Duration) -> Lock {
    let (mut holder, held) = hold(urls);
    let waiter = {
        let b = b.clone();
        Waiter::spawn(move || b.acquire_with(R, ttl, &waiting()))
    };
    wait_numsub(servers, 1, "while B waits");
    holder
        .release(&held)
        .unwrap_or_else(|e| panic!("the holder's release: {e}"));
    waiter.outcome().unwrap_or_else(|e| panic!("B: {e}"))
}

/// `R` passed between two callers of `b`: the first takes it, a second
/// waits (refused), the first releases. The second's lock, handed over.
fn handed_over(servers: &[Server], b: &SharedRedlock) -> Lock {
    let first = b
        .try_acquire(R, HOLD_TTL)
        .unwrap_or_else(|e| panic!("the first holder takes {R}: {e}"));
    let waiter = refused_waiter(servers, b);
    b.release(&first)
        .unwrap_or_else(|e| panic!("the first holder's release: {e}"));
    waiter
        .outcome()
        .unwrap_or_else(|e| panic!("the waiter, after the release: {e}"))
}

fn get(server: &Server, key: &str) -> Reply {
    connect(server).cmd(&["GET".into(), key.into()])
}

/// How many masters hold `key` with `lock`'s token.
fn holding(servers: &[Server], key: &str, lock: &Lock) -> usize {
    servers
        .iter()
        .filter(|s| get(s, key) == bulk(lock.token().as_str()))
        .count()
}

/// Polls until no master holds `lock`: a release returns at its quorum,
/// the last master's reply may come later.
fn released_everywhere(servers: &[Server], lock: &Lock) {
    assert!(
        eventually(SETTLE, || holding(servers, R, lock) == 0),
        "the released lock still on some master after {SETTLE:?}"
    );
}

/// A Redlock client of another make: a plain `SET NX PX` on every master
/// to lock, the spec's compare-and-delete without a publish to release.
struct Foreign {
    conns: Vec<Plain>,
    token: &'static str,
}

impl Foreign {
    fn connect(servers: &[Server], token: &'static str) -> Foreign {
        Foreign {
            conns: servers.iter().map(connect).collect(),
            token,
        }
    }

    /// `SET resource token NX PX ttl_ms` on every master: which granted.
    fn set(&mut self, resource: &str, ttl_ms: i64) -> Vec<bool> {
        self.conns
            .iter_mut()
            .map(|c| {
                let reply = c.cmd(&[
                    "SET".into(),
                    resource.into(),
                    self.token.into(),
                    "NX".into(),
                    "PX".into(),
                    Arg::Int(ttl_ms),
                ]);
                match reply {
                    Reply::Nil => false,
                    r if r.is_ok() => true,
                    other => panic!("foreign SET NX: {other:?}"),
                }
            })
            .collect()
    }

    /// The spec's compare-and-delete, as EVAL: what each master returned.
    fn release(&mut self, resource: &str) -> Vec<i64> {
        self.conns
            .iter_mut()
            .map(|c| {
                let reply = c.cmd(&[
                    "EVAL".into(),
                    SPEC_RELEASE.into(),
                    Arg::Int(1),
                    resource.into(),
                    self.token.into(),
                ]);
                match reply {
                    Reply::Integer(n) => n,
                    other => panic!("foreign release: {other:?}"),
                }
            })
            .collect()
    }
}

#[test]
fn a_waiter_in_another_client_acquires_within_a_few_round_trips_of_a_release() {
    let masters = cluster(3);
    let urls = masters.urls();
    let (mut holder, held) = hold(&urls);
    let b = shared(&urls);
    let before: Vec<Calls> = masters.iter().map(calls).collect();
    let waiter = Waiter::shared(&b);
    wait_numsub(masters.servers(), 1, "while B waits");
    // From here on B only waits: what the masters run after the release is
    // the release and what it caused.
    wait_refused(masters.servers(), &before, "before the release");
    let at_release: Vec<Calls> = masters.iter().map(calls).collect();
    assert!(waiter.is_waiting(), "B returned while the holder held {R}");
    holder
        .release(&held)
        .unwrap_or_else(|e| panic!("the holder's release: {e}"));
    let lock = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("B, woken by the release: {e}"));
    let after: Vec<Calls> = masters.iter().map(calls).collect();
    for (i, (then, now)) in at_release.iter().zip(&after).enumerate() {
        // At most two attempts: the one the release woke, and one more if
        // that one raced something. Each script is the holder's release, a
        // waiting attempt, or the clean-up after a refused attempt.
        let attempts = now.set - then.set;
        let scripts = now.scripts - then.scripts;
        assert!(
            attempts <= 2 && scripts <= 1 + 2 * attempts,
            "master {i}: after the release, {attempts} acquire attempts and {scripts} scripts \
             (the release included): B polled instead of waiting for the release \
             (before {then:?}, after {now:?})"
        );
    }
    assert!(holding(masters.servers(), R, &lock) >= 2);
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_holder_that_dies_without_releasing_is_replaced_at_its_expiry_not_a_retry_delay_later() {
    let masters = cluster(3);
    let urls = masters.urls();
    die_holding(&urls);
    let b = shared(&urls);
    let lock = Waiter::shared(&b)
        .outcome()
        .unwrap_or_else(|e| panic!("the waiter, at the dead holder's expiry: {e}"));
    assert!(holding(masters.servers(), R, &lock) >= 2);
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

/// As above with a single-thread client waiting, which does not subscribe:
/// it waits for the expiry its refused attempt read.
#[test]
fn a_holder_that_dies_without_releasing_is_replaced_at_its_expiry_for_a_single_thread_waiter() {
    let masters = cluster(3);
    let urls = masters.urls();
    die_holding(&urls);
    let mut b = single(&urls);
    let before: Vec<Calls> = masters.iter().map(calls).collect();
    let waiter = Waiter::spawn(move || b.acquire_with(R, HOLD_TTL, &waiting()));
    // Once it is refused it waits; a waiter that already has the lock (on a
    // machine slow enough to let 2 s pass) did not subscribe either.
    let waits = || {
        !waiter.is_waiting()
            || masters
                .iter()
                .zip(&before)
                .all(|(s, b)| calls(s).pttl > b.pttl)
    };
    assert!(eventually(SETTLE, waits), "the waiter was never refused");
    for (i, server) in masters.iter().enumerate() {
        assert_eq!(numsub(server, R), 0, "master {i}: a Redlock subscribed");
    }
    let lock = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("the waiter, at the dead holder's expiry: {e}"));
    assert!(holding(masters.servers(), R, &lock) >= 2);
    single(&urls)
        .release(&lock)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A waiting acquire of `kind` (fenced, or of `R` and another resource) in
/// a client of its own, behind a holder of `R` that died: it sleeps until
/// the holder's keys expire, as its refusals tell (minus the key's PTTL),
/// and does not try every retry delay meanwhile. The retry delay is short
/// (20 ms) and the dead holder's lock lasts 2 s: a waiter that polls runs
/// its script on each master about a hundred times before it expires; one
/// that sleeps until then, a handful (its first attempt, the one after it
/// subscribed, the one at the expiry, and perhaps one more for a key that
/// outlived its PTTL by a millisecond).
fn a_waiter_behind_a_dead_holder_sleeps_until_its_expiry(kind: &str) {
    let masters = cluster(3);
    let urls = masters.urls();
    die_holding(&urls);
    let b = shared(&urls);
    let before = calls_now(masters.servers());
    let retry = Retry::default()
        .with_attempts(u32::MAX)
        .with_delay(Duration::from_millis(20))
        .with_max_wait(Some(MAX_WAIT));
    let lock = match kind {
        "fenced" => b.acquire_fenced_with(R, HOLD_TTL, &retry),
        _ => b.acquire_many_with([R, "notify:r2"], HOLD_TTL, &retry),
    }
    .unwrap_or_else(|e| panic!("the {kind} waiter, at the dead holder's expiry: {e}"));
    let scripts: Vec<u64> = masters
        .iter()
        .zip(&before)
        .map(|(s, b)| calls(s).scripts - b.scripts)
        .collect();
    assert!(
        scripts.iter().all(|&n| n <= 10),
        "the {kind} waiter ran its script {scripts:?} times on the masters: it polled"
    );
    assert!(holding(masters.servers(), R, &lock) >= 2);
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_fenced_waiter_behind_a_dead_holder_sleeps_until_its_expiry() {
    a_waiter_behind_a_dead_holder_sleeps_until_its_expiry("fenced");
}

#[test]
fn a_multi_resource_waiter_behind_a_dead_holder_sleeps_until_its_expiry() {
    a_waiter_behind_a_dead_holder_sleeps_until_its_expiry("many");
}

#[test]
fn a_release_while_a_master_is_down_still_wakes_the_waiter() {
    let mut masters = cluster(3);
    let urls = masters.urls();
    let (mut holder, held) = hold(&urls);
    let b = shared(&urls);
    let waiter = Waiter::shared(&b);
    wait_numsub(masters.servers(), 1, "while B waits");
    masters[2].kill().unwrap_or_else(|e| panic!("{e}"));
    assert!(waiter.is_waiting(), "B returned while the holder held {R}");
    holder
        .release(&held)
        .unwrap_or_else(|e| panic!("the holder's release, two masters of three up: {e}"));
    let lock = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("B, woken by the release on two masters: {e}"));
    assert_eq!(holding(&masters.servers()[..2], R, &lock), 2);
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_dropped_subscriber_connection_is_resubscribed() {
    let masters = cluster(3);
    let urls = masters.urls();
    let (mut holder, held) = hold(&urls);
    let b = shared(&urls);
    let waiter = Waiter::shared(&b);
    wait_numsub(masters.servers(), 1, "while B waits");
    for (i, server) in masters.iter().enumerate() {
        let killed = connect(server).cmd(&[
            "CLIENT".into(),
            "KILL".into(),
            "TYPE".into(),
            "pubsub".into(),
        ]);
        // Synchronous: the subscription is gone when the reply comes.
        assert_eq!(killed, Reply::Integer(1), "master {i}: B's subscriber");
    }
    wait_numsub(masters.servers(), 1, "after the subscribers were killed");
    assert!(waiter.is_waiting(), "B returned while the holder held {R}");
    holder
        .release(&held)
        .unwrap_or_else(|e| panic!("the holder's release: {e}"));
    let lock = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("B, woken through its new subscriptions: {e}"));
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_client_keeps_its_subscription_while_its_last_waiter_holds_the_lock_and_ends_it_at_the_release()
 {
    let masters = cluster(3);
    let urls = masters.urls();
    let b = shared(&urls);
    let lock = waited_for(masters.servers(), &urls, &b, HOLD_TTL);
    // B holds the lock, nobody waits: the subscription stays for the next
    // local waiter, which waits for B's release rather than try. Nothing
    // ends it before B's release (the lock is valid for HOLD_TTL).
    let subscribed: Vec<i64> = masters.servers().iter().map(|s| numsub(s, R)).collect();
    assert_eq!(subscribed, [1, 1, 1], "while B holds the lock");
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    wait_numsub(masters.servers(), 0, "once B released the lock");
}

/// A lock held here that its holder shortened with an extend counts as
/// held here no longer than its new validity: the subscription kept for
/// it ends then, and a new local waiter takes the lock at once. Before,
/// the client took it to be held for the TTL it was taken with (30 s): the
/// subscription stayed, and a local waiter waited for that lock until its
/// `max_wait` (20 s) before it tried.
#[test]
fn a_lock_shortened_by_an_extend_is_held_here_no_longer_than_its_new_validity() {
    let masters = cluster(3);
    let urls = masters.urls();
    let b = shared(&urls);
    let mut lock = waited_for(masters.servers(), &urls, &b, HOLD_TTL);
    b.extend(&mut lock, Duration::from_millis(300))
        .unwrap_or_else(|e| panic!("B shortens its lock: {e}"));
    wait_numsub(
        masters.servers(),
        0,
        "once B's lock, shortened to 300 ms, is no longer valid",
    );
    let waiter = {
        let b = b.clone();
        Waiter::spawn(move || b.acquire_with(R, HOLD_TTL, &waiting()))
    };
    let taken = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("a new waiter in B, B's lock lapsed: {e}"));
    b.release(&taken).unwrap_or_else(|e| panic!("{e}"));
}

/// A lock a waiter took and nobody releases (its owner gone, its key left
/// to expire) ends the subscription kept for it at its validity's end.
#[test]
fn the_subscription_kept_for_a_lock_held_here_ends_when_the_lock_is_no_longer_valid() {
    let masters = cluster(3);
    let urls = masters.urls();
    let b = shared(&urls);
    let lock = waited_for(masters.servers(), &urls, &b, Duration::from_secs(2));
    // Never released: the 2 s lock's validity ends within SETTLE.
    std::mem::forget(lock);
    wait_numsub(masters.servers(), 0, "once B's lock is no longer valid");
}

/// A waiting future dropped unpolled leaves the queue of its client's
/// waiters: the next one still gets the lock at the release, and the
/// subscription ends with it.
#[test]
fn a_dropped_waiter_leaves_the_queue_to_the_next_one() {
    let masters = cluster(3);
    let urls = masters.urls();
    let (mut holder, held) = hold(&urls);
    let b = shared(&urls);
    // Submitted when made: both wait without being polled.
    let first = b.acquire_with_async(R, HOLD_TTL, &waiting());
    let second = b.acquire_with_async(R, HOLD_TTL, &waiting());
    wait_numsub(masters.servers(), 1, "while two futures wait");
    drop(first);
    holder
        .release(&held)
        .unwrap_or_else(|e| panic!("the holder's release: {e}"));
    let lock = block_on(second, MAX_WAIT + HUNG)
        .unwrap_or_else(|e| panic!("the waiter behind the dropped one: {e}"));
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    wait_numsub(
        masters.servers(),
        0,
        "once the last waiter released the lock",
    );
}

/// The only waiter dropped while the holder holds on: nobody waits any
/// more, so the client unsubscribes, without waiting for a release, the
/// holder's expiry or the dropped waiter's `max_wait`.
#[test]
fn the_client_unsubscribes_when_its_only_waiter_is_dropped() {
    let masters = cluster(3);
    let urls = masters.urls();
    let (mut holder, held) = hold(&urls);
    let b = shared(&urls);
    let only = b.acquire_with_async(R, HOLD_TTL, &waiting());
    wait_numsub(masters.servers(), 1, "while the future waits");
    drop(only);
    wait_numsub(masters.servers(), 0, "once the only waiter is dropped");
    holder
        .release(&held)
        .unwrap_or_else(|e| panic!("the holder's release: {e}"));
}

/// Polls `future` on this thread, parking between wake-ups, for at most
/// `limit`: no runtime, only `std::task`.
fn block_on<F: Future>(future: F, limit: Duration) -> F::Output {
    struct Unpark(thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    let deadline = Instant::now() + limit;
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "the future is hung: not ready after {limit:?}"
        );
        thread::park_timeout(left);
    }
}

/// A client that does not publish (the spec's release) holds: our waiter
/// is not woken by its release, but by the expiry its refused attempt
/// read, and gets the lock only once the foreign one is gone; then the
/// foreign client is refused while ours holds.
#[test]
fn a_lock_held_by_a_client_that_does_not_publish_is_acquired_after_its_release() {
    let masters = cluster(3);
    let urls = masters.urls();
    let mut foreign = Foreign::connect(masters.servers(), "foreign-1");
    // Short enough that the waiter, told only by PTTL, wakes within
    // MAX_WAIT.
    assert_eq!(
        foreign.set(R, 1500),
        vec![true; 3],
        "the foreign client takes {R}"
    );
    let b = shared(&urls);
    let before: Vec<Calls> = masters.iter().map(calls).collect();
    let waiter = Waiter::shared(&b);
    wait_refused(masters.servers(), &before, "while the foreign client holds");
    let was_waiting = waiter.is_waiting();
    let released = foreign.release(R);
    let lock = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("B, after the foreign release and expiry: {e}"));
    if released.iter().filter(|n| **n == 1).count() >= 2 {
        // The foreign client still held a quorum when it released.
        assert!(was_waiting, "B returned while the foreign client held {R}");
    }
    assert!(holding(masters.servers(), R, &lock) >= 2);
    // The acquire returned at its quorum; the foreign key is gone
    // everywhere, so its SET reaches every master.
    assert!(
        eventually(SETTLE, || holding(masters.servers(), R, &lock) == 3),
        "B's lock on every master"
    );
    let mut other = Foreign::connect(masters.servers(), "foreign-2");
    assert_eq!(
        other.set(R, 1500),
        vec![false; 3],
        "a foreign SET NX while ours held"
    );
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    released_everywhere(masters.servers(), &lock);
    assert_eq!(other.set(R, 1500), vec![true; 3], "after our release");
    assert_eq!(other.release(R), vec![1; 3]);
}

#[test]
fn a_client_that_does_not_publish_is_refused_on_every_master_while_ours_holds() {
    let masters = cluster(3);
    let urls = masters.urls();
    let b = shared(&urls);
    let lock = b.try_acquire(R, HOLD_TTL).unwrap_or_else(|e| panic!("{e}"));
    // Every master has it once all replies are in (the acquire returned at
    // its quorum).
    assert!(eventually(SETTLE, || holding(masters.servers(), R, &lock) == 3));
    let mut foreign = Foreign::connect(masters.servers(), "foreign-1");
    assert_eq!(foreign.set(R, 1500), vec![false; 3]);
    // Its release, with its own token, leaves ours alone.
    assert_eq!(foreign.release(R), vec![0; 3]);
    assert_eq!(holding(masters.servers(), R, &lock), 3);
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    released_everywhere(masters.servers(), &lock);
    assert_eq!(foreign.set(R, 1500), vec![true; 3], "after our release");
    assert_eq!(foreign.release(R), vec![1; 3]);
}

/// One critical section of [`waiters_woken_by_releases_never_hold_the_lock_together`]:
/// from when its holder was told it held the lock until it was done, and
/// its lock's deadline, on the one monotonic clock.
#[derive(Debug, Clone, Copy)]
struct Section {
    client: usize,
    thread: usize,
    acquired: Instant,
    done: Instant,
    deadline: Instant,
}

impl Section {
    /// Done at or after its deadline: the holder, descheduled, overran its
    /// validity, and its section was protected only until the deadline.
    fn overran(&self) -> bool {
        self.done >= self.deadline
    }

    /// The end of the part the lock protects.
    fn end(&self) -> Instant {
        self.done.min(self.deadline)
    }
}

/// Pairs of overlapping sections: sorted by the instant each began, each
/// must begin at or after the latest end before it.
fn overlaps(mut sections: Vec<Section>) -> Vec<(Section, Section)> {
    sections.sort_by_key(|s| s.acquired);
    let mut found = Vec::new();
    let mut latest: Option<Section> = None;
    for s in sections {
        if let Some(prev) = latest
            && s.acquired < prev.end()
        {
            found.push((prev, s));
        }
        if latest.is_none_or(|prev| s.end() > prev.end()) {
            latest = Some(s);
        }
    }
    found
}

/// Mutual exclusion among notified waiters: threads of several shared
/// clients contend for one resource with short holds. Most holders
/// release (the next one is woken by the release, in its own client at
/// once, in the others by the published message); every 25th keeps the
/// lock, so that the next holder gets it at the key's expiry. No two
/// sections may overlap while their locks are valid, and at most 1 % may
/// end past their lock's validity (a holder descheduled for most of the
/// TTL on a loaded machine: its fault, not the lock's, but bounded). A
/// flag set on entry would call such an overrun two holders at once; the
/// sections, checked afterwards on one clock, tell them apart, as
/// `tests/safety.rs` does.
#[test]
fn waiters_woken_by_releases_never_hold_the_lock_together() {
    const CLIENTS: usize = 3;
    const THREADS: usize = 4;
    const SECTIONS: usize = 300;
    const KEEP_EVERY: usize = 25;
    const BOUND: Duration = Duration::from_secs(60);
    // Short, so that a kept lock is handed over by expiry soon; long
    // compared to a hold, so that only a thread descheduled for most of a
    // second overruns.
    const TTL: Duration = Duration::from_secs(1);
    let masters = cluster(3);
    let urls = masters.urls();
    let clients: Vec<SharedRedlock> = (0..CLIENTS).map(|_| shared(&urls)).collect();
    let taken = AtomicUsize::new(0);
    let gave_up = AtomicUsize::new(0);
    let start = Barrier::new(CLIENTS * THREADS);
    let end = Instant::now() + BOUND;
    let sections: Vec<Section> = thread::scope(|scope| {
        let threads: Vec<_> = clients
            .iter()
            .enumerate()
            .flat_map(|(c, redlock)| (0..THREADS).map(move |t| (c, t, redlock)))
            .map(|(c, t, redlock)| {
                let (taken, gave_up, start) = (&taken, &gave_up, &start);
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    start.wait();
                    while taken.load(Ordering::SeqCst) < SECTIONS && Instant::now() < end {
                        let lock = match redlock.acquire_with(R, TTL, &waiting()) {
                            Ok(lock) => lock,
                            Err(Error::Held(_)) => {
                                // Gave up after MAX_WAIT (at once if it
                                // polls): not this test's subject.
                                gave_up.fetch_add(1, Ordering::SeqCst);
                                thread::sleep(Duration::from_millis(1));
                                continue;
                            }
                            Err(e) => panic!("client {c} thread {t}: {e}"),
                        };
                        let acquired = Instant::now();
                        let n = taken.fetch_add(1, Ordering::SeqCst);
                        if n % 10 == 0 {
                            thread::sleep(Duration::from_millis(1));
                        } else {
                            thread::yield_now();
                        }
                        mine.push(Section {
                            client: c,
                            thread: t,
                            acquired,
                            done: Instant::now(),
                            deadline: lock.deadline(),
                        });
                        if n % KEEP_EVERY != KEEP_EVERY - 1 {
                            redlock
                                .release(&lock)
                                .unwrap_or_else(|e| panic!("client {c} thread {t}: {e}"));
                        }
                    }
                    mine
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let overruns = sections.iter().filter(|s| s.overran()).count();
    let found = overlaps(sections.clone());
    if let Some((a, b)) = found.first() {
        panic!(
            "{} pairs of sections overlap while both locks were valid, the first: client {} \
             thread {} {a:?}, then client {} thread {} {b:?}",
            found.len(),
            a.client,
            a.thread,
            b.client,
            b.thread
        );
    }
    assert!(
        overruns * 100 <= sections.len(),
        "{overruns} of {} sections overran their validity: more than 1 %",
        sections.len()
    );
    assert!(
        sections.len() >= SECTIONS,
        "{} sections in {BOUND:?}, {} waits given up after {MAX_WAIT:?}",
        sections.len(),
        gave_up.load(Ordering::SeqCst)
    );
}

/// Several waiters in one client: after the release each gets the lock in
/// turn, holds it briefly and releases it. With the key's TTL longer than
/// the waiters' `MAX_WAIT`, only the release notifications and the
/// client's own releases can hand it over.
#[test]
fn several_waiters_in_one_client_each_get_the_lock_in_turn_after_a_release() {
    const WAITERS: usize = 8;
    let masters = cluster(3);
    let urls = masters.urls();
    let (mut holder, held) = hold(&urls);
    let b = shared(&urls);
    let inside = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(WAITERS));
    let (tx, outcomes) = mpsc::channel();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|w| {
            let (b, inside, start, tx) = (
                b.clone(),
                Arc::clone(&inside),
                Arc::clone(&start),
                tx.clone(),
            );
            thread::spawn(move || {
                start.wait();
                let outcome = b.acquire_with(R, HOLD_TTL, &waiting()).map(|lock| {
                    assert!(
                        !inside.swap(true, Ordering::SeqCst),
                        "waiter {w}: two holders at once"
                    );
                    thread::sleep(Duration::from_millis(2));
                    inside.store(false, Ordering::SeqCst);
                    b.release(&lock)
                });
                let _ = tx.send((w, outcome));
            })
        })
        .collect();
    drop(tx);
    wait_numsub(masters.servers(), 1, "while the waiters wait");
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a waiter returned while the holder held {R}"
    );
    holder
        .release(&held)
        .unwrap_or_else(|e| panic!("the holder's release: {e}"));
    let deadline = Instant::now() + MAX_WAIT + HUNG;
    let mut order = Vec::new();
    for _ in 0..WAITERS {
        let left = deadline.saturating_duration_since(Instant::now());
        match outcomes.recv_timeout(left) {
            Ok((w, Ok(Ok(())))) => order.push(w),
            Ok((w, Ok(Err(e)))) => panic!("waiter {w}'s release: {e}"),
            Ok((w, Err(e))) => panic!("waiter {w}, after {order:?} had the lock: {e}"),
            // A waiter panicked: its join below says why.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!(
                    "waiters hung: only {order:?} had the lock {:?} after the release",
                    MAX_WAIT + HUNG
                )
            }
        }
    }
    for waiter in waiters {
        if let Err(panic) = waiter.join() {
            std::panic::resume_unwind(panic);
        }
    }
    assert_eq!(order.len(), WAITERS, "only {order:?} got the lock");
    wait_numsub(masters.servers(), 0, "once every waiter has had the lock");
}

/// A master stopped with SIGSTOP for the guard's life: continued when the
/// guard is dropped, also when the test fails.
struct Stopped<'a>(&'a mut Server);

impl<'a> Stopped<'a> {
    fn new(server: &'a mut Server) -> Stopped<'a> {
        server.pause().unwrap_or_else(|e| panic!("{e}"));
        Stopped(server)
    }

    fn resume(&mut self) {
        self.0.resume().unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        let _ = self.0.resume();
    }
}

/// The local port of the one connection subscribed on `server` (`CLIENT
/// LIST TYPE pubsub`).
fn subscriber_port(server: &Server) -> u16 {
    let reply = connect(server).cmd(&[
        "CLIENT".into(),
        "LIST".into(),
        "TYPE".into(),
        "pubsub".into(),
    ]);
    let Reply::Bulk(list) = &reply else {
        panic!("CLIENT LIST on {}: {reply:?}", server.url());
    };
    let list = String::from_utf8_lossy(list);
    let ports: Vec<u16> = list
        .lines()
        .filter_map(|line| {
            let addr = line.split(' ').find_map(|f| f.strip_prefix("addr="))?;
            addr.rsplit(':').next()?.parse().ok()
        })
        .collect();
    assert_eq!(ports.len(), 1, "subscribers on {}: {list}", server.url());
    ports[0]
}

/// Whether this machine has an established TCP connection from local port
/// `local` to port `remote` (`/proc/net/tcp`, state 01), whatever its
/// process does: a stopped master's kernel keeps the connections to it.
fn established(local: u16, remote: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_else(|e| panic!("reading /proc/net/tcp: {e}"));
    let port = |addr: &str| {
        addr.rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 3
            && port(fields[1]) == Some(local)
            && port(fields[2]) == Some(remote)
            && fields[3] == "01"
    })
}

/// A master stopped with SIGSTOP keeps its connections
/// open (its kernel takes the bytes) and answers nothing. The shared
/// client's subscriber connection to it is dropped once a SUBSCRIBE has
/// gone unconfirmed past the stall limit, instead of counting as listening
/// for as long as the master is stopped; waiters are still woken through
/// the two live masters; and once the master continues, a new subscriber
/// connection subscribes there again.
#[test]
fn a_subscriber_connection_to_a_stopped_master_is_dropped_and_made_again() {
    const WAITERS: usize = 6;
    /// Far past the stall limit, which is the per-instance timeout here
    /// (2 s).
    const DROPPED: Duration = Duration::from_secs(15);
    /// The holder's TTL and the waiters' patience: far longer than every
    /// wait of the test put together on a loaded machine (with the
    /// suite's 30 s and 20 s, a slow run saw the waiters give up, or the
    /// holder's keys expire, before the master continued).
    const LONG: Duration = Duration::from_secs(300);
    let mut masters = cluster(3);
    let urls = masters.urls();
    let resources: Vec<String> = (0..WAITERS)
        .map(|k| format!("notify:stopped:{k}"))
        .collect();
    let mut holder = single(&urls);
    let mut held: Vec<Lock> = resources
        .iter()
        .map(|r| {
            holder
                .try_acquire(r.clone(), LONG)
                .unwrap_or_else(|e| panic!("the holder takes {r}: {e}"))
        })
        .collect();
    let mut config = config(&urls);
    config.connect_timeout = Duration::from_secs(1);
    let b = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let wait_for = |resource: &String| {
        let (b, resource) = (b.clone(), resource.clone());
        let patient = waiting().with_max_wait(Some(LONG));
        Waiter::spawn(move || b.acquire_with(resource, LONG, &patient))
    };
    let mut waiters = vec![wait_for(&resources[0])];
    wait_numsub_of(
        masters.servers(),
        &resources[..1],
        1,
        "while one waiter waits",
    );
    let port = subscriber_port(&masters[2]);
    let stopped_port = masters[2].port();
    assert!(established(port, stopped_port), "B's subscriber connection");
    let (live, rest) = masters.servers_mut().split_at_mut(2);
    let mut stopped = Stopped::new(&mut rest[0]);
    // New resources waited for: their SUBSCRIBEs go unconfirmed there.
    waiters.extend(resources[1..].iter().map(wait_for));
    assert!(
        eventually(DROPPED, || !established(port, stopped_port)),
        "B's subscriber connection to the stopped master (local port {port}) still established \
         after {DROPPED:?}"
    );
    // Woken through the live masters.
    let half = WAITERS / 2;
    for lock in held.drain(..half) {
        holder
            .release(&lock)
            .unwrap_or_else(|e| panic!("the holder's release, one master stopped: {e}"));
    }
    for (waiter, resource) in waiters.drain(..half).zip(&resources) {
        let lock = waiter
            .outcome()
            .unwrap_or_else(|e| panic!("the waiter for {resource}, one master stopped: {e}"));
        b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    }
    stopped.resume();
    wait_numsub_of(live, &resources[half..], 1, "after the master continued");
    wait_numsub_of(
        std::slice::from_ref(&*stopped.0),
        &resources[half..],
        1,
        "on the master that continued",
    );
    for lock in held.drain(..) {
        holder
            .release(&lock)
            .unwrap_or_else(|e| panic!("the holder's release: {e}"));
    }
    for (waiter, resource) in waiters.into_iter().zip(&resources[half..]) {
        let lock = waiter
            .outcome()
            .unwrap_or_else(|e| panic!("the waiter for {resource}: {e}"));
        b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    }
    drop(stopped);
    wait_numsub_of(
        masters.servers(),
        &resources,
        0,
        "once every waiter has had the lock",
    );
}

/// Racers for a free lock that each take one master split the votes:
/// each is refused by a quorum, but of *different* holders, who will each
/// clean up their key at once, quietly (a refused attempt's cleanup
/// publishes nothing). A waiter that took such refusals for a holder's
/// lock waited for the keys' TTL, and so did every racer: 4 processes of 2
/// threads on one resource managed 8 to 89 sections a second, each
/// process's longest wait the whole run. Here three racers' keys stand, one
/// per master, and go without a word once the waiter has been refused;
/// the waiter must take the lock well within its patience, and the keys'
/// TTL is longer than that.
#[test]
fn racers_that_split_the_masters_are_told_from_a_holder_and_not_waited_for() {
    let masters = cluster(3);
    let urls = masters.urls();
    for (server, racer) in masters.iter().zip(["racer-a", "racer-b", "racer-c"]) {
        let set = connect(server).cmd(&[
            Arg::Bytes(b"SET"),
            Arg::Bytes(R.as_bytes()),
            Arg::Bytes(racer.as_bytes()),
            Arg::Bytes(b"PX"),
            Arg::Int(i64::try_from(HOLD_TTL.as_millis()).unwrap_or(i64::MAX)),
        ]);
        assert_eq!(set, Reply::Status("OK".into()), "SET on {}", server.url());
    }
    let b = shared(&urls);
    let before: Vec<Calls> = masters.iter().map(calls).collect();
    let waiter = Waiter::shared(&b);
    wait_refused(masters.servers(), &before, "while the racers' keys stand");
    assert!(waiter.is_waiting(), "B took {R} from three racers");
    for server in masters.iter() {
        let del = connect(server).cmd(&[Arg::Bytes(b"DEL"), Arg::Bytes(R.as_bytes())]);
        assert_eq!(del, Reply::Integer(1), "DEL on {}", server.url());
    }
    // Nothing blocks B now; its patience (MAX_WAIT) would end its wait
    // with one more attempt, which would then succeed too: it must be done
    // long before.
    assert!(
        eventually(SETTLE, || !waiter.is_waiting()),
        "B still waited {SETTLE:?} after the racers' keys were gone"
    );
    let lock = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("B, once the racers' keys were gone: {e}"));
    assert!(holding(masters.servers(), R, &lock) >= 2);
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

/// Waiters in two processes, a lock
/// held elsewhere on two of three masters, the third free. Each waiting
/// attempt wins the free master and is refused by the other two; its
/// cleanup deleted the key it had just set there, and the release script
/// published that, waking the other process's waiter into the same
/// attempt, whose cleanup woke the first again: a storm at round-trip rate
/// until the holder's keys expired. The cleanup of an attempt that found
/// the lock held elsewhere now publishes nothing, and each waiter waits for
/// the holder's expiry.
#[test]
fn a_cleanup_of_an_attempt_refused_elsewhere_wakes_no_other_process() {
    let masters = cluster(3);
    let urls = masters.urls();
    let held_ms = 1_500;
    common::hold_elsewhere([&masters[0], &masters[1]], R, held_ms);
    let before = calls(&masters[2]);
    let waiters: Vec<Waiter> = (0..2)
        .map(|_| {
            let redlock = shared(&urls);
            Waiter::spawn(move || {
                let lock = redlock.acquire_with(R, HOLD_TTL, &waiting())?;
                redlock.release(&lock)?;
                Ok(lock)
            })
        })
        .collect();
    for waiter in waiters {
        // Released already, inside the waiter.
        let _released = waiter
            .outcome()
            .unwrap_or_else(|e| panic!("a waiter, after the holder's expiry: {e}"));
    }
    let after = calls(&masters[2]);
    // Each waiter: a first attempt, a waiting one, and a few after the
    // expiry or the other's release (each an attempt and its cleanup).
    let attempts = after.set - before.set;
    assert!(
        attempts <= 20,
        "{attempts} acquire attempts reached the free master while the lock was held \
         elsewhere for {held_ms} ms (before {before:?}, after {after:?}): the waiters woke \
         each other"
    );
}

#[test]
fn a_release_with_a_waiter_in_the_same_client_hands_the_lock_over_unannounced() {
    let masters = cluster(3);
    let (servers, urls) = (masters.servers(), masters.urls());
    for handovers in [8, 0] {
        let mut config = config(&urls);
        config.local_handovers = handovers;
        let b = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
        let first = b
            .try_acquire(R, HOLD_TTL)
            .unwrap_or_else(|e| panic!("the first holder takes {R}: {e}"));
        let waiter = refused_waiter(servers, &b);
        let before = calls_now(servers);
        b.release(&first)
            .unwrap_or_else(|e| panic!("the first holder's release: {e}"));
        let next = waiter
            .outcome()
            .unwrap_or_else(|e| panic!("the waiter, after the release: {e}"));
        assert_ne!(next.token(), first.token(), "a fresh token");
        assert!(
            next.remaining() > HOLD_TTL - MAX_WAIT,
            "the waiter's own TTL: {:?} left",
            next.remaining()
        );
        assert!(
            holding(servers, R, &next) >= 2,
            "a quorum holds the waiter's token"
        );
        // The waiter's attempt left right behind the release: nobody else
        // was told the lock was free.
        let published = published_since(servers, &before);
        if handovers > 0 {
            assert_eq!(published, [0, 0, 0], "handed over unannounced");
            // Right behind the release (its one script), the attempt is a
            // plain SET NX, not the waiting script: no Lua to run for it.
            let plain = || {
                servers.iter().zip(&before).all(|(s, b)| {
                    let now = calls(s);
                    (now.scripts - b.scripts, now.set - b.set) == (1, 1)
                })
            };
            assert!(
                eventually(SETTLE, plain),
                "the release's script and a plain SET on every master: {:?}",
                servers
                    .iter()
                    .zip(&before)
                    .map(|(s, b)| {
                        let now = calls(s);
                        (now.scripts - b.scripts, now.set - b.set)
                    })
                    .collect::<Vec<_>>()
            );
        } else {
            // Without hand-overs the release is announced; the last
            // master's reply may come after the release returns.
            let every = || published_since(servers, &before).iter().all(|&p| p == 1);
            assert!(eventually(SETTLE, every), "announced: {published:?}");
        }
        // With no one waiting, a release is announced.
        let before = calls_now(servers);
        b.release(&next)
            .unwrap_or_else(|e| panic!("the waiter's release: {e}"));
        let every = || published_since(servers, &before).iter().all(|&p| p == 1);
        assert!(
            eventually(SETTLE, every),
            "the last release announced: {:?}",
            published_since(servers, &before)
        );
    }
}

/// A row of hand-overs ends after `Config::local_handovers`
/// only while other processes compete for the lock. Once a row has ended
/// (its release announced) and no other client's release is heard, this
/// client's callers pass the lock on until the window ends the row: the
/// count would only make them race, in vain, for their own lock. A client
/// takes others to compete until a row has ended so.
#[test]
fn with_no_other_process_heard_a_row_of_hand_overs_goes_on_past_its_count() {
    const X: &str = "notify:x";
    let masters = cluster(3);
    let (servers, urls) = (masters.servers(), masters.urls());
    let mut config = config(&urls);
    config.local_handovers = 1;
    config.local_handover_window = Duration::from_secs(3600);
    // A release whose next holder is not queued yet waits for it (rather
    // than announce the release, which the check below would misread).
    config.local_handover_linger = Duration::from_secs(2);
    let b = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let c = shared(&urls);
    let first = b
        .try_acquire(R, HOLD_TTL)
        .unwrap_or_else(|e| panic!("the first holder takes {R}: {e}"));
    // A caller of B waiting for R and X together, X held by C: it listens
    // to R's releases throughout, so that B keeps what it learned of R
    // even while none of its callers waits in R's queue.
    let x = c
        .try_acquire(X, HOLD_TTL)
        .unwrap_or_else(|e| panic!("C takes {X}: {e}"));
    let listener = {
        let b = b.clone();
        Waiter::spawn(move || b.acquire_many_with([R, X], HOLD_TTL, &waiting()))
    };
    wait_numsub_of(servers, &[X], 1, "while B's caller waits for R and X");
    // The first row: one hand-over, then announced (no row has ended yet,
    // so other processes are taken to compete).
    let waiter = refused_waiter(servers, &b);
    b.release(&first)
        .unwrap_or_else(|e| panic!("the first holder's release: {e}"));
    let mut lock = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("the first waiter: {e}"));
    let waiter = Waiter::shared(&b);
    let before = calls_now(servers);
    b.release(&lock)
        .unwrap_or_else(|e| panic!("the first row's last release: {e}"));
    let every = || published_since(servers, &before).iter().all(|&p| p == 1);
    assert!(
        eventually(SETTLE, every),
        "the first row ends at its count, announced: {:?}",
        published_since(servers, &before)
    );
    lock = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("the waiter after the announced release: {e}"));
    // Nobody else was heard since: the next row goes on past its count,
    // each release unannounced, each next holder with a fresh token.
    let before = calls_now(servers);
    for handed in 1..=3 {
        let waiter = Waiter::shared(&b);
        b.release(&lock)
            .unwrap_or_else(|e| panic!("hand-over {handed}'s release: {e}"));
        let next = waiter
            .outcome()
            .unwrap_or_else(|e| panic!("hand-over {handed}'s waiter: {e}"));
        assert_ne!(next.token(), lock.token(), "a fresh token");
        lock = next;
    }
    assert_eq!(
        published_since(servers, &before),
        [0, 0, 0],
        "three hand-overs in a row, with a count of 1 and no other process heard, all \
         unannounced"
    );
    assert!(
        holding(servers, R, &lock) >= 2,
        "a quorum holds the last holder's token"
    );
    // Then the listener gets both.
    c.release(&x)
        .unwrap_or_else(|e| panic!("C's release of {X}: {e}"));
    b.release(&lock)
        .unwrap_or_else(|e| panic!("the last holder's release: {e}"));
    let both = listener
        .outcome()
        .unwrap_or_else(|e| panic!("the caller waiting for R and X: {e}"));
    b.release(&both)
        .unwrap_or_else(|e| panic!("the release of R and X: {e}"));
}

/// A row of hand-overs ends with an announced release, whose messages
/// tell this client's own waiter as they tell other processes'. Where the
/// user may SUBSCRIBE but not PUBLISH (the release script's publish is
/// refused, the release itself done), no message comes: the waiter is
/// told when the release is done, rather than left to the lock's expiry
/// (and to the mark of a lock held here, which a message would have
/// cleared). The simulator found it (seed 687,841: 663 ms past its
/// bound); before, this waiter waited for the held lock's validity to end
/// (about 30 s), far past [`SETTLE`].
#[test]
fn a_row_ended_where_publish_is_refused_still_tells_the_clients_own_waiter() {
    let masters = cluster(3);
    let servers = masters.servers();
    common::set_user(masters.iter(), "locker", "on >pw ~* &* +@all -publish");
    let urls = common::urls_as(masters.iter(), "locker", "pw");
    let mut config = config(&urls);
    config.local_handovers = 1;
    config.local_handover_window = Duration::from_secs(3600);
    // A release whose next holder is not queued yet waits for it.
    config.local_handover_linger = Duration::from_secs(2);
    let b = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    // One hand-over, then the row's end.
    let lock = handed_over(servers, &b);
    let waiter = Waiter::shared(&b);
    let before = calls_now(servers);
    b.release(&lock)
        .unwrap_or_else(|e| panic!("the row's last release: {e}"));
    assert!(
        eventually(SETTLE, || !waiter.is_waiting()),
        "the waiter still waits {SETTLE:?} after a release no master published"
    );
    let next = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("the waiter, after a release no master published: {e}"));
    assert_eq!(
        published_since(servers, &before),
        [0, 0, 0],
        "PUBLISH refused to the user"
    );
    assert!(
        holding(servers, R, &next) >= 2,
        "a quorum holds the waiter's token"
    );
    b.release(&next)
        .unwrap_or_else(|e| panic!("the waiter's release: {e}"));
}

/// A lock passing between a client's callers, released while
/// none of them waits, is held a moment for one coming back
/// (`Config::local_handover_linger`), and handed to it unannounced; with
/// no linger the release is announced, and every process's waiters would
/// race the caller coming back. A linger that runs out announces the
/// release, and the lock is free to all.
#[test]
fn a_lock_passing_between_callers_waits_a_moment_for_the_next_one() {
    let masters = cluster(3);
    let (servers, urls) = (masters.servers(), masters.urls());
    for linger in [HUNG, Duration::ZERO, Duration::from_millis(50)] {
        let mut config = config(&urls);
        config.local_handover_window = Duration::from_secs(3600);
        config.local_handover_linger = linger;
        let b = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
        // Two callers of B take the lock in turn: a hand-over.
        let second = handed_over(servers, &b);
        // The second releases with nobody waiting in B.
        let before = calls_now(servers);
        let releaser = {
            let b = b.clone();
            thread::spawn(move || b.release(&second))
        };
        if linger == Duration::from_millis(50) {
            // Nobody comes: announced once the linger is over, and the
            // lock is free to another client.
            let released = releaser.join().unwrap_or_else(|_| panic!("the releaser"));
            released.unwrap_or_else(|e| panic!("the release nobody came for: {e}"));
            let every = || published_since(servers, &before).iter().all(|&p| p == 1);
            assert!(eventually(SETTLE, every), "announced after the linger");
            let c = shared(&urls);
            let other = c
                .try_acquire(R, HOLD_TTL)
                .unwrap_or_else(|e| panic!("another client, after the linger: {e}"));
            c.release(&other).unwrap_or_else(|e| panic!("{e}"));
            continue;
        }
        let mut releaser = Some(releaser);
        let mut released = None;
        if linger.is_zero() {
            // Announced at once: done before the first caller comes back.
            released = releaser.take().map(|r| r.join());
        } else if let Some(waiting) = &releaser {
            // Time for the release to reach B's loop, where it waits for a
            // caller (come earlier, the caller is handed the lock all the
            // same: it waits behind the lock held here).
            eventually(Duration::from_millis(200), || waiting.is_finished());
            assert!(!waiting.is_finished(), "the release waits for a caller");
        }
        // The first caller comes back for the lock.
        let third = b
            .acquire_with(R, HOLD_TTL, &waiting())
            .unwrap_or_else(|e| panic!("the caller coming back: {e}"));
        let released = released
            .or_else(|| releaser.map(|r| r.join()))
            .unwrap_or_else(|| panic!("the releaser"))
            .unwrap_or_else(|_| panic!("the releaser panicked"));
        released.unwrap_or_else(|e| panic!("the second holder's release: {e}"));
        assert!(
            holding(servers, R, &third) >= 2,
            "a quorum holds the third token"
        );
        let published = published_since(servers, &before);
        if linger > Duration::ZERO {
            assert_eq!(published, [0, 0, 0], "handed over unannounced");
            // Its release would wait for a caller again: the keys go by
            // hand.
            for server in servers {
                connect(server).cmd(&["DEL".into(), R.into()]);
            }
        } else {
            let every = || published_since(servers, &before).iter().all(|&p| p == 1);
            assert!(eventually(SETTLE, every), "announced: {published:?}");
            b.release(&third).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// A fenced waiter in the same client is handed the lock too,
/// unannounced, and its fence is new and larger: its two-phase acquire
/// runs behind the release, reading the fence after it.
#[test]
fn a_fenced_waiter_in_the_same_client_is_handed_the_lock_with_a_larger_fence() {
    let masters = cluster(3);
    let (servers, urls) = (masters.servers(), masters.urls());
    let b = shared(&urls);
    let first = b
        .try_acquire_fenced(R, HOLD_TTL)
        .unwrap_or_else(|e| panic!("the first holder takes {R} fenced: {e}"));
    let before = calls_now(servers);
    let waiter = {
        let b = b.clone();
        Waiter::spawn(move || b.acquire_fenced_with(R, HOLD_TTL, &waiting()))
    };
    // Its first attempt (refused everywhere, so no cleanup follows it),
    // then, subscribed, its second attempt: under way or refused, it is
    // handed the lock.
    wait_numsub(servers, 1, "while the fenced waiter waits");
    let tried_again = || {
        servers
            .iter()
            .zip(&before)
            .all(|(s, b)| calls(s).scripts >= b.scripts + 2)
    };
    assert!(
        eventually(SETTLE, tried_again),
        "the fenced waiter's second attempt reached every master"
    );
    let before = calls_now(servers);
    b.release(&first)
        .unwrap_or_else(|e| panic!("the first holder's release: {e}"));
    let next = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("the fenced waiter, after the release: {e}"));
    assert_ne!(next.token(), first.token(), "a fresh token");
    assert!(
        next.fence() > first.fence(),
        "fence {:?} after {:?}",
        next.fence(),
        first.fence()
    );
    assert!(
        holding(servers, R, &next) >= 2,
        "a quorum holds the fenced waiter's token"
    );
    assert_eq!(
        published_since(servers, &before),
        [0, 0, 0],
        "handed over unannounced"
    );
    b.release(&next)
        .unwrap_or_else(|e| panic!("the fenced waiter's release: {e}"));
}

#[test]
fn after_a_row_of_hand_overs_the_release_is_announced_and_another_process_gets_its_turn() {
    // The row ends at its count, or at its window.
    row_of_hand_overs_then_announced(1, Duration::from_secs(3600));
    row_of_hand_overs_then_announced(100, Duration::from_millis(200));
}

/// A shared client hands a lock over once, then, the row at its end (one
/// hand-over of `handovers`, or `window` past), announces the release.
fn row_of_hand_overs_then_announced(handovers: u32, window: Duration) {
    let masters = cluster(3);
    let (servers, urls) = (masters.servers(), masters.urls());
    let mut config = config(&urls);
    config.local_handovers = handovers;
    config.local_handover_window = window;
    let b = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let c = shared(&urls);
    let first = b
        .try_acquire(R, HOLD_TTL)
        .unwrap_or_else(|e| panic!("the first holder takes {R}: {e}"));
    // Another process waits first, then one of b's own.
    let other = refused_waiter(servers, &c);
    let own = refused_waiter(servers, &b);
    let before = calls_now(servers);
    let row_began = Instant::now();
    b.release(&first)
        .unwrap_or_else(|e| panic!("the first holder's release: {e}"));
    let handed = own
        .outcome()
        .unwrap_or_else(|e| panic!("b's waiter, after b's release: {e}"));
    assert_eq!(
        published_since(servers, &before),
        [0, 0, 0],
        "handed over unannounced"
    );
    assert!(
        other.is_waiting(),
        "the other process's waiter got a lock b's waiter holds"
    );
    // b's next waiter waits for the lock held here (it sends nothing: no
    // refusal to wait for); the row is at its end, so the release is
    // announced to every process. The waiter's order is submitted here,
    // so that the loop takes it before the release: a waiter started on a
    // thread of its own could come after the release, find the lock free
    // and race the other process, its refused attempt publishing a second
    // message (seen once in ten runs on a loaded machine).
    let own = {
        let pending = b.acquire_with_async(R, HOLD_TTL, &waiting());
        Waiter::spawn(move || block_on(pending, MAX_WAIT + HUNG))
    };
    if handovers > 1 {
        // Not a timed assertion: the row must have lasted its window.
        while row_began.elapsed() <= window {
            thread::sleep(window / 10);
        }
    }
    let before = calls_now(servers);
    b.release(&handed)
        .unwrap_or_else(|e| panic!("the handed lock's release: {e}"));
    let every = || published_since(servers, &before).iter().all(|&p| p == 1);
    assert!(
        eventually(SETTLE, every),
        "the release after the budget announced: {:?}",
        published_since(servers, &before)
    );
    // Both hear it; one gets the lock, then the other.
    assert!(
        eventually(SETTLE, || !other.is_waiting() || !own.is_waiting()),
        "neither waiter got the announced lock"
    );
    // Each lock is released through the client that took it: through
    // another, the release may reach the slowest master before the
    // owner's own SET there (the owner returns at its quorum), and that
    // key would stay for its TTL.
    let (first_in, second_in, names, firsts, seconds) = if other.is_waiting() {
        let names = ("b's waiter", "the other process's waiter");
        (own, other, names, &b, &c)
    } else {
        let names = ("the other process's waiter", "b's waiter");
        (other, own, names, &c, &b)
    };
    let lock = first_in
        .outcome()
        .unwrap_or_else(|e| panic!("{}: {e}", names.0));
    assert!(
        holding(servers, R, &lock) >= 2,
        "{} holds a quorum",
        names.0
    );
    assert!(second_in.is_waiting(), "{} got a held lock", names.1);
    firsts
        .release(&lock)
        .unwrap_or_else(|e| panic!("{}'s release: {e}", names.0));
    let last = second_in
        .outcome()
        .unwrap_or_else(|e| panic!("{}: {e}", names.1));
    seconds
        .release(&last)
        .unwrap_or_else(|e| panic!("{}'s release: {e}", names.1));
    released_everywhere(servers, &last);
}

/// A new acquire does not race the process a release named.
/// C takes the lock and releases it while B's waiter waits, so B knows C
/// (seated in B's turns); then C goes away. B's waiter's lock, released
/// with nobody else waiting in B, is announced naming C, whose turn it
/// is; an acquire through B right after waits what B's woken waiters
/// would give C (four wake spreads and a row's window), rather than take
/// at once the lock C was named to take: the releasing process's callers
/// coming back did so after 28% of such releases (4 x 2 processes and
/// threads, hold 0, read off a master's MONITOR). C being gone, B's
/// acquire then takes the lock. Not a timed assertion: the wait has that
/// lower bound on any machine. Fails with new acquires trying at once
/// (they took the lock within milliseconds).
#[test]
fn a_new_acquire_gives_the_process_a_release_named_its_turn() {
    let masters = cluster(3);
    let (servers, urls) = (masters.servers(), masters.urls());
    let mut config = config(&urls);
    config.wake_spread = Duration::from_millis(250);
    let patience = config.wake_spread * 4;
    let b = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let lock = {
        let c = shared(&urls);
        let held = c
            .try_acquire(R, HOLD_TTL)
            .unwrap_or_else(|e| panic!("C takes {R}: {e}"));
        let waiter = refused_waiter(servers, &b);
        c.release(&held)
            .unwrap_or_else(|e| panic!("C's release: {e}"));
        waiter
            .outcome()
            .unwrap_or_else(|e| panic!("B's waiter, after C's release: {e}"))
    };
    let released_at = Instant::now();
    b.release(&lock)
        .unwrap_or_else(|e| panic!("B's release, naming C: {e}"));
    let fresh = Waiter::shared(&b)
        .outcome()
        .unwrap_or_else(|e| panic!("B's new acquire, C gone: {e}"));
    let waited = released_at.elapsed();
    assert!(
        waited >= patience,
        "B's new acquire took the lock {waited:?} after B's release named C, \
         within the {patience:?} C's turn lasts at least"
    );
    b.release(&fresh)
        .unwrap_or_else(|e| panic!("the new lock's release: {e}"));
    released_everywhere(servers, &fresh);
}

/// A multi-resource waiter listens to every one of its
/// resources' releases, not its first's alone, and joins no queue: a
/// holder of the second resource releasing it wakes the waiter, which
/// then takes the whole set, rather than after a retry delay (longer
/// here than the test waits for it).
#[test]
fn a_multi_resource_waiter_is_woken_by_the_release_of_any_of_its_resources() {
    let masters = cluster(3);
    let (servers, urls) = (masters.servers(), masters.urls());
    let b = shared(&urls);
    let mut holder = single(&urls);
    let set = ["notify:m1", "notify:m2"];
    let held = holder
        .try_acquire(set[1], HOLD_TTL)
        .unwrap_or_else(|e| panic!("the holder takes {}: {e}", set[1]));
    // Its retry delay, and so its fallback wait without a message, is
    // longer than the waiter is given to return: only the release's
    // message can end the wait in time.
    let patient = Retry::default()
        .with_attempts(2)
        .with_delay(2 * (MAX_WAIT + HUNG))
        .with_max_wait(None);
    let waiter = {
        let b = b.clone();
        Waiter::spawn(move || b.acquire_many_with(set, HOLD_TTL, &patient))
    };
    wait_numsub_of(servers, &set, 1, "while the multi-resource waiter waits");
    assert!(waiter.is_waiting(), "the waiter got a held set");
    holder
        .release(&held)
        .unwrap_or_else(|e| panic!("the holder's release: {e}"));
    let both = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("the multi-resource waiter, after the release: {e}"));
    assert_eq!(both.resources().len(), 2);
    for key in set {
        assert!(
            holding(servers, key, &both) >= 2,
            "a quorum holds {key} for the waiter"
        );
    }
    b.release(&both)
        .unwrap_or_else(|e| panic!("the multi-resource waiter's release: {e}"));
    wait_numsub_of(servers, &set, 0, "once the waiter released the set");
}

#[test]
fn a_fenced_waiter_is_woken_by_the_release_not_a_retry_delay() {
    let masters = cluster(3);
    let (servers, urls) = (masters.servers(), masters.urls());
    let b = shared(&urls);
    let mut holder = single(&urls);
    // A fenced waiter behind a fenced holder: the next fence is larger.
    let held = holder
        .try_acquire_fenced(R, HOLD_TTL)
        .unwrap_or_else(|e| panic!("the holder takes {R} fenced: {e}"));
    let waiter = {
        let b = b.clone();
        Waiter::spawn(move || b.acquire_fenced_with(R, HOLD_TTL, &waiting()))
    };
    wait_numsub(servers, 1, "while the fenced waiter waits");
    assert!(waiter.is_waiting(), "the fenced waiter got a held lock");
    holder
        .release(&held)
        .unwrap_or_else(|e| panic!("the fenced holder's release: {e}"));
    let fenced = waiter
        .outcome()
        .unwrap_or_else(|e| panic!("the fenced waiter, after the release: {e}"));
    assert!(
        fenced.fence() > held.fence(),
        "fence {:?} after {:?}",
        fenced.fence(),
        held.fence()
    );
    b.release(&fenced)
        .unwrap_or_else(|e| panic!("the fenced waiter's release: {e}"));
    wait_numsub(servers, 0, "once the fenced waiter released the lock");
}
