//! `redlock probe`: is each master fit to hold Redlock's keys?
//!
//! This module owns the checks of a deployment. It is not a hot path, so it
//! talks to each master over a blocking socket (TCP, TCP under rustls for
//! `rediss://`, or unix) with a timeout, through the crate's
//! [`resp`](redlock_mio::resp) codec, and honours the URL's user, password
//! and database. It only reads: PING, `INFO server`, `INFO replication`,
//! `COMMAND DOCS` (the lock commands the master offers) and `CONFIG GET`;
//! it never writes a key. TLS trusts what the lock commands
//! trust: the rustls settings come from the library
//! ([`TlsConfig::client_config`](redlock_mio::TlsConfig::client_config)).
//!
//! A master is healthy when it answers PING as a master. Warnings name
//! what endangers mutual exclusion on a healthy one: an eviction policy
//! that can drop lock keys before they expire, replicas a failover could
//! promote, persistence that loses keys across a restart, a TLS
//! certificate about to expire. The server is named as it names itself
//! (Valkey's `server_name`), not by the Redis version it claims to match.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use redlock_mio::resp::{Arg, Limits, Reply, decode, encode_command};
use redlock_mio::{Capabilities, Cause, Endpoint, LockCommands};
use redlock_mio::{ServerAddr, TlsConfig};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, ProtocolVersion, StreamOwned};

use crate::cert::{self, Validity};
use crate::exit::{self, Failure};
use crate::{Quarantine, say};

pub const LONG_ABOUT: &str = "Check each master: reachable or the error, the server and its \
    version as it names itself (redis 7.0.15, valkey 8.0.1), round-trip time of a PING \
    (best of 3), uptime and run_id, the lock commands it offers (DELIFEQ, DELEX, SET \
    IFEQ: release and extend without Lua), and warnings about what endangers Redlock's safety \
    there: an eviction policy that can remove lock keys (maxmemory-policy other than \
    noeviction), replicas attached (a failover can hand a lock out twice), and \
    persistence settings that lose locks across a restart.\n\n\
    For a rediss:// master it also reports the TLS version, the cipher suite and when \
    the server's certificate expires, and warns when that is within 30 days, or \
    within --max-ttl (the largest TTL the deployment uses) when that is longer: a \
    lock taken now must not outlive the certificate of a master that holds it. TLS \
    trusts what the lock commands trust: --tls-ca, else the system's roots, and \
    --tls-cert/--tls-key for a master that asks for a client certificate. A \
    certificate that fails verification (an unknown issuer, expired, made out to \
    another name) makes the master UNREACHABLE, with rustls's reason.\n\n\
    A master is healthy when it answers PING as a master (not a replica). One up \
    for less than the maximum TTL (--max-ttl, 60 s by default) is shown in restart \
    quarantine, for as long as a lock client leaves it out of the quorum \
    (--no-quarantine: never). Exits 69 when fewer than a quorum (N/2+1) are healthy \
    and out of restart quarantine, 0 otherwise, warnings or not. \
    --timeout (default 2s) bounds each connect, read and write (and so each step \
    of a TLS handshake).";

/// PINGs per master; the best round trip is reported.
const PINGS: u32 = 3;

/// A server certificate that expires sooner than this is warned about
/// (or sooner than `--max-ttl`, when longer): 30 days leaves time to renew.
const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 86_400);

/// Why a master could not be checked.
#[derive(Debug)]
enum Down {
    /// No connection, or it broke or timed out.
    Unreachable(String),
    /// Connected, but refused: authentication, SELECT or PING.
    Refused(String),
}

impl From<io::Error> for Down {
    /// A TLS failure names rustls's reason: an untrusted or expired
    /// certificate, or the master's alert (a client certificate it wants).
    fn from(e: io::Error) -> Down {
        if let Some(tls) = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
            return Down::Unreachable(format!("TLS: {tls}"));
        }
        Down::Unreachable(match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "timed out".to_owned(),
            _ => e.to_string(),
        })
    }
}

