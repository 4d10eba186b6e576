//! The hub's waiting room: which resources local waiters wait for, and
//! what this client knows of each one's lock while they do.
//!
//! [`Room`] keeps a record per resource waited for (from the first
//! waiter's arrival until the engine has forgotten its subscription), in
//! four small parts, each a concern of its own: the [`Queue`] of local
//! waiters and the releases they have seen, the [`Marks`] of the lock held
//! here, the hand-over [`Row`] (lock cohorting), and the [`Turns`] across
//! processes. Waiters queue in arrival order: only the head races for the
//! lock, so that one release sets off one `SET NX` per process, not one
//! per waiter. A release, published by a master or done through this
//! client ([`Room::handle_released`]), moves the resource's epoch on and
//! queues the resource once for [`Room::poll_notified`]; a waiter that
//! compares epochs before and after its attempt cannot miss a release
//! that came in between. A subscription made again after its connection
//! dropped counts as a release too, since one may have been missed.
//!
//! The room does not subscribe: it asks ([`Room::poll_change`]), and the
//! hub moves its asks to the engine's subscriptions and what they heard
//! back in ([`Room::handle_message`], [`Room::handle_renewed`],
//! [`Room::handle_forgotten`]). It touches no connection, reads no clock
//! and knows nothing of jobs. Memory is bounded by the resources waited
//! for: a record goes when the engine forgets its subscription, and a
//! flood of messages moves an epoch on, queueing nothing more.
//!
//! Across processes, turns ([`Turn`]): a refused waiting attempt publishes
//! a notice with its token ([`WAITING_MARK`](crate::script::WAITING_MARK)),
//! which seats its process (by [`process_id`]) in every listening client's
//! turns for the lock, and an announced release through this client names
//! the seated process that has gone longest without the lock
//! ([`Room::name_next`]). The named process tries at once, the others a
//! little later: one releaser decides, so every process reads the same
//! turn from its message. A process named that does not take the lock
//! loses its seat where the lock was taken, until its next refusal.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use crate::hash::FxMap;
use crate::token::Token;

mod marks;
mod queue;
mod row;
mod turns;

pub(crate) use marks::Marks;
pub(crate) use queue::Queue;
pub(crate) use row::{Cohort, Row};
pub(crate) use turns::{Message, Own, Turn, Turns, process_id};

/// A change of subscription the room asks of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// Subscribe to the resource's releases.
    Subscribe(Bytes),
    /// No longer.
    Unsubscribe(Bytes),
}

/// A resource local waiters wait for, in its four concerns.
#[derive(Debug, Default)]
pub(crate) struct Waited {
    /// Subscription asked for: from the first waiter's arrival until it
    /// is let go with nobody waiting.
    subscribed: bool,
    /// The local waiters and the releases they have seen.
    pub(crate) queue: Queue,
    /// The lock held here.
    pub(crate) marks: Marks,
    /// The rows of hand-overs.
    pub(crate) row: Row,
    /// The turns across processes.
    pub(crate) turns: Turns,
}

impl Waited {
    /// Subscribed with nobody waiting, for a lock held here (or until
    /// swept, see [`Room::sweep`]).
    fn is_lingering(&self) -> bool {
        self.subscribed && self.queue.is_empty()
    }
}

/// The resources local waiters wait for (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct Room {
    /// By resource, a fixed hasher: the order the table is walked in (to
    /// sweep, say) is the same in every run, so that a simulated run
    /// replays. The keys are the application's own resource names.
    table: FxMap<Bytes, Waited>,
    /// Resources released since the last [`Room::poll_notified`], each at
    /// most once.
    notified: VecDeque<Bytes>,
    /// Subscriptions to change, for [`Room::poll_change`].
    changes: VecDeque<Change>,
    /// The resources a sweep unsubscribes, reused.
    swept: Vec<Bytes>,
    /// How many records are subscribed: the common case, none, costs no
    /// walk of the table.
    subscribed: usize,
    /// This client, as messages name it.
    own: Own,
    /// Bumped wherever [`Room::is_contended`] may change its answer (a
    /// flag set or cleared, a record dropped): a simulation reads the
    /// flags again only when it moved.
    contention_epoch: u64,
}

