//! `redlock bench --rate`: an open-loop benchmark, in which operations
//! start at a rate fixed in advance whatever the replies do.
//!
//! A closed loop (each caller sends its next operation when the last one
//! replied) slows down with the system it measures, so a stall hides the
//! operations that would have queued behind it: coordinated omission. Here
//! the schedule ([`schedule`]) says when each operation is meant to start,
//! and the record ([`record`]) times each one from that intended start as
//! well as from its actual send, as wrk2 does. Both are plain data in and
//! out, with no clock and no socket, so that their arithmetic is tested
//! apart from the network; the driver ([`drive`]) is the only part that
//! sleeps, sends and reads the clock, and [`report`] only formats. This
//! module owns the flags and the run's plan; it starts no master (the
//! bench does, and stops them).

pub(crate) mod drive;
pub(crate) mod exec;
pub(crate) mod handoff;
pub(crate) mod plot;
pub(crate) mod record;
pub(crate) mod report;
pub(crate) mod schedule;
pub(crate) mod sweep;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use redlock_mio::Config;

use crate::exit::{self, Failure};
use crate::parse_duration;
use crate::signals::Signals;
use schedule::Arrivals;

/// The open-loop flags of `redlock bench`.
#[derive(Args, Debug)]
pub(crate) struct RateArgs {
    /// Open loop: start R operations a second in total, whatever the
    /// replies do, and time each from its intended start (latency) and
    /// from its actual send (service time)
    #[arg(long, value_name = "R", value_parser = parse_rate, conflicts_with = "sweep")]
    pub(crate) rate: Option<f64>,

    /// Open loop at --steps rates from FROM to TO a second, each the last
    /// times one factor; with --slo, the highest rate that meets it
    #[arg(long, value_name = "FROM..TO", value_parser = sweep::parse_range)]
    pub(crate) sweep: Option<(f64, f64)>,

    /// With --sweep: how many rates
    #[arg(long, value_name = "N", default_value_t = 6, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub(crate) steps: u32,

    /// With --sweep: the latency objective, from the intended start, as
    /// pXX=D (p99=2ms); each step says whether it meets it, and the
    /// report the highest rate that does (headroom)
    #[arg(long, value_name = "pXX=D", value_parser = sweep::parse_slo)]
    pub(crate) slo: Option<sweep::Slo>,

    /// With --rate or --sweep: draw the percentile spectrum (latency
    /// against 1/(1-percentile), one line per rate, and the hand-offs of a
    /// single rate with --hold) and, for a sweep, the percentiles against
    /// the rate with the SLO, as an SVG file
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,

    /// With --rate: how starts are spaced, exactly 1/R apart or as a
    /// Poisson process of rate R
    #[arg(long, value_enum, value_name = "KIND", default_value_t = ArrivalKind::Constant)]
    pub(crate) arrivals: ArrivalKind,

    /// With --arrivals poisson: the seed of the gaps (a seed gives the
    /// same starts on every run)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) seed: u64,

    /// With --rate: operations meant to start in the first D are sent but
    /// not recorded; --duration is measured after it
    #[arg(long, value_name = "D", default_value = "1s", value_parser = parse_duration)]
    pub(crate) warm_up: Duration,

    /// With --rate or --sweep: write both histograms, one per second, as
    /// an HdrHistogram interval log (tags `latency` and `service`, in µs;
    /// a sweep's steps one after another, tagged `latency-R`, `service-R`)
    #[arg(long, value_name = "FILE")]
    pub(crate) hdr_log: Option<PathBuf>,
}

/// `--arrivals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum ArrivalKind {
    /// Exactly 1/R apart.
    #[default]
    Constant,
    /// A Poisson process (exponential gaps), seeded by --seed.
    Poisson,
}

pub(crate) fn parse_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text
        .trim()
        .trim_end_matches("/s")
        .parse()
        .map_err(|_| format!("{text:?} is not a rate (operations a second, e.g. 2000)"))?;
    if rate.is_finite() && rate > 0.0 {
        Ok(rate)
    } else {
        Err(format!("{text:?}: a rate must be above zero"))
    }
}

/// What the closed-loop bench's flags make of each operation.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    /// Caller threads (without `tasks`).
    pub(crate) threads: usize,
    /// Each thread its own client.
    pub(crate) client_per_thread: bool,
    /// Async callers on one thread instead of threads.
    pub(crate) tasks: Option<usize>,
    /// Resource names drawn from; `None`: each caller its own.
    pub(crate) resources: Option<usize>,
    pub(crate) ttl: Duration,
    /// Hold each lock this long, waiting for a held one.
    pub(crate) hold: Option<Duration>,
    /// The wait between attempts on a held lock (with `hold`).
    pub(crate) retry_delay: Duration,
    /// Locks per operation.
    pub(crate) batch: u32,
    /// The measured window, after the warm-up.
    pub(crate) duration: Duration,
    pub(crate) json: bool,
}

