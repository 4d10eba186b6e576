//! The waiting checker: a waiting acquire waiting while the lock it wants
//! is free must get it, or another caller must, within a bound (see
//! [`Waiting`]). It owns what it needs to decide that, fed by the world:
//! each master's key of each resource as the masters change them (and
//! which release deleted a key), the clients' waiting acquires, the
//! release messages each client read, and how long each client has been
//! unable to reach every master. It reads no model and no hub itself,
//! and changes nothing in the run.

use super::{Micros, TokenKey};

/// The most masters a run has (a quorum of more is never found).
const MAX_MASTERS: usize = 16;

/// One master's key of a resource, as the checker last read it.
#[derive(Debug, Clone)]
struct Key {
    token: TokenKey,
    /// The virtual time from which the key has expired (`Micros::MAX`:
    /// never).
    until: Micros,
}

/// A release command, as the waiting checker weighs the keys it deletes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Release {
    /// The client that sent it.
    pub(super) client: usize,
    /// The token it releases: it deletes a key only of that token.
    pub(super) token: TokenKey,
    pub(super) kind: Kind,
    /// When its client queued it.
    pub(super) sent: Micros,
}

/// What a release is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// It publishes, of a lock a caller held: a holder's release.
    Announced,
    /// It publishes, of an attempt no caller was given: the release of a
    /// lock won after its caller went, or a failed attempt's cleanup told
    /// to all.
    Unclaimed,
    /// Quiet, of a lock a caller held: a hand-over, the head waiter's
    /// attempt right behind it in the same write.
    HandOver,
    /// Quiet, of an attempt no caller was given: a failed attempt's
    /// cleanup, which tells nobody (SAFETY.md: an attempt whose keys in
    /// fact stood on a quorum is learnt of at their expiry).
    Cleanup,
}

/// How a resource's lock last became free.
#[derive(Debug, Clone, Copy, Default)]
enum Freed {
    /// Its keys expired (or it was never taken).
    #[default]
    Expired,
    /// A master lost its keys (a restart without its data).
    Lost,
    /// A release deleted the key that freed it.
    Released(Release),
}

impl Freed {
    /// The client that freed the lock by a release of its own, which it
    /// knows of, and when it queued that release: reaching every master
    /// since, it owes the lock within the bound, whatever the old key's
    /// TTL. (Cut off from a master meanwhile, its release may have been
    /// lost with that connection, or its reply: the release, failed as
    /// far as the client knows, tells its waiters nothing.)
    fn releaser(self) -> Option<(usize, Micros)> {
        match self {
            Freed::Released(Release {
                client,
                kind: Kind::Announced | Kind::Unclaimed | Kind::HandOver,
                sent,
                ..
            }) => Some((client, sent)),
            _ => None,
        }
    }

    fn describe(self) -> String {
        match self {
            Freed::Expired => "by expiry".to_owned(),
            Freed::Lost => "by a master's data loss".to_owned(),
            Freed::Released(Release { client, kind, .. }) => {
                let what = match kind {
                    Kind::Announced => "announced release",
                    Kind::Unclaimed => {
                        "announced release of a lock no caller was given (won after its \
                         caller went, say)"
                    }
                    Kind::HandOver => "hand-over (the quiet release of a lock a caller held)",
                    Kind::Cleanup => "failed attempt's quiet cleanup",
                };
                format!("by client {client}'s {what}")
            }
        }
    }
}

/// One resource's lock as the masters' keys make it.
#[derive(Debug, Clone, Default)]
struct Resource {
    /// Per master.
    keys: Vec<Option<Key>>,
    /// Held: a quorum of masters holds one token's live key; or blocked:
    /// no token's key is live on a quorum, yet fewer than a quorum of
    /// masters hold no live key (keys of several tokens, left by racers
    /// or by releases that did not reach every master), so nobody can
    /// take it. Then, when that ends by expiry if nothing changes.
    lapse: Option<Micros>,
    /// Free (a quorum of masters with no live key: any caller can take
    /// it) since then.
    free_since: Option<Micros>,
    /// How it became free, while it is.
    freed: Freed,
    /// The token of the release that last deleted a live key of it, and on
    /// how many masters it has.
    deletions: Option<(TokenKey, usize)>,
}

