//! Operations run on their caller's thread ([`Hub::run_inline`]), as
//! every [`Redlock`](crate::Redlock) call and a lone blocking
//! [`SharedRedlock`](crate::SharedRedlock) caller's are: with the hub
//! idle, the caller makes the job and drives its rounds itself, each to
//! its end through the [`Drive`] the hub's links implement; the loop is
//! locked out meanwhile. A job that would wait is handed to the hub
//! ([`Hub::handle_waiting_job`]).
//!
//! In the world, such a caller's client is blocked while its round runs:
//! its hub is out of its place (on the run's stack, running the job), and
//! the world goes on around it, event by event, from inside
//! [`Drive::run`]: the masters, the network and the other clients as
//! ever; of this client, only what its caller's driver would do, the
//! engine's inputs (bytes read, connects, resets) and its time limits.
//! Its other callers' operations and its hub's timers wait until the
//! operation is done. One operation runs inline at a time in the world.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use super::{Event, HUB_HOME, LinkState, SimLinks, SimPromise, World};
use crate::clock::Stamp;
use crate::conn::Cause;
use crate::engine::{Engine, RoundId};
use crate::hub::{Drive, Hub, Order, Promise, Ran};
use crate::job::Job;

/// Why the world is there: an operation runs inline only within a run.
const IN_RUN: &str = "an operation runs inline only inside its world's run";

/// An operation a blocking caller runs inline, with its client's hub.
pub(super) struct Call {
    client: usize,
    hub: Box<Hub<SimPromise, SimLinks>>,
    job: Job,
    completion: SimPromise,
}

/// The links drive a round run inline by running the world around it.
impl Drive for SimLinks {
    fn now(&self) -> Stamp {
        self.clock.stamp(self.now.get())
    }

    fn run(&mut self, engine: &mut Engine, id: RoundId, _spin: bool) {
        let world = self.world.upgrade().expect(IN_RUN);
        world.borrow_mut().drive_inline(self.client, engine, id);
    }

    fn send(&mut self, engine: &mut Engine) {
        let world = self.world.upgrade().expect(IN_RUN);
        world.borrow_mut().flush_engine(self.client, engine);
    }
}

impl World {
    /// Client `client`'s blocking caller runs `order` inline, its hub idle
    /// (see `World::submit`): the job is made now, and run once the event
    /// at hand is handled ([`World::run_inline`]). An order refused before
    /// anything is sent ends here, as `SharedRedlock::try_inline` does.
    pub(super) fn start_inline(&mut self, client: usize, order: Order, completion: SimPromise) {
        let c = &mut self.clients[client];
        let now = c.clock.stamp(self.now).mono;
        match c.hub().make_job(order, now) {
            Ok(job) => {
                let hub = c.core.take().expect(HUB_HOME);
                // Its timers wait for the operation's end: a wake-up come
                // meanwhile is stale, and the hub asks again after.
                c.wake = None;
                c.inline_wake = None;
                self.inline_active = Some(client);
                self.inline_call = Some(Box::new(Call {
                    client,
                    hub,
                    job,
                    completion,
                }));
            }
            Err(output) => {
                let _ = completion.complete(output);
            }
        }
    }

    /// Runs `call` on the run's stack, the world shared with the client's
    /// links, which drive its rounds; then hands the hub back.
    pub(super) fn run_inline(world: &Rc<RefCell<World>>, call: Box<Call>) {
        let Call {
            client,
            mut hub,
            job,
            completion,
        } = *call;
        hub.io().1.world = Rc::downgrade(world);
        let ran = hub.run_inline(job);
        world.borrow_mut().outcome.inline += 1;
        hub.io().1.world = Weak::new();
        world.borrow_mut().end_inline(client, hub, ran, completion);
    }

