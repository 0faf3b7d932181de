//! Client side of the protocol: compose requests, parse replies.
//!
//! Composing appends to a caller-owned `Vec<u8>` so a connection reuses one output buffer for
//! a whole batch of pipelined requests (one `write` per batch, no allocation per request).
//!
//! Parsing works one *reply frame* at a time: a frame is one line (`STORED\r\n`, `END\r\n`,
//! `HD …\r\n`, a number, an error) or one line plus its data block (`VALUE k f n [cas]\r\n`
//! `<n bytes>\r\n`, `VA n …\r\n<n bytes>\r\n`). A `get` of K keys is answered by up to K
//! `Value` frames and one `End`; the caller, which knows what it asked, assembles frames into
//! replies. [`parse_reply`] borrows keys and data from the input buffer and answers
//! [`ParsedReply::Incomplete`] when the buffer holds only a prefix of a frame: that is the
//! ordinary outcome of a partial read, not an error, and the caller keeps the bytes and reads
//! more.

use memchr::memchr;
use thiserror::Error;

use crate::lex::Tokens;

pub use crate::lex::{parse_u64, MAX_KEY_LEN};

/// Longest reply line we wait for before calling the input garbage, in bytes. memcached's
/// longest lines are `VALUE <250-byte key> <flags> <bytes> <cas>` (< 300 bytes) and error
/// strings; meta replies with many flags stay well below this.
pub const MAX_LINE_LEN: usize = 8192;

/// Largest data block we accept in a reply, in bytes (memcached's `-I` maximum is 1 GiB).
pub const MAX_DATA_LEN: usize = 1 << 30;

/// Why a request could not be composed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ComposeError {
    /// Keys are 1..=250 bytes.
    #[error("key length {0} is outside 1..=250 bytes")]
    KeyLength(usize),
    /// Keys may not contain spaces or control characters.
    #[error("key contains a space or control character at byte {0}")]
    KeyByte(usize),
    /// A `get` needs at least one key.
    #[error("get needs at least one key")]
    NoKeys,
}

/// Why reply bytes are not a valid reply. After any of these the stream is out of step and the
/// connection should be closed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReplyError {
    /// The first word of the line is not a known reply.
    #[error("unknown reply line {0:?}")]
    Unknown(String),
    /// A known reply with malformed fields.
    #[error("malformed {what} line {line:?}")]
    Malformed {
        /// Which reply.
        what: &'static str,
        /// The offending line (lossy, truncated to 100 bytes).
        line: String,
    },
    /// A data block not followed by `\r\n`.
    #[error("data block of {0} bytes is not terminated by \\r\\n")]
    BadDataTerminator(usize),
    /// A line longer than [`MAX_LINE_LEN`] without `\r\n`.
    #[error("reply line longer than {MAX_LINE_LEN} bytes")]
    LineTooLong,
    /// A data block larger than [`MAX_DATA_LEN`].
    #[error("data block of {0} bytes exceeds the limit")]
    DataTooLarge(u64),
}

