//! The one module that owns mio: sockets, readiness, and the poll timeout.
//!
//! A [`Driver`] holds one socket per master (TCP with `TCP_NODELAY`, or a
//! Unix stream), registered once under `Token(i)` for read and write
//! readiness. It opens sockets when a connection asks, to the address its
//! [`Route`] gives (host names are looked up off this loop, see
//! [`resolve`](crate::resolve)), finishes each
//! non-blocking connect the way mio documents (writable, then `take_error`,
//! then `peer_addr`), writes queued bytes until done or `WouldBlock`,
//! reads into one reused buffer, retries on `Interrupted`, and sleeps in
//! `poll` until the round's next deadline. It decides nothing: every byte
//! and every failure goes to the [`Engine`], keyed by master index.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use mio::net::{TcpStream, UnixStream};
use mio::{Events, Interest, Poll, Token};

use crate::addr::{Endpoint, ServerAddr};
use crate::conn::{Cause, Conn, READ_CHUNK};
use crate::engine::{Engine, RoundId};
use crate::resolve::{Resolver, Route};

/// The token of the [`mio::Waker`] from [`Driver::waker`]; masters' tokens
/// are their indices.
const WAKE: Token = Token(usize::MAX);

/// The token of the driver's [`FineTimer`].
#[cfg(target_os = "linux")]
const TIMER: Token = Token(usize::MAX - 1);

#[cfg(target_os = "linux")]
mod timer;
#[cfg(target_os = "linux")]
use timer::FineTimer;

/// The TLS client settings a driver opens `rediss://` connections with.
#[cfg(feature = "tls")]
pub(crate) type TlsClient = std::sync::Arc<rustls::ClientConfig>;

/// Without the `tls` feature there are none (`rediss://` is refused when
/// parsed).
#[cfg(not(feature = "tls"))]
pub(crate) type TlsClient = std::convert::Infallible;

#[derive(Debug)]
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    #[cfg(feature = "tls")]
    Tls(Box<crate::tls::TlsStream>),
}

