//! Validity that never lies: a caller is never told it holds a
//! lock whose keys may be gone. Each test here reproduces a scenario the
//! review found, against real masters.

mod common;

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{Server, client, cluster, connect, eventually, status};
use redlock_mio::Cause;
use redlock_mio::resp::Arg;
use redlock_mio::{Config, ConfigError, Error, Lock, Redlock, Resolver, Token, Vote};

/// Generous for a loaded machine: only a broken run waits this long.
const WAIT: Duration = Duration::from_secs(30);

/// Holds every command of every client on `server` for `ms` milliseconds
/// (`CLIENT PAUSE`): commands sent meanwhile run when it ends. In force once
/// this returns.
fn hold_commands(server: &Server, ms: i64) {
    let reply = connect(server).cmd(&["CLIENT".into(), "PAUSE".into(), Arg::Int(ms)]);
    assert_eq!(reply, status("OK"), "CLIENT PAUSE on {}", server.url());
}

/// Item 1. N = 3: a lock taken for 30 s is extended to 2 s while two
/// masters hold their commands past the round's timeout. The extend fails
/// (one grant, two timeouts), yet all three masters run the script: M1 at
/// once, M2 and M3 when their pause ends. The keys now expire 2 s after
/// that, and another client takes the lock then. The lock must say so: its
/// deadline can be no later than the moment the other client got it.
#[test]
fn a_failed_extend_never_leaves_a_deadline_later_than_the_keys() {
    let masters = cluster(3);
    let urls = masters.urls();
    let mut a = client(&urls, None);
    let mut lock = a
        .try_acquire("validity:extend", Duration::from_secs(30))
        .expect("acquire");
    for server in &masters.servers()[1..] {
        hold_commands(server, 3000);
    }
    let err = a
        .extend(&mut lock, Duration::from_secs(2))
        .expect_err("two of three masters cannot answer in time");
    assert!(matches!(err, Error::NoQuorum(_)), "{err}");
    let failure = err.failure().expect("votes");
    assert!(
        failure.votes[1..]
            .iter()
            .all(|v| matches!(v.vote, Vote::Failed(_))),
        "{failure}"
    );
    let told = lock.deadline();
    assert!(
        lock.remaining() <= Duration::from_secs(2),
        "after a failed extend to 2 s the lock claims {:?} of validity",
        lock.remaining()
    );

    let mut b = client(&urls, None);
    let mut taken_at = None;
    assert!(
        eventually(WAIT, || {
            let tried = Instant::now();
            match b.try_acquire("validity:extend", Duration::from_secs(30)) {
                Ok(_) => taken_at = Some(tried),
                Err(e) => assert!(!matches!(e, Error::Config(_)), "{e}"),
            }
            taken_at.is_some()
        }),
        "another client never got the lock"
    );
    let taken_at = taken_at.unwrap_or_else(|| unreachable!());
    assert!(
        told <= taken_at,
        "A was told it held the lock until {:?} after B took it",
        told - taken_at
    );
}

/// A resolver for `name` (anything else is an error) that waits for `gate`
/// to open, then answers `addrs`, or the loopback address at the port asked
/// for when `addrs` is empty.
fn gated_resolver(
    name: &'static str,
    addrs: Vec<SocketAddr>,
    gate: &Arc<(Mutex<bool>, Condvar)>,
) -> Resolver {
    let gate = Arc::clone(gate);
    Resolver::new(move |host, port| {
        if host != name {
            return Err(io::Error::other(format!("unknown host {host}")));
        }
        let (open, wake) = &*gate;
        let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = wake.wait(open).unwrap_or_else(|e| e.into_inner());
        }
        if addrs.is_empty() {
            return Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))]);
        }
        Ok(addrs.clone())
    })
}

/// Whether `redlock` takes (and then releases) `resource` within [`WAIT`],
/// trying again until it does.
fn acquires_in_time(redlock: &mut Redlock, resource: &'static str) -> bool {
    let mut held = None;
    let taken = eventually(WAIT, || {
        held = redlock.try_acquire(resource, Duration::from_secs(10)).ok();
        held.is_some()
    });
    if let Some(lock) = held {
        redlock.release(&lock).expect("release");
    }
    taken
}

fn open_gate(gate: &(Mutex<bool>, Condvar)) {
    *gate.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
    gate.1.notify_all();
}

