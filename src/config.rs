//! Client settings: [`Config`], its defaults (the spec's), the retry
//! policy, and the checks that refuse settings and arguments that cannot
//! work ([`ConfigError`]), before anything is sent.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::addr::{AddrError, ServerAddr};
use crate::conn::Timing;
use crate::quorum::Validity;
use crate::resolve::Resolver;
use crate::resp::Limits;

/// The largest TTL accepted, in milliseconds. Redis refuses a `PX` whose
/// absolute expiry overflows a signed 64-bit millisecond clock; half of
/// that range leaves room for any plausible server clock.
pub const MAX_TTL_MS: u64 = (i64::MAX / 2) as u64;

/// How a blocking acquire retries. Made from [`Retry::default`],
/// [`Retry::once`], [`Retry::until`] or [`Retry::forever`], then set with
/// the `with_` methods (a struct that may gain a setting, so not built by
/// a literal):
///
/// ```
/// use std::time::Duration;
/// use redlock_mio::Retry;
///
/// let retry = Retry::until(Duration::from_secs(5)).with_delay(Duration::from_millis(50));
/// assert_eq!(retry.max_wait, Some(Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Retry {
    /// Attempts in all, the first included; at least 1. Default 10.
    pub attempts: u32,
    /// Delay between attempts: each wait is uniform in
    /// `[delay / 2, delay]`, so that competing clients fall out of step.
    /// Default 200 ms.
    pub delay: Duration,
    /// Give up once this much time has passed since the first attempt,
    /// whatever the attempt count. Default none.
    pub max_wait: Option<Duration>,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: 10,
            delay: Duration::from_millis(200),
            max_wait: None,
        }
    }
}

impl Retry {
    /// One attempt, no waiting.
    pub fn once() -> Retry {
        Retry {
            attempts: 1,
            ..Retry::default()
        }
    }

    /// Retry until `max_wait` has passed, however many attempts that takes.
    pub fn until(max_wait: Duration) -> Retry {
        Retry {
            attempts: u32::MAX,
            max_wait: Some(max_wait),
            ..Retry::default()
        }
    }

    /// Retry forever.
    pub fn forever() -> Retry {
        Retry {
            attempts: u32::MAX,
            ..Retry::default()
        }
    }

    /// This retry with [`Retry::attempts`] set to `attempts`.
    #[must_use]
    pub fn with_attempts(self, attempts: u32) -> Retry {
        Retry { attempts, ..self }
    }

    /// This retry with [`Retry::delay`] set to `delay`.
    #[must_use]
    pub fn with_delay(self, delay: Duration) -> Retry {
        Retry { delay, ..self }
    }

    /// This retry with [`Retry::max_wait`] set to `max_wait`.
    #[must_use]
    pub fn with_max_wait(self, max_wait: Option<Duration>) -> Retry {
        Retry { max_wait, ..self }
    }
}

/// TLS settings for `rediss://` masters (used with the `tls` feature).
/// The server's certificate is checked against the URL's host, and
/// against the system's root certificates unless `ca_file` is given.
/// Made from [`TlsConfig::default`] and set with the `with_` methods:
///
/// ```
/// use redlock_mio::TlsConfig;
///
/// let tls = TlsConfig::default()
///     .with_ca_file("ca.pem")
///     .with_client_cert("client.pem", "client.key");
/// assert!(tls.cert_file.is_some());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsConfig {
    /// PEM file of the certificate authorities to trust instead of the
    /// system's.
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate chain, for mutual TLS (with
    /// `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client's private key, for mutual TLS (with
    /// `cert_file`).
    pub key_file: Option<PathBuf>,
}

impl TlsConfig {
    /// These settings, trusting the certificate authorities of the PEM
    /// file `path` instead of the system's.
    #[must_use]
    pub fn with_ca_file(self, path: impl Into<PathBuf>) -> TlsConfig {
        TlsConfig {
            ca_file: Some(path.into()),
            ..self
        }
    }

