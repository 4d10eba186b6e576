//! Intended use of redlock-mio, in about 20 lines. Run it against your
//! masters: `REDLOCK_SERVERS=redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002 cargo run --example lock`
use std::time::Duration;

use redlock_mio::{Error, Redlock};

fn main() -> Result<(), Error> {
    let servers =
        std::env::var("REDLOCK_SERVERS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut redlock = Redlock::connect(servers.split(','))?;

    // One lock, released explicitly: the fastest path.
    let lock = redlock.acquire("orders:42", Duration::from_secs(10))?;
    println!(
        "held with token {} for {:?}",
        lock.token(),
        lock.remaining()
    );
    // ... work, finishing before lock.remaining() runs out ...
    redlock.release(&lock)?;

    // A guard releases when it goes out of scope.
    match redlock.lock("orders:43", Duration::from_secs(10)) {
        Ok(guard) => println!("guarded, valid until {:?}", guard.deadline()),
        Err(Error::Held(why)) => println!("not now: {why}"),
        Err(other) => return Err(other),
    }
    Ok(())
}
