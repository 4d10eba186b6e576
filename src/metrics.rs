//! Observability: the metrics the client records through the `metrics`
//! facade (feature `metrics`) and the span it opens per operation through
//! `tracing` (feature `tracing`).
//!
//! This module owns every metric's name and labels. The modules where
//! outcomes are decided call its small functions: `job` when an
//! operation's output is taken, `shared` when the loop releases locks
//! nobody claimed, `keep` when a kept lock is lost, `engine` when a
//! master's connection fails and when its restart quarantine begins or
//! ends; `client` and `shared` open the spans. It decides nothing, does no
//! I/O and reads no clock: it is handed plain data (results, errors,
//! causes, instants) and imports nothing that decides. With the
//! features off its functions are empty and inlined and its types hold
//! nothing, so the hot path gains no allocation, lock or atomic.
//!
//! # Metrics
//!
//! Recorded through whatever recorder the application installed (an
//! exporter such as `metrics-exporter-prometheus`); with none, the
//! facade's no-op recorder. Every key is built at compile time from static
//! names and labels, or, for the per-master ones, once per client, so that
//! recording allocates nothing; what a recorder does with a key (a map
//! lookup per call, for most) is its own cost.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `redlock_acquires_total` | counter | `outcome` | acquires ended (one per resource of a batch) |
//! | `redlock_acquire_duration_seconds` | histogram | `outcome` | from the first attempt's start to the result, retries and waits included |
//! | `redlock_acquire_wait_seconds` | histogram | | acquired locks only: time before the winning attempt started (retry delays, waits for a release, failed attempts); 0 when the first attempt won |
//! | `redlock_acquire_attempts` | histogram | `outcome` | attempts per acquire |
//! | `redlock_extends_total` | counter | `outcome` | extensions ended, a watchdog's included |
//! | `redlock_releases_total` | counter | `outcome` | releases ended (one per lock of a batch) |
//! | `redlock_locks_held` | gauge | | locks acquired and not yet released by this process |
//! | `redlock_locks_lost_total` | counter | `reason` | kept locks the watchdog gave up |
//! | `redlock_master_failures_total` | counter | `master`, `cause` | a master's connection failed (dropped, or a connect that failed) |
//! | `redlock_master_quarantined` | gauge | `master` | clients in this process that hold the master in restart quarantine |
//! | `redlock_requests_total` | counter | `via` | requests sent to masters, each master's counted, by how they went: `set_nx` (a plain acquire), `script`, or a master's own `delifeq`, `delex`, `set_ifeq` |
//! | `redlock_native_refused_total` | counter | | requests re-sent by script after a master refused a command of its own it had advertised |
//! | `redlock_subscribe_refused_total` | counter | | SUBSCRIBEs a master refused (a user without channel rights): waiters there wait for the holder's expiry |
//! | `redlock_noscript_recoveries_total` | counter | `via` | `-NOSCRIPT`s recovered from, by `script_load` or `eval` |
//!
//! `outcome` is `ok`, or the kind of [`Error`]: `held`, `not_held` (or
//! `gone`, for an extend whose masters' own `SET ... IFEQ ... GET` found
//! the key gone on every master that refused),
//! `no_quorum`, `protocol`, `validity_expired`, `fence_unknown`,
//! `fence_refused`, `extension_limit`, `config`, `os`. `reason` is one of
//! those error kinds (extending kept failing), `extension_limit` or
//! `expired` (see [`LostReason`]). `master` is the master's URL, password
//! hidden; `cause` the kind of [`Cause`] (`closed`, `io`, `connect`,
//! `stalled`, ...).
//!
//! Operations refused before anything is sent (a TTL out of range, the
//! extension cap reached, two masters that are one server) are not
//! counted. `redlock_locks_held` goes up by one per lock acquired and down
//! by one per lock released, whatever the release's outcome: a lock left to
//! expire without a release stays counted, and releasing a lock twice, or
//! one made with [`Lock::from_parts`](crate::Lock::from_parts), counts down
//! twice. The quarantine gauge changes when the client's event loop next
//! turns after a quarantine begins or ends.
//!
//! # Spans
//!
//! One `DEBUG` span named `redlock` per operation, with fields `op`
//! (`acquire`, `extend`, `release`, `acquire_batch`, `release_batch`),
//! `resource` (the first key, as `b"..."`) and `outcome` (as above, recorded when it
//! ends). [`Redlock`](crate::Redlock) enters it while the operation runs on
//! the caller's thread; the shared client's loop keeps it open from the
//! operation's start to its end.
//!
//! [`Error`]: crate::Error
//! [`Cause`]: crate::Cause
//! [`LostReason`]: crate::LostReason

