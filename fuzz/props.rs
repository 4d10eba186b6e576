//! Properties of the RESP2 codec that must hold for any input, checked by
//! panicking when one does not.
//!
//! This file is the only copy of them: the cargo-fuzz targets in
//! `fuzz_targets/` include it to search for inputs that break a property,
//! and `tests/fuzz_corpus.rs` includes it to replay the committed corpus on
//! every `cargo test`. It checks the codec from outside, through the public
//! API only, and must not depend on anything but `redlock_mio` and `bytes`,
//! so that both builds can compile it.

use std::io::Write as _;

use bytes::{Bytes, BytesMut};
use redlock_mio::resp::{
    Arg, DEPTH_CAP, FrameScan, Limit, Limits, ProtocolError, Reply, Status, decode, decode_resumed,
    encode_command, frame_len, parse,
};

/// Arbitrary bytes, as a server might send them, into the parser.
///
/// For each of several [`Limits`]: `parse` and `frame_len` agree; a
/// complete reply uses at least 3 and at most `data.len()` bytes and obeys
/// the limits; every cut of the input gives `Partial` or the very same
/// answer; `decode` takes exactly the bytes `parse` used; replies taken one
/// after another off the input are the same whether the bytes arrive at
/// once or in chunks, by `decode` or by `decode_resumed` with its scan
/// kept between chunks; and every parsed reply re-encodes to bytes that parse
/// back to it.
pub fn check_parse(data: &[u8]) {
    let seed = fnv1a(data);
    for limits in limit_sets(seed) {
        let first = check_first_reply(data, &limits, seed);
        let whole = check_pipeline(data, &limits, &first);
        check_streamed(data, &limits, &whole, seed);
    }
}

/// An arbitrary command, read from `data` by [`args_from`], through
/// `encode_command` and back through the parser.
///
/// The encoding equals the wire form built independently with `std`
/// formatting, takes one exact reservation, and parses back, with limits
/// set exactly to what it needs, as an array of bulk strings equal to the
/// arguments that uses all of it. One less on any limit is refused with
/// that limit's error.
pub fn check_roundtrip(data: &[u8]) {
    let args = args_from(data);
    let texts: Vec<Vec<u8>> = args
        .iter()
        .map(|arg| match *arg {
            Arg::Bytes(b) => b.to_vec(),
            Arg::Int(n) => n.to_string().into_bytes(),
            Arg::Parts(parts) => parts.concat(),
            _ => unreachable!("args_from makes bytes and integers only"),
        })
        .collect();
    let mut want = Vec::new();
    write!(want, "*{}\r\n", texts.len()).unwrap();
    for text in &texts {
        write!(want, "${}\r\n", text.len()).unwrap();
        want.extend_from_slice(text);
        want.extend_from_slice(b"\r\n");
    }

    let mut dst = BytesMut::new();
    encode_command(&mut dst, &args);
    assert_eq!(&dst[..], &want[..], "wire form of {args:?}");
    // `encode_command` reserves its computed length once; an empty buffer
    // then has exactly that capacity, except that `Vec` never allocates
    // fewer than 8 bytes.
    if dst.len() >= 8 {
        assert_eq!(dst.capacity(), dst.len(), "reserved length of {args:?}");
    }

    // It appends: what was already in the buffer stays.
    let mut appended = BytesMut::from(&b"$-1\r\n"[..]);
    encode_command(&mut appended, &args);
    assert_eq!(&appended[..5], b"$-1\r\n");
    assert_eq!(&appended[5..], &want[..]);

    let wire = dst.freeze();
    let expected = Reply::Array(
        texts
            .iter()
            .map(|text| Reply::Bulk(Bytes::copy_from_slice(text)))
            .collect(),
    );
    let exact = exact_limits(&texts);
    let whole = Status::Complete {
        value: expected.clone(),
        used: wire.len(),
    };
    assert_eq!(parse(&wire, &exact), Ok(whole), "{args:?}");
    assert_eq!(
        frame_len(&wire, &exact),
        Ok(Status::Complete {
            value: wire.len(),
            used: wire.len(),
        })
    );
    let cut = (fnv1a(data) % wire.len() as u64) as usize;
    for cut in [cut, wire.len() - 1] {
        assert_eq!(
            parse(&wire.slice(..cut), &exact),
            Ok(Status::Partial),
            "{args:?} cut at {cut}"
        );
    }

    // A reply read off a socket buffer leaves the next one behind.
    let mut buf = BytesMut::from(&wire[..]);
    buf.extend_from_slice(b"+OK\r\n");
    assert_eq!(decode(&mut buf, &exact), Ok(Some(expected)));
    assert_eq!(&buf[..], b"+OK\r\n");

    let refused = |limits: Limits, limit: Limit| {
        assert_eq!(
            parse(&wire, &limits),
            Err(ProtocolError::LimitExceeded(limit)),
            "{args:?} with {limits:?}"
        );
    };
    refused(
        Limits {
            max_depth: 0,
            ..exact
        },
        Limit::Depth,
    );
    refused(
        Limits {
            max_reply_len: exact.max_reply_len - 1,
            ..exact
        },
        Limit::ReplyLength,
    );
    refused(
        Limits {
            max_line_len: exact.max_line_len - 1,
            ..exact
        },
        Limit::LineLength,
    );
    if exact.max_array_len > 0 {
        refused(
            Limits {
                max_array_len: exact.max_array_len - 1,
                ..exact
            },
            Limit::ArrayLength,
        );
    }
    if exact.max_bulk_len > 0 {
        refused(
            Limits {
                max_bulk_len: exact.max_bulk_len - 1,
                ..exact
            },
            Limit::BulkLength,
        );
    }
}

