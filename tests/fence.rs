//! Fencing tokens for a quorum, against real masters: strictly increasing
//! across successive holders of one resource, under contention and across a
//! minority master's data loss, which the next acquisition repairs.

mod common;

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use common::{client, cluster, connect, wait_for_uptime};
use redlock_mio::resp::{Arg, Reply};
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
