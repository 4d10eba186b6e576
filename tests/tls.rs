//! TLS to the masters (`rediss://`), against real TLS-only redis-server
//! masters with certificates made at test time ([`certs::Certs`]):
//! locking over TLS, TLS and plain masters in one quorum, requests larger
//! than rustls buffers (during the handshake and after it), every way a
//! handshake can fail (an unknown issuer, an expired certificate, a
//! certificate for another name, a client certificate missing for a
//! master that asks for one), TLS settings that cannot work, and two fakes
//! on 127.0.0.1: one that accepts and never answers the ClientHello, one
//! that answers it with bytes that are not TLS.
//!
//! A TLS failure with one master is one failed vote, naming the problem:
//! the other masters still make the quorum, and nothing panics. Keys are
//! read behind the client's back through each TLS master's unix socket,
//! in plain.
//!
//! Every master here is started empty by its test, so restart quarantine
//! is off: no lock predates them. Each test stops what it starts: masters
//! and fakes are dropped (killed, joined) also when an assertion fails.

mod common;
// Beside the shared harness, but not in it: only the tests that make
// certificates include it (here, and the CLI's `probe` and `bench` tests).
#[path = "common/tls.rs"]
mod certs;

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use certs::{Certs, Pair};
use common::{
    Cluster, Options, Server, assert_untouched, bulk, cluster_with, connect, eventually, wait_empty,
};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::{
    Cause, Config, ConfigError, Error, Failure, Lock, Redlock, Retry, SharedRedlock, TlsConfig,
    Token, Vote,
};

/// Long enough that no key expires during a test: a key that is gone was
/// released.
const TTL: Duration = Duration::from_secs(10);
/// The per-instance timeout: generous, so that a TLS handshake on a
/// loaded machine is not a lost vote, yet far below the TTL.
const PER_INSTANCE: Duration = Duration::from_secs(1);
/// How long past [`PER_INSTANCE`] a round with a silent master may take
/// on a loaded machine.
const SLACK: Duration = Duration::from_secs(2);
/// How long a check of the masters' keys may take.
const WAIT: Duration = Duration::from_secs(5);

/// Settings for `urls` with `tls`. No restart quarantine: the masters were
/// started empty by the test, so no lock predates them.
fn config(urls: &[String], tls: TlsConfig) -> Config {
    let mut config = Config::new(urls).unwrap_or_else(|e| panic!("{e}"));
    config.per_instance_timeout = PER_INSTANCE;
    config.connect_timeout = Duration::from_secs(5);
    config.quarantine = None;
    config.tls = tls;
    config
}

/// Trusting `ca` only, no client certificate.
fn trusting(ca: &Path) -> TlsConfig {
    TlsConfig::default().with_ca_file(ca.to_path_buf())
}

/// Trusting `ca` only, showing `client`'s certificate.
fn trusting_as(ca: &Path, client: &Pair) -> TlsConfig {
    TlsConfig::default()
        .with_ca_file(ca.to_path_buf())
        .with_client_cert(client.cert.clone(), client.key.clone())
}

/// A single-threaded client, connected before its first round.
fn redlock(urls: &[String], tls: TlsConfig) -> Redlock {
    let mut client = Redlock::new(config(urls, tls)).unwrap_or_else(|e| panic!("{e}"));
    client.warm_up(Duration::from_secs(5));
    client
}

fn shared(urls: &[String], tls: TlsConfig) -> SharedRedlock {
    SharedRedlock::new(config(urls, tls)).unwrap_or_else(|e| panic!("{e}"))
}

/// `k` TLS-only masters serving `pair`, asking clients for no certificate.
fn tls_masters(k: usize, certs: &Certs, pair: &Pair) -> Cluster {
    cluster_with(k, &Options::new().tls(certs.options(pair)))
}

fn get(server: &Server, key: &str) -> Reply {
    connect(server).cmd(&[Arg::Bytes(b"GET"), Arg::Bytes(key.as_bytes())])
}

fn pttl(server: &Server, key: &str) -> i64 {
    match connect(server).cmd(&[Arg::Bytes(b"PTTL"), Arg::Bytes(key.as_bytes())]) {
        Reply::Integer(ms) => ms,
        other => panic!("PTTL {key} on {}: {other:?}", server.url()),
    }
}

