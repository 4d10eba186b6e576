//! The lock manager: Redlock's acquire, release and extend over N masters.
//!
//! [`Redlock`] is the API a caller uses (its settings are in
//! [`config`](crate::config), its errors in [`error`](crate::error)); it implements
//! `docs/spec.md` by driving the same sans-IO [`Hub`] as the
//! shared client, on its caller's thread, with the [`Driver`] for I/O: each
//! operation's job (the rules that turn votes into a [`Lock`] or an
//! [`Error`]: the quorum and validity check, the release to all N masters
//! after a failed acquire, retries with jitter, the extension cap, and
//! argument checks) runs inline, and one that waits is driven by the hub's
//! timers. One `Redlock` is one client with its own connections; it is
//! `Send` but used from one thread at a time (`&mut self`).
//!
//! What dropping does: a [`Lock`] is a plain value (its own module,
//! [`lock`](crate::lock), below the jobs that make it) and dropping it
//! sends nothing (the keys expire after their TTL), so that
//! latency-critical callers release explicitly, when they choose; a
//! [`LockGuard`] borrows the client and releases on drop.

use std::io;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::clock::Stamp;
use crate::config::{Config, ConfigError, LockCommands, Retry};
use crate::conn::{Conn, Keys, Op};
use crate::driver::Driver;
use crate::engine::{Engine, RoundId};
use crate::error::Error;
use crate::health::MasterState;
use crate::hub::{Drive, Hub, Links, Promise, Ran};
use crate::job::{Acquire, Batch, Extend, Job, Output, Release, SplitMix64};
use crate::lock::Lock;
use crate::quorum::quorum;
use crate::resource::ResourceName;
use crate::script::Scripts;
use crate::token::TokenSource;
/// A lock that releases itself when dropped. It borrows its client, so the
/// client cannot run other operations while the guard lives (use
/// [`LockGuard::client`] meanwhile).
#[must_use = "dropping the guard releases the lock at once"]
#[derive(Debug)]
pub struct LockGuard<'a> {
    client: &'a mut Redlock,
    lock: Option<Lock>,
}

impl LockGuard<'_> {
    /// Releases now and reports the outcome, which dropping cannot.
    ///
    /// # Errors
    /// As [`Redlock::release`].
    pub fn release(mut self) -> Result<(), Error> {
        match self.lock.take() {
            Some(lock) => self.client.release(&lock),
            None => Ok(()),
        }
    }

    /// Extends the lock; see [`Redlock::extend`].
    ///
    /// # Errors
    /// As [`Redlock::extend`].
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        match self.lock.as_mut() {
            Some(lock) => self.client.extend(lock, ttl),
            None => Ok(()),
        }
    }

    /// The client, for other operations while the lock is held.
    pub fn client(&mut self) -> &mut Redlock {
        self.client
    }

    /// Stops guarding: the lock is returned and no longer released on drop.
    pub fn into_lock(mut self) -> Option<Lock> {
        self.lock.take()
    }
}

impl Deref for LockGuard<'_> {
    type Target = Lock;
    fn deref(&self) -> &Lock {
        // `lock` is only taken by methods that consume the guard.
        self.lock
            .as_ref()
            .unwrap_or_else(|| unreachable!("guard without lock"))
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            // Nothing to report to: the keys expire after the TTL anyway.
            let _ = self.client.release(&lock);
        }
    }
}

/// A Redlock client over N independent masters.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_mio::Redlock;
///
/// # fn main() -> Result<(), redlock_mio::Error> {
/// let mut redlock = Redlock::connect([
///     "redis://127.0.0.1:7000",
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
/// ])?;
/// let lock = redlock.acquire("orders:42", Duration::from_secs(10))?;
/// // ... work while lock.remaining() > 0 ...
/// redlock.release(&lock)?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Redlock {
    /// The core the shared client's loop runs too, driven on the caller's
    /// thread: each operation runs inline ([`Hub::run_inline`]), and one
    /// that waits (to retry, or for a lock's expiry) is handed to the hub
    /// and driven by [`Redlock::wait`] until its output is in.
    hub: Hub<Local, Driver>,
    /// Where the hub leaves the output of an operation that waited.
    done: Arc<Mutex<Option<Output>>>,
}

