//! What the engine tells `watch` (memcached's log streams): `fetchers` (each lookup) and
//! `mutations` (each store command's outcome).

use kvlab_protocol::Watch;
use kvlab_store::SetStatus;

use super::Engine;

impl Engine {
    /// `watch fetchers`: a lookup of `key` found an item of `(value bytes, flags)` or none.
    pub(super) fn log_fetch(&self, key: &[u8], found: Option<(usize, u32)>) {
        let watchers = &self.server.admin.watchers;
        if !watchers.watching(Watch::FETCHERS) {
            return;
        }
        let (class, size) = match found {
            Some((len, flags)) => (
                self.server
                    .admin
                    .classes
                    .class_of_item(key.len(), len, flags),
                len,
            ),
            None => (0, 0),
        };
        watchers.fetch(key, found.is_some(), class, size, self.cfd);
    }

    /// `watch mutations`: a store command's outcome.
    pub(super) fn log_store(
        &self,
        key: &[u8],
        status: SetStatus,
        cmd: &[u8],
        exptime: i64,
        len: usize,
        flags: u32,
    ) {
        let watchers = &self.server.admin.watchers;
        if !watchers.watching(Watch::MUTATIONS) {
            return;
        }
        let status = match status {
            SetStatus::Stored { .. } => "stored",
            SetStatus::NotStored => "not_stored",
            SetStatus::Exists => "exists",
            SetStatus::NotFound => "not_found",
            SetStatus::TooLarge => "too_large",
            SetStatus::OutOfMemory => "no_memory",
        };
        // Seconds from now, as memcached prints the item's expiry (0: none).
        let ttl = match exptime {
            t if t <= 0 => 0,
            t if t <= kvlab_store::REALTIME_MAXDELTA => t,
            t => t.saturating_sub(self.store.now_unix() as i64).max(0),
        };
        let class = self
            .server
            .admin
            .classes
            .class_of_item(key.len(), len, flags);
        let cmd = std::str::from_utf8(cmd).unwrap_or("na");
        watchers.store(key, status, cmd, ttl as u32, class, len, self.cfd);
    }
}
