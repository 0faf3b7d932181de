//! Item storage: one heap block per item version, shared by reference count.
//!
//! ```text
//!  Block (one allocation, align 8)
//!  ┌───────┬───────────┬─────────┬───────┬─────────┬─────────┬───────────┐
//!  │ refs  │ value_len │   cas   │ flags │ key_len │   key   │   value   │
//!  │ u32   │ u32       │ u64     │ u32   │ u8      │ k bytes │ v bytes   │
//!  └───────┴───────────┴─────────┴───────┴─────────┴─────────┴───────────┘
//!   0       4           8         16      20        21        21 + k
//! ```
//!
//! A [`Value`] handed to a reader is a pointer to the block: cloning it is one atomic
//! increment, reading it borrows the bytes in place. A new value (set, append, incr)
//! is a new block, so readers never see bytes change under them. The only mutable
//! field is `cas` (an atomic, written under the shard lock when `md … I` bumps it).
//!
//! The rest of an item's metadata (expiry, last access, eviction links, flags bits)
//! lives in the shard's slab entry, see `slab.rs` and `shard/mod.rs`.

use std::alloc::{self, Layout};
use std::fmt;
use std::mem::size_of;
use std::ops::Deref;
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Longest key the store accepts, in bytes (memcached's `KEY_MAX_LENGTH`).
pub const MAX_KEY_LEN: usize = 250;

/// Memory charged per item on top of its key and value bytes, in bytes.
///
/// It is what one item really costs on x86-64 Linux with glibc malloc:
///
/// | part                                                        | bytes    |
/// |-------------------------------------------------------------|----------|
/// | block header (refcount, value length, CAS, flags, key length)| 21       |
/// | malloc: 8-byte chunk header + rounding to 16 (mean)          | ~16      |
/// | slab entry (block pointer, links, exptime, atime, gen, bits) | 32 (+ up to one part-used 1024-entry chunk per shard) |
/// | hash-table slot (4 bytes + 1 control byte) at load 7/16..7/8 | 6..11    |
///
/// Measured: with 1 000 000 items of 10-byte keys and 100-byte values, process RSS
/// grows by 187.1 bytes per item, i.e. 77 bytes beyond key + value
/// (`tests/memory.rs`, `rss_per_item_one_million`); a counting allocator gives 81 at
/// 200 000 items (`per_item_overhead_is_honest`, which keeps this figure within
/// 15 bytes). For comparison, memcached 1.6 charges 59 bytes per such item in its
/// `bytes` stat (item header with CAS, key terminator, `\r\n`) but its RSS grows by
/// 197 bytes per item (87 beyond key + value) with slab-class rounding and its hash
/// table.
pub const ITEM_OVERHEAD: usize = 77;

/// Bytes charged against the memory limit for an item with these lengths.
#[inline]
pub(crate) fn item_charge(key_len: usize, value_len: usize) -> usize {
    key_len + value_len + ITEM_OVERHEAD
}

#[repr(C)]
struct Header {
    refs: AtomicU32,
    value_len: u32,
    cas: AtomicU64,
    flags: u32,
    key_len: u8,
    // The key starts right after `key_len`, inside what would be this struct's
    // trailing padding; see `DATA_OFFSET`.
}

/// Offset of the key bytes from the start of a block.
const DATA_OFFSET: usize = 21;
const ALIGN: usize = 8;
/// Refcounts above this abort, like `Arc` (a leak of ~2^31 clones is a bug).
const MAX_REFS: u32 = i32::MAX as u32;

/// An owned reference to one item block.
pub(crate) struct Block {
    ptr: NonNull<Header>,
}

// SAFETY: a block's bytes are written once, before the `Block` exists, and never
// again except through the atomics in the header; the refcount is atomic. So sharing
// and sending references between threads is sound, like `Arc<[u8]>`.
unsafe impl Send for Block {}
// SAFETY: see `Send`.
unsafe impl Sync for Block {}

impl Block {
    /// Allocates a block holding `key` and the concatenation of `parts` as the value,
    /// with `cas` 0. The caller guarantees `key.len() <= 255` and a total value
    /// length that fits `u32` (the store checks both before building a block).
    pub(crate) fn new(key: &[u8], parts: &[&[u8]], flags: u32) -> Block {
        Self::new_padded(key, parts, 0, flags)
    }

    /// [`Block::new`] with `spaces` space bytes after the parts (a counter rewritten
    /// shorter than its old value keeps the value's length, as memcached's in-place
    /// rewrite does, however long that is).
    pub(crate) fn new_padded(key: &[u8], parts: &[&[u8]], spaces: usize, flags: u32) -> Block {
        let value_len: usize = parts.iter().map(|p| p.len()).sum::<usize>() + spaces;
        let key_len = u8::try_from(key.len()).unwrap_or_else(|_| too_long());
        let value_len32 = u32::try_from(value_len).unwrap_or_else(|_| too_long());
        let layout = Self::layout(key.len(), value_len);
        // SAFETY: the layout has a non-zero size (at least `size_of::<Header>()`).
        let raw = unsafe { alloc::alloc(layout) }.cast::<Header>();
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        // SAFETY: `raw` points to a fresh allocation of `layout.size()` bytes, aligned
        // to 8, large enough for the header fields and `DATA_OFFSET + key + value`.
        // Fields are written through raw pointers; no reference to uninitialised
        // memory is created.
        unsafe {
            ptr::addr_of_mut!((*raw).refs).write(AtomicU32::new(1));
            ptr::addr_of_mut!((*raw).value_len).write(value_len32);
            ptr::addr_of_mut!((*raw).cas).write(AtomicU64::new(0));
            ptr::addr_of_mut!((*raw).flags).write(flags);
            ptr::addr_of_mut!((*raw).key_len).write(key_len);
            let mut dst = raw.cast::<u8>().add(DATA_OFFSET);
            ptr::copy_nonoverlapping(key.as_ptr(), dst, key.len());
            dst = dst.add(key.len());
            for p in parts {
                ptr::copy_nonoverlapping(p.as_ptr(), dst, p.len());
                dst = dst.add(p.len());
            }
            ptr::write_bytes(dst, b' ', spaces);
        }
        Block { ptr }
    }

    fn layout(key_len: usize, value_len: usize) -> Layout {
        let size = (DATA_OFFSET + key_len + value_len).max(size_of::<Header>());
        Layout::from_size_align(size, ALIGN).unwrap_or_else(|_| too_long())
    }

    #[inline]
    fn header(&self) -> &Header {
        // SAFETY: the block is live while `self` holds a reference, and the
        // allocation is at least `size_of::<Header>()` bytes with the header
        // fields initialised.
        unsafe { self.ptr.as_ref() }
    }

    #[inline]
    pub(crate) fn key(&self) -> &[u8] {
        let len = usize::from(self.header().key_len);
        // SAFETY: `len` key bytes were written at `DATA_OFFSET` and are immutable.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<u8>().add(DATA_OFFSET), len) }
    }

    #[inline]
    pub(crate) fn value(&self) -> &[u8] {
        let h = self.header();
        let off = DATA_OFFSET + usize::from(h.key_len);
        // SAFETY: `value_len` value bytes were written right after the key.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr.as_ptr().cast::<u8>().add(off),
                h.value_len as usize,
            )
        }
    }

    #[inline]
    pub(crate) fn flags(&self) -> u32 {
        self.header().flags
    }

    #[inline]
    pub(crate) fn cas(&self) -> u64 {
        self.header().cas.load(Ordering::Relaxed)
    }

    /// Only called under the owning shard's lock; readers of a `Value` never read it.
    #[inline]
    pub(crate) fn set_cas(&self, cas: u64) {
        self.header().cas.store(cas, Ordering::Relaxed);
    }

    /// Bytes charged against the memory limit.
    #[inline]
    pub(crate) fn charge(&self) -> usize {
        let h = self.header();
        item_charge(usize::from(h.key_len), h.value_len as usize)
    }

    /// Key plus value length: the size the `largest` policy orders by.
    #[inline]
    pub(crate) fn data_len(&self) -> u64 {
        let h = self.header();
        u64::from(h.key_len) + u64::from(h.value_len)
    }
}