/// Reads a command's arguments from fuzz input: a tag byte, then by the tag
/// modulo 3
/// - 0: an integer, from the next 8 bytes little-endian (zero-padded when
///   the input ends first);
/// - 1: bytes, as many as the next byte says;
/// - 2: bytes, as many as the next 2 bytes say, little-endian.
///
/// A length past the end of the input takes what is left.
pub fn args_from(data: &[u8]) -> Vec<Arg<'_>> {
    let mut args = Vec::new();
    let mut rest = data;
    while let Some((&tag, tail)) = rest.split_first() {
        let (head, tail) = match tag % 3 {
            0 => take(tail, 8),
            1 => take(tail, 1),
            _ => take(tail, 2),
        };
        let mut le = [0u8; 8];
        le[..head.len()].copy_from_slice(head);
        let n = u64::from_le_bytes(le);
        rest = if tag % 3 == 0 {
            args.push(Arg::Int(n as i64));
            tail
        } else {
            let (bytes, tail) = take(tail, n as usize);
            args.push(Arg::Bytes(bytes));
            tail
        };
    }
    args
}

fn take(s: &[u8], n: usize) -> (&[u8], &[u8]) {
    s.split_at(n.min(s.len()))
}

/// The smallest limits that accept the encoding of `texts`.
fn exact_limits(texts: &[Vec<u8>]) -> Limits {
    let longest = texts.iter().map(Vec::len).max().unwrap_or(0);
    // Only the length lines are lines; their content is the digits.
    let digits = |n: usize| n.to_string().len();
    Limits {
        max_bulk_len: longest,
        max_array_len: texts.len(),
        max_depth: 1,
        max_line_len: digits(texts.len()).max(digits(longest)),
        // The whole command's encoded length.
        max_reply_len: 3
            + digits(texts.len())
            + texts
                .iter()
                .map(|t| 5 + digits(t.len()) + t.len())
                .sum::<usize>(),
    }
}

/// The limits every parse property is checked under.
fn limit_sets(seed: u64) -> [Limits; 4] {
    [
        Limits::default(),
        // Small enough that a few bytes of input reach every limit.
        Limits {
            max_bulk_len: 4,
            max_array_len: 2,
            max_depth: 2,
            max_line_len: 6,
            max_reply_len: 12,
        },
        // Drawn from the input, so that the fuzzer moves the limits too:
        // zero, and past DEPTH_CAP, included.
        Limits {
            max_bulk_len: (seed & 0x3f) as usize,
            max_array_len: ((seed >> 6) & 0xf) as usize,
            max_depth: ((seed >> 10) & 0x7f) as usize,
            max_line_len: ((seed >> 17) & 0x3f) as usize,
            max_reply_len: ((seed >> 23) & 0xff) as usize,
        },
        // Roomy: only DEPTH_CAP bounds the nesting, and announced lengths
        // far past any input are accepted as partial.
        Limits {
            max_bulk_len: 1 << 30,
            max_array_len: 1 << 20,
            max_depth: usize::MAX,
            max_line_len: 1 << 20,
            max_reply_len: 1 << 30,
        },
    ]
}

type Parsed = Result<Status<Reply>, ProtocolError>;

