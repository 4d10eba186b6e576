//! The servers' own lock commands, where a master has them: what each
//! master offers, learned once per connection, and how a release, a quiet
//! cleanup or an extend is written with them.
//!
//! Valkey 9.0 has `DELIFEQ key value`, Redis 8.4 `DELEX key IFEQ value`:
//! the script's compare-and-delete as one command, `:1` when the key held
//! the value and is gone, `:0` otherwise. Both, and Valkey 8.1, have
//! `SET key value IFEQ compare`: with `GET PX ttl`, the extend script's
//! compare-and-pexpire, answering the old value whatever the outcome. A
//! master runs either far cheaper than a Lua script (on a Valkey 9.1.2
//! master here, about 0.6x the CPU per acquire and release), and a user
//! without scripting rights may run them.
//!
//! What a master offers is asked, never inferred from its version (forks
//! and proxies report versions that lie): one `COMMAND DOCS SET DELIFEQ
//! DELEX`, pipelined in the handshake ([`PROBE`]), read by
//! [`Capabilities::from_docs`]. This module owns that reading and the
//! commands' encoding; it sends nothing and decides nothing about rounds:
//! [`Conn`](crate::conn::Conn) picks a request's form from what its master
//! offers, and falls back to the scripts when a master refuses a command it
//! advertised.

use bytes::BytesMut;

use crate::resp::{self, Arg, Limits, Reply};
use crate::script::RELEASE_CHANNEL_PREFIX;

/// The handshake's capability probe: `COMMAND DOCS` for `SET` and the two
/// compare-and-delete commands. A server leaves out the commands it does
/// not know; `SET`'s documented arguments show `IFEQ`.
pub(crate) const PROBE: [&[u8]; 5] = [b"COMMAND", b"DOCS", b"SET", b"DELIFEQ", b"DELEX"];

/// The deepest nesting the probe's reply has on the servers tested (6: a
/// subcommand's argument's arguments), with a margin. Parser limits below
/// this skip the probe, so that a reply within the servers' shape never
/// breaks a connection that the user's limits would otherwise serve.
pub(crate) const PROBE_DEPTH: usize = 8;

/// Whether the probe's reply, as real servers give it (about 2.5 KiB, 6
/// levels deep), fits within `limits`.
pub(crate) fn probe_fits(limits: &Limits) -> bool {
    limits.max_depth >= PROBE_DEPTH
        && limits.max_array_len >= 64
        && limits.max_bulk_len >= 1024
        && limits.max_line_len >= 256
        && limits.max_reply_len >= 32 * 1024
}

/// The lock commands a master offers besides `SET NX PX` and the scripts,
/// as its `COMMAND DOCS` told (see the module's documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Capabilities {
    /// `SET key value IFEQ compare` (Valkey 8.1+, Redis 8.4+): extend
    /// without a script.
    pub set_ifeq: bool,
    /// `DELIFEQ key value` (Valkey 9.0+): release without a script.
    pub delifeq: bool,
    /// `DELEX key IFEQ value` (Redis 8.4+): release without a script.
    pub delex: bool,
}

impl Capabilities {
    /// None: every operation but the plain acquire runs a script.
    pub const NONE: Capabilities = Capabilities {
        set_ifeq: false,
        delifeq: false,
        delex: false,
    };

    /// Reads a reply to `COMMAND DOCS SET DELIFEQ DELEX`: a flat array of
    /// command names, each followed by its documentation. A command the
    /// server does not know is absent; `IFEQ` counts where it appears, as
    /// an argument's token, anywhere in `SET`'s documentation. Anything
    /// else (an error, a proxy's odd answer) offers nothing.
    pub fn from_docs(reply: &Reply) -> Capabilities {
        let mut caps = Capabilities::NONE;
        let Reply::Array(items) = reply else {
            return caps;
        };
        for pair in items.chunks_exact(2) {
            let name = match &pair[0] {
                Reply::Bulk(name) | Reply::Status(name) => &name[..],
                _ => continue,
            };
            if name.eq_ignore_ascii_case(b"delifeq") {
                caps.delifeq = true;
            } else if name.eq_ignore_ascii_case(b"delex") {
                caps.delex = true;
            } else if name.eq_ignore_ascii_case(b"set") {
                caps.set_ifeq = mentions(&pair[1], b"IFEQ");
            }
        }
        caps
    }

