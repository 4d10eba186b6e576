//! redlock-test: local `redis-server` processes for the integration tests
//! and benchmarks of redlock-mio.
//!
//! This crate owns redis-server child processes that it starts itself on
//! the loopback interface (`127.0.0.1`), each with a fresh private temporary
//! directory for its log, its working directory and an optional unix
//! socket. It never connects to, starts or stops anything on a remote host,
//! and it is not part of the lock engine: it lives beside the library, not
//! in it, so that a plain dependency on redlock-mio never compiles it.
//!
//! A [`Server`] is one master; a [`Cluster`] is N independent masters, the
//! deployment Redlock runs against. Both stop their processes and remove
//! their directories when dropped, also while a failing test unwinds.
//! Readiness is checked the way a client would see it: a blocking PING over
//! loopback, encoded and parsed with the library's own
//! [`redlock_mio::resp`] codec.
//!
//! A master started with [`Options::tls`] listens for TLS only on its TCP
//! port (`rediss://`). This crate speaks no TLS (it stays free of a TLS
//! stack, since the command line depends on it), so such a master also
//! listens on a private unix socket: the readiness probe goes there, and
//! so can a test that reads the master's keys in plain.
//!
//! ```no_run
//! use redlock_test::{Cluster, Options};
//!
//! # fn main() -> Result<(), redlock_test::SpawnError> {
//! let mut masters = Cluster::start(3, &Options::new())?;
//! println!("masters at {:?}", masters.urls());
//! masters[1].pause()?; // a stalled master: SIGSTOP
//! masters[1].resume()?;
//! masters[2].restart()?; // crash and come back empty, on the same port
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, DirBuilder, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::ops::{Index, IndexMut};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;

use redlock_mio::resp::{Limits, Reply, decode, encode_command};

/// The environment variable naming the redis-server binary to run.
pub const REDIS_SERVER_ENV: &str = "REDIS_SERVER";

/// How long [`Server::start`] waits for PING by default.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

const INSTALL_HINT: &str = "set REDIS_SERVER or install it: apt-get install -y redis-server";
/// Fresh ports tried by [`Server::start`] before giving up.
const PORT_ATTEMPTS: u32 = 5;
/// How long [`Server::restart`] keeps retrying a port that is momentarily busy.
const RESTART_PORT_WAIT: Duration = Duration::from_secs(5);
/// Pause between readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Connect, read and write timeout of one readiness probe. A probe that
/// reaches a stalled process gives up after this long and tries again.
const PROBE_IO_TIMEOUT: Duration = Duration::from_millis(500);
/// How long [`Server::pause`] and [`Server::resume`] wait for the process
/// state to change.
const SIGNAL_WAIT: Duration = Duration::from_secs(5);
/// Lines of the server's log quoted in an error.
const LOG_TAIL_LINES: usize = 20;
/// `sun_path` holds 108 bytes on Linux, including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// Why a redis-server could not be found, started, signalled or stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum SpawnError {
    /// No redis-server binary: `tried` is the explicit path or the value of
    /// `REDIS_SERVER` that does not name an executable, or `None` when
    /// `redis-server` is not on `PATH`.
    NotFound {
        /// The path that was looked for, when one was given.
        tried: Option<PathBuf>,
    },
    /// An operating-system call failed.
    Io {
        /// What was being done, such as "creating the temporary directory".
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The process exited before it answered PING.
    Exited {
        /// The port it was started on.
        port: u16,
        /// How it exited.
        status: ExitStatus,
        /// The last lines of its log and of its standard output.
        log_tail: String,
    },
    /// The process did not answer PING in time; it has been killed.
    Timeout {
        /// The port it was started on.
        port: u16,
        /// How long it was waited for.
        waited: Duration,
        /// The last lines of its log and of its standard output.
        log_tail: String,
    },
    /// Every attempt found its port taken by another process.
    PortInUse {
        /// The last port tried.
        port: u16,
        /// How many times a start was attempted.
        attempts: u32,
        /// The last lines of the last attempt's log.
        log_tail: String,
    },
    /// The server is not running (it was killed), so it cannot be paused or
    /// resumed.
    NotRunning,
    /// The options cannot work, such as a unix socket path that is too long.
    InvalidOptions(String),
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpawnError::NotFound { tried: None } => {
                write!(f, "redis-server not found ({INSTALL_HINT})")
            }
            SpawnError::NotFound { tried: Some(path) } => {
                write!(
                    f,
                    "redis-server not found at {} ({INSTALL_HINT})",
                    path.display()
                )
            }
            SpawnError::Io { context, source } => write!(f, "{context}: {source}"),
            SpawnError::Exited {
                port,
                status,
                log_tail,
            } => write!(
                f,
                "redis-server on 127.0.0.1:{port} exited before answering PING ({status}); \
                 end of its log:\n{log_tail}"
            ),
            SpawnError::Timeout {
                port,
                waited,
                log_tail,
            } => write!(
                f,
                "redis-server on 127.0.0.1:{port} did not answer PING within {waited:?}; \
                 end of its log:\n{log_tail}"
            ),
            SpawnError::PortInUse {
                port,
                attempts,
                log_tail,
            } => write!(
                f,
                "redis-server could not listen after {attempts} attempts, last on \
                 127.0.0.1:{port}: address already in use; end of its log:\n{log_tail}"
            ),
            SpawnError::NotRunning => f.write_str("redis-server is not running"),
            SpawnError::InvalidOptions(why) => write!(f, "invalid redis-server options: {why}"),
        }
    }
}

