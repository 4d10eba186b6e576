//! Release notifications: which resources this client waits for, the
//! subscriptions that tell it when they are released, and the local queue
//! of waiters per resource.
//!
//! [`Channels`] is sans-IO state beside the [`Engine`](crate::engine::Engine)'s
//! subscriber connections (one per master, [`Role::Subscriber`]). A
//! resource is subscribed on every master while at least one local waiter
//! waits for it ([`Channels::join`]), and unsubscribed when the last one
//! leaves. Waiters queue in arrival order: only the head races for the
//! lock, so that one release sets off one `SET NX` per process, not one
//! per waiter. A release, published by a master or done through this
//! client ([`Channels::handle_released`]), moves the resource's epoch on
//! and queues the resource once for [`Channels::poll_notified`]; a waiter
//! that compares epochs before and after its attempt cannot miss a release
//! that came in between. A subscription made again after its connection
//! dropped counts as a release too, since one may have been missed.
//!
//! Memory is bounded by the resources waited for: a message for a
//! resource nobody here waits for is read and dropped, and a flood of
//! messages moves an epoch on, queueing nothing more. A resource nobody
//! waits for any more is kept only until its UNSUBSCRIBEs are confirmed,
//! and a subscriber connection awaits at most
//! [`Timing::max_in_flight`](crate::conn::Timing::max_in_flight)
//! confirmations, none for longer than the stall limit, before it is
//! dropped with its subscriptions: a master that stops answering leaves at
//! most that many such resources behind, and for no longer. Nothing here
//! touches a socket or reads a clock.
//!
//! Each resource's [`Channel`] is five parts, one per concern, each plain
//! data with unit tests of its own: the waiter queue and the releases that
//! wake it ([`Queue`]), the subscription per master ([`Subscription`]),
//! the "held here" marks ([`Marks`]), the row of in-process hand-overs
//! ([`Row`]) and the turns across processes ([`Turns`]).
//!
//! Across processes, turns ([`Turn`]): a refused waiting attempt publishes
//! a notice with its token ([`WAITING_MARK`]), which seats its process
//! (by [`process_id`]) in every listening client's turns for the lock,
//! and an announced release through this client names the seated process
//! that has gone longest without the lock ([`Channels::name_next`]). The
//! named process tries at once, the others a little later: one releaser
//! decides, so every process reads the same turn from its message. A
//! process named that does not take the lock loses its seat where the
//! lock was taken, until its next refusal.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use crate::conn::{Cause, Conn, Role};
use crate::hash::FxMap;
use crate::resp::{Arg, Reply};
use crate::script::{RELEASE_CHANNEL_PREFIX, WAITING_MARK};
use crate::token::Token;

/// A row of in-process hand-overs of one lock (lock cohorting): how many
/// so far, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cohort {
    /// Hand-overs in the row, this lock's included.
    pub(crate) row: u32,
    /// When the first of them was sent.
    pub(crate) since: Instant,
}

/// Whose turn it is to try for a lock after the last release heard of it
/// (a turn across processes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Nobody's in particular: every head waiter tries after its share of
    /// the wake spread.
    Open,
    /// This client's: its head waiter tries at once.
    Mine,
    /// Another process's: this client's head waiter tries only if that
    /// one has not taken the lock by then.
    Theirs,
}

/// A process heard waiting for a lock: its id (see [`process_id`]), and
/// when it last released the lock (the channel's count of releases
/// then; 0 for never).
#[derive(Debug, Clone, Copy)]
struct Seat {
    id: i64,
    served: u64,
}

/// The most processes a channel keeps turns for.
const MAX_SEATS: usize = 16;

/// The id of the process (the client) that minted `token`, if this crate
/// minted it: its first 16 hex digits (a client's tokens share their
/// first 32, see [`TokenSource`](crate::token::TokenSource)), as an
/// integer. Not 0, which names nobody.
pub(crate) fn process_id(token: &Token) -> Option<i64> {
    let bytes = token.as_bytes();
    if bytes.len() != 48 {
        return None;
    }
    prefix_id(bytes)
}

/// The process id (see [`process_id`]) read from the start of `prefix`.
fn prefix_id(prefix: &[u8]) -> Option<i64> {
    let hex = std::str::from_utf8(prefix.get(..16)?).ok()?;
    let id = u64::from_str_radix(hex, 16).ok()?.cast_signed();
    (id != 0).then_some(id)
}

/// A message on a release channel, read: a release's (its token's bytes,
/// then the process it names to try next, if any) or a refused attempt's
/// notice (the refused token's bytes).
pub(crate) struct Message<'a> {
    /// A refused attempt's notice ([`WAITING_MARK`]): nothing was freed.
    pub(crate) waiting: bool,
    /// The token, as sent.
    pub(crate) token: &'a [u8],
    /// The process a release names to try next.
    pub(crate) named: Option<i64>,
}

impl Message<'_> {
    /// Reads `payload`: `token`, `token:id` or `?token`.
    pub(crate) fn read(payload: &[u8]) -> Message<'_> {
        let waiting = payload.first() == Some(&WAITING_MARK);
        let payload = payload.get(usize::from(waiting)..).unwrap_or(&[]);
        let (token, named) = match memchr::memchr(b':', payload) {
            Some(at) => (
                payload.get(..at).unwrap_or(&[]),
                (payload.get(at + 1..))
                    .and_then(|n| std::str::from_utf8(n).ok())
                    .and_then(|n| n.parse::<i64>().ok())
                    .filter(|&n| n != 0),
            ),
            None => (payload, None),
        };
        Message {
            waiting,
            token,
            named,
        }
    }
}

/// One subscriber connection's view of one resource's channel.
#[derive(Debug, Clone, Copy, Default)]
struct Link {
    /// SUBSCRIBE and UNSUBSCRIBE commands sent and not yet confirmed.
    pending: u32,
    /// The last SUBSCRIBE was sent on a new connection: a release may
    /// have been missed while there was none.
    renewed: bool,
}

/// A resource that local waiters wait for, in five parts, one per concern:
/// who waits and what wakes them ([`Queue`]), the subscription on each
/// master ([`Subscription`]), whether the lock is held here ([`Marks`]),
/// the row of in-process hand-overs ([`Row`]) and the turns across
/// processes ([`Turns`]). Each part is plain data with its own unit tests.
#[derive(Debug)]
struct Channel {
    queue: Queue,
    sub: Subscription,
    marks: Marks,
    row: Row,
    turns: Turns,
}

/// Who waits for a resource here, and the releases that wake them.
#[derive(Debug, Default)]
struct Queue {
    /// Waiters in arrival order; the head races.
    waiters: VecDeque<usize>,
    /// Waiters for this resource among others (multi-resource acquires):
    /// each release wakes every one of them; none is anyone's head.
    listeners: Vec<usize>,
    /// Moved on by each release seen.
    epoch: u64,
    /// In [`Channels::notified`].
    queued: bool,
    /// The token of this client's last cleanup of a waiter's failed
    /// attempt: the masters' messages for it wake nobody.
    cleanup: Option<Token>,
    /// The token of the last release message read (see
    /// [`Channels::heard_release`]).
    heard: Option<Token>,
}

impl Queue {
    /// Nobody here waits: no queue, no listener.
    fn is_empty(&self) -> bool {
        self.waiters.is_empty() && self.listeners.is_empty()
    }
}

/// The resource's subscription, per subscriber connection.
#[derive(Debug)]
struct Subscription {
    /// Per subscriber connection.
    links: Vec<Link>,
    /// Subscribed (or subscribing) on every subscriber connection: from
    /// the first waiter's join until the UNSUBSCRIBEs are sent.
    subscribed: bool,
}

impl Subscription {
    /// No SUBSCRIBE or UNSUBSCRIBE of it is unconfirmed anywhere.
    fn is_settled(&self) -> bool {
        self.links.iter().all(|l| l.pending == 0)
    }
}

/// Whether the lock is held here, and by which of this client's locks.
#[derive(Debug, Default)]
struct Marks {
    /// This client took the lock (this token, valid until then), and it
    /// has not been let go through this client (nor heard released): the
    /// lock is held here. The subscription stays with no waiter left
    /// until it is let go or that instant passes, and a new local waiter
    /// waits for its release instead of trying (see
    /// [`Channels::held_here`]).
    held: Option<(Instant, Token)>,
    /// The token of the last lock this client took on the resource (see
    /// [`Channels::is_current`]). Unlike `held`, no message clears it: a
    /// message of another client's key deleted on a master this client's
    /// lock did not hold says nothing of which of its locks is current.
    latest: Option<Token>,
    /// With nobody waiting here, the subscription is kept until then
    /// after this client's release named another process, for that
    /// process's turn: a new local waiter, waiting for it, hears its
    /// release (see [`Channels::let_go`]).
    kept: Option<Instant>,
}

impl Marks {
    /// Until when a subscription kept with nobody waiting stays: the later
    /// of the lock's validity while held here and the turn it is `kept`
    /// for; none when neither holds it ([`Channels::sweep`] ends it then).
    fn kept_until(&self) -> Option<Instant> {
        // `None` orders before any `Some`: the later of the two, or the one.
        self.held.map(|(until, _)| until).max(self.kept)
    }

    /// The lock of `token` is no longer held here, if it was the one held
    /// here: another lock's mark stays.
    fn let_go_of(&mut self, token: Token) {
        if self.held.is_some_and(|(_, held)| held == token) {
            self.held = None;
        }
    }
}

