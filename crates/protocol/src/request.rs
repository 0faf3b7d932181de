//! Server side: parse client requests, incrementally and without copying.
//!
//! [`parse`] looks at the front of an input buffer and returns one of three outcomes:
//!
//! - [`Parsed::Request`]: a whole request, borrowing its keys and data from the buffer, and how
//!   many bytes it used;
//! - [`Parsed::Incomplete`]: the buffer holds the start of a request and more bytes are needed.
//!   This is an expected outcome (a TCP read ends wherever it ends), not an error, so it is
//!   not mapped onto an I/O error kind;
//! - [`Parsed::Error`]: a bad request, with the reply memcached gives for it, how many bytes
//!   to drop, how many more bytes of data to discard as they arrive (a refused large value is
//!   swallowed, not parsed as commands) and whether the connection must close.
//!
//! The wording of every error is memcached 1.6's, checked against the real server.

use crate::admin::{self, Admin};
use crate::lex::{parse_i64, parse_u64, valid_key_token, Tokens};
use crate::meta::{MetaCommand, MetaError, MetaFlags, MetaKey};

pub use crate::error::ProtocolError;
pub use crate::lex::{valid_key, MAX_KEY_LEN};
pub use crate::limits::{Binding, Limits};

/// The five storage commands of the text protocol, plus `cas`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreCommand {
    /// `set`: store unconditionally.
    Set,
    /// `add`: store only if the key is absent.
    Add,
    /// `replace`: store only if the key is present.
    Replace,
    /// `append`: add the data after the present value.
    Append,
    /// `prepend`: add the data before the present value.
    Prepend,
    /// `cas`: store only if the item is unchanged since the client read it.
    Cas,
}

impl StoreCommand {
    const ALL: [StoreCommand; 6] = [
        StoreCommand::Set,
        StoreCommand::Add,
        StoreCommand::Replace,
        StoreCommand::Append,
        StoreCommand::Prepend,
        StoreCommand::Cas,
    ];

    /// The command's name on the wire.
    pub fn name(self) -> &'static [u8] {
        match self {
            StoreCommand::Set => b"set",
            StoreCommand::Add => b"add",
            StoreCommand::Replace => b"replace",
            StoreCommand::Append => b"append",
            StoreCommand::Prepend => b"prepend",
            StoreCommand::Cas => b"cas",
        }
    }

    fn from_name(name: &[u8]) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// The keys of a retrieval command: a borrowed, already validated, space-separated list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys<'a>(&'a [u8]);

impl<'a> Keys<'a> {
    /// The keys in request order.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.0.split(|&b| b == b' ').filter(|k| !k.is_empty())
    }

    /// The key list as sent (space-separated, possibly with repeated spaces).
    pub fn text(&self) -> &'a [u8] {
        self.0
    }
}

