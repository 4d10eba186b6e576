//! `redlock bench --rate` against real masters: every shape of
//! the bench in an open loop, the JSON and the HdrHistogram log it
//! writes, and a stall that the latency from the intended start shows.
//!
//! No assertion here is timed: each checks structure and counts, that a
//! latency from the intended start is never below the service time from
//! the send, and, for the stall, a lower bound that the stall itself
//! guarantees (two of three masters stopped for 200 ms delay every
//! operation meant to start during it).

#[path = "../../tests/common/tls.rs"]
mod certs;
mod command;
#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::thread;
use std::time::Duration;

use command::{code, finish, redlock, stderr, stdout};

const QUANTILES: [&str; 6] = ["p50", "p90", "p99", "p999", "p9999", "max"];

/// The report's JSON, checked for the fields every open-loop run has.
fn report(out: &std::process::Output) -> serde_json::Value {
    assert_eq!(code(out), 0, "{}", stderr(out));
    let text = stdout(out);
    assert_eq!(text.lines().count(), 1, "one JSON object: {text}");
    let r: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    for key in [
        "intended_per_sec",
        "achieved_per_sec",
        "failed",
        "errored",
        "done",
    ] {
        assert!(r[key].is_number(), "{key} in {text}");
    }
    for h in ["latency_us", "service_us"] {
        for q in QUANTILES {
            assert!(r[h][q].is_u64(), "{h}.{q} in {text}");
        }
        // Quantiles in order.
        let values: Vec<u64> = QUANTILES
            .iter()
            .map(|q| r[h][q].as_u64().unwrap())
            .collect();
        assert!(values.windows(2).all(|w| w[0] <= w[1]), "{h}: {text}");
    }
    // Timed from an earlier instant to the same reply.
    for q in QUANTILES {
        assert!(
            r["latency_us"][q].as_u64() >= r["service_us"][q].as_u64(),
            "latency below service at {q}: {text}"
        );
    }
    assert_eq!(
        r["measured"].as_u64(),
        Some(
            r["done"].as_u64().unwrap()
                + r["failed"].as_u64().unwrap()
                + r["errored"].as_u64().unwrap()
        ),
        "{text}"
    );
    r
}

/// `bench --rate 500 --warm-up 200ms --duration 1s --json --timeout 2s`,
/// each default replaced by the same flag in `extra`.
fn open_loop(urls: &[String], extra: &[&str]) -> std::process::Command {
    let mut bench = redlock(urls);
    bench.arg("bench").args(extra).arg("--json");
    // A slow round on a loaded machine must not count as an error.
    for (flag, value) in [
        ("--rate", "500"),
        ("--warm-up", "200ms"),
        ("--duration", "1s"),
        ("--timeout", "2s"),
    ] {
        if !extra.contains(&flag) {
            bench.args([flag, value]);
        }
    }
    bench
}

#[test]
fn every_shape_runs_open_loop_and_reports_both_latencies() {
    let masters = common::cluster(3);
    let urls = masters.urls();
    for shape in [
        &["--threads", "2"][..],
        &["--threads", "2", "--client-per-thread"],
        &["--tasks", "8"],
        &["--batch", "4"],
        &["--arrivals", "poisson", "--seed", "7"],
    ] {
        let r = report(&finish(open_loop(&urls, shape)));
        assert_eq!(r["mode"], "open-loop", "{shape:?}");
        assert_eq!(r["intended_per_sec"].as_f64(), Some(500.0), "{shape:?}");
        // 1.2 s of schedule at 500/s: 600 starts (Poisson: about).
        let intended = r["intended"].as_u64().unwrap();
        assert!((450..=750).contains(&intended), "{shape:?}: {r}");
        assert_eq!(
            r["warm_up_ops"].as_u64().unwrap()
                + r["measured"].as_u64().unwrap()
                + r["unsent"].as_u64().unwrap(),
            intended,
            "{shape:?}: every start is warm-up, measured or unsent: {r}"
        );
        assert!(r["done"].as_u64().unwrap() > 0, "{shape:?}: {r}");
        assert_eq!(r["errored"].as_u64(), Some(0), "{shape:?}: {r}");
        assert_eq!(
            r["failed"].as_u64(),
            Some(0),
            "{shape:?}: no contention: {r}"
        );
    }
}

