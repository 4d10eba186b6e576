//! One round over N masters: the votes, the quorum decision, and the
//! validity arithmetic.
//!
//! A [`Round`] turns each master's reply to each of its requests into a
//! [`Vote`], and decides each request as soon as the outcome is known: `Q`
//! grants, or so many refusals and failures that `Q` is out of reach.
//! [`Validity::compute`] is the spec's `ttl - elapsed - drift`, and
//! [`plan_fence`] decides a fenced acquire's fence from what the masters
//! reported. Nothing here does I/O, reads a clock or touches the wire: the
//! [`Engine`](crate::engine::Engine) sends the requests and routes replies
//! to their round, and passes `now`.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::conn::{Cause, Conn, Op, Request};
use crate::resp::Reply;

/// The quorum for `n` masters: `n / 2 + 1`.
pub(crate) fn quorum(n: usize) -> usize {
    if crate::knobs::injected(crate::knobs::Bug::QuorumOffByOne) {
        return (n / 2).max(1);
    }
    n / 2 + 1
}

/// One master's answer in a round.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Vote {
    /// No answer yet; after a decision, the master had not answered when the
    /// outcome was already known.
    Pending,
    /// `+OK` to SET NX, or 1 from the release or extend script.
    Granted,
    /// The key is held by another token: a null reply to SET NX, or 0 from a
    /// script (for a release or an extend by script: not this token's,
    /// another's or gone, which the script does not tell apart).
    Refused,
    /// An extend found the key gone: a nil from the master's own
    /// compare-and-set (`SET ... IFEQ ... GET`), which, unlike the script,
    /// tells a key that expired or was deleted from one another token
    /// holds ([`Vote::Refused`]). Counted as a refusal.
    Gone,
    /// No usable answer.
    Failed(Cause),
}

/// The outcome of a round, decided as soon as it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Decision {
    /// At least `Q` masters granted.
    Won,
    /// Fewer than `Q` masters can grant.
    Lost,
}

/// Why a lost round was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// Enough masters answered, but too many refused: the key holds
    /// another token there.
    Refused,
    /// More than `N - Q` masters failed to answer usably.
    Unreachable,
    /// As `Unreachable`, and at least one failure was a protocol violation.
    Protocol,
}

/// The lock validity left after a successful round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Validity {
    /// `ttl - elapsed - drift`.
    pub(crate) remaining: Duration,
    /// `now + remaining`: the instant mutual exclusion ends.
    pub(crate) deadline: Instant,
}

impl Validity {
    /// `ttl - drift`: how long after a round's start keys it set or
    /// extended with `ttl` surely still stand, whatever the round's outcome.
    /// `None` when the drift allowance takes it all.
    pub(crate) fn span(ttl: Duration, drift_factor: f64) -> Option<Duration> {
        let factor = if (0.0..1.0).contains(&drift_factor) {
            drift_factor
        } else {
            1.0
        };
        let scaled = Duration::try_from_secs_f64(ttl.as_secs_f64() * factor).unwrap_or(ttl);
        let drift = scaled.checked_add(Duration::from_millis(2))?;
        if crate::knobs::injected(crate::knobs::Bug::DriftDropped) {
            return Some(ttl);
        }
        ttl.checked_sub(drift).filter(|span| !span.is_zero())
    }

    /// The spec's rule: `drift = ttl * drift_factor + 2 ms`, and the lock is
    /// valid for `ttl - (now - started) - drift` from `now`. `None` when
    /// nothing is left. `drift_factor` outside `[0, 1)` counts as 1.
    #[cfg(test)]
    pub(crate) fn compute(
        ttl: Duration,
        started: Instant,
        now: Instant,
        drift_factor: f64,
    ) -> Option<Validity> {
        let elapsed = now.saturating_duration_since(started);
        let remaining = Validity::span(ttl, drift_factor)?.checked_sub(elapsed)?;
        if remaining.is_zero() {
            return None;
        }
        let deadline = now.checked_add(remaining)?;
        Some(Validity {
            remaining,
            deadline,
        })
    }
}

/// Who holds the key on one master that refused an attempt and said so
/// (an [`Op::tells_holder`] refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    /// A hash of the key's value ([`holder_id`]), 0 when unknown.
    id: u64,
    /// The value carries this client's token prefix: one of its own locks.
    own: bool,
}

const UNKNOWN: Holder = Holder { id: 0, own: false };

/// The votes one request (one slot of a round) collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tally {
    granted: usize,
    refused: usize,
    failed: usize,
    decided_at: Option<Instant>,
}

const EMPTY: Tally = Tally {
    granted: 0,
    refused: 0,
    failed: 0,
    decided_at: None,
};

/// K requests (slots) sent to every master in one pass, and the votes they
/// collect: one quorum decision per slot. A single operation is a round of
/// one slot; a batch puts K pipelined commands in one write per master.
/// The [`Engine`](crate::engine::Engine) keeps many rounds at once and
/// routes each reply to its round; a round is reused from operation to
/// operation, so that a steady-state round allocates nothing.
#[derive(Debug)]
pub(crate) struct Round {
    /// Each slot's operation.
    ops: Vec<Op>,
    n: usize,
    quorum: usize,
    started: Instant,
    deadline: Instant,
    /// `votes[slot * n + master]`.
    votes: Vec<Vote>,
    /// The integer each master replied, where it replied one, laid out as
    /// `votes`.
    values: Vec<Option<i64>>,
    /// What each master reported in phase one of a fenced acquire, laid
    /// out as `votes`.
    reads: Vec<Option<FenceRead>>,
    /// Who holds the key where a waiting attempt was refused, laid out as
    /// `votes`.
    holders: Vec<Holder>,
    /// The prefix of this client's tokens (see
    /// [`TokenSource::prefix`](crate::token::TokenSource::prefix)), when
    /// the round knows it: a holder whose value starts with it is one of
    /// this client's locks.
    own: Option<[u8; 32]>,
    tallies: Vec<Tally>,
    undecided: usize,
}

