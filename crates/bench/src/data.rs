//! Real data sets as load (`--data PATH`): records read once from a maildir tree, a
//! JSON-lines file or a CSV file, held in memory and shared by every generator thread.
//!
//! ```text
//!  PATH ──► format (directory: maildir; .jsonl/.ndjson or first byte `{`: JSON lines;
//!           .csv: CSV) ──► raw (key, value) records in file order
//!       ──► wire keys (keys memcached cannot carry are mapped) ──► the item size rule
//!       ──► duplicates dropped (the first record of a key is kept) ──► DataSet (Arc)
//! ```
//!
//! - A **maildir tree**: every regular file under the directory, recursively, in path order;
//!   the key is the file's path relative to the root (`/`-separated), or its `Message-ID`
//!   header with [`DataKey::MessageId`] (the path when a message has none); the value is the
//!   file's bytes.
//! - **JSON lines**: one object a line, `{"key": "...", "value": "..."}` with the value as
//!   a string (its UTF-8 bytes), or `{"key": "...", "value_base64": "..."}` with the value
//!   in standard base64 (padded) for binary bytes. Blank lines are skipped.
//! - **CSV**: `key,value` rows, an optional first row `key,value` being a header; quoted
//!   fields may hold commas, quotes (doubled) and newlines.
//!
//! Keys: memcached's text protocol takes keys of 1 to 250 bytes without spaces or control
//! characters. A key that is not one is mapped by [`wire_key`]: its first bytes (spaces and
//! control characters made `_`), `#`, and the 32 hex digits of its 128-bit XXH3 digest. With
//! `--protocol meta --meta-base64` any byte may travel (the `b` flag), so only keys longer
//! than 186 bytes are mapped. The count and one example are reported.
//!
//! Values: a record whose key, value and per-item overhead exceed the item size limit
//! (`--max-item-size`, memcached's `-I`) is skipped and counted ([`fits`]).
//!
//! A process reads each data set once: loads are cached by their [`DataSpec`], so the runs
//! of a `--repeat`, a search or an experiment share the records.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use kvlab_protocol::client::{MAX_BASE64_KEY_LEN, MAX_KEY_LEN};
use serde::{Deserialize, Serialize};

use crate::BenchError;

/// memcached's default item size limit (`-I 1m`), bytes.
pub const DEFAULT_MAX_ITEM_SIZE: u64 = 1 << 20;

/// Bytes an item costs beyond its key and value: kvlab's per-item charge (77) rounded up; it
/// also covers memcached's item header (at most 56 bytes with CAS).
pub const ITEM_OVERHEAD: u64 = 80;

/// Hex digits of a mapped key's digest.
const DIGEST_HEX: usize = 32;

/// What a maildir message's key is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataKey {
    /// The file's path relative to the root.
    #[default]
    Path,
    /// The message's `Message-ID` header (the path when it has none).
    MessageId,
}

/// Where a data set comes from and how it is read: what `--data`, `--data-key`,
/// `--max-item-size` (and `--meta-base64`) say.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DataSpec {
    /// A maildir tree (directory), a JSON-lines file or a CSV file.
    pub path: PathBuf,
    /// A maildir message's key.
    #[serde(default)]
    pub key: DataKey,
    /// Records whose item would be larger are skipped, bytes.
    #[serde(default = "default_max_item_size")]
    pub max_item_size: u64,
    /// Keys travel base64-encoded (meta protocol, `b` flag): only over-long keys are mapped.
    #[serde(default)]
    pub base64_keys: bool,
}

fn default_max_item_size() -> u64 {
    DEFAULT_MAX_ITEM_SIZE
}

/// A key as read and as sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappedKey {
    /// The key in the data set (lossy UTF-8).
    pub original: String,
    /// The key sent to the server.
    pub mapped: String,
}

