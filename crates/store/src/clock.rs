//! Time: the [`Clock`] the store reads, and the memcached rules that turn a wire
//! exptime into an absolute expiry.
//!
//! The store never reads the system time itself. The server passes [`SystemClock`];
//! tests pass a [`ManualClock`] and move it, so no test sleeps.
//!
//! Internally the store keeps times as `u32` seconds relative to an epoch taken when
//! the store is created (like memcached's `rel_time_t`), which keeps per-item
//! metadata small. [`TimeBase`] does the conversions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time in whole unix seconds.
pub trait Clock: Send + Sync + 'static {
    /// Seconds since the unix epoch.
    fn now(&self) -> u64;
}

/// The real wall clock.
///
/// On Linux it reads `CLOCK_REALTIME_COARSE` (the time of the last timer tick, a few
/// milliseconds old): about 8 ns per read instead of 30-40 ns for
/// [`SystemTime::now`], and every request reads the clock once. Whole seconds are
/// all the store needs. Elsewhere it uses [`SystemTime`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> u64 {
        #[cfg(target_os = "linux")]
        {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
            let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
            if rc == 0 {
                // A clock before 1970 reads as 0.
                return u64::try_from(ts.tv_sec).unwrap_or(0);
            }
        }
        // A system clock set before 1970 reads as 0 rather than failing.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock that reads `start` until moved.
    pub fn new(start: u64) -> ManualClock {
        ManualClock {
            now: AtomicU64::new(start),
        }
    }

    /// Sets the current time (unix seconds).
    pub fn set(&self, t: u64) {
        self.now.store(t, Ordering::SeqCst);
    }

    /// Moves the clock forward by `secs`.
    pub fn advance(&self, secs: u64) {
        self.now.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// Wire exptimes above this many seconds (30 days) are absolute unix times, like
/// memcached's `REALTIME_MAXDELTA`.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// What a wire exptime means at a given moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// `0`: never expires.
    Never,
    /// Negative, or an absolute time not after now: stored items are invisible at once.
    Expired,
    /// Expires when the clock reaches this absolute unix time (always after now).
    At(u64),
}

/// memcached's TTL rule: 0 = never; negative = already expired; up to 30 days =
/// relative to `now`; larger = absolute unix time. An item is expired once
/// `now >= exptime`.
pub(crate) fn expiry_from_wire(wire: i64, now: u64) -> Expiry {
    if wire == 0 {
        Expiry::Never
    } else if wire < 0 {
        Expiry::Expired
    } else if wire <= REALTIME_MAXDELTA {
        // wire is in 1..=REALTIME_MAXDELTA here, so the cast is lossless.
        Expiry::At(now.saturating_add(wire as u64))
    } else if (wire as u64) <= now {
        Expiry::Expired
    } else {
        Expiry::At(wire as u64)
    }
}

/// What an absolute exptime (unix seconds, 0 = never; as [`crate::ExportedItem`]
/// carries it) means at `now`: the same moment, without the 30-day rule.
pub(crate) fn expiry_from_abs(abs: u64, now: u64) -> Expiry {
    if abs == 0 {
        Expiry::Never
    } else if abs <= now {
        Expiry::Expired
    } else {
        Expiry::At(abs)
    }
}

/// Converts between absolute unix seconds and the store's compact relative times.
///
/// Relative time `r` means unix time `epoch + r`. Relative times saturate at
/// `u32::MAX` (136 years after the store started) and at 0 for times before the
/// epoch (a clock moved backwards).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TimeBase {
    epoch: u64,
}

impl TimeBase {
    pub(crate) fn new(epoch: u64) -> TimeBase {
        TimeBase { epoch }
    }

    pub(crate) fn rel(self, abs: u64) -> u32 {
        u32::try_from(abs.saturating_sub(self.epoch)).unwrap_or(u32::MAX)
    }

    pub(crate) fn abs(self, rel: u32) -> u64 {
        self.epoch + u64::from(rel)
    }

    /// Stored form of an expiry that is not `Expired`: 0 = never, else relative
    /// time (>= 1 because the expiry lies after `now >= epoch`).
    pub(crate) fn exptime(self, e: Expiry) -> u32 {
        match e {
            Expiry::Never | Expiry::Expired => 0,
            Expiry::At(abs) => self.rel(abs).max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_exptime_rules() {
        let now = 1_700_000_000;
        assert_eq!(expiry_from_wire(0, now), Expiry::Never);
        assert_eq!(expiry_from_wire(-1, now), Expiry::Expired);
        assert_eq!(expiry_from_wire(i64::MIN, now), Expiry::Expired);
        assert_eq!(expiry_from_wire(1, now), Expiry::At(now + 1));
        assert_eq!(
            expiry_from_wire(REALTIME_MAXDELTA, now),
            Expiry::At(now + 2_592_000)
        );
        // Just past 30 days: an absolute time, long in the past.
        assert_eq!(
            expiry_from_wire(REALTIME_MAXDELTA + 1, now),
            Expiry::Expired
        );
        assert_eq!(expiry_from_wire(now as i64, now), Expiry::Expired);
        assert_eq!(expiry_from_wire(now as i64 + 5, now), Expiry::At(now + 5));
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(100);
        assert_eq!(c.now(), 100);
        c.advance(5);
        assert_eq!(c.now(), 105);
        c.set(7);
        assert_eq!(c.now(), 7);
        let sys = SystemClock.now();
        let std = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(sys > 1_600_000_000);
        assert!(sys.abs_diff(std) <= 1, "{sys} vs {std}");
    }

    #[test]
    fn time_base_saturates() {
        let tb = TimeBase::new(1000);
        assert_eq!(tb.rel(999), 0);
        assert_eq!(tb.rel(1010), 10);
        assert_eq!(tb.abs(10), 1010);
        assert_eq!(tb.rel(u64::MAX), u32::MAX);
        assert_eq!(tb.exptime(Expiry::Never), 0);
        assert_eq!(tb.exptime(Expiry::At(1001)), 1);
    }
}
