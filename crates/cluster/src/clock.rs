//! Wall-clock time as the cluster's records keep it: unix milliseconds (migrations' start,
//! leases) and seconds (items' absolute expiry times).

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time in milliseconds (0 before 1970).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Unix time in seconds.
pub(crate) fn now_unix() -> u64 {
    now_ms() / 1000
}