#[cold]
fn too_long() -> ! {
    // The store checks key and value lengths before building a block.
    panic!("item key or value longer than the block format allows")
}

impl Clone for Block {
    #[inline]
    fn clone(&self) -> Block {
        // Relaxed is enough for an increment: the clone is made from a live
        // reference, so the block cannot be freed concurrently (same as `Arc`).
        let old = self.header().refs.fetch_add(1, Ordering::Relaxed);
        if old > MAX_REFS {
            std::process::abort();
        }
        Block { ptr: self.ptr }
    }
}

impl Drop for Block {
    #[inline]
    fn drop(&mut self) {
        if self.header().refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // Synchronise with every other owner's release before freeing (as `Arc`).
        fence(Ordering::Acquire);
        let h = self.header();
        let layout = Self::layout(usize::from(h.key_len), h.value_len as usize);
        // SAFETY: this was the last reference; the block was allocated with exactly
        // this layout in `Block::new`.
        unsafe { alloc::dealloc(self.ptr.as_ptr().cast::<u8>(), layout) }
    }
}

/// An item's value bytes: immutable and cheap to clone (a reference-count increment,
/// no allocation). Holding a `Value` keeps the bytes alive after the item is
/// replaced, deleted or evicted; the memory limit stops counting them at that point.
#[derive(Clone)]
pub struct Value {
    block: Block,
}

