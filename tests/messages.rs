//! What a new user reads when a lock fails: each message names
//! the cause a user can act on, against real masters the test starts. A
//! password the URL lacks names the password (not restart quarantine); a
//! wrong one names the credentials; a deployment in restart quarantine
//! says so, for how long, and how to turn it off; a port that speaks
//! something else says it is not Redis; a master that had not answered
//! when the round was decided is listed; a held lock is said to be this
//! client's or another's only when the masters told whose it is.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread;
use std::time::Duration;

use common::{Options, cluster, hold_elsewhere, master_with, shared_config};
use redlock_mio::{Error, Failure, Lock, Redlock, Retry, SharedRedlock, Vote};

const TTL: Duration = Duration::from_secs(2);

/// The TTL of a lock that must stay held while a test runs.
const HELD: Duration = Duration::from_secs(30);

/// The start of the message of a lock held by this client, by another,
/// and by one of the two (a refusal that named no holder).
const BY_THIS_CLIENT: &str = "lock held by this client (a lock it took and has not released): ";
const BY_ANOTHER_CLIENT: &str = "lock held by another client: ";
const BY_EITHER: &str = "lock already held (by this client or another): ";

/// A client of `urls` with restart quarantine as given, connected before
/// its first round (as far as the masters let it).
fn client(urls: &[String], quarantine: Option<Duration>) -> Redlock {
    let mut config = shared_config(urls);
    config.quarantine = quarantine;
    let mut client = Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    client.warm_up(Duration::from_secs(2));
    client
}

/// A master that wants a password, named by a URL without one, with
/// restart quarantine on and off: the message says to put the password in
/// the URL, and neither names INFO nor quarantine.
#[test]
fn a_password_missing_from_the_url_is_named_with_quarantine_on_and_off() {
    let locked = master_with(&Options::new().requirepass("secret"));
    let urls = [locked.url()];
    for quarantine in [Some(Duration::from_secs(60)), None] {
        let got = client(&urls, quarantine).try_acquire("r", TTL);
        let Err(error @ Error::Denied(_)) = &got else {
            panic!("quarantine {quarantine:?}: a missing password is for good: {got:?}");
        };
        let message = error.to_string();
        assert!(message.contains("NOAUTH"), "{message}");
        assert!(
            message.contains("the master needs a password")
                && message.contains("redis://:PASSWORD@host:port"),
            "quarantine {quarantine:?}: {message}"
        );
        assert!(
            !message.contains("quarantine") && !message.contains("+info"),
            "quarantine {quarantine:?}: {message}"
        );
    }
}

/// A wrong password: the message says the user name or password is wrong.
#[test]
fn a_wrong_password_is_named_as_wrong_credentials() {
    let locked = master_with(&Options::new().requirepass("secret"));
    let urls = [format!("redis://:hunter2@127.0.0.1:{}", locked.port())];
    let got = client(&urls, None).try_acquire("r", TTL);
    let Err(error @ Error::Denied(_)) = &got else {
        panic!("a wrong password is for good: {got:?}");
    };
    let message = error.to_string();
    assert!(message.contains("WRONGPASS"), "{message}");
    assert!(message.contains("wrong user name or password"), "{message}");
    assert!(
        !message.contains("hunter2"),
        "the password must not show: {message}"
    );
}

/// Masters started a moment ago, with restart quarantine on: the error
/// says they are in restart quarantine, for how long each, and how to
/// turn it off for masters started empty.
#[test]
fn freshly_started_masters_say_they_are_in_restart_quarantine() {
    let masters = cluster(3);
    let got = client(&masters.urls(), Some(Duration::from_secs(60))).try_acquire("r", TTL);
    let Err(error @ Error::NoQuorum(failure)) = &got else {
        panic!("masters up for less than the max TTL must not count: {got:?}");
    };
    let message = error.to_string();
    // Two quarantined votes decide the round; the third may come after.
    let quarantined = failure.quarantined();
    assert!(quarantined >= 2, "{message}");
    assert!(
        message.starts_with(&format!(
            "quorum missed: {quarantined} of 3 masters in restart quarantine for up to "
        )),
        "{message}"
    );
    assert!(
        message.contains("for masters started empty")
            && message.contains("Config::quarantine = None turns it off"),
        "{message}"
    );
    assert!(!message.contains("unreachable"), "{message}");
    for vote in &failure.votes {
        let Vote::Failed(cause) = &vote.vote else {
            assert_eq!(vote.vote, Vote::Pending, "{message}");
            continue;
        };
        let text = cause.to_string();
        let seconds = text
            .strip_prefix("in restart quarantine for ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{text}"));
        assert!((58..=60).contains(&seconds), "{text}");
        assert!(text.contains(" s more"), "{text}");
    }
}