impl Resource {
    /// When the keys' quorum holder's hold lapses by expiry, if a quorum of
    /// masters holds one token's key live at `now`.
    fn holder(&self, quorum: usize, now: Micros) -> Option<Micros> {
        let live = || self.keys.iter().flatten().filter(|k| k.until > now);
        for key in live() {
            let (untils, count) = sorted_untils(live().filter(|k| k.token == key.token));
            if count >= quorum {
                // Held until all but `quorum - 1` of them have expired.
                return Some(untils[count - quorum]);
            }
        }
        None
    }

    /// When a quorum of masters will hold no live key if nothing changes
    /// (`now` if one does now).
    fn free_at(&self, quorum: usize, now: Micros) -> Micros {
        let (untils, live) = sorted_untils(self.keys.iter().flatten().filter(|k| k.until > now));
        let free = self.keys.len() - live;
        if free >= quorum {
            return now;
        }
        // `quorum - free` more keys must expire.
        untils[quorum - free - 1]
    }
}

/// The expiries of `keys` (the first [`MAX_MASTERS`]), soonest first, and
/// how many there are; no allocation.
fn sorted_untils<'a>(keys: impl Iterator<Item = &'a Key>) -> ([Micros; MAX_MASTERS], usize) {
    let mut untils = [Micros::MAX; MAX_MASTERS];
    let mut count = 0;
    for (slot, key) in untils.iter_mut().zip(keys) {
        *slot = key.until;
        count += 1;
    }
    untils[..count].sort_unstable();
    (untils, count)
}

/// One client's waiting for one resource.
#[derive(Debug, Clone, Copy, Default)]
struct Pair {
    /// Its waiting acquires under way (callers not gone).
    waiters: u32,
    /// Since when it has had one without a break.
    since: Micros,
    /// The first reason to try it had at or after the start of its owed
    /// time (see [`Waiting::deadline`]): a release message read, its own
    /// release of the lock done, or its first waiter's start.
    notice: Option<Micros>,
    /// The free spell (its start) a violation was reported for.
    reported: Option<Micros>,
}

/// The waiting checker's bounds (see [`Waiting`] and `waiting_bounds` in
/// the world), in µs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    /// From a reason to try to the lock held, for a client whose messages
    /// all took the network's usual delays.
    pub(super) quick: Micros,
    /// The same, for one with messages late (but none overdue).
    pub(super) slow: Micros,
    /// How long after its last late message a client is slow.
    pub(super) settle: Micros,
    /// The longest a waiter waits for a lock with no message.
    pub(super) timer: Micros,
}

/// The waiting checker.
///
/// A client *owes* the lock of resource `r` while `r` is free (a quorum
/// of masters holds no live key of it: released by its holder or
/// expired; keys of several tokens on a majority, none on a quorum, block
/// every caller until enough of them expire),
/// one of its waiting acquires (Retry with [`Config::wake_on_release`],
/// one resource, plain or fenced, more than one attempt) waits for it,
/// and it can reach
/// every master (see `World::disturbed_since`). From `g`, the latest of
/// when the lock was free, when the client's waiting began and when it
/// last could not reach every master, the client must have a reason to
/// try by `s`: the first release message for `r` it read at or after `g`
/// (from another process: its own releases count when done), its own
/// release of `r` done, or its waiting's start; else, at the latest,
/// `g + timer`, the longest a waiter waits without a message (its last
/// attempt read the holder's remaining time, at most [`MAX_TTL`]). From `s`
/// it, or another caller, must hold the lock within `quick`, or `slow`
/// when any of its messages took longer than the network's usual delays
/// since `settle` before `s`. Otherwise the client reports it, once per
/// free spell.
///
/// The [`Bounds`] come from the configuration and the network's delays
/// (see `waiting_bounds` in the world). A lock handed over in-process is
/// never free:
/// the release and the waiter's SET NX reach each master in one write.
/// No bound applies while a client cannot reach every master in time: with
/// a master failing it cannot at once tell racers that split the votes
/// from a holder, looks again after a per-instance timeout, and then
/// waits for the refusing keys' expiry (`job.rs`, `next_wait`); nor while
/// it is paused.
///
/// [`Config::wake_on_release`]: crate::Config::wake_on_release
/// [`MAX_TTL`]: super::MAX_TTL
#[derive(Debug)]
pub(super) struct Waiting {
    quorum: usize,
    bounds: Bounds,
    resources: Vec<Resource>,
    /// By client, then resource.
    pairs: Vec<Vec<Pair>>,
    /// The soonest a deadline may pass or a hold lapse: nothing to check
    /// before.
    pub(super) next_check: Micros,
}