/// What one master told.
#[derive(Debug, Default)]
struct Findings {
    /// The server and its version, as it names itself: `valkey 8.0.1`.
    server: Option<String>,
    /// What TLS a `rediss://` master negotiated.
    tls: Option<Session>,
    rtt: Duration,
    /// The lock commands it offers besides `SET NX` and the scripts, as
    /// the client's handshake reads them.
    commands: Option<String>,
    uptime_s: Option<u64>,
    /// The restart quarantine left, by the lock client's rule, as of the
    /// INFO reading: the master's votes do not count until it ends.
    quarantine: Option<Duration>,
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
/// `timeout` bounds each connect, read and write; a certificate that
/// expires within `--max-ttl` (the largest TTL in use, when longer than
/// [`EXPIRY_WARNING`]) is warned about. A master is in restart quarantine
/// as `quarantine` sets it for the lock commands.
pub fn probe(
    urls: &[String],
    timeout: Duration,
    quarantine: Quarantine,
    tls: &TlsConfig,
) -> Result<u8, Failure> {
    // It asks each master itself what it offers, whatever the setting.
    let mut config = crate::config(urls, tls, LockCommands::Auto)?;
    quarantine.apply(&mut config);
    let max_ttl = config.quarantine;
    let horizon = quarantine
        .max_ttl
        .map_or(EXPIRY_WARNING, |ttl| ttl.max(EXPIRY_WARNING));
    // Loaded once, and only when a master asks for TLS, as the library does;
    // settings that cannot work are a usage error, as for the lock commands.
    let tls = if config.servers.iter().any(|s| s.tls) {
        let client = config.tls.client_config();
        Some(client.map_err(|e| Failure::usage(e.to_string()))?)
    } else {
        None
    };
    let tls = tls.as_ref();
    let results: Vec<Result<Findings, Down>> = thread::scope(|scope| {
        let handles: Vec<_> = config
            .servers
            .iter()
            .map(|addr| scope.spawn(move || check(addr, tls, timeout, horizon, max_ttl)))
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
    // The quarantine left on each healthy master, zero when out of it.
    let mut waits = Vec::new();
    for (addr, result) in config.servers.iter().zip(&results) {
        let line = describe(addr, result, max_ttl);
        out.push_str(&line);
        if let Ok(f) = result
            && f.unfit.is_none()
        {
            waits.push(f.quarantine.unwrap_or_default());
        }
    }
    waits.sort_unstable();
    let n = config.servers.len();
    let quorum = n / 2 + 1;
    let healthy = waits.len();
    let quarantined = waits.iter().filter(|w| !w.is_zero()).count();
    // How long until a quorum of healthy masters is out of quarantine.
    let wait = waits.get(quorum - 1).copied();
    let verdict = match wait {
        None => "NOT ENOUGH for a lock".to_owned(),
        Some(wait) if !wait.is_zero() => format!(
            "NO LOCK for {} s more: {quarantined} in restart quarantine (for masters started \
             empty, or that persist every write, --no-quarantine turns it off)",
            seconds_up(wait)
        ),
        Some(_) if quarantined > 0 => format!("ok ({quarantined} in restart quarantine)"),
        Some(_) => "ok".to_owned(),
    };
    out.push_str(&format!(
        "{healthy} of {n} masters healthy, quorum {quorum}: {verdict}\n"
    ));
    io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .map_err(|e| Failure::new(exit::OSERR, format!("cannot write the report: {e}")))?;
    match wait {
        None => say(&format!(
            "only {healthy} of {n} masters healthy, {quorum} needed"
        )),
        Some(wait) if !wait.is_zero() => say(&format!(
            "only {} of {n} masters healthy and out of restart quarantine, {quorum} needed",
            healthy - quarantined
        )),
        Some(_) => return Ok(exit::OK),
    }
    Ok(exit::UNAVAILABLE)
}

/// `d` in whole seconds, rounded up: 0.2 s left reads 1 s, not 0 s.
fn seconds_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A maximum TTL as the user gave it: `60 s`, or `1s 500ms`.
fn ttl_text(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// The report's lines for one master; `max_ttl` is restart quarantine's.
fn describe(
    addr: &ServerAddr,
    result: &Result<Findings, Down>,
    max_ttl: Option<Duration>,
) -> String {
    let f = match result {
        Ok(f) => f,
        Err(Down::Unreachable(e)) => return format!("{addr}  UNREACHABLE: {e}\n"),
        Err(Down::Refused(e)) => return format!("{addr}  UNHEALTHY: {e}\n"),
    };
    let mut line = format!("{addr}  ");
    match (&f.unfit, f.quarantine.zip(f.uptime_s).zip(max_ttl)) {
        (Some(why), _) => line.push_str(&format!("UNHEALTHY: {why}")),
        (None, Some(((left, uptime), max_ttl))) => line.push_str(&format!(
            "in restart quarantine for {} s more (uptime {uptime} s < max TTL {})",
            seconds_up(left),
            ttl_text(max_ttl)
        )),
        (None, None) => line.push_str("ok"),
    }
    line.push_str(&format!(
        "  {}  rtt {:.2} ms",
        f.server.as_deref().unwrap_or("server unknown"),
        f.rtt.as_secs_f64() * 1e3
    ));
    if let Some(uptime) = f.uptime_s {
        line.push_str(&format!("  uptime {uptime} s"));
    }
    if let Some(run_id) = &f.run_id {
        line.push_str(&format!("  run_id {run_id}"));
    }
    line.push('\n');
    if let Some(tls) = &f.tls {
        line.push_str(&format!("  tls: {tls}\n"));
    }
    if let Some(commands) = &f.commands {
        line.push_str(&format!("  lock commands: {commands}\n"));
    }
    for warning in &f.warnings {
        line.push_str(&format!("  warning: {warning}\n"));
    }
    for note in &f.notes {
        line.push_str(&format!("  note: {note}\n"));
    }
    line
}

/// A blocking socket: TCP, TCP under TLS, or unix.
enum Stream {
    Tcp(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// What a TLS handshake settled.
#[derive(Debug)]
struct Session {
    /// `TLS 1.3` or `TLS 1.2`.
    protocol: String,
    /// The cipher suite's IANA name.
    suite: String,
    /// The server certificate's validity, `None` when it sent none.
    validity: Option<Result<Validity, cert::Unreadable>>,
}

impl Session {
    fn of(session: &ClientConnection) -> Session {
        let protocol = match session.protocol_version() {
            Some(ProtocolVersion::TLSv1_3) => "TLS 1.3".to_owned(),
            Some(ProtocolVersion::TLSv1_2) => "TLS 1.2".to_owned(),
            Some(other) => format!("{other:?}"),
            None => "TLS ?".to_owned(),
        };
        let suite = session
            .negotiated_cipher_suite()
            .map(|s| s.suite())
            .map_or_else(
                || "cipher suite ?".to_owned(),
                |s| s.as_str().map_or_else(|| format!("{s:?}"), str::to_owned),
            );
        let validity = session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| cert::validity(leaf.as_ref()));
        Session {
            protocol,
            suite,
            validity,
        }
    }
}

impl std::fmt::Display for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, {}", self.protocol, self.suite)?;
        match &self.validity {
            Some(Ok(validity)) => write!(
                f,
                ", certificate valid until {}",
                cert::utc_text(validity.not_after)
            ),
            Some(Err(e)) => write!(f, ", {e}"),
            None => write!(f, ", no certificate"),
        }
    }
}

/// One blocking RESP2 connection.
struct Conn {
    stream: Stream,
    buf: BytesMut,
    limits: Limits,
    /// Whether a reply was read: the first tells a port that speaks
    /// another protocol (see [`Cause::of_first_reply`]).
    heard: bool,
}

impl Conn {
    /// Connects, and for a `rediss://` master completes the TLS handshake
    /// with `tls`, so that a certificate rustls refuses fails here, naming
    /// why.
    fn open(
        addr: &ServerAddr,
        tls: Option<&Arc<ClientConfig>>,
        timeout: Duration,
    ) -> io::Result<(Conn, Option<Session>)> {
        let mut session = None;
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
                if addr.tls {
                    // `probe` loads the settings whenever a master asks for
                    // TLS; never fall back to plain text without them.
                    let config = tls.ok_or_else(|| io::Error::other("no TLS settings loaded"))?;
                    let tls = handshake(s, config, host)?;
                    session = Some(Session::of(&tls.conn));
                    Stream::Tls(Box::new(tls))
                } else {
                    Stream::Tcp(s)
                }
            }
            Endpoint::Unix(path) => {
                let s = UnixStream::connect(path)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                Stream::Unix(s)
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("probe cannot reach {other:?}"),
                ));
            }
        };
        let conn = Conn {
            stream,
            heard: false,
            buf: BytesMut::new(),
            limits: Limits {
                // INFO and CONFIG replies only; room for a verbose INFO.
                max_bulk_len: 1024 * 1024,
                ..Limits::default()
            },
        };
        Ok((conn, session))
    }

    fn call(&mut self, args: &[Arg<'_>]) -> io::Result<Reply> {
        let mut out = BytesMut::new();
        encode_command(&mut out, args);
        self.stream.write_all(&out)?;
        let mut chunk = [0u8; 4096];
        loop {
            match decode(&mut self.buf, &self.limits) {
                Ok(Some(reply)) => {
                    self.heard = true;
                    return Ok(reply);
                }
                Ok(None) => {}
                Err(e) if self.heard => {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
                Err(e) => {
                    let cause = Cause::of_first_reply(e, &self.buf);
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        cause.to_string(),
                    ));
                }
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

/// A TLS session to `host` (a name or an IP address, checked against the
/// server's certificate, as the library checks it) over `tcp`, its
/// handshake complete. Each read and write is bounded by `tcp`'s timeouts.
///
/// # Errors
/// The socket's error, or rustls's (inside an `InvalidData` error) when
/// the handshake fails.
fn handshake(
    tcp: TcpStream,
    config: &Arc<ClientConfig>,
    host: &str,
) -> io::Result<StreamOwned<ClientConnection, TcpStream>> {
    let name = ServerName::try_from(host.to_owned()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("server name {host:?}: {e}"),
        )
    })?;
    let session = ClientConnection::new(Arc::clone(config), name)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut tls = StreamOwned::new(session, tcp);
    while tls.conn.is_handshaking() {
        match tls.conn.complete_io(&mut tls.sock) {
            // No progress and no error: the socket took no bytes.
            Ok((0, 0)) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(tls)
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

/// What the server says it is, and its version: `server_name` and its own
/// version field where it names itself (Valkey from 7.2.5: `valkey 8.0.1`,
/// although its `redis_version` says 7.2.4), else `redis` and
/// `redis_version`. `None` when INFO tells neither.
fn server_identity(info: &str) -> Option<String> {
    let redis_version = info_field(info, "redis_version").filter(|v| !v.is_empty());
    match info_field(info, "server_name").filter(|n| !n.is_empty()) {
        Some(name) => {
            let own = info_field(info, &format!("{name}_version")).filter(|v| !v.is_empty());
            Some(match own.or(redis_version) {
                Some(version) => format!("{name} {version}"),
                None => name.to_owned(),
            })
        }
        None => redis_version.map(|version| format!("redis {version}")),
    }
}

/// The warning for a server certificate that expires within `horizon` of
/// `now` (Unix seconds), or the note when its expiry is unknown.
fn judge_certificate(session: &Session, now: i64, horizon: Duration, findings: &mut Findings) {
    let validity = match &session.validity {
        Some(Ok(validity)) => validity,
        Some(Err(e)) => {
            findings
                .notes
                .push(format!("{e}: its expiry is not checked"));
            return;
        }
        None => {
            findings
                .notes
                .push("no server certificate: its expiry is not checked".to_owned());
            return;
        }
    };
    let left = validity.not_after.saturating_sub(now);
    let horizon = i64::try_from(horizon.as_secs()).unwrap_or(i64::MAX);
    if left >= horizon {
        return;
    }
    let when = match left {
        ..0 => "has expired".to_owned(),
        0..86_400 => "expires within a day".to_owned(),
        86_400..172_800 => "expires in 1 day".to_owned(),
        _ => format!("expires in {} days", left / 86_400),
    };
    findings.warnings.push(format!(
        "the TLS certificate {when} ({}): renew it before then; once it has expired, \
         clients refuse this master and it no longer counts toward a quorum",
        cert::utc_text(validity.not_after)
    ));
}

/// Seconds since the Unix epoch on the system clock, which is the clock
/// rustls checks certificates against.
fn unix_now() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
}

/// Connects, authenticates, and gathers the findings; `Err` when the
/// master cannot be used at all.
fn check(
    addr: &ServerAddr,
    tls: Option<&Arc<ClientConfig>>,
    timeout: Duration,
    horizon: Duration,
    max_ttl: Option<Duration>,
) -> Result<Findings, Down> {
    let (mut conn, session) = Conn::open(addr, tls, timeout)?;
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
    if let Some(session) = session {
        judge_certificate(&session, unix_now(), horizon, &mut findings);
        findings.tls = Some(session);
    }
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
            findings.server = server_identity(&info);
            findings.uptime_s = info_field(&info, "uptime_in_seconds").and_then(|s| s.parse().ok());
            // The lock client's own rule.
            findings.quarantine = match (findings.uptime_s, max_ttl) {
                (Some(uptime), Some(max_ttl)) => match Cause::of_uptime(uptime, max_ttl) {
                    Some(Cause::Quarantined(left)) => Some(left),
                    _ => None,
                },
                _ => None,
            };
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
    // What the client's handshake asks: the lock commands of its own.
    let docs = call(
        &mut conn,
        &[
            "COMMAND".into(),
            "DOCS".into(),
            "SET".into(),
            "DELIFEQ".into(),
            "DELEX".into(),
        ],
    )?;
    findings.commands = Some(match error_text(&docs) {
        Some(e) => format!("none known, Lua scripts (COMMAND DOCS refused: {e})"),
        None => {
            let caps = Capabilities::from_docs(&docs);
            let way = match (caps.deletes(), caps.set_ifeq) {
                (true, true) => "release and extend without Lua",
                (false, true) => "extend without Lua, release by script",
                (true, false) => "release without Lua, extend by script",
                (false, false) => "release and extend by Lua scripts",
            };
            format!("{} ({way})", caps.describe())
        }
    });
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

    /// `INFO server` of redis-server 7.0.15 (this machine's), abridged.
    const REDIS_INFO: &str = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n\
        redis_git_dirty:0\r\nredis_build_id:ae4d7c971a948f0\r\nredis_mode:standalone\r\n\
        os:Linux 6.8.0 x86_64\r\narch_bits:64\r\nrun_id:bfaeeb5a0c6f1a7f4c1f6f3b7a4d5e6f7a8b9c0d\r\n\
        tcp_port:6379\r\nuptime_in_seconds:864000\r\n";

    /// `INFO server` of Valkey, as valkey-io/valkey-doc's `commands/info.md`
    /// records it (an unreleased build, hence 255.255.255), abridged.
    const VALKEY_UNSTABLE_INFO: &str = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\n\
        valkey_version:255.255.255\r\nredis_git_sha1:b0d5a0f5\r\nredis_git_dirty:1\r\n\
        redis_build_id:1cadaf78f6168f2d\r\nserver_mode:standalone\r\n\
        run_id:e0abe2248cad0c6d9cb2445d8e6b73448f567f74\r\nuptime_in_seconds:94798\r\n";

    #[test]
    fn the_server_is_named_as_it_names_itself() {
        // There is no Valkey binary on the machine these tests were written
        // on: the Valkey cases are recorded INFO texts.
        let cases = [
            ("redis has no server_name", REDIS_INFO, Some("redis 7.0.15")),
            (
                "valkey names itself and its own version",
                VALKEY_UNSTABLE_INFO,
                Some("valkey 255.255.255"),
            ),
            (
                "valkey 8.0.1",
                "redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n",
                Some("valkey 8.0.1"),
            ),
            (
                "the name may come after the versions",
                "valkey_version:7.2.5\r\nredis_version:7.2.4\r\nserver_name:valkey\r\n",
                Some("valkey 7.2.5"),
            ),
            (
                "a name without its own version falls back to redis_version",
                "redis_version:7.2.4\r\nserver_name:keyvalue\r\n",
                Some("keyvalue 7.2.4"),
            ),
            ("a name alone", "server_name:valkey\r\n", Some("valkey")),
            (
                "an empty server_name is no name",
                "redis_version:6.2.14\r\nserver_name:\r\n",
                Some("redis 6.2.14"),
            ),
            ("nothing known", "# Server\r\nuptime_in_seconds:1\r\n", None),
        ];
        for (name, info, want) in cases {
            assert_eq!(server_identity(info).as_deref(), want, "{name}");
        }
    }

    fn session(validity: Option<Result<Validity, cert::Unreadable>>) -> Session {
        Session {
            protocol: "TLS 1.3".to_owned(),
            suite: "TLS13_AES_256_GCM_SHA384".to_owned(),
            validity,
        }
    }

    fn until(not_after: i64) -> Option<Result<Validity, cert::Unreadable>> {
        Some(Ok(Validity {
            not_before: 0,
            not_after,
        }))
    }

    #[test]
    fn a_certificate_near_its_expiry_is_warned_about() {
        const NOW: i64 = 1_795_535_588;
        const DAY: i64 = 86_400;
        // (case, validity, words the warning holds, or none)
        let cases = [
            ("far away", until(NOW + 365 * DAY), None),
            ("exactly 30 days", until(NOW + 30 * DAY), None),
            (
                "a second under 30 days",
                until(NOW + 30 * DAY - 1),
                Some("expires in 29 days"),
            ),
            ("tomorrow", until(NOW + DAY + 5), Some("expires in 1 day")),
            ("within the hour", until(NOW + 3_600), Some("within a day")),
            ("already gone", until(NOW - 1), Some("has expired")),
            ("the far past", until(i64::MIN), Some("has expired")),
        ];
        for (name, validity, want) in cases {
            let mut findings = Findings::default();
            judge_certificate(&session(validity), NOW, EXPIRY_WARNING, &mut findings);
            assert!(findings.notes.is_empty(), "{name}: {:?}", findings.notes);
            match want {
                None => assert!(
                    findings.warnings.is_empty(),
                    "{name}: {:?}",
                    findings.warnings
                ),
                Some(words) => {
                    assert_eq!(findings.warnings.len(), 1, "{name}");
                    assert!(
                        findings.warnings[0].contains(words),
                        "{name}: {:?}",
                        findings.warnings
                    );
                    assert!(findings.warnings[0].contains(" UTC)"), "{name}");
                }
            }
        }
    }

    #[test]
    fn a_max_ttl_past_30_days_widens_the_horizon() {
        const NOW: i64 = 1_795_535_588;
        const DAY: i64 = 86_400;
        let ninety = Duration::from_secs(90 * 86_400);
        let mut findings = Findings::default();
        judge_certificate(&session(until(NOW + 60 * DAY)), NOW, ninety, &mut findings);
        assert_eq!(findings.warnings.len(), 1, "{:?}", findings.warnings);
        assert!(findings.warnings[0].contains("expires in 60 days"));
        let mut findings = Findings::default();
        judge_certificate(&session(until(NOW + 91 * DAY)), NOW, ninety, &mut findings);
        assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    }

    #[test]
    fn an_unknown_expiry_is_a_note() {
        for validity in [None, Some(cert::validity(b"not DER"))] {
            let mut findings = Findings::default();
            judge_certificate(&session(validity), 0, EXPIRY_WARNING, &mut findings);
            assert!(findings.warnings.is_empty());
            assert!(findings.notes[0].contains("expiry is not checked"));
        }
    }

    #[test]
    fn the_tls_line_names_version_suite_and_expiry() {
        assert_eq!(
            session(until(67_090_118_400)).to_string(),
            "TLS 1.3, TLS13_AES_256_GCM_SHA384, certificate valid until 4096-01-01 00:00:00 UTC"
        );
    }

    #[test]
    fn a_tls_failure_names_rustls_reason() {
        let refused = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        match Down::from(refused) {
            Down::Unreachable(why) => {
                assert_eq!(why, "TLS: invalid peer certificate: UnknownIssuer");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn info_fields_are_found_by_exact_name() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_version_extra:x\r\nrun_id:abc\r\n";
        assert_eq!(info_field(info, "redis_version"), Some("7.0.15"));
        assert_eq!(info_field(info, "run_id"), Some("abc"));
        assert_eq!(info_field(info, "uptime_in_seconds"), None);
    }
}
