//! What a new user reads when a lock fails: each message names
//! the cause a user can act on, against real masters the test starts. A
//! password the URL lacks names the password (not restart quarantine); a
//! wrong one names the credentials; a deployment in restart quarantine
//! says so, for how long, and how to turn it off; a port that speaks
//! something else says it is not Redis; a master that had not answered
//! when the round was decided is listed.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use common::{Options, cluster, hold_elsewhere, master_with, shared_config};
use redlock_mio::{Error, Redlock, Vote};

const TTL: Duration = Duration::from_secs(2);

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