/// One parsed request. Keys and data borrow the input buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`/`gets` (`cas` says which).
    Get {
        /// The keys, in request order.
        keys: Keys<'a>,
        /// `gets`/`gats`: return each item's CAS value too.
        cas: bool,
    },
    /// `gat`/`gats`: get and touch.
    Gat {
        /// Expiry as sent: 0 never, negative expired, up to 30 days relative, else unix time.
        exptime: i64,
        /// The keys, in request order.
        keys: Keys<'a>,
        /// `gets`/`gats`: return each item's CAS value too.
        cas: bool,
    },
    /// `set add replace append prepend cas`.
    Store {
        /// Which command.
        command: StoreCommand,
        /// The key.
        key: &'a [u8],
        /// The client flags stored with the item.
        flags: u32,
        /// Expiry as sent: 0 never, negative expired, up to 30 days relative, else unix time.
        exptime: i64,
        /// The data block, without its `\r\n`.
        data: &'a [u8],
        /// The compare value of `cas`; 0 for the other commands.
        cas_unique: u64,
        /// `noreply`: no reply on success.
        noreply: bool,
    },
    /// `incr`/`decr`.
    Arith {
        /// `incr` (true) or `decr`.
        incr: bool,
        /// The key.
        key: &'a [u8],
        /// The amount to add or subtract.
        delta: u64,
        /// `noreply`: no reply on success.
        noreply: bool,
    },
    /// `delete`.
    Delete {
        /// The key.
        key: &'a [u8],
        /// `noreply`: no reply on success.
        noreply: bool,
    },
    /// `touch`: set a new expiry.
    Touch {
        /// The key.
        key: &'a [u8],
        /// Expiry as sent: 0 never, negative expired, up to 30 days relative, else unix time.
        exptime: i64,
        /// `noreply`: no reply on success.
        noreply: bool,
    },
    /// `flush_all`: invalidate every item now or after a delay.
    FlushAll {
        /// Seconds until the flush takes effect (0: now).
        delay: i64,
        /// `noreply`: no reply on success.
        noreply: bool,
    },
    /// `verbosity`.
    Verbosity {
        /// The verbosity level.
        level: u32,
        /// `noreply`: no reply on success.
        noreply: bool,
    },
    /// `slabs automove <0|1|2>`: memcached's slab rebalancer setting.
    SlabsAutomove {
        /// 0 off, 1 on (the default), 2 aggressive.
        mode: u8,
    },
    /// `cluster <subcommand> …`: a kvlab cluster node's own commands (the ring, migration
    /// streams); `args` is the rest of the line. A server that is not a cluster node answers
    /// `ERROR`, as memcached does.
    Cluster {
        /// The words after `cluster`, as sent.
        args: &'a [u8],
    },
    /// `version`.
    Version,
    /// `quit`: close the connection.
    Quit,
    /// `stats` with an optional group name (`settings`, `items`, `slabs`, `conns`, `reset`…).
    Stats {
        /// The group name.
        group: Option<&'a [u8]>,
    },
    /// An administration command (`shutdown`, `cache_memlimit`, `slabs reassign`,
    /// `stats detail`, `lru_crawler`, `watch`).
    Admin(Admin<'a>),
    /// A meta command (`mg ms md ma mn me`).
    Meta {
        /// Which meta command.
        command: MetaCommand,
        /// The key, as sent (possibly base64).
        key: MetaKey<'a>,
        /// The flags, parsed and as sent.
        flags: MetaFlags<'a>,
        /// The data block of `ms`, without its `\r\n` (empty for the others).
        data: &'a [u8],
    },
}

/// The outcome of looking at the front of an input buffer.
// A `Parsed` lives on the stack for one request and is never stored in bulk; boxing the large
// variant would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A whole request that used `consumed` bytes.
    Request {
        /// The request.
        request: Request<'a>,
        /// Bytes of the input it used.
        consumed: usize,
    },
    /// More bytes are needed before anything can be said.
    Incomplete,
    /// A bad request: reply `error.reply()` unless `noreply`, drop `consumed` bytes, then
    /// discard the next `swallow` bytes as they arrive (possibly more than are buffered now).
    ///
    /// `noreply` follows memcached: a command that takes `noreply` and ends with it stays
    /// silent about its own argument errors too (but not about an unknown command or wrong
    /// number of arguments, which memcached rejects before looking at `noreply`).
    Error {
        /// What was wrong.
        error: ProtocolError,
        /// Bytes of the input it used.
        consumed: usize,
        /// Bytes of a refused data block still to discard as they arrive.
        swallow: usize,
        /// The request ended with `noreply` (see above).
        noreply: bool,
        /// A `set` (or `ms` in set mode) refused as too large: memcached drops the key's old
        /// value too, so that a failed write never leaves a stale value readable.
        drops: Option<MetaKey<'a>>,
    },
}

fn error(error: ProtocolError, consumed: usize) -> Parsed<'static> {
    Parsed::Error {
        error,
        consumed,
        swallow: 0,
        noreply: false,
        drops: None,
    }
}

/// Parses the request at the front of `buf`.
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parsed<'a> {
    let mut parsed = parse_one(buf, limits);
    if let Parsed::Error { error, noreply, .. } = &mut parsed {
        if *error != ProtocolError::UnknownCommand && ends_with_noreply(buf) {
            *noreply = true;
        }
    }
    parsed
}

/// Whether the command line at the front of `buf` is a command that takes `noreply` and
/// ends with it.
fn ends_with_noreply(buf: &[u8]) -> bool {
    let line = match memchr::memchr(b'\n', buf) {
        Some(nl) => &buf[..nl],
        None => return false,
    };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut tokens = Tokens::new(line);
    let takes_noreply = matches!(
        tokens.next(),
        Some(
            b"set"
                | b"add"
                | b"replace"
                | b"append"
                | b"prepend"
                | b"cas"
                | b"incr"
                | b"decr"
                | b"delete"
                | b"touch"
                | b"verbosity"
                | b"flush_all"
        )
    );
    takes_noreply && tokens.last() == Some(b"noreply")
}

