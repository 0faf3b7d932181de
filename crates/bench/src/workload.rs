//! What requests a run sends: key space, key and value sizes, key choice, operation mix,
//! multi-get, and verifiable values.
//!
//! Requests are composed straight into a connection's output buffer (no allocation per
//! request): keys are written into a small stack buffer, values come from a shared filler or,
//! with `verify`, are generated in place from the key and a version.
//!
//! Verifiable values: `<key index>.<version>.` followed by bytes derived from both, and a
//! length derived from both. A hit is checked against its key: a value of another key, of the
//! wrong length, or with any byte changed is a verification error. The version a server holds
//! is not known in advance (several connections write), so it is read from the value itself.
//!
//! With a data set ([`Workload::data`], `--data`), the key space is the set's records: key
//! `k` is record `k`'s key, a set sends its bytes, and a checked hit must equal them byte for
//! byte.

use std::sync::Arc;

use kvlab_client::{http, ReqKind};
use kvlab_protocol::client::{self as proto, ComposeError, MetaKeyMode, MultiGet, StoreCmd};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::data::{DataSet, DataSpec, DataSummary};
use crate::dist::{mix64, unit, KeyChooser, KeyDist, SizeDist};
use crate::BenchError;

/// Largest value the generator composes, in bytes (memcached's default item limit is 1 MiB,
/// including item overhead).
pub const MAX_VALUE: u64 = 1_000_000;

/// Operation weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mix {
    /// Weight of gets (multi-gets when `multiget > 1`).
    pub get: u32,
    /// Weight of sets.
    pub set: u32,
    /// Weight of deletes.
    pub delete: u32,
}

impl Mix {
    /// Parses `get=9,set=1,delete=0` (any subset, any order; weights are integers).
    pub fn parse(s: &str) -> Result<Self, BenchError> {
        let mut m = Mix {
            get: 0,
            set: 0,
            delete: 0,
        };
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (op, w) = part.split_once('=').ok_or_else(|| {
                BenchError::Spec(format!("bad mix entry {part:?}: want op=weight"))
            })?;
            let w: u32 = w
                .trim()
                .parse()
                .map_err(|_| BenchError::Spec(format!("bad weight in mix entry {part:?}")))?;
            match op.trim() {
                "get" => m.get = w,
                "set" => m.set = w,
                "delete" | "del" => m.delete = w,
                other => {
                    return Err(BenchError::Spec(format!(
                        "unknown operation {other:?} in mix"
                    )))
                }
            }
        }
        if m.get + m.set + m.delete == 0 {
            return Err(BenchError::Spec(format!(
                "mix {s:?} has no operation with weight > 0"
            )));
        }
        Ok(m)
    }
}

/// The whole workload description (sent to agents as JSON; absent keys take
/// [`Workload::default`]'s values).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Workload {
    /// Number of distinct keys.
    pub keys: u64,
    /// Key prefix (part of the key size).
    pub key_prefix: String,
    /// Key sizes in bytes (each key's size is fixed by a hash of the key).
    pub key_size: SizeDist,
    /// Key choice.
    pub key_dist: KeyDist,
    /// Value sizes in bytes.
    pub value_size: SizeDist,
    /// Operation weights.
    pub mix: Mix,
    /// Keys per get request.
    pub multiget: u32,
    /// Generate verifiable values and check every hit.
    pub verify: bool,
    /// Expiry time sent with sets (seconds; 0 = never).
    pub exptime: u32,
    /// A real data set as the key space and values (`keys` is then its record count).
    pub data: Option<DataSpec>,
    /// The records of `data` once read ([`Workload::attach_data`]); serialised as what
    /// loading found, never read back (a receiver reads `data` itself).
    #[serde(skip_deserializing, skip_serializing_if = "Loaded::is_none")]
    pub data_set: Loaded,
}

/// A loaded data set, shared by every generator thread. Two are equal when both hold a set or
/// neither does: the records follow from [`Workload::data`], which is compared.
#[derive(Clone, Default)]
pub struct Loaded(pub Option<Arc<DataSet>>);

impl Loaded {
    /// Not loaded.
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    /// What loading found.
    pub fn summary(&self) -> Option<&DataSummary> {
        self.0.as_deref().map(DataSet::summary)
    }
}