/// One reply frame, borrowing from the input buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    /// `VALUE <key> <flags> <bytes> [<cas>]` and its data.
    Value {
        /// The key.
        key: &'a [u8],
        /// Client flags.
        flags: u32,
        /// The data block (without the trailing `\r\n`).
        data: &'a [u8],
        /// CAS unique, for `gets`.
        cas: Option<u64>,
    },
    /// `END`: the end of a retrieval.
    End,
    /// `STORED`.
    Stored,
    /// `NOT_STORED`.
    NotStored,
    /// `EXISTS`.
    Exists,
    /// `NOT_FOUND`.
    NotFound,
    /// `DELETED`.
    Deleted,
    /// `TOUCHED`.
    Touched,
    /// `OK`.
    Ok,
    /// A bare number: the result of `incr`/`decr`.
    Number(u64),
    /// `VERSION <text>`.
    Version(&'a [u8]),
    /// `ERROR`: unknown command.
    Error,
    /// `CLIENT_ERROR <reason>`.
    ClientError(&'a [u8]),
    /// `SERVER_ERROR <reason>`.
    ServerError(&'a [u8]),
    /// Meta `VA <size> <flags>*` and its data.
    MetaValue {
        /// Meta flags as returned (e.g. `f0 c123`).
        flags: &'a [u8],
        /// The data block.
        data: &'a [u8],
    },
    /// Meta `HD <flags>*`: success without a value.
    MetaHeader(&'a [u8]),
    /// Meta `EN`: miss.
    MetaMiss,
    /// Meta `NF`: not found.
    MetaNotFound,
    /// Meta `NS`: not stored.
    MetaNotStored,
    /// Meta `EX`: CAS mismatch.
    MetaExists,
    /// Meta `MN`: no-op marker.
    MetaNoop,
}

impl Reply<'_> {
    /// True for the replies that carry an error (`ERROR`, `CLIENT_ERROR`, `SERVER_ERROR`).
    pub fn is_error(&self) -> bool {
        matches!(
            self,
            Reply::Error | Reply::ClientError(_) | Reply::ServerError(_)
        )
    }
}

/// The outcome of [`parse_reply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedReply<'a> {
    /// One frame and the number of input bytes it used.
    Complete {
        /// The frame.
        reply: Reply<'a>,
        /// Bytes consumed from the start of the input.
        len: usize,
    },
    /// The input holds only a prefix of a frame: read more and call again with all of it.
    Incomplete,
}

/// Parses the reply frame at the start of `buf`.
pub fn parse_reply(buf: &[u8]) -> Result<ParsedReply<'_>, ReplyError> {
    let Some(nl) = memchr(b'\n', buf) else {
        return if buf.len() > MAX_LINE_LEN {
            Err(ReplyError::LineTooLong)
        } else {
            Ok(ParsedReply::Incomplete)
        };
    };
    if nl > MAX_LINE_LEN {
        return Err(ReplyError::LineTooLong);
    }
    // memcached always sends \r\n; tolerate a bare \n like memcached does on input.
    let line = if nl > 0 && buf[nl - 1] == b'\r' {
        &buf[..nl - 1]
    } else {
        &buf[..nl]
    };
    let line_len = nl + 1;
    let (word, rest) = split_word(line);
    let simple = |reply| {
        Ok(ParsedReply::Complete {
            reply,
            len: line_len,
        })
    };
    match word {
        b"VALUE" => parse_value(buf, line, rest, line_len),
        b"VA" => parse_meta_value(buf, line, rest, line_len),
        b"END" => simple(Reply::End),
        b"STORED" => simple(Reply::Stored),
        b"NOT_STORED" => simple(Reply::NotStored),
        b"EXISTS" => simple(Reply::Exists),
        b"NOT_FOUND" => simple(Reply::NotFound),
        b"DELETED" => simple(Reply::Deleted),
        b"TOUCHED" => simple(Reply::Touched),
        b"OK" => simple(Reply::Ok),
        b"ERROR" => simple(Reply::Error),
        b"VERSION" => simple(Reply::Version(rest)),
        b"CLIENT_ERROR" => simple(Reply::ClientError(rest)),
        b"SERVER_ERROR" => simple(Reply::ServerError(rest)),
        b"HD" => simple(Reply::MetaHeader(rest)),
        b"EN" => simple(Reply::MetaMiss),
        b"NF" => simple(Reply::MetaNotFound),
        b"NS" => simple(Reply::MetaNotStored),
        b"EX" => simple(Reply::MetaExists),
        b"MN" => simple(Reply::MetaNoop),
        w if !w.is_empty() && w.iter().all(u8::is_ascii_digit) && rest.is_empty() => {
            match parse_u64(w) {
                Some(n) => simple(Reply::Number(n)),
                None => Err(malformed("number", line)),
            }
        }
        _ => Err(ReplyError::Unknown(lossy(line))),
    }
}

fn parse_value<'a>(
    buf: &'a [u8],
    line: &[u8],
    rest: &'a [u8],
    line_len: usize,
) -> Result<ParsedReply<'a>, ReplyError> {
    let (key, rest) = split_word(rest);
    let (flags, rest) = split_word(rest);
    let (bytes, rest) = split_word(rest);
    let (cas, rest) = split_word(rest);
    if key.is_empty() || !rest.is_empty() {
        return Err(malformed("VALUE", line));
    }
    let flags = parse_u64(flags)
        .and_then(|f| u32::try_from(f).ok())
        .ok_or_else(|| malformed("VALUE", line))?;
    let cas = if cas.is_empty() {
        None
    } else {
        Some(parse_u64(cas).ok_or_else(|| malformed("VALUE", line))?)
    };
    let n = parse_u64(bytes).ok_or_else(|| malformed("VALUE", line))?;
    let data = match data_block(buf, line_len, n)? {
        Some(d) => d,
        None => return Ok(ParsedReply::Incomplete),
    };
    Ok(ParsedReply::Complete {
        reply: Reply::Value {
            key,
            flags,
            data: data.0,
            cas,
        },
        len: data.1,
    })
}

