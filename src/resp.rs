//! RESP2, the Redis wire protocol: an encoder for commands and an
//! incremental, zero-copy parser for replies.
//!
//! This module owns the bytes-level grammar and nothing else: it never
//! touches a socket, a clock or a lock. The parser takes whatever bytes
//! have arrived so far and answers either [`Status::Complete`] with the
//! number of bytes one whole reply used, or [`Status::Partial`] when more
//! input is needed; partial input is not an error and allocates nothing.
//! Limits on bulk length, array length, nesting depth and line length are
//! part of the grammar, so that a broken or hostile server gets a typed
//! [`ProtocolError`] instead of a panic or an allocation of its choosing.

use std::fmt;
use std::ops::Range;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The outcome of feeding bytes to the parser.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Status<T> {
    /// One whole reply was found; `used` bytes of the input belong to it.
    Complete {
        /// The parsed reply (or its length, for [`frame_len`]).
        value: T,
        /// How many input bytes the reply occupies.
        used: usize,
    },
    /// The input ends before the reply does: read more and try again.
    Partial,
}

/// One RESP2 reply.
///
/// Payloads are [`Bytes`] slices of the buffer the reply was parsed from:
/// parsing copies no payload.
#[derive(Clone, PartialEq, Eq)]
pub enum Reply {
    /// A simple string, `+OK`.
    Status(Bytes),
    /// An error reply, `-ERR ...`: a value, not a transport failure.
    Error(Bytes),
    /// An integer, `:1`.
    Integer(i64),
    /// A bulk string, `$3\r\nabc`.
    Bulk(Bytes),
    /// The null bulk string, `$-1`.
    Nil,
    /// An array, `*2\r\n...`, possibly empty or nested.
    Array(Vec<Reply>),
    /// The null array, `*-1`.
    NilArray,
}

impl Reply {
    /// True for the simple string `+OK`.
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Status(s) if s.as_ref() == b"OK")
    }

    /// True for an error reply whose code (its first word) is `code`,
    /// such as `NOSCRIPT`.
    pub fn is_error_code(&self, code: &[u8]) -> bool {
        match self {
            Reply::Error(msg) => {
                msg.starts_with(code) && matches!(msg.get(code.len()), None | Some(b' '))
            }
            _ => false,
        }
    }

    /// Appends this reply, in RESP2, to `dst`. Parsing the result gives back
    /// an equal reply, for every reply the parser produced; a hand-built
    /// `Status` or `Error` holding CR or LF has no RESP2 form and does not
    /// round-trip.
    pub fn encode(&self, dst: &mut BytesMut) {
        match self {
            Reply::Status(s) => put_line(dst, b'+', s),
            Reply::Error(s) => put_line(dst, b'-', s),
            Reply::Integer(n) => put_int_line(dst, b':', *n),
            Reply::Bulk(b) => {
                put_int_line(dst, b'$', len_i64(b.len()));
                dst.put_slice(b);
                dst.put_slice(b"\r\n");
            }
            Reply::Nil => dst.put_slice(b"$-1\r\n"),
            Reply::NilArray => dst.put_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                put_int_line(dst, b'*', len_i64(items.len()));
                for item in items {
                    item.encode(dst);
                }
            }
        }
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Status(s) => write!(f, "Status({:?})", s),
            Reply::Error(s) => write!(f, "Error({:?})", s),
            Reply::Integer(n) => write!(f, "Integer({n})"),
            Reply::Bulk(b) => write!(f, "Bulk({:?})", b),
            Reply::Nil => f.write_str("Nil"),
            Reply::Array(items) => f.debug_tuple("Array").field(items).finish(),
            Reply::NilArray => f.write_str("NilArray"),
        }
    }
}

/// Which limit a reply exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// [`Limits::max_bulk_len`].
    BulkLength,
    /// [`Limits::max_array_len`].
    ArrayLength,
    /// [`Limits::max_depth`].
    Depth,
    /// [`Limits::max_line_len`].
    LineLength,
    /// [`Limits::max_reply_len`].
    ReplyLength,
}

/// Why a reply could not be parsed. Small and `Copy`: the connection that
/// sees one closes itself; there is nothing to recover from the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The first byte of a reply is not one of `+ - : $ *`.
    UnknownType(u8),
    /// A `\r` not followed by `\n`, or a bulk payload not followed by CRLF.
    BadLineEnding,
    /// A length or integer that is empty or holds a non-digit.
    InvalidInteger,
    /// A length or integer that does not fit in an `i64`.
    IntegerOverflow,
    /// A negative length other than `-1`.
    NegativeLength(i64),
    /// A configured limit was exceeded.
    LimitExceeded(Limit),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::UnknownType(b) => write!(f, "unknown RESP type byte 0x{b:02x}"),
            ProtocolError::BadLineEnding => f.write_str("line not terminated by CRLF"),
            ProtocolError::InvalidInteger => f.write_str("invalid integer"),
            ProtocolError::IntegerOverflow => f.write_str("integer does not fit in 64 bits"),
            ProtocolError::NegativeLength(n) => write!(f, "negative length {n}"),
            ProtocolError::LimitExceeded(limit) => {
                let what = match limit {
                    Limit::BulkLength => "bulk length",
                    Limit::ArrayLength => "array length",
                    Limit::Depth => "nesting depth",
                    Limit::LineLength => "line length",
                    Limit::ReplyLength => "total reply length",
                };
                write!(f, "reply exceeds the {what} limit")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Bounds on what the parser accepts. The defaults fit a lock client, whose
/// largest expected reply is `INFO server` (a few KiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk string payload, in bytes. Default 64 KiB.
    pub max_bulk_len: usize,
    /// Largest array element count. Default 1024.
    pub max_array_len: usize,
    /// Deepest nesting of arrays; a flat array has depth 1. Default 8.
    /// Values above [`DEPTH_CAP`] act as [`DEPTH_CAP`]: the parser recurses
    /// once per level and must not exhaust the stack.
    pub max_depth: usize,
    /// Longest simple string, error or integer line, without its CRLF.
    /// Default 4 KiB.
    pub max_line_len: usize,
    /// Largest whole reply, in bytes, nested arrays and all; checked on
    /// partial input too, so that a reply within every other limit still
    /// cannot grow the read buffer without end. Default 96 KiB: room for
    /// the largest bulk and its framing.
    pub max_reply_len: usize,
}

