//! What this client knows of its own hold on one resource's lock: the
//! lock taken here and not let go (its token, valid until when), the
//! latest lock it took, and an instant a subscription is kept for another
//! process's turn. These marks decide whether a new local waiter waits
//! for a release rather than try, whether a release lets go of the lock
//! held here, and until when a subscription with nobody waiting stays.
//! They know nothing of waiters, subscriptions or turns.

use std::time::Instant;

use crate::token::Token;

/// One resource's marks of the lock held here.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    /// This client took the lock (this token, valid until then), and it
    /// has not been let go through this client (nor heard released): the
    /// lock is held here. A subscription stays with no waiter left until
    /// it is let go or that instant passes, and a new local waiter waits
    /// for its release instead of trying.
    held: Option<(Instant, Token)>,
    /// The token of the last lock this client took on the resource (see
    /// [`Marks::is_current`]). Unlike `held`, no message clears it: a
    /// message of another client's key deleted on a master this client's
    /// lock did not hold says nothing of which of its locks is current.
    latest: Option<Token>,
    /// With nobody waiting here, the subscription is kept until then
    /// after this client's release named another process, for that
    /// process's turn: a new local waiter, waiting for it, hears its
    /// release.
    kept: Option<Instant>,
}

impl Marks {
    /// This client took the lock (`token`), valid until `until`.
    pub(crate) fn handle_granted(&mut self, until: Instant, token: Token) {
        self.held = Some((until, token));
        self.latest = Some(token);
    }

    /// The lock of `token` was extended (or shortened) to `until`; nothing
    /// changes when another lock is held here (the extended one lapsed).
    pub(crate) fn handle_extended(&mut self, until: Instant, token: Token) {
        if self.held.is_some_and(|(_, held)| held == token) {
            self.held = Some((until, token));
        }
    }

    /// Until when the lock is held here, if it is at `now`.
    pub(crate) fn held_until(&self, now: Instant) -> Option<Instant> {
        self.held
            .map(|(until, _)| until)
            .filter(|&until| until > now)
    }

    /// Whether a lock is marked held here (valid or not).
    pub(crate) fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// Whether a release of `token` lets go of the lock held here, or ends
    /// its row: not when this client has taken the lock again since (the
    /// released one lapsed, its caller releasing it late), whether or not
    /// the later lock is still marked held (a message may have cleared
    /// that mark).
    pub(crate) fn is_current(&self, token: Token) -> bool {
        self.latest.is_none_or(|latest| latest == token)
    }

    /// The lock was let go through this client: no longer held here.
    pub(crate) fn let_go(&mut self) {
        self.held = None;
    }

    /// Keeps the subscription until `until`, for another process's turn.
    pub(crate) fn keep(&mut self, until: Instant) {
        self.kept = Some(until);
    }

    /// The subscription ended: nothing is held or kept for it any more.
    pub(crate) fn clear(&mut self) {
        self.held = None;
        self.kept = None;
    }

    /// The lock of `token` is no longer held here, if it was the one held
    /// here: another lock's mark stays (a lock released through this
    /// client that lapsed, another of its locks holding it now).
    pub(crate) fn let_go_of(&mut self, token: Token) {
        if self.held.is_some_and(|(_, held)| held == token) {
            self.held = None;
        }
    }

    /// A master's release message of `token` (`None`: none read) was
    /// heard, `ours` when this client minted it. No longer held here, but
    /// for a late message (a slower master's) of an earlier release of
    /// this client's: the lock a waiter took since is still held here.
    pub(crate) fn handle_heard(&mut self, token: Option<Token>, ours: bool) {
        if !ours || token == self.held.map(|(_, held)| held) {
            self.held = None;
        }
    }

    /// Until when a subscription kept with nobody waiting stays: the later
    /// of the lock's validity while held here and the turn it is kept
    /// for; none when neither holds it (a sweep ends it then).
    pub(crate) fn kept_until(&self) -> Option<Instant> {
        // `None` orders before any `Some`: the later of the two, or the one.
        self.held.map(|(until, _)| until).max(self.kept)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::token::TokenSource;

    /// Two tokens of one client, in the order it minted them.
    fn two_tokens() -> (Token, Token) {
        let mut tokens = TokenSource::from_seed([1; 16]);
        (tokens.next_token(), tokens.next_token())
    }

    #[test]
    fn a_lock_granted_is_held_until_its_validity_let_go_or_released() {
        let now = Instant::now();
        let valid = now + Duration::from_secs(2);
        let (held, other) = two_tokens();
        let mut marks = Marks::default();
        assert_eq!(marks.held_until(now), None);
        marks.handle_granted(valid, held);
        assert_eq!(marks.held_until(now), Some(valid));
        assert_eq!(marks.held_until(valid), None, "no longer valid");
        // Another lock's release or extension changes nothing.
        marks.let_go_of(other);
        marks.handle_extended(now + Duration::from_secs(9), other);
        assert_eq!(marks.held_until(now), Some(valid));
        let later = now + Duration::from_secs(3);
        marks.handle_extended(later, held);
        assert_eq!(marks.held_until(now), Some(later));
        marks.let_go_of(held);
        assert!(!marks.is_held());
        marks.handle_granted(valid, other);
        marks.let_go();
        assert_eq!(marks.held_until(now), None);
    }

    #[test]
    fn only_the_latest_lock_is_current_and_messages_do_not_change_that() {
        let now = Instant::now();
        let (lapsed, held) = two_tokens();
        let mut marks = Marks::default();
        assert!(marks.is_current(lapsed), "nothing taken: any lets go");
        marks.handle_granted(now, held);
        assert!(!marks.is_current(lapsed));
        marks.handle_heard(None, false);
        assert!(!marks.is_held(), "another client's message cleared it");
        assert!(marks.is_current(held));
        assert!(!marks.is_current(lapsed));
    }

    #[test]
    fn a_late_message_of_this_clients_earlier_release_leaves_the_mark() {
        let now = Instant::now();
        let (earlier, held) = two_tokens();
        let mut marks = Marks::default();
        marks.handle_granted(now, held);
        marks.handle_heard(Some(earlier), true);
        assert!(marks.is_held());
        marks.handle_heard(Some(held), true);
        assert!(!marks.is_held());
    }

    #[test]
    fn a_subscription_is_kept_until_the_later_of_the_validity_and_the_turn() {
        let now = Instant::now();
        let (valid, turn) = (now + Duration::from_secs(2), now + Duration::from_secs(3));
        let token = TokenSource::from_seed([1; 16]).next_token();
        let mut marks = Marks::default();
        assert_eq!(marks.kept_until(), None);
        marks.handle_granted(valid, token);
        assert_eq!(marks.kept_until(), Some(valid));
        marks.keep(turn);
        assert_eq!(marks.kept_until(), Some(turn));
        marks.let_go();
        assert_eq!(marks.kept_until(), Some(turn));
        marks.clear();
        assert_eq!(marks.kept_until(), None);
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
}