fn parse_one<'a>(buf: &'a [u8], limits: &Limits) -> Parsed<'a> {
    let Some(nl) = memchr::memchr(b'\n', buf) else {
        return incomplete_line(buf, limits);
    };
    let line_end = nl + 1;
    let mut line = &buf[..nl];
    if let [rest @ .., b'\r'] = line {
        line = rest;
    }
    if line.len() > limits.max_get_line {
        return error(ProtocolError::LineTooLong, line_end);
    }
    let mut tokens = Tokens::new(line);
    let Some(name) = tokens.next() else {
        return error(ProtocolError::UnknownCommand, line_end);
    };
    match name {
        b"get" => parse_get(tokens, line_end, false),
        b"gets" => parse_get(tokens, line_end, true),
        b"gat" => parse_gat(tokens, line_end, false),
        b"gats" => parse_gat(tokens, line_end, true),
        b"mg" | b"ms" | b"md" | b"ma" | b"mn" | b"me" => {
            parse_meta(name, tokens, buf, line_end, limits)
        }
        b"incr" | b"decr" => parse_arith(name == b"incr", tokens, line_end),
        b"delete" => parse_delete(tokens, line_end),
        b"touch" => parse_touch(tokens, line_end),
        b"flush_all" => parse_flush_all(tokens, line_end),
        b"verbosity" => parse_verbosity(tokens, line_end),
        b"slabs" => parse_slabs(tokens, line_end),
        b"shutdown" => admin_request(admin::shutdown(tokens), line_end),
        b"cache_memlimit" => admin_request(admin::cache_memlimit(tokens), line_end),
        b"lru_crawler" => admin_request(admin::lru_crawler(tokens), line_end),
        b"watch" => admin_request(admin::watch(tokens), line_end),
        b"cluster" => request(
            Request::Cluster {
                args: tokens.remainder(),
            },
            line_end,
        ),
        // memcached ignores anything after `version`.
        b"version" => request(Request::Version, line_end),
        b"quit" if tokens.rest_is_empty() => request(Request::Quit, line_end),
        b"stats" => {
            let group = tokens.next();
            if group == Some(b"detail") {
                return admin_request(admin::stats_detail(tokens), line_end);
            }
            if group == Some(b"cachedump") {
                return admin_request(admin::stats_cachedump(tokens), line_end);
            }
            if tokens.rest_is_empty() {
                request(Request::Stats { group }, line_end)
            } else {
                error(ProtocolError::UnknownCommand, line_end)
            }
        }
        _ => match StoreCommand::from_name(name) {
            Some(command) => parse_store(command, tokens, buf, line_end, limits),
            // memcached closes on an unknown command whose last token starts with `HTTP/`
            // (`GET / HTTP/1.1`), and answers `ERROR` to any other.
            None if Tokens::new(line)
                .last()
                .is_some_and(|t| t.starts_with(b"HTTP/")) =>
            {
                error(ProtocolError::Http, line_end)
            }
            None => error(ProtocolError::UnknownCommand, line_end),
        },
    }
}

fn request(request: Request<'_>, consumed: usize) -> Parsed<'_> {
    Parsed::Request { request, consumed }
}

fn admin_request(parsed: admin::Parsed<'_>, line_end: usize) -> Parsed<'_> {
    match parsed {
        admin::Parsed::Command(a) => request(Request::Admin(a), line_end),
        admin::Parsed::Unknown => error(ProtocolError::UnknownCommand, line_end),
        admin::Parsed::BadFormat => error(ProtocolError::BadFormat, line_end),
    }
}

/// No newline yet: wait, unless the line is already longer than any valid one.
fn incomplete_line(buf: &[u8], limits: &Limits) -> Parsed<'static> {
    let limit = if is_retrieval(buf) {
        limits.max_get_line
    } else {
        limits.max_line
    };
    if buf.len() > limit {
        error(ProtocolError::LineTooLong, buf.len())
    } else {
        Parsed::Incomplete
    }
}

fn is_retrieval(line: &[u8]) -> bool {
    let start = line.iter().position(|&b| b != b' ').unwrap_or(line.len());
    let line = &line[start..];
    [&b"get "[..], b"gets ", b"gat ", b"gats "]
        .iter()
        .any(|p| line.starts_with(p))
}

fn parse_u32(t: &[u8]) -> Option<u32> {
    parse_u64(t).and_then(|v| u32::try_from(v).ok())
}

/// Whether an optional last token asks for no reply. memcached looks only at whether the
/// last token is `noreply`: any other word in its place is ignored (`incr k 1 x` answers).
fn is_noreply(t: Option<&[u8]>) -> bool {
    t == Some(b"noreply")
}

/// `delete`'s stricter reading: a word other than `noreply` after the key is a usage error.
fn delete_noreply(t: Option<&[u8]>) -> Option<bool> {
    match t {
        None => Some(false),
        Some(b"noreply") => Some(true),
        Some(_) => None,
    }
}

fn parse_keys<'a>(tokens: &Tokens<'a>) -> Option<Keys<'a>> {
    let rest = tokens.remainder();
    Tokens::new(rest).all(valid_key_token).then_some(Keys(rest))
}