impl Shape {
    /// Callers: threads or tasks.
    pub(crate) fn callers(&self) -> usize {
        self.tasks.unwrap_or(self.threads)
    }

    /// Resource names in use.
    pub(crate) fn resource_count(&self) -> usize {
        self.resources
            .unwrap_or(self.callers() * self.batch as usize)
    }
}

/// The masters, for the report.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Masters {
    pub(crate) count: usize,
    pub(crate) spawned: bool,
    pub(crate) tls: usize,
    pub(crate) quorum: usize,
}

/// The open-loop runs asked for: one rate, or a sweep's.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The rates, in the order run.
    pub(crate) rates: Vec<f64>,
    /// A sweep (even of one rate): the report has steps and a headroom.
    pub(crate) sweep: bool,
    pub(crate) arrivals: Arrivals,
    pub(crate) warm_up: Duration,
    pub(crate) hdr_log: Option<PathBuf>,
    pub(crate) slo: Option<sweep::Slo>,
    pub(crate) plot: Option<PathBuf>,
}

impl RateArgs {
    /// The plan these flags ask for; `None` for the closed loop.
    ///
    /// # Errors
    /// Open-loop flags without `--rate` or `--sweep`; `--slo` without
    /// `--sweep`.
    pub(crate) fn plan(&self) -> Result<Option<Plan>, Failure> {
        let rates = match (self.rate, self.sweep) {
            (Some(rate), _) => vec![rate],
            (None, Some((from, to))) => sweep::geometric(from, to, self.steps as usize),
            (None, None) => {
                if self.hdr_log.is_some()
                    || self.plot.is_some()
                    || self.slo.is_some()
                    || self.arrivals != ArrivalKind::Constant
                    || self.warm_up != Duration::from_secs(1)
                {
                    return Err(Failure::usage(
                        "--arrivals, --warm-up, --hdr-log, --slo and --plot apply to an open \
                         loop: give --rate or --sweep",
                    ));
                }
                return Ok(None);
            }
        };
        let sweep = self.sweep.is_some();
        if !sweep && self.slo.is_some() {
            return Err(Failure::usage("--slo applies to --sweep"));
        }
        let arrivals = match self.arrivals {
            ArrivalKind::Constant => Arrivals::Constant,
            ArrivalKind::Poisson => Arrivals::Poisson { seed: self.seed },
        };
        Ok(Some(Plan {
            rates,
            sweep,
            arrivals,
            warm_up: self.warm_up,
            hdr_log: self.hdr_log.clone(),
            slo: self.slo.clone(),
            plot: self.plot.clone(),
        }))
    }
}

/// Runs the open loop at each rate of the plan; the report for stdout
/// and the exit code.
///
/// # Errors
/// A client that cannot be made, a log or a picture that cannot be
/// written.
pub(crate) fn bench(
    config: &Config,
    shape: &Shape,
    plan: &Plan,
    masters: &Masters,
    signals: &Signals,
) -> Result<(String, u8), Failure> {
    let mut runs = Vec::with_capacity(plan.rates.len());
    for &rate in &plan.rates {
        let run = drive::run(config, shape, plan, rate, signals)?;
        let interrupted = run.interrupted.is_some();
        runs.push(run);
        if interrupted {
            break;
        }
    }
    let cannot = |path: &std::path::Path, e: std::io::Error| {
        Failure::new(exit::OSERR, format!("cannot write {}: {e}", path.display()))
    };
    if let Some(path) = &plan.hdr_log {
        report::write_hdr_log(path, plan, &runs).map_err(|e| cannot(path, e))?;
    }
    if let Some(path) = &plan.plot {
        report::plot(path, masters, shape, plan, &runs).map_err(|e| cannot(path, e))?;
    }
    let text = match (plan.sweep, shape.json, &runs[..]) {
        (false, false, [run]) => report::text(masters, shape, plan, run),
        (false, true, [run]) => report::json(masters, shape, plan, run),
        (true, false, _) => report::sweep_text(masters, shape, plan, &runs),
        _ => report::sweep_json(masters, shape, plan, &runs),
    };
    let last = runs.last();
    let code = match last.and_then(|r| r.interrupted) {
        Some(signal) => u8::try_from(128 + signal).unwrap_or(exit::SOFTWARE),
        None if runs
            .iter()
            .all(|r| r.recorder.done == 0 && r.recorder.errored > 0) =>
        {
            exit::UNAVAILABLE
        }
        None => exit::OK,
    };
    Ok((text, code))
}
