//! The bounds checker: no connection is dropped at the in-flight bound
//! ([`Cause::TooFarBehind`]) while its master keeps up. Every path to the
//! wire (new orders, kept locks' extensions, retries, wake-ups,
//! hand-overs, the releases of locks whose caller went away, the
//! subscriptions) is to hold a connection within its bound by waiting its
//! turn: a burst that every master shares waits in the client, it never
//! drops a connection other callers use. A master lagging alone (its
//! oldest request unanswered past the per-instance timeout,
//! [`Conn::is_unresponsive`]: stalled, its replies lost or late) is the
//! one a drop is for (`Engine::has_room` holds nobody back for it), and is
//! excused.
//!
//! The connection never holds more than its bound (it is dropped first),
//! so a checker that looks for a queue past the bound cannot fire; this one
//! looks for the drop itself, per client, through [`Watch`]: what each
//! connection's state was when last looked at, and each drop seen, once.
//! It changes nothing in the run.

use std::time::Instant;

use crate::conn::{Cause, Conn};

/// One client's connections, as the bounds checker follows them: which
/// were unresponsive when last looked at up, which the world has seen
/// down, and the drops at the bound found since the world last took them.
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// Bit `i`: link `i` was unresponsive when last looked at while not
    /// down (a drop clears the queue, so the state before it is what
    /// excuses it).
    unresponsive: u64,
    /// Bit `i`: the world has seen link `i` down since its last connect,
    /// and weighed its drop then.
    seen_down: u64,
    drops: Vec<Dropped>,
}

/// A connection dropped at the in-flight bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Dropped {
    /// The client's link: a master's command connection below the number
    /// of masters, its subscriber connection from there on.
    pub(super) link: usize,
    /// Its master lagged alone: the connection was unresponsive.
    pub(super) lagging: bool,
}