use std::time::Instant;

use crate::addr::ServerAddr;
use crate::conn::{Cause, Conn};
use crate::error::Error;
#[cfg(any(feature = "metrics", feature = "tracing"))]
use crate::quorum::Vote;

#[cfg(feature = "metrics")]
use metrics::{Key, Label, Level, Metadata, SharedString};

#[cfg(feature = "metrics")]
const ACQUIRES: &str = "redlock_acquires_total";
#[cfg(feature = "metrics")]
const ACQUIRE_DURATION: &str = "redlock_acquire_duration_seconds";
#[cfg(feature = "metrics")]
const ACQUIRE_WAIT: &str = "redlock_acquire_wait_seconds";
#[cfg(feature = "metrics")]
const ACQUIRE_ATTEMPTS: &str = "redlock_acquire_attempts";
#[cfg(feature = "metrics")]
const EXTENDS: &str = "redlock_extends_total";
#[cfg(feature = "metrics")]
const RELEASES: &str = "redlock_releases_total";
#[cfg(feature = "metrics")]
const HELD: &str = "redlock_locks_held";
#[cfg(feature = "metrics")]
const LOST: &str = "redlock_locks_lost_total";
#[cfg(feature = "metrics")]
const MASTER_FAILURES: &str = "redlock_master_failures_total";
#[cfg(feature = "metrics")]
const MASTER_QUARANTINED: &str = "redlock_master_quarantined";
#[cfg(feature = "metrics")]
const SUBSCRIBE_REFUSED: &str = "redlock_subscribe_refused_total";
#[cfg(feature = "metrics")]
const NOSCRIPT_RECOVERIES: &str = "redlock_noscript_recoveries_total";
#[cfg(feature = "metrics")]
const NATIVE_REFUSED: &str = "redlock_native_refused_total";
#[cfg(feature = "metrics")]
const REQUESTS: &str = "redlock_requests_total";
#[cfg(feature = "metrics")]
static REQUESTS_VIA: [[Label; 1]; 5] = [
    [Label::from_static_parts("via", "set_nx")],
    [Label::from_static_parts("via", "script")],
    [Label::from_static_parts("via", "delifeq")],
    [Label::from_static_parts("via", "delex")],
    [Label::from_static_parts("via", "set_ifeq")],
];
/// `redlock_requests_total` per `via`, in `Form::LABELS` order.
#[cfg(feature = "metrics")]
static REQUESTS_BY_FORM: [Key; 5] = [
    Key::from_static_parts(REQUESTS, &REQUESTS_VIA[0]),
    Key::from_static_parts(REQUESTS, &REQUESTS_VIA[1]),
    Key::from_static_parts(REQUESTS, &REQUESTS_VIA[2]),
    Key::from_static_parts(REQUESTS, &REQUESTS_VIA[3]),
    Key::from_static_parts(REQUESTS, &REQUESTS_VIA[4]),
];

/// How an operation ended, as the `outcome` (or `reason`) label says it.
#[cfg(any(feature = "metrics", feature = "tracing"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Held,
    NotHeld,
    /// Not held: the key was gone on the masters that said so (see
    /// [`Vote::Gone`]).
    Gone,
    NoQuorum,
    Denied,
    Protocol,
    ValidityExpired,
    FenceUnknown,
    FenceRefused,
    ExtensionLimit,
    Config,
    Os,
    /// A kept lock's validity ran out before the keeper could act (losses
    /// only).
    Expired,
}

