//! memcached's binary protocol, raw bytes, against kvlab under every I/O model and the real
//! memcached side by side: the same requests must get the same responses byte for byte,
//! except CAS values (compared as zero or not) and `version`/`stat` bodies.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use kvlab_server::IoModel;
use kvlab_testkit::Memcached;

const GET: u8 = 0x00;
const SET: u8 = 0x01;
const ADD: u8 = 0x02;
const REPLACE: u8 = 0x03;
const DELETE: u8 = 0x04;
const INCR: u8 = 0x05;
const DECR: u8 = 0x06;
const QUIT: u8 = 0x07;
const FLUSH: u8 = 0x08;
const GETQ: u8 = 0x09;
const NOOP: u8 = 0x0a;
const VERSION: u8 = 0x0b;
const GETK: u8 = 0x0c;
const GETKQ: u8 = 0x0d;
const APPEND: u8 = 0x0e;
const PREPEND: u8 = 0x0f;
const STAT: u8 = 0x10;
const SETQ: u8 = 0x11;
const ADDQ: u8 = 0x12;
const DELETEQ: u8 = 0x14;
const INCRQ: u8 = 0x15;
const QUITQ: u8 = 0x17;
const FLUSHQ: u8 = 0x18;
const APPENDQ: u8 = 0x19;
const TOUCH: u8 = 0x1c;
const GAT: u8 = 0x1d;
const GATQ: u8 = 0x1e;
const GATK: u8 = 0x23;

fn packet(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
    let mut p = vec![0x80, opcode];
    p.extend_from_slice(&(key.len() as u16).to_be_bytes());
    p.push(extras.len() as u8);
    p.extend_from_slice(&[0, 0, 0]);
    p.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    p.extend_from_slice(&u32::from(opcode).wrapping_mul(0x01010101).to_be_bytes());
    p.extend_from_slice(&cas.to_be_bytes());
    p.extend_from_slice(extras);
    p.extend_from_slice(key);
    p.extend_from_slice(value);
    p
}

fn op(opcode: u8, key: &[u8]) -> Vec<u8> {
    packet(opcode, &[], key, &[], 0)
}

fn store(opcode: u8, key: &[u8], value: &[u8], flags: u32, exptime: u32, cas: u64) -> Vec<u8> {
    let mut extras = flags.to_be_bytes().to_vec();
    extras.extend_from_slice(&exptime.to_be_bytes());
    packet(opcode, &extras, key, value, cas)
}

fn arith(opcode: u8, key: &[u8], delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
    let mut extras = delta.to_be_bytes().to_vec();
    extras.extend_from_slice(&initial.to_be_bytes());
    extras.extend_from_slice(&exptime.to_be_bytes());
    packet(opcode, &extras, key, &[], 0)
}

fn touch(opcode: u8, key: &[u8], exptime: u32) -> Vec<u8> {
    packet(opcode, &exptime.to_be_bytes(), key, &[], 0)
}

/// One response: header fields and body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Response {
    bytes: Vec<u8>,
}

impl Response {
    fn opcode(&self) -> u8 {
        self.bytes[1]
    }
    fn status(&self) -> u16 {
        u16::from_be_bytes([self.bytes[6], self.bytes[7]])
    }
    fn cas(&self) -> u64 {
        u64::from_be_bytes(self.bytes[16..24].try_into().expect("8 bytes"))
    }
    fn body(&self) -> &[u8] {
        &self.bytes[24..]
    }
    /// The bytes with a CAS value made 0 or 1 (servers number items differently).
    fn masked(&self) -> Vec<u8> {
        let mut b = self.bytes.clone();
        let nonzero = self.cas() != 0;
        b[16..24].copy_from_slice(&u64::from(nonzero).to_be_bytes());
        b
    }
}

fn read_response(s: &mut TcpStream) -> Option<Response> {
    let mut header = [0u8; 24];
    s.read_exact(&mut header).ok()?;
    let len = u32::from_be_bytes(header[8..12].try_into().expect("4 bytes")) as usize;
    let mut bytes = header.to_vec();
    bytes.resize(24 + len, 0);
    s.read_exact(&mut bytes[24..]).ok()?;
    Some(Response { bytes })
}