impl Watch {
    /// Looks at the client's links (`links`, by index) at `now`: each one
    /// up (or connecting) notes whether it is unresponsive. Done before each
    /// turn of the hub (and each input to a round run inline): within a
    /// turn the time stands still and no reply is read, so a connection
    /// turns unresponsive only between turns, and the state a drop within
    /// the turn is weighed by is this one (or a fresh connection's, see
    /// [`Watch::handle_reconnect`]).
    pub(super) fn look<'a>(&mut self, links: impl Iterator<Item = Option<&'a Conn>>, now: Instant) {
        for (i, conn) in links.enumerate().take(64) {
            let Some(conn) = conn.filter(|c| !c.is_down()) else {
                continue;
            };
            let bit = 1 << i;
            if conn.is_unresponsive(now) {
                self.unresponsive |= bit;
            } else {
                self.unresponsive &= !bit;
            }
        }
    }

    /// Link `link`, which the world had up or connecting, is found down,
    /// with `cause`: a drop at the bound is noted. The world has now seen
    /// it down (see [`Watch::handle_reconnect`]).
    pub(super) fn handle_down(&mut self, link: usize, cause: Option<&Cause>) {
        self.weigh(link, cause);
        if link < 64 {
            self.seen_down |= 1 << link;
        }
    }

    /// Link `link`, down with `cause`, is connected again: a drop the world
    /// has not seen (one made and followed by this reconnect within one turn
    /// of the hub) is weighed now; one it has seen, not again. The new
    /// connection has nothing unanswered.
    pub(super) fn handle_reconnect(&mut self, link: usize, cause: Option<&Cause>) {
        let bit = if link < 64 { 1 << link } else { 0 };
        if self.seen_down & bit == 0 {
            self.weigh(link, cause);
        }
        self.seen_down &= !bit;
        self.unresponsive &= !bit;
    }

    fn weigh(&mut self, link: usize, cause: Option<&Cause>) {
        if matches!(cause, Some(Cause::TooFarBehind)) {
            let lagging = link < 64 && self.unresponsive & (1 << link) != 0;
            self.drops.push(Dropped { link, lagging });
        }
    }

    /// The drops found since the last call.
    pub(super) fn take_drops(&mut self) -> Vec<Dropped> {
        std::mem::take(&mut self.drops)
    }

    /// Whether any drop waits to be taken (most turns: none).
    pub(super) fn has_drops(&self) -> bool {
        !self.drops.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::addr::ServerAddr;
    use crate::conn::{Role, Timing};
    use crate::resp::{Arg, Limits};
    use crate::script::Scripts;

    fn timing() -> Timing {
        Timing {
            connect: Duration::from_secs(1),
            stall: Duration::from_secs(1),
            patience: Duration::from_millis(50),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
            quarantine: None,
            max_in_flight: 32,
        }
    }

    /// A subscriber connection of 32 at most, up, with `queued` commands
    /// unconfirmed, queued at `at`.
    fn subscriber(queued: usize, at: Instant) -> Conn {
        let addr: ServerAddr = "redis://127.0.0.1:7000".parse().unwrap();
        let mut conn = Conn::with_role(
            Role::Subscriber,
            addr,
            Scripts::new(),
            Limits::default(),
            timing(),
            at,
        );
        conn.handle_connect_started(at);
        conn.handle_connected();
        for _ in 0..queued {
            let subscribe = [Arg::Bytes(b"SUBSCRIBE"), Arg::Bytes(b"c")];
            conn.queue_command(&subscribe, at).unwrap();
        }
        conn
    }

    /// Fills `conn` to its bound: the command past it drops the
    /// connection.
    fn overflow(conn: &mut Conn, now: Instant) {
        let subscribe = [Arg::Bytes(b"SUBSCRIBE"), Arg::Bytes(b"c")];
        while conn.queue_command(&subscribe, now).is_ok() {}
    }

    #[test]
    fn a_connection_dropped_at_its_bound_while_its_master_keeps_up_is_a_violation() {
        let now = Instant::now();
        let mut watch = Watch::default();
        let mut conn = subscriber(3, now);
        watch.look([Some(&conn)].into_iter(), now);
        overflow(&mut conn, now);
        // The probe reads the drop for what it is: the checker can fire.
        assert!(matches!(conn.down_cause(), Some(Cause::TooFarBehind)));
        watch.handle_down(0, conn.down_cause());
        assert_eq!(
            watch.take_drops(),
            [Dropped {
                link: 0,
                lagging: false
            }]
        );
        // Seen down already: its reconnect weighs nothing again.
        watch.handle_reconnect(0, conn.down_cause());
        assert!(watch.take_drops().is_empty());
    }

    #[test]
    fn a_drop_made_and_followed_by_a_reconnect_in_one_turn_is_weighed_once() {
        let now = Instant::now();
        let mut watch = Watch::default();
        let mut conn = subscriber(0, now);
        watch.look([Some(&conn)].into_iter(), now);
        overflow(&mut conn, now);
        // Looked at again down: the state before the drop stays.
        watch.look([Some(&conn)].into_iter(), now);
        watch.handle_reconnect(0, conn.down_cause());
        assert_eq!(watch.take_drops().len(), 1);
        watch.handle_reconnect(0, conn.down_cause());
        assert_eq!(watch.take_drops().len(), 1, "each reconnect follows a drop");
    }

    #[test]
    fn a_master_lagging_alone_is_dropped_with_no_violation() {
        let then = Instant::now();
        let now = then + Duration::from_millis(51);
        let mut watch = Watch::default();
        // Its oldest command unconfirmed for longer than the patience.
        let mut conn = subscriber(5, then);
        watch.look([None, Some(&conn)].into_iter(), now);
        overflow(&mut conn, now);
        watch.handle_down(1, conn.down_cause());
        assert_eq!(
            watch.take_drops(),
            [Dropped {
                link: 1,
                lagging: true
            }]
        );
    }

    #[test]
    fn a_connection_made_again_after_a_lagging_one_is_weighed_afresh() {
        let then = Instant::now();
        let now = then + Duration::from_millis(51);
        let mut watch = Watch::default();
        let mut conn = subscriber(5, then);
        watch.look([Some(&conn)].into_iter(), now);
        overflow(&mut conn, now);
        watch.handle_reconnect(0, conn.down_cause());
        assert!(watch.take_drops()[0].lagging);
        // The new connection fills within the same turn: its master keeps
        // up, as far as anyone can tell.
        let mut conn = subscriber(0, now);
        overflow(&mut conn, now);
        watch.handle_down(0, conn.down_cause());
        assert!(!watch.take_drops()[0].lagging);
    }

    #[test]
    fn other_failures_are_no_drop_at_the_bound() {
        let mut watch = Watch::default();
        watch.handle_down(0, Some(&Cause::Stalled));
        watch.handle_reconnect(1, Some(&Cause::Closed));
        watch.handle_reconnect(2, None);
        assert!(!watch.has_drops());
    }
}