/// Sets `key` on `server` to a token of no client, as another holder's.
fn hold_elsewhere(server: &Server, key: &str) {
    let reply = connect(server).cmd(&[
        Arg::Bytes(b"SET"),
        Arg::Bytes(key.as_bytes()),
        Arg::Bytes(b"someone-else"),
        Arg::Bytes(b"PX"),
        Arg::Bytes(b"10000"),
    ]);
    assert_eq!(reply, common::status("OK"), "SET on {}", server.url());
}

/// Waits until every server in `servers` holds `key` with `token`: an
/// operation returns once its quorum is known, so the slowest master's
/// write may land just after.
fn wait_held<'a>(servers: impl IntoIterator<Item = &'a Server>, key: &str, token: &Token) {
    for server in servers {
        assert!(
            eventually(WAIT, || get(server, key) == bulk(token.as_str())),
            "{} does not hold {key} with the lock's token: {:?}",
            server.url(),
            get(server, key)
        );
    }
}

fn wait_all_empty<'a>(servers: impl IntoIterator<Item = &'a Server>) {
    for server in servers {
        if let Err(keys) = wait_empty(server, WAIT) {
            panic!("{} still holds {keys:?}", server.url());
        }
    }
}

/// The problem a TLS failure names. A master whose handshake failed in an
/// earlier round may be in reconnect backoff, with that failure inside.
fn tls_problem(cause: &Cause) -> Option<&str> {
    match cause {
        Cause::Tls(problem) => Some(problem),
        Cause::Backoff(last) => tls_problem(last),
        _ => None,
    }
}

/// Asserts that every master of `client` fails its TLS handshake with a
/// message that names the problem by one of `words` (lower case).
///
/// A round ends as soon as its outcome is known: once two of three
/// masters have failed, the third may still be `Pending`. So rounds are
/// tried (a bounded number) until each master has shown its failure; in
/// each, no master grants or refuses and every failed vote is such a TLS
/// failure.
fn assert_every_master_fails_tls(client: &mut Redlock, resource: &'static str, words: &[&str]) {
    let masters = client.config().servers.len();
    let mut seen = vec![false; masters];
    for _ in 0..10 {
        let failure = match client.try_acquire(resource, TTL) {
            Err(Error::NoQuorum(failure)) => failure,
            other => panic!("expected the masters' TLS to fail, got {other:?}"),
        };
        for (i, vote) in failure.votes.iter().enumerate() {
            let cause = match &vote.vote {
                Vote::Pending => continue,
                Vote::Failed(cause) => cause,
                other => panic!("{} voted {other:?}: {failure}", vote.server),
            };
            let Some(problem) = tls_problem(cause) else {
                panic!(
                    "{} failed with {cause:?}, not a TLS cause: {failure}",
                    vote.server
                );
            };
            let lower = problem.to_lowercase();
            assert!(
                words.iter().any(|w| lower.contains(w)),
                "{}'s TLS failure {problem:?} names none of {words:?}",
                vote.server
            );
            seen[i] = true;
        }
        if seen.iter().all(|&s| s) {
            return;
        }
        // Lets the master left pending finish failing.
        client.warm_up(Duration::from_secs(5));
    }
    panic!("not every master showed a TLS failure in 10 rounds: {seen:?}");
}