/// What loading a data set found (reported by the run, and in `--json` under
/// `config.workload.data_set`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataSummary {
    /// `maildir`, `jsonl` or `csv`.
    pub format: String,
    /// The path read.
    pub path: String,
    /// Records loaded (the key space of the run).
    pub records: u64,
    /// Their values' bytes.
    pub value_bytes: u64,
    /// The largest value loaded, bytes.
    pub largest_value: u64,
    /// Keys mapped because memcached could not carry them.
    pub mapped_keys: u64,
    /// One mapped key.
    pub mapped_example: Option<MappedKey>,
    /// Records skipped because their item exceeds the item size limit.
    pub skipped_oversize: u64,
    /// The largest skipped value, bytes.
    pub largest_skipped: u64,
    /// The item size limit applied, bytes.
    pub max_item_size: u64,
    /// Records dropped because an earlier record had the same key.
    pub duplicate_keys: u64,
    /// Maildir with `message-id` keys: messages without one, keyed by path.
    pub without_message_id: u64,
}

impl DataSummary {
    /// One paragraph for the terminal.
    pub fn text(&self) -> String {
        let mut s = format!(
            "data: {} {}: {} records, {:.1} MiB of values (largest {} bytes)",
            self.format,
            self.path,
            self.records,
            self.value_bytes as f64 / (1024.0 * 1024.0),
            self.largest_value
        );
        s.push_str(&format!("; keys mapped: {}", self.mapped_keys));
        if let Some(m) = &self.mapped_example {
            s.push_str(&format!(" (e.g. {:?} → {:?})", m.original, m.mapped));
        }
        if self.skipped_oversize > 0 {
            s.push_str(&format!(
                "; skipped {} over the item size limit of {} bytes (largest value {} bytes)",
                self.skipped_oversize, self.max_item_size, self.largest_skipped
            ));
        }
        if self.duplicate_keys > 0 {
            s.push_str(&format!(
                "; {} records with a key seen before dropped",
                self.duplicate_keys
            ));
        }
        if self.without_message_id > 0 {
            s.push_str(&format!(
                "; {} messages without Message-ID keyed by path",
                self.without_message_id
            ));
        }
        s
    }
}

/// A loaded data set: records in file order, addressed by index (the key space `0..len`).
pub struct DataSet {
    keys: Vec<Box<[u8]>>,
    values: Vec<Box<[u8]>>,
    index: HashMap<Box<[u8]>, u32>,
    /// Digests of the distinct values: checks a value whose key is not known.
    value_digests: HashSet<u128>,
    max_key_len: usize,
    summary: DataSummary,
}

/// What loading found, not the records (which may be gigabytes).
impl std::fmt::Debug for DataSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataSet")
            .field("summary", &self.summary)
            .finish_non_exhaustive()
    }
}

impl DataSet {
    /// Records.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it holds no record (a loaded set never is).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Record `i`'s key as sent (valid on the wire).
    pub fn key(&self, i: u64) -> &[u8] {
        &self.keys[i as usize]
    }

    /// Record `i`'s value.
    pub fn value(&self, i: u64) -> &[u8] {
        &self.values[i as usize]
    }

    /// The record of a key as sent.
    pub fn index_of(&self, key: &[u8]) -> Option<u64> {
        self.index.get(key).map(|&i| u64::from(i))
    }

    /// Whether `value` is some record's value.
    pub fn holds_value(&self, value: &[u8]) -> bool {
        self.value_digests
            .contains(&xxhash_rust::xxh3::xxh3_128(value))
    }

    /// The longest key sent.
    pub fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    /// What loading found.
    pub fn summary(&self) -> &DataSummary {
        &self.summary
    }

    /// Reads the data set `spec` names (see the module's documentation).
    pub fn load(spec: &DataSpec) -> Result<DataSet, BenchError> {
        if spec.max_item_size <= ITEM_OVERHEAD {
            return Err(BenchError::Spec(format!(
                "max_item_size = {}: must be > {ITEM_OVERHEAD} bytes",
                spec.max_item_size
            )));
        }
        let path = &spec.path;
        let ctx = |e: std::io::Error| BenchError::Spec(format!("data {}: {e}", path.display()));
        let meta = std::fs::metadata(path).map_err(ctx)?;
        let mut b = Builder::new(spec);
        if meta.is_dir() {
            b.summary.format = "maildir".into();
            read_maildir(path, spec.key, &mut b)?;
        } else {
            match format_of(path).map_err(ctx)? {
                Format::Jsonl => {
                    b.summary.format = "jsonl".into();
                    read_jsonl(path, &mut b)?;
                }
                Format::Csv => {
                    b.summary.format = "csv".into();
                    read_csv(path, &mut b)?;
                }
            }
        }
        b.finish()
    }

