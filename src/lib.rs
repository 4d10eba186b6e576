//! redlock-mio: the Redlock distributed lock over N independent Redis
//! masters, with a hand-written RESP2 codec and one mio event loop.
//!
//! Modules are listed in data-flow order: an acquire goes from [`resp`]
//! (bytes on the wire) upwards.

#![warn(missing_docs)]

pub mod addr;
pub mod conn;
pub mod driver;
pub mod lock;
pub mod watchdog;
pub mod quorum;
pub mod resp;
pub mod script;
pub mod token;

pub use addr::ServerAddr;
pub use lock::{Config, ConfigError, Error, Failure, Lock, LockGuard, MasterVote, Redlock, Retry};
pub use quorum::Vote;
pub use token::Token;
pub use watchdog::{KeepOptions, Lost, LostReason, Watchdog};
#[cfg(feature = "spawn")]
pub mod spawn;
