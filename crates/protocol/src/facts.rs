//! What a request *is*, stated once: its keys ([`Request::keys`]), what it does to them
//! ([`Request::effect`]) and its command family ([`Request::family`]).
//!
//! Each fact is one `match` over every variant, with no catch-all arm: a new command fails to
//! compile here until each fact is stated for it, and then every layer that asks — the
//! cluster's ownership gate, the engine's read-through and its dispatch, the session, the
//! proxy — knows it without being changed.

use crate::admin::Admin;
use crate::meta::{MetaCommand, MetaKey};
use crate::request::{Keys, Request, StoreCommand};

/// Which family of commands a request belongs to: the part of a server that serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `get gets gat gats`: values of several keys, one reply ended by `END`.
    Retrieval,
    /// `set add replace append prepend cas`: a value stored.
    Storage,
    /// `incr decr`: a number changed in place.
    Arithmetic,
    /// `delete touch`: one existing key removed or given a new expiry.
    KeyUpdate,
    /// `mg ms md ma mn me`: the meta commands.
    Meta,
    /// Everything about the server rather than an item: `flush_all verbosity stats version
    /// quit slabs automove cluster` and the administration commands.
    Admin,
}

/// What a request does to the items it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Reads its keys' items and changes none (`get gets me`, `mg` without `T N E`).
    Read,
    /// Reads or finds its keys' items and gives them a new expiry (`gat gats touch`, `mg T`).
    Touch,
    /// Changes its key's item depending on what it holds now (`add replace append prepend
    /// cas incr decr delete md ma`, `ms` in another mode or with `C I`, `mg N E`).
    Write,
    /// Replaces its key's item whatever it holds (`set`, `ms` in set mode without `C I`):
    /// its current state is never read.
    Overwrite,
    /// Names no item: the server's state and commands (`flush_all`, settings, statistics,
    /// administration, `version quit cluster`). Some change items wholesale (`flush_all`;
    /// `cache_memlimit` and `lru_crawler` may evict or reclaim).
    Server,
    /// Nothing at all (`mn`).
    Nothing,
}

impl Effect {
    /// Whether a request of this effect may change an item: what a cluster node refuses
    /// while it may no longer write. A server-wide command counts (it may drop items).
    #[inline]
    pub fn may_change_items(self) -> bool {
        match self {
            Effect::Read | Effect::Nothing => false,
            Effect::Touch | Effect::Write | Effect::Overwrite | Effect::Server => true,
        }
    }

    /// Whether the command depends on its keys' current items (a durable cache reads them
    /// through from disk first): all that name keys but an overwrite.
    #[inline]
    pub fn reads_current(self) -> bool {
        match self {
            Effect::Read | Effect::Touch | Effect::Write => true,
            Effect::Overwrite | Effect::Server | Effect::Nothing => false,
        }
    }
}

