//! The shared harness of the integration tests: real local masters from
//! [`redlock_test`], and a tiny blocking client that speaks RESP2 with the
//! crate's own codec. Certificates for TLS masters are made in `tls.rs`
//! beside this file, which the tests that need them include on their own
//! (`tests/tls.rs`, and `cli/tests/cli.rs` for `probe` and `bench`): this
//! file is also the CLI's test harness, and keeps rcgen out of the test
//! binaries that make no certificate.
//!
//! The blocking client speaks no TLS: it reaches a TLS master through the
//! master's unix socket, in plain, to read and write keys behind the lock
//! client's back.
//!
//! Starting a master panics with the spawn error's message, so that a
//! machine without redis-server fails every test with one clear line
//! instead of passing silently. Each test stops what it starts: dropping a
//! [`Server`] or [`Cluster`] kills its processes, also when a test panics.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use bytes::BytesMut;
use redlock_mio::resp::{Arg, Limits, Reply, decode, encode_command};
pub use redlock_test::{Cluster, Options, Server};

/// Read and write timeout of a [`Plain`] connection unless a test sets its
/// own: generous, so that a loaded machine does not fail a test, yet a
/// stalled master cannot hang one forever.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// One master with default options.
pub fn master() -> Server {
    master_with(&Options::new())
}

/// One master with the given options.
pub fn master_with(opts: &Options) -> Server {
    Server::start(opts).unwrap_or_else(|e| panic!("{e}"))
}

/// `k` independent masters with default options.
pub fn cluster(k: usize) -> Cluster {
    cluster_with(k, &Options::new())
}

/// `k` independent masters with the given options.
pub fn cluster_with(k: usize, opts: &Options) -> Cluster {
    Cluster::start(k, opts).unwrap_or_else(|e| panic!("{e}"))
}

/// A blocking RESP2 connection over a std `TcpStream` or `UnixStream`.
pub struct Plain {
    stream: Stream,
    buf: BytesMut,
}

/// What a [`Plain`] connection runs over.
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

/// Connects to `server` in plain (over TCP, or over its unix socket for a
/// TLS master), panicking when that fails.
pub fn connect(server: &Server) -> Plain {
    try_connect(server).unwrap_or_else(|e| panic!("connecting to {}: {e}", server.url()))
}

/// Connects to `server` in plain: over TCP, or over its unix socket for a
/// TLS master, whose TCP port speaks TLS only.
pub fn try_connect(server: &Server) -> io::Result<Plain> {
    match server.unix_socket().filter(|_| server.is_tls()) {
        Some(path) => {
            let stream = UnixStream::connect(path)?;
            stream.set_read_timeout(Some(IO_TIMEOUT))?;
            stream.set_write_timeout(Some(IO_TIMEOUT))?;
            Ok(Plain {
                stream: Stream::Unix(stream),
                buf: BytesMut::new(),
            })
        }
        None => try_connect_addr(server.addr()),
    }
}