    /// Drives the world until round `id` of client `client`'s operation run
    /// inline is complete, as its caller's driver does: writes what its
    /// engine queued, waits for the next event, reads it, applies the
    /// engine's time limits.
    fn drive_inline(&mut self, client: usize, engine: &mut Engine, id: RoundId) {
        loop {
            self.flush_engine(client, engine);
            if engine.is_complete(id) {
                return;
            }
            self.wake_inline(client, engine);
            let (at, event) = self
                .events
                .pop()
                .expect("a round run inline has its deadline to come");
            self.advance_to(at);
            if self.now >= self.waiting.next_check {
                self.check_waiting();
            }
            // As the hub's turn does (see `Watch::look`).
            let now = self.clients[client].clock.stamp(self.now).mono;
            let links = (0..engine.links()).map(|i| engine.link(i));
            self.clients[client].watch.borrow_mut().look(links, now);
            self.handle_inline(client, engine, event);
        }
    }

    /// Asks for an event when client `client`'s engine, running a round
    /// inline, next needs the time.
    fn wake_inline(&mut self, client: usize, engine: &Engine) {
        let Some(at) = engine.poll_timeout() else {
            return;
        };
        let c = &mut self.clients[client];
        let at = c.clock.virtual_at(at).max(self.now + 1);
        if c.inline_wake.is_none_or(|w| w > at) {
            c.inline_wake = Some(at);
            self.schedule(at, Event::InlineWake { client, at });
        }
    }

    /// `event`, while client `client`'s operation runs inline on `engine`.
    fn handle_inline(&mut self, client: usize, engine: &mut Engine, event: Event) {
        match event {
            Event::ToClient {
                client: c,
                link,
                id,
                bytes,
                notice,
            } if c == client => {
                let cl = &mut self.clients[c];
                if cl.links[link].state != (LinkState::Up { id }) {
                    return;
                }
                let now = cl.clock.stamp(self.now).mono;
                engine.handle_input(link, &bytes, now);
                engine.handle_timeout(now);
                if let Some(r) = notice {
                    self.contended[c][r] = true;
                    self.notice(c, r);
                }
            }
            Event::Connect {
                client: c,
                link,
                id,
            } if c == client => {
                if self.connect_engine(c, engine, link, id) {
                    let now = self.clients[c].clock.stamp(self.now).mono;
                    engine.handle_timeout(now);
                }
            }
            Event::Reset {
                client: c,
                link,
                id,
            } if c == client => {
                let cl = &mut self.clients[c];
                if matches!(cl.links[link].state, LinkState::Up { id: x } | LinkState::Connecting { id: x } if x == id)
                {
                    cl.links[link].state = LinkState::Down;
                    let now = cl.clock.stamp(self.now).mono;
                    engine.handle_failure(link, now, Cause::Closed);
                    engine.handle_timeout(now);
                }
            }
            Event::InlineWake { client: c, at } if c == client => {
                let cl = &mut self.clients[c];
                if cl.inline_wake == Some(at) {
                    cl.inline_wake = None;
                    let now = cl.clock.stamp(self.now).mono;
                    engine.handle_timeout(now);
                }
            }
            // Its callers are busy: their next operations come after; so
            // does a burst, which has every client's callers act.
            Event::Work { client: c }
            | Event::QuickRelease { client: c, .. }
            | Event::Abandon { client: c, .. }
                if c == client =>
            {
                self.clients[c].held_back.push(event);
            }
            Event::Burst { .. } => self.clients[client].held_back.push(event),
            // Its hub's timers: it asks again when it is home.
            Event::Wake { client: c, .. } | Event::Unpause { client: c } if c == client => {}
            event => self.handle(event),
        }
    }

    /// Client `client`'s operation run inline ended as `ran`: its output to
    /// its caller, or the job to the hub, which goes home and takes its
    /// turn; what waited for the operation comes now.
    fn end_inline(
        &mut self,
        client: usize,
        mut hub: Box<Hub<SimPromise, SimLinks>>,
        ran: Ran,
        completion: SimPromise,
    ) {
        let c = &mut self.clients[client];
        let stamp = c.clock.stamp(self.now);
        match ran {
            Ran::Done(output) => {
                let _ = completion.complete(output);
            }
            Ran::Waiting(job, span) => hub.handle_waiting_job(job, completion, span, stamp),
        }
        c.core = Some(hub);
        c.inline_wake = None;
        self.inline_active = None;
        for event in std::mem::take(&mut c.held_back) {
            self.schedule(self.now, event);
        }
        self.step(client);
    }
}