impl Room {
    /// The prefix of the tokens this client mints (see
    /// [`TokenSource::prefix`](crate::token::TokenSource::prefix)).
    pub(crate) fn know_own_tokens(&mut self, prefix: [u8; 32]) {
        self.own = Own::new(prefix);
    }

    /// `resource`'s record, if someone waits for it (or did until its
    /// subscription is forgotten). The common case, nobody waiting, costs
    /// no hashing.
    pub(crate) fn get(&self, resource: &[u8]) -> Option<&Waited> {
        if self.table.is_empty() {
            return None;
        }
        self.table.get(resource)
    }

    /// `resource`'s record, to change (see [`Room::get`]).
    pub(crate) fn get_mut(&mut self, resource: &[u8]) -> Option<&mut Waited> {
        self.table.get_mut(resource)
    }

    /// The waiter that races for `resource`.
    pub(crate) fn head(&self, resource: &[u8]) -> Option<usize> {
        self.get(resource)?.queue.head()
    }

    /// How many releases of `resource` were seen while someone waited.
    pub(crate) fn epoch(&self, resource: &[u8]) -> u64 {
        self.get(resource).map_or(0, |w| w.queue.epoch())
    }

    /// Waiter `waiter` waits for `resource`: it joins the queue, and the
    /// first waiter asks for the subscription.
    pub(crate) fn join(&mut self, resource: &Bytes, waiter: usize) {
        self.enter(resource).queue.join(waiter);
    }

    /// Waiter `waiter` waits for `resource` among others: it listens to
    /// its releases, subscribed as for [`Room::join`], but joins no queue.
    pub(crate) fn listen(&mut self, resource: &Bytes, waiter: usize) {
        self.enter(resource).queue.listen(waiter);
    }

    /// `resource`'s record, made if new, subscribed if it was not.
    fn enter(&mut self, resource: &Bytes) -> &mut Waited {
        let waited = self.table.entry(resource.clone()).or_default();
        if !std::mem::replace(&mut waited.subscribed, true) {
            self.subscribed += 1;
            self.changes.push_back(Change::Subscribe(resource.clone()));
        }
        waited
    }

    /// Waiter `waiter` stops listening to `resource`; the last one to go,
    /// with no queue and the lock not held here, unsubscribes.
    pub(crate) fn unlisten(&mut self, resource: &Bytes, waiter: usize) {
        let Some(waited) = self.table.get_mut(resource) else {
            return;
        };
        waited.queue.unlisten(waiter);
        if waited.is_lingering() && !waited.marks.is_held() {
            self.unsubscribe(resource);
        }
    }

    /// Waiter `waiter` stops waiting for `resource`. The last one
    /// unsubscribes, unless the lock is held here (see
    /// [`Room::handle_granted`]). Returns the new head of the queue when
    /// the head left.
    pub(crate) fn leave(&mut self, resource: &Bytes, waiter: usize) -> Option<usize> {
        let waited = self.table.get_mut(resource)?;
        let position = waited.queue.leave(waiter)?;
        if let Some(head) = waited.queue.head() {
            return Some(head).filter(|_| position == 0);
        }
        if waited.queue.is_empty() && !waited.marks.is_held() {
            self.unsubscribe(resource);
        }
        None
    }

    /// This client took the lock on `resource` (`token`), valid until
    /// `until`, while its callers listen for it: it is held here until let
    /// go through this client ([`Room::let_go`]), heard released, or that
    /// instant. Returns the row of hand-overs the lock goes on with, if
    /// this client handed the lock over since it last took it.
    pub(crate) fn handle_granted(
        &mut self,
        resource: &[u8],
        until: Instant,
        token: Token,
    ) -> Option<Cohort> {
        let waited = self.table.get_mut(resource)?;
        waited.marks.handle_granted(until, token);
        waited.turns.handle_taken(self.own);
        waited.row.handle_granted()
    }