#[test]
fn contended_shapes_count_failures_and_holds_wait() {
    let masters = common::cluster(3);
    let urls = masters.urls();
    let r = report(&finish(open_loop(
        &urls,
        &["--threads", "4", "--resources", "1"],
    )));
    assert!(r["done"].as_u64().unwrap() > 0, "{r}");
    assert!(r["handoff_us"].is_null(), "no waiting, no hand-off: {r}");
}

/// `--resources 1 --hold 2ms` at 1,000/s: each lock is held longer than
/// the gap between starts, so every acquire but the first waits for the
/// one before it, and each grant after a release is a hand-off, timed on
/// its own histogram and drawn as a line of its own.
#[test]
fn hand_offs_of_one_contended_resource_have_their_own_histogram() {
    let masters = common::cluster(3);
    let dir = redlock_test::TempDir::create().expect("a temporary directory");
    let svg = dir.path().join("handoffs.svg");
    let r = report(&finish(open_loop(
        &masters.urls(),
        &[
            "--threads",
            "4",
            "--resources",
            "1",
            "--hold",
            "2ms",
            "--rate",
            "1000",
            "--plot",
            svg.to_str().expect("a UTF-8 path"),
        ],
    )));
    let picture = std::fs::read_to_string(&svg).expect("the picture");
    assert!(picture.contains("hand-off: "), "{picture:.300}");
    assert_eq!(r["hold_ms"].as_f64(), Some(2.0), "{r}");
    assert!(r["done"].as_u64().unwrap() > 0, "{r}");
    let handoffs = &r["handoff_us"];
    assert!(handoffs["count"].as_u64().unwrap() > 0, "{r}");
    for q in QUANTILES {
        assert!(handoffs[q].is_u64(), "handoff_us.{q}: {r}");
    }
}

#[test]
fn tls_masters_run_open_loop() {
    let certs = certs::Certs::generate();
    let masters = common::cluster_with(3, &common::Options::new().tls(certs.server_options()));
    let urls = masters.urls();
    let mut bench = open_loop(&urls, &["--threads", "2"]);
    bench.arg("--tls-ca").arg(&certs.ca);
    let r = report(&finish(bench));
    assert_eq!(r["tls_masters"].as_u64(), Some(3), "{r}");
    assert!(r["done"].as_u64().unwrap() > 0, "{r}");
}

/// An interval log as HdrHistogram's own reader takes it: each interval's
/// tag, start (from the log's base time) and count.
fn read_hdr_log(text: &str) -> Vec<(String, std::time::Duration, u64)> {
    let mut decoder = hdrhistogram::serialization::Deserializer::new();
    let mut intervals = Vec::new();
    for entry in
        hdrhistogram::serialization::interval_log::IntervalLogIterator::new(text.as_bytes())
    {
        if let Ok(hdrhistogram::serialization::interval_log::LogEntry::Interval(h)) = entry {
            let bytes = base64_decode(h.encoded_histogram());
            let histogram: hdrhistogram::Histogram<u64> =
                decoder.deserialize(&mut &bytes[..]).expect("a histogram");
            let tag = h.tag().map(|t| t.as_str().to_owned()).unwrap_or_default();
            intervals.push((tag, h.start_timestamp(), histogram.len()));
        }
    }
    intervals
}

/// Each tag's count over all its intervals.
fn counts_by_tag(
    intervals: &[(String, std::time::Duration, u64)],
) -> std::collections::BTreeMap<&str, u64> {
    let mut counts = std::collections::BTreeMap::new();
    for (tag, _, count) in intervals {
        *counts.entry(tag.as_str()).or_default() += count;
    }
    counts
}

