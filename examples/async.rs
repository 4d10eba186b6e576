//! The shared client under tokio: many tasks taking locks through one event
//! loop, and a lock kept alive while an async job runs, the job stopped if
//! the lock is lost. The library depends on no runtime: its futures use
//! only `std::task`, so any executor drives them.
//!
//! `REDLOCK_SERVERS=redis://...,redis://... cargo run --example async`

use std::time::Duration;

use redlock_mio::{Error, KeepOptions, SharedRedlock};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let servers =
        std::env::var("REDLOCK_SERVERS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // One client per process: a clone is a handle to the same event loop.
    let redlock = SharedRedlock::connect(servers.split(','))?;

    // A hundred tasks at once; their acquires and releases share writes.
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let redlock = redlock.clone();
            tokio::spawn(async move {
                let lock = redlock
                    .acquire_async(format!("orders:{i}"), Duration::from_secs(10))
                    .await?;
                // ... work while lock.remaining() > 0 ...
                redlock.release_async(&lock).await
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task panicked")?;
    }

    // A long job under a lock the event loop keeps alive; if the lock is
    // lost, the job is dropped (cancelled) while validity is left.
    let lock = redlock
        .acquire_async("reports:nightly", Duration::from_secs(10))
        .await?;
    let kept = redlock.keep(lock, KeepOptions::default())?;
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(25)) => println!("job done"),
        lost = kept.lost_async() => println!("lock lost, job cancelled: {lost}"),
    }
    kept.release_async().await
}
