//! Multi-resource locks against real masters: all or nothing on each
//! master, the quorum taken over masters.

mod common;

use std::time::Duration;

use common::{cluster, connect};

/// A client for masters the test started empty.
fn client(urls: &[String]) -> Redlock {
    common::client(urls, None)
}
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::{ConfigError, Error, Redlock};
use redlock_test::Server;

const TTL: Duration = Duration::from_secs(15);

fn get(server: &Server, key: &str) -> Reply {
    connect(server).cmd(&[Arg::Bytes(b"GET"), Arg::Bytes(key.as_bytes())])
}

fn pttl(server: &Server, key: &str) -> i64 {
    match connect(server).cmd(&[Arg::Bytes(b"PTTL"), Arg::Bytes(key.as_bytes())]) {
        Reply::Integer(ms) => ms,
        other => panic!("PTTL {key}: {other:?}"),
    }
}

fn token(text: &str) -> Reply {
    Reply::Bulk(bytes::Bytes::copy_from_slice(text.as_bytes()))
}

#[test]
fn overlapping_sets_contend_and_disjoint_ones_do_not() {
    let masters = cluster(3);
    let urls = masters.urls();
    let mut a = client(&urls);
    let mut b = client(&urls);
    let ab = a
        .try_acquire_many(["m:a", "m:b"], TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ab.resources().len(), 2);
    assert_eq!(ab.resource(), b"m:a");
    for server in &masters {
        for key in ["m:a", "m:b"] {
            assert_eq!(get(server, key), token(ab.token().as_str()), "{key}");
        }
    }
    let refused = b.try_acquire_many(["m:b", "m:c"], TTL);
    assert!(matches!(refused, Err(Error::Held(_))), "{refused:?}");
    // All or nothing: the refused set left no m:c behind.
    for server in &masters {
        assert_eq!(get(server, "m:c"), Reply::Nil, "{}", server.url());
    }
    let cd = b
        .try_acquire_many(["m:c", "m:d"], TTL)
        .unwrap_or_else(|e| panic!("disjoint set: {e}"));
    // A single-resource lock on a member of a held set is refused too.
    assert!(matches!(b.try_acquire("m:a", TTL), Err(Error::Held(_))));
    a.release(&ab).unwrap_or_else(|e| panic!("{e}"));
    b.release(&cd).unwrap_or_else(|e| panic!("{e}"));
    for server in &masters {
        for key in ["m:a", "m:b", "m:c", "m:d"] {
            assert_eq!(
                get(server, key),
                Reply::Nil,
                "{key} left on {}",
                server.url()
            );
        }
    }
}

#[test]
fn a_set_partly_held_on_one_master_is_not_taken_there_and_nothing_is_left() {
    let masters = cluster(3);
    let foreign = connect(&masters[0]).cmd(&[
        Arg::Bytes(b"SET"),
        Arg::Bytes(b"p:b"),
        Arg::Bytes(b"someone-else"),
    ]);
    assert!(foreign.is_ok());
    let mut a = client(&masters.urls());
    let lock = a
        .try_acquire_many(["p:a", "p:b"], TTL)
        .unwrap_or_else(|e| panic!("quorum from the two others: {e}"));
    // Master 0 held p:b elsewhere, so it took neither key.
    assert_eq!(get(&masters[0], "p:a"), Reply::Nil);
    assert_eq!(get(&masters[0], "p:b"), token("someone-else"));
    for server in &masters.servers()[1..] {
        assert_eq!(get(server, "p:a"), token(lock.token().as_str()));
        assert_eq!(get(server, "p:b"), token(lock.token().as_str()));
    }
    a.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        get(&masters[0], "p:b"),
        token("someone-else"),
        "not ours to release"
    );
    for server in &masters.servers()[1..] {
        assert_eq!(get(server, "p:a"), Reply::Nil);
        assert_eq!(get(server, "p:b"), Reply::Nil);
    }
    // With the foreign key on two masters, the set cannot be had.
    connect(&masters[1]).cmd(&[Arg::Bytes(b"SET"), Arg::Bytes(b"p:b"), Arg::Bytes(b"x")]);
    let refused = a.try_acquire_many(["p:a", "p:b"], TTL);
    assert!(matches!(refused, Err(Error::Held(_))), "{refused:?}");
    a.settle(Duration::from_secs(5));
    for server in &masters {
        assert_eq!(
            get(server, "p:a"),
            Reply::Nil,
            "p:a left on {}",
            server.url()
        );
    }
}

#[test]
fn extending_a_set_extends_every_key_or_none() {
    let masters = cluster(3);
    let mut a = client(&masters.urls());
    let mut lock = a
        .try_acquire_many(["e:a", "e:b", "e:c"], Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    a.extend(&mut lock, TTL).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lock.extensions(), 1);
    for server in &masters {
        for key in ["e:a", "e:b", "e:c"] {
            assert!(pttl(server, key) > 5_000, "{key} on {}", server.url());
        }
    }
    // One key lost on two masters: the set is no longer held there, and
    // extending changes nothing.
    for server in &masters.servers()[..2] {
        connect(server).cmd(&[Arg::Bytes(b"DEL"), Arg::Bytes(b"e:b")]);
        connect(server).cmd(&[Arg::Bytes(b"PEXPIRE"), Arg::Bytes(b"e:a"), Arg::Int(4_000)]);
    }
    let lost = a.extend(&mut lock, TTL);
    assert!(matches!(lost, Err(Error::NotHeld(_))), "{lost:?}");
    assert!(pttl(&masters[0], "e:a") <= 4_000, "all or none per master");
    let released = a.release(&lock);
    assert!(matches!(released, Err(Error::NotHeld(_))), "{released:?}");
    for server in &masters {
        for key in ["e:a", "e:b", "e:c"] {
            assert_eq!(get(server, key), Reply::Nil, "{key} on {}", server.url());
        }
    }
}

#[test]
fn an_empty_set_is_a_config_error() {
    let mut a = client(&["redis://127.0.0.1:1".to_owned()]);
    let empty: [&'static str; 0] = [];
    assert_eq!(
        a.try_acquire_many(empty, TTL).err(),
        Some(Error::Config(ConfigError::NoResources))
    );
}
