//! When each operation of an open-loop run is meant to start.
//!
//! This module owns the intended start times: the i-th operation is due at
//! `origin + i / R` (constant arrivals) or after exponentially distributed
//! gaps of mean `1 / R` drawn from a seeded generator (Poisson arrivals).
//! Times are computed from the origin and the index (or the sum of the
//! gaps), never from when the previous operation was sent, so that a slow
//! reply cannot push the schedule back: the rate asked is the rate
//! scheduled, and what could not be sent on time is counted, not dropped.
//! It reads no clock and does no I/O: the driver asks for the next start
//! and decides how to wait for it.

use std::time::{Duration, Instant};

/// How arrivals are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrivals {
    /// Exactly `1 / R` apart.
    Constant,
    /// Exponential gaps of mean `1 / R`, from a generator seeded with this.
    Poisson { seed: u64 },
}

/// One operation's place in the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Intended {
    /// Its index from 0, in order of intended start.
    pub(crate) index: u64,
    /// When it is meant to start.
    pub(crate) at: Instant,
}

/// A schedule that cannot be made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ScheduleError {
    /// The rate is not a finite number above zero.
    Rate(f64),
}

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScheduleError::Rate(r) => write!(f, "a rate must be a number above zero, not {r}"),
        }
    }
}

/// The intended starts of one run: from `origin`, at `rate` a second, for
/// `length`; handed out in order, each once.
#[derive(Debug)]
pub(crate) struct Schedule {
    origin: Instant,
    rate: f64,
    length: Duration,
    arrivals: Arrivals,
    /// How many starts were handed out.
    issued: u64,
    /// Poisson: the next start's offset from the origin, in seconds.
    next_offset: f64,
    rng: SplitMix64,
}

impl Schedule {
    /// Operations at `rate` a second from `origin` until `origin + length`.
    ///
    /// # Errors
    /// A rate that is not a finite number above zero.
    pub(crate) fn new(
        origin: Instant,
        rate: f64,
        length: Duration,
        arrivals: Arrivals,
    ) -> Result<Schedule, ScheduleError> {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(ScheduleError::Rate(rate));
        }
        let seed = match arrivals {
            Arrivals::Constant => 0,
            Arrivals::Poisson { seed } => seed,
        };
        let mut schedule = Schedule {
            origin,
            rate,
            length,
            arrivals,
            issued: 0,
            next_offset: 0.0,
            rng: SplitMix64(seed),
        };
        if let Arrivals::Poisson { .. } = arrivals {
            // The first arrival is a gap after the origin too, as in any
            // Poisson process observed from an arbitrary instant.
            schedule.next_offset = schedule.gap();
        }
        Ok(schedule)
    }

    /// The next intended start, handed out once, in order; `None` once
    /// the schedule's length is reached.
    #[must_use]
    pub(crate) fn poll_next(&mut self) -> Option<Intended> {
        let offset = self.offset_of_next();
        if offset >= self.length.as_secs_f64() {
            return None;
        }
        let at = self.origin.checked_add(Duration::from_secs_f64(offset))?;
        let intended = Intended {
            index: self.issued,
            at,
        };
        self.issued += 1;
        if let Arrivals::Poisson { .. } = self.arrivals {
            self.next_offset += self.gap();
        }
        Some(intended)
    }

    /// The next start without handing it out.
    #[must_use]
    pub(crate) fn peek(&self) -> Option<Instant> {
        let offset = self.offset_of_next();
        if offset >= self.length.as_secs_f64() {
            return None;
        }
        self.origin.checked_add(Duration::from_secs_f64(offset))
    }

    /// Starts handed out so far.
    pub(crate) fn issued(&self) -> u64 {
        self.issued
    }

    /// Hands out every start that is due at `now` and not yet handed out,
    /// and counts them: what a generator that gives up at `now` never
    /// sent. A generator that falls behind says so with this count; it
    /// never skips starts to catch up.
    #[must_use]
    pub(crate) fn abandon_due(&mut self, now: Instant) -> u64 {
        let mut n = 0;
        while self.peek().is_some_and(|at| at <= now) {
            let _ = self.poll_next();
            n += 1;
        }
        n
    }

    /// Seconds from the origin to the next start: computed from its index
    /// (constant), so that no rounding accumulates, or the running sum of
    /// the gaps (Poisson).
    fn offset_of_next(&self) -> f64 {
        match self.arrivals {
            Arrivals::Constant => self.issued as f64 / self.rate,
            Arrivals::Poisson { .. } => self.next_offset,
        }
    }

    /// One exponential gap of mean `1 / rate`, in seconds.
    fn gap(&mut self) -> f64 {
        // In (0, 1]: ln of it is finite.
        let u = 1.0 - self.rng.next_unit();
        -u.ln() / self.rate
    }
}