    /// These settings, with a client certificate chain and its private
    /// key (PEM files), for masters that ask for one (mutual TLS).
    #[must_use]
    pub fn with_client_cert(
        self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> TlsConfig {
        TlsConfig {
            cert_file: Some(cert_file.into()),
            key_file: Some(key_file.into()),
            ..self
        }
    }
}

/// Which commands release and extend locks (see [`Config::lock_commands`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockCommands {
    /// Each master's own compare-and-delete (`DELIFEQ` on Valkey 9.0+,
    /// `DELEX` on Redis 8.4+) and compare-and-set (`SET ... IFEQ` on Valkey
    /// 8.1+ and Redis 8.4+), where the handshake finds them (one
    /// `COMMAND DOCS`, pipelined); the scripts elsewhere, and wherever a
    /// master refuses a command it advertised, until it reconnects. Masters
    /// of different servers in one client each go their own way.
    #[default]
    Auto,
    /// The scripts on every master, and no `COMMAND DOCS` in the
    /// handshake: for a proxy that refuses commands it does not know.
    Scripts,
}

/// Settings of a [`Redlock`](crate::Redlock) client. Build one with [`Config::new`] and
/// change the public fields; the defaults follow the spec.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// The masters, in a fixed order that error reports follow.
    pub servers: Vec<ServerAddr>,
    /// Clock drift allowance as a fraction of the TTL, plus 2 ms.
    /// Default 0.01; must be in `[0, 1)`.
    pub drift_factor: f64,
    /// How long a round waits for the masters' replies; small compared to
    /// the TTL, so that a dead or stalled master does not hold the caller.
    /// Default 50 ms.
    pub per_instance_timeout: Duration,
    /// How long a connect may take; also how long a connection may leave a
    /// request unanswered before it is dropped and re-established.
    /// Default 1 s.
    pub connect_timeout: Duration,
    /// Longest wait before reconnecting to a master that keeps failing; the
    /// wait starts at 10 ms and doubles. Default 1 s.
    pub reconnect_backoff_max: Duration,
    /// Retries of [`Redlock::acquire`](crate::Redlock::acquire). Default: [`Retry::default`].
    pub retry: Retry,
    /// How many times one lock may be extended; `None` (the default) for
    /// no limit.
    pub max_extensions: Option<u32>,
    /// Parser limits for replies.
    pub limits: Limits,
    /// Restart quarantine, crash-recovery safety without `appendfsync
    /// always`: the largest TTL this client will use. On every (re)connect
    /// the client reads the master's `INFO server`; a master whose uptime is
    /// shorter than this, or whose `run_id` changed while it held this
    /// client's locks, does not count toward the quorum until this long
    /// after its restart (its votes read as [`Cause::Quarantined`]). An
    /// acquire or extend with a longer TTL is refused. `None` turns it off,
    /// for masters that persist every write (`appendfsync always`).
    /// Default: 60 s.
    ///
    /// [`Cause::Quarantined`]: crate::Cause::Quarantined
    pub quarantine: Option<Duration>,
    /// Busy-wait for replies (poll with a zero timeout) instead of sleeping
    /// in the kernel: lower latency for a core's worth of CPU while a round
    /// waits. Default off.
    pub spin: bool,
    /// The most requests one master may leave unanswered. An operation
    /// returns at its quorum, so the slowest master's replies are read
    /// later; a master that falls this far behind is dropped (its vote
    /// fails with [`Cause::TooFarBehind`]) and reconnected, as a stalled
    /// one is. The queue is allocated once per connection, so that a
    /// lagging master costs no allocation: 160 bytes a request (see
    /// [`Redlock::buffer_capacity`](crate::Redlock::buffer_capacity)). Default 1024: a single-operation
    /// client issues about 10,000 requests a second per master here, so
    /// 1024 is a lag of about 100 ms, twice the default per-instance
    /// timeout, past which the master's votes time out anyway; raise it for
    /// large batches ([`Redlock::try_acquire_batch`](crate::Redlock::try_acquire_batch) puts one request per
    /// resource in flight, and a batch may have at most half of this
    /// bound: [`ConfigError::BatchTooLarge`]). At least 32.
    ///
    /// [`Cause::TooFarBehind`]: crate::Cause::TooFarBehind
    pub max_in_flight: usize,
    /// Looks host names up: on a thread of its own, never inside a round,
    /// allowed [`Config::connect_timeout`] before the master counts as
    /// unresolved. Every address it returns is tried in turn, one per
    /// connect. Default: the system's resolver. IP literals are never
    /// looked up.
    pub resolver: Resolver,
    /// How a waiting acquire (one with retries left) waits for a lock that
    /// another client holds. `true` (the default): it learns the key's
    /// remaining time from the refusing masters and waits until then, and
    /// a [`SharedRedlock`](crate::SharedRedlock) also subscribes to the
    /// resource's release channel ([`script::release_channel`]) on every
    /// master and tries again as soon as a release is published, or at
    /// once when a lock is released through the same client: a released
    /// lock is handed over within round trips. Waiting then lasts up to
    /// [`Retry::max_wait`], or `attempts * delay` without one; attempts
    /// refused because the lock is held do not use up [`Retry::attempts`].
    /// Fenced and multi-resource acquires wait so too (their scripts
    /// report the holder's remaining time as the waiting script does), and
    /// a multi-resource one listens to every one of its resources'
    /// channels (any release among them wakes it). Beside a
    /// master that fails, a refusal that makes a quorum only with it is
    /// looked at again after [`Config::per_instance_timeout`] before its
    /// key's remaining time is waited out (racers that split the other
    /// masters clean up at once, unannounced).
    /// `false`: every refused attempt waits [`Retry::delay`] (jittered),
    /// as Redlock clients usually do.
    ///
    /// [`script::release_channel`]: crate::script::release_channel
    pub wake_on_release: bool,
    /// With [`Config::wake_on_release`]: each waiter tries again after a
    /// random wait in `[0, wake_spread]` once woken, so that waiters in
    /// several processes woken by one release do not all send their
    /// `SET NX` at once and split the masters' votes; the longer a waiter
    /// has waited, the smaller its share of the spread (a quarter at
    /// 20 ms, then shrinking in proportion to the wait), so that the
    /// longest waiter tends to try first. Default 300 µs (see
    /// docs/waiting.md for the measurements).
    ///
    /// A release that names the process whose turn it is (a shared
    /// client's announced release names the waiting process that has gone
    /// longest without the lock, known from the notices refused attempts
    /// publish) replaces the spread: that process's head waiter tries at
    /// once, and the others wait 4 spreads and the row window
    /// ([`Config::local_handover_window`], at most 10 ms), and up to one
    /// spread more, so that the named one's attempt reaches the masters
    /// first and its row of hand-overs runs, and try then only if it did
    /// not take the lock (a later release naming them wakes them at
    /// once).
    pub wake_spread: Duration,
    /// With [`Config::wake_on_release`], in a shared client: how many
    /// times in a row a lock released while a waiter of this client waits
    /// for it is handed over in-process. The release is sent without a
    /// notification and the waiter's `SET NX` right behind it, in the same
    /// write to every master: one round trip frees the lock and takes it
    /// again, with a fresh token and the waiter's full TTL, where a
    /// release, a notification and an attempt took two and more. The
    /// release after that many hand-overs notifies every process, and this
    /// client's waiters then hear of it from the masters, as other
    /// processes' waiters do, so that they get their turn (lock
    /// cohorting; see also [`Config::local_handover_window`]). A fenced
    /// waiter is handed a lock too: its attempt behind the release is its
    /// whole two-phase acquire, phase one in that write and the fence
    /// write-back one round trip later, so its fence is read after the
    /// release, from a quorum, and is new and larger. 0 turns hand-overs
    /// off. Default 8.
    ///
    /// The count applies while other processes compete for the lock:
    /// another client's release of it (or cleanup after a race) was heard
    /// since this client last ended a row with an announced release, or
    /// no row has ended yet. With nobody else heard, the window alone ends
    /// a row: the count would only make this client's own callers race,
    /// in vain, for their own lock (an announced release costs about
    /// three hand-overs). A process that starts competing is heard once
    /// it takes a master in a race (its cleanup is published) or the lock
    /// (its release is); a client that does not publish (another Redlock
    /// library) is never heard, and against it rows end at the window.
    pub local_handovers: u32,
    /// With [`Config::local_handovers`]: how long a row of in-process
    /// hand-overs may last, from its first; the release after that is
    /// announced to every process. With short critical sections the count
    /// ends a row (while other processes compete), with longer ones this:
    /// the other processes' waiters wait about this long for their turn,
    /// however long each section. Default 2 ms.
    pub local_handover_window: Duration,
    /// With [`Config::local_handovers`]: how long a release finding no
    /// local waiter for its lock waits for one, when the lock has been
    /// passing between this client's callers (it was handed over since a
    /// release last waited in vain) and the row of hand-overs is within
    /// its budget. A caller that released the lock and comes straight
    /// back for it is then handed it (one round trip, unannounced) rather
    /// than meeting every process's waiters, woken by an announced
    /// release, in a race it wins while they each pay an attempt and a
    /// cleanup. The lock stays held meanwhile, and the releasing caller's
    /// release returns that much later. A release that waited in vain
    /// does not wait again until the lock is next handed over, so a
    /// client with one caller per lock never waits. `Duration::ZERO`
    /// turns it off. Default 100 µs.
    pub local_handover_linger: Duration,
    /// TLS settings for the `rediss://` masters. Default: the system's
    /// root certificates, no client certificate.
    pub tls: TlsConfig,
    /// Which commands release and extend locks. Default
    /// [`LockCommands::Auto`]: each master's own where it has them.
    pub lock_commands: LockCommands,
    /// Bugs put in on purpose by the crate's own tests (set through
    /// `sim::knobs`, under `--cfg redlock_sim`); private, so that the
    /// settings' shape is the same whatever features a dependent turns on.
    pub(crate) knobs: Knobs,
}