impl Value {
    pub(crate) fn new(block: Block) -> Value {
        Value { block }
    }
}

impl Deref for Value {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.block.value()
    }
}

impl AsRef<[u8]> for Value {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        self.block.value()
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        **self == **other
    }
}

impl Eq for Value {}

impl PartialEq<[u8]> for Value {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<&[u8]> for Value {
    fn eq(&self, other: &&[u8]) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const PREVIEW: usize = 64;
        let v: &[u8] = self;
        write!(f, "Value({} bytes, \"", v.len())?;
        for &b in v.iter().take(PREVIEW) {
            write!(f, "{}", std::ascii::escape_default(b))?;
        }
        if v.len() > PREVIEW {
            write!(f, "…")?;
        }
        write!(f, "\")")
    }
}

/// A snapshot of a live item, as a get returns it.
#[derive(Clone, Debug)]
pub struct ItemView {
    /// The value bytes.
    pub value: Value,
    /// Opaque client flags.
    pub flags: u32,
    /// The item's CAS unique.
    pub cas: u64,
    /// 0 = never expires, else absolute unix seconds.
    pub exptime: u64,
}

/// One item as [`crate::Store::scan`] exports it and [`crate::Store::import`]
/// stores it: key, value, flags, absolute expiry and CAS.
///
/// An exported item holds the item's block by reference count (as a [`Value`]
/// does), and its key is read from that block: exporting copies no bytes and
/// allocates nothing. Holding it keeps the bytes alive after the item leaves the
/// store, like a [`Value`].
#[derive(Clone)]
pub struct ExportedItem {
    value: Value,
    exptime: u64,
    cas: u64,
    last_access: u64,
    fetched: bool,
}

impl ExportedItem {
    pub(crate) fn from_block(block: Block, exptime: u64, cas: u64) -> ExportedItem {
        ExportedItem {
            value: Value::new(block),
            exptime,
            cas,
            last_access: 0,
            fetched: false,
        }
    }

    /// With the time of its last access (absolute unix seconds) and whether it was
    /// fetched since stored, as the store knew them when it exported the item.
    pub(crate) fn with_access(mut self, last_access: u64, fetched: bool) -> ExportedItem {
        self.last_access = last_access;
        self.fetched = fetched;
        self
    }