fn parse_get(tokens: Tokens<'_>, line_end: usize, cas: bool) -> Parsed<'_> {
    if tokens.rest_is_empty() {
        return error(ProtocolError::UnknownCommand, line_end);
    }
    match parse_keys(&tokens) {
        Some(keys) => request(Request::Get { keys, cas }, line_end),
        None => error(ProtocolError::BadFormat, line_end),
    }
}

fn parse_gat(mut tokens: Tokens<'_>, line_end: usize, cas: bool) -> Parsed<'_> {
    let Some(t) = tokens.next() else {
        return error(ProtocolError::UnknownCommand, line_end);
    };
    let Some(exptime) = parse_i64(t) else {
        return error(ProtocolError::InvalidExptime, line_end);
    };
    match parse_keys(&tokens) {
        Some(keys) => request(Request::Gat { exptime, keys, cas }, line_end),
        None => error(ProtocolError::BadFormat, line_end),
    }
}

fn parse_store<'a>(
    command: StoreCommand,
    tokens: Tokens<'a>,
    buf: &'a [u8],
    line_end: usize,
    limits: &Limits,
) -> Parsed<'a> {
    // The first six tokens, and how many there are in all (one scan of the line).
    let (args, n) = {
        let mut t = tokens;
        let args: [Option<&[u8]>; 6] = [t.next(), t.next(), t.next(), t.next(), t.next(), t.next()];
        let n = args.iter().flatten().count() + t.count();
        (args, n)
    };
    let want = if command == StoreCommand::Cas { 5 } else { 4 };
    if n != want && n != want + 1 {
        return error(ProtocolError::UnknownCommand, line_end);
    }
    let [Some(key), Some(flags), Some(exptime), Some(len), extra1, extra2] = args else {
        return error(ProtocolError::UnknownCommand, line_end);
    };
    let (cas_token, noreply_token) = if command == StoreCommand::Cas {
        (extra1, extra2)
    } else {
        (None, extra1)
    };
    if !valid_key_token(key) {
        return error(ProtocolError::BadFormat, line_end);
    }
    // memcached reads flags as an unsigned long and keeps their low 32 bits, and the length
    // as a long truncated to 32 bits (`4294967311` is 15, `6442450945` negative): kvlab
    // reads them the same way, so that the data block the client sends after the line is
    // consumed as data, never run as commands.
    let (Some(flags), Some(exptime), Some(len)) =
        (parse_u64(flags), parse_i64(exptime), parse_i64(len))
    else {
        return error(ProtocolError::BadFormat, line_end);
    };
    let (flags, len) = (flags as u32, i64::from(len as i32));
    let cas_unique = match cas_token {
        Some(t) => match parse_u64(t) {
            Some(v) => v,
            None => return error(ProtocolError::BadFormat, line_end),
        },
        None => 0,
    };
    let noreply = is_noreply(noreply_token);
    let drops = (command == StoreCommand::Set).then(|| MetaKey::plain(key));
    data_block(len, buf, line_end, limits, drops, |data| Request::Store {
        command,
        key,
        flags,
        exptime,
        data,
        cas_unique,
        noreply,
    })
}

