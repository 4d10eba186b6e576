//! The RESP2 codec on what a lock client sends and receives: `SET NX PX`
//! and `EVALSHA` out; `+OK`, a null bulk, `:1`, `:0`, `-NOSCRIPT` and a
//! token-sized bulk back, alone and pipelined.
//!
//! Each parse fixture is measured twice, once in a group whose throughput
//! counts replies and once in a group that counts bytes, so that reports
//! read in replies/s and in bytes/s; the encoders likewise in commands/s
//! and bytes/s.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use redlock_mio::resp::{Arg, Limits, Reply, Status, decode, encode_command, parse};

/// A lock token as `SET` stores it: 40 bytes.
const TOKEN: &[u8; 40] = b"8f14e45fceea167a5a36dedd4bea2543a1b2c3d4";
/// The SHA1 hex of a release script, as `EVALSHA` names it.
const SHA: &[u8; 40] = b"e0e1f9fabfc9d4800c877a703b823ac0578ff831";
const KEY: &[u8] = b"lock:orders";

/// Single replies: name and wire form.
const REPLIES: &[(&str, &[u8])] = &[
    ("ok", b"+OK\r\n"),
    ("nil_bulk", b"$-1\r\n"),
    ("integer_one", b":1\r\n"),
    ("integer_zero", b":0\r\n"),
    (
        "noscript",
        b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    ),
    (
        "bulk_40",
        b"$40\r\n8f14e45fceea167a5a36dedd4bea2543a1b2c3d4\r\n",
    ),
];

/// All of the above, back to back, as one read might deliver them.
const PIPELINE: &[u8] = b"+OK\r\n$-1\r\n:1\r\n:0\r\n\
    -NOSCRIPT No matching script. Please use EVAL.\r\n\
    $40\r\n8f14e45fceea167a5a36dedd4bea2543a1b2c3d4\r\n";
const PIPELINE_REPLIES: u64 = 6;

fn set_nx_px(dst: &mut BytesMut) {
    encode_command(
        dst,
        &[
            Arg::Bytes(b"SET"),
            Arg::Bytes(KEY),
            Arg::Bytes(TOKEN),
            Arg::Bytes(b"NX"),
            Arg::Bytes(b"PX"),
            Arg::Int(30_000),
        ],
    );
}

fn evalsha(dst: &mut BytesMut) {
    encode_command(
        dst,
        &[
            Arg::Bytes(b"EVALSHA"),
            Arg::Bytes(SHA),
            Arg::Int(1),
            Arg::Bytes(KEY),
            Arg::Bytes(TOKEN),
        ],
    );
}

type Encoder = fn(&mut BytesMut);
const COMMANDS: &[(&str, Encoder)] = &[("set_nx_px", set_nx_px), ("evalsha", evalsha)];

/// Decodes every reply off `buf`, as a connection does after a read.
fn decode_all(buf: &mut BytesMut, limits: &Limits) -> u64 {
    let mut n = 0;
    while let Some(reply) = decode(buf, limits).expect("fixture is valid RESP") {
        black_box(reply);
        n += 1;
    }
    n
}

/// Fails fast, also under `--test`, if a fixture stops being what its name
/// says.
fn check_fixtures(limits: &Limits) {
    for (name, wire) in REPLIES {
        let parsed = parse(&Bytes::from_static(wire), limits);
        assert!(
            matches!(parsed, Ok(Status::Complete { used, .. }) if used == wire.len()),
            "{name}: {parsed:?}"
        );
    }
    let mut buf = BytesMut::from(PIPELINE);
    assert_eq!(decode_all(&mut buf, limits), PIPELINE_REPLIES);
    assert!(buf.is_empty());
    for (name, encode) in COMMANDS {
        let mut cmd = BytesMut::new();
        encode(&mut cmd);
        let parsed = parse(&cmd.freeze(), limits);
        assert!(
            matches!(
                parsed,
                Ok(Status::Complete {
                    value: Reply::Array(_),
                    ..
                })
            ),
            "{name}: {parsed:?}"
        );
    }
}

fn bench_parse(c: &mut Criterion) {
    let limits = Limits::default();
    check_fixtures(&limits);
    for (group_name, per_reply) in [("parse/replies", true), ("parse/bytes", false)] {
        let mut group = c.benchmark_group(group_name);
        for (name, wire) in REPLIES {
            group.throughput(if per_reply {
                Throughput::Elements(1)
            } else {
                Throughput::Bytes(wire.len() as u64)
            });
            let src = Bytes::from_static(wire);
            group.bench_function(*name, |b| b.iter(|| parse(black_box(&src), &limits)));
        }
        group.throughput(if per_reply {
            Throughput::Elements(PIPELINE_REPLIES)
        } else {
            Throughput::Bytes(PIPELINE.len() as u64)
        });
        // One read buffer, refilled each iteration and drained by `decode`,
        // as a connection reuses its buffer.
        let mut buf = BytesMut::with_capacity(PIPELINE.len());
        group.bench_function("pipeline_decode", |b| {
            b.iter(|| {
                buf.extend_from_slice(black_box(PIPELINE));
                decode_all(&mut buf, &limits)
            })
        });
        group.finish();
    }
}

fn bench_encode(c: &mut Criterion) {
    for (group_name, per_command) in [("encode/commands", true), ("encode/bytes", false)] {
        let mut group = c.benchmark_group(group_name);
        for (name, encode) in COMMANDS {
            let mut dst = BytesMut::new();
            encode(&mut dst);
            group.throughput(if per_command {
                Throughput::Elements(1)
            } else {
                Throughput::Bytes(dst.len() as u64)
            });
            group.bench_function(*name, |b| {
                b.iter(|| {
                    dst.clear();
                    encode(black_box(&mut dst));
                    dst.len()
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_parse, bench_encode);
criterion_main!(benches);
