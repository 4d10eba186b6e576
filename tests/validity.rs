//! Validity that never lies (issue 10): a caller is never told it holds a
//! lock whose keys may be gone. Each test here reproduces a scenario the
//! review found, against real masters.

mod common;

use std::time::{Duration, Instant};

use common::{Server, client, cluster, connect, eventually, status};
use redlock_mio::resp::Arg;
use redlock_mio::{Error, Vote};

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