impl std::error::Error for SpawnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SpawnError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> SpawnError {
    move |source| SpawnError::Io {
        context: context.into(),
        source,
    }
}

/// How a master serves TLS: its certificate and key, the certificate
/// authorities it checks client certificates against, and whether it asks
/// clients for one (`--tls-auth-clients`). The files are PEM, read by
/// redis-server at each start.
///
/// ```
/// use redlock_test::{Options, TlsOptions};
///
/// let opts = Options::new()
///     .tls(TlsOptions::new("server.pem", "server.key", "ca.pem").auth_clients(true));
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    cert_file: PathBuf,
    key_file: PathBuf,
    ca_file: PathBuf,
    auth_clients: bool,
}

impl TlsOptions {
    /// The server's certificate chain, its private key and the CA
    /// certificates for client certificates; clients are not asked for a
    /// certificate (`--tls-auth-clients no`).
    pub fn new(
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
        ca_file: impl Into<PathBuf>,
    ) -> Self {
        TlsOptions {
            cert_file: cert_file.into(),
            key_file: key_file.into(),
            ca_file: ca_file.into(),
            auth_clients: false,
        }
    }

    /// Whether a client must present a certificate signed by the CA file
    /// (mutual TLS): `--tls-auth-clients yes` or `no`.
    pub fn auth_clients(mut self, yes: bool) -> Self {
        self.auth_clients = yes;
        self
    }

    /// The arguments that make redis-server listen for TLS only, on
    /// `port`.
    fn args(&self, port: u16) -> Vec<OsString> {
        vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string().into(),
            "--tls-cert-file".into(),
            self.cert_file.clone().into(),
            "--tls-key-file".into(),
            self.key_file.clone().into(),
            "--tls-ca-cert-file".into(),
            self.ca_file.clone().into(),
            "--tls-auth-clients".into(),
            if self.auth_clients { "yes" } else { "no" }.into(),
        ]
    }
}

/// How to start a redis-server: which binary, extra arguments, a password,
/// an optional unix socket and optional TLS. Built with chained methods.
///
/// ```
/// use redlock_test::Options;
///
/// let opts = Options::new()
///     .requirepass("pw")
///     .args(["--maxmemory-policy", "allkeys-lru"])
///     .unix_socket(true);
/// # let _ = opts;
/// ```
#[derive(Debug, Clone)]
pub struct Options {
    binary: Option<PathBuf>,
    args: Vec<OsString>,
    password: Option<String>,
    unix_socket: bool,
    tls: Option<TlsOptions>,
    startup_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            binary: None,
            args: Vec::new(),
            password: None,
            unix_socket: false,
            tls: None,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
        }
    }
}

