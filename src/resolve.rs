//! Host names to addresses, off the event loop.
//!
//! A name lookup (`getaddrinfo`) blocks for as long as the resolver takes,
//! and a round must never wait on it: a [`Route`] runs each lookup on a
//! short-lived thread of its own and is asked, without blocking, for the
//! address to connect to next. It keeps every address a lookup returned and
//! tries them in turn, one per connect, moving on when a connect fails and
//! looking the name up again once each address has failed. IP literals and
//! Unix sockets are never looked up. The [`Resolver`] that does the lookup
//! can be replaced (service discovery, tests).

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use crate::conn::Cause;

type LookupFn = dyn Fn(&str, u16) -> io::Result<Vec<SocketAddr>> + Send + Sync;

/// Looks a host name up. Called on a thread of its own, never on the event
/// loop, so it may block. The default asks the system
/// (`ToSocketAddrs`, i.e. `getaddrinfo`).
#[derive(Clone)]
pub struct Resolver(Arc<LookupFn>);

impl Resolver {
    /// A resolver that calls `lookup(host, port)`.
    pub fn new(
        lookup: impl Fn(&str, u16) -> io::Result<Vec<SocketAddr>> + Send + Sync + 'static,
    ) -> Resolver {
        Resolver(Arc::new(lookup))
    }

    /// The system's resolver.
    pub fn system() -> Resolver {
        Resolver::new(|host, port| Ok((host, port).to_socket_addrs()?.collect()))
    }
}

impl Default for Resolver {
    fn default() -> Self {
        Resolver::system()
    }
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Resolver")
    }
}

impl PartialEq for Resolver {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A lookup running on its own thread.
#[derive(Debug)]
struct Lookup {
    result: Receiver<io::Result<Vec<SocketAddr>>>,
    started: Instant,
}

/// Where one master's TCP connects go.
#[derive(Debug)]
pub(crate) struct Route {
    host: String,
    port: u16,
    /// An IP literal: its one address, never looked up.
    literal: bool,
    addrs: Vec<SocketAddr>,
    /// The address the next connect goes to.
    next: usize,
    /// Connects failed in a row since the last success or lookup.
    misses: usize,
    lookup: Option<Lookup>,
    /// The last lookup failed and nothing was known before: reported once,
    /// and the next ask looks the name up again.
    failed: bool,
}

impl Route {
    /// The route to `host:port`. An IP literal is ready at once; a name is
    /// looked up on first use.
    pub(crate) fn new(host: &str, port: u16) -> Route {
        let literal = host.parse::<IpAddr>().ok();
        Route {
            host: host.to_owned(),
            port,
            literal: literal.is_some(),
            addrs: literal
                .map(|ip| SocketAddr::new(ip, port))
                .into_iter()
                .collect(),
            next: 0,
            misses: 0,
            lookup: None,
            failed: false,
        }
    }

    /// The address to connect to now, without blocking. While the first
    /// lookup of a name runs, the master cannot vote:
    /// [`Cause::Resolving`]; once it failed, or ran past `limit` (the
    /// connect timeout), [`Cause::Resolve`].
    ///
    /// # Errors
    /// As above.
    pub(crate) fn poll_addr(
        &mut self,
        resolver: &Resolver,
        now: Instant,
        limit: Duration,
    ) -> Result<SocketAddr, Cause> {
        self.poll_lookup();
        if let Some(addr) = self.addrs.get(self.next) {
            return Ok(*addr);
        }
        if std::mem::take(&mut self.failed) {
            return Err(Cause::Resolve);
        }
        match &self.lookup {
            None => {
                self.start_lookup(resolver, now);
                Err(Cause::Resolving)
            }
            Some(lookup) if now.saturating_duration_since(lookup.started) < limit => {
                Err(Cause::Resolving)
            }
            // Past the connect timeout: reported as failed. The thread is
            // not abandoned: its answer is taken whenever it comes.
            Some(_) => Err(Cause::Resolve),
        }
    }

    /// A connect to the address last given succeeded.
    pub(crate) fn handle_connected(&mut self) {
        self.misses = 0;
    }

    /// A connect to the address last given failed: the next one goes to the
    /// next address; once every address has failed, the name is looked up
    /// again (the old addresses are used meanwhile).
    pub(crate) fn handle_connect_failed(&mut self, resolver: &Resolver, now: Instant) {
        if self.addrs.is_empty() {
            return;
        }
        self.next = (self.next + 1) % self.addrs.len();
        self.misses += 1;
        if self.misses >= self.addrs.len() && !self.literal && self.lookup.is_none() {
            self.start_lookup(resolver, now);
        }
    }

    fn start_lookup(&mut self, resolver: &Resolver, now: Instant) {
        let (send, result) = mpsc::sync_channel(1);
        let lookup = Arc::clone(&resolver.0);
        let (host, port) = (self.host.clone(), self.port);
        let spawned = std::thread::Builder::new()
            .name("redlock-resolve".into())
            .spawn(move || {
                // Nobody may wait any more: a failed send changes nothing.
                let _ = send.send(lookup(&host, port));
            });
        if spawned.is_ok() {
            self.lookup = Some(Lookup {
                result,
                started: now,
            });
        }
    }