impl Plain {
    /// Sends one command and reads its reply, panicking on an I/O or
    /// protocol error (an error reply is a value, not a panic).
    pub fn cmd(&mut self, args: &[Arg<'_>]) -> Reply {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("command {args:?}: {e}"))
    }

    /// Sends one command and reads its reply.
    pub fn try_cmd(&mut self, args: &[Arg<'_>]) -> io::Result<Reply> {
        self.send(args)?;
        self.read_reply()
    }

    /// Sends one command without reading its reply.
    pub fn send(&mut self, args: &[Arg<'_>]) -> io::Result<()> {
        let mut out = BytesMut::new();
        encode_command(&mut out, args);
        self.stream.write_all(&out)
    }

    /// Reads the next reply.
    pub fn read_reply(&mut self) -> io::Result<Reply> {
        let limits = Limits::default();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(reply) = decode(&mut self.buf, &limits)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
            {
                return Ok(reply);
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sets the read timeout; `None` blocks forever.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        let set = match &self.stream {
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            Stream::Unix(s) => s.set_read_timeout(timeout),
        };
        set.unwrap_or_else(|e| panic!("setting the read timeout: {e}"));
    }
}

/// A bulk-string reply holding `s`, for comparisons.
pub fn bulk(s: &str) -> Reply {
    Reply::Bulk(bytes::Bytes::copy_from_slice(s.as_bytes()))
}

/// A simple-string reply holding `s`, for comparisons.
pub fn status(s: &str) -> Reply {
    Reply::Status(bytes::Bytes::copy_from_slice(s.as_bytes()))
}

/// Polls `done` every 10 ms until it holds or `limit` passes; true when it
/// held.
pub fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every key `server` holds, each with its value and PTTL, for reports.
pub fn keys_with_ttl(server: &Server) -> Vec<String> {
    let mut c = connect(server);
    let Reply::Array(names) = c.cmd(&["KEYS".into(), "*".into()]) else {
        panic!("KEYS * on {}", server.url());
    };
    names
        .iter()
        .map(|name| {
            let Reply::Bulk(name) = name else {
                return format!("{name:?}");
            };
            let value = c.cmd(&["GET".into(), Arg::Bytes(name)]);
            let pttl = c.cmd(&["PTTL".into(), Arg::Bytes(name)]);
            format!(
                "{} = {value:?} (PTTL {pttl:?})",
                String::from_utf8_lossy(name)
            )
        })
        .collect()
}

/// How many keys `server` holds.
pub fn dbsize(server: &Server) -> i64 {
    match connect(server).cmd(&["DBSIZE".into()]) {
        Reply::Integer(n) => n,
        other => panic!("DBSIZE on {}: {other:?}", server.url()),
    }
}

/// Asserts that no master of `masters` holds any key: nothing was
/// written (`context` says after what).
pub fn assert_untouched<'a>(masters: impl IntoIterator<Item = &'a Server>, context: &str) {
    for server in masters {
        assert_eq!(
            dbsize(server),
            0,
            "{context}: {} was written to",
            server.url()
        );
    }
}

/// Waits, at most `limit`, until `server` holds no key at all. Returns the
/// keys still there when it does not, for the assertion message.
pub fn wait_empty(server: &Server, limit: Duration) -> Result<(), Vec<String>> {
    if eventually(limit, || dbsize(server) == 0) {
        Ok(())
    } else {
        Err(keys_with_ttl(server))
    }
}

/// Connects to a master (or anything speaking RESP2) at `addr` over TCP.
pub fn try_connect_addr(addr: std::net::SocketAddr) -> io::Result<Plain> {
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.set_nodelay(true)?;
    Ok(Plain {
        stream: Stream::Tcp(stream),
        buf: BytesMut::new(),
    })
}

/// A lock client of `urls` for tests: a generous per-instance timeout, so
/// that a loaded machine does not turn a slow reply into a lost vote, and
/// restart quarantine as given (`None` for masters the test started empty:
/// no lock predates them).
pub fn client(urls: &[String], quarantine: Option<Duration>) -> redlock_mio::Redlock {
    let mut config = redlock_mio::Config::new(urls).unwrap_or_else(|e| panic!("{e}"));
    config.per_instance_timeout = Duration::from_millis(300);
    config.quarantine = quarantine;
    let mut client = redlock_mio::Redlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    // Connected before the first round, so that a test's first operation
    // does not spend its per-instance timeout on connect and handshake.
    client.warm_up(Duration::from_secs(5));
    client
}

/// A master's `uptime_in_seconds`.
pub fn uptime(server: &Server) -> u64 {
    let Reply::Bulk(info) = connect(server).cmd(&[Arg::Bytes(b"INFO"), Arg::Bytes(b"server")])
    else {
        panic!("INFO server from {}", server.url());
    };
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no uptime from {}", server.url()))
}

/// Waits until every master has been up for at least `at_least` as the
/// client reckons it (an `uptime_in_seconds` of `u` means more than
/// `u - 1` s), so that only a test's own restarts trigger restart
/// quarantine.
pub fn wait_for_uptime(masters: &Cluster, at_least: Duration) {
    let ready = || {
        masters
            .iter()
            .all(|s| Duration::from_secs(uptime(s).saturating_sub(1)) >= at_least)
    };
    assert!(
        eventually(at_least + Duration::from_secs(10), ready),
        "masters never reached {at_least:?} of uptime"
    );
}

/// Settings for a shared client of masters the test started empty: no
/// lock predates them, so restart quarantine is off (it would keep them
/// out of the quorum at first), and time limits are generous, so that a
/// loaded machine turns no slow reply into a lost vote nor a slow master
/// into a dropped connection.
pub fn shared_config(urls: &[String]) -> redlock_mio::Config {
    let mut config = redlock_mio::Config::new(urls).unwrap_or_else(|e| panic!("{e}"));
    config.per_instance_timeout = Duration::from_secs(2);
    config.connect_timeout = Duration::from_secs(5);
    config.quarantine = None;
    config
}

/// A minimal executor: polls `future` on this thread, parking between
/// wake-ups. No runtime, only `std::task`.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

/// Runs `f` on a thread of its own and waits up to `limit` for it: a call
/// that hangs fails its test (`None`) instead of hanging the run.
pub fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(f());
    });
    result.recv_timeout(limit).ok()
}