impl Waiting {
    /// A checker for `clients` and `resources` resources on `masters`
    /// masters, with the given bounds.
    pub(super) fn new(
        clients: usize,
        resources: usize,
        masters: usize,
        quorum: usize,
        bounds: Bounds,
    ) -> Waiting {
        let resource = Resource {
            keys: vec![None; masters],
            lapse: None,
            free_since: Some(0),
            freed: Freed::Expired,
            deletions: None,
        };
        Waiting {
            quorum,
            bounds,
            resources: vec![resource; resources],
            pairs: vec![vec![Pair::default(); resources]; clients],
            next_check: Micros::MAX,
        }
    }

    /// Master `master`'s key of resource `r` now: its token and the
    /// virtual time from which it has expired, or none; `release`, the
    /// release command that ran there now, if one did. Returns whether that
    /// release deleted a live key of its token.
    pub(super) fn handle_key(
        &mut self,
        r: usize,
        master: usize,
        key: Option<(&[u8], Micros)>,
        now: Micros,
        release: Option<Release>,
    ) -> bool {
        let slot = &mut self.resources[r].keys[master];
        let key = key.map(|(token, until)| Key {
            token: TokenKey::new(token),
            until,
        });
        // Unchanged (a read, a refused attempt): the state it makes moves
        // only with time, which every reader brings up to date first
        // (`refresh`).
        let same = match (&*slot, &key) {
            (Some(old), Some(new)) => old.token == new.token && old.until == new.until,
            (None, None) => true,
            _ => false,
        };
        let deleted = release.filter(|release| {
            key.is_none()
                && slot
                    .as_ref()
                    .is_some_and(|old| old.token == release.token && old.until > now)
        });
        *slot = key;
        if let Some(release) = deleted {
            let deletions = &mut self.resources[r].deletions;
            *deletions = match *deletions {
                Some((token, n)) if token == release.token => Some((token, n + 1)),
                _ => Some((release.token, 1)),
            };
        }
        if !same {
            let freed = match deleted {
                Some(release) => Freed::Released(release),
                None => Freed::Lost,
            };
            self.update(r, now, freed);
        }
        deleted.is_some()
    }

    /// Whether resource `r`'s lock is free at `now`.
    pub(super) fn is_free(&mut self, r: usize, now: Micros) -> bool {
        self.refresh(r, now);
        self.resources[r].free_since.is_some()
    }

    /// Resource `r`'s state at `now`: held or blocked until when, or free
    /// since when; `freed`: how the change seen now freed it, if it did
    /// (it may have lapsed by expiry before).
    fn update(&mut self, r: usize, now: Micros, freed: Freed) {
        let resource = &mut self.resources[r];
        let lapse = resource
            .holder(self.quorum, now)
            .or_else(|| Some(resource.free_at(self.quorum, now)).filter(|&at| at > now));
        match lapse {
            Some(lapse) => {
                resource.free_since = None;
                resource.lapse = Some(lapse);
                self.next_check = self.next_check.min(lapse);
            }
            None => {
                if resource.free_since.is_none() {
                    // Freed by the change seen now, or by expiry since.
                    let (since, freed) = match resource.lapse {
                        Some(lapse) if lapse <= now => (lapse, Freed::Expired),
                        _ => (now, freed),
                    };
                    resource.free_since = Some(since);
                    resource.freed = freed;
                    self.next_check = self.next_check.min(now);
                }
                resource.lapse = None;
            }
        }
    }