/// The hard ceiling on [`Limits::max_depth`].
pub const DEPTH_CAP: usize = 64;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_len: 64 * 1024,
            max_array_len: 1024,
            max_depth: 8,
            max_line_len: 4 * 1024,
            max_reply_len: 96 * 1024,
        }
    }
}

/// Finds the length of the first whole reply in `src` without building it.
/// Allocates nothing.
///
/// # Errors
/// A [`ProtocolError`] when the input cannot be the start of a valid reply
/// within `limits`.
pub fn frame_len(src: &[u8], limits: &Limits) -> Result<Status<usize>, ProtocolError> {
    // Only the first `max_reply_len` bytes are looked at: a reply that
    // needs more is too long, whichever way its bytes arrive, and any other
    // error lies within them.
    let view = &src[..src.len().min(limits.max_reply_len)];
    match walk(view, 0, 1, limits, &mut Skip)? {
        Some(((), end)) => Ok(Status::Complete {
            value: end,
            used: end,
        }),
        None if src.len() > view.len() => Err(ProtocolError::LimitExceeded(Limit::ReplyLength)),
        None => Ok(Status::Partial),
    }
}

/// Parses the first whole reply in `src`. Payloads are slices of `src`.
/// Nothing is allocated when the input is partial.
///
/// # Errors
/// As [`frame_len`].
pub fn parse(src: &Bytes, limits: &Limits) -> Result<Status<Reply>, ProtocolError> {
    let used = match frame_len(src, limits)? {
        Status::Complete { used, .. } => used,
        Status::Partial => return Ok(Status::Partial),
    };
    match walk(src, 0, 1, limits, &mut Build { src })? {
        Some((value, end)) if end == used => Ok(Status::Complete { value, used }),
        // The same grammar accepted these bytes a moment ago; reaching here
        // would be a bug in `walk`, reported rather than panicked on.
        _ => Err(ProtocolError::BadLineEnding),
    }
}