#[test]
fn a_lock_is_taken_extended_and_released_over_tls_on_three_masters() {
    let certs = Certs::generate();
    let masters = tls_masters(3, &certs, &certs.server);
    let urls = masters.urls();
    assert!(
        urls.iter().all(|u| u.starts_with("rediss://127.0.0.1:")),
        "{urls:?}"
    );
    let mut alice = redlock(&urls, trusting(&certs.ca));
    let mut bob = redlock(&urls, trusting(&certs.ca));

    let mut lock = alice
        .try_acquire("tls:cycle", TTL)
        .unwrap_or_else(|e| panic!("acquire over TLS: {e}"));
    wait_held(&masters, "tls:cycle", lock.token());
    match bob.try_acquire("tls:cycle", TTL) {
        // Decided as soon as a quorum refused.
        Err(Error::Held(failure)) => {
            assert!(failure.refused >= bob.quorum(), "{failure}");
            assert_eq!(failure.granted, 0, "{failure}");
        }
        other => panic!("a second client must be refused over TLS: {other:?}"),
    }

    let longer = Duration::from_secs(30);
    alice
        .extend(&mut lock, longer)
        .unwrap_or_else(|e| panic!("extend over TLS: {e}"));
    for server in &masters {
        assert!(
            eventually(WAIT, || pttl(server, "tls:cycle") > TTL.as_millis() as i64),
            "{} kept PTTL {} after extending to {longer:?}",
            server.url(),
            pttl(server, "tls:cycle")
        );
    }

    alice
        .release(&lock)
        .unwrap_or_else(|e| panic!("release over TLS: {e}"));
    wait_all_empty(&masters);
    let lock = bob
        .try_acquire("tls:cycle", TTL)
        .unwrap_or_else(|e| panic!("the released lock, over TLS: {e}"));
    bob.release(&lock)
        .unwrap_or_else(|e| panic!("release over TLS: {e}"));
    wait_all_empty(&masters);
}

#[test]
fn the_shared_client_locks_over_tls_from_many_threads() {
    let certs = Certs::generate();
    let masters = tls_masters(3, &certs, &certs.server);
    let client = shared(&masters.urls(), trusting(&certs.ca));
    let threads = 4;
    let cycles = 20;
    thread::scope(|scope| {
        for t in 0..threads {
            let client = &client;
            scope.spawn(move || {
                for i in 0..cycles {
                    let resource = format!("tls:shared:{t}:{i}");
                    let mut lock = client
                        .acquire(resource.clone(), TTL)
                        .unwrap_or_else(|e| panic!("{resource}: acquire: {e}"));
                    client
                        .extend(&mut lock, TTL)
                        .unwrap_or_else(|e| panic!("{resource}: extend: {e}"));
                    client
                        .release(&lock)
                        .unwrap_or_else(|e| panic!("{resource}: release: {e}"));
                }
            });
        }
    });
    let lock = client
        .try_acquire("tls:shared:held", TTL)
        .unwrap_or_else(|e| panic!("acquire: {e}"));
    wait_held(&masters, "tls:shared:held", lock.token());
    client
        .release(&lock)
        .unwrap_or_else(|e| panic!("release: {e}"));
    wait_all_empty(&masters);
}

/// Settings for requests larger than rustls buffers (64 KiB of plaintext
/// while the handshake is under way, and 64 KiB of records the socket has
/// not taken after it): room for a [`BIG_BATCH`] in flight, so that the
/// test is of TLS and not of admission; a per-instance timeout that a
/// loaded machine encrypting hundreds of KiB per master stays within; and
/// a stall limit (the connect timeout) far past the time a paused master's
/// requests wait, with a shared client's idle loop looking at them once a
/// per-instance timeout.
fn big_config(urls: &[String], tls: TlsConfig) -> Config {
    let mut config = config(urls, tls);
    config.per_instance_timeout = Duration::from_secs(2);
    config.connect_timeout = Duration::from_secs(60);
    config.max_in_flight = 4 * BIG_BATCH;
    config
}

/// Resources in the large batch: each `SET` is about 170 bytes, so a
/// master gets about 170 KiB in one write, more than twice what rustls
/// buffers.
const BIG_BATCH: usize = 1000;
/// Long enough that no key expires during a large request's test.
const BIG_TTL: Duration = Duration::from_secs(60);
/// How long a paused master, once resumed, may take to catch up with what
/// waited for it (a shared client's idle loop looks once a per-instance
/// timeout).
const CATCH_UP: Duration = Duration::from_secs(30);

fn big_batch_names() -> Vec<String> {
    (0..BIG_BATCH)
        .map(|i| format!("tls:big-batch:a-resource-name-of-some-length-to-fill-the-buffer:{i:06}"))
        .collect()
}

