//! Pictures of an open-loop run, as SVG: the percentile spectrum, and for
//! a sweep the latency percentiles against the rate with the SLO drawn.
//!
//! This module owns drawing, with plotters' SVG backend alone (no font
//! files, no bitmaps); it takes histograms and rates and measures
//! nothing. The spectrum is HdrHistogram's own picture: latency against
//! 1/(1-percentile) on a log axis, so that p99, p99.9 and p99.99 are
//! evenly spaced and the tail is as wide as the body.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;
use plotters::style::Palette;

/// One line of the spectrum: a label and its histogram (µs).
pub(crate) struct Line<'a> {
    pub(crate) label: String,
    pub(crate) histogram: &'a Histogram<u64>,
    /// Drawn thinner and lighter: the service time beside a latency.
    pub(crate) faint: bool,
    /// The colour's index, shared by a latency and its service time.
    pub(crate) colour: usize,
}

/// One step of a sweep: the rate asked and its latency percentiles (µs)
/// in the order of `labels`.
pub(crate) struct Step {
    pub(crate) rate: f64,
    pub(crate) values: Vec<u64>,
}

/// The SLO line of a sweep's picture.
pub(crate) struct SloLine {
    pub(crate) label: String,
    pub(crate) us: u64,
}

/// The spectrum's x-axis end: 1/(1-0.99999).
const X_MAX: f64 = 100_000.0;
const WIDTH: u32 = 1000;
const HEIGHT: u32 = 560;

fn to_error(e: impl std::fmt::Debug) -> std::io::Error {
    std::io::Error::other(format!("{e:?}"))
}

/// The spectrum's points of one histogram: (1/(1-q), latency in ms) at
/// ten quantiles a decade of 1/(1-q), as far as its count resolves.
pub(crate) fn spectrum_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let resolved = (h.len() as f64).min(X_MAX);
    (0..=50)
        .map(|k| 10f64.powf(f64::from(k) / 10.0))
        .take_while(|&x| x <= resolved)
        .map(|x| {
            let q = 1.0 - 1.0 / x;
            (x, ms(h.value_at_quantile(q)))
        })
        .chain(std::iter::once((resolved.max(1.0), ms(h.max()))))
        .collect()
}

fn ms(us: u64) -> f64 {
    (us as f64 / 1000.0).max(0.001)
}

fn colour(i: usize) -> RGBColor {
    let (r, g, b) = Palette99::COLORS[i % Palette99::COLORS.len()];
    RGBColor(r, g, b)
}

/// Draws the percentile spectrum of `lines` into `area`.
fn draw_spectrum<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    lines: &[Line<'_>],
) -> Result<(), std::io::Error> {
    let points: Vec<Vec<(f64, f64)>> = lines.iter().map(|l| spectrum_points(l.histogram)).collect();
    let top = points.iter().flatten().map(|p| p.1).fold(0.01f64, f64::max) * 2.0;
    let bottom = points.iter().flatten().map(|p| p.1).fold(top, f64::min) / 2.0;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (1f64..X_MAX).log_scale(),
            (bottom.max(0.001)..top).log_scale(),
        )
        .map_err(to_error)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_label_formatter(&|x| percentile_label(*x))
        .draw()
        .map_err(to_error)?;
    for (line, points) in lines.iter().zip(points) {
        let c = colour(line.colour);
        let style = if line.faint {
            c.mix(0.45).stroke_width(1)
        } else {
            c.stroke_width(2)
        };
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(to_error)?
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(to_error)?;
    Ok(())
}

/// A rate to two significant digits: "950", "1300", "16000".
pub(crate) fn rate_label(rate: f64) -> String {
    if rate < 1.0 {
        return format!("{rate:.2}");
    }
    let magnitude = 10f64.powi(rate.log10().floor() as i32 - 1);
    format!("{:.0}", (rate / magnitude).round() * magnitude)
}