/// The properties of the first reply in `data`; returns what `parse` said.
fn check_first_reply(data: &[u8], limits: &Limits, seed: u64) -> Parsed {
    let src = Bytes::copy_from_slice(data);
    let first = parse(&src, limits);
    match (&first, frame_len(data, limits)) {
        (Ok(Status::Complete { used, .. }), Ok(Status::Complete { value, used: u })) => {
            assert_eq!((value, u), (*used, *used), "frame_len of {data:?}");
        }
        (Ok(Status::Partial), Ok(Status::Partial)) => {}
        (Err(e), Err(f)) => assert_eq!(*e, f, "frame_len of {data:?}"),
        (_, measured) => panic!("parse {first:?} but frame_len {measured:?} on {data:?}"),
    }
    if let Err(e) = &first {
        // Display must not panic either.
        let _ = e.to_string();
    }

    // Every cut of the input says Partial or exactly what the whole said.
    let whole_len = match &first {
        Ok(Status::Complete { used, .. }) => *used,
        _ => data.len(),
    };
    for cut in cuts(whole_len, seed) {
        let got = parse(&src.slice(..cut), limits);
        let fine = match &first {
            Ok(Status::Complete { .. }) | Ok(Status::Partial) => got == Ok(Status::Partial),
            Err(_) => got == Ok(Status::Partial) || got == first,
        };
        assert!(fine, "{data:?} cut at {cut} gave {got:?}, whole {first:?}");
    }
    if let Ok(Status::Complete { used, .. }) = &first {
        // Nothing after the reply matters to it.
        assert_eq!(parse(&src.slice(..*used), limits), first, "{data:?}");
    }

    // A resumed scan fed the input in growing prefixes says Partial until
    // the reply is whole, then what `frame_len` says of the whole.
    let mut scan = FrameScan::new();
    let mut prefixes = cuts(whole_len, seed);
    prefixes.sort_unstable();
    for cut in prefixes {
        match scan.scan(&data[..cut], limits) {
            Ok(Status::Partial) => {}
            Err(e) if first == Err(e) => {
                scan = FrameScan::new();
            }
            other => panic!("{data:?}: resumed scan at {cut} gave {other:?}, whole {first:?}"),
        }
    }
    let resumed = scan.scan(data, limits);
    match (&first, &resumed) {
        (Ok(Status::Complete { used, .. }), Ok(Status::Complete { used: u, .. })) => {
            assert_eq!(used, u, "resumed scan of {data:?}");
        }
        (Ok(Status::Partial), Ok(Status::Partial)) => {}
        (Err(e), Err(f)) => assert_eq!(e, f, "resumed scan of {data:?}"),
        _ => panic!("{data:?}: resumed scan {resumed:?}, whole {first:?}"),
    }

    // `decode` takes what `parse` used, and nothing on Partial or error.
    let mut buf = BytesMut::from(data);
    let got = decode(&mut buf, limits);
    match &first {
        Ok(Status::Complete { value, used }) => {
            assert_eq!(got, Ok(Some(value.clone())), "decode of {data:?}");
            assert_eq!(&buf[..], &data[*used..], "decode left of {data:?}");
        }
        Ok(Status::Partial) => {
            assert_eq!(got, Ok(None), "decode of {data:?}");
            assert_eq!(&buf[..], data, "decode left of {data:?}");
        }
        Err(e) => {
            assert_eq!(got, Err(*e), "decode of {data:?}");
            assert_eq!(&buf[..], data, "decode left of {data:?}");
        }
    }
    first
}

/// Replies taken one after another off the front of the input, and how
/// taking them ended.
struct Pipeline {
    replies: Vec<Reply>,
    consumed: usize,
    error: Option<ProtocolError>,
}

/// Parses every reply off `data` in a loop, checks each, and checks that
/// `decode` on one buffer takes the same replies and leaves the same tail.
fn check_pipeline(data: &[u8], limits: &Limits, first: &Parsed) -> Pipeline {
    let mut rest = Bytes::copy_from_slice(data);
    let mut whole = Pipeline {
        replies: Vec::new(),
        consumed: 0,
        error: None,
    };
    loop {
        match parse(&rest, limits) {
            Ok(Status::Complete { value, used }) => {
                assert!(
                    (3..=rest.len()).contains(&used),
                    "used {used} of {} bytes in {data:?}",
                    rest.len()
                );
                check_reply(&value, limits);
                check_reencode(&value, used, limits);
                whole.replies.push(value);
                whole.consumed += used;
                rest = rest.slice(used..);
            }
            Ok(Status::Partial) => break,
            Err(e) => {
                whole.error = Some(e);
                break;
            }
        }
    }
    assert!(whole.consumed <= data.len());
    match (first, whole.replies.first()) {
        (Ok(Status::Complete { value, .. }), Some(reply)) => assert_eq!(value, reply),
        (Ok(Status::Complete { .. }), None) => panic!("first reply of {data:?} lost"),
        (_, Some(_)) => panic!("{data:?} gave no first reply but a pipeline"),
        _ => {}
    }

    let mut buf = BytesMut::from(data);
    for want in &whole.replies {
        assert_eq!(decode(&mut buf, limits), Ok(Some(want.clone())), "{data:?}");
    }
    let end = decode(&mut buf, limits);
    assert_eq!(end, whole.error.map_or(Ok(None), Err), "{data:?}");
    assert_eq!(&buf[..], &data[whole.consumed..], "{data:?}");
    whole
}