impl PartialEq for Loaded {
    fn eq(&self, other: &Self) -> bool {
        self.0.is_some() == other.0.is_some()
    }
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(d) => write!(f, "Loaded({} records)", d.len()),
            None => write!(f, "Loaded(none)"),
        }
    }
}

impl Serialize for Loaded {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.summary().serialize(s)
    }
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            keys: 100_000,
            key_prefix: "key:".into(),
            key_size: SizeDist::Fixed { n: 16 },
            key_dist: KeyDist::Uniform,
            value_size: SizeDist::Fixed { n: 100 },
            mix: Mix {
                get: 9,
                set: 1,
                delete: 0,
            },
            multiget: 1,
            verify: false,
            exptime: 0,
            data: None,
            data_set: Loaded::default(),
        }
    }
}

impl Workload {
    /// The workload of a named preset with `keys` keys named `key_prefix…`: `default` (or
    /// none) is [`Workload::default`]; `etc` is Facebook's ETC model as mutilate uses it
    /// (GEV key sizes, generalized Pareto value sizes, 30:1 get:set). The one place both
    /// `kvlab bench --workload` and `kvlab lab`'s `preset` turn a name into a workload.
    pub fn preset(name: Option<&str>, keys: u64, key_prefix: &str) -> Result<Workload, BenchError> {
        let mut wl = Workload {
            keys,
            key_prefix: key_prefix.to_string(),
            ..Workload::default()
        };
        match name {
            None | Some("default") => {}
            Some("etc") => {
                wl.key_size = crate::dist::etc_key_size();
                wl.value_size = crate::dist::etc_value_size();
                wl.mix = Mix {
                    get: 30,
                    set: 1,
                    delete: 0,
                };
            }
            Some(other) => {
                return Err(BenchError::Spec(format!(
                    "unknown workload preset {other:?} (known: etc)"
                )))
            }
        }
        Ok(wl)
    }

    /// Reads the data set [`Workload::data`] names, if any and not read yet (once per process,
    /// [`DataSet::shared`]), and makes its records the key space.
    pub fn attach_data(&mut self) -> Result<(), BenchError> {
        let Some(spec) = &self.data else {
            return Ok(());
        };
        if self.data_set.is_none() {
            self.data_set = Loaded(Some(DataSet::shared(spec)?));
        }
        if let Some(d) = &self.data_set.0 {
            self.keys = d.len() as u64;
        }
        Ok(())
    }

    /// The loaded data set, if the workload has one.
    pub fn data_set(&self) -> Option<&DataSet> {
        self.data_set.0.as_deref()
    }

    /// Checks that the workload can be generated.
    pub fn validate(&self) -> Result<(), BenchError> {
        if self.data.is_some() {
            let Some(d) = self.data_set() else {
                return Err(BenchError::Internal(
                    "the data set was not read (Workload::attach_data)".into(),
                ));
            };
            if self.keys != d.len() as u64 {
                return Err(BenchError::Spec(format!(
                    "keys = {}: with data the key space is the data set's {} records",
                    self.keys,
                    d.len()
                )));
            }
            if self.multiget == 0 || self.multiget > 1000 {
                return Err(BenchError::Spec("--multiget must be in 1..=1000".into()));
            }
            // Every key was made valid when the set was read (data::wire_key).
            return Ok(());
        }
        if self.keys == 0 {
            return Err(BenchError::Spec("--keys must be > 0".into()));
        }
        if self.multiget == 0 || self.multiget > 1000 {
            return Err(BenchError::Spec("--multiget must be in 1..=1000".into()));
        }
        let min = self.min_key_len(self.keys - 1);
        if min > proto::MAX_KEY_LEN {
            return Err(BenchError::Spec(format!(
                "key prefix too long: keys need {min} bytes"
            )));
        }
        let mut buf = [0u8; 256];
        let k = self.key(0, &mut buf);
        proto::check_key(k).map_err(|e| BenchError::Spec(format!("keys are invalid: {e}")))?;
        Ok(())
    }

    fn min_key_len(&self, k: u64) -> usize {
        self.key_prefix.len() + digits(k)
    }

