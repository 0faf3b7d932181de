//! memcached's slab size classes, as names for item sizes.
//!
//! kvlab allocates one block per item and charges its real size, so it has no slab
//! pages; but operators read memcached's per-class figures (`stats items`,
//! `stats slabs`, `lru_crawler metadump`'s `cls=`) and choose classes by number
//! (`lru_crawler crawl 1,2`, `slabs reassign`). [`SizeClasses`] computes the classes
//! exactly as memcached 1.6 does from its `-f` (growth factor) and `-n` (smallest
//! chunk's data size), and the size memcached would give an item, so an item is
//! reported in the class memcached would put it in.

/// memcached's `sizeof(item)` on 64-bit Linux: the header before key and data.
pub const ITEM_HEADER: usize = 48;
/// memcached's slab page (1 MiB); the largest chunk is half of it.
const SLAB_PAGE: usize = 1024 * 1024;
/// Chunks are multiples of 8 bytes.
const ALIGN: u32 = 8;
/// memcached's `MAX_NUMBER_OF_SLAB_CLASSES` (63 + the global pool's 0).
pub const MAX_CLASSES: u32 = 64;

/// The size classes of one configuration (`-f`, `-n`, `-I`).
#[derive(Clone, Debug, PartialEq)]
pub struct SizeClasses {
    /// Chunk size of class `i + 1`.
    sizes: Vec<u32>,
    item_size_max: usize,
    factor: f64,
    chunk_size: u32,
}

impl Default for SizeClasses {
    /// memcached's defaults: `-f 1.25 -n 48 -I 1m`.
    fn default() -> Self {
        SizeClasses::new(1.25, 48, 1024 * 1024)
    }
}

impl SizeClasses {
    /// memcached's `slabs_init`: the first chunk holds an item header and `chunk_size`
    /// bytes, each next one is `factor` times larger (truncated, then aligned to 8)
    /// until half a slab page; the last class is half a slab page (larger items are
    /// chained from chunks).
    pub fn new(factor: f64, chunk_size: u32, item_size_max: usize) -> SizeClasses {
        let chunk_max = (SLAB_PAGE / 2) as u32;
        let mut sizes = Vec::new();
        let mut size = ITEM_HEADER as u32 + chunk_size;
        while (sizes.len() as u32) + 1 < MAX_CLASSES - 1 {
            if f64::from(size) >= f64::from(chunk_max) / factor {
                break;
            }
            if !size.is_multiple_of(ALIGN) {
                size += ALIGN - size % ALIGN;
            }
            sizes.push(size);
            size = (f64::from(size) * factor) as u32;
        }
        sizes.push(chunk_max);
        SizeClasses {
            sizes,
            item_size_max,
            factor,
            chunk_size,
        }
    }

    /// The growth factor (`-f`).
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// The smallest chunk's data size (`-n`).
    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// The largest class id (memcached's `power_largest`); classes are `1..=largest`.
    pub fn largest(&self) -> u32 {
        self.sizes.len() as u32
    }

    /// The chunk size of class `id` (0 if there is no such class).
    pub fn size(&self, id: u32) -> u32 {
        id.checked_sub(1)
            .and_then(|i| self.sizes.get(i as usize))
            .copied()
            .unwrap_or(0)
    }

    /// memcached's slab page size in bytes (1 MiB).
    pub fn page_size(&self) -> usize {
        SLAB_PAGE
    }

    /// Chunks of class `id` per slab page.
    pub fn per_page(&self, id: u32) -> u32 {
        match self.size(id) {
            0 => 0,
            s => SLAB_PAGE as u32 / s,
        }
    }

    /// The size memcached gives an item (`ITEM_ntotal`): header, key and its NUL,
    /// client flags if not 0, the CAS, and the data with its `\r\n`.
    pub fn item_size(key_len: usize, value_len: usize, flags: u32) -> usize {
        ITEM_HEADER + key_len + 1 + if flags == 0 { 0 } else { 4 } + 8 + value_len + 2
    }

    /// The class of an item of `size` bytes (memcached's `slabs_clsid`): the smallest
    /// whose chunk holds it; items larger than the largest chunk are chained and
    /// counted in the largest class. 0 for a size of 0 or over `-I`.
    pub fn class_of(&self, size: usize) -> u32 {
        if size == 0 || size > self.item_size_max {
            return 0;
        }
        match self.sizes.iter().position(|&s| size <= s as usize) {
            Some(i) => i as u32 + 1,
            None => self.largest(),
        }
    }

    /// The class memcached would store this item in.
    pub fn class_of_item(&self, key_len: usize, value_len: usize, flags: u32) -> u32 {
        self.class_of(Self::item_size(key_len, value_len, flags))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_classes_are_memcacheds() {
        // `memcached -vv` 1.6: 96, 120, 152, 192, 240, 304, … 524288 (class 39).
        let c = SizeClasses::default();
        assert_eq!(&c.sizes[..6], &[96, 120, 152, 192, 240, 304]);
        assert_eq!(c.largest(), 39);
        assert_eq!(c.size(39), 524_288);
        assert_eq!(c.per_page(1), 10_922);
        // `set a:b 0 0 1` is 63 bytes in class 1, as memcached's metadump says.
        assert_eq!(SizeClasses::item_size(3, 1, 0), 63);
        assert_eq!(c.class_of_item(3, 1, 0), 1);
        assert_eq!(c.class_of(97), 2);
        assert_eq!(c.class_of(600_000), 39);
        assert_eq!(c.class_of(2 << 20), 0);
        // `memcached -vv -f 2 -n 100`: 152, 304, … 155648, then 524288 as class 12.
        let c = SizeClasses::new(2.0, 100, 1 << 20);
        assert_eq!(&c.sizes[..3], &[152, 304, 608]);
        assert_eq!(
            (c.largest(), c.size(11), c.size(12)),
            (12, 155_648, 524_288)
        );
    }
}
