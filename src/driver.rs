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
//! and every failure goes to the [`Conn`] and [`Round`] it belongs to.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use mio::net::{TcpStream, UnixStream};
use mio::{Events, Interest, Poll, Token};

use crate::addr::{Endpoint, ServerAddr};
use crate::conn::{Cause, Conn, READ_CHUNK};
use crate::quorum::Round;
use crate::resolve::{Resolver, Route};

#[derive(Debug)]
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    /// Whether a non-blocking connect has finished: `Ok(true)` connected,
    /// `Ok(false)` still in progress.
    fn connect_result(&mut self) -> io::Result<bool> {
        let (error, peer) = match self {
            Stream::Tcp(s) => (s.take_error(), s.peer_addr().map(drop)),
            Stream::Unix(s) => (s.take_error(), s.peer_addr().map(drop)),
        };
        if let Some(e) = error? {
            return Err(e);
        }
        match peer {
            Ok(()) => {
                if let Stream::Tcp(s) = self {
                    s.set_nodelay(true)?;
                }
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Drives N connections over one `mio::Poll`.
#[derive(Debug)]
pub struct Driver {
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
    /// One reused buffer for every read ([`READ_CHUNK`] bytes): a read that
    /// returns less has drained the socket.
    read_buf: Box<[u8]>,
}

impl Driver {
    /// A driver for `servers`, looking host names up with `resolver`, each
    /// lookup allowed `lookup_limit` (the connect timeout).
    ///
    /// # Errors
    /// When the OS refuses a new poll instance.
    pub fn new(
        servers: &[ServerAddr],
        resolver: Resolver,
        lookup_limit: Duration,
    ) -> io::Result<Driver> {
        let n = servers.len();
        Ok(Driver {
            poll: Poll::new()?,
            events: Events::with_capacity(n.max(4) * 2),
            sockets: (0..n).map(|_| None).collect(),
            routes: servers
                .iter()
                .map(|server| match &server.endpoint {
                    Endpoint::Tcp { host, port } => Some(Route::new(host, *port)),
                    Endpoint::Unix(_) => None,
                })
                .collect(),
            connected: vec![false; n],
            resolver,
            lookup_limit,
            read_buf: vec![0u8; READ_CHUNK].into_boxed_slice(),
        })
    }

    /// Gets connections ready for a round: drops sockets whose connection
    /// failed and opens a socket for each connection due for a (re)connect.
    /// Connect and stall limits are applied in [`Driver::run`], after a
    /// poll, so that replies already waiting in a socket are read before a
    /// connection is judged stalled.
    pub fn prepare(&mut self, conns: &mut [Conn], now: Instant) {
        for (i, conn) in conns.iter_mut().enumerate() {
            if conn.is_down() {
                self.close(i);
            }
            if conn.poll_connect(now) {
                self.open(i, conn, now);
            }
        }
    }

    /// Runs `round` until every slot is decided or its deadline passes, and
    /// returns the instant it ended. With `spin`, polls with a zero timeout
    /// (a busy wait on one core) instead of sleeping in the kernel until a
    /// reply arrives: lower latency, a core's worth of CPU.
    pub fn run(&mut self, conns: &mut [Conn], round: &mut Round, spin: bool) -> Instant {
        let mut now = Instant::now();
        loop {
            self.flush(conns, round, now);
            if round.is_decided() {
                return now;
            }
            // A deadline already past polls with a zero timeout: replies
            // waiting in the sockets are read before any limit is applied.
            let deadline = round.poll_timeout(conns);
            let timeout = if spin {
                Duration::ZERO
            } else {
                deadline.saturating_duration_since(now)
            };
            if let Err(e) = self.poll.poll(&mut self.events, Some(timeout))
                && e.kind() != io::ErrorKind::Interrupted
            {
                // A broken poll instance cannot wait for anything: fail
                // every master of this round rather than spin.
                for i in 0..conns.len() {
                    round.handle_failure(conns, i, now, Cause::Io(e.kind()));
                }
                self.close_failed(conns);
                return now;
            }
            now = Instant::now();
            self.handle_events(conns, round, now);
            round.handle_timeout(conns, now);
            self.close_failed(conns);
        }
    }

    /// Reads until no connection has a request in flight (every late reply
    /// read, every `-NOSCRIPT` fallback sent and answered) or `deadline`
    /// passes. Returns how many requests were still unanswered.
    pub fn settle(&mut self, conns: &mut [Conn], round: &mut Round, deadline: Instant) -> usize {
        let mut now = Instant::now();
        loop {
            self.flush(conns, round, now);
            let waiting = conns
                .iter()
                .filter(|c| !c.is_down())
                .map(Conn::in_flight)
                .sum();
            if waiting == 0 || now >= deadline {
                return waiting;
            }
            let timeout = conns
                .iter()
                .filter_map(Conn::poll_timeout)
                .fold(deadline, Instant::min)
                .saturating_duration_since(now);
            if let Err(e) = self.poll.poll(&mut self.events, Some(timeout))
                && e.kind() != io::ErrorKind::Interrupted
            {
                return waiting;
            }
            now = Instant::now();
            self.handle_events(conns, round, now);
            round.handle_timeout(conns, now);
            self.close_failed(conns);
        }
    }

    /// Writes whatever the connections have queued without waiting for any
    /// reply: used to send a release nobody waits for.
    pub fn send(&mut self, conns: &mut [Conn], round: &mut Round) {
        self.flush(conns, round, Instant::now());
    }

    fn handle_events(&mut self, conns: &mut [Conn], round: &mut Round, now: Instant) {
        for event in self.events.iter() {
            let i = event.token().0;
            let (Some(Some(stream)), Some(conn)) = (self.sockets.get_mut(i), conns.get(i)) else {
                continue;
            };
            if conn.is_connecting() {
                match stream.connect_result() {
                    Ok(true) => {
                        conns[i].handle_connected();
                        self.connected[i] = true;
                        if let Some(Some(route)) = self.routes.get_mut(i) {
                            route.handle_connected();
                        }
                    }
                    Ok(false) => continue,
                    Err(e) => {
                        round.handle_failure(conns, i, now, Cause::Connect(e.kind()));
                        continue;
                    }
                }
            }
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                // A short read drains the socket, and edge-triggered
                // readiness reports the next arrival; only a peer close
                // needs reading on to the end.
                let to_end = event.is_read_closed() || event.is_error();
                let failure = loop {
                    match stream.read(&mut self.read_buf) {
                        Ok(0) => break Some(Cause::Closed),
                        Ok(n) => {
                            conns[i].handle_input(&self.read_buf[..n]);
                            // Parsed as it arrives, so that the buffer holds
                            // at most one partial reply, which the parser's
                            // limits bound, whatever the master sends.
                            round.handle_input(conns, i, now);
                            if conns[i].is_down() || (n < self.read_buf.len() && !to_end) {
                                break None;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break Some(Cause::Io(e.kind())),
                    }
                };
                if let Some(cause) = failure
                    && !conns[i].is_down()
                {
                    round.handle_failure(conns, i, now, cause);
                }
            }
        }
        self.close_failed(conns);
    }

    fn flush(&mut self, conns: &mut [Conn], round: &mut Round, now: Instant) {
        for i in 0..conns.len() {
            let Some(stream) = self.sockets[i].as_mut() else {
                continue;
            };
            let failure = loop {
                let pending = conns[i].poll_transmit();
                if pending.is_empty() {
                    break None;
                }
                match stream.write(pending) {
                    Ok(0) => break Some(Cause::Io(io::ErrorKind::WriteZero)),
                    Ok(n) => conns[i].handle_written(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => break Some(Cause::Io(e.kind())),
                }
            };
            if let Some(cause) = failure {
                round.handle_failure(conns, i, now, cause);
                self.close(i);
            }
        }
    }

    fn open(&mut self, i: usize, conn: &mut Conn, now: Instant) {
        self.connected[i] = false;
        let opened = match (&conn.addr().endpoint, self.routes.get_mut(i)) {
            (Endpoint::Tcp { .. }, Some(Some(route))) => {
                match route.poll_addr(&self.resolver, now, self.lookup_limit) {
                    Ok(addr) => TcpStream::connect(addr).map(Stream::Tcp),
                    Err(cause) => return conn.handle_failure(now, cause),
                }
            }
            (Endpoint::Unix(path), _) => UnixStream::connect(path).map(Stream::Unix),
            (Endpoint::Tcp { .. }, _) => return conn.handle_failure(now, Cause::Resolve),
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
                conn.handle_connect_started(now);
            }
            Err(e) => {
                self.connect_failed(i, now);
                conn.handle_failure(now, Cause::Connect(e.kind()));
            }
        }
    }

    /// A connect to master `i` failed: its next one tries its next address.
    fn connect_failed(&mut self, i: usize, now: Instant) {
        if let Some(Some(route)) = self.routes.get_mut(i) {
            route.handle_connect_failed(&self.resolver, now);
        }
    }

    fn close_failed(&mut self, conns: &[Conn]) {
        for (i, conn) in conns.iter().enumerate() {
            if conn.is_down() {
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
