//! The lock engine against real local redis-server masters: acquire,
//! extend and release over N = 1, 3 and 5 masters, contention between
//! clients, masters that die, stall or restart, the script cache being
//! flushed, and the URL forms (unix socket, password, ACL user, database).
//!
//! Timeouts are generous so that a loaded machine does not fail a test:
//! nothing here asserts that something is fast, only that it finishes
//! within a bound far below the TTL. Checks through a second connection
//! poll with a deadline, since the engine returns as soon as a quorum has
//! answered and the other masters may still be working.

mod common;

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use common::{Options, Plain, Server, bulk, cluster, connect, eventually, master, master_with};
use redlock_mio::AddrError;
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::{
    Config, ConfigError, Error, Failure, Lock, LockCommands, Redlock, Retry, Token, Vote,
};

/// The usual TTL: long enough that no lock expires during a test, and
/// longer than [`WAIT`], so that a key cannot pass for released by
/// expiring while a test waits for it to go.
const TTL: Duration = Duration::from_secs(15);
/// A longer TTL, for extensions and stalled masters.
const LONG_TTL: Duration = Duration::from_secs(30);
/// How long a poll for a state change on a master may take.
const WAIT: Duration = Duration::from_secs(5);
/// A bound, far below the TTL, within which an operation facing dead or
/// stalled masters must return.
const PROMPT: Duration = Duration::from_secs(5);

/// Settings for the masters at `urls` with generous timeouts and a retry
/// policy that gives a recovering master several seconds.
fn config(urls: &[String]) -> Config {
    let mut config = Config::new(urls).unwrap_or_else(|e| panic!("{e}"));
    // The test's masters start empty: no lock predates them, and restart
    // quarantine (tests/quarantine.rs) would only keep them out at first.
    config.quarantine = None;
    config.per_instance_timeout = Duration::from_secs(1);
    config.connect_timeout = Duration::from_secs(2);
    config.retry = Retry::default()
        .with_attempts(100)
        .with_delay(Duration::from_millis(100))
        .with_max_wait(Some(WAIT));
    config
}

fn client(urls: &[String]) -> Redlock {
    Redlock::new(config(urls)).unwrap_or_else(|e| panic!("{e}"))
}

/// A plain connection to `server`, authenticated when it has a password.
fn plain(server: &Server) -> Plain {
    let mut c = connect(server);
    if let Some(pw) = server.password() {
        let reply = c.cmd(&["AUTH".into(), pw.into()]);
        assert!(reply.is_ok(), "AUTH: {reply:?}");
    }
    c
}

fn get(server: &Server, key: &str) -> Reply {
    plain(server).cmd(&["GET".into(), key.into()])
}

fn pttl(server: &Server, key: &str) -> i64 {
    match plain(server).cmd(&["PTTL".into(), key.into()]) {
        Reply::Integer(ms) => ms,
        other => panic!("PTTL {key}: {other:?}"),
    }
}

fn token_reply(token: &Token) -> Reply {
    bulk(token.as_str())
}

/// Waits until every master in `servers` holds `key` with `token`.
fn wait_held(servers: &[Server], key: &str, token: &Token) {
    for server in servers {
        assert!(
            eventually(WAIT, || get(server, key) == token_reply(token)),
            "{} should hold {key} = {token}, has {:?}",
            server.url(),
            get(server, key)
        );
    }
}

/// Waits until no master in `servers` holds `key` at all.
fn wait_gone(servers: &[Server], key: &str) {
    for server in servers {
        assert!(
            eventually(WAIT, || get(server, key) == Reply::Nil),
            "{} should not hold {key}, has {:?}",
            server.url(),
            get(server, key)
        );
    }
}

/// The failure of an error that carries one, panicking otherwise.
fn failure(err: &Error) -> &Failure {
    err.failure()
        .unwrap_or_else(|| panic!("expected a failed round, got {err:?}"))
}

