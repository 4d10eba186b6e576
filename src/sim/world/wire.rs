//! What the world reads off the wire: the commands a simulated master
//! receives, taken from its connection's buffer without a copy, and what
//! each does to the locks, for the checkers; and the release messages a
//! master pushes. Reads only; decides nothing about the run.

use std::sync::OnceLock;

use bytes::BytesMut;

use crate::resp::{Limits, Reply, format_i64};
use crate::script::{
    ACQUIRE_FENCED_SOURCE, ACQUIRE_MANY_SOURCE, ACQUIRE_WAIT_SOURCE, CLEANUP_MANY_SOURCE,
    CLEANUP_SOURCE, RELEASE_CHANNEL_PREFIX, RELEASE_MANY_SOURCE, RELEASE_SOURCE, Script,
};
use crate::sim::model::Frame;
use crate::wait::Message;

/// The most arguments [`read_command`] reads a command with; a longer
/// one is left to the general decoder.
pub(super) const MAX_ARGS: usize = 16;

/// What [`read_command`] found at the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Read {
    /// A whole command of this many bytes, with this many arguments.
    Command { len: usize, args: usize },
    /// The start of one: more bytes are to come.
    Partial,
    /// Anything else (never sent by the client), for the general decoder
    /// to answer as it does: a frame not an array of bulk strings, a
    /// length past [`Limits::default`], too many arguments.
    Other,
}

/// Reads the command at the front of `buf`, an array of bulk strings as
/// clients send them, into `args` (slices of `buf`): what
/// [`crate::resp::decode`] would make of it, without building a reply or
/// copying a byte.
pub(super) fn read_command<'b>(buf: &'b [u8], args: &mut [&'b [u8]; MAX_ARGS]) -> Read {
    let limits = Limits::default();
    let mut at = 0;
    let Some(&first) = buf.first() else {
        return Read::Partial;
    };
    if first != b'*' {
        return Read::Other;
    }
    let count = match number(buf, &mut at) {
        Some(Ok(n)) if n <= MAX_ARGS && n <= limits.max_array_len => n,
        Some(Ok(_)) | Some(Err(())) => return Read::Other,
        None => return partial(buf, &limits),
    };
    for slot in args.iter_mut().take(count) {
        match buf.get(at) {
            Some(b'$') => {}
            Some(_) => return Read::Other,
            None => return partial(buf, &limits),
        }
        let len = match number(buf, &mut at) {
            Some(Ok(n)) if n <= limits.max_bulk_len => n,
            Some(Ok(_)) | Some(Err(())) => return Read::Other,
            None => return partial(buf, &limits),
        };
        let Some(end) = at.checked_add(len) else {
            return Read::Other;
        };
        match buf.get(end..end + 2) {
            Some(b"\r\n") => {}
            Some(_) => return Read::Other,
            None => return partial(buf, &limits),
        }
        *slot = &buf[at..end];
        at = end + 2;
    }
    Read::Command {
        len: at,
        args: count,
    }
}

/// Incomplete input: more is to come, unless it is already longer than a
/// reply may be (the general decoder then says so).
fn partial(buf: &[u8], limits: &Limits) -> Read {
    if buf.len() > limits.max_reply_len {
        Read::Other
    } else {
        Read::Partial
    }
}

/// The length after the type byte at `*at`, up to its CRLF, moving `*at`
/// past it: `None` when the line is not all in, `Err` when it is not a
/// plain decimal. Inlined: the world reads one for every argument of
/// every command.
#[inline(always)]
fn number(buf: &[u8], at: &mut usize) -> Option<Result<usize, ()>> {
    let mut n: usize = 0;
    let mut i = *at + 1;
    loop {
        let &c = buf.get(i)?;
        match c {
            b'0'..=b'9' if i - *at <= 10 => {
                n = n * 10 + usize::from(c - b'0');
            }
            b'\r' if i > *at + 1 => {
                return match buf.get(i + 1) {
                    None => None,
                    Some(b'\n') => {
                        *at = i + 2;
                        Some(Ok(n))
                    }
                    Some(_) => Some(Err(())),
                };
            }
            _ => return Some(Err(())),
        }
        i += 1;
    }
}