impl Round {
    /// A round for `n` masters, idle until [`Round::reset`].
    pub(crate) fn new(n: usize, now: Instant) -> Round {
        Round {
            ops: Vec::new(),
            n,
            quorum: quorum(n),
            started: now,
            deadline: now,
            votes: vec![Vote::Pending; n],
            values: vec![None; n],
            reads: vec![None; n],
            holders: vec![UNKNOWN; n],
            own: None,
            tallies: vec![EMPTY],
            undecided: 0,
        }
    }

    /// The prefix of this client's tokens: from now on a refusal that
    /// names its holder tells whether it is one of this client's locks
    /// ([`Round::held_by_own`]).
    pub(crate) fn know_own_tokens(&mut self, prefix: [u8; 32]) {
        self.own = Some(prefix);
    }

    /// Readies the round for `requests`, every vote pending, replies
    /// awaited until `now + timeout`.
    pub(crate) fn reset(&mut self, requests: &[Request], now: Instant, timeout: Duration) {
        self.ops.clear();
        self.ops.extend(requests.iter().map(|r| r.op));
        self.started = now;
        self.deadline = now.checked_add(timeout).unwrap_or(now);
        let k = requests.len();
        self.votes.clear();
        self.votes.resize(k * self.n, Vote::Pending);
        self.values.clear();
        self.values.resize(k * self.n, None);
        self.reads.clear();
        self.reads.resize(k * self.n, None);
        self.holders.clear();
        self.holders.resize(k * self.n, UNKNOWN);
        self.tallies.clear();
        self.tallies.resize(k, EMPTY);
        self.undecided = k;
    }

    /// When pending votes fail with [`Cause::Timeout`].
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The quorum `Q`.
    pub(crate) fn quorum(&self) -> usize {
        self.quorum
    }