/// The data block that follows a storage command line: `len` bytes and `\r\n`.
///
/// `drops` is the key whose old value a refusal as too large drops (`set`, `ms` setting).
pub(crate) fn data_block<'a>(
    len: i64,
    buf: &'a [u8],
    line_end: usize,
    limits: &Limits,
    drops: Option<MetaKey<'a>>,
    make: impl FnOnce(&'a [u8]) -> Request<'a>,
) -> Parsed<'a> {
    // memcached refuses negative lengths and those near i32::MAX without reading any data.
    let Some(len) = usize::try_from(len)
        .ok()
        .filter(|&l| l <= i32::MAX as usize - 2)
    else {
        return error(ProtocolError::BadFormat, line_end);
    };
    if len > limits.item_size_max {
        return Parsed::Error {
            error: ProtocolError::TooLarge,
            consumed: line_end,
            swallow: len + 2,
            noreply: false,
            drops,
        };
    }
    let end = line_end + len + 2;
    if buf.len() < end {
        return Parsed::Incomplete;
    }
    if &buf[end - 2..end] != b"\r\n" {
        return error(ProtocolError::BadDataChunk, end);
    }
    request(make(&buf[line_end..end - 2]), end)
}

/// `slabs automove <0|1|2>` (memcached: a number above 2 or a missing one is `ERROR`, a
/// non-number a bad command line); other `slabs` subcommands are unknown here.
fn parse_slabs(mut tokens: Tokens<'_>, line_end: usize) -> Parsed<'_> {
    // memcached: `reassign` with exactly two arguments; any other count falls through to
    // `automove` and so to `ERROR`.
    if tokens.token_count() == 3 && tokens.clone().next() == Some(b"reassign") {
        tokens.next();
        return admin_request(admin::slabs_reassign(tokens), line_end);
    }
    match (tokens.next(), tokens.next(), tokens.rest_is_empty()) {
        (Some(b"automove"), Some(mode), true) => match parse_u64(mode) {
            Some(m @ 0..=2) => request(Request::SlabsAutomove { mode: m as u8 }, line_end),
            Some(_) => error(ProtocolError::UnknownCommand, line_end),
            None => error(ProtocolError::BadFormat, line_end),
        },
        _ => error(ProtocolError::UnknownCommand, line_end),
    }
}

fn parse_arith(incr: bool, mut tokens: Tokens<'_>, line_end: usize) -> Parsed<'_> {
    let n = tokens.token_count();
    let (Some(key), Some(delta)) = (tokens.next(), tokens.next()) else {
        return error(ProtocolError::UnknownCommand, line_end);
    };
    if n > 3 {
        return error(ProtocolError::UnknownCommand, line_end);
    }
    if !valid_key_token(key) {
        return error(ProtocolError::BadFormat, line_end);
    }
    let Some(delta) = parse_u64(delta) else {
        return error(ProtocolError::InvalidDelta, line_end);
    };
    let noreply = is_noreply(tokens.next());
    request(
        Request::Arith {
            incr,
            key,
            delta,
            noreply,
        },
        line_end,
    )
}

fn parse_delete(mut tokens: Tokens<'_>, line_end: usize) -> Parsed<'_> {
    let n = tokens.token_count();
    let Some(key) = tokens.next() else {
        return error(ProtocolError::UnknownCommand, line_end);
    };
    if n > 3 {
        return error(ProtocolError::UnknownCommand, line_end);
    }
    if !valid_key_token(key) {
        return error(ProtocolError::BadFormat, line_end);
    }
    // memcached still accepts the legacy `delete <key> 0 [noreply]`; any other time is an error.
    let mut next = tokens.next();
    if next == Some(b"0") {
        next = tokens.next();
    } else if n == 3 {
        return error(ProtocolError::DeleteUsage, line_end);
    }
    match delete_noreply(next) {
        Some(noreply) => request(Request::Delete { key, noreply }, line_end),
        None => error(ProtocolError::DeleteUsage, line_end),
    }
}

fn parse_touch(mut tokens: Tokens<'_>, line_end: usize) -> Parsed<'_> {
    let n = tokens.token_count();
    let (Some(key), Some(exptime)) = (tokens.next(), tokens.next()) else {
        return error(ProtocolError::UnknownCommand, line_end);
    };
    if n > 3 {
        return error(ProtocolError::UnknownCommand, line_end);
    }
    if !valid_key_token(key) {
        return error(ProtocolError::BadFormat, line_end);
    }
    let Some(exptime) = parse_i64(exptime) else {
        return error(ProtocolError::InvalidExptime, line_end);
    };
    let noreply = is_noreply(tokens.next());
    request(
        Request::Touch {
            key,
            exptime,
            noreply,
        },
        line_end,
    )
}

/// `flush_all [delay] [noreply]`, read as memcached reads it: at most two arguments; the
/// last one is `noreply` or not; the first is the delay unless it is the only one and is
/// `noreply` (so `flush_all noreply noreply` is a bad delay, silenced).
fn parse_flush_all(tokens: Tokens<'_>, line_end: usize) -> Parsed<'_> {
    let n = tokens.token_count();
    if n > 2 {
        return error(ProtocolError::UnknownCommand, line_end);
    }
    let mut tokens = tokens;
    let (first, second) = (tokens.next(), tokens.next());
    let noreply = is_noreply(second.or(first));
    let mut delay = 0;
    if n != usize::from(noreply) {
        match first.and_then(parse_i64) {
            Some(d) => delay = d,
            None => return error(ProtocolError::InvalidExptime, line_end),
        }
    }
    request(Request::FlushAll { delay, noreply }, line_end)
}

fn parse_verbosity(mut tokens: Tokens<'_>, line_end: usize) -> Parsed<'_> {
    let n = tokens.token_count();
    if !(1..=2).contains(&n) {
        return error(ProtocolError::UnknownCommand, line_end);
    }
    let level = tokens.next().and_then(parse_u32);
    let noreply = is_noreply(tokens.next());
    match level {
        Some(level) => request(Request::Verbosity { level, noreply }, line_end),
        None => error(ProtocolError::BadFormat, line_end),
    }
}

fn parse_meta<'a>(
    name: &[u8],
    mut tokens: Tokens<'a>,
    buf: &'a [u8],
    line_end: usize,
    limits: &Limits,
) -> Parsed<'a> {
    let command = match MetaCommand::from_name(name) {
        Some(c) if c != MetaCommand::Noop => c,
        _ => {
            // `mn` takes no key and no flags: anything after it is ignored, as memcached does.
            return request(
                Request::Meta {
                    command: MetaCommand::Noop,
                    key: MetaKey::empty(),
                    flags: MetaFlags::default(),
                    data: &[],
                },
                line_end,
            );
        }
    };
    let Some(raw_key) = tokens.next() else {
        return error(ProtocolError::UnknownCommand, line_end);
    };
    let mut datalen = None;
    if command == MetaCommand::Set {
        let Some(len) = tokens.next().and_then(parse_i64) else {
            return error(ProtocolError::BadFormat, line_end);
        };
        datalen = Some(len);
    }
    let flags = match MetaFlags::parse(command, tokens.remainder()) {
        Ok(f) => f,
        Err(e) => return meta_error(e, command, datalen, buf, line_end, limits),
    };
    let key = match MetaKey::new(raw_key, flags.base64) {
        Ok(k) => k,
        Err(e) => return meta_error(e, command, datalen, buf, line_end, limits),
    };
    match datalen {
        Some(len) => data_block(
            len,
            buf,
            line_end,
            limits,
            // The default mode is set (`MS`).
            matches!(flags.mode, None | Some(b'S')).then_some(key),
            |data| Request::Meta {
                command,
                key,
                flags,
                data,
            },
        ),
        None => request(
            Request::Meta {
                command,
                key,
                flags,
                data: &[],
            },
            line_end,
        ),
    }
}

/// A meta request whose line is bad. For `ms`, memcached still consumes the data block
/// (when it can tell its length), so the value is not parsed as commands.
fn meta_error<'a>(
    e: MetaError,
    command: MetaCommand,
    datalen: Option<i64>,
    buf: &'a [u8],
    line_end: usize,
    limits: &Limits,
) -> Parsed<'a> {
    let err = match e {
        MetaError::BadKey => ProtocolError::BadFormat,
        other => ProtocolError::Meta(other),
    };
    if command == MetaCommand::Set && err != ProtocolError::BadFormat {
        if let Some(len) = datalen.and_then(|l| usize::try_from(l).ok()) {
            if len <= limits.item_size_max {
                let end = line_end + len + 2;
                if buf.len() < end {
                    return Parsed::Incomplete;
                }
                return error(err, end);
            }
        }
    }
    error(err, line_end)
}