/// Sets `key` on each of `masters` to another client's token for `ttl_ms`:
/// a lock held elsewhere.
pub fn hold_elsewhere<'a>(masters: impl IntoIterator<Item = &'a Server>, key: &str, ttl_ms: i64) {
    for m in masters {
        let set = connect(m).cmd(&[
            Arg::Bytes(b"SET"),
            Arg::Bytes(key.as_bytes()),
            Arg::Bytes(b"someone-else"),
            Arg::Bytes(b"PX"),
            Arg::Int(ttl_ms),
        ]);
        assert_eq!(set, status("OK"), "SET {key} on {}", m.url());
    }
}

/// `ACL SETUSER <name> <rule>` on every one of `masters` (the rule's words
/// as separate arguments).
pub fn set_user<'a>(masters: impl IntoIterator<Item = &'a Server>, name: &str, rule: &str) {
    for m in masters {
        let mut args = vec![
            Arg::Bytes(b"ACL"),
            Arg::Bytes(b"SETUSER"),
            Arg::Bytes(name.as_bytes()),
        ];
        args.extend(rule.split_whitespace().map(|w| Arg::Bytes(w.as_bytes())));
        assert_eq!(
            connect(m).cmd(&args),
            status("OK"),
            "ACL SETUSER on {}",
            m.url()
        );
    }
}

/// `redis://user:password@127.0.0.1:port` for each of `masters`.
pub fn urls_as<'a>(
    masters: impl IntoIterator<Item = &'a Server>,
    user: &str,
    password: &str,
) -> Vec<String> {
    masters
        .into_iter()
        .map(|m| format!("redis://{user}:{password}@127.0.0.1:{}", m.port()))
        .collect()
}

/// How many connections `server` has accepted so far
/// (`total_connections_received`).
pub fn connections_received(server: &Server) -> u64 {
    let Reply::Bulk(info) = connect(server).cmd(&[Arg::Bytes(b"INFO"), Arg::Bytes(b"stats")])
    else {
        panic!("INFO stats from {}", server.url());
    };
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no total_connections_received from {}", server.url()))
}

/// The number after `<field>:<prefix>=` in `INFO <section>` (for example
/// `errorstat_NOSCRIPT:count=`), 0 when the line is absent.
pub fn info_count(server: &Server, section: &str, field: &str, prefix: &str) -> u64 {
    let Reply::Bulk(info) = connect(server).cmd(&[Arg::Bytes(b"INFO"), section.into()]) else {
        panic!("INFO {section} from {}", server.url());
    };
    let start = format!("{field}:{prefix}=");
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix(start.as_str()))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// `calls` of `cmdstat_<command>` in `INFO commandstats`, 0 when absent.
pub fn command_calls(server: &Server, command: &str) -> u64 {
    info_count(
        server,
        "commandstats",
        &format!("cmdstat_{command}"),
        "calls",
    )
}

/// Whether `script` is in `server`'s script cache (`SCRIPT EXISTS`).
pub fn script_loaded(server: &Server, script: &redlock_mio::script::Script) -> bool {
    connect(server).cmd(&[
        Arg::Bytes(b"SCRIPT"),
        Arg::Bytes(b"EXISTS"),
        Arg::Bytes(script.sha()),
    ]) == Reply::Array(vec![Reply::Integer(1)])
}

/// A server binary of the test matrix beside Debian's Redis 7.0: the one
/// `env` names, else `fetched` under `target/servers` (for example
/// `valkey-9.1/valkey-server`), downloaded by `scripts/servers.sh` (once
/// per test binary) when missing. Panics with one line saying why when it
/// cannot be had: a test that needs it never passes without it.
pub fn matrix_binary(env: &str, fetched: &str) -> std::path::PathBuf {
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;
    if let Some(given) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        return PathBuf::from(given);
    }
    // The library's tests and the CLI's (one level down) share this file.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = if manifest.join("scripts/servers.sh").exists() {
        manifest.to_path_buf()
    } else {
        manifest.parent().unwrap_or(manifest).to_path_buf()
    };
    let path = root.join("target/servers").join(fetched);
    if path.exists() {
        return path;
    }
    static FETCHED: OnceLock<Result<(), String>> = OnceLock::new();
    let fetched_once = FETCHED.get_or_init(|| {
        let out = std::process::Command::new("bash")
            .arg(root.join("scripts/servers.sh"))
            .output()
            .map_err(|e| format!("cannot run it: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    });
    match fetched_once {
        Ok(()) if path.exists() => path,
        Ok(()) => panic!("scripts/servers.sh left no {}; set {env}", path.display()),
        Err(why) => panic!(
            "{} is missing and scripts/servers.sh failed ({why}); set {env} to the binary",
            path.display()
        ),
    }
}
