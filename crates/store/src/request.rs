//! Request options and outcomes of the store's operations, one type per command
//! family. Exptimes are in wire form (see [`crate::clock::REALTIME_MAXDELTA`]).

/// Which storage command a [`SetRequest`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetMode {
    /// Store unconditionally.
    Set,
    /// Store only if no live item has the key (else `NotStored`).
    Add,
    /// Store only if a live item has the key (else `NotStored`).
    Replace,
    /// Add bytes after the existing value, keeping its flags and exptime.
    Append,
    /// Add bytes before the existing value, keeping its flags and exptime.
    Prepend,
}

/// A storage command (`set`/`add`/`replace`/`append`/`prepend`/`cas`/`ms`).
///
/// `compare_cas` turns `Set` and `Replace` into memcached's `cas`: `NotFound` if
/// the key is absent, `Exists` if its CAS differs, else store (counted in
/// `cas_hits`/`cas_misses`/`cas_badval`). With `Append`/`Prepend` a differing CAS
/// gives `Exists` (memcached's simplified check); `Add` ignores it.
///
/// `invalidate` (meta `ms … I`) only matters with `compare_cas`: a CAS *lower*
/// than the item's stores the value anyway but marks it stale, keeping the old
/// exptime and win-token state (so `mg` reports `X`, and `W` to the first caller if
/// no token was handed out yet). This is memcached's behaviour.
#[derive(Clone, Debug)]
pub struct SetRequest<'a> {
    /// Which storage command.
    pub mode: SetMode,
    /// The key.
    pub key: &'a [u8],
    /// The value (for `Append`/`Prepend`: the part to add).
    pub value: &'a [u8],
    /// Client flags stored with the item (kept as they were by `Append`/`Prepend`).
    pub flags: u32,
    /// Wire exptime; ignored by `Append`/`Prepend`.
    pub exptime: i64,
    /// Store only if the item's CAS is this one (`cas`, meta `C`).
    pub compare_cas: Option<u64>,
    /// CAS to assign instead of a fresh one (meta `E`).
    pub new_cas: Option<u64>,
    /// Meta `ms … I`, see above.
    pub invalidate: bool,
}

impl<'a> SetRequest<'a> {
    /// A plain `set` with flags 0, no expiry, no CAS options.
    pub fn new(mode: SetMode, key: &'a [u8], value: &'a [u8]) -> SetRequest<'a> {
        SetRequest {
            mode,
            key,
            value,
            flags: 0,
            exptime: 0,
            compare_cas: None,
            new_cas: None,
            invalidate: false,
        }
    }
}

/// What [`crate::Store::import`] does when the key already has a live item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportMode {
    /// Keep the live item and answer `NotStored` (memcached `add`): an item already
    /// in the target is taken to be newer than the copy — in a migration, the
    /// target only takes writes for a key after the hand-off.
    IfAbsent,
    /// Replace it (memcached `set`): for replaying changes made at the source
    /// while a copy ran, before the target takes writes.
    Overwrite,
}

/// Outcome of [`crate::Store::set`] (and [`crate::Store::import`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetStatus {
    /// Stored; the item's new CAS.
    Stored {
        /// The new CAS.
        cas: u64,
    },
    /// The mode's condition failed (add of a live key, replace/append/prepend of a
    /// missing one, append/prepend result larger than `item_size_max`).
    NotStored,
    /// CAS mismatch.
    Exists,
    /// CAS store of a missing key.
    NotFound,
    /// Key + value + per-item overhead exceed `item_size_max` (or the key exceeds
    /// [`crate::MAX_KEY_LEN`]).
    TooLarge,
    /// Not enough memory even after evicting (or, with `Policy::None`, after
    /// reclaiming expired items).
    OutOfMemory,
}

/// Options of a meta get (`mg`).
#[derive(Clone, Debug, Default)]
pub struct MetaGetOpts {
    /// `T`: new exptime (wire form). Counts the request as a touch instead of a get.
    pub touch: Option<i64>,
    /// `N`: on a miss, create an empty item with this exptime and give the caller
    /// the win token.
    pub vivify: Option<i64>,
    /// `R`: if the remaining TTL is below this many seconds and no token was handed
    /// out yet, the caller wins.
    pub recache: Option<u64>,
    /// `u`: don't update recency, last access or the fetched bit.
    pub no_bump: bool,
}

/// Options of a meta delete (`md`).
#[derive(Clone, Debug, Default)]
pub struct MetaDeleteOpts {
    /// `C`: delete only if the CAS matches (else `Exists`).
    pub compare_cas: Option<u64>,
    /// `I`: mark the item stale (new CAS, win token reset) instead of removing it.
    pub invalidate: bool,
    /// `T`, with `invalidate`: new exptime (wire form).
    pub ttl: Option<i64>,
}

/// Outcome of [`crate::Store::meta_delete`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteStatus {
    /// Removed, or marked stale with `invalidate`.
    Deleted,
    /// No live item.
    NotFound,
    /// CAS mismatch.
    Exists,
}

/// An increment or decrement (`incr`/`decr`/`ma`).
#[derive(Clone, Debug)]
pub struct ArithRequest {
    /// Increment (wrapping at 2^64) or decrement (flooring at 0).
    pub incr: bool,
    /// The amount.
    pub delta: u64,
    /// `C`: apply only if the CAS matches (else `Exists`).
    pub compare_cas: Option<u64>,
    /// `E`: CAS to assign instead of a fresh one.
    pub new_cas: Option<u64>,
    /// `N`/`J`: on a miss, create the item with this initial value and wire
    /// exptime, and return the initial value.
    pub vivify: Option<(u64, i64)>,
    /// `T`: new exptime (wire form).
    pub touch: Option<i64>,
}

impl ArithRequest {
    /// `incr key delta` / `decr key delta` without options.
    pub fn new(incr: bool, delta: u64) -> ArithRequest {
        ArithRequest {
            incr,
            delta,
            compare_cas: None,
            new_cas: None,
            vivify: None,
            touch: None,
        }
    }
}

/// Outcome of [`crate::Store::arith`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithStatus {
    /// The new value, the item's new CAS and its remaining TTL (-1 = never).
    Ok {
        /// The new value.
        value: u64,
        /// The item's new CAS.
        cas: u64,
        /// Remaining time to live in seconds (-1 = never).
        ttl: i64,
    },
    /// No live item (and no `vivify`).
    NotFound,
    /// The current value is not 1 to 20 ASCII digits fitting a `u64`.
    NonNumeric,
    /// CAS mismatch.
    Exists,
    /// The new value needed memory the store could not free (memcached answers
    /// `SERVER_ERROR out of memory`). Only `Policy::None`, or a limit smaller than
    /// the item, can cause it.
    OutOfMemory,
}
