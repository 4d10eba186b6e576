//! What an open-loop run prints: the text report, the JSON object and the
//! HdrHistogram interval log.
//!
//! This module only formats what the run measured ([`Measured`]); it
//! decides nothing and times nothing.

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};

use super::drive::Measured;
use super::{Masters, Plan, Shape};
use crate::openloop::schedule::Arrivals;

/// The quantiles reported, with their JSON names and column heads.
pub(crate) const QUANTILES: [(f64, &str, &str); 5] = [
    (0.50, "p50", "p50"),
    (0.90, "p90", "p90"),
    (0.99, "p99", "p99"),
    (0.999, "p999", "p99.9"),
    (0.9999, "p9999", "p99.99"),
];

/// p50, p90, p99, p99.9, p99.99 and max; zeros when empty.
pub(crate) fn percentiles(h: &Histogram<u64>) -> [u64; 6] {
    if h.is_empty() {
        return [0; 6];
    }
    let mut out = [0; 6];
    for (slot, (q, _, _)) in out.iter_mut().zip(QUANTILES) {
        *slot = h.value_at_quantile(q);
    }
    out[5] = h.max();
    out
}

/// `{"count", "p50", ..., "p9999", "max", "mean"}` in µs.
pub(crate) fn json_latency(h: &Histogram<u64>) -> serde_json::Value {
    let values = percentiles(h);
    let mut object = serde_json::Map::new();
    object.insert("count".into(), h.len().into());
    for ((_, name, _), v) in QUANTILES.iter().zip(values) {
        object.insert((*name).into(), v.into());
    }
    object.insert("max".into(), values[5].into());
    object.insert(
        "mean".into(),
        (if h.is_empty() { 0.0 } else { h.mean() }).into(),
    );
    serde_json::Value::Object(object)
}

fn per_sec(n: u64, window: Duration) -> f64 {
    let secs = window.as_secs_f64();
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// The achieved rate: measured operations that replied within the
/// window, a second.
pub(crate) fn achieved(run: &Measured) -> f64 {
    per_sec(run.recorder.completed_in_window, run.window)
}

fn arrivals_name(a: Arrivals) -> String {
    match a {
        Arrivals::Constant => "constant".to_owned(),
        Arrivals::Poisson { seed } => format!("poisson (seed {seed})"),
    }
}

/// One run as a JSON value (also a sweep's step).
pub(crate) fn json_value(
    masters: &Masters,
    shape: &Shape,
    plan: &Plan,
    run: &Measured,
) -> serde_json::Value {
    let r = &run.recorder;
    serde_json::json!({
        "mode": "open-loop",
        "masters": masters.count,
        "spawned": masters.spawned,
        "tls_masters": masters.tls,
        "quorum": masters.quorum,
        "threads": if shape.tasks.is_some() { 1 } else { shape.threads },
        "tasks": shape.tasks,
        "client": if shape.client_per_thread { "per-thread" } else { "shared" },
        "resources": shape.resource_count(),
        "ttl_ms": u64::try_from(shape.ttl.as_millis()).unwrap_or(u64::MAX),
        "hold_ms": shape.hold.map(|h| h.as_secs_f64() * 1000.0),
        "batch": shape.batch,
        "arrivals": match plan.arrivals { Arrivals::Constant => "constant", Arrivals::Poisson { .. } => "poisson" },
        "seed": match plan.arrivals { Arrivals::Poisson { seed } => Some(seed), Arrivals::Constant => None },
        "warm_up_s": plan.warm_up.as_secs_f64(),
        "duration_s": run.window.as_secs_f64(),
        "interrupted": run.interrupted.is_some(),
        "intended_per_sec": run.rate,
        "achieved_per_sec": achieved(run),
        "intended": run.intended,
        "warm_up_ops": r.warm_up,
        "measured": r.measured(),
        "done": r.done,
        "failed": r.failed,
        "errored": r.errored,
        "unsent": run.unsent,
        "fell_behind": run.unsent > 0,
        "max_send_lag_us": super::record::micros(r.max_send_lag),
        "latency_us": json_latency(&r.total.latency),
        "service_us": json_latency(&r.total.service),
        "handoff_us": run.handoffs.as_ref().map(json_latency),
        "first_error": run.first_error,
    })
}

/// The JSON report of one run: one object and a newline.
pub(crate) fn json(masters: &Masters, shape: &Shape, plan: &Plan, run: &Measured) -> String {
    format!("{}\n", json_value(masters, shape, plan, run))
}

/// The header line saying what ran against what.
pub(crate) fn header(masters: &Masters, shape: &Shape) -> String {
    let origin = if masters.spawned {
        "local, started for this run"
    } else {
        "from --servers"
    };
    let origin = match masters.tls {
        0 => origin.to_owned(),
        k if k == masters.count => format!("{origin}, over TLS"),
        k => format!("{origin}, {k} over TLS"),
    };
    let callers = match shape.tasks {
        Some(t) => format!("{t} async callers on one thread, one shared client"),
        None if shape.client_per_thread => format!("{} threads, a client each", shape.threads),
        None => format!("{} threads sharing one client", shape.threads),
    };
    let resources = match shape.resources {
        None => format!("{} resources (one per caller)", shape.resource_count()),
        Some(r) => format!("{r} resources shared by the callers"),
    };
    let mut line = format!(
        "redlock bench, open loop: {} masters ({origin}), quorum {}; {callers}; {resources}; ttl {}",
        masters.count,
        masters.quorum,
        humantime::format_duration(shape.ttl)
    );
    if let Some(hold) = shape.hold {
        let _ = write!(
            line,
            "; each lock held {}",
            humantime::format_duration(hold)
        );
    }
    if shape.batch > 1 {
        let _ = write!(line, "; batches of {} locks", shape.batch);
    }
    line
}

/// The text report of one run.
pub(crate) fn text(masters: &Masters, shape: &Shape, plan: &Plan, run: &Measured) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", header(masters, shape));
    out.push_str(&text_body(shape, plan, run));
    out
}