/// Where a [`Redlock`] caller waits for an operation handed to its hub:
/// the caller is the thread that drives the hub, so it never goes first.
#[derive(Debug)]
struct Local(Arc<Mutex<Option<Output>>>);

impl Promise for Local {
    fn complete(self, output: Output) -> Option<Output> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(output);
        None
    }

    fn is_abandoned(&self) -> bool {
        false
    }
}

/// The driver opens the hub's connections ...
impl Links for Driver {
    fn prepare(&mut self, engine: &mut Engine, now: Instant) {
        Driver::prepare(self, engine, now);
    }
}

/// ... and drives the rounds a caller runs on its own thread, on the
/// real clocks.
impl Drive for Driver {
    fn now(&self) -> Stamp {
        Stamp::now()
    }

    fn run(&mut self, engine: &mut Engine, id: RoundId, spin: bool) {
        Driver::run(self, engine, id, spin);
    }

    fn send(&mut self, engine: &mut Engine) {
        Driver::send(self, engine);
    }
}

/// The least time [`Redlock::warm_up_quorum`] gives the masters that are
/// not ready once a quorum is. Two URLs of one server finish their
/// handshakes together but for the scheduling of a loaded machine: 13 ms
/// apart at most in 1,000 warm-ups on 2 cores under 16 busy loops.
const QUORUM_GRACE_MIN: Duration = Duration::from_millis(50);

/// Where a warm-up stands, counted over the masters' connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WarmUp {
    /// Connections that finished their handshake (and have nothing else in
    /// flight).
    ready: usize,
    /// Distinct servers among them, by `run_id`.
    servers: usize,
    /// Connections still to wait for: looking their host name up,
    /// connecting, or in their handshake. A master that failed otherwise
    /// is left to its reconnect backoff.
    waiting: usize,
    /// Whether a host name lookup is still running.
    resolving: bool,
}

impl WarmUp {
    fn of(conns: &[Conn]) -> WarmUp {
        let is_ready = |c: &Conn| {
            !c.is_down() && !c.is_connecting() && c.in_flight() == 0 && c.run_id().is_some()
        };
        // A ready connection counts as a server unless an earlier ready one
        // reaches the same server.
        let servers = conns
            .iter()
            .enumerate()
            .filter(|(i, c)| {
                is_ready(c)
                    && !conns[..*i]
                        .iter()
                        .any(|o| is_ready(o) && o.run_id() == c.run_id())
            })
            .count();
        WarmUp {
            ready: conns.iter().filter(|c| is_ready(c)).count(),
            servers,
            waiting: conns
                .iter()
                .filter(|c| !is_ready(c) && (!c.is_down() || c.is_resolving()))
                .count(),
            resolving: conns.iter().any(Conn::is_resolving),
        }
    }
}

/// What every client is made of, from its settings: the masters' names
/// for error reports, the engine, the driver, the token source and the
/// retry jitter. [`Redlock`] and the shared client's event loop each own
/// one.
pub(crate) struct Parts {
    pub(crate) names: Vec<Arc<str>>,
    pub(crate) engine: Engine,
    pub(crate) driver: Driver,
    pub(crate) tokens: TokenSource,
    pub(crate) jitter: SplitMix64,
}

impl Parts {
    /// The parts for `config`, which [`Config::check`] accepted.
    ///
    /// # Errors
    /// [`Error::Os`] when the OS refuses a poll instance or random bytes.
    ///
    /// With `subscribe`, the engine has a subscriber connection per master
    /// for release notifications (the shared client's, when
    /// [`Config::wake_on_release`] is on).
    pub(crate) fn new(config: &Config, now: Instant, subscribe: bool) -> Result<Parts, Error> {
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).map_err(|_| Error::Os(io::ErrorKind::Other))?;
        let mut engine = Engine::new(
            &config.servers,
            Scripts::new(),
            config.limits,
            config.timing(),
            now,
            subscribe,
        );
        engine.set_native(config.lock_commands == LockCommands::Auto);
        Ok(Parts {
            names: config
                .servers
                .iter()
                .map(|a| Arc::from(a.to_string()))
                .collect(),
            engine,
            driver: Driver::new(
                &config.servers,
                config.servers.len() * if subscribe { 2 } else { 1 },
                config.resolver.clone(),
                config.connect_timeout,
                tls_client(config)?,
            )
            .map_err(|e| Error::Os(e.kind()))?,
            tokens: TokenSource::new().map_err(|_| Error::Os(io::ErrorKind::Other))?,
            jitter: SplitMix64(u64::from_le_bytes(seed)),
        })
    }
}

