//! Turns across processes at one resource's lock: the processes heard
//! waiting for it (seated by their refused attempts' notices), the
//! releases counted, the process the last one named to try next, and
//! when that turn began. Every process reads the same turn from a
//! release's message, so one releaser decides. Also what such a message
//! says ([`Message`]) and which process minted a token ([`process_id`],
//! [`Own`]). Nothing here knows of local waiters or subscriptions.

use std::time::Instant;

use crate::script::WAITING_MARK;
use crate::token::Token;

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

impl Turn {
    /// Whose turn a release naming `named` gave, for this client `own`.
    fn named(named: Option<i64>, own: Own) -> Turn {
        match (named, own.id) {
            (Some(named), Some(own)) if named == own => Turn::Mine,
            (Some(_), _) => Turn::Theirs,
            (None, _) => Turn::Open,
        }
    }
}

/// This client as messages tell it: the prefix of every token it mints
/// (see [`TokenSource::prefix`](crate::token::TokenSource::prefix)) and
/// its process id. Unknown until told: every message is then another's.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Own {
    prefix: Option<[u8; 32]>,
    id: Option<i64>,
}

impl Own {
    /// The client whose tokens start with `prefix`.
    pub(crate) fn new(prefix: [u8; 32]) -> Own {
        Own {
            prefix: Some(prefix),
            id: prefix_id(&prefix),
        }
    }

    /// Whether this client minted `token`.
    pub(crate) fn minted(self, token: &Token) -> bool {
        self.prefix.is_some_and(|p| token.has_prefix(&p))
    }
}

/// A process heard waiting for a lock: its id (see [`process_id`]), and
/// when it last released the lock (the count of releases then; 0 for
/// never).
#[derive(Debug, Clone, Copy)]
struct Seat {
    id: i64,
    served: u64,
}

/// The most processes a resource keeps turns for.
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

/// One resource's turns across processes.
#[derive(Debug, Default)]
pub(crate) struct Turns {
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
    /// [`Turns::theirs_since`]).
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

    /// A refused attempt's notice of process `id`: it waits, and gets a
    /// seat; this client's own notice heard, it knows itself seated.
    pub(crate) fn handle_notice(&mut self, id: i64, own: Own) {
        self.seat(id);
        if Some(id) == own.id {
            self.seated = Some(self.count);
        }
    }

    /// A release of `token`'s naming `named` to try next: counted once
    /// however many masters tell of it (and told here first, for one of
    /// this client's).
    pub(crate) fn count_release(&mut self, token: Token, named: Option<i64>, own: Own) {
        if self.counted.contains(&Some(token)) {
            return;
        }
        self.counted = [Some(token), self.counted[0]];
        self.named = named;
        if named.is_some() && named == own.id {
            self.seated = Some(self.count + 1);
        }
        let Some(by) = process_id(&token) else {
            return;
        };
        self.count += 1;
        self.seat(by).served = self.count;
    }

    /// This client took the lock: a process the last release named that
    /// did not come for its turn loses its seat (it is seated again if it
    /// still waits, by its next refusal).
    pub(crate) fn handle_taken(&mut self, own: Own) {
        if let Some(named) = self.named.take()
            && Some(named) != own.id
        {
            self.seats.retain(|s| s.id != named);
        }
    }

    /// Whose turn it is: the process the last release named, if any.
    pub(crate) fn turn(&self, own: Own) -> Turn {
        Turn::named(self.named, own)
    }

    /// The last release was made or heard here at `now`, unless it was
    /// already: the turn it named began then.
    pub(crate) fn handle_began(&mut self, now: Instant) {
        if self.turn_began.is_none_or(|(count, _)| count != self.count) {
            self.turn_began = Some((self.count, now));
        }
    }

    /// When the turn the last release gave began here, if that turn is
    /// another process's ([`Turn::Theirs`]).
    pub(crate) fn theirs_since(&self, own: Own) -> Option<Instant> {
        if self.turn(own) != Turn::Theirs {
            return None;
        }
        self.began()
    }

    /// When the turn the last release counted named began here, if it is
    /// known.
    fn began(&self) -> Option<Instant> {
        self.turn_began
            .filter(|&(count, _)| count == self.count)
            .map(|(_, at)| at)
    }