impl Options {
    /// Default options: the binary from [`find_binary`], no extra
    /// arguments, no password, no unix socket, no TLS, a 10 s startup
    /// timeout.
    pub fn new() -> Self {
        Options::default()
    }

    /// Runs this binary instead of looking at `REDIS_SERVER` and `PATH`.
    /// A bare name (no `/`) is looked up on `PATH`.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Appends one command-line argument, passed after the ones this crate
    /// sets (so it can override them).
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends command-line arguments, such as
    /// `["--user", "alice", "on", ">pw", "~*", "&*", "+@all"]`.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets `--requirepass` and remembers the password, so that the
    /// readiness probe authenticates first.
    pub fn requirepass(mut self, password: impl Into<String>) -> Self {
        let password = password.into();
        self.args.push("--requirepass".into());
        self.args.push(password.clone().into());
        self.password = Some(password);
        self
    }

    /// Also listens on a unix socket, `redis.sock` in the server's
    /// temporary directory, with permissions 700.
    pub fn unix_socket(mut self, yes: bool) -> Self {
        self.unix_socket = yes;
        self
    }

    /// Listens for TLS only: the TCP port the server is given speaks TLS,
    /// and no port speaks plain TCP. The server then always has a unix
    /// socket too ([`Server::unix_socket`]), through which its readiness is
    /// checked.
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How long to wait for the server to answer PING after each start.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }
}

/// Finds the redis-server binary: `REDIS_SERVER` when set and not empty,
/// else `redis-server` on `PATH`.
///
/// # Errors
/// [`SpawnError::NotFound`] when that names no executable file.
pub fn find_binary() -> Result<PathBuf, SpawnError> {
    resolve_binary(
        None,
        std::env::var_os(REDIS_SERVER_ENV),
        std::env::var_os("PATH"),
    )
}

/// [`find_binary`] with its inputs passed in, so that tests need not touch
/// the process environment.
fn resolve_binary(
    explicit: Option<&Path>,
    env_value: Option<OsString>,
    path_var: Option<OsString>,
) -> Result<PathBuf, SpawnError> {
    let given = explicit
        .map(Path::to_path_buf)
        .or_else(|| env_value.filter(|v| !v.is_empty()).map(PathBuf::from));
    let wanted = given
        .clone()
        .unwrap_or_else(|| PathBuf::from("redis-server"));
    let bare_name = wanted.parent().is_some_and(|p| p.as_os_str().is_empty());
    if !bare_name {
        return if is_executable(&wanted) {
            Ok(wanted)
        } else {
            Err(SpawnError::NotFound { tried: given })
        };
    }
    path_var
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(&wanted))
        .find(|candidate| is_executable(candidate))
        .ok_or(SpawnError::NotFound { tried: given })
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A private directory (mode 700) under [`std::env::temp_dir`], removed
/// with everything in it on drop: each server's, and one for the files a
/// test writes for its servers, such as certificates.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a fresh directory with a unique name.
    ///
    /// # Errors
    /// [`SpawnError::Io`] when it cannot be created.
    pub fn create() -> Result<TempDir, SpawnError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let mut last_error = None;
        for _ in 0..16 {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let name = format!(
                "redlock-mio-{}-{}-{nanos:x}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            let path = base.join(name);
            match DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_error = Some(e),
                Err(e) => return Err(io_error(format!("creating {}", path.display()))(e)),
            }
        }
        let source = last_error
            .unwrap_or_else(|| io::Error::new(io::ErrorKind::AlreadyExists, "no unique name"));
        Err(io_error(format!(
            "creating a temporary directory under {}",
            base.display()
        ))(source))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort: a leftover directory in /tmp is not worth a panic.
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Why one launch did not come up.
enum Launch {
    /// The port was taken: try again, on another port or a bit later.
    PortBusy(String),
    Failed(SpawnError),
}