#[cfg(any(feature = "metrics", feature = "tracing"))]
impl Outcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn of<T>(result: &Result<T, Error>) -> Outcome {
        match result {
            Ok(_) => Outcome::Ok,
            Err(error) => Outcome::of_error(error),
        }
    }

    fn of_error(error: &Error) -> Outcome {
        match error {
            Error::Held(_) => Outcome::Held,
            // Every refusal found no key: an extend by the masters' own
            // `SET ... IFEQ ... GET` tells a lock that expired from one
            // another client took (`not_held`, or where it cannot tell).
            Error::NotHeld(failure)
                if failure.votes.iter().any(|v| v.vote == Vote::Gone)
                    && !failure.votes.iter().any(|v| v.vote == Vote::Refused) =>
            {
                Outcome::Gone
            }
            Error::NotHeld(_) => Outcome::NotHeld,
            Error::NoQuorum(_) => Outcome::NoQuorum,
            Error::Denied(_) => Outcome::Denied,
            Error::Protocol(_) => Outcome::Protocol,
            Error::ValidityExpired(_) => Outcome::ValidityExpired,
            Error::FenceUnknown { .. } => Outcome::FenceUnknown,
            Error::FenceRefused(_) => Outcome::FenceRefused,
            Error::ExtensionLimit(_) => Outcome::ExtensionLimit,
            Error::Config(_) => Outcome::Config,
            Error::Os(_) | Error::Stopped(_) | Error::Internal(_) => Outcome::Os,
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn of_loss(loss: Loss<'_>) -> Outcome {
        match loss {
            Loss::Failed(error) => Outcome::of_error(error),
            Loss::ExtensionLimit => Outcome::ExtensionLimit,
            Loss::Expired => Outcome::Expired,
        }
    }

    /// The label value (the keys below spell the same values).
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Held => "held",
            Outcome::NotHeld => "not_held",
            Outcome::Gone => "gone",
            Outcome::NoQuorum => "no_quorum",
            Outcome::Denied => "denied",
            Outcome::Protocol => "protocol",
            Outcome::ValidityExpired => "validity_expired",
            Outcome::FenceUnknown => "fence_unknown",
            Outcome::FenceRefused => "fence_refused",
            Outcome::ExtensionLimit => "extension_limit",
            Outcome::Config => "config",
            Outcome::Os => "os",
            Outcome::Expired => "expired",
        }
    }
}

/// A `&'static Key` made at compile time from a static name and at most
/// one static label: recording with it allocates nothing.
#[cfg(feature = "metrics")]
macro_rules! static_key {
    ($name:expr) => {{
        static KEY: Key = Key::from_static_name($name);
        &KEY
    }};
    ($name:expr, $label:literal => $value:literal) => {{
        static LABELS: [Label; 1] = [Label::from_static_parts($label, $value)];
        static KEY: Key = Key::from_static_parts($name, &LABELS);
        &KEY
    }};
}

/// The static key of metric `$name` for an [`Outcome`], under label
/// `$label`. The values are [`Outcome::label`]'s (a test checks).
#[cfg(feature = "metrics")]
macro_rules! outcome_key {
    ($name:expr, $label:literal, $outcome:expr) => {
        match $outcome {
            Outcome::Ok => static_key!($name, $label => "ok"),
            Outcome::Held => static_key!($name, $label => "held"),
            Outcome::NotHeld => static_key!($name, $label => "not_held"),
            Outcome::Gone => static_key!($name, $label => "gone"),
            Outcome::NoQuorum => static_key!($name, $label => "no_quorum"),
            Outcome::Denied => static_key!($name, $label => "denied"),
            Outcome::Protocol => static_key!($name, $label => "protocol"),
            Outcome::ValidityExpired => static_key!($name, $label => "validity_expired"),
            Outcome::FenceUnknown => static_key!($name, $label => "fence_unknown"),
            Outcome::FenceRefused => static_key!($name, $label => "fence_refused"),
            Outcome::ExtensionLimit => static_key!($name, $label => "extension_limit"),
            Outcome::Config => static_key!($name, $label => "config"),
            Outcome::Os => static_key!($name, $label => "os"),
            Outcome::Expired => static_key!($name, $label => "expired"),
        }
    };
}