/// The test knobs a [`Config`] carries: nothing without `--cfg
/// redlock_sim`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Knobs {
    /// Added to every validity the client computes, so that a lock claims
    /// to outlive its keys: `tests/safety.rs` shows its checker catching
    /// a validity wrong by a few milliseconds. Default zero.
    #[cfg(any(test, redlock_sim))]
    pub(crate) overstate_validity: Duration,
    /// The shared client's event loop panics when it starts an operation
    /// on this resource: `tests/loop_stops.rs` shows what callers see when
    /// the loop ends by a panic. Default none.
    #[cfg(any(test, redlock_sim))]
    pub(crate) panic_on_resource: Option<bytes::Bytes>,
}

impl Config {
    /// The connections' time limits under these settings.
    pub(crate) fn timing(&self) -> Timing {
        Timing {
            connect: self.connect_timeout,
            stall: self.connect_timeout.max(self.per_instance_timeout),
            patience: self.per_instance_timeout,
            backoff_min: Duration::from_millis(10).min(self.reconnect_backoff_max),
            backoff_max: self.reconnect_backoff_max,
            quarantine: self.quarantine,
            max_in_flight: self.max_in_flight,
        }
    }
}

impl Config {
    /// Settings with the default values for the masters at `urls`.
    ///
    /// # Errors
    /// [`ConfigError::NoServers`] for an empty list, [`ConfigError::Url`]
    /// for a malformed URL (naming its position, not its text, since it may
    /// carry a password).
    pub fn new<I, S>(urls: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let servers = urls
            .into_iter()
            .enumerate()
            .map(|(index, url)| {
                url.as_ref()
                    .parse()
                    .map_err(|error| ConfigError::Url { index, error })
            })
            .collect::<Result<Vec<ServerAddr>, _>>()?;
        if servers.is_empty() {
            return Err(ConfigError::NoServers);
        }
        Ok(Config {
            servers,
            drift_factor: 0.01,
            per_instance_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            reconnect_backoff_max: Duration::from_secs(1),
            retry: Retry::default(),
            max_extensions: None,
            limits: Limits::default(),
            quarantine: Some(Duration::from_secs(60)),
            spin: false,
            max_in_flight: 1024,
            resolver: Resolver::system(),
            wake_on_release: true,
            wake_spread: Duration::from_micros(300),
            local_handovers: 8,
            local_handover_window: Duration::from_millis(2),
            local_handover_linger: Duration::from_micros(100),
            tls: TlsConfig::default(),
            lock_commands: LockCommands::Auto,
            knobs: Knobs::default(),
        })
    }

