//! Runs the deterministic simulation of the client (see `src/sim/world.rs`)
//! over seed after seed for as long as it is given, and reports the
//! operations and faults simulated; stops at the first seed a checker
//! fails, printing the command that replays it.
//!
//! ```sh
//! cargo simulate --for 60s
//! cargo simulate --seeds 1000
//! cargo simulate --seed 1234
//! ```
//!
//! `cargo simulate` (an alias in `.cargo/config.toml`) is `cargo run
//! --release --example simulate` under `--cfg redlock_sim`, the cfg the
//! simulator is compiled under.
//!
//! Options: `--for <secs>s` (default 10s), `--seeds <n>` (that many seeds,
//! however long they take, unless `--for` is given too: then whichever
//! ends first), `--seed <n>` (that seed alone), `--from <n>`
//! (the first seed), `--clients`, `--masters`, `--ops`, `--keep-going`
//! (go on past a failing seed, and say at the end which checkers failed,
//! how often, and first at which seed), and
//! `--bug quorum-off-by-one|drift-dropped|extend-not-shortened|
//! failure-counted-as-split|resend-decided|release-notice-dropped|
//! handover-budget-ignored|contention-unheard|cleanup-skips-granted|
//! admission-bypassed|handover-to-attempt|abandoned-stays-held|
//! dropped-waiter-tries|script-loaded-per-noscript|
//! extend-drops-px` to put a bug in on purpose (the run should then
//! stop at a seed that shows it).

use std::process::ExitCode;

/// The simulator's runs are short-lived buffers and small tables made and
/// dropped by the million; mimalloc serves them in less time than glibc's
/// allocator (interleaved `--seeds 2000`: 97,839 to 99,346 operations per
/// CPU-second with glibc's, 101,225 to 103,774 with this). Only this
/// program's: the library, its tests and the CLI keep the system's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(redlock_sim)]
fn main() -> ExitCode {
    simulator::main()
}

#[cfg(not(redlock_sim))]
fn main() -> ExitCode {
    eprintln!(
        "the simulator is compiled only under --cfg redlock_sim: \
         run it with `cargo simulate` (CONTRIBUTING.md)"
    );
    ExitCode::from(2)
}

/// The simulator's runs, under `--cfg redlock_sim`.
#[cfg(redlock_sim)]
mod simulator {
    use std::process::ExitCode;
    use std::time::{Duration, Instant};

    use redlock_mio::sim::world::{Bug, Settings, simulate};

    /// How long a run with neither `--for` nor `--seeds` goes on.
    const DEFAULT_BUDGET: Duration = Duration::from_secs(10);

    /// Virtual time one seed may run for.
    const LIMIT: Duration = Duration::from_secs(600);