/// Where the metrics say they come from.
#[cfg(feature = "metrics")]
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Runs `record`, which calls the application's recorder or subscriber:
/// a panic there is the application's, caught here (its panic hook still
/// reports it), so that it costs a metric, never the event loop that every
/// caller of the client waits on.
#[cfg(any(feature = "metrics", feature = "tracing"))]
#[inline(always)]
fn guarded<T>(record: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(record)).ok()
}

#[cfg(feature = "metrics")]
fn counter(key: &Key) -> metrics::Counter {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA))
}

#[cfg(feature = "metrics")]
fn gauge(key: &Key) -> metrics::Gauge {
    metrics::with_recorder(|r| r.register_gauge(key, &METADATA))
}

#[cfg(feature = "metrics")]
fn histogram(key: &Key) -> metrics::Histogram {
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA))
}

/// An acquire ended with `result`: it started at `first`, its last attempt
/// at `last` (if one was made), it made `attempts`, and its result was
/// taken at `now`.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline(always)]
pub(crate) fn acquired<T>(
    result: &Result<T, Error>,
    first: Instant,
    last: Option<Instant>,
    attempts: u32,
    now: Instant,
) {
    #[cfg(feature = "metrics")]
    guarded(|| {
        let outcome = Outcome::of(result);
        counter(outcome_key!(ACQUIRES, "outcome", outcome)).increment(1);
        let duration = now.saturating_duration_since(first);
        histogram(outcome_key!(ACQUIRE_DURATION, "outcome", outcome))
            .record(duration.as_secs_f64());
        histogram(outcome_key!(ACQUIRE_ATTEMPTS, "outcome", outcome)).record(f64::from(attempts));
        if outcome == Outcome::Ok {
            let wait = last.map_or(duration, |at| at.saturating_duration_since(first));
            histogram(static_key!(ACQUIRE_WAIT)).record(wait.as_secs_f64());
            gauge(static_key!(HELD)).increment(1.0);
        }
    });
}

/// An extension ended with `result`.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline(always)]
pub(crate) fn extended(result: &Result<(), Error>) {
    #[cfg(feature = "metrics")]
    guarded(|| counter(outcome_key!(EXTENDS, "outcome", Outcome::of(result))).increment(1));
}

/// A release ended with `result`: the lock is not held any more, however
/// it ended.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline(always)]
pub(crate) fn released(result: &Result<(), Error>) {
    #[cfg(feature = "metrics")]
    guarded(|| {
        counter(outcome_key!(RELEASES, "outcome", Outcome::of(result))).increment(1);
        gauge(static_key!(HELD)).decrement(1.0);
    });
}

/// The loop released `count` locks that an acquire took for a caller who
/// went away (no release job, nobody waits for the outcome).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline(always)]
pub(crate) fn released_unclaimed(count: usize) {
    #[cfg(feature = "metrics")]
    guarded(|| gauge(static_key!(HELD)).decrement(count as f64));
}

/// Why the watchdog gave a kept lock up, as the `reason` label says it.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum Loss<'a> {
    /// An extension failed with this error.
    Failed(&'a Error),
    /// The extension cap was reached.
    ExtensionLimit,
    /// The validity ran out before the keeper could act.
    Expired,
}

/// The watchdog gave a kept lock up.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline(always)]
pub(crate) fn lost(loss: Loss<'_>) {
    #[cfg(feature = "metrics")]
    guarded(|| counter(outcome_key!(LOST, "reason", Outcome::of_loss(loss))).increment(1));
}