    /// `ttl - drift` with this client's drift factor: how long after a
    /// round's start its keys surely stand (see [`Validity::span`]); with
    /// `--cfg redlock_sim`, overstated by the knob that says so.
    pub(crate) fn validity_span(&self, ttl: Duration) -> Option<Duration> {
        let span = Validity::span(ttl, self.drift_factor);
        #[cfg(any(test, redlock_sim))]
        let span = span.map(|span| span + self.knobs.overstate_validity);
        span
    }

    /// `ttl` rounded down to whole milliseconds, if Redis and the restart
    /// quarantine accept it: at least 1 ms, at most [`MAX_TTL_MS`], and no
    /// more than [`Config::quarantine`]. The rule every acquire, extend and
    /// watchdog applies.
    pub(crate) fn checked_ttl(&self, ttl: Duration) -> Result<Duration, ConfigError> {
        let ttl = Duration::from_millis(checked_ttl(ttl)?);
        match self.quarantine {
            Some(max) if ttl > max => Err(ConfigError::TtlOverQuarantine(max)),
            _ => Ok(ttl),
        }
    }

    /// The most resources (or locks) one batch may have: half of
    /// [`Config::max_in_flight`], the shared client's admission limit, so
    /// that a batch never pushes a connection others use past its bound.
    pub(crate) fn max_batch(&self) -> usize {
        self.max_in_flight / 2
    }

