//! memcached's binary protocol (a connection whose first byte is `0x80`), served by
//! translation: each binary request becomes the text or meta [`Request`] with the same
//! meaning (meta commands carry what binary carries: CAS in and out, flags, TTL, quiet,
//! incr's initial value), the service answers it as text, and [`respond`] turns that text
//! reply into memcached's binary response — status codes and messages as memcached 1.6
//! writes them.
//!
//! ```text
//!  24-byte header + extras + key + value ──► frame ──► translate ──► Request (meta/text)
//!  binary response ◄── respond ◄── text reply ◄── Service::call
//! ```
//!
//! Keys are taken as bytes, as memcached takes them (no text-key rules), up to 250.

use std::io::Write as _;

use crate::meta::{MetaCommand, MetaFlags, MetaKey};
use crate::request::Request;
use crate::MAX_KEY_LEN;

/// The first byte of every binary request.
pub const REQUEST_MAGIC: u8 = 0x80;
const RESPONSE_MAGIC: u8 = 0x81;
/// Bytes of a request or response header.
pub const HEADER_LEN: usize = 24;

/// Response statuses (memcached's `protocol_binary_response_status`).
pub mod status {
    /// Success.
    pub const OK: u16 = 0x00;
    /// Key not found.
    pub const KEY_ENOENT: u16 = 0x01;
    /// Key exists (add, or a CAS mismatch).
    pub const KEY_EEXISTS: u16 = 0x02;
    /// Value too large.
    pub const E2BIG: u16 = 0x03;
    /// Invalid arguments (a malformed request: the connection closes after it).
    pub const EINVAL: u16 = 0x04;
    /// Item not stored (append/prepend to a missing key).
    pub const NOT_STORED: u16 = 0x05;
    /// Incr/decr on a non-numeric value.
    pub const DELTA_BADVAL: u16 = 0x06;
    /// Authentication required or failed.
    pub const AUTH_ERROR: u16 = 0x20;
    /// Unknown command.
    pub const UNKNOWN_COMMAND: u16 = 0x81;
    /// Out of memory.
    pub const ENOMEM: u16 = 0x82;
}

/// The message memcached puts in the body of an error response.
fn message(status: u16) -> &'static [u8] {
    match status {
        status::KEY_ENOENT => b"Not found",
        status::KEY_EEXISTS => b"Data exists for key.",
        status::E2BIG => b"Too large.",
        status::EINVAL => b"Invalid arguments",
        status::NOT_STORED => b"Not stored.",
        status::DELTA_BADVAL => b"Non-numeric server-side value for incr or decr",
        status::AUTH_ERROR => b"Auth failure.",
        status::ENOMEM => b"Out of memory",
        _ => b"Unknown command",
    }
}

mod op {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// A request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The command.
    pub opcode: u8,
    /// Bytes of key (after the extras).
    pub key_len: u16,
    /// Bytes of extras (first in the body).
    pub extras_len: u8,
    /// Bytes of extras, key and value.
    pub body_len: u32,
    /// Echoed in the response.
    pub opaque: u32,
    /// The compare value (0: none).
    pub cas: u64,
}

impl Header {
    fn quiet(&self) -> bool {
        matches!(
            self.opcode,
            op::GETQ
                | op::GETKQ
                | op::SETQ
                | op::ADDQ
                | op::REPLACEQ
                | op::DELETEQ
                | op::INCREMENTQ
                | op::DECREMENTQ
                | op::QUITQ
                | op::FLUSHQ
                | op::APPENDQ
                | op::PREPENDQ
                | op::GATQ
                | op::GATKQ
        )
    }

