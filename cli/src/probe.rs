//! `redlock probe`: is each master fit to hold Redlock's keys?
//!
//! This module owns the checks of a deployment. It is not a hot path, so it
//! talks to each master over a plain blocking socket (TCP or unix) with a
//! timeout, through the crate's [`resp`](redlock_mio::resp) codec, and
//! honours the URL's user, password and database. It only reads: PING,
//! `INFO server`, `INFO replication` and `CONFIG GET`; it never writes a key.
//!
//! A master is healthy when it answers PING as a master. Warnings name
//! what endangers mutual exclusion on a healthy one: an eviction policy
//! that can drop lock keys before they expire, replicas a failover could
//! promote, persistence that loses keys across a restart.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use redlock_mio::Endpoint;
use redlock_mio::ServerAddr;
use redlock_mio::resp::{Arg, Limits, Reply, decode, encode_command};

use crate::exit::{self, Failure};
use crate::say;

pub const LONG_ABOUT: &str = "Check each master: reachable or the error, Redis version, \
    round-trip time of a PING (best of 3), uptime and run_id, and warnings about what \
    endangers Redlock's safety there: an eviction policy that can remove lock keys \
    (maxmemory-policy other than noeviction), replicas attached (a failover can hand a \
    lock out twice), and persistence settings that lose locks across a restart.\n\n\
    A master is healthy when it answers PING as a master (not a replica). Exits 69 \
    when fewer than a quorum (N/2+1) are healthy, 0 otherwise, warnings or not. \
    --timeout (default 2s) bounds each connect, read and write.";

/// PINGs per master; the best round trip is reported.
const PINGS: u32 = 3;

/// Why a master could not be checked.
#[derive(Debug)]
enum Down {
    /// No connection, or it broke or timed out.
    Unreachable(String),
    /// Connected, but refused: authentication, SELECT or PING.
    Refused(String),
}

impl From<io::Error> for Down {
    fn from(e: io::Error) -> Down {
        Down::Unreachable(match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "timed out".to_owned(),
            _ => e.to_string(),
        })
    }
}

/// What one master told.
#[derive(Debug, Default)]
struct Findings {
    version: Option<String>,
    rtt: Duration,
    uptime_s: Option<u64>,
    run_id: Option<String>,
    /// Why the master cannot hold locks although it answers.
    unfit: Option<String>,
    warnings: Vec<String>,
    notes: Vec<String>,
}

/// Runs `redlock probe`.
///
/// # Errors
/// A usage failure for a malformed URL.
/// `timeout` bounds each connect, read and write.
pub fn probe(urls: &[String], timeout: Duration) -> Result<u8, Failure> {
    let config = crate::config(urls)?;
    let results: Vec<Result<Findings, Down>> = thread::scope(|scope| {
        let handles: Vec<_> = config
            .servers
            .iter()
            .map(|addr| scope.spawn(move || check(addr, timeout)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Down::Refused("the check failed unexpectedly".to_owned()))
                })
            })
            .collect()
    });
    let mut out = String::new();
    let mut healthy = 0;
    for (addr, result) in config.servers.iter().zip(&results) {
        let line = describe(addr, result);
        out.push_str(&line);
        if matches!(result, Ok(f) if f.unfit.is_none()) {
            healthy += 1;
        }
    }
    let n = config.servers.len();
    let quorum = n / 2 + 1;
    let verdict = if healthy >= quorum {
        "ok"
    } else {
        "NOT ENOUGH for a lock"
    };
    out.push_str(&format!(
        "{healthy} of {n} masters healthy, quorum {quorum}: {verdict}\n"
    ));
    io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .map_err(|e| Failure::new(exit::OSERR, format!("cannot write the report: {e}")))?;
    if healthy < quorum {
        say(&format!(
            "only {healthy} of {n} masters healthy, {quorum} needed"
        ));
        return Ok(exit::UNAVAILABLE);
    }
    Ok(exit::OK)
}