    /// [`DataSet::load`], once per process for each spec.
    pub fn shared(spec: &DataSpec) -> Result<Arc<DataSet>, BenchError> {
        // Held across the load: a second caller for the same set waits rather than reading
        // it again.
        static CACHE: Mutex<Vec<(DataSpec, Arc<DataSet>)>> = Mutex::new(Vec::new());
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, set)) = cache.iter().find(|(s, _)| s == spec) {
            return Ok(Arc::clone(set));
        }
        let set = Arc::new(DataSet::load(spec)?);
        cache.push((spec.clone(), Arc::clone(&set)));
        Ok(set)
    }
}

enum Format {
    Jsonl,
    Csv,
}

/// By extension, else JSON lines when the first non-blank byte is `{`.
fn format_of(path: &Path) -> std::io::Result<Format> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("jsonl" | "ndjson") => return Ok(Format::Jsonl),
        Some("csv") => return Ok(Format::Csv),
        _ => {}
    }
    let mut f = std::fs::File::open(path)?;
    let mut buf = [0u8; 4096];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if let Some(&b) = buf[..n].iter().find(|b| !b.is_ascii_whitespace()) {
            if b == b'{' {
                return Ok(Format::Jsonl);
            }
            break;
        }
    }
    Err(std::io::Error::other(
        "cannot tell its format: want a directory (maildir), a .jsonl/.ndjson file (or one \
         whose first byte is `{`), or a .csv file",
    ))
}

/// Whether an item of this key and value fits under `max_item_size`.
pub fn fits(key_len: usize, value_len: usize, max_item_size: u64) -> bool {
    key_len as u64 + value_len as u64 + ITEM_OVERHEAD <= max_item_size
}

/// Whether memcached carries `key` as it is: with `base64` (the meta protocol's `b` flag) any
/// key of 1 to 186 bytes, else 1 to 250 bytes without spaces or control characters.
pub fn is_wire_key(key: &[u8], base64: bool) -> bool {
    if base64 {
        (1..=MAX_BASE64_KEY_LEN).contains(&key.len())
    } else {
        (1..=MAX_KEY_LEN).contains(&key.len()) && key.iter().all(|&b| b > b' ' && b != 0x7f)
    }
}

/// The key sent for `key`: itself when memcached carries it ([`is_wire_key`]), else its first
/// bytes (without `base64`, spaces and control characters made `_`), `#`, and the 32 lowercase
/// hex digits of its XXH3-128 digest — at most 250 bytes (186 with `base64`).
pub fn wire_key(key: &[u8], base64: bool) -> Cow<'_, [u8]> {
    if is_wire_key(key, base64) {
        return Cow::Borrowed(key);
    }
    let limit = if base64 {
        MAX_BASE64_KEY_LEN
    } else {
        MAX_KEY_LEN
    };
    let keep = key.len().min(limit - DIGEST_HEX - 1);
    let mut out = Vec::with_capacity(keep + DIGEST_HEX + 1);
    out.extend(key[..keep].iter().map(|&b| {
        if !base64 && (b <= b' ' || b == 0x7f) {
            b'_'
        } else {
            b
        }
    }));
    out.push(b'#');
    out.extend_from_slice(format!("{:032x}", xxhash_rust::xxh3::xxh3_128(key)).as_bytes());
    Cow::Owned(out)
}

/// Records as read, turned into a data set.
struct Builder<'s> {
    spec: &'s DataSpec,
    keys: Vec<Box<[u8]>>,
    values: Vec<Box<[u8]>>,
    index: HashMap<Box<[u8]>, u32>,
    summary: DataSummary,
}

