//! One caller's load never breaks another's, against real masters: a
//! batch larger than a connection's in-flight bound, and kept locks whose
//! extensions fall due together, go through the shared client's
//! admission instead of pushing the connections every caller shares past
//! their bound (which drops them as "too far behind").

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use common::{cluster, dbsize, eventually, shared_config as config};
use redlock_mio::{Error, KeepOptions, SharedRedlock};

/// `try_acquire_batch` of 1,100 free resources, with
/// other callers at work on the same client: the batch is refused before
/// anything is sent, with an error that says how to raise the bound, and
/// every other caller's operations succeed. Before, every master was
/// dropped as "too far behind", failing the 1,100 and everyone else.
#[test]
fn a_batch_over_the_bound_is_refused_and_breaks_no_other_caller() {
    let masters = cluster(3);
    let redlock = SharedRedlock::new(config(&masters.urls())).unwrap_or_else(|e| panic!("{e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let others: Vec<_> = (0..4)
        .map(|i| {
            let (redlock, stop, done) = (redlock.clone(), Arc::clone(&stop), Arc::clone(&done));
            thread::spawn(move || -> Result<(), Error> {
                while !stop.load(Ordering::Acquire) {
                    let lock =
                        redlock.try_acquire(format!("other:{i}"), Duration::from_secs(10))?;
                    redlock.release(&lock)?;
                    done.fetch_add(1, Ordering::AcqRel);
                }
                Ok(())
            })
        })
        .collect();
    assert!(eventually(Duration::from_secs(20), || done
        .load(Ordering::Acquire)
        >= 20));
    let resources: Vec<String> = (0..1100).map(|i| format!("big:{i}")).collect();
    let got = redlock.try_acquire_batch(resources, Duration::from_secs(10));
    let Err(Error::Config(refusal)) = &got else {
        let failed = got
            .as_ref()
            .map(|r| r.iter().filter(|r| r.is_err()).count());
        panic!("a batch of 1,100 with a bound of 1,024 in flight: {failed:?} failed");
    };
    let message = refusal.to_string();
    assert!(
        message.contains("1100") && message.contains("max_in_flight"),
        "{message}"
    );
    let before = done.load(Ordering::Acquire);
    assert!(eventually(Duration::from_secs(20), || done
        .load(Ordering::Acquire)
        >= before + 20));
    stop.store(true, Ordering::Release);
    for other in others {
        other
            .join()
            .expect("caller thread")
            .unwrap_or_else(|e| panic!("another caller failed: {e}"));
    }
    for m in masters.iter() {
        assert_eq!(dbsize(m), 0, "nothing of the batch was written");
    }
}

/// For kept locks: 64 kept locks whose extensions fall
/// due at one instant, on a client whose connections hold at most 32
/// requests in flight. Extensions go through admission (16 at a time
/// here), so every one of them succeeds; before, they were all sent in
/// one write, every connection was dropped as too far behind, every
/// extension failed, and the retries, all due at one instant, failed
/// again.
#[test]
fn kept_locks_falling_due_together_are_admitted_not_dropped() {
    let masters = cluster(3);
    let mut config = config(&masters.urls());
    config.max_in_flight = 32;
    config.per_instance_timeout = Duration::from_millis(500);
    let redlock = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let lock = redlock
        .try_acquire("kept", Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("{e}"));
    // The same lock kept 64 times: 64 schedules with one deadline.
    let kept: Vec<_> = (0..64)
        .map(|_| {
            redlock
                .keep(lock.clone(), KeepOptions::default())
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    // Two extension periods (one a second).
    let extended = eventually(Duration::from_secs(30), || {
        kept.iter()
            .all(|w| w.extensions() >= 2 || w.last_error().is_some())
    });
    assert!(extended, "extensions never happened");
    let failed: Vec<String> = kept
        .iter()
        .filter_map(|w| w.last_error().map(|e| e.to_string()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 64 kept locks failed to extend: {:?}",
        failed.len(),
        failed.first()
    );
    assert!(kept.iter().all(|w| w.lost().is_none()));
    for w in kept {
        let _ = w.release();
    }
}
