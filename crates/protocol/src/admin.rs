//! memcached's administration commands: `shutdown`, `cache_memlimit`, `slabs reassign`,
//! `stats detail`, `lru_crawler` and `watch`. Parsed here with memcached 1.6's token
//! rules (which argument counts are `ERROR`, which values are a bad format); what they
//! answer depends on the server's settings (`-A`, the crawler, the size classes), so the
//! server composes the replies.

use crate::lex::{parse_i64, parse_u64, Tokens};

/// An administration command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admin<'a> {
    /// `shutdown [graceful]` (served only with `-A`).
    Shutdown(ShutdownMode),
    /// `cache_memlimit <megabytes> [noreply]`: the memory limit at run time.
    CacheMemlimit {
        /// The new limit in megabytes; `None` when the argument is not a number
        /// (memcached answers `ERROR`).
        megabytes: Option<u64>,
        /// The line ended with `noreply`: no reply at all, even to an error.
        noreply: bool,
    },
    /// `slabs reassign <src> <dst>`: move a slab page between size classes.
    SlabsReassign {
        /// Source and destination class; `None` when either is not a number.
        classes: Option<(i64, i64)>,
    },
    /// `stats detail on|off|dump`; anything else (or nothing) is the usage error.
    StatsDetail(&'a [u8]),
    /// `stats cachedump <class> <limit>`: list the items of a size class.
    StatsCachedump(Cachedump),
    /// `lru_crawler …`.
    LruCrawler(LruCrawler<'a>),
    /// `watch [streams…]`: the connection becomes a log stream.
    Watch {
        /// The streams asked for ([`Watch`] bits; `fetchers` when none is named), or
        /// `None` when a name is unknown (memcached answers `ERROR`).
        streams: Option<u16>,
    },
}

/// `stats cachedump`'s arguments, as memcached reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cachedump {
    /// Class and most items to list (0: all).
    List {
        /// The size class.
        class: u64,
        /// Most items to list; 0 lists all.
        limit: u64,
    },
    /// Fewer than two arguments: `CLIENT_ERROR bad command line`.
    Usage,
    /// An argument that is not an unsigned number: `CLIENT_ERROR bad command line format`.
    BadFormat,
}

/// `shutdown`'s argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownMode {
    /// `shutdown`: stop now.
    Now,
    /// `shutdown graceful`: stop after the connections' replies are out.
    Graceful,
    /// Anything else (`CLIENT_ERROR invalid shutdown mode`).
    Invalid,
}