/// One local redis-server master on a loopback port, stopped (SIGKILL) and
/// cleaned up on drop.
#[derive(Debug)]
pub struct Server {
    binary: PathBuf,
    opts: Options,
    port: u16,
    pid: u32,
    child: Option<Child>,
    socket: Option<PathBuf>,
    // Declared last: removed after `Drop for Server` has stopped the child.
    dir: TempDir,
}

impl Server {
    /// Starts one master on a free loopback port and waits until it answers
    /// PING. A port taken between choosing and binding it is retried with a
    /// fresh port a few times.
    ///
    /// # Errors
    /// [`SpawnError::NotFound`] without a binary; [`SpawnError::Exited`] or
    /// [`SpawnError::Timeout`] (with the end of the server's log) when it
    /// does not come up; [`SpawnError::PortInUse`] when every port tried was
    /// taken; [`SpawnError::Io`] when a directory, file or process cannot be
    /// created.
    pub fn start(opts: &Options) -> Result<Server, SpawnError> {
        let binary = resolve_binary(
            opts.binary.as_deref(),
            std::env::var_os(REDIS_SERVER_ENV),
            std::env::var_os("PATH"),
        )?;
        let dir = TempDir::create()?;
        // A TLS-only master is probed over its unix socket: this crate
        // speaks no TLS.
        let socket = if opts.unix_socket || opts.tls.is_some() {
            let path = dir.path.join("redis.sock");
            if path.as_os_str().len() > MAX_SOCKET_PATH {
                return Err(SpawnError::InvalidOptions(format!(
                    "unix socket path {} is longer than {MAX_SOCKET_PATH} bytes",
                    path.display()
                )));
            }
            Some(path)
        } else {
            None
        };
        let mut server = Server {
            binary,
            opts: opts.clone(),
            port: 0,
            pid: 0,
            child: None,
            socket,
            dir,
        };
        let mut attempts = 0;
        loop {
            attempts += 1;
            server.port = free_port()?;
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(Launch::Failed(e)) => return Err(e),
                Err(Launch::PortBusy(log_tail)) if attempts >= PORT_ATTEMPTS => {
                    return Err(SpawnError::PortInUse {
                        port: server.port,
                        attempts,
                        log_tail,
                    });
                }
                Err(Launch::PortBusy(_)) => {}
            }
        }
    }

    /// The TCP port it listens on, the same across [`Server::restart`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:port` without credentials, or `rediss://...` for
    /// a TLS master.
    pub fn url(&self) -> String {
        let scheme = if self.is_tls() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// True when its TCP port speaks TLS only ([`Options::tls`]).
    pub fn is_tls(&self) -> bool {
        self.opts.tls.is_some()
    }

    /// The unix socket it also listens on, when [`Options::unix_socket`]
    /// asked for one, and always for a TLS master: there it speaks plain
    /// RESP, a side door for tests to read and write keys.
    pub fn unix_socket(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// The password set with [`Options::requirepass`], if any.
    pub fn password(&self) -> Option<&str> {
        self.opts.password.as_deref()
    }

    /// The server's private temporary directory (its log is `redis.log`
    /// there). Removed when the server is dropped.
    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    /// The process id of the most recently started process, which may have
    /// been killed since.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// True while the process has not exited. A paused process is running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Kills the process with SIGKILL, as a crash would, and reaps it.
    /// Does nothing when it is not running. Works on a paused process.
    ///
    /// # Errors
    /// [`SpawnError::Io`] when the signal cannot be sent or the process
    /// cannot be waited for.
    pub fn kill(&mut self) -> Result<(), SpawnError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // A failed kill means the process already exited; the wait below
        // reaps it either way, and its error is the one worth reporting.
        let _ = child.kill();
        child
            .wait()
            .map_err(io_error(format!("waiting for redis-server {}", self.pid)))?;
        Ok(())
    }

    /// Stops the process with SIGSTOP, as a long GC pause or a stalled host
    /// would: connections stay open but nothing is answered. Returns once
    /// the kernel reports the process stopped (on Linux).
    ///
    /// # Errors
    /// [`SpawnError::NotRunning`] after [`Server::kill`];
    /// [`SpawnError::Io`] when the signal fails or the process does not
    /// stop within 5 s.
    pub fn pause(&mut self) -> Result<(), SpawnError> {
        let pid = self.live_pid()?;
        send_signal(pid, libc::SIGSTOP, "SIGSTOP")?;
        wait_for_state(pid, true)
    }

    /// Continues a paused process with SIGCONT.
    ///
    /// # Errors
    /// As [`Server::pause`].
    pub fn resume(&mut self) -> Result<(), SpawnError> {
        let pid = self.live_pid()?;
        send_signal(pid, libc::SIGCONT, "SIGCONT")?;
        wait_for_state(pid, false)
    }

    /// Kills the process if it is running and starts a new one on the same
    /// port with the same arguments, then waits for PING. The new process
    /// starts empty (nothing is saved), like a master that crashed without
    /// persistence. A port that is momentarily busy is retried for a few
    /// seconds.
    ///
    /// # Errors
    /// As [`Server::start`], and as [`Server::kill`].
    pub fn restart(&mut self) -> Result<(), SpawnError> {
        self.kill()?;
        let deadline = Instant::now() + RESTART_PORT_WAIT;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(Launch::Failed(e)) => return Err(e),
                Err(Launch::PortBusy(log_tail)) if Instant::now() >= deadline => {
                    return Err(SpawnError::PortInUse {
                        port: self.port,
                        attempts,
                        log_tail,
                    });
                }
                Err(Launch::PortBusy(_)) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn live_pid(&mut self) -> Result<u32, SpawnError> {
        // Not yet reaped means the pid still names our child, never a
        // recycled one.
        if self.is_running() {
            Ok(self.pid)
        } else {
            Err(SpawnError::NotRunning)
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path.join("redis.log")
    }

    fn stdout_path(&self) -> PathBuf {
        self.dir.path.join("stdout.log")
    }

    /// Starts the process on `self.port` and waits for it to answer PING.
    fn launch(&mut self) -> Result<(), Launch> {
        // Fresh logs, so that an old "Address already in use" is not read
        // as this attempt's.
        let _ = fs::remove_file(self.log_path());
        let output = File::create(self.stdout_path())
            .map_err(io_error("creating redis-server's stdout file"))
            .map_err(Launch::Failed)?;
        let errors = output
            .try_clone()
            .map_err(io_error("duplicating redis-server's stdout file"))
            .map_err(Launch::Failed)?;
        let mut cmd = Command::new(&self.binary);
        match &self.opts.tls {
            Some(tls) => cmd.args(tls.args(self.port)),
            None => cmd.arg("--port").arg(self.port.to_string()),
        };
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir.path)
            .arg("--logfile")
            .arg(self.log_path())
            .args(["--daemonize", "no"]);
        if let Some(socket) = &self.socket {
            cmd.arg("--unixsocket")
                .arg(socket)
                .args(["--unixsocketperm", "700"]);
        }
        cmd.args(&self.opts.args)
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors);
        let child = cmd.spawn().map_err(|e| {
            Launch::Failed(if e.kind() == io::ErrorKind::NotFound {
                SpawnError::NotFound {
                    tried: Some(self.binary.clone()),
                }
            } else {
                io_error(format!("starting {}", self.binary.display()))(e)
            })
        })?;
        self.pid = child.id();
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), Launch> {
        let started = Instant::now();
        loop {
            let exited = match self.child.as_mut().map(Child::try_wait) {
                Some(Ok(None)) => None,
                Some(Ok(Some(status))) => Some(status),
                Some(Err(e)) => {
                    let _ = self.kill();
                    return Err(Launch::Failed(io_error("checking on redis-server")(e)));
                }
                None => return Err(Launch::Failed(SpawnError::NotRunning)),
            };
            if let Some(status) = exited {
                self.child = None;
                let log_tail = self.log_tail();
                return Err(if log_tail.contains("Address already in use") {
                    Launch::PortBusy(log_tail)
                } else {
                    Launch::Failed(SpawnError::Exited {
                        port: self.port,
                        status,
                        log_tail,
                    })
                });
            }
            if self.probe() {
                return Ok(());
            }
            let waited = started.elapsed();
            if waited >= self.opts.startup_timeout {
                let _ = self.kill();
                return Err(Launch::Failed(SpawnError::Timeout {
                    port: self.port,
                    waited,
                    log_tail: self.log_tail(),
                }));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// One readiness check: AUTH when a password is known, PING, and
    /// `INFO server` to make sure the answer comes from our process and
    /// not from another one that won the race for the port.
    fn probe(&self) -> bool {
        let Ok((ping, info)) = self.ping_and_info() else {
            return false;
        };
        match ping {
            Reply::Status(s) if s.as_ref() == b"PONG" => match info {
                Reply::Bulk(text) => info_pid(&text) == Some(self.pid),
                // INFO refused by an ACL: up, though we cannot tell whose.
                _ => true,
            },
            // Password protected and we do not know the password: it is up.
            reply => reply.is_error_code(b"NOAUTH"),
        }
    }

    /// The replies to PING and `INFO server`, pipelined behind an AUTH
    /// when a password is known: over TCP, or over the unix socket for a
    /// TLS master. A TLS master that answers there has bound its TLS port
    /// too: redis-server binds every listener before it serves any, and
    /// exits when one fails.
    fn ping_and_info(&self) -> io::Result<(Reply, Reply)> {
        match (&self.opts.tls, &self.socket) {
            (Some(_), Some(socket)) => {
                let mut stream = UnixStream::connect(socket)?;
                stream.set_read_timeout(Some(PROBE_IO_TIMEOUT))?;
                stream.set_write_timeout(Some(PROBE_IO_TIMEOUT))?;
                self.exchange_ping_and_info(&mut stream)
            }
            _ => {
                let mut stream = TcpStream::connect_timeout(&self.addr(), PROBE_IO_TIMEOUT)?;
                stream.set_read_timeout(Some(PROBE_IO_TIMEOUT))?;
                stream.set_write_timeout(Some(PROBE_IO_TIMEOUT))?;
                self.exchange_ping_and_info(&mut stream)
            }
        }
    }

    fn exchange_ping_and_info(
        &self,
        stream: &mut (impl Read + Write),
    ) -> io::Result<(Reply, Reply)> {
        let mut out = BytesMut::new();
        if let Some(password) = &self.opts.password {
            encode_command(&mut out, &["AUTH".into(), password.as_str().into()]);
        }
        encode_command(&mut out, &["PING".into()]);
        encode_command(&mut out, &["INFO".into(), "server".into()]);
        stream.write_all(&out)?;
        let mut buf = BytesMut::new();
        if self.opts.password.is_some() {
            // A wrong password shows up as NOAUTH on the PING.
            read_reply(stream, &mut buf)?;
        }
        let ping = read_reply(stream, &mut buf)?;
        let info = read_reply(stream, &mut buf)?;
        Ok((ping, info))
    }

    fn log_tail(&self) -> String {
        let mut tail = String::new();
        for path in [self.log_path(), self.stdout_path()] {
            let Ok(bytes) = fs::read(&path) else {
                continue;
            };
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let start = lines.len().saturating_sub(LOG_TAIL_LINES);
            for line in &lines[start..] {
                tail.push_str(line);
                tail.push('\n');
            }
        }
        if tail.is_empty() {
            tail.push_str("(empty)\n");
        }
        tail
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGKILL also ends a SIGSTOPped process. Errors cannot be
        // reported from drop; the child is reaped either way.
        let _ = self.kill();
    }
}

/// Asks the kernel for a free loopback port by binding port 0. The
/// listener is dropped before redis-server binds, so the port can be taken
/// in between: callers retry on "Address already in use".
fn free_port() -> Result<u16, SpawnError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(io_error("binding 127.0.0.1:0 to find a free port"))?;
    let addr = listener
        .local_addr()
        .map_err(io_error("reading the address of 127.0.0.1:0"))?;
    Ok(addr.port())
}

fn send_signal(pid: u32, signal: libc::c_int, name: &str) -> Result<(), SpawnError> {
    let target = libc::pid_t::try_from(pid).map_err(|_| {
        io_error(format!("sending {name}"))(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pid {pid} out of range"),
        ))
    })?;
    // SAFETY: kill(2) has no memory-safety preconditions; `target` is our
    // own unreaped child, so the pid cannot have been recycled.
    let rc = unsafe { libc::kill(target, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io_error(format!("sending {name} to redis-server {pid}"))(
            io::Error::last_os_error(),
        ))
    }
}

/// Waits until `/proc/<pid>/stat` shows the process stopped (or no longer
/// stopped). Without `/proc` the signal is trusted to have been delivered.
fn wait_for_state(pid: u32, stopped: bool) -> Result<(), SpawnError> {
    let deadline = Instant::now() + SIGNAL_WAIT;
    loop {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return Ok(());
        };
        // The state follows the command name, which is in parentheses and
        // may itself contain spaces or parentheses.
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        let is_stopped = state.is_some_and(|s| s == "T" || s == "t");
        if is_stopped == stopped {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let want = if stopped { "stop" } else { "continue" };
            return Err(io_error(format!(
                "waiting for redis-server {pid} to {want}"
            ))(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("still in state {state:?}"),
            )));
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// Reads one whole reply from a blocking stream, keeping any extra bytes in
/// `buf` for the next call.
fn read_reply(stream: &mut impl Read, buf: &mut BytesMut) -> io::Result<Reply> {
    let limits = Limits::default();
    let mut chunk = [0u8; 4096];
    loop {
        match decode(buf, &limits) {
            Ok(Some(reply)) => return Ok(reply),
            Ok(None) => {}
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The `process_id:` field of an `INFO server` reply.
fn info_pid(info: &[u8]) -> Option<u32> {
    info.split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"process_id:"))
        .and_then(|rest| std::str::from_utf8(rest).ok())
        .and_then(|s| s.trim().parse().ok())
}

/// N independent local masters, each on its own port: the deployment
/// Redlock runs against. Dropping it stops them all.
#[derive(Debug)]
pub struct Cluster {
    servers: Vec<Server>,
}

impl Cluster {
    /// Starts `k` masters with the same options, concurrently, and waits
    /// until each answers PING.
    ///
    /// # Errors
    /// The first error of any [`Server::start`]; the masters that did
    /// start are stopped again.
    pub fn start(k: usize, opts: &Options) -> Result<Cluster, SpawnError> {
        let results: Vec<Result<Server, SpawnError>> = thread::scope(|scope| {
            let handles: Vec<_> = (0..k)
                .map(|_| scope.spawn(|| Server::start(opts)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        let servers = results.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(Cluster { servers })
    }

    /// How many masters.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// True for a cluster of zero masters.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// The `i`th master, if there is one.
    pub fn get(&self, i: usize) -> Option<&Server> {
        self.servers.get(i)
    }

    /// The `i`th master, mutably (to kill, pause or restart it).
    pub fn get_mut(&mut self, i: usize) -> Option<&mut Server> {
        self.servers.get_mut(i)
    }

    /// All masters, in start order.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// All masters, mutably.
    pub fn servers_mut(&mut self) -> &mut [Server] {
        &mut self.servers
    }

    /// Iterates over the masters.
    pub fn iter(&self) -> std::slice::Iter<'_, Server> {
        self.servers.iter()
    }

    /// Every master's [`Server::url`].
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(Server::url).collect()
    }

    /// Every master's [`Server::addr`].
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(Server::addr).collect()
    }
}

impl Index<usize> for Cluster {
    type Output = Server;

    fn index(&self, i: usize) -> &Server {
        &self.servers[i]
    }
}

impl IndexMut<usize> for Cluster {
    fn index_mut(&mut self, i: usize) -> &mut Server {
        &mut self.servers[i]
    }
}

impl<'a> IntoIterator for &'a Cluster {
    type Item = &'a Server;
    type IntoIter = std::slice::Iter<'a, Server>;

    fn into_iter(self) -> Self::IntoIter {
        self.servers.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_bin_dir() -> TempDir {
        let dir = TempDir::create().expect("temp dir");
        let exe = dir.path.join("redis-server");
        fs::write(&exe, "#!/bin/sh\n").expect("write fake binary");
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).expect("chmod");
        let plain = dir.path.join("not-executable");
        fs::write(&plain, "").expect("write plain file");
        dir
    }

    #[test]
    fn the_binary_is_found_in_order_explicit_then_env_then_path() {
        let dir = fake_bin_dir();
        let exe = dir.path.join("redis-server");
        let path_var = Some(OsString::from(format!(
            "/nonexistent:{}",
            dir.path.display()
        )));
        /// (name, explicit path, REDIS_SERVER, the binary expected).
        type Case<'a> = (&'a str, Option<&'a Path>, Option<&'a str>, Option<&'a Path>);
        let cases: &[Case<'_>] = &[
            ("found on PATH", None, None, Some(&exe)),
            ("empty env is ignored", None, Some(""), Some(&exe)),
            (
                "env path wins over PATH",
                None,
                Some(exe.to_str().expect("utf-8 temp dir")),
                Some(&exe),
            ),
            (
                "env bare name is looked up on PATH",
                None,
                Some("redis-server"),
                Some(&exe),
            ),
            (
                "env naming nothing",
                None,
                Some("/nonexistent/redis-server"),
                None,
            ),
            (
                "explicit wins over env",
                Some(Path::new("/nonexistent/redis-server")),
                Some(exe.to_str().expect("utf-8 temp dir")),
                None,
            ),
            ("explicit path", Some(&exe), None, Some(&exe)),
        ];
        for (name, explicit, env, want) in cases {
            let got = resolve_binary(*explicit, env.map(OsString::from), path_var.clone());
            match want {
                Some(want) => assert_eq!(got.ok().as_deref(), Some(*want), "{name}"),
                None => assert!(matches!(got, Err(SpawnError::NotFound { .. })), "{name}"),
            }
        }
    }

    #[test]
    fn a_file_without_execute_permission_is_not_a_binary() {
        let dir = fake_bin_dir();
        let plain = dir.path.join("not-executable");
        assert!(resolve_binary(Some(&plain), None, None).is_err());
    }

    #[test]
    fn nothing_on_path_is_one_clear_line() {
        let err = resolve_binary(None, None, Some(OsString::from("/nonexistent")))
            .expect_err("no redis-server in /nonexistent");
        assert_eq!(
            err.to_string(),
            "redis-server not found (set REDIS_SERVER or install it: apt-get install -y redis-server)"
        );
    }

    #[test]
    fn info_pid_reads_the_process_id_line() {
        let info = b"# Server\r\nredis_version:7.0.15\r\nprocess_id:4242\r\ntcp_port:1\r\n";
        assert_eq!(info_pid(info), Some(4242));
        assert_eq!(info_pid(b"# Server\r\n"), None);
    }

    #[test]
    fn a_tls_master_listens_for_tls_only_on_its_port() {
        let cases = [
            ("clients are not asked for a certificate", false, "no"),
            ("clients must show a certificate", true, "yes"),
        ];
        for (name, auth, flag) in cases {
            let tls =
                TlsOptions::new("/c/server.pem", "/c/server.key", "/c/ca.pem").auth_clients(auth);
            let want: Vec<OsString> = [
                "--port",
                "0",
                "--tls-port",
                "6390",
                "--tls-cert-file",
                "/c/server.pem",
                "--tls-key-file",
                "/c/server.key",
                "--tls-ca-cert-file",
                "/c/ca.pem",
                "--tls-auth-clients",
                flag,
            ]
            .into_iter()
            .map(OsString::from)
            .collect();
            assert_eq!(tls.args(6390), want, "{name}");
        }
    }

    #[test]
    fn temp_dirs_are_unique_and_removed_on_drop() {
        let a = TempDir::create().expect("temp dir");
        let b = TempDir::create().expect("temp dir");
        assert_ne!(a.path, b.path);
        let path = a.path.clone();
        assert!(path.is_dir());
        drop(a);
        assert!(!path.exists());
    }
}
