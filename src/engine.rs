//! The sans-IO engine: N connections and every round in flight over them.
//!
//! An [`Engine`] owns what changes together: the [`Conn`] to each master
//! and the [`Round`]s under way, many at once. Starting a round encodes
//! each request once and queues it on every connection in one pass, tagged
//! with the round and slot, so that each connection's FIFO matches replies
//! to their requests across concurrent rounds. Inputs are keyed by master
//! index (connect started or finished, bytes read, bytes written, a
//! failure, the time); outputs are the bytes to write, whether to open a
//! socket, the next deadline, and which rounds completed. The mio
//! [`Driver`](crate::driver::Driver) and the test simulator drive it
//! through the same doors. Beside them, one subscriber connection per
//! master carries the subscriptions to releases ([`subs`]): it takes
//! requests (subscribe, unsubscribe) and reports what it heard
//! ([`Engine::poll_heard`]), and knows nothing of who waits. It never
//! touches a socket or reads a clock.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::addr::ServerAddr;

use crate::conn::{Cause, Conn, Op, Request, Role, Tag, Timing, Wires};
use crate::health::{Board, BoardReader};
use crate::metrics::Masters;
use crate::quorum::{FencePlan, Round, Vote, plan_fence, same_server};
use crate::resp::Limits;
use crate::script::Scripts;

mod subs;

pub(crate) use subs::Heard;
use subs::Subscriptions;

/// Names a round in an [`Engine`]: its slot in the engine's table and that
/// slot's generation, so that a reply to a round that is over never lands
/// in a later round that reuses the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RoundId(u64);

impl RoundId {
    fn new(index: usize, generation: u32) -> RoundId {
        RoundId((u64::from(generation) << 32) | index as u64)
    }

    /// The round's slot in the engine's table: dense (slots are reused),
    /// so a table indexed by it is as long as the most rounds ever live at
    /// once.
    pub(crate) fn index(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }

    fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// When a round counts as complete, for [`Engine::poll_completed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Once every slot is decided.
    Decision,
    /// Phase one of a fenced acquire (one slot): once decided, and either
    /// the fence can be planned from the reports so far or no master is
    /// left to report (answered, failed or timed out). `readmit` is the
    /// readmission span [`plan_fence`] takes.
    Fence {
        /// See [`plan_fence`].
        readmit: Option<Duration>,
    },
}

#[derive(Debug)]
struct Entry {
    generation: u32,
    live: bool,
    /// Reported complete through [`Engine::poll_completed`].
    reported: bool,
    wait: Wait,
    round: Round,
}

/// N connections and the rounds in flight over them.
#[derive(Debug)]
pub(crate) struct Engine {
    conns: Vec<Conn>,
    entries: Vec<Entry>,
    /// Indices of `entries` that are not live.
    free: Vec<usize>,
    /// Rounds that completed and were not yet polled.
    completed: VecDeque<RoundId>,
    /// Reused encoding buffers: each request is encoded once per form (the
    /// script, a master's own command) for all masters.
    wires: Wires,
    /// Per master, set while [`Engine::start`] runs when a send dropped
    /// the connection.
    dropped: Vec<Option<Cause>>,
    n: usize,
    /// One subscriber connection per master (none when the client does not
    /// subscribe): links `n..2n` to the driver.
    subs: Vec<Conn>,
    /// The resources subscribed to on `subs`.
    subscriptions: Subscriptions,
    /// The masters' failures and quarantine, reported as metrics.
    metrics: Masters,
    /// What each master's state is, for callers to read.
    board: Board,
    /// The prefix of this client's tokens, for its rounds to tell its own
    /// locks from others' where a refusal names the holder.
    own: Option<[u8; 32]>,
}

