//! One resource's queue of local waiters: who waits for its release, in
//! arrival order, who listens among other resources, and the releases
//! seen meanwhile (an epoch to compare, a mark that the resource is
//! queued for the hub's wake-ups). It decides nothing about locks held
//! here, turns or subscriptions, and sends nothing.

use std::collections::VecDeque;

use crate::token::Token;

/// The waiters of one resource and the releases they have seen.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    /// Waiters in arrival order; the head races.
    waiters: VecDeque<usize>,
    /// Waiters for this resource among others (multi-resource acquires):
    /// each release wakes every one of them; none is anyone's head.
    listeners: Vec<usize>,
    /// Moved on by each release seen.
    epoch: u64,
    /// In the room's queue of resources released and not yet polled.
    queued: bool,
    /// The token of this client's last cleanup of a waiter's failed
    /// attempt: the masters' messages for it wake nobody.
    cleanup: Option<Token>,
    /// The token of the last release message read (see [`Queue::heard`]).
    heard: Option<Token>,
}

impl Queue {
    /// Waiter `waiter` joins the queue, behind those already in it.
    pub(crate) fn join(&mut self, waiter: usize) {
        self.waiters.push_back(waiter);
    }

    /// Waiter `waiter` listens to this resource's releases, among others'.
    pub(crate) fn listen(&mut self, waiter: usize) {
        self.listeners.push(waiter);
    }

    /// Waiter `waiter` no longer listens.
    pub(crate) fn unlisten(&mut self, waiter: usize) {
        self.listeners.retain(|&w| w != waiter);
    }

    /// Waiter `waiter` leaves the queue: where it stood (0 for the head),
    /// or `None` if it was not in it.
    pub(crate) fn leave(&mut self, waiter: usize) -> Option<usize> {
        let position = self.waiters.iter().position(|&w| w == waiter)?;
        self.waiters.remove(position);
        Some(position)
    }

    /// The waiter that races for the lock.
    pub(crate) fn head(&self) -> Option<usize> {
        self.waiters.front().copied()
    }

    /// The waiters listening among other resources.
    pub(crate) fn listeners(&self) -> &[usize] {
        &self.listeners
    }

    /// Nobody waits: no queue, no listener.
    pub(crate) fn is_empty(&self) -> bool {
        self.waiters.is_empty() && self.listeners.is_empty()
    }

    /// How many releases were seen.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A release seen: the epoch moves on. Whether the resource is to be
    /// queued for the wake-ups now: once until [`Queue::handle_polled`].
    #[must_use]
    pub(crate) fn release(&mut self) -> bool {
        self.epoch += 1;
        !std::mem::replace(&mut self.queued, true)
    }

    /// The resource was taken off the room's queue of releases.
    pub(crate) fn handle_polled(&mut self) {
        self.queued = false;
    }

    /// A local waiter's failed attempt is undone by a release of `token`:
    /// its messages free only what that attempt took, and wake nobody.
    pub(crate) fn handle_cleanup(&mut self, token: Token) {
        self.cleanup = Some(token);
    }

    /// Whether a message of `token` (`None`: no token read) may have freed
    /// the lock: any but this client's last cleanup's.
    pub(crate) fn wakes(&self, token: Option<Token>) -> bool {
        token.is_none() || token != self.cleanup
    }

    /// A release message of `token` was read.
    pub(crate) fn handle_heard(&mut self, token: Option<Token>) {
        self.heard = token;
    }

    /// Whether the last release message read was `token`'s: a master's
    /// message of that release reached the waiters (and woke them).
    pub(crate) fn heard(&self, token: Token) -> bool {
        self.heard == Some(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::TokenSource;

    #[test]
    fn waiters_race_in_arrival_order_and_listeners_are_nobodys_head() {
        let mut queue = Queue::default();
        assert!(queue.is_empty());
        queue.listen(4);
        assert_eq!(queue.head(), None, "a listener races nobody's turn");
        queue.join(7);
        queue.join(9);
        assert_eq!(queue.head(), Some(7));
        assert_eq!(queue.leave(9), Some(1), "not the head");
        assert_eq!(queue.leave(9), None, "gone already");
        assert_eq!(queue.leave(7), Some(0));
        assert_eq!(queue.listeners(), [4]);
        assert!(!queue.is_empty());
        queue.unlisten(4);
        assert!(queue.is_empty());
    }

    #[test]
    fn every_release_moves_the_epoch_on_and_queues_the_resource_once_until_polled() {
        let mut queue = Queue::default();
        assert!(queue.release());
        assert!(!queue.release());
        assert_eq!(queue.epoch(), 2);
        queue.handle_polled();
        assert!(queue.release());
        assert_eq!(queue.epoch(), 3);
    }

    #[test]
    fn only_this_clients_last_cleanup_wakes_nobody() {
        let mut tokens = TokenSource::from_seed([1; 16]);
        let (cleanup, other) = (tokens.next_token(), tokens.next_token());
        let mut queue = Queue::default();
        assert!(queue.wakes(Some(cleanup)));
        assert!(queue.wakes(None), "no token read: the key may be free");
        queue.handle_cleanup(cleanup);
        assert!(!queue.wakes(Some(cleanup)));
        assert!(queue.wakes(Some(other)));
        assert!(queue.wakes(None));
        queue.handle_heard(Some(other));
        assert!(queue.heard(other));
        assert!(!queue.heard(cleanup));
    }
}