fn conn(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s
}

/// Sends `requests` then a `noop`, and reads every response up to the noop's (or the close).
fn exchange_bin(s: &mut TcpStream, requests: &[Vec<u8>]) -> Vec<Response> {
    let mut bytes: Vec<u8> = requests.concat();
    bytes.extend_from_slice(&op(NOOP, b""));
    let _ = s.write_all(&bytes);
    let mut got = Vec::new();
    while let Some(r) = read_response(s) {
        let noop = r.opcode() == NOOP;
        got.push(r);
        if noop {
            break;
        }
    }
    got
}

/// Whether the server closed the connection (a read finds the end, not a timeout).
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0))
}

/// The cases: each runs on a fresh connection after a binary flush.
fn cases() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let big = vec![b'x'; 1024 * 1024 + 1];
    // Past the item limit by more than a key and extras: refused from the header alone.
    let huge = vec![b'x'; 2 * 1024 * 1024];
    vec![
        (
            "get family",
            vec![
                store(SET, b"k", b"hello", 5, 0, 0),
                op(GET, b"k"),
                op(GETK, b"k"),
                op(GETQ, b"k"),
                op(GETKQ, b"k"),
                op(GET, b"nope"),
                op(GETK, b"nope"),
                op(GETQ, b"nope"),
                op(GETKQ, b"nope"),
            ],
        ),
        (
            "add replace",
            vec![
                store(ADD, b"a", b"1", 0, 0, 0),
                store(ADD, b"a", b"2", 0, 0, 0),
                store(ADDQ, b"a", b"3", 0, 0, 0),
                store(REPLACE, b"r", b"1", 0, 0, 0),
                store(REPLACE, b"a", b"4", 7, 0, 0),
                op(GET, b"a"),
                store(SETQ, b"q", b"quiet", 1, 0, 0),
                op(GET, b"q"),
            ],
        ),
        (
            "cas",
            vec![
                store(SET, b"c", b"v", 0, 0, 0),
                store(SET, b"c", b"w", 0, 0, 1),
                store(SET, b"missing", b"w", 0, 0, 12345),
                op(GET, b"c"),
            ],
        ),
        (
            "append prepend",
            vec![
                store(SET, b"p", b"mid", 3, 0, 0),
                packet(APPEND, &[], b"p", b"-end", 0),
                packet(PREPEND, &[], b"p", b"start-", 0),
                packet(APPENDQ, &[], b"p", b"!", 0),
                op(GET, b"p"),
                packet(APPEND, &[], b"none", b"x", 0),
                packet(PREPEND, &[], b"none", b"x", 0),
                packet(APPENDQ, &[], b"none", b"x", 0),
            ],
        ),
        (
            "delete",
            vec![
                store(SET, b"d", b"v", 0, 0, 0),
                store(SET, b"e", b"v", 0, 0, 0),
                op(DELETE, b"d"),
                op(DELETE, b"d"),
                op(DELETEQ, b"e"),
                op(DELETEQ, b"e"),
                op(GET, b"e"),
            ],
        ),
        (
            "incr decr",
            vec![
                arith(INCR, b"n", 5, 10, 0),
                arith(INCR, b"n", 5, 10, 0),
                arith(DECR, b"n", 100, 0, 0),
                arith(INCR, b"m", 1, 0, u32::MAX),
                arith(INCRQ, b"n", 2, 0, 0),
                op(GET, b"n"),
                store(SET, b"s", b"abc", 0, 0, 0),
                arith(INCR, b"s", 1, 0, 0),
                store(SET, b"w", b"18446744073709551615", 0, 0, 0),
                arith(INCR, b"w", 1, 0, 0),
            ],
        ),
        (
            "touch gat",
            vec![
                store(SET, b"t", b"val", 9, 0, 0),
                touch(TOUCH, b"t", 100),
                touch(GAT, b"t", 100),
                touch(GATK, b"t", 100),
                touch(GATQ, b"t", 100),
                touch(TOUCH, b"none", 100),
                touch(GAT, b"none", 100),
                touch(GATK, b"none", 100),
                touch(GATQ, b"none", 100),
            ],
        ),
        (
            "flush",
            vec![
                store(SET, b"f", b"v", 0, 0, 0),
                op(FLUSH, b""),
                op(GET, b"f"),
                store(SET, b"f", b"v", 0, 0, 0),
                op(FLUSHQ, b""),
                op(GET, b"f"),
                packet(FLUSH, &0u32.to_be_bytes(), b"", b"", 0),
            ],
        ),
        (
            "stat reset, stat of an unknown group",
            vec![op(STAT, b"reset"), op(STAT, b"bogus")],
        ),
        (
            "unknown command, then on",
            vec![
                op(0x30, b""),
                packet(0x30, &[], b"", b"abcd", 0),
                op(GET, b"nope"),
            ],
        ),
        (
            "a large value",
            vec![
                store(SET, b"large", &vec![b'y'; 500_000], 1, 0, 0),
                op(GETK, b"large"),
            ],
        ),
        (
            "too large, swallowed",
            vec![store(SET, b"big", &big, 0, 0, 0), op(GET, b"big")],
        ),
        (
            // memcached removes the old value of a set refused as too large (found by memjs).
            "a set too large drops the old value",
            vec![
                store(SET, b"old", b"v1", 0, 0, 0),
                store(SET, b"old", &big, 0, 0, 0),
                op(GET, b"old"),
                store(SET, b"older", b"v1", 0, 0, 0),
                store(SET, b"older", &huge, 0, 0, 0),
                op(GET, b"older"),
                store(SET, b"oldq", b"v1", 0, 0, 0),
                store(SETQ, b"oldq", &huge, 0, 0, 0),
                op(GET, b"oldq"),
            ],
        ),
        (
            "add, replace and append too large keep the old value",
            vec![
                store(SET, b"kept", b"v1", 0, 0, 0),
                store(ADD, b"kept", &big, 0, 0, 0),
                store(REPLACE, b"kept", &big, 0, 0, 0),
                packet(APPEND, &[], b"kept", &big, 0),
                store(ADD, b"kept", &huge, 0, 0, 0),
                store(REPLACE, b"kept", &huge, 0, 0, 0),
                packet(APPEND, &[], b"kept", &huge, 0),
                op(GET, b"kept"),
            ],
        ),
    ]
}