/// Waits until every master of `servers` holds exactly `n` keys.
fn wait_dbsize<'a>(servers: impl IntoIterator<Item = &'a Server>, n: i64) {
    for server in servers {
        assert!(
            eventually(CATCH_UP, || common::dbsize(server) == n),
            "{} holds {} keys, not {n}",
            server.url(),
            common::dbsize(server)
        );
    }
}

/// Every result of a batch is a lock.
fn all_locked(results: Result<Vec<Result<Lock, Error>>, Error>) -> Vec<Lock> {
    let results = results.unwrap_or_else(|e| panic!("batch over TLS: {e}"));
    assert_eq!(results.len(), BIG_BATCH);
    let (locks, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
    if let Some(Err(first)) = failed.first() {
        panic!(
            "{} of {BIG_BATCH} resources not locked over TLS; the first: {first}",
            failed.len()
        );
    }
    locks.into_iter().flatten().collect()
}

/// A fresh client's first write to a master is the connection's first
/// flight and a batch of [`BIG_BATCH`] acquires, about 170 KiB, queued
/// while the handshake is still under way (the third master is paused, so
/// that its handshake cannot end before): rustls takes 64 KiB of it, the
/// rest waits in the connection's buffer until the handshake ends, and all
/// of it reaches the master once it is resumed. It used to fail the vote
/// as `WriteZero`, and drop the connection with the batch.
#[test]
fn a_batch_larger_than_rustls_buffers_waits_for_the_handshake() {
    let certs = Certs::generate();
    let mut masters = tls_masters(3, &certs, &certs.server);
    let mut client =
        Redlock::new(big_config(&masters.urls(), trusting(&certs.ca))).expect("client");
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    let locks = all_locked(client.try_acquire_batch(big_batch_names(), BIG_TTL));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(client.settle(CATCH_UP), 0, "requests left unanswered");
    wait_dbsize(&masters, BIG_BATCH as i64);
    let released = client.release_batch(&locks);
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    assert_eq!(client.settle(CATCH_UP), 0, "releases left unanswered");
    wait_all_empty(&masters);
}

/// [`a_batch_larger_than_rustls_buffers_waits_for_the_handshake`] from a
/// shared client, whose loop thread writes the rest once the handshake
/// ends.
#[test]
fn a_shared_batch_larger_than_rustls_buffers_waits_for_the_handshake() {
    let certs = Certs::generate();
    let mut masters = tls_masters(3, &certs, &certs.server);
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    let client =
        SharedRedlock::new(big_config(&masters.urls(), trusting(&certs.ca))).expect("client");
    let locks = all_locked(client.try_acquire_batch(big_batch_names(), BIG_TTL));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    wait_dbsize(&masters, BIG_BATCH as i64);
    let released = client.release_batch(&locks);
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    wait_all_empty(&masters);
}

/// Waits until every master of `servers` holds `key` with `token`; the
/// key is too long to name in a message.
fn wait_held_big<'a>(servers: impl IntoIterator<Item = &'a Server>, key: &str, token: &Token) {
    for server in servers {
        assert!(
            eventually(CATCH_UP, || get(server, key) == bulk(token.as_str())),
            "{} does not hold the {}-byte key with the lock's token: {:?}",
            server.url(),
            key.len(),
            get(server, key)
        );
    }
}

/// A resource whose name is 4 MiB: one request far larger than rustls
/// buffers, and than the kernel's socket buffers take from a paused
/// master's client.
fn big_resource() -> String {
    format!("tls:big:{}", "r".repeat(4 << 20))
}

/// A connected client's request larger than rustls buffers ([`big_resource`])
/// to a paused master: the socket takes what the kernel buffers, rustls
/// holds 64 KiB of records more and takes nothing after that, and the
/// rest waits in the connection's buffer until the socket is writable
/// again, once the master is resumed. It used to fail the vote as
/// `WriteZero`, and drop the connection with the request.
#[test]
fn a_request_larger_than_rustls_buffers_waits_for_the_socket() {
    let certs = Certs::generate();
    let mut masters = tls_masters(3, &certs, &certs.server);
    let resource = big_resource();
    let mut client =
        Redlock::new(big_config(&masters.urls(), trusting(&certs.ca))).expect("client");
    assert_eq!(client.warm_up(Duration::from_secs(5)), 3, "connected");
    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    let lock = client
        .try_acquire(resource.clone(), BIG_TTL)
        .unwrap_or_else(|e| panic!("a 4 MiB resource over TLS: {e}"));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(client.settle(CATCH_UP), 0, "requests left unanswered");
    wait_held_big(&masters, &resource, lock.token());
    client
        .release(&lock)
        .unwrap_or_else(|e| panic!("release: {e}"));
    assert_eq!(client.settle(CATCH_UP), 0, "releases left unanswered");
    wait_all_empty(&masters);
}

