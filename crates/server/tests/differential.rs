//! Randomized differential test against memcached 1.6: a seeded stream of text commands is
//! sent in lock step to kvlab and to memcached over raw sockets, each followed by `mn` (whose
//! `MN` marks the end of its replies, so a missing or extra reply shows), and the replies must
//! be the same bytes.
//!
//! Every text command takes part — `get gets gat gats set add replace append prepend cas incr
//! decr delete touch flush_all verbosity` — with and without `noreply`, multi-gets, binary
//! (non-UTF-8) values with `\r` and `\n` inside, flags over all 32 bits and numeric values for
//! the counters. Expiry is never set (exptime 0; `flush_all` without a delay), so nothing
//! depends on the clock. `version` is left out (the two differ by design).
//!
//! CAS values differ between the servers (each numbers its own): a `gets`/`gats` reply's CAS
//! is replaced by `<cas>` before comparing, each server's value is remembered per key for the
//! `cas` commands that follow, and the pairs must stay one-to-one (kvlab's value X always
//! seen where memcached's Y is).
//!
//! Allow-list of known differences: none yet. A difference fails the test with the seed,
//! the operation's index, the request and both replies (`DIFF_LOG=1` prints every operation
//! with memcached's reply).
//!
//! Counters stay below 2^63 (values below 2^62, deltas below 2^40): for a number of 2^63 or
//! more, memcached 1.6's `safe_strtoull` looks for a `-` with `strchr` from the item's data
//! on, past its end into whatever the slab chunk holds after it, so whether it increments
//! such a value depends on leftover memory (a CI run: 20 differences, each memcached
//! refusing `incr` of 18446744073709551615 that it had accepted in other runs). For the
//! same reason `incr`/`decr` never name a key that may hold a blank value (empty, or
//! whitespace only): memcached's `strtoull` skips the blank and the item's `\r\n` and reads
//! on, so it has incremented ` ` as the digits an earlier item left behind it (to
//! 4611686018427387904, where kvlab answers `CLIENT_ERROR cannot increment or decrement
//! non-numeric value`, as memcached does when no digit follows). Blank values go only under
//! the last `BLANK_KEYS` keys; the others' values always hold a non-blank byte.
//!
//! The reference memcached runs without its LRU crawler and maintainer threads
//! (`-o no_lru_crawler,no_lru_maintainer`): memcached rewrites a counter that became shorter
//! in place, space-padded, only while it holds the item's only reference (`refcount == 2` in
//! `do_add_delta`), else it stores the bare digits; with those threads running, one of them
//! sometimes holds a reference, and 4–17 of 40,000 operations per run showed bare digits at
//! different operations from run to run. Without them memcached pads every time, as kvlab
//! does (3 of 3 runs clean; 1 of 2 runs with the threads showed 16 differences).

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use common::*;
use kvlab_server::IoModel;
use kvlab_testkit::Memcached;

/// Operations per seed.
const OPS: usize = 20_000;
/// Seeds run by `cargo test`.
const SEEDS: [u64; 2] = [0x6b76_6c61_6201, 0x6d65_6d63_6163];
/// Keys drawn from (few, so that hits, misses and conflicts all happen).
const KEYS: usize = 24;
/// The last keys, the only ones that may hold a blank value and never counted.
const BLANK_KEYS: usize = 3;

/// splitmix64: small, seeded, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn key(rng: &mut Rng) -> String {
    format!("k{}", rng.below(KEYS as u64))
}

/// A key `incr`/`decr` may name: never one of the `BLANK_KEYS`.
fn counter_key(rng: &mut Rng) -> String {
    format!("k{}", rng.below((KEYS - BLANK_KEYS) as u64))
}

/// A value to store under `key`: blank only under the `BLANK_KEYS` (see the module doc).
fn value_for(rng: &mut Rng, key: &str) -> Vec<u8> {
    let mut v = value(rng);
    let blank_key = key[1..]
        .parse::<usize>()
        .is_ok_and(|i| i >= KEYS - BLANK_KEYS);
    if !blank_key && v.iter().all(|b| b" \t\n\r\x0b\x0c".contains(b)) {
        v.push(b'z');
    }
    v
}