fn run_cases(addr: SocketAddr) -> Vec<(&'static str, Vec<Response>)> {
    cases()
        .into_iter()
        .map(|(name, requests)| {
            let mut s = conn(addr);
            let flushed = exchange_bin(&mut s, &[op(FLUSH, b"")]);
            assert_eq!(flushed.len(), 2, "{name}: flush");
            (name, exchange_bin(&mut s, &requests))
        })
        .collect()
}

/// The closing cases: requests after which the server closes, with what it answers first.
fn closing_cases() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("quit", op(QUIT, b"")),
        ("get without a key", op(GET, b"")),
        ("a key of 251 bytes", op(GET, &[b'k'; 251])),
        ("version with a value", packet(VERSION, &[], b"", b"x", 0)),
        ("quitq", op(QUITQ, b"")),
        ("get with extras", packet(GET, &[0, 0, 0, 0], b"k", b"", 0)),
        ("noop with a key", op(NOOP, b"k")),
        ("set without extras", packet(SET, &[], b"k", b"v", 0)),
        (
            "incr with short extras",
            packet(INCR, &[0; 8], b"k", b"", 0),
        ),
        ("bad magic after a request", {
            let mut p = op(NOOP, b"");
            p.extend_from_slice(b"get k\r\n_________________");
            p
        }),
    ]
}

