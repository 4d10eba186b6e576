//! The transport side of release notifications: which resources are
//! subscribed on the subscriber connections (one per master), the
//! SUBSCRIBE and UNSUBSCRIBE commands each one has yet to confirm, and
//! what the masters push back, reported as [`Heard`] for the hub's
//! waiting room to read.
//!
//! [`Subscriptions`] takes requests ([`Subscriptions::subscribe`],
//! [`Subscriptions::unsubscribe`]) and never decides who waits, which
//! lock is held here or whose turn it is. A resource is kept until its
//! UNSUBSCRIBEs are confirmed (a message may still come for it meanwhile);
//! then it is [`Heard::Forgotten`]. A subscriber connection awaits at most
//! [`Timing::max_in_flight`](crate::conn::Timing::max_in_flight)
//! confirmations, none for longer than the stall limit, before it is
//! dropped with its subscriptions: a master that stops answering leaves
//! at most that many resources behind, and for no longer. A message for a
//! resource not subscribed is read and dropped. A master that refuses a
//! SUBSCRIBE (`-NOPERM`) answered: nothing is subscribed there any more,
//! and the connection stays. Nothing here touches a socket or reads a
//! clock.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use crate::conn::{Cause, Conn, Role};
use crate::hash::FxMap;
use crate::resp::{Arg, Reply};
use crate::script::RELEASE_CHANNEL_PREFIX;

/// What the subscriber connections heard, for the waiting room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Heard {
    /// A message on `resource`'s release channel: a release's or a
    /// refused attempt's notice (its `payload`, empty when it was no
    /// string).
    Message {
        /// The resource whose channel it came on.
        resource: Bytes,
        /// As published.
        payload: Bytes,
    },
    /// `resource`'s subscription, made again on a new connection, was
    /// confirmed: a release may have been missed while there was none.
    Renewed(Bytes),
    /// `resource` is no longer subscribed anywhere, nor waits for any
    /// confirmation: nothing more will be heard of it.
    Forgotten(Bytes),
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

/// One resource's subscriptions.
#[derive(Debug)]
struct Channel {
    /// Per subscriber connection.
    links: Vec<Link>,
    /// Subscribed (or subscribing) on every subscriber connection: from
    /// [`Subscriptions::subscribe`] until the UNSUBSCRIBEs are sent.
    subscribed: bool,
}

impl Channel {
    /// A resource subscribed nowhere yet, for `links` subscriber
    /// connections.
    fn new(links: usize) -> Channel {
        Channel {
            links: vec![Link::default(); links],
            subscribed: false,
        }
    }

    /// No SUBSCRIBE or UNSUBSCRIBE of it is unconfirmed anywhere.
    fn is_settled(&self) -> bool {
        self.links.iter().all(|l| l.pending == 0)
    }
}

/// The resources subscribed to, per subscriber connection (see the
/// module's docs).
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    /// By resource. A fixed hasher, so that the order the table is walked
    /// in (to subscribe again after a reconnect) is the same in every run:
    /// the client's decisions follow from its inputs alone, and a
    /// simulated run replays. The keys are the application's own resource
    /// names, not a remote party's.
    table: FxMap<Bytes, Channel>,
    /// What was heard and not yet polled.
    heard: VecDeque<Heard>,
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
    /// Per subscriber connection: the SUBSCRIBEs (`true`) and UNSUBSCRIBEs
    /// that found no room on it (see [`Subscriptions::flush`]), in order,
    /// each already counted in its link's `pending`.
    outbox: Vec<Vec<(bool, Bytes)>>,
    /// How many resources are subscribed: the common case, none, costs
    /// no walk of the table (see [`Subscriptions::is_wanted`]).
    subscribed: usize,
}

impl Subscriptions {
    /// Whether any resource is subscribed: subscriber connections are
    /// opened only then.
    pub(crate) fn is_wanted(&self) -> bool {
        self.subscribed > 0
    }