/// The row of in-process hand-overs of the lock.
#[derive(Debug)]
struct Row {
    /// The lock passed between two of this client's callers (handed
    /// over) since a release last waited for a local caller in vain:
    /// several callers here take it in turn (see
    /// [`Config::local_handover_linger`](crate::Config::local_handover_linger)).
    company: bool,
    /// Another client's release of this lock (or cleanup of its attempt)
    /// was heard since this client last ended a row of hand-overs with an
    /// announced release ([`Channels::handle_yield`]): other processes
    /// compete for it, and a row ends after
    /// [`Config::local_handovers`](crate::Config::local_handovers) as well
    /// as after its window. Set for a new channel: until a row has ended
    /// with nobody else heard, other processes are taken to compete.
    contended: bool,
    /// This client released the lock unannounced, handing it over, with
    /// this row to go on, and has taken no lock on the resource since.
    /// The next lock granted here goes on with it, whichever caller's
    /// attempt took it: the head waiter's it was handed to, or another's
    /// that left right behind the release (a queued waiter's last attempt
    /// as it gives up, a caller's first). Taken as a row of its own, the
    /// lock would pass quietly past the row's count (the simulator's row
    /// checker, seed 110,847 with 120 operations per client). Cleared
    /// when a row ends with an announced release. After a hand-over that
    /// failed (the lock went elsewhere), the next lock taken here goes on
    /// with the old row too: that row ends sooner, never later.
    handing: Option<Cohort>,
}

impl Default for Row {
    fn default() -> Row {
        Row {
            company: false,
            contended: true,
            handing: None,
        }
    }
}

/// The turns across processes at the lock.
#[derive(Debug, Default)]
struct Turns {
    /// The processes heard waiting for this lock.
    seats: Vec<Seat>,
    /// Releases counted.
    count: u64,
    /// The last two releases counted.
    counted: [Option<Token>; 2],
    /// The process the last release heard (or made here) named to try
    /// next, if it named one.
    named: Option<i64>,
    /// The count of releases when this client's own notice was last
    /// heard, or a release last named it: it is seated in the turns of
    /// the processes listening, as far as it knows.
    seated: Option<u64>,
    /// The count of releases when the last one was made or first heard
    /// here, and that instant: when the turn it named began (see
    /// [`Channels::theirs_since`]).
    turn_began: Option<(u64, Instant)>,
}

impl Turns {
    /// `id`'s process waits for the lock: seated, if it was not, as served
    /// before every other (its turn comes next).
    fn seat(&mut self, id: i64) -> &mut Seat {
        let at = match self.seats.iter().position(|s| s.id == id) {
            Some(at) => at,
            None => {
                self.make_room();
                self.seats.push(Seat { id, served: 0 });
                self.seats.len() - 1
            }
        };
        &mut self.seats[at]
    }

    /// Room for one more seat, if there are [`MAX_SEATS`]: the one
    /// served last goes (it is seated again by its next refusal).
    fn make_room(&mut self) {
        if self.seats.len() >= MAX_SEATS
            && let Some(i) = (self.seats.iter().enumerate())
                .max_by_key(|(_, s)| s.served)
                .map(|(i, _)| i)
        {
            self.seats.swap_remove(i);
        }
    }

    /// A release of `token`'s naming `named` to try next: counted once
    /// however many masters tell of it (and told here first, for one of
    /// this client's); `own` is this client's process id.
    fn count_release(&mut self, token: Token, named: Option<i64>, own: Option<i64>) {
        if self.counted.contains(&Some(token)) {
            return;
        }
        self.counted = [Some(token), self.counted[0]];
        self.named = named;
        if named.is_some() && named == own {
            self.seated = Some(self.count + 1);
        }
        let Some(by) = process_id(&token) else {
            return;
        };
        self.count += 1;
        self.seat(by).served = self.count;
    }

    /// The process a release should name to try next: the seat served
    /// longest ago, `own` aside; `own` when no other waits and
    /// `waiting_here`; else none.
    fn next(&self, own: Option<i64>, waiting_here: bool) -> Option<i64> {
        (self.seats.iter())
            .filter(|s| Some(s.id) != own)
            .min_by_key(|s| (s.served, s.id))
            .map(|s| s.id)
            .or(own.filter(|_| waiting_here))
    }

    /// Whether this client should publish its notice that it waits: unless
    /// its own notice was heard, or a release named it, within the last
    /// round of turns (as many releases as seats, and one more).
    fn needs_notice(&self) -> bool {
        let round = u64::try_from(self.seats.len()).unwrap_or(u64::MAX) + 1;
        self.seated
            .is_none_or(|at| self.count.saturating_sub(at) > round)
    }

    /// When the turn the last release counted named began here, if it is
    /// known.
    fn began(&self) -> Option<Instant> {
        self.turn_began
            .filter(|&(count, _)| count == self.count)
            .map(|(_, at)| at)
    }
}

impl Channel {
    /// A channel with nobody in it yet, for `links` subscriber connections.
    fn new(links: usize) -> Channel {
        Channel {
            queue: Queue::default(),
            sub: Subscription {
                links: vec![Link::default(); links],
                subscribed: false,
            },
            marks: Marks::default(),
            row: Row::default(),
            turns: Turns::default(),
        }
    }

    /// Subscribed with nobody waiting, for a lock held here (or until
    /// swept, see [`Channels::sweep`]).
    fn is_lingering(&self) -> bool {
        self.sub.subscribed && self.queue.is_empty()
    }
}

/// The resources local waiters wait for, and their subscriptions.
#[derive(Debug, Default)]
pub(crate) struct Channels {
    /// By resource. A fixed hasher, so that the order the table is walked
    /// in (to subscribe again after a reconnect, say) is the same in every
    /// run: the client's decisions follow from its inputs alone, and a
    /// simulated run replays. The keys are the application's own resource
    /// names, not a remote party's.
    table: FxMap<Bytes, Channel>,
    /// Resources released since the last [`Channels::poll_notified`],
    /// each at most once.
    notified: VecDeque<Bytes>,
    /// A channel name under construction, reused.
    name: Vec<u8>,
    /// Per subscriber connection: the master refused this client's
    /// SUBSCRIBE (`-NOPERM`). No notification comes from it; it is sent
    /// no more subscriptions and counts as settled, so that waiters rely
    /// on the expiry timer, and it is not dropped for it. A new connection
    /// (made for another reason) tries once more.
    refused: Vec<bool>,
    /// Per subscriber connection: the refusal was reported (once).
    warned: Vec<bool>,
    /// The resources a sweep unsubscribes, reused.
    swept: Vec<Bytes>,
    /// Per subscriber connection: the SUBSCRIBEs (`true`) and UNSUBSCRIBEs
    /// that found no room on it (see [`Channels::flush`]), in order, each
    /// already counted in its link's `pending`.
    outbox: Vec<Vec<(bool, Bytes)>>,
    /// How many channels are subscribed: the common case, none, costs
    /// no walk of the table (see [`Channels::is_wanted`]).
    subscribed: usize,
    /// The prefix of every token this client mints: a message with
    /// another token is another client's release (see `Channel`'s
    /// `contended`). `None` until told: every message is then another's.
    own: Option<[u8; 32]>,
    /// This client's process id (see [`process_id`]), from `own`.
    own_id: Option<i64>,
    /// Bumped wherever [`Channels::is_contended`] may change its answer
    /// (a flag set or cleared, a channel dropped): a simulation reads the
    /// flags again only when it moved.
    contention_epoch: u64,
}

impl Channels {
    /// Whether any resource is waited for: subscriber connections are
    /// opened only then.
    pub(crate) fn is_wanted(&self) -> bool {
        self.subscribed > 0
    }

    /// Waiter `waiter` waits for `resource`: it joins the queue, and the
    /// first waiter subscribes on every subscriber connection that is up
    /// (the others subscribe when they connect). A connection too far
    /// behind to take the SUBSCRIBE is dropped.
    pub(crate) fn join(
        &mut self,
        subs: &mut [Conn],
        resource: &Bytes,
        waiter: usize,
        now: Instant,
    ) {
        self.enter(subs, resource, now, |channel| {
            channel.queue.waiters.push_back(waiter)
        });
    }

    /// Waiter `waiter` waits for `resource` among others: it listens to
    /// its releases, subscribed as for [`Channels::join`], but joins no
    /// queue.
    pub(crate) fn listen(
        &mut self,
        subs: &mut [Conn],
        resource: &Bytes,
        waiter: usize,
        now: Instant,
    ) {
        self.enter(subs, resource, now, |channel| {
            channel.queue.listeners.push(waiter)
        });
    }

    /// Waiter `waiter` stops listening to `resource`; the last one to go,
    /// with no queue and the lock not held here, unsubscribes.
    pub(crate) fn unlisten(
        &mut self,
        subs: &mut [Conn],
        resource: &Bytes,
        waiter: usize,
        now: Instant,
    ) {
        let Some(channel) = self.table.get_mut(resource) else {
            return;
        };
        channel.queue.listeners.retain(|&w| w != waiter);
        if channel.is_lingering() && channel.marks.held.is_none() {
            self.unsubscribe(subs, resource, now);
        }
    }

    /// The waiters listening to `resource` (see [`Channels::listen`]).
    pub(crate) fn listeners(&self, resource: &[u8]) -> &[usize] {
        if self.table.is_empty() {
            return &[];
        }
        self.table
            .get(resource)
            .map_or(&[], |c| c.queue.listeners.as_slice())
    }

    /// `resource`'s channel, made if new, passed to `add` (which adds a
    /// waiter), then subscribed if it was not.
    fn enter(
        &mut self,
        subs: &mut [Conn],
        resource: &Bytes,
        now: Instant,
        add: impl FnOnce(&mut Channel),
    ) {
        let channel = self
            .table
            .entry(resource.clone())
            .or_insert_with(|| Channel::new(subs.len()));
        add(channel);
        if std::mem::replace(&mut channel.sub.subscribed, true) {
            return;
        }
        self.subscribed += 1;
        let links = &mut channel.sub.links;
        post_everywhere(
            &mut self.outbox,
            &mut self.name,
            &self.refused,
            links,
            subs,
            true,
            resource,
            now,
        );
    }