/// A master refused to subscribe this client to release notifications
/// (`-NOPERM`: the user has no rights on the `redlock:released:*`
/// channels), `first` time for that master on this connection: its
/// waiters fall back on the holder's expiry. Counted each time; warned
/// once per master (feature `tracing`).
#[inline(always)]
pub(crate) fn subscribe_refused(first: bool, reply: &[u8]) {
    let _ = (first, reply);
    #[cfg(feature = "metrics")]
    guarded(|| counter(static_key!(SUBSCRIBE_REFUSED)).increment(1));
    #[cfg(feature = "tracing")]
    if first {
        guarded(|| {
            tracing::warn!(
                reply = %String::from_utf8_lossy(reply),
                "a master refuses release notifications (grant the user &redlock:released:*): \
                 waiters there wait for the holder's expiry"
            );
        });
    }
}

/// A connection recovered from `-NOSCRIPT` (after `SCRIPT FLUSH` or a
/// restart): `script_load` times by SCRIPT LOAD and EVALSHA again, `eval`
/// times by EVAL (SCRIPT LOAD refused, or did not take).
#[inline(always)]
pub(crate) fn noscript_recovered(script_load: u64, eval: u64) {
    let _ = (script_load, eval);
    #[cfg(feature = "metrics")]
    if script_load > 0 || eval > 0 {
        guarded(|| {
            counter(static_key!(NOSCRIPT_RECOVERIES, "via" => "script_load"))
                .increment(script_load);
            counter(static_key!(NOSCRIPT_RECOVERIES, "via" => "eval")).increment(eval);
        });
    }
}

/// A connection answered `count` requests with the script after its master
/// refused a command of its own it had advertised (see
/// [`Capabilities`](crate::Capabilities)).
#[inline(always)]
pub(crate) fn native_refused(count: u64) {
    let _ = count;
    #[cfg(feature = "metrics")]
    if count > 0 {
        guarded(|| counter(static_key!(NATIVE_REFUSED)).increment(count));
    }
}

/// A connection sent `sent[i]` requests the way `Form::LABELS[i]` names
/// (the plain acquire's `SET NX`, a script, or a master's own command).
#[inline(always)]
pub(crate) fn requests_sent(sent: &[u64; 5]) {
    let _ = sent;
    #[cfg(feature = "metrics")]
    guarded(|| {
        for (i, &count) in sent.iter().enumerate() {
            if count > 0 {
                counter(&REQUESTS_BY_FORM[i]).increment(count);
            }
        }
    });
}

/// The label of each kind of [`Cause`], in [`cause_index`] order.
#[cfg(any(test, feature = "metrics"))]
const CAUSES: [&str; 17] = [
    "timeout",
    "resolve",
    "resolving",
    "connect",
    "connect_timeout",
    "backoff",
    "io",
    "closed",
    "tls",
    "protocol",
    "unsolicited",
    "stalled",
    "too_far_behind",
    "handshake",
    "server",
    "quarantined",
    "same_server",
];

#[cfg(any(test, feature = "metrics"))]
fn cause_index(cause: &Cause) -> usize {
    match cause {
        Cause::Timeout => 0,
        Cause::Resolve => 1,
        Cause::Resolving => 2,
        Cause::Connect(_) => 3,
        Cause::ConnectTimeout => 4,
        Cause::Backoff(_) => 5,
        Cause::Io(_) => 6,
        Cause::Closed => 7,
        Cause::Tls(_) => 8,
        Cause::Protocol(_) | Cause::NotRedis(..) => 9,
        Cause::Unsolicited => 10,
        Cause::Stalled => 11,
        Cause::TooFarBehind => 12,
        Cause::Handshake(..) => 13,
        Cause::Server(_) => 14,
        Cause::Quarantined(_) => 15,
        Cause::SameServer(_) => 16,
    }
}

/// The per-master metrics of one engine: their keys, made once when the
/// client is built (the `master` label is the master's URL, an `Arc<str>`
/// shared by its keys), and each master's quarantine state as last
/// reported. Empty without the `metrics` feature.
#[derive(Debug, Default)]
pub(crate) struct Masters {
    /// `redlock_master_failures_total`, per master then per cause kind.
    #[cfg(feature = "metrics")]
    failures: Vec<Key>,
    /// `redlock_master_quarantined`, per master.
    #[cfg(feature = "metrics")]
    quarantine: Vec<Key>,
    /// Whether this client counts each master in the quarantine gauge.
    #[cfg(feature = "metrics")]
    quarantined: Vec<bool>,
}