/// [`a_request_larger_than_rustls_buffers_waits_for_the_socket`] from a
/// shared client, connected by a first lock, whose loop thread writes the
/// rest once the socket is writable.
#[test]
fn a_shared_request_larger_than_rustls_buffers_waits_for_the_socket() {
    let certs = Certs::generate();
    let mut masters = tls_masters(3, &certs, &certs.server);
    let resource = big_resource();
    let client =
        SharedRedlock::new(big_config(&masters.urls(), trusting(&certs.ca))).expect("client");
    let lock = client
        .try_acquire("tls:big:small", BIG_TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_held(&masters, "tls:big:small", lock.token());
    client.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    wait_all_empty(&masters);

    masters[2].pause().unwrap_or_else(|e| panic!("{e}"));
    let lock = client
        .try_acquire(resource.clone(), BIG_TTL)
        .unwrap_or_else(|e| panic!("a 4 MiB resource over TLS: {e}"));
    masters[2].resume().unwrap_or_else(|e| panic!("{e}"));
    wait_held_big(&masters, &resource, lock.token());
    client
        .release(&lock)
        .unwrap_or_else(|e| panic!("release: {e}"));
    wait_all_empty(&masters);
}

#[test]
fn tls_and_plain_masters_vote_in_one_quorum() {
    let certs = Certs::generate();
    let tls = tls_masters(2, &certs, &certs.server);
    let plain = common::master();
    let mut urls = tls.urls();
    urls.push(plain.url());
    assert!(urls[2].starts_with("redis://"), "{urls:?}");
    let client = shared(&urls, trusting(&certs.ca));
    let every = || tls.iter().chain(std::iter::once(&plain));

    let lock = client
        .try_acquire("tls:mixed", TTL)
        .unwrap_or_else(|e| panic!("acquire on TLS and plain masters: {e}"));
    wait_held(every(), "tls:mixed", lock.token());
    client
        .release(&lock)
        .unwrap_or_else(|e| panic!("release: {e}"));
    wait_all_empty(every());

    // The plain master refuses: the quorum must come from both TLS ones.
    hold_elsewhere(&plain, "tls:mixed:2");
    let lock = client
        .try_acquire("tls:mixed:2", TTL)
        .unwrap_or_else(|e| panic!("acquire with the TLS masters' votes: {e}"));
    wait_held(&tls, "tls:mixed:2", lock.token());
    client
        .release(&lock)
        .unwrap_or_else(|e| panic!("release: {e}"));
    wait_all_empty(&tls);
}

/// Three TLS-only masters serving `served`, and a client trusting `ca`
/// only: every master fails its handshake naming the problem by one of
/// `words`, and nothing is written.
fn assert_refused(certs: &Certs, served: &Pair, ca: &Path, resource: &'static str, words: &[&str]) {
    let masters = tls_masters(3, certs, served);
    let mut client = Redlock::new(config(&masters.urls(), trusting(ca))).expect("client");
    assert_every_master_fails_tls(&mut client, resource, words);
    assert_untouched(&masters, resource);
}

#[test]
fn a_master_whose_issuer_is_not_trusted_is_a_failed_tls_vote() {
    let certs = Certs::generate();
    assert_refused(
        &certs,
        &certs.server,
        &certs.other_ca,
        "tls:untrusted",
        &["issuer"],
    );
}

#[test]
fn an_expired_server_certificate_is_a_failed_tls_vote() {
    let certs = Certs::generate();
    assert_refused(
        &certs,
        &certs.expired,
        &certs.ca,
        "tls:expired",
        &["expired"],
    );
}

#[test]
fn a_certificate_for_another_name_is_a_failed_tls_vote() {
    let certs = Certs::generate();
    assert_refused(
        &certs,
        &certs.wrong_host,
        &certs.ca,
        "tls:wrong-name",
        &["name"],
    );
}

#[test]
fn a_host_name_in_the_url_is_checked_against_the_certificate() {
    let certs = Certs::generate();
    let good = tls_masters(3, &certs, &certs.server);
    let by_name = |masters: &Cluster| -> Vec<String> {
        masters
            .iter()
            .map(|s| format!("rediss://{}:{}", certs::SERVER_DNS, s.port()))
            .collect()
    };
    let mut client = redlock(&by_name(&good), trusting(&certs.ca));
    let lock = client
        .try_acquire("tls:by-name", TTL)
        .unwrap_or_else(|e| panic!("acquire by the certificate's DNS name: {e}"));
    wait_held(&good, "tls:by-name", lock.token());
    client
        .release(&lock)
        .unwrap_or_else(|e| panic!("release: {e}"));
    wait_all_empty(&good);

    let wrong = tls_masters(3, &certs, &certs.wrong_host);
    // Warmed up: the name is looked up before the first round.
    let mut client = redlock(&by_name(&wrong), trusting(&certs.ca));
    assert_every_master_fails_tls(&mut client, "tls:by-name", &["name"]);
}

#[test]
fn a_master_that_asks_for_a_client_certificate_refuses_a_client_without_one() {
    let certs = Certs::generate();
    let opts = Options::new().tls(certs.server_options().auth_clients(true));
    let masters = cluster_with(3, &opts);
    let urls = masters.urls();

    let mut anonymous = Redlock::new(config(&urls, trusting(&certs.ca))).expect("client");
    assert_every_master_fails_tls(&mut anonymous, "tls:mutual", &["certificate", "alert"]);
    assert_untouched(&masters, "a client without a certificate");

    let mut known = redlock(&urls, trusting_as(&certs.ca, &certs.client));
    let lock = known
        .try_acquire("tls:mutual", TTL)
        .unwrap_or_else(|e| panic!("acquire with a client certificate: {e}"));
    wait_held(&masters, "tls:mutual", lock.token());
    known
        .release(&lock)
        .unwrap_or_else(|e| panic!("release with a client certificate: {e}"));
    wait_all_empty(&masters);
}

#[test]
fn tls_files_that_cannot_be_used_are_a_config_error() {
    let certs = Certs::generate();
    let not_pem = certs.dir().join("not-pem.txt");
    std::fs::write(&not_pem, "this is not PEM\n").expect("write");
    let missing = certs.dir().join("missing.pem");
    let urls = ["rediss://127.0.0.1:1".to_owned()];
    let cases: [(&str, TlsConfig); 5] = [
        ("a CA file that does not exist", trusting(&missing)),
        ("a CA file with no certificate in it", trusting(&not_pem)),
        ("a client certificate without its key", {
            let mut tls = trusting(&certs.ca);
            tls.cert_file = Some(certs.client.cert.clone());
            tls
        }),
        ("a client key without its certificate", {
            let mut tls = trusting(&certs.ca);
            tls.key_file = Some(certs.client.key.clone());
            tls
        }),
        (
            "a client key file that does not exist",
            trusting(&certs.ca).with_client_cert(certs.client.cert.clone(), missing.clone()),
        ),
    ];
    for (name, tls) in cases {
        match Redlock::new(config(&urls, tls.clone())) {
            Err(Error::Config(ConfigError::Tls(problem))) => {
                assert!(!problem.is_empty(), "{name}: an empty message");
            }
            other => panic!("{name}: Redlock::new gave {other:?}"),
        }
        match SharedRedlock::new(config(&urls, tls)) {
            Err(Error::Config(ConfigError::Tls(_))) => {}
            Err(other) => panic!("{name}: SharedRedlock::new gave {other:?}"),
            Ok(_) => panic!("{name}: SharedRedlock::new accepted it"),
        }
    }
}

#[test]
fn a_plain_url_to_a_tls_master_fails_its_votes_and_a_waiting_acquire_ends() {
    let certs = Certs::generate();
    let masters = tls_masters(3, &certs, &certs.server);
    // The wrong scheme: the masters reset every plain connection.
    let urls: Vec<String> = masters
        .iter()
        .map(|s| format!("redis://127.0.0.1:{}", s.port()))
        .collect();

    let mut single = Redlock::new(config(&urls, TlsConfig::default())).expect("client");
    match single.try_acquire("tls:plain-url", TTL) {
        Err(Error::NoQuorum(failure)) => {
            assert_eq!((failure.granted, failure.refused), (0, 0), "{failure}");
        }
        other => panic!("plain RESP to TLS-only masters: {other:?}"),
    }

    // A shared client's blocking acquire with retries left ends once its
    // attempts are used up. It runs on a thread of its own, so that a
    // hang fails the test instead of stalling it; such a thread, stuck in
    // the library, cannot be stopped, and ends with the test process.
    let client = shared(&urls, TlsConfig::default());
    // Enough attempts that the later ones find every master in reconnect
    // backoff (it doubles from 10 ms), past the 100 ms between attempts.
    let retry = Retry::default()
        .with_attempts(10)
        .with_delay(Duration::from_millis(100))
        .with_max_wait(None);
    let (done, outcome) = mpsc::channel();
    let waiter = client.clone();
    thread::spawn(move || {
        let _ = done.send(waiter.acquire_with("tls:plain-url", TTL, &retry));
    });
    let limit = Duration::from_secs(30);
    match outcome.recv_timeout(limit) {
        Ok(Err(Error::NoQuorum(failure))) => {
            assert_eq!((failure.granted, failure.refused), (0, 0), "{failure}");
            assert_eq!(failure.attempts, retry.attempts, "{failure}");
        }
        Ok(other) => panic!("plain RESP to TLS-only masters, shared: {other:?}"),
        Err(_) => panic!(
            "a shared acquire of {} attempts {:?} apart, over masters that reset every \
             connection, has not returned in {limit:?}",
            retry.attempts, retry.delay
        ),
    }
    assert_untouched(&masters, "plain RESP to TLS-only masters");
}

/// What a fake master on 127.0.0.1 does with each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fake {
    /// Accepts, reads, answers nothing, never closes.
    Silent,
    /// Reads the ClientHello and answers with bytes that are not TLS,
    /// then stays open.
    Garbage,
}