/// The TLS settings a client's `rediss://` masters use, loaded once; none
/// when no master asks for TLS.
///
/// # Errors
/// [`ConfigError::Tls`] when the settings cannot be loaded.
#[cfg(feature = "tls")]
fn tls_client(config: &Config) -> Result<Option<crate::driver::TlsClient>, Error> {
    if !config.servers.iter().any(|s| s.tls) {
        return Ok(None);
    }
    Ok(Some(crate::tls::client_config(&config.tls)?))
}

/// Without the `tls` feature no master asks for TLS.
#[cfg(not(feature = "tls"))]
fn tls_client(_config: &Config) -> Result<Option<crate::driver::TlsClient>, Error> {
    Ok(None)
}

impl Redlock {
    /// A client for the masters at `urls`, with default settings. Nothing
    /// is connected yet: each master is connected on first use.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty list or a malformed URL.
    pub fn connect<I, S>(urls: I) -> Result<Redlock, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Redlock::new(Config::new(urls)?)
    }

    /// A client with the given settings.
    ///
    /// # Errors
    /// [`Error::Config`] for settings that cannot work; [`Error::Os`] when
    /// the OS refuses a poll instance or random bytes.
    pub fn new(config: Config) -> Result<Redlock, Error> {
        config.check()?;
        let now = Stamp::now();
        let Parts {
            names,
            engine,
            driver,
            tokens,
            jitter,
        } = Parts::new(&config, now.mono, false)?;
        Ok(Redlock {
            hub: Hub::new(config, names, engine, driver, tokens, jitter, now),
            done: Arc::new(Mutex::new(None)),
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        self.hub.config()
    }

    /// The quorum: how many masters must agree.
    pub fn quorum(&self) -> usize {
        quorum(self.hub.engine().masters())
    }

    /// Each master's state as this client last saw it (after its last
    /// operation, `warm_up` or `settle`): up, connecting, or down and why;
    /// in restart quarantine, and until when; refusing this client (an
    /// ACL); the lock commands of its own it offers. A master that is down
    /// or refuses this client costs a vote, not the locks, so nothing else
    /// would say so in a build without the `tracing` or `metrics`
    /// features.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redlock_mio::Error> {
    /// let mut redlock = redlock_mio::Redlock::connect([
    ///     "redis://127.0.0.1:7000",
    ///     "redis://127.0.0.1:7001",
    ///     "redis://127.0.0.1:7002",
    /// ])?;
    /// redlock.warm_up(std::time::Duration::from_secs(1));
    /// let now = std::time::Instant::now();
    /// for master in redlock.masters() {
    ///     if !master.can_vote(now) {
    ///         eprintln!("{}: {:?}", master.server, master.status);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn masters(&self) -> Vec<MasterState> {
        self.hub.engine().board().read()
    }

    /// One attempt to acquire `resource` for `ttl`.
    ///
    /// `resource` is the Redis key, used as is (see [`ResourceName`]). Pass
    /// a `Bytes` you keep and clone per call, and no operation allocates in
    /// steady state; a borrowed name (`&str`, `&String`) is copied once, and
    /// a `Bytes` made from a `String` costs one small allocation (its
    /// shared header) when the engine first clones it.
    ///
    /// On success the lock is valid until [`Lock::deadline`]:
    /// `ttl - elapsed - drift` after the attempt ended. On failure the
    /// release script has been sent to every master, those that did not
    /// answer included, so that nothing is left behind.
    ///
    /// # Errors
    /// [`Error::Held`] when the lock is held, by another client or by this
    /// one (this attempt is not told which: see
    /// [`Failure::held_by_this_client`](crate::Failure::held_by_this_client));
    /// [`Error::NoQuorum`] or
    /// [`Error::Protocol`] when too few masters answered;
    /// [`Error::ValidityExpired`] when the round was too slow;
    /// [`Error::Config`] for a TTL under 1 ms or over [`MAX_TTL_MS`](crate::MAX_TTL_MS).
    pub fn try_acquire(
        &mut self,
        resource: impl ResourceName,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        self.acquire_with(resource, ttl, &Retry::once())
    }

    /// Acquires `resource` for `ttl`, retrying as [`Config::retry`] says.
    ///
    /// # Errors
    /// As [`Redlock::try_acquire`], for the last attempt.
    pub fn acquire(&mut self, resource: impl ResourceName, ttl: Duration) -> Result<Lock, Error> {
        let retry = self.config().retry;
        self.acquire_with(resource, ttl, &retry)
    }

    /// Acquires `resource` for `ttl` and wraps it in a guard that releases
    /// on drop.
    ///
    /// # Errors
    /// As [`Redlock::acquire`].
    pub fn lock(
        &mut self,
        resource: impl ResourceName,
        ttl: Duration,
    ) -> Result<LockGuard<'_>, Error> {
        let lock = self.acquire(resource, ttl)?;
        Ok(LockGuard {
            client: self,
            lock: Some(lock),
        })
    }

    /// Acquires with an explicit retry policy.
    ///
    /// # Errors
    /// As [`Redlock::try_acquire`], for the last attempt.
    pub fn acquire_with(
        &mut self,
        resource: impl ResourceName,
        ttl: Duration,
        retry: &Retry,
    ) -> Result<Lock, Error> {
        self.acquire_keys(Keys::One(resource.into_name()), Op::Acquire, ttl, retry)
    }

    /// A fenced lock, retrying as [`Config::retry`] says; see
    /// [`Redlock::try_acquire_fenced`].
    ///
    /// # Errors
    /// As [`Redlock::try_acquire_fenced`], for the last attempt.
    pub fn acquire_fenced(
        &mut self,
        resource: impl ResourceName,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let retry = self.config().retry;
        self.acquire_fenced_with(resource, ttl, &retry)
    }

    /// One attempt to acquire `resource` with a fencing token
    /// ([`Lock::fence`]): a number larger than that of every fenced lock on
    /// the resource returned before this call began, for a storage service
    /// to reject writes from a holder that was paused past its validity.
    ///
    /// Two round trips instead of one: (a) on each master a script does the
    /// SET NX PX and, atomically with it, reports the master's fence for
    /// the resource (`<resource>:fence`) and whether it can vouch for it;
    /// (b) the client takes the largest value among at least a quorum of
    /// granting masters that can, adds one, and writes it back to every
    /// master with a script that stores it only while the caller still
    /// holds the key, and only if it is larger. The fence is valid once a
    /// quorum confirmed the write-back within the validity, which counts
    /// both round trips.
    ///
    /// A master vouches for its fence when it carries the fencing marker
    /// (it has kept its data since it was marked), or when it holds this
    /// resource's fence (written back since it lost its data). A master
    /// that lost its data loses the marker with it, and does not count
    /// until a write-back has repaired it for the resource or it has been
    /// readmitted. The first fenced acquire of a fresh deployment needs
    /// every master to grant, to mark them all. The exact assumptions (a
    /// master loses all its data or none, a minority at most, every client
    /// on these scripts) are in `SAFETY.md`, *Fencing tokens*.
    ///
    /// # Errors
    /// As [`Redlock::try_acquire`]; also [`Error::FenceUnknown`] when too
    /// few of the granting masters could vouch for their fence, and
    /// [`Error::FenceRefused`] when the write-back found the lock key gone
    /// on too many masters. The keys are released in every case.
    pub fn try_acquire_fenced(
        &mut self,
        resource: impl ResourceName,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        self.acquire_fenced_with(resource, ttl, &Retry::once())
    }

    /// [`Redlock::try_acquire_fenced`] with a retry policy.
    ///
    /// # Errors
    /// As [`Redlock::try_acquire_fenced`], for the last attempt.
    pub fn acquire_fenced_with(
        &mut self,
        resource: impl ResourceName,
        ttl: Duration,
        retry: &Retry,
    ) -> Result<Lock, Error> {
        self.acquire_keys(
            Keys::One(resource.into_name()),
            Op::AcquireFenced,
            ttl,
            retry,
        )
    }

    /// One attempt to lock every one of `resources` together, all or
    /// nothing: on each master one script sets all the keys, or none when
    /// any is held, and the quorum is taken over masters. Release and
    /// extend such a lock like any other ([`Redlock::release`],
    /// [`Redlock::extend`]): they act on all its keys.
    ///
    /// # Errors
    /// [`ConfigError::NoResources`] for an empty set; otherwise as
    /// [`Redlock::try_acquire`], [`Error::Held`] meaning that some of the
    /// resources are held elsewhere.
    pub fn try_acquire_many<I>(&mut self, resources: I, ttl: Duration) -> Result<Lock, Error>
    where
        I: IntoIterator,
        I::Item: ResourceName,
    {
        self.acquire_many_with(resources, ttl, &Retry::once())
    }

    /// [`Redlock::try_acquire_many`] with a retry policy.
    ///
    /// # Errors
    /// As [`Redlock::try_acquire_many`], for the last attempt.
    pub fn acquire_many_with<I>(
        &mut self,
        resources: I,
        ttl: Duration,
        retry: &Retry,
    ) -> Result<Lock, Error>
    where
        I: IntoIterator,
        I::Item: ResourceName,
    {
        let keys: Arc<[Bytes]> = resources.into_iter().map(ResourceName::into_name).collect();
        if keys.is_empty() {
            return Err(ConfigError::NoResources.into());
        }
        self.acquire_keys(Keys::Many(keys), Op::AcquireMany, ttl, retry)
    }

    /// The acquire loop: `op` is [`Op::Acquire`], [`Op::AcquireFenced`]
    /// (followed by the fence write-back) or [`Op::AcquireMany`].
    fn acquire_keys(
        &mut self,
        keys: Keys,
        op: Op,
        ttl: Duration,
        retry: &Retry,
    ) -> Result<Lock, Error> {
        self.check_servers()?;
        let now = Instant::now();
        let acquire = Acquire::new(&mut self.hub.split().ctx, keys, op, ttl, retry, now)?;
        match self.run(Job::Acquire(acquire)) {
            Output::Lock(result) => result,
            _ => Err(Error::Internal(
                "the hub answered an order with another kind's output",
            )),
        }
    }

    /// One attempt to acquire each of `resources` for `ttl`, all in one
    /// pass: each master gets every `SET` in one write, and each resource
    /// gets its own quorum decision, validity and result, in the order
    /// given. Resources that were not acquired are released on every master
    /// as after [`Redlock::try_acquire`].
    ///
    /// # Errors
    /// The outer error is [`Error::Config`] for a TTL under 1 ms or over
    /// [`MAX_TTL_MS`](crate::MAX_TTL_MS), or
    /// [`ConfigError::BatchTooLarge`] for more resources than half of
    /// [`Config::max_in_flight`] (nothing is sent); each inner result is as
    /// [`Redlock::try_acquire`]'s.
    pub fn try_acquire_batch<I>(
        &mut self,
        resources: I,
        ttl: Duration,
    ) -> Result<Vec<Result<Lock, Error>>, Error>
    where
        I: IntoIterator,
        I::Item: ResourceName,
    {
        self.check_servers()?;
        let requests = self.hub.take_spare();
        let now = Instant::now();
        let batch = Batch::acquire(&mut self.hub.split().ctx, requests, resources, ttl, now)?;
        match self.run(Job::AcquireBatch(batch)) {
            Output::Locks(results) => Ok(results),
            _ => Err(Error::Internal(
                "the hub answered an order with another kind's output",
            )),
        }
    }

    /// Releases each of `locks` on every master, all in one pass: one write
    /// per master, one quorum decision per lock, one result per lock in the
    /// order given (each as [`Redlock::release`]'s). More locks than half
    /// of [`Config::max_in_flight`] are refused before anything is sent,
    /// each result [`ConfigError::BatchTooLarge`].
    pub fn release_batch(&mut self, locks: &[Lock]) -> Vec<Result<(), Error>> {
        let requests = self.hub.take_spare();
        let batch = Batch::release(&self.hub.split().ctx, requests, locks, Instant::now());
        match self.run(Job::ReleaseBatch(batch)) {
            Output::Releases(results) => results,
            _ => Vec::new(),
        }
    }

    /// Releases `lock` on every master, whatever each answered before.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when a quorum no longer held this token (the lock
    /// had expired); [`Error::NoQuorum`] or [`Error::Protocol`] when too
    /// few masters answered. Keys not released expire after their TTL.
    pub fn release(&mut self, lock: &Lock) -> Result<(), Error> {
        let release = Release::new(&self.hub.split().ctx, lock, Instant::now());
        match self.run(Job::Release(release)) {
            Output::Released(result) => result,
            _ => Err(Error::Internal(
                "the hub answered an order with another kind's output",
            )),
        }
    }

    /// Extends `lock` to `ttl` from now on every master. It is extended only
    /// if a quorum confirms within the new validity, which then replaces the
    /// old one.
    ///
    /// A failed extend can still shorten the lock: every master that ran
    /// the script set the keys' TTL to `ttl`, whether or not its reply
    /// arrived in time. So before anything is sent, the lock's deadline
    /// becomes no later than now plus `ttl - drift`, and only a confirmed
    /// extend moves it later: whatever the outcome, and however the call
    /// ends, the deadline is one the keys honour.
    ///
    /// # Errors
    /// [`Error::ExtensionLimit`] past [`Config::max_extensions`];
    /// [`Error::NotHeld`] when the token no longer holds a quorum; otherwise
    /// as [`Redlock::try_acquire`]. On error the lock's deadline is the
    /// earlier of the old one and the call's start plus `ttl - drift`
    /// (nothing was sent, and nothing changed, for a config error or the
    /// extension limit).
    pub fn extend(&mut self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        self.check_servers()?;
        Extend::shorten(self.hub.config(), lock, ttl, Stamp::now())?;
        let extend = Extend::new(&self.hub.split().ctx, lock.clone(), ttl, Instant::now())?;
        match self.run(Job::Extend(extend)) {
            Output::Extended(now_standing, result) => {
                *lock = now_standing;
                result
            }
            _ => Err(Error::Internal(
                "the hub answered an order with another kind's output",
            )),
        }
    }

    /// Runs `job` to its end on this thread: inline on the hub while it
    /// has rounds to run, then, if it waits, handed to the hub and driven
    /// there ([`Redlock::wait`]).
    fn run(&mut self, job: Job) -> Output {
        match self.hub.run_inline(job) {
            Ran::Done(output) => output,
            Ran::Waiting(job, span) => {
                let local = Local(Arc::clone(&self.done));
                self.hub.handle_waiting_job(job, local, span, Stamp::now());
                self.wait()
            }
        }
    }

    /// Drives the hub on this thread until the operation handed to it is
    /// done: its timers (retry delays, a held lock's expiry), its rounds,
    /// and the late replies of earlier ones read meanwhile.
    fn wait(&mut self) -> Output {
        let spin = self.hub.config().spin;
        loop {
            let (engine, driver) = self.hub.io();
            driver.send(engine);
            if let Some(output) = self
                .done
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                return output;
            }
            let now = Instant::now();
            let timeout = match self.hub.poll_timeout() {
                _ if spin => Duration::ZERO,
                Some(at) => at.saturating_duration_since(now),
                // Nothing due, nothing in flight, and no output: the hub
                // lost the operation (a bug), which must not hang.
                None => {
                    return Output::Failed(Error::Internal(
                        "the hub lost an operation: nothing due, nothing in flight",
                    ));
                }
            };
            let (engine, driver) = self.hub.io();
            if let Err(cause) = driver.turn(engine, Some(timeout)) {
                let now = Instant::now();
                for i in 0..engine.links() {
                    engine.handle_failure(i, now, cause.clone());
                }
            }
            let now = Stamp::now();
            self.hub.handle_completed(now);
            self.hub.handle_timeout(now);
        }
    }

    /// Connects every master that is not connected (and not in reconnect
    /// backoff) and waits, at most `timeout`, for their handshakes, so that
    /// the first operation does not spend its per-instance timeout on
    /// connecting. Returns how many masters are connected afterwards.
    pub fn warm_up(&mut self, timeout: Duration) -> usize {
        let start = Instant::now();
        let deadline = start.checked_add(timeout).unwrap_or(start);
        loop {
            let (engine, driver) = self.hub.io();
            driver.prepare(engine, Instant::now());
            let left = deadline.saturating_duration_since(Instant::now());
            self.settle(left);
            let ready = self
                .hub
                .engine()
                .conns()
                .iter()
                .filter(|c| !c.is_down() && !c.is_connecting())
                .count();
            // A master whose host name is still being looked up is asked
            // again shortly; one that failed otherwise is left to its
            // reconnect backoff.
            let resolving = self.hub.engine().conns().iter().any(Conn::is_resolving);
            if !resolving || Instant::now() >= deadline {
                return ready;
            }
            std::thread::sleep(left.min(Duration::from_millis(2)));
        }
    }

    /// Connects every master, as [`Redlock::warm_up`] does, but waits for
    /// the slowest only briefly: it returns once a quorum of servers (two
    /// URLs of one server count once) has finished its handshake and the
    /// other masters have had as long again, at least 50 ms, to finish
    /// theirs; or once no master is left
    /// to wait for, or `timeout` has passed. A stalled minority (connects
    /// that succeed, handshakes never answered) therefore costs a few
    /// milliseconds, not `timeout`. A master whose host name is still
    /// being looked up is waited for, within `timeout`, and its grace
    /// counts from the end of the lookup. Returns how many masters
    /// finished their handshake.
    ///
    /// One server named twice is told by the `run_id` both its
    /// connections read, which both read within the grace unless one is
    /// far slower than the other; the votes of a round stay one per server
    /// whether or not it was told before (see `SAFETY.md`).
    ///
    /// # Errors
    /// [`ConfigError::SameServer`] when two masters turned out to be one
    /// server; every acquire and extend is refused from then on.
    pub fn warm_up_quorum(&mut self, timeout: Duration) -> Result<usize, Error> {
        let start = Instant::now();
        let deadline = start.checked_add(timeout).unwrap_or(start);
        let quorum = self.quorum();
        let mut quorum_at: Option<Instant> = None;
        // When a master was last seen waiting for its host name.
        let mut looked_up_at = start;
        let mut resolving = true;
        loop {
            let now = Instant::now();
            let (engine, driver) = self.hub.io();
            if resolving {
                driver.prepare(engine, now);
            }
            driver.send(engine);
            self.hub.check_distinct();
            self.check_servers()?;
            let progress = WarmUp::of(self.hub.engine().conns());
            resolving = progress.resolving;
            if resolving {
                looked_up_at = now;
            }
            if progress.waiting == 0 || now >= deadline {
                return Ok(progress.ready);
            }
            let mut wake = deadline;
            if progress.servers >= quorum {
                let at = *quorum_at.get_or_insert(now);
                let took = at.saturating_duration_since(start);
                let grace = took.max(QUORUM_GRACE_MIN);
                let grace_end = at.max(looked_up_at).checked_add(grace).unwrap_or(at);
                if now >= grace_end && !resolving {
                    return Ok(progress.ready);
                }
                wake = wake.min(grace_end);
            }
            let mut wait = wake.saturating_duration_since(now);
            if resolving {
                // The lookup runs off this thread: ask again shortly.
                wait = wait.min(Duration::from_millis(2));
            }
            let (engine, driver) = self.hub.io();
            if driver.turn(engine, Some(wait)).is_err() {
                // A broken poll instance: the first round will say so.
                return Ok(progress.ready);
            }
        }
    }

    /// Bytes of memory held by all connections' buffers and in-flight
    /// queues: bounded whatever the masters send or leave unanswered, and
    /// constant while replies stay small (see [`Config::max_in_flight`]).
    pub fn buffer_capacity(&self) -> usize {
        self.hub
            .engine()
            .conns()
            .iter()
            .map(Conn::buffer_capacity)
            .sum()
    }

    /// Finishes what earlier operations left in flight: reads every late
    /// reply and answers a late `-NOSCRIPT` (after `SCRIPT FLUSH` on a
    /// master) with EVAL, waiting at most `timeout`. Returns how many
    /// requests were still unanswered, 0 when all masters are done.
    ///
    /// An operation returns as soon as its quorum outcome is known, so the
    /// slowest masters may still be answering when it returns; their
    /// replies are read at the client's next operation. A release that met
    /// with `-NOSCRIPT` on a slow master takes effect there only then.
    /// Callers about to go idle or exit, who want every master done, call
    /// this.
    pub fn settle(&mut self, timeout: Duration) -> usize {
        let deadline = Instant::now().checked_add(timeout);
        let deadline = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        let (engine, driver) = self.hub.io();
        let unanswered = driver.settle(engine, deadline);
        self.hub.check_distinct();
        unanswered
    }

    /// Refuses to take or extend locks once two masters turned out to be
    /// one server (releasing stays allowed: it can only free keys).
    fn check_servers(&self) -> Result<(), Error> {
        match self.hub.same_server() {
            Some(error) => Err(Error::Config(error.clone())),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::AddrError;
    use crate::job::readmit_after;

    #[test]
    fn config_refuses_what_cannot_work() {
        let empty: [&str; 0] = [];
        assert_eq!(Config::new(empty), Err(ConfigError::NoServers));
        assert!(matches!(
            Config::new(["redis://h", "redis://h:0"]),
            Err(ConfigError::Url {
                index: 1,
                error: AddrError::BadPort
            })
        ));
        let base = Config::new(["redis://127.0.0.1:1"]).unwrap();
        type Change = fn(&mut Config);
        let cases: [(Change, ConfigError); 5] = [
            (|c| c.drift_factor = 1.0, ConfigError::DriftFactor),
            (|c| c.drift_factor = f64::NAN, ConfigError::DriftFactor),
            (
                |c| c.per_instance_timeout = Duration::ZERO,
                ConfigError::ZeroTimeout,
            ),
            (|c| c.retry.attempts = 0, ConfigError::ZeroAttempts),
            (|c| c.max_in_flight = 31, ConfigError::InFlightTooSmall),
        ];
        for (change, want) in cases {
            let mut config = base.clone();
            change(&mut config);
            assert_eq!(Redlock::new(config).err(), Some(Error::Config(want)));
        }
    }

    #[test]
    fn defaults_follow_the_spec_and_keep_quarantine_on() {
        let config = Config::new(["redis://127.0.0.1:1"]).unwrap();
        assert_eq!(config.drift_factor, 0.01);
        assert_eq!(config.per_instance_timeout, Duration::from_millis(50));
        assert_eq!(config.quarantine, Some(Duration::from_secs(60)));
        assert!(!config.spin);
        let mut redlock = Redlock::new(config).unwrap();
        let got = redlock.try_acquire("r", Duration::from_secs(61));
        assert_eq!(
            got,
            Err(Error::Config(ConfigError::TtlOverQuarantine(
                Duration::from_secs(60)
            )))
        );
    }

    #[test]
    fn a_zero_ttl_is_refused_before_anything_is_sent() {
        let mut redlock = Redlock::connect(["redis://127.0.0.1:1"]).unwrap();
        let got = redlock.try_acquire("r", Duration::ZERO);
        assert_eq!(got, Err(Error::Config(ConfigError::ZeroTtl)));
    }

    #[test]
    fn readmission_waits_twice_the_max_ttl_stretched_by_drift_both_ways() {
        let max = Duration::from_secs(1);
        // 2 s * 1.01 / 0.99 = 2040.4 ms, plus 10 ms.
        let wait = readmit_after(max, 0.01);
        assert!(wait > Duration::from_millis(2_050) && wait < Duration::from_millis(2_051));
        assert_eq!(readmit_after(max, 0.0), Duration::from_millis(2_010));
        assert_eq!(readmit_after(Duration::MAX, 0.01), Duration::MAX);
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let mut rng = SplitMix64(7);
        let (low, high) = (Duration::from_millis(100), Duration::from_millis(200));
        let draws: Vec<Duration> = (0..1000).map(|_| rng.between(low, high)).collect();
        assert!(draws.iter().all(|d| (low..=high).contains(d)));
        assert!(draws.iter().any(|d| *d < Duration::from_millis(120)));
        assert!(draws.iter().any(|d| *d > Duration::from_millis(180)));
        assert_eq!(rng.between(high, high), high);
    }
}