/// A value: digits (a counter, sometimes space-padded or too long), or binary bytes with
/// `\r`, `\n`, NUL and bytes ≥ 0x80 — but never `M`, so that no value can end like the `MN`
/// marker.
fn value(rng: &mut Rng) -> Vec<u8> {
    match rng.below(10) {
        0..=3 => {
            // Below 2^62: see the module doc on counters of 2^63 and more.
            let mut v = (rng.next() >> 2).to_string().into_bytes();
            v.truncate(1 + rng.below(20) as usize);
            if rng.chance(20) {
                v.extend(std::iter::repeat_n(b' ', rng.below(6) as usize));
            }
            v
        }
        4 => b"4611686018427387903".to_vec(),
        _ => {
            const BYTES: &[u8] = b"ab\r\n\x00\xff\x80\xc3 xyz09\t";
            (0..rng.below(40))
                .map(|_| BYTES[rng.below(BYTES.len() as u64) as usize])
                .collect()
        }
    }
}

fn noreply(rng: &mut Rng) -> &'static str {
    if rng.chance(15) {
        " noreply"
    } else {
        ""
    }
}

/// One operation: the bytes for kvlab and for memcached (they differ only in a `cas`
/// command's compare value).
fn operation(rng: &mut Rng, cas_of: &HashMap<String, (u64, u64)>) -> (Vec<u8>, Vec<u8>) {
    let storage = |rng: &mut Rng, cmd: &str| {
        let k = key(rng);
        let v = value_for(rng, &k);
        let flags = if rng.chance(20) {
            rng.next() as u32
        } else {
            rng.below(4) as u32
        };
        let mut req = format!("{cmd} {k} {flags} 0 {}{}\r\n", v.len(), noreply(rng)).into_bytes();
        req.extend_from_slice(&v);
        req.extend_from_slice(b"\r\n");
        req
    };
    let req = match rng.below(100) {
        0..=17 => {
            let n = 1 + rng.below(4);
            let keys: Vec<String> = (0..n).map(|_| key(rng)).collect();
            format!("get {}\r\n", keys.join(" ")).into_bytes()
        }
        18..=25 => {
            let n = 1 + rng.below(3);
            let keys: Vec<String> = (0..n).map(|_| key(rng)).collect();
            format!("gets {}\r\n", keys.join(" ")).into_bytes()
        }
        26..=28 => format!("gat 0 {}\r\n", key(rng)).into_bytes(),
        29..=31 => format!("gats 0 {} {}\r\n", key(rng), key(rng)).into_bytes(),
        32..=45 => storage(rng, "set"),
        46..=49 => storage(rng, "add"),
        50..=53 => storage(rng, "replace"),
        54..=57 => storage(rng, "append"),
        58..=61 => storage(rng, "prepend"),
        62..=69 => {
            // `cas` with each server's last seen CAS of the key (or a stale or made-up one).
            let k = key(rng);
            let v = value_for(rng, &k);
            let nr = noreply(rng);
            let (kv, mc) = match cas_of.get(&k) {
                Some(&pair) if rng.chance(80) => pair,
                _ => (1_000_000 + rng.below(10), 1_000_000 + rng.below(10)),
            };
            let line = |cas: u64| {
                let mut r = format!("cas {k} 5 0 {} {cas}{nr}\r\n", v.len()).into_bytes();
                r.extend_from_slice(&v);
                r.extend_from_slice(b"\r\n");
                r
            };
            return (line(kv), line(mc));
        }
        70..=77 => {
            let delta = match rng.below(4) {
                0 => rng.next() >> 24,
                _ => rng.below(100),
            };
            let cmd = if rng.chance(50) { "incr" } else { "decr" };
            format!("{cmd} {} {delta}{}\r\n", counter_key(rng), noreply(rng)).into_bytes()
        }
        78..=87 => format!("delete {}{}\r\n", key(rng), noreply(rng)).into_bytes(),
        88..=93 => format!("touch {} 0{}\r\n", key(rng), noreply(rng)).into_bytes(),
        94 => format!("flush_all{}\r\n", noreply(rng)).into_bytes(),
        95 => format!("flush_all 0{}\r\n", noreply(rng)).into_bytes(),
        96 => format!("verbosity {}{}\r\n", rng.below(2), noreply(rng)).into_bytes(),
        // Bad input on purpose: a bad delta, a missing argument, an unknown command.
        97 => format!("incr {} x{}\r\n", key(rng), noreply(rng)).into_bytes(),
        98 => b"touch k1\r\n".to_vec(),
        _ => b"bogus\r\n".to_vec(),
    };
    (req.clone(), req)
}