    /// Takes a finished lookup's answer.
    fn poll_lookup(&mut self) {
        let Some(lookup) = &self.lookup else { return };
        match lookup.result.try_recv() {
            Err(TryRecvError::Empty) => {}
            Ok(Ok(addrs)) if !addrs.is_empty() => {
                self.addrs = addrs;
                self.next = 0;
                self.misses = 0;
                self.lookup = None;
            }
            // A failed refresh keeps the addresses known before.
            Ok(_) | Err(TryRecvError::Disconnected) => {
                self.lookup = None;
                self.failed = self.addrs.is_empty();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Condvar, Mutex};

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Waits (a bounded time) until `route` has an address.
    fn resolved(route: &mut Route, resolver: &Resolver) -> Result<SocketAddr, Cause> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match route.poll_addr(resolver, Instant::now(), Duration::from_secs(60)) {
                Err(Cause::Resolving) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                other => return other,
            }
        }
    }

    #[test]
    fn an_ip_literal_is_never_looked_up() {
        let resolver = Resolver::new(|_, _| panic!("looked up"));
        let mut route = Route::new("127.0.0.1", 7000);
        let now = Instant::now();
        assert_eq!(
            route.poll_addr(&resolver, now, Duration::ZERO),
            Ok(addr(7000))
        );
        route.handle_connect_failed(&resolver, now);
        assert_eq!(
            route.poll_addr(&resolver, now, Duration::ZERO),
            Ok(addr(7000))
        );
        let mut v6 = Route::new("::1", 7000);
        assert!(v6.poll_addr(&resolver, now, Duration::ZERO).is_ok());
    }

    #[test]
    fn a_lookup_that_blocks_never_blocks_the_caller() {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let held = Arc::clone(&gate);
        let resolver = Resolver::new(move |_, port| {
            let (open, wake) = &*held;
            let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
            while !*open {
                open = wake.wait(open).unwrap_or_else(|e| e.into_inner());
            }
            Ok(vec![addr(port)])
        });
        let mut route = Route::new("blocked.example", 7001);
        let t0 = Instant::now();
        let limit = Duration::from_secs(1);
        // The lookup is stuck; each ask returns at once.
        assert_eq!(route.poll_addr(&resolver, t0, limit), Err(Cause::Resolving));
        assert_eq!(route.poll_addr(&resolver, t0, limit), Err(Cause::Resolving));
        assert_eq!(
            route.poll_addr(&resolver, t0 + limit, limit),
            Err(Cause::Resolve),
            "past the connect timeout it is a failed lookup"
        );
        *gate.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        gate.1.notify_all();
        assert_eq!(resolved(&mut route, &resolver), Ok(addr(7001)));
    }

    #[test]
    fn every_address_is_tried_in_turn_and_then_looked_up_again() {
        let lookups = Arc::new(Mutex::new(0));
        let counted = Arc::clone(&lookups);
        let resolver = Resolver::new(move |_, _| {
            *counted.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            Ok(vec![addr(1), addr(2), addr(3)])
        });
        let mut route = Route::new("three.example", 0);
        let now = Instant::now();
        assert_eq!(resolved(&mut route, &resolver), Ok(addr(1)));
        route.handle_connect_failed(&resolver, now);
        assert_eq!(route.poll_addr(&resolver, now, Duration::ZERO), Ok(addr(2)));
        route.handle_connected();
        route.handle_connect_failed(&resolver, now);
        assert_eq!(route.poll_addr(&resolver, now, Duration::ZERO), Ok(addr(3)));
        route.handle_connect_failed(&resolver, now);
        route.handle_connect_failed(&resolver, now);
        // Three failures in a row: a new lookup, the old addresses meanwhile.
        assert!(route.poll_addr(&resolver, now, Duration::ZERO).is_ok());
        let deadline = Instant::now() + Duration::from_secs(30);
        while *lookups.lock().unwrap_or_else(|e| e.into_inner()) < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*lookups.lock().unwrap_or_else(|e| e.into_inner()), 2);
    }

    #[test]
    fn a_failed_or_empty_lookup_is_a_resolve_failure() {
        let failing = Resolver::new(|_, _| Err(io::Error::other("no such host")));
        let mut route = Route::new("nowhere.example", 1);
        assert_eq!(resolved(&mut route, &failing), Err(Cause::Resolve));
        // The next ask (after the connection's backoff) looks it up again.
        let now = Instant::now();
        let limit = Duration::from_secs(60);
        assert_eq!(route.poll_addr(&failing, now, limit), Err(Cause::Resolving));
        let empty = Resolver::new(|_, _| Ok(Vec::new()));
        let mut route = Route::new("empty.example", 1);
        assert_eq!(resolved(&mut route, &empty), Err(Cause::Resolve));
    }
}
