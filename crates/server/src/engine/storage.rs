//! The storage family: `set`, `add`, `replace`, `append`, `prepend`, `cas`.

use kvlab_protocol::response as r;
use kvlab_protocol::{StoreCommand, Watch};
use kvlab_store::{SetMode, SetRequest, SetStatus};

use super::{Done, Engine, WorkerStats};

impl Engine {
    /// A storage command: one argument per field of `Request::Store`, as `apply` takes
    /// them apart.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn storage(
        &mut self,
        command: StoreCommand,
        key: &[u8],
        flags: u32,
        exptime: i64,
        data: &[u8],
        cas_unique: u64,
        noreply: bool,
        out: &mut Vec<u8>,
    ) -> Done {
        WorkerStats::add(&self.worker.cmd_set, 1);
        if self.server.admin.detail.enabled() {
            self.server.admin.detail.set(key);
        }
        let (mode, compare_cas) = match command {
            StoreCommand::Set => (SetMode::Set, None),
            StoreCommand::Add => (SetMode::Add, None),
            StoreCommand::Replace => (SetMode::Replace, None),
            StoreCommand::Append => (SetMode::Append, None),
            StoreCommand::Prepend => (SetMode::Prepend, None),
            StoreCommand::Cas => (SetMode::Set, Some(self.compared(cas_unique))),
        };
        if self.server.admin.watchers.watching(Watch::FETCHERS) {
            // memcached's store looks the key up first, and logs that lookup.
            let old = self.store.peek(key);
            self.log_fetch(key, old.map(|m| (m.item.value.len(), m.item.flags)));
        }
        let old_class = compare_cas.map_or(0, |_| self.class_now(key));
        let status = self.store.set(&SetRequest {
            mode,
            key,
            value: data,
            flags,
            exptime,
            compare_cas,
            new_cas: None,
            invalidate: false,
        });
        self.log_store(key, status, command.name(), exptime, data.len(), flags);
        self.count_store(status, key, data.len(), flags, old_class);
        let reply = match status {
            SetStatus::Stored { .. } => r::STORED,
            SetStatus::NotStored => r::NOT_STORED,
            SetStatus::Exists => r::EXISTS,
            SetStatus::NotFound => r::NOT_FOUND,
            SetStatus::TooLarge => r::TOO_LARGE,
            SetStatus::OutOfMemory => r::OUT_OF_MEMORY,
        };
        // memcached's `noreply` silences every reply of a text storage command,
        // its errors included.
        if !noreply {
            out.extend_from_slice(reply);
        }
        Done::changed_if(matches!(status, SetStatus::Stored { .. }))
    }
}