/// Item 6. Two of three masters are named by a host name whose lookup
/// hangs. The acquire must not wait on it: it returns, while the lookup is
/// still stuck, with those two votes failed as "lookup still running". Once
/// the lookup answers, the masters are used.
#[test]
fn a_hanging_host_name_lookup_never_holds_a_round() {
    let masters = cluster(3);
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let addrs = masters.addrs();
    // One name for both: the port picks the master.
    let resolver = gated_resolver("slow.test", Vec::new(), &gate);
    let urls = [
        masters[0].url(),
        format!("redis://slow.test:{}", addrs[1].port()),
        format!("redis://slow.test:{}", addrs[2].port()),
    ];
    let mut config = Config::new(urls).expect("config");
    config.quarantine = None;
    config.per_instance_timeout = Duration::from_millis(300);
    config.resolver = resolver;
    let mut redlock = Redlock::new(config).expect("client");
    let err = redlock
        .try_acquire("validity:dns", Duration::from_secs(10))
        .expect_err("one master of three cannot grant");
    let failure = err.failure().expect("votes");
    assert!(matches!(err, Error::NoQuorum(_)), "{err}");
    for vote in &failure.votes[1..] {
        assert_eq!(vote.vote, Vote::Failed(Cause::Resolving), "{failure}");
    }
    assert!(
        !*gate.0.lock().unwrap_or_else(|e| e.into_inner()),
        "gate still shut"
    );
    open_gate(&gate);
    assert!(
        acquires_in_time(&mut redlock, "validity:dns"),
        "the masters were never used after their lookup"
    );
}

/// Item 6. A name that resolves to two addresses, the first refusing
/// connections: the client moves on to the second instead of retrying the
/// first for ever.
#[test]
fn every_address_a_name_resolves_to_is_tried_in_turn() {
    let master = common::master();
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let gate = Arc::new((Mutex::new(true), Condvar::new()));
    let mut config = Config::new([format!("redis://two.test:{}", master.port())]).expect("config");
    config.quarantine = None;
    config.per_instance_timeout = Duration::from_millis(300);
    config.resolver = gated_resolver("two.test", vec![dead, master.addr()], &gate);
    let mut redlock = Redlock::new(config).expect("client");
    assert!(
        acquires_in_time(&mut redlock, "validity:two"),
        "the second address was never tried"
    );
}

/// Item 7. One server named twice (`127.0.0.1:P` and `localhost:P`)
/// beside one other master: two votes from the one server would make a
/// fake majority. Once both names are connected
/// every acquire or extend is refused with a configuration error naming
/// both URLs. (A vote from the second name of a server is never counted
/// even within the round that connects it: see the simulator test
/// `one_server_behind_two_connections_votes_once`.)
#[test]
fn one_server_named_twice_never_votes_twice() {
    let mut masters = cluster(2);
    let port = masters[0].port();
    let urls = [
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}"),
        masters[1].url(),
    ];
    let mut config = Config::new(&urls).expect("config");
    config.quarantine = None;
    config.per_instance_timeout = Duration::from_millis(300);
    let mut redlock = Redlock::new(config).expect("client");
    // Every name looked up and connected: the one server answers twice.
    assert_eq!(redlock.warm_up(WAIT), 3, "all three names connected");
    let refused = redlock.try_acquire("validity:twice", Duration::from_secs(10));
    if let Ok(mut lock) = refused {
        // SET NX refuses the second name, so an acquire alone cannot show
        // it: an extend can. With the real second master stopped, one
        // server's two names extend the lock "on a quorum".
        masters[1].pause().expect("pause");
        let extended = redlock.extend(&mut lock, Duration::from_secs(10));
        masters[1].resume().expect("resume");
        panic!(
            "acquired with one server named twice; with the other master stopped, extend said {extended:?}"
        );
    }
    let Err(Error::Config(error @ ConfigError::SameServer { .. })) = &refused else {
        panic!("expected SameServer, got {refused:?}");
    };
    let message = error.to_string();
    assert!(
        message.contains(&urls[0]) && message.contains(&urls[1]),
        "{message}"
    );
    let mut lock = Lock::from_parts("validity:twice", Token::parse("t").expect("token"));
    assert!(matches!(
        redlock.extend(&mut lock, Duration::from_secs(1)),
        Err(Error::Config(ConfigError::SameServer { .. }))
    ));
}