    /// Waiter `waiter` stops waiting for `resource`. The last one
    /// unsubscribes, unless the lock is held here (see
    /// [`Channels::handle_granted`]). Returns the new head of the queue
    /// when the head left.
    pub(crate) fn leave(
        &mut self,
        subs: &mut [Conn],
        resource: &Bytes,
        waiter: usize,
        now: Instant,
    ) -> Option<usize> {
        let channel = self.table.get_mut(resource)?;
        let position = channel.queue.waiters.iter().position(|&w| w == waiter)?;
        channel.queue.waiters.remove(position);
        if !channel.queue.waiters.is_empty() {
            return channel
                .queue
                .waiters
                .front()
                .copied()
                .filter(|_| position == 0);
        }
        if channel.queue.listeners.is_empty() && channel.marks.held.is_none() {
            self.unsubscribe(subs, resource, now);
        }
        None
    }

    /// This client took the lock on `resource` (`token`), valid until
    /// `until`, while its callers listen for it: it is held here until let
    /// go through this client
    /// ([`Channels::let_go`]), heard released, or that instant. Returns
    /// the row of hand-overs the lock goes on with, if this client handed
    /// the lock over since it last took it (see
    /// [`Channels::handle_handed_over`]).
    pub(crate) fn handle_granted(
        &mut self,
        resource: &[u8],
        until: Instant,
        token: Token,
    ) -> Option<Cohort> {
        let own = self.own_id;
        let channel = self.table.get_mut(resource)?;
        channel.marks.held = Some((until, token));
        channel.marks.latest = Some(token);
        // Taken here though the last release named another process: that
        // one did not come for its turn (it is seated again if it still
        // waits, by its next refusal).
        if let Some(named) = channel.turns.named.take()
            && Some(named) != own
        {
            channel.turns.seats.retain(|s| s.id != named);
        }
        channel.row.handing.take()
    }

    /// This client released the lock on `resource` unannounced, handing
    /// it over to a caller here, the row going on as `next`: the next
    /// lock on it granted here carries `next` (see
    /// [`Channels::handle_granted`]).
    pub(crate) fn handle_handed_over(&mut self, resource: &[u8], next: Cohort) {
        if let Some(channel) = self.table.get_mut(resource) {
            channel.row.handing = Some(next);
        }
    }

    /// A lock on `resource` held here, of `token`, was extended: it is held
    /// until `until` now (later, or shortened by a failed extend), so
    /// that a local waiter waits for the lock no longer than that. Nothing
    /// changes when another lock holds it here (the extended one lapsed).
    pub(crate) fn handle_extended(&mut self, resource: &[u8], until: Instant, token: Token) {
        if let Some(channel) = self.table.get_mut(resource)
            && channel.marks.held.is_some_and(|(_, held)| held == token)
        {
            channel.marks.held = Some((until, token));
        }
    }

    /// The lock on `resource` was handed over between two callers here
    /// (`true`), or a release waited for a caller here in vain (`false`).
    pub(crate) fn handle_company(&mut self, resource: &[u8], company: bool) {
        if let Some(channel) = self.table.get_mut(resource) {
            channel.row.company = company;
        }
    }

    /// The prefix of the tokens this client mints (see
    /// [`TokenSource::prefix`](crate::token::TokenSource::prefix)).
    pub(crate) fn know_own_tokens(&mut self, prefix: [u8; 32]) {
        self.own = Some(prefix);
        self.own_id = prefix_id(&prefix);
    }

    /// This client ended a row of hand-overs of the lock on `resource`
    /// with an announced release: whether other processes still compete
    /// for it is told by their releases heard from now on.
    pub(crate) fn handle_yield(&mut self, resource: &[u8]) {
        if let Some(channel) = self.table.get_mut(resource) {
            channel.row.contended = false;
            channel.row.handing = None;
            self.contention_epoch += 1;
        }
    }

    /// See `contention_epoch`.
    #[cfg(any(test, feature = "test-knobs"))]
    pub(crate) fn contention_epoch(&self) -> u64 {
        self.contention_epoch
    }

    /// Whether other processes compete for the lock on `resource`: one of
    /// their releases (or cleanups) was heard since this client last
    /// ended a row of hand-overs, or no row has ended yet.
    pub(crate) fn is_contended(&self, resource: &[u8]) -> bool {
        self.table.is_empty() || self.table.get(resource).is_none_or(|c| c.row.contended)
    }

    /// Whether the lock on `resource` passes between several callers here
    /// (see [`Channels::handle_company`]).
    pub(crate) fn has_company(&self, resource: &[u8]) -> bool {
        !self.table.is_empty() && self.table.get(resource).is_some_and(|c| c.row.company)
    }

    /// Until when a lock on `resource` taken by a local waiter is held
    /// here, if one is at `now`: a new local waiter waits for its release
    /// (handed over, or announced) rather than try.
    pub(crate) fn held_here(&self, resource: &[u8], now: Instant) -> Option<Instant> {
        if self.table.is_empty() {
            return None;
        }
        let channel = self.table.get(resource)?;
        channel
            .marks
            .held
            .map(|(until, _)| until)
            .filter(|&until| until > now && channel.sub.subscribed)
    }

    /// Whether a release of `token` lets go of the lock on `resource`
    /// held here, or ends its row: not when this client has taken the
    /// lock again since (the released one lapsed, its caller releasing it
    /// late), whether or not the later lock is still marked held here (a
    /// message heard may have cleared that mark).
    pub(crate) fn is_current(&self, resource: &[u8], token: Token) -> bool {
        self.table
            .get(resource)
            .and_then(|c| c.marks.latest)
            .is_none_or(|latest| latest == token)
    }

    /// The lock on `resource` is let go through this client (released,
    /// or handed over): it is no longer held here, and with nobody
    /// waiting the subscription ends, or is kept until `keep` (another
    /// process's turn, see `kept`).
    pub(crate) fn let_go(
        &mut self,
        subs: &mut [Conn],
        resource: &Bytes,
        keep: Option<Instant>,
        now: Instant,
    ) {
        let Some(channel) = self.table.get_mut(resource) else {
            return;
        };
        channel.marks.held = None;
        if channel.is_lingering() {
            match keep.filter(|&until| until > now) {
                Some(until) => channel.marks.kept = Some(until),
                None => self.unsubscribe(subs, resource, now),
            }
        }
    }

    /// Ends the subscriptions kept with nobody waiting whose lock is no
    /// longer held here at `now` (heard released, or past its validity).
    pub(crate) fn sweep(&mut self, subs: &mut [Conn], now: Instant) {
        if self.subscribed == 0 {
            return;
        }
        let mut done = std::mem::take(&mut self.swept);
        done.extend(
            self.table
                .iter()
                .filter(|(_, c)| c.is_lingering() && c.marks.kept_until().is_none_or(|t| t <= now))
                .map(|(resource, _)| resource.clone()),
        );
        for resource in done.drain(..) {
            self.unsubscribe(subs, &resource, now);
        }
        self.swept = done;
    }

    /// When the next subscription kept for a lock held here ends, if its
    /// lock is not let go before (see [`Channels::sweep`]).
    pub(crate) fn next_sweep(&self) -> Option<Instant> {
        if self.subscribed == 0 {
            return None;
        }
        self.table
            .values()
            .filter(|c| c.is_lingering())
            .filter_map(|c| c.marks.kept_until())
            .min()
    }

    /// Unsubscribes `resource` on every subscriber connection (a
    /// connection too far behind to take the UNSUBSCRIBE is dropped, and
    /// its subscriptions with it).
    fn unsubscribe(&mut self, subs: &mut [Conn], resource: &Bytes, now: Instant) {
        let Some(channel) = self.table.get_mut(resource) else {
            return;
        };
        if std::mem::take(&mut channel.sub.subscribed) {
            self.subscribed -= 1;
        }
        channel.marks.held = None;
        channel.marks.kept = None;
        let links = &mut channel.sub.links;
        post_everywhere(
            &mut self.outbox,
            &mut self.name,
            &self.refused,
            links,
            subs,
            false,
            resource,
            now,
        );
        if self
            .table
            .get(resource)
            .is_some_and(|c| !c.sub.subscribed && c.sub.is_settled())
        {
            self.table.remove(resource);
            self.contention_epoch += 1;
        }
    }

    /// The waiter that races for `resource`.
    pub(crate) fn head(&self, resource: &[u8]) -> Option<usize> {
        // The common case, nobody waiting, costs no hashing.
        if self.table.is_empty() {
            return None;
        }
        self.table.get(resource)?.queue.waiters.front().copied()
    }

    /// How many releases of `resource` were seen while someone waited.
    pub(crate) fn epoch(&self, resource: &[u8]) -> u64 {
        self.table.get(resource).map_or(0, |c| c.queue.epoch)
    }

    /// Whether the subscriptions for `resource` are in place as far as
    /// they can be: confirmed by enough masters that every release, which
    /// deletes the key on a quorum, is published on one of them
    /// (`n - quorum + 1`), or no SUBSCRIBE is still unconfirmed and no
    /// subscriber connection is about to connect (the rest are down,
    /// backing off). Until then a waiter must not try: a release between
    /// its attempt and its subscription would go unseen.
    pub(crate) fn is_listening(
        &self,
        subs: &[Conn],
        resource: &[u8],
        quorum: usize,
        now: std::time::Instant,
    ) -> bool {
        let Some(channel) = self.table.get(resource) else {
            return true;
        };
        let mut confirmed = 0;
        let mut settled = true;
        for (i, (link, conn)) in channel.sub.links.iter().zip(subs).enumerate() {
            if self.refused.get(i).copied().unwrap_or(false) {
                // Refused for good: nothing to wait for there.
                continue;
            }
            if conn.is_down() {
                settled &= !conn.poll_connect(now) || conn.is_resolving();
            } else if link.pending == 0 {
                confirmed += 1;
            } else {
                settled = false;
            }
        }
        settled || confirmed + quorum > subs.len()
    }

    /// Whether the last release message read for `resource` was one of
    /// `token`'s: a master's message of that release reached this
    /// client's waiters (and woke them).
    pub(crate) fn heard_release(&self, resource: &[u8], token: Token) -> bool {
        self.table
            .get(resource)
            .is_some_and(|channel| channel.queue.heard == Some(token))
    }

