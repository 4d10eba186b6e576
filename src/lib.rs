//! redlock-mio: the Redlock distributed lock over N independent Redis
//! masters, with a hand-written RESP2 codec and one mio event loop.
//!
//! Start with [`Redlock`]: `Redlock::connect(urls)`, then
//! `try_acquire` / `acquire`, `extend`, `release`, for one thread at a time
//! and the lowest latency. [`SharedRedlock`] is the client for many threads
//! or tasks: one event loop thread per process, every caller's operations
//! pipelined into shared writes, blocking calls and futures for any
//! executor; [`SharedRedlock::keep`] keeps any number of locks alive from
//! that loop ([`Watchdog`]). The semantics are the spec's
//! (`docs/spec.md`); `SAFETY.md` says what they guarantee.
//!
//! Every type a caller names is re-exported here, at the root: settings
//! ([`Config`], [`Retry`]), results ([`Lock`], [`Error`] with its
//! [`Failure`], one [`Vote`] and [`Cause`] per master) and addresses
//! ([`ServerAddr`], [`Resolver`]). Two modules are public besides: [`resp`],
//! the RESP2 codec the client speaks, and [`script`], the Lua it runs on
//! each master.
//!
//! The modules are listed in data-flow order, each importing only modules
//! before it: one acquire goes from the bytes on the wire up to the API:
//!
//! `hash -> resp -> script -> token -> clock -> addr -> conn -> quorum ->
//! resolve -> config -> error -> metrics -> wait -> engine -> tls -> driver
//! -> lock -> job -> keep -> hub -> client -> shared -> watchdog`
//!
//! `hash` is a fixed, fast hasher for tables keyed by the application's own
//! names; `resp` encodes commands and parses replies; `conn` is one master's
//! connection state; `quorum` one round's votes and validity arithmetic;
//! `metrics` records what the modules after it decide, from plain data
//! (features `metrics` and `tracing`); `wait` is the hub's waiting room
//! (each resource's queue of local waiters, the marks of a lock held
//! here, the rows of hand-overs, the turns across processes), fed by
//! the engine's subscriptions; `engine` owns the N connections (and
//! their subscriptions to releases) and every round in flight;
//! `driver` is the one module that touches mio; `lock` is the held lock as
//! a value; `job` is each operation (retries, cleanup, fencing) as a state
//! machine; `keep` is the policy that keeps locks alive; `hub` is
//! everything a client decides (admission, the job table, timers,
//! waiters, kept locks, shutdown, a job run on its caller's thread);
//! `client` drives a hub on the caller's thread, and `shared` on a thread
//! of its own for many callers; `watchdog` is the holder's handle on a
//! kept lock.
//! Everything but `resolve`, `driver`, `client` and `shared` is sans-IO:
//! plain data in, plain data out, `now` passed in.
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
//!
//! # Features
//!
//! All off by default. `tls`: `rediss://` masters over rustls, with
//! [`Config::tls`] settings ([`TlsConfig`]). `metrics`: every operation's
//! outcome, duration and attempts, and each master's failures, recorded
//! through the `metrics` facade's global recorder (docs/observability.md
//! lists them).
//! `tracing`: a debug span per operation. No feature exists for the
//! crate's own tests: its simulator and test knobs are compiled only under
//! `--cfg redlock_sim`, which no dependent sets.

// docs.rs labels each item that needs a feature ([package.metadata.docs.rs]).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

// Blank lines keep rustfmt from sorting these: the order is the data flow.
mod hash;

// Only the codec and the scripts are public modules: the codec is a
// documented RESP2 parser and encoder (fuzzed, benchmarked and used by the
// tools beside the crate), and the scripts are the Lua each master runs.
// Everything else is reached through the re-exports below.
pub mod resp;

pub mod script;

mod token;

mod resource;

mod clock;

// Bugs put in on purpose for the simulator's checkers (`--cfg redlock_sim`).
#[cfg_attr(any(test, redlock_sim), doc(hidden))]
#[allow(unreachable_pub)]
#[cfg_attr(not(any(test, redlock_sim)), allow(dead_code))]
pub(crate) mod knobs;

mod addr;

mod native;

mod conn;

mod quorum;

mod resolve;

mod config;

mod error;

mod metrics;

mod wait;

mod health;

mod engine;

#[cfg(feature = "tls")]
mod tls;

mod driver;

mod lock;

mod job;

mod keep;

mod hub;

mod client;

mod shared;

mod watchdog;

// Beside the data flow, for the crate's own tests: the simulated world.
#[cfg(any(test, redlock_sim))]
#[doc(hidden)]
pub mod sim;

pub use addr::{AddrError, Endpoint, Secret, ServerAddr};
pub use client::{LockGuard, Redlock};
pub use config::{Config, ConfigError, LockCommands, MAX_DURATION, MAX_TTL_MS, Retry, TlsConfig};
pub use conn::{Cause, HandshakeStep};
pub use error::{Error, Failure, MasterVote};
pub use health::{MasterState, MasterStatus};
pub use keep::{KeepOptions, Lost, LostReason};
pub use lock::Lock;
pub use native::Capabilities;
pub use quorum::Vote;
pub use resolve::Resolver;
pub use resource::ResourceName;
pub use shared::{Pending, SharedLockGuard, SharedRedlock};
pub use token::{TOKEN_MAX_LEN, Token, TokenError};
pub use watchdog::{LostFuture, Watchdog};

/// README.md's Rust examples, compiled (and run, unless marked `no_run`)
/// as doc tests, so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's Rust examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
struct GuideDoctests;

/// The deployment page's Rust examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/deployment.md")]
struct DeploymentDoctests;