    /// How many slots (requests) the round carries.
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.tallies.len()
    }

    /// True once every slot is decided.
    pub(crate) fn is_decided(&self) -> bool {
        self.undecided == 0
    }

    /// Each master's vote on `slot`, in master order.
    pub(crate) fn votes(&self, slot: usize) -> &[Vote] {
        self.votes
            .get(slot * self.n..(slot + 1) * self.n)
            .unwrap_or_default()
    }

    /// How many masters granted `slot`.
    pub(crate) fn granted(&self, slot: usize) -> usize {
        self.tally(slot).granted
    }

    /// How many masters refused `slot` (the key holds another token).
    pub(crate) fn refused(&self, slot: usize) -> usize {
        self.tally(slot).refused
    }

    /// How many masters failed to answer `slot` usably.
    pub(crate) fn failed(&self, slot: usize) -> usize {
        self.tally(slot).failed
    }

    /// The largest integer replied to `slot` by a master that granted it.
    /// A fenced acquire's reports are richer: see [`Round::fence_reads`].
    #[cfg(test)]
    pub(crate) fn max_granted_value(&self, slot: usize) -> Option<i64> {
        let values = self
            .values
            .get(slot * self.n..(slot + 1) * self.n)
            .unwrap_or_default();
        self.votes(slot)
            .iter()
            .zip(values)
            .filter(|(vote, _)| **vote == Vote::Granted)
            .filter_map(|(_, value)| *value)
            .max()
    }

    /// The integer each master replied to `slot`, in master order, where
    /// it replied one (a waiting acquire's refusal carries minus the
    /// holder's remaining time).
    pub(crate) fn values(&self, slot: usize) -> &[Option<i64>] {
        self.values
            .get(slot * self.n..(slot + 1) * self.n)
            .unwrap_or_default()
    }

    /// How many of the masters that refused `slot` may hold one lock: the
    /// most that refused with one holder's value, plus those whose holder
    /// is unknown (a master on the older waiting script, or another
    /// operation), which may hold it too. With the masters that failed, a
    /// quorum of them can be one holder's lock, who will release it; less
    /// is racers that each took some masters (a split), who will each
    /// clean up. Allocates nothing.
    pub(crate) fn refused_by_one(&self, slot: usize) -> usize {
        let range = slot * self.n..(slot + 1) * self.n;
        let (Some(votes), Some(holders)) = (self.votes.get(range.clone()), self.holders.get(range))
        else {
            return 0;
        };
        let refused = || {
            votes
                .iter()
                .zip(holders)
                .filter(|(v, _)| matches!(v, Vote::Refused))
                .map(|(_, h)| h.id)
        };
        let unknown = refused().filter(|h| *h == 0).count();
        let most = refused()
            .filter(|h| *h != 0)
            .map(|h| refused().filter(|o| *o == h).count())
            .max()
            .unwrap_or(0);
        most + unknown
    }

    /// The holder that refused `slot` on the most masters, as the waiting
    /// script named it (a hash of its token); none when no refusal named
    /// one. Allocates nothing.
    pub(crate) fn main_holder(&self, slot: usize) -> Option<u64> {
        let range = slot * self.n..(slot + 1) * self.n;
        let (Some(votes), Some(holders)) = (self.votes.get(range.clone()), self.holders.get(range))
        else {
            return None;
        };
        let named = || {
            votes
                .iter()
                .zip(holders)
                .filter(|(v, h)| matches!(v, Vote::Refused) && h.id != 0)
                .map(|(_, h)| h.id)
        };
        named().max_by_key(|h| named().filter(|o| o == h).count())
    }

    /// Whether the masters that refused `slot` hold the key for one of
    /// this client's locks, as they said: `Some(true)` when every one of
    /// them named a value with this client's token prefix, `Some(false)`
    /// when every one named another client's, `None` when none refused,
    /// one did not name its holder (a plain `SET NX` refusal says nothing
    /// of it), the two kinds are mixed, or the round does not know this
    /// client's prefix. Allocates nothing.
    pub(crate) fn held_by_own(&self, slot: usize) -> Option<bool> {
        let range = slot * self.n..(slot + 1) * self.n;
        let (Some(votes), Some(holders), Some(_)) = (
            self.votes.get(range.clone()),
            self.holders.get(range),
            self.own,
        ) else {
            return None;
        };
        let mut refusals = votes
            .iter()
            .zip(holders)
            .filter(|(v, _)| matches!(v, Vote::Refused))
            .map(|(_, h)| (h.id != 0).then_some(h.own));
        let first = refusals.next().flatten()?;
        refusals.all(|h| h == Some(first)).then_some(first)
    }

    /// What each master reported in phase one of a fenced acquire on
    /// `slot`, in master order: `None` where it sent no such report (it
    /// refused, failed, has not answered, or ran another script).
    pub(crate) fn fence_reads(&self, slot: usize) -> &[Option<FenceRead>] {
        self.reads
            .get(slot * self.n..(slot + 1) * self.n)
            .unwrap_or_default()
    }

    /// Whether some master has not answered `slot` yet.
    pub(crate) fn is_waiting(&self, slot: usize) -> bool {
        self.votes(slot).contains(&Vote::Pending)
    }

    /// When `slot` was decided: the instant its validity is measured to.
    #[cfg(test)]
    pub(crate) fn decided_at(&self, slot: usize) -> Option<Instant> {
        self.tally(slot).decided_at
    }

    fn tally(&self, slot: usize) -> Tally {
        self.tallies.get(slot).copied().unwrap_or(EMPTY)
    }

    /// The outcome of `slot`, once known.
    pub(crate) fn decision(&self, slot: usize) -> Option<Decision> {
        let t = self.tally(slot);
        if t.granted >= self.quorum {
            Some(Decision::Won)
        } else if t.refused + t.failed > self.n - self.quorum {
            Some(Decision::Lost)
        } else {
            None
        }
    }

    /// Why `slot` was lost: failures alone explain the loss when more than
    /// `N - Q` masters failed; otherwise refusals do. Meaningful once
    /// [`Round::decision`] is [`Decision::Lost`].
    pub(crate) fn loss(&self, slot: usize) -> Loss {
        if self.failed(slot) <= self.n - self.quorum {
            Loss::Refused
        } else if self
            .votes(slot)
            .iter()
            .any(|v| matches!(v, Vote::Failed(cause) if cause.is_protocol()))
        {
            Loss::Protocol
        } else {
            Loss::Unreachable
        }
    }

    /// Whether master `i` has yet to vote on `slot`.
    pub(crate) fn is_pending(&self, slot: usize, i: usize) -> bool {
        self.votes.get(slot * self.n + i) == Some(&Vote::Pending)
    }

    /// Whether `slot` still waits for its decision.
    pub(crate) fn is_undecided(&self, slot: usize) -> bool {
        slot < self.tallies.len() && self.decision(slot).is_none()
    }

    /// Master `i`'s reply to `slot`, which must be pending: counted as the
    /// operation says, unless `conns` show that it cannot count (a
    /// quarantined master, or a second connection to one server).
    pub(crate) fn handle_reply(
        &mut self,
        conns: &mut [Conn],
        slot: usize,
        i: usize,
        reply: Reply,
        now: Instant,
    ) {
        if !self.is_pending(slot, i) {
            return;
        }
        let op = self.ops.get(slot).copied().unwrap_or(Op::Acquire);
        // A fenced acquire's bare -1 (a refusal that tells no time) is not
        // kept: it would read as a holder with a millisecond left.
        if let (Reply::Integer(value), Some(cell)) =
            (&reply, self.values.get_mut(slot * self.n + i))
            && !(op == Op::AcquireFenced && *value < 0)
        {
            *cell = Some(*value);
        }
        if let (Op::AcquireFenced, Some(cell)) = (op, self.reads.get_mut(slot * self.n + i)) {
            *cell = FenceRead::parse(&reply);
        }
        if let (true, Reply::Array(items)) = (op.tells_holder(), &reply)
            && let [Reply::Integer(value), Reply::Bulk(holder)] = items.as_slice()
        {
            if let Some(cell) = self.values.get_mut(slot * self.n + i) {
                *cell = Some(*value);
            }
            if let Some(cell) = self.holders.get_mut(slot * self.n + i) {
                // Compared in place: no copy of the value is kept.
                *cell = Holder {
                    id: holder_id(holder),
                    own: self.own.is_some_and(|prefix| holder.starts_with(&prefix)),
                };
            }
        }
        let mut vote = classify(op, reply);
        if let (Vote::Granted, true, Some(conn)) = (&vote, op.keeps_keys(), conns.get_mut(i)) {
            conn.handle_grant(now);
        }
        // One server named twice votes once at most: a connection's vote
        // counts only while no other connection is known to reach the same
        // server (by run_id). Once both handshakes are read, neither counts
        // (and acquires and extends are refused with SameServer); before
        // that, only the one whose twin's handshake is still unread.
        if let (Vote::Granted | Vote::Refused | Vote::Gone, Some(other)) =
            (&vote, same_server(conns, i))
        {
            vote = Vote::Failed(Cause::SameServer(other));
        }
        // A quarantined master's answer is read, never counted: it may have
        // lost keys in a restart.
        if let (Vote::Granted | Vote::Refused | Vote::Gone, Some(left)) =
            (&vote, conns.get(i).and_then(|c| c.quarantine_left(now)))
        {
            vote = Vote::Failed(Cause::Quarantined(left));
        }
        self.record(slot, i, vote, now);
    }

    /// The operation of `slot`.
    pub(crate) fn op(&self, slot: usize) -> Op {
        self.ops.get(slot).copied().unwrap_or(Op::Acquire)
    }

    /// Master `i`'s vote on `slot`, decided without its reply, if the vote
    /// is still pending.
    pub(crate) fn handle_vote(&mut self, slot: usize, i: usize, vote: Vote, now: Instant) {
        if self.is_pending(slot, i) {
            self.record(slot, i, vote, now);
        }
    }

    /// Master `i` failed: its pending votes fail with `cause`.
    pub(crate) fn fail_pending(&mut self, i: usize, cause: &Cause, now: Instant) {
        for slot in 0..self.tallies.len() {
            if self.is_pending(slot, i) {
                self.record(slot, i, Vote::Failed(cause.clone()), now);
            }
        }
    }

    /// Once the deadline has passed, fails every pending vote with
    /// [`Cause::Timeout`].
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if now >= self.deadline {
            for i in 0..self.n {
                self.fail_pending(i, &Cause::Timeout, now);
            }
        }
    }

    /// Records a vote of master `i` on `slot` (a send that failed at once,
    /// for example).
    pub(crate) fn record(&mut self, slot: usize, i: usize, vote: Vote, now: Instant) {
        let was_decided = self.decision(slot).is_some();
        let Some(tally) = self.tallies.get_mut(slot) else {
            return;
        };
        match vote {
            Vote::Pending => return,
            Vote::Granted => tally.granted += 1,
            Vote::Refused | Vote::Gone => tally.refused += 1,
            Vote::Failed(_) => tally.failed += 1,
        }
        if let Some(v) = self.votes.get_mut(slot * self.n + i) {
            *v = vote;
        }
        if !was_decided && self.decision(slot).is_some() {
            if let Some(tally) = self.tallies.get_mut(slot) {
                tally.decided_at = Some(now);
            }
            self.undecided = self.undecided.saturating_sub(1);
        }
    }
}