    /// The subscriber connections on which `channel`'s subscription is in
    /// place: not refused, up, with nothing unconfirmed.
    #[cfg(test)]
    fn confirmed_links<'a>(
        &'a self,
        channel: &'a Channel,
        subs: &'a [Conn],
    ) -> impl Iterator<Item = usize> + 'a {
        (channel.sub.links.iter().zip(subs).enumerate())
            .filter(|(i, (link, conn))| {
                !self.refused.get(*i).copied().unwrap_or(false)
                    && !conn.is_down()
                    && link.pending == 0
            })
            .map(|(i, _)| i)
    }

    /// A lock on `resource` (`token`'s) was released through this client:
    /// its local waiters are woken without waiting for the masters'
    /// messages (each of which still counts: see [`Channels::handle_push`]).
    /// It is no longer held here, unless another lock of this client's
    /// holds it now (the released one lapsed, its caller releasing it
    /// late): that one's mark stays.
    pub(crate) fn handle_released(&mut self, resource: &[u8], token: Token) {
        if self.table.is_empty() {
            return;
        }
        if let Some(channel) = self.table.get_mut(resource) {
            channel.marks.let_go_of(token);
            release(&mut self.notified, resource, channel);
        }
    }

    /// Whose turn it is to try for the lock on `resource`: the process
    /// the last release named, if it named one.
    pub(crate) fn turn(&self, resource: &[u8]) -> Turn {
        self.turn_named(self.table.get(resource).and_then(|c| c.turns.named))
    }

    /// Whose turn a release naming `named` gave (see [`Channels::turn`]).
    fn turn_named(&self, named: Option<i64>) -> Turn {
        match (named, self.own_id) {
            (Some(named), Some(own)) if named == own => Turn::Mine,
            (Some(_), _) => Turn::Theirs,
            (None, _) => Turn::Open,
        }
    }

    /// The last release of the lock on `resource` was made or heard here
    /// at `now`, unless it was already: the turn it named began then.
    pub(crate) fn handle_turn_began(&mut self, resource: &[u8], now: Instant) {
        if let Some(channel) = self.table.get_mut(resource)
            && channel
                .turns
                .turn_began
                .is_none_or(|(count, _)| count != channel.turns.count)
        {
            channel.turns.turn_began = Some((channel.turns.count, now));
        }
    }

    /// When the turn of the process the last release of the lock on
    /// `resource` named began here, if that is another process
    /// ([`Turn::Theirs`]).
    pub(crate) fn theirs_since(&self, resource: &[u8]) -> Option<Instant> {
        // An empty table answers without hashing the key.
        let channel = self.table.get(resource)?;
        if self.turn_named(channel.turns.named) != Turn::Theirs {
            return None;
        }
        channel.turns.began()
    }

    /// Whether this client's waiting attempts on `resource`, refused,
    /// should publish the notice that it waits: unless its own notice was
    /// heard, or a release named it, within the last round of turns (as
    /// many releases as seats, and one more). Not told otherwise when
    /// another client unseats it (it did not come when named), it then
    /// sends the notice again once a round of turns has passed it by.
    pub(crate) fn needs_notice(&self, resource: &[u8]) -> bool {
        self.table
            .get(resource)
            .is_none_or(|channel| channel.turns.needs_notice())
    }

    /// This client releases the lock on `resource` (`token`), announced:
    /// the process to try next, which the release names to every
    /// process. The seat served longest ago, this client's aside; this
    /// client itself when no other waits and `waiting_here`; else none
    /// (0).
    pub(crate) fn name_next(&mut self, resource: &[u8], token: Token, waiting_here: bool) -> i64 {
        let own = self.own_id;
        let Some(channel) = self.table.get_mut(resource) else {
            return 0;
        };
        let next = channel.turns.next(own, waiting_here);
        channel.turns.count_release(token, next, own);
        next.unwrap_or(0)
    }

    /// A local waiter's failed attempt on `resource` is undone by a
    /// release of `token`: the masters will publish it, but it frees only
    /// keys that attempt took, never the holder's, so its messages move
    /// no epoch on (a waiter woken by its own cleanup would try again at
    /// once, into the same refusal, for as long as the lock is held).
    pub(crate) fn handle_cleanup(&mut self, resource: &[u8], token: Token) {
        if let Some(channel) = self.table.get_mut(resource) {
            channel.queue.cleanup = Some(token);
        }
    }

    /// The next resource released since the last call.
    pub(crate) fn poll_notified(&mut self) -> Option<Bytes> {
        let resource = self.notified.pop_front()?;
        if let Some(channel) = self.table.get_mut(&resource) {
            channel.queue.queued = false;
        }
        Some(resource)
    }

    /// Sends the SUBSCRIBEs and UNSUBSCRIBEs that found no room when they
    /// were made, on each subscriber connection that has room now (fewer
    /// than half its in-flight bound unconfirmed): one command naming
    /// every channel of each run of one verb, in order. A subscription is
    /// sent at once while its connection has room; a burst of waiters on
    /// many resources past that waits here, to go as one command, rather
    /// than drop the connection as too far behind (a `release_batch`
    /// waking a thousand waiters did, for every subscriber connection of
    /// their client; found by the simulation's bounds checker). The hub
    /// calls it at the end of each of its turns.
    pub(crate) fn flush(&mut self, subs: &mut [Conn], now: Instant) {
        let mut dropped = false;
        for (i, conn) in subs.iter_mut().enumerate() {
            let Some(outbox) = self.outbox.get_mut(i) else {
                break;
            };
            if outbox.is_empty() || !conn.has_room_for_command() {
                continue;
            }
            let mut start = 0;
            while let Some(&(subscribe, _)) = outbox.get(start) {
                let end = outbox[start..]
                    .iter()
                    .position(|(verb, _)| *verb != subscribe)
                    .map_or(outbox.len(), |run| start + run);
                self.name.clear();
                for (_, resource) in &outbox[start..end] {
                    self.name.extend_from_slice(RELEASE_CHANNEL_PREFIX);
                    self.name.extend_from_slice(resource);
                }
                let verb: &[u8] = if subscribe {
                    b"SUBSCRIBE"
                } else {
                    b"UNSUBSCRIBE"
                };
                let mut args = Vec::with_capacity(end - start + 1);
                args.push(Arg::Bytes(verb));
                let mut at = 0;
                for (_, resource) in &outbox[start..end] {
                    let len = RELEASE_CHANNEL_PREFIX.len() + resource.len();
                    args.push(Arg::Bytes(&self.name[at..at + len]));
                    at += len;
                }
                if let Err(cause) = conn.queue_command(&args, now) {
                    dropped |= matches!(cause, Cause::TooFarBehind);
                    break;
                }
                start = end;
            }
            outbox.clear();
        }
        if dropped {
            self.handle_links_down(subs);
        }
    }

    /// Subscriber connection `link` started connecting: every resource
    /// waited for is subscribed on it (after its AUTH, in the same write),
    /// by one SUBSCRIBE naming them all, so that a new connection starts
    /// one command from empty however many resources are waited for.
    pub(crate) fn handle_link_up(&mut self, link: usize, conn: &mut Conn, now: Instant) {
        if let Some(refused) = self.refused.get_mut(link) {
            // A new connection tries once more.
            *refused = false;
        }
        // Made for the old connection: the new one subscribes afresh.
        if let Some(outbox) = self.outbox.get_mut(link) {
            outbox.clear();
        }
        // The channels' names one after another in `name`, and where each
        // ends: the arguments borrow them.
        self.name.clear();
        let mut ends = Vec::new();
        for (resource, channel) in &self.table {
            if channel.sub.subscribed {
                self.name.extend_from_slice(RELEASE_CHANNEL_PREFIX);
                self.name.extend_from_slice(resource);
                ends.push(self.name.len());
            }
        }
        if ends.is_empty() {
            return;
        }
        let mut args = Vec::with_capacity(ends.len() + 1);
        args.push(Arg::Bytes(b"SUBSCRIBE"));
        let mut start = 0;
        for end in ends {
            args.push(Arg::Bytes(&self.name[start..end]));
            start = end;
        }
        if conn.queue_command(&args, now).is_err() {
            return;
        }
        for channel in self.table.values_mut() {
            if let Some(state) = channel.sub.links.get_mut(link)
                && channel.sub.subscribed
            {
                state.pending = 1;
                state.renewed = true;
            }
        }
    }

    /// The master behind subscriber connection `link` refused a SUBSCRIBE
    /// for good (`-NOPERM`, in `reply`): a permission is an answer, not a
    /// broken connection. Nothing is subscribed there from now on (the
    /// connection stays), and its waiters rely on the holder's expiry.
    fn handle_refused(&mut self, link: usize, reply: &[u8]) {
        if self.refused.len() <= link {
            self.refused.resize(link + 1, false);
            self.warned.resize(link + 1, false);
        }
        self.refused[link] = true;
        if let Some(outbox) = self.outbox.get_mut(link) {
            outbox.clear();
        }
        let first = !std::mem::replace(&mut self.warned[link], true);
        crate::metrics::subscribe_refused(first, reply);
        for channel in self.table.values_mut() {
            if let Some(state) = channel.sub.links.get_mut(link) {
                *state = Link::default();
            }
        }
        self.table
            .retain(|_, c| c.sub.subscribed || !c.sub.is_settled());
        self.contention_epoch += 1;
    }

    /// Subscriber connection `link` dropped: its subscriptions are gone
    /// with it.
    pub(crate) fn handle_link_down(&mut self, link: usize) {
        if let Some(outbox) = self.outbox.get_mut(link) {
            outbox.clear();
        }
        for channel in self.table.values_mut() {
            if let Some(state) = channel.sub.links.get_mut(link) {
                *state = Link::default();
            }
        }
        self.table
            .retain(|_, c| c.sub.subscribed || !c.sub.is_settled());
        self.contention_epoch += 1;
    }

    /// Every subscriber connection that is down dropped (a send found it
    /// too far behind): see [`Channels::handle_link_down`]. For one that
    /// was down already this changes nothing.
    fn handle_links_down(&mut self, subs: &[Conn]) {
        for (link, conn) in subs.iter().enumerate() {
            if conn.is_down() {
                self.handle_link_down(link);
            }
        }
    }

    /// A frame pushed on subscriber connection `link`.
    ///
    /// # Errors
    /// [`Cause::Server`] for an error reply (SUBSCRIBE refused, by an ACL
    /// say): the connection is then dropped and made again later.
    pub(crate) fn handle_push(&mut self, link: usize, reply: Reply) -> Result<(), Cause> {
        let items = match reply {
            Reply::Array(items) => items,
            Reply::Error(msg) if msg.starts_with(b"NOPERM") => {
                self.handle_refused(link, &msg);
                return Ok(());
            }
            Reply::Error(msg) => return Err(Cause::Server(msg)),
            // Nothing else is sent in subscribed mode; a stray frame
            // changes nothing.
            _ => return Ok(()),
        };
        let (Some(Reply::Bulk(kind)), Some(Reply::Bulk(name))) = (items.first(), items.get(1))
        else {
            return Ok(());
        };
        let Some(resource) = name.strip_prefix(RELEASE_CHANNEL_PREFIX) else {
            return Ok(());
        };
        let own = self.own;
        let own_id = self.own_id;
        let Some(channel) = self.table.get_mut(resource) else {
            return Ok(());
        };
        match &kind[..] {
            b"message" => {
                let payload = match items.get(2) {
                    Some(Reply::Bulk(payload)) => &payload[..],
                    _ => &[][..],
                };
                let Message {
                    waiting,
                    token,
                    named,
                } = Message::read(payload);
                let token = std::str::from_utf8(token)
                    .ok()
                    .and_then(|text| Token::parse(text).ok());
                if waiting {
                    // A process was refused: it waits for this lock too,
                    // and gets a seat in the turns. Nothing was freed.
                    if let Some(t) = token {
                        if let Some(id) = process_id(&t) {
                            channel.turns.seat(id);
                            if Some(id) == own_id {
                                channel.turns.seated = Some(channel.turns.count);
                            }
                        }
                        if !own.is_some_and(|p| t.has_prefix(&p))
                            && !crate::knobs::injected(crate::knobs::Bug::ContentionUnheard)
                        {
                            channel.row.contended = true;
                            self.contention_epoch += 1;
                        }
                    }
                    return Ok(());
                }
                // Another client's release, or its cleanup after a race:
                // another process competes for this lock.
                let ours = token.is_some_and(|t| own.is_some_and(|p| t.has_prefix(&p)));
                // The release of a lock of this client's that another of
                // its locks has replaced here freed nothing a waiter could
                // take: a master's own compare-and-delete is followed by
                // its message whatever it found (the script sends none
                // unless it deleted the key).
                if ours
                    && channel
                        .marks
                        .latest
                        .is_some_and(|latest| token != Some(latest))
                {
                    return Ok(());
                }
                if let Some(t) = token
                    && token != channel.queue.cleanup
                {
                    channel.turns.count_release(t, named, own_id);
                }
                channel.queue.heard = token;
                if !ours && !crate::knobs::injected(crate::knobs::Bug::ContentionUnheard) {
                    channel.row.contended = true;
                    self.contention_epoch += 1;
                }
                if crate::knobs::injected(crate::knobs::Bug::ReleaseNoticeDropped) {
                    return Ok(());
                }
                // Every master's message counts, those of one release
                // included: a release reaches the masters one by one, and
                // a waiter woken by the first may try before the others
                // have freed the lock, and be refused there. Only the
                // later masters' messages can then tell it to try again
                // (counted once per release, they were dropped, and the
                // waiter waited for the holder's expiry).
                if token.is_none() || token != channel.queue.cleanup {
                    // No longer held here, if it was: the lingering
                    // subscription ends at the next sweep. Not for a late
                    // message (a slower master's) of an earlier release of
                    // this client's: the lock a waiter took since is
                    // still held here, and its subscription stays.
                    if !ours || token == channel.marks.held.map(|(_, held)| held) {
                        channel.marks.held = None;
                    }
                    release(&mut self.notified, resource, channel);
                }
            }
            b"subscribe" | b"unsubscribe" => {
                let Some(state) = channel.sub.links.get_mut(link) else {
                    return Ok(());
                };
                state.pending = state.pending.saturating_sub(1);
                if kind[..] == b"subscribe"[..] && std::mem::take(&mut state.renewed) {
                    release(&mut self.notified, resource, channel);
                }
                if !channel.sub.subscribed && channel.sub.is_settled() {
                    self.table.remove(resource);
                    self.contention_epoch += 1;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The subscriber connections on which `resource`'s subscription
    /// counts toward [`Channels::is_listening`] (see
    /// [`Channels::confirmed_links`]).
    #[cfg(test)]
    pub(crate) fn confirmed(&self, subs: &[Conn], resource: &[u8]) -> Vec<usize> {
        self.table.get(resource).map_or_else(Vec::new, |channel| {
            self.confirmed_links(channel, subs).collect()
        })
    }

    /// How many resources are tracked (waited for, or with commands
    /// unconfirmed).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// Moves `channel`'s epoch on for a release and queues `resource` for
/// [`Channels::poll_notified`], once.
fn release(notified: &mut VecDeque<Bytes>, resource: &[u8], channel: &mut Channel) {
    channel.queue.epoch += 1;
    if !channel.queue.queued {
        channel.queue.queued = true;
        notified.push_back(Bytes::copy_from_slice(resource));
    }
}

/// [`post`] on every subscriber connection (`subs`, the channel's view of
/// each in `links`) that is up and has not refused this client.
#[allow(clippy::too_many_arguments)]
fn post_everywhere(
    outbox: &mut Vec<Vec<(bool, Bytes)>>,
    name: &mut Vec<u8>,
    refused: &[bool],
    links: &mut [Link],
    subs: &mut [Conn],
    subscribe: bool,
    resource: &Bytes,
    now: Instant,
) {
    for (i, (link, conn)) in links.iter_mut().zip(subs.iter_mut()).enumerate() {
        if refused.get(i).copied().unwrap_or(false) || conn.is_down() {
            continue;
        }
        if subscribe {
            link.renewed = false;
        }
        post(outbox, name, i, conn, subscribe, resource, now, link);
    }
}

/// Queues a SUBSCRIBE (`subscribe`) or UNSUBSCRIBE of `resource`'s
/// channel on subscriber connection `i` (`conn`, up; `link`, the channel's
/// view of it, counts it unconfirmed): at once while the connection has
/// room and nothing waits before it, else into its outbox for
/// [`Channels::flush`]. One that undoes the resource's last command still
/// in the outbox takes it out instead: neither is sent. Waiters coming and
/// going on ever new resources while a master does not answer then leave
/// the outbox as it was, not one pair each.
#[allow(clippy::too_many_arguments)]
fn post(
    outbox: &mut Vec<Vec<(bool, Bytes)>>,
    name: &mut Vec<u8>,
    i: usize,
    conn: &mut Conn,
    subscribe: bool,
    resource: &Bytes,
    now: Instant,
    link: &mut Link,
) {
    debug_assert_eq!(conn.role(), Role::Subscriber);
    if outbox.len() <= i {
        outbox.resize_with(i + 1, Vec::new);
    }
    let waiting = &mut outbox[i];
    if let Some(at) = waiting.iter().rposition(|(_, r)| r == resource)
        && waiting[at].0 != subscribe
    {
        waiting.remove(at);
        link.pending = link.pending.saturating_sub(1);
        return;
    }
    link.pending += 1;
    if waiting.is_empty() && conn.has_room_for_command() {
        let verb: &[u8] = if subscribe {
            b"SUBSCRIBE"
        } else {
            b"UNSUBSCRIBE"
        };
        name.clear();
        name.extend_from_slice(RELEASE_CHANNEL_PREFIX);
        name.extend_from_slice(resource);
        // Room was checked: only a connection down refuses it, and its
        // subscriptions are made again when it connects.
        let _ = conn.queue_command(&[Arg::Bytes(verb), Arg::Bytes(name)], now);
        return;
    }
    waiting.push((subscribe, resource.clone()));
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use bytes::BytesMut;

    use super::*;
    use crate::conn::Timing;
    use crate::resp::{self, Limits};
    use crate::script::Scripts;
    use crate::token::TokenSource;

    const R: &[u8] = b"orders:42";

    fn subs(n: usize, now: Instant) -> Vec<Conn> {
        let timing = Timing {
            connect: Duration::from_secs(1),
            stall: Duration::from_secs(1),
            patience: Duration::from_millis(200),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
            quarantine: None,
            max_in_flight: 1024,
        };
        (0..n)
            .map(|i| {
                let addr = format!("redis://127.0.0.1:{}", 7000 + i).parse().unwrap();
                let mut conn = Conn::with_role(
                    Role::Subscriber,
                    addr,
                    Scripts::new(),
                    Limits::default(),
                    timing,
                    now,
                );
                conn.handle_connect_started(now);
                conn.handle_connected();
                conn
            })
            .collect()
    }

    /// The commands queued on `conn`, each as its words, and the buffer
    /// emptied as if written.
    fn sent(conn: &mut Conn) -> Vec<String> {
        let mut buf = BytesMut::from(conn.poll_transmit());
        conn.handle_written(buf.len());
        let mut commands = Vec::new();
        while let Some(Reply::Array(words)) = resp::decode(&mut buf, &Limits::default()).unwrap() {
            let words: Vec<String> = words
                .iter()
                .map(|w| match w {
                    Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                    other => format!("{other:?}"),
                })
                .collect();
            commands.push(words.join(" "));
        }
        commands
    }

    fn push(kind: &str, resource: &[u8], last: Reply) -> Reply {
        Reply::Array(vec![
            Reply::Bulk(Bytes::copy_from_slice(kind.as_bytes())),
            Reply::Bulk(Bytes::from(crate::script::release_channel(resource))),
            last,
        ])
    }

    fn message(resource: &[u8], token: &Token) -> Reply {
        push(
            "message",
            resource,
            Reply::Bulk(Bytes::copy_from_slice(token.as_bytes())),
        )
    }

    /// A client's channels over three subscriber connections, knowing its
    /// own tokens (the source it mints them from).
    fn own_client(now: Instant) -> (Vec<Conn>, Channels, TokenSource) {
        let subs = subs(3, now);
        let mut channels = Channels::default();
        let ours = TokenSource::from_seed([1; 16]);
        channels.know_own_tokens(ours.prefix());
        (subs, channels, ours)
    }

    fn confirm(channels: &mut Channels, n: usize, kind: &str) {
        for link in 0..n {
            channels
                .handle_push(link, push(kind, R, Reply::Integer(1)))
                .unwrap();
        }
    }

    #[test]
    fn the_first_waiter_subscribes_everywhere_the_last_unsubscribes_and_the_queue_is_fifo() {
        let now = Instant::now();
        let mut subs = subs(3, now);
        let mut channels = Channels::default();
        let resource = Bytes::from_static(R);
        channels.join(&mut subs, &resource, 7, now);
        channels.join(&mut subs, &resource, 9, now);
        for conn in &mut subs {
            assert_eq!(sent(conn), ["SUBSCRIBE redlock:released:orders:42"]);
        }
        assert_eq!(channels.head(R), Some(7));
        assert!(channels.is_wanted());
        confirm(&mut channels, 3, "subscribe");
        // The head leaves: the next one races.
        assert_eq!(channels.leave(&mut subs, &resource, 7, now), Some(9));
        assert_eq!(channels.head(R), Some(9));
        for conn in &mut subs {
            assert!(sent(conn).is_empty());
        }
        assert_eq!(channels.leave(&mut subs, &resource, 9, now), None);
        for conn in &mut subs {
            assert_eq!(sent(conn), ["UNSUBSCRIBE redlock:released:orders:42"]);
        }
        assert!(!channels.is_wanted());
        assert_eq!(
            channels.len(),
            1,
            "kept until the UNSUBSCRIBEs are confirmed"
        );
        confirm(&mut channels, 3, "unsubscribe");
        assert_eq!(channels.len(), 0);
    }

    #[test]
    fn a_listener_is_no_head_and_keeps_the_subscription_until_the_last_one_goes() {
        let now = Instant::now();
        let mut subs = subs(3, now);
        let mut channels = Channels::default();
        let resource = Bytes::from_static(R);
        channels.listen(&mut subs, &resource, 4, now);
        for conn in &mut subs {
            assert_eq!(sent(conn), ["SUBSCRIBE redlock:released:orders:42"]);
        }
        assert_eq!(channels.head(R), None, "a listener races nobody's turn");
        assert_eq!(channels.listeners(R), [4]);
        confirm(&mut channels, 3, "subscribe");
        // A queue's waiter comes and goes: the listener keeps the
        // subscription.
        channels.join(&mut subs, &resource, 7, now);
        assert_eq!(channels.head(R), Some(7));
        assert_eq!(channels.leave(&mut subs, &resource, 7, now), None);
        for conn in &mut subs {
            assert!(sent(conn).is_empty(), "still listened to");
        }
        // A release is queued once, for the head and the listeners alike.
        let token = TokenSource::from_seed([2; 16]).next_token();
        channels.handle_released(R, token);
        assert_eq!(channels.poll_notified().as_deref(), Some(R));
        assert_eq!(channels.epoch(R), 1);
        channels.unlisten(&mut subs, &resource, 4, now);
        for conn in &mut subs {
            assert_eq!(sent(conn), ["UNSUBSCRIBE redlock:released:orders:42"]);
        }
        assert!(!channels.is_wanted());
        assert!(channels.listeners(R).is_empty());
    }

    #[test]
    fn a_lock_let_go_for_another_process_turn_keeps_the_subscription_until_the_turn_is_over() {
        let now = Instant::now();
        let valid = now + Duration::from_secs(2);
        let turn = now + Duration::from_millis(4);
        let (mut subs, mut channels, mut ours) = own_client(now);
        let resource = Bytes::from_static(R);
        channels.join(&mut subs, &resource, 7, now);
        confirm(&mut channels, 3, "subscribe");
        for conn in &mut subs {
            sent(conn);
        }
        channels.handle_granted(R, valid, ours.next_token());
        assert_eq!(channels.leave(&mut subs, &resource, 7, now), None);
        // Let go for another process's turn: kept, nothing sent, and no
        // longer held here.
        channels.let_go(&mut subs, &resource, Some(turn), now);
        assert!(subs.iter_mut().all(|c| sent(c).is_empty()), "kept");
        assert_eq!(channels.held_here(R, now), None);
        assert_eq!(channels.next_sweep(), Some(turn));
        // Not swept before the turn is over; then ended.
        channels.sweep(&mut subs, turn - Duration::from_micros(1));
        assert!(subs.iter_mut().all(|c| sent(c).is_empty()), "kept");
        channels.sweep(&mut subs, turn);
        for conn in &mut subs {
            assert_eq!(sent(conn), ["UNSUBSCRIBE redlock:released:orders:42"]);
        }
        confirm(&mut channels, 3, "unsubscribe");
        assert_eq!(channels.len(), 0);
    }

    #[test]
    fn a_lock_a_waiter_took_keeps_the_subscription_until_let_go_heard_released_or_no_longer_valid()
    {
        let now = Instant::now();
        let valid = now + Duration::from_secs(2);
        let (mut subs, mut channels, mut ours) = own_client(now);
        let resource = Bytes::from_static(R);
        let subscribed = |subs: &mut Vec<Conn>| {
            for conn in subs.iter_mut() {
                assert_eq!(sent(conn), ["SUBSCRIBE redlock:released:orders:42"]);
            }
        };
        let unsubscribed = |subs: &mut Vec<Conn>| {
            for conn in subs.iter_mut() {
                assert_eq!(sent(conn), ["UNSUBSCRIBE redlock:released:orders:42"]);
            }
        };
        // Let go through this client.
        channels.join(&mut subs, &resource, 7, now);
        subscribed(&mut subs);
        confirm(&mut channels, 3, "subscribe");
        channels.handle_granted(R, valid, ours.next_token());
        assert_eq!(channels.leave(&mut subs, &resource, 7, now), None);
        assert!(subs.iter_mut().all(|c| sent(c).is_empty()), "kept");
        assert_eq!(channels.held_here(R, now), Some(valid));
        assert!(channels.is_wanted());
        channels.let_go(&mut subs, &resource, None, now);
        unsubscribed(&mut subs);
        assert_eq!(channels.held_here(R, now), None);
        confirm(&mut channels, 3, "unsubscribe");
        assert_eq!(channels.len(), 0);
        // Heard released: ended at the next sweep.
        channels.join(&mut subs, &resource, 8, now);
        subscribed(&mut subs);
        confirm(&mut channels, 3, "subscribe");
        let earlier = ours.next_token();
        let held = ours.next_token();
        channels.handle_granted(R, valid, held);
        assert_eq!(channels.leave(&mut subs, &resource, 8, now), None);
        assert_eq!(channels.next_sweep(), Some(valid));
        // A slower master's message of an earlier release of this client's
        // says nothing of the lock held here.
        channels
            .handle_push(2, message(R, &earlier))
            .expect("a message");
        assert_eq!(channels.held_here(R, now), Some(valid));
        // Its own release heard, or another client's (it no longer holds).
        for token in [held, TokenSource::from_seed([3; 16]).next_token()] {
            channels.handle_granted(R, valid, held);
            channels
                .handle_push(0, message(R, &token))
                .expect("a message");
            assert_eq!(channels.held_here(R, now), None);
        }
        channels.sweep(&mut subs, now);
        unsubscribed(&mut subs);
        confirm(&mut channels, 3, "unsubscribe");
        assert_eq!(channels.len(), 0);
        // Never let go: ended once no longer valid, not before.
        channels.join(&mut subs, &resource, 9, now);
        subscribed(&mut subs);
        confirm(&mut channels, 3, "subscribe");
        channels.handle_granted(R, valid, ours.next_token());
        assert_eq!(channels.leave(&mut subs, &resource, 9, now), None);
        channels.sweep(&mut subs, now);
        assert!(subs.iter_mut().all(|c| sent(c).is_empty()), "still valid");
        assert_eq!(channels.held_here(R, valid), None);
        channels.sweep(&mut subs, valid);
        unsubscribed(&mut subs);
    }

    #[test]
    fn only_the_lock_held_here_lets_go_of_it_not_an_earlier_one_released_late() {
        let now = Instant::now();
        let valid = now + Duration::from_secs(2);
        let (mut subs, mut channels, mut ours) = own_client(now);
        let resource = Bytes::from_static(R);
        // Nothing marked: any release of this client's lets go.
        let lapsed = ours.next_token();
        assert!(channels.is_current(R, lapsed));
        channels.join(&mut subs, &resource, 7, now);
        confirm(&mut channels, 3, "subscribe");
        let held = ours.next_token();
        channels.handle_granted(R, valid, held);
        // An earlier lock of this client's on the same resource, lapsed
        // and released late by its caller, is not the one held here.
        assert!(!channels.is_current(R, lapsed));
        assert!(channels.is_current(R, held));
        // Nor once another client's message cleared the held-here mark
        // (its key deleted on a master this client's lock did not hold):
        // seed 53,920 of the simulator, five clients and five masters.
        let mut theirs = TokenSource::from_seed([2; 16]);
        channels
            .handle_push(0, message(R, &theirs.next_token()))
            .unwrap();
        assert_eq!(channels.held_here(R, now), None, "the mark cleared");
        assert!(!channels.is_current(R, lapsed));
        assert!(channels.is_current(R, held));
    }

    #[test]
    fn the_lock_taken_here_after_a_hand_over_goes_on_with_its_row_whoever_took_it() {
        let now = Instant::now();
        let valid = now + Duration::from_secs(2);
        let (mut subs, mut channels, mut ours) = own_client(now);
        channels.join(&mut subs, &Bytes::from_static(R), 7, now);
        confirm(&mut channels, 3, "subscribe");
        // Taken with no hand-over before it: a row of its own.
        assert_eq!(channels.handle_granted(R, valid, ours.next_token()), None);
        let next = Cohort { row: 2, since: now };
        channels.handle_handed_over(R, next);
        // The next lock taken here goes on with the row, once: a caller's
        // attempt that happened to leave right behind the release, not
        // the head's it was handed to (seed 110,847 of the simulator,
        // 120 operations per client).
        assert_eq!(
            channels.handle_granted(R, valid, ours.next_token()),
            Some(next)
        );
        assert_eq!(channels.handle_granted(R, valid, ours.next_token()), None);
        // A row ended with an announced release goes on with nobody.
        channels.handle_handed_over(R, next);
        channels.handle_yield(R);
        assert_eq!(channels.handle_granted(R, valid, ours.next_token()), None);
    }

    #[test]
    fn a_waiter_listens_once_enough_masters_confirmed_that_every_release_reaches_it() {
        let now = Instant::now();
        let mut subs = subs(3, now);
        let mut channels = Channels::default();
        channels.join(&mut subs, &Bytes::from_static(R), 1, now);
        assert!(!channels.is_listening(&subs, R, 2, now));
        channels
            .handle_push(0, push("subscribe", R, Reply::Integer(1)))
            .unwrap();
        // A release deletes on 2 of 3 masters: one confirmation could be
        // the master it skipped.
        assert!(!channels.is_listening(&subs, R, 2, now));
        channels
            .handle_push(2, push("subscribe", R, Reply::Integer(1)))
            .unwrap();
        assert!(channels.is_listening(&subs, R, 2, now));
        // A master whose subscriber connection is down and backing off
        // holds nobody back.
        let mut channels = Channels::default();
        let mut subs = self::subs(3, now);
        channels.join(&mut subs, &Bytes::from_static(R), 1, now);
        subs[1].handle_failure(now, Cause::Closed);
        subs[1].handle_failure(now, Cause::Closed);
        channels.handle_link_down(1);
        channels
            .handle_push(0, push("subscribe", R, Reply::Integer(1)))
            .unwrap();
        assert!(!channels.is_listening(&subs, R, 2, now));
        channels
            .handle_push(2, push("subscribe", R, Reply::Integer(1)))
            .unwrap();
        assert!(channels.is_listening(&subs, R, 2, now));
    }

    #[test]
    fn every_masters_message_of_a_release_counts_and_a_cleanups_none() {
        let now = Instant::now();
        let mut subs = subs(3, now);
        let mut channels = Channels::default();
        channels.join(&mut subs, &Bytes::from_static(R), 1, now);
        confirm(&mut channels, 3, "subscribe");
        let mut tokens = TokenSource::from_seed([1; 16]);
        let (local, remote, cleanup) = (
            tokens.next_token(),
            tokens.next_token(),
            tokens.next_token(),
        );
        channels.handle_released(R, local);
        assert_eq!(channels.epoch(R), 1);
        // The release reaches the masters one by one: a waiter that tried
        // after the first must hear of each later one.
        for link in 0..3 {
            channels.handle_push(link, message(R, &local)).unwrap();
            assert_eq!(channels.epoch(R), 2 + link as u64);
        }
        for link in 0..3 {
            channels.handle_push(link, message(R, &remote)).unwrap();
        }
        assert_eq!(channels.epoch(R), 7);
        // A waiter's own cleanup frees only what its attempt took.
        channels.handle_cleanup(R, cleanup);
        for link in 0..3 {
            channels.handle_push(link, message(R, &cleanup)).unwrap();
        }
        assert_eq!(channels.epoch(R), 7);
        // Queued once, however many releases came.
        assert_eq!(channels.poll_notified().as_deref(), Some(R));
        assert_eq!(channels.poll_notified(), None);
    }

    #[test]
    fn another_clients_release_heard_since_the_last_row_ended_makes_the_lock_contended() {
        let now = Instant::now();
        let (mut subs, mut channels, mut ours) = own_client(now);
        let mut theirs = TokenSource::from_seed([2; 16]);
        // No channel, or a new one: taken to be contended.
        assert!(channels.is_contended(R));
        channels.join(&mut subs, &Bytes::from_static(R), 1, now);
        confirm(&mut channels, 3, "subscribe");
        assert!(channels.is_contended(R));
        // A row ended: from now on, only other clients' messages count.
        channels.handle_yield(R);
        assert!(!channels.is_contended(R));
        let (yielded, cleanup) = (ours.next_token(), ours.next_token());
        channels.handle_cleanup(R, cleanup);
        for link in 0..3 {
            channels.handle_push(link, message(R, &yielded)).unwrap();
            channels.handle_push(link, message(R, &cleanup)).unwrap();
        }
        assert!(!channels.is_contended(R), "this client's own releases");
        // Another client's cleanup after a race (or its release) does.
        channels
            .handle_push(1, message(R, &theirs.next_token()))
            .unwrap();
        assert!(channels.is_contended(R));
        channels.handle_yield(R);
        assert!(!channels.is_contended(R));
        // A message whose payload is no token is another client's too.
        channels
            .handle_push(0, push("message", R, Reply::Bulk(Bytes::from_static(b""))))
            .unwrap();
        assert!(channels.is_contended(R));
    }

    /// A message with `payload` on `R`'s channel.
    fn text(payload: &str) -> Reply {
        push("message", R, Reply::Bulk(Bytes::from(payload.to_owned())))
    }

    // The parts of a channel, each alone: no engine, no connection.

    #[test]
    fn turns_seat_each_process_once_count_each_release_once_and_name_the_longest_unserved() {
        let mut a = TokenSource::from_seed([1; 16]);
        let mut b = TokenSource::from_seed([2; 16]);
        let (id_a, id_b) = (
            process_id(&a.next_token()).unwrap(),
            process_id(&b.next_token()).unwrap(),
        );
        let mut turns = Turns::default();
        assert!(turns.needs_notice(), "never heard: not seated");
        turns.seat(id_a);
        turns.seat(id_b);
        turns.seat(id_a);
        assert_eq!(turns.seats.len(), 2, "one seat a process");
        // B releases, naming A; each master's message of it counts once.
        let released = b.next_token();
        for _ in 0..3 {
            turns.count_release(released, Some(id_a), Some(id_a));
        }
        assert_eq!((turns.count, turns.named), (1, Some(id_a)));
        assert_eq!(turns.seated, Some(1), "named: A knows itself seated");
        assert!(!turns.needs_notice());
        // A has never released: it goes first, unless it is the releaser.
        assert_eq!(turns.next(None, false), Some(id_a));
        assert_eq!(turns.next(Some(id_a), false), Some(id_b));
        // Alone, a releaser names itself only with a caller waiting.
        let mut alone = Turns::default();
        alone.seat(id_a);
        assert_eq!(alone.next(Some(id_a), false), None);
        assert_eq!(alone.next(Some(id_a), true), Some(id_a));
        // A round of turns past its seat, a process asks again.
        for _ in 0..4 {
            turns.count_release(b.next_token(), None, Some(id_a));
        }
        assert!(turns.needs_notice());
        // The turn began when first made or heard, for the last release.
        let now = Instant::now();
        assert_eq!(turns.began(), None);
        turns.turn_began = Some((turns.count, now));
        assert_eq!(turns.began(), Some(now));
        turns.count_release(b.next_token(), None, None);
        assert_eq!(
            turns.began(),
            None,
            "a later release's turn is not known yet"
        );
    }

    #[test]
    fn seats_are_bounded_and_the_one_served_last_makes_room() {
        let mut turns = Turns::default();
        for id in 1..=MAX_SEATS as i64 {
            turns.seat(id).served = id as u64;
        }
        turns.seat(1_000);
        assert_eq!(turns.seats.len(), MAX_SEATS);
        assert!(turns.seats.iter().all(|s| s.id != MAX_SEATS as i64));
        assert!(turns.seats.iter().any(|s| s.id == 1_000));
    }

    #[test]
    fn marks_let_go_only_of_their_own_lock_and_keep_until_the_later_of_lock_and_turn() {
        let now = Instant::now();
        let mut tokens = TokenSource::from_seed([3; 16]);
        let (held, lapsed) = (tokens.next_token(), tokens.next_token());
        let mut marks = Marks::default();
        assert_eq!(marks.kept_until(), None);
        marks.held = Some((now + Duration::from_secs(1), held));
        marks.let_go_of(lapsed);
        assert!(
            marks.held.is_some(),
            "a lapsed lock's release keeps the mark"
        );
        marks.kept = Some(now + Duration::from_secs(2));
        assert_eq!(marks.kept_until(), Some(now + Duration::from_secs(2)));
        marks.kept = Some(now);
        assert_eq!(marks.kept_until(), Some(now + Duration::from_secs(1)));
        marks.let_go_of(held);
        assert_eq!(marks.held, None);
        assert_eq!(marks.kept_until(), Some(now));
    }

    #[test]
    fn a_new_channel_waits_for_nobody_is_settled_and_takes_others_to_compete() {
        let mut channel = Channel::new(3);
        assert!(channel.queue.is_empty());
        assert!(channel.sub.is_settled());
        assert!(!channel.is_lingering(), "not subscribed");
        assert!(
            channel.row.contended,
            "until a row ends with nobody else heard"
        );
        channel.sub.subscribed = true;
        assert!(channel.is_lingering(), "subscribed with nobody waiting");
        channel.queue.listeners.push(4);
        assert!(!channel.queue.is_empty());
        assert!(!channel.is_lingering());
        channel.sub.links[1].pending = 1;
        assert!(!channel.sub.is_settled());
    }

    /// [`own_client`] with a caller waiting for `R`, subscribed on every
    /// master.
    fn waiting_client(now: Instant) -> (Channels, TokenSource) {
        let (mut subs, mut channels, ours) = own_client(now);
        channels.join(&mut subs, &Bytes::from_static(R), 1, now);
        confirm(&mut channels, 3, "subscribe");
        (channels, ours)
    }

    #[test]
    fn a_release_names_the_process_that_waited_longest_and_every_process_reads_its_turn() {
        let now = Instant::now();
        let (mut channels, mut ours) = waiting_client(now);
        let (mut a, mut b) = (
            TokenSource::from_seed([2; 16]),
            TokenSource::from_seed([3; 16]),
        );
        let (a_id, b_id) = (
            process_id(&a.next_token()).unwrap(),
            process_id(&b.next_token()).unwrap(),
        );
        let own_id = process_id(&ours.next_token()).unwrap();
        assert_eq!(channels.turn(R), Turn::Open, "no release named anyone");
        // B released (its message names nobody), then A was refused: A
        // waits, and has not had the lock since B had it.
        channels
            .handle_push(0, message(R, &b.next_token()))
            .unwrap();
        assert_eq!(channels.turn(R), Turn::Open);
        let epoch = channels.epoch(R);
        while channels.poll_notified().is_some() {}
        let refused = format!("?{}", a.next_token().as_str());
        for link in 0..3 {
            channels.handle_push(link, text(&refused)).unwrap();
        }
        // A refusal frees nothing: no epoch moves, nobody is woken.
        assert_eq!(channels.epoch(R), epoch);
        assert_eq!(channels.poll_notified(), None);
        // This client's release names A, whose turn it is: this client's
        // own waiter waits for A.
        assert_eq!(channels.name_next(R, ours.next_token(), true), a_id);
        assert_eq!(channels.turn(R), Turn::Theirs);
        // A's release names B (served before this client): not ours.
        let named = |token: Token, id: i64| text(&format!("{}:{id}", token.as_str()));
        channels
            .handle_push(1, named(a.next_token(), b_id))
            .unwrap();
        assert_eq!(channels.turn(R), Turn::Theirs);
        // B's names this client: its head waiter tries at once. Every
        // master's message of it says the same.
        let token = b.next_token();
        for link in 0..3 {
            channels.handle_push(link, named(token, own_id)).unwrap();
            assert_eq!(channels.turn(R), Turn::Mine);
        }
        // Another client's release naming nobody: everybody's turn.
        channels
            .handle_push(0, message(R, &a.next_token()))
            .unwrap();
        assert_eq!(channels.turn(R), Turn::Open);
    }

    #[test]
    fn another_process_turn_begins_once_per_release_when_it_is_first_heard() {
        let now = Instant::now();
        let ms = std::time::Duration::from_millis;
        let (mut channels, mut ours) = waiting_client(now);
        let mut a = TokenSource::from_seed([2; 16]);
        let a_id = process_id(&a.next_token()).unwrap();
        let own_id = process_id(&ours.next_token()).unwrap();
        let named = |token: Token, id: i64| text(&format!("{}:{id}", token.as_str()));
        // No release yet: nobody's turn.
        channels.handle_turn_began(R, now);
        assert_eq!(channels.theirs_since(R), None);
        // A waits; this client's release names it at `now`.
        let refused = format!("?{}", a.next_token().as_str());
        channels.handle_push(0, text(&refused)).unwrap();
        assert_eq!(channels.name_next(R, ours.next_token(), true), a_id);
        channels.handle_turn_began(R, now);
        assert_eq!(channels.theirs_since(R), Some(now));
        // Every master's message of that release, heard later, is the
        // same release: A's turn began when it was made.
        channels.handle_turn_began(R, now + ms(1));
        assert_eq!(channels.theirs_since(R), Some(now));
        // A's release, heard at +5 ms, names this client: its own turn.
        channels
            .handle_push(1, named(a.next_token(), own_id))
            .unwrap();
        channels.handle_turn_began(R, now + ms(5));
        assert_eq!(channels.theirs_since(R), None, "this client's turn");
        // This client's next release names A again: a new turn, at +9 ms.
        assert_eq!(channels.name_next(R, ours.next_token(), true), a_id);
        assert_eq!(
            channels.theirs_since(R),
            None,
            "not told when this turn began yet"
        );
        channels.handle_turn_began(R, now + ms(9));
        assert_eq!(channels.theirs_since(R), Some(now + ms(9)));
    }

    #[test]
    fn a_process_named_that_does_not_come_loses_its_seat_and_a_lone_waiter_is_named() {
        let now = Instant::now();
        let (mut channels, mut ours) = waiting_client(now);
        let mut a = TokenSource::from_seed([2; 16]);
        let a_id = process_id(&a.next_token()).unwrap();
        let own_id = process_id(&ours.next_token()).unwrap();
        // Not seated yet: its refusals tell the others it waits.
        assert!(channels.needs_notice(R));
        let notice = format!("?{}", ours.next_token().as_str());
        channels.handle_push(1, text(&notice)).unwrap();
        assert!(!channels.needs_notice(R), "its own notice heard");
        // Nobody else waits: a release names this client when a caller
        // here waits, and nobody when none does.
        assert_eq!(channels.name_next(R, ours.next_token(), true), own_id);
        assert_eq!(channels.turn(R), Turn::Mine);
        assert_eq!(channels.name_next(R, ours.next_token(), false), 0);
        assert_eq!(channels.turn(R), Turn::Open);
        // A waits, and is named.
        let refused = format!("?{}", a.next_token().as_str());
        channels.handle_push(0, text(&refused)).unwrap();
        assert_eq!(channels.name_next(R, ours.next_token(), true), a_id);
        // Releases that pass this client by (a round of turns and more)
        // make it tell the others again.
        for _ in 0..3 {
            channels
                .handle_push(0, message(R, &a.next_token()))
                .unwrap();
        }
        assert!(channels.needs_notice(R));
        // A release naming it seats it again, as far as it knows.
        let named = format!("{}:{own_id}", a.next_token().as_str());
        channels.handle_push(0, text(&named)).unwrap();
        assert!(!channels.needs_notice(R));
        assert_eq!(channels.name_next(R, ours.next_token(), true), a_id);
        // A never came: this client took the lock again after its wait.
        channels.handle_granted(R, now + Duration::from_secs(1), ours.next_token());
        assert_eq!(
            channels.name_next(R, ours.next_token(), true),
            own_id,
            "A unseated"
        );
        // Until it is refused again.
        let refused = format!("?{}", a.next_token().as_str());
        channels.handle_push(2, text(&refused)).unwrap();
        assert_eq!(channels.name_next(R, ours.next_token(), true), a_id);
        // Tokens this crate did not mint name no process.
        assert_eq!(
            process_id(&Token::parse("0000000000000000ffffffffffffffffffffffffffffffff").unwrap()),
            None
        );
        assert_eq!(process_id(&Token::parse("short").unwrap()), None);
        assert_eq!(process_id(&Token::parse(&"g".repeat(48)).unwrap()), None);
    }

    #[test]
    fn messages_nobody_waits_for_are_dropped_and_a_flood_is_bounded() {
        let now = Instant::now();
        let mut subs = subs(1, now);
        let mut channels = Channels::default();
        channels.join(&mut subs, &Bytes::from_static(R), 1, now);
        confirm(&mut channels, 1, "subscribe");
        let mut tokens = TokenSource::from_seed([2; 16]);
        for i in 0..100_000u32 {
            let token = tokens.next_token();
            let other = format!("other:{i}");
            channels
                .handle_push(0, message(other.as_bytes(), &token))
                .unwrap();
            channels.handle_push(0, message(R, &token)).unwrap();
            // Garbage in the payload still wakes: the key may be free.
            channels
                .handle_push(0, push("message", R, Reply::Integer(i64::from(i))))
                .unwrap();
            // Frames of other shapes change nothing.
            channels.handle_push(0, Reply::Nil).unwrap();
            channels
                .handle_push(0, push("pmessage", R, Reply::Nil))
                .unwrap();
        }
        assert_eq!(channels.len(), 1, "only the resource waited for is kept");
        assert_eq!(channels.epoch(R), 200_000);
        assert_eq!(channels.notified.len(), 1, "queued once however many");
        assert_eq!(channels.epoch(b"other:1"), 0);
        assert!(matches!(
            channels.handle_push(0, Reply::Error(Bytes::from_static(b"ERR no"))),
            Err(Cause::Server(_))
        ));
        // A permission refused is an answer: no error, so no redial.
        assert!(
            channels
                .handle_push(0, Reply::Error(Bytes::from_static(b"NOPERM no")))
                .is_ok()
        );
    }

    #[test]
    fn a_subscription_renewed_after_its_connection_dropped_counts_as_a_release() {
        let now = Instant::now();
        let mut subs = subs(2, now);
        let mut channels = Channels::default();
        channels.join(&mut subs, &Bytes::from_static(R), 1, now);
        confirm(&mut channels, 2, "subscribe");
        for conn in &mut subs {
            sent(conn);
        }
        assert_eq!(channels.epoch(R), 0);
        subs[0].handle_failure(now, Cause::Closed);
        channels.handle_link_down(0);
        subs[0].handle_connect_started(now);
        channels.handle_link_up(0, &mut subs[0], now);
        subs[0].handle_connected();
        assert_eq!(sent(&mut subs[0]), ["SUBSCRIBE redlock:released:orders:42"]);
        assert!(
            channels.is_listening(&subs, R, 2, now),
            "one of two suffices"
        );
        channels
            .handle_push(0, push("subscribe", R, Reply::Integer(1)))
            .unwrap();
        assert_eq!(channels.epoch(R), 1, "a release may have been missed");
    }
}
