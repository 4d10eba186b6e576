//! The world around the client, simulated: models of what the
//! client talks to, driven by seeded tests. Compiled for the crate's own
//! tests only (`cfg(test)`, or `--cfg redlock_sim` in RUSTFLAGS): not API.

pub mod rng;

pub mod model;

pub mod world;

/// A bug put in on purpose for the current thread (see [`world::Bug`]):
/// for a real-master test that shows its check catching one, where the
/// client runs on the test's own thread (a [`Redlock`](crate::Redlock)).
pub use crate::knobs::{Injected, inject};

/// Test knobs a [`Config`](crate::Config) carries for one client (its
/// shared loop included), where a thread's [`inject`] cannot reach.
pub mod knobs {
    use std::time::Duration;

    use crate::config::Config;

    /// Adds `by` to every validity `config`'s client computes: a lock then
    /// claims to outlive its keys.
    pub fn overstate_validity(config: &mut Config, by: Duration) {
        config.knobs.overstate_validity = by;
    }

    /// Makes the shared client's event loop panic when it starts an
    /// operation on `resource`.
    pub fn panic_on_resource(config: &mut Config, resource: bytes::Bytes) {
        config.knobs.panic_on_resource = Some(resource);
    }
}