fn parse_meta_value<'a>(
    buf: &'a [u8],
    line: &[u8],
    rest: &'a [u8],
    line_len: usize,
) -> Result<ParsedReply<'a>, ReplyError> {
    let (size, flags) = split_word(rest);
    let n = parse_u64(size).ok_or_else(|| malformed("VA", line))?;
    match data_block(buf, line_len, n)? {
        Some((data, len)) => Ok(ParsedReply::Complete {
            reply: Reply::MetaValue { flags, data },
            len,
        }),
        None => Ok(ParsedReply::Incomplete),
    }
}

/// The data block of `n` bytes after the header line, and the total frame length; `None` when
/// the buffer does not hold it all yet.
fn data_block(buf: &[u8], start: usize, n: u64) -> Result<Option<(&[u8], usize)>, ReplyError> {
    if n > MAX_DATA_LEN as u64 {
        return Err(ReplyError::DataTooLarge(n));
    }
    // Cannot truncate: n <= MAX_DATA_LEN, which fits in usize.
    let n = n as usize;
    let end = start + n;
    if buf.len() < end + 2 {
        // Fail early on a wrong terminator we can already see.
        if buf.len() > end && buf[end] != b'\r' {
            return Err(ReplyError::BadDataTerminator(n));
        }
        return Ok(None);
    }
    if &buf[end..end + 2] != b"\r\n" {
        return Err(ReplyError::BadDataTerminator(n));
    }
    Ok(Some((&buf[start..end], end + 2)))
}

/// Splits off the first space-separated word; skips leading spaces (the request
/// tokenizer's rules: runs of spaces are one separator).
fn split_word(s: &[u8]) -> (&[u8], &[u8]) {
    let mut tokens = Tokens::new(s);
    let word = tokens.next().unwrap_or_default();
    (word, tokens.remainder())
}

fn lossy(line: &[u8]) -> String {
    String::from_utf8_lossy(&line[..line.len().min(100)]).into_owned()
}

fn malformed(what: &'static str, line: &[u8]) -> ReplyError {
    ReplyError::Malformed {
        what,
        line: lossy(line),
    }
}

/// Checks a key: 1..=250 bytes, no space or control character.
pub fn check_key(key: &[u8]) -> Result<(), ComposeError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(ComposeError::KeyLength(key.len()));
    }
    match key.iter().position(|&b| b <= b' ' || b == 0x7f) {
        Some(i) => Err(ComposeError::KeyByte(i)),
        None => Ok(()),
    }
}

/// Appends the decimal form of `n` without allocating.
pub fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

/// Composes a `get` (or `gets`) of several keys, key by key, straight into the output buffer.
///
/// ```
/// use kvlab_protocol::client::MultiGet;
/// let mut out = Vec::new();
/// let mut g = MultiGet::begin(&mut out, false);
/// g.key(b"a").unwrap();
/// g.key(b"b").unwrap();
/// assert_eq!(g.finish().unwrap(), 2);
/// assert_eq!(out, b"get a b\r\n");
/// ```
pub struct MultiGet<'o> {
    out: &'o mut Vec<u8>,
    start: usize,
    keys: usize,
}

impl<'o> MultiGet<'o> {
    /// Starts a `get` (or `gets` when `cas`).
    pub fn begin(out: &'o mut Vec<u8>, cas: bool) -> Self {
        let start = out.len();
        out.extend_from_slice(if cas { b"gets" } else { b"get" });
        MultiGet {
            out,
            start,
            keys: 0,
        }
    }

    /// Adds a key. On error the whole request is removed from the buffer.
    pub fn key(&mut self, key: &[u8]) -> Result<(), ComposeError> {
        if let Err(e) = check_key(key) {
            self.out.truncate(self.start);
            self.keys = usize::MAX; // poison: finish() reports the error too
            return Err(e);
        }
        if self.keys == usize::MAX {
            return Err(ComposeError::NoKeys);
        }
        self.out.push(b' ');
        self.out.extend_from_slice(key);
        self.keys += 1;
        Ok(())
    }

