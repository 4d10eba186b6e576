//! A job run on its caller's own thread: [`Redlock`](crate::Redlock)'s
//! every operation, and a blocking [`SharedRedlock`](crate::SharedRedlock)
//! call that finds the loop idle. Its rounds are driven there and then by
//! a [`Drive`]; once it would wait, the hub takes it over.

use std::time::Instant;

use super::{Hub, Links, Promise, Split};
use crate::clock::Stamp;
use crate::engine::{Engine, RoundId};
use crate::error::Error;
use crate::job::{Job, Output, Step};
use crate::metrics::OpSpan;

/// What running a job on its caller's own thread asks of the world
/// besides [`Links`] ([`Hub::run_inline`]): the time, and each round
/// driven to its end there and then.
pub(crate) trait Drive: Links {
    /// Both clocks, now.
    fn now(&self) -> Stamp;

    /// Writes and reads until round `id` is complete; with `spin`, busy
    /// waiting ([`Config::spin`]).
    fn run(&mut self, engine: &mut Engine, id: RoundId, spin: bool);

    /// Writes what the connections have queued, waiting for no reply.
    fn send(&mut self, engine: &mut Engine);
}

/// How a job run on its caller's thread ([`Hub::run_inline`]) ended.
// Held for a moment on the stack: boxing the job would allocate.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Ran {
    /// Done: its output.
    Done(Output),
    /// It waits (to retry, or for a release): the hub takes it over
    /// ([`Hub::handle_waiting_job`]), with its span.
    Waiting(Job, OpSpan),
}

impl<P: Promise, L: Drive> Hub<P, L> {
    /// Runs `job` on the calling thread, with the hub idle (nothing of
    /// the loop's own in flight): its rounds, sends and outcome, each
    /// round driven to its end by the [`Drive`]. [`Ran::Waiting`] when
    /// the job would wait (to retry, or for a release): it goes to
    /// [`Hub::handle_waiting_job`] then. Both clients' callers run their
    /// operations this way: [`Redlock`](crate::Redlock) always, a blocking
    /// [`SharedRedlock`](crate::SharedRedlock) call when it is alone.
    pub(crate) fn run_inline(&mut self, mut job: Job) -> Ran {
        let span = job.span();
        super::hear(&mut self.room, &mut self.engine);
        // Another process's turn at the lock under way: the job waits for
        // it as a queued waiter, not try ahead of that process. The clock
        // is read only when a turn is known.
        if job
            .resource()
            .and_then(|r| self.room.theirs_since(r))
            .is_some_and(|since| super::turn_over_at(&self.config, since) > self.links.now().mono)
        {
            let _ = job.queue_first();
            return Ran::Waiting(job, span);
        }
        let ended = {
            let _entered = span.enter();
            self.run_rounds(&mut job)
        };
        let Some(now) = ended else {
            return Ran::Waiting(job, span);
        };
        let output = job.take_output(now);
        if let Some(requests) = job.into_requests() {
            self.spare = requests;
        }
        let output = output.unwrap_or(Output::Released(Err(Error::Os(std::io::ErrorKind::Other))));
        span.record(output.first_error());
        Ran::Done(output)
    }

    /// [`Hub::run_inline`]'s rounds: the instant `job` was done, or none
    /// when it waits (to retry, or for a release).
    fn run_rounds(&mut self, job: &mut Job) -> Option<Instant> {
        let spin = self.config.spin;
        loop {
            let Split {
                engine,
                links,
                mut ctx,
            } = self.split();
            let now = links.now().mono;
            // No admission gate here: the hub is idle, so no other
            // caller's request shares the connections, and a master that
            // piles up requests meanwhile lags alone, which its
            // connection's bound is for. Gated, a `Redlock` behind a slow
            // master waited for it to turn unresponsive, and allocated
            // handing its job to the hub (`tests/alloc.rs`).
            match job.poll(&mut ctx, now) {
                Step::Round {
                    requests,
                    timeout,
                    wait,
                } => {
                    links.prepare(engine, now);
                    let started = links.now();
                    let id = engine.start(requests, started.mono, timeout, wait);
                    links.run(engine, id, spin);
                    let ended = links.now();
                    engine.end(id);
                    if let Some(round) = engine.round(id) {
                        job.handle_round(&mut ctx, round, started, ended);
                    }
                    engine.free(id);
                    // Idle: the only rounds completed are this one and
                    // releases nobody waits for.
                    while engine.poll_completed().is_some() {}
                    self.check_distinct();
                }
                Step::Send { requests, skip } => {
                    links.prepare(engine, now);
                    engine.send(requests, now, skip);
                    links.send(engine);
                    while engine.poll_completed().is_some() {}
                }
                Step::Sleep(_) | Step::Subscribe(_) | Step::Await { .. } => return None,
                Step::Done => return Some(now),
            }
        }
    }
}