/// Takes the first whole reply off the front of a read buffer. Returns
/// `Ok(None)`, consuming nothing, when the buffer holds only part of one.
///
/// # Errors
/// As [`frame_len`]; the buffer is left as it was.
pub fn decode(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Reply>, ProtocolError> {
    let used = match frame_len(buf, limits)? {
        Status::Complete { used, .. } => used,
        Status::Partial => return Ok(None),
    };
    let frame = buf.split_to(used).freeze();
    match parse(&frame, limits)? {
        Status::Complete { value, .. } => Ok(Some(value)),
        Status::Partial => Err(ProtocolError::BadLineEnding),
    }
}

/// A [`frame_len`] that resumes where it stopped: fed a growing buffer (a
/// read buffer that more bytes were appended to), it goes on from the last
/// value it found whole, so that a reply arriving a byte at a time costs
/// time linear in its length, not quadratic. Same answers as [`frame_len`]
/// on the whole input, however the input was split (the fuzz targets check
/// that). Allocates nothing: open arrays are counted in a fixed stack.
#[derive(Debug, Clone)]
pub struct FrameScan {
    /// Where the next value not yet found whole starts.
    pos: usize,
    /// Elements still to come in each open array, outermost first.
    open: [usize; DEPTH_CAP + 1],
    depth: usize,
    /// Bytes of headers examined, for tests of the linear bound.
    examined: u64,
}

impl Default for FrameScan {
    fn default() -> Self {
        FrameScan::new()
    }
}

/// One value's header, as [`FrameScan`] steps over it.
enum Step {
    /// A whole value (line, integer, bulk, nil, empty array) ends here.
    Leaf(usize),
    /// An array of this many elements opens; they start here.
    Open(usize, usize),
}

impl FrameScan {
    /// A scan at the start of a reply.
    pub fn new() -> FrameScan {
        FrameScan {
            pos: 0,
            open: [0; DEPTH_CAP + 1],
            depth: 0,
            examined: 0,
        }
    }

    /// Forgets the reply in progress: call it when the buffer's front was
    /// taken (the reply found, or the connection reset).
    pub fn reset(&mut self) {
        self.pos = 0;
        self.depth = 0;
    }

    /// Bytes of header lines examined since this scan was made: at most a
    /// line per value plus what a partial header costs per call.
    pub fn examined(&self) -> u64 {
        self.examined
    }

    /// The length of the first whole reply in `src`, which must be the
    /// input of the last call with bytes appended (or anything after a
    /// [`FrameScan::reset`]).
    ///
    /// # Errors
    /// As [`frame_len`].
    pub fn scan(&mut self, src: &[u8], limits: &Limits) -> Result<Status<usize>, ProtocolError> {
        let view = &src[..src.len().min(limits.max_reply_len)];
        loop {
            let step = match self.step(view, limits)? {
                Some(step) => step,
                None if src.len() > view.len() => {
                    return Err(ProtocolError::LimitExceeded(Limit::ReplyLength));
                }
                None => return Ok(Status::Partial),
            };
            match step {
                Step::Open(len, next) => {
                    self.depth += 1;
                    self.open[self.depth] = len;
                    self.pos = next;
                }
                Step::Leaf(end) => {
                    self.pos = end;
                    // A value ended: so may the arrays around it.
                    loop {
                        if self.depth == 0 {
                            let used = self.pos;
                            self.reset();
                            return Ok(Status::Complete { value: used, used });
                        }
                        self.open[self.depth] -= 1;
                        if self.open[self.depth] > 0 {
                            break;
                        }
                        self.depth -= 1;
                    }
                }
            }
        }
    }

    /// The header of the value at `self.pos`, as `walk` reads it.
    fn step(&mut self, src: &[u8], limits: &Limits) -> Result<Option<Step>, ProtocolError> {
        let pos = self.pos;
        let Some(&kind) = src.get(pos) else {
            return Ok(None);
        };
        let found = find_line(src, pos + 1, limits)?;
        let line_end = found.as_ref().map_or(src.len(), |(_, next)| *next);
        self.examined += (line_end - pos) as u64;
        let Some((line, next)) = found else {
            return Ok(None);
        };
        match kind {
            b'+' | b'-' => Ok(Some(Step::Leaf(next))),
            b':' => parse_i64(&src[line]).map(|_| Some(Step::Leaf(next))),
            b'$' => {
                let Some(len) = parse_len(&src[line], limits.max_bulk_len, Limit::BulkLength)?
                else {
                    return Ok(Some(Step::Leaf(next)));
                };
                let end = next + len;
                match (src.get(end), src.get(end + 1)) {
                    (None, _) | (Some(b'\r'), None) => Ok(None),
                    (Some(b'\r'), Some(b'\n')) => Ok(Some(Step::Leaf(end + 2))),
                    _ => Err(ProtocolError::BadLineEnding),
                }
            }
            b'*' => {
                let Some(len) = parse_len(&src[line], limits.max_array_len, Limit::ArrayLength)?
                else {
                    return Ok(Some(Step::Leaf(next)));
                };
                // As `walk`: the top level is depth 1.
                if self.depth + 1 > limits.max_depth.min(DEPTH_CAP) {
                    return Err(ProtocolError::LimitExceeded(Limit::Depth));
                }
                Ok(Some(if len == 0 {
                    Step::Leaf(next)
                } else {
                    Step::Open(len, next)
                }))
            }
            other => Err(ProtocolError::UnknownType(other)),
        }
    }
}

/// [`decode`] with a [`FrameScan`] kept beside the buffer between calls:
/// bytes already scanned are not scanned again.
///
/// # Errors
/// As [`frame_len`]; the buffer is left as it was.
pub fn decode_resumed(
    buf: &mut BytesMut,
    scan: &mut FrameScan,
    limits: &Limits,
) -> Result<Option<Reply>, ProtocolError> {
    // Most replies are one value, not an array (+OK, :1, a nil, an error, a
    // token): found and built in one pass over its header, not two.
    if scan.pos == 0 && scan.depth == 0 {
        match buf.first() {
            Some(b'+' | b'-' | b':' | b'$') => return decode_leaf(buf, scan, limits),
            // A short array of values that are not arrays (a release
            // message, a subscription's confirmation), whole: found and
            // built in one pass too. Anything else takes the scan.
            Some(b'*') => {
                if let Some(reply) = decode_flat(buf, scan, limits) {
                    return Ok(Some(reply));
                }
            }
            _ => {}
        }
    }
    let used = match scan.scan(buf, limits) {
        Ok(Status::Complete { used, .. }) => used,
        Ok(Status::Partial) => return Ok(None),
        Err(e) => {
            scan.reset();
            return Err(e);
        }
    };
    let frame = buf.split_to(used).freeze();
    match walk(&frame, 0, 1, limits, &mut Build { src: &frame })? {
        Some((value, end)) if end == used => Ok(Some(value)),
        // The scan accepted these bytes; reaching here would be a bug,
        // reported rather than panicked on.
        _ => Err(ProtocolError::BadLineEnding),
    }
}

/// The most elements [`decode_flat`] takes an array with.
const FLAT_MAX: usize = 4;

/// [`decode_resumed`] for a whole array of at most [`FLAT_MAX`] values
/// none of which is an array: its elements located in one walk
/// ([`Locate`]), then the frame split off and each sliced from it, as
/// [`FrameScan::scan`] then [`walk`] would make it. `None` for anything
/// else (another shape, an array not all in, an error), left as it was
/// for the scan to answer as it does.
fn decode_flat(buf: &mut BytesMut, scan: &mut FrameScan, limits: &Limits) -> Option<Reply> {
    let view = &buf[..buf.len().min(limits.max_reply_len)];
    let (line, first) = find_line(view, 1, limits).ok()??;
    let count = parse_len(&view[line], limits.max_array_len, Limit::ArrayLength)
        .ok()?
        .filter(|&n| n <= FLAT_MAX)?;
    if 1 > limits.max_depth.min(DEPTH_CAP) {
        return None;
    }
    let mut leaves: [Option<Leaf>; FLAT_MAX] = Default::default();
    let mut header = first as u64;
    let mut at = first;
    for slot in leaves.iter_mut().take(count) {
        if view.get(at) == Some(&b'*') {
            return None;
        }
        let (leaf, after) = walk(view, at, 2, limits, &mut Locate).ok()??;
        header += match &leaf {
            Leaf::Bulk(range) => range.start - at,
            _ => after - at,
        } as u64;
        *slot = Some(leaf);
        at = after;
    }
    scan.examined += header;
    let frame = buf.split_to(at).freeze();
    let mut build = Build { src: &frame };
    let items = leaves
        .into_iter()
        .flatten()
        .map(|leaf| match leaf {
            Leaf::Line(kind, range) => build.line(kind, range),
            Leaf::Integer(n) => build.integer(n),
            Leaf::Bulk(range) => build.bulk(range),
            // Not reached for an array: its first byte was checked above.
            Leaf::Nil | Leaf::Array => build.nil(false),
        })
        .collect();
    Some(build.array(items))
}

/// [`decode_resumed`] for a reply that is not an array: the same answers
/// as [`FrameScan::scan`] then [`walk`], in one walk that locates the value
/// ([`Locate`]) before the frame is split off and the value sliced from it.
fn decode_leaf(
    buf: &mut BytesMut,
    scan: &mut FrameScan,
    limits: &Limits,
) -> Result<Option<Reply>, ProtocolError> {
    // As the scan: a reply longer than allowed is an error once that much
    // has come without its end.
    let view = &buf[..buf.len().min(limits.max_reply_len)];
    let Some((leaf, used)) = walk(view, 0, 1, limits, &mut Locate)? else {
        scan.examined += view.len() as u64;
        if buf.len() > view.len() {
            return Err(ProtocolError::LimitExceeded(Limit::ReplyLength));
        }
        return Ok(None);
    };
    // The header line: the whole value but a bulk string's payload.
    let header = match &leaf {
        Leaf::Bulk(range) => range.start,
        _ => used,
    };
    scan.examined += header as u64;
    // A value that holds no bytes of the frame (an integer, a nil, the
    // `+OK` most commands answer) is not split off: the buffer moves past
    // it, with no shared handle made and dropped.
    Ok(Some(match leaf {
        Leaf::Integer(n) => {
            buf.advance(used);
            Reply::Integer(n)
        }
        Leaf::Nil => {
            buf.advance(used);
            Reply::Nil
        }
        Leaf::Line(b'+', range) if buf[range.clone()] == *b"OK" => {
            buf.advance(used);
            Reply::Status(Bytes::from_static(b"OK"))
        }
        Leaf::Line(kind, range) => Build {
            src: &buf.split_to(used).freeze(),
        }
        .line(kind, range),
        Leaf::Bulk(range) => Reply::Bulk(buf.split_to(used).freeze().slice(range)),
        // Not reached: the first byte is not an array's.
        Leaf::Array => return Err(ProtocolError::UnknownType(b'*')),
    }))
}

/// Where a value that is not an array lies in its frame.
enum Leaf {
    Line(u8, Range<usize>),
    Integer(i64),
    Bulk(Range<usize>),
    Nil,
    Array,
}

/// A [`Sink`] that locates a value, slicing nothing.
struct Locate;

impl Sink for Locate {
    type Out = Leaf;
    fn line(&mut self, kind: u8, range: Range<usize>) -> Leaf {
        Leaf::Line(kind, range)
    }
    fn integer(&mut self, n: i64) -> Leaf {
        Leaf::Integer(n)
    }
    fn bulk(&mut self, range: Range<usize>) -> Leaf {
        Leaf::Bulk(range)
    }
    fn nil(&mut self, _: bool) -> Leaf {
        Leaf::Nil
    }
    fn array(&mut self, _: Vec<Leaf>) -> Leaf {
        Leaf::Array
    }
}

/// What the grammar walk produces for each value: nothing (to measure a
/// frame) or a [`Reply`] sliced from the source.
trait Sink {
    type Out;
    fn line(&mut self, kind: u8, range: Range<usize>) -> Self::Out;
    fn integer(&mut self, n: i64) -> Self::Out;
    fn bulk(&mut self, range: Range<usize>) -> Self::Out;
    fn nil(&mut self, array: bool) -> Self::Out;
    fn array(&mut self, items: Vec<Self::Out>) -> Self::Out;
}

struct Skip;

impl Sink for Skip {
    type Out = ();
    fn line(&mut self, _: u8, _: Range<usize>) {}
    fn integer(&mut self, _: i64) {}
    fn bulk(&mut self, _: Range<usize>) {}
    fn nil(&mut self, _: bool) {}
    fn array(&mut self, _: Vec<()>) {}
}

struct Build<'a> {
    src: &'a Bytes,
}

