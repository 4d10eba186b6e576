//! What an open-loop run measured: each operation timed from its intended
//! start and from its actual send.
//!
//! This module owns the correction that makes an open-loop figure honest
//! (Gil Tene's coordinated omission, as wrk2 corrects it): an operation's
//! latency runs from when the schedule meant it to start, so that the
//! operations that queued behind a stall carry the stall; its service time
//! runs from when it was actually sent, which is what a closed loop
//! reports. It also owns the warm-up (operations meant to start before the
//! measured window are sent but not recorded), the counts of what failed,
//! and one histogram pair per interval for the HdrHistogram log. It takes
//! instants from the driver and reads no clock.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Values are microseconds, up to an hour.
pub(crate) const HIGHEST_US: u64 = 3_600_000_000;

/// The instants of one operation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// When the schedule meant it to start.
    pub(crate) intended: Instant,
    /// When it was sent.
    pub(crate) sent: Instant,
    /// When its last reply came.
    pub(crate) done: Instant,
}

impl Timing {
    /// From the intended start to the last reply: what a caller that
    /// needed a lock at its intended start waited.
    pub(crate) fn latency(&self) -> Duration {
        let from = if knob::time_from_send() {
            self.sent
        } else {
            self.intended
        };
        self.done.saturating_duration_since(from)
    }

    /// From the send to the last reply: what a closed loop reports.
    pub(crate) fn service(&self) -> Duration {
        self.done.saturating_duration_since(self.sent)
    }

    /// How late the send was: the generator's own delay, or the wait for
    /// a free caller.
    pub(crate) fn send_lag(&self) -> Duration {
        self.sent.saturating_duration_since(self.intended)
    }
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Locked and released.
    Done,
    /// The lock was held elsewhere (contention).
    Failed,
    /// Masters unreachable, slow rounds, a failed release.
    Errored,
}

/// Latency and service time, one histogram each.
#[derive(Debug, Clone)]
pub(crate) struct Pair {
    /// From the intended start.
    pub(crate) latency: Histogram<u64>,
    /// From the actual send.
    pub(crate) service: Histogram<u64>,
}

impl Pair {
    pub(crate) fn new() -> Pair {
        Pair {
            latency: histogram(),
            service: histogram(),
        }
    }

    fn add(&mut self, other: &Pair) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.latency.add(&other.latency);
        let _ = self.service.add(&other.service);
    }
}

/// A histogram of microseconds up to an hour, three significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGHEST_US, 3)
        .unwrap_or_else(|e| unreachable!("constant histogram bounds: {e}"))
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One caller's record of a run; merged with the others' at the end.
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    /// The first intended start that is measured: the end of the warm-up.
    measured_from: Instant,
    /// The end of the measured window.
    end: Instant,
    /// Each interval's length, for the HdrHistogram log.
    interval: Duration,
    /// Successful operations over the whole measured window.
    pub(crate) total: Pair,
    /// The same, by the interval (from `measured_from`) their reply came
    /// in.
    pub(crate) intervals: Vec<Pair>,
    /// The latest send, relative to its intended start.
    pub(crate) max_send_lag: Duration,
    /// Measured operations by outcome.
    pub(crate) done: u64,
    pub(crate) failed: u64,
    pub(crate) errored: u64,
    /// Measured operations whose reply came before `end`: the achieved
    /// rate's numerator.
    pub(crate) completed_in_window: u64,
    /// Operations sent during the warm-up, not recorded.
    pub(crate) warm_up: u64,
}

impl Recorder {
    /// Records operations meant to start from `measured_from` on, in
    /// histograms per `interval`; `end` closes the measured window.
    pub(crate) fn new(measured_from: Instant, end: Instant, interval: Duration) -> Recorder {
        Recorder {
            measured_from,
            end,
            interval: interval.max(Duration::from_millis(1)),
            total: Pair::new(),
            intervals: Vec::new(),
            max_send_lag: Duration::ZERO,
            done: 0,
            failed: 0,
            errored: 0,
            completed_in_window: 0,
            warm_up: 0,
        }
    }

