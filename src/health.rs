//! What a client knows of each master now, for its caller to read in any
//! build: [`MasterState`], kept on a [`Board`] the engine updates.
//!
//! A master that refuses this client for good (a wrong password, an ACL)
//! or cannot be reached costs it a vote, not its locks: two of three still
//! grant. Without the `tracing` or `metrics` features nothing would say
//! so. The board says it: the engine looks at its connections once a turn
//! (a few field reads per master) and rewrites the board only when one
//! changed, so reading it costs the event loop nothing it would notice.
//! This module decides nothing and reads no clock: it is handed the
//! connections.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::addr::ServerAddr;
use crate::conn::{Cause, Conn, Op};
use crate::native::Capabilities;

/// Where a master's connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MasterStatus {
    /// Not connected yet: connections are made on first use (or by
    /// `warm_up`).
    NotConnected,
    /// A connect or its handshake is under way.
    Connecting,
    /// Connected and its handshake done: it votes (unless in restart
    /// quarantine, or refusing this client, see [`MasterState`]).
    Up,
    /// Down, with why; it is reconnected after a backoff.
    Down(Cause),
}

/// One master, as this client knows it now (see
/// [`Redlock::masters`](crate::Redlock::masters)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MasterState {
    /// The master's URL, password hidden.
    pub server: Arc<str>,
    /// Its connection.
    pub status: MasterStatus,
    /// Until when it stays out of the quorum after a restart (see
    /// [`Config::quarantine`](crate::Config::quarantine)), if that was
    /// ever set; past instants included.
    pub quarantined_until: Option<Instant>,
    /// Why it refuses this client's acquires and extends for good, when
    /// it does (a handshake step an ACL denies): it cannot vote.
    pub refusal: Option<Cause>,
    /// The lock commands of its own it offers, as its last handshake told.
    pub capabilities: Capabilities,
}

impl MasterState {
    /// How much longer the master stays out of the quorum, at `now`.
    pub fn quarantine_left(&self, now: Instant) -> Option<Duration> {
        self.quarantined_until
            .and_then(|until| until.checked_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    /// Whether the master can vote at `now`: up, out of quarantine, and
    /// refusing nothing.
    pub fn can_vote(&self, now: Instant) -> bool {
        self.status == MasterStatus::Up
            && self.quarantine_left(now).is_none()
            && self.refusal.is_none()
    }
}

/// The masters' states, shared between the engine that writes them and
/// every handle that reads them.
#[derive(Debug)]
pub(crate) struct Board {
    /// What was last written, read without the lock.
    seen: Vec<MasterState>,
    states: Arc<Mutex<Vec<MasterState>>>,
}

impl Board {
    /// Every master of `servers` not connected yet.
    pub(crate) fn new(servers: &[ServerAddr]) -> Board {
        let seen: Vec<MasterState> = servers
            .iter()
            .map(|addr| MasterState {
                server: Arc::from(addr.to_string()),
                status: MasterStatus::NotConnected,
                quarantined_until: None,
                refusal: None,
                capabilities: Capabilities::NONE,
            })
            .collect();
        Board {
            states: Arc::new(Mutex::new(seen.clone())),
            seen,
        }
    }

    /// A reader of the board, for a handle on another thread.
    pub(crate) fn reader(&self) -> BoardReader {
        BoardReader(Arc::clone(&self.states))
    }

    /// Rewrites the states of the masters whose connections changed since
    /// the last call; locks the board, and clones a cause, only then, so
    /// that a turn with nothing new allocates nothing.
    pub(crate) fn observe(&mut self, conns: &[Conn]) {
        for (i, (seen, conn)) in self.seen.iter_mut().zip(conns).enumerate() {
            let refusal = conn.refusal_for(Op::Acquire);
            if same_status(&seen.status, conn)
                && seen.quarantined_until == conn.quarantined_until()
                && seen.capabilities == conn.capabilities()
                && seen.refusal.as_ref() == refusal
            {
                continue;
            }
            seen.status = status_of(conn);
            seen.quarantined_until = conn.quarantined_until();
            seen.capabilities = conn.capabilities();
            seen.refusal = refusal.cloned();
            let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(state) = states.get_mut(i) {
                state.clone_from(seen);
            }
        }
    }
}

/// Whether `status` is what `conn` says now, compared in place.
fn same_status(status: &MasterStatus, conn: &Conn) -> bool {
    match (status, conn.down_cause()) {
        (MasterStatus::NotConnected, Some(Cause::Closed)) => !conn.was_connected(),
        (MasterStatus::Down(cause), Some(now)) => {
            (conn.was_connected() || !matches!(now, Cause::Closed)) && cause == now
        }
        (MasterStatus::Up, None) => conn.is_ready(),
        (MasterStatus::Connecting, None) => !conn.is_ready(),
        _ => false,
    }
}

/// Reads a [`Board`].
#[derive(Debug, Clone)]
pub(crate) struct BoardReader(Arc<Mutex<Vec<MasterState>>>);

impl BoardReader {
    /// Every master's state, in configuration order.
    pub(crate) fn read(&self) -> Vec<MasterState> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn status_of(conn: &Conn) -> MasterStatus {
    match conn.down_cause() {
        Some(Cause::Closed) if !conn.was_connected() => MasterStatus::NotConnected,
        Some(cause) => MasterStatus::Down(cause.clone()),
        None if conn.is_ready() => MasterStatus::Up,
        None => MasterStatus::Connecting,
    }
}