/// The first other connection to the same server process as connection
/// `i`, by `run_id`, if any.
pub(crate) fn same_server(conns: &[Conn], i: usize) -> Option<usize> {
    let run_id = conns.get(i)?.run_id()?;
    conns
        .iter()
        .enumerate()
        .find(|(j, conn)| *j != i && conn.run_id() == Some(run_id))
        .map(|(j, _)| j)
}

/// How far one master's fence reading can be trusted, as phase one of a
/// fenced acquire reports it (see `SAFETY.md`, *Fencing tokens*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// The master carries the fencing marker: it has kept its data since it
    /// was marked, so its reading holds for every resource, a missing fence
    /// meaning "none was ever written here".
    Marked,
    /// No marker, but it holds this resource's fence, which was written
    /// back after it lost its data: its reading holds for this resource.
    Repaired,
    /// No marker and no fence for this resource: it may have lost one. Its
    /// reading does not count.
    Unmarked,
}

/// One master's report in phase one of a fenced acquire: the reply
/// `{reading, standing, high, unmarked_ms}` of the phase-one script
/// ([`crate::script::ACQUIRE_FENCED_SOURCE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FenceRead {
    /// The master's fence for the resource; for a marked master, at least
    /// its floor.
    pub(crate) fence: i64,
    /// Whether `fence` counts.
    pub(crate) standing: Standing,
    /// For a marked master, the largest fence it ever stored, for any
    /// resource; 0 otherwise.
    pub(crate) high: i64,
    /// For an unmarked master, how long ago (by its own clock) a fenced
    /// acquire first found it unmarked.
    pub(crate) unmarked_for: Option<Duration>,
}

impl FenceRead {
    /// Reads the phase-one script's reply; `None` for any other shape.
    pub(crate) fn parse(reply: &Reply) -> Option<FenceRead> {
        let Reply::Array(items) = reply else {
            return None;
        };
        let [
            Reply::Integer(fence),
            Reply::Integer(standing),
            Reply::Integer(high),
            Reply::Integer(unmarked_ms),
        ] = items.as_slice()
        else {
            return None;
        };
        let standing = match standing {
            2 => Standing::Marked,
            1 => Standing::Repaired,
            0 => Standing::Unmarked,
            _ => return None,
        };
        if *fence < 0 || *high < 0 {
            return None;
        }
        let unmarked_for = match (standing, u64::try_from(*unmarked_ms)) {
            (Standing::Marked, _) => None,
            (_, Ok(ms)) => Some(Duration::from_millis(ms)),
            (_, Err(_)) => return None,
        };
        Some(FenceRead {
            fence: *fence,
            standing,
            high: *high,
            unmarked_for,
        })
    }

    /// Whether the reading counts toward the fence.
    pub(crate) fn is_trusted(&self) -> bool {
        self.standing != Standing::Unmarked
    }
}