    /// The longest key [`Workload::key`] can write (250 when the key size distribution is
    /// unbounded).
    pub fn max_key_len(&self) -> usize {
        if let Some(d) = self.data_set() {
            return d.max_key_len();
        }
        let size = self
            .key_size
            .max_hint()
            .unwrap_or(proto::MAX_KEY_LEN as u64);
        let size = size.min(proto::MAX_KEY_LEN as u64) as usize;
        size.max(self.min_key_len(self.keys.saturating_sub(1)))
            .min(proto::MAX_KEY_LEN)
    }

    /// Writes key `k` into `buf` and returns it: the prefix, the decimal index, then `x`
    /// padding up to the key's size (never shorter than prefix and index).
    /// With a data set: record `k`'s key as sent.
    pub fn key<'b>(&self, k: u64, buf: &'b mut [u8; 256]) -> &'b [u8] {
        if let Some(d) = self.data_set() {
            // At most 250 bytes (data::wire_key).
            let key = d.key(k);
            buf[..key.len()].copy_from_slice(key);
            return &buf[..key.len()];
        }
        let min = self.min_key_len(k);
        let size = match self.key_size {
            SizeDist::Fixed { n } => n as usize,
            d => d.size(unit(mix64(k ^ 0x6b65_7973)), 1, proto::MAX_KEY_LEN as u64) as usize,
        }
        .clamp(min, proto::MAX_KEY_LEN);
        let p = self.key_prefix.as_bytes();
        buf[..p.len()].copy_from_slice(p);
        let mut end = p.len() + digits(k);
        let mut n = k;
        for i in (p.len()..end).rev() {
            buf[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        while end < size {
            buf[end] = b'x';
            end += 1;
        }
        &buf[..size]
    }

    /// The key index encoded in `key`, if it is one of ours.
    pub fn key_index(&self, key: &[u8]) -> Option<u64> {
        if let Some(d) = self.data_set() {
            return d.index_of(key);
        }
        let rest = key.strip_prefix(self.key_prefix.as_bytes())?;
        let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if rest[n..].iter().any(|&b| b != b'x') {
            return None;
        }
        proto::parse_u64(&rest[..n])
    }

    /// The size of a verifiable value for key `k` at version `v`.
    pub fn verified_len(&self, k: u64, v: u64) -> usize {
        let header = digits(k) + digits(v) + 2;
        let d = self
            .value_size
            .size(unit(mix64(mix64(k) ^ v)), 0, MAX_VALUE) as usize;
        d.max(header)
    }

    /// Appends the verifiable value of key `k` at version `v`.
    pub fn write_verified(&self, k: u64, v: u64, out: &mut Vec<u8>) {
        let len = self.verified_len(k, v);
        let start = out.len();
        proto::push_u64(out, k);
        out.push(b'.');
        proto::push_u64(out, v);
        out.push(b'.');
        let header = out.len() - start;
        out.resize(start + len, 0);
        fill_body(&mut out[start + header..], k, v);
    }

    /// Checks a value returned for `key`: ok when it is the verifiable value of that key at
    /// the version it names (with a data set: when it is that key's record's value).
    pub fn check_value(&self, key: &[u8], data: &[u8]) -> bool {
        match self.key_index(key) {
            Some(k) => self.check_value_of(k, data),
            None => false,
        }
    }

    /// Checks a value returned for key index `k`.
    pub fn check_value_of(&self, k: u64, data: &[u8]) -> bool {
        if let Some(d) = self.data_set() {
            return k < d.len() as u64 && d.value(k) == data;
        }
        self.value_key(data) == Some(k) && self.check_value_any(data)
    }

    /// The key index a verifiable value names.
    fn value_key(&self, data: &[u8]) -> Option<u64> {
        let end = data.iter().position(|&b| b == b'.')?;
        proto::parse_u64(&data[..end])
    }

    /// Checks a value whose key is not known (an HTTP multi-get's raw responses do not name
    /// their key): ok when it is the verifiable value of the key and version it names.
    pub fn check_value_any(&self, data: &[u8]) -> bool {
        if let Some(d) = self.data_set() {
            return d.holds_value(data);
        }
        let mut parts = data.splitn(3, |&b| b == b'.');
        let (Some(ks), Some(vs), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return false;
        };
        let (Some(k2), Some(v)) = (proto::parse_u64(ks), proto::parse_u64(vs)) else {
            return false;
        };
        k2 < self.keys && data.len() == self.verified_len(k2, v) && body_matches(body, k2, v)
    }
}