/// Writes `reply` into `out` as [`Reply::encode`] does, byte for byte,
/// each line in one copy.
fn encode(reply: &Reply, out: &mut BytesMut) {
    let mut line = [0u8; 24];
    match reply {
        Reply::Status(text) => put_line(out, b'+', text),
        Reply::Error(text) => put_line(out, b'-', text),
        // The commonest replies, 0 and 1 (and the other digits), in one
        // copy of a fixed length.
        &Reply::Integer(n @ 0..=9) => out.extend_from_slice(&[b':', b'0' + n as u8, b'\r', b'\n']),
        Reply::Integer(n) => out.extend_from_slice(int_line(&mut line, b':', *n)),
        Reply::Bulk(bytes) => put_bulk(out, bytes),
        Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
        Reply::NilArray => out.extend_from_slice(b"*-1\r\n"),
        Reply::Array(items) => {
            let len = i64::try_from(items.len()).unwrap_or(i64::MAX);
            out.extend_from_slice(int_line(&mut line, b'*', len));
            for item in items {
                encode(item, out);
            }
        }
    }
}

/// Writes `frame` into `out` as [`encode`] writes [`Frame::into_reply`],
/// byte for byte, without building that reply.
pub(super) fn encode_frame(frame: &Frame, out: &mut BytesMut) {
    match frame {
        Frame::Refusal { left, holder } => {
            let mut line = [0u8; 24];
            out.extend_from_slice(b"*2\r\n");
            out.extend_from_slice(int_line(&mut line, b':', -left));
            put_bulk(out, holder);
        }
        Frame::Message { channel, payload } => {
            out.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n");
            put_bulk(out, channel);
            put_bulk(out, payload);
        }
        Frame::Reply(reply) => encode(reply, out),
    }
}

/// A bulk string: its length line, its bytes, CRLF.
fn put_bulk(out: &mut BytesMut, bytes: &[u8]) {
    let mut line = [0u8; 24];
    out.reserve(bytes.len() + line.len());
    let len = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
    out.extend_from_slice(int_line(&mut line, b'$', len));
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

fn put_line(out: &mut BytesMut, kind: u8, text: &[u8]) {
    out.reserve(text.len() + 3);
    out.extend_from_slice(&[kind]);
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
}

/// `kind`, `n` in decimal and CRLF, in the tail of `line`.
fn int_line(line: &mut [u8; 24], kind: u8, n: i64) -> &[u8] {
    let mut digits = [0u8; 20];
    let text = format_i64(n, &mut digits);
    let end = line.len();
    let start = end - text.len() - 3;
    line[start] = kind;
    line[start + 1..end - 2].copy_from_slice(text);
    line[end - 2..].copy_from_slice(b"\r\n");
    &line[start..]
}

/// What a command does to a lock, as the checkers follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effect {
    /// An acquire attempt (SET NX or an acquire script) with this token.
    Acquire,
    /// An attempt of a waiting acquire (the script that also reads the
    /// holder's PTTL): in a process, only the head waiter of a resource
    /// makes them.
    WaitingAcquire,
    /// A release (compare-and-delete) of this token; `quiet`: one that
    /// publishes nothing (a failed attempt's cleanup, or a hand-over).
    Release { quiet: bool },
}

/// The scripts that acquire or release, commonest first.
fn effects() -> &'static [(Script, Effect); 7] {
    static EFFECTS: OnceLock<[(Script, Effect); 7]> = OnceLock::new();
    EFFECTS.get_or_init(|| {
        [
            (Script::new(ACQUIRE_WAIT_SOURCE), Effect::WaitingAcquire),
            (
                Script::new(RELEASE_SOURCE),
                Effect::Release { quiet: false },
            ),
            (Script::new(CLEANUP_SOURCE), Effect::Release { quiet: true }),
            (Script::new(ACQUIRE_FENCED_SOURCE), Effect::Acquire),
            (Script::new(ACQUIRE_MANY_SOURCE), Effect::Acquire),
            (
                Script::new(RELEASE_MANY_SOURCE),
                Effect::Release { quiet: false },
            ),
            (
                Script::new(CLEANUP_MANY_SOURCE),
                Effect::Release { quiet: true },
            ),
        ]
    })
}

