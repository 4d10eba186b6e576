//! What keeping many locks alive costs: K locks (default 10,000) kept by
//! one `SharedRedlock`'s event loop, no thread per lock, for D seconds.
//! Reports the extensions made, the locks lost (should be none), the
//! process's CPU time over the kept period as a share of one core, its
//! resident memory before and after the locks were handed over, and its
//! thread count.
//!
//! `cargo bench --bench keep [-- --locks K --secs D --ttl-ms T]`
//!
//! The three masters are started here, empty, so restart quarantine is
//! off: no lock predates them.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use redlock_mio::{Config, KeepOptions, SharedRedlock};
use redlock_test::{Cluster, Options};

struct Args {
    locks: usize,
    secs: u64,
    ttl: Duration,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        locks: 10_000,
        secs: 10,
        ttl: Duration::from_secs(3),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| format!("{flag} needs a number"))
        };
        match flag.as_str() {
            "--locks" => args.locks = usize::try_from(value()?).map_err(|e| e.to_string())?,
            "--secs" => args.secs = value()?,
            "--ttl-ms" => args.ttl = Duration::from_millis(value()?),
            // cargo bench passes --bench; criterion-style filters are ignored.
            _ => {}
        }
    }
    Ok(args)
}

/// User plus system CPU time of this process so far.
fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// A field of /proc/self/status, in its own unit (kB for memory).
fn status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn run(args: &Args) -> Result<(), String> {
    let masters = Cluster::start(3, &Options::new()).map_err(|e| e.to_string())?;
    let mut config = Config::new(masters.urls()).map_err(|e| e.to_string())?;
    config.quarantine = None;
    config.per_instance_timeout = Duration::from_millis(200);
    config.max_in_flight = 8192;
    let redlock = SharedRedlock::new(config).map_err(|e| e.to_string())?;
    let mut locks = Vec::with_capacity(args.locks);
    for chunk in (0..args.locks).collect::<Vec<_>>().chunks(512) {
        let names: Vec<String> = chunk.iter().map(|i| format!("keep:{i}")).collect();
        for result in redlock
            .try_acquire_batch(names, args.ttl)
            .map_err(|e| e.to_string())?
        {
            locks.push(result.map_err(|e| e.to_string())?);
        }
    }
    let rss_before = status("VmRSS:");
    let kept: Vec<_> = locks
        .into_iter()
        .map(|lock| redlock.keep(lock, KeepOptions::default()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(args.secs));
    let wall = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let rss_after = status("VmRSS:");
    let threads = status("Threads:");
    let extensions: u64 = kept.iter().map(|k| u64::from(k.extensions())).sum();
    let lost = kept.iter().filter(|k| !k.is_held()).count();
    let released = kept
        .into_iter()
        .map(|k| k.release())
        .filter(Result::is_ok)
        .count();
    println!(
        "keep: {} locks, ttl {} ms (extended every {} ms), {:.1} s: {} extensions ({:.0}/s), \
         {} lost, {} released; CPU {:.1}% of one core ({:.3} s), RSS {} kB before keeping, \
         {} kB after ({:.0} B per kept lock), {} threads in the process",
        args.locks,
        args.ttl.as_millis(),
        args.ttl.as_millis() / 3,
        wall.as_secs_f64(),
        extensions,
        extensions as f64 / wall.as_secs_f64(),
        lost,
        released,
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
        cpu.as_secs_f64(),
        rss_before,
        rss_after,
        (rss_after.saturating_sub(rss_before) * 1024) as f64 / args.locks.max(1) as f64,
        threads,
    );
    Ok(())
}

fn main() -> ExitCode {
    match parse().and_then(|args| run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keep bench: {e}");
            ExitCode::FAILURE
        }
    }
}