impl<'s> Builder<'s> {
    fn new(spec: &'s DataSpec) -> Self {
        Builder {
            spec,
            keys: Vec::new(),
            values: Vec::new(),
            index: HashMap::new(),
            summary: DataSummary {
                path: spec.path.display().to_string(),
                max_item_size: spec.max_item_size,
                ..DataSummary::default()
            },
        }
    }

    fn push(&mut self, key: &[u8], value: Vec<u8>) -> Result<(), BenchError> {
        let wire = wire_key(key, self.spec.base64_keys);
        if !fits(wire.len(), value.len(), self.spec.max_item_size) {
            self.summary.skipped_oversize += 1;
            self.summary.largest_skipped = self.summary.largest_skipped.max(value.len() as u64);
            return Ok(());
        }
        if self.index.contains_key(wire.as_ref()) {
            self.summary.duplicate_keys += 1;
            return Ok(());
        }
        if let Cow::Owned(m) = &wire {
            self.summary.mapped_keys += 1;
            if self.summary.mapped_example.is_none() {
                self.summary.mapped_example = Some(MappedKey {
                    original: String::from_utf8_lossy(key).into_owned(),
                    mapped: String::from_utf8_lossy(m).into_owned(),
                });
            }
        }
        let i = u32::try_from(self.keys.len())
            .map_err(|_| BenchError::Spec("data: more than 2^32 records".into()))?;
        let wire: Box<[u8]> = wire.into_owned().into_boxed_slice();
        self.index.insert(wire.clone(), i);
        self.keys.push(wire);
        self.summary.value_bytes += value.len() as u64;
        self.summary.largest_value = self.summary.largest_value.max(value.len() as u64);
        self.values.push(value.into_boxed_slice());
        Ok(())
    }

    fn finish(self) -> Result<DataSet, BenchError> {
        let mut summary = self.summary;
        if self.keys.is_empty() {
            return Err(BenchError::Spec(format!(
                "data {}: no record to load{}",
                summary.path,
                if summary.skipped_oversize > 0 {
                    format!(
                        " ({} over the item size limit of {} bytes)",
                        summary.skipped_oversize, summary.max_item_size
                    )
                } else {
                    String::new()
                }
            )));
        }
        summary.records = self.keys.len() as u64;
        let value_digests = self
            .values
            .iter()
            .map(|v| xxhash_rust::xxh3::xxh3_128(v))
            .collect();
        Ok(DataSet {
            max_key_len: self.keys.iter().map(|k| k.len()).max().unwrap_or(0),
            keys: self.keys,
            values: self.values,
            index: self.index,
            value_digests,
            summary,
        })
    }
}

fn read_maildir(root: &Path, key: DataKey, b: &mut Builder<'_>) -> Result<(), BenchError> {
    use std::os::unix::ffi::OsStrExt as _;
    let err = |p: &Path, e: std::io::Error| BenchError::Spec(format!("data {}: {e}", p.display()));
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| err(&dir, e))? {
            let entry = entry.map_err(|e| err(&dir, e))?;
            // Not followed: a symbolic link is neither a message nor a folder of the tree.
            let ty = entry.file_type().map_err(|e| err(&entry.path(), e))?;
            if ty.is_dir() {
                dirs.push(entry.path());
            } else if ty.is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    for path in files {
        let value = std::fs::read(&path).map_err(|e| err(&path, e))?;
        let rel = path.strip_prefix(root).unwrap_or(&path);
        let rel = rel.as_os_str().as_bytes();
        match key {
            DataKey::Path => b.push(rel, value)?,
            DataKey::MessageId => match message_id(&value) {
                Some(id) => {
                    let id = id.to_vec();
                    b.push(&id, value)?;
                }
                None => {
                    b.summary.without_message_id += 1;
                    b.push(rel, value)?;
                }
            },
        }
    }
    Ok(())
}