/// The report's lines for one master.
fn describe(addr: &ServerAddr, result: &Result<Findings, Down>) -> String {
    let f = match result {
        Ok(f) => f,
        Err(Down::Unreachable(e)) => return format!("{addr}  UNREACHABLE: {e}\n"),
        Err(Down::Refused(e)) => return format!("{addr}  UNHEALTHY: {e}\n"),
    };
    let mut line = format!("{addr}  ");
    match &f.unfit {
        None => line.push_str("ok"),
        Some(why) => line.push_str(&format!("UNHEALTHY: {why}")),
    }
    line.push_str(&format!(
        "  redis {}  rtt {:.2} ms",
        f.version.as_deref().unwrap_or("?"),
        f.rtt.as_secs_f64() * 1e3
    ));
    if let Some(uptime) = f.uptime_s {
        line.push_str(&format!("  uptime {uptime} s"));
    }
    if let Some(run_id) = &f.run_id {
        line.push_str(&format!("  run_id {run_id}"));
    }
    line.push('\n');
    for warning in &f.warnings {
        line.push_str(&format!("  warning: {warning}\n"));
    }
    for note in &f.notes {
        line.push_str(&format!("  note: {note}\n"));
    }
    line
}

/// A blocking socket, TCP or unix.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// One blocking RESP2 connection.
struct Conn {
    stream: Stream,
    buf: BytesMut,
    limits: Limits,
}