/// Feeds `data` into one growing buffer in chunks, as reads from a socket
/// would, decoding after each until it needs more; the replies and the end
/// must be those of the whole input at once.
fn check_streamed(data: &[u8], limits: &Limits, whole: &Pipeline, seed: u64) {
    let mut ends: Vec<usize> = if data.len() <= 64 {
        (1..=data.len()).collect()
    } else {
        let mut ends: Vec<usize> = points(seed, 8, data.len()).collect();
        ends.push(data.len());
        ends.sort_unstable();
        ends
    };
    ends.dedup();
    // `decode`, and `decode_resumed` as a connection reads (a scan kept
    // beside its buffer), each on its own copy of the stream.
    for resumed in [false, true] {
        let mut buf = BytesMut::new();
        let mut scan = FrameScan::new();
        let mut replies = Vec::new();
        let mut error = None;
        let mut start = 0;
        'chunks: for &end in &ends {
            buf.extend_from_slice(&data[start..end]);
            start = end;
            loop {
                let next = if resumed {
                    decode_resumed(&mut buf, &mut scan, limits)
                } else {
                    decode(&mut buf, limits)
                };
                match next {
                    Ok(Some(reply)) => replies.push(reply),
                    Ok(None) => break,
                    // A connection closes on a protocol error.
                    Err(e) => {
                        error = Some(e);
                        break 'chunks;
                    }
                }
            }
        }
        assert_eq!(
            replies, whole.replies,
            "streamed {data:?} (resumed: {resumed})"
        );
        assert_eq!(error, whole.error, "streamed {data:?} (resumed: {resumed})");
        if error.is_none() {
            assert_eq!(
                &buf[..],
                &data[whole.consumed..],
                "streamed {data:?} (resumed: {resumed})"
            );
        }
    }
}

/// A parsed reply stays within the limits it was parsed under.
fn check_reply(reply: &Reply, limits: &Limits) {
    let _ = format!("{reply:?}");
    let _ = (reply.is_ok(), reply.is_error_code(b"NOSCRIPT"));
    assert!(
        depth(reply) <= limits.max_depth.min(DEPTH_CAP),
        "{reply:?} nests deeper than {limits:?}"
    );
    check_lengths(reply, limits);
}

fn check_lengths(reply: &Reply, limits: &Limits) {
    match reply {
        Reply::Status(line) | Reply::Error(line) => {
            assert!(
                line.len() <= limits.max_line_len,
                "{reply:?} past {limits:?}"
            );
            assert!(
                !line.iter().any(|&b| b == b'\r' || b == b'\n'),
                "{reply:?} holds a line break"
            );
        }
        Reply::Bulk(payload) => {
            assert!(
                payload.len() <= limits.max_bulk_len,
                "{reply:?} past {limits:?}"
            );
        }
        Reply::Array(items) => {
            assert!(
                items.len() <= limits.max_array_len,
                "{reply:?} past {limits:?}"
            );
            for item in items {
                check_lengths(item, limits);
            }
        }
        Reply::Integer(_) | Reply::Nil | Reply::NilArray => {}
    }
}

/// Nesting as the depth limit counts it: a flat array, even empty, is 1;
/// a null array is not an array.
fn depth(reply: &Reply) -> usize {
    match reply {
        Reply::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// `Reply::encode` writes the canonical form, never longer than what was
/// parsed (integers lose leading zeros and `-0`), which parses back to the
/// same reply under the same limits.
fn check_reencode(reply: &Reply, used: usize, limits: &Limits) {
    let mut enc = BytesMut::new();
    reply.encode(&mut enc);
    let enc = enc.freeze();
    assert!(
        enc.len() <= used,
        "{reply:?} re-encoded to {} bytes from {used}",
        enc.len()
    );
    let back = parse(&enc, limits);
    assert_eq!(
        back,
        Ok(Status::Complete {
            value: reply.clone(),
            used: enc.len(),
        }),
        "{reply:?} re-encoded as {enc:?}"
    );
}

/// The cuts of a `len`-byte input to check: all of them for short inputs,
/// else the ends and a few drawn from the seed, to keep each run fast.
fn cuts(len: usize, seed: u64) -> Vec<usize> {
    if len <= 64 {
        return (0..len).collect();
    }
    let mut cuts: Vec<usize> = [0, 1, 2, len / 2, len - 3, len - 2, len - 1]
        .into_iter()
        .chain(points(seed, 16, len))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// `count` positions in `0..len` drawn from `seed` with splitmix64.
fn points(seed: u64, count: usize, len: usize) -> impl Iterator<Item = usize> {
    let mut state = seed;
    (0..count).map(move |_| {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z % len as u64) as usize
    })
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
