//! A pass over everything a node's store holds — its memory, then, on a durable node, the
//! keys on its disk (most of which may not be in memory: cold) — in bounded steps: what a
//! migration's copy, a resend, a resync and the clean-up walk.

use kvlab_store::{DiskCursor, ExportedItem};

use super::*;

/// Where a pass over a node's store is.
#[derive(Default)]
pub(crate) struct Pass {
    memory: ScanCursor,
    disk: DiskCursor,
    on_disk: bool,
}

impl Pass {
    /// One step: appends to `items` the live items among the next `max` memory slots or
    /// disk records whose key `keep` accepts (a key on disk as it is now: a newer version
    /// in memory wins, a deleted one is skipped); true once the pass is complete. Memory
    /// gives only what its disk lacks (items changed since written), so a key comes once
    /// unless it changed since it was written — then twice, the later never older. Holds
    /// one shard lock at a time, and none while it reads the disk.
    pub(crate) fn step(
        &mut self,
        store: &Store,
        max: usize,
        items: &mut Vec<ExportedItem>,
        mut keep: impl FnMut(&[u8]) -> bool,
    ) -> Result<bool, ClusterError> {
        if !self.on_disk {
            let step = store.scan_unwritten(&mut self.memory, max, items, |_, k| keep(k));
            self.on_disk = step.done;
            return Ok(step.done && store.durability().is_none());
        }
        let step = store
            .scan_disk(&mut self.disk, max, items, |_, k| keep(k))
            .map_err(|e| ClusterError::Migration(format!("reading the data directory: {e}")))?;
        Ok(step.done)
    }
}