    /// `len` if a batch of that many fits [`Config::max_batch`].
    pub(crate) fn checked_batch(&self, len: usize) -> Result<usize, ConfigError> {
        let max = self.max_batch();
        if len > max {
            return Err(ConfigError::BatchTooLarge { len, max });
        }
        Ok(len)
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.servers.is_empty() {
            return Err(ConfigError::NoServers);
        }
        if !(0.0..1.0).contains(&self.drift_factor) {
            return Err(ConfigError::DriftFactor);
        }
        if self.per_instance_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        self.retry.check()?;
        if self.max_in_flight < MIN_IN_FLIGHT {
            return Err(ConfigError::InFlightTooSmall);
        }
        let durations = [
            ("per_instance_timeout", Some(self.per_instance_timeout)),
            ("connect_timeout", Some(self.connect_timeout)),
            ("reconnect_backoff_max", Some(self.reconnect_backoff_max)),
            ("quarantine", self.quarantine),
            ("wake_spread", Some(self.wake_spread)),
            ("local_handover_linger", Some(self.local_handover_linger)),
            ("local_handover_window", Some(self.local_handover_window)),
        ];
        for (setting, duration) in durations {
            check_duration(setting, duration)?;
        }
        Ok(())
    }
}

impl Retry {
    /// A policy that can work: at least one attempt, and waits the clock
    /// can count ([`MAX_DURATION`]).
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.attempts == 0 {
            return Err(ConfigError::ZeroAttempts);
        }
        check_duration("retry delay", Some(self.delay))?;
        check_duration("retry max_wait", self.max_wait)
    }
}

