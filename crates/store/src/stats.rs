//! Counters, named and defined as in memcached's `stats` output.
//!
//! Each shard counts into its own [`ShardStats`] under the shard lock it already
//! holds, so counting costs no atomics; [`crate::Store::stats`] sums the shards.

/// A snapshot of the store's counters (memcached `stats` names and meanings).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Items currently linked (including expired or flushed ones not yet reclaimed).
    pub curr_items: u64,
    /// Items ever stored.
    pub total_items: u64,
    /// Bytes charged against the limit: key + value + [`crate::ITEM_OVERHEAD`] per item.
    pub bytes: u64,
    /// The memory limit (`Config::memory_limit`).
    pub limit_maxbytes: u64,
    /// Live items removed to make room.
    pub evictions: u64,
    /// Expired or flushed items reclaimed that had never been fetched.
    pub expired_unfetched: u64,
    /// Evicted items that had never been fetched.
    pub evicted_unfetched: u64,
    /// Expired or flushed items whose memory was reclaimed (by an eviction scan or
    /// the crawler). memcached counts only the former here.
    pub reclaimed: u64,
    /// Expired or flushed items the crawler ([`crate::Store::crawl_step`],
    /// [`crate::Store::reclaim_expired`]) freed; also counted in `reclaimed`.
    pub crawler_reclaimed: u64,
    /// Items (occupied slab slots) the crawler examined.
    pub crawler_items_checked: u64,
    /// Get-type requests (`get`, `gets`, `mg`) that found a live item.
    pub get_hits: u64,
    /// Get-type requests that found nothing.
    pub get_misses: u64,
    /// Get-type requests that found an expired item (also counted as misses).
    pub get_expired: u64,
    /// Get-type requests that found a flushed item (also counted as misses).
    pub get_flushed: u64,
    /// Deletes that removed an item.
    pub delete_hits: u64,
    /// Deletes that found nothing (or whose CAS did not match).
    pub delete_misses: u64,
    /// Successful increments.
    pub incr_hits: u64,
    /// Increments of a missing key.
    pub incr_misses: u64,
    /// Successful decrements.
    pub decr_hits: u64,
    /// Decrements of a missing key.
    pub decr_misses: u64,
    /// CAS stores that matched.
    pub cas_hits: u64,
    /// CAS stores of a missing key.
    pub cas_misses: u64,
    /// CAS stores whose CAS did not match.
    pub cas_badval: u64,
    /// Touches (`touch`, `gat`, `mg … T`) that found an item.
    pub touch_hits: u64,
    /// Touches that found nothing.
    pub touch_misses: u64,
    /// Stores (and read-modify-writes) refused because the item would be over the
    /// item size limit (`SERVER_ERROR object too large for cache`).
    pub store_too_large: u64,
    /// Stores and arithmetic refused for lack of memory (`SERVER_ERROR out of memory
    /// storing object`).
    pub store_no_memory: u64,
}

/// One shard's counters (everything in [`StoreStats`] that is a count of events).
#[derive(Clone, Debug, Default)]
pub(crate) struct ShardStats {
    pub total_items: u64,
    pub evictions: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    pub reclaimed: u64,
    pub crawler_reclaimed: u64,
    pub crawler_items_checked: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub get_expired: u64,
    pub get_flushed: u64,
    pub delete_hits: u64,
    pub delete_misses: u64,
    pub incr_hits: u64,
    pub incr_misses: u64,
    pub decr_hits: u64,
    pub decr_misses: u64,
    pub cas_hits: u64,
    pub cas_misses: u64,
    pub cas_badval: u64,
    pub touch_hits: u64,
    pub touch_misses: u64,
}

impl ShardStats {
    /// Adds these counters into `out`.
    pub(crate) fn add_to(&self, out: &mut StoreStats) {
        out.total_items += self.total_items;
        out.evictions += self.evictions;
        out.expired_unfetched += self.expired_unfetched;
        out.evicted_unfetched += self.evicted_unfetched;
        out.reclaimed += self.reclaimed;
        out.crawler_reclaimed += self.crawler_reclaimed;
        out.crawler_items_checked += self.crawler_items_checked;
        out.get_hits += self.get_hits;
        out.get_misses += self.get_misses;
        out.get_expired += self.get_expired;
        out.get_flushed += self.get_flushed;
        out.delete_hits += self.delete_hits;
        out.delete_misses += self.delete_misses;
        out.incr_hits += self.incr_hits;
        out.incr_misses += self.incr_misses;
        out.decr_hits += self.decr_hits;
        out.decr_misses += self.decr_misses;
        out.cas_hits += self.cas_hits;
        out.cas_misses += self.cas_misses;
        out.cas_badval += self.cas_badval;
        out.touch_hits += self.touch_hits;
        out.touch_misses += self.touch_misses;
    }
}