    /// Whether this client's refused attempts should publish the notice
    /// that it waits: unless its own notice was heard, or a release named
    /// it, within the last round of turns (as many releases as seats, and
    /// one more). Not told otherwise when another client unseats it (it
    /// did not come when named), it then sends the notice again once a
    /// round of turns has passed it by.
    pub(crate) fn needs_notice(&self) -> bool {
        let round = u64::try_from(self.seats.len()).unwrap_or(u64::MAX) + 1;
        self.seated
            .is_none_or(|at| self.count.saturating_sub(at) > round)
    }

    /// This client releases the lock (`token`), announced: the process to
    /// try next, which the release names to every process. The seat
    /// served longest ago, this client's aside; this client itself when
    /// no other waits and `waiting_here`; else none (0).
    pub(crate) fn name_next(&mut self, token: Token, own: Own, waiting_here: bool) -> i64 {
        let next = self.next(own, waiting_here);
        self.count_release(token, next, own);
        next.unwrap_or(0)
    }

    /// The process a release should name to try next: the seat served
    /// longest ago, `own` aside; `own` when no other waits and
    /// `waiting_here`; else none.
    fn next(&self, own: Own, waiting_here: bool) -> Option<i64> {
        (self.seats.iter())
            .filter(|s| Some(s.id) != own.id)
            .min_by_key(|s| (s.served, s.id))
            .map(|s| s.id)
            .or(own.id.filter(|_| waiting_here))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::token::TokenSource;

    /// A process minting tokens, and its id.
    fn process(seed: u8) -> (TokenSource, i64) {
        let mut tokens = TokenSource::from_seed([seed; 16]);
        let id = process_id(&tokens.next_token()).unwrap();
        (tokens, id)
    }

    #[test]
    fn a_release_names_the_seat_served_longest_ago_and_every_process_reads_the_same_turn() {
        let (mut ours, own_id) = process(1);
        let own = Own::new(ours.prefix());
        let ((mut a, a_id), (mut b, b_id)) = (process(2), process(3));
        let mut turns = Turns::default();
        assert_eq!(turns.turn(own), Turn::Open, "no release named anyone");
        turns.count_release(b.next_token(), None, own);
        turns.handle_notice(a_id, own);
        assert_eq!(turns.name_next(ours.next_token(), own, true), a_id);
        assert_eq!(turns.turn(own), Turn::Theirs);
        // A's release names B; B's names this client, however many
        // masters tell of it.
        turns.count_release(a.next_token(), Some(b_id), own);
        assert_eq!(turns.turn(own), Turn::Theirs);
        let token = b.next_token();
        for _ in 0..3 {
            turns.count_release(token, Some(own_id), own);
            assert_eq!(turns.turn(own), Turn::Mine);
        }
        turns.count_release(a.next_token(), None, own);
        assert_eq!(turns.turn(own), Turn::Open);
        // Another client, reading the same messages, reads the same turns.
        let other = Own::new(a.prefix());
        assert_eq!(turns.turn(other), Turn::Open);
    }

    #[test]
    fn another_process_turn_begins_once_per_release() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let (mut ours, _) = process(1);
        let own = Own::new(ours.prefix());
        let (_, a_id) = process(2);
        let mut turns = Turns::default();
        turns.handle_began(now);
        assert_eq!(turns.theirs_since(own), None, "nobody's turn");
        turns.handle_notice(a_id, own);
        assert_eq!(turns.name_next(ours.next_token(), own, true), a_id);
        turns.handle_began(now);
        turns.handle_began(now + ms(1));
        assert_eq!(turns.theirs_since(own), Some(now));
        assert_eq!(turns.name_next(ours.next_token(), own, true), a_id);
        assert_eq!(turns.theirs_since(own), None, "not told when yet");
        turns.handle_began(now + ms(9));
        assert_eq!(turns.theirs_since(own), Some(now + ms(9)));
    }