/// SplitMix64 (Steele, Lea and Flood): a seed gives the same gaps on
/// every machine, and any seed, zero included, gives a full sequence.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(mut s: Schedule) -> Vec<Intended> {
        std::iter::from_fn(|| s.poll_next()).collect()
    }

    #[test]
    fn constant_arrivals_are_index_over_rate_from_the_origin() {
        let origin = Instant::now();
        // (rate, length, starts expected, the offset of start 3 in ns)
        let cases = [
            (1000.0, Duration::from_millis(10), 10, 3_000_000),
            (3.0, Duration::from_secs(2), 6, 1_000_000_000),
            (2500.0, Duration::from_millis(2), 5, 1_200_000),
        ];
        for (rate, length, count, third_ns) in cases {
            let starts = all(Schedule::new(origin, rate, length, Arrivals::Constant).unwrap());
            assert_eq!(starts.len(), count, "rate {rate}");
            assert_eq!(starts[0].at, origin, "rate {rate}");
            let third = starts[3].at.duration_since(origin).as_nanos();
            assert!(third.abs_diff(third_ns) <= 1, "rate {rate}: {third} ns");
            assert!(starts.iter().enumerate().all(|(i, s)| s.index == i as u64));
        }
    }

    #[test]
    fn a_long_constant_schedule_does_not_drift() {
        let origin = Instant::now();
        let mut s = Schedule::new(
            origin,
            7.0,
            Duration::from_secs(10_000_000),
            Arrivals::Constant,
        )
        .unwrap();
        let mut last = None;
        for _ in 0..7_000_001 {
            last = s.poll_next();
        }
        let last = last.unwrap();
        // Start 7,000,000 is exactly 1,000,000 s after the origin.
        let off = last.at.duration_since(origin);
        assert!(off.as_secs_f64() - 1_000_000.0 < 1e-6, "{off:?}");
    }

    #[test]
    fn poisson_arrivals_repeat_with_their_seed_and_average_the_rate() {
        let origin = Instant::now();
        let length = Duration::from_secs(100);
        let make =
            |seed| Schedule::new(origin, 1000.0, length, Arrivals::Poisson { seed }).unwrap();
        let a = all(make(7));
        assert_eq!(a, all(make(7)), "the same seed, the same starts");
        assert_ne!(a, all(make(8)), "another seed, other starts");
        // 100,000 expected; a Poisson count's standard deviation is 316.
        assert!((98_500..101_500).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at), "in order");
        assert!(
            a[0].at > origin,
            "the first arrival is a gap after the origin"
        );
        // Exponential gaps: about 1/e of them longer than the mean.
        let long = a
            .windows(2)
            .filter(|w| w[1].at - w[0].at > Duration::from_millis(1))
            .count() as f64
            / a.len() as f64;
        assert!((long - (-1.0f64).exp()).abs() < 0.01, "{long}");
    }

    #[test]
    fn rates_that_are_not_above_zero_are_refused() {
        let origin = Instant::now();
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let made = Schedule::new(origin, rate, Duration::from_secs(1), Arrivals::Constant);
            assert!(made.is_err(), "{rate}");
        }
    }

    #[test]
    fn a_generator_that_gives_up_counts_every_start_it_did_not_send() {
        let origin = Instant::now();
        let mut s =
            Schedule::new(origin, 1000.0, Duration::from_secs(1), Arrivals::Constant).unwrap();
        let _ = s.poll_next();
        // At 10.5 ms starts 1 to 10 are due (start 0 was sent).
        let late = origin + Duration::from_micros(10_500);
        assert_eq!(s.abandon_due(late), 10);
        assert_eq!(s.issued(), 11);
        assert_eq!(s.peek(), Some(origin + Duration::from_millis(11)));
        assert_eq!(s.abandon_due(late), 0, "nothing due twice");
    }

    #[test]
    fn peek_shows_what_poll_next_hands_out() {
        let origin = Instant::now();
        for arrivals in [Arrivals::Constant, Arrivals::Poisson { seed: 1 }] {
            let mut s = Schedule::new(origin, 100.0, Duration::from_secs(1), arrivals).unwrap();
            while let Some(at) = s.peek() {
                assert_eq!(s.poll_next().map(|i| i.at), Some(at));
            }
            assert_eq!(s.poll_next(), None);
        }
    }
}
