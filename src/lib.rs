//! redlock-mio: the Redlock distributed lock over N independent Redis
//! masters, with a hand-written RESP2 codec and one mio event loop.
//!
//! Start with [`Redlock`] ([`lock`]): `Redlock::connect(urls)`, then
//! `try_acquire` / `acquire`, `extend`, `release`; [`watchdog`] keeps a lock
//! alive on its own thread. The semantics are the spec's
//! (`shared/spec/redlock.md`); `SAFETY.md` says what they guarantee.
//!
//! The modules are listed in data-flow order: one acquire goes from the
//! bytes on the wire ([`resp`]) up to the API ([`lock`]). Everything below
//! [`driver`] is sans-IO: plain data in, plain data out, `now` passed in.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_mio::Redlock;
//!
//! # fn main() -> Result<(), redlock_mio::Error> {
//! let mut redlock = Redlock::connect(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001", "redis://127.0.0.1:7002"])?;
//! let lock = redlock.acquire("orders:42", Duration::from_secs(10))?;
//! redlock.release(&lock)?;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

// Blank lines keep rustfmt from sorting these: the order is the data flow.
pub mod resp;

pub mod script;

pub mod token;

pub mod clock;

pub mod addr;

pub mod conn;

pub mod quorum;

pub mod engine;

pub mod resolve;

pub mod driver;

pub mod config;

pub mod error;

mod job;

pub mod lock;

pub mod shared;

pub mod watchdog;

pub use addr::ServerAddr;
pub use config::{Config, ConfigError, MAX_TTL_MS, Retry};
pub use error::{Error, Failure, MasterVote};
pub use lock::{Lock, LockGuard, Redlock};
pub use quorum::Vote;
pub use resolve::Resolver;
pub use shared::{Pending, SharedRedlock};
pub use token::Token;
pub use watchdog::{KeepOptions, Lost, LostReason, Watchdog};