impl Conn {
    fn open(addr: &ServerAddr, timeout: Duration) -> io::Result<Conn> {
        let stream = match &addr.endpoint {
            Endpoint::Tcp { host, port } => {
                let mut last =
                    io::Error::new(io::ErrorKind::NotFound, "host name resolves to no address");
                let mut connected = None;
                for sock in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&sock, timeout) {
                        Ok(s) => {
                            connected = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let s = connected.ok_or(last)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            Endpoint::Unix(path) => {
                let s = UnixStream::connect(path)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                Stream::Unix(s)
            }
        };
        Ok(Conn {
            stream,
            buf: BytesMut::new(),
            limits: Limits {
                // INFO and CONFIG replies only; room for a verbose INFO.
                max_bulk_len: 1024 * 1024,
                ..Limits::default()
            },
        })
    }

    fn call(&mut self, args: &[Arg<'_>]) -> io::Result<Reply> {
        let mut out = BytesMut::new();
        encode_command(&mut out, args);
        self.stream.write_all(&out)?;
        let mut chunk = [0u8; 4096];
        loop {
            match decode(&mut self.buf, &self.limits) {
                Ok(Some(reply)) => return Ok(reply),
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed",
                    ));
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

fn text(reply: &Reply) -> Option<String> {
    match reply {
        Reply::Bulk(b) | Reply::Status(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

fn error_text(reply: &Reply) -> Option<String> {
    match reply {
        Reply::Error(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// The value of `field:` in an INFO reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// Connects, authenticates, and gathers the findings; `Err` when the
/// master cannot be used at all.
fn check(addr: &ServerAddr, timeout: Duration) -> Result<Findings, Down> {
    let mut conn = Conn::open(addr, timeout)?;
    let call = |conn: &mut Conn, args: &[Arg<'_>]| conn.call(args).map_err(Down::from);
    if let Some(password) = &addr.password {
        let reply = match &addr.user {
            Some(user) => call(
                &mut conn,
                &[
                    "AUTH".into(),
                    user.as_str().into(),
                    password.expose().into(),
                ],
            )?,
            None => call(&mut conn, &["AUTH".into(), password.expose().into()])?,
        };
        if let Some(e) = error_text(&reply) {
            return Err(Down::Refused(format!("authentication failed: {e}")));
        }
    }
    if addr.db != 0 {
        let reply = call(&mut conn, &["SELECT".into(), Arg::Int(i64::from(addr.db))])?;
        if let Some(e) = error_text(&reply) {
            return Err(Down::Refused(format!("SELECT {} failed: {e}", addr.db)));
        }
    }
    let mut findings = Findings {
        rtt: Duration::MAX,
        ..Findings::default()
    };
    for _ in 0..PINGS {
        let sent = Instant::now();
        let reply = call(&mut conn, &["PING".into()])?;
        findings.rtt = findings.rtt.min(sent.elapsed());
        if let Some(e) = error_text(&reply) {
            return Err(Down::Refused(format!("PING refused: {e}")));
        }
        if text(&reply).as_deref() != Some("PONG") {
            return Err(Down::Refused(format!("PING answered {reply:?}, not PONG")));
        }
    }
    let server = call(&mut conn, &["INFO".into(), "server".into()])?;
    match (text(&server), error_text(&server)) {
        (Some(info), _) => {
            findings.version = info_field(&info, "redis_version").map(str::to_owned);
            findings.uptime_s = info_field(&info, "uptime_in_seconds").and_then(|s| s.parse().ok());
            findings.run_id = info_field(&info, "run_id").map(str::to_owned);
        }
        (None, Some(e)) => findings.notes.push(format!("INFO server refused: {e}")),
        (None, None) => findings.notes.push("INFO server gave no text".to_owned()),
    }
    let replication = call(&mut conn, &["INFO".into(), "replication".into()])?;
    if let Some(info) = text(&replication) {
        check_replication(&info, &mut findings);
    } else {
        findings
            .notes
            .push("INFO replication refused: replicas not checked".to_owned());
    }
    let mut config = |name: &str| -> Result<Result<Option<String>, String>, Down> {
        let reply = call(&mut conn, &["CONFIG".into(), "GET".into(), name.into()])?;
        Ok(match reply {
            Reply::Array(items) => Ok(items.get(1).and_then(text)),
            other => Err(error_text(&other).unwrap_or_else(|| format!("{other:?}"))),
        })
    };
    let mut settings = Settings::default();
    let wanted = [
        ("maxmemory-policy", &mut settings.policy),
        ("maxmemory", &mut settings.maxmemory),
        ("appendonly", &mut settings.appendonly),
        ("appendfsync", &mut settings.appendfsync),
        ("save", &mut settings.save),
    ];
    let mut refused = None;
    for (name, slot) in wanted {
        match config(name)? {
            Ok(value) => *slot = value,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    match refused {
        None => settings.judge(&mut findings),
        Some(e) => findings.notes.push(format!(
            "CONFIG GET refused ({e}): eviction and persistence not checked"
        )),
    }
    Ok(findings)
}

fn check_replication(info: &str, findings: &mut Findings) {
    if info_field(info, "role") == Some("slave") {
        let master = match (
            info_field(info, "master_host"),
            info_field(info, "master_port"),
        ) {
            (Some(host), Some(port)) => format!(" of {host}:{port}"),
            _ => String::new(),
        };
        findings.unfit = Some(format!(
            "a replica{master}: Redlock needs independent masters that accept writes"
        ));
    }
    let replicas: u64 = info_field(info, "connected_slaves")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if replicas > 0 {
        findings.warnings.push(format!(
            "{replicas} replica(s) attached: replication is asynchronous, so a failover \
             can lose lock keys and hand a lock out twice; Redlock needs independent masters"
        ));
    }
}

/// The `CONFIG GET` values that matter to lock safety (`None`: unknown to
/// this server version).
#[derive(Debug, Default)]
struct Settings {
    policy: Option<String>,
    maxmemory: Option<String>,
    appendonly: Option<String>,
    appendfsync: Option<String>,
    save: Option<String>,
}

impl Settings {
    fn judge(&self, findings: &mut Findings) {
        if let Some(policy) = self.policy.as_deref().filter(|p| *p != "noeviction") {
            let dormant = if self.maxmemory.as_deref() == Some("0") {
                " (dormant while maxmemory is 0, active as soon as it is set)"
            } else {
                ""
            };
            let whose = if policy.starts_with("volatile-") {
                "lock keys carry a TTL, so eviction can remove them"
            } else {
                "eviction can remove lock keys"
            };
            findings.warnings.push(format!(
                "maxmemory-policy {policy}: {whose} before they expire, breaking mutual \
                 exclusion{dormant}; use noeviction"
            ));
        }
        let aof = self.appendonly.as_deref() == Some("yes");
        let fix = "restart it only after the largest TTL in use has passed (delayed restart), \
                   or use appendonly yes with appendfsync always";
        match (aof, self.save.as_deref()) {
            (false, Some("")) => findings.warnings.push(format!(
                "no persistence (appendonly no, save \"\"): a restart comes back empty and can \
                 hand out locks still held; {fix}"
            )),
            (false, Some(save)) => findings.warnings.push(format!(
                "snapshots only (appendonly no, save \"{save}\"): a restart loses locks taken \
                 since the last snapshot; {fix}"
            )),
            _ => {}
        }
        if aof && let Some(fsync) = self.appendfsync.as_deref().filter(|f| *f != "always") {
            findings.notes.push(format!(
                "appendfsync {fsync}: a crash can lose the last writes, locks among them; \
                 appendfsync always or a delayed restart keeps locks safe across a crash"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(settings: Settings) -> Findings {
        let mut findings = Findings::default();
        settings.judge(&mut findings);
        findings
    }

    fn set(policy: &str, appendonly: &str, appendfsync: &str, save: &str) -> Settings {
        Settings {
            policy: Some(policy.to_owned()),
            maxmemory: Some("100mb".to_owned()),
            appendonly: Some(appendonly.to_owned()),
            appendfsync: Some(appendfsync.to_owned()),
            save: Some(save.to_owned()),
        }
    }

    #[test]
    fn settings_that_endanger_locks_are_named() {
        // (case, settings, words the warnings hold, words the notes hold)
        let cases: Vec<(&str, Settings, &[&str], &[&str])> = vec![
            ("safe", set("noeviction", "yes", "always", ""), &[], &[]),
            (
                "allkeys evicts",
                set("allkeys-lru", "yes", "always", ""),
                &["allkeys-lru", "evict"],
                &[],
            ),
            (
                "volatile evicts TTL keys",
                set("volatile-ttl", "yes", "always", ""),
                &["volatile-ttl", "TTL"],
                &[],
            ),
            (
                "no persistence",
                set("noeviction", "no", "everysec", ""),
                &["no persistence", "delayed restart"],
                &[],
            ),
            (
                "snapshots only",
                set("noeviction", "no", "everysec", "3600 1"),
                &["snapshots only"],
                &[],
            ),
            (
                "aof everysec",
                set("noeviction", "yes", "everysec", ""),
                &[],
                &["appendfsync everysec"],
            ),
            ("unknown settings", Settings::default(), &[], &[]),
        ];
        for (name, settings, warnings, notes) in cases {
            let f = judged(settings);
            let all_warnings = f.warnings.join(" | ");
            let all_notes = f.notes.join(" | ");
            assert_eq!(
                f.warnings.is_empty(),
                warnings.is_empty(),
                "{name}: {all_warnings}"
            );
            assert_eq!(f.notes.is_empty(), notes.is_empty(), "{name}: {all_notes}");
            for word in warnings {
                assert!(all_warnings.contains(word), "{name}: {all_warnings}");
            }
            for word in notes {
                assert!(all_notes.contains(word), "{name}: {all_notes}");
            }
        }
    }

    #[test]
    fn an_eviction_policy_without_maxmemory_is_called_dormant() {
        let mut settings = set("allkeys-lru", "yes", "always", "");
        settings.maxmemory = Some("0".to_owned());
        assert!(judged(settings).warnings[0].contains("dormant"));
    }

    #[test]
    fn replicas_warn_and_a_replica_is_unfit() {
        let mut master = Findings::default();
        check_replication(
            "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n",
            &mut master,
        );
        assert!(master.unfit.is_none());
        assert!(master.warnings[0].starts_with("2 replica(s) attached"));

        let mut replica = Findings::default();
        check_replication(
            "role:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:6379\r\nconnected_slaves:0\r\n",
            &mut replica,
        );
        assert_eq!(
            replica.unfit.as_deref(),
            Some(
                "a replica of 10.0.0.1:6379: Redlock needs independent masters that accept writes"
            )
        );
        assert!(replica.warnings.is_empty());
    }

    #[test]
    fn info_fields_are_found_by_exact_name() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_version_extra:x\r\nrun_id:abc\r\n";
        assert_eq!(info_field(info, "redis_version"), Some("7.0.15"));
        assert_eq!(info_field(info, "run_id"), Some("abc"));
        assert_eq!(info_field(info, "uptime_in_seconds"), None);
    }
}