/// The `lru_crawler` subcommands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LruCrawler<'a> {
    /// `lru_crawler crawl <classes|all>`: a pass that reclaims expired items now.
    Crawl(&'a [u8]),
    /// `lru_crawler metadump <classes|all|hash>`: one line per item, then `END`.
    Metadump(&'a [u8]),
    /// `lru_crawler tocrawl <n>` (`None`: not a number).
    Tocrawl(Option<u64>),
    /// `lru_crawler sleep <µs>` (`None`: not a number).
    Sleep(Option<u64>),
    /// `lru_crawler enable`.
    Enable,
    /// `lru_crawler disable`.
    Disable,
    /// Any other form (`ERROR`).
    Unknown,
}

/// `watch` stream bits (memcached's `LOG_*` names).
pub struct Watch;

impl Watch {
    /// `fetchers`: every item fetch.
    pub const FETCHERS: u16 = 1;
    /// `mutations`: every item store.
    pub const MUTATIONS: u16 = 1 << 1;
    /// `evictions`: every eviction.
    pub const EVICTIONS: u16 = 1 << 2;
    /// `rawcmds`, `sysevents`, `connevents`, `proxyreqs`, `proxyevents`, `proxyuser`:
    /// accepted as memcached does; kvlab logs nothing for them.
    pub const OTHER: u16 = 1 << 15;

    fn of(name: &[u8]) -> Option<u16> {
        Some(match name {
            b"fetchers" => Self::FETCHERS,
            b"mutations" => Self::MUTATIONS,
            b"evictions" => Self::EVICTIONS,
            b"rawcmds" | b"sysevents" | b"connevents" | b"proxyreqs" | b"proxyevents"
            | b"proxyuser" => Self::OTHER,
            _ => return None,
        })
    }
}

/// What parsing one admin command line gives.
pub(crate) enum Parsed<'a> {
    /// A command.
    Command(Admin<'a>),
    /// memcached's `ERROR` (unknown form, wrong number of arguments).
    Unknown,
    /// memcached's `CLIENT_ERROR bad command line format`.
    BadFormat,
}

/// `shutdown …` (`tokens` after the command name).
pub(crate) fn shutdown(mut tokens: Tokens<'_>) -> Parsed<'static> {
    let mode = match (tokens.next(), tokens.next()) {
        (None, _) => ShutdownMode::Now,
        (Some(b"graceful"), None) => ShutdownMode::Graceful,
        _ => ShutdownMode::Invalid,
    };
    Parsed::Command(Admin::Shutdown(mode))
}

/// `cache_memlimit …`: one or two arguments, else `ERROR`.
pub(crate) fn cache_memlimit(tokens: Tokens<'_>) -> Parsed<'static> {
    let n = tokens.token_count();
    if !(1..=2).contains(&n) {
        return Parsed::Unknown;
    }
    let mut t = tokens.clone();
    let megabytes = t.next().and_then(parse_u64);
    let noreply = tokens.last() == Some(b"noreply");
    Parsed::Command(Admin::CacheMemlimit { megabytes, noreply })
}

/// `slabs reassign <src> <dst>` (the other `slabs` forms are the caller's).
pub(crate) fn slabs_reassign(mut tokens: Tokens<'_>) -> Parsed<'static> {
    let class = |t: Option<&[u8]>| t.and_then(parse_i64).filter(|c| i32::try_from(*c).is_ok());
    let (src, dst) = (class(tokens.next()), class(tokens.next()));
    Parsed::Command(Admin::SlabsReassign {
        classes: src.zip(dst),
    })
}

/// `stats detail …` (`tokens` after `detail`).
pub(crate) fn stats_detail(mut tokens: Tokens<'_>) -> Parsed<'_> {
    Parsed::Command(Admin::StatsDetail(tokens.next().unwrap_or_default()))
}

/// `stats cachedump …` (`tokens` after `cachedump`); arguments past the second are
/// ignored, as memcached ignores them.
pub(crate) fn stats_cachedump(mut tokens: Tokens<'_>) -> Parsed<'static> {
    let dump = match (tokens.next(), tokens.next()) {
        (Some(class), Some(limit)) => match (parse_u64(class), parse_u64(limit)) {
            (Some(class), Some(limit)) => Cachedump::List { class, limit },
            _ => Cachedump::BadFormat,
        },
        _ => Cachedump::Usage,
    };
    Parsed::Command(Admin::StatsCachedump(dump))
}

/// `lru_crawler …`.
pub(crate) fn lru_crawler(tokens: Tokens<'_>) -> Parsed<'_> {
    let n = tokens.token_count();
    let mut t = tokens;
    let (sub, arg) = (t.next(), t.next());
    let command = match (n, sub, arg) {
        (2, Some(b"crawl"), Some(arg)) => LruCrawler::Crawl(arg),
        (2, Some(b"metadump"), Some(arg)) => LruCrawler::Metadump(arg),
        (2, Some(b"tocrawl"), Some(arg)) => match parse_u64(arg) {
            Some(v) if v <= u64::from(u32::MAX) => LruCrawler::Tocrawl(Some(v)),
            _ => return Parsed::BadFormat,
        },
        (2, Some(b"sleep"), Some(arg)) => match parse_u64(arg) {
            Some(v) if v <= u64::from(u32::MAX) => LruCrawler::Sleep(Some(v)),
            _ => return Parsed::BadFormat,
        },
        (1, Some(b"enable"), _) => LruCrawler::Enable,
        (1, Some(b"disable"), _) => LruCrawler::Disable,
        _ => LruCrawler::Unknown,
    };
    Parsed::Command(Admin::LruCrawler(command))
}

/// `watch [streams…]`.
pub(crate) fn watch(tokens: Tokens<'_>) -> Parsed<'static> {
    let mut streams = 0;
    for name in tokens.clone() {
        match Watch::of(name) {
            Some(bit) => streams |= bit,
            None => return Parsed::Command(Admin::Watch { streams: None }),
        }
    }
    if streams == 0 {
        streams = Watch::FETCHERS;
    }
    Parsed::Command(Admin::Watch {
        streams: Some(streams),
    })
}

/// memcached's `uriencode`: every byte but ASCII letters, digits and `-._~` as `%XX`
/// (upper-case hex), as `lru_crawler metadump` and `watch` print keys.
pub fn uri_encode(out: &mut Vec<u8>, key: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in key {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_encoding_is_memcacheds() {
        let mut out = Vec::new();
        uri_encode(&mut out, b"a:b c~d\x01\xff");
        assert_eq!(out, b"a%3Ab%20c~d%01%FF");
    }
}
