//! One resource's rows of in-process hand-overs (lock cohorting): whether
//! several callers here take the lock in turn, whether other processes
//! compete for it, and the row a hand-over left for the next lock taken
//! here. A release plans from these whether it hands the lock over or
//! announces it; they know nothing of waiters, subscriptions or turns.

use std::time::Instant;

/// A row of in-process hand-overs of one lock (lock cohorting): how many
/// so far, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cohort {
    /// Hand-overs in the row, this lock's included.
    pub(crate) row: u32,
    /// When the first of them was sent.
    pub(crate) since: Instant,
}

/// One resource's hand-over rows.
#[derive(Debug)]
pub(crate) struct Row {
    /// The lock passed between two of this client's callers (handed
    /// over) since a release last waited for a local caller in vain:
    /// several callers here take it in turn (see
    /// [`Config::local_handover_linger`](crate::Config::local_handover_linger)).
    company: bool,
    /// Another client's release of this lock (or cleanup of its attempt)
    /// was heard since this client last ended a row of hand-overs with an
    /// announced release ([`Row::handle_yield`]): other processes compete
    /// for it, and a row ends after
    /// [`Config::local_handovers`](crate::Config::local_handovers) as well
    /// as after its window. Set for a new resource: until a row has ended
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

impl Row {
    /// This client took the lock: the row it goes on with, if this client
    /// handed the lock over since it last took it.
    #[must_use]
    pub(crate) fn handle_granted(&mut self) -> Option<Cohort> {
        self.handing.take()
    }

    /// This client released the lock unannounced, handing it over, the
    /// row going on as `next`.
    pub(crate) fn handle_handed_over(&mut self, next: Cohort) {
        self.handing = Some(next);
    }

    /// The lock was handed over between two callers here (`true`), or a
    /// release waited for a caller here in vain (`false`).
    pub(crate) fn handle_company(&mut self, company: bool) {
        self.company = company;
    }

    /// This client ended a row with an announced release: whether other
    /// processes still compete is told by their messages from now on.
    pub(crate) fn handle_yield(&mut self) {
        self.contended = false;
        self.handing = None;
    }

    /// Another process's release or notice was heard: it competes.
    pub(crate) fn handle_contender(&mut self) {
        self.contended = true;
    }

    /// Whether other processes compete for the lock.
    pub(crate) fn is_contended(&self) -> bool {
        self.contended
    }

    /// Whether the lock passes between several callers here.
    pub(crate) fn has_company(&self) -> bool {
        self.company
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_taken_after_a_hand_over_goes_on_with_its_row_once() {
        let now = Instant::now();
        let mut row = Row::default();
        assert_eq!(row.handle_granted(), None, "a row of its own");
        let next = Cohort { row: 2, since: now };
        row.handle_handed_over(next);
        assert_eq!(row.handle_granted(), Some(next));
        assert_eq!(row.handle_granted(), None);
        // A row ended with an announced release goes on with nobody.
        row.handle_handed_over(next);
        row.handle_yield();
        assert_eq!(row.handle_granted(), None);
    }

    #[test]
    fn a_lock_is_contended_until_a_row_ends_and_again_once_another_is_heard() {
        let mut row = Row::default();
        assert!(row.is_contended(), "taken to compete until told");
        row.handle_yield();
        assert!(!row.is_contended());
        row.handle_contender();
        assert!(row.is_contended());
    }

    #[test]
    fn company_is_what_the_last_release_found() {
        let mut row = Row::default();
        assert!(!row.has_company());
        row.handle_company(true);
        assert!(row.has_company());
        row.handle_company(false);
        assert!(!row.has_company());
    }
}