    #[test]
    fn a_process_named_that_does_not_come_loses_its_seat_and_a_lone_waiter_is_named() {
        let (mut ours, own_id) = process(1);
        let own = Own::new(ours.prefix());
        let (mut a, a_id) = process(2);
        let mut turns = Turns::default();
        assert!(turns.needs_notice());
        turns.handle_notice(own_id, own);
        assert!(!turns.needs_notice(), "its own notice heard");
        assert_eq!(turns.name_next(ours.next_token(), own, true), own_id);
        assert_eq!(turns.name_next(ours.next_token(), own, false), 0);
        turns.handle_notice(a_id, own);
        assert_eq!(turns.name_next(ours.next_token(), own, true), a_id);
        // Releases that pass this client by make it tell the others again.
        for _ in 0..3 {
            turns.count_release(a.next_token(), None, own);
        }
        assert!(turns.needs_notice());
        turns.count_release(a.next_token(), Some(own_id), own);
        assert!(!turns.needs_notice(), "named: seated, as far as it knows");
        assert_eq!(turns.name_next(ours.next_token(), own, true), a_id);
        // A never came: this client took the lock after its wait.
        turns.handle_taken(own);
        assert_eq!(turns.name_next(ours.next_token(), own, true), own_id);
    }

    #[test]
    fn at_most_sixteen_processes_are_seated_the_one_served_last_going_first() {
        let own = Own::default();
        let mut turns = Turns::default();
        let mut sources: Vec<(TokenSource, i64)> = (2..20).map(process).collect();
        for (_, id) in &sources {
            turns.handle_notice(*id, own);
        }
        assert_eq!(turns.seats.len(), MAX_SEATS);
        let token = sources[17].0.next_token();
        turns.count_release(token, None, own);
        assert_eq!(turns.seats.len(), MAX_SEATS);
        assert!(turns.seats.iter().any(|s| s.id == sources[17].1));
    }

    #[test]
    fn messages_read_as_releases_naming_a_process_or_notices_and_tokens_name_their_process() {
        // (payload, a notice, the token read, the process named)
        type Case = (&'static [u8], bool, &'static [u8], Option<i64>);
        let cases: [Case; 5] = [
            (b"abc", false, b"abc", None),
            (b"abc:42", false, b"abc", Some(42)),
            (b"abc:0", false, b"abc", None),
            (b"?abc", true, b"abc", None),
            (b"", false, b"", None),
        ];
        for (payload, waiting, token, named) in cases {
            let message = Message::read(payload);
            assert_eq!(
                (message.waiting, message.token, message.named),
                (waiting, token, named)
            );
        }
        assert_eq!(
            process_id(&Token::parse("0000000000000000ffffffffffffffffffffffffffffffff").unwrap()),
            None
        );
        assert_eq!(process_id(&Token::parse("short").unwrap()), None);
        assert_eq!(process_id(&Token::parse(&"g".repeat(48)).unwrap()), None);
    }

    #[test]
    fn turns_seat_each_process_once_count_each_release_once_and_name_the_longest_unserved() {
        let mut a = TokenSource::from_seed([1; 16]);
        let mut b = TokenSource::from_seed([2; 16]);
        let (id_a, id_b) = (
            process_id(&a.next_token()).unwrap(),
            process_id(&b.next_token()).unwrap(),
        );
        let own_a = Own::new(a.prefix());
        let mut turns = Turns::default();
        assert!(turns.needs_notice(), "never heard: not seated");
        turns.seat(id_a);
        turns.seat(id_b);
        turns.seat(id_a);
        assert_eq!(turns.seats.len(), 2, "one seat a process");
        // B releases, naming A; each master's message of it counts once.
        let released = b.next_token();
        for _ in 0..3 {
            turns.count_release(released, Some(id_a), own_a);
        }
        assert_eq!((turns.count, turns.named), (1, Some(id_a)));
        assert_eq!(turns.seated, Some(1), "named: A knows itself seated");
        assert!(!turns.needs_notice());
        // A has never released: it goes first, unless it is the releaser.
        assert_eq!(turns.next(Own::default(), false), Some(id_a));
        assert_eq!(turns.next(own_a, false), Some(id_b));
        // Alone, a releaser names itself only with a caller waiting.
        let mut alone = Turns::default();
        alone.seat(id_a);
        assert_eq!(alone.next(own_a, false), None);
        assert_eq!(alone.next(own_a, true), Some(id_a));
        // A round of turns past its seat, a process asks again.
        for _ in 0..4 {
            turns.count_release(b.next_token(), None, own_a);
        }
        assert!(turns.needs_notice());
        // The turn began when first made or heard, for the last release.
        let now = Instant::now();
        assert_eq!(turns.began(), None);
        turns.turn_began = Some((turns.count, now));
        assert_eq!(turns.began(), Some(now));
        turns.count_release(b.next_token(), None, Own::default());
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
}
