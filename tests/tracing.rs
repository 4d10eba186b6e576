//! The `tracing` feature against real masters: a subscriber installed for
//! this test binary keeps every span, and the test reads the `redlock`
//! spans of known operations, on both clients: their `op`, `resource`
//! and `outcome`, and their level.

mod common;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use common::cluster;
use redlock_mio::{Config, Error, Redlock, SharedRedlock};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One span as the subscriber saw it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    name: &'static str,
    level: Level,
    fields: HashMap<&'static str, String>,
}

/// Keeps every span, by id.
struct Keeping {
    spans: &'static Mutex<Vec<Seen>>,
}

struct Fields<'a>(&'a mut HashMap<&'static str, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Subscriber for Keeping {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = HashMap::new();
        span.record(&mut Fields(&mut fields));
        let mut spans = lock(self.spans);
        spans.push(Seen {
            name: span.metadata().name(),
            level: *span.metadata().level(),
            fields,
        });
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut spans = lock(self.spans);
        if let Some(seen) = usize::try_from(span.into_u64() - 1)
            .ok()
            .and_then(|i| spans.get_mut(i))
        {
            values.record(&mut Fields(&mut seen.fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// The spans seen so far, the subscriber installed on first use.
fn spans() -> &'static Mutex<Vec<Seen>> {
    static SPANS: OnceLock<&'static Mutex<Vec<Seen>>> = OnceLock::new();
    SPANS.get_or_init(|| {
        let spans: &'static Mutex<Vec<Seen>> = Box::leak(Box::default());
        let subscriber = Keeping { spans };
        tracing::subscriber::set_global_default(subscriber)
            .unwrap_or_else(|e| panic!("a subscriber is installed already: {e}"));
        spans
    })
}

/// The `redlock` spans of `resource`, as `(op, outcome)`.
fn ops(resource: &str) -> Vec<(String, String)> {
    let quoted = format!("b\"{resource}\"");
    lock(spans())
        .iter()
        .filter(|s| s.name == "redlock" && s.fields.get("resource") == Some(&quoted))
        .inspect(|s| assert_eq!(s.level, Level::DEBUG, "{s:?}"))
        .map(|s| {
            let field = |name| s.fields.get(name).cloned().unwrap_or_default();
            (field("op"), field("outcome"))
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// Settings for masters the test started empty: no restart quarantine (no
/// lock predates them), generous limits for a loaded machine.
fn config(urls: &[String]) -> Config {
    let mut config = Config::new(urls).unwrap_or_else(|e| panic!("{e}"));
    config.quarantine = None;
    config.per_instance_timeout = Duration::from_millis(300);
    config
}

#[test]
fn each_operation_has_a_debug_span_with_its_op_resource_and_outcome() {
    spans();
    let masters = cluster(3);
    let ttl = Duration::from_secs(10);

    let mut redlock = Redlock::new(config(&masters.urls())).unwrap_or_else(|e| panic!("{e}"));
    let mut lock = redlock
        .try_acquire("trace:single", ttl)
        .unwrap_or_else(|e| panic!("{e}"));
    let got = redlock.try_acquire("trace:single", ttl);
    assert!(matches!(got, Err(Error::Held(_))), "{got:?}");
    redlock
        .extend(&mut lock, ttl)
        .unwrap_or_else(|e| panic!("{e}"));
    redlock.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    let got = redlock.release(&lock);
    assert!(matches!(got, Err(Error::NotHeld(_))), "{got:?}");
    assert_eq!(
        ops("trace:single"),
        pairs(&[
            ("acquire", "ok"),
            ("acquire", "held"),
            ("extend", "ok"),
            ("release", "ok"),
            ("release", "not_held"),
        ])
    );

    // The shared client: on the caller's thread, and on its loop.
    let shared = SharedRedlock::new(config(&masters.urls())).unwrap_or_else(|e| panic!("{e}"));
    let lock = shared
        .acquire("trace:shared", ttl)
        .unwrap_or_else(|e| panic!("{e}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let got = runtime.block_on(shared.try_acquire_async("trace:shared", ttl));
    assert!(matches!(got, Err(Error::Held(_))), "{got:?}");
    runtime
        .block_on(shared.release_async(&lock))
        .unwrap_or_else(|e| panic!("{e}"));
    let results = shared
        .try_acquire_batch(["trace:batch", "trace:other"], ttl)
        .unwrap_or_else(|e| panic!("{e}"));
    let locks: Vec<_> = results.into_iter().flatten().collect();
    assert!(shared.release_batch(&locks).iter().all(Result::is_ok));
    assert_eq!(
        ops("trace:shared"),
        pairs(&[("acquire", "ok"), ("acquire", "held"), ("release", "ok")])
    );
    assert_eq!(
        ops("trace:batch"),
        pairs(&[("acquire_batch", "ok"), ("release_batch", "ok")])
    );
}
