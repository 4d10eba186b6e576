//! The codec and the harness together against one real master, over a plain
//! blocking socket: the single-instance primitives of the spec behave as
//! the lock engine will expect them to.

mod common;

use common::{bulk, connect, master};
use redlock_mio::resp::{Arg, Reply};

/// The compare-and-delete release script of the spec, verbatim.
const RELEASE: &str = r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end"#;

#[test]
fn set_nx_takes_a_free_key_once_and_get_returns_the_token() {
    let server = master();
    let mut c = connect(&server);
    let set = |token: &'static str| -> [Arg<'static>; 6] {
        [
            "SET".into(),
            "k".into(),
            token.into(),
            "NX".into(),
            "PX".into(),
            Arg::Int(10_000),
        ]
    };
    assert!(c.cmd(&set("tok")).is_ok(), "a free key is taken");
    assert_eq!(c.cmd(&set("other")), Reply::Nil, "a held key is refused");
    assert_eq!(c.cmd(&["GET".into(), "k".into()]), bulk("tok"));
}

#[test]
fn the_release_script_deletes_only_with_the_right_token() {
    let server = master();
    let mut c = connect(&server);
    let setup = c.cmd(&[
        "SET".into(),
        "k".into(),
        "tok".into(),
        "NX".into(),
        "PX".into(),
        Arg::Int(10_000),
    ]);
    assert!(setup.is_ok(), "{setup:?}");
    let release = |token: &'static str| -> [Arg<'static>; 5] {
        [
            "EVAL".into(),
            RELEASE.into(),
            Arg::Int(1),
            "k".into(),
            token.into(),
        ]
    };

    assert_eq!(c.cmd(&release("wrong")), Reply::Integer(0));
    assert_eq!(
        c.cmd(&["GET".into(), "k".into()]),
        bulk("tok"),
        "a wrong token leaves the key"
    );

    assert_eq!(c.cmd(&release("tok")), Reply::Integer(1));
    assert_eq!(
        c.cmd(&["GET".into(), "k".into()]),
        Reply::Nil,
        "the right token deletes the key"
    );
}

#[test]
fn evalsha_of_an_unknown_script_is_a_noscript_error_reply() {
    let server = master();
    let mut c = connect(&server);
    let reply = c.cmd(&["EVALSHA".into(), [b'0'; 40][..].into(), Arg::Int(0)]);
    assert!(reply.is_error_code(b"NOSCRIPT"), "{reply:?}");
    // The connection is still usable: an error reply is a value.
    assert_eq!(c.cmd(&["PING".into()]), common::status("PONG"));
}
