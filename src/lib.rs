//! redlock-mio: the Redlock distributed lock over N independent Redis
//! masters, with a hand-written RESP2 codec and one mio event loop.
//!
//! Modules are listed in data-flow order: an acquire goes from [`resp`]
//! (bytes on the wire) upwards.

#![warn(missing_docs)]

pub mod resp;
#[cfg(feature = "spawn")]
pub mod spawn;
