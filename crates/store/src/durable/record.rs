//! The on-disk record of an item (flags, absolute exptime, CAS, flush generation, value)
//! and of the two meta entries: their encoding and decoding.

use crate::wb::{visible, Op, Rec};

/// The record format of a queued op (`None` for a delete).
impl Op {
    pub(super) fn encode(&self) -> Option<Vec<u8>> {
        match self {
            Op::Put(r) => Some(encode(
                r.block.flags(),
                r.exptime,
                r.cas,
                r.gen,
                r.block.value(),
            )),
            Op::Delete { .. } | Op::Purge => None,
        }
    }
}

/// An item as read back.
pub(crate) struct DiskRec {
    pub flags: u32,
    pub exptime: u64,
    pub cas: u64,
    pub gen: u64,
    pub value: Vec<u8>,
}

impl DiskRec {
    pub(crate) fn from_rec(r: &Rec) -> DiskRec {
        DiskRec {
            flags: r.block.flags(),
            exptime: r.exptime,
            cas: r.cas,
            gen: r.gen,
            value: r.block.value().to_vec(),
        }
    }

    /// Whether the record is live at `now_abs` in disk generation `gen`.
    pub(crate) fn visible(&self, now_abs: u64, gen: u64) -> bool {
        visible(self.exptime, self.gen, now_abs, gen)
    }
}

/// A record's header, as the purge reads it (without copying the value).
#[derive(Clone, Copy)]
pub(super) struct Head {
    pub(super) exptime: u64,
    pub(super) cas: u64,
    pub(super) gen: u64,
}

impl Head {
    pub(super) fn decode(b: &[u8]) -> Option<Head> {
        if b.len() < REC_HEADER || b[0] != REC_V1 {
            return None;
        }
        Some(Head {
            exptime: u64_at(b, 5)?,
            cas: u64_at(b, 13)?,
            gen: u64_at(b, 21)?,
        })
    }

    pub(super) fn visible(&self, now_abs: u64, gen: u64) -> bool {
        visible(self.exptime, self.gen, now_abs, gen)
    }
}

/// Record format version 1: `[1][flags u32][exptime u64][cas u64][gen u64][value]`,
/// little-endian; exptime is absolute unix seconds (0 = never).
const REC_V1: u8 = 1;
const REC_HEADER: usize = 1 + 4 + 8 + 8 + 8;

fn encode(flags: u32, exptime: u64, cas: u64, gen: u64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(REC_HEADER + value.len());
    v.push(REC_V1);
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(&exptime.to_le_bytes());
    v.extend_from_slice(&cas.to_le_bytes());
    v.extend_from_slice(&gen.to_le_bytes());
    v.extend_from_slice(value);
    v
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Decodes a record; `None` for an unknown format (treated as absent).
pub(crate) fn decode(mut b: Vec<u8>) -> Option<DiskRec> {
    if b.len() < REC_HEADER || b[0] != REC_V1 {
        return None;
    }
    let flags = u32::from_le_bytes(b.get(1..5)?.try_into().ok()?);
    let Head { exptime, cas, gen } = Head::decode(&b)?;
    b.drain(..REC_HEADER);
    Some(DiskRec {
        flags,
        exptime,
        cas,
        gen,
        value: b,
    })
}

/// Meta entry: disk flush generation and pending delayed flush (abs time, 0 none).
pub(crate) const META_GEN: &[u8] = b"flush_gen";
/// Meta entry: highest CAS value handed out when the batch was collected.
pub(crate) const META_CAS: &[u8] = b"cas_high";
/// CAS sequence numbers skipped per shard after a restart (see the module doc).
pub(crate) const CAS_GAP: u64 = 1 << 24;

pub(crate) fn decode_pair(v: &[u8]) -> Option<(u64, u64)> {
    Some((u64_at(v, 0)?, u64_at(v, 8)?))
}

pub(crate) fn encode_pair(a: u64, b: u64) -> Vec<u8> {
    let mut v = a.to_le_bytes().to_vec();
    v.extend_from_slice(&b.to_le_bytes());
    v
}