/// Checks a failure lost to refusals: at most `granted` masters granted,
/// none failed, and enough refused that a quorum was out of reach.
fn assert_lost_to_refusals(fail: &Failure, n: usize, granted: usize) {
    assert_eq!(fail.votes.len(), n, "{fail}");
    assert_eq!(fail.quorum, n / 2 + 1, "{fail}");
    assert!(fail.granted <= granted, "{fail}");
    assert!(
        fail.refused > n - fail.quorum,
        "a quorum must be out of reach: {fail}"
    );
    // With N odd, N - Q + 1 = Q: a refusing majority.
    assert!(fail.refused >= fail.quorum, "{fail}");
    let counted = |want: fn(&Vote) -> bool| fail.votes.iter().filter(|v| want(&v.vote)).count();
    // A native extend tells a key gone from one another holds; both refuse.
    assert_eq!(
        counted(|v| matches!(v, Vote::Refused | Vote::Gone)),
        fail.refused,
        "{fail}"
    );
    assert_eq!(counted(|v| *v == Vote::Granted), fail.granted, "{fail}");
    assert_eq!(
        counted(|v| matches!(v, Vote::Failed(_))),
        0,
        "no master failed: {fail}"
    );
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[test]
fn acquire_extend_and_release_hold_and_free_the_key_on_every_master() {
    for n in [1, 3, 5] {
        let masters = cluster(n);
        let servers = masters.servers();
        let mut redlock = client(&masters.urls());
        assert_eq!(redlock.quorum(), n / 2 + 1, "N = {n}");

        let before = Instant::now();
        let mut lock = redlock
            .try_acquire("orders:42", TTL)
            .unwrap_or_else(|e| panic!("N = {n}: {e}"));
        assert_eq!(lock.resource(), b"orders:42");
        assert_eq!(lock.ttl(), TTL);
        assert_eq!(lock.extensions(), 0);
        let remaining = lock.remaining();
        assert!(
            !remaining.is_zero() && remaining <= TTL,
            "N = {n}: {remaining:?}"
        );
        assert!(lock.is_valid());
        assert!(
            lock.deadline() <= before + TTL,
            "validity never reaches past start + TTL"
        );

        let token = *lock.token();
        wait_held(servers, "orders:42", &token);
        for server in servers {
            let left = pttl(server, "orders:42");
            assert!(
                left <= ms(TTL) && left > ms(TTL) - 5_000,
                "N = {n}, {}: PTTL {left}",
                server.url()
            );
        }

        let old_deadline = lock.deadline();
        let before_extend = Instant::now();
        redlock
            .extend(&mut lock, LONG_TTL)
            .unwrap_or_else(|e| panic!("N = {n}: extend: {e}"));
        assert!(lock.deadline() > old_deadline, "N = {n}: deadline moved");
        assert!(lock.deadline() <= before_extend + LONG_TTL);
        assert_eq!(lock.ttl(), LONG_TTL);
        assert_eq!(lock.extensions(), 1);
        assert!(lock.remaining() > TTL && lock.remaining() <= LONG_TTL);
        assert_eq!(lock.token(), &token, "extending keeps the token");
        for server in servers {
            assert!(
                eventually(WAIT, || pttl(server, "orders:42") > ms(TTL)),
                "N = {n}, {}: PTTL {} not raised",
                server.url(),
                pttl(server, "orders:42")
            );
            assert!(pttl(server, "orders:42") <= ms(LONG_TTL));
            assert_eq!(get(server, "orders:42"), token_reply(&token));
        }

        redlock
            .release(&lock)
            .unwrap_or_else(|e| panic!("N = {n}: release: {e}"));
        wait_gone(servers, "orders:42");
    }
}

#[test]
fn of_two_clients_contending_for_one_resource_exactly_one_wins() {
    for n in [1, 3, 5] {
        let masters = cluster(n);
        let servers = masters.servers();
        let mut alice = client(&masters.urls());
        let mut bob = client(&masters.urls());

        let lock = alice
            .try_acquire("shared", TTL)
            .unwrap_or_else(|e| panic!("N = {n}: {e}"));
        wait_held(servers, "shared", lock.token());

        let err = bob
            .try_acquire("shared", TTL)
            .expect_err("the lock is held by alice");
        assert!(matches!(err, Error::Held(_)), "N = {n}: {err:?}");
        let fail = failure(&err);
        assert_lost_to_refusals(fail, n, 0);
        assert_eq!(fail.attempts, 1);
        // A plain attempt is not told whose lock it is.
        assert!(
            err.to_string()
                .starts_with("lock already held (by this client or another): "),
            "{err}"
        );

        // Bob's failed attempt and its release leave alice's keys alone.
        thread::sleep(Duration::from_millis(50));
        for server in servers {
            assert_eq!(get(server, "shared"), token_reply(lock.token()));
        }

        // Bob's retrying acquire gets the lock once alice lets go.
        let bobs = thread::scope(|s| {
            let waiter = s.spawn(|| bob.acquire("shared", TTL));
            thread::sleep(Duration::from_millis(300));
            alice.release(&lock).unwrap_or_else(|e| panic!("{e}"));
            waiter
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
        .unwrap_or_else(|e| panic!("N = {n}: bob after release: {e}"));
        wait_held(servers, "shared", bobs.token());
        bob.release(&bobs).unwrap_or_else(|e| panic!("{e}"));
        wait_gone(servers, "shared");
    }
}

#[test]
fn clients_racing_from_threads_at_the_same_instant_never_both_win() {
    const ROUNDS: usize = 15;
    for n in [1, 3, 5] {
        let masters = cluster(n);
        let urls = masters.urls();
        for threads in [2, 4] {
            let barrier = Barrier::new(threads);
            let per_thread: Vec<Vec<Result<Lock, Error>>> = thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let (urls, barrier) = (&urls, &barrier);
                        s.spawn(move || {
                            let mut redlock = client(urls);
                            // Connect before the race, so that the race is
                            // between SETs, not connects.
                            let warm = redlock
                                .try_acquire(format!("warm-{threads}-{t}"), TTL)
                                .unwrap_or_else(|e| panic!("warm-up: {e}"));
                            redlock.release(&warm).unwrap_or_else(|e| panic!("{e}"));
                            (0..ROUNDS)
                                .map(|round| {
                                    barrier.wait();
                                    redlock.try_acquire(format!("race-{threads}-{round}"), TTL)
                                })
                                .collect()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            });
            for round in 0..ROUNDS {
                let results: Vec<&Result<Lock, Error>> =
                    per_thread.iter().map(|r| &r[round]).collect();
                let winners: Vec<&Lock> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
                let context = format!("N = {n}, {threads} threads, round {round}: {results:?}");
                assert!(winners.len() <= 1, "two winners: {context}");
                // Two clients split N (odd) masters so that one gets a
                // majority; one master goes to exactly one client. More
                // clients on more masters may split the vote.
                if threads == 2 || n == 1 {
                    assert_eq!(winners.len(), 1, "exactly one winner: {context}");
                }
                for result in &results {
                    match result {
                        Ok(_) => {}
                        Err(err @ Error::Held(fail)) => {
                            assert!(fail.granted + fail.refused <= n, "{err}");
                            assert!(
                                fail.votes
                                    .iter()
                                    .all(|v| !matches!(v.vote, Vote::Failed(_))),
                                "no master failed: {context}"
                            );
                        }
                        Err(err) => panic!("unexpected error {err}: {context}"),
                    }
                }
                // The winner holds every master where it won; losers' keys
                // are released.
                let key = format!("race-{threads}-{round}");
                for server in masters.servers() {
                    assert!(
                        eventually(WAIT, || {
                            let value = get(server, &key);
                            value == Reply::Nil
                                || winners.iter().any(|w| value == token_reply(w.token()))
                        }),
                        "{}: a loser's key stays: {:?}; {context}",
                        server.url(),
                        get(server, &key)
                    );
                }
                if let Some(winner) = winners.first() {
                    let holding = masters
                        .iter()
                        .filter(|s| get(s, &key) == token_reply(winner.token()))
                        .count();
                    let quorum = n / 2 + 1;
                    assert!(holding >= quorum, "{context}");
                }
            }
        }
    }
}

#[test]
fn a_release_or_extend_with_a_wrong_token_is_not_held_and_changes_nothing() {
    let masters = cluster(3);
    let servers = masters.servers();
    let mut owner = client(&masters.urls());
    let mut stranger = client(&masters.urls());
    let lock = owner
        .try_acquire("guarded", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_held(servers, "guarded", lock.token());

    let wrong = Token::parse("wrong").unwrap_or_else(|e| panic!("{e}"));
    let mut forged = Lock::from_parts("guarded", wrong);

    let err = stranger
        .release(&forged)
        .expect_err("a wrong token releases nothing");
    assert!(matches!(err, Error::NotHeld(_)), "{err:?}");
    assert_lost_to_refusals(failure(&err), 3, 0);
    // The owner's own client, with a forged lock, fares no better.
    let err = owner.release(&forged).expect_err("wrong token");
    assert!(matches!(err, Error::NotHeld(_)), "{err:?}");
    for server in servers {
        assert_eq!(get(server, "guarded"), token_reply(lock.token()));
    }

    let before: Vec<i64> = servers.iter().map(|s| pttl(s, "guarded")).collect();
    let err = stranger
        .extend(&mut forged, LONG_TTL)
        .expect_err("a wrong token extends nothing");
    assert!(matches!(err, Error::NotHeld(_)), "{err:?}");
    assert_lost_to_refusals(failure(&err), 3, 0);
    assert_eq!(forged.extensions(), 0, "a failed extend counts nothing");
    assert_eq!(forged.ttl(), Duration::ZERO);
    for (server, before) in servers.iter().zip(before) {
        let after = pttl(server, "guarded");
        assert!(
            after <= before && after > before - 5_000,
            "{}: PTTL {before} -> {after}",
            server.url()
        );
        assert_eq!(get(server, "guarded"), token_reply(lock.token()));
    }

    // The right token releases from any client (as the command line does
    // with a printed token).
    let by_token = Lock::from_parts("guarded", *lock.token());
    stranger
        .release(&by_token)
        .unwrap_or_else(|e| panic!("release by token: {e}"));
    wait_gone(servers, "guarded");
    let err = owner.release(&lock).expect_err("already released");
    assert!(matches!(err, Error::NotHeld(_)), "{err:?}");
}

#[test]
fn a_failed_acquire_leaves_no_key_behind() {
    let masters = cluster(3);
    let servers = masters.servers();
    for server in &servers[..2] {
        let reply = plain(server).cmd(&[
            "SET".into(),
            "contested".into(),
            "other".into(),
            "PX".into(),
            Arg::Int(ms(LONG_TTL)),
        ]);
        assert!(reply.is_ok(), "{reply:?}");
    }
    let mut redlock = client(&masters.urls());
    let err = redlock
        .try_acquire("contested", TTL)
        .expect_err("two of three masters hold another token");
    assert!(matches!(err, Error::Held(_)), "{err:?}");
    let fail = failure(&err);
    assert_lost_to_refusals(fail, 3, 1);
    assert_eq!(fail.votes[0].vote, Vote::Refused, "{fail}");
    assert_eq!(fail.votes[1].vote, Vote::Refused, "{fail}");

    // The third master took the SET (or will); the release sent after the
    // failure, without waiting for replies, removes it.
    wait_gone(&servers[2..], "contested");
    for server in &servers[..2] {
        assert_eq!(get(server, "contested"), bulk("other"));
    }
    // Nothing arrives late either: the client's next round drains the
    // replies and the key stays gone.
    let probe = redlock
        .try_acquire("probe", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&probe).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(get(&servers[2], "contested"), Reply::Nil);
}

/// A failed attempt's cleanup goes where the attempt may have set its key,
/// not to the masters that refused it: a refusal says the SET changed
/// nothing there, and the attempt's token is its own (a retry takes a new
/// one), so a release there would only cost the master a script run.
#[test]
fn a_failed_acquire_cleans_up_only_where_its_attempt_was_not_refused() {
    let masters = cluster(3);
    let servers = masters.servers();
    common::hold_elsewhere(&servers[..2], "contested", ms(LONG_TTL));
    // The compare-and-delete, by script or by the master's own command.
    let evalshas = || -> Vec<u64> {
        servers
            .iter()
            .map(|s| common::command_calls(s, "evalsha") + common::command_calls(s, "delifeq"))
            .collect()
    };
    let mut redlock = client(&masters.urls());
    let before = evalshas();
    let err = redlock
        .try_acquire("contested", TTL)
        .expect_err("two of three masters hold another token");
    let fail = failure(&err);
    assert_eq!(fail.votes[0].vote, Vote::Refused, "{fail}");
    assert_eq!(fail.votes[1].vote, Vote::Refused, "{fail}");
    // The master that granted is cleaned up.
    wait_gone(&servers[2..], "contested");
    // A SET behind the cleanup on each connection: once every master has
    // it, a cleanup sent to any of them has run.
    let probe = redlock
        .try_acquire("probe", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_held(servers, "probe", probe.token());
    let after = evalshas();
    assert_eq!(
        after[..2],
        before[..2],
        "EVALSHA calls on the two refusing masters (before, after)"
    );
    assert!(
        after[2] > before[2],
        "the cleanup ran on the granting master"
    );
    redlock.release(&probe).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn with_one_of_three_masters_killed_acquire_and_release_still_succeed() {
    // And with two of five: a minority down never stops the quorum.
    for (n, dead) in [(3, 1), (5, 2)] {
        let mut masters = cluster(n);
        let mut redlock = client(&masters.urls());
        // One client connected before the crash, one connecting after it.
        let warm = redlock
            .try_acquire("warm", TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        redlock.release(&warm).unwrap_or_else(|e| panic!("{e}"));
        for i in 1..=dead {
            masters[i].kill().unwrap_or_else(|e| panic!("{e}"));
        }
        let alive: Vec<usize> = (0..n).filter(|i| !(1..=dead).contains(i)).collect();
        let mut fresh = client(&masters.urls());

        for (who, redlock) in [("warm", &mut redlock), ("fresh", &mut fresh)] {
            let key = format!("down-{who}");
            for attempt in 0..3 {
                let what = format!("N = {n}, {dead} down, {who} client, attempt {attempt}");
                let started = Instant::now();
                let lock = redlock
                    .try_acquire(key.clone(), TTL)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(
                    started.elapsed() < PROMPT,
                    "{what}: {:?}",
                    started.elapsed()
                );
                assert!(lock.is_valid());
                for &i in &alive {
                    wait_held(&masters.servers()[i..=i], &key, lock.token());
                }
                redlock
                    .release(&lock)
                    .unwrap_or_else(|e| panic!("{what}: release: {e}"));
                for &i in &alive {
                    wait_gone(&masters.servers()[i..=i], &key);
                }
            }
        }
    }
}

#[test]
fn with_two_of_three_masters_killed_acquire_reports_no_quorum_naming_each_cause() {
    let mut masters = cluster(3);
    let mut redlock = client(&masters.urls());
    let warm = redlock
        .try_acquire("warm", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&warm).unwrap_or_else(|e| panic!("{e}"));
    masters[1].kill().unwrap_or_else(|e| panic!("{e}"));
    masters[2].kill().unwrap_or_else(|e| panic!("{e}"));
    let mut fresh = client(&masters.urls());

    // The warm client twice (first its broken connections, then the
    // reconnects), and a client that never connected.
    let attempts = [
        ("warm, first attempt", true),
        ("fresh", false),
        ("warm, second attempt", true),
    ];
    for (who, warm) in attempts {
        let redlock = if warm { &mut redlock } else { &mut fresh };
        let started = Instant::now();
        let err = redlock
            .try_acquire("res", TTL)
            .expect_err("two of three masters are down");
        let took = started.elapsed();
        assert!(took < PROMPT, "{who}: took {took:?}");
        assert!(matches!(err, Error::NoQuorum(_)), "{who}: {err:?}");
        let text = err.to_string();
        eprintln!("two masters down, {who}: {text}");
        assert!(!text.contains('\n'), "one line: {text}");
        assert!(text.starts_with("quorum of masters unreachable"), "{text}");
        let fail = failure(&err);
        assert_eq!(fail.votes.len(), 3);
        for i in [1, 2] {
            let Vote::Failed(cause) = &fail.votes[i].vote else {
                panic!("{who}: master {i} is down: {fail}");
            };
            assert_eq!(&*fail.votes[i].server, masters[i].url());
            let named = format!("{}: {cause}", masters[i].url());
            assert!(text.contains(&named), "{who}: {named:?} in {text}");
        }
        assert!(
            matches!(fail.votes[0].vote, Vote::Granted | Vote::Pending),
            "{who}: the live master: {fail}"
        );
        // Named only when the round was decided before it answered, and
        // then as such.
        let live = format!("{}:", masters[0].url());
        let named = match fail.votes[0].vote {
            Vote::Pending => format!("{live} no answer yet"),
            _ => live.clone(),
        };
        assert_eq!(
            text.matches(&live).count(),
            usize::from(text.contains(&named) && fail.votes[0].vote == Vote::Pending),
            "the live master is not named as failed: {text}"
        );
    }
    // The warm client once more, now that its connections are known dead.
    let err = redlock
        .try_acquire("res", TTL)
        .expect_err("still two of three down");
    assert!(matches!(err, Error::NoQuorum(_)), "{err:?}");
    eprintln!("two masters down, warm, third attempt: {err}");

    masters[1].restart().unwrap_or_else(|e| panic!("{e}"));
    masters[2].restart().unwrap_or_else(|e| panic!("{e}"));
    // The live master granted every attempt; each failed attempt's release
    // removed it again. The restarted masters start empty.
    wait_gone(masters.servers(), "res");

    for (who, redlock) in [("warm", &mut redlock), ("fresh", &mut fresh)] {
        let lock = redlock
            .acquire("res", TTL)
            .unwrap_or_else(|e| panic!("{who} client after restarts: {e}"));
        redlock
            .release(&lock)
            .unwrap_or_else(|e| panic!("{who}: release: {e}"));
        wait_gone(masters.servers(), "res");
    }
}

#[test]
fn a_stopped_master_does_not_hold_up_the_caller() {
    let mut masters = cluster(3);
    let mut redlock = client(&masters.urls());
    let warm = redlock
        .try_acquire("warm", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&warm).unwrap_or_else(|e| panic!("{e}"));

    // One of three stopped: the other two make the quorum.
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    let lock = redlock
        .try_acquire("one-stopped", LONG_TTL)
        .unwrap_or_else(|e| panic!("one master stopped: {e}"));
    let took = started.elapsed();
    assert!(took < PROMPT, "took {took:?} with a TTL of {LONG_TTL:?}");
    assert!(lock.remaining() > LONG_TTL - PROMPT);
    wait_held(&masters.servers()[..2], "one-stopped", lock.token());
    let started = Instant::now();
    redlock
        .release(&lock)
        .unwrap_or_else(|e| panic!("one master stopped: release: {e}"));
    assert!(started.elapsed() < PROMPT);
    wait_gone(&masters.servers()[..2], "one-stopped");
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    // Resumed, it runs the SET and the release in order: no key stays.
    wait_gone(&masters.servers()[2..], "one-stopped");

    // Two of three stopped: no quorum, reported within the per-instance
    // timeout rather than the TTL.
    masters[1].pause().unwrap_or_else(|e| panic!("{e}"));
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    let err = redlock
        .try_acquire("two-stopped", LONG_TTL)
        .expect_err("two of three masters stopped");
    let took = started.elapsed();
    assert!(took < PROMPT, "took {took:?} with a TTL of {LONG_TTL:?}");
    assert!(matches!(err, Error::NoQuorum(_)), "{err:?}");
    eprintln!("two masters stopped: {err}");
    let fail = failure(&err);
    for i in [1, 2] {
        assert!(
            matches!(fail.votes[i].vote, Vote::Failed(_)),
            "master {i} stopped: {fail}"
        );
    }
    assert!(!err.to_string().contains('\n'));
    masters[1].resume().unwrap_or_else(|e| panic!("{e}"));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    // The stopped masters ran the SET late and the release after it.
    wait_gone(masters.servers(), "two-stopped");

    let lock = redlock
        .acquire("two-stopped", TTL)
        .unwrap_or_else(|e| panic!("after resume: {e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    wait_gone(masters.servers(), "two-stopped");
}

#[test]
fn a_restarted_master_is_reconnected_to() {
    // A single master, default retry policy.
    let mut server = master();
    let mut config = Config::new([server.url()]).unwrap_or_else(|e| panic!("{e}"));
    config.quarantine = None;
    config.per_instance_timeout = Duration::from_secs(1);
    assert_eq!(config.retry, Retry::default());
    let mut redlock = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let lock = redlock
        .try_acquire("before", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));

    server.restart().unwrap_or_else(|e| panic!("{e}"));
    let first = redlock.try_acquire("after", TTL);
    match &first {
        Ok(_) => eprintln!("single master restarted: the first attempt succeeded"),
        Err(e) => eprintln!("single master restarted: the first attempt failed: {e}"),
    }
    let lock = match first {
        Ok(lock) => lock,
        Err(err) => {
            assert!(matches!(err, Error::NoQuorum(_)), "{err:?}");
            redlock
                .acquire("after", TTL)
                .unwrap_or_else(|e| panic!("the retrying acquire after a restart: {e}"))
        }
    };
    wait_held(std::slice::from_ref(&server), "after", lock.token());
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    wait_gone(std::slice::from_ref(&server), "after");

    // Restarted between acquire and release: the key is gone with the
    // master's memory; the release reports what it can.
    let lock = redlock
        .try_acquire("across", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    server.restart().unwrap_or_else(|e| panic!("{e}"));
    let released = redlock.release(&lock);
    match &released {
        Ok(()) => eprintln!("release across a restart: Ok"),
        Err(e) => eprintln!("release across a restart: {e}"),
    }
    assert!(!matches!(released, Err(Error::Held(_))));
    assert_eq!(get(&server, "across"), Reply::Nil);
    let lock = redlock
        .acquire("across", TTL)
        .unwrap_or_else(|e| panic!("after the second restart: {e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));

    // One of three restarted: the quorum carries on at once, and the
    // restarted master is back in use within a few operations.
    let mut masters = cluster(3);
    let mut redlock = client(&masters.urls());
    let warm = redlock
        .try_acquire("warm", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&warm).unwrap_or_else(|e| panic!("{e}"));
    masters[1].restart().unwrap_or_else(|e| panic!("{e}"));
    let lock = redlock
        .try_acquire("three", TTL)
        .unwrap_or_else(|e| panic!("one of three restarted: {e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    let back = (0..20).any(|_| {
        let lock = redlock
            .try_acquire("three", TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        let held = eventually(Duration::from_millis(500), || {
            get(&masters[1], "three") == token_reply(lock.token())
        });
        redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
        held
    });
    assert!(back, "the restarted master never held a lock again");
    wait_gone(masters.servers(), "three");
}

// After SCRIPT FLUSH every EVALSHA meets -NOSCRIPT, which each connection
// answers with EVAL. An operation returns at its quorum, so a slow master's
// -NOSCRIPT may be read only later: at the client's next operation, or in
// `Redlock::settle`, which these tests call where they need every master
// done.
#[test]
fn after_a_script_flush_release_and_extend_still_succeed() {
    let masters = cluster(3);
    let servers = masters.servers();
    let flush_all = || {
        for server in servers {
            let reply = plain(server).cmd(&["SCRIPT".into(), "FLUSH".into()]);
            assert!(reply.is_ok(), "{reply:?}");
        }
    };
    let mut redlock = client(&masters.urls());

    let lock = redlock
        .try_acquire("flushed", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_held(servers, "flushed", lock.token());
    flush_all();
    redlock
        .release(&lock)
        .unwrap_or_else(|e| panic!("release after SCRIPT FLUSH: {e}"));
    assert_eq!(redlock.settle(WAIT), 0, "every master answered");
    wait_gone(servers, "flushed");

    let mut lock = redlock
        .try_acquire("flushed", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_held(servers, "flushed", lock.token());
    flush_all();
    redlock
        .extend(&mut lock, LONG_TTL)
        .unwrap_or_else(|e| panic!("extend after SCRIPT FLUSH: {e}"));
    assert_eq!(redlock.settle(WAIT), 0, "every master answered");
    // A quorum ran the extend; a master whose -NOSCRIPT came after the
    // decision is not sent it again (a decided extend is never re-sent),
    // and keeps the old TTL.
    let raised = servers
        .iter()
        .filter(|server| pttl(server, "flushed") > ms(TTL))
        .count();
    assert!(raised >= 2, "{raised} masters extended");
    // Flushed again before the release, and once more with the release
    // and a new extend back to back.
    flush_all();
    redlock
        .extend(&mut lock, LONG_TTL)
        .unwrap_or_else(|e| panic!("second extend after SCRIPT FLUSH: {e}"));
    flush_all();
    redlock
        .release(&lock)
        .unwrap_or_else(|e| panic!("release after SCRIPT FLUSH: {e}"));
    assert_eq!(redlock.settle(WAIT), 0, "every master answered");
    wait_gone(servers, "flushed");
}

#[test]
fn a_master_on_a_unix_socket_locks_and_unlocks() {
    let server = master_with(&Options::new().unix_socket(true));
    let path = server.unix_socket().expect("a socket was asked for");
    let url = format!("unix://{}", path.display());
    let mut redlock = client(std::slice::from_ref(&url));
    let mut lock = redlock
        .try_acquire("over-unix", TTL)
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    wait_held(std::slice::from_ref(&server), "over-unix", lock.token());
    redlock
        .extend(&mut lock, LONG_TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(pttl(&server, "over-unix") > ms(TTL));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    wait_gone(std::slice::from_ref(&server), "over-unix");

    // The database parameter of a unix URL.
    let mut in_db = client(&[format!("{url}?db=2")]);
    let lock = in_db
        .try_acquire("over-unix", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut c = plain(&server);
    assert!(c.cmd(&["SELECT".into(), Arg::Int(2)]).is_ok());
    assert_eq!(
        c.cmd(&["GET".into(), "over-unix".into()]),
        token_reply(lock.token())
    );
    assert_eq!(get(&server, "over-unix"), Reply::Nil, "not in db 0");
    in_db.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_password_in_the_url_authenticates_and_a_wrong_one_is_reported_without_leaking_it() {
    const PASSWORD: &str = "correct-horse-7";
    const WRONG: &str = "battery-staple-9";
    let server = master_with(&Options::new().requirepass(PASSWORD));
    let port = server.port();

    let mut redlock = client(&[format!("redis://:{PASSWORD}@127.0.0.1:{port}")]);
    let lock = redlock
        .try_acquire("secret", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_held(std::slice::from_ref(&server), "secret", lock.token());
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    wait_gone(std::slice::from_ref(&server), "secret");

    let cases = [
        (
            "wrong password",
            format!("redis://:{WRONG}@127.0.0.1:{port}"),
        ),
        ("no password", format!("redis://127.0.0.1:{port}")),
    ];
    for (what, url) in cases {
        let mut redlock = client(&[url]);
        let started = Instant::now();
        let err = redlock
            .try_acquire("secret", TTL)
            .expect_err("authentication must fail");
        assert!(started.elapsed() < PROMPT);
        // A refusal for good, not an unreachable master.
        assert!(matches!(err, Error::Denied(_)), "{what}: {err:?}");
        let text = err.to_string();
        let debug = format!("{err:?}");
        eprintln!("{what}: {text}");
        assert!(text.contains("AUTH"), "{what}: {text}");
        assert!(!text.contains('\n'), "{what}: {text}");
        for secret in [PASSWORD, WRONG] {
            assert!(!text.contains(secret), "{what}: {text}");
            assert!(!debug.contains(secret), "{what}: {debug}");
        }
        assert_eq!(get(&server, "secret"), Reply::Nil);
    }
}

#[test]
fn an_acl_user_in_the_url_authenticates() {
    let acl = ["--user", "alice", "on", ">s3cret-acl", "~*", "&*", "+@all"];
    let server = master_with(&Options::new().args(acl));
    let port = server.port();

    let mut redlock = client(&[format!("redis://alice:s3cret-acl@127.0.0.1:{port}")]);
    let mut lock = redlock
        .try_acquire("acl", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_held(std::slice::from_ref(&server), "acl", lock.token());
    redlock
        .extend(&mut lock, LONG_TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    wait_gone(std::slice::from_ref(&server), "acl");

    let mut wrong = client(&[format!("redis://alice:not-s3cret@127.0.0.1:{port}")]);
    let err = wrong
        .try_acquire("acl", TTL)
        .expect_err("wrong password for alice");
    assert!(matches!(err, Error::Denied(_)), "{err:?}");
    let text = err.to_string();
    eprintln!("ACL user, wrong password: {text}");
    assert!(text.contains("AUTH"), "{text}");
    assert!(!text.contains("not-s3cret"), "{text}");
    assert!(!format!("{err:?}").contains("not-s3cret"));
    assert!(text.contains("alice:***@"), "the user is named: {text}");
}

#[test]
fn a_database_number_in_the_url_selects_that_database() {
    let server = master();
    let mut redlock = client(&[format!("{}/3", server.url())]);
    let lock = redlock
        .try_acquire("in-db-3", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut c = plain(&server);
    assert!(c.cmd(&["SELECT".into(), Arg::Int(3)]).is_ok());
    assert!(eventually(WAIT, || c
        .cmd(&["GET".into(), "in-db-3".into()])
        == token_reply(lock.token())));
    assert_eq!(get(&server, "in-db-3"), Reply::Nil, "not in db 0");
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    assert!(eventually(WAIT, || c
        .cmd(&["GET".into(), "in-db-3".into()])
        == Reply::Nil));
}

#[test]
fn malformed_urls_empty_lists_and_zero_ttls_are_config_errors() {
    let cases = [
        ("redis://:hunter2@127.0.0.1:0", AddrError::BadPort),
        ("redis://:hunter2@127.0.0.1:port", AddrError::BadPort),
        ("rediss://:hunter2@127.0.0.1:port", AddrError::BadPort),
        (
            "redis:/:hunter2@127.0.0.1:6379",
            AddrError::UnsupportedScheme,
        ),
        ("127.0.0.1:6379", AddrError::UnsupportedScheme),
        ("redis://:hunter2@", AddrError::MissingHost),
        ("redis://alice:hunter2@127.0.0.1/db3", AddrError::BadDb),
        (
            "redis://:hunter2%zz@127.0.0.1",
            AddrError::BadPercentEncoding,
        ),
        ("redis://:hunter2@[::1", AddrError::BadIpv6),
        ("redis://alice@127.0.0.1", AddrError::UserWithoutPassword),
        (
            "redis://:hunter2@127.0.0.1?timeout=1",
            AddrError::UnknownParameter,
        ),
        ("unix://relative/hunter2.sock", AddrError::MissingSocketPath),
    ];
    for (url, want) in cases {
        for (index, urls) in [
            (0, vec![url, "redis://127.0.0.1:6379"]),
            (1, vec!["redis://127.0.0.1:6379", url]),
        ] {
            let err = Redlock::connect(&urls).expect_err("malformed URL");
            assert_eq!(
                err,
                Error::Config(ConfigError::Url { index, error: want }),
                "{url}"
            );
            let text = err.to_string();
            let debug = format!("{err:?}");
            assert!(!text.contains("hunter2"), "{url}: {text}");
            assert!(!debug.contains("hunter2"), "{url}: {debug}");
            assert!(text.contains(&format!("#{}", index + 1)), "{text}");
            assert!(!text.contains('\n'), "{text}");
        }
    }

    let empty: [&str; 0] = [];
    assert_eq!(
        Redlock::connect(empty).err(),
        Some(Error::Config(ConfigError::NoServers))
    );
    assert_eq!(Config::new(empty), Err(ConfigError::NoServers));
    let mut emptied = Config::new(["redis://127.0.0.1:6379"]).unwrap_or_else(|e| panic!("{e}"));
    emptied.servers.clear();
    assert_eq!(
        Redlock::new(emptied).err(),
        Some(Error::Config(ConfigError::NoServers))
    );

    let server = master();
    let mut redlock = client(&[server.url()]);
    let zero = Error::Config(ConfigError::ZeroTtl);
    for ttl in [Duration::ZERO, Duration::from_micros(999)] {
        assert_eq!(redlock.try_acquire("zero", ttl).err(), Some(zero.clone()));
        assert_eq!(redlock.acquire("zero", ttl).err(), Some(zero.clone()));
        assert_eq!(redlock.lock("zero", ttl).err(), Some(zero.clone()));
    }
    assert_eq!(get(&server, "zero"), Reply::Nil, "nothing was sent");
    let mut lock = redlock
        .try_acquire("zero", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    let deadline = lock.deadline();
    assert_eq!(redlock.extend(&mut lock, Duration::ZERO).err(), Some(zero));
    assert_eq!(lock.deadline(), deadline);
    assert_eq!(lock.extensions(), 0);
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn dropping_a_guard_releases_the_lock() {
    let masters = cluster(3);
    let servers = masters.servers();
    let mut redlock = client(&masters.urls());
    let token = {
        let mut guard = redlock
            .lock("guarded", TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        wait_held(servers, "guarded", guard.token());
        guard
            .extend(LONG_TTL)
            .unwrap_or_else(|e| panic!("extend through the guard: {e}"));
        assert_eq!(guard.extensions(), 1);
        // The client is usable while the guard lives.
        let other = guard
            .client()
            .try_acquire("other", TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        guard
            .client()
            .release(&other)
            .unwrap_or_else(|e| panic!("{e}"));
        *guard.token()
    };
    wait_gone(servers, "guarded");
    // Nobody else's key was touched: the guard released its own token.
    assert!(token.as_str().len() >= 16);

    // An explicit release reports the outcome; into_lock disarms the guard.
    let guard = redlock
        .lock("guarded", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    guard.release().unwrap_or_else(|e| panic!("{e}"));
    wait_gone(servers, "guarded");
    let guard = redlock.lock("kept", TTL).unwrap_or_else(|e| panic!("{e}"));
    let kept = guard.into_lock().expect("the guard had a lock");
    wait_held(servers, "kept", kept.token());
    thread::sleep(Duration::from_millis(50));
    wait_held(servers, "kept", kept.token());
    redlock.release(&kept).unwrap_or_else(|e| panic!("{e}"));
    wait_gone(servers, "kept");
}

#[test]
fn the_extension_limit_refuses_the_third_extension() {
    let masters = cluster(3);
    let mut config = config(&masters.urls());
    config.max_extensions = Some(2);
    let mut redlock = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let mut lock = redlock
        .try_acquire("limited", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    for i in 1..=2 {
        redlock
            .extend(&mut lock, TTL)
            .unwrap_or_else(|e| panic!("extension {i}: {e}"));
        assert_eq!(lock.extensions(), i);
    }
    let deadline = lock.deadline();
    let err = redlock
        .extend(&mut lock, LONG_TTL)
        .expect_err("a third extension");
    assert_eq!(err, Error::ExtensionLimit(2));
    assert_eq!(err.to_string(), "lock already extended 2 times");
    assert_eq!(lock.extensions(), 2);
    assert_eq!(
        lock.deadline(),
        deadline,
        "a refused extension changes nothing"
    );
    for server in &masters {
        assert!(pttl(server, "limited") <= ms(TTL), "nothing was sent");
    }
    // A new lock starts a new count.
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    let mut lock = redlock
        .try_acquire("limited", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock
        .extend(&mut lock, TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

/// Deletes `key` on `server`, as an expiry would.
fn expire_now(server: &Server, key: &str) {
    let reply = plain(server).cmd(&["DEL".into(), key.into()]);
    assert_eq!(reply, Reply::Integer(1), "{}: DEL {key}", server.url());
}

#[test]
fn an_extend_needs_a_quorum_and_a_release_reaches_every_master() {
    let masters = cluster(3);
    let servers = masters.servers();
    let mut redlock = client(&masters.urls());
    let mut lock = redlock
        .try_acquire("partial", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_held(servers, "partial", lock.token());

    // Lost on one master: two confirmations still make the quorum.
    expire_now(&servers[0], "partial");
    redlock
        .extend(&mut lock, LONG_TTL)
        .unwrap_or_else(|e| panic!("extend with a quorum: {e}"));
    assert_eq!(lock.extensions(), 1);
    for server in &servers[1..] {
        assert!(eventually(WAIT, || pttl(server, "partial") > ms(TTL)));
    }
    assert_eq!(get(&servers[0], "partial"), Reply::Nil, "not re-created");

    // Lost on two: no quorum, and the lock is left as it was.
    expire_now(&servers[1], "partial");
    let deadline = lock.deadline();
    let err = redlock
        .extend(&mut lock, LONG_TTL)
        .expect_err("one master of three is no quorum");
    assert!(matches!(err, Error::NotHeld(_)), "{err:?}");
    assert_lost_to_refusals(failure(&err), 3, 1);
    assert_eq!(lock.deadline(), deadline);
    assert_eq!(lock.extensions(), 1);
    assert_eq!(lock.ttl(), LONG_TTL);

    // The release fails for want of a quorum, but still deletes the key
    // on the one master that held it.
    let err = redlock.release(&lock).expect_err("held on one master only");
    assert!(matches!(err, Error::NotHeld(_)), "{err:?}");
    wait_gone(servers, "partial");
}

#[test]
fn a_lock_that_expired_and_was_taken_again_can_no_longer_be_extended_or_released() {
    for n in [1, 3, 5] {
        let masters = cluster(n);
        let servers = masters.servers();
        let mut first = client(&masters.urls());
        let mut second = client(&masters.urls());
        let mut old = first
            .try_acquire("handover", TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        wait_held(servers, "handover", old.token());
        for server in servers {
            expire_now(server, "handover");
        }
        let new = second
            .try_acquire("handover", TTL)
            .unwrap_or_else(|e| panic!("N = {n}: after expiry: {e}"));
        wait_held(servers, "handover", new.token());

        let err = first
            .extend(&mut old, LONG_TTL)
            .expect_err("the old holder cannot extend");
        assert!(matches!(err, Error::NotHeld(_)), "N = {n}: {err:?}");
        assert_lost_to_refusals(failure(&err), n, 0);
        let err = first
            .release(&old)
            .expect_err("the old holder cannot release");
        assert!(matches!(err, Error::NotHeld(_)), "N = {n}: {err:?}");
        assert_lost_to_refusals(failure(&err), n, 0);
        for server in servers {
            assert_eq!(get(server, "handover"), token_reply(new.token()));
            assert!(pttl(server, "handover") <= ms(TTL), "not extended");
        }
        second.release(&new).unwrap_or_else(|e| panic!("{e}"));
        wait_gone(servers, "handover");
    }
}

#[test]
fn a_round_that_leaves_no_validity_is_refused_and_released() {
    let masters = cluster(3);
    let servers = masters.servers();
    let mut config = config(&masters.urls());
    // drift = TTL * factor + 2 ms exceeds the TTL: no round can leave any
    // validity, however fast.
    config.drift_factor = 0.999_999_9;
    let mut redlock = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let err = redlock
        .try_acquire("no-validity", TTL)
        .expect_err("no validity can be left");
    assert!(matches!(err, Error::ValidityExpired(_)), "{err:?}");
    let fail = failure(&err);
    assert!(fail.granted >= fail.quorum, "a quorum granted: {fail}");
    assert!(err.to_string().contains("validity"), "{err}");
    // The keys it took are released, not left for the TTL.
    wait_gone(servers, "no-validity");
}

#[test]
fn a_retrying_acquire_gives_up_as_its_policy_says() {
    let masters = cluster(3);
    let mut holder = client(&masters.urls());
    let mut waiter = client(&masters.urls());
    let lock = holder
        .try_acquire("busy", LONG_TTL)
        .unwrap_or_else(|e| panic!("{e}"));

    let three = Retry::default()
        .with_attempts(3)
        .with_delay(Duration::from_millis(100))
        .with_max_wait(None);
    let started = Instant::now();
    let err = waiter
        .acquire_with("busy", TTL, &three)
        .expect_err("held throughout");
    let took = started.elapsed();
    assert!(matches!(err, Error::Held(_)), "{err:?}");
    let fail = failure(&err);
    assert_eq!(fail.attempts, 3, "{fail}");
    assert_lost_to_refusals(fail, 3, 0);
    // Two waits of at least delay / 2 each, and far less than the TTL.
    assert!(took >= Duration::from_millis(100), "{took:?}");
    assert!(took < PROMPT, "{took:?}");
    assert!(fail.elapsed <= took);

    let until = Retry::until(Duration::from_secs(2)).with_delay(Duration::from_millis(100));
    let started = Instant::now();
    let err = waiter
        .acquire_with("busy", TTL, &until)
        .expect_err("held throughout");
    let took = started.elapsed();
    assert!(matches!(err, Error::Held(_)), "{err:?}");
    assert!(failure(&err).attempts > 1, "{err}");
    assert!(took < PROMPT, "{took:?}");

    // Every failed attempt released what it took: only the holder's token.
    for server in &masters {
        assert_eq!(get(server, "busy"), token_reply(lock.token()));
    }
    holder.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

/// After an attempt every master refused, a waiting acquire tries again
/// after its retry delay even though nothing comes back from any master:
/// its cleanup goes nowhere (no master can hold the attempt's key), and
/// the client has no subscriber connection whose confirmation could wake
/// it. It once waited for some reply, or else for the connect timeout
/// (set far beyond the retry policy here), before its second attempt.
#[test]
fn a_retry_after_an_attempt_every_master_refused_needs_no_reply_to_go_on() {
    let server = master();
    let urls = [server.url()];
    let mut holder = client(&urls);
    let lock = holder
        .try_acquire("busy", LONG_TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut config = config(&urls);
    // Far beyond the retry policy, and short of the holder's TTL.
    config.connect_timeout = LONG_TTL / 2;
    let mut waiter = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let three = Retry::default()
        .with_attempts(3)
        .with_delay(Duration::from_millis(50))
        .with_max_wait(None);
    let err = waiter
        .acquire_with("busy", TTL, &three)
        .expect_err("held throughout");
    assert!(matches!(err, Error::Held(_)), "{err:?}");
    // Every attempt the policy allows was made before the lock was
    // given up: none was lost to a wait for the connect timeout.
    assert_eq!(failure(&err).attempts, 3, "{err}");
    holder.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn resources_with_any_bytes_are_locked_as_given() {
    let masters = cluster(3);
    let servers = masters.servers();
    let mut redlock = client(&masters.urls());
    let long = vec![b'k'; 64 * 1024];
    // Any bytes but none: an empty name is refused (tests/api.rs).
    let names: [&[u8]; 5] = [
        b"with space",
        b"crlf\r\n*1\r\n$4\r\nPING\r\n",
        b"\0\xff\xfe binary",
        "ünïcödé:🔒".as_bytes(),
        &long,
    ];
    for name in names {
        let shown = String::from_utf8_lossy(&name[..name.len().min(40)]).into_owned();
        let mut lock = redlock
            .try_acquire(name.to_vec(), TTL)
            .unwrap_or_else(|e| panic!("{shown:?}: {e}"));
        assert_eq!(lock.resource(), name);
        for server in servers {
            let mut c = plain(server);
            assert!(
                eventually(WAIT, || c.cmd(&["GET".into(), Arg::Bytes(name)])
                    == token_reply(lock.token())),
                "{shown:?} on {}",
                server.url()
            );
        }
        redlock
            .extend(&mut lock, LONG_TTL)
            .unwrap_or_else(|e| panic!("{shown:?}: {e}"));
        redlock
            .release(&lock)
            .unwrap_or_else(|e| panic!("{shown:?}: {e}"));
        for server in servers {
            let mut c = plain(server);
            assert!(
                eventually(WAIT, || c.cmd(&["EXISTS".into(), Arg::Bytes(name)])
                    == Reply::Integer(0)),
                "{shown:?} on {}",
                server.url()
            );
        }
    }
    // Nothing is left behind, and no name was split into other keys.
    for server in servers {
        let reply = plain(server).cmd(&["DBSIZE".into()]);
        assert_eq!(reply, Reply::Integer(0), "{}", server.url());
    }
}

#[test]
fn a_master_stalled_past_the_stall_limit_is_used_again_after_resume() {
    let mut masters = cluster(3);
    let mut config = config(&masters.urls());
    // Generous for a loaded machine: the live masters must answer every
    // round within the per-instance timeout, and their connections must
    // not be judged stalled.
    config.per_instance_timeout = Duration::from_secs(1);
    config.connect_timeout = Duration::from_secs(1);
    config.reconnect_backoff_max = Duration::from_millis(200);
    let mut redlock = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let warm = redlock
        .try_acquire("warm", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&warm).unwrap_or_else(|e| panic!("{e}"));

    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    // Keep working past the stall limit, so that the connection to the
    // stopped master is dropped and re-tried meanwhile.
    let stalled_since = Instant::now();
    let mut cycles = 0;
    while stalled_since.elapsed() < Duration::from_millis(2500) {
        let lock = redlock
            .try_acquire(format!("stalled-{cycles}"), TTL)
            .unwrap_or_else(|e| panic!("cycle {cycles}, one master stopped: {e}"));
        redlock
            .release(&lock)
            .unwrap_or_else(|e| panic!("cycle {cycles}: release: {e}"));
        cycles += 1;
        thread::sleep(Duration::from_millis(20));
    }
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));

    // Back in use: a lock reaches the resumed master again.
    let back = eventually(WAIT, || {
        let lock = redlock
            .try_acquire("resumed", TTL)
            .unwrap_or_else(|e| panic!("after resume: {e}"));
        let held = eventually(Duration::from_millis(300), || {
            get(&masters[2], "resumed") == token_reply(lock.token())
        });
        redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
        held
    });
    assert!(back, "the resumed master never held a lock again");
    // The masters that kept answering hold nothing. The resumed one may
    // keep a key until its TTL: a SET written before its connection was
    // dropped as stalled runs on resume, and the release that followed on
    // a new connection is not ordered after it.
    for server in &masters.servers()[..2] {
        assert!(
            eventually(WAIT, || plain(server).cmd(&["DBSIZE".into()])
                == Reply::Integer(0)),
            "{}: keys left: {:?}",
            server.url(),
            plain(server).cmd(&["KEYS".into(), "*".into()])
        );
    }
    let left = plain(&masters[2]).cmd(&["KEYS".into(), "*".into()]);
    if left != Reply::Array(Vec::new()) {
        eprintln!("stalled master: keys left on the resumed master: {left:?}");
    }
    eprintln!("stalled master: {cycles} lock cycles while stopped");
}

#[test]
fn after_a_script_flush_a_single_master_still_releases_and_extends() {
    // With one master the round waits for its answer, so the fallback
    // always runs before the caller gets the result.
    let server = master();
    let one = std::slice::from_ref(&server);
    let flush = || {
        let reply = plain(&server).cmd(&["SCRIPT".into(), "FLUSH".into()]);
        assert!(reply.is_ok(), "{reply:?}");
    };
    let mut redlock = client(&[server.url()]);
    for round in 0..3 {
        let mut lock = redlock
            .try_acquire("flushed", TTL)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        flush();
        redlock
            .extend(&mut lock, LONG_TTL)
            .unwrap_or_else(|e| panic!("round {round}: extend after SCRIPT FLUSH: {e}"));
        assert!(pttl(&server, "flushed") > ms(TTL), "round {round}");
        flush();
        redlock
            .release(&lock)
            .unwrap_or_else(|e| panic!("round {round}: release after SCRIPT FLUSH: {e}"));
        assert_eq!(get(&server, "flushed"), Reply::Nil, "round {round}");
        wait_gone(one, "flushed");
    }
}

#[test]
fn a_master_that_answers_noscript_after_the_quorum_gets_the_release_but_not_the_extend() {
    let mut masters = cluster(3);
    // The scripts, whatever the server: a master's own extend gets no
    // NOSCRIPT, and a late one runs as any request sent does.
    let mut config = config(&masters.urls());
    config.lock_commands = LockCommands::Scripts;
    let mut redlock = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let flush_all = |masters: &common::Cluster| {
        for server in masters {
            let reply = plain(server).cmd(&["SCRIPT".into(), "FLUSH".into()]);
            assert!(reply.is_ok(), "{reply:?}");
        }
    };

    // Release: master 2 is stopped while the other two answer, so its
    // -NOSCRIPT comes after the round has been decided.
    let lock = redlock
        .try_acquire("late", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_held(masters.servers(), "late", lock.token());
    flush_all(&masters);
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    redlock
        .release(&lock)
        .unwrap_or_else(|e| panic!("release with a quorum: {e}"));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    // Without SCRIPT FLUSH the resumed master runs the release it was sent
    // (see a_stopped_master_does_not_hold_up_the_caller); after one, its
    // -NOSCRIPT arrives after the release returned, and settling answers it
    // with EVAL.
    assert_eq!(redlock.settle(WAIT), 0, "every master answered");
    wait_gone(masters.servers(), "late");

    // Extend: the quorum's masters run it; the stopped master's -NOSCRIPT
    // comes after the decision, and a decided extend is not re-sent (it
    // would lengthen a key past what the holder was told), so that master
    // keeps the old TTL.
    let mut lock = redlock
        .try_acquire("late-extend", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_held(masters.servers(), "late-extend", lock.token());
    flush_all(&masters);
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    redlock
        .extend(&mut lock, LONG_TTL)
        .unwrap_or_else(|e| panic!("extend with a quorum: {e}"));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(redlock.settle(WAIT), 0, "every master answered");
    for (i, server) in masters.iter().enumerate() {
        let ttl = pttl(server, "late-extend");
        assert_eq!(ttl > ms(TTL), i < 2, "{}: PTTL {ttl}", server.url());
    }
}

/// How many connections `server` has accepted so far (this query's own
/// included).
fn connections_received(server: &Server) -> i64 {
    let Reply::Bulk(info) = plain(server).cmd(&["INFO".into(), "stats".into()]) else {
        panic!("INFO stats from {}", server.url());
    };
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no total_connections_received from {}", server.url()))
}

#[test]
fn an_idle_client_keeps_its_connections() {
    let masters = cluster(3);
    let mut config = config(&masters.urls());
    // A stall limit (the larger of these two) short enough that the idle
    // periods below, each well past it, stay short, and long enough that a
    // live master on a loaded machine always answers within it.
    config.per_instance_timeout = Duration::from_secs(1);
    config.connect_timeout = Duration::from_secs(1);
    let mut redlock = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let warm = redlock
        .try_acquire("warm", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&warm).unwrap_or_else(|e| panic!("{e}"));

    let before: Vec<i64> = masters.iter().map(connections_received).collect();
    for i in 0..3 {
        // Idle: every master answered the last round long ago, though the
        // last to answer did so after the quorum had decided it.
        thread::sleep(Duration::from_millis(1500));
        let lock = redlock
            .try_acquire(format!("idle-{i}"), TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        thread::sleep(Duration::from_millis(1500));
        redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    }
    let after: Vec<i64> = masters.iter().map(connections_received).collect();
    for ((server, before), after) in masters.iter().zip(before).zip(after) {
        // One more: the query above.
        assert_eq!(
            after - before - 1,
            0,
            "{}: reconnects while every master answered",
            server.url()
        );
    }
}

#[test]
fn warm_up_connects_every_live_master_before_the_first_operation() {
    let mut masters = cluster(3);
    masters[2].kill().unwrap_or_else(|e| panic!("{e}"));
    let mut redlock = client(&masters.urls());
    assert_eq!(redlock.warm_up(WAIT), 2, "the two live masters");
    let lock = redlock
        .try_acquire("warm", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

/// A stalled master (its connect succeeds, its
/// handshake is never answered) does not hold `warm_up_quorum` for its
/// timeout, here a minute: it returns once the two others are ready and
/// the grace is over. The call runs on a thread that the test waits for
/// within half that minute, so that the old wait fails the test instead of
/// passing slowly; no duration is compared.
#[test]
fn warm_up_quorum_does_not_wait_for_a_stalled_master() {
    let mut masters = cluster(3);
    let mut redlock = client(&masters.urls());
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    let (tx, rx) = std::sync::mpsc::channel();
    let warming = thread::spawn(move || {
        let ready = redlock.warm_up_quorum(Duration::from_secs(60));
        let _ = tx.send(ready);
        redlock
    });
    let ready = rx.recv_timeout(Duration::from_secs(30));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    let ready = ready.unwrap_or_else(|_| panic!("warm_up_quorum waited for the stalled master"));
    assert_eq!(ready, Ok(2), "the two answering masters");
    let mut redlock = warming.join().unwrap_or_else(|_| panic!("warm-up thread"));
    let lock = redlock
        .try_acquire("warm-quorum", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

/// One server named twice (an IP literal and a name looked up) is told
/// by `warm_up_quorum`, however soon a quorum is ready, and refused from
/// then on.
#[test]
fn warm_up_quorum_tells_one_server_named_twice() {
    let masters = cluster(2);
    let port = masters[0].port();
    let urls = vec![
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}"),
        masters[1].url(),
    ];
    let mut redlock = client(&urls);
    let same = |got: Option<&Error>| {
        matches!(got, Some(Error::Config(ConfigError::SameServer { first, second }))
            if **first == *urls[0] && **second == *urls[1])
    };
    let got = redlock.warm_up_quorum(WAIT);
    assert!(same(got.as_ref().err()), "{got:?}");
    let got = redlock.try_acquire("twice", TTL);
    assert!(same(got.as_ref().err()), "{got:?}");
}

#[test]
fn a_batch_locks_each_free_resource_and_reports_each_held_one() {
    let masters = cluster(3);
    let servers = masters.servers();
    // Two of the sixteen are held elsewhere, on a majority.
    for key in ["batch-3", "batch-11"] {
        for server in &servers[..2] {
            let reply = plain(server).cmd(&["SET".into(), key.into(), "other".into()]);
            assert!(reply.is_ok(), "{reply:?}");
        }
    }
    let mut redlock = client(&masters.urls());
    let names: Vec<String> = (0..16).map(|i| format!("batch-{i}")).collect();
    let results = redlock
        .try_acquire_batch(names.iter().cloned(), TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(results.len(), 16);
    let mut locks = Vec::new();
    for (name, result) in names.iter().zip(results) {
        match (name.as_str(), result) {
            ("batch-3" | "batch-11", Err(Error::Held(fail))) => assert!(fail.refused >= 2),
            ("batch-3" | "batch-11", other) => panic!("{name}: {other:?}"),
            (_, Ok(lock)) => {
                assert_eq!(lock.resource(), name.as_bytes());
                assert!(lock.remaining() > Duration::ZERO && lock.remaining() <= TTL);
                wait_held(servers, name, lock.token());
                locks.push(lock);
            }
            (_, Err(e)) => panic!("{name}: {e}"),
        }
    }
    // The held ones' third master got our SET, and the release after it.
    for key in ["batch-3", "batch-11"] {
        assert!(
            eventually(WAIT, || get(&servers[2], key) == Reply::Nil),
            "{key} left on the third master: {:?}",
            get(&servers[2], key)
        );
    }
    let released = redlock.release_batch(&locks);
    assert_eq!(released.len(), 14);
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    for lock in &locks {
        wait_gone(
            servers,
            std::str::from_utf8(lock.resource()).unwrap_or_default(),
        );
    }
    // Releasing them again: each lock reports that it is no longer held.
    let again = redlock.release_batch(&locks);
    assert!(
        again.iter().all(|r| matches!(r, Err(Error::NotHeld(_)))),
        "{again:?}"
    );
}

#[test]
fn spin_mode_locks_and_unlocks_like_the_default() {
    let masters = cluster(3);
    let mut config = config(&masters.urls());
    config.spin = true;
    let mut redlock = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    for i in 0..50 {
        let lock = redlock
            .try_acquire(format!("spin-{}", i % 3), TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    }
    let lock = redlock
        .try_acquire("spin-held", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut other = client(&masters.urls());
    assert!(matches!(
        other.try_acquire("spin-held", TTL),
        Err(Error::Held(_))
    ));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    wait_gone(masters.servers(), "spin-held");
}

/// A batch whose commands take more than a connection's write buffer
/// (`conn::OUT_CAPACITY`, 16 KiB) goes out whole, rounds after rounds: the
/// buffer holds a round's requests until they are written, and only a
/// master that leaves `Config::max_in_flight` requests unanswered is too
/// far behind. (A first cut of the lagging-master bound failed every
/// acquire of a batch of 128 here.)
#[test]
fn a_batch_larger_than_the_write_buffer_goes_out_whole() {
    let masters = cluster(3);
    let mut redlock = client(&masters.urls());
    // 256 acquires of 40-byte names: about 25 KiB of SETs per master, and
    // more in releases.
    let names: Vec<String> = (0..256)
        .map(|i| format!("a-batch-larger-than-the-buffer-{i:08}"))
        .collect();
    for round in 0..3 {
        let results = redlock
            .try_acquire_batch(names.iter().cloned(), TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        let locks: Vec<_> = results
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("round {round}: {e}")))
            .collect();
        let released = redlock.release_batch(&locks);
        assert!(
            released.iter().all(Result::is_ok),
            "round {round}: {released:?}"
        );
    }
}