/// A fake master on its own thread. Dropping it stops the thread and
/// closes every connection it accepted.
struct FakeServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The bytes a [`Fake::Garbage`] master answers with.
const GARBAGE: &[u8] = b"-ERR this is not TLS\r\n\x00\xff\xfe garbage";
/// How often the fake looks for its stop flag.
const POLL: Duration = Duration::from_millis(20);
/// The most connections a fake accepts.
const MAX_ACCEPTS: usize = 256;

impl FakeServer {
    fn start(fake: Fake) -> FakeServer {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("local address");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = thread::spawn(move || serve(&listener, fake, &flag));
        FakeServer {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.addr.port())
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A panic in the fake shows up in the test's own assertions.
            let _ = thread.join();
        }
    }
}

fn serve(listener: &TcpListener, fake: Fake, stop: &AtomicBool) {
    let mut open: Vec<TcpStream> = Vec::new();
    let mut accepted = 0;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) if accepted < MAX_ACCEPTS => {
                accepted += 1;
                if fake == Fake::Garbage {
                    answer_with_garbage(&stream);
                }
                open.push(stream);
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(POLL),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => thread::sleep(POLL),
        }
        // Silent connections are drained, so that the client's writes
        // never block on a full buffer; nothing is answered.
        for mut stream in &open {
            let _ = stream.set_nonblocking(true);
            let mut sink = [0u8; 4096];
            while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
        }
    }
}