/// Sends `req` then `mn`, reads until `MN`.
fn exchange_synced(s: &mut TcpStream, req: &[u8]) -> Vec<u8> {
    s.write_all(req).expect("write");
    s.write_all(b"mn\r\n").expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while !got.ends_with(b"MN\r\n") {
        match s.read(&mut buf) {
            Ok(0) => {
                got.extend_from_slice(b"<EOF>");
                break;
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {
                got.extend_from_slice(b"<TIMEOUT>");
                break;
            }
        }
    }
    got
}

/// Replaces each `VALUE <key> <flags> <len> <cas>` line's CAS by `<cas>` and returns the
/// `(key, cas)` pairs, in order; values are skipped by their length (they may hold `\r\n`).
fn normalise(reply: &[u8]) -> (Vec<u8>, Vec<(String, u64)>) {
    let mut out = Vec::with_capacity(reply.len());
    let mut cas = Vec::new();
    let mut rest = reply;
    while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
        let line = &rest[..=nl];
        rest = &rest[nl + 1..];
        let text = String::from_utf8_lossy(line);
        let tokens: Vec<&str> = text.trim_end().split(' ').collect();
        if tokens.first() != Some(&"VALUE") || tokens.len() < 4 {
            out.extend_from_slice(line);
            continue;
        }
        if let Some(c) = tokens.get(4).and_then(|t| t.parse::<u64>().ok()) {
            cas.push((tokens[1].to_string(), c));
            out.extend_from_slice(
                format!(
                    "{} {} {} {} <cas>\r\n",
                    tokens[0], tokens[1], tokens[2], tokens[3]
                )
                .as_bytes(),
            );
        } else {
            out.extend_from_slice(line);
        }
        let len: usize = tokens[3].parse().unwrap_or(0);
        let take = (len + 2).min(rest.len());
        out.extend_from_slice(&rest[..take]);
        rest = &rest[take..];
    }
    out.extend_from_slice(rest);
    (out, cas)
}

fn run_seed(seed: u64, kv: SocketAddr, mc: SocketAddr) -> Vec<String> {
    let mut kvs = connect(kv);
    let mut mcs = connect(mc);
    assert_eq!(exchange_synced(&mut kvs, b"flush_all\r\n"), b"OK\r\nMN\r\n");
    assert_eq!(exchange_synced(&mut mcs, b"flush_all\r\n"), b"OK\r\nMN\r\n");
    let mut rng = Rng(seed);
    let mut cas_of: HashMap<String, (u64, u64)> = HashMap::new();
    let (mut kv_to_mc, mut mc_to_kv) = (HashMap::new(), HashMap::new());
    let mut diffs = Vec::new();
    for i in 0..OPS {
        let (kv_req, mc_req) = operation(&mut rng, &cas_of);
        let (kv_reply, kv_cas) = normalise(&exchange_synced(&mut kvs, &kv_req));
        let (mc_reply, mc_cas) = normalise(&exchange_synced(&mut mcs, &mc_req));
        if std::env::var("DIFF_LOG").is_ok() {
            eprintln!(
                "OP {i} {:?} => {:?}",
                String::from_utf8_lossy(&mc_req),
                String::from_utf8_lossy(&mc_reply)
            );
        }
        let mut same = kv_reply == mc_reply && kv_cas.len() == mc_cas.len();
        for ((key, k), (_, m)) in kv_cas.iter().zip(&mc_cas) {
            same &= *kv_to_mc.entry(*k).or_insert(*m) == *m;
            same &= *mc_to_kv.entry(*m).or_insert(*k) == *k;
            cas_of.insert(key.clone(), (*k, *m));
        }
        if !same {
            diffs.push(format!(
                "seed {seed:#x} op {i}: {:?}\n  kvlab     {:?}\n  memcached {:?}",
                String::from_utf8_lossy(&kv_req),
                String::from_utf8_lossy(&kv_reply),
                String::from_utf8_lossy(&mc_reply)
            ));
            if diffs.len() >= 10 {
                break;
            }
        }
    }
    diffs
}

#[test]
fn random_text_commands_match_memcached() {
    let mc = Memcached::start_with(&["-o", "no_lru_crawler,no_lru_maintainer"])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
    let (server, _clock) = start(IoModel::Reactor, |_| {});
    let mut diffs = Vec::new();
    for seed in SEEDS {
        diffs.extend(run_seed(seed, server.addr(), mc.addr));
    }
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}