/// The `Message-ID` header's value (trimmed; folded lines joined), if the message has one.
pub fn message_id(msg: &[u8]) -> Option<Vec<u8>> {
    let mut lines = msg
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    while let Some(line) = lines.next() {
        if line.is_empty() {
            return None; // the end of the headers
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if !line[..colon].eq_ignore_ascii_case(b"message-id") {
            continue;
        }
        let mut value = line[colon + 1..].to_vec();
        for cont in lines.by_ref() {
            match cont.first() {
                Some(b' ' | b'\t') => value.extend_from_slice(cont),
                _ => break,
            }
        }
        let v = value.trim_ascii();
        return (!v.is_empty()).then(|| v.to_vec());
    }
    None
}

/// One line of a JSON-lines data set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRecord {
    key: String,
    value: Option<String>,
    value_base64: Option<String>,
}

fn read_jsonl(path: &Path, b: &mut Builder<'_>) -> Result<(), BenchError> {
    let at = |n: usize, m: String| BenchError::Spec(format!("data {}:{n}: {m}", path.display()));
    let f = std::fs::File::open(path).map_err(|e| at(0, e.to_string()))?;
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| at(n, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: JsonRecord = serde_json::from_str(&line).map_err(|e| at(n, e.to_string()))?;
        let value = match (r.value, r.value_base64) {
            (Some(v), None) => v.into_bytes(),
            (None, Some(v)) => base64::engine::general_purpose::STANDARD
                .decode(v.as_bytes())
                .map_err(|e| at(n, format!("value_base64: {e}")))?,
            _ => return Err(at(n, "give one of \"value\" and \"value_base64\"".into())),
        };
        b.push(r.key.as_bytes(), value)?;
    }
    Ok(())
}

