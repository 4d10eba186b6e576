//! The world around the client, simulated (issue 22): models of what the
//! client talks to, driven by seeded tests. Compiled for the crate's own
//! tests only (`cfg(test)` or the `test-knobs` feature): not API.

pub mod rng;

pub mod model;

pub mod world;

/// A bug put in on purpose for the current thread (see [`world::Bug`]):
/// for a real-master test that shows its check catching one, where the
/// client runs on the test's own thread (a [`Redlock`](crate::Redlock)).
pub use crate::knobs::{Injected, inject};