    /// Records one operation. Only successful ones enter the histograms,
    /// as in the closed-loop bench; every one is counted.
    pub(crate) fn handle_done(&mut self, timing: Timing, outcome: Outcome) {
        if timing.intended < self.measured_from {
            self.warm_up += 1;
            return;
        }
        self.max_send_lag = self.max_send_lag.max(timing.send_lag());
        if timing.done <= self.end {
            self.completed_in_window += 1;
        }
        match outcome {
            Outcome::Done => self.done += 1,
            Outcome::Failed => {
                self.failed += 1;
                return;
            }
            Outcome::Errored => {
                self.errored += 1;
                return;
            }
        }
        let latency = micros(timing.latency());
        let service = micros(timing.service());
        self.total.latency.saturating_record(latency);
        self.total.service.saturating_record(service);
        let since = timing.done.saturating_duration_since(self.measured_from);
        let slot = usize::try_from(since.as_nanos() / self.interval.as_nanos()).unwrap_or(0);
        if self.intervals.len() <= slot {
            self.intervals.resize_with(slot + 1, Pair::new);
        }
        let pair = &mut self.intervals[slot];
        pair.latency.saturating_record(latency);
        pair.service.saturating_record(service);
    }

    /// Adds another caller's record to this one.
    pub(crate) fn merge(&mut self, other: &Recorder) {
        self.total.add(&other.total);
        if self.intervals.len() < other.intervals.len() {
            self.intervals.resize_with(other.intervals.len(), Pair::new);
        }
        for (mine, theirs) in self.intervals.iter_mut().zip(&other.intervals) {
            mine.add(theirs);
        }
        self.max_send_lag = self.max_send_lag.max(other.max_send_lag);
        self.done += other.done;
        self.failed += other.failed;
        self.errored += other.errored;
        self.completed_in_window += other.completed_in_window;
        self.warm_up += other.warm_up;
    }

    /// Measured operations, whatever their outcome.
    pub(crate) fn measured(&self) -> u64 {
        self.done + self.failed + self.errored
    }
}

/// The test-only switch that breaks the correction: latency timed from
/// the actual send, as a closed loop times it. The tests below show that
/// their check of the correction fails with it on.
#[cfg(test)]
pub(crate) mod knob {
    use std::cell::Cell;

    thread_local! {
        static TIME_FROM_SEND: Cell<bool> = const { Cell::new(false) };
    }

    pub(crate) fn time_from_send() -> bool {
        TIME_FROM_SEND.with(Cell::get)
    }

    pub(crate) fn set_time_from_send(on: bool) {
        TIME_FROM_SEND.with(|k| k.set(on));
    }
}

#[cfg(not(test))]
mod knob {
    pub(crate) const fn time_from_send() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openloop::schedule::{Arrivals, Schedule};

    const US: Duration = Duration::from_micros(1);

    /// One caller (one operation in flight at a time) at 1,000/s for 10 s
    /// of virtual time: each operation takes 100 µs, but the one meant to
    /// start at 5 s takes `stall`. The caller sends each at its intended
    /// start or, when it is still busy then, as soon as it is free.
    fn simulate(stall: Duration, warm_up: Duration) -> Recorder {
        let origin = Instant::now();
        let length = Duration::from_secs(10);
        let mut schedule = Schedule::new(origin, 1000.0, length, Arrivals::Constant).unwrap();
        let mut recorder = Recorder::new(origin + warm_up, origin + length, Duration::from_secs(1));
        let mut free = origin;
        while let Some(op) = schedule.poll_next() {
            let sent = op.at.max(free);
            let took = if op.index == 5000 { stall } else { 100 * US };
            let done = sent + took;
            free = done;
            let timing = Timing {
                intended: op.at,
                sent,
                done,
            };
            recorder.handle_done(timing, Outcome::Done);
        }
        recorder
    }

    /// The correction's property: a 200 ms stall at 1,000/s delays the
    /// ~200 operations meant to start during it, so the latency's p99 is
    /// tens of milliseconds while the service time's stays at 100 µs.
    fn check_the_stall_shows(r: &Recorder) -> Result<(), String> {
        let latency_p99 = r.total.latency.value_at_quantile(0.99);
        let latency_p999 = r.total.latency.value_at_quantile(0.999);
        let service_p99 = r.total.service.value_at_quantile(0.99);
        if service_p99 > 101 {
            return Err(format!("service p99 {service_p99} µs"));
        }
        // The ops queued behind the stall waited 200 ms down to 0: the
        // slowest 1% (100 of 10,000) waited at least 100 ms, the 0.1% at
        // least 180 ms.
        if latency_p99 < 99_000 || latency_p999 < 179_000 {
            return Err(format!(
                "latency p99 {latency_p99} µs, p99.9 {latency_p999} µs: the stall is hidden"
            ));
        }
        Ok(())
    }