fn digits(mut n: u64) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// Printable pseudo-random bytes derived from (k, v), 8 per hash.
fn body_byte_block(k: u64, v: u64, i: usize) -> [u8; 8] {
    let h = mix64(mix64(k.wrapping_mul(31) ^ v) ^ i as u64);
    let mut b = h.to_le_bytes();
    for x in &mut b {
        *x = b'a' + (*x % 26);
    }
    b
}

fn fill_body(out: &mut [u8], k: u64, v: u64) {
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let b = body_byte_block(k, v, i);
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

fn body_matches(body: &[u8], k: u64, v: u64) -> bool {
    body.chunks(8)
        .enumerate()
        .all(|(i, c)| c == &body_byte_block(k, v, i)[..c.len()])
}

/// The operation of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// get / multi-get
    Get,
    /// set
    Set,
    /// delete
    Delete,
}

/// Generates one thread's requests.
pub struct Generator {
    wl: Workload,
    keys: KeyChooser,
    filler: Vec<u8>,
    version: u64,
    key_buf: [u8; 256],
    get_cut: u32,
    set_cut: u32,
    total: u32,
    /// `Some(Host header)`: compose HTTP requests for kvlab's REST interface.
    http_host: Option<Vec<u8>>,
    /// `Some(key mode)`: compose memcached meta commands.
    meta: Option<MetaKeyMode>,
}

impl Generator {
    /// A generator; `thread_id` makes versions and sequential starting points distinct.
    pub fn new(wl: &Workload, thread_id: u64, threads: u64) -> Result<Self, BenchError> {
        wl.validate()?;
        let start = wl.keys / threads.max(1) * thread_id;
        let max_value = match wl.data {
            // Sets send the records' own bytes.
            Some(_) => 0,
            None => wl.value_size.max_hint().unwrap_or(MAX_VALUE).min(MAX_VALUE) as usize,
        };
        Ok(Generator {
            keys: KeyChooser::new(wl.key_dist, wl.keys, start)?,
            filler: vec![b'x'; max_value],
            version: thread_id << 40,
            key_buf: [0; 256],
            get_cut: wl.mix.get,
            set_cut: wl.mix.get + wl.mix.set,
            total: wl.mix.get + wl.mix.set + wl.mix.delete,
            wl: wl.clone(),
            http_host: None,
            meta: None,
        })
    }

    /// Composes HTTP/1.1 requests to kvlab's REST interface instead, with `host` as the
    /// `Host` header.
    pub fn http(mut self, host: &str) -> Self {
        self.http_host = Some(host.as_bytes().to_vec());
        self
    }

    /// Composes memcached meta commands instead (`mg`, `ms`, `md`; a multi-get is quiet
    /// `mg … q` per key and `mn`), with keys sent as `mode` says.
    pub fn meta(mut self, mode: MetaKeyMode) -> Self {
        self.meta = Some(mode);
        self
    }

    /// The workload.
    pub fn workload(&self) -> &Workload {
        &self.wl
    }

    /// Draws an operation from the mix.
    pub fn op<R: Rng + ?Sized>(&self, rng: &mut R) -> Op {
        let x = rng.gen_range(0..self.total);
        if x < self.get_cut {
            Op::Get
        } else if x < self.set_cut {
            Op::Set
        } else {
            Op::Delete
        }
    }

    /// Composes one request of operation `op` into `out`; returns what it expects back and
    /// its (first) key index.
    pub fn compose<R: Rng + ?Sized>(
        &mut self,
        op: Op,
        rng: &mut R,
        out: &mut Vec<u8>,
    ) -> Result<(ReqKind, u64), ComposeError> {
        let k = self.keys.next(rng);
        self.compose_key(op, k, rng, out)
    }

