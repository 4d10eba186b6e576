//! Runs the deterministic simulation of the client (see `src/sim/world.rs`)
//! over seed after seed for as long as it is given, and reports the
//! operations and faults simulated; stops at the first seed a checker
//! fails, printing the command that replays it.
//!
//! ```sh
//! cargo run --release --features test-knobs --example simulate -- --for 60s
//! cargo run --release --features test-knobs --example simulate -- --seed 1234
//! ```
//!
//! Options: `--for <secs>s` (default 10s), `--seed <n>` (that seed alone),
//! `--from <n>` (the first seed), `--clients`, `--masters`, `--ops`, and
//! `--bug quorum-off-by-one|drift-dropped|extend-not-shortened|
//! failure-counted-as-split|resend-decided` to put a bug in on purpose
//! (the run should then stop at a seed that shows it).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use redlock_mio::sim::world::{Bug, Settings, simulate};

/// Virtual time one seed may run for.
const LIMIT: Duration = Duration::from_secs(600);

fn main() -> ExitCode {
    let mut settings = Settings::default();
    let mut budget = Duration::from_secs(10);
    let mut only: Option<u64> = None;
    let mut from = 0u64;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut words = args.iter();
    while let Some(flag) = words.next() {
        let value = words.next().map(String::as_str).unwrap_or("");
        let number = || value.trim_end_matches('s').parse::<u64>().ok();
        if flag == "--bug" {
            settings.bug = Some(match value {
                "quorum-off-by-one" => Bug::QuorumOffByOne,
                "drift-dropped" => Bug::DriftDropped,
                "extend-not-shortened" => Bug::ExtendNotShortened,
                "failure-counted-as-split" => Bug::FailureCountedAsSplit,
                "resend-decided" => Bug::ResendDecided,
                _ => {
                    eprintln!("simulate: unknown bug {value}");
                    return ExitCode::from(2);
                }
            });
            continue;
        }
        match (flag.as_str(), number()) {
            ("--for", Some(secs)) => budget = Duration::from_secs(secs),
            ("--seed", Some(seed)) => only = Some(seed),
            ("--from", Some(seed)) => from = seed,
            ("--clients", Some(n)) => settings.clients = n as usize,
            ("--masters", Some(n)) => settings.masters = n as usize,
            ("--ops", Some(n)) => settings.ops = n as usize,
            _ => {
                eprintln!("simulate: unknown option or value: {flag} {value}");
                return ExitCode::from(2);
            }
        }
    }
    let started = Instant::now();
    let (mut seeds, mut ops, mut granted, mut faults, mut simulated) =
        (0u64, 0u64, 0u64, 0u64, Duration::ZERO);
    let (mut kept, mut kept_extensions) = (0u64, 0u64);
    let mut seed = only.unwrap_or(from);
    loop {
        let outcome = simulate(seed, &settings, LIMIT);
        seeds += 1;
        ops += outcome.ops;
        granted += outcome.granted;
        kept += outcome.kept;
        kept_extensions += outcome.kept_extensions;
        faults += outcome.faults;
        simulated += outcome.simulated;
        if !outcome.violations.is_empty() {
            eprintln!("seed {seed}: {outcome}");
            for violation in &outcome.violations {
                eprintln!("  {violation}");
            }
            eprintln!(
                "replay: cargo run --release --features test-knobs --example simulate -- --seed {seed} \
                 --clients {} --masters {} --ops {}{}",
                settings.clients,
                settings.masters,
                settings.ops,
                bug_flag(&args)
            );
            return ExitCode::FAILURE;
        }
        if only.is_some() || started.elapsed() >= budget {
            break;
        }
        seed += 1;
    }
    let cpu = started.elapsed().as_secs_f64();
    println!(
        "{seeds} seeds ({}..={seed}): {ops} operations ({granted} locks granted, {kept} kept \
         and extended {kept_extensions} times), {faults} faults, {:.1} s simulated, in {cpu:.1} s: \
         {:.0} operations per second",
        only.unwrap_or(from),
        simulated.as_secs_f64(),
        ops as f64 / cpu
    );
    ExitCode::SUCCESS
}

/// `--bug <name>` as given, for the replay line.
fn bug_flag(args: &[String]) -> String {
    args.iter()
        .position(|a| a == "--bug")
        .and_then(|i| args.get(i + 1))
        .map_or(String::new(), |bug| format!(" --bug {bug}"))
}
