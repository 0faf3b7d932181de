//! Counters, named and defined as in memcached's `stats` output.
//!
//! Every figure is declared once, in a `figures!` table: the table makes the struct field,
//! its documentation, its name on the wire (`stats`, `/stats`, `/metrics`) and its
//! [`Kind`]. A front end renders [`StoreStats::figures`] and [`DurableStats::figures`] and
//! never names a store counter itself.
//!
//! Each shard counts into its own [`ShardStats`] under the shard lock it already holds, so
//! counting costs no atomics; [`crate::Store::stats`] sums the shards.

/// How a figure moves: what Prometheus is told it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only grows while the process lives (Prometheus `counter`).
    Counter,
    /// Goes up and down (Prometheus `gauge`).
    Gauge,
}

/// One named figure of a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figure {
    /// Its name in memcached's `stats` (and, prefixed `kvlab_`, in `/metrics`).
    pub name: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// Its value.
    pub value: u64,
}

/// Declares a struct of `u64` figures and its [`Figure`] list: each figure is one line of
/// the table (`doc`, `field: Kind`), and its wire name is the field's name after `prefix`.
macro_rules! figures {
    (
        $(#[$meta:meta])*
        pub struct $name:ident (prefix $prefix:literal) {
            $( $(#[doc = $doc:literal])* $field:ident: $kind:ident, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: u64, )*
        }

        impl $name {
            /// Every figure with its wire name and kind, in the table's order.
            pub fn figures(&self) -> Vec<Figure> {
                vec![$(Figure {
                    name: concat!($prefix, stringify!($field)),
                    kind: Kind::$kind,
                    value: self.$field,
                }),*]
            }

            /// Zeroes every [`Kind::Counter`] figure (memcached's `stats reset`); gauges stay.
            #[allow(dead_code)] // used for the shards' table only
            pub(crate) fn reset_counters(&mut self) {
                $( if matches!(Kind::$kind, Kind::Counter) { self.$field = 0; } )*
            }

            /// Adds every figure of `self` into `out` (how the shards' counters are summed).
            #[allow(dead_code)] // used for the shards' table only
            pub(crate) fn add_to(&self, out: &mut $name) {
                $( out.$field += self.$field; )*
            }
        }
    };
}

figures! {
    /// A snapshot of the store's counters (memcached `stats` names and meanings).
    pub struct StoreStats (prefix "") {
        /// Get-type requests (`get`, `gets`, `mg`) that found a live item.
        get_hits: Counter,
        /// Get-type requests that found nothing.
        get_misses: Counter,
        /// Get-type requests that found an expired item (also counted as misses).
        get_expired: Counter,
        /// Get-type requests that found a flushed item (also counted as misses).
        get_flushed: Counter,
        /// Deletes that found nothing (or whose CAS did not match).
        delete_misses: Counter,
        /// Deletes that removed an item.
        delete_hits: Counter,
        /// Increments of a missing key.
        incr_misses: Counter,
        /// Successful increments.
        incr_hits: Counter,
        /// Decrements of a missing key.
        decr_misses: Counter,
        /// Successful decrements.
        decr_hits: Counter,
        /// CAS stores of a missing key.
        cas_misses: Counter,
        /// CAS stores that matched.
        cas_hits: Counter,
        /// CAS stores whose CAS did not match.
        cas_badval: Counter,
        /// Touches (`touch`, `gat`, `mg … T`) that found an item.
        touch_hits: Counter,
        /// Touches that found nothing.
        touch_misses: Counter,
        /// The memory limit (`StoreConfig::memory_limit`).
        limit_maxbytes: Gauge,
        /// Bytes charged against the limit: key + value + [`crate::ITEM_OVERHEAD`] per item.
        bytes: Gauge,
        /// Items currently linked (including expired or flushed ones not yet reclaimed).
        curr_items: Gauge,
        /// Items ever stored.
        total_items: Counter,
        /// Expired or flushed items reclaimed that had never been fetched.
        expired_unfetched: Counter,
        /// Evicted items that had never been fetched.
        evicted_unfetched: Counter,
        /// Live items removed to make room.
        evictions: Counter,
        /// Expired or flushed items whose memory was reclaimed (by an eviction scan or
        /// the crawler). memcached counts only the former here.
        reclaimed: Counter,
        /// Expired or flushed items the crawler ([`crate::Store::crawl_step`],
        /// [`crate::Store::reclaim_expired`]) freed; also counted in `reclaimed`.
        crawler_reclaimed: Counter,
        /// Items (occupied slab slots) the crawler examined.
        crawler_items_checked: Counter,
        /// Stores (and read-modify-writes) refused because the item would be over the
        /// item size limit (`SERVER_ERROR object too large for cache`).
        store_too_large: Counter,
        /// Stores and arithmetic refused for lack of memory (`SERVER_ERROR out of memory
        /// storing object`).
        store_no_memory: Counter,
    }
}

/// One shard's counters: the store's table, of which a shard counts the events (the
/// whole-store gauges and refusals stay zero here; [`crate::Store::stats`] fills them).
pub(crate) type ShardStats = StoreStats;

figures! {
    /// Counters of a durable store's engine traffic (`durable_*` in `stats`).
    pub struct DurableStats (prefix "durable_") {
        /// Engine point reads (read-through misses).
        reads: Counter,
        /// Engine batches (commit rounds and purge batches) committed.
        commits: Counter,
        /// fdatasyncs (as part of a commit or alone).
        fsyncs: Counter,
        /// Item puts and deletes written.
        items_written: Counter,
        /// `persist` calls.
        persists: Counter,
        /// Bytes of queued ops not yet in the engine (write-behind buffer and tombstones).
        queued_bytes: Gauge,
        /// Writes that waited for the write-behind queue to drain below its bound.
        write_waits: Counter,
        /// Commit rounds or purge steps of the flusher that failed (a failed round's
        /// ops stay queued; a failed purge pass is retried later).
        flush_errors: Counter,
        /// Dead records (of an older flush generation, or expired) deleted from the
        /// engine by the purge, or by `load` finding one. A rare race between the two
        /// can delete (and count) one record twice.
        purged: Counter,
        /// Records the purge examined.
        purge_scanned: Counter,
        /// Purge passes over the whole engine completed.
        purge_passes: Counter,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_follow_the_table_with_names_kinds_and_values() {
        let s = StoreStats {
            evictions: 7,
            bytes: 3,
            ..StoreStats::default()
        };
        let f = s.figures();
        let ev = f.iter().find(|f| f.name == "evictions").copied();
        assert_eq!(
            ev,
            Some(Figure {
                name: "evictions",
                kind: Kind::Counter,
                value: 7
            })
        );
        let bytes = f
            .iter()
            .find(|f| f.name == "bytes")
            .map(|f| (f.kind, f.value));
        assert_eq!(bytes, Some((Kind::Gauge, 3)));
        assert_eq!(f.first().map(|f| f.name), Some("get_hits"));

        let d = DurableStats {
            queued_bytes: 5,
            ..DurableStats::default()
        };
        let q = d
            .figures()
            .into_iter()
            .find(|f| f.name == "durable_queued_bytes");
        assert_eq!(q.map(|f| (f.kind, f.value)), Some((Kind::Gauge, 5)));
    }

    #[test]
    fn add_to_sums_every_field() {
        let one = StoreStats {
            get_hits: 1,
            evictions: 2,
            store_no_memory: 3,
            ..StoreStats::default()
        };
        let mut sum = StoreStats::default();
        one.add_to(&mut sum);
        one.add_to(&mut sum);
        let doubled: Vec<u64> = one.figures().iter().map(|f| 2 * f.value).collect();
        let got: Vec<u64> = sum.figures().iter().map(|f| f.value).collect();
        assert_eq!(got, doubled);
    }
}