impl Engine {
    /// An engine for `servers`, nothing connected yet; with `subscribe`,
    /// a subscriber connection per master too, connected once a waiter
    /// waits.
    pub(crate) fn new(
        servers: &[ServerAddr],
        scripts: Scripts,
        limits: Limits,
        timing: Timing,
        now: Instant,
        subscribe: bool,
    ) -> Engine {
        let subs = if subscribe {
            servers
                .iter()
                .map(|addr| {
                    Conn::with_role(Role::Subscriber, addr.clone(), scripts, limits, timing, now)
                })
                .collect()
        } else {
            Vec::new()
        };
        Engine {
            subs,
            subscriptions: Subscriptions::default(),
            metrics: Masters::new(servers),
            board: Board::new(servers),
            conns: servers
                .iter()
                .map(|addr| Conn::new(addr.clone(), scripts, limits, timing, now))
                .collect(),
            entries: Vec::new(),
            free: Vec::new(),
            completed: VecDeque::new(),
            wires: Wires::new(),
            dropped: vec![None; servers.len()],
            n: servers.len(),
            own: None,
        }
    }

    /// The prefix of the tokens this client mints (see
    /// [`TokenSource::prefix`](crate::token::TokenSource::prefix)): its
    /// rounds tell a refusal that names one of its own locks from one
    /// that names another client's ([`Round::held_by_own`]).
    pub(crate) fn know_own_tokens(&mut self, prefix: [u8; 32]) {
        self.own = Some(prefix);
        for entry in &mut self.entries {
            entry.round.know_own_tokens(prefix);
        }
    }

    /// How many masters.
    pub(crate) fn masters(&self) -> usize {
        self.n
    }

    /// A reader of the masters' states (see [`crate::health`]).
    pub(crate) fn board(&self) -> BoardReader {
        self.board.reader()
    }

    /// Every master's connection, in master order.
    pub(crate) fn conns(&self) -> &[Conn] {
        &self.conns
    }

    /// How many connections the driver drives: the masters' (`0..n`),
    /// then their subscriber connections (`n..2n`), if any.
    pub(crate) fn links(&self) -> usize {
        self.n + self.subs.len()
    }

    /// Connection `i` of [`Engine::links`].
    pub(crate) fn link(&self, i: usize) -> Option<&Conn> {
        match i.checked_sub(self.n) {
            None => self.conns.get(i),
            Some(s) => self.subs.get(s),
        }
    }

    fn link_mut(&mut self, i: usize) -> Option<&mut Conn> {
        match i.checked_sub(self.n) {
            None => self.conns.get_mut(i),
            Some(s) => self.subs.get_mut(s),
        }
    }

    // --- Subscriptions to releases (see `subs`): requests in, what was
    // heard out. ---

    /// Subscribes to `resource`'s releases on every subscriber connection
    /// (see [`Subscriptions::subscribe`]).
    pub(crate) fn subscribe(&mut self, resource: &Bytes, now: Instant) {
        self.subscriptions.subscribe(&mut self.subs, resource, now);
    }

    /// Unsubscribes `resource` (see [`Subscriptions::unsubscribe`]).
    pub(crate) fn unsubscribe(&mut self, resource: &Bytes, now: Instant) {
        self.subscriptions
            .unsubscribe(&mut self.subs, resource, now);
    }

    /// Whether a waiter for `resource` may try: its subscriptions are in
    /// place (see [`Subscriptions::is_listening`]).
    pub(crate) fn is_listening(&self, resource: &[u8], now: Instant) -> bool {
        self.subscriptions
            .is_listening(&self.subs, resource, crate::quorum::quorum(self.n), now)
    }

    /// Whether any resource's releases are subscribed to (waited for, or
    /// kept for a lock held here).
    pub(crate) fn is_subscribed(&self) -> bool {
        self.subscriptions.is_wanted()
    }

    /// Sends the subscriptions made and ended since the last call (see
    /// [`Subscriptions::flush`]).
    pub(crate) fn flush_subscriptions(&mut self, now: Instant) {
        self.subscriptions.flush(&mut self.subs, now);
    }

    /// The next thing the subscriber connections heard since the last
    /// call.
    pub(crate) fn poll_heard(&mut self) -> Option<Heard> {
        self.subscriptions.poll_heard()
    }