    #[test]
    fn a_stall_delays_the_operations_meant_to_start_during_it() {
        let r = simulate(Duration::from_millis(200), Duration::ZERO);
        check_the_stall_shows(&r).unwrap();
        assert_eq!(r.done, 10_000);
        assert_eq!(
            r.total.latency.max(),
            r.total.service.max(),
            "the stalled op itself"
        );
        assert!(r.max_send_lag >= Duration::from_millis(199));
    }

    #[test]
    fn timed_from_the_send_the_stall_check_fails() {
        // The knob of the module: latency timed from the actual send. The
        // check above must catch it, or it checks nothing.
        knob::set_time_from_send(true);
        let r = simulate(Duration::from_millis(200), Duration::ZERO);
        knob::set_time_from_send(false);
        let err = check_the_stall_shows(&r).unwrap_err();
        assert!(err.contains("the stall is hidden"), "{err}");
    }

    #[test]
    fn latency_is_never_below_service_time() {
        let r = simulate(Duration::from_millis(200), Duration::ZERO);
        for q in [0.5, 0.9, 0.99, 0.999, 0.9999, 1.0] {
            assert!(
                r.total.latency.value_at_quantile(q) >= r.total.service.value_at_quantile(q),
                "at {q}"
            );
        }
    }

    #[test]
    fn with_no_stall_latency_and_service_agree() {
        let r = simulate(100 * US, Duration::ZERO);
        assert_eq!(r.total.latency.max(), 100);
        assert_eq!(r.total.service.max(), 100);
        assert_eq!(r.max_send_lag, Duration::ZERO);
    }

    #[test]
    fn the_warm_up_is_sent_but_not_recorded() {
        let r = simulate(Duration::from_millis(200), Duration::from_secs(6));
        assert_eq!(r.warm_up, 6000);
        assert_eq!(r.done, 4000);
        assert_eq!(r.total.latency.len(), 4000);
        // The stall was in the warm-up, and the operations it delayed too.
        assert!(r.total.latency.max() < 1000, "{}", r.total.latency.max());
    }

    #[test]
    fn operations_are_counted_by_outcome_and_only_successes_timed() {
        let origin = Instant::now();
        let mut r = Recorder::new(
            origin,
            origin + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let t = |sent_us: u64, done_us: u64| Timing {
            intended: origin,
            sent: origin + Duration::from_micros(sent_us),
            done: origin + Duration::from_micros(done_us),
        };
        r.handle_done(t(0, 10), Outcome::Done);
        r.handle_done(t(5, 20), Outcome::Failed);
        r.handle_done(t(5, 2_000_000), Outcome::Errored);
        assert_eq!((r.done, r.failed, r.errored, r.measured()), (1, 1, 1, 3));
        assert_eq!(r.total.latency.len(), 1);
        assert_eq!(r.completed_in_window, 2, "the error replied after the end");
    }

    #[test]
    fn intervals_are_by_reply_time_and_merge_adds_them() {
        let origin = Instant::now();
        let end = origin + Duration::from_secs(3);
        let mut a = Recorder::new(origin, end, Duration::from_secs(1));
        let mut b = a.clone();
        let at = |ms: u64| Timing {
            intended: origin,
            sent: origin,
            done: origin + Duration::from_millis(ms),
        };
        a.handle_done(at(500), Outcome::Done);
        b.handle_done(at(2500), Outcome::Done);
        b.handle_done(at(2600), Outcome::Done);
        a.merge(&b);
        let counts: Vec<u64> = a.intervals.iter().map(|p| p.latency.len()).collect();
        assert_eq!(counts, [1, 0, 2]);
        assert_eq!(a.total.latency.len(), 3);
        assert_eq!(a.done, 3);
    }

    #[test]
    fn a_reply_stamped_before_its_send_times_as_zero() {
        let origin = Instant::now();
        let t = Timing {
            intended: origin + US,
            sent: origin + 2 * US,
            done: origin,
        };
        assert_eq!(
            (t.latency(), t.service(), t.send_lag()),
            (Duration::ZERO, Duration::ZERO, US)
        );
    }
}