impl Masters {
    /// The keys for `servers`: 18 per master (one per cause kind, and the
    /// quarantine gauge's), each a small shared allocation, made here once
    /// with the `metrics` feature; nothing without.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    #[inline(always)]
    pub(crate) fn new(servers: &[ServerAddr]) -> Masters {
        #[cfg(feature = "metrics")]
        let masters = {
            let mut masters = Masters::default();
            for server in servers {
                let name = SharedString::from_shared(std::sync::Arc::from(server.to_string()));
                let master = || Label::new("master", name.clone());
                for cause in CAUSES {
                    let labels = vec![master(), Label::from_static_parts("cause", cause)];
                    // Retained: its labels shared, so that no clone copies.
                    masters
                        .failures
                        .push(Key::from_parts(MASTER_FAILURES, labels).to_retained());
                }
                let key = Key::from_parts(MASTER_QUARANTINED, vec![master()]);
                masters.quarantine.push(key.to_retained());
                masters.quarantined.push(false);
            }
            masters
        };
        #[cfg(not(feature = "metrics"))]
        let masters = Masters::default();
        masters
    }

    /// Master `i`'s connection failed with `cause`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    #[inline(always)]
    pub(crate) fn handle_failure(&self, i: usize, cause: &Cause) {
        #[cfg(feature = "metrics")]
        if let Some(key) = self.failures.get(i * CAUSES.len() + cause_index(cause)) {
            guarded(|| counter(key).increment(1));
        }
    }

    /// Reports the masters whose restart quarantine began or ended since
    /// the last call, as `conns` say at `now`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    #[inline(always)]
    pub(crate) fn observe_quarantine(&mut self, conns: &[Conn], now: Instant) {
        #[cfg(feature = "metrics")]
        for ((conn, key), counted) in conns
            .iter()
            .zip(&self.quarantine)
            .zip(&mut self.quarantined)
        {
            let quarantined = conn.quarantined_until().is_some_and(|until| until > now);
            if quarantined != *counted {
                *counted = quarantined;
                guarded(|| {
                    let gauge = gauge(key);
                    if quarantined {
                        gauge.increment(1.0);
                    } else {
                        gauge.decrement(1.0);
                    }
                });
            }
        }
    }
}

#[cfg(feature = "metrics")]
impl Drop for Masters {
    /// A client that goes away stops counting its masters as quarantined.
    fn drop(&mut self) {
        for (key, counted) in self.quarantine.iter().zip(&self.quarantined) {
            if *counted {
                guarded(|| gauge(key).decrement(1.0));
            }
        }
    }
}

/// One operation's span (feature `tracing`); empty without it.
#[derive(Debug)]
pub(crate) struct OpSpan {
    #[cfg(feature = "tracing")]
    span: tracing::Span,
}

/// An [`OpSpan`] entered until dropped.
#[derive(Debug)]
pub(crate) struct Entered<'a> {
    #[cfg(feature = "tracing")]
    _entered: tracing::span::Entered<'a>,
    #[cfg(not(feature = "tracing"))]
    _span: std::marker::PhantomData<&'a OpSpan>,
}

impl OpSpan {
    /// A `DEBUG` span for operation `op` on `resource` (its first, for
    /// several), which is about to start.
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    #[inline(always)]
    pub(crate) fn new(op: &'static str, resource: Option<&bytes::Bytes>) -> OpSpan {
        #[cfg(feature = "tracing")]
        let span = {
            let span = guarded(|| {
                tracing::debug_span!(
                    "redlock",
                    op,
                    resource = resource.map(tracing::field::debug),
                    outcome = tracing::field::Empty
                )
            });
            OpSpan {
                span: span.unwrap_or_else(tracing::Span::none),
            }
        };
        #[cfg(not(feature = "tracing"))]
        let span = OpSpan {};
        span
    }

