//! The memory budget: one atomic counter of charged bytes shared by all shards.
//!
//! A store first *reserves* the bytes it needs with a compare-and-swap that never
//! takes the counter above the limit, and only then links the item; removing an item
//! releases its charge. So the counter — `stats().bytes` — never exceeds the limit,
//! whatever the interleaving of threads, except while a lowered limit
//! (`cache_memlimit`) is being evicted down to: then no reservation succeeds until it
//! is met.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Keeps the hot counter on its own cache line, away from read-mostly fields.
#[repr(align(128))]
pub(crate) struct Budget {
    used: AtomicUsize,
    /// Changed at run time by [`Budget::set_limit`] (`cache_memlimit`); read relaxed, as
    /// a reservation only needs some recent value.
    limit: AtomicUsize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Budget {
        Budget {
            used: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_never_exceeds_limit() {
        let b = Budget::new(100);
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
}
