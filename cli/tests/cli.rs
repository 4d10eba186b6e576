//! The `redlock` binary against real local masters: exit codes, the lock
//! held while a command runs, signal forwarding, the lost-lock path,
//! acquire/release from a shell, `bench --json` and `probe`.
//!
//! Every process a test starts is stopped by a guard: masters by the
//! harness, `redlock` by [`Running`] (whose command gets SIGTERM from the
//! kernel when `redlock` dies), a command that ignores SIGTERM by
//! [`KillOnDrop`], a master stopped with SIGSTOP is continued by
//! [`Stalled`], and the commands run under a lock are bounded sleeps.
//! Waits poll with generous deadlines, so that a loaded machine slows the
//! tests down without failing them; the few durations compared have
//! bounds many times what is expected, which only a broken rule reaches.

// The library's harness (masters and a blocking RESP2 client), shared
// rather than copied.
#[path = "../../tests/common/mod.rs"]
mod common;
// Certificates for `probe`'s and `bench`'s TLS masters, made as the
// library's TLS tests make them.
#[path = "../../tests/common/tls.rs"]
mod certs;
// `redlock` commands run to completion: shared with tests/servers.rs.
mod command;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use certs::{Certs, Pair};
use command::{
    EXIT_DEADLINE, START_DEADLINE, code, finish, finish_within, one_shot, redlock, shipped, stderr,
    stdout,
};
use common::{
    Cluster, Options, Server, bulk, cluster, connect, connections_received, master, master_with,
    set_user, urls_as,
};
use redlock_mio::resp::{Arg, Reply};

/// A `redlock` running in the background, killed and reaped on drop.
struct Running {
    child: Child,
}

impl Running {
    fn start(mut command: Command) -> Running {
        command.stdout(Stdio::null()).stderr(Stdio::piped());
        Running {
            child: command.spawn().expect("starting redlock"),
        }
    }

    fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    fn signal(&self, signal: libc::c_int) {
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0, "kill");
    }

    /// Waits for the exit; the status and what was written on stderr.
    fn wait(&mut self, deadline: Duration) -> (ExitStatus, String) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let mut err = String::new();
                if let Some(mut pipe) = self.child.stderr.take() {
                    let _ = pipe.read_to_string(&mut err);
                }
                return (status, err);
            }
            assert!(
                started.elapsed() < deadline,
                "redlock did not exit within {deadline:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A private directory for marker files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "redlock-cli-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&path).expect("creating a scratch directory");
        Scratch(path)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Polls until `path` exists, then returns its contents.