    /// Encodes `requests` once and queues all of them on every connection,
    /// so that each master gets them in one write (with whatever other
    /// rounds queued since the last write). A master that is down gets its
    /// failed votes at once. Replies are awaited until `now + timeout`, or
    /// until the master is unresponsive (see [`Engine::handle_timeout`]).
    pub(crate) fn start(
        &mut self,
        requests: &[Request],
        now: Instant,
        timeout: Duration,
        wait: Wait,
    ) -> RoundId {
        self.start_except(requests, now, timeout, wait, 0)
    }

    /// Sends `requests` without waiting for their replies (releases), to
    /// every master but those whose bit is set in `skip` (bit `i` for
    /// master `i`; masters from 64 on are never skipped).
    pub(crate) fn send(&mut self, requests: &[Request], now: Instant, skip: u64) {
        let id = self.start_except(requests, now, Duration::ZERO, Wait::Decision, skip);
        self.finish(id);
    }

    /// [`Engine::start`], leaving out the masters whose bit is set in
    /// `skip`: their votes are recorded as refused at once.
    fn start_except(
        &mut self,
        requests: &[Request],
        now: Instant,
        timeout: Duration,
        wait: Wait,
        skip: u64,
    ) -> RoundId {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let mut round = Round::new(self.n, now);
                if let Some(prefix) = self.own {
                    round.know_own_tokens(prefix);
                }
                self.entries.push(Entry {
                    generation: 0,
                    live: false,
                    reported: false,
                    wait,
                    round,
                });
                self.entries.len() - 1
            }
        };
        let entry = &mut self.entries[index];
        entry.generation = entry.generation.wrapping_add(1);
        entry.live = true;
        entry.reported = false;
        entry.wait = wait;
        entry.round.reset(requests, now, timeout);
        let id = RoundId::new(index, entry.generation);
        for (slot, request) in requests.iter().enumerate() {
            self.wires.clear();
            let tag = Tag {
                round: id.0,
                slot: slot as u32,
            };
            for (i, conn) in self.conns.iter_mut().enumerate() {
                if i < 64 && skip & (1 << i) != 0 {
                    entry.round.record(slot, i, Vote::Refused, now);
                    continue;
                }
                let was_up = !conn.is_down();
                if let Err(cause) = conn.send(tag, request, &mut self.wires, now) {
                    if was_up {
                        // The send dropped the connection (too far
                        // behind): every round's requests on it are gone.
                        self.dropped[i] = Some(cause.clone());
                    }
                    entry.round.record(slot, i, Vote::Failed(cause), now);
                }
            }
        }
        self.check_complete(index);
        for i in 0..self.n {
            if let Some(cause) = self.dropped[i].take() {
                self.fail_pending(i, &cause, now);
            }
        }
        id
    }

    /// Whether the masters' own lock commands are asked for and used
    /// where they have them ([`LockCommands`](crate::LockCommands)): from
    /// each connection's next handshake.
    pub(crate) fn set_native(&mut self, on: bool) {
        for conn in &mut self.conns {
            conn.set_probe(on);
        }
    }

    /// The round `id`, while it is live.
    pub(crate) fn round(&self, id: RoundId) -> Option<&Round> {
        self.entry(id).map(|e| &e.round)
    }

    /// Whether round `id` is complete as its [`Wait`] says (or unknown).
    pub(crate) fn is_complete(&self, id: RoundId) -> bool {
        self.entry(id).is_none_or(Entry::is_complete)
    }

    /// Whether a round completed that [`Engine::poll_completed`] has not
    /// reported yet: one started while every master was down completes at
    /// once, with no I/O left to wake a driver waiting for it.
    pub(crate) fn has_completed(&self) -> bool {
        !self.completed.is_empty()
    }

    /// The next round that completed since the last call.
    pub(crate) fn poll_completed(&mut self) -> Option<RoundId> {
        self.completed.pop_front()
    }

    /// Ends round `id`: requests of it still queued on connections that
    /// have not finished connecting are dropped unsent (releases excepted).
    /// Its votes stay readable, and late replies are still counted, until
    /// [`Engine::free`].
    pub(crate) fn end(&mut self, id: RoundId) {
        if self.entry(id).is_some() {
            for conn in &mut self.conns {
                conn.handle_round_end(id.0);
            }
        }
    }

    /// Forgets round `id`: late replies to it are read and dropped.
    pub(crate) fn free(&mut self, id: RoundId) {
        let index = id.index();
        if let Some(entry) = self.entries.get_mut(index)
            && entry.live
            && entry.generation == id.generation()
        {
            entry.live = false;
            self.free.push(index);
        }
    }

    /// [`Engine::end`] then [`Engine::free`].
    pub(crate) fn finish(&mut self, id: RoundId) {
        self.end(id);
        self.free(id);
    }

    /// How many rounds are live.
    #[cfg(test)]
    pub(crate) fn live_rounds(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    // --- The doors: inputs keyed by master index, and outputs. ---

    /// Whether the driver should open a socket for link `i` now (a
    /// subscriber connection only while someone waits).
    #[must_use]
    pub(crate) fn poll_connect(&self, i: usize, now: Instant) -> bool {
        if i >= self.n && !self.subscriptions.is_wanted() {
            return false;
        }
        self.link(i).is_some_and(|c| c.poll_connect(now))
    }

    /// The driver opened a socket for link `i`.
    pub(crate) fn handle_connect_started(&mut self, i: usize, now: Instant) {
        if let Some(conn) = self.link_mut(i) {
            conn.handle_connect_started(now);
        }
        if let Some(s) = i.checked_sub(self.n)
            && let Some(conn) = self.subs.get_mut(s)
        {
            self.subscriptions.handle_link_up(s, conn, now);
        }
    }

    /// Link `i`'s connect finished.
    pub(crate) fn handle_connected(&mut self, i: usize) {
        if let Some(conn) = self.link_mut(i) {
            conn.handle_connected();
        }
    }

    /// Bytes waiting to be written on link `i`.
    pub(crate) fn poll_transmit(&self, i: usize) -> &[u8] {
        self.link(i).map_or(&[], Conn::poll_transmit)
    }

    /// The first `n` bytes of [`Engine::poll_transmit`] were written.
    pub(crate) fn handle_written(&mut self, i: usize, n: usize) {
        if let Some(conn) = self.link_mut(i) {
            conn.handle_written(n);
        }
    }

    /// Bytes read on link `i`: every complete reply is routed to its
    /// round, or for a subscriber connection to its subscriptions. A
    /// malformed stream fails the connection.
    pub(crate) fn handle_input(&mut self, i: usize, bytes: &[u8], now: Instant) {
        if let Some(s) = i.checked_sub(self.n) {
            return self.handle_pushes(s, bytes, now);
        }
        let Some(conn) = self.conns.get_mut(i) else {
            return;
        };
        conn.handle_input(bytes);
        loop {
            let entries = &self.entries;
            // A `-NOSCRIPT` is answered with EVAL only while the request
            // still matters: its slot undecided, or a release.
            let resend = |tag: Tag, op: Op| {
                op.releases()
                    || crate::knobs::injected(crate::knobs::Bug::ResendDecided)
                    || lookup(entries, RoundId(tag.round))
                        .is_some_and(|e| e.round.is_undecided(tag.slot as usize))
            };
            match self.conns[i].poll_reply(now, resend) {
                Ok(Some((tag, reply))) => {
                    let id = RoundId(tag.round);
                    let index = id.index();
                    if lookup(&self.entries, id).is_some() {
                        let entry = &mut self.entries[index];
                        let slot = tag.slot as usize;
                        // A request that ran behind a refused handshake
                        // step counts as refused: the master cannot vote
                        // (its INFO, say, could not be checked).
                        match self.conns[i].refusal_for(entry.round.op(slot)) {
                            Some(cause) => {
                                let vote = Vote::Failed(cause.clone());
                                entry.round.handle_vote(slot, i, vote, now);
                            }
                            _ => entry
                                .round
                                .handle_reply(&mut self.conns, slot, i, reply, now),
                        }
                        self.check_complete(index);
                    }
                }
                Ok(None) => {
                    let recovered = self.conns[i].take_recoveries();
                    crate::metrics::noscript_recovered(recovered.script_load, recovered.eval);
                    crate::metrics::native_refused(recovered.native_refused);
                    crate::metrics::requests_sent(&recovered.sent);
                    return;
                }
                Err(cause) => return self.handle_failure(i, now, cause),
            }
        }
    }

    fn handle_pushes(&mut self, s: usize, bytes: &[u8], now: Instant) {
        let Some(conn) = self.subs.get_mut(s) else {
            return;
        };
        conn.handle_input(bytes);
        loop {
            let pushed = conn.poll_push().and_then(|frame| match frame {
                Some(reply) => self.subscriptions.handle_push(s, reply).map(|()| true),
                None => Ok(false),
            });
            match pushed {
                Ok(true) => {}
                Ok(false) => return,
                Err(cause) => return self.handle_failure(self.n + s, now, cause),
            }
        }
    }

    /// Link `i` failed: its connection is dropped (to be reconnected);
    /// a master's pending votes in every round fail with `cause`, a
    /// subscriber's subscriptions are gone.
    pub(crate) fn handle_failure(&mut self, i: usize, now: Instant, cause: Cause) {
        if let Some(conn) = self.link_mut(i) {
            conn.handle_failure(now, cause.clone());
        }
        match i.checked_sub(self.n) {
            None => self.fail_pending(i, &cause, now),
            Some(s) => self.subscriptions.handle_link_down(s),
        }
    }

    /// Applies the connections' connect and stall limits (a subscriber
    /// connection's too: a SUBSCRIBE or UNSUBSCRIBE unconfirmed past it
    /// drops the connection and its subscriptions) and the rounds'
    /// deadlines. A master that is unresponsive (a request unanswered
    /// past the per-instance timeout, [`Conn::is_unresponsive`]) fails its
    /// pending votes in every round at once, with [`Cause::Timeout`]: it
    /// still gets the requests, in order, but no round waits for it, since
    /// each reply would come after that one's. A stalled master then costs
    /// a round nothing rather than its timeout; two racers that split the
    /// other masters would otherwise each keep their key in the way for
    /// that long, again and again until the stall limit. (Called after the
    /// sockets are read, as the stall limit is: a reply waiting in a socket
    /// is read first. No wake-up is set for the instant a master turns
    /// unresponsive: a round waiting on it then learns it at its next
    /// reply, or at its own deadline, at most the per-instance timeout.)
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        for i in 0..self.n {
            if let Some(cause) = self.conns[i].handle_timeout(now) {
                self.fail_pending(i, &cause, now);
            } else if self.conns[i].is_unresponsive(now) {
                // As a round's own deadline does: counted as a failure of
                // the master only by the round that sent the request.
                self.fail_votes(i, &Cause::Timeout, now);
            }
        }
        for s in 0..self.subs.len() {
            if self.subs[s].handle_timeout(now).is_some() {
                self.subscriptions.handle_link_down(s);
            }
        }
        self.metrics.observe_quarantine(&self.conns, now);
        self.board.observe(&self.conns);
        for index in 0..self.entries.len() {
            let entry = &mut self.entries[index];
            if entry.live && !entry.reported && now >= entry.round.deadline() {
                entry.round.handle_timeout(now);
                self.check_complete(index);
            }
        }
    }

    /// The next instant at which [`Engine::handle_timeout`] has work: a
    /// live round's deadline or a connection's connect or stall limit; or
    /// at which [`Engine::poll_connect`] will say to open a subscriber
    /// connection that someone waits on (a master's connection is opened
    /// on next use instead).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        // Plain loops into one running minimum: every turn asks this.
        let mut soonest = None;
        let mut take = |at: Option<Instant>| {
            if let Some(at) = at
                && soonest.is_none_or(|s| at < s)
            {
                soonest = Some(at);
            }
        };
        for conn in self.conns.iter().chain(&self.subs) {
            take(conn.poll_timeout());
        }
        for entry in &self.entries {
            if entry.live && !entry.reported {
                take(Some(entry.round.deadline()));
            }
        }
        if self.subscriptions.is_wanted() {
            for sub in &self.subs {
                take(sub.retry_at());
            }
        }
        soonest
    }

    /// Requests still awaiting a reply on connections that are up.
    pub(crate) fn in_flight(&self) -> usize {
        self.conns
            .iter()
            .filter(|c| !c.is_down())
            .map(Conn::in_flight)
            .sum()
    }

    /// Whether `k` more requests fit under `limit` in flight: the shared
    /// client's admission rule. Every master that keeps up must have room
    /// (a master that is down counts as empty), so that a burst all masters
    /// share waits its turn instead of pushing the slowest of them past
    /// [`Timing::max_in_flight`] (a master still connecting or in its
    /// handshake included: at start-up every master is); a master that
    /// is unresponsive (its oldest request unanswered for longer than the
    /// per-instance timeout) holds nobody back and is dropped as too far
    /// behind, as with one caller. At least a quorum must have room.
    pub(crate) fn has_room(&self, k: usize, limit: usize, now: Instant) -> bool {
        let mut fits = 0;
        for conn in &self.conns {
            if conn.is_down() || conn.in_flight() + k <= limit {
                fits += 1;
            } else if !conn.is_unresponsive(now) {
                return self.in_flight() == 0;
            }
        }
        fits >= crate::quorum::quorum(self.n) || self.in_flight() == 0
    }

    /// When [`Engine::has_room`] may turn true with no reply coming, after
    /// `now`: just after the soonest instant a master holding `limit` or
    /// more turns unresponsive (it then holds nobody back). A job waiting
    /// for room behind a master that stopped answering waits that long,
    /// not for the stall limit.
    pub(crate) fn room_at(&self, limit: usize, now: Instant) -> Option<Instant> {
        self.conns
            .iter()
            .filter(|c| !c.is_down() && c.in_flight() >= limit)
            .filter_map(Conn::unresponsive_after)
            .filter(|&at| at >= now)
            .min()
            .and_then(|at| at.checked_add(Duration::from_micros(1)))
    }

    /// Looks for two masters that are one server, once a connection read a
    /// new `run_id`: the first such pair, in master order.
    pub(crate) fn poll_same_server(&mut self) -> Option<(usize, usize)> {
        let mut learned = false;
        for conn in &mut self.conns {
            learned |= conn.take_new_run_id();
        }
        if !learned {
            return None;
        }
        (0..self.n).find_map(|i| same_server(&self.conns, i).map(|j| (i.min(j), i.max(j))))
    }

    fn entry(&self, id: RoundId) -> Option<&Entry> {
        lookup(&self.entries, id)
    }

    /// Master `i` failed with `cause`: counted, and its pending votes in
    /// every live round fail.
    fn fail_pending(&mut self, i: usize, cause: &Cause, now: Instant) {
        self.metrics.handle_failure(i, cause);
        self.fail_votes(i, cause, now);
    }

    /// Master `i`'s pending votes in every live round fail with `cause`.
    fn fail_votes(&mut self, i: usize, cause: &Cause, now: Instant) {
        for index in 0..self.entries.len() {
            if self.entries[index].live {
                self.entries[index].round.fail_pending(i, cause, now);
                self.check_complete(index);
            }
        }
    }

    fn check_complete(&mut self, index: usize) {
        let Some(entry) = self.entries.get_mut(index) else {
            return;
        };
        if entry.live && !entry.reported && entry.is_complete() {
            entry.reported = true;
            self.completed
                .push_back(RoundId::new(index, entry.generation));
        }
    }
}

fn lookup(entries: &[Entry], id: RoundId) -> Option<&Entry> {
    entries
        .get(id.index())
        .filter(|e| e.live && e.generation == id.generation())
}

impl Entry {
    fn is_complete(&self) -> bool {
        if !self.round.is_decided() {
            return false;
        }
        match self.wait {
            Wait::Decision => true,
            Wait::Fence { readmit } => {
                !self.round.is_waiting(0)
                    || !matches!(
                        plan_fence(
                            self.round.votes(0),
                            self.round.fence_reads(0),
                            self.round.quorum(),
                            readmit
                        ),
                        FencePlan::Unknown { .. }
                    )
            }
        }
    }
}

#[cfg(test)]
mod sim;