    /// Enters the span until the guard is dropped.
    #[inline(always)]
    pub(crate) fn enter(&self) -> Entered<'_> {
        Entered {
            #[cfg(feature = "tracing")]
            _entered: self.span.enter(),
            #[cfg(not(feature = "tracing"))]
            _span: std::marker::PhantomData,
        }
    }

    /// Records how the operation ended: `failure`, its first error (a
    /// batch's outcome is its first failure's), or none for `ok`. The span
    /// closes when dropped.
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    #[inline(always)]
    pub(crate) fn record(&self, failure: Option<&Error>) {
        #[cfg(feature = "tracing")]
        {
            let outcome = failure.map_or(Outcome::Ok, Outcome::of_error);
            guarded(|| self.span.record("outcome", outcome.label()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The label each cause kind is counted under.
    #[test]
    fn each_cause_kind_has_its_own_label() {
        use crate::conn::HandshakeStep;
        use std::io::ErrorKind;
        use std::time::Duration;
        let cases: [(Cause, &str); 8] = [
            (Cause::Timeout, "timeout"),
            (Cause::Connect(ErrorKind::ConnectionRefused), "connect"),
            (Cause::Io(ErrorKind::BrokenPipe), "io"),
            (Cause::Closed, "closed"),
            (Cause::Stalled, "stalled"),
            (Cause::TooFarBehind, "too_far_behind"),
            (
                Cause::Handshake(HandshakeStep::Auth, bytes::Bytes::new()),
                "handshake",
            ),
            (Cause::Quarantined(Duration::from_secs(1)), "quarantined"),
        ];
        for (cause, label) in cases {
            assert_eq!(CAUSES[cause_index(&cause)], label, "{cause}");
        }
        let mut labels = CAUSES.to_vec();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), CAUSES.len(), "labels are distinct");
    }

    /// An extend refused only by masters that found the key gone reads
    /// `gone`; one refused by any master that holds another token, or by
    /// scripts that cannot tell, `not_held`.
    #[cfg(any(feature = "metrics", feature = "tracing"))]
    #[test]
    fn an_extend_that_found_the_key_gone_is_told_apart() {
        use crate::error::{Failure, MasterVote};
        let failure = |votes: &[Vote]| {
            Error::NotHeld(Failure {
                quorum: 2,
                granted: 0,
                refused: votes.len(),
                votes: votes
                    .iter()
                    .map(|v| MasterVote {
                        server: "redis://m".into(),
                        vote: v.clone(),
                    })
                    .collect(),
                elapsed: std::time::Duration::ZERO,
                attempts: 1,
                held_by_this_client: None,
            })
        };
        let cases = [
            (vec![Vote::Gone, Vote::Gone, Vote::Pending], Outcome::Gone),
            (
                vec![Vote::Gone, Vote::Refused, Vote::Gone],
                Outcome::NotHeld,
            ),
            (vec![Vote::Refused, Vote::Refused], Outcome::NotHeld),
        ];
        for (votes, want) in cases {
            assert_eq!(Outcome::of_error(&failure(&votes)), want, "{votes:?}");
        }
    }

    /// The static keys spell the labels [`Outcome::label`] gives.
    #[cfg(feature = "metrics")]
    #[test]
    fn every_outcome_key_carries_its_label() {
        let all = [
            Outcome::Ok,
            Outcome::Held,
            Outcome::NotHeld,
            Outcome::Gone,
            Outcome::NoQuorum,
            Outcome::Denied,
            Outcome::Protocol,
            Outcome::ValidityExpired,
            Outcome::FenceUnknown,
            Outcome::FenceRefused,
            Outcome::ExtensionLimit,
            Outcome::Config,
            Outcome::Os,
            Outcome::Expired,
        ];
        for outcome in all {
            let key = outcome_key!(ACQUIRES, "outcome", outcome);
            let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
            assert_eq!(labels, [("outcome", outcome.label())]);
            let key = outcome_key!(LOST, "reason", outcome);
            assert_eq!(key.labels().next().map(Label::value), Some(outcome.label()));
        }
    }
}
