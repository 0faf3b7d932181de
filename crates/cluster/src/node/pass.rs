//! A pass over everything a node's store holds — its memory, then, on a durable node, the
//! keys on its disk (most of which may not be in memory: cold) — in bounded steps: what a
//! migration's copy, a resend, a resync and the clean-up walk.

use std::collections::HashMap;

use kvlab_store::{DiskCursor, ExportedItem};

use super::*;

/// Where a pass over a node's store is.
#[derive(Default)]
pub(crate) struct Pass {
    memory: ScanCursor,
    disk: DiskCursor,
    on_disk: bool,
    /// On a durable node, the items the memory part gave (changed since written: at most
    /// what the cache holds), by key, with their CAS: the disk part gives such a key as it
    /// is now, which is the same item unless it changed since — then it comes again.
    from_memory: HashMap<Box<[u8]>, u64>,
}

impl Pass {
    /// One step: appends to `items` the live items among the next `max` memory slots or
    /// disk records whose key `keep` accepts (a key on disk as it is now: a newer version
    /// in memory wins, a deleted one is skipped); true once the pass is complete. Memory
    /// gives only what its disk lacks (items changed since written), so a key comes once
    /// unless it changed during the pass — then twice, the later never older. Holds one
    /// shard lock at a time, and none while it reads the disk.
    pub(crate) fn step(
        &mut self,
        store: &Store,
        max: usize,
        items: &mut Vec<ExportedItem>,
        mut keep: impl FnMut(&[u8]) -> bool,
    ) -> Result<bool, ClusterError> {
        let durable = store.durability().is_some();
        if !self.on_disk {
            let first = items.len();
            let step = store.scan_unwritten(&mut self.memory, max, items, |_, k| keep(k));
            if durable {
                for item in &items[first..] {
                    self.from_memory.insert(item.key().into(), item.cas());
                }
            }
            self.on_disk = step.done;
            return Ok(step.done && !durable);
        }
        let first = items.len();
        let step = store
            .scan_disk(&mut self.disk, max, items, |_, k| keep(k))
            .map_err(|e| ClusterError::Migration(format!("reading the data directory: {e}")))?;
        if !self.from_memory.is_empty() {
            let mut at = 0;
            items.retain(|item| {
                at += 1;
                at <= first || self.from_memory.get(item.key()) != Some(&item.cas())
            });
        }
        Ok(step.done)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use kvlab_store::{
        Durability, DurableConfig, SetMode, SetRequest, Store, StoreConfig, SystemClock,
    };

    use super::Pass;

    fn set(s: &Store, key: &str, value: &str) {
        s.set(&SetRequest::new(
            SetMode::Set,
            key.as_bytes(),
            value.as_bytes(),
        ));
    }

    /// Each live item of a whole pass, as `key=value`, in the order given.
    fn pass(s: &Store, between: impl FnOnce()) -> Vec<String> {
        let mut p = Pass::default();
        let mut items = Vec::new();
        let mut got = Vec::new();
        let mut between = Some(between);
        loop {
            items.clear();
            let done = p.step(s, 2, &mut items, |_| true).unwrap();
            got.extend(items.iter().map(|i| {
                let (k, v) = (i.key(), i.value());
                format!(
                    "{}={}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                )
            }));
            if p.on_disk {
                if let Some(f) = between.take() {
                    f();
                }
            }
            if done {
                return got;
            }
        }
    }

    /// On a durable node, a key changed since it was written comes from memory and is on
    /// disk too: the pass gives it once — twice only if it changes again during the pass
    /// (the later never older).
    #[test]
    fn a_key_in_memory_and_on_disk_comes_once_unless_it_changes_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let durable = DurableConfig {
            dir: dir.path().to_path_buf(),
            durability: Durability::None,
            flush_interval: Duration::from_secs(3600),
        };
        let s = Store::open(StoreConfig::default(), Arc::new(SystemClock), durable).unwrap();
        for k in ["a", "b", "c", "d"] {
            set(&s, k, "1");
        }
        s.sync_all().unwrap();
        set(&s, "a", "2"); // changed since written: in memory and (older) on disk
        set(&s, "b", "2");
        let mut got = pass(&s, || {});
        got.sort();
        assert_eq!(got, ["a=2", "b=2", "c=1", "d=1"]);

        // Changed again once memory was passed: the disk part gives it as it is now.
        let got = pass(&s, || set(&s, "a", "3"));
        assert_eq!(
            got.iter().filter(|i| i.starts_with("a=")).count(),
            2,
            "{got:?}"
        );
        assert_eq!(
            got.iter().rev().find(|i| i.starts_with("a=")).unwrap(),
            "a=3"
        );
    }
}