fn wait_for_file(path: &Path, running: &mut Running) -> String {
    let started = Instant::now();
    loop {
        if let Ok(text) = fs::read_to_string(path) {
            return text;
        }
        if let Ok(Some(status)) = running.child.try_wait() {
            let (_, err) = running.wait(Duration::ZERO);
            panic!("redlock exited ({status}) before its command wrote {path:?}: {err}");
        }
        assert!(
            started.elapsed() < START_DEADLINE,
            "the command did not write {path:?} within {START_DEADLINE:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Polls until the command has written its pid (with [`WRITE_PID`]) to
/// `path`, and returns it.
fn wait_for_pid(path: &Path, running: &mut Running) -> libc::pid_t {
    wait_for_file(path, running).trim().parse().expect("a pid")
}

/// A shell snippet that writes its pid to `$1` atomically (the test polls
/// for the file, and must never read it half-written).
const WRITE_PID: &str = r#"echo $$ > "$1.tmp" && mv "$1.tmp" "$1""#;

/// The arguments after `sh -c` of a command that writes its pid to
/// `pid_file` ([`WRITE_PID`]), then runs until `go` exists, for at most
/// `secs` seconds.
fn until_go(pid_file: &Path, go: &Path, secs: u32) -> [std::ffi::OsString; 4] {
    let ticks = secs * 20;
    [
        format!(
            r#"{WRITE_PID}; i=0; while [ ! -e "$2" ] && [ $i -lt {ticks} ]; do sleep 0.05; i=$((i+1)); done"#
        )
        .into(),
        "sh".into(),
        pid_file.into(),
        go.into(),
    ]
}

/// The value of `key` on every master.
fn get_all(masters: &Cluster, key: &str) -> Vec<Reply> {
    masters
        .iter()
        .map(|m| connect(m).cmd(&["GET".into(), key.into()]))
        .collect()
}

/// How long a test waits for masters to reflect what `redlock` did: a
/// request sent just before `redlock` exited may be read by a busy master
/// after the test's own GET. Well below the TTLs used, so that a key that
/// went away was released, not expired.
const SETTLE: Duration = Duration::from_secs(10);

/// Waits until no master holds `key`.
fn assert_free(masters: &Cluster, key: &str) {
    let started = Instant::now();
    loop {
        let values = get_all(masters, key);
        if values.iter().all(|v| *v == Reply::Nil) {
            return;
        }
        assert!(
            started.elapsed() < SETTLE,
            "{key} should be free: {values:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until a quorum of masters holds `key` with `token`; no master may
/// hold another value. (A lock needs a quorum, not all N: on a busy machine
/// one master may miss the round.)
fn assert_held(masters: &Cluster, key: &str, token: &str) {
    let quorum = masters.len() / 2 + 1;
    let started = Instant::now();
    loop {
        let values = get_all(masters, key);
        assert!(
            values.iter().all(|v| *v == Reply::Nil || *v == bulk(token)),
            "{key} holds another token: {values:?}"
        );
        if values.iter().filter(|v| **v == bulk(token)).count() >= quorum {
            return;
        }
        assert!(
            started.elapsed() < SETTLE,
            "{key} should be held by {token}: {values:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn is_alive(pid: libc::pid_t) -> bool {
    unsafe { libc::kill(pid, 0) == 0 }
}

#[test]
fn run_exits_with_the_commands_status() {
    let masters = cluster(3);
    let urls = masters.urls();
    // (command, expected exit code)
    let cases: &[(&[&str], i32)] = &[
        (&["true"], 0),
        (&["sh", "-c", "exit 7"], 7),
        (&["sh", "-c", "exit 255"], 255),
        (&["sh", "-c", "kill -KILL $$"], 128 + libc::SIGKILL),
        (&["/nonexistent/command"], 127),
    ];
    for (command, want) in cases {
        let mut run = one_shot(&urls);
        run.args(["run", "--nonblock", "status", "--"])
            .args(*command);
        let out = finish(run);
        assert_eq!(code(&out), *want, "{command:?}: {}", stderr(&out));
        assert_free(&masters, "status");
    }
}

#[test]
fn the_lock_is_held_while_the_command_runs_and_free_after() {
    let masters = cluster(3);
    let urls = masters.urls();
    let scratch = Scratch::new();
    let (seen, go) = (scratch.file("seen"), scratch.file("go"));
    let mut holder = redlock(&urls);
    holder.args(["run", "held", "--", "sh", "-c"]).arg(
        r#"printf '%s %s' "$REDLOCK_RESOURCE" "$REDLOCK_TOKEN" > "$1.tmp" && mv "$1.tmp" "$1"
           i=0; while [ ! -e "$2" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"#,
    );
    holder.arg("sh").arg(&seen).arg(&go);
    let mut holder = Running::start(holder);

    let env = wait_for_file(&seen, &mut holder);
    let (resource, token) = env.split_once(' ').expect("resource and token");
    assert_eq!(resource, "held");
    assert_eq!(token.len(), 48, "{token:?}");
    assert_held(&masters, "held", token);

    let mut contender = one_shot(&urls);
    contender.args(["run", "--nonblock", "held", "--", "true"]);
    let out = finish(contender);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).starts_with("redlock: "), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("held by another client"),
        "{}",
        stderr(&out)
    );

    let mut contender = one_shot(&urls);
    contender.args(["run", "-n", "-E", "9", "held", "--", "true"]);
    assert_eq!(code(&finish(contender)), 9);

    let mut contender = one_shot(&urls);
    contender.args(["run", "--wait", "300ms", "held", "--", "true"]);
    assert_eq!(code(&finish(contender)), 1);

    fs::write(&go, "").expect("writing the go file");
    let (status, err) = holder.wait(EXIT_DEADLINE);
    assert_eq!(status.code(), Some(0), "{err}");
    assert_free(&masters, "held");

    let mut after = one_shot(&urls);
    after.args(["run", "--nonblock", "held", "--", "true"]);
    assert_eq!(code(&finish(after)), 0);
}

#[test]
fn sigterm_to_redlock_is_forwarded_and_the_lock_released() {
    let masters = cluster(3);
    let scratch = Scratch::new();
    let pid_file = scratch.file("pid");
    let mut holder = redlock(&masters.urls());
    holder
        .args(["run", "term", "--", "sh", "-c"])
        .arg(format!("{WRITE_PID}; exec sleep 30"))
        .arg("sh")
        .arg(&pid_file);
    let mut holder = Running::start(holder);
    let child = wait_for_pid(&pid_file, &mut holder);
    let token = get_all(&masters, "term")
        .into_iter()
        .find_map(|r| match r {
            Reply::Bulk(b) => Some(String::from_utf8_lossy(&b).into_owned()),
            _ => None,
        })
        .expect("the lock's key on some master");
    assert_held(&masters, "term", &token);

    holder.signal(libc::SIGTERM);
    let (status, err) = holder.wait(EXIT_DEADLINE);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{err}");
    assert!(!is_alive(child), "the command should have been terminated");
    assert_free(&masters, "term");
}

/// Starts `redlock run --ttl 2s` with `script`, stalls two of three masters
/// with SIGSTOP, and returns how long redlock took to exit, its status and
/// its stderr.
fn lose_the_lock(script: &str, kill_after: &str) -> (Duration, ExitStatus, String, libc::pid_t) {
    let mut masters = cluster(3);
    let scratch = Scratch::new();
    let pid_file = scratch.file("pid");
    let mut holder = redlock(&masters.urls());
    holder
        .args([
            "run",
            "--ttl",
            "2s",
            "--kill-after",
            kill_after,
            "lost",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!("{WRITE_PID}; {script}"))
        .arg("sh")
        .arg(&pid_file);
    let mut holder = Running::start(holder);
    let child = wait_for_pid(&pid_file, &mut holder);

    masters[0].pause().expect("pausing master 0");
    masters[1].pause().expect("pausing master 1");
    let paused = Instant::now();
    let (status, err) = holder.wait(EXIT_DEADLINE);
    let took = paused.elapsed();
    masters[0].resume().expect("resuming master 0");
    masters[1].resume().expect("resuming master 1");
    (took, status, err, child)
}

#[test]
fn a_lost_lock_stops_the_command_and_exits_75() {
    let (took, status, err, child) = lose_the_lock("exec sleep 60", "20s");
    assert_eq!(status.code(), Some(75), "{err}");
    assert!(err.contains("lost the lock"), "{err}");
    // SIGTERM sufficed: no need to wait for --kill-after.
    assert!(took < Duration::from_secs(20), "took {took:?}: {err}");
    assert!(!is_alive(child), "the command should have been terminated");
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let (_, status, err, child) = lose_the_lock(
        r#"trap '' TERM; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"#,
        "500ms",
    );
    assert_eq!(status.code(), Some(75), "{err}");
    assert!(err.contains("SIGKILL"), "{err}");
    assert!(!is_alive(child), "the command should have been killed");
}

#[test]
fn acquire_prints_a_token_that_release_and_extend_take() {
    let masters = cluster(3);
    let urls = masters.urls();

    let mut acquire = redlock(&urls);
    acquire.args(["acquire", "shell", "--ttl", "30s"]);
    let out = finish(acquire);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let printed = stdout(&out);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 1, "{printed:?}");
    let token = lines[0];
    let validity: u64 = stderr(&out)
        .trim()
        .strip_prefix("redlock: validity ")
        .and_then(|s| s.strip_suffix(" ms"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{:?}", stderr(&out)));
    assert!(validity > 0 && validity <= 30_000, "{validity}");
    assert_held(&masters, "shell", token);

    let mut extend = one_shot(&urls);
    extend.args(["extend", "shell", token, "--ttl", "90s"]);
    let out = finish(extend);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let extended = masters
        .iter()
        .filter(|m| match connect(m).cmd(&["PTTL".into(), "shell".into()]) {
            Reply::Integer(ms) => ms > 60_000,
            other => panic!("PTTL: {other:?}"),
        })
        .count();
    assert!(extended >= 2, "a quorum should have the new TTL");

    // Well formed, and not the lock's: not held (1).
    let other = "0".repeat(48);
    let mut wrong = one_shot(&urls);
    wrong.args(["extend", "shell", &other, "--ttl", "90s"]);
    assert_eq!(code(&finish(wrong)), 1);
    let mut wrong = one_shot(&urls);
    wrong.args(["release", "shell", &other]);
    let out = finish(wrong);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("no longer held"), "{}", stderr(&out));

    // Not what `acquire` prints (a mistyped token once read as "no
    // longer held", exit 1): a usage error (2), that names the shape.
    let cut = &token[..47];
    let upper = token.to_uppercase();
    for malformed_token in ["two words", "not-the-token", cut, &upper] {
        for op in ["release", "extend"] {
            let mut malformed = redlock(&urls);
            malformed.args([op, "shell", malformed_token]);
            if op == "extend" {
                malformed.args(["--ttl", "90s"]);
            }
            let out = finish(malformed);
            assert_eq!(code(&out), 2, "{op} {malformed_token:?}: {}", stderr(&out));
            assert!(
                stderr(&out).contains("malformed token"),
                "{op} {malformed_token:?}: {}",
                stderr(&out)
            );
        }
    }
    assert_held(&masters, "shell", token);

    // The masters may also come from the environment.
    let mut release = one_shot(&[]);
    release
        .env("REDLOCK_SERVERS", urls.join(","))
        .args(["release", "shell", token]);
    let out = finish(release);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_free(&masters, "shell");

    let mut again = one_shot(&urls);
    again.args(["release", "shell", token]);
    let out = finish(again);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("no longer held"), "{}", stderr(&out));
}

#[test]
fn an_unreachable_quorum_exits_69_without_running_the_command() {
    let live = master();
    // Nothing listens on port 1 of the loopback interface.
    let urls = vec![
        live.url(),
        "redis://127.0.0.1:1".to_owned(),
        "redis://127.0.0.1:1/2".to_owned(),
    ];
    let scratch = Scratch::new();
    let ran = scratch.file("ran");
    let mut run = redlock(&urls);
    run.args(["run", "--nonblock", "down", "--", "touch"])
        .arg(&ran);
    let out = finish(run);
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("quorum of masters unreachable"),
        "{}",
        stderr(&out)
    );
    assert!(!ran.exists(), "the command must not run without the lock");

    let mut acquire = redlock(&urls);
    acquire.args(["acquire", "down", "--wait", "500ms"]);
    assert_eq!(code(&finish(acquire)), 69);
}

#[test]
fn bench_json_output_parses_and_shows_throughput() {
    let mut bench = redlock(&[]);
    bench.args([
        "bench",
        "--spawn",
        "3",
        "--duration",
        "2s",
        "--threads",
        "2",
        "--json",
        // Not the 50 ms default: a slow round on a loaded machine would
        // count as an error.
        "--timeout",
        "2s",
    ]);
    let out = finish(bench);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "one JSON object: {text}");
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let number = |path: &[&str]| {
        let mut v = &report;
        for key in path {
            v = &v[key];
        }
        v.as_f64().unwrap_or_else(|| panic!("{path:?} in {text}"))
    };
    assert_eq!(number(&["masters"]), 3.0);
    assert_eq!(number(&["tls_masters"]), 0.0);
    assert_eq!(number(&["threads"]), 2.0);
    assert_eq!(report["client"].as_str(), Some("shared"), "{text}");
    assert!(number(&["cycles"]) > 0.0, "{text}");
    assert!(number(&["cycles_per_sec"]) > 0.0, "{text}");
    assert!(number(&["duration_s"]) >= 2.0, "{text}");
    assert_eq!(
        number(&["acquire_failed"]),
        0.0,
        "one resource per thread: {text}"
    );
    assert_eq!(number(&["errors"]), 0.0, "{text}");
    for op in ["acquire_us", "release_us"] {
        for p in ["p50", "p90", "p99", "p999", "max"] {
            assert!(number(&[op, p]) > 0.0, "{op}.{p}: {text}");
        }
        assert!(number(&[op, "p50"]) <= number(&[op, "max"]), "{text}");
    }
}

#[test]
fn probe_warns_about_an_eviction_policy_that_can_drop_lock_keys() {
    let evicting = master_with(&Options::new().args(["--maxmemory-policy", "allkeys-lru"]));
    let mut probe = redlock(&[evicting.url()]);
    probe.arg("probe");
    let out = finish(probe);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = stdout(&out);
    assert!(
        report.contains("warning: maxmemory-policy allkeys-lru"),
        "{report}"
    );
    assert!(report.contains("evict"), "{report}");
    assert!(report.contains("run_id "), "{report}");
    assert!(report.contains("1 of 1 masters healthy"), "{report}");
}

#[test]
fn probe_fails_without_a_quorum_of_healthy_masters() {
    let live = master_with(&Options::new().requirepass("s3cret"));
    let with_password = live.url().replacen("redis://", "redis://:s3cret@", 1);
    let without_password = live.url();
    let urls = vec![
        with_password,
        without_password,
        "redis://127.0.0.1:1".to_owned(),
    ];
    let mut probe = redlock(&urls);
    probe.arg("probe");
    let out = finish(probe);
    let report = stdout(&out);
    assert_eq!(code(&out), 69, "{report}{}", stderr(&out));
    assert!(
        report.lines().next().is_some_and(|l| l.contains(" ok ")),
        "{report}"
    );
    assert!(report.contains("NOAUTH"), "{report}");
    assert!(report.contains("UNREACHABLE"), "{report}");
    assert!(report.contains("1 of 3 masters healthy"), "{report}");
    assert!(
        !report.contains("s3cret"),
        "the password must not be shown: {report}"
    );
}

/// `probe` of `masters`, trusting `ca` for rediss://.
fn probe_tls(masters: &[&Server], ca: &Path) -> Output {
    let urls: Vec<String> = masters.iter().map(|m| m.url()).collect();
    let mut probe = redlock(&urls);
    probe.arg("--tls-ca").arg(ca).arg("probe");
    finish(probe)
}

/// A TLS-only master serving `pair`.
fn tls_master(certs: &Certs, pair: &Pair) -> Server {
    master_with(&Options::new().tls(certs.options(pair)))
}

#[test]
fn probe_names_the_server_and_its_version() {
    let live = master();
    let info = connect(&live).cmd(&["INFO".into(), "server".into()]);
    let Reply::Bulk(info) = info else {
        panic!("INFO server answered {info:?}");
    };
    let info = String::from_utf8_lossy(&info);
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    // Redis names no server_name and the name falls back to redis; Valkey
    // names itself, and its own version beside a redis_version of 7.2.4.
    let named = match field("server_name") {
        Some(server) => {
            let own = field(&format!("{server}_version")).expect("the server's own version");
            format!("{server} {own}")
        }
        None => format!("redis {}", field("redis_version").expect("redis_version")),
    };
    let mut probe = redlock(&[live.url()]);
    probe.arg("probe");
    let out = finish(probe);
    let report = stdout(&out);
    assert_eq!(code(&out), 0, "{report}{}", stderr(&out));
    let line = format!("{}  ok  {named}  rtt ", live.url());
    assert!(report.starts_with(&line), "want {line:?} in {report}");
    assert!(!report.contains("tls:"), "{report}");
}

#[test]
fn probe_reports_the_tls_version_suite_and_certificate_expiry() {
    let certs = Certs::generate();
    let live = tls_master(&certs, &certs.server);
    let out = probe_tls(&[&live], &certs.ca);
    let report = stdout(&out);
    assert_eq!(code(&out), 0, "{report}{}", stderr(&out));
    assert!(live.url().starts_with("rediss://"), "{}", live.url());
    assert!(
        report.starts_with(&format!("{}  ok  redis ", live.url())),
        "{report}"
    );
    let tls = report
        .lines()
        .find_map(|l| l.strip_prefix("  tls: "))
        .unwrap_or_else(|| panic!("no tls line in {report}"));
    let (protocol, rest) = tls.split_once(", ").expect("protocol, suite, expiry");
    assert!(["TLS 1.3", "TLS 1.2"].contains(&protocol), "{tls}");
    let (suite, expiry) = rest.split_once(", ").expect("suite, expiry");
    assert!(suite.starts_with("TLS"), "a cipher suite's name: {tls}");
    // rcgen's default: valid until 4096.
    assert_eq!(
        expiry, "certificate valid until 4096-01-01 00:00:00 UTC",
        "{tls}"
    );
    assert!(!report.contains("certificate expires"), "{report}");
    assert!(report.contains("1 of 1 masters healthy"), "{report}");
}

#[test]
fn probe_warns_about_a_certificate_that_expires_within_30_days() {
    let certs = Certs::generate();
    let live = tls_master(&certs, &certs.expiring);
    let out = probe_tls(&[&live], &certs.ca);
    let report = stdout(&out);
    // Still valid, so still healthy: a warning, not a failure.
    assert_eq!(code(&out), 0, "{report}{}", stderr(&out));
    let days = certs::EXPIRING_IN.as_secs() / 86_400;
    // Made within a second of the probe: `days` whole days are left, or
    // one fewer (the certificate holds whole seconds).
    let warned = [days - 1, days].iter().any(|d| {
        report.contains(&format!(
            "\n  warning: the TLS certificate expires in {d} days ("
        ))
    });
    assert!(warned, "want a warning {days} days ahead in {report}");
    assert!(report.contains("1 of 1 masters healthy"), "{report}");
}

#[test]
fn probe_reports_a_master_whose_certificate_fails_verification_unreachable() {
    let certs = Certs::generate();
    let good = tls_master(&certs, &certs.server);
    let expired = tls_master(&certs, &certs.expired);
    let misnamed = tls_master(&certs, &certs.wrong_host);
    let out = probe_tls(&[&good, &expired, &misnamed], &certs.ca);
    let report = stdout(&out);
    assert_eq!(code(&out), 69, "{report}{}", stderr(&out));
    let line = |server: &Server| {
        report
            .lines()
            .find(|l| l.starts_with(&format!("{}  ", server.url())))
            .unwrap_or_else(|| panic!("no line for {} in {report}", server.url()))
    };
    assert!(line(&good).contains("  ok  "), "{report}");
    assert!(
        line(&expired).contains("UNREACHABLE: TLS: invalid peer certificate: certificate expired"),
        "{report}"
    );
    assert!(
        line(&misnamed)
            .contains("UNREACHABLE: TLS: invalid peer certificate: certificate not valid for name"),
        "{report}"
    );
    assert!(
        report.contains("1 of 3 masters healthy, quorum 2"),
        "{report}"
    );
    assert!(
        stderr(&out).contains("only 1 of 3 masters healthy"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn probe_trusting_the_wrong_ca_reports_the_unknown_issuer_and_exits_69() {
    let certs = Certs::generate();
    let live = tls_master(&certs, &certs.server);
    let out = probe_tls(&[&live], &certs.other_ca);
    let report = stdout(&out);
    assert_eq!(code(&out), 69, "{report}{}", stderr(&out));
    let want = format!(
        "{}  UNREACHABLE: TLS: invalid peer certificate: UnknownIssuer\n",
        live.url()
    );
    assert!(report.starts_with(&want), "want {want:?} in {report}");
    assert!(report.contains("0 of 1 masters healthy"), "{report}");
}

#[test]
fn probe_presents_the_client_certificate_a_master_asks_for() {
    let certs = Certs::generate();
    let mutual = master_with(&Options::new().tls(certs.server_options().auth_clients(true)));

    let without = probe_tls(&[&mutual], &certs.ca);
    let report = stdout(&without);
    assert_eq!(code(&without), 69, "{report}{}", stderr(&without));
    assert!(
        report.starts_with(&format!("{}  UNREACHABLE: TLS: ", mutual.url())),
        "{report}"
    );

    let mut probe = redlock(&[mutual.url()]);
    probe
        .arg("--tls-ca")
        .arg(&certs.ca)
        .arg("--tls-cert")
        .arg(&certs.client.cert)
        .arg("--tls-key")
        .arg(&certs.client.key)
        .arg("probe");
    let with = finish(probe);
    let report = stdout(&with);
    assert_eq!(code(&with), 0, "{report}{}", stderr(&with));
    assert!(report.contains("\n  tls: TLS 1."), "{report}");
}

#[test]
fn probe_with_a_missing_ca_file_is_a_usage_error() {
    let certs = Certs::generate();
    let live = tls_master(&certs, &certs.server);
    let missing = certs.dir().join("no-such-ca.pem");
    let out = probe_tls(&[&live], &missing);
    assert_eq!(code(&out), 2, "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("no-such-ca.pem"), "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
}

#[test]
fn usage_errors_exit_2_with_one_line_on_stderr() {
    let urls = vec!["redis://127.0.0.1:1".to_owned()];
    let cases: &[&[&str]] = &[
        &[],
        &["frobnicate"],
        &["run"],
        &["run", "r"],
        &["run", "--wait", "1s", "--nonblock", "r", "--", "true"],
        &["acquire", "r", "--ttl", "5 parsecs"],
        &["acquire", "r", "--ttl", "0s"],
        &["release", "r"],
        &["bench", "--threads", "0"],
        &["bench", "--wait-mode", "sometimes"],
        &["bench", "--wait-mode", "poll", "--wake-spread", "1ms"],
    ];
    for args in cases {
        let mut command = redlock(&urls);
        command.args(*args);
        let out = finish(command);
        let err = stderr(&out);
        assert_eq!(code(&out), 2, "{args:?}: {err}");
        assert!(
            !err.is_empty() && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }

    let mut bad_url = redlock(&["http://127.0.0.1:1".to_owned()]);
    bad_url.args(["acquire", "r"]);
    let out = finish(bad_url);
    assert_eq!(code(&out), 2);
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("redlock: master URL #1"),
        "{}",
        stderr(&out)
    );

    let mut help = redlock(&[]);
    help.arg("--help");
    let out = finish(help);
    assert_eq!(code(&out), 0);
    assert!(stdout(&out).contains("Exit status"), "{}", stdout(&out));
    assert!(stdout(&out).contains("75"), "{}", stdout(&out));
}

#[test]
fn no_masters_given_is_a_usage_error_naming_the_remedy() {
    for args in [
        &["acquire", "r"][..],
        &["probe"],
        &["run", "r", "--", "true"],
    ] {
        let mut command = redlock(&[]);
        command.args(args);
        let out = finish(command);
        assert_eq!(code(&out), 2, "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("redlock: no Redis masters given"), "{err}");
        assert!(
            err.contains("--servers") && err.contains("REDLOCK_SERVERS"),
            "{err}"
        );
    }
}

// The key a lock takes is the resource name as given: a plain GET sees it.
#[test]
fn the_resource_is_the_redis_key_as_given() {
    let masters = cluster(1);
    let mut acquire = redlock(&masters.urls());
    acquire.args(["acquire", "orders:42"]);
    let out = finish(acquire);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = stdout(&out).trim().to_owned();
    let mut c = connect(&masters[0]);
    assert_eq!(
        c.cmd(&["GET".into(), Arg::Bytes(b"orders:42")]),
        bulk(&token)
    );
}

#[test]
fn bench_batches_spins_and_gives_each_thread_a_client_on_request() {
    let mut bench = redlock(&[]);
    bench.args([
        "bench",
        "--spawn",
        "3",
        "--duration",
        "1s",
        "--threads",
        "1",
        "--batch",
        "16",
        "--spin",
        "--client-per-thread",
        "--json",
        // Not the 50 ms default: a slow round on a loaded machine would
        // count as an error.
        "--timeout",
        "2s",
    ]);
    let out = finish(bench);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(report["batch"].as_u64(), Some(16), "{text}");
    assert_eq!(
        report["resources"].as_u64(),
        Some(16),
        "one per batch slot: {text}"
    );
    assert_eq!(report["spin"].as_bool(), Some(true), "{text}");
    assert_eq!(report["client"].as_str(), Some("per-thread"), "{text}");
    assert!(report["cycles"].as_u64().is_some_and(|c| c >= 16), "{text}");
    assert_eq!(report["errors"].as_u64(), Some(0), "{text}");
}

#[test]
fn restart_quarantine_is_on_by_default_and_names_itself() {
    let masters = common::cluster(3);
    let mut acquire = shipped(&masters.urls());
    // A long timeout, so that a slow first round cannot be what fails.
    acquire.args(["--timeout", "5s", "acquire", "--nonblock", "fresh"]);
    let out = finish(acquire);
    // Masters up for less than the 60 s maximum TTL do not count yet.
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with(
            "redlock: cannot acquire \"fresh\": quorum missed: 3 of 3 masters in restart \
             quarantine for up to 60 s more ("
        ) || err.contains(": quorum missed: 2 of 3 masters in restart quarantine"),
        "{err}"
    );
    // The command's own switch, not the library's setting.
    assert!(err.contains("--no-quarantine"), "{err}");
    assert!(!err.contains("Config::"), "{err}");
    assert!(err.contains("in restart quarantine for 60 s more"), "{err}");
}

/// `probe` at uptime 0 said "3 of 3 masters healthy: ok" while
/// every lock failed. Each master in restart quarantine says so, by the
/// client's rule (`--max-ttl` honoured), and a quorum in quarantine is no
/// quorum for a lock yet: exit 69. `--no-quarantine` turns it off.
#[test]
fn probe_shows_masters_in_restart_quarantine() {
    let masters = common::cluster(3);
    let urls = masters.urls();
    let mut probe = shipped(&urls);
    probe.args(["--max-ttl", "30s", "probe"]);
    let out = finish(probe);
    let report = stdout(&out);
    assert_eq!(code(&out), 69, "{report}{}", stderr(&out));
    for url in &urls {
        let line = report
            .lines()
            .find(|l| l.starts_with(url.as_str()))
            .unwrap_or_else(|| panic!("{url}: {report}"));
        // Up 0 or 1 s: a quarantine of 30 s, as the client reckons it.
        let quarantined = ["(uptime 0 s < max TTL 30 s)", "(uptime 1 s < max TTL 30 s)"];
        assert!(
            line.starts_with(&format!("{url}  in restart quarantine for 30 s more ("))
                && quarantined.iter().any(|q| line.contains(q)),
            "{report}"
        );
    }
    assert!(
        report.contains("3 of 3 masters healthy, quorum 2: NO LOCK for 30 s more"),
        "{report}"
    );
    assert!(report.contains("--no-quarantine"), "{report}");

    let mut off = shipped(&urls);
    off.args(["--no-quarantine", "probe"]);
    let out = finish(off);
    let report = stdout(&out);
    assert_eq!(code(&out), 0, "{report}{}", stderr(&out));
    assert!(!report.contains("quarantine"), "{report}");
    assert!(
        report.contains("3 of 3 masters healthy, quorum 2: ok"),
        "{report}"
    );
}

/// A port that answers HTTP reads as not a Redis server, in
/// `probe` as in the lock commands.
#[test]
fn an_http_port_reads_as_not_a_redis_server() {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    let urls = [format!("redis://127.0.0.1:{port}")];
    let said = "not a Redis server (it answered \"HTTP/1.1 400 Bad Request\")";
    let mut probe = redlock(&urls);
    probe.arg("probe");
    let out = finish(probe);
    let report = stdout(&out);
    assert_eq!(code(&out), 69, "{report}");
    assert!(
        report.contains(&format!("{}  UNREACHABLE: {said}", urls[0])),
        "{report}"
    );
    let mut acquire = one_shot(&urls);
    acquire.args(["acquire", "--nonblock", "r"]);
    let out = finish(acquire);
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(stderr(&out).contains(said), "{}", stderr(&out));
}

#[test]
fn a_ttl_over_max_ttl_is_a_usage_error() {
    let masters = common::cluster(1);
    let mut acquire = shipped(&masters.urls());
    acquire.args(["--max-ttl", "5s", "acquire", "r", "--ttl", "6s"]);
    let out = finish(acquire);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("quarantine"), "{}", stderr(&out));
}

#[test]
fn a_short_ttl_is_kept_alive_for_as_long_as_the_command_runs() {
    let masters = cluster(3);
    let urls = masters.urls();
    let scratch = Scratch::new();
    let (pid_file, go) = (scratch.file("pid"), scratch.file("go"));
    let ttl = Duration::from_secs(2);
    let mut holder = redlock(&urls);
    // A short TTL, yet rounds that a loaded machine does not time out: the
    // retries of a failed extension get a third of the TTL less a round.
    holder
        .args([
            "run",
            "--ttl",
            "2s",
            "--timeout",
            "250ms",
            "short",
            "--",
            "sh",
            "-c",
        ])
        // Runs until told to stop, so that no contender can come after it
        // however slowly the contenders run.
        .args(until_go(&pid_file, &go, 60));
    let mut holder = Running::start(holder);
    wait_for_file(&pid_file, &mut holder);
    let started = Instant::now();
    // Three TTLs and more: only extensions keep the others out.
    while started.elapsed() < ttl * 13 / 4 {
        let mut contender = one_shot(&urls);
        contender.args(["run", "--nonblock", "short", "--", "true"]);
        let out = finish(contender);
        assert_eq!(
            code(&out),
            1,
            "after {:?}: {}",
            started.elapsed(),
            stderr(&out)
        );
        thread::sleep(Duration::from_millis(300));
    }
    fs::write(&go, "").expect("writing the go file");
    let (status, err) = holder.wait(EXIT_DEADLINE);
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("lost the lock"), "{err}");
    assert_free(&masters, "short");
}

/// True once `pid` has exited: no such process, or a zombie that its
/// parent has not reaped yet (`kill(pid, 0)` still succeeds on those).
fn has_exited(pid: libc::pid_t) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// A process's start time (field 22 of `/proc/PID/stat`), to tell it from
/// a later process that reused its pid.
fn start_time(pid: libc::pid_t) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // Fields from the 3rd (state) on; the start time is the 22nd.
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// A command run under a lock, SIGKILLed on drop if it still runs: a
/// failing test must not leave behind a command that ignores SIGTERM.
struct KillOnDrop {
    pid: libc::pid_t,
    started: Option<String>,
}

impl KillOnDrop {
    fn new(pid: libc::pid_t) -> KillOnDrop {
        KillOnDrop {
            pid,
            started: start_time(pid),
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !has_exited(self.pid) && self.started.is_some() && start_time(self.pid) == self.started {
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

/// Polls until `done` holds, failing the test after `limit`.
fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    assert!(
        common::eventually(limit, &mut done),
        "{what} within {limit:?}"
    );
}

/// A command that ignores SIGTERM, under a
/// 3 s lock whose majority stalls, with `--kill-after 30s`. It must be dead
/// by the lock's deadline, not 30 s after the loss.
///
/// What is asserted cannot flake on a slow machine:
/// - exit 75, and the command ended by SIGKILL (redlock says so);
/// - a witness that needs no clock: the key on the master left running
///   expires no earlier than the lock's deadline (its TTL is counted from
///   a SET or PEXPIRE sent after the deadline's round started). So once
///   that key is gone, the command must be too: the test checks the key
///   first and the command second, and a command still alive after the key
///   was seen gone ran past the deadline. A slow test only sees this later,
///   it never sees it falsely;
/// - redlock exits long before `--kill-after`: 20 s after the stall against
///   the ~3 s expected, while the old behaviour could not kill before 30 s.
#[test]
fn a_command_that_ignores_sigterm_dies_by_the_locks_deadline_whatever_kill_after_says() {
    let mut masters = cluster(3);
    let scratch = Scratch::new();
    let pid_file = scratch.file("pid");
    let mut holder = redlock(&masters.urls());
    holder
        .args([
            "run",
            "--ttl",
            "3s",
            "--kill-after",
            "30s",
            "deadline",
            "--",
            "sh",
            "-c",
        ])
        // SIG_IGN survives exec: sleep ignores SIGTERM too, and has no
        // children of its own to outlive it.
        .arg(format!("trap '' TERM; {WRITE_PID}; exec sleep 45"))
        .arg("sh")
        .arg(&pid_file);
    let mut holder = Running::start(holder);
    let child = wait_for_pid(&pid_file, &mut holder);
    let command = KillOnDrop::new(child);

    // Leave running a master that holds the key, stall the two others.
    let mut holding = Vec::new();
    wait_until(SETTLE, "a quorum holds the key", || {
        holding = get_all(&masters, "deadline")
            .iter()
            .map(|v| matches!(v, Reply::Bulk(_)))
            .collect();
        holding.iter().filter(|h| **h).count() >= 2
    });
    let live = holding.iter().position(|h| *h).expect("a holding master");
    let stalled: Vec<usize> = (0..3).filter(|&i| i != live).collect();
    for &i in &stalled {
        masters[i].pause().expect("pausing a master");
    }
    let paused = Instant::now();
    let mut witness = connect(&masters[live]);
    loop {
        let key_gone = witness.cmd(&["EXISTS".into(), "deadline".into()]) == Reply::Integer(0);
        let reaped = matches!(holder.child.try_wait(), Ok(Some(_)));
        if reaped || has_exited(child) {
            break;
        }
        assert!(
            !key_gone,
            "the command was still running after the lock's key expired on the live master"
        );
        assert!(paused.elapsed() < EXIT_DEADLINE, "the command never died");
        thread::sleep(Duration::from_millis(10));
    }
    let (status, err) = holder.wait(EXIT_DEADLINE);
    let took = paused.elapsed();
    for &i in &stalled {
        masters[i].resume().expect("resuming a master");
    }
    drop(command);
    assert_eq!(status.code(), Some(75), "{err}");
    // SIGKILL for the deadline, after the loss was reported or, on a
    // machine too loaded for the keeper thread to report it in time,
    // without it: both say so.
    assert!(err.contains("killed by SIGKILL"), "{err}");
    assert!(err.contains("deadline"), "{err}");
    assert!(
        took < Duration::from_secs(20),
        "took {took:?}: waited for --kill-after: {err}"
    );
}

/// A command that finishes after the lock's deadline did part of its work
/// unprotected, whatever its status: `run` exits 75. redlock is stopped
/// (SIGSTOP) past the deadline, the only way to keep it from killing the
/// command in time; the deadline is less than the TTL after redlock
/// started, since it is counted from the acquire round's start.
#[test]
fn a_command_that_finishes_after_the_deadline_makes_run_exit_75() {
    let masters = cluster(3);
    let scratch = Scratch::new();
    let (pid_file, go) = (scratch.file("pid"), scratch.file("go"));
    let ttl = Duration::from_secs(2);
    let mut holder = redlock(&masters.urls());
    holder
        .args(["run", "--ttl", "2s", "late", "--", "sh", "-c"])
        .arg(format!(
            r#"{WRITE_PID}; i=0; while [ ! -e "$2" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; exit 0"#
        ))
        .arg("sh")
        .arg(&pid_file)
        .arg(&go);
    let started = Instant::now();
    let mut holder = Running::start(holder);
    let child = wait_for_pid(&pid_file, &mut holder);

    holder.signal(libc::SIGSTOP);
    wait_until(ttl * 2, "the TTL passes", || started.elapsed() > ttl);
    fs::write(&go, "").expect("writing the go file");
    wait_until(START_DEADLINE, "the command exits", || has_exited(child));
    holder.signal(libc::SIGCONT);
    let (status, err) = holder.wait(EXIT_DEADLINE);
    assert_eq!(status.code(), Some(75), "{err}");
    assert!(err.contains("after the lock's deadline"), "{err}");
}

#[test]
fn an_absurd_kill_after_waits_for_the_deadline_instead_of_panicking() {
    // 1.6e19 s: a Duration, but past what an Instant can hold.
    let (_, status, err, child) = lose_the_lock("exec sleep 60", "500000000000y");
    assert_eq!(status.code(), Some(75), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!is_alive(child), "the command should have been terminated");
}

/// `run --fence` and `acquire --fence` take fenced locks: each fence is
/// larger than the one before, whoever took it.
#[test]
fn fenced_locks_hand_out_growing_fences_to_run_and_acquire() {
    let masters = cluster(3);
    let urls = masters.urls();
    let scratch = Scratch::new();
    let acquire_fenced = || {
        let mut acquire = redlock(&urls);
        acquire.args(["acquire", "--fence", "fenced", "--ttl", "30s"]);
        let out = finish(acquire);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let printed = stdout(&out);
        let lines: Vec<&str> = printed.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {printed:?}");
        let (token, fence) = lines[0].split_once(' ').expect("token and fence");
        let fence: u64 = fence.parse().expect("a number");
        let mut release = one_shot(&urls);
        release.args(["release", "fenced", token]);
        assert_eq!(code(&finish(release)), 0);
        fence
    };
    let run_fenced = |fenced: bool| {
        let env = scratch.file(if fenced { "fenced" } else { "plain" });
        let mut run = redlock(&urls);
        run.arg("run");
        if fenced {
            run.arg("--fence");
        }
        run.args(["fenced", "--", "sh", "-c"])
            .arg(r#"printf '%s' "${REDLOCK_FENCE-unset}" > "$1""#)
            .arg("sh")
            .arg(&env)
            // A fence inherited from an outer `redlock run` must not leak.
            .env("REDLOCK_FENCE", "7");
        let out = finish(run);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        fs::read_to_string(&env).expect("the command's report")
    };

    let first = acquire_fenced();
    let second: u64 = run_fenced(true).parse().expect("REDLOCK_FENCE");
    let third = acquire_fenced();
    assert!(first < second && second < third, "{first} {second} {third}");
    assert_eq!(run_fenced(false), "unset");

    let mut plain = redlock(&urls);
    plain.args(["acquire", "fenced"]);
    let out = finish(plain);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stdout(&out).trim().contains(' '), "{}", stdout(&out));
}

/// The headline counts locks taken and released; failed attempts stand
/// beside it; a batch draws distinct resources, so that one thread's batch
/// over exactly as many resources never contends with itself.
#[test]
fn bench_counts_only_locks_taken_and_released_and_a_batch_never_contends_with_itself() {
    let mut bench = redlock(&[]);
    bench.args([
        "bench",
        "--spawn",
        "1",
        "--duration",
        "1s",
        "--threads",
        "1",
        "--batch",
        "16",
        "--resources",
        "16",
        "--json",
        // Not the 50 ms default: a slow round on a loaded machine would
        // count as an error.
        "--timeout",
        "2s",
    ]);
    let out = finish(bench);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let count = |key: &str| {
        report[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {text}"))
    };
    assert_eq!(count("acquire_failed"), 0, "self-contention: {text}");
    assert_eq!(count("errors"), 0, "{text}");
    assert!(count("cycles") >= 16, "{text}");
    assert_eq!(
        count("attempts"),
        count("cycles") + count("acquire_failed") + count("errors"),
        "{text}"
    );
    assert_eq!(count("attempts") % 16, 0, "whole batches: {text}");

    // Two threads over the same 16 resources do contend: failures are
    // counted beside the headline, never in it.
    let mut bench = redlock(&[]);
    bench.args([
        "bench",
        "--spawn",
        "1",
        "--duration",
        "1s",
        "--threads",
        "2",
        "--batch",
        "16",
        "--resources",
        "16",
    ]);
    let out = finish(bench);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = stdout(&out);
    let headline = report
        .lines()
        .find(|l| l.contains("locks taken and released"))
        .unwrap_or_else(|| panic!("no headline: {report}"));
    let failed = report
        .lines()
        .find(|l| l.starts_with("failed attempts"))
        .unwrap_or_else(|| panic!("no failures line: {report}"));
    assert!(!headline.contains("failed"), "{report}");
    assert!(failed.contains("held elsewhere"), "{report}");
}

#[test]
fn bench_refuses_fewer_resources_than_a_batch() {
    let mut bench = redlock(&[]);
    bench.args(["bench", "--batch", "16", "--resources", "4"]);
    let out = finish(bench);
    let err = stderr(&out);
    assert_eq!(code(&out), 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--resources") && err.contains("--batch"),
        "{err}"
    );
}

/// A TTL over restart quarantine's maximum is refused before anything is
/// sent, by every command that sets one, naming the flag that raises it.
#[test]
fn a_ttl_over_the_quarantine_maximum_names_the_flag_that_raises_it() {
    let urls = ["redis://127.0.0.1:1".to_owned()];
    let token = "0".repeat(48);
    let cases: &[&[&str]] = &[
        &["acquire", "r", "--ttl", "5m"],
        &["--max-ttl", "5s", "acquire", "r", "--ttl", "6s"],
        &["--max-ttl", "5s", "run", "--ttl", "6s", "r", "--", "true"],
        &["--max-ttl", "5s", "extend", "r", &token, "--ttl", "6s"],
    ];
    for args in cases {
        let mut command = shipped(&urls);
        command.args(*args);
        let out = finish(command);
        let err = stderr(&out);
        assert_eq!(code(&out), 2, "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("quarantine"), "{args:?}: {err}");
        assert!(err.contains("--max-ttl"), "{args:?}: {err}");
    }
}

/// cli/README.md's shell-script example passes the CLI's own TTL check with
/// the shipped defaults: against masters that are down it fails for that
/// reason (69), not as a usage error (2).
#[test]
fn the_readme_shell_example_passes_the_ttl_check() {
    let readme = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("reading cli/README.md");
    let acquire = readme
        .lines()
        .find_map(|l| l.split_once("$(redlock acquire "))
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(args, _)| args.to_owned())
        .expect("a `token=$(redlock acquire ...)` example");
    let extend = readme
        .lines()
        .find_map(|l| l.trim().strip_prefix("redlock extend "))
        .map(|l| l.split('#').next().unwrap_or_default().to_owned())
        .expect("a `redlock extend ...` example");
    let token = "0".repeat(48);
    let urls = ["redis://127.0.0.1:1".to_owned()];
    for (verb, args) in [("acquire", acquire), ("extend", extend)] {
        let mut command = shipped(&urls);
        command.arg(verb);
        for arg in args.split_whitespace() {
            command.arg(if arg == "\"$token\"" { &token } else { arg });
        }
        if verb == "acquire" {
            command.arg("--nonblock");
        }
        let out = finish(command);
        assert_eq!(code(&out), 69, "{verb} {args}: {}", stderr(&out));
    }
}

/// One server named twice is refused before it can vote
/// twice: exit 2, both URLs named, nothing left on the master.
#[test]
fn one_server_named_twice_is_a_usage_error_naming_both_urls() {
    let masters = common::cluster(2);
    let port = masters[0].port();
    let urls = vec![
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}"),
        masters[1].url(),
    ];
    let mut command = one_shot(&urls);
    command.args(["acquire", "cli:twice", "--ttl", "10s"]);
    let output = finish(command);
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    let message = stderr(&output);
    assert!(
        message.contains(&urls[0]) && message.contains(&urls[1]),
        "{message}"
    );
    assert_free(&masters, "cli:twice");

    // `run` too, whose warm-up is on a client of its own: the command
    // never starts.
    let scratch = Scratch::new();
    let ran = scratch.file("ran");
    let mut command = one_shot(&urls);
    command.args(["run", "cli:twice", "--", "touch"]).arg(&ran);
    let output = finish(command);
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    assert!(!ran.exists(), "the command ran");
    assert_free(&masters, "cli:twice");
}

/// `bench --servers rediss://...` with `--tls-ca`: every mode of the
/// bench (shared client, a client per thread, async callers) locks over
/// TLS-only masters, and the report says how many masters it spoke TLS
/// to.
#[test]
fn bench_measures_tls_masters_given_their_ca() {
    let certs = certs::Certs::generate();
    let masters = common::cluster_with(3, &Options::new().tls(certs.server_options()));
    let urls = masters.urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    for mode in [
        &["--threads", "2"][..],
        &["--threads", "2", "--client-per-thread"],
        &["--tasks", "4"],
    ] {
        let mut bench = redlock(&urls);
        bench.arg("--tls-ca").arg(&certs.ca).args([
            "bench",
            "--duration",
            "1s",
            "--json",
            // A handshake and a slow round on a loaded machine must not
            // count as errors.
            "--timeout",
            "2s",
        ]);
        bench.args(mode);
        let out = finish(bench);
        assert_eq!(code(&out), 0, "{mode:?}: {}", stderr(&out));
        let text = stdout(&out);
        let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(report["masters"].as_u64(), Some(3), "{text}");
        assert_eq!(report["tls_masters"].as_u64(), Some(3), "{text}");
        assert_eq!(report["spawned"].as_bool(), Some(false), "{text}");
        assert!(
            report["cycles"].as_u64().is_some_and(|c| c > 0),
            "{mode:?}: {text}"
        );
        assert_eq!(report["errors"].as_u64(), Some(0), "{mode:?}: {text}");
    }
}

/// `--tasks C`: C async callers on one thread share one client, driven by
/// the bench's own minimal executor (no runtime).
#[test]
fn bench_runs_async_callers_on_one_thread() {
    let mut bench = redlock(&[]);
    bench.args([
        "bench",
        "--spawn",
        "3",
        "--duration",
        "1s",
        "--tasks",
        "16",
        "--json",
        "--timeout",
        "2s",
    ]);
    let out = finish(bench);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(report["tasks"].as_u64(), Some(16), "{text}");
    assert_eq!(report["client"].as_str(), Some("shared"), "{text}");
    assert_eq!(
        report["resources"].as_u64(),
        Some(16),
        "one per caller: {text}"
    );
    assert!(report["cycles"].as_u64().is_some_and(|c| c > 0), "{text}");
    assert_eq!(report["errors"].as_u64(), Some(0), "{text}");
    assert_eq!(report["acquire_failed"].as_u64(), Some(0), "{text}");
}

/// `--hold D` (the contention bench): threads wait for one held
/// resource instead of counting it as contention; the JSON gives the hold,
/// how waiters wait (notified, with a wake spread, or polling), the waits
/// (open ones counted until the end) and each thread's share.
#[test]
fn bench_holds_locks_and_reports_waits_and_shares() {
    // The spread applies to notified waiters only: null when polling.
    for (mode, spread, spread_us) in [("notify", "200us", Some(200)), ("poll", "", None)] {
        let mut bench = redlock(&[]);
        bench.args([
            "bench",
            "--spawn",
            "3",
            "--duration",
            "2s",
            "--threads",
            "3",
            "--resources",
            "1",
            "--hold",
            "1ms",
            "--retry-delay",
            "20ms",
            "--wait-mode",
            mode,
            "--json",
            "--timeout",
            "2s",
        ]);
        if !spread.is_empty() {
            bench.args(["--wake-spread", spread]);
        }
        let out = finish(bench);
        assert_eq!(code(&out), 0, "{mode}: {}", stderr(&out));
        let text = stdout(&out);
        let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(report["hold_ms"].as_f64(), Some(1.0), "{text}");
        assert_eq!(report["wait_mode"].as_str(), Some(mode), "{text}");
        assert_eq!(report["wake_spread_us"].as_u64(), spread_us, "{text}");
        assert!(report["cycles"].as_u64().is_some_and(|c| c > 0), "{text}");
        assert_eq!(report["errors"].as_u64(), Some(0), "{text}");
        let wait = &report["wait_us"];
        for p in ["p50", "p90", "p99", "max"] {
            assert!(wait[p].as_u64().is_some(), "wait_us.{p}: {text}");
        }
        assert!(wait["p50"].as_u64() <= wait["max"].as_u64(), "{text}");
        assert!(wait["open"].as_u64().is_some_and(|n| n <= 3), "{text}");
        let shares: Vec<f64> = report["shares"]
            .as_array()
            .expect("shares")
            .iter()
            .map(|s| s.as_f64().expect("share"))
            .collect();
        assert_eq!(shares.len(), 3, "{text}");
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{text}");
    }
}

/// The number of subscribers of `channel` on `master` (`PUBSUB NUMSUB`).
fn subscribers(master: &common::Server, channel: &[u8]) -> i64 {
    match connect(master).cmd(&["PUBSUB".into(), "NUMSUB".into(), channel.into()]) {
        Reply::Array(pair) => match pair.as_slice() {
            [_, Reply::Integer(n)] => *n,
            other => panic!("PUBSUB NUMSUB: {other:?}"),
        },
        other => panic!("PUBSUB NUMSUB: {other:?}"),
    }
}

/// `redlock acquire` waits for a held lock by notification. The
/// test holds `r` for 30 s; `redlock acquire --wait 20s` must subscribe to
/// `r`'s release channel on every master (a polling waiter never does) and
/// take the lock as soon as the test releases it. A waiter that only knew
/// the holder's expiry (the one-shot client, which never subscribes) could
/// try again only at 30 s, after its 20 s wait: it would exit 1.
///
/// No durations are compared: the subscription is polled for with a
/// deadline well inside the child's 20 s wait, and the child's own
/// `--wait` bounds its exit.
#[test]
fn acquire_waits_for_a_held_lock_by_release_notification() {
    let masters = cluster(3);
    let urls = masters.urls();
    // Masters started empty by this test: no lock predates them, so
    // restart quarantine is off, here and in `redlock` (see `redlock`).
    let mut holder = common::client(&urls, None);
    let held = holder
        .try_acquire("r", Duration::from_secs(30))
        .expect("the test takes r");

    let mut acquire = redlock(&urls);
    acquire
        .args(["acquire", "--wait", "20s", "--ttl", "5s", "r"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut waiter = Running {
        child: acquire.spawn().expect("starting redlock"),
    };

    let channel = redlock_mio::script::release_channel(b"r");
    assert_eq!(channel, b"redlock:released:r");
    let mut counts = Vec::new();
    let subscribed = common::eventually(Duration::from_secs(15), || {
        if let Ok(Some(status)) = waiter.child.try_wait() {
            panic!("redlock acquire exited ({status}) before subscribing");
        }
        counts = masters.iter().map(|m| subscribers(m, &channel)).collect();
        counts.iter().all(|&n| n == 1)
    });
    assert!(
        subscribed,
        "redlock acquire should subscribe to {} on every master: {counts:?}",
        String::from_utf8_lossy(&channel)
    );

    holder.release(&held).expect("the test releases r");
    let (status, err) = waiter.wait(EXIT_DEADLINE);
    assert_eq!(status.code(), Some(0), "{err}");
    let mut out = String::new();
    waiter
        .child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("reading stdout");
    let token = out.trim();
    assert_eq!(out.lines().count(), 1, "{out:?}");
    assert!(!token.is_empty(), "no token printed: {out:?} {err}");
    assert_ne!(token, held.token().as_str(), "{out:?}");
    assert_held(&masters, "r", token);
}

/// `acquire` over three TLS-only masters trusting
/// their CA (`--tls-ca`) stores the token on all three; `release` (the CA
/// from REDLOCK_TLS_CA) removes it; a client trusting another CA, or the
/// system's roots, is refused with a message naming the certificate
/// problem, and writes nothing.
#[test]
fn acquire_and_release_over_tls_masters_and_a_wrong_ca_is_named() {
    let certs = certs::Certs::generate();
    let masters = common::cluster_with(3, &Options::new().tls(certs.server_options()));
    let urls = masters.urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");

    let mut acquire = one_shot(&urls);
    acquire
        .arg("--tls-ca")
        .arg(&certs.ca)
        .args(["acquire", "tls:cli", "--ttl", "60s"]);
    let out = finish(acquire);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let printed = stdout(&out);
    let token = printed.trim();
    assert!(!token.is_empty() && !token.contains('\n'), "{printed:?}");
    // The acquire returned at its quorum; the third SET lands soon after.
    assert!(
        common::eventually(SETTLE, || get_all(&masters, "tls:cli")
            .iter()
            .all(|v| *v == bulk(token))),
        "every master should hold {token}: {:?}",
        get_all(&masters, "tls:cli")
    );

    let mut release = one_shot(&urls);
    release
        .env("REDLOCK_TLS_CA", &certs.ca)
        .args(["release", "tls:cli", token]);
    let out = finish(release);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_free(&masters, "tls:cli");

    // Another CA, then no CA at all (the system's roots, which do not
    // know the test CA either).
    for (how, ca) in [
        ("another CA", Some(&certs.other_ca)),
        ("system roots", None),
    ] {
        let mut refused = one_shot(&urls);
        if let Some(ca) = ca {
            refused.arg("--tls-ca").arg(ca);
        }
        refused.args(["acquire", "tls:cli", "--ttl", "60s", "--wait", "500ms"]);
        let out = finish(refused);
        let err = stderr(&out);
        assert_eq!(code(&out), 69, "{how}: {err}");
        assert!(
            err.contains("invalid peer certificate: UnknownIssuer"),
            "{how}: the certificate problem should be named: {err}"
        );
        assert!(stdout(&out).is_empty(), "{how}: {}", stdout(&out));
        common::assert_untouched(masters.iter(), how);
    }
}

/// A master stopped with SIGSTOP, continued (SIGCONT) on drop, also when
/// the test fails; its cluster then stops it.
struct Stalled(u32);

impl Stalled {
    fn new(master: &mut Server) -> Stalled {
        master.pause().expect("pausing a master");
        Stalled(master.pid())
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGCONT) };
    }
}

/// One master of three stalled (SIGSTOP: its TCP
/// connects succeed, nothing is answered) costs the one-shot commands
/// nothing: they go on with the quorum that answers. With a 60 s connect
/// timeout and a 60 s per-master timeout, a command that waited for the
/// stalled master's handshake (a warm-up of every master) or for its
/// replies at exit (a client's shutdown) would take a minute; each must
/// end well within 30 s. No duration is compared: a slow machine only
/// brings the exits closer to that bound, which the old waits exceed by
/// 30 s.
#[test]
fn a_stalled_master_costs_acquire_release_and_run_no_wait() {
    let mut masters = cluster(3);
    let urls = masters.urls();
    let _stalled = Stalled::new(&mut masters[2]);
    let answering = [&masters[0], &masters[1]];
    let patient = |args: &[&str]| {
        let mut command = redlock(&urls);
        command
            .args(["--connect-timeout", "60s", "--timeout", "60s"])
            .args(args);
        command
    };
    let bound = Duration::from_secs(30);

    let out = finish_within(patient(&["acquire", "--wait", "0s", "stalled"]), bound);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = stdout(&out).trim().to_owned();
    for master in answering {
        let value = connect(master).cmd(&["GET".into(), "stalled".into()]);
        assert_eq!(value, bulk(&token), "the answering masters hold the lock");
    }

    let out = finish_within(patient(&["release", "stalled", &token]), bound);
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    let out = finish_within(patient(&["run", "stalled", "--", "true"]), bound);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for master in answering {
        let value = connect(master).cmd(&["GET".into(), "stalled".into()]);
        assert_eq!(value, Reply::Nil, "released on the answering masters");
    }
}

/// The lock clients connected to `master`, as (id, last command) from
/// `CLIENT LIST`, the test's own connection left out.
fn lock_clients(master: &Server) -> Vec<(String, String)> {
    let Reply::Bulk(list) = connect(master).cmd(&["CLIENT".into(), "LIST".into()]) else {
        panic!("CLIENT LIST did not answer a bulk string");
    };
    String::from_utf8_lossy(&list)
        .lines()
        .filter_map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(name))
                    .map(str::to_owned)
            };
            Some((field("id=")?, field("cmd=")?))
        })
        .filter(|(_, cmd)| cmd != "client|list")
        .collect()
}

/// `run` keeps its lock alive through
/// the client that acquired it, so that the client extending the lock saw
/// it granted and read each master's `run_id` at the time (restart
/// quarantine needs both). Seen from the masters: the connection that ran
/// the acquire's SET is still open while the command runs, and the
/// extension's EVALSHA comes on that same connection. Before, a one-shot
/// client acquired and closed its connections, and a new client connected
/// for the first extension.
#[test]
fn run_extends_its_lock_on_the_connections_that_acquired_it() {
    let masters = cluster(3);
    let scratch = Scratch::new();
    let (pid_file, go) = (scratch.file("pid"), scratch.file("go"));
    let mut holder = redlock(&masters.urls());
    // A 30 s connect timeout: a connection is not dropped and made again
    // for a reply that a loaded machine is slow to read.
    holder
        .args([
            "--connect-timeout",
            "30s",
            "run",
            "--ttl",
            "3s",
            "kept",
            "--",
            "sh",
            "-c",
        ])
        .args(until_go(&pid_file, &go, 60));
    let mut holder = Running::start(holder);
    wait_for_pid(&pid_file, &mut holder);

    // The lock was taken before the command started.
    let acquired: Vec<Vec<String>> = masters
        .iter()
        .map(|master| {
            lock_clients(master)
                .into_iter()
                .filter(|(_, cmd)| cmd == "set")
                .map(|(id, _)| id)
                .collect()
        })
        .collect();
    for (master, acquired) in masters.iter().zip(&acquired) {
        let mut extended = Vec::new();
        wait_until(START_DEADLINE, "an extension reaches every master", || {
            extended = lock_clients(master)
                .into_iter()
                .filter(|(_, cmd)| cmd == "evalsha")
                .map(|(id, _)| id)
                .collect();
            !extended.is_empty()
        });
        assert!(
            extended.iter().all(|id| acquired.contains(id)),
            "{}: extended on connection {extended:?}, acquired on {acquired:?}",
            master.url()
        );
    }
    fs::write(&go, "").expect("writing the go file");
    let (status, err) = holder.wait(EXIT_DEADLINE);
    assert_eq!(status.code(), Some(0), "{err}");
    assert_free(&masters, "kept");
}

/// A worker for the tests of the command's process group: it ignores
/// SIGTERM (as do the sleeps it runs: SIG_IGN survives exec), writes its
/// pid to `$1`, and runs for a minute at most. Started with its output
/// away from redlock's stderr, which [`Running::wait`] reads to the end.
const STUBBORN_WORKER: &str = r#"trap "" TERM; echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"#;

/// A command whose work runs in its children (`sh -c
/// 'worker & wait'`) is stopped whole at a loss: SIGTERM goes to its
/// process group, and a worker that ignores it is killed with the group
/// after `--kill-after`, though the shell it ran under is gone by then.
/// Before, only the shell was signalled, and the worker ran on after the
/// lock was lost.
#[test]
fn a_lost_lock_stops_the_commands_whole_process_group() {
    let mut masters = cluster(3);
    let scratch = Scratch::new();
    let (leader_file, worker_file) = (scratch.file("leader"), scratch.file("worker"));
    let mut holder = redlock(&masters.urls());
    holder
        .args([
            "run",
            "--ttl",
            "2s",
            "--kill-after",
            "500ms",
            "group",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            r#"{WRITE_PID}; sh -c '{STUBBORN_WORKER}' sh "$2" </dev/null >/dev/null 2>&1 & wait"#
        ))
        .arg("sh")
        .arg(&leader_file)
        .arg(&worker_file);
    let mut holder = Running::start(holder);
    let leader = wait_for_pid(&leader_file, &mut holder);
    let worker = wait_for_pid(&worker_file, &mut holder);
    let _worker = KillOnDrop::new(worker);

    let _stalled = [Stalled::new(&mut masters[0]), Stalled::new(&mut masters[1])];
    let (status, err) = holder.wait(EXIT_DEADLINE);
    assert_eq!(status.code(), Some(75), "{err}");
    assert!(err.contains("lost the lock"), "{err}");
    assert!(has_exited(leader), "the command should have been stopped");
    wait_until(
        SETTLE,
        "the worker that ignores SIGTERM is killed with the command's group",
        || has_exited(worker),
    );
}

/// The process group of `pid`, from `/proc/PID/stat`.
fn process_group(pid: libc::pid_t) -> libc::pid_t {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("reading /proc/PID/stat");
    let (_, rest) = stat.rsplit_once(')').expect("a stat line");
    // Fields from the 3rd (state) on; the group is the 5th.
    rest.split_whitespace()
        .nth(2)
        .and_then(|g| g.parse().ok())
        .expect("a process group")
}

/// The command runs in a process group of its own (so
/// that `run` can signal whatever it starts), and with `--foreground` in
/// redlock's (so that it may read the terminal and gets the terminal's
/// signals itself).
#[test]
fn the_command_runs_in_a_process_group_of_its_own_unless_foreground() {
    let masters = cluster(3);
    for foreground in [false, true] {
        let scratch = Scratch::new();
        let (pid_file, go) = (scratch.file("pid"), scratch.file("go"));
        let mut holder = redlock(&masters.urls());
        holder.arg("run");
        if foreground {
            holder.arg("--foreground");
        }
        holder
            .args(["pgroup", "--", "sh", "-c"])
            .args(until_go(&pid_file, &go, 30));
        let mut holder = Running::start(holder);
        let command = wait_for_pid(&pid_file, &mut holder);
        let (group, redlocks) = (process_group(command), process_group(holder.pid()));
        if foreground {
            assert_eq!(group, redlocks, "--foreground: in redlock's group");
        } else {
            assert_eq!(group, command, "the command leads a group of its own");
            assert_ne!(group, redlocks);
        }
        fs::write(&go, "").expect("writing the go file");
        let (status, err) = holder.wait(EXIT_DEADLINE);
        assert_eq!(status.code(), Some(0), "{err}");
    }
}

/// A pseudo-terminal for `redlock`, as a shell prompt would give it: the
/// slave side is its stdin and the controlling terminal of a session of
/// its own, in which its process group is the foreground one. Keys typed
/// on the master side (Ctrl-C, Ctrl-Z) reach that group as a terminal's
/// signals, sent by the kernel.
struct Terminal {
    master: fs::File,
}

impl Terminal {
    /// Starts `command` on a new pseudo-terminal.
    fn start(mut command: Command) -> (Running, Terminal) {
        use std::ffi::CStr;
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use std::os::unix::process::CommandExt;
        let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
        assert!(master >= 0, "posix_openpt");
        let master = unsafe { fs::File::from_raw_fd(master) };
        assert_eq!(unsafe { libc::grantpt(master.as_raw_fd()) }, 0, "grantpt");
        assert_eq!(unsafe { libc::unlockpt(master.as_raw_fd()) }, 0, "unlockpt");
        let mut name = [0 as libc::c_char; 128];
        let named = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
        assert_eq!(named, 0, "ptsname_r");
        let slave = unsafe { libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY) };
        assert!(slave >= 0, "opening {:?}", unsafe {
            CStr::from_ptr(name.as_ptr())
        });
        command.stdin(unsafe { OwnedFd::from_raw_fd(slave) });
        unsafe {
            command.pre_exec(|| {
                // A session of its own, whose controlling terminal is the
                // slave (stdin by now): its group is the foreground one.
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        (Running::start(command), Terminal { master })
    }

    /// Types `key` (a control character) on the terminal.
    fn press(&mut self, key: u8) {
        use std::io::Write;
        self.master
            .write_all(&[key])
            .expect("writing to the terminal");
    }
}

/// The state letter of `pid` in `/proc/PID/stat` (`T` when stopped).
fn process_state(pid: libc::pid_t) -> char {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.trim_start().chars().next()
        })
        .unwrap_or('?')
}

/// A terminal's Ctrl-C goes to its foreground process group, redlock's,
/// and no longer reaches the command, which runs in a group of its own:
/// redlock passes it on, and exits with the command's status once the
/// lock is released.
#[test]
fn ctrl_c_on_the_terminal_reaches_the_command_through_redlock() {
    let masters = cluster(3);
    let scratch = Scratch::new();
    let pid_file = scratch.file("pid");
    let mut holder = redlock(&masters.urls());
    holder
        .args(["run", "ctrl-c", "--", "sh", "-c"])
        .arg(format!("{WRITE_PID}; exec sleep 30"))
        .arg("sh")
        .arg(&pid_file);
    let (mut holder, mut terminal) = Terminal::start(holder);
    let command = wait_for_pid(&pid_file, &mut holder);
    let _command = KillOnDrop::new(command);
    terminal.press(0x03);
    let (status, err) = holder.wait(EXIT_DEADLINE);
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{err}");
    assert_free(&masters, "ctrl-c");
}

/// A terminal's Ctrl-Z stops redlock's group; redlock stops the command's
/// group first (a command running on while nobody extends the lock nor
/// watches its deadline would outlive it), and continues it when it is
/// continued itself (a shell's `fg` or `bg`).
#[test]
fn ctrl_z_on_the_terminal_stops_the_command_with_redlock_and_fg_continues_both() {
    let masters = cluster(3);
    let scratch = Scratch::new();
    let (pid_file, go) = (scratch.file("pid"), scratch.file("go"));
    let mut holder = redlock(&masters.urls());
    holder
        .args(["run", "ctrl-z", "--", "sh", "-c"])
        .args(until_go(&pid_file, &go, 30));
    let (mut holder, mut terminal) = Terminal::start(holder);
    let command = wait_for_pid(&pid_file, &mut holder);
    let _command = KillOnDrop::new(command);
    terminal.press(0x1a);
    wait_until(SETTLE, "redlock and the command stop", || {
        process_state(holder.pid()) == 'T' && process_state(command) == 'T'
    });
    // `fg`: SIGCONT to redlock's process group.
    assert_eq!(unsafe { libc::killpg(holder.pid(), libc::SIGCONT) }, 0);
    wait_until(SETTLE, "redlock and the command go on", || {
        process_state(holder.pid()) != 'T' && process_state(command) != 'T'
    });
    fs::write(&go, "").expect("writing the go file");
    let (status, err) = holder.wait(EXIT_DEADLINE);
    assert_eq!(status.code(), Some(0), "{err}");
    assert_free(&masters, "ctrl-z");
}

/// With Redis 7's default for a new user (no
/// channel rights): acquire and release work (exit 0, the key gone on
/// every master), and a `run` waiting for a held lock gets it when the
/// holder releases, opening only a handful of connections.
#[test]
fn a_user_without_channel_rights_acquires_releases_and_waits() {
    let masters = cluster(3);
    set_user(masters.iter(), "locker", "on >pw ~* +@all resetchannels");
    let urls = urls_as(masters.iter(), "locker", "pw");
    let mut acquire = one_shot(&urls);
    acquire.args(["acquire", "acl", "--ttl", "30s"]);
    let out = finish(acquire);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = stdout(&out).trim().to_owned();
    let mut release = one_shot(&urls);
    release.args(["release", "acl", &token]);
    let out = finish(release);
    assert_eq!(
        code(&out),
        0,
        "release without channel rights: {}",
        stderr(&out)
    );
    assert_free(&masters, "acl");

    let mut hold = one_shot(&urls);
    hold.args(["acquire", "acl", "--ttl", "3s"]);
    let out = finish(hold);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let held = stdout(&out).trim().to_owned();
    let before: u64 = masters.iter().map(connections_received).sum();
    let mut run = one_shot(&urls);
    run.args(["run", "acl", "--wait", "60s", "--ttl", "30s", "--", "true"]);
    let mut release = one_shot(&urls);
    release.args(["release", "acl", &held]);
    let waiting = thread::spawn(move || finish(run));
    let out = finish(release);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = waiting.join().expect("run");
    assert_eq!(code(&out), 0, "run got the lock: {}", stderr(&out));
    let opened = masters.iter().map(connections_received).sum::<u64>() - before;
    // run's warm-up, command and subscriber connections, the release's,
    // and this test's INFO: a handful, never one per round trip.
    assert!(opened <= 30, "{opened} connections opened");
}

/// A wrong password exits 77 at once (no `--wait`, and with one), naming
/// the authentication failure in one line; a user denied INFO, with
/// restart quarantine on (the default), the same, naming INFO.
#[test]
fn a_wrong_password_or_a_user_denied_info_exits_77_naming_the_refusal() {
    let masters = cluster(3);
    set_user(masters.iter(), "locker", "on >pw ~* &* +@all");
    set_user(masters.iter(), "noinfo", "on >pw ~* &* +@all -info");
    let cases = [
        (
            urls_as(masters.iter(), "locker", "wrong"),
            "AUTH failed: WRONGPASS",
            false,
        ),
        (
            urls_as(masters.iter(), "noinfo", "pw"),
            "INFO server failed: NOPERM",
            true,
        ),
    ];
    for (urls, named, shipped_defaults) in cases {
        for wait in [None, Some("600s")] {
            let mut acquire = if shipped_defaults {
                shipped(&urls)
            } else {
                one_shot(&urls)
            };
            acquire.args(["acquire", "refused", "--ttl", "30s"]);
            if let Some(wait) = wait {
                acquire.args(["--wait", wait]);
            }
            let out = finish(acquire);
            let err = stderr(&out);
            assert_eq!(code(&out), 77, "{named}, wait {wait:?}: {err}");
            assert!(err.contains(named), "{err}");
            assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        }
    }
}