    /// Where the key of a `SET`/`SETQ` refused as too large lies in its packet (from the
    /// packet's start), when it has one: memcached reads extras and key before it refuses
    /// the value, and removes that key's old value so that no stale value stays readable.
    /// Other commands (and a key longer than any key may be) remove nothing.
    pub fn too_large_drops(&self) -> Option<std::ops::Range<usize>> {
        let start = HEADER_LEN + self.extras_len as usize;
        let end = start + self.key_len as usize;
        (matches!(self.opcode, op::SET | op::SETQ)
            && self.key_len > 0
            && self.key_len as usize <= MAX_KEY_LEN
            && end <= HEADER_LEN + self.body_len as usize)
            .then_some(start..end)
    }

    /// Whether a value (not only extras and key) may follow: the body may be as long as
    /// an item.
    pub fn stores(&self) -> bool {
        matches!(
            self.opcode,
            op::SET
                | op::ADD
                | op::REPLACE
                | op::APPEND
                | op::PREPEND
                | op::SETQ
                | op::ADDQ
                | op::REPLACEQ
                | op::APPENDQ
                | op::PREPENDQ
        )
    }
}

/// One binary request framed from the input.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// More bytes are needed for the header or the body.
    Incomplete,
    /// Not a binary request (memcached closes the connection, silently).
    BadMagic,
    /// A whole request: its header, and `HEADER_LEN + body_len` bytes.
    Packet(Header),
    /// A body longer than any request may be (`item_size_max` for a value): answered
    /// (`E2BIG` for a storage command, else `EINVAL`, which closes) and its body swallowed.
    TooLarge(Header),
}

/// Frames the request at the start of `input`; values may be up to `item_size_max`.
pub fn frame(input: &[u8], item_size_max: usize) -> Frame {
    if input.len() < HEADER_LEN {
        return Frame::Incomplete;
    }
    if input[0] != REQUEST_MAGIC {
        return Frame::BadMagic;
    }
    let be16 = |i: usize| u16::from_be_bytes([input[i], input[i + 1]]);
    let be32 = |i: usize| u32::from_be_bytes([input[i], input[i + 1], input[i + 2], input[i + 3]]);
    let header = Header {
        opcode: input[1],
        key_len: be16(2),
        extras_len: input[4],
        body_len: be32(8),
        opaque: be32(12),
        cas: (u64::from(be32(16)) << 32) | u64::from(be32(20)),
    };
    let body = header.body_len as usize;
    // Extras (at most 20) and a key (at most 250) besides a value.
    let max = if header.stores() {
        item_size_max + 32 + MAX_KEY_LEN
    } else {
        2048
    };
    if body > max {
        return Frame::TooLarge(header);
    }
    if input.len() < HEADER_LEN + body {
        return Frame::Incomplete;
    }
    Frame::Packet(header)
}

/// What a binary request becomes.
// Made and matched at once, on the stack, never stored: boxing the request would cost an
// allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Translated<'a> {
    /// Served by the service as this request; [`respond`] translates its reply.
    Call(Request<'a>),
    /// Answered here: `noop` (and `quit`, which then closes) — a response with this
    /// status unless quiet.
    Direct,
    /// Malformed: answered `EINVAL`, and the connection closes (as memcached does).
    Invalid,
    /// An opcode not served: `UNKNOWN_COMMAND`; the connection stays.
    Unknown,
}

/// Whether the connection closes after this request's response.
pub fn closes(header: &Header) -> bool {
    matches!(header.opcode, op::QUIT | op::QUITQ)
}