impl Stream {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.tcp(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.read(buf),
        }
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.write(buf),
        }
    }

    /// Writes what a TLS session holds from earlier writes (records the
    /// socket refused, the handshake's); nothing for a plain socket.
    fn write_held(&mut self) -> io::Result<()> {
        match self {
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.write_records().map(drop),
            _ => Ok(()),
        }
    }

    /// After a failed write, the refusal a TLS peer sent before it closed,
    /// still unread: a server that refuses the session (a client
    /// certificate missing, in TLS 1.3 judged after the client's first
    /// writes) sends its alert, then closes with those writes unread, and
    /// the reset that close sends can fail the next write before the alert
    /// is read. The alert names the problem; the reset does not. Nothing
    /// for a plain socket, or when no such refusal is there.
    #[cfg_attr(not(feature = "tls"), allow(unused_variables))]
    fn refusal(&mut self, buf: &mut [u8]) -> Option<Cause> {
        match self {
            #[cfg(feature = "tls")]
            Stream::Tls(s) => loop {
                match s.read(buf) {
                    Ok(0) => return None,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return crate::tls::cause_of(&e),
                }
            },
            _ => None,
        }
    }

    /// Whether reads must go on to `WouldBlock`: a TLS session's short
    /// plaintext read says nothing of what the socket still holds.
    fn reads_to_the_end(&self) -> bool {
        match self {
            #[cfg(feature = "tls")]
            Stream::Tls(_) => true,
            _ => false,
        }
    }

    /// Whether a non-blocking connect has finished: `Ok(true)` connected,
    /// `Ok(false)` still in progress.
    fn connect_result(&mut self) -> io::Result<bool> {
        let (error, peer) = match self {
            Stream::Tcp(s) => (s.take_error(), s.peer_addr().map(drop)),
            Stream::Unix(s) => (s.take_error(), s.peer_addr().map(drop)),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => (s.tcp().take_error(), s.tcp().peer_addr().map(drop)),
        };
        if let Some(e) = error? {
            return Err(e);
        }
        match peer {
            Ok(()) => {
                match self {
                    Stream::Tcp(s) => s.set_nodelay(true)?,
                    #[cfg(feature = "tls")]
                    Stream::Tls(s) => s.tcp().set_nodelay(true)?,
                    _ => {}
                }
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The failure an I/O error stands for: a TLS session's refusal names its
/// reason ([`Cause::Tls`]); anything else is its kind.
fn io_cause(error: &io::Error) -> Cause {
    #[cfg(feature = "tls")]
    if let Some(cause) = crate::tls::cause_of(error) {
        return cause;
    }
    Cause::Io(error.kind())
}

/// Drives N connections over one `mio::Poll`.
#[derive(Debug)]
pub(crate) struct Driver {
    poll: Poll,
    events: Events,
    sockets: Vec<Option<Stream>>,
    /// Per master: where its TCP connects go (`None` for a Unix socket).
    routes: Vec<Option<Route>>,
    /// Per master: whether its socket finished connecting.
    connected: Vec<bool>,
    resolver: Resolver,
    /// How long a host name lookup may run before it counts as failed.
    lookup_limit: Duration,
    /// The TLS settings for `rediss://` masters, when there are some.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: Option<TlsClient>,
    /// One reused buffer for every read ([`READ_CHUNK`] bytes): a read that
    /// returns less has drained the socket.
    read_buf: Box<[u8]>,
    /// Ends a poll whose timeout is shorter than `epoll` keeps to (none
    /// where the OS has no timerfd, or refused one).
    #[cfg(target_os = "linux")]
    timer: Option<FineTimer>,
}

impl Driver {
    /// A driver for `servers`, looking host names up with `resolver`, each
    /// lookup allowed `lookup_limit` (the connect timeout).
    ///
    /// # Errors
    /// When the OS refuses a new poll instance.
    ///
    /// `links` is the engine's [`Engine::links`]: link `i` connects to
    /// `servers[i % servers.len()]` (a master's subscriber connection goes
    /// where its commands go).
    pub(crate) fn new(
        servers: &[ServerAddr],
        links: usize,
        resolver: Resolver,
        lookup_limit: Duration,
        tls: Option<TlsClient>,
    ) -> io::Result<Driver> {
        let n = links;
        let poll = Poll::new()?;
        #[cfg(target_os = "linux")]
        let timer = FineTimer::new(poll.registry(), TIMER).ok();
        Ok(Driver {
            poll,
            events: Events::with_capacity(n.max(4) * 2),
            sockets: (0..n).map(|_| None).collect(),
            routes: servers
                .iter()
                .cycle()
                .take(n)
                .map(|server| match &server.endpoint {
                    Endpoint::Tcp { host, port } => Some(Route::new(host, *port)),
                    Endpoint::Unix(_) => None,
                })
                .collect(),
            connected: vec![false; n],
            resolver,
            lookup_limit,
            tls,
            read_buf: vec![0u8; READ_CHUNK].into_boxed_slice(),
            #[cfg(target_os = "linux")]
            timer,
        })
    }

    /// Gets connections ready for a round: drops sockets whose connection
    /// failed and opens a socket for each connection due for a (re)connect.
    /// Connect and stall limits are applied after a poll, so that replies
    /// already waiting in a socket are read before a connection is judged
    /// stalled.
    pub(crate) fn prepare(&mut self, engine: &mut Engine, now: Instant) {
        for i in 0..engine.links() {
            if engine.link(i).is_some_and(Conn::is_down) {
                self.close(i);
            }
            if engine.poll_connect(i, now) {
                self.open(i, engine, now);
            }
        }
    }

    /// Drives the engine until round `id` is complete, and returns the
    /// instant it ended. With `spin`, polls with a zero timeout (a busy wait
    /// on one core) instead of sleeping in the kernel until a reply
    /// arrives: lower latency, a core's worth of CPU.
    pub(crate) fn run(&mut self, engine: &mut Engine, id: RoundId, spin: bool) -> Instant {
        self.drive(engine, spin, None, |engine| engine.is_complete(id))
    }

    /// Reads until no connection has a request in flight (every late reply
    /// read, every `-NOSCRIPT` fallback sent and answered) or `deadline`
    /// passes. Returns how many requests were still unanswered.
    pub(crate) fn settle(&mut self, engine: &mut Engine, deadline: Instant) -> usize {
        self.drive(engine, false, Some(deadline), |engine| {
            engine.in_flight() == 0
        });
        engine.in_flight()
    }

    /// Writes whatever the connections have queued without waiting for any
    /// reply: used to send a release nobody waits for.
    pub(crate) fn send(&mut self, engine: &mut Engine) {
        self.flush(engine, Instant::now());
    }

    /// The one drive loop: write, stop once `done` or past `deadline`,
    /// sleep in `poll` until the engine's next deadline (or `deadline`),
    /// read, apply the time. Returns the instant it stopped.
    fn drive(
        &mut self,
        engine: &mut Engine,
        spin: bool,
        deadline: Option<Instant>,
        done: impl Fn(&Engine) -> bool,
    ) -> Instant {
        let mut now = Instant::now();
        loop {
            self.flush(engine, now);
            if done(engine) || deadline.is_some_and(|d| now >= d) {
                return now;
            }
            // A deadline already past polls with a zero timeout: replies
            // waiting in the sockets are read before any limit is applied.
            let wake = match (engine.poll_timeout(), deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let timeout = if spin {
                Some(Duration::ZERO)
            } else {
                wake.map(|t| t.saturating_duration_since(now))
            };
            now = match self.turn(engine, timeout) {
                Ok(now) => now,
                Err(cause) => {
                    // A broken poll instance cannot wait for anything: fail
                    // every master rather than spin.
                    let now = Instant::now();
                    for i in 0..engine.links() {
                        engine.handle_failure(i, now, cause.clone());
                    }
                    self.close_failed(engine);
                    return now;
                }
            };
        }
    }

    /// One turn of the event loop: waits in `poll` at most `timeout`
    /// (`None`: until an event), reads what arrived, applies the time,
    /// closes failed sockets, and returns the instant after the poll. Events
    /// for tokens past the masters' (a [`mio::Waker`]'s) only end the wait.
    ///
    /// # Errors
    /// The cause to fail every master with when the poll instance broke.
    pub(crate) fn turn(
        &mut self,
        engine: &mut Engine,
        timeout: Option<Duration>,
    ) -> Result<Instant, Cause> {
        // A wait shorter than epoll keeps to ends on the timer; the poll's
        // rounded-up timeout stays the limit.
        #[cfg(target_os = "linux")]
        if let (Some(timeout), Some(timer)) = (timeout, &mut self.timer) {
            timer.arm_if_fine(timeout);
        }
        if let Err(e) = self.poll.poll(&mut self.events, timeout)
            && e.kind() != io::ErrorKind::Interrupted
        {
            return Err(Cause::Io(e.kind()));
        }
        let now = Instant::now();
        self.handle_events(engine, now);
        engine.handle_timeout(now);
        self.close_failed(engine);
        Ok(now)
    }

    /// A waker that ends a [`Driver::turn`] from another thread.
    ///
    /// # Errors
    /// When the OS refuses it.
    pub(crate) fn waker(&self) -> io::Result<mio::Waker> {
        mio::Waker::new(self.poll.registry(), WAKE)
    }

    fn handle_events(&mut self, engine: &mut Engine, now: Instant) {
        for event in self.events.iter() {
            #[cfg(target_os = "linux")]
            if let Some(timer) = &mut self.timer
                && timer.is_token(event.token())
            {
                timer.handle_fired();
                continue;
            }
            let i = event.token().0;
            let (Some(Some(stream)), Some(conn)) = (self.sockets.get_mut(i), engine.link(i)) else {
                continue;
            };
            if conn.is_connecting() {
                match stream.connect_result() {
                    Ok(true) => {
                        engine.handle_connected(i);
                        self.connected[i] = true;
                        if let Some(Some(route)) = self.routes.get_mut(i) {
                            route.handle_connected();
                        }
                    }
                    Ok(false) => continue,
                    Err(e) => {
                        engine.handle_failure(i, now, Cause::Connect(e.kind()));
                        continue;
                    }
                }
            }
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                // A short read drains the socket, and edge-triggered
                // readiness reports the next arrival; only a peer close
                // needs reading on to the end.
                let to_end =
                    event.is_read_closed() || event.is_error() || stream.reads_to_the_end();
                let failure = loop {
                    match stream.read(&mut self.read_buf) {
                        Ok(0) => break Some(Cause::Closed),
                        Ok(n) => {
                            // Parsed as it arrives, so that the buffer holds
                            // at most one partial reply, which the parser's
                            // limits bound, whatever the master sends.
                            engine.handle_input(i, &self.read_buf[..n], now);
                            let down = engine.link(i).is_none_or(Conn::is_down);
                            if down || (n < self.read_buf.len() && !to_end) {
                                break None;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break Some(io_cause(&e)),
                    }
                };
                if let Some(cause) = failure
                    && !engine.link(i).is_none_or(Conn::is_down)
                {
                    engine.handle_failure(i, now, cause);
                }
            }
        }
        self.close_failed(engine);
    }

    fn flush(&mut self, engine: &mut Engine, now: Instant) {
        for i in 0..engine.links() {
            let Some(stream) = self.sockets.get_mut(i).and_then(Option::as_mut) else {
                continue;
            };
            let failure = loop {
                let pending = engine.poll_transmit(i);
                if pending.is_empty() {
                    break stream.write_held().err().map(|e| io_cause(&e));
                }
                match stream.write(pending) {
                    Ok(0) => break Some(Cause::Io(io::ErrorKind::WriteZero)),
                    Ok(n) => engine.handle_written(i, n),
                    // For a TLS session also while its handshake holds all
                    // it may: the handshake's reply, read as it comes,
                    // makes room, and the next flush goes on.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => break Some(io_cause(&e)),
                }
            };
            if let Some(cause) = failure {
                let cause = stream.refusal(&mut self.read_buf).unwrap_or(cause);
                engine.handle_failure(i, now, cause);
                self.close(i);
            }
        }
    }

    fn open(&mut self, i: usize, engine: &mut Engine, now: Instant) {
        self.connected[i] = false;
        let Some(conn) = engine.link(i) else {
            return;
        };
        let opened = match (&conn.addr().endpoint, self.routes.get_mut(i)) {
            (Endpoint::Tcp { host, .. }, Some(Some(route))) => {
                let tcp = match route.poll_addr(&self.resolver, now, self.lookup_limit) {
                    Ok(addr) => TcpStream::connect(addr),
                    Err(cause) => return engine.handle_failure(i, now, cause),
                };
                if conn.addr().tls {
                    match tcp.map(|tcp| self.secure(tcp, host)) {
                        Ok(Ok(stream)) => Ok(stream),
                        Ok(Err(cause)) => return engine.handle_failure(i, now, cause),
                        Err(e) => Err(e),
                    }
                } else {
                    tcp.map(Stream::Tcp)
                }
            }
            (Endpoint::Unix(path), _) => UnixStream::connect(path).map(Stream::Unix),
            (Endpoint::Tcp { .. }, _) => return engine.handle_failure(i, now, Cause::Resolve),
        };
        let registered = opened.and_then(|mut stream| {
            self.poll
                .registry()
                .register(
                    stream.source(),
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .map(|()| stream)
        });
        match registered {
            Ok(stream) => {
                self.sockets[i] = Some(stream);
                engine.handle_connect_started(i, now);
            }
            Err(e) => {
                self.connect_failed(i, now);
                engine.handle_failure(i, now, Cause::Connect(e.kind()));
            }
        }
    }

    /// A TLS session to `host` over `tcp`.
    #[cfg(feature = "tls")]
    fn secure(&self, tcp: TcpStream, host: &str) -> Result<Stream, Cause> {
        match &self.tls {
            Some(config) => {
                crate::tls::TlsStream::new(tcp, config, host).map(|s| Stream::Tls(Box::new(s)))
            }
            None => Err(Cause::Tls("no TLS settings for this client".into())),
        }
    }

    /// Without the `tls` feature no URL asks for TLS.
    #[cfg(not(feature = "tls"))]
    fn secure(&self, _tcp: TcpStream, _host: &str) -> Result<Stream, Cause> {
        Err(Cause::Tls("this build has no TLS".into()))
    }

    /// A connect to master `i` failed: its next one tries its next address.
    fn connect_failed(&mut self, i: usize, now: Instant) {
        if let Some(Some(route)) = self.routes.get_mut(i) {
            route.handle_connect_failed(&self.resolver, now);
        }
    }

    fn close_failed(&mut self, engine: &Engine) {
        for i in 0..engine.links() {
            if engine.link(i).is_some_and(Conn::is_down) {
                self.close(i);
            }
        }
    }

    fn close(&mut self, i: usize) {
        if let Some(mut stream) = self.sockets[i].take() {
            // Closed before it connected: refused, timed out, unreachable.
            if !self.connected[i] {
                self.connect_failed(i, Instant::now());
            }
            // Dropping the socket closes it, which removes it from epoll
            // anyway; a failed deregister changes nothing.
            let _ = self.poll.registry().deregister(stream.source());
        }
    }
}