    /// Composes one request for key `k` (multi-gets add further random keys).
    pub fn compose_key<R: Rng + ?Sized>(
        &mut self,
        op: Op,
        k: u64,
        rng: &mut R,
        out: &mut Vec<u8>,
    ) -> Result<(ReqKind, u64), ComposeError> {
        if self.http_host.is_some() {
            return self.compose_http(op, k, rng, out);
        }
        if let Some(mode) = self.meta {
            return self.compose_meta(op, k, mode, rng, out);
        }
        match op {
            Op::Get if self.wl.multiget > 1 => {
                let mut g = MultiGet::begin(out, false);
                g.key(self.wl.key(k, &mut self.key_buf))?;
                for _ in 1..self.wl.multiget {
                    let k2 = self.keys.next(rng);
                    g.key(self.wl.key(k2, &mut self.key_buf))?;
                }
                let n = g.finish()?;
                Ok((ReqKind::Get { keys: n as u32 }, k))
            }
            Op::Get => {
                proto::get(out, self.wl.key(k, &mut self.key_buf))?;
                Ok((ReqKind::Get { keys: 1 }, k))
            }
            Op::Set => {
                let key = self.wl.key(k, &mut self.key_buf);
                if let Some(d) = self.wl.data_set() {
                    proto::store(
                        out,
                        StoreCmd::Set,
                        key,
                        0,
                        self.wl.exptime,
                        d.value(k),
                        false,
                    )?;
                } else if self.wl.verify {
                    self.version += 1;
                    let v = self.version;
                    let len = self.wl.verified_len(k, v);
                    proto::store_header(out, StoreCmd::Set, key, 0, self.wl.exptime, len, false)?;
                    self.wl.write_verified(k, v, out);
                    proto::finish_data(out);
                } else {
                    let len = self.wl.value_size.sample(rng, 0, self.filler.len() as u64) as usize;
                    proto::store(
                        out,
                        StoreCmd::Set,
                        key,
                        0,
                        self.wl.exptime,
                        &self.filler[..len],
                        false,
                    )?;
                }
                Ok((ReqKind::Store, k))
            }
            Op::Delete => {
                proto::delete(out, self.wl.key(k, &mut self.key_buf), false)?;
                Ok((ReqKind::Delete, k))
            }
        }
    }

    /// [`Generator::compose_key`] in the meta protocol: the same requests as the text
    /// protocol's (a get asks for the value and client flags, no CAS, as `get` does).
    fn compose_meta<R: Rng + ?Sized>(
        &mut self,
        op: Op,
        k: u64,
        mode: MetaKeyMode,
        rng: &mut R,
        out: &mut Vec<u8>,
    ) -> Result<(ReqKind, u64), ComposeError> {
        match op {
            Op::Get if self.wl.multiget > 1 => {
                // Quiet gets: a miss sends nothing, so `mn` (answered `MN`) ends the request.
                proto::meta_get(out, self.wl.key(k, &mut self.key_buf), mode, true)?;
                for _ in 1..self.wl.multiget {
                    let k2 = self.keys.next(rng);
                    proto::meta_get(out, self.wl.key(k2, &mut self.key_buf), mode, true)?;
                }
                proto::meta_noop(out);
                Ok((
                    ReqKind::Get {
                        keys: self.wl.multiget,
                    },
                    k,
                ))
            }
            Op::Get => {
                proto::meta_get(out, self.wl.key(k, &mut self.key_buf), mode, false)?;
                Ok((ReqKind::Get { keys: 1 }, k))
            }
            Op::Set => {
                let key = self.wl.key(k, &mut self.key_buf);
                if let Some(d) = self.wl.data_set() {
                    proto::meta_set(out, key, mode, 0, self.wl.exptime, d.value(k))?;
                } else if self.wl.verify {
                    self.version += 1;
                    let v = self.version;
                    let len = self.wl.verified_len(k, v);
                    proto::meta_set_header(out, key, mode, 0, self.wl.exptime, len)?;
                    self.wl.write_verified(k, v, out);
                    proto::finish_data(out);
                } else {
                    let len = self.wl.value_size.sample(rng, 0, self.filler.len() as u64) as usize;
                    proto::meta_set(out, key, mode, 0, self.wl.exptime, &self.filler[..len])?;
                }
                Ok((ReqKind::Store, k))
            }
            Op::Delete => {
                proto::meta_delete(out, self.wl.key(k, &mut self.key_buf), mode)?;
                Ok((ReqKind::Delete, k))
            }
        }
    }

