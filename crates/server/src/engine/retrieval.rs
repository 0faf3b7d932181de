//! The retrieval family: `get`, `gets`, `gat`, `gats` — the values of the keys found, then
//! `END`.

use kvlab_protocol::response as r;
use kvlab_protocol::Keys;

use super::{defer, Blocking, ClassOp, Done, Engine, ReadThrough, WorkerStats};

impl Engine {
    /// `get`, `gets` (`cas`). `loaded` lists the keys read through for it so far.
    #[inline]
    pub(super) fn get(
        &mut self,
        keys: Keys<'_>,
        cas: bool,
        out: &mut Vec<u8>,
        loaded: &[ReadThrough],
    ) -> Done {
        let start = out.len();
        let mut n = 0;
        let detail = self.server.admin.detail.enabled();
        for key in keys.iter() {
            n += 1;
            // A key read through for this get: what was found, should it have left
            // memory again before this re-run.
            let read = loaded.iter().rev().find(|r| r.key == key);
            let item = match read.and_then(ReadThrough::found) {
                Some(found) => self.store.get_loaded(key, found),
                None => self.store.get(key),
            };
            if item.is_none() && read.is_none() && self.disk.read_through {
                // In memory when `needs_load` looked, evicted since: read through.
                out.truncate(start);
                return Done::Flow(defer(Blocking::Load(ReadThrough::new(key))));
            }
            if detail {
                self.server.admin.detail.get(key, item.is_some());
            }
            self.log_fetch(key, item.as_ref().map(|i| (i.value.len(), i.flags)));
            if let Some(item) = item {
                self.count_class(ClassOp::GetHit, key.len(), item.value.len(), item.flags);
                r::value(
                    out,
                    key,
                    item.flags,
                    &item.value,
                    cas.then(|| self.shown(item.cas)),
                );
            }
        }
        WorkerStats::add(&self.worker.cmd_get, n);
        out.extend_from_slice(r::END);
        Done::Unchanged
    }

    /// `gat`, `gats` (`cas`): get and touch; the keys it touched changed (a new TTL).
    #[inline]
    pub(super) fn gat(
        &mut self,
        exptime: i64,
        keys: Keys<'_>,
        cas: bool,
        out: &mut Vec<u8>,
    ) -> Done {
        let mut n = 0;
        // Only the keys found got a new TTL: those are persisted (listed under `sync` only).
        let mut touched = Vec::new();
        let detail = self.server.admin.detail.enabled();
        for key in keys.iter() {
            n += 1;
            let item = self.store.get_and_touch(key, exptime);
            if detail {
                self.server.admin.detail.get(key, item.is_some());
            }
            self.log_fetch(key, item.as_ref().map(|i| (i.value.len(), i.flags)));
            if let Some(item) = item {
                self.count_class(ClassOp::TouchHit, key.len(), item.value.len(), item.flags);
                r::value(
                    out,
                    key,
                    item.flags,
                    &item.value,
                    cas.then(|| self.shown(item.cas)),
                );
                if self.disk.sync {
                    touched.push(key.to_vec());
                }
            }
        }
        WorkerStats::add(&self.worker.cmd_get, n);
        WorkerStats::add(&self.worker.cmd_touch, n);
        out.extend_from_slice(r::END);
        Done::ChangedKeys(touched)
    }
}
