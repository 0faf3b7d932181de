//! The memory budget: one atomic counter of charged bytes shared by all shards.
//!
//! A store first *reserves* the bytes it needs with a compare-and-swap that never
//! takes the counter above the limit, and only then links the item; removing an item
//! releases its charge. So the counter — `stats().bytes` — never exceeds the limit,
//! whatever the interleaving of threads, except while a lowered limit
//! (`cache_memlimit`) is being evicted down to: then no reservation succeeds until it
//! is met.
//!
//! Beside the bytes, the budget counts items against an optional entry bound
//! (`StoreConfig::max_items`, `--cache-items`) the same way: a store of a *new* key takes an
//! item slot with a compare-and-swap that never passes the bound, under the key's shard
//! lock and just before it links the item (a replacement takes none: it is known then
//! whether the key has an item), and unlinking an item gives its slot back. So the
//! number of items never exceeds the bound either.
//!
//! The budget also keeps the store's *charge clock*: the bytes ever charged by a
//! store, which orders items store-wide for `lru` (see [`Budget::advance`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Keeps the hot counter on its own cache line, away from read-mostly fields.
#[repr(align(128))]
pub(crate) struct Budget {
    used: AtomicUsize,
    /// Changed at run time by [`Budget::set_limit`] (`cache_memlimit`); read relaxed, as
    /// a reservation only needs some recent value.
    limit: AtomicUsize,
    /// Bytes ever charged by stores (the charge clock); on the same cache line as
    /// `used`, which the same stores already write.
    charged: AtomicU64,
    /// Charge-clock bytes per stamp unit, as a shift (see [`Budget::stamp_now`]).
    stamp_shift: u32,
    /// Items linked (or with a slot taken and about to be linked).
    items: AtomicUsize,
    /// The entry bound; `usize::MAX` for none.
    max_items: usize,
}

/// Stamp units per memory limit: a stamp's resolution is the limit / 4096 (16 KiB
/// under `-m 64`), and 16-bit stamps compare correctly over 8 limits of stores.
const STAMP_UNITS_PER_LIMIT: usize = 4096;

impl Budget {
    /// A budget of `limit` bytes and at most `max_items` items (0: no entry bound).
    pub(crate) fn new(limit: usize, max_items: usize) -> Budget {
        Budget {
            used: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit),
            charged: AtomicU64::new(0),
            stamp_shift: (limit / STAMP_UNITS_PER_LIMIT).max(1).ilog2(),
            items: AtomicUsize::new(0),
            max_items: if max_items == 0 {
                usize::MAX
            } else {
                max_items
            },
        }
    }

    /// Takes a slot for one more item if that keeps the count within the entry bound.
    #[inline]
    pub(crate) fn try_take_item(&self) -> bool {
        if self.max_items == usize::MAX {
            self.items.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        self.items
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_items).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back an item slot (an item unlinked, or a slot taken and not used).
    #[inline]
    pub(crate) fn release_item(&self) {
        self.items.fetch_sub(1, Ordering::Relaxed);
    }

    /// Advances the charge clock by a store of `n` bytes and returns the store's
    /// stamp: the clock after it, in units of the limit / 4096, modulo 2^16.
    ///
    /// Stamps order items store-wide by the bytes stored since (an item's *age*,
    /// [`stamp_age`]), so `lru` can evict the store-wide least recently used item
    /// while its lists are per shard. One relaxed add on the cache line the
    /// reservation already writes.
    #[inline]
    pub(crate) fn advance(&self, n: usize) -> u16 {
        let n = n as u64;
        let t = self.charged.fetch_add(n, Ordering::Relaxed).wrapping_add(n);
        (t >> self.stamp_shift) as u16
    }

    /// The stamp of now (what an access gives its item), without advancing.
    #[inline]
    pub(crate) fn stamp_now(&self) -> u16 {
        (self.charged.load(Ordering::Relaxed) >> self.stamp_shift) as u16
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    pub(crate) fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Adds `n` bytes if that keeps the total within the limit.
    ///
    /// Relaxed is enough: the counter publishes no data, it only has to be a
    /// single total order of additions and subtractions, which any atomic is.
    #[inline]
    pub(crate) fn try_reserve(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let mut cur = self.used.load(Ordering::Relaxed);
        let limit = self.limit();
        loop {
            let Some(new) = cur.checked_add(n).filter(|&t| t <= limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Returns `n` previously reserved bytes.
    #[inline]
    pub(crate) fn release(&self, n: usize) {
        if n != 0 {
            self.used.fetch_sub(n, Ordering::Relaxed);
        }
    }
}

/// Age of an item stamped `stamp` at stamp `now`, in stamp units (limit / 4096
/// bytes stored since): 0 for a stamp from after `now` (a store that raced with the
/// read of `now`); an item untouched for more than 8 limits of stores wraps around
/// and looks younger than it is, which only makes it a later victim.
#[inline]
pub(crate) fn stamp_age(now: u16, stamp: u16) -> u16 {
    let d = now.wrapping_sub(stamp);
    if d > u16::MAX / 2 {
        0
    } else {
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_slots_never_exceed_the_bound() {
        let b = Budget::new(100, 2);
        assert!(b.try_take_item());
        assert!(b.try_take_item());
        assert!(!b.try_take_item(), "a third item over a bound of 2");
        b.release_item();
        assert!(b.try_take_item());
        let unbounded = Budget::new(100, 0);
        assert!((0..1000).all(|_| unbounded.try_take_item()));
    }

    #[test]
    fn reserve_never_exceeds_limit() {
        let b = Budget::new(100, 0);
        assert!(b.try_reserve(60));
        assert!(!b.try_reserve(41));
        assert!(b.try_reserve(40));
        assert!(!b.try_reserve(1));
        assert!(b.try_reserve(0));
        b.release(50);
        assert_eq!(b.used(), 50);
        assert!(!b.try_reserve(usize::MAX));
        b.set_limit(40);
        assert!(!b.try_reserve(1), "over a lowered limit nothing fits");
        b.release(20);
        assert!(b.try_reserve(10));
        assert!(!b.try_reserve(1));
    }

    #[test]
    fn stamps_count_bytes_in_units_of_the_limit() {
        let b = Budget::new(64 << 20, 0);
        assert_eq!(b.stamp_shift, 14);
        assert_eq!(b.advance(200_000), 12);
        assert_eq!(b.stamp_now(), 12);
        assert_eq!(stamp_age(b.stamp_now(), 0), 12);
        assert_eq!(stamp_age(5, 7), 0, "a stamp from after now is age 0");
        assert_eq!(stamp_age(3, u16::MAX), 4, "ages wrap");
        assert_eq!(Budget::new(100, 0).stamp_shift, 0);
    }
}