    /// When the item was last stored or read: absolute unix seconds (0 for an item
    /// made by [`ExportedItem::new`]).
    pub fn last_access(&self) -> u64 {
        self.last_access
    }

    /// Whether the item was read since it was stored (memcached's `fetch=yes`).
    pub fn fetched(&self) -> bool {
        self.fetched
    }

    /// An item received from elsewhere (e.g. decoded from a migration stream), to
    /// pass to [`crate::Store::import`]: copies `key` and `value` into one block.
    /// `exptime` is absolute unix seconds, 0 = never. `None` if the key is longer
    /// than [`MAX_KEY_LEN`] or the value than `u32::MAX` bytes.
    pub fn new(
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u64,
        cas: u64,
    ) -> Option<ExportedItem> {
        if key.len() > MAX_KEY_LEN || u32::try_from(value.len()).is_err() {
            return None;
        }
        Some(ExportedItem::from_block(
            Block::new(key, &[value], flags),
            exptime,
            cas,
        ))
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        self.value.block.key()
    }

    /// The value bytes (shared, not copied).
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Opaque client flags.
    pub fn flags(&self) -> u32 {
        self.value.block.flags()
    }

    /// When the item expires: absolute unix seconds, 0 = never. Absolute, so an
    /// imported copy expires at the same moment as the original.
    pub fn exptime(&self) -> u64 {
        self.exptime
    }

    /// The item's CAS unique in the store it was exported from (when it was
    /// exported; CAS values are per store, see [`crate::Store::import`]).
    pub fn cas(&self) -> u64 {
        self.cas
    }
}

impl fmt::Debug for ExportedItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportedItem")
            .field("key", &self.key().escape_ascii().to_string())
            .field("value", &self.value)
            .field("flags", &self.flags())
            .field("exptime", &self.exptime)
            .field("cas", &self.cas)
            .finish()
    }
}

/// What a meta get (`mg`) sees: the item plus the state the meta flags report.
#[derive(Clone, Debug)]
pub struct MetaView {
    /// The item, after any touch this request applied.
    pub item: ItemView,
    /// Fetched before this request (`h`).
    pub hit_before: bool,
    /// Seconds since the last access before this request (`l`).
    pub last_access_age: u64,
    /// Remaining seconds to live, -1 = never expires (`t`). 0 if this request's
    /// touch made the item expire at once.
    pub ttl: i64,
    /// This caller won the right to recache the item (`W`).
    pub won: bool,
    /// The item was marked stale by an invalidating delete or set (`X`).
    pub stale: bool,
    /// Another caller already holds the win token (`Z`).
    pub win_already_sent: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_roundtrip_and_refcount() {
        let b = Block::new(b"key", &[b"hel", b"lo"], 42);
        b.set_cas(7);
        assert_eq!(b.key(), b"key");
        assert_eq!(b.value(), b"hello");
        assert_eq!(b.flags(), 42);
        assert_eq!(b.cas(), 7);
        assert_eq!(b.charge(), 8 + ITEM_OVERHEAD);
        let v = Value::new(b.clone());
        drop(b);
        let v2 = v.clone();
        drop(v);
        assert_eq!(&*v2, b"hello");
        assert_eq!(v2, &b"hello"[..]);
        assert!(format!("{v2:?}").contains("hello"));
    }

    #[test]
    fn empty_and_max_key() {
        let b = Block::new(b"", &[], 0);
        assert_eq!(b.key(), b"");
        assert_eq!(b.value(), b"");
        let k = [b'k'; 255];
        let b = Block::new(&k, &[&[1, 2, 3]], u32::MAX);
        assert_eq!(b.key(), &k[..]);
        assert_eq!(b.value(), &[1, 2, 3]);
        assert_eq!(b.flags(), u32::MAX);
    }

    #[test]
    fn value_is_shared_across_threads() {
        let v = Value::new(Block::new(b"k", &[b"shared"], 0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let v = v.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        let c = v.clone();
                        assert_eq!(&*c, b"shared");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(v.block.header().refs.load(Ordering::Relaxed), 1);
    }
}