    /// [`Generator::compose_key`] over HTTP: a multi-get is `multiget` pipelined GETs.
    fn compose_http<R: Rng + ?Sized>(
        &mut self,
        op: Op,
        k: u64,
        rng: &mut R,
        out: &mut Vec<u8>,
    ) -> Result<(ReqKind, u64), ComposeError> {
        let host: &[u8] = self.http_host.as_deref().unwrap_or(b"");
        // Keys were validated once (Workload::validate); HTTP encodes any byte anyway.
        match op {
            Op::Get => {
                http::get(out, host, self.wl.key(k, &mut self.key_buf));
                for _ in 1..self.wl.multiget {
                    let k2 = self.keys.next(rng);
                    http::get(out, host, self.wl.key(k2, &mut self.key_buf));
                }
                Ok((
                    ReqKind::Get {
                        keys: self.wl.multiget,
                    },
                    k,
                ))
            }
            Op::Set => {
                let key = self.wl.key(k, &mut self.key_buf);
                if let Some(d) = self.wl.data_set() {
                    http::put(out, host, key, self.wl.exptime, d.value(k));
                } else if self.wl.verify {
                    self.version += 1;
                    let v = self.version;
                    let len = self.wl.verified_len(k, v);
                    http::put_header(out, host, key, self.wl.exptime, len);
                    self.wl.write_verified(k, v, out);
                } else {
                    let len = self.wl.value_size.sample(rng, 0, self.filler.len() as u64) as usize;
                    http::put(out, host, key, self.wl.exptime, &self.filler[..len]);
                }
                Ok((ReqKind::Store, k))
            }
            Op::Delete => {
                http::delete(out, host, self.wl.key(k, &mut self.key_buf));
                Ok((ReqKind::Delete, k))
            }
        }
    }