fn read_csv(path: &Path, b: &mut Builder<'_>) -> Result<(), BenchError> {
    let bad = |m: String| BenchError::Spec(format!("data {}: {m}", path.display()));
    let mut r = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_path(path)
        .map_err(|e| bad(e.to_string()))?;
    let mut rec = csv::ByteRecord::new();
    let mut first = true;
    while r
        .read_byte_record(&mut rec)
        .map_err(|e| bad(e.to_string()))?
    {
        let line = rec.position().map_or(0, |p| p.line());
        if rec.len() != 2 {
            return Err(bad(format!(
                "line {line}: {} fields, want 2 (key,value)",
                rec.len()
            )));
        }
        if first && &rec[0] == b"key" && &rec[1] == b"value" {
            first = false;
            continue;
        }
        first = false;
        b.push(&rec[0], rec[1].to_vec())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec(path: &Path) -> DataSpec {
        DataSpec {
            path: path.to_path_buf(),
            key: DataKey::Path,
            max_item_size: DEFAULT_MAX_ITEM_SIZE,
            base64_keys: false,
        }
    }

    #[test]
    fn keys_memcached_cannot_carry_are_mapped() {
        assert_eq!(wire_key(b"plain:key", false), Cow::Borrowed(b"plain:key"));
        let spaced = wire_key(b"a key", false);
        let s = std::str::from_utf8(&spaced).unwrap();
        assert!(s.starts_with("a_key#") && s.len() == 5 + 1 + 32, "{s}");
        assert!(is_wire_key(&spaced, false));
        // Distinct keys that sanitise alike stay distinct.
        assert_ne!(wire_key(b"a key", false), wire_key(b"a\tkey", false));
        let long = vec![b'k'; 300];
        let m = wire_key(&long, false);
        assert_eq!(m.len(), MAX_KEY_LEN);
        assert!(is_wire_key(&m, false));
        assert_eq!(&m[..217], &long[..217]);
        assert_eq!(wire_key(&long, false), m, "stable");
        assert!(!is_wire_key(b"", false));
        assert!(is_wire_key(&wire_key(b"", false), false));
        // Base64 keys carry any byte; only their length is bounded.
        assert_eq!(wire_key(b"a key", true), Cow::Borrowed(b"a key"));
        let m = wire_key(&[b' '; 200], true);
        assert_eq!(m.len(), MAX_BASE64_KEY_LEN);
        assert!(m.starts_with(b"   "));
    }

    #[test]
    fn oversize_records_are_skipped_and_counted() {
        assert!(fits(10, 1000, 1090));
        assert!(!fits(10, 1001, 1090));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.jsonl");
        let big = "x".repeat(5000);
        let bigger = "y".repeat(7000);
        std::fs::write(
            &p,
            format!(
                "{{\"key\":\"a\",\"value\":\"small\"}}\n\n{{\"key\":\"b\",\"value\":\"{big}\"}}\n\
                 {{\"key\":\"c\",\"value\":\"{bigger}\"}}\n{{\"key\":\"a\",\"value\":\"again\"}}\n"
            ),
        )
        .unwrap();
        let set = DataSet::load(&DataSpec {
            max_item_size: 4096,
            ..spec(&p)
        })
        .unwrap();
        assert_eq!(set.len(), 1);
        assert_eq!(set.value(0), b"small");
        let s = set.summary();
        assert_eq!((s.skipped_oversize, s.largest_skipped), (2, 7000));
        assert_eq!(s.duplicate_keys, 1);
        assert!(s.text().contains("skipped 2"), "{}", s.text());
        let all = DataSet::load(&spec(&p)).unwrap();
        assert_eq!((all.len(), all.summary().skipped_oversize), (3, 0));
        let e = DataSet::load(&DataSpec {
            max_item_size: 85,
            ..spec(&p)
        })
        .unwrap_err();
        assert!(e.to_string().contains("no record"), "{e}");
    }

    #[test]
    fn formats_are_read_as_documented() {
        let dir = tempfile::tempdir().unwrap();
        let j = dir.path().join("records");
        std::fs::write(
            &j,
            "  {\"key\":\"k 1\",\"value_base64\":\"AAH/\"}\n{\"key\":\"k2\",\"value\":\"é\"}\n",
        )
        .unwrap();
        let set = DataSet::load(&spec(&j)).unwrap();
        assert_eq!(set.summary().format, "jsonl");
        assert_eq!(set.value(0), &[0, 1, 255]);
        assert_eq!(set.value(1), "é".as_bytes());
        assert_eq!(set.summary().mapped_keys, 1);
        assert_eq!(set.index_of(&wire_key(b"k 1", false)), Some(0));
        assert!(set.holds_value(&[0, 1, 255]) && !set.holds_value(b"x"));
        std::fs::write(
            &j,
            "{\"key\":\"k\",\"value\":\"v\",\"value_base64\":\"AA==\"}\n",
        )
        .unwrap();
        let e = DataSet::load(&spec(&j)).unwrap_err().to_string();
        assert!(e.contains(":1: give one of"), "{e}");

        let c = dir.path().join("d.csv");
        std::fs::write(&c, "key,value\nk1,\"a, b\nc \"\"q\"\"\"\nk2,plain\n").unwrap();
        let set = DataSet::load(&spec(&c)).unwrap();
        assert_eq!(set.len(), 2);
        assert_eq!(set.value(0), b"a, b\nc \"q\"");
        std::fs::write(&c, "k1,v,extra\n").unwrap();
        assert!(DataSet::load(&spec(&c)).is_err());

        let m = dir.path().join("maildir");
        std::fs::create_dir_all(m.join("u/inbox")).unwrap();
        std::fs::write(
            m.join("u/inbox/1."),
            "Subject: x\r\nMessage-ID: <a@b>\r\n\r\nhi",
        )
        .unwrap();
        std::fs::write(m.join("u/inbox/2."), "Subject: y\n\nno id").unwrap();
        std::fs::write(m.join("u/3."), "Message-Id:\n <folded@x>\nFrom: z\n\nbody").unwrap();
        let by_path = DataSet::load(&spec(&m)).unwrap();
        assert_eq!(by_path.key(0), b"u/3.");
        assert_eq!(by_path.key(1), b"u/inbox/1.");
        let by_id = DataSet::load(&DataSpec {
            key: DataKey::MessageId,
            ..spec(&m)
        })
        .unwrap();
        assert_eq!(by_id.key(0), b"<folded@x>");
        assert_eq!(by_id.key(1), b"<a@b>");
        assert_eq!(by_id.key(2), b"u/inbox/2.");
        assert_eq!(by_id.summary().without_message_id, 1);
    }
}