    /// Whether a release can go without a script: `DELIFEQ` or `DELEX`.
    pub fn deletes(&self) -> bool {
        self.delifeq || self.delex
    }

    /// The commands offered, by name, for a report: `"DELIFEQ, SET IFEQ"`,
    /// or `"none"`.
    pub fn describe(&self) -> String {
        let names: Vec<&str> = [
            (self.delifeq, "DELIFEQ"),
            (self.delex, "DELEX"),
            (self.set_ifeq, "SET IFEQ"),
        ]
        .into_iter()
        .filter_map(|(has, name)| has.then_some(name))
        .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }
}

/// Whether `word` is one of the strings in `reply`, at any depth.
fn mentions(reply: &Reply, word: &[u8]) -> bool {
    match reply {
        Reply::Bulk(s) | Reply::Status(s) => s[..] == *word,
        Reply::Array(items) => items.iter().any(|item| mentions(item, word)),
        _ => false,
    }
}

/// How a compare-and-delete is written on one master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delete {
    /// `DELIFEQ key token`.
    DelIfEq,
    /// `DELEX key IFEQ token`.
    DelEx,
}

/// Appends the compare-and-delete of `key` by `token`.
pub(crate) fn encode_delete(dst: &mut BytesMut, how: Delete, key: &[u8], token: &[u8]) {
    match how {
        Delete::DelIfEq => resp::encode_command(
            dst,
            &[Arg::Bytes(b"DELIFEQ"), Arg::Bytes(key), Arg::Bytes(token)],
        ),
        Delete::DelEx => resp::encode_command(
            dst,
            &[
                Arg::Bytes(b"DELEX"),
                Arg::Bytes(key),
                Arg::Bytes(b"IFEQ"),
                Arg::Bytes(token),
            ],
        ),
    }
}

/// Appends the release message the release script would publish:
/// `PUBLISH redlock:released:<key> <token>`, or `<token>:<next>` when the
/// release names the process to try next (`next` non-zero).
pub(crate) fn encode_notice(dst: &mut BytesMut, key: &[u8], token: &[u8], next: i64) {
    let mut digits = [0u8; 20];
    let next = if next != 0 {
        resp::format_i64(next, &mut digits)
    } else {
        &[][..]
    };
    let colon: &[u8] = if next.is_empty() { b"" } else { b":" };
    resp::encode_command_iter(
        dst,
        [
            Arg::Bytes(b"PUBLISH"),
            Arg::Parts(&[RELEASE_CHANNEL_PREFIX, key]),
            Arg::Parts(&[token, colon, next]),
        ]
        .into_iter(),
    );
}

/// Appends the extend: `SET key token IFEQ token GET PX ttl`. `PX` always:
/// `SET ... IFEQ` without it would leave the key with no TTL at all.
pub(crate) fn encode_extend(dst: &mut BytesMut, key: &[u8], token: &[u8], ttl_ms: i64) {
    let ttl = if crate::knobs::injected(crate::knobs::Bug::ExtendDropsPx) {
        None
    } else {
        Some(ttl_ms)
    };
    let head = [
        Arg::Bytes(b"SET"),
        Arg::Bytes(key),
        Arg::Bytes(token),
        Arg::Bytes(b"IFEQ"),
        Arg::Bytes(token),
        Arg::Bytes(b"GET"),
    ];
    let tail = ttl.map(|ttl| [Arg::Bytes(b"PX"), Arg::Int(ttl)]);
    resp::encode_command_iter(dst, head.into_iter().chain(tail.into_iter().flatten()));
}