/// Translates request `header` with `body` (its extras, key and value) into the request
/// the service serves, writing meta flag text into `scratch` (reused: no allocation once
/// it has grown): the body taken apart ([`Body`]), then one step per family of opcodes.
pub fn translate<'a>(header: &Header, body: &'a [u8], scratch: &'a mut Vec<u8>) -> Translated<'a> {
    let Some(body) = Body::split(header, body) else {
        return Translated::Invalid;
    };
    scratch.clear();
    match header.opcode {
        op::GET
        | op::GETQ
        | op::GETK
        | op::GETKQ
        | op::TOUCH
        | op::GAT
        | op::GATQ
        | op::GATK
        | op::GATKQ => retrieval(header, &body, scratch),
        op::SET
        | op::SETQ
        | op::ADD
        | op::ADDQ
        | op::REPLACE
        | op::REPLACEQ
        | op::APPEND
        | op::APPENDQ
        | op::PREPEND
        | op::PREPENDQ => storage(header, &body, scratch),
        op::DELETE | op::DELETEQ => delete(header, &body, scratch),
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            arithmetic(header, &body, scratch)
        }
        op::QUIT | op::QUITQ | op::NOOP | op::VERSION | op::FLUSH | op::FLUSHQ | op::STAT => {
            server(header, &body)
        }
        _ => Translated::Unknown,
    }
}

/// A binary request's body taken apart: extras, key, value.
struct Body<'a> {
    extras: &'a [u8],
    key: &'a [u8],
    value: &'a [u8],
}