/// Waits (a bounded time) for the client's first bytes, then writes the
/// garbage.
fn answer_with_garbage(mut stream: &TcpStream) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut hello = [0u8; 4096];
    let _ = stream.read(&mut hello);
    let _ = stream.write_all(GARBAGE);
}

/// Two real TLS masters and `fake` as the third; the first real master
/// holds `contested` for someone else, so that the fake's vote decides
/// that round.
struct WithFake {
    _certs: Certs,
    masters: Cluster,
    fake: FakeServer,
    urls: Vec<String>,
    tls: TlsConfig,
}

impl WithFake {
    fn start(fake: Fake) -> WithFake {
        let certs = Certs::generate();
        let masters = tls_masters(2, &certs, &certs.server);
        let fake = FakeServer::start(fake);
        let mut urls = masters.urls();
        urls.push(fake.url());
        let tls = trusting(&certs.ca);
        WithFake {
            _certs: certs,
            masters,
            fake,
            urls,
            tls,
        }
    }

    /// The votes of a round the fake decides: the first real master
    /// refuses and the second grants, so that the fake's vote makes the
    /// difference. The round is lost once the fake has failed; the second
    /// master's grant may come after that (`Pending`).
    fn decisive_round(&self, acquire: impl FnOnce(&'static str) -> Result<Lock, Error>) -> Failure {
        hold_elsewhere(&self.masters[0], "tls:decisive");
        let failure = match acquire("tls:decisive") {
            Err(e) => e
                .failure()
                .cloned()
                .unwrap_or_else(|| panic!("no votes in {e:?}")),
            Ok(lock) => panic!(
                "granted by one real master and {:?}: {lock:?}",
                self.fake.addr
            ),
        };
        assert_eq!(failure.votes[0].vote, Vote::Refused, "{failure}");
        assert!(
            matches!(failure.votes[1].vote, Vote::Granted | Vote::Pending),
            "{failure}"
        );
        failure
    }

    /// A round the fake cannot spoil: both real masters grant.
    fn quorum_without_the_fake(&self, lock: &Lock) {
        wait_held(&self.masters, "tls:fresh", lock.token());
    }
}

#[test]
fn a_master_that_never_answers_the_handshake_fails_its_vote_within_the_timeout() {
    let setup = WithFake::start(Fake::Silent);
    let mut client = Redlock::new(config(&setup.urls, setup.tls.clone())).expect("client");

    let started = Instant::now();
    let failure = setup.decisive_round(|key| client.try_acquire(key, TTL));
    let took = started.elapsed();
    match &failure.votes[2].vote {
        Vote::Failed(Cause::Timeout | Cause::Tls(_)) => {}
        other => panic!("the silent master voted {other:?}: {failure}"),
    }
    // The round waited for the silent master, not the other way round.
    assert_eq!(failure.votes[1].vote, Vote::Granted, "{failure}");
    assert!(
        took < PER_INSTANCE + SLACK,
        "the round took {took:?} with a per-instance timeout of {PER_INSTANCE:?}"
    );
    wait_all_empty(std::iter::once(&setup.masters[1]));

    let lock = client
        .try_acquire("tls:fresh", TTL)
        .unwrap_or_else(|e| panic!("two TLS masters of three make the quorum: {e}"));
    setup.quorum_without_the_fake(&lock);
    client
        .release(&lock)
        .unwrap_or_else(|e| panic!("release from two TLS masters of three: {e}"));
    wait_all_empty(std::iter::once(&setup.masters[1]));
}

#[test]
fn a_master_that_answers_the_client_hello_with_garbage_is_a_failed_tls_vote() {
    let setup = WithFake::start(Fake::Garbage);
    let client = shared(&setup.urls, setup.tls.clone());

    let failure = setup.decisive_round(|key| client.try_acquire(key, TTL));
    match &failure.votes[2].vote {
        Vote::Failed(cause) if tls_problem(cause).is_some() => {}
        other => panic!("the garbage master voted {other:?}: {failure}"),
    }
    wait_all_empty(std::iter::once(&setup.masters[1]));

    // The client's loop is alive and the two real masters still make the
    // quorum.
    let lock = client
        .try_acquire("tls:fresh", TTL)
        .unwrap_or_else(|e| panic!("two TLS masters of three make the quorum: {e}"));
    setup.quorum_without_the_fake(&lock);
    client
        .release(&lock)
        .unwrap_or_else(|e| panic!("release from two TLS masters of three: {e}"));
    wait_all_empty(std::iter::once(&setup.masters[1]));
}