impl Sink for Build<'_> {
    type Out = Reply;
    fn line(&mut self, kind: u8, range: Range<usize>) -> Reply {
        let s = self.src.slice(range);
        if kind == b'-' {
            Reply::Error(s)
        } else {
            Reply::Status(s)
        }
    }
    fn integer(&mut self, n: i64) -> Reply {
        Reply::Integer(n)
    }
    fn bulk(&mut self, range: Range<usize>) -> Reply {
        Reply::Bulk(self.src.slice(range))
    }
    fn nil(&mut self, array: bool) -> Reply {
        if array { Reply::NilArray } else { Reply::Nil }
    }
    fn array(&mut self, items: Vec<Reply>) -> Reply {
        Reply::Array(items)
    }
}

/// Parses one value starting at `pos`; `Ok(None)` when the input ends first.
/// Returns the value and the position just past it.
fn walk<S: Sink>(
    src: &[u8],
    pos: usize,
    depth: usize,
    limits: &Limits,
    sink: &mut S,
) -> Result<Option<(S::Out, usize)>, ProtocolError> {
    let Some(&kind) = src.get(pos) else {
        return Ok(None);
    };
    let Some((line, next)) = find_line(src, pos + 1, limits)? else {
        return Ok(None);
    };
    match kind {
        b'+' | b'-' => Ok(Some((sink.line(kind, line), next))),
        b':' => Ok(Some((sink.integer(parse_i64(&src[line])?), next))),
        b'$' => {
            let Some(len) = parse_len(&src[line], limits.max_bulk_len, Limit::BulkLength)? else {
                return Ok(Some((sink.nil(false), next)));
            };
            let end = next + len;
            // The trailer is checked byte by byte, so that a wrong first
            // byte is an error even before the second arrives.
            match (src.get(end), src.get(end + 1)) {
                (None, _) | (Some(b'\r'), None) => Ok(None),
                (Some(b'\r'), Some(b'\n')) => Ok(Some((sink.bulk(next..end), end + 2))),
                _ => Err(ProtocolError::BadLineEnding),
            }
        }
        b'*' => {
            let Some(len) = parse_len(&src[line], limits.max_array_len, Limit::ArrayLength)? else {
                return Ok(Some((sink.nil(true), next)));
            };
            if depth > limits.max_depth.min(DEPTH_CAP) {
                return Err(ProtocolError::LimitExceeded(Limit::Depth));
            }
            // Grows with the elements actually present, never to the
            // announced length up front.
            let mut items = Vec::new();
            let mut at = next;
            for _ in 0..len {
                match walk(src, at, depth + 1, limits, sink)? {
                    Some((item, after)) => {
                        items.push(item);
                        at = after;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((sink.array(items), at)))
        }
        other => Err(ProtocolError::UnknownType(other)),
    }
}

/// Finds the CRLF-terminated line starting at `start`: its content range and
/// the position after the CRLF.
fn find_line(
    src: &[u8],
    start: usize,
    limits: &Limits,
) -> Result<Option<(Range<usize>, usize)>, ProtocolError> {
    let rest = src.get(start..).unwrap_or_default();
    let window = &rest[..rest.len().min(limits.max_line_len.saturating_add(1))];
    match memchr::memchr2(b'\r', b'\n', window) {
        Some(i) if window[i] == b'\n' => Err(ProtocolError::BadLineEnding),
        Some(i) => match rest.get(i + 1) {
            None => Ok(None),
            Some(b'\n') => Ok(Some((start..start + i, start + i + 2))),
            Some(_) => Err(ProtocolError::BadLineEnding),
        },
        None if rest.len() > limits.max_line_len => {
            Err(ProtocolError::LimitExceeded(Limit::LineLength))
        }
        None => Ok(None),
    }
}

/// A length line: `-1` is null (`None`), other negatives are errors.
fn parse_len(digits: &[u8], max: usize, limit: Limit) -> Result<Option<usize>, ProtocolError> {
    match parse_i64(digits)? {
        -1 => Ok(None),
        n if n < 0 => Err(ProtocolError::NegativeLength(n)),
        n => match usize::try_from(n) {
            Ok(len) if len <= max => Ok(Some(len)),
            _ => Err(ProtocolError::LimitExceeded(limit)),
        },
    }
}

fn parse_i64(digits: &[u8]) -> Result<i64, ProtocolError> {
    let (negative, body) = match digits.split_first() {
        Some((b'-', body)) => (true, body),
        _ => (false, digits),
    };
    if body.is_empty() {
        return Err(ProtocolError::InvalidInteger);
    }
    // Accumulate as a negative number so that i64::MIN parses.
    let mut n: i64 = 0;
    for &d in body {
        if !d.is_ascii_digit() {
            return Err(ProtocolError::InvalidInteger);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_sub(i64::from(d - b'0')))
            .ok_or(ProtocolError::IntegerOverflow)?;
    }
    if negative {
        Ok(n)
    } else {
        n.checked_neg().ok_or(ProtocolError::IntegerOverflow)
    }
}

/// One argument of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Arg<'a> {
    /// Raw bytes, sent as they are.
    Bytes(&'a [u8]),
    /// An integer, sent as its decimal text.
    Int(i64),
    /// Pieces sent as one argument, one after another: a channel named by
    /// a prefix and a key, say, without joining them first.
    Parts(&'a [&'a [u8]]),
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(b: &'a [u8]) -> Self {
        Arg::Bytes(b)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(s: &'a str) -> Self {
        Arg::Bytes(s.as_bytes())
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for Arg<'a> {
    fn from(b: &'a [u8; N]) -> Self {
        Arg::Bytes(b)
    }
}

impl From<i64> for Arg<'_> {
    fn from(n: i64) -> Self {
        Arg::Int(n)
    }
}

/// How many arguments the command of `args` has, and how many bytes
/// [`encode_command`] writes for it.
fn command_size<'a>(args: impl Iterator<Item = Arg<'a>>) -> (usize, usize) {
    let mut count = 0usize;
    let mut total = 0usize;
    for arg in args {
        let payload = match arg {
            Arg::Bytes(b) => b.len(),
            Arg::Int(n) => decimal_len(n),
            Arg::Parts(parts) => parts.iter().map(|p| p.len()).sum(),
        };
        count += 1;
        total += 1 + decimal_len(len_i64(payload)) + 2 + payload + 2;
    }
    (count, total + 1 + decimal_len(len_i64(count)) + 2)
}

/// How many bytes [`encode_command`] writes for `args`.
pub(crate) fn command_len(args: &[Arg<'_>]) -> usize {
    command_size(args.iter().copied()).1
}

/// Appends one command, an array of bulk strings, to `dst`. The exact size
/// is computed first and reserved once; integers are formatted on the stack.
pub fn encode_command(dst: &mut BytesMut, args: &[Arg<'_>]) {
    encode_command_iter(dst, args.iter().copied());
}

/// As [`encode_command`], for arguments that come from an iterator (a key
/// list between fixed arguments, say): walked twice, once to size the
/// command and once to write it, so that nothing is collected.
pub fn encode_command_iter<'a, I>(dst: &mut BytesMut, args: I)
where
    I: Iterator<Item = Arg<'a>> + Clone,
{
    let mut scratch = [0u8; 20];
    let (count, total) = command_size(args.clone());
    dst.reserve(total);
    put_int_line(dst, b'*', len_i64(count));
    for arg in args {
        match arg {
            Arg::Bytes(b) => {
                put_int_line(dst, b'$', len_i64(b.len()));
                dst.put_slice(b);
            }
            Arg::Int(n) => {
                let text = format_i64(n, &mut scratch);
                put_int_line(dst, b'$', len_i64(text.len()));
                put_digits(dst, text);
            }
            Arg::Parts(parts) => {
                let len = parts.iter().map(|p| p.len()).sum();
                put_int_line(dst, b'$', len_i64(len));
                for part in parts {
                    dst.put_slice(part);
                }
            }
        }
        dst.put_slice(b"\r\n");
    }
}

/// Buffer lengths always fit in an i64 on the platforms Rust supports.
fn len_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn put_line(dst: &mut BytesMut, kind: u8, body: &[u8]) {
    dst.put_u8(kind);
    dst.put_slice(body);
    dst.put_slice(b"\r\n");
}

fn put_int_line(dst: &mut BytesMut, kind: u8, n: i64) {
    let mut scratch = [0u8; 20];
    dst.put_u8(kind);
    put_digits(dst, format_i64(n, &mut scratch));
    dst.put_slice(b"\r\n");
}

/// Appends a number's few digits a byte at a time: cheaper than a copy
/// of unknown length for the one to three digits of most lengths.
fn put_digits(dst: &mut BytesMut, digits: &[u8]) {
    for &digit in digits {
        dst.put_u8(digit);
    }
}

/// Formats `n` in decimal into the tail of `buf`, returning the text.
pub(crate) fn format_i64(n: i64, buf: &mut [u8; 20]) -> &[u8] {
    // Most lengths (a token's 48, a key's) and counts: one or two digits,
    // written without the loop.
    if let Ok(small @ 0..=99) = u8::try_from(n) {
        if small < 10 {
            buf[19] = b'0' + small;
            return &buf[19..];
        }
        buf[18] = b'0' + small / 10;
        buf[19] = b'0' + small % 10;
        return &buf[18..];
    }
    let mut at = buf.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        buf[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    &buf[at..]
}

fn decimal_len(n: i64) -> usize {
    let mut len = usize::from(n < 0) + 1;
    let mut rest = n.unsigned_abs();
    while rest >= 10 {
        rest /= 10;
        len += 1;
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_len_is_what_encode_command_writes() {
        let cases: [&[Arg<'_>]; 5] = [
            &[],
            &[Arg::Bytes(b"SUBSCRIBE"), Arg::Bytes(b"redlock:released:r")],
            &[
                Arg::Bytes(b""),
                Arg::Int(0),
                Arg::Int(-7),
                Arg::Int(i64::MIN),
            ],
            &[Arg::Bytes(&[b'x'; 1000]), Arg::Int(1234567890)],
            &[
                Arg::Bytes(b"PUBLISH"),
                Arg::Parts(&[&b"redlock:released:"[..], &b"r"[..]]),
                Arg::Parts(&[]),
            ],
        ];
        for args in cases {
            let mut dst = BytesMut::new();
            encode_command(&mut dst, args);
            assert_eq!(command_len(args), dst.len(), "{args:?}");
        }
    }

    /// Short arrays of plain values (release messages, confirmations) are
    /// decoded in one walk; every other array, and any array not all in,
    /// through the scan. Either way the reply, what is left in the buffer
    /// and the error are those of `parse` on the whole input, fed whole or
    /// a byte at a time.
    #[test]
    fn short_flat_arrays_decode_as_the_scan_does() {
        let cases: &[&[u8]] = &[
            b"*3\r\n$7\r\nmessage\r\n$2\r\nr0\r\n$5\r\ntoken\r\n",
            b"*3\r\n$9\r\nsubscribe\r\n$2\r\nr0\r\n:1\r\n",
            b"*4\r\n+OK\r\n-ERR no\r\n$-1\r\n:-7\r\n",
            b"*0\r\n",
            b"*-1\r\n",
            b"*2\r\n*1\r\n:1\r\n:2\r\n",
            b"*2\r\n*-1\r\n:2\r\n",
            b"*5\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n",
            b"*2\r\n:1\r\n?\r\n",
            b"*2\r\n$3\r\nab\r\n",
        ];
        for &case in cases {
            let mut wire = case.to_vec();
            wire.extend_from_slice(b":9\r\n");
            let whole = parse(&Bytes::copy_from_slice(&wire), &Limits::default());
            let expected = match whole {
                Ok(Status::Complete { value, used }) => Ok(Some((value, wire.len() - used))),
                Ok(Status::Partial) => Ok(None),
                Err(e) => Err(e),
            };
            let mut buf = BytesMut::from(&wire[..]);
            let mut scan = FrameScan::new();
            let got = decode_resumed(&mut buf, &mut scan, &Limits::default())
                .map(|reply| reply.map(|reply| (reply, buf.len())));
            assert_eq!(got, expected, "whole: {:?}", String::from_utf8_lossy(case));
            let mut buf = BytesMut::new();
            let mut scan = FrameScan::new();
            let mut got = Ok(None);
            for (fed, &byte) in wire.iter().enumerate() {
                buf.extend_from_slice(&[byte]);
                got = decode_resumed(&mut buf, &mut scan, &Limits::default())
                    .map(|reply| reply.map(|reply| (reply, wire.len() - fed - 1 + buf.len())));
                if !matches!(got, Ok(None)) {
                    break;
                }
            }
            assert_eq!(
                got,
                expected,
                "bytewise: {:?}",
                String::from_utf8_lossy(case)
            );
        }
    }

    /// A master that sends a reply a byte at a time.
    /// Scanning it from its start on every byte (what `decode` does, and
    /// what the connection did) is quadratic; the resumed scan looks at
    /// each header a bounded number of times.
    #[test]
    fn a_reply_arriving_a_byte_at_a_time_is_scanned_in_linear_time() {
        let mut wire = b"*1000\r\n".to_vec();
        for _ in 0..1000 {
            wire.extend_from_slice(b":1\r\n");
        }
        let limits = Limits::default();
        let mut resumed = FrameScan::new();
        let mut restarted = 0;
        for cut in 1..wire.len() {
            assert_eq!(resumed.scan(&wire[..cut], &limits), Ok(Status::Partial));
            let mut fresh = FrameScan::new();
            assert_eq!(fresh.scan(&wire[..cut], &limits), Ok(Status::Partial));
            restarted += fresh.examined();
        }
        let len = wire.len();
        assert_eq!(
            resumed.scan(&wire, &limits),
            Ok(Status::Complete {
                value: len,
                used: len
            })
        );
        let linear = resumed.examined();
        assert!(
            linear <= 3 * len as u64,
            "{linear} bytes examined for a {len}-byte reply"
        );
        // The same input restarted on every byte: about len^2 / 2.
        assert!(restarted > 500 * len as u64, "{restarted}");
    }

    fn parse_all(input: &[u8]) -> Result<Status<Reply>, ProtocolError> {
        parse(&Bytes::copy_from_slice(input), &Limits::default())
    }

    fn complete(input: &[u8]) -> Reply {
        match parse_all(input) {
            Ok(Status::Complete { value, used }) => {
                assert_eq!(used, input.len(), "whole input used for {input:?}");
                value
            }
            other => panic!("{input:?} did not parse whole: {other:?}"),
        }
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn every_reply_kind_parses_whole() {
        let cases: &[(&str, &[u8], Reply)] = &[
            ("simple string", b"+OK\r\n", Reply::Status(b("OK"))),
            ("empty simple string", b"+\r\n", Reply::Status(b(""))),
            (
                "error",
                b"-NOSCRIPT No matching script\r\n",
                Reply::Error(b("NOSCRIPT No matching script")),
            ),
            ("integer one", b":1\r\n", Reply::Integer(1)),
            ("integer zero", b":0\r\n", Reply::Integer(0)),
            ("negative integer", b":-42\r\n", Reply::Integer(-42)),
            (
                "largest integer",
                b":9223372036854775807\r\n",
                Reply::Integer(i64::MAX),
            ),
            (
                "smallest integer",
                b":-9223372036854775808\r\n",
                Reply::Integer(i64::MIN),
            ),
            ("bulk", b"$3\r\nabc\r\n", Reply::Bulk(b("abc"))),
            ("empty bulk", b"$0\r\n\r\n", Reply::Bulk(b(""))),
            (
                "bulk holding CRLF",
                b"$4\r\na\r\nb\r\n",
                Reply::Bulk(b("a\r\nb")),
            ),
            ("null bulk", b"$-1\r\n", Reply::Nil),
            ("null array", b"*-1\r\n", Reply::NilArray),
            ("empty array", b"*0\r\n", Reply::Array(vec![])),
            (
                "flat array",
                b"*2\r\n:1\r\n$-1\r\n",
                Reply::Array(vec![Reply::Integer(1), Reply::Nil]),
            ),
            (
                "nested array",
                b"*2\r\n*1\r\n+a\r\n*0\r\n",
                Reply::Array(vec![
                    Reply::Array(vec![Reply::Status(b("a"))]),
                    Reply::Array(vec![]),
                ]),
            ),
        ];
        for (name, input, want) in cases {
            assert_eq!(&complete(input), want, "{name}");
        }
    }

    #[test]
    fn every_split_point_gives_the_same_reply() {
        let inputs: &[&[u8]] = &[
            b"+OK\r\n",
            b"-ERR x\r\n",
            b":-12\r\n",
            b"$5\r\nhello\r\n",
            b"$-1\r\n",
            b"*3\r\n:1\r\n*1\r\n$2\r\nab\r\n*-1\r\n",
        ];
        for input in inputs {
            let whole = complete(input);
            for cut in 0..input.len() {
                assert_eq!(
                    parse_all(&input[..cut]),
                    Ok(Status::Partial),
                    "{input:?} cut at {cut}"
                );
            }
            // Byte by byte into one growing buffer, as a socket would deliver.
            let mut buf = BytesMut::new();
            let mut got = None;
            for &byte in *input {
                assert!(got.is_none(), "reply completed before its last byte");
                buf.put_u8(byte);
                got = decode(&mut buf, &Limits::default()).unwrap();
            }
            assert_eq!(got, Some(whole));
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn pipelined_replies_parse_one_after_another() {
        let mut buf = BytesMut::from(&b"+OK\r\n$-1\r\n:1\r\n-NOSCRIPT x\r\n$2\r\nab\r\n+O"[..]);
        let limits = Limits::default();
        let mut got = Vec::new();
        while let Some(reply) = decode(&mut buf, &limits).unwrap() {
            got.push(reply);
        }
        assert_eq!(
            got,
            vec![
                Reply::Status(b("OK")),
                Reply::Nil,
                Reply::Integer(1),
                Reply::Error(b("NOSCRIPT x")),
                Reply::Bulk(b("ab")),
            ]
        );
        assert_eq!(&buf[..], b"+O", "the partial tail stays in the buffer");
    }

    #[test]
    fn malformed_input_is_a_typed_error() {
        let cases: &[(&str, &[u8], ProtocolError)] = &[
            (
                "unknown type byte",
                b"!x\r\n",
                ProtocolError::UnknownType(b'!'),
            ),
            ("CR without LF", b"+OK\rx\n", ProtocolError::BadLineEnding),
            ("LF without CR", b"+OK\n", ProtocolError::BadLineEnding),
            ("empty integer", b":\r\n", ProtocolError::InvalidInteger),
            ("lone minus", b":-\r\n", ProtocolError::InvalidInteger),
            (
                "non-digit integer",
                b":1a\r\n",
                ProtocolError::InvalidInteger,
            ),
            (
                "plus-signed integer",
                b":+1\r\n",
                ProtocolError::InvalidInteger,
            ),
            ("non-digit length", b"$x\r\n", ProtocolError::InvalidInteger),
            (
                "integer overflow",
                b":9223372036854775808\r\n",
                ProtocolError::IntegerOverflow,
            ),
            (
                "integer underflow",
                b":-9223372036854775809\r\n",
                ProtocolError::IntegerOverflow,
            ),
            (
                "length overflow",
                b"$99999999999999999999\r\n",
                ProtocolError::IntegerOverflow,
            ),
            (
                "negative bulk length",
                b"$-2\r\n",
                ProtocolError::NegativeLength(-2),
            ),
            (
                "negative array length",
                b"*-5\r\n",
                ProtocolError::NegativeLength(-5),
            ),
            (
                "bulk longer than announced",
                b"$2\r\nabc\r\n",
                ProtocolError::BadLineEnding,
            ),
            (
                "bulk trailer wrong before it is complete",
                b"$2\r\nabc",
                ProtocolError::BadLineEnding,
            ),
            (
                "bad element inside an array",
                b"*2\r\n:1\r\n?\r\n",
                ProtocolError::UnknownType(b'?'),
            ),
        ];
        for (name, input, want) in cases {
            assert_eq!(parse_all(input), Err(*want), "{name}");
        }
    }

    #[test]
    fn errors_do_not_consume_the_buffer() {
        let mut buf = BytesMut::from(&b"!bad\r\n"[..]);
        assert!(decode(&mut buf, &Limits::default()).is_err());
        assert_eq!(&buf[..], b"!bad\r\n");
    }

    fn small_limits() -> Limits {
        Limits {
            max_bulk_len: 4,
            max_array_len: 2,
            max_depth: 2,
            max_line_len: 6,
            max_reply_len: 12,
        }
    }

    #[test]
    fn limits_hold_at_the_limit_and_fail_one_past_it() {
        let limits = small_limits();
        let cases: &[(&str, &[u8], Option<Limit>)] = &[
            ("bulk at limit", b"$4\r\nabcd\r\n", None),
            ("bulk past limit", b"$5\r\n", Some(Limit::BulkLength)),
            ("array at limit", b"*2\r\n:1\r\n:2\r\n", None),
            ("array past limit", b"*3\r\n", Some(Limit::ArrayLength)),
            ("depth at limit", b"*1\r\n*1\r\n:1\r\n", None),
            (
                "depth past limit",
                b"*1\r\n*1\r\n*1\r\n",
                Some(Limit::Depth),
            ),
            ("line at limit", b"+abcdef\r\n", None),
            ("reply at limit", b"*2\r\n:1\r\n:2\r\n", None),
            (
                "reply past limit",
                b"*2\r\n:1\r\n:22\r\n",
                Some(Limit::ReplyLength),
            ),
            (
                "partial reply past limit",
                b"*2\r\n:1\r\n:2222",
                Some(Limit::ReplyLength),
            ),
            ("line past limit", b"+abcdefg", Some(Limit::LineLength)),
            (
                "integer line past limit",
                b":1234567",
                Some(Limit::LineLength),
            ),
        ];
        for (name, input, want) in cases {
            let got = parse(&Bytes::copy_from_slice(input), &limits);
            match want {
                None => assert!(
                    matches!(got, Ok(Status::Complete { used, .. }) if used == input.len()),
                    "{name}: {got:?}"
                ),
                Some(limit) => assert_eq!(got, Err(ProtocolError::LimitExceeded(*limit)), "{name}"),
            }
        }
    }

    #[test]
    fn limits_at_their_maximum_mean_no_limit_and_never_overflow() {
        let limits = Limits {
            max_bulk_len: usize::MAX,
            max_array_len: usize::MAX,
            max_depth: usize::MAX,
            max_line_len: usize::MAX,
            max_reply_len: usize::MAX,
        };
        let got = parse(&Bytes::from_static(b"*1\r\n+OK\r\n"), &limits);
        assert!(
            matches!(got, Ok(Status::Complete { used: 9, .. })),
            "{got:?}"
        );
    }

    #[test]
    fn a_huge_announced_bulk_is_refused_before_its_payload_arrives() {
        let got = parse_all(b"$1000000000\r\n");
        assert_eq!(got, Err(ProtocolError::LimitExceeded(Limit::BulkLength)));
    }

    #[test]
    fn an_announced_array_length_is_not_allocated_up_front() {
        let limits = Limits {
            max_array_len: usize::MAX,
            ..Limits::default()
        };
        let got = parse(
            &Bytes::from_static(b"*9223372036854775807\r\n:1\r\n"),
            &limits,
        );
        assert_eq!(got, Ok(Status::Partial));
    }

    #[test]
    fn commands_encode_to_the_exact_wire_form() {
        let mut dst = BytesMut::new();
        encode_command(
            &mut dst,
            &[
                "SET".into(),
                b"k".into(),
                Arg::Bytes(b""),
                Arg::Int(-7),
                Arg::Int(i64::MIN),
            ],
        );
        let want: &[u8] =
            b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$2\r\n-7\r\n$20\r\n-9223372036854775808\r\n";
        assert_eq!(&dst[..], want);
        assert_eq!(
            dst.capacity(),
            dst.len(),
            "exactly one reserve of the exact size"
        );
    }

    #[test]
    fn encoded_commands_parse_back_as_arrays_of_bulks() {
        let long = vec![b'x'; 300];
        let args = [
            Arg::Bytes(b"EVALSHA"),
            Arg::Bytes(&long),
            Arg::Int(0),
            Arg::Int(1_000_000_007),
            Arg::Bytes(b"a\r\nb"),
        ];
        let mut dst = BytesMut::new();
        encode_command(&mut dst, &args);
        let want = Reply::Array(vec![
            Reply::Bulk(b("EVALSHA")),
            Reply::Bulk(Bytes::from(long.clone())),
            Reply::Bulk(b("0")),
            Reply::Bulk(b("1000000007")),
            Reply::Bulk(b("a\r\nb")),
        ]);
        assert_eq!(complete(&dst), want);
    }

    #[test]
    fn replies_round_trip_through_encode() {
        let replies = [
            Reply::Status(b("OK")),
            Reply::Error(b("ERR x")),
            Reply::Integer(i64::MIN),
            Reply::Bulk(b("")),
            Reply::Nil,
            Reply::NilArray,
            Reply::Array(vec![Reply::Array(vec![]), Reply::Bulk(b("z"))]),
        ];
        for reply in replies {
            let mut dst = BytesMut::new();
            reply.encode(&mut dst);
            assert_eq!(complete(&dst), reply);
        }
    }

    #[test]
    fn decimal_helpers_agree_with_std() {
        let mut scratch = [0u8; 20];
        for n in [0, 9, 10, 99, 100, -1, -10, i64::MAX, i64::MIN, 1234567890] {
            let text = format_i64(n, &mut scratch).to_vec();
            assert_eq!(text, n.to_string().into_bytes());
            assert_eq!(decimal_len(n), text.len());
        }
    }

    #[test]
    fn error_codes_match_the_first_word_only() {
        assert!(Reply::Error(b("NOSCRIPT No matching")).is_error_code(b"NOSCRIPT"));
        assert!(Reply::Error(b("NOSCRIPT")).is_error_code(b"NOSCRIPT"));
        assert!(!Reply::Error(b("NOSCRIPTX y")).is_error_code(b"NOSCRIPT"));
        assert!(!Reply::Status(b("NOSCRIPT")).is_error_code(b"NOSCRIPT"));
    }
}