/// The keys a request names, borrowed from it: none, one, a retrieval's list, or a meta
/// command's key (decoded from base64 on use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKeys<'a> {
    /// No key.
    None,
    /// One key.
    One(&'a [u8]),
    /// A retrieval's keys, in request order.
    List(Keys<'a>),
    /// A meta command's key (base64 decoded on use).
    Meta(MetaKey<'a>),
}

impl RequestKeys<'_> {
    /// Calls `f` with every key, in request order.
    #[inline]
    pub fn for_each(self, mut f: impl FnMut(&[u8])) {
        self.find_map(|k| {
            f(k);
            None::<()>
        });
    }

    /// Calls `f` with each key in request order until it returns `Some`, and returns that.
    #[inline]
    pub fn find_map<R>(self, mut f: impl FnMut(&[u8]) -> Option<R>) -> Option<R> {
        match self {
            RequestKeys::None => None,
            RequestKeys::One(key) => f(key),
            RequestKeys::List(keys) => keys.iter().find_map(f),
            RequestKeys::Meta(key) => key.with(f),
        }
    }
}

impl<'a> Request<'a> {
    /// The keys the request names (none for `mn` and the server-wide commands).
    #[inline]
    pub fn keys(&self) -> RequestKeys<'a> {
        match *self {
            Request::Get { keys, .. } | Request::Gat { keys, .. } => RequestKeys::List(keys),
            Request::Store { key, .. }
            | Request::Arith { key, .. }
            | Request::Delete { key, .. }
            | Request::Touch { key, .. } => RequestKeys::One(key),
            Request::Meta { command, key, .. } => match command {
                MetaCommand::Get
                | MetaCommand::Set
                | MetaCommand::Delete
                | MetaCommand::Arith
                | MetaCommand::Debug => RequestKeys::Meta(key),
                MetaCommand::Noop => RequestKeys::None,
            },
            Request::FlushAll { .. }
            | Request::Verbosity { .. }
            | Request::SlabsAutomove { .. }
            | Request::Cluster { .. }
            | Request::Version
            | Request::Quit
            | Request::Stats { .. }
            | Request::Admin(_) => RequestKeys::None,
        }
    }

    /// What the request does to the items it names.
    #[inline]
    pub fn effect(&self) -> Effect {
        match *self {
            Request::Get { .. } => Effect::Read,
            Request::Gat { .. } | Request::Touch { .. } => Effect::Touch,
            Request::Store { command, .. } => match command {
                StoreCommand::Set => Effect::Overwrite,
                StoreCommand::Add
                | StoreCommand::Replace
                | StoreCommand::Append
                | StoreCommand::Prepend
                | StoreCommand::Cas => Effect::Write,
            },
            Request::Arith { .. } | Request::Delete { .. } => Effect::Write,
            Request::Meta { command, flags, .. } => match command {
                MetaCommand::Get if flags.has(b'N') || flags.has(b'E') => Effect::Write,
                MetaCommand::Get if flags.has(b'T') => Effect::Touch,
                MetaCommand::Get | MetaCommand::Debug => Effect::Read,
                MetaCommand::Set
                    if matches!(flags.mode, None | Some(b'S'))
                        && flags.compare_cas.is_none()
                        && !flags.invalidate =>
                {
                    Effect::Overwrite
                }
                MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arith => Effect::Write,
                MetaCommand::Noop => Effect::Nothing,
            },
            Request::FlushAll { .. }
            | Request::Verbosity { .. }
            | Request::SlabsAutomove { .. }
            | Request::Cluster { .. }
            | Request::Version
            | Request::Quit
            | Request::Stats { .. }
            | Request::Admin(_) => Effect::Server,
        }
    }

    /// The request's command family.
    #[inline]
    pub fn family(&self) -> Family {
        match *self {
            Request::Get { .. } | Request::Gat { .. } => Family::Retrieval,
            Request::Store { .. } => Family::Storage,
            Request::Arith { .. } => Family::Arithmetic,
            Request::Delete { .. } | Request::Touch { .. } => Family::KeyUpdate,
            Request::Meta { .. } => Family::Meta,
            Request::FlushAll { .. }
            | Request::Verbosity { .. }
            | Request::SlabsAutomove { .. }
            | Request::Cluster { .. }
            | Request::Version
            | Request::Quit
            | Request::Stats { .. }
            | Request::Admin(_) => Family::Admin,
        }
    }

    /// Whether the client asked for no reply on success (`noreply`).
    #[inline]
    pub fn noreply(&self) -> bool {
        match *self {
            Request::Store { noreply, .. }
            | Request::Arith { noreply, .. }
            | Request::Delete { noreply, .. }
            | Request::Touch { noreply, .. }
            | Request::FlushAll { noreply, .. }
            | Request::Verbosity { noreply, .. } => noreply,
            Request::Admin(admin) => match admin {
                Admin::CacheMemlimit { noreply, .. } => noreply,
                Admin::Shutdown(_)
                | Admin::SlabsReassign { .. }
                | Admin::StatsDetail(_)
                | Admin::StatsCachedump(_)
                | Admin::LruCrawler(_)
                | Admin::Watch { .. } => false,
            },
            Request::Get { .. }
            | Request::Gat { .. }
            | Request::SlabsAutomove { .. }
            | Request::Cluster { .. }
            | Request::Version
            | Request::Quit
            | Request::Stats { .. }
            | Request::Meta { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::request::{parse, Limits, Parsed};

    use super::*;

    fn facts(line: &str) -> (Vec<Vec<u8>>, Effect, Family) {
        let Parsed::Request { request, .. } = parse(line.as_bytes(), &Limits::default()) else {
            panic!("{line:?} does not parse")
        };
        let mut keys = Vec::new();
        request.keys().for_each(|k| keys.push(k.to_vec()));
        (keys, request.effect(), request.family())
    }

    #[test]
    fn the_facts_of_each_command() {
        use Effect::*;
        use Family::*;
        let k = |ks: &[&str]| ks.iter().map(|k| k.as_bytes().to_vec()).collect::<Vec<_>>();
        for (line, keys, effect, family) in [
            ("get a  b\r\n", k(&["a", "b"]), Read, Retrieval),
            ("gats 5 a\r\n", k(&["a"]), Touch, Retrieval),
            ("set a 0 0 1\r\nx\r\n", k(&["a"]), Overwrite, Storage),
            ("add a 0 0 1\r\nx\r\n", k(&["a"]), Write, Storage),
            ("cas a 0 0 1 5\r\nx\r\n", k(&["a"]), Write, Storage),
            ("incr a 1\r\n", k(&["a"]), Write, Arithmetic),
            ("delete a\r\n", k(&["a"]), Write, KeyUpdate),
            ("touch a 5\r\n", k(&["a"]), Touch, KeyUpdate),
            ("mg a v\r\n", k(&["a"]), Read, Meta),
            ("mg a T5 v\r\n", k(&["a"]), Touch, Meta),
            ("mg a N5 v\r\n", k(&["a"]), Write, Meta),
            ("mg a2V5 b v\r\n", k(&["key"]), Read, Meta),
            ("ms a 1 T5\r\nx\r\n", k(&["a"]), Overwrite, Meta),
            ("ms a 1 MA\r\nx\r\n", k(&["a"]), Write, Meta),
            ("ms a 1 C5\r\nx\r\n", k(&["a"]), Write, Meta),
            ("ms a 1 I\r\nx\r\n", k(&["a"]), Write, Meta),
            ("md a\r\n", k(&["a"]), Write, Meta),
            ("ma a\r\n", k(&["a"]), Write, Meta),
            ("me a\r\n", k(&["a"]), Read, Meta),
            ("mn\r\n", k(&[]), Nothing, Meta),
            ("flush_all\r\n", k(&[]), Server, Admin),
            ("stats\r\n", k(&[]), Server, Admin),
            ("version\r\n", k(&[]), Server, Admin),
            ("lru_crawler enable\r\n", k(&[]), Server, Admin),
        ] {
            assert_eq!(facts(line), (keys, effect, family), "{line:?}");
        }
    }

    #[test]
    fn keys_stop_at_the_first_found() {
        let Parsed::Request { request, .. } = parse(b"get a b c\r\n", &Limits::default()) else {
            panic!()
        };
        let mut seen = 0;
        let found = request.keys().find_map(|k| {
            seen += 1;
            (k == b"b").then_some(seen)
        });
        assert_eq!(found, Some(2));
    }
}