#[test]
fn the_hdr_log_has_both_tags_for_every_interval() {
    let masters = common::cluster(3);
    let dir = redlock_test::TempDir::create().expect("a temporary directory");
    let log = dir.path().join("run.hlog");
    let path = log.to_str().expect("a UTF-8 path");
    let bench = open_loop(&masters.urls(), &["--duration", "2s", "--hdr-log", path]);
    let r = report(&finish(bench));
    let text = std::fs::read_to_string(&log).expect("the log");
    // HdrHistogram's own reader takes it, and its intervals add up to the
    // run's successful operations, under each tag.
    let intervals = read_hdr_log(&text);
    let counts = counts_by_tag(&intervals);
    let done = r["done"].as_u64().unwrap();
    assert_eq!(counts.get("latency"), Some(&done), "{counts:?}");
    assert_eq!(counts.get("service"), Some(&done), "{counts:?}");
    assert!(text.contains("#[StartTime: "), "{text}");
    assert!(text.contains("#[BaseTime: "), "{text}");
    assert!(intervals.len() >= 4, "two intervals, two tags each: {text}");
}

/// A sweep's log holds every step, one after another on one time line,
/// each tagged with its rate, and each step's intervals add up to its
/// successful operations.
#[test]
fn a_sweep_logs_every_step_under_its_rate() {
    let masters = common::cluster(3);
    let dir = redlock_test::TempDir::create().expect("a temporary directory");
    let log = dir.path().join("sweep.hlog");
    let path = log.to_str().expect("a UTF-8 path");
    let mut bench = redlock(&masters.urls());
    bench.args([
        "bench",
        "--sweep",
        "100..200",
        "--steps",
        "2",
        "--warm-up",
        "100ms",
        "--duration",
        "1s",
        "--timeout",
        "2s",
        "--json",
        "--hdr-log",
        path,
    ]);
    let out = finish(bench);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let text = std::fs::read_to_string(&log).expect("the log");
    let intervals = read_hdr_log(&text);
    let counts = counts_by_tag(&intervals);
    let steps = r["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2, "{r}");
    for (step, rate) in steps.iter().zip(["100", "200"]) {
        let done = step["done"].as_u64().unwrap();
        assert_eq!(
            counts.get(format!("latency-{rate}").as_str()),
            Some(&done),
            "{counts:?}"
        );
        assert_eq!(
            counts.get(format!("service-{rate}").as_str()),
            Some(&done),
            "{counts:?}"
        );
    }
    let last_of_first = intervals
        .iter()
        .filter(|(tag, ..)| tag == "latency-100")
        .map(|(_, start, _)| *start)
        .max()
        .expect("the first step's intervals");
    let first_of_second = intervals
        .iter()
        .filter(|(tag, ..)| tag == "latency-200")
        .map(|(_, start, _)| *start)
        .min()
        .expect("the second step's intervals");
    assert!(last_of_first < first_of_second, "one time line: {text}");
}

#[test]
fn open_loop_flags_without_a_rate_are_refused() {
    let mut bench = redlock(&[]);
    bench.args(["bench", "--hdr-log", "/dev/null"]);
    let out = finish(bench);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("give --rate"), "{}", stderr(&out));
    for flags in [
        &["--rate", "100", "--slo", "p99=1ms"][..],
        &["--rate", "100", "--sweep", "100..200"],
        &["--sweep", "200..100"],
    ] {
        let mut bench = redlock(&[]);
        bench.arg("bench").args(flags);
        let out = finish(bench);
        assert_eq!(code(&out), 2, "{flags:?}: {}", stderr(&out));
    }
}

/// Two of three masters stopped (SIGSTOP) for 200 ms during a 2,000/s run
/// with a 1 s per-master timeout: every operation meant to start during
/// the stop waits for the resume, so the latency's tail from the intended
/// start is at least the stall's order while the service time's p50 is
/// not. Bounds only from below, guaranteed by the stop itself.
#[test]
fn a_stall_raises_the_tail_from_the_intended_start_far_above_the_service_p50() {
    let mut masters = common::cluster(3);
    let urls = masters.urls();
    let mut bench = redlock(&urls);
    bench.args([
        "bench",
        "--rate",
        "2000",
        "--warm-up",
        "300ms",
        "--duration",
        "2s",
        "--json",
        "--timeout",
        "1s",
    ]);
    bench.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = bench.spawn().expect("starting redlock");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr"));
    let mut said = String::new();
    while !said.contains("open loop at") {
        said.clear();
        assert!(
            lines.read_line(&mut said).expect("stderr") > 0,
            "no start line"
        );
    }
    // Into the measured window, then stop two masters for 200 ms.
    thread::sleep(Duration::from_millis(800));
    for m in &mut masters.servers_mut()[..2] {
        m.pause().expect("SIGSTOP");
    }
    thread::sleep(Duration::from_millis(200));
    for m in &mut masters.servers_mut()[..2] {
        m.resume().expect("SIGCONT");
    }
    let out = child.wait_with_output().expect("redlock");
    let r = report(&out);
    let latency = |q: &str| r["latency_us"][q].as_u64().unwrap();
    let service_p50 = r["service_us"]["p50"].as_u64().unwrap();
    // The operation in flight at the stop waited for the resume, and so
    // did the ~400 meant to start during it.
    assert!(latency("max") >= 150_000, "{r}");
    assert!(latency("p99") >= 20 * service_p50.max(1), "{r}");
    assert!(
        latency("p99") > r["service_us"]["p99"].as_u64().unwrap(),
        "{r}"
    );
}

