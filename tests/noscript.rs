//! Recovery from `-NOSCRIPT` against real masters:
//! after `SCRIPT FLUSH`, a long-lived client loads its script again with
//! `SCRIPT LOAD` and sends the `EVALSHA` again, in one round trip, rather
//! than running it by `EVAL`: since Redis 7.4 scripts created by EVAL live
//! in an LRU that other clients' EVALs evict, and the client would pay a
//! NOSCRIPT round again after every burst of them.

mod common;

use std::time::Duration;

use common::{cluster, command_calls as calls, connect, script_loaded as loaded, shared_config};
use redlock_mio::resp::{Arg, Reply};
use redlock_mio::script::RELEASE_SOURCE;
use redlock_mio::script::Script;
use redlock_mio::{Redlock, SharedRedlock};
use redlock_test::Cluster;

const TTL: Duration = Duration::from_secs(30);

fn flush_scripts(masters: &Cluster) {
    for m in masters.iter() {
        assert_eq!(
            connect(m).cmd(&[Arg::Bytes(b"SCRIPT"), Arg::Bytes(b"FLUSH")]),
            Reply::Status("OK".into())
        );
    }
}

#[test]
fn after_script_flush_a_long_lived_client_loads_its_script_again_not_evals_it() {
    let masters = cluster(3);
    let mut config = shared_config(&masters.urls());
    // The release by its script on every server: a master's own
    // compare-and-delete has no NOSCRIPT to recover from.
    config.lock_commands = redlock_mio::LockCommands::Scripts;
    let mut single = Redlock::new(config.clone()).unwrap_or_else(|e| panic!("{e}"));
    let shared = SharedRedlock::new(config).unwrap_or_else(|e| panic!("{e}"));
    let lock = single
        .try_acquire("warm", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    single.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    let lock = shared
        .try_acquire("warm", TTL)
        .unwrap_or_else(|e| panic!("{e}"));
    shared.release(&lock).unwrap_or_else(|e| panic!("{e}"));
    let release = Script::new(RELEASE_SOURCE);
    for round in 0..2 {
        flush_scripts(&masters);
        assert!(masters.iter().all(|m| !loaded(m, &release)));
        let lock = single
            .try_acquire("a", TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        single
            .release(&lock)
            .unwrap_or_else(|e| panic!("round {round}: release after SCRIPT FLUSH: {e}"));
        let lock = shared
            .try_acquire("b", TTL)
            .unwrap_or_else(|e| panic!("{e}"));
        shared
            .release(&lock)
            .unwrap_or_else(|e| panic!("round {round}: shared release after SCRIPT FLUSH: {e}"));
        // Every master's late replies read, so that each has recovered.
        single.settle(Duration::from_secs(10));
    }
    for m in masters.iter() {
        assert!(
            loaded(m, &release),
            "{}: the release script is loaded",
            m.url()
        );
        assert_eq!(
            calls(m, "eval"),
            0,
            "{}: recovered by SCRIPT LOAD and EVALSHA, never by EVAL",
            m.url()
        );
        assert!(calls(m, "script|load") > 0, "{}", m.url());
    }
}