fn run_closing(addr: SocketAddr) -> Vec<(&'static str, Vec<Response>, bool)> {
    closing_cases()
        .into_iter()
        .map(|(name, bytes)| {
            let mut s = conn(addr);
            s.write_all(&bytes).expect("send");
            let mut got = Vec::new();
            while let Some(r) = read_response(&mut s) {
                got.push(r);
            }
            let closed = closed(&mut s);
            (name, got, closed)
        })
        .collect()
}

fn masked(rs: &[Response]) -> Vec<Vec<u8>> {
    rs.iter().map(Response::masked).collect()
}

#[test]
fn binary_protocol_is_served_as_memcached_serves_it() {
    let mc = Memcached::start_with(&[])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
    let want = run_cases(mc.addr);
    let want_closing = run_closing(mc.addr);
    // The table's own claims, checked on memcached: a few anchors.
    let get = &want[0].1;
    assert_eq!(get[1].status(), 0);
    assert_eq!(get[1].body(), b"\0\0\0\x05hello");
    assert_eq!(get[5].body(), b"Not found");
    let mut failures = Vec::new();
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |_| {});
        let got = run_cases(server.addr());
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            if masked(w) != masked(g) {
                failures.push(format!(
                    "{} {name}:\n  memcached {:?}\n  kvlab     {:?}",
                    io.name(),
                    w.iter().map(|r| &r.bytes).collect::<Vec<_>>(),
                    g.iter().map(|r| &r.bytes).collect::<Vec<_>>()
                ));
            }
        }
        let got = run_closing(server.addr());
        for ((name, w, wc), (_, g, gc)) in want_closing.iter().zip(&got) {
            if masked(w) != masked(g) || wc != gc {
                failures.push(format!(
                    "{} closing {name}: memcached {:?} closed {wc}; kvlab {:?} closed {gc}",
                    io.name(),
                    w.iter().map(|r| &r.bytes).collect::<Vec<_>>(),
                    g.iter().map(|r| &r.bytes).collect::<Vec<_>>()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same over a durable store (`--durability sync`): a miss reads through from disk and
/// a write persists before its response — inline for a binary request, also under the
/// models whose text requests use helper threads.
#[test]
fn binary_protocol_over_a_durable_store() {
    let mc = Memcached::start_with(&[])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
    let want = run_cases(mc.addr);
    let mut failures = Vec::new();
    for &io in IoModel::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let (server, _clock) = start(io, |c| {
            c.durable = Some(kvlab_store::DurableConfig {
                dir: dir.path().to_path_buf(),
                durability: kvlab_store::Durability::Sync,
                flush_interval: Duration::from_millis(200),
            })
        });
        let got = run_cases(server.addr());
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            if masked(w) != masked(g) {
                failures.push(format!("{} {name}: {:?}", io.name(), g));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// CAS semantics: the CAS a get returns replaces the item; a stale one is refused; a set's
/// response carries the new item's CAS, which a get then returns.
#[test]
fn binary_cas_round_trips() {
    let (server, _clock) = start(IoModel::Reactor, |_| {});
    let mut s = conn(server.addr());
    let r = exchange_bin(&mut s, &[store(SET, b"k", b"v1", 0, 0, 0), op(GET, b"k")]);
    let (set_cas, get_cas) = (r[0].cas(), r[1].cas());
    assert!(set_cas != 0 && set_cas == get_cas, "{r:?}");
    let r = exchange_bin(
        &mut s,
        &[
            store(SET, b"k", b"v2", 0, 0, get_cas),
            store(SET, b"k", b"v3", 0, 0, get_cas),
            arith(INCR, b"n", 1, 7, 0),
        ],
    );
    assert_eq!((r[0].status(), r[1].status()), (0, 2), "{r:?}");
    assert!(r[0].cas() != get_cas && r[0].cas() != 0);
    assert_eq!(r[2].body(), 7u64.to_be_bytes());
}

/// `version` and `stat` answer in memcached's shapes (their contents differ).
#[test]
fn binary_version_and_stat() {
    let (server, _clock) = start(IoModel::Reactor, |_| {});
    let mut s = conn(server.addr());
    let r = exchange_bin(&mut s, &[op(VERSION, b"")]);
    assert_eq!(r[0].status(), 0);
    assert!(r[0].body().starts_with(b"1."), "{:?}", r[0]);
    let r = exchange_bin(&mut s, &[op(STAT, b"")]);
    let stats: Vec<&Response> = r.iter().filter(|r| r.opcode() == STAT).collect();
    assert!(stats.len() > 20, "{} stats", stats.len());
    let last = stats.last().expect("a terminator");
    assert_eq!(last.bytes.len(), 24, "the last stat packet is empty");
    assert!(stats
        .iter()
        .any(|r| r.body().starts_with(b"curr_connections")));
}

/// The connection speaks what its first byte says: a text client is unaffected.
#[test]
fn text_connections_are_unaffected() {
    let (server, _clock) = start(IoModel::Reactor, |_| {});
    let mut s = connect(server.addr());
    assert_eq!(
        exchange(&mut s, b"set k 0 0 1\r\nx\r\n", b"\r\n"),
        b"STORED\r\n"
    );
    let mut b = conn(server.addr());
    let r = exchange_bin(&mut b, &[op(GET, b"k")]);
    assert_eq!(r[0].body(), b"\0\0\0\0x");
}

/// Where memcached 1.6 goes wrong, kvlab does not: an unknown command with a key has its
/// whole body skipped (memcached skips the key twice and reads the next request from its
/// middle), and a key longer than the body is refused and the connection closed
/// (memcached waits for ever).
#[test]
fn binary_requests_memcached_mishandles() {
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |_| {});
        let mut s = conn(server.addr());
        let r = exchange_bin(&mut s, &[op(0x45, b"key"), op(GET, b"nope")]);
        let statuses: Vec<u16> = r.iter().map(Response::status).collect();
        assert_eq!(statuses, [0x81, 1, 0], "{}", io.name());
        let mut s = conn(server.addr());
        let mut p = op(GET, b"key");
        p[3] = 9;
        s.write_all(&p).expect("send");
        let r = read_response(&mut s).expect("a response");
        assert_eq!((r.status(), r.body()), (4, &b"Invalid arguments"[..]));
        assert!(closed(&mut s), "{}", io.name());
    }
}

/// `-B binary`: a connection whose first bytes are not a binary request is closed without a
/// word (once a whole header is in), binary requests are served; `-B ascii`: binary bytes
/// are read as text lines (the noop's opcode and opaque bytes are `\n`). As memcached does,
/// side by side.
#[test]
fn binding_protocol_decides_what_a_connection_speaks() {
    use kvlab_protocol::Binding;
    let garbage = b"Here's a bunch of garbage that doesn't look like the bin prot.";
    for (flag, binding) in [("binary", Binding::Binary), ("ascii", Binding::Ascii)] {
        let mc = Memcached::start_with(&["-B", flag])
            .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
        let (server, _clock) = start(IoModel::Reactor, |c| {
            c.accepted.binding_protocol = binding;
        });
        for (who, addr) in [("memcached", mc.addr), ("kvlab", server.addr())] {
            let mut s = conn(addr);
            if binding == Binding::Binary {
                let _ = s.write_all(garbage);
                assert!(closed(&mut s), "{who} -B {flag}: garbage");
                let mut s = conn(addr);
                let r = exchange_bin(&mut s, &[]);
                assert_eq!(r.len(), 1, "{who} -B {flag}: noop");
                assert_eq!(r[0].opcode(), NOOP, "{who} -B {flag}");
            } else {
                let mut noop = op(NOOP, b"");
                noop.extend_from_slice(b"\r\n");
                // Six lines: the magic byte, the header's zeros, three empty lines (the
                // opaque's other three `\n`) and the CAS's zeros.
                let six = "ERROR\r\n".repeat(6);
                let reply = exchange(&mut s, &noop, six.as_bytes());
                assert_eq!(String::from_utf8_lossy(&reply), six, "{who} -B {flag}");
            }
        }
    }
}
