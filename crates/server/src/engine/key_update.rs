//! One existing key removed or given a new expiry: `delete`, `touch`.

use kvlab_protocol::response as r;

use super::{ClassOp, Done, Engine, WorkerStats};

impl Engine {
    /// `delete`.
    #[inline]
    pub(super) fn delete(&mut self, key: &[u8], noreply: bool, out: &mut Vec<u8>) -> Done {
        if self.server.admin.detail.enabled() {
            self.server.admin.detail.delete(key);
        }
        let class = self.class_now(key);
        let deleted = self.store.delete(key);
        if deleted {
            self.worker.classes.add(ClassOp::DeleteHit, class);
        }
        if !noreply {
            out.extend_from_slice(if deleted { r::DELETED } else { r::NOT_FOUND });
        }
        Done::changed_if(deleted)
    }

    /// `touch`: a new expiry.
    #[inline]
    pub(super) fn touch(
        &mut self,
        key: &[u8],
        exptime: i64,
        noreply: bool,
        out: &mut Vec<u8>,
    ) -> Done {
        WorkerStats::add(&self.worker.cmd_touch, 1);
        // Looked up before: a touch into the past leaves nothing to look at after.
        let class = self.class_now(key);
        let touched = self.store.touch(key, exptime);
        if touched {
            self.worker.classes.add(ClassOp::TouchHit, class);
        }
        if !noreply {
            out.extend_from_slice(if touched { r::TOUCHED } else { r::NOT_FOUND });
        }
        Done::changed_if(touched)
    }
}