/// The effect of the command `args` on the locks and the token it
/// carries, and the keys it may change: SET's key, a script's keys.
#[allow(clippy::type_complexity)]
pub(super) fn effect<'c, 'a>(args: &'c [&'a [u8]]) -> (Option<(Effect, &'a [u8])>, &'c [&'a [u8]]) {
    let name = args.first().copied().unwrap_or_default();
    if name.eq_ignore_ascii_case(b"SET") {
        let nx = args.iter().any(|a| a.eq_ignore_ascii_case(b"NX"));
        let effect = args.get(2).filter(|_| nx).map(|t| (Effect::Acquire, *t));
        return (effect, args.get(1..2).unwrap_or(&[]));
    }
    if deletes_natively(args) {
        let token = args.last().copied();
        return (
            token.map(|t| (Effect::Release { quiet: true }, t)),
            args.get(1..2).unwrap_or(&[]),
        );
    }
    let by_sha = name.eq_ignore_ascii_case(b"EVALSHA");
    if !by_sha && !name.eq_ignore_ascii_case(b"EVAL") {
        return (None, &[]);
    }
    let Some(keys) = args.get(2).and_then(|n| key_count(n)) else {
        return (None, &[]);
    };
    let Some((keys, argv)) = args.get(3..).and_then(|rest| rest.split_at_checked(keys)) else {
        return (None, &[]);
    };
    let effect = args.get(1).and_then(|script| script_effect(script, by_sha));
    (effect.zip(argv.first().copied()), keys)
}

/// Whether `args` is a master's own compare-and-delete (`DELIFEQ key
/// token`, `DELEX key IFEQ token`): a release, quiet unless its
/// `PUBLISH` follows in the same write (see [`announced_by`]).
pub(super) fn deletes_natively(args: &[&[u8]]) -> bool {
    match args {
        [name, _, _] => name.eq_ignore_ascii_case(b"DELIFEQ"),
        [name, _, cond, _] => {
            name.eq_ignore_ascii_case(b"DELEX") && cond.eq_ignore_ascii_case(b"IFEQ")
        }
        _ => false,
    }
}

/// What follows a native delete of `key` at the front of `rest`, the rest
/// of its write: `Some(true)` when it is the release's `PUBLISH` on the
/// key's channel (an announced release), `Some(false)` when another
/// command, `None` when the next command has not wholly arrived.
pub(super) fn announced_by(rest: &[u8], key: &[u8]) -> Option<bool> {
    let mut slots = [&[][..]; MAX_ARGS];
    match read_command(rest, &mut slots) {
        Read::Command { args: 3, .. } => Some(
            slots[0].eq_ignore_ascii_case(b"PUBLISH")
                && slots[1].strip_prefix(RELEASE_CHANNEL_PREFIX) == Some(key),
        ),
        Read::Command { .. } | Read::Other => Some(false),
        Read::Partial => None,
    }
}

/// The TTL (ms) an acquire command `args` asks for: `SET`'s `PX`, an
/// acquire script's second argument (after its token). Every attempt of
/// one acquire carries the same; the world gives each unfinished acquire
/// of a client its own (see `cancel.rs`).
pub(super) fn acquire_ttl(args: &[&[u8]]) -> Option<u64> {
    let name = args.first()?;
    let ttl = if name.eq_ignore_ascii_case(b"SET") {
        let px = args.iter().position(|a| a.eq_ignore_ascii_case(b"PX"))?;
        args.get(px + 1)?
    } else {
        let keys = key_count(args.get(2)?)?;
        args.get(3usize.checked_add(keys)?.checked_add(1)?)?
    };
    key_count(ttl).map(|ttl| ttl as u64)
}

/// A key count as `str::parse::<usize>` reads it (an optional `+`, then
/// decimal digits, at most `usize::MAX`), without a UTF-8 check first.
fn key_count(text: &[u8]) -> Option<usize> {
    let digits = text.strip_prefix(b"+").unwrap_or(text);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0usize, |n, &c| {
        let digit = c.checked_sub(b'0').filter(|d| *d < 10)?;
        n.checked_mul(10)?.checked_add(usize::from(digit))
    })
}

/// What script `script` (its SHA, or its text) does to a lock.
fn script_effect(script: &[u8], by_sha: bool) -> Option<Effect> {
    let scripts = effects();
    let found = if by_sha {
        // In any case, as the master takes it: SHAs are lowercase. Most
        // scripts differ in their first eight digits, compared in one go.
        let sha: [u8; 40] = script.try_into().ok()?;
        let sha = sha.map(|c| c.to_ascii_lowercase());
        scripts
            .iter()
            .find(|(s, _)| head(s.sha()) == head(&sha) && *s.sha() == sha)
    } else {
        scripts
            .iter()
            .find(|(s, _)| s.source().as_bytes() == script)
    };
    found.map(|&(_, effect)| effect)
}

/// The first eight digits of a SHA.
fn head(sha: &[u8; 40]) -> [u8; 8] {
    let mut head = [0; 8];
    head.copy_from_slice(&sha[..8]);
    head
}

/// The channel a pushed frame announces a release on (the resource, after
/// [`RELEASE_CHANNEL_PREFIX`]), and the token released: a `message` on a
/// release channel.
pub(super) fn release_message(frame: &Frame) -> Option<(&[u8], &[u8])> {
    let Frame::Message { channel, payload } = frame else {
        return None;
    };
    // Read as the client reads it: a refused attempt's notice frees
    // nothing.
    let message = Message::read(payload);
    if message.waiting {
        return None;
    }
    Some((channel.strip_prefix(RELEASE_CHANNEL_PREFIX)?, message.token))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::decode;
    use bytes::Bytes;

    /// `read_command` against the general decoder, on `input` cut at every
    /// length.
    fn agrees(input: &[u8]) {
        for cut in 0..=input.len() {
            let buf = &input[..cut];
            let mut args = [&[][..]; MAX_ARGS];
            let read = read_command(buf, &mut args);
            let mut owned = BytesMut::from(buf);
            let decoded = decode(&mut owned, &Limits::default());
            match (read, decoded) {
                (Read::Partial, Ok(None)) => {}
                (Read::Command { len, args: n }, Ok(Some(Reply::Array(items)))) => {
                    assert_eq!(len, cut - owned.len(), "{input:?} cut at {cut}");
                    let words: Vec<&[u8]> = items
                        .iter()
                        .map(|w| match w {
                            Reply::Bulk(b) => b.as_ref(),
                            other => panic!("{other:?}"),
                        })
                        .collect();
                    assert_eq!(words, args[..n].to_vec(), "{input:?} cut at {cut}");
                }
                (Read::Other, _) => {}
                (read, decoded) => panic!("{input:?} cut at {cut}: {read:?} {decoded:?}"),
            }
        }
    }

    #[test]
    fn commands_read_as_the_decoder_reads_them_however_they_are_cut() {
        agrees(b"*3\r\n$3\r\nSET\r\n$2\r\nr0\r\n$0\r\n\r\n");
        agrees(b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$2\r\nr1\r\n");
        agrees(b"*0\r\n");
        agrees(b"*2\r\n$3\r\nGET\r\n$12\r\nline\r\nbreaks\r\n");
    }

    #[test]
    fn anything_else_is_left_to_the_decoder() {
        let other = |input: &[u8]| {
            let mut args = [&[][..]; MAX_ARGS];
            assert_eq!(read_command(input, &mut args), Read::Other, "{input:?}");
        };
        other(b"?garbage\r\n");
        other(b"*1\r\n:1\r\n");
        other(b"*1\r\n$-1\r\n");
        other(b"*-1\r\n");
        other(b"*1\r\n$3\r\nabcd\r\n");
        other(b"*17\r\n");
        other(b"*1\r\n$65537\r\n");
        other(b"*1\r\n$3x\r\n");
    }

    #[test]
    fn replies_are_written_as_the_codec_writes_them() {
        let replies = [
            Reply::Status(Bytes::from_static(b"OK")),
            Reply::Error(Bytes::from_static(b"NOSCRIPT No matching script.")),
            Reply::Integer(0),
            Reply::Integer(9),
            Reply::Integer(10),
            Reply::Integer(99),
            Reply::Integer(100),
            Reply::Integer(-1),
            Reply::Integer(-1_234),
            Reply::Integer(i64::MIN),
            Reply::Integer(i64::MAX),
            Reply::Bulk(Bytes::new()),
            Reply::Bulk(Bytes::from_static(b"a token\r\n")),
            Reply::Nil,
            Reply::NilArray,
            Reply::Array(Vec::new()),
            Reply::Array(vec![
                Reply::Integer(-5),
                Reply::Bulk(Bytes::from_static(b"v")),
                Reply::Array(vec![Reply::Nil]),
            ]),
        ];
        for reply in &replies {
            let (mut ours, mut codec) = (BytesMut::new(), BytesMut::new());
            encode(reply, &mut ours);
            reply.encode(&mut codec);
            assert_eq!(ours, codec, "{reply:?}");
        }
    }

    #[test]
    fn frames_are_written_as_the_codec_writes_their_replies() {
        let frames = [
            Frame::Refusal {
                left: 1_234,
                holder: Bytes::from_static(b"a token"),
            },
            Frame::Refusal {
                left: 0,
                holder: Bytes::new(),
            },
            Frame::Refusal {
                left: 99,
                holder: Bytes::from_static(&[b't'; 48]),
            },
            Frame::Message {
                channel: Bytes::from_static(b"redlock:released:r0"),
                payload: Bytes::from_static(b"t:1"),
            },
            Frame::Reply(Reply::Integer(1)),
        ];
        for frame in frames {
            let (mut ours, mut codec) = (BytesMut::new(), BytesMut::new());
            encode_frame(&frame, &mut ours);
            frame.clone().into_reply().encode(&mut codec);
            assert_eq!(ours, codec, "{frame:?}");
        }
    }

    #[test]
    fn a_script_call_is_told_by_its_sha_or_its_text() {
        let release = Script::new(RELEASE_SOURCE);
        let upper = release.sha().to_ascii_uppercase();
        for name in [&release.sha()[..], &upper[..]] {
            let args: [&[u8]; 5] = [b"EVALSHA", name, b"1", b"r0", b"token"];
            let (found, keys) = effect(&args);
            assert_eq!(
                found,
                Some((Effect::Release { quiet: false }, &b"token"[..]))
            );
            assert_eq!(keys, [&b"r0"[..]]);
        }
        let args: [&[u8]; 5] = [b"EVAL", CLEANUP_SOURCE.as_bytes(), b"1", b"r0", b"t"];
        assert_eq!(
            effect(&args).0,
            Some((Effect::Release { quiet: true }, &b"t"[..]))
        );
        let args: [&[u8]; 6] = [b"SET", b"r2", b"t", b"NX", b"PX", b"100"];
        assert_eq!(
            effect(&args),
            (Some((Effect::Acquire, &b"t"[..])), &[&b"r2"[..]][..])
        );
        let args: [&[u8]; 3] = [b"SET", b"r2", b"t"];
        assert_eq!(effect(&args), (None, &[&b"r2"[..]][..]));
        let args: [&[u8]; 2] = [b"GET", b"r2"];
        assert_eq!(effect(&args), (None, &[][..]));
        // A SHA of another length: no script.
        let short = &release.sha()[..39];
        let args: [&[u8]; 5] = [b"EVALSHA", short, b"1", b"r0", b"token"];
        assert_eq!(effect(&args), (None, &[&b"r0"[..]][..]));
        // Fewer keys than it says: none.
        let args: [&[u8]; 4] = [b"EVALSHA", b"0123", b"2", b"r0"];
        assert_eq!(effect(&args), (None, &[][..]));
    }

    #[test]
    fn an_acquires_ttl_is_read_from_set_and_from_the_scripts() {
        let set: [&[u8]; 6] = [b"SET", b"r0", b"t", b"NX", b"PX", b"1234"];
        assert_eq!(acquire_ttl(&set), Some(1_234));
        let wait: [&[u8]; 7] = [b"EVALSHA", b"sha", b"1", b"r0", b"t", b"700", b"1"];
        assert_eq!(acquire_ttl(&wait), Some(700));
        let many: [&[u8]; 7] = [b"EVALSHA", b"sha", b"2", b"r0", b"r1", b"t", b"90"];
        assert_eq!(acquire_ttl(&many), Some(90));
        let short: [&[u8]; 5] = [b"EVALSHA", b"sha", b"1", b"r0", b"t"];
        assert_eq!(acquire_ttl(&short), None);
    }

    #[test]
    fn key_counts_read_as_str_parse_reads_them() {
        let cases: [&[u8]; 12] = [
            b"0",
            b"1",
            b"+1",
            b"01",
            b"",
            b"+",
            b"-1",
            b" 1",
            b"1x",
            b"18446744073709551615",
            b"18446744073709551616",
            b"\xff",
        ];
        for text in cases {
            let parsed = std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse::<usize>().ok());
            assert_eq!(key_count(text), parsed, "{text:?}");
        }
    }
}
