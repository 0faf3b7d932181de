//! Walking the shards a step at a time: the crawler's steps (expired and flushed items
//! reclaimed) and scans (items exported, e.g. for migration).

use crate::item::ExportedItem;

use super::{CrawlCursor, CrawlStep, ScanCursor, ScanStep, Store};

/// Slab slots one step of [`Store::reclaim_expired`] examines.
const RECLAIM_STEP: usize = 1024;

impl Store {
    /// One bounded step of the crawler (memcached's LRU crawler): locks the shard
    /// at `cursor`, examines at most `max_items` of its slab slots from where the
    /// last step stopped, and reclaims every expired or flushed item among them
    /// exactly as an eviction scan would (memory released, eviction order updated;
    /// on a durable store a dirty item's put is queued first, so an older disk
    /// version cannot come back). Counted in `crawler_items_checked` and
    /// `crawler_reclaimed` (and `reclaimed`, `expired_unfetched`).
    ///
    /// A step never crosses into another shard, so the lock is held for at most
    /// `max_items` slot visits (`max_items` 0 counts as 1). When it finishes the
    /// last shard the cursor returns to the first and the step says `wrapped`:
    /// one pass of steps from [`CrawlCursor::default`] to `wrapped` has examined
    /// every slot that existed when the pass began. On a durable store it first
    /// waits, holding no lock, while the write-behind queue is over its bound, as
    /// a write command does.
    pub fn crawl_step(&self, cursor: &mut CrawlCursor, max_items: usize) -> CrawlStep {
        self.throttle();
        let now = self.now();
        let si = cursor.shard.min(self.shards.len() - 1);
        let done = self
            .lock(si)
            .crawl(cursor.slot, max_items.max(1), &now, &self.budget);
        let mut wrapped = false;
        match done.next {
            Some(slot) => *cursor = CrawlCursor { shard: si, slot },
            None => {
                let next = si + 1;
                wrapped = next == self.shards.len();
                *cursor = CrawlCursor {
                    shard: if wrapped { 0 } else { next },
                    slot: 0,
                };
            }
        }
        CrawlStep {
            examined: done.examined,
            checked: done.checked,
            reclaimed: done.reclaimed,
            wrapped,
        }
    }

    /// Unlinks every expired or flushed item now (one whole crawler pass); returns
    /// how many. Runs as [`Store::crawl_step`]s of [`RECLAIM_STEP`] slots, so it
    /// holds one shard lock at a time, briefly.
    pub fn reclaim_expired(&self) -> u64 {
        let mut cursor = CrawlCursor::default();
        let mut reclaimed = 0;
        loop {
            let step = self.crawl_step(&mut cursor, RECLAIM_STEP);
            reclaimed += step.reclaimed as u64;
            if step.wrapped {
                return reclaimed;
            }
        }
    }

    /// The hash this store shards `key` by, as [`Store::scan_matching`] passes it
    /// to its filter. Seeded at random per store instance: it can partition one
    /// store's items (e.g. among parallel scans, by ranges of it), but means
    /// nothing to another store or process — a cluster ring hashes the key itself.
    pub fn key_hash(&self, key: &[u8]) -> u64 {
        self.hash(key)
    }

    /// One bounded step of an export pass (what migration streams): locks the
    /// shard at `cursor`, examines at most `max_items` of its slab slots from where
    /// the last step stopped (`max_items` 0 counts as 1), appends every live item
    /// among them to `out` and moves the cursor on. Expired and flushed items are
    /// skipped (and left for the crawler). Like [`Store::crawl_step`], a step never
    /// crosses into another shard, so one lock is held for at most `max_items` slot
    /// visits; a step may export nothing (free slots, dead items) while the pass
    /// goes on — loop until [`ScanStep::done`].
    ///
    /// A scan is read-only: it does not fetch-mark items, move them in the eviction
    /// order, or change any counter (`get_hits`, …); it does not wait for a durable
    /// store's write-behind queue. On a durable store it exports the items in memory
    /// only, not those that are only on disk: [`Store::scan_disk`] exports those.
    ///
    /// What a pass (steps from [`ScanCursor::default`] until `done`) guarantees:
    /// every key that has a live item for the whole pass is exported exactly once —
    /// with the version live when its slot was examined (an overwrite, touch or
    /// append keeps an item's slot, so such a key still counts as live throughout).
    /// A key stored, deleted, evicted, expired or flushed during the pass may be
    /// exported once, not at all, or — if it was removed after its slot was
    /// examined and stored again into a slot not yet examined — twice; exports of
    /// one key come in the order of its versions, so the last one is the newest
    /// seen (not necessarily the newest now).
    pub fn scan(
        &self,
        cursor: &mut ScanCursor,
        max_items: usize,
        out: &mut Vec<ExportedItem>,
    ) -> ScanStep {
        self.scan_step(cursor, max_items, out, false, |_| true)
    }

    /// [`Store::scan`], exporting only the live items for which `filter(hash, key)`
    /// is true (`hash` is [`Store::key_hash`]): e.g. a hash range of this store, or
    /// keys a cluster ring maps elsewhere. Filtered-out items still count as
    /// examined. The filter runs under the shard lock: keep it cheap, and never
    /// call the store from it (that could deadlock).
    pub fn scan_matching(
        &self,
        cursor: &mut ScanCursor,
        max_items: usize,
        out: &mut Vec<ExportedItem>,
        mut filter: impl FnMut(u64, &[u8]) -> bool,
    ) -> ScanStep {
        self.scan_step(cursor, max_items, out, false, |key| {
            filter(self.hash(key), key)
        })
    }

    /// [`Store::scan_matching`] of what a pass must read from memory before
    /// [`Store::scan_disk`] reads the rest: on a durable store only the items changed since
    /// they were last written (an item identical to its disk or queued version is read
    /// there, so it comes once), on a memory-only store every item.
    pub fn scan_unwritten(
        &self,
        cursor: &mut ScanCursor,
        max_items: usize,
        out: &mut Vec<ExportedItem>,
        mut filter: impl FnMut(u64, &[u8]) -> bool,
    ) -> ScanStep {
        let dirty_only = self.durable.is_some();
        self.scan_step(cursor, max_items, out, dirty_only, |key| {
            filter(self.hash(key), key)
        })
    }

    fn scan_step(
        &self,
        cursor: &mut ScanCursor,
        max_items: usize,
        out: &mut Vec<ExportedItem>,
        dirty_only: bool,
        keep: impl FnMut(&[u8]) -> bool,
    ) -> ScanStep {
        let si = cursor.shard;
        if si >= self.shards.len() {
            return ScanStep {
                done: true,
                ..ScanStep::default()
            };
        }
        let now = self.now();
        let before = out.len();
        let step = self.lock(si).scan(
            cursor.slot,
            max_items.max(1),
            &now,
            self.time,
            dirty_only,
            keep,
            out,
        );
        *cursor = match step.next {
            Some(slot) => ScanCursor { shard: si, slot },
            None => ScanCursor {
                shard: si + 1,
                slot: 0,
            },
        };
        ScanStep {
            examined: step.examined,
            exported: out.len() - before,
            done: cursor.shard == self.shards.len(),
        }
    }
}
