//! `--sweep FROM..TO --slo p99=2ms`: the rates of a sweep, the SLO, and
//! the headroom, the highest rate that meets it.
//!
//! This module owns the arithmetic of a sweep (geometric steps, whether a
//! step meets the SLO, the headroom) as plain functions; the runs are the
//! driver's. A step meets the SLO when its latency from the intended
//! start at the SLO's quantile is within the bound and every start was
//! sent (a generator that fell behind proves nothing). The headroom is
//! the highest rate that meets the SLO; the
//! report shows every step, so that a step above it that missed, or one
//! below it (a cold machine's tail at a low rate), is in plain view.

use std::time::Duration;

use hdrhistogram::Histogram;

use super::record::micros;

/// A latency objective: the latency at `quantile` at most `bound`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Slo {
    /// As written: "p99", "p99.9".
    pub(crate) name: String,
    pub(crate) quantile: f64,
    pub(crate) bound: Duration,
}

impl Slo {
    /// Whether a step with this latency histogram and this many unsent
    /// starts meets the objective.
    #[must_use]
    pub(crate) fn is_met(&self, latency: &Histogram<u64>, unsent: u64) -> bool {
        unsent == 0
            && !latency.is_empty()
            && latency.value_at_quantile(self.quantile) <= micros(self.bound)
    }
}

/// Parses `p99=2ms`, `p99.9=500us`, `p50=1ms`.
///
/// # Errors
/// Another shape, a percentile outside (0, 100), a malformed duration.
pub(crate) fn parse_slo(text: &str) -> Result<Slo, String> {
    let (name, bound) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: write the SLO as p99=2ms"))?;
    let name = name.trim();
    let percent: f64 = name
        .strip_prefix('p')
        .and_then(|p| {
            // p999 and p9999 as the JSON names them.
            match p {
                "999" => Some(99.9),
                "9999" => Some(99.99),
                _ => p.parse().ok(),
            }
        })
        .ok_or_else(|| format!("{name:?} is not a percentile (p50, p99, p99.9)"))?;
    if !(percent > 0.0 && percent < 100.0) {
        return Err(format!("{name:?}: a percentile is above 0 and below 100"));
    }
    let bound = crate::parse_duration(bound)?;
    Ok(Slo {
        name: name.to_owned(),
        quantile: percent / 100.0,
        bound,
    })
}

/// Parses `FROM..TO`, two rates with FROM below TO.
///
/// # Errors
/// Another shape, or rates not above zero and increasing.
pub(crate) fn parse_range(text: &str) -> Result<(f64, f64), String> {
    let (from, to) = text
        .split_once("..")
        .ok_or_else(|| format!("{text:?}: write the sweep as FROM..TO, e.g. 1000..20000"))?;
    let from = super::parse_rate(from)?;
    let to = super::parse_rate(to)?;
    if from >= to {
        return Err(format!("{text:?}: FROM must be below TO"));
    }
    Ok((from, to))
}

/// `steps` rates from `from` to `to`, each the last times the same
/// factor; rounded to whole operations a second.
pub(crate) fn geometric(from: f64, to: f64, steps: usize) -> Vec<f64> {
    match steps {
        0 => Vec::new(),
        1 => vec![from.round()],
        n => {
            let factor = (to / from).powf(1.0 / (n - 1) as f64);
            (0..n)
                .map(|i| (from * factor.powi(i32::try_from(i).unwrap_or(i32::MAX))).round())
                .collect()
        }
    }
}

/// The highest rate that meets the SLO; `None` when none does. `steps`
/// as swept: (rate, met).
pub(crate) fn headroom(steps: &[(f64, bool)]) -> Option<f64> {
    steps
        .iter()
        .filter(|(_, met)| *met)
        .map(|(rate, _)| *rate)
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometric_steps_multiply_by_one_factor_from_end_to_end() {
        let cases: &[(f64, f64, usize, &[f64])] = &[
            (
                1000.0,
                16000.0,
                5,
                &[1000.0, 2000.0, 4000.0, 8000.0, 16000.0],
            ),
            (100.0, 10000.0, 3, &[100.0, 1000.0, 10000.0]),
            (500.0, 600.0, 1, &[500.0]),
            (500.0, 600.0, 0, &[]),
        ];
        for (from, to, n, want) in cases {
            assert_eq!(geometric(*from, *to, *n), *want, "{from}..{to} in {n}");
        }
    }

    #[test]
    fn the_headroom_is_the_highest_rate_that_meets_the_slo() {
        type Case<'a> = (&'a [(f64, bool)], Option<f64>);
        let cases: &[Case<'_>] = &[
            (
                &[(1000.0, true), (2000.0, true), (4000.0, false)],
                Some(2000.0),
            ),
            (
                &[(1000.0, false), (2000.0, true), (4000.0, false)],
                Some(2000.0),
            ),
            (
                &[(1000.0, true), (2000.0, false), (4000.0, true)],
                Some(4000.0),
            ),
            (&[(1000.0, false), (2000.0, false)], None),
            (
                &[(4000.0, true), (1000.0, true), (2000.0, false)],
                Some(4000.0),
            ),
            (&[], None),
        ];
        for (steps, want) in cases {
            assert_eq!(headroom(steps), *want, "{steps:?}");
        }
    }

    #[test]
    fn slos_parse_as_written_and_refuse_the_rest() {
        let ms = Duration::from_millis;
        let ok = [
            ("p99=2ms", 0.99, ms(2)),
            ("p99.9=500us", 0.999, Duration::from_micros(500)),
            ("p999=1ms", 0.999, ms(1)),
            ("p50=0.001", 0.5, ms(1)),
        ];
        for (text, q, bound) in ok {
            let slo = parse_slo(text).unwrap();
            assert!((slo.quantile - q).abs() < 1e-12, "{text}");
            assert_eq!(slo.bound, bound, "{text}");
        }
        for bad in ["p99", "99=2ms", "p100=1ms", "p0=1ms", "p99=fast", "x=1ms"] {
            assert!(parse_slo(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ranges_parse_as_from_below_to() {
        assert_eq!(parse_range("1000..20000"), Ok((1000.0, 20000.0)));
        for bad in ["1000", "2000..1000", "0..10", "a..b", "5..5"] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_step_meets_the_slo_at_its_quantile_and_only_if_all_was_sent() {
        let mut h = super::super::record::histogram();
        for v in 1..=1000u64 {
            h.saturating_record(v);
        }
        let slo = |us| Slo {
            name: "p99".into(),
            quantile: 0.99,
            bound: Duration::from_micros(us),
        };
        assert!(slo(990).is_met(&h, 0));
        assert!(!slo(980).is_met(&h, 0));
        assert!(!slo(990).is_met(&h, 1), "a generator that fell behind");
        assert!(
            !slo(990).is_met(&super::super::record::histogram(), 0),
            "no data"
        );
    }
}