/// "p90" for 10, "p99.9" for 1000.
pub(crate) fn percentile_label(x: f64) -> String {
    if x < 1.5 {
        return "p0".to_owned();
    }
    let q = 100.0 * (1.0 - 1.0 / x);
    let text = format!("{q:.5}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("p{text}")
}

/// Writes the spectrum of one run (or of several rates) to `path`.
///
/// # Errors
/// The file cannot be written.
pub(crate) fn spectrum(path: &Path, title: &str, lines: &[Line<'_>]) -> std::io::Result<()> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(to_error)?;
    draw_spectrum(&root, title, lines)?;
    root.present().map_err(to_error)
}

/// Writes a sweep's picture to `path`: the spectrum of every step on top,
/// the latency percentiles against the rate below, with the SLO.
///
/// # Errors
/// The file cannot be written.
pub(crate) fn sweep(
    path: &Path,
    title: &str,
    lines: &[Line<'_>],
    labels: &[&str],
    steps: &[Step],
    slo: Option<&SloLine>,
) -> std::io::Result<()> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT * 2)).into_drawing_area();
    root.fill(&WHITE).map_err(to_error)?;
    let (upper, lower) = root.split_vertically(HEIGHT);
    draw_spectrum(&upper, title, lines)?;
    let values = steps.iter().flat_map(|s| s.values.iter().map(|&v| ms(v)));
    let top = values
        .clone()
        .chain(slo.map(|s| ms(s.us)))
        .fold(0.01f64, f64::max)
        * 2.0;
    let bottom = values.chain(slo.map(|s| ms(s.us))).fold(top, f64::min) / 2.0;
    let mut chart = ChartBuilder::on(&lower)
        .caption(
            "latency from the intended start, by rate",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        // The steps evenly spaced (a sweep's rates are geometric), each
        // labelled with its rate: plotters' log axis would label round
        // numbers between them and crowd its minor lines.
        .build_cartesian_2d(
            -0.5..steps.len() as f64 - 0.5,
            (bottom.max(0.001)..top).log_scale(),
        )
        .map_err(to_error)?;
    let step_label = |x: &f64| {
        let k = x.round();
        match steps.get(k as usize) {
            Some(step) if (x - k).abs() < 1e-6 && k >= 0.0 => rate_label(step.rate),
            _ => String::new(),
        }
    };
    chart
        .configure_mesh()
        .x_desc("rate asked (operations/s)")
        .y_desc("latency (ms)")
        .x_labels(steps.len() + 1)
        .x_label_formatter(&step_label)
        .draw()
        .map_err(to_error)?;
    for (i, label) in labels.iter().enumerate() {
        let c = colour(i);
        let points: Vec<(f64, f64)> = steps
            .iter()
            .enumerate()
            .map(|(k, s)| (k as f64, ms(s.values[i])))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
            .map_err(to_error)?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(to_error)?;
    }
    if let Some(slo) = slo {
        let y = ms(slo.us);
        chart
            .draw_series(LineSeries::new(
                [(-0.5, y), (steps.len() as f64 - 0.5, y)],
                RED.stroke_width(3),
            ))
            .map_err(to_error)?
            .label(slo.label.clone())
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(to_error)?;
    root.present().map_err(to_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_labels_read_as_percentiles() {
        let cases = [
            (1.0, "p0"),
            (10.0, "p90"),
            (100.0, "p99"),
            (1000.0, "p99.9"),
            (2.0, "p50"),
        ];
        for (x, want) in cases {
            assert_eq!(percentile_label(x), want, "{x}");
        }
    }

    #[test]
    fn rates_are_labelled_to_two_significant_digits() {
        let cases = [
            (1000.0, "1000"),
            (1104.9, "1100"),
            (16384.0, "16000"),
            (95.2, "95"),
            (0.5, "0.50"),
        ];
        for (rate, want) in cases {
            assert_eq!(rate_label(rate), want, "{rate}");
        }
    }

    #[test]
    fn the_spectrum_goes_as_far_as_the_count_resolves_and_ends_at_the_max() {
        let mut h = crate::openloop::record::histogram();
        for v in 1..=1000 {
            h.saturating_record(v);
        }
        let points = spectrum_points(&h);
        let (last_x, last_y) = *points.last().unwrap();
        assert_eq!(last_x, 1000.0);
        assert!((last_y - 1.0).abs() < 0.01, "the max, 1000 µs: {last_y}");
        assert!(
            points
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1)
        );
        assert!(spectrum_points(&crate::openloop::record::histogram()).is_empty());
    }

    #[test]
    fn both_pictures_are_svg_files() {
        let dir = std::env::temp_dir().join(format!("redlock-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut h = crate::openloop::record::histogram();
        for v in [100, 200, 300, 5000] {
            h.saturating_record(v);
        }
        let line = |faint| Line {
            label: "1000/s".into(),
            histogram: &h,
            faint,
            colour: 0,
        };
        let one = dir.join("one.svg");
        spectrum(&one, "t", &[line(false), line(true)]).unwrap();
        let steps = [
            Step {
                rate: 1000.0,
                values: vec![100, 200],
            },
            Step {
                rate: 2000.0,
                values: vec![150, 900],
            },
        ];
        let slo = SloLine {
            label: "SLO p99 <= 2ms".into(),
            us: 2000,
        };
        let two = dir.join("two.svg");
        sweep(
            &two,
            "t",
            &[line(false)],
            &["p50", "p99"],
            &steps,
            Some(&slo),
        )
        .unwrap();
        for file in [one, two] {
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(
                text.starts_with("<svg") && text.contains("polyline"),
                "{file:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