impl<'a> Body<'a> {
    /// The parts of `body` as `header` lays them out; `None` if they do not fit in it, or
    /// the key is too long.
    fn split(header: &Header, body: &'a [u8]) -> Option<Body<'a>> {
        let ext = header.extras_len as usize;
        let klen = header.key_len as usize;
        if ext + klen > body.len() || klen > MAX_KEY_LEN {
            return None;
        }
        Some(Body {
            extras: &body[..ext],
            key: &body[ext..ext + klen],
            value: &body[ext + klen..],
        })
    }

    /// The shape memcached checks: `extras` bytes of extras, a key or none, a value or none.
    fn shaped(&self, extras: usize, needs_key: bool, has_value: bool) -> bool {
        self.extras.len() == extras
            && self.key.is_empty() != needs_key
            && (has_value || self.value.is_empty())
    }

    /// The 32-bit big-endian number at `at` in the extras (the caller checked their length).
    fn be32(&self, at: usize) -> u32 {
        let b = &self.extras[at..at + 4];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// The 64-bit big-endian number at `at` in the extras.
    fn be64(&self, at: usize) -> u64 {
        (u64::from(self.be32(at)) << 32) | u64::from(self.be32(at + 4))
    }

    /// Meta command `command` on the key with the flags written in `scratch` (an `ms`
    /// carries the value).
    fn meta(&self, command: MetaCommand, scratch: &'a [u8]) -> Translated<'a> {
        match MetaFlags::parse(command, scratch) {
            Ok(flags) => Translated::Call(Request::Meta {
                command,
                key: MetaKey::plain(self.key),
                flags,
                data: if command == MetaCommand::Set {
                    self.value
                } else {
                    &[]
                },
            }),
            Err(_) => Translated::Invalid,
        }
    }
}

/// `get` (`v f c`), `touch` (`T`), `gat` (`T v f c`) and their quiet and key forms as `mg`.
fn retrieval<'a>(header: &Header, body: &Body<'a>, scratch: &'a mut Vec<u8>) -> Translated<'a> {
    if matches!(header.opcode, op::GET | op::GETQ | op::GETK | op::GETKQ) {
        if !body.shaped(0, true, false) {
            return Translated::Invalid;
        }
        scratch.extend_from_slice(b"v f c");
        return body.meta(MetaCommand::Get, scratch);
    }
    if !body.shaped(4, true, false) {
        return Translated::Invalid;
    }
    let _ = write!(scratch, "T{}", body.be32(0));
    if header.opcode != op::TOUCH {
        scratch.extend_from_slice(b" v");
    }
    scratch.extend_from_slice(b" f c");
    body.meta(MetaCommand::Get, scratch)
}

/// `set add replace` (flags and expiry in the extras) and `append prepend` (none) as `ms`
/// in the matching mode, a non-zero CAS as `C`.
fn storage<'a>(header: &Header, body: &Body<'a>, scratch: &'a mut Vec<u8>) -> Translated<'a> {
    let mode = match header.opcode {
        op::SET | op::SETQ => 'S',
        op::ADD | op::ADDQ => 'E',
        op::REPLACE | op::REPLACEQ => 'R',
        op::APPEND | op::APPENDQ => 'A',
        _ => 'P',
    };
    if matches!(mode, 'A' | 'P') {
        if !body.shaped(0, true, true) {
            return Translated::Invalid;
        }
        let _ = write!(scratch, "M{mode} c");
    } else {
        if !body.shaped(8, true, true) {
            return Translated::Invalid;
        }
        let _ = write!(scratch, "F{} T{} M{mode} c", body.be32(0), body.be32(4));
    }
    if header.cas != 0 {
        let _ = write!(scratch, " C{}", header.cas);
    }
    body.meta(MetaCommand::Set, scratch)
}

/// `delete` as `md`, a non-zero CAS as `C`.
fn delete<'a>(header: &Header, body: &Body<'a>, scratch: &'a mut Vec<u8>) -> Translated<'a> {
    if !body.shaped(0, true, false) {
        return Translated::Invalid;
    }
    if header.cas != 0 {
        let _ = write!(scratch, "C{}", header.cas);
    }
    body.meta(MetaCommand::Delete, scratch)
}

/// `increment decrement` as `ma`: delta, and unless the expiry is `0xffffffff` the item
/// created with the initial value on a miss.
fn arithmetic<'a>(header: &Header, body: &Body<'a>, scratch: &'a mut Vec<u8>) -> Translated<'a> {
    if !body.shaped(20, true, false) {
        return Translated::Invalid;
    }
    let incr = matches!(header.opcode, op::INCREMENT | op::INCREMENTQ);
    let (delta, initial, exptime) = (body.be64(0), body.be64(8), body.be32(16));
    let _ = write!(scratch, "D{delta} M{} v c", if incr { 'I' } else { 'D' });
    // 0xffffffff: fail on a miss; else create the item with the initial value.
    if exptime != u32::MAX {
        let _ = write!(scratch, " N{exptime} J{initial}");
    }
    if header.cas != 0 {
        let _ = write!(scratch, " C{}", header.cas);
    }
    body.meta(MetaCommand::Arith, scratch)
}

/// `quit noop` (answered here), `version`, `flush` (an optional delay), `stat` (an optional
/// group as the key).
fn server<'a>(header: &Header, body: &Body<'a>) -> Translated<'a> {
    match header.opcode {
        op::QUIT | op::QUITQ | op::NOOP if body.shaped(0, false, false) => Translated::Direct,
        op::VERSION if body.shaped(0, false, false) => Translated::Call(Request::Version),
        op::FLUSH | op::FLUSHQ
            if matches!(body.extras.len(), 0 | 4)
                && body.key.is_empty()
                && body.value.is_empty() =>
        {
            let delay = if body.extras.len() == 4 {
                i64::from(body.be32(0))
            } else {
                0
            };
            Translated::Call(Request::FlushAll {
                delay,
                noreply: false,
            })
        }
        op::STAT if body.shaped(0, !body.key.is_empty(), false) => {
            Translated::Call(Request::Stats {
                group: (!body.key.is_empty()).then_some(body.key),
            })
        }
        _ => Translated::Invalid,
    }
}

/// Appends a response header for `header`'s request.
fn response_header(
    out: &mut Vec<u8>,
    header: &Header,
    status: u16,
    extras_len: u8,
    key_len: usize,
    body_len: usize,
    cas: u64,
) {
    out.push(RESPONSE_MAGIC);
    out.push(header.opcode);
    out.extend_from_slice(&(key_len as u16).to_be_bytes());
    out.push(extras_len);
    out.push(0);
    out.extend_from_slice(&status.to_be_bytes());
    out.extend_from_slice(&(body_len as u32).to_be_bytes());
    out.extend_from_slice(&header.opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
}

/// Appends an error response for `header`'s request with memcached's message.
pub fn error(out: &mut Vec<u8>, header: &Header, status: u16) {
    let msg = message(status);
    response_header(out, header, status, 0, 0, msg.len(), 0);
    out.extend_from_slice(msg);
}

/// Appends the response to a request answered here ([`Translated::Direct`]: `noop`,
/// `quit`); nothing for `quitq`.
pub fn direct(out: &mut Vec<u8>, header: &Header) {
    if !header.quiet() {
        response_header(out, header, status::OK, 0, 0, 0, 0);
    }
}

/// The number after `letter` among a meta reply's flags (`c123` → 123).
fn flag(flags: &[u8], letter: u8) -> Option<u64> {
    flags
        .split(|&b| b == b' ')
        .find(|t| t.first() == Some(&letter))
        .and_then(|t| std::str::from_utf8(&t[1..]).ok()?.parse().ok())
}

/// The text reply's first line (without its `\r\n`) and what follows it.
fn first_line(text: &[u8]) -> (&[u8], &[u8]) {
    match memchr::memmem::find(text, b"\r\n") {
        Some(i) => (&text[..i], &text[i + 2..]),
        None => (text, &[]),
    }
}

/// Translates the service's text reply to `header`'s request (translated with `key`) into
/// the binary response, appended to `out`; quiet requests' usual replies are left out.
pub fn respond(out: &mut Vec<u8>, header: &Header, key: &[u8], text: &[u8]) {
    let (line, rest) = first_line(text);
    let quiet = header.quiet();
    // Errors the service answers alike for every command.
    if let Some(reason) = line.strip_prefix(b"SERVER_ERROR ") {
        let status = if reason.starts_with(b"object too large") {
            status::E2BIG
        } else {
            status::ENOMEM
        };
        return error(out, header, status);
    }
    if line == b"CLIENT_ERROR unauthenticated" {
        return error(out, header, status::AUTH_ERROR);
    }
    match header.opcode {
        op::GET
        | op::GETQ
        | op::GETK
        | op::GETKQ
        | op::TOUCH
        | op::GAT
        | op::GATQ
        | op::GATK
        | op::GATKQ => respond_get(out, header, key, line, rest),
        op::SET
        | op::SETQ
        | op::ADD
        | op::ADDQ
        | op::REPLACE
        | op::REPLACEQ
        | op::APPEND
        | op::APPENDQ
        | op::PREPEND
        | op::PREPENDQ => respond_store(out, header, line),
        op::DELETE | op::DELETEQ => match line {
            b"HD" if quiet => {}
            b"HD" => response_header(out, header, status::OK, 0, 0, 0, 0),
            b"EX" => error(out, header, status::KEY_EEXISTS),
            b"NF" => error(out, header, status::KEY_ENOENT),
            _ => error(out, header, status::EINVAL),
        },
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            respond_arithmetic(out, header, line, rest)
        }
        op::VERSION => {
            let version = line.strip_prefix(b"VERSION ").unwrap_or(line);
            response_header(out, header, status::OK, 0, 0, version.len(), 0);
            out.extend_from_slice(version);
        }
        op::FLUSH | op::FLUSHQ => {
            if !quiet {
                response_header(out, header, status::OK, 0, 0, 0, 0);
            }
        }
        op::STAT => respond_stat(out, header, line, text),
        _ => error(out, header, status::UNKNOWN_COMMAND),
    }
}

/// A get, touch or get-and-touch's response to the reply `line` (and the value in `rest`).
fn respond_get(out: &mut Vec<u8>, header: &Header, key: &[u8], line: &[u8], rest: &[u8]) {
    let quiet = header.quiet();
    let with_key = matches!(header.opcode, op::GETK | op::GETKQ | op::GATK | op::GATKQ);
    let (flags_text, value) = if let Some(f) = line.strip_prefix(b"VA ") {
        // `VA <len> f.. c..` then the value and `\r\n`.
        let (len, f) = match f.iter().position(|&b| b == b' ') {
            Some(i) => (&f[..i], &f[i + 1..]),
            None => (f, &b""[..]),
        };
        let len: usize = std::str::from_utf8(len)
            .ok()
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        (f, &rest[..len.min(rest.len())])
    } else if let Some(f) = line.strip_prefix(b"HD") {
        (f.strip_prefix(b" ").unwrap_or(f), &b""[..])
    } else {
        // `EN`: a miss.
        if quiet {
            return;
        }
        if with_key {
            response_header(out, header, status::KEY_ENOENT, 0, key.len(), key.len(), 0);
            out.extend_from_slice(key);
            return;
        }
        return error(out, header, status::KEY_ENOENT);
    };
    let flags = flag(flags_text, b'f').unwrap_or(0) as u32;
    let cas = flag(flags_text, b'c').unwrap_or(0);
    let key = if with_key { key } else { &[] };
    response_header(
        out,
        header,
        status::OK,
        4,
        key.len(),
        4 + key.len() + value.len(),
        cas,
    );
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// A storage command's response to the reply `line`.
fn respond_store(out: &mut Vec<u8>, header: &Header, line: &[u8]) {
    let quiet = header.quiet();
    if let Some(f) = line.strip_prefix(b"HD") {
        if !quiet {
            let cas = flag(f.strip_prefix(b" ").unwrap_or(f), b'c').unwrap_or(0);
            response_header(out, header, status::OK, 0, 0, 0, cas);
        }
        return;
    }
    let status = match line {
        b"EX" => status::KEY_EEXISTS,
        b"NF" => status::KEY_ENOENT,
        b"NS" => match header.opcode {
            op::ADD | op::ADDQ => status::KEY_EEXISTS,
            op::REPLACE | op::REPLACEQ => status::KEY_ENOENT,
            _ => status::NOT_STORED,
        },
        _ => status::EINVAL,
    };
    error(out, header, status);
}

/// An increment or decrement's response to the reply `line` (and the number in `rest`).
fn respond_arithmetic(out: &mut Vec<u8>, header: &Header, line: &[u8], rest: &[u8]) {
    let quiet = header.quiet();
    if let Some(f) = line.strip_prefix(b"VA ") {
        if quiet {
            return;
        }
        let (num, _) = first_line(rest);
        let value: u64 = std::str::from_utf8(num)
            .ok()
            .and_then(|n| n.trim_end().parse().ok())
            .unwrap_or(0);
        let cas = flag(f, b'c').unwrap_or(0);
        response_header(out, header, status::OK, 0, 0, 8, cas);
        out.extend_from_slice(&value.to_be_bytes());
        return;
    }
    let status = match line {
        b"NF" => status::KEY_ENOENT,
        b"EX" => status::KEY_EEXISTS,
        _ if line.starts_with(b"CLIENT_ERROR cannot increment") => status::DELTA_BADVAL,
        _ => status::EINVAL,
    };
    error(out, header, status);
}

/// A stat request's responses, one per `STAT` line of the reply `text` (whose first line is
/// `line`), then the terminating one.
fn respond_stat(out: &mut Vec<u8>, header: &Header, line: &[u8], text: &[u8]) {
    if line == b"RESET" {
        // `stat reset`: the terminating packet alone.
        return response_header(out, header, status::OK, 0, 0, 0, 0);
    }
    if !line.starts_with(b"STAT ") && line != b"END" {
        return error(out, header, status::KEY_ENOENT);
    }
    let mut text = text;
    while !text.is_empty() {
        let (line, rest) = first_line(text);
        text = rest;
        let Some(stat) = line.strip_prefix(b"STAT ") else {
            continue;
        };
        let (name, value) = match stat.iter().position(|&b| b == b' ') {
            Some(i) => (&stat[..i], &stat[i + 1..]),
            None => (stat, &b""[..]),
        };
        response_header(
            out,
            header,
            status::OK,
            0,
            name.len(),
            name.len() + value.len(),
            0,
        );
        out.extend_from_slice(name);
        out.extend_from_slice(value);
    }
    response_header(out, header, status::OK, 0, 0, 0, 0);
}

/// The key of a request `body` (after its extras), for [`respond`].
pub fn key<'a>(header: &Header, body: &'a [u8]) -> &'a [u8] {
    let ext = header.extras_len as usize;
    body.get(ext..ext + header.key_len as usize).unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
        let mut p = vec![REQUEST_MAGIC, opcode];
        p.extend_from_slice(&(key.len() as u16).to_be_bytes());
        p.push(extras.len() as u8);
        p.extend_from_slice(&[0, 0, 0]);
        p.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
        p.extend_from_slice(&7u32.to_be_bytes());
        p.extend_from_slice(&cas.to_be_bytes());
        p.extend_from_slice(extras);
        p.extend_from_slice(key);
        p.extend_from_slice(value);
        p
    }

    #[test]
    fn every_prefix_is_incomplete_and_the_whole_is_a_packet() {
        let p = packet(op::SET, &[0, 0, 0, 1, 0, 0, 0, 0], b"k", b"value", 0);
        for n in 0..p.len() {
            assert_eq!(frame(&p[..n], 1024), Frame::Incomplete, "prefix {n}");
        }
        let Frame::Packet(h) = frame(&p, 1024) else {
            panic!("not a packet")
        };
        assert_eq!(
            (h.opcode, h.key_len, h.extras_len, h.body_len, h.opaque),
            (1, 1, 8, 14, 7)
        );
        assert_eq!(frame(&[b'x'; 23], 1024), Frame::Incomplete);
        assert_eq!(frame(&[b'x'; 24], 1024), Frame::BadMagic);
    }

    #[test]
    fn set_translates_to_ms_and_its_reply_back() {
        let p = packet(op::SET, &[0, 0, 0, 5, 0, 0, 0, 9], b"k", b"value", 3);
        let Frame::Packet(h) = frame(&p, 1024) else {
            panic!("not a packet")
        };
        let mut scratch = Vec::new();
        let body = &p[HEADER_LEN..];
        let Translated::Call(Request::Meta {
            command,
            flags,
            data,
            ..
        }) = translate(&h, body, &mut scratch)
        else {
            panic!("not a meta request")
        };
        assert_eq!(command, MetaCommand::Set);
        assert_eq!(flags.text(), b"F5 T9 MS c C3");
        assert_eq!(data, b"value");
        let mut out = Vec::new();
        respond(&mut out, &h, b"k", b"HD c42\r\n");
        assert_eq!(out.len(), HEADER_LEN);
        assert_eq!(out[0], RESPONSE_MAGIC);
        assert_eq!(&out[16..24], &42u64.to_be_bytes());
        out.clear();
        respond(&mut out, &h, b"k", b"EX\r\n");
        assert_eq!(&out[6..8], &status::KEY_EEXISTS.to_be_bytes());
        assert_eq!(&out[HEADER_LEN..], b"Data exists for key.");
    }

    #[test]
    fn malformed_requests_are_invalid() {
        // A get with extras.
        let p = packet(op::GET, &[0, 0, 0, 0], b"k", b"", 0);
        let Frame::Packet(h) = frame(&p, 1024) else {
            panic!("not a packet")
        };
        let mut scratch = Vec::new();
        assert!(matches!(
            translate(&h, &p[HEADER_LEN..], &mut scratch),
            Translated::Invalid
        ));
        // A key longer than the body.
        let mut p = packet(op::GET, &[], b"key", b"", 0);
        p[3] = 9;
        let Frame::Packet(h) = frame(&p, 1024) else {
            panic!("not a packet")
        };
        assert!(matches!(
            translate(&h, &p[HEADER_LEN..], &mut scratch),
            Translated::Invalid
        ));
    }
}