    /// Checks a hit when verifying (always true otherwise).
    pub fn check(&self, key: &[u8], data: &[u8]) -> bool {
        !self.wl.verify || self.wl.check_value(key, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn keys_have_their_size_and_round_trip() {
        let wl = Workload {
            key_size: crate::dist::etc_key_size(),
            ..Workload::default()
        };
        let mut buf = [0u8; 256];
        let mut sizes = std::collections::HashSet::new();
        for k in [0u64, 7, 12345, 99_999] {
            let key = wl.key(k, &mut buf).to_vec();
            assert_eq!(
                wl.key_index(&key),
                Some(k),
                "{}",
                String::from_utf8_lossy(&key)
            );
            assert_eq!(wl.key(k, &mut buf), &key[..], "a key's size is stable");
            sizes.insert(key.len());
        }
        assert!(sizes.len() > 1, "sizes vary under a distribution");
        let fixed = Workload::default();
        assert_eq!(fixed.key(5, &mut buf), b"key:5xxxxxxxxxxx");
        assert_eq!(fixed.key_index(b"key:5xxxxxxxxxxx"), Some(5));
        assert_eq!(fixed.key_index(b"key:5xxy"), None);
    }

    #[test]
    fn verified_values_check_and_corruption_is_caught() {
        let wl = Workload {
            verify: true,
            value_size: SizeDist::Uniform { min: 1, max: 300 },
            ..Workload::default()
        };
        let mut buf = [0u8; 256];
        let key = wl.key(42, &mut buf).to_vec();
        let mut v = Vec::new();
        wl.write_verified(42, 7, &mut v);
        assert!(wl.check_value(&key, &v));
        let other = wl.key(43, &mut buf).to_vec();
        assert!(!wl.check_value(&other, &v), "value of another key");
        let mut bad = v.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(!wl.check_value(&key, &bad), "flipped byte");
        assert!(!wl.check_value(&key, &v[..v.len() - 1]), "truncated");
        assert!(!wl.check_value(&key, b"garbage"));
    }

    #[test]
    fn generator_follows_the_mix() {
        let wl = Workload {
            mix: Mix::parse("get=21,delete=8,set=1").unwrap(),
            ..Workload::default()
        };
        let g = Generator::new(&wl, 0, 1).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut n = [0u32; 3];
        for _ in 0..30_000 {
            n[g.op(&mut rng) as usize] += 1;
        }
        // Expected 21000 / 1000 / 8000 with sd < 90: 5 sd bounds.
        assert!((n[0] as i64 - 21_000).abs() < 450, "{n:?}");
        assert!((n[1] as i64 - 1_000).abs() < 160, "{n:?}");
        assert!((n[2] as i64 - 8_000).abs() < 400, "{n:?}");
    }

    #[test]
    fn composes_multiget_and_sets() {
        let wl = Workload {
            multiget: 3,
            verify: true,
            ..Workload::default()
        };
        let mut g = Generator::new(&wl, 0, 1).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut out = Vec::new();
        let (kind, _) = g.compose(Op::Get, &mut rng, &mut out).unwrap();
        assert_eq!(kind, ReqKind::Get { keys: 3 });
        assert_eq!(out.iter().filter(|&&b| b == b' ').count(), 3);
        out.clear();
        g.compose_key(Op::Set, 9, &mut rng, &mut out).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("set key:9xxxxxxxxxxx 0 0 "), "{s}");
        assert!(s.ends_with("\r\n"));
        assert!(Mix::parse("get=0").is_err());
        assert!(Mix::parse("put=1").is_err());
    }

    #[test]
    fn composes_meta_requests() {
        let wl = Workload {
            multiget: 3,
            verify: true,
            mix: Mix::parse("get=1,set=1,delete=1").unwrap(),
            ..Workload::default()
        };
        let mut g = Generator::new(&wl, 0, 1).unwrap().meta(MetaKeyMode::Plain);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut out = Vec::new();
        let (kind, _) = g.compose(Op::Get, &mut rng, &mut out).unwrap();
        assert_eq!(kind, ReqKind::Get { keys: 3 });
        let s = String::from_utf8(std::mem::take(&mut out)).unwrap();
        let lines: Vec<&str> = s.split_terminator("\r\n").collect();
        assert_eq!(lines.len(), 4, "{s}");
        assert!(lines[..3]
            .iter()
            .all(|l| l.starts_with("mg key:") && l.ends_with(" v f q")));
        assert_eq!(lines[3], "mn");
        g.compose_key(Op::Set, 9, &mut rng, &mut out).unwrap();
        let s = String::from_utf8(std::mem::take(&mut out)).unwrap();
        let (head, data) = s.split_once("\r\n").unwrap();
        let len = data.len() - 2;
        assert_eq!(head, format!("ms key:9xxxxxxxxxxx {len} F0 T0"));
        assert!(wl.check_value(b"key:9xxxxxxxxxxx", &data.as_bytes()[..len]));
        g.compose_key(Op::Delete, 9, &mut rng, &mut out).unwrap();
        assert_eq!(out, b"md key:9xxxxxxxxxxx\r\n");

        let single = Workload::default();
        let mut g = Generator::new(&single, 0, 1)
            .unwrap()
            .meta(MetaKeyMode::Base64);
        out.clear();
        let (kind, _) = g.compose_key(Op::Get, 1, &mut rng, &mut out).unwrap();
        assert_eq!(kind, ReqKind::Get { keys: 1 });
        // base64("key:1xxxxxxxxxxx")
        assert_eq!(out, b"mg a2V5OjF4eHh4eHh4eHh4eA== b v f\r\n");
    }

    #[test]
    fn max_key_len_bounds_every_key() {
        let mut buf = [0u8; 256];
        let wl = Workload::default();
        assert_eq!(wl.max_key_len(), 16);
        let long_prefix = Workload {
            keys: 1000,
            key_prefix: "p".repeat(20),
            ..Workload::default()
        };
        assert_eq!(long_prefix.max_key_len(), 23);
        assert_eq!(long_prefix.key(999, &mut buf).len(), 23);
        let uniform = Workload {
            key_size: SizeDist::Uniform { min: 10, max: 40 },
            ..Workload::default()
        };
        assert_eq!(uniform.max_key_len(), 40);
        assert!((0..1000).all(|k| uniform.key(k, &mut buf).len() <= 40));
        let etc = Workload::preset(Some("etc"), 1000, "key:").unwrap();
        assert_eq!(etc.max_key_len(), proto::MAX_KEY_LEN);
    }
}
