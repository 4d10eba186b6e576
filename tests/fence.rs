//! Fencing tokens for a quorum, against real masters: strictly increasing
//! across successive holders of one resource, under contention, and across
//! a minority master's data loss (the marker rule of `SAFETY.md`): a
//! master that lost its data does not count until repaired, a fresh
//! deployment bootstraps once every master answers, a majority's loss
//! leaves the fence unknown, and a master is readmitted with a floor.
//! A refused write-back is its own error.

mod common;

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::{client, cluster, connect, eventually, try_connect_addr, wait_for_uptime};
use redlock_mio::resp::{Arg, Limits, Reply, decode};
use redlock_mio::script::{FENCE_SOURCE, FENCE_STATE_KEY, Script};
use redlock_mio::{Error, Lock, Redlock};
use redlock_test::Server;

const TTL: Duration = Duration::from_secs(2);

fn stored_fence(server: &Server, resource: &str) -> Option<u64> {
    let key = format!("{resource}:fence");
    match connect(server).cmd(&[Arg::Bytes(b"GET"), Arg::Bytes(key.as_bytes())]) {
        Reply::Bulk(v) => std::str::from_utf8(&v).ok().and_then(|v| v.parse().ok()),
        _ => None,
    }
}

fn fenced(redlock: &mut Redlock, resource: &str) -> Lock {
    let lock = redlock
        .try_acquire_fenced(resource.to_owned(), TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(lock.remaining() > Duration::ZERO);
    lock
}

#[test]
fn successive_holders_get_strictly_increasing_fences() {
    let masters = cluster(3);
    let urls = masters.urls();
    let mut a = client(&urls, None);
    let mut b = client(&urls, None);
    let mut last = 0;
    for round in 0..10 {
        let holder = if round % 2 == 0 { &mut a } else { &mut b };
        let lock = fenced(holder, "fenced");
        let fence = lock.fence().unwrap_or_else(|| panic!("no fence"));
        assert!(fence > last, "round {round}: {fence} after {last}");
        last = fence;
        // Held: the other client is refused, fenced or not.
        let other = if round % 2 == 0 { &mut b } else { &mut a };
        assert!(matches!(
            other.try_acquire_fenced("fenced", TTL),
            Err(Error::Held(_))
        ));
        let holder = if round % 2 == 0 { &mut a } else { &mut b };
        holder.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(last, 10, "one step per acquisition");
    // The slowest master's write-back may still be on its way when the
    // quorum has decided: read once every reply is in. A quorum holds the
    // last fence (the guarantee); a master whose connection was dropped on
    // a very loaded machine may hold an older one, never a larger one.
    a.settle(Duration::from_secs(10));
    b.settle(Duration::from_secs(10));
    let stored: Vec<Option<u64>> = masters
        .iter()
        .map(|server| stored_fence(server, "fenced"))
        .collect();
    assert!(
        stored.iter().filter(|f| **f == Some(10)).count() >= 2,
        "{stored:?}"
    );
    assert!(
        stored.iter().all(|f| f.is_some_and(|f| f <= 10)),
        "{stored:?}"
    );
    // A plain lock carries no fence.
    let plain = a
        .try_acquire("fenced", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plain.fence(), None);
    a.release(&plain).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_minority_master_that_lost_its_data_is_repaired_by_the_next_write_back() {
    let mut masters = cluster(3);
    let urls = masters.urls();
    let mut a = client(&urls, None);
    for _ in 0..3 {
        let lock = fenced(&mut a, "repair");
        a.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    }
    masters[2]
        .restart()
        .unwrap_or_else(|e| panic!("restart: {e}"));
    assert_eq!(
        stored_fence(&masters[2], "repair"),
        None,
        "its data is gone"
    );
    let mut b = client(&urls, None);
    let lock = fenced(&mut b, "repair");
    assert_eq!(lock.fence(), Some(4), "read from the masters that kept it");
    assert_eq!(
        b.settle(Duration::from_secs(10)),
        0,
        "every master answered"
    );
    for server in &masters {
        assert_eq!(stored_fence(server, "repair"), Some(4), "{}", server.url());
    }
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn fences_increase_under_contention_while_a_minority_master_crashes_and_restarts() {
    // Quarantine keeps a restarted master (which lost its fence values)
    // out of the next quorums, so that every granting quorum still meets
    // the one that confirmed the previous write-back.
    let max_ttl = TTL;
    let mut masters = cluster(3);
    wait_for_uptime(&masters, max_ttl);
    let urls = masters.urls();
    let held: Mutex<Vec<(Instant, Instant, u64)>> = Mutex::new(Vec::new());
    let run_for = Duration::from_secs(4);
    let start = Instant::now();
    thread::scope(|s| {
        for _ in 0..3 {
            let (urls, held) = (&urls, &held);
            s.spawn(move || {
                let mut redlock = client(urls, Some(max_ttl));
                while start.elapsed() < run_for {
                    if let Ok(lock) =
                        redlock.try_acquire_fenced("contended", Duration::from_millis(500))
                    {
                        let acquired = Instant::now();
                        let fence = lock.fence().unwrap_or_else(|| panic!("no fence"));
                        thread::sleep(Duration::from_millis(2));
                        // Work that overran the validity (a thread scheduled
                        // late) is over at the deadline, as far as the lock
                        // is concerned: no later holder may start before it.
                        let finished = Instant::now().min(lock.deadline());
                        held.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((acquired, finished, fence));
                        let _ = redlock.release(&lock);
                    }
                }
            });
        }
        // Crash and restart one master (a different one each time) twice.
        thread::sleep(Duration::from_millis(800));
        masters[1].restart().unwrap_or_else(|e| panic!("{e}"));
        thread::sleep(Duration::from_millis(1200));
        masters[0].restart().unwrap_or_else(|e| panic!("{e}"));
    });
    let mut held = held.into_inner().unwrap_or_else(|p| p.into_inner());
    held.sort();
    assert!(held.len() >= 10, "too few acquisitions: {}", held.len());
    for pair in held.windows(2) {
        let ((_, done, before), (start, _, after)) = (pair[0], pair[1]);
        assert!(done <= start, "two holders overlap: {pair:?}");
        assert!(after > before, "fence went from {before} to {after}");
    }
    println!(
        "{} fenced acquisitions, fences {}..={}",
        held.len(),
        held[0].2,
        held[held.len() - 1].2
    );
}

/// A master's fencing state: whether it carries the marker, and its floor.
fn fence_state(server: &Server) -> (bool, Option<u64>) {
    let reply = connect(server).cmd(&[
        Arg::Bytes(b"HMGET"),
        Arg::Bytes(FENCE_STATE_KEY),
        Arg::Bytes(b"marked"),
        Arg::Bytes(b"floor"),
    ]);
    let Reply::Array(fields) = reply else {
        panic!("HMGET on {}: {reply:?}", server.url());
    };
    let floor = match fields.get(1) {
        Some(Reply::Bulk(v)) => std::str::from_utf8(v).ok().and_then(|v| v.parse().ok()),
        _ => None,
    };
    (matches!(fields.first(), Some(Reply::Bulk(_))), floor)
}

fn flushall(server: &Server) {
    assert_eq!(
        connect(server).cmd(&[Arg::Bytes(b"FLUSHALL")]),
        Reply::Status(bytes::Bytes::from_static(b"OK")),
        "FLUSHALL on {}",
        server.url()
    );
}

fn names(servers: &[&str]) -> Vec<Arc<str>> {
    servers.iter().map(|s| Arc::from(*s)).collect()
}

/// On three real masters: a fence that reached only M1 and M2 (M3
/// unreachable) must not be handed out again after M2 lost its data and
/// M1 is slow, when the grants come from M2 and M3 (SAFETY.md, "Fencing
/// tokens"). Before the marker, B got fence 5 a second time.
#[test]
fn a_fence_is_not_handed_out_again_after_a_master_that_had_it_lost_its_data() {
    let mut masters = cluster(3);
    let m3 = Proxy::start(masters[2].addr());
    let urls = vec![masters[0].url(), masters[1].url(), m3.url()];
    let mut a = client(&urls, None);
    for _ in 0..4 {
        let lock = fenced(&mut a, "item8");
        a.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(a.settle(Duration::from_secs(5)), 0);
    for server in &masters {
        assert_eq!(stored_fence(server, "item8"), Some(4), "{}", server.url());
        assert!(fence_state(server).0, "{} is marked", server.url());
    }
    // A takes fence 5 while M3 is unreachable: it reaches M1 and M2 only.
    m3.set_swallow(true);
    let lock = fenced(&mut a, "item8");
    assert_eq!(lock.fence(), Some(5));
    a.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    drop(a);
    m3.set_swallow(false);
    assert_eq!(stored_fence(&masters[0], "item8"), Some(5));
    assert_eq!(stored_fence(&masters[1], "item8"), Some(5));
    assert_eq!(stored_fence(&masters[2], "item8"), Some(4));
    // M2 comes back empty; M1 stops answering (SIGSTOP).
    masters[1]
        .restart()
        .unwrap_or_else(|e| panic!("restart: {e}"));
    let mut b = client(&urls, None);
    assert_eq!(
        b.warm_up(Duration::from_secs(5)),
        3,
        "B reaches every master"
    );
    masters[0].pause().unwrap_or_else(|e| panic!("pause: {e}"));
    let got = b.try_acquire_fenced("item8", TTL);
    masters[0]
        .resume()
        .unwrap_or_else(|e| panic!("resume: {e}"));
    match got {
        Ok(lock) => panic!(
            "B was granted fence {:?} by M2 (empty) and M3, after A held 5",
            lock.fence()
        ),
        // M2 cannot vouch for its reading, M3 alone is no quorum.
        Err(Error::FenceUnknown { untrusted, failure }) => {
            assert_eq!(untrusted, names(&[&masters[1].url()]), "{failure}");
            assert_eq!(failure.granted, 2, "{failure}");
        }
        Err(e) => panic!("{e}"),
    }
    // With M1 back, B reads 5 from it and writes 6 everywhere, which
    // repairs M2 for this resource (and only for it: M2 stays unmarked).
    let mut second = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            second = b.try_acquire_fenced("item8", TTL).ok();
            second.is_some()
        }),
        "B never got the lock once M1 answered again"
    );
    let lock = second.unwrap_or_else(|| unreachable!());
    assert_eq!(lock.fence(), Some(6));
    b.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.settle(Duration::from_secs(5)), 0);
    for server in &masters {
        assert_eq!(stored_fence(server, "item8"), Some(6), "{}", server.url());
    }
    assert_eq!(fence_state(&masters[1]), (false, None), "M2 stays unmarked");
}

/// Item 12: the write-back of phase two finds the lock key gone (deleted
/// here between the phases by a proxy in front of two of the three
/// masters). That is its own error, not "held by another client", and the
/// next acquisition still gets a larger fence.
#[test]
fn a_refused_fence_write_back_is_its_own_error() {
    let masters = cluster(3);
    let p1 = Proxy::start(masters[0].addr());
    let p2 = Proxy::start(masters[1].addr());
    let urls = vec![p1.url(), p2.url(), masters[2].url()];
    let mut a = client(&urls, None);
    let lock = fenced(&mut a, "vanishing");
    a.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    // Every reply of that first lock read, so that only the next
    // acquisition's write-backs meet the deletion.
    assert_eq!(a.settle(Duration::from_secs(5)), 0);
    p1.delete_before_write_back(Some("vanishing"));
    p2.delete_before_write_back(Some("vanishing"));
    let got = a.try_acquire_fenced("vanishing", TTL);
    assert_eq!(
        (p1.deletions(), p2.deletions()),
        (1, 1),
        "one write-back through each proxy"
    );
    match got {
        Err(Error::FenceRefused(failure)) => {
            // The two refusals decide the round: M3's grant counts only
            // when it arrived before the second of them (timing).
            assert_eq!(failure.refused, 2, "{failure}");
            assert!(failure.granted <= 1, "{failure}");
            let text = Error::FenceRefused(failure).to_string();
            assert!(text.contains("lock key was gone"), "{text}");
        }
        Ok(lock) => panic!("granted fence {:?} without a quorum", lock.fence()),
        Err(e) => panic!("expected FenceRefused: {e}"),
    }
    p1.delete_before_write_back(None);
    p2.delete_before_write_back(None);
    // The last fence returned was 1: the next one is larger. M3 stored 2
    // from the failed attempt, which no quorum confirmed: the next fence is
    // 3 when M3's reading is among the quorum's, 2 when M1 and M2 answer
    // first (both are within the guarantee; which one depends on timing).
    let lock = fenced(&mut a, "vanishing");
    assert!(matches!(lock.fence(), Some(2 | 3)), "{:?}", lock.fence());
    a.release(&lock).unwrap_or_else(|e| panic!("{e}"));
}

/// A fresh deployment: no master carries the marker, and an unmarked
/// master may equally have lost its data, so fencing starts only once
/// every master has granted in one acquisition; from then on a quorum
/// suffices.
#[test]
fn a_fresh_deployment_starts_fencing_once_every_master_answers() {
    let masters = cluster(3);
    let m3 = Proxy::start(masters[2].addr());
    let urls = vec![masters[0].url(), masters[1].url(), m3.url()];
    let mut early = client(&urls, None);
    assert_eq!(early.warm_up(Duration::from_secs(5)), 3);
    m3.set_swallow(true);
    match early.try_acquire_fenced("fresh", TTL) {
        Err(Error::FenceUnknown { untrusted, failure }) => assert_eq!(
            untrusted,
            names(&[&masters[0].url(), &masters[1].url()]),
            "{failure}"
        ),
        Ok(lock) => panic!("fence {:?} from two unmarked masters", lock.fence()),
        Err(e) => panic!("{e}"),
    }
    drop(early);
    for server in &masters {
        assert_eq!(fence_state(server), (false, None), "{}", server.url());
    }
    m3.set_swallow(false);
    let mut c = client(&urls, None);
    let lock = fenced(&mut c, "fresh");
    assert_eq!(lock.fence(), Some(1));
    c.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.settle(Duration::from_secs(5)), 0);
    for server in &masters {
        assert!(fence_state(server).0, "{} is marked", server.url());
    }
    // Marked: a quorum now suffices, for this resource and a new one.
    m3.set_swallow(true);
    for (resource, want) in [("fresh", 2), ("new", 1)] {
        let lock = fenced(&mut c, resource);
        assert_eq!(lock.fence(), Some(want), "{resource}");
        c.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Two of three masters lose their data: what they confirmed may now live
/// on no intact master, so every fenced acquire fails with FenceUnknown
/// instead of starting the fences over. Plain locks are unaffected.
#[test]
fn two_masters_that_lost_their_data_leave_the_fence_unknown_rather_than_start_over() {
    let masters = cluster(3);
    let urls = masters.urls();
    let mut c = client(&urls, None);
    for _ in 0..3 {
        let lock = fenced(&mut c, "lost");
        c.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(c.settle(Duration::from_secs(5)), 0);
    flushall(&masters[1]);
    flushall(&masters[2]);
    for resource in ["lost", "never-fenced"] {
        match c.try_acquire_fenced(resource, TTL) {
            Err(Error::FenceUnknown { untrusted, failure }) => {
                assert_eq!(failure.granted, 3, "{failure}");
                assert_eq!(
                    untrusted,
                    names(&[&masters[1].url(), &masters[2].url()]),
                    "{resource}: {failure}"
                );
            }
            Ok(lock) => panic!(
                "{resource}: fence {:?} after losing a majority",
                lock.fence()
            ),
            Err(e) => panic!("{resource}: {e}"),
        }
    }
    let plain = c.try_acquire("lost", TTL).unwrap_or_else(|e| panic!("{e}"));
    c.release(&plain).unwrap_or_else(|e| panic!("{e}"));
}

/// With restart quarantine on (max TTL 1 s), a master seen without its
/// marker for twice that is readmitted by the next fenced acquire, with a
/// floor above every fence a quorum of marked masters holds, so that the
/// fences it lost cannot come back. Here fence 3 of "item" reached only
/// M1 and M3 before M3 lost its data; once M3 is readmitted, M1 stops, and
/// M2 (which has 2) and M3 must still give more than 3.
#[test]
fn a_master_that_lost_its_data_is_readmitted_with_a_floor_after_twice_the_max_ttl() {
    let max_ttl = Duration::from_secs(1);
    let ttl = Duration::from_millis(500);
    let mut masters = cluster(3);
    wait_for_uptime(&masters, max_ttl);
    let m2 = Proxy::start(masters[1].addr());
    let urls = vec![masters[0].url(), m2.url(), masters[2].url()];
    let mut a = client(&urls, Some(max_ttl));
    let take = |redlock: &mut Redlock, resource: &str| {
        let lock = redlock
            .try_acquire_fenced(resource.to_owned(), ttl)
            .unwrap_or_else(|e| panic!("{resource}: {e}"));
        redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
        lock.fence().unwrap_or_else(|| panic!("no fence"))
    };
    assert_eq!((take(&mut a, "item"), take(&mut a, "item")), (1, 2));
    assert_eq!(a.settle(Duration::from_secs(5)), 0);
    m2.set_swallow(true);
    assert_eq!(take(&mut a, "item"), 3);
    drop(a);
    // Everything the client sent M2 is swallowed before the relay passes
    // bytes again: on a loaded machine the relay's thread may read the
    // write-back only after the client is gone.
    assert!(
        eventually(Duration::from_secs(30), || m2.reading() == 0),
        "the relay still reads a closed client's bytes"
    );
    m2.set_swallow(false);
    let stored: Vec<_> = masters.iter().map(|s| stored_fence(s, "item")).collect();
    assert_eq!(stored, [Some(3), Some(2), Some(3)]);
    flushall(&masters[2]);
    let mut c = client(&urls, Some(max_ttl));
    assert!(
        eventually(Duration::from_secs(30), || {
            take(&mut c, "other");
            c.settle(Duration::from_secs(5));
            fence_state(&masters[2]).0
        }),
        "M3 was never readmitted"
    );
    let (_, floor) = fence_state(&masters[2]);
    assert!(floor.is_some_and(|f| f > 3), "M3's floor {floor:?}");
    masters[0].pause().unwrap_or_else(|e| panic!("pause: {e}"));
    let got = c.try_acquire_fenced("item", ttl);
    masters[0]
        .resume()
        .unwrap_or_else(|e| panic!("resume: {e}"));
    let lock = got.unwrap_or_else(|e| panic!("M2 and M3 are marked: {e}"));
    assert!(
        lock.fence() > Some(3),
        "fence {:?} from M2 and the readmitted M3",
        lock.fence()
    );
    let _ = c.release(&lock);
}

// The proxy: a TCP relay in front of one master, with std threads (one
// accepting, two per connection), that can swallow what the client sends
// (an unreachable master whose connection stays open) or delete a lock
// key just before a fence write-back reaches the master. Dropping it stops
// and joins every thread.

/// How often a relay thread checks for stop.
const PUMP_POLL: Duration = Duration::from_millis(20);

struct Relay {
    upstream: SocketAddr,
    swallow: AtomicBool,
    /// Client connections whose bytes are still being read (to their end).
    reading: AtomicUsize,
    stop: AtomicBool,
    /// The key to delete on the master before forwarding a write-back.
    delete: Mutex<Option<String>>,
    deletions: Mutex<usize>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

struct Proxy {
    addr: SocketAddr,
    relay: Arc<Relay>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("proxy bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy addr: {e}"));
        let relay = Arc::new(Relay {
            upstream,
            swallow: AtomicBool::new(false),
            reading: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            delete: Mutex::new(None),
            deletions: Mutex::new(0),
            threads: Mutex::new(Vec::new()),
        });
        let shared = Arc::clone(&relay);
        let acceptor = thread::spawn(move || accept(&listener, &shared));
        Proxy {
            addr,
            relay,
            acceptor: Some(acceptor),
        }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// While on, every byte the client sends is dropped: the master is
    /// unreachable, though the connection stays open.
    fn set_swallow(&self, on: bool) {
        self.relay.swallow.store(on, Ordering::SeqCst);
    }

    /// Client connections whose bytes are still being read: 0 once every
    /// client that connected has closed and all it sent has been read
    /// (and, while swallowing, dropped).
    fn reading(&self) -> usize {
        self.relay.reading.load(Ordering::SeqCst)
    }

    /// From now on, `resource`'s lock key is deleted on the master just
    /// before each fence write-back is forwarded to it; `None` stops that.
    fn delete_before_write_back(&self, resource: Option<&str>) {
        *lock(&self.relay.delete) = resource.map(str::to_owned);
    }

    fn deletions(&self) -> usize {
        *lock(&self.relay.deletions)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.relay.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept, which then sees `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for pump in std::mem::take(&mut *lock(&self.relay.threads)) {
            let _ = pump.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn accept(listener: &TcpListener, relay: &Arc<Relay>) {
    for conn in listener.incoming() {
        if relay.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = conn else { continue };
        let Ok(server) = TcpStream::connect_timeout(&relay.upstream, Duration::from_secs(2)) else {
            continue;
        };
        let setup = |s: &TcpStream| -> io::Result<TcpStream> {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(PUMP_POLL))?;
            s.try_clone()
        };
        let (Ok(client_out), Ok(server_out)) = (setup(&client), setup(&server)) else {
            continue;
        };
        let mut threads = lock(&relay.threads);
        relay.reading.fetch_add(1, Ordering::SeqCst);
        for (from, to, to_server) in [(client, server_out, true), (server, client_out, false)] {
            let relay = Arc::clone(relay);
            threads.push(thread::spawn(move || pump(from, to, to_server, &relay)));
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, to_server: bool, relay: &Relay) {
    let fence_sha = Script::new(FENCE_SOURCE).sha().to_vec();
    let mut buf = vec![0u8; 16 * 1024];
    // What the client sent, cut into whole commands, so that each fence
    // write-back is seen on its own however the reads split or merge them.
    let mut pending = BytesMut::new();
    while !relay.stop.load(Ordering::SeqCst) {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(_) => break,
        };
        if !to_server {
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
            continue;
        }
        if relay.swallow.load(Ordering::SeqCst) {
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        let mut failed = false;
        loop {
            let before = pending.clone();
            let command = match decode(&mut pending, &Limits::default()) {
                Ok(Some(command)) => command,
                Ok(None) => break,
                Err(_) => {
                    failed = true;
                    break;
                }
            };
            let raw = &before[..before.len() - pending.len()];
            let is_write_back = matches!(&command, Reply::Array(args)
                if matches!(args.get(1), Some(Reply::Bulk(sha)) if sha[..] == fence_sha[..]));
            let delete = lock(&relay.delete).clone();
            if let (true, Some(key)) = (is_write_back, delete) {
                let deleted = try_connect_addr(relay.upstream)
                    .and_then(|mut c| c.try_cmd(&[Arg::Bytes(b"DEL"), Arg::Bytes(key.as_bytes())]));
                if let Ok(Reply::Integer(_)) = deleted {
                    *lock(&relay.deletions) += 1;
                }
            }
            if to.write_all(raw).is_err() {
                failed = true;
                break;
            }
        }
        if failed {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    if to_server {
        relay.reading.fetch_sub(1, Ordering::SeqCst);
    }
}