/// Standard base64, as the interval log encodes its histograms.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    digits
        .chunks(4)
        .flat_map(|chunk| {
            let n =
                chunk.iter().fold(0u32, |n, &d| (n << 6) | u32::from(d)) << (6 * (4 - chunk.len()));
            let bytes = n.to_be_bytes();
            bytes[1..chunk.len()].to_vec()
        })
        .collect()
}

/// `--sweep FROM..TO --steps N --slo` runs each rate, says of each
/// whether it met the SLO, and reports the headroom; `--plot` draws it.
/// The SLOs are out of reach either way (10 s, 1 µs), so that nothing
/// here depends on the machine's speed.
#[test]
fn a_sweep_reports_each_rate_and_the_headroom_and_draws_it() {
    let masters = common::cluster(3);
    let urls = masters.urls();
    let dir = redlock_test::TempDir::create().expect("a temporary directory");
    let svg = dir.path().join("sweep.svg");
    let svg_path = svg.to_str().expect("a UTF-8 path");
    for (slo, headroom) in [("p99=10s", Some(400.0)), ("p99.9=1us", None)] {
        let mut bench = redlock(&urls);
        bench.args([
            "bench",
            "--sweep",
            "100..400",
            "--steps",
            "3",
            "--slo",
            slo,
            "--warm-up",
            "100ms",
            "--duration",
            "500ms",
            "--timeout",
            "2s",
            "--json",
            "--plot",
            svg_path,
        ]);
        let out = finish(bench);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let r: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
        assert_eq!(r["mode"], "open-loop sweep", "{r}");
        let rates: Vec<f64> = r["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|s| s["intended_per_sec"].as_f64().unwrap())
            .collect();
        assert_eq!(rates, [100.0, 200.0, 400.0], "geometric: {r}");
        assert_eq!(r["headroom_per_sec"].as_f64(), headroom, "{slo}: {r}");
        for step in r["steps"].as_array().unwrap() {
            assert_eq!(
                step["meets_slo"].as_bool(),
                Some(headroom.is_some()),
                "{step}"
            );
            assert!(
                step["latency_us"]["p99"].as_u64() >= step["service_us"]["p99"].as_u64(),
                "{step}"
            );
        }
        let picture = std::fs::read_to_string(&svg).expect("the picture");
        assert!(picture.starts_with("<svg"), "{picture:.200}");
        assert!(picture.contains("SLO: "), "the SLO is drawn");
        assert!(
            picture.contains("400/s, from the intended start"),
            "one line per rate"
        );
    }
}

#[test]
fn a_single_rate_draws_its_spectrum() {
    let masters = common::cluster(3);
    let dir = redlock_test::TempDir::create().expect("a temporary directory");
    let svg = dir.path().join("one.svg");
    let path = svg.to_str().expect("a UTF-8 path");
    report(&finish(open_loop(&masters.urls(), &["--plot", path])));
    let picture = std::fs::read_to_string(&svg).expect("the picture");
    assert!(
        picture.contains("500/s, from the intended start"),
        "{picture:.300}"
    );
    assert!(
        picture.contains("500/s, from the send (service)"),
        "{picture:.300}"
    );
    assert!(picture.contains("p99.9"), "the percentile axis");
}