    pub(crate) fn main() -> ExitCode {
        let mut settings = Settings::default();
        // `--for`, if given.
        let mut budget: Option<Duration> = None;
        let mut only: Option<u64> = None;
        let mut count: Option<u64> = None;
        let mut from = 0u64;
        let mut keep_going = false;
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut words = args.iter();
        while let Some(flag) = words.next() {
            if flag == "--keep-going" {
                keep_going = true;
                continue;
            }
            let value = words.next().map(String::as_str).unwrap_or("");
            let number = || value.trim_end_matches('s').parse::<u64>().ok();
            if flag == "--bug" {
                settings.bug = Some(match value {
                    "quorum-off-by-one" => Bug::QuorumOffByOne,
                    "drift-dropped" => Bug::DriftDropped,
                    "extend-not-shortened" => Bug::ExtendNotShortened,
                    "failure-counted-as-split" => Bug::FailureCountedAsSplit,
                    "resend-decided" => Bug::ResendDecided,
                    "release-notice-dropped" => Bug::ReleaseNoticeDropped,
                    "handover-budget-ignored" => Bug::HandoverBudgetIgnored,
                    "contention-unheard" => Bug::ContentionUnheard,
                    "cleanup-skips-granted" => Bug::CleanupSkipsGranted,
                    "admission-bypassed" => Bug::AdmissionBypassed,
                    "handover-to-attempt" => Bug::HandoverToAttempt,
                    "abandoned-stays-held" => Bug::AbandonedStaysHeld,
                    "dropped-waiter-tries" => Bug::DroppedWaiterTries,
                    "script-loaded-per-noscript" => Bug::ScriptLoadedPerNoscript,
                    "extend-drops-px" => Bug::ExtendDropsPx,
                    _ => {
                        eprintln!("simulate: unknown bug {value}");
                        return ExitCode::from(2);
                    }
                });
                continue;
            }
            match (flag.as_str(), number()) {
                ("--for", Some(secs)) => budget = Some(Duration::from_secs(secs)),
                ("--seed", Some(seed)) => only = Some(seed),
                ("--seeds", Some(n)) if n > 0 => count = Some(n),
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
        let cpu_before = cpu_time();
        let (mut seeds, mut ops, mut granted, mut faults, mut simulated) =
            (0u64, 0u64, 0u64, 0u64, Duration::ZERO);
        let (mut kept, mut kept_extensions, mut inline) = (0u64, 0u64, 0u64);
        let mut seed = only.unwrap_or(from);
        // Per checker (a violation's first word): failing seeds, and the first.
        let mut failed: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        loop {
            let outcome = simulate(seed, &settings, LIMIT);
            seeds += 1;
            ops += outcome.ops;
            granted += outcome.granted;
            kept += outcome.kept;
            kept_extensions += outcome.kept_extensions;
            inline += outcome.inline;
            faults += outcome.faults;
            simulated += outcome.simulated;
            if !outcome.violations.is_empty() {
                eprintln!("seed {seed}: {outcome}");
                for violation in &outcome.violations {
                    eprintln!("  {violation}");
                }
                eprintln!(
                    "replay: cargo simulate --seed {seed} \
                 --clients {} --masters {} --ops {}{}",
                    settings.clients,
                    settings.masters,
                    settings.ops,
                    bug_flag(&args)
                );
                if !keep_going {
                    return ExitCode::FAILURE;
                }
                let mut seen = std::collections::BTreeSet::new();
                for violation in &outcome.violations {
                    // "at 12.345 ms: checker: ..."
                    let checker = violation.split(": ").nth(1).unwrap_or("?");
                    if seen.insert(checker.to_owned()) {
                        let entry = failed.entry(checker.to_owned()).or_insert((0, seed));
                        entry.0 += 1;
                    }
                }
            }
            let out_of_time = |budget: Duration| started.elapsed() >= budget;
            let enough = match count {
                Some(n) => seeds >= n || budget.is_some_and(out_of_time),
                None => out_of_time(budget.unwrap_or(DEFAULT_BUDGET)),
            };
            if only.is_some() || enough {
                break;
            }
            seed += 1;
        }
        let wall = started.elapsed().as_secs_f64();
        let cpu = (cpu_time() - cpu_before).as_secs_f64();
        println!(
            "{seeds} seeds ({}..={seed}): {ops} operations ({granted} locks granted, {kept} kept \
         and extended {kept_extensions} times, {inline} run inline), {faults} faults, {:.1} s \
         simulated, in {wall:.1} s ({cpu:.1} s of CPU): {:.0} operations per CPU-second, {:.0} \
         seeds per CPU-second",
            only.unwrap_or(from),
            simulated.as_secs_f64(),
            ops as f64 / cpu.max(1e-9),
            seeds as f64 / cpu.max(1e-9)
        );
        for (checker, (count, first)) in &failed {
            println!("{checker}: {count} seeds failed, the first {first}");
        }
        if failed.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }

    /// The CPU time this process has used (user and system), from
    /// `getrusage`: what a run costs on a shared machine, whatever else runs.
    fn cpu_time() -> Duration {
        // SAFETY: `getrusage` fills the zeroed struct it is given; `RUSAGE_SELF`
        // is always a valid target.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut usage);
            usage
        };
        let time = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        time(usage.ru_utime) + time(usage.ru_stime)
    }

    /// `--bug <name>` as given, for the replay line.
    fn bug_flag(args: &[String]) -> String {
        args.iter()
            .position(|a| a == "--bug")
            .and_then(|i| args.get(i + 1))
            .map_or(String::new(), |bug| format!(" --bug {bug}"))
    }
}