    /// This client ended a row of hand-overs of the lock on `resource`
    /// with an announced release: whether other processes still compete
    /// for it is told by their releases heard from now on.
    pub(crate) fn handle_yield(&mut self, resource: &[u8]) {
        if let Some(waited) = self.table.get_mut(resource) {
            waited.row.handle_yield();
            self.contention_epoch += 1;
        }
    }

    /// Whether other processes compete for the lock on `resource`: one of
    /// their releases (or cleanups) was heard since this client last
    /// ended a row of hand-overs, or no row has ended yet.
    pub(crate) fn is_contended(&self, resource: &[u8]) -> bool {
        self.get(resource).is_none_or(|w| w.row.is_contended())
    }

    /// See `contention_epoch`.
    #[cfg(any(test, redlock_sim))]
    pub(crate) fn contention_epoch(&self) -> u64 {
        self.contention_epoch
    }

    /// Until when a lock on `resource` taken by a local waiter is held
    /// here, if one is at `now` and still subscribed to: a new local
    /// waiter waits for its release (handed over, or announced) rather
    /// than try.
    pub(crate) fn held_here(&self, resource: &[u8], now: Instant) -> Option<Instant> {
        let waited = self.get(resource)?;
        waited.marks.held_until(now).filter(|_| waited.subscribed)
    }

    /// The lock on `resource` is let go through this client (released,
    /// or handed over): it is no longer held here, and with nobody
    /// waiting the subscription ends, or is kept until `keep` (another
    /// process's turn).
    pub(crate) fn let_go(&mut self, resource: &Bytes, keep: Option<Instant>, now: Instant) {
        let Some(waited) = self.table.get_mut(resource) else {
            return;
        };
        waited.marks.let_go();
        if waited.is_lingering() {
            match keep.filter(|&until| until > now) {
                Some(until) => waited.marks.keep(until),
                None => self.unsubscribe(resource),
            }
        }
    }

    /// Ends the subscriptions kept with nobody waiting whose lock is no
    /// longer held here at `now` (heard released, or past its validity),
    /// nor kept for another process's turn.
    pub(crate) fn sweep(&mut self, now: Instant) {
        if self.subscribed == 0 {
            return;
        }
        let mut done = std::mem::take(&mut self.swept);
        done.extend(
            (self.table.iter())
                .filter(|(_, w)| w.is_lingering() && w.marks.kept_until().is_none_or(|t| t <= now))
                .map(|(resource, _)| resource.clone()),
        );
        for resource in done.drain(..) {
            self.unsubscribe(&resource);
        }
        self.swept = done;
    }

    /// When the next subscription kept with nobody waiting ends, unless
    /// its lock is let go before (see [`Room::sweep`]).
    pub(crate) fn next_sweep(&self) -> Option<Instant> {
        if self.subscribed == 0 {
            return None;
        }
        (self.table.values())
            .filter(|w| w.is_lingering())
            .filter_map(|w| w.marks.kept_until())
            .min()
    }

    /// Asks for `resource`'s subscription to end: nothing is held or kept
    /// for it any more. Its record stays until the engine forgets it.
    fn unsubscribe(&mut self, resource: &Bytes) {
        let Some(waited) = self.table.get_mut(resource) else {
            return;
        };
        if std::mem::take(&mut waited.subscribed) {
            self.subscribed -= 1;
        }
        waited.marks.clear();
        self.changes
            .push_back(Change::Unsubscribe(resource.clone()));
    }

    /// A lock on `resource` (`token`'s) was released through this client:
    /// its local waiters are woken without waiting for the masters'
    /// messages (each of which still counts: see [`Room::handle_message`]).
    /// It is no longer held here, unless another lock of this client's
    /// holds it now (the released one lapsed, its caller releasing it
    /// late): that one's mark stays.
    pub(crate) fn handle_released(&mut self, resource: &[u8], token: Token) {
        if self.table.is_empty() {
            return;
        }
        if let Some(waited) = self.table.get_mut(resource) {
            waited.marks.let_go_of(token);
            release(&mut self.notified, resource, &mut waited.queue);
        }
    }