    /// Subscribes `resource` on every subscriber connection that is up
    /// (the others subscribe when they connect): at once where the
    /// connection has room, else in its outbox (see [`post`]).
    pub(crate) fn subscribe(&mut self, subs: &mut [Conn], resource: &Bytes, now: Instant) {
        let channel = self
            .table
            .entry(resource.clone())
            .or_insert_with(|| Channel::new(subs.len()));
        if std::mem::replace(&mut channel.subscribed, true) {
            return;
        }
        self.subscribed += 1;
        self.post_everywhere(subs, true, resource, now);
    }

    /// Unsubscribes `resource` on every subscriber connection that is up
    /// (see [`post`]: an unsubscribe that undoes a subscribe still in the
    /// outbox takes it out). Forgotten at once if nothing is left to
    /// confirm.
    pub(crate) fn unsubscribe(&mut self, subs: &mut [Conn], resource: &Bytes, now: Instant) {
        let Some(channel) = self.table.get_mut(resource) else {
            return;
        };
        if std::mem::take(&mut channel.subscribed) {
            self.subscribed -= 1;
        }
        self.post_everywhere(subs, false, resource, now);
        if self
            .table
            .get(resource)
            .is_some_and(|c| !c.subscribed && c.is_settled())
        {
            self.forget(resource);
        }
    }