/// A run's report without the header (a sweep prints one header).
pub(crate) fn text_body(shape: &Shape, plan: &Plan, run: &Measured) -> String {
    let mut out = String::new();
    let r = &run.recorder;
    if run.interrupted.is_some() {
        let _ = writeln!(
            out,
            "interrupted: the figures cover the time measured until then"
        );
    }
    let _ = writeln!(
        out,
        "rate: intended {:.0}/s ({} arrivals), achieved {:.0}/s over {:.2} s measured, \
         after {} of warm-up ({} operations sent, not recorded)",
        run.rate,
        arrivals_name(plan.arrivals),
        achieved(run),
        run.window.as_secs_f64(),
        humantime::format_duration(plan.warm_up),
        r.warm_up,
    );
    let _ = writeln!(
        out,
        "operations measured: {} ({} done, {} failed: held elsewhere, {} errors)",
        r.measured(),
        r.done,
        r.failed,
        r.errored
    );
    if let Some(e) = &run.first_error {
        let _ = writeln!(out, "  first error: {e}");
    }
    if run.unsent > 0 {
        let _ = writeln!(
            out,
            "THE GENERATOR FELL BEHIND: {} of {} intended operations were never sent (still \
             unsent {} after the end); the rate was not lowered. Give more callers \
             (--threads, --tasks) or a lower --rate",
            run.unsent,
            run.intended,
            humantime::format_duration(super::drive::DRAIN),
        );
    }
    let _ = writeln!(
        out,
        "latest send after its intended start: {} µs{}",
        super::record::micros(r.max_send_lag),
        if r.max_send_lag > Duration::from_millis(1) {
            format!(
                " (waits for a free caller, of {}, and for a CPU: they are in the latency)",
                shape.callers()
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(out);
    let _ = write!(out, "{:<34}", "(µs)");
    for (_, _, head) in QUANTILES {
        let _ = write!(out, " {head:>8}");
    }
    let _ = writeln!(out, " {:>8}", "max");
    let timed_to = if shape.hold.is_some() {
        "the grant"
    } else {
        "the release's reply"
    };
    for (name, h) in [
        ("latency, from the intended start", &r.total.latency),
        ("service, from the actual send", &r.total.service),
    ] {
        let _ = write!(out, "{name:<34}");
        for v in percentiles(h) {
            let _ = write!(out, " {v:>8}");
        }
        let _ = writeln!(out);
    }
    if let Some(h) = &run.handoffs {
        let _ = write!(out, "{:<34}", "hand-off, release to next grant");
        for v in percentiles(h) {
            let _ = write!(out, " {v:>8}");
        }
        let _ = writeln!(out, "  ({} hand-offs)", h.len());
    }
    let _ = writeln!(
        out,
        "(each timed to {timed_to}; successful operations only)"
    );
    out
}

/// Writes the per-interval histograms as an HdrHistogram interval log,
/// tagged `latency` and `service`, in µs; a sweep's steps follow one
/// another on one time line, tagged `latency-R` and `service-R` with
/// their rate R a second, so that a reader picks a step by its tag.
///
/// # Errors
/// The file cannot be created or written.
pub(crate) fn write_hdr_log(path: &Path, plan: &Plan, runs: &[Measured]) -> io::Result<()> {
    let Some(first) = runs.first() else {
        return Ok(());
    };
    let mut file = io::BufWriter::new(std::fs::File::create(path)?);
    let mut serializer = V2DeflateSerializer::new();
    let measured_from = first.started + plan.warm_up;
    let mut builder = IntervalLogWriterBuilder::new();
    builder
        .add_comment("redlock bench --rate: latency from the intended start, service from the send, in microseconds")
        .with_start_time(measured_from)
        .with_base_time(measured_from)
        .with_max_value_divisor(1000.0);
    let mut log = builder.begin_log_with(&mut file, &mut serializer)?;
    let interval = super::drive::INTERVAL;
    for run in runs {
        let names = if plan.sweep {
            let rate = run.rate.round();
            [format!("latency-{rate}"), format!("service-{rate}")]
        } else {
            ["latency".to_owned(), "service".to_owned()]
        };
        let tags = [Tag::new(&names[0]), Tag::new(&names[1])];
        // Each step from its own measured start, on the first one's line.
        let offset = (run.started + plan.warm_up)
            .duration_since(measured_from)
            .unwrap_or_default();
        for (i, pair) in run.recorder.intervals.iter().enumerate() {
            let start = offset + interval * u32::try_from(i).unwrap_or(u32::MAX);
            for (h, tag) in [(&pair.latency, tags[0]), (&pair.service, tags[1])] {
                log.write_histogram(h, start, interval, tag)
                    .map_err(|e| io::Error::other(format!("{e:?}")))?;
            }
        }
    }
    drop(log);
    file.flush()
}

/// Whether each run met the plan's SLO, in run order (all false without
/// one).
fn met(plan: &Plan, runs: &[Measured]) -> Vec<bool> {
    runs.iter()
        .map(|r| {
            plan.slo
                .as_ref()
                .is_some_and(|slo| slo.is_met(&r.recorder.total.latency, r.unsent))
        })
        .collect()
}

/// The headroom of a sweep: the highest rate meeting the SLO.
fn headroom(plan: &Plan, runs: &[Measured]) -> Option<f64> {
    plan.slo.as_ref()?;
    let steps: Vec<(f64, bool)> = runs.iter().map(|r| r.rate).zip(met(plan, runs)).collect();
    super::sweep::headroom(&steps)
}

/// A sweep as one JSON object: its steps (each a run's object, with
/// `meets_slo`), the SLO and `headroom_per_sec`.
pub(crate) fn sweep_json(
    masters: &Masters,
    shape: &Shape,
    plan: &Plan,
    runs: &[Measured],
) -> String {
    let steps: Vec<serde_json::Value> = runs
        .iter()
        .zip(met(plan, runs))
        .map(|(run, met)| {
            let mut v = json_value(masters, shape, plan, run);
            if plan.slo.is_some() {
                v["meets_slo"] = met.into();
            }
            v
        })
        .collect();
    let value = serde_json::json!({
        "mode": "open-loop sweep",
        "rates": plan.rates,
        "slo": plan.slo.as_ref().map(|s| serde_json::json!({
            "percentile": s.name,
            "quantile": s.quantile,
            "us": super::record::micros(s.bound),
        })),
        "headroom_per_sec": headroom(plan, runs),
        "steps": steps,
    });
    format!("{value}\n")
}

/// A sweep as text: one row a rate, then the headroom.
pub(crate) fn sweep_text(
    masters: &Masters,
    shape: &Shape,
    plan: &Plan,
    runs: &[Measured],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", header(masters, shape));
    let _ = writeln!(
        out,
        "sweep: {} rates ({} arrivals), each {} of warm-up then {} measured",
        plan.rates.len(),
        arrivals_name(plan.arrivals),
        humantime::format_duration(plan.warm_up),
        humantime::format_duration(shape.duration),
    );
    let _ = writeln!(out);
    let _ = write!(
        out,
        "{:>9} {:>9}  latency from the intended start (µs)",
        "rate/s", "achieved"
    );
    let _ = writeln!(out);
    let _ = write!(out, "{:>9} {:>9}", "", "");
    for (_, _, head) in QUANTILES {
        let _ = write!(out, " {head:>8}");
    }
    let _ = write!(
        out,
        " {:>8} {:>11} {:>8} {:>7}",
        "max", "service p50", "errors", "unsent"
    );
    if let Some(slo) = &plan.slo {
        let _ = write!(
            out,
            "  {} <= {}",
            slo.name,
            humantime::format_duration(slo.bound)
        );
    }
    let _ = writeln!(out);
    for (run, met) in runs.iter().zip(met(plan, runs)) {
        let _ = write!(out, "{:>9.0} {:>9.0}", run.rate, achieved(run));
        for v in percentiles(&run.recorder.total.latency) {
            let _ = write!(out, " {v:>8}");
        }
        let service = percentiles(&run.recorder.total.service)[0];
        let _ = write!(
            out,
            " {service:>11} {:>8} {:>7}",
            run.recorder.errored, run.unsent
        );
        if plan.slo.is_some() {
            let _ = write!(out, "  {}", if met { "yes" } else { "NO" });
        }
        let _ = writeln!(out);
    }
    if let Some(slo) = &plan.slo {
        let _ = writeln!(out);
        match headroom(plan, runs) {
            Some(rate) => {
                let _ = writeln!(
                    out,
                    "headroom: {rate:.0}/s, the highest rate of this sweep with {} <= {} \
                     and every start sent",
                    slo.name,
                    humantime::format_duration(slo.bound)
                );
            }
            None => {
                let _ = writeln!(out, "headroom: none; no rate of this sweep met the SLO");
            }
        }
    }
    if runs.iter().any(|r| r.unsent > 0) {
        let _ = writeln!(
            out,
            "THE GENERATOR FELL BEHIND at the rates with unsent operations: their figures \
             are not what the rate asked; give more callers (--threads, --tasks)"
        );
    }
    if runs.iter().any(|r| r.interrupted.is_some()) {
        let _ = writeln!(out, "interrupted: the sweep stopped at the last rate shown");
    }
    out
}

/// Draws the runs: their spectrum, and for a sweep the percentiles
/// against the rate with the SLO.
///
/// # Errors
/// The file cannot be written.
pub(crate) fn plot(
    path: &Path,
    masters: &Masters,
    shape: &Shape,
    plan: &Plan,
    runs: &[Measured],
) -> io::Result<()> {
    use super::plot::{Line, SloLine, Step};
    let mut lines = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        lines.push(Line {
            label: format!("{:.0}/s, from the intended start", run.rate),
            histogram: &run.recorder.total.latency,
            faint: false,
            colour: i,
        });
        lines.push(Line {
            label: format!("{:.0}/s, from the send (service)", run.rate),
            histogram: &run.recorder.total.service,
            faint: true,
            colour: i,
        });
    }
    let title = format!(
        "redlock bench, open loop: {} masters, {} callers",
        masters.count,
        shape.callers()
    );
    if !plan.sweep {
        // One contended resource: its hand-offs too, in a colour of their
        // own.
        for run in runs {
            if let Some(handoffs) = run.handoffs.as_ref().filter(|h| !h.is_empty()) {
                lines.push(Line {
                    label: "hand-off: a release to the next holder's grant".to_owned(),
                    histogram: handoffs,
                    faint: false,
                    colour: runs.len(),
                });
            }
        }
        return super::plot::spectrum(path, &title, &lines);
    }
    let labels: Vec<&str> = QUANTILES
        .iter()
        .map(|(_, _, head)| *head)
        .chain(["max"])
        .collect();
    let steps: Vec<Step> = runs
        .iter()
        .map(|r| Step {
            rate: r.rate,
            values: percentiles(&r.recorder.total.latency).to_vec(),
        })
        .collect();
    let slo = plan.slo.as_ref().map(|s| SloLine {
        label: format!("SLO: {} <= {}", s.name, humantime::format_duration(s.bound)),
        us: super::record::micros(s.bound),
    });
    // The spectrum of a sweep: latency lines only, one per rate.
    let latency_lines: Vec<Line<'_>> = lines.into_iter().filter(|l| !l.faint).collect();
    super::plot::sweep(path, &title, &latency_lines, &labels, &steps, slo.as_ref())
}