/// What a native extend's reply means: the script's reply for the same
/// outcome, so that the round reads both alike, except that a key found
/// missing is told apart from one another token holds. `GET` answers the
/// old value whatever the outcome: this token's (extended), nil (gone, not
/// created), or another's (taken, left alone). Any other reply is passed
/// on, to be read as the protocol violation it is.
pub(crate) fn read_extend(reply: Reply, token: &[u8]) -> Reply {
    match reply {
        Reply::Bulk(old) if old[..] == *token => Reply::Integer(1),
        Reply::Bulk(_) => Reply::Integer(0),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn arr(items: Vec<Reply>) -> Reply {
        Reply::Array(items)
    }

    fn set_docs(tokens: &[&str]) -> Reply {
        let args = tokens
            .iter()
            .map(|t| {
                arr(vec![
                    bulk("name"),
                    bulk(&t.to_lowercase()),
                    bulk("token"),
                    bulk(t),
                ])
            })
            .collect();
        arr(vec![
            bulk("summary"),
            bulk("Sets the string value of a key. Added the `IFEQ` option."),
            bulk("arguments"),
            arr(vec![arr(vec![
                bulk("name"),
                bulk("condition"),
                bulk("arguments"),
                arr(args),
            ])]),
        ])
    }

    #[test]
    fn capabilities_are_read_from_the_probes_reply() {
        let cases = [
            (
                "Redis 7.0: SET without IFEQ, no delete command",
                arr(vec![bulk("set"), set_docs(&["NX", "XX"])]),
                Capabilities::NONE,
            ),
            (
                "Valkey 8.1: SET IFEQ only",
                arr(vec![bulk("set"), set_docs(&["NX", "XX", "IFEQ"])]),
                Capabilities {
                    set_ifeq: true,
                    ..Capabilities::NONE
                },
            ),
            (
                "Valkey 9.1: SET IFEQ and DELIFEQ",
                arr(vec![
                    bulk("set"),
                    set_docs(&["NX", "IFEQ"]),
                    bulk("delifeq"),
                    arr(vec![bulk("summary"), bulk("x")]),
                ]),
                Capabilities {
                    set_ifeq: true,
                    delifeq: true,
                    delex: false,
                },
            ),
            (
                "Redis 8.4: SET IFEQ and DELEX",
                arr(vec![
                    bulk("set"),
                    set_docs(&["IFEQ", "IFNE"]),
                    bulk("delex"),
                    arr(vec![]),
                ]),
                Capabilities {
                    set_ifeq: true,
                    delifeq: false,
                    delex: true,
                },
            ),
            (
                "the word in prose is no token",
                arr(vec![bulk("set"), set_docs(&["NX"])]),
                Capabilities::NONE,
            ),
            (
                "a refusal offers nothing",
                Reply::Error(Bytes::from_static(b"NOPERM no")),
                Capabilities::NONE,
            ),
            (
                "an odd array offers nothing it does not name",
                arr(vec![Reply::Integer(1), bulk("delifeq")]),
                Capabilities::NONE,
            ),
        ];
        for (name, reply, want) in cases {
            assert_eq!(Capabilities::from_docs(&reply), want, "{name}");
        }
    }

    #[test]
    fn the_commands_are_written_as_the_servers_take_them() {
        let mut out = BytesMut::new();
        encode_delete(&mut out, Delete::DelIfEq, b"k", b"t");
        assert_eq!(&out[..], b"*3\r\n$7\r\nDELIFEQ\r\n$1\r\nk\r\n$1\r\nt\r\n");
        out.clear();
        encode_delete(&mut out, Delete::DelEx, b"k", b"t");
        assert_eq!(
            &out[..],
            b"*4\r\n$5\r\nDELEX\r\n$1\r\nk\r\n$4\r\nIFEQ\r\n$1\r\nt\r\n"
        );
        out.clear();
        encode_extend(&mut out, b"k", b"t", 500);
        assert_eq!(
            &out[..],
            &b"*8\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nt\r\n$4\r\nIFEQ\r\n$1\r\nt\r\n$3\r\nGET\r\n$2\r\nPX\r\n$3\r\n500\r\n"[..]
        );
        out.clear();
        encode_notice(&mut out, b"k", b"t", 0);
        assert_eq!(
            &out[..],
            &b"*3\r\n$7\r\nPUBLISH\r\n$18\r\nredlock:released:k\r\n$1\r\nt\r\n"[..]
        );
        out.clear();
        encode_notice(&mut out, b"k", b"t", 42);
        assert_eq!(
            &out[..],
            &b"*3\r\n$7\r\nPUBLISH\r\n$18\r\nredlock:released:k\r\n$4\r\nt:42\r\n"[..]
        );
    }

    #[test]
    fn an_extends_reply_tells_extended_gone_and_taken_apart() {
        let t = b"tok";
        assert_eq!(read_extend(bulk("tok"), t), Reply::Integer(1));
        assert_eq!(read_extend(bulk("other"), t), Reply::Integer(0));
        assert_eq!(read_extend(Reply::Nil, t), Reply::Nil);
        let err = Reply::Error(Bytes::from_static(b"ERR syntax error"));
        assert_eq!(read_extend(err.clone(), t), err);
    }
}
