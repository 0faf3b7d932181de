//! Temporary stand-in for the durable store API until it lands in `kvlab-store`: a
//! memory-only store reports no durability, so none of these are called.

#![allow(dead_code)]

use kvlab_store::Store;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    None,
    Interval,
    Sync,
}

pub trait DurableOps {
    fn durability(&self) -> Option<Durability>;
    fn load(&self, key: &[u8]) -> std::io::Result<bool>;
    fn persist(&self, key: &[u8]) -> std::io::Result<()>;
    fn sync_all(&self) -> std::io::Result<()>;
}

impl DurableOps for Store {
    fn durability(&self) -> Option<Durability> {
        None
    }
    fn load(&self, _key: &[u8]) -> std::io::Result<bool> {
        Ok(false)
    }
    fn persist(&self, _key: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
    fn sync_all(&self) -> std::io::Result<()> {
        Ok(())
    }
}