/// The longest duration a setting may have: a year. Longer ones would be
/// added to the clock by the event loop, where an overflow would stop it.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

fn check_duration(setting: &'static str, duration: Option<Duration>) -> Result<(), ConfigError> {
    match duration {
        Some(d) if d > MAX_DURATION => Err(ConfigError::DurationTooLarge(setting)),
        _ => Ok(()),
    }
}

/// A setting or argument that cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// No master was given.
    NoServers,
    /// The URL at `index` is malformed.
    Url {
        /// Position of the URL in the list given.
        index: usize,
        /// What is wrong with it.
        error: AddrError,
    },
    /// The drift factor is not in `[0, 1)`.
    DriftFactor,
    /// A timeout of zero.
    ZeroTimeout,
    /// A retry policy with no attempt.
    ZeroAttempts,
    /// A TTL under one millisecond.
    ZeroTtl,
    /// A TTL over [`MAX_TTL_MS`].
    TtlTooLarge,
    /// A multi-resource lock over no resource.
    NoResources,
    /// A resource name is empty: a key of no bytes names nothing a
    /// reader of the masters could tell apart.
    EmptyResource,
    /// A watchdog's extension period, as a fraction of the TTL, outside
    /// `(0, 1)`.
    ExtensionFraction,
    /// A TTL over the restart quarantine's maximum ([`Config::quarantine`]):
    /// a restart could lose such a lock after the quarantine ended.
    TtlOverQuarantine(Duration),
    /// [`Config::max_in_flight`] under 32: no room for a connection's
    /// handshake and a batch.
    InFlightTooSmall,
    /// The named duration (a setting, or a retry policy's) is over
    /// [`MAX_DURATION`].
    DurationTooLarge(&'static str),
    /// A batch of more resources (or locks) than half of
    /// [`Config::max_in_flight`], the most one operation may put in flight
    /// on a connection that others share: it is refused before anything is
    /// sent, and nothing else is affected.
    BatchTooLarge {
        /// How many resources or locks the batch has.
        len: usize,
        /// The most a batch may have: `max_in_flight / 2`.
        max: usize,
    },
    /// The TLS settings cannot be used: a CA, certificate or key file
    /// that is missing or holds no usable PEM item, a certificate without
    /// its key, no root certificate to trust.
    Tls(String),
    /// Two URLs name the same server process (the same `run_id`, read on
    /// connect): it would vote twice and make a fake majority. Seen once
    /// both are connected; from then on every operation is refused.
    SameServer {
        /// The first URL (password hidden).
        first: Arc<str>,
        /// The second URL (password hidden).
        second: Arc<str>,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NoServers => f.write_str("no Redis master given"),
            ConfigError::Url { index, error } => write!(f, "master URL #{}: {error}", index + 1),
            ConfigError::DriftFactor => f.write_str("drift factor must be in [0, 1)"),
            ConfigError::ZeroTimeout => f.write_str("timeouts must be greater than zero"),
            ConfigError::ZeroAttempts => f.write_str("a retry policy needs at least one attempt"),
            ConfigError::ZeroTtl => f.write_str("TTL must be at least 1 ms"),
            ConfigError::TtlTooLarge => write!(f, "TTL exceeds the maximum of {MAX_TTL_MS} ms"),
            ConfigError::NoResources => {
                f.write_str("a multi-resource lock needs at least one resource")
            }
            ConfigError::EmptyResource => f.write_str("a resource name is empty"),
            ConfigError::ExtensionFraction => f.write_str(
                "the watchdog's extension period must be a fraction of the TTL in (0, 1)",
            ),
            ConfigError::TtlOverQuarantine(max) => write!(
                f,
                "TTL exceeds the restart quarantine's maximum TTL of {} ms (raise Config::quarantine, or turn it off for masters with appendfsync always)",
                max.as_millis()
            ),
            ConfigError::InFlightTooSmall => {
                write!(f, "max_in_flight must be at least {MIN_IN_FLIGHT}")
            }
            ConfigError::DurationTooLarge(setting) => write!(
                f,
                "{setting} is over the longest duration a setting may have ({} days)",
                MAX_DURATION.as_secs() / 86_400
            ),
            ConfigError::BatchTooLarge { len, max } => write!(
                f,
                "a batch of {len} is over the limit of {max} (half of Config::max_in_flight): \
                 raise max_in_flight to at least {}, or split the batch",
                len.saturating_mul(2)
            ),
            ConfigError::Tls(problem) => write!(f, "TLS settings: {problem}"),
            ConfigError::SameServer { first, second } => write!(
                f,
                "{first} and {second} are the same server (same run_id): one server \
                 cannot be two of the independent masters"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The smallest [`Config::max_in_flight`]: a connection's handshake alone
/// puts up to a dozen requests in flight.
const MIN_IN_FLIGHT: usize = 32;

pub(crate) fn checked_ttl(ttl: Duration) -> Result<u64, ConfigError> {
    match u64::try_from(ttl.as_millis()) {
        Ok(0) => Err(ConfigError::ZeroTtl),
        Ok(ms) if ms <= MAX_TTL_MS => Ok(ms),
        _ => Err(ConfigError::TtlTooLarge),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_checked() {
        assert_eq!(checked_ttl(Duration::ZERO), Err(ConfigError::ZeroTtl));
        assert_eq!(
            checked_ttl(Duration::from_micros(999)),
            Err(ConfigError::ZeroTtl)
        );
        assert_eq!(checked_ttl(Duration::from_millis(1)), Ok(1));
        assert_eq!(
            checked_ttl(Duration::from_millis(MAX_TTL_MS)),
            Ok(MAX_TTL_MS)
        );
        assert_eq!(
            checked_ttl(Duration::from_millis(MAX_TTL_MS + 1)),
            Err(ConfigError::TtlTooLarge)
        );
        assert_eq!(checked_ttl(Duration::MAX), Err(ConfigError::TtlTooLarge));
    }

    /// A duration the event loop would add to the clock
    /// past its range (a panic on its thread) is refused up front, at the
    /// limit and one past it.
    #[test]
    fn every_duration_the_loop_adds_to_the_clock_is_bounded() {
        type Set = fn(&mut Config, Duration);
        let settings: [(&str, Set); 9] = [
            ("per_instance_timeout", |c, d| c.per_instance_timeout = d),
            ("connect_timeout", |c, d| c.connect_timeout = d),
            ("reconnect_backoff_max", |c, d| c.reconnect_backoff_max = d),
            ("quarantine", |c, d| c.quarantine = Some(d)),
            ("wake_spread", |c, d| c.wake_spread = d),
            ("local_handover_linger", |c, d| c.local_handover_linger = d),
            ("local_handover_window", |c, d| c.local_handover_window = d),
            ("retry delay", |c, d| c.retry.delay = d),
            ("retry max_wait", |c, d| c.retry.max_wait = Some(d)),
        ];
        for (name, set) in settings {
            let mut config = Config::new(["redis://127.0.0.1:1"]).unwrap();
            set(&mut config, MAX_DURATION);
            assert_eq!(config.check(), Ok(()), "{name} at the limit");
            for over in [MAX_DURATION + Duration::from_nanos(1), Duration::MAX] {
                set(&mut config, over);
                assert_eq!(
                    config.check(),
                    Err(ConfigError::DurationTooLarge(name)),
                    "{name} past the limit"
                );
            }
        }
    }
}