    /// [`post`] on every subscriber connection (`subs`) that is up and has
    /// not refused this client, counted in `resource`'s view of each.
    fn post_everywhere(
        &mut self,
        subs: &mut [Conn],
        subscribe: bool,
        resource: &Bytes,
        now: Instant,
    ) {
        let Some(channel) = self.table.get_mut(resource) else {
            return;
        };
        for (i, (link, conn)) in channel.links.iter_mut().zip(subs.iter_mut()).enumerate() {
            if self.refused.get(i).copied().unwrap_or(false) || conn.is_down() {
                continue;
            }
            if subscribe {
                link.renewed = false;
            }
            post(
                &mut self.outbox,
                &mut self.name,
                i,
                conn,
                subscribe,
                resource,
                now,
                link,
            );
        }
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
        now: Instant,
    ) -> bool {
        let Some(channel) = self.table.get(resource) else {
            return true;
        };
        let mut confirmed = 0;
        let mut settled = true;
        for (i, (link, conn)) in channel.links.iter().zip(subs).enumerate() {
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

    /// The next thing heard since the last call.
    pub(crate) fn poll_heard(&mut self) -> Option<Heard> {
        self.heard.pop_front()
    }

    /// Subscriber connection `link` started connecting: every resource
    /// subscribed is subscribed on it (after its AUTH, in the same write),
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
            if channel.subscribed {
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
            if let Some(state) = channel.links.get_mut(link)
                && channel.subscribed
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
        let first = !std::mem::replace(&mut self.warned[link], true);
        crate::metrics::subscribe_refused(first, reply);
        self.handle_link_down(link);
    }

    /// Subscriber connection `link` dropped: its subscriptions are gone
    /// with it.
    pub(crate) fn handle_link_down(&mut self, link: usize) {
        if let Some(outbox) = self.outbox.get_mut(link) {
            outbox.clear();
        }
        for channel in self.table.values_mut() {
            if let Some(state) = channel.links.get_mut(link) {
                *state = Link::default();
            }
        }
        let heard = &mut self.heard;
        self.table.retain(|resource, c| {
            let keep = c.subscribed || !c.is_settled();
            if !keep {
                heard.push_back(Heard::Forgotten(resource.clone()));
            }
            keep
        });
    }

    /// Every subscriber connection that is down dropped (a send found it
    /// too far behind): see [`Subscriptions::handle_link_down`]. For one
    /// that was down already this changes nothing.
    fn handle_links_down(&mut self, subs: &[Conn]) {
        for (link, conn) in subs.iter().enumerate() {
            if conn.is_down() {
                self.handle_link_down(link);
            }
        }
    }

    /// `resource` goes, and the waiting room is told.
    fn forget(&mut self, resource: &[u8]) {
        if let Some((resource, _)) = self.table.remove_entry(resource) {
            self.heard.push_back(Heard::Forgotten(resource));
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
        if !name.starts_with(RELEASE_CHANNEL_PREFIX) {
            return Ok(());
        }
        let resource = &name[RELEASE_CHANNEL_PREFIX.len()..];
        let Some(channel) = self.table.get_mut(resource) else {
            return Ok(());
        };
        match &kind[..] {
            b"message" => {
                let payload = match items.get(2) {
                    Some(Reply::Bulk(payload)) => payload.clone(),
                    _ => Bytes::new(),
                };
                self.heard.push_back(Heard::Message {
                    resource: name.slice(RELEASE_CHANNEL_PREFIX.len()..),
                    payload,
                });
            }
            b"subscribe" | b"unsubscribe" => {
                let Some(state) = channel.links.get_mut(link) else {
                    return Ok(());
                };
                state.pending = state.pending.saturating_sub(1);
                if kind[..] == b"subscribe"[..] && std::mem::take(&mut state.renewed) {
                    let resource = name.slice(RELEASE_CHANNEL_PREFIX.len()..);
                    self.heard.push_back(Heard::Renewed(resource));
                }
                if !channel.subscribed && channel.is_settled() {
                    self.forget(resource);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The subscriber connections on which `resource`'s subscription
    /// counts toward [`Subscriptions::is_listening`]: not refused, up,
    /// with nothing unconfirmed.
    #[cfg(test)]
    pub(crate) fn confirmed(&self, subs: &[Conn], resource: &[u8]) -> Vec<usize> {
        let Some(channel) = self.table.get(resource) else {
            return Vec::new();
        };
        (channel.links.iter().zip(subs).enumerate())
            .filter(|(i, (link, conn))| {
                !self.refused.get(*i).copied().unwrap_or(false)
                    && !conn.is_down()
                    && link.pending == 0
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// How many resources are tracked (subscribed, or with commands
    /// unconfirmed).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// Queues a SUBSCRIBE (`subscribe`) or UNSUBSCRIBE of `resource`'s
/// channel on subscriber connection `i` (`conn`, up; `link`, the
/// resource's view of it, counts it unconfirmed): at once while the
/// connection has room and nothing waits before it, else into its outbox
/// for [`Subscriptions::flush`]. One that undoes the resource's last
/// command still in the outbox takes it out instead: neither is sent.
/// Waiters coming and going on ever new resources while a master does not
/// answer then leave the outbox as it was, not one pair each.
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
    use bytes::BytesMut;

    use super::*;
    use crate::resp::{self, Limits};
    use crate::script::Scripts;

    const R: &[u8] = b"orders:42";

    fn resource() -> Bytes {
        Bytes::from_static(R)
    }

    /// `n` subscriber connections, connected.
    fn subs(n: usize, now: Instant) -> Vec<Conn> {
        let config = crate::Config::new(["redis://127.0.0.1:7000"]).unwrap();
        (0..n)
            .map(|i| {
                let addr = format!("redis://127.0.0.1:{}", 7000 + i).parse().unwrap();
                let mut conn = Conn::with_role(
                    Role::Subscriber,
                    addr,
                    Scripts::new(),
                    Limits::default(),
                    config.timing(),
                    now,
                );
                conn.handle_connect_started(now);
                conn.handle_connected();
                conn
            })
            .collect()
    }

    /// `n` subscriber connections with `R` subscribed on each.
    fn subscribed(n: usize, now: Instant) -> (Vec<Conn>, Subscriptions) {
        let mut subs = subs(n, now);
        let mut subscriptions = Subscriptions::default();
        subscriptions.subscribe(&mut subs, &resource(), now);
        (subs, subscriptions)
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

    fn confirm(subscriptions: &mut Subscriptions, links: &[usize], kind: &str) {
        for &link in links {
            subscriptions
                .handle_push(link, push(kind, R, Reply::Integer(1)))
                .unwrap();
        }
    }

    /// Everything heard since the last call.
    fn heard(subscriptions: &mut Subscriptions) -> Vec<Heard> {
        std::iter::from_fn(|| subscriptions.poll_heard()).collect()
    }

    #[test]
    fn a_subscription_goes_to_every_connection_and_is_forgotten_once_its_end_is_confirmed() {
        let now = Instant::now();
        assert!(!Subscriptions::default().is_wanted());
        let (mut subs, mut subscriptions) = subscribed(3, now);
        subscriptions.subscribe(&mut subs, &resource(), now);
        for conn in &mut subs {
            assert_eq!(sent(conn), ["SUBSCRIBE redlock:released:orders:42"]);
        }
        assert!(subscriptions.is_wanted());
        confirm(&mut subscriptions, &[0, 1, 2], "subscribe");
        subscriptions.unsubscribe(&mut subs, &resource(), now);
        for conn in &mut subs {
            assert_eq!(sent(conn), ["UNSUBSCRIBE redlock:released:orders:42"]);
        }
        assert!(!subscriptions.is_wanted());
        assert_eq!(subscriptions.len(), 1, "kept until confirmed");
        confirm(&mut subscriptions, &[0, 1], "unsubscribe");
        assert!(heard(&mut subscriptions).is_empty());
        confirm(&mut subscriptions, &[2], "unsubscribe");
        assert_eq!(subscriptions.len(), 0);
        assert_eq!(heard(&mut subscriptions), [Heard::Forgotten(resource())]);
    }

    #[test]
    fn a_waiter_listens_once_enough_masters_confirmed_that_every_release_reaches_it() {
        let now = Instant::now();
        let mut subs = subs(3, now);
        let mut subscriptions = Subscriptions::default();
        assert!(
            subscriptions.is_listening(&subs, R, 2, now),
            "nothing to wait for"
        );
        subscriptions.subscribe(&mut subs, &resource(), now);
        assert!(!subscriptions.is_listening(&subs, R, 2, now));
        // A release deletes on 2 of 3 masters: one confirmation could be
        // the master it skipped.
        confirm(&mut subscriptions, &[0], "subscribe");
        assert!(!subscriptions.is_listening(&subs, R, 2, now));
        confirm(&mut subscriptions, &[2], "subscribe");
        assert!(subscriptions.is_listening(&subs, R, 2, now));
        assert_eq!(subscriptions.confirmed(&subs, R), [0, 2]);
        // A master whose subscriber connection is down and backing off
        // holds nobody back.
        let (mut subs, mut subscriptions) = subscribed(3, now);
        subs[1].handle_failure(now, Cause::Closed);
        subs[1].handle_failure(now, Cause::Closed);
        subscriptions.handle_link_down(1);
        confirm(&mut subscriptions, &[0], "subscribe");
        assert!(!subscriptions.is_listening(&subs, R, 2, now));
        confirm(&mut subscriptions, &[2], "subscribe");
        assert!(subscriptions.is_listening(&subs, R, 2, now));
    }

    #[test]
    fn messages_are_heard_for_resources_subscribed_alone_and_other_frames_change_nothing() {
        let now = Instant::now();
        let (_subs, mut subscriptions) = subscribed(1, now);
        confirm(&mut subscriptions, &[0], "subscribe");
        let payload = Bytes::from_static(b"token:7");
        for frame in [
            push("message", b"other", Reply::Bulk(payload.clone())),
            push("message", R, Reply::Bulk(payload.clone())),
            // Garbage in the payload is still heard: the key may be free.
            push("message", R, Reply::Integer(3)),
            Reply::Nil,
            push("pmessage", R, Reply::Nil),
        ] {
            subscriptions.handle_push(0, frame).unwrap();
        }
        assert_eq!(
            heard(&mut subscriptions),
            [
                Heard::Message {
                    resource: resource(),
                    payload
                },
                Heard::Message {
                    resource: resource(),
                    payload: Bytes::new()
                },
            ]
        );
        assert!(matches!(
            subscriptions.handle_push(0, Reply::Error(Bytes::from_static(b"ERR no"))),
            Err(Cause::Server(_))
        ));
    }

    #[test]
    fn a_subscription_refused_is_an_answer_the_connection_stays_and_sends_no_more() {
        let now = Instant::now();
        let (mut subs, mut subscriptions) = subscribed(3, now);
        for conn in &mut subs {
            sent(conn);
        }
        let noperm = Reply::Error(Bytes::from_static(b"NOPERM no"));
        assert!(subscriptions.handle_push(1, noperm).is_ok());
        assert!(!subs[1].is_down());
        confirm(&mut subscriptions, &[0], "subscribe");
        assert!(
            !subscriptions.is_listening(&subs, R, 2, now),
            "one of two left"
        );
        confirm(&mut subscriptions, &[2], "subscribe");
        assert!(subscriptions.is_listening(&subs, R, 2, now));
        let other = Bytes::from_static(b"other");
        subscriptions.subscribe(&mut subs, &other, now);
        assert!(sent(&mut subs[1]).is_empty(), "refused there");
        assert_eq!(sent(&mut subs[0]), ["SUBSCRIBE redlock:released:other"]);
        // Nothing unconfirmed there: an unsubscribe settles without it.
        subscriptions.unsubscribe(&mut subs, &other, now);
        confirm_on(&mut subscriptions, &other, &[0, 2]);
        assert_eq!(heard(&mut subscriptions), [Heard::Forgotten(other)]);
    }

    fn confirm_on(subscriptions: &mut Subscriptions, resource: &[u8], links: &[usize]) {
        for &link in links {
            subscriptions
                .handle_push(link, push("subscribe", resource, Reply::Integer(1)))
                .unwrap();
            subscriptions
                .handle_push(link, push("unsubscribe", resource, Reply::Integer(0)))
                .unwrap();
        }
    }

    #[test]
    fn a_subscription_renewed_after_its_connection_dropped_is_heard_as_renewed() {
        let now = Instant::now();
        let (mut subs, mut subscriptions) = subscribed(2, now);
        confirm(&mut subscriptions, &[0, 1], "subscribe");
        for conn in &mut subs {
            sent(conn);
        }
        subs[0].handle_failure(now, Cause::Closed);
        subscriptions.handle_link_down(0);
        subs[0].handle_connect_started(now);
        subscriptions.handle_link_up(0, &mut subs[0], now);
        subs[0].handle_connected();
        assert_eq!(sent(&mut subs[0]), ["SUBSCRIBE redlock:released:orders:42"]);
        assert!(
            subscriptions.is_listening(&subs, R, 2, now),
            "one of two suffices"
        );
        assert!(heard(&mut subscriptions).is_empty());
        confirm(&mut subscriptions, &[0], "subscribe");
        assert_eq!(
            heard(&mut subscriptions),
            [Heard::Renewed(resource())],
            "a release may have been missed"
        );
    }

    #[test]
    fn a_new_resource_is_settled_until_a_command_of_it_is_unconfirmed() {
        let mut channel = Channel::new(3);
        assert!(channel.is_settled());
        assert!(!channel.subscribed);
        channel.links[1].pending = 1;
        assert!(!channel.is_settled());
    }

    #[test]
    fn past_half_the_bound_commands_wait_in_the_outbox_and_an_unsubscribe_takes_its_subscribe_out()
    {
        let now = Instant::now();
        let mut subs = subs(1, now);
        let mut subscriptions = Subscriptions::default();
        let half = crate::Config::new(["redis://127.0.0.1:7000"])
            .unwrap()
            .timing()
            .max_in_flight
            / 2;
        let names: Vec<Bytes> = (0..=half).map(|k| Bytes::from(format!("r{k}"))).collect();
        for name in &names {
            subscriptions.subscribe(&mut subs, name, now);
        }
        assert_eq!(sent(&mut subs[0]).len(), half, "the last one waits");
        let last = &names[half];
        subscriptions.unsubscribe(&mut subs, last, now);
        assert_eq!(subscriptions.len(), half, "never sent: forgotten at once");
        assert_eq!(heard(&mut subscriptions), [Heard::Forgotten(last.clone())]);
        // Still no room: what waits stays there (the engine's simulation
        // shows it going as one command once confirmations come back).
        let other = Bytes::from_static(b"other");
        subscriptions.subscribe(&mut subs, &other, now);
        subscriptions.flush(&mut subs, now);
        assert!(sent(&mut subs[0]).is_empty());
        assert!(!subscriptions.is_listening(&subs, b"other", 1, now));
    }
}
