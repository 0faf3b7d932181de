//! Who hears of evictions: a front end's observer ([`crate::Store::observe_evictions`])
//! gets each item an eviction takes (not the expired or flushed ones reclaimed), under the
//! lock of the item's shard — so it must be quick and must not call the store.

/// An item as an eviction took it.
#[derive(Debug)]
pub struct Evicted<'a> {
    /// Its key.
    pub key: &'a [u8],
    /// Bytes of its value.
    pub value_len: usize,
    /// Its client flags.
    pub flags: u32,
    /// Read since it was stored.
    pub fetched: bool,
    /// Seconds it had left to live; -1 if it had no expiry.
    pub ttl: i64,
    /// Seconds since it was last stored or read.
    pub idle: u64,
}

/// Hears of every eviction (memcached's `watch evictions`, per-class eviction counts)
/// and every reclaim of an expired or flushed item.
pub trait EvictionObserver: Send + Sync {
    /// `item` was evicted.
    fn evicted(&self, item: &Evicted<'_>);

    /// `item`, expired or flushed, was reclaimed: by the crawler (`by_crawler`) or by a
    /// store that needed its memory (its `ttl` is then 0 or less).
    fn reclaimed(&self, item: &Evicted<'_>, by_crawler: bool) {
        let _ = (item, by_crawler);
    }
}