/// A port that answers HTTP: the master reads as not a Redis server,
/// quoting what it answered.
#[test]
fn an_http_port_reads_as_not_a_redis_server() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("{e}"))
        .port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    let got = client(&[format!("redis://127.0.0.1:{port}")], None).try_acquire("r", TTL);
    let Err(error) = &got else {
        panic!("an HTTP port grants nothing: {got:?}");
    };
    let message = error.to_string();
    assert!(
        message.contains("not a Redis server (it answered \"HTTP/1.1 400 Bad Request\")"),
        "{message}"
    );
    assert!(!message.contains("CRLF"), "{message}");
}

/// Two masters refuse (another client holds the key) while a third never
/// answers: the round is decided without it, and the message lists it as
/// not having answered yet.
#[test]
fn a_master_that_had_not_answered_yet_is_listed() {
    let masters = cluster(2);
    hold_elsewhere(masters.iter(), "r", 30_000);
    // Accepts connections and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let mut urls = masters.urls();
    urls.push(format!(
        "redis://127.0.0.1:{}",
        silent.local_addr().unwrap_or_else(|e| panic!("{e}")).port()
    ));
    // Not warmed up: the silent master's handshake would wait out the
    // warm-up, and could stall past its limit before the round.
    let mut client = Redlock::new(shared_config(&urls)).unwrap_or_else(|e| panic!("{e}"));
    let got = client.try_acquire("r", TTL);
    let Err(error @ Error::Held(failure)) = &got else {
        panic!("two of three refuse: {got:?}");
    };
    assert_eq!(failure.votes[2].vote, Vote::Pending, "{error}");
    let message = error.to_string();
    assert!(
        message.ends_with(&format!("; {}: no answer yet", urls[2])),
        "{message}"
    );
}

/// A waiting acquire: retries, woken by releases, for at most a second.
/// Its attempts after the first ask the masters who holds the lock; the
/// wait is long enough that, on a loaded machine too, the first (a plain
/// `SET NX`, which names nobody) is over before it runs out, so that its
/// last attempt asks.
fn waiting() -> Retry {
    Retry::default()
        .with_attempts(10)
        .with_delay(Duration::from_millis(50))
        .with_max_wait(Some(Duration::from_secs(1)))
}

/// The failure of an acquire refused because the lock is held, and its
/// message, which must start with `starts`.
fn held<'a>(got: &'a Result<Lock, Error>, starts: &str) -> &'a Failure {
    let Err(error @ Error::Held(failure)) = got else {
        panic!("the lock is held: {got:?}");
    };
    let message = error.to_string();
    assert!(message.starts_with(starts), "{message}");
    failure
}

/// A lock this client holds, wanted again by the same client: a waiting
/// acquire, whose attempts ask who holds, and a fenced one, whose script
/// names the holder too, say this client holds it; a plain attempt,
/// which learns nothing of the holder, does not say who does.
#[test]
fn a_lock_this_client_holds_is_said_to_be_held_by_this_client() {
    let masters = cluster(3);
    let mut client = client(&masters.urls(), None);
    let lock = client
        .try_acquire("r", HELD)
        .unwrap_or_else(|e| panic!("{e}"));

    let got = client.acquire_with("r", TTL, &waiting());
    let failure = held(&got, BY_THIS_CLIENT);
    assert_eq!(failure.held_by_this_client(), Some(true), "{failure}");
    assert!(failure.attempts >= 2, "{failure}");

    let got = client.try_acquire_fenced("r", TTL);
    assert_eq!(held(&got, BY_THIS_CLIENT).held_by_this_client(), Some(true));

    let got = client.try_acquire("r", TTL);
    assert_eq!(held(&got, BY_EITHER).held_by_this_client(), None);

    client.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

/// Two callers of one shared client: the second, waiting for the lock
/// the first holds, is told this client holds it.
#[test]
fn a_shared_clients_caller_waiting_for_another_callers_lock_is_told_this_client_holds_it() {
    let masters = cluster(3);
    let shared =
        SharedRedlock::new(shared_config(&masters.urls())).unwrap_or_else(|e| panic!("{e}"));
    let lock = shared
        .try_acquire("r", HELD)
        .unwrap_or_else(|e| panic!("{e}"));

    let other = shared.clone();
    let got = thread::spawn(move || other.acquire_with("r", TTL, &waiting()))
        .join()
        .unwrap_or_else(|_| panic!("the second caller panicked"));
    assert_eq!(held(&got, BY_THIS_CLIENT).held_by_this_client(), Some(true));

    shared.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

/// A lock another client holds: a waiting acquire is told so; a plain
/// attempt does not say who holds it.
#[test]
fn a_lock_another_client_holds_is_said_to_be_held_by_another_client() {
    let masters = cluster(3);
    let urls = masters.urls();
    let mut alice = client(&urls, None);
    let mut bob = client(&urls, None);
    let lock = alice
        .try_acquire("r", HELD)
        .unwrap_or_else(|e| panic!("{e}"));

    let got = bob.acquire_with("r", TTL, &waiting());
    let failure = held(&got, BY_ANOTHER_CLIENT);
    assert_eq!(failure.held_by_this_client(), Some(false), "{failure}");

    let got = bob.try_acquire("r", TTL);
    assert_eq!(held(&got, BY_EITHER).held_by_this_client(), None);

    alice.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}
