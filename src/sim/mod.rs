//! The world around the client, simulated (issue 22): models of what the
//! client talks to, driven by seeded tests. Compiled for the crate's own
//! tests only (`cfg(test)` or the `test-knobs` feature): not API.

pub mod rng;

pub mod model;

pub mod world;
