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
pub(crate) mod record;
pub(crate) mod report;
pub(crate) mod schedule;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use redlock_mio::Config;

use crate::exit::{self, Failure};
use crate::parse_duration;
use crate::signals::Signals;
use schedule::Arrivals;

/// The open-loop flags of `redlock bench`.
#[derive(Args, Debug, Default)]
pub(crate) struct RateArgs {
    /// Open loop: start R operations a second in total, whatever the
    /// replies do, and time each from its intended start (latency) and
    /// from its actual send (service time)
    #[arg(long, value_name = "R", value_parser = parse_rate)]
    pub(crate) rate: Option<f64>,

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

    /// With --rate: write both histograms, one per second, as an
    /// HdrHistogram interval log (tags `latency` and `service`, in µs)
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

fn parse_rate(text: &str) -> Result<f64, String> {
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

/// One open-loop run at one rate.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) rate: f64,
    pub(crate) arrivals: Arrivals,
    pub(crate) warm_up: Duration,
    pub(crate) hdr_log: Option<PathBuf>,
}

impl RateArgs {
    /// The plan these flags ask for; `None` for the closed loop.
    ///
    /// # Errors
    /// Open-loop flags without `--rate`.
    pub(crate) fn plan(&self) -> Result<Option<Plan>, Failure> {
        let Some(rate) = self.rate else {
            if self.hdr_log.is_some()
                || self.arrivals != ArrivalKind::Constant
                || self.warm_up != Duration::from_secs(1)
            {
                return Err(Failure::usage(
                    "--arrivals, --warm-up and --hdr-log apply to an open loop: give --rate",
                ));
            }
            return Ok(None);
        };
        let arrivals = match self.arrivals {
            ArrivalKind::Constant => Arrivals::Constant,
            ArrivalKind::Poisson => Arrivals::Poisson { seed: self.seed },
        };
        Ok(Some(Plan {
            rate,
            arrivals,
            warm_up: self.warm_up,
            hdr_log: self.hdr_log.clone(),
        }))
    }
}

/// Runs the open loop; the report for stdout and the exit code.
///
/// # Errors
/// A client that cannot be made, a log that cannot be written.
pub(crate) fn bench(
    config: &Config,
    shape: &Shape,
    plan: &Plan,
    masters: &Masters,
    signals: &Signals,
) -> Result<(String, u8), Failure> {
    let run = drive::run(config, shape, plan, signals)?;
    if let Some(path) = &plan.hdr_log {
        report::write_hdr_log(path, plan, &run)
            .map_err(|e| Failure::new(exit::OSERR, format!("cannot write {path:?}: {e}")))?;
    }
    let text = if shape.json {
        report::json(masters, shape, plan, &run)
    } else {
        report::text(masters, shape, plan, &run)
    };
    let code = match run.interrupted {
        Some(signal) => u8::try_from(128 + signal).unwrap_or(exit::SOFTWARE),
        None if run.recorder.done == 0 && run.recorder.errored > 0 => exit::UNAVAILABLE,
        None => exit::OK,
    };
    Ok((text, code))
}