    /// Ends the line; returns the number of keys.
    pub fn finish(self) -> Result<usize, ComposeError> {
        if self.keys == 0 || self.keys == usize::MAX {
            self.out.truncate(self.start);
            return Err(ComposeError::NoKeys);
        }
        self.out.extend_from_slice(b"\r\n");
        Ok(self.keys)
    }
}

/// Appends `get <key>\r\n`.
pub fn get(out: &mut Vec<u8>, key: &[u8]) -> Result<(), ComposeError> {
    check_key(key)?;
    out.extend_from_slice(b"get ");
    out.extend_from_slice(key);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// The storage commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreCmd {
    /// `set`
    Set,
    /// `add`
    Add,
    /// `replace`
    Replace,
    /// `append`
    Append,
    /// `prepend`
    Prepend,
    /// `cas <unique>`
    Cas(u64),
}

/// Appends the header line of a storage command for a data block of `len` bytes. The caller
/// then appends exactly `len` bytes and calls [`finish_data`]. This split lets a caller write
/// a generated value straight into the output buffer.
pub fn store_header(
    out: &mut Vec<u8>,
    cmd: StoreCmd,
    key: &[u8],
    flags: u32,
    exptime: u32,
    len: usize,
    noreply: bool,
) -> Result<(), ComposeError> {
    check_key(key)?;
    out.extend_from_slice(match cmd {
        StoreCmd::Set => b"set ",
        StoreCmd::Add => b"add ",
        StoreCmd::Replace => b"replace ",
        StoreCmd::Append => b"append ",
        StoreCmd::Prepend => b"prepend ",
        StoreCmd::Cas(_) => b"cas ",
    });
    out.extend_from_slice(key);
    out.push(b' ');
    push_u64(out, u64::from(flags));
    out.push(b' ');
    push_u64(out, u64::from(exptime));
    out.push(b' ');
    push_u64(out, len as u64);
    if let StoreCmd::Cas(unique) = cmd {
        out.push(b' ');
        push_u64(out, unique);
    }
    if noreply {
        out.extend_from_slice(b" noreply");
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Ends the data block of a storage command.
pub fn finish_data(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\r\n");
}

/// Appends a whole storage command with its data.
pub fn store(
    out: &mut Vec<u8>,
    cmd: StoreCmd,
    key: &[u8],
    flags: u32,
    exptime: u32,
    data: &[u8],
    noreply: bool,
) -> Result<(), ComposeError> {
    store_header(out, cmd, key, flags, exptime, data.len(), noreply)?;
    out.extend_from_slice(data);
    finish_data(out);
    Ok(())
}

/// Appends `delete <key>\r\n`.
pub fn delete(out: &mut Vec<u8>, key: &[u8], noreply: bool) -> Result<(), ComposeError> {
    check_key(key)?;
    out.extend_from_slice(b"delete ");
    out.extend_from_slice(key);
    out.extend_from_slice(if noreply { b" noreply\r\n" } else { b"\r\n" });
    Ok(())
}

/// Appends `incr`/`decr <key> <delta>\r\n`.
pub fn incr(out: &mut Vec<u8>, key: &[u8], delta: u64, decr: bool) -> Result<(), ComposeError> {
    check_key(key)?;
    out.extend_from_slice(if decr { b"decr " } else { b"incr " });
    out.extend_from_slice(key);
    out.push(b' ');
    push_u64(out, delta);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Appends `touch <key> <exptime>\r\n`.
pub fn touch(out: &mut Vec<u8>, key: &[u8], exptime: u32) -> Result<(), ComposeError> {
    check_key(key)?;
    out.extend_from_slice(b"touch ");
    out.extend_from_slice(key);
    out.push(b' ');
    push_u64(out, u64::from(exptime));
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Appends `version\r\n`.
pub fn version(out: &mut Vec<u8>) {
    out.extend_from_slice(b"version\r\n");
}

/// How a meta command sends its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetaKeyMode {
    /// The key as is.
    #[default]
    Plain,
    /// The key base64-encoded, with the `b` flag (memcached decodes it; the encoded text
    /// must itself fit in 250 bytes, so keys are at most [`MAX_BASE64_KEY_LEN`] = 186 bytes).
    Base64,
}

/// Longest key that still fits in 250 bytes once base64-encoded.
pub const MAX_BASE64_KEY_LEN: usize = MAX_KEY_LEN / 4 * 3;

/// Appends ` <key>` (or ` <base64 key>`) after a meta command word; the `b` flag, when
/// needed, is appended by the caller with the other flags.
fn push_meta_key(out: &mut Vec<u8>, key: &[u8], mode: MetaKeyMode) -> Result<(), ComposeError> {
    check_key(key)?;
    out.push(b' ');
    match mode {
        MetaKeyMode::Plain => out.extend_from_slice(key),
        MetaKeyMode::Base64 => {
            use base64::Engine as _;
            if key.len() > MAX_BASE64_KEY_LEN {
                return Err(ComposeError::KeyLength(key.len()));
            }
            // Encoded straight into the output buffer: no temporary.
            let start = out.len();
            out.resize(start + key.len().div_ceil(3) * 4, 0);
            let n = base64::engine::general_purpose::STANDARD
                .encode_slice(key, &mut out[start..])
                .expect("room for the encoding was reserved");
            out.truncate(start + n);
        }
    }
    Ok(())
}

fn push_b_flag(out: &mut Vec<u8>, mode: MetaKeyMode) {
    if mode == MetaKeyMode::Base64 {
        out.extend_from_slice(b" b");
    }
}

/// Appends meta get `mg <key> [b] v f [q]\r\n`: value and client flags. The reply is
/// `VA <len> f<flags>` and the data, or `EN` on a miss; with `quiet`, a miss sends nothing
/// (end a run of quiet gets with [`meta_noop`], answered by `MN`, to know they are done).
pub fn meta_get(
    out: &mut Vec<u8>,
    key: &[u8],
    mode: MetaKeyMode,
    quiet: bool,
) -> Result<(), ComposeError> {
    let mark = out.len();
    out.extend_from_slice(b"mg");
    if let Err(e) = push_meta_key(out, key, mode) {
        out.truncate(mark);
        return Err(e);
    }
    push_b_flag(out, mode);
    out.extend_from_slice(if quiet { b" v f q\r\n" } else { b" v f\r\n" });
    Ok(())
}

/// Appends the header line of a meta set, `ms <key> <len> [b] F<flags> T<exptime>\r\n`,
/// for a data block of `len` bytes; the caller appends the data and calls [`finish_data`].
/// The reply is `HD` (stored) or `NS`.
pub fn meta_set_header(
    out: &mut Vec<u8>,
    key: &[u8],
    mode: MetaKeyMode,
    flags: u32,
    exptime: u32,
    len: usize,
) -> Result<(), ComposeError> {
    let mark = out.len();
    out.extend_from_slice(b"ms");
    if let Err(e) = push_meta_key(out, key, mode) {
        out.truncate(mark);
        return Err(e);
    }
    out.push(b' ');
    push_u64(out, len as u64);
    push_b_flag(out, mode);
    out.extend_from_slice(b" F");
    push_u64(out, u64::from(flags));
    out.extend_from_slice(b" T");
    push_u64(out, u64::from(exptime));
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Appends a whole meta set with its data.
pub fn meta_set(
    out: &mut Vec<u8>,
    key: &[u8],
    mode: MetaKeyMode,
    flags: u32,
    exptime: u32,
    data: &[u8],
) -> Result<(), ComposeError> {
    meta_set_header(out, key, mode, flags, exptime, data.len())?;
    out.extend_from_slice(data);
    finish_data(out);
    Ok(())
}

/// Appends meta delete `md <key> [b]\r\n`; the reply is `HD` or `NF`.
pub fn meta_delete(out: &mut Vec<u8>, key: &[u8], mode: MetaKeyMode) -> Result<(), ComposeError> {
    let mark = out.len();
    out.extend_from_slice(b"md");
    if let Err(e) = push_meta_key(out, key, mode) {
        out.truncate(mark);
        return Err(e);
    }
    push_b_flag(out, mode);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Appends meta no-op `mn\r\n`.
pub fn meta_noop(out: &mut Vec<u8>) {
    out.extend_from_slice(b"mn\r\n");
}

/// The token of return flag `flag` in a meta reply's flags (`f` in `f3 c12` → `3`), if present.
pub fn meta_flag(flags: &[u8], flag: u8) -> Option<&[u8]> {
    flags
        .split(|&b| b == b' ')
        .find(|t| t.first() == Some(&flag))
        .map(|t| &t[1..])
}

/// The client flags (`f<n>`) of a meta reply; 0 when absent or malformed.
pub fn meta_client_flags(flags: &[u8]) -> u32 {
    meta_flag(flags, b'f')
        .and_then(parse_u64)
        .and_then(|f| u32::try_from(f).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn complete(buf: &[u8]) -> (Reply<'_>, usize) {
        match parse_reply(buf).unwrap() {
            ParsedReply::Complete { reply, len } => (reply, len),
            ParsedReply::Incomplete => panic!("incomplete: {buf:?}"),
        }
    }

    #[test]
    fn composes_requests() {
        let mut out = Vec::new();
        get(&mut out, b"k1").unwrap();
        store(&mut out, StoreCmd::Set, b"k2", 5, 0, b"hello", false).unwrap();
        store(&mut out, StoreCmd::Cas(77), b"k2", 0, 10, b"", true).unwrap();
        delete(&mut out, b"k3", false).unwrap();
        incr(&mut out, b"n", 12, true).unwrap();
        touch(&mut out, b"t", 9).unwrap();
        version(&mut out);
        meta_get(&mut out, b"m", MetaKeyMode::Plain, false).unwrap();
        assert_eq!(
            out,
            b"get k1\r\nset k2 5 0 5\r\nhello\r\ncas k2 0 10 0 77 noreply\r\n\r\ndelete k3\r\n\
decr n 12\r\ntouch t 9\r\nversion\r\nmg m v f\r\n"
                .to_vec()
        );
    }

    #[test]
    fn composes_meta_requests() {
        let mut out = Vec::new();
        meta_get(&mut out, b"k1", MetaKeyMode::Plain, false).unwrap();
        meta_get(&mut out, b"k2", MetaKeyMode::Plain, true).unwrap();
        meta_noop(&mut out);
        meta_set(&mut out, b"k3", MetaKeyMode::Plain, 7, 30, b"hello").unwrap();
        meta_set_header(&mut out, b"k4", MetaKeyMode::Plain, 0, 0, 2).unwrap();
        out.extend_from_slice(b"hi");
        finish_data(&mut out);
        meta_delete(&mut out, b"k5", MetaKeyMode::Plain).unwrap();
        assert_eq!(
            s(&out),
            "mg k1 v f\r\nmg k2 v f q\r\nmn\r\nms k3 5 F7 T30\r\nhello\r\n\
ms k4 2 F0 T0\r\nhi\r\nmd k5\r\n"
        );
    }

    #[test]
    fn composes_base64_meta_keys() {
        let mut out = Vec::new();
        // "key:1" is a2V5OjE= in standard base64 (padded, as memcached expects).
        meta_get(&mut out, b"key:1", MetaKeyMode::Base64, true).unwrap();
        meta_set(&mut out, b"key:1", MetaKeyMode::Base64, 1, 0, b"v").unwrap();
        meta_delete(&mut out, b"abc", MetaKeyMode::Base64).unwrap();
        assert_eq!(
            s(&out),
            "mg a2V5OjE= b v f q\r\nms a2V5OjE= 1 b F1 T0\r\nv\r\nmd YWJj b\r\n"
        );
        // The encoding must fit memcached's 250-byte key token: 186 bytes (248 encoded) do,
        // 187 (252 encoded) don't.
        out.clear();
        meta_get(&mut out, &[b'x'; 186], MetaKeyMode::Base64, false).unwrap();
        assert_eq!(out.len(), "mg ".len() + 248 + " b v f\r\n".len());
        let mut out = b"x".to_vec();
        assert_eq!(
            meta_get(&mut out, &[b'x'; 187], MetaKeyMode::Base64, false),
            Err(ComposeError::KeyLength(187))
        );
        assert_eq!(
            meta_set(&mut out, b"a b", MetaKeyMode::Base64, 0, 0, b""),
            Err(ComposeError::KeyByte(1))
        );
        assert_eq!(
            meta_delete(&mut out, b"", MetaKeyMode::Plain),
            Err(ComposeError::KeyLength(0))
        );
        assert_eq!(out, b"x", "a rejected request leaves nothing behind");
    }

    #[test]
    fn reads_meta_return_flags() {
        assert_eq!(meta_flag(b"f3 c12", b'c'), Some(&b"12"[..]));
        assert_eq!(meta_flag(b"f3 c12", b'k'), None);
        assert_eq!(meta_client_flags(b"f3 c12"), 3);
        assert_eq!(meta_client_flags(b"c12 f4294967295"), u32::MAX);
        assert_eq!(meta_client_flags(b""), 0);
        assert_eq!(meta_client_flags(b"fx"), 0);
    }

    #[test]
    fn meta_frames_parse_whole_and_wait_when_partial() {
        let frames: Vec<(&[u8], Reply<'_>)> = vec![
            (
                b"VA 5 f3\r\nhello\r\n",
                Reply::MetaValue {
                    flags: b"f3",
                    data: b"hello",
                },
            ),
            (
                b"VA 0\r\n\r\n",
                Reply::MetaValue {
                    flags: b"",
                    data: b"",
                },
            ),
            (b"HD\r\n", Reply::MetaHeader(b"")),
            (b"EN\r\n", Reply::MetaMiss),
            (b"NF\r\n", Reply::MetaNotFound),
            (b"NS\r\n", Reply::MetaNotStored),
            (b"EX\r\n", Reply::MetaExists),
            (b"MN\r\n", Reply::MetaNoop),
        ];
        for (bytes, want) in frames {
            for cut in 0..bytes.len() {
                assert_eq!(
                    parse_reply(&bytes[..cut]),
                    Ok(ParsedReply::Incomplete),
                    "{:?} cut at {cut}",
                    s(bytes)
                );
            }
            // A quiet multi-get's stream: hits back to back, then MN; each frame on its own.
            let mut buf = bytes.to_vec();
            buf.extend_from_slice(b"MN\r\n");
            let (got, len) = complete(&buf);
            assert_eq!(got, want);
            assert_eq!(len, bytes.len());
            assert_eq!(complete(&buf[len..]), (Reply::MetaNoop, 4));
        }
        assert!(matches!(
            parse_reply(b"VA x f1\r\n"),
            Err(ReplyError::Malformed { what: "VA", .. })
        ));
        assert_eq!(
            parse_reply(b"VA 1 f0\r\nab\r\n"),
            Err(ReplyError::BadDataTerminator(1))
        );
    }

    fn s(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    #[test]
    fn rejects_bad_keys_and_leaves_buffer_clean() {
        let mut out = b"x".to_vec();
        assert_eq!(get(&mut out, b""), Err(ComposeError::KeyLength(0)));
        assert_eq!(
            get(&mut out, &[b'a'; 251]),
            Err(ComposeError::KeyLength(251))
        );
        assert_eq!(get(&mut out, b"a b"), Err(ComposeError::KeyByte(1)));
        assert_eq!(
            delete(&mut out, b"a\nb", false),
            Err(ComposeError::KeyByte(1))
        );
        let mut g = MultiGet::begin(&mut out, true);
        g.key(b"ok").unwrap();
        assert!(g.key(b"bad key").is_err());
        assert!(g.finish().is_err());
        assert!(MultiGet::begin(&mut out, false).finish().is_err());
        assert_eq!(out, b"x");
    }

    #[test]
    fn parses_every_reply_kind() {
        let cases: Vec<(&[u8], Reply<'_>)> = vec![
            (b"END\r\n", Reply::End),
            (b"STORED\r\n", Reply::Stored),
            (b"NOT_STORED\r\n", Reply::NotStored),
            (b"EXISTS\r\n", Reply::Exists),
            (b"NOT_FOUND\r\n", Reply::NotFound),
            (b"DELETED\r\n", Reply::Deleted),
            (b"TOUCHED\r\n", Reply::Touched),
            (b"OK\r\n", Reply::Ok),
            (b"ERROR\r\n", Reply::Error),
            (b"42\r\n", Reply::Number(42)),
            (b"VERSION 1.6.21\r\n", Reply::Version(b"1.6.21")),
            (
                b"CLIENT_ERROR bad data chunk\r\n",
                Reply::ClientError(b"bad data chunk"),
            ),
            (
                b"SERVER_ERROR out of memory\r\n",
                Reply::ServerError(b"out of memory"),
            ),
            (b"HD c5\r\n", Reply::MetaHeader(b"c5")),
            (b"EN\r\n", Reply::MetaMiss),
            (b"NF\r\n", Reply::MetaNotFound),
            (b"NS\r\n", Reply::MetaNotStored),
            (b"EX\r\n", Reply::MetaExists),
            (b"MN\r\n", Reply::MetaNoop),
            (
                b"VALUE k 3 5\r\nhello\r\n",
                Reply::Value {
                    key: b"k",
                    flags: 3,
                    data: b"hello",
                    cas: None,
                },
            ),
            (
                b"VALUE k 0 2 99\r\nhi\r\n",
                Reply::Value {
                    key: b"k",
                    flags: 0,
                    data: b"hi",
                    cas: Some(99),
                },
            ),
            (
                b"VA 2 f1\r\nhi\r\n",
                Reply::MetaValue {
                    flags: b"f1",
                    data: b"hi",
                },
            ),
        ];
        for (bytes, want) in cases {
            let mut buf = bytes.to_vec();
            buf.extend_from_slice(b"END\r\n"); // a following frame is not consumed
            let (got, len) = complete(&buf);
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(bytes));
            assert_eq!(len, bytes.len());
        }
    }

    #[test]
    fn data_may_contain_crlf() {
        let (r, len) = complete(b"VALUE k 0 4\r\n\r\n\r\n\r\n");
        assert_eq!(
            r,
            Reply::Value {
                key: b"k",
                flags: 0,
                data: b"\r\n\r\n",
                cas: None
            }
        );
        assert_eq!(len, 19);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert!(matches!(parse_reply(b"HELLO\r\n"), Err(ReplyError::Unknown(s)) if s == "HELLO"));
        assert!(matches!(
            parse_reply(b"VALUE k x 1\r\na\r\n"),
            Err(ReplyError::Malformed { what: "VALUE", .. })
        ));
        assert_eq!(
            parse_reply(b"VALUE k 0 1\r\nabc"),
            Err(ReplyError::BadDataTerminator(1))
        );
        assert_eq!(
            parse_reply(b"VALUE k 0 99999999999\r\n"),
            Err(ReplyError::DataTooLarge(99_999_999_999))
        );
        assert_eq!(
            parse_reply(&[b'a'; MAX_LINE_LEN + 1]),
            Err(ReplyError::LineTooLong)
        );
    }

    const VALID: &[&[u8]] = &[
        b"VALUE key 1 10 5\r\n0123456789\r\n",
        b"STORED\r\n",
        b"VALUE k 0 0\r\n\r\n",
        b"VA 3 f0\r\nabc\r\n",
        b"SERVER_ERROR x\r\n",
        b"12345\r\n",
    ];

    proptest! {
        #[test]
        fn every_prefix_of_a_valid_reply_is_incomplete(i in 0..VALID.len(), cut in 0usize..40) {
            let full = VALID[i];
            let cut = cut.min(full.len() - 1);
            prop_assert_eq!(parse_reply(&full[..cut]), Ok(ParsedReply::Incomplete));
            let parsed = parse_reply(full);
            let ok = matches!(parsed, Ok(ParsedReply::Complete { len, .. }) if len == full.len());
            prop_assert!(ok, "full reply did not parse: {:?}", parsed);
        }

        #[test]
        fn no_input_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(ParsedReply::Complete { len, .. }) = parse_reply(&bytes) {
                prop_assert!(len <= bytes.len() && len > 0);
            }
        }

        #[test]
        fn composed_values_round_trip(key in "[a-z0-9:]{1,250}", data in proptest::collection::vec(any::<u8>(), 0..300), flags in any::<u32>()) {
            // Compose a server-style VALUE frame with our own number writer and parse it back.
            let mut buf = b"VALUE ".to_vec();
            buf.extend_from_slice(key.as_bytes());
            buf.push(b' ');
            push_u64(&mut buf, u64::from(flags));
            buf.push(b' ');
            push_u64(&mut buf, data.len() as u64);
            buf.extend_from_slice(b"\r\n");
            buf.extend_from_slice(&data);
            buf.extend_from_slice(b"\r\n");
            let (r, len) = complete(&buf);
            prop_assert_eq!(len, buf.len());
            prop_assert_eq!(r, Reply::Value { key: key.as_bytes(), flags, data: &data, cas: None });
        }
    }
}