    /// Whose turn it is to try for the lock on `resource`: the process
    /// the last release named, if it named one.
    pub(crate) fn turn(&self, resource: &[u8]) -> Turn {
        self.get(resource)
            .map_or(Turn::Open, |w| w.turns.turn(self.own))
    }

    /// When the turn of the process the last release of the lock on
    /// `resource` named began here, if that is another process
    /// ([`Turn::Theirs`]).
    pub(crate) fn theirs_since(&self, resource: &[u8]) -> Option<Instant> {
        self.get(resource)?.turns.theirs_since(self.own)
    }

    /// This client releases the lock on `resource` (`token`), announced:
    /// the process to try next, which the release names to every process
    /// (see [`Turns::name_next`]); none (0) when nobody waits for it here.
    pub(crate) fn name_next(&mut self, resource: &[u8], token: Token, waiting_here: bool) -> i64 {
        let own = self.own;
        self.table
            .get_mut(resource)
            .map_or(0, |w| w.turns.name_next(token, own, waiting_here))
    }

    /// The next resource released since the last call.
    pub(crate) fn poll_notified(&mut self) -> Option<Bytes> {
        let resource = self.notified.pop_front()?;
        if let Some(waited) = self.table.get_mut(&resource) {
            waited.queue.handle_polled();
        }
        Some(resource)
    }

    /// The next subscription to change, for the engine.
    pub(crate) fn poll_change(&mut self) -> Option<Change> {
        self.changes.pop_front()
    }

    /// A message on `resource`'s release channel, with `payload`: a
    /// refused attempt's notice seats its process in the turns; a release
    /// (or one this client cannot read) is counted, tells of another
    /// process competing unless this client minted it, clears the mark of
    /// the lock held here that it released, and wakes the waiters, unless
    /// it is this client's own cleanup.
    pub(crate) fn handle_message(&mut self, resource: &[u8], payload: &[u8]) {
        let own = self.own;
        let Some(waited) = self.table.get_mut(resource) else {
            return;
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
            // A process was refused: it waits for this lock too, and gets
            // a seat in the turns. Nothing was freed.
            if let Some(t) = token {
                if let Some(id) = process_id(&t) {
                    waited.turns.handle_notice(id, own);
                }
                if !own.minted(&t) && !crate::knobs::injected(crate::knobs::Bug::ContentionUnheard)
                {
                    waited.row.handle_contender();
                    self.contention_epoch += 1;
                }
            }
            return;
        }
        // Another client's release, or its cleanup after a race: another
        // process competes for this lock.
        let ours = token.is_some_and(|t| own.minted(&t));
        // The release of a lock of this client's that another of its locks
        // has replaced here freed nothing a waiter could take: a master's
        // own compare-and-delete is followed by its message whatever it
        // found (the script sends none unless it deleted the key).
        if let Some(t) = token
            && ours
            && !waited.marks.is_current(t)
        {
            return;
        }
        if let Some(t) = token
            && waited.queue.wakes(token)
        {
            waited.turns.count_release(t, named, own);
        }
        waited.queue.handle_heard(token);
        if !ours && !crate::knobs::injected(crate::knobs::Bug::ContentionUnheard) {
            waited.row.handle_contender();
            self.contention_epoch += 1;
        }
        if crate::knobs::injected(crate::knobs::Bug::ReleaseNoticeDropped) {
            return;
        }
        // Every master's message counts, those of one release included: a
        // release reaches the masters one by one, and a waiter woken by
        // the first may try before the others have freed the lock, and be
        // refused there. Only the later masters' messages can then tell it
        // to try again (counted once per release, they were dropped, and
        // the waiter waited for the holder's expiry).
        if waited.queue.wakes(token) {
            // No longer held here, if it was: the lingering subscription
            // ends at the next sweep.
            waited.marks.handle_heard(token, ours);
            release(&mut self.notified, resource, &mut waited.queue);
        }
    }

    /// `resource`'s subscription was made again on a new connection and
    /// confirmed: a release may have been missed, and counts as one.
    pub(crate) fn handle_renewed(&mut self, resource: &[u8]) {
        if let Some(waited) = self.table.get_mut(resource) {
            release(&mut self.notified, resource, &mut waited.queue);
        }
    }

