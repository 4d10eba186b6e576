//! Fencing tokens for a quorum, against real masters: strictly increasing
//! across successive holders of one resource, under contention and across a
//! minority master's data loss, which the next acquisition repairs.

mod common;

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::{client, cluster, connect, eventually, try_connect_addr, wait_for_uptime};
use redlock_mio::resp::{Arg, Limits, Reply, decode};
use redlock_mio::script::{FENCE_SOURCE, Script};
use redlock_mio::spawn::Server;
use redlock_mio::{Error, Lock, Redlock};

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
    for server in &masters {
        assert_eq!(stored_fence(server, "fenced"), Some(10), "{}", server.url());
    }
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
                        let finished = Instant::now();
                        assert!(finished < lock.deadline(), "work overran the validity");
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

/// The scenario of issue 10, item 8, on three real masters: a fence that
/// reached only M1 and M2 (M3 unreachable) must not be handed out again
/// after M2 lost its data and M1 is slow, when the grants come from M2
/// and M3.
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
    for server in &masters {
        assert_eq!(stored_fence(server, "item8"), Some(4), "{}", server.url());
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
    match &got {
        Ok(lock) => assert!(
            lock.fence() > Some(5),
            "B was granted fence {:?} by M2 (empty) and M3, after A held 5",
            lock.fence()
        ),
        Err(e) => println!("B refused while M1 is slow: {e}"),
    }
    if let Ok(lock) = &got {
        b.release(lock).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Item 12: the write-back of phase two finds the lock key gone (deleted
/// here between the phases by a proxy in front of two of the three
/// masters): that is not "held by another client".
#[test]
fn a_refused_fence_write_back_is_not_reported_as_held() {
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
    p1.delete_before_write_back("vanishing");
    p2.delete_before_write_back("vanishing");
    let got = a.try_acquire_fenced("vanishing", TTL);
    assert_eq!(
        (p1.deletions(), p2.deletions()),
        (1, 1),
        "one write-back through each proxy"
    );
    let err = match got {
        Ok(lock) => panic!("granted fence {:?} without a quorum", lock.fence()),
        Err(e) => e,
    };
    assert!(
        !matches!(err, Error::Held(_)),
        "reported as held by another client: {err}"
    );
    println!("{err}");
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

    /// From now on, `resource`'s lock key is deleted on the master just
    /// before each fence write-back is forwarded to it.
    fn delete_before_write_back(&self, resource: &str) {
        *lock(&self.relay.delete) = Some(resource.to_owned());
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
}