/// What phase two of a fenced acquire does besides writing the fence back:
/// the directive the write-back script ([`crate::script::FENCE_SOURCE`])
/// applies to unmarked masters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Directive {
    /// Nothing.
    Keep,
    /// Every master granted and none was marked: a fresh deployment. Mark
    /// every master that still holds the lock.
    Bootstrap,
    /// Mark, with the fence as floor, each master that has been seen
    /// unmarked for at least this long: the fence is larger than the
    /// `high` of a quorum of marked masters, read after every write-back
    /// that such a master confirmed before it lost its data had landed.
    Readmit(Duration),
}

impl Directive {
    /// The directive's text, as the write-back script reads it.
    pub(crate) fn to_bytes(self) -> Bytes {
        match self {
            Directive::Keep => Bytes::from_static(b"keep"),
            Directive::Bootstrap => Bytes::from_static(b"bootstrap"),
            Directive::Readmit(after) => Bytes::from(format!("readmit:{}", after.as_millis())),
        }
    }
}

/// The fence a fenced acquire may hand out, decided from phase one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum FencePlan {
    /// Write `fence` back to every master, with `directive`.
    Write {
        /// The new fence: one more than every trusted reading.
        fence: i64,
        /// What to do to unmarked masters.
        directive: Directive,
    },
    /// Fewer than a quorum of the masters that granted can vouch for their
    /// reading: no fence can be trusted.
    Unknown {
        /// How many could.
        trusted: usize,
    },
}

/// The fencing rule, on the votes and reports of phase one (one entry per
/// master, in master order):
///
/// 1. Every master granted and none is marked: a fresh deployment (or one
///    that predates the marker). The fence is one more than every reading,
///    and phase two marks them all ([`Directive::Bootstrap`]).
/// 2. At least `quorum` masters that granted are trusted (marked, or
///    repaired for this resource): the fence is one more than their
///    largest reading. Any quorum meets the quorum that confirmed the
///    previous fence, and a trusted master still holds what it confirmed.
///    When `readmit_after` is given, a quorum of the granting masters is
///    marked, and some granting master has been unmarked for that long,
///    the fence is also made larger than those marked masters' `high`, and
///    phase two readmits the master ([`Directive::Readmit`]).
/// 3. Otherwise the fence is [`FencePlan::Unknown`].
pub(crate) fn plan_fence(
    votes: &[Vote],
    reads: &[Option<FenceRead>],
    quorum: usize,
    readmit_after: Option<Duration>,
) -> FencePlan {
    let granted = || {
        votes
            .iter()
            .zip(reads)
            .filter(|(vote, _)| **vote == Vote::Granted)
            .filter_map(|(_, read)| read.as_ref())
    };
    let max_of = |values: &mut dyn Iterator<Item = i64>| values.max().unwrap_or(0).max(0);
    let next = |max: i64| max.saturating_add(1);
    let all = granted().count();
    if all == votes.len() && all > 0 && granted().all(|r| r.standing != Standing::Marked) {
        return FencePlan::Write {
            fence: next(max_of(&mut granted().map(|r| r.fence))),
            directive: Directive::Bootstrap,
        };
    }
    let trusted = granted().filter(|r| r.is_trusted()).count();
    if trusted < quorum {
        return FencePlan::Unknown { trusted };
    }
    let fence = next(max_of(
        &mut granted().filter(|r| r.is_trusted()).map(|r| r.fence),
    ));
    let marked = granted().filter(|r| r.standing == Standing::Marked).count();
    let due = |after: Duration| granted().any(|r| r.unmarked_for.is_some_and(|u| u >= after));
    match readmit_after {
        Some(after) if marked >= quorum && due(after) => {
            let high = max_of(
                &mut granted()
                    .filter(|r| r.standing == Standing::Marked)
                    .map(|r| r.high),
            );
            FencePlan::Write {
                fence: fence.max(next(high)),
                directive: Directive::Readmit(after),
            }
        }
        _ => FencePlan::Write {
            fence,
            directive: Directive::Keep,
        },
    }
}

/// A refusing key's holder, from its value: a 64-bit FNV-1a hash, never 0
/// (which stands for "unknown"). Two holders' tokens collide with odds of
/// one in 2^64, and a collision only makes a split read as a holder's lock,
/// waited for until it expires or is released, as before holders were told
/// apart.
fn holder_id(value: &[u8]) -> u64 {
    let hash = value.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash.max(1)
}