    /// The engine forgot `resource`'s subscription (unsubscribed and
    /// confirmed, or its connections dropped with nothing subscribed):
    /// its record goes.
    pub(crate) fn handle_forgotten(&mut self, resource: &[u8]) {
        // Subscribed again meanwhile (a waiter came back before the hub
        // moved this in): the record stays, its new subscription asked.
        if self.table.get(resource).is_some_and(|w| !w.subscribed) {
            self.table.remove(resource);
            self.contention_epoch += 1;
        }
    }

    /// How many resources have a record.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// Moves `queue`'s epoch on for a release and queues `resource` for
/// [`Room::poll_notified`], once.
fn release(notified: &mut VecDeque<Bytes>, resource: &[u8], queue: &mut Queue) {
    if queue.release() {
        notified.push_back(Bytes::copy_from_slice(resource));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::token::TokenSource;

    const R: &[u8] = b"orders:42";

    fn resource() -> Bytes {
        Bytes::from_static(R)
    }

    /// The changes `room` asks for, in order.
    fn changes(room: &mut Room) -> Vec<Change> {
        std::iter::from_fn(|| room.poll_change()).collect()
    }

    fn subscribed() -> Vec<Change> {
        vec![Change::Subscribe(resource())]
    }

    fn unsubscribed() -> Vec<Change> {
        vec![Change::Unsubscribe(resource())]
    }

    /// A room that knows its client's tokens (the source it mints them
    /// from).
    fn own_room() -> (Room, TokenSource) {
        let mut room = Room::default();
        let ours = TokenSource::from_seed([1; 16]);
        room.know_own_tokens(ours.prefix());
        (room, ours)
    }

    /// [`own_room`] with waiter 7 in `R`'s queue.
    fn waiting_room() -> (Room, TokenSource) {
        let (mut room, ours) = own_room();
        room.join(&resource(), 7);
        assert_eq!(changes(&mut room), subscribed());
        (room, ours)
    }

    #[test]
    fn the_first_waiter_subscribes_the_last_unsubscribes_and_the_record_goes_once_forgotten() {
        let mut room = Room::default();
        room.join(&resource(), 7);
        room.join(&resource(), 9);
        assert_eq!(changes(&mut room), subscribed(), "asked once");
        assert_eq!(room.head(R), Some(7));
        // The head leaves: the next one races.
        assert_eq!(room.leave(&resource(), 7), Some(9));
        assert!(changes(&mut room).is_empty());
        assert_eq!(room.leave(&resource(), 9), None);
        assert_eq!(changes(&mut room), unsubscribed());
        assert_eq!(room.len(), 1, "kept until the engine forgets it");
        room.handle_forgotten(R);
        assert_eq!(room.len(), 0);
        // A waiter coming back before that subscribes again.
        room.join(&resource(), 3);
        room.leave(&resource(), 3);
        room.join(&resource(), 4);
        assert_eq!(
            changes(&mut room),
            [subscribed(), unsubscribed(), subscribed()].concat()
        );
    }

    #[test]
    fn a_listener_is_no_head_and_keeps_the_subscription_until_the_last_one_goes() {
        let mut room = Room::default();
        room.listen(&resource(), 4);
        assert_eq!(changes(&mut room), subscribed());
        assert_eq!(room.head(R), None, "a listener races nobody's turn");
        room.join(&resource(), 7);
        assert_eq!(room.leave(&resource(), 7), None);
        assert!(changes(&mut room).is_empty(), "still listened to");
        // A release is queued once, for the head and the listeners alike.
        let token = TokenSource::from_seed([2; 16]).next_token();
        room.handle_released(R, token);
        assert_eq!(room.poll_notified().as_deref(), Some(R));
        assert_eq!(room.epoch(R), 1);
        room.unlisten(&resource(), 4);
        assert_eq!(changes(&mut room), unsubscribed());
    }

    #[test]
    fn a_lock_let_go_for_another_process_turn_keeps_the_subscription_until_the_turn_is_over() {
        let now = Instant::now();
        let valid = now + Duration::from_secs(2);
        let turn = now + Duration::from_millis(4);
        let (mut room, mut ours) = waiting_room();
        room.handle_granted(R, valid, ours.next_token());
        assert_eq!(room.leave(&resource(), 7), None);
        room.let_go(&resource(), Some(turn), now);
        assert!(changes(&mut room).is_empty(), "kept");
        assert_eq!(room.held_here(R, now), None);
        assert_eq!(room.next_sweep(), Some(turn));
        room.sweep(turn - Duration::from_micros(1));
        assert!(changes(&mut room).is_empty(), "kept");
        room.sweep(turn);
        assert_eq!(changes(&mut room), unsubscribed());
        assert_eq!(room.next_sweep(), None);
    }

    #[test]
    fn a_lock_a_waiter_took_keeps_the_subscription_until_let_go_heard_released_or_no_longer_valid()
    {
        let now = Instant::now();
        let valid = now + Duration::from_secs(2);
        let (mut room, mut ours) = waiting_room();
        // Let go through this client.
        room.handle_granted(R, valid, ours.next_token());
        assert_eq!(room.leave(&resource(), 7), None);
        assert!(changes(&mut room).is_empty(), "kept");
        assert_eq!(room.held_here(R, now), Some(valid));
        room.let_go(&resource(), None, now);
        assert_eq!(changes(&mut room), unsubscribed());
        assert_eq!(room.held_here(R, now), None);
        room.handle_forgotten(R);
        // Heard released: ended at the next sweep.
        room.join(&resource(), 8);
        assert_eq!(changes(&mut room), subscribed());
        let earlier = ours.next_token();
        let held = ours.next_token();
        room.handle_granted(R, valid, held);
        assert_eq!(room.leave(&resource(), 8), None);
        assert_eq!(room.next_sweep(), Some(valid));
        // A slower master's message of an earlier release of this client's
        // says nothing of the lock held here.
        room.handle_message(R, earlier.as_bytes());
        assert_eq!(room.held_here(R, now), Some(valid));
        // Its own release heard, or another client's (it no longer holds).
        for token in [held, TokenSource::from_seed([3; 16]).next_token()] {
            room.handle_granted(R, valid, held);
            room.handle_message(R, token.as_bytes());
            assert_eq!(room.held_here(R, now), None);
        }
        room.sweep(now);
        assert_eq!(changes(&mut room), unsubscribed());
        room.handle_forgotten(R);
        // Never let go: ended once no longer valid, not before.
        room.join(&resource(), 9);
        assert_eq!(changes(&mut room), subscribed());
        room.handle_granted(R, valid, ours.next_token());
        assert_eq!(room.leave(&resource(), 9), None);
        room.sweep(now);
        assert!(changes(&mut room).is_empty(), "still valid");
        assert_eq!(room.held_here(R, valid), None);
        room.sweep(valid);
        assert_eq!(changes(&mut room), unsubscribed());
    }

    #[test]
    fn a_lock_taken_with_nobody_listening_is_marked_nowhere() {
        let now = Instant::now();
        let (mut room, mut ours) = own_room();
        let token = ours.next_token();
        assert_eq!(room.handle_granted(R, now, token), None);
        assert_eq!(room.held_here(R, now), None);
        assert!(room.get(R).is_none_or(|w| w.marks.is_current(token)));
        assert!(room.is_contended(R), "no row has ended here");
    }

    #[test]
    fn every_masters_message_of_a_release_counts_and_a_cleanups_none() {
        let mut room = Room::default();
        room.join(&resource(), 1);
        let mut tokens = TokenSource::from_seed([1; 16]);
        let (local, remote, cleanup) = (
            tokens.next_token(),
            tokens.next_token(),
            tokens.next_token(),
        );
        room.handle_released(R, local);
        assert_eq!(room.epoch(R), 1);
        // The release reaches the masters one by one: a waiter that tried
        // after the first must hear of each later one.
        for n in 0..3 {
            room.handle_message(R, local.as_bytes());
            assert_eq!(room.epoch(R), 2 + n);
        }
        for _ in 0..3 {
            room.handle_message(R, remote.as_bytes());
        }
        assert_eq!(room.epoch(R), 7);
        // A waiter's own cleanup frees only what its attempt took.
        if let Some(waited) = room.get_mut(R) {
            waited.queue.handle_cleanup(cleanup);
        }
        for _ in 0..3 {
            room.handle_message(R, cleanup.as_bytes());
        }
        assert_eq!(room.epoch(R), 7);
        // A subscription renewed counts as a release; garbage wakes too
        // (the key may be free).
        room.handle_renewed(R);
        room.handle_message(R, b"");
        assert_eq!(room.epoch(R), 9);
        // Queued once, however many releases came; nothing for others.
        room.handle_message(b"other", remote.as_bytes());
        assert_eq!(room.poll_notified().as_deref(), Some(R));
        assert_eq!(room.poll_notified(), None);
        assert_eq!(room.len(), 1);
    }

    #[test]
    fn another_clients_release_heard_since_the_last_row_ended_makes_the_lock_contended() {
        let (mut room, mut ours) = waiting_room();
        let mut theirs = TokenSource::from_seed([2; 16]);
        assert!(room.is_contended(R), "a new record: taken to be contended");
        room.handle_yield(R);
        assert!(!room.is_contended(R));
        let (yielded, cleanup) = (ours.next_token(), ours.next_token());
        if let Some(waited) = room.get_mut(R) {
            waited.queue.handle_cleanup(cleanup);
        }
        room.handle_message(R, yielded.as_bytes());
        room.handle_message(R, cleanup.as_bytes());
        assert!(!room.is_contended(R), "this client's own releases");
        let epoch = room.contention_epoch();
        room.handle_message(R, theirs.next_token().as_bytes());
        assert!(room.is_contended(R));
        assert!(room.contention_epoch() > epoch);
        room.handle_yield(R);
        // Another client's notice, or a message whose payload is no token.
        room.handle_message(R, format!("?{}", theirs.next_token().as_str()).as_bytes());
        assert!(room.is_contended(R));
        room.handle_yield(R);
        room.handle_message(R, b"");
        assert!(room.is_contended(R));
        // A record forgotten: contended again, as a new one. Not while it
        // is subscribed (asked again before the hub moved the news in).
        room.handle_yield(R);
        room.handle_forgotten(R);
        assert!(!room.is_contended(R), "still waited for: kept");
        assert_eq!(room.leave(&resource(), 7), None);
        let epoch = room.contention_epoch();
        room.handle_forgotten(R);
        assert!(room.is_contended(R));
        assert!(room.contention_epoch() > epoch);
    }

    #[test]
    fn a_refusal_seats_its_process_and_frees_nothing_and_a_release_names_it() {
        let now = Instant::now();
        let (mut room, mut ours) = waiting_room();
        let mut a = TokenSource::from_seed([2; 16]);
        let a_id = process_id(&a.next_token()).unwrap();
        assert_eq!(room.turn(R), Turn::Open);
        assert!(room.get(R).is_some_and(|w| w.turns.needs_notice()));
        room.handle_message(R, format!("?{}", a.next_token().as_str()).as_bytes());
        assert_eq!(room.epoch(R), 0, "a refusal frees nothing");
        assert_eq!(room.poll_notified(), None);
        assert_eq!(room.name_next(R, ours.next_token(), true), a_id);
        assert_eq!(room.turn(R), Turn::Theirs);
        if let Some(waited) = room.get_mut(R) {
            waited.turns.handle_began(now);
        }
        assert_eq!(room.theirs_since(R), Some(now));
        // A never came: this client took the lock again after its wait.
        room.handle_granted(R, now, ours.next_token());
        assert_eq!(room.turn(R), Turn::Open);
        assert_eq!(room.name_next(R, ours.next_token(), false), 0);
        // Nothing waited for: nobody named, nobody's turn.
        assert_eq!(room.name_next(b"other", ours.next_token(), true), 0);
        assert_eq!(room.turn(b"other"), Turn::Open);
        assert_eq!(room.theirs_since(b"other"), None);
    }

    #[test]
    fn a_new_record_waits_for_nobody_and_takes_others_to_compete() {
        let mut waited = Waited::default();
        assert!(waited.queue.is_empty());
        assert!(!waited.is_lingering(), "not subscribed");
        assert!(
            waited.row.is_contended(),
            "until a row ends with nobody else heard"
        );
        waited.subscribed = true;
        assert!(waited.is_lingering(), "subscribed with nobody waiting");
        waited.queue.listen(4);
        assert!(!waited.queue.is_empty());
        assert!(!waited.is_lingering());
    }

    #[test]
    fn only_the_lock_held_here_lets_go_of_it_not_an_earlier_one_released_late() {
        let now = Instant::now();
        let valid = now + Duration::from_secs(2);
        let (mut room, mut ours) = own_room();
        let is_current = |room: &Room, token| room.get(R).is_none_or(|w| w.marks.is_current(token));
        // Nothing marked: any release of this client's lets go.
        let lapsed = ours.next_token();
        assert!(is_current(&room, lapsed));
        room.join(&resource(), 7);
        let held = ours.next_token();
        room.handle_granted(R, valid, held);
        // An earlier lock of this client's on the same resource, lapsed
        // and released late by its caller, is not the one held here.
        assert!(!is_current(&room, lapsed));
        assert!(is_current(&room, held));
        // A master's message of that late release freed nothing a waiter
        // could take (a master's own compare-and-delete publishes whatever
        // it found): it wakes nobody and leaves the mark.
        let epoch = room.epoch(R);
        room.handle_message(R, lapsed.as_bytes());
        assert_eq!(room.epoch(R), epoch);
        assert_eq!(room.held_here(R, now), Some(valid));
        // Nor once another client's message cleared the held-here mark
        // (its key deleted on a master this client's lock did not hold):
        // seed 53,920 of the simulator, five clients and five masters.
        let mut theirs = TokenSource::from_seed([2; 16]);
        room.handle_message(R, theirs.next_token().as_bytes());
        assert_eq!(room.held_here(R, now), None, "the mark cleared");
        assert!(!is_current(&room, lapsed));
        assert!(is_current(&room, held));
    }

    #[test]
    fn the_lock_taken_here_after_a_hand_over_goes_on_with_its_row_whoever_took_it() {
        let now = Instant::now();
        let valid = now + Duration::from_secs(2);
        let (mut room, mut ours) = waiting_room();
        let hand_over = |room: &mut Room, next| {
            if let Some(waited) = room.get_mut(R) {
                waited.row.handle_handed_over(next);
            }
        };
        // Taken with no hand-over before it: a row of its own.
        assert_eq!(room.handle_granted(R, valid, ours.next_token()), None);
        let next = Cohort { row: 2, since: now };
        hand_over(&mut room, next);
        // The next lock taken here goes on with the row, once: a caller's
        // attempt that happened to leave right behind the release, not
        // the head's it was handed to (seed 110,847 of the simulator,
        // 120 operations per client).
        assert_eq!(room.handle_granted(R, valid, ours.next_token()), Some(next));
        assert_eq!(room.handle_granted(R, valid, ours.next_token()), None);
        // A row ended with an announced release goes on with nobody.
        hand_over(&mut room, next);
        room.handle_yield(R);
        assert_eq!(room.handle_granted(R, valid, ours.next_token()), None);
    }

    #[test]
    fn messages_nobody_waits_for_are_dropped_and_a_flood_is_bounded() {
        let mut room = Room::default();
        room.join(&resource(), 1);
        let mut tokens = TokenSource::from_seed([2; 16]);
        for i in 0..100_000u32 {
            let token = tokens.next_token();
            let other = format!("other:{i}");
            room.handle_message(other.as_bytes(), token.as_bytes());
            room.handle_message(R, token.as_bytes());
            // Garbage in the payload still wakes: the key may be free.
            room.handle_message(R, i.to_string().as_bytes());
        }
        assert_eq!(room.len(), 1, "only the resource waited for is kept");
        assert_eq!(room.epoch(R), 200_000);
        assert_eq!(room.notified.len(), 1, "queued once however many");
        assert_eq!(room.epoch(b"other:1"), 0);
    }
}