    /// Client `client` starts a waiting acquire of resource `r`.
    pub(super) fn handle_waiter(&mut self, client: usize, r: usize, now: Micros) {
        let pair = &mut self.pairs[client][r];
        if pair.waiters == 0 {
            pair.since = now;
            pair.notice = Some(now);
            pair.reported = None;
            self.next_check = self.next_check.min(now);
        }
        pair.waiters += 1;
    }

    /// One of client `client`'s waiting acquires of `r` ended, or its
    /// caller went.
    pub(super) fn handle_waiter_gone(&mut self, client: usize, r: usize) {
        let pair = &mut self.pairs[client][r];
        pair.waiters = pair.waiters.saturating_sub(1);
    }

    /// Client `client` read a reason to try resource `r` at `now`: a
    /// release message, or its own release done. `disturbed` is when it
    /// last could not reach every master (`now` if it cannot now).
    pub(super) fn handle_notice(
        &mut self,
        client: usize,
        r: usize,
        now: Micros,
        disturbed: Micros,
    ) {
        self.refresh(r, now);
        let Some(free) = self.resources[r].free_since else {
            return;
        };
        let pair = &mut self.pairs[client][r];
        if pair.waiters == 0 {
            return;
        }
        let owed_from = free.max(pair.since).max(disturbed);
        if pair.notice.is_none_or(|n| n < owed_from) && now >= owed_from {
            pair.notice = Some(now);
            self.next_check = self.next_check.min(now);
        }
    }

    /// Resource `r` brought up to `now`: a hold that lapsed since.
    fn refresh(&mut self, r: usize, now: Micros) {
        if self.resources[r].lapse.is_some_and(|lapse| lapse <= now) {
            self.update(r, now, Freed::Expired);
        }
    }

    /// Until when client `client`'s waiting for `r` may last before it must
    /// have the lock, as things stand (it last could not reach every master
    /// at `broken`, and its connections were slow until `slow`), if it owes
    /// it; and the reason to try it had.
    fn deadline(
        &self,
        client: usize,
        r: usize,
        broken: Micros,
        slow: Micros,
    ) -> Option<(Micros, Micros)> {
        let resource = &self.resources[r];
        let free = resource.free_since?;
        let pair = &self.pairs[client][r];
        if pair.waiters == 0 || pair.reported == Some(free) {
            return None;
        }
        let owed_from = free.max(pair.since).max(broken);
        let latest = owed_from.saturating_add(self.bounds.timer);
        // Freed by this client's own release (announced, or handed over)
        // of a lock that stood, which deleted its keys on a quorum of
        // masters (as far as the client can tell, a release that worked;
        // a late release of a lapsed lock, its keys mostly expired, tells
        // it nothing), every master reachable since it queued it: it
        // knows, and owes the lock from then on, whatever the old key's
        // TTL; no message need reach it.
        let worked = |token| {
            resource
                .deletions
                .is_some_and(|(deleted, n)| deleted == token && n >= self.quorum)
        };
        let strict = match resource.freed {
            Freed::Released(release) => {
                resource.freed.releaser().is_some_and(|(releaser, sent)| {
                    releaser == client && broken <= sent && worked(release.token)
                })
            }
            _ => false,
        };
        let reason = match pair.notice {
            _ if strict => owed_from,
            Some(n) if n >= owed_from => n.min(latest),
            _ => latest,
        };
        let bound = if slow.saturating_add(self.bounds.settle) <= reason {
            self.bounds.quick
        } else {
            self.bounds.slow
        };
        Some((reason.saturating_add(bound), reason))
    }