/// What one reply means for one operation.
fn classify(op: Op, reply: Reply) -> Vote {
    match (op, reply) {
        (Op::Acquire, reply) if reply.is_ok() => Vote::Granted,
        (Op::Acquire, Reply::Nil) => Vote::Refused,
        // The native extend's nil (see `native::read_extend`).
        (Op::Extend, Reply::Nil) => Vote::Gone,
        (Op::AcquireFenced, ref reply) if FenceRead::parse(reply).is_some() => Vote::Granted,
        // A bare fence value: a master running an older script. It grants,
        // but its value vouches for nothing (no fence read is kept).
        (Op::AcquireFenced, Reply::Integer(n)) if n >= 0 => Vote::Granted,
        (Op::AcquireFenced, Reply::Integer(-1)) => Vote::Refused,
        // Minus the holder's remaining time, kept in the round's values,
        // and the holder's value (a master running the older script sends
        // the time alone).
        // The fenced and multi-resource acquires refuse so too.
        (Op::AcquireWait, Reply::Integer(n)) if n < 0 => Vote::Refused,
        (op, Reply::Array(ref items))
            if op.tells_holder()
                && matches!(items.as_slice(), [Reply::Integer(n), Reply::Bulk(_)] if *n <= 0) =>
        {
            Vote::Refused
        }
        // Every script but the fenced acquire answers 1 or 0.
        (op, Reply::Integer(1)) if !matches!(op, Op::Acquire | Op::AcquireFenced) => Vote::Granted,
        (op, Reply::Integer(0)) if !matches!(op, Op::Acquire | Op::AcquireFenced) => Vote::Refused,
        (_, Reply::Error(msg)) => Vote::Failed(Cause::Server(msg)),
        (_, other) => {
            // A hostile master's reply can be large: the report keeps its
            // start.
            let mut text = format!("unexpected reply {other:?}");
            if text.len() > 120 {
                let mut cut = 120;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
                text.push_str("...");
            }
            Vote::Failed(Cause::Server(Bytes::from(text)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_is_a_strict_majority() {
        let cases = [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)];
        for (n, q) in cases {
            assert_eq!(quorum(n), q, "n = {n}");
        }
    }

    #[test]
    fn validity_is_ttl_minus_elapsed_minus_drift() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        // drift = 10 s * 0.01 + 2 ms = 102 ms; elapsed 8 ms.
        let v = Validity::compute(ttl, t0, t0 + Duration::from_millis(8), 0.01).unwrap();
        assert_eq!(v.remaining, Duration::from_millis(10_000 - 8 - 102));
        assert_eq!(v.deadline, t0 + Duration::from_millis(10_000 - 102));
    }

    #[test]
    fn validity_used_up_is_none_never_a_wrap() {
        let t0 = Instant::now();
        let ttl = Duration::from_millis(100);
        // drift = 1 ms + 2 ms; 97 ms elapsed leaves exactly nothing.
        assert_eq!(
            Validity::compute(ttl, t0, t0 + Duration::from_millis(97), 0.01),
            None
        );
        assert!(Validity::compute(ttl, t0, t0 + Duration::from_millis(96), 0.01).is_some());
        assert_eq!(
            Validity::compute(ttl, t0, t0 + Duration::from_secs(5), 0.01),
            None
        );
        assert_eq!(
            Validity::compute(Duration::from_millis(1), t0, t0, 0.01),
            None
        );
    }

    #[test]
    fn a_drift_factor_out_of_range_counts_as_one() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(1);
        for factor in [f64::NAN, -0.5, 1.0, f64::INFINITY] {
            assert_eq!(Validity::compute(ttl, t0, t0, factor), None, "{factor}");
        }
    }

    #[test]
    fn refusals_count_as_one_holders_only_when_they_name_one_holder() {
        fn refusal_of(holder: &[u8]) -> Reply {
            Reply::Array(vec![
                Reply::Integer(-9_000),
                Reply::Bulk(Bytes::copy_from_slice(holder)),
            ])
        }
        let now = Instant::now();
        let request = Request {
            op: Op::AcquireWait,
            keys: crate::conn::Keys::One(Bytes::from_static(b"r")),
            token: crate::token::TokenSource::from_seed([7; 16]).next_token(),
            arg: 10_000,
            notice: false,
        };
        let refusal = |holder: &'static [u8]| refusal_of(holder);
        // (replies of five masters, refusals that may be one holder's)
        let cases: [(Vec<Option<Reply>>, usize); 6] = [
            // Racers that each took a master: a split.
            (
                vec![
                    Some(refusal(b"a")),
                    Some(refusal(b"b")),
                    Some(refusal(b"c")),
                    None,
                    None,
                ],
                1,
            ),
            // One holder on three, a racer on one.
            (
                vec![
                    Some(refusal(b"h")),
                    Some(refusal(b"h")),
                    Some(refusal(b"x")),
                    Some(refusal(b"h")),
                    None,
                ],
                3,
            ),
            // A master on the older script: its holder is unknown, and may be any.
            (
                vec![
                    Some(Reply::Integer(-9_000)),
                    Some(refusal(b"a")),
                    Some(refusal(b"b")),
                    None,
                    None,
                ],
                2,
            ),
            // Grants and silence are not refusals.
            (
                vec![
                    Some(Reply::Integer(1)),
                    Some(refusal(b"a")),
                    None,
                    None,
                    None,
                ],
                1,
            ),
            // A key that is not a string reads as "": a holder like another.
            (
                vec![
                    Some(refusal(b"")),
                    Some(refusal(b"")),
                    Some(refusal(b"a")),
                    None,
                    None,
                ],
                2,
            ),
            (vec![None, None, None, None, None], 0),
        ];
        for (replies, want) in cases {
            let mut round = Round::new(5, now);
            round.reset(std::slice::from_ref(&request), now, Duration::from_secs(1));
            for (i, reply) in replies.iter().enumerate() {
                if let Some(reply) = reply {
                    round.handle_reply(&mut [], 0, i, reply.clone(), now);
                }
            }
            assert_eq!(round.refused_by_one(0), want, "{replies:?}");
            // The holder named by the most refusals.
            let named = |h: &[u8]| {
                replies
                    .iter()
                    .flatten()
                    .filter(|r| **r == refusal_of(h))
                    .count()
            };
            let main = round.main_holder(0);
            match [b"h".as_slice(), b"a", b"b", b"c", b"x", b""]
                .into_iter()
                .filter(|h| named(h) > 0)
                .max_by_key(|h| named(h))
            {
                Some(h) => assert_eq!(main, Some(holder_id(h)), "{replies:?}"),
                None => assert_eq!(main, None, "{replies:?}"),
            }
        }
        assert_eq!(holder_id(b"a"), holder_id(b"a"));
        assert_ne!(holder_id(b"a"), holder_id(b"b"));
        assert_ne!(holder_id(b""), 0);
    }

    #[test]
    fn refusals_tell_this_clients_locks_from_others_by_the_token_prefix() {
        let mut ours = crate::token::TokenSource::from_seed([7; 16]);
        let mut theirs = crate::token::TokenSource::from_seed([8; 16]);
        let prefix = ours.prefix();
        let token = ours.next_token();
        let request = |op| Request {
            op,
            keys: crate::conn::Keys::One(Bytes::from_static(b"r")),
            token,
            arg: 10_000,
            notice: false,
        };
        let named = |holder: &[u8]| {
            Some(Reply::Array(vec![
                Reply::Integer(-9_000),
                Reply::Bulk(Bytes::copy_from_slice(holder)),
            ]))
        };
        let own = ours.next_token();
        let other = theirs.next_token();
        // The prefix but for its last byte: another client's.
        let mut near = own.as_bytes().to_vec();
        near[31] ^= 1;
        let (own, other) = (own.as_bytes(), other.as_bytes());
        let granted = Some(Reply::Integer(1));
        let failed = Some(Reply::Error(Bytes::from_static(b"ERR no")));
        #[rustfmt::skip]
        type Case<'a> = (&'a str, Op, Vec<Option<Reply>>, bool, Option<bool>);
        let cases: Vec<Case<'_>> = vec![
            (
                "every refusal names this client's lock",
                Op::AcquireWait,
                vec![named(own), named(own), named(own)],
                true,
                Some(true),
            ),
            (
                "a grant and a failure do not count, nor a master not heard yet",
                Op::AcquireWait,
                vec![named(own), granted.clone(), failed.clone()],
                true,
                Some(true),
            ),
            (
                "every refusal names another client's lock",
                Op::AcquireWait,
                vec![named(other), named(&near), None],
                true,
                Some(false),
            ),
            (
                "a value that is not a token is another's",
                Op::AcquireWait,
                vec![named(b""), named(other), named(b"ab")],
                true,
                Some(false),
            ),
            (
                "both kinds: not known",
                Op::AcquireWait,
                vec![named(own), named(other), named(own)],
                true,
                None,
            ),
            (
                "a refusal that names nobody (the older script): not known",
                Op::AcquireWait,
                vec![named(own), Some(Reply::Integer(-9_000)), named(own)],
                true,
                None,
            ),
            (
                "a plain SET NX refusal names nobody",
                Op::Acquire,
                vec![Some(Reply::Nil), Some(Reply::Nil), None],
                true,
                None,
            ),
            (
                "a fenced acquire's refusal names its holder",
                Op::AcquireFenced,
                vec![named(own), named(own), None],
                true,
                Some(true),
            ),
            (
                "a multi-resource acquire's too",
                Op::AcquireMany,
                vec![named(other), granted.clone(), None],
                true,
                Some(false),
            ),
            (
                "no refusal: nothing to tell",
                Op::AcquireWait,
                vec![granted.clone(), failed.clone(), None],
                true,
                None,
            ),
            (
                "a round that does not know this client's prefix cannot tell",
                Op::AcquireWait,
                vec![named(own), named(own), named(own)],
                false,
                None,
            ),
        ];
        let now = Instant::now();
        for (name, op, replies, knows, want) in cases {
            let mut round = Round::new(3, now);
            if knows {
                round.know_own_tokens(prefix);
            }
            round.reset(&[request(op)], now, Duration::from_secs(1));
            for (i, reply) in replies.into_iter().enumerate() {
                if let Some(reply) = reply {
                    round.handle_reply(&mut [], 0, i, reply, now);
                }
            }
            assert_eq!(round.held_by_own(0), want, "{name}");
        }
    }

    #[test]
    fn replies_classify_per_operation() {
        let ok = Reply::Status(Bytes::from_static(b"OK"));
        let cases = [
            (Op::Acquire, ok.clone(), Vote::Granted),
            (Op::Acquire, Reply::Nil, Vote::Refused),
            (Op::Release, Reply::Integer(1), Vote::Granted),
            (Op::Release, Reply::Integer(0), Vote::Refused),
            (Op::Extend, Reply::Integer(1), Vote::Granted),
            (Op::Extend, Reply::Integer(0), Vote::Refused),
            (Op::Extend, Reply::Nil, Vote::Gone),
        ];
        for (op, reply, want) in cases {
            assert_eq!(classify(op, reply.clone()), want, "{op:?} {reply:?}");
        }
        let odd = [
            (Op::Acquire, Reply::Integer(1)),
            (Op::Release, ok.clone()),
            (Op::Extend, Reply::Integer(2)),
            (Op::Acquire, Reply::Error(Bytes::from_static(b"OOM no"))),
        ];
        for (op, reply) in odd {
            assert!(
                matches!(classify(op, reply.clone()), Vote::Failed(Cause::Server(_))),
                "{op:?} {reply:?}"
            );
        }
    }

    fn read(fence: i64, standing: Standing, high: i64, unmarked_ms: u64) -> Option<FenceRead> {
        Some(FenceRead {
            fence,
            standing,
            high,
            unmarked_for: (standing != Standing::Marked)
                .then(|| Duration::from_millis(unmarked_ms)),
        })
    }

    #[test]
    fn fence_reports_parse_from_the_phase_one_reply() {
        let reply =
            |items: &[i64]| Reply::Array(items.iter().map(|&n| Reply::Integer(n)).collect());
        let cases = [
            (
                "a marked master",
                reply(&[7, 2, 9, -1]),
                read(7, Standing::Marked, 9, 0),
            ),
            (
                "a repaired master",
                reply(&[4, 1, 0, 30]),
                read(4, Standing::Repaired, 0, 30),
            ),
            (
                "an unmarked master",
                reply(&[0, 0, 0, 5]),
                read(0, Standing::Unmarked, 0, 5),
            ),
            ("an unknown standing", reply(&[1, 3, 0, -1]), None),
            ("a negative fence", reply(&[-2, 2, 0, -1]), None),
            (
                "an unmarked master without an age",
                reply(&[0, 0, 0, -1]),
                None,
            ),
            ("too few items", reply(&[1, 2, 3]), None),
            ("a bare integer", Reply::Integer(5), None),
        ];
        for (name, reply, want) in cases {
            assert_eq!(FenceRead::parse(&reply), want, "{name}");
            let vote = classify(Op::AcquireFenced, reply);
            let granted = want.is_some() || name == "a bare integer";
            assert_eq!(vote == Vote::Granted, granted, "{name}: {vote:?}");
        }
    }

    #[test]
    fn the_fence_counts_only_masters_that_can_vouch_for_it() {
        use Standing::{Marked, Repaired, Unmarked};
        const G: Vote = Vote::Granted;
        const P: Vote = Vote::Pending;
        const R: Vote = Vote::Refused;
        let after = Some(Duration::from_secs(4));
        let keep = |fence| FencePlan::Write {
            fence,
            directive: Directive::Keep,
        };
        #[rustfmt::skip]
        type Case = (&'static str, Vec<Vote>, Vec<Option<FenceRead>>, Option<Duration>, FencePlan);
        let cases: Vec<Case> = vec![
            (
                "a quorum of marked masters: one more than their largest",
                vec![G, G, P],
                vec![read(5, Marked, 9, 0), read(4, Marked, 9, 0), None],
                None,
                keep(6),
            ),
            (
                "a master that lost its data does not count, and a lone marked one is no quorum",
                vec![P, G, G],
                vec![None, read(0, Unmarked, 0, 10), read(4, Marked, 4, 0)],
                None,
                FencePlan::Unknown { trusted: 1 },
            ),
            (
                "a master repaired for this resource counts",
                vec![P, G, G],
                vec![None, read(6, Repaired, 0, 10), read(4, Marked, 4, 0)],
                None,
                keep(7),
            ),
            (
                "a refusing master's report counts for nothing",
                vec![G, R, G],
                vec![
                    read(1, Marked, 1, 0),
                    read(50, Marked, 50, 0),
                    read(2, Marked, 2, 0),
                ],
                None,
                keep(3),
            ),
            (
                "every master granted, none marked: bootstrap above every reading",
                vec![G, G, G],
                vec![
                    read(0, Unmarked, 0, 0),
                    read(3, Repaired, 0, 0),
                    read(0, Unmarked, 0, 0),
                ],
                None,
                FencePlan::Write {
                    fence: 4,
                    directive: Directive::Bootstrap,
                },
            ),
            (
                "no bootstrap while a master has not answered",
                vec![G, G, P],
                vec![read(0, Unmarked, 0, 0), read(0, Unmarked, 0, 0), None],
                None,
                FencePlan::Unknown { trusted: 0 },
            ),
            (
                "no bootstrap when one master is marked: the others lost their data",
                vec![G, G, G],
                vec![
                    read(3, Marked, 3, 0),
                    read(0, Unmarked, 0, 0),
                    read(0, Unmarked, 0, 0),
                ],
                None,
                FencePlan::Unknown { trusted: 1 },
            ),
            (
                "a master unmarked long enough is readmitted, the fence above the marked masters' high",
                vec![G, G, G],
                vec![
                    read(2, Marked, 8, 0),
                    read(1, Marked, 5, 0),
                    read(0, Unmarked, 0, 4_000),
                ],
                after,
                FencePlan::Write {
                    fence: 9,
                    directive: Directive::Readmit(Duration::from_secs(4)),
                },
            ),
            (
                "not before it has been unmarked that long",
                vec![G, G, G],
                vec![
                    read(2, Marked, 8, 0),
                    read(1, Marked, 5, 0),
                    read(0, Unmarked, 0, 3_999),
                ],
                after,
                keep(3),
            ),
            (
                "nor without a quorum of marked masters to take the floor from",
                vec![G, G, G],
                vec![
                    read(2, Marked, 8, 0),
                    read(3, Repaired, 0, 9_000),
                    read(0, Unmarked, 0, 9_000),
                ],
                after,
                keep(4),
            ),
            (
                "nor without restart quarantine",
                vec![G, G, G],
                vec![
                    read(2, Marked, 8, 0),
                    read(1, Marked, 5, 0),
                    read(0, Unmarked, 0, 9_000),
                ],
                None,
                keep(3),
            ),
            (
                "one master: its own marker decides",
                vec![G],
                vec![read(7, Marked, 7, 0)],
                None,
                keep(8),
            ),
        ];
        for (name, votes, reads, readmit, want) in cases {
            let quorum = quorum(votes.len());
            assert_eq!(plan_fence(&votes, &reads, quorum, readmit), want, "{name}");
        }
    }

    #[test]
    fn directives_read_as_the_write_back_script_expects() {
        assert_eq!(Directive::Keep.to_bytes(), "keep");
        assert_eq!(Directive::Bootstrap.to_bytes(), "bootstrap");
        assert_eq!(
            Directive::Readmit(Duration::from_millis(2_050)).to_bytes(),
            "readmit:2050"
        );
    }
}