    /// Checks every client's waiting at `now`; `disturbed(c)` is when
    /// client `c` last could not reach every master (`now` if it cannot
    /// now) and until when its connections were slow, `None` for a client
    /// that no longer waits for anything (closed). Returns each violation
    /// found.
    pub(super) fn check(
        &mut self,
        now: Micros,
        mut disturbed: impl FnMut(usize) -> Option<(Micros, Micros)>,
        names: &[&str],
    ) -> Vec<String> {
        let mut found = Vec::new();
        for r in 0..self.resources.len() {
            self.refresh(r, now);
        }
        let mut next = self
            .resources
            .iter()
            .filter_map(|res| res.lapse)
            .min()
            .unwrap_or(Micros::MAX);
        for client in 0..self.pairs.len() {
            if self.pairs[client].iter().all(|p| p.waiters == 0) {
                continue;
            }
            let Some((broken, slow)) = disturbed(client) else {
                continue;
            };
            for r in 0..self.resources.len() {
                let Some((deadline, reason)) = self.deadline(client, r, broken, slow) else {
                    continue;
                };
                if now <= deadline {
                    next = next.min(deadline.saturating_add(1));
                    continue;
                }
                let free = self.resources[r].free_since.unwrap_or(0);
                let freed = self.resources[r].freed.describe();
                let pair = &mut self.pairs[client][r];
                pair.reported = Some(free);
                found.push(format!(
                    "waiting: client {client}'s waiting acquire of {:?} still waits {:.3} ms \
                     after a reason to try it (at {:.3} ms; the lock free since {:.3} ms, {freed}, \
                     the client waiting since {:.3} ms, reaching every master since {:.3} ms, \
                     slow until {:.3} ms), over its bound",
                    names.get(r).copied().unwrap_or("?"),
                    (now - reason) as f64 / 1e3,
                    reason as f64 / 1e3,
                    free as f64 / 1e3,
                    pair.since as f64 / 1e3,
                    broken as f64 / 1e3,
                    slow as f64 / 1e3,
                ));
            }
        }
        self.next_check = next;
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Micros = 1_000;

    fn checker() -> Waiting {
        // Three masters, quorum two; bound 100 ms (slow: 300 ms), timer 1 s.
        let bounds = Bounds {
            quick: 100 * MS,
            slow: 300 * MS,
            settle: 10 * MS,
            timer: 1_000 * MS,
        };
        Waiting::new(2, 1, 3, 2, bounds)
    }

    fn hold(w: &mut Waiting, token: &[u8], until: Micros, now: Micros) {
        for m in 0..3 {
            w.handle_key(0, m, Some((token, until)), now, None);
        }
    }

    /// Every master's key of `r0` gone at `now`, deleted by `by`'s release
    /// of `token`, or by nobody known.
    fn delete(w: &mut Waiting, by: Option<(usize, &[u8], Kind)>, now: Micros) {
        let release = by.map(|(client, token, kind)| Release {
            client,
            token: TokenKey::new(token),
            kind,
            sent: now - MS,
        });
        for m in 0..3 {
            w.handle_key(0, m, None, now, release);
        }
    }

    fn release(w: &mut Waiting, now: Micros) {
        delete(w, None, now);
    }

    fn check(w: &mut Waiting, now: Micros) -> Vec<String> {
        w.check(now, |_| Some((0, 0)), &["r0"])
    }

    #[test]
    fn a_waiter_told_of_a_release_owes_the_lock_within_the_bound() {
        let mut w = checker();
        hold(&mut w, b"a", 5_000 * MS, 0);
        w.handle_waiter(1, 0, 10 * MS);
        release(&mut w, 20 * MS);
        w.handle_notice(1, 0, 21 * MS, 0);
        assert!(check(&mut w, 121 * MS).is_empty());
        assert_eq!(w.next_check, 121 * MS + 1);
        let found = check(&mut w, 122 * MS);
        assert_eq!(found.len(), 1, "{found:?}");
        // Once per free spell.
        assert!(check(&mut w, 500 * MS).is_empty());
    }

    #[test]
    fn a_lock_taken_again_or_handed_over_is_owed_by_nobody() {
        let mut w = checker();
        hold(&mut w, b"a", 5_000 * MS, 0);
        w.handle_waiter(1, 0, 10 * MS);
        // Handed over master by master: never free.
        for m in 0..3 {
            w.handle_key(0, m, Some((b"b", 5_000 * MS)), 20 * MS, None);
        }
        w.handle_notice(1, 0, 21 * MS, 0);
        assert!(check(&mut w, 900 * MS).is_empty());
        release(&mut w, 1_000 * MS);
        hold(&mut w, b"c", 5_000 * MS, 1_050 * MS);
        assert!(check(&mut w, 1_900 * MS).is_empty());
    }

    #[test]
    fn an_untold_waiter_owes_the_lock_within_the_timer_and_the_bound() {
        let mut w = checker();
        hold(&mut w, b"a", 300 * MS, 0);
        w.handle_waiter(1, 0, 10 * MS);
        // Expired at 300 ms: nobody publishes.
        assert!(check(&mut w, 1_400 * MS).is_empty());
        assert_eq!(check(&mut w, 1_401 * MS).len(), 1);
    }

    #[test]
    fn a_client_that_cannot_reach_every_master_owes_nothing_until_it_can() {
        let mut w = checker();
        hold(&mut w, b"a", 5_000 * MS, 0);
        w.handle_waiter(1, 0, 10 * MS);
        release(&mut w, 20 * MS);
        w.handle_notice(1, 0, 21 * MS, 0);
        // Disturbed at 50 ms: the message read before counts no more.
        let disturbed = |_| Some((50 * MS, 0));
        assert!(w.check(200 * MS, disturbed, &["r0"]).is_empty());
        assert!(w.check(1_150 * MS, disturbed, &["r0"]).is_empty());
        assert_eq!(w.check(1_151 * MS, disturbed, &["r0"]).len(), 1);
    }

    #[test]
    fn a_client_with_late_messages_owes_the_lock_within_the_slow_bound() {
        let mut w = checker();
        hold(&mut w, b"a", 5_000 * MS, 0);
        w.handle_waiter(1, 0, 10 * MS);
        release(&mut w, 20 * MS);
        w.handle_notice(1, 0, 21 * MS, 0);
        // Late until 15 ms: slow until 25 ms, after the reason.
        let late = |_| Some((0, 15 * MS));
        assert!(w.check(321 * MS, late, &["r0"]).is_empty());
        assert_eq!(w.check(322 * MS, late, &["r0"]).len(), 1);
    }

    #[test]
    fn a_quorum_of_one_token_holds_until_all_but_a_minority_expired() {
        let mut w = checker();
        w.handle_key(0, 0, Some((b"a", 100 * MS)), 0, None);
        w.handle_key(0, 1, Some((b"a", 300 * MS)), 0, None);
        w.handle_key(0, 2, Some((b"b", 900 * MS)), 0, None);
        assert_eq!(w.resources[0].lapse, Some(100 * MS));
        w.handle_key(0, 2, Some((b"a", 200 * MS)), 0, None);
        assert_eq!(w.resources[0].lapse, Some(200 * MS));
        w.handle_waiter(0, 0, 0);
        // Free from 200 ms, seen at the check.
        assert!(check(&mut w, 250 * MS).is_empty());
        assert_eq!(w.resources[0].free_since, Some(200 * MS));
    }

    /// The timer excused any wait up to the old key's TTL. A
    /// lock its waiter's own client released (announced, or handed over)
    /// is owed within the bound from the release, whatever that TTL was,
    /// with no message needed.
    #[test]
    fn a_released_lock_is_owed_by_its_releaser_within_the_bound_whatever_its_old_ttl() {
        for kind in [Kind::Announced, Kind::Unclaimed, Kind::HandOver] {
            let mut w = checker();
            hold(&mut w, b"a", 5_000 * MS, 0);
            w.handle_waiter(1, 0, 10 * MS);
            delete(&mut w, Some((1, b"a", kind)), 20 * MS);
            assert!(check(&mut w, 120 * MS).is_empty(), "{kind:?}");
            let found = check(&mut w, 121 * MS);
            assert_eq!(found.len(), 1, "{kind:?}: {found:?}");
            assert!(found[0].contains("by client 1's"), "{found:?}");
        }
    }

    /// Another client's release reaches this one only by a message: with
    /// none read (its subscriptions refused, say), the timer still
    /// excuses the wait, as it does for a lock freed by expiry, by a
    /// master's data loss or by a failed attempt's quiet cleanup.
    #[test]
    fn a_lock_freed_unseen_by_the_waiter_keeps_the_timer_excuse() {
        let others = [
            Some((0, &b"a"[..], Kind::Announced)),
            Some((0, &b"a"[..], Kind::HandOver)),
            Some((1, &b"a"[..], Kind::Cleanup)),
            None,
        ];
        for by in others {
            let mut w = checker();
            hold(&mut w, b"a", 5_000 * MS, 0);
            w.handle_waiter(1, 0, 10 * MS);
            delete(&mut w, by, 20 * MS);
            assert!(check(&mut w, 1_120 * MS).is_empty(), "{by:?}");
            assert_eq!(check(&mut w, 1_121 * MS).len(), 1, "{by:?}");
        }
    }

    /// A release that deletes its keys on fewer than a quorum of masters
    /// (a late release of a lapsed lock, its other keys expired or taken
    /// since) does not work as far as its client can tell, even when the
    /// key it deletes is the one that frees the lock: the timer excuses
    /// the wait.
    #[test]
    fn a_release_that_deleted_no_quorum_of_keys_keeps_the_timer_excuse() {
        let mut w = checker();
        w.handle_key(0, 0, Some((b"a", 30 * MS)), 0, None);
        w.handle_key(0, 1, Some((b"b", 5_000 * MS)), 0, None);
        w.handle_key(0, 2, Some((b"a", 19 * MS)), 0, None);
        w.handle_waiter(1, 0, 10 * MS);
        let release = Release {
            client: 1,
            token: TokenKey::new(b"a"),
            kind: Kind::Announced,
            sent: 18 * MS,
        };
        // Held by "a" until its key on master 2 expires at 19 ms (the world
        // checks then), then blocked ("a" on one master, "b" on another)
        // until master 0's key of "a" is deleted at 20 ms.
        assert!(check(&mut w, 19 * MS).is_empty());
        assert!(!w.is_free(0, 19 * MS));
        assert!(w.handle_key(0, 0, None, 20 * MS, Some(release)));
        assert!(w.is_free(0, 20 * MS));
        assert!(check(&mut w, 200 * MS).is_empty());
        assert!(check(&mut w, 1_120 * MS).is_empty());
        assert_eq!(check(&mut w, 1_121 * MS).len(), 1);
    }

    /// A release deletes only its own token's key: one that finds another
    /// token's key, or none, frees nothing by itself.
    #[test]
    fn a_release_of_another_token_frees_nothing_of_its_own() {
        let mut w = checker();
        hold(&mut w, b"a", 300 * MS, 0);
        w.handle_waiter(1, 0, 10 * MS);
        let release = Release {
            client: 1,
            token: TokenKey::new(b"b"),
            kind: Kind::Announced,
            sent: 19 * MS,
        };
        assert!(!w.handle_key(0, 0, None, 20 * MS, Some(release)));
        // Free since the expiry of "a" on the other two at 300 ms.
        assert!(check(&mut w, 1_400 * MS).is_empty());
        assert!(w.is_free(0, 1_400 * MS));
        assert_eq!(check(&mut w, 1_401 * MS).len(), 1);
    }

    /// A releaser that could not reach every master after it queued its
    /// release (its connections down when it went out, its reply lost)
    /// has the timer, as any waiter after such a break: as far as it
    /// knows, its release failed, and it tells its waiters nothing.
    #[test]
    fn a_releaser_cut_off_after_its_release_falls_back_to_the_timer() {
        // Cut off after the free, or between queuing the release and the
        // free: owed from the later of the free and the cut, with the
        // timer.
        for (cut, deadline) in [(50 * MS, 1_150 * MS), (19 * MS + 500, 1_120 * MS)] {
            let mut w = checker();
            hold(&mut w, b"a", 5_000 * MS, 0);
            w.handle_waiter(1, 0, 10 * MS);
            // Queued at 19 ms, deleting the keys at 20 ms.
            delete(&mut w, Some((1, b"a", Kind::Announced)), 20 * MS);
            let broken = move |_| Some((cut, 0));
            assert!(w.check(deadline, broken, &["r0"]).is_empty(), "{cut}");
            assert_eq!(w.check(deadline + 1, broken, &["r0"]).len(), 1, "{cut}");
        }
    }
}
