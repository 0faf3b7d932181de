//! The wire table: request bytes → the exact reply bytes, one case per behaviour, each
//! marked whether the reference memcached gives the same bytes. The server runs it under
//! every I/O model, over a durable store and against memcached itself; the proxy runs it
//! in front of kvlab and memcached backends.
//!
//! Each case runs on a fresh connection after a `flush_all`, and ends with a sync request so
//! that "no reply" is checked too (the next bytes must be the sync reply).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The case gives the same bytes on memcached.
pub const SAME: bool = true;
/// The case is kvlab's own behaviour.
pub const OURS: bool = false;

/// Sent after every case: its reply marks the end of the case's replies, so a missing or
/// extra reply shows up as a mismatch.
pub const SYNC: &[u8] = b"mg kvlab:sync k O7\r\n";
/// What memcached answers to [`SYNC`].
pub const SYNC_REPLY: &[u8] = b"EN kkvlab:sync O7\r\n";

/// One behaviour.
pub struct Case {
    /// What it shows.
    pub name: &'static str,
    /// The bytes sent.
    pub request: Vec<u8>,
    /// The bytes expected back.
    pub reply: Vec<u8>,
    /// The reference memcached gives the same bytes.
    pub same_as_memcached: bool,
    /// One server's own administration (`shutdown`, `cache_memlimit`, `lru_crawler`…):
    /// a proxy in front of several servers answers `ERROR`, so the proxy's tests skip it.
    pub server_only: bool,
}

impl Case {
    /// Marks the case as one server's own administration (see [`Case::server_only`]).
    pub fn server_only(mut self) -> Case {
        self.server_only = true;
        self
    }
}

/// A case.
pub fn case(name: &'static str, request: &[u8], reply: &[u8], same: bool) -> Case {
    Case {
        name,
        request: request.to_vec(),
        reply: reply.to_vec(),
        same_as_memcached: same,
        server_only: false,
    }
}

/// Every case.
pub fn table() -> Vec<Case> {
    [
        storage_cases(),
        arithmetic_cases(),
        delete_touch_flush_cases(),
        bad_input_cases(),
        meta_cases(),
        admin_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Storage and retrieval.
fn storage_cases() -> Vec<Case> {
    let max_key = "a".repeat(250);
    vec![
        case("set then get", b"set k 5 0 5\r\nhello\r\nget k\r\n", b"STORED\r\nVALUE k 5 5\r\nhello\r\nEND\r\n", SAME),
        case("get miss", b"get nope\r\n", b"END\r\n", SAME),
        case("multi-get in request order with repeats", b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\nget a x b a\r\n",
            b"STORED\r\nSTORED\r\nVALUE a 0 1\r\n1\r\nVALUE b 0 1\r\n2\r\nVALUE a 0 1\r\n1\r\nEND\r\n", SAME),
        case("binary value", b"set bin 0 0 4\r\n\x00\r\n\xff\r\nget bin\r\n", b"STORED\r\nVALUE bin 0 4\r\n\x00\r\n\xff\r\nEND\r\n", SAME),
        case("empty value", b"set e 0 0 0\r\n\r\nget e\r\n", b"STORED\r\nVALUE e 0 0\r\n\r\nEND\r\n", SAME),
        case("largest flags", b"set f 4294967295 0 1\r\nx\r\nget f\r\n", b"STORED\r\nVALUE f 4294967295 1\r\nx\r\nEND\r\n", SAME),
        case("add", b"add k 0 0 1\r\na\r\nadd k 0 0 1\r\nb\r\nget k\r\n", b"STORED\r\nNOT_STORED\r\nVALUE k 0 1\r\na\r\nEND\r\n", SAME),
        case("replace", b"replace k 0 0 1\r\na\r\nset k 0 0 1\r\nb\r\nreplace k 0 0 1\r\nc\r\nget k\r\n",
            b"NOT_STORED\r\nSTORED\r\nSTORED\r\nVALUE k 0 1\r\nc\r\nEND\r\n", SAME),
        case("append and prepend keep flags", b"set x 3 0 5\r\nhello\r\nappend x 9 9 3\r\nabc\r\nprepend x 0 0 2\r\n>>\r\nget x\r\n",
            b"STORED\r\nSTORED\r\nSTORED\r\nVALUE x 3 10\r\n>>helloabc\r\nEND\r\n", SAME),
        case("append and prepend to missing", b"append nothere 0 0 1\r\nx\r\nprepend nothere 0 0 1\r\nx\r\n", b"NOT_STORED\r\nNOT_STORED\r\n", SAME),
        case("cas on missing key", b"cas nope 0 0 1 1\r\nz\r\n", b"NOT_FOUND\r\n", SAME),
        case("cas with stale value", b"set x 0 0 1\r\na\r\ncas x 0 0 1 999999999\r\nz\r\nget x\r\n", b"STORED\r\nEXISTS\r\nVALUE x 0 1\r\na\r\nEND\r\n", SAME),
        case("noreply storage", b"set k 0 0 1 noreply\r\nx\r\nadd k 0 0 1 noreply\r\ny\r\nget k\r\n", b"VALUE k 0 1\r\nx\r\nEND\r\n", SAME),
        case("negative exptime stores an expired item", b"set k 0 -5 1\r\nx\r\nget k\r\n", b"STORED\r\nEND\r\n", SAME),
        case("leading and repeated spaces", b"set k 0 0 1\r\nx\r\n  get  k   \r\n", b"STORED\r\nVALUE k 0 1\r\nx\r\nEND\r\n", SAME),
        case("bare newline line ends", b"set k 0 0 1\nx\r\nget k\n", b"STORED\r\nVALUE k 0 1\r\nx\r\nEND\r\n", SAME),
        case("leading zero length", b"set k 0 0 01\r\nx\r\n", b"STORED\r\n", SAME),
        case("key of 250 bytes", format!("set {max_key} 0 0 1\r\nx\r\nget {max_key}\r\n").as_bytes(),
            format!("STORED\r\nVALUE {max_key} 0 1\r\nx\r\nEND\r\n").as_bytes(), SAME),
    ]
}

/// Arithmetic.
fn arithmetic_cases() -> Vec<Case> {
    vec![
        case("incr decr wrap and floor", b"set n 0 0 2\r\n10\r\nincr n 5\r\ndecr n 100\r\nincr n 18446744073709551615\r\nincr n 2\r\n",
            b"STORED\r\n15\r\n0\r\n18446744073709551615\r\n1\r\n", SAME),
        case("incr keeps flags", b"set n 7 0 1\r\n9\r\nincr n 1\r\nget n\r\n", b"STORED\r\n10\r\nVALUE n 7 2\r\n10\r\nEND\r\n", SAME),
        case("incr missing", b"incr nx 1\r\ndecr nx 1\r\n", b"NOT_FOUND\r\nNOT_FOUND\r\n", SAME),
        case("incr non-numeric", b"set n 0 0 2\r\nab\r\nincr n 1\r\n", b"STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n", SAME),
        case("incr too-long number", b"set n 0 0 21\r\n184467440737095516150\r\nincr n 1\r\n", b"STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n", SAME),
        case("incr bad delta", b"incr n abc\r\nincr n -1\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\nCLIENT_ERROR invalid numeric delta argument\r\n", SAME),
        // A shorter result keeps the old length, space-padded (memcached rewrites the value
        // in place), for incr and decr and ma alike.
        case("decr pads a shorter result", b"set n 0 0 3\r\n100\r\ndecr n 1\r\nget n\r\nms c 3\r\n100\r\nma c MD v\r\nmg c v\r\n",
            b"STORED\r\n99\r\nVALUE n 0 3\r\n99 \r\nEND\r\nHD\r\nVA 2\r\n99\r\nVA 3\r\n99 \r\n", SAME),
        // memcached reads a counter with strtoull: leading whitespace, a `+`, leading zeros,
        // and anything after a space are fine.
        case("incr reads numbers as memcached", b"set n 0 0 2\r\n 5\r\nincr n 1\r\nget n\r\nset n 0 0 3\r\n5 x\r\nincr n 1\r\nset n 0 0 3\r\n+07\r\nincr n 1\r\nset n 0 0 2\r\n-0\r\nincr n 1\r\nset n 0 0 2\r\n-1\r\nincr n 1\r\n",
            b"STORED\r\n6\r\nVALUE n 0 2\r\n6 \r\nEND\r\nSTORED\r\n6\r\nSTORED\r\n8\r\nSTORED\r\n1\r\nSTORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n", SAME),
        case("incr noreply", b"set n 0 0 1\r\n1\r\nincr n 1 noreply\r\nget n\r\n", b"STORED\r\nVALUE n 0 1\r\n2\r\nEND\r\n", SAME),
    ]
}

/// Delete, touch, flush, verbosity.
#[rustfmt::skip]
fn delete_touch_flush_cases() -> Vec<Case> {
    vec![
        case("delete", b"set k 0 0 1\r\nx\r\ndelete k\r\ndelete k\r\n", b"STORED\r\nDELETED\r\nNOT_FOUND\r\n", SAME),
        case("delete legacy zero", b"set k 0 0 1\r\nx\r\ndelete k 0\r\n", b"STORED\r\nDELETED\r\n", SAME),
        case("delete with a time", b"delete k 1\r\n", b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n", SAME),
        case("delete noreply", b"set k 0 0 1\r\nx\r\ndelete k noreply\r\nget k\r\n", b"STORED\r\nEND\r\n", SAME),
        case("touch", b"set k 0 0 1\r\nx\r\ntouch k 10\r\ntouch nope 10\r\n", b"STORED\r\nTOUCHED\r\nNOT_FOUND\r\n", SAME),
        case("gat and gats", b"set k 0 0 1\r\nx\r\ngat 100 k nope\r\ngat 10\r\n", b"STORED\r\nVALUE k 0 1\r\nx\r\nEND\r\nEND\r\n", SAME),
        case("gat bad exptime", b"gat abc k\r\n", b"CLIENT_ERROR invalid exptime argument\r\n", SAME),
        case("flush_all", b"set k 0 0 1\r\nx\r\nflush_all\r\nget k\r\nflush_all 0\r\nflush_all noreply\r\n", b"STORED\r\nOK\r\nEND\r\nOK\r\n", SAME),
        case("flush_all bad delay", b"flush_all abc\r\n", b"CLIENT_ERROR invalid exptime argument\r\n", SAME),
        case("verbosity", b"verbosity\r\nverbosity 1\r\nverbosity 1 noreply\r\nverbosity abc\r\n",
            b"ERROR\r\nOK\r\nCLIENT_ERROR bad command line format\r\n", SAME),
    ]
}

/// Bad input.
fn bad_input_cases() -> Vec<Case> {
    let long_key = "a".repeat(251);
    let mut too_large = b"set k 0 0 2000000\r\n".to_vec();
    too_large.extend(std::iter::repeat_n(b'x', 2_000_000));
    too_large.extend_from_slice(b"\r\nget k\r\n");
    // A value over the item size limit, with a key's old value before it: a refused `set`
    // (or `ms`, or a `set noreply`) drops the old value too; `add`, `replace`, `append` and
    // `cas` keep it.
    let big = |line: &str| {
        let mut v = b"set k 0 0 2\r\nhi\r\n".to_vec();
        v.extend_from_slice(line.as_bytes());
        v.extend(std::iter::repeat_n(b'x', 2_000_000));
        v.extend_from_slice(b"\r\nget k\r\n");
        v
    };
    let (set_big, ms_big, set_big_noreply) = (
        big("set k 0 0 2000000\r\n"),
        big("ms k 2000000 T0\r\n"),
        big("set k 0 0 2000000 noreply\r\n"),
    );
    let (add_big, replace_big, append_big, cas_big) = (
        big("add k 0 0 2000000\r\n"),
        big("replace k 0 0 2000000\r\n"),
        big("append k 0 0 2000000\r\n"),
        big("cas k 0 0 2000000 1\r\n"),
    );
    let mut long_line = vec![b'a'; 3000];
    long_line.extend_from_slice(b"\r\n");
    let long_set = format!("set {} 0 0 1\r\nx\r\n", "k".repeat(2100)).into_bytes();
    vec![
        case("unknown command", b"bogus\r\n\r\nGET k\r\nget\r\ngets\r\n", b"ERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\n", SAME),
        case("HTTP-like lines that memcached does not close on",
            b"get / HTTP/1.0\r\nFOO HTTP/1.1 x\r\nFOO HTTP\r\nFOO http/1.1\r\nincr HTTP/1.1\r\nxHTTP/1.1\r\n",
            b"END\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\n", SAME),
        case("get key too long", format!("get {long_key}\r\n").as_bytes(), b"CLIENT_ERROR bad command line format\r\n", SAME),
        case("set key too long", format!("set {long_key} 0 0 1\r\nx\r\n").as_bytes(), b"CLIENT_ERROR bad command line format\r\nERROR\r\n", SAME),
        case("bad data chunk", b"set k 0 0 3\r\nabcde\r\nget k\r\n", b"CLIENT_ERROR bad data chunk\r\nERROR\r\nEND\r\n", SAME),
        case("negative length", b"set k 0 0 -1\r\nget k\r\n", b"CLIENT_ERROR bad command line format\r\nEND\r\n", SAME),
        case("non-numeric length", b"set k 0 0 abc\r\n", b"CLIENT_ERROR bad command line format\r\n", SAME),
        // memcached reads the length as a long and keeps its low 32 bits: 4294967298 is 2
        // (the block is read as data, never run as commands); past 2^63 it is a bad line.
        case("length past 32 bits", b"set k 0 0 4294967298\r\nab\r\nget k\r\nset k 0 0 99999999999999999999\r\nget k\r\n",
            b"STORED\r\nVALUE k 0 2\r\nab\r\nEND\r\nCLIENT_ERROR bad command line format\r\nVALUE k 0 2\r\nab\r\nEND\r\n", SAME),
        case("object too large is swallowed", &too_large, b"SERVER_ERROR object too large for cache\r\nEND\r\n", SAME),
        case("a set too large drops the old value", &set_big, b"STORED\r\nSERVER_ERROR object too large for cache\r\nEND\r\n", SAME),
        case("an ms too large drops the old value", &ms_big, b"STORED\r\nSERVER_ERROR object too large for cache\r\nEND\r\n", SAME),
        case("a set noreply too large drops it silently", &set_big_noreply, b"STORED\r\nEND\r\n", SAME),
        case("add too large keeps the old value", &add_big, b"STORED\r\nSERVER_ERROR object too large for cache\r\nVALUE k 0 2\r\nhi\r\nEND\r\n", SAME),
        case("replace too large keeps it", &replace_big, b"STORED\r\nSERVER_ERROR object too large for cache\r\nVALUE k 0 2\r\nhi\r\nEND\r\n", SAME),
        case("append too large keeps it", &append_big, b"STORED\r\nSERVER_ERROR object too large for cache\r\nVALUE k 0 2\r\nhi\r\nEND\r\n", SAME),
        case("cas too large keeps it", &cas_big, b"STORED\r\nSERVER_ERROR object too large for cache\r\nVALUE k 0 2\r\nhi\r\nEND\r\n", SAME),
        case("wrong arity", b"set k 0 0\r\nset k 0 0 1 extra junk\r\nx\r\nincr k\r\ntouch k\r\n", b"ERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\n", SAME),
        case("bad flags", b"set k abc 0 1\r\nx\r\nset k -1 0 1\r\nx\r\n", b"CLIENT_ERROR bad command line format\r\nERROR\r\nCLIENT_ERROR bad command line format\r\nERROR\r\n", SAME),
        // memcached 1.6 takes flags up to 2^64-1 and keeps their low 32 bits; kvlab reads
        // them the same way, so the data block is stored, not run as a command.
        case("flags over 32 bits", b"set v 0 0 1\r\nv\r\nset k 4294967297 0 8\r\ndelete v\r\nget k\r\nappend k 4294967296 0 1\r\nx\r\nget k v\r\n",
            b"STORED\r\nSTORED\r\nVALUE k 1 8\r\ndelete v\r\nEND\r\nSTORED\r\nVALUE k 1 9\r\ndelete vx\r\nVALUE v 0 1\r\nv\r\nEND\r\n", SAME),
        case("cas without unique", b"cas k 0 0 1\r\nx\r\n", b"ERROR\r\nERROR\r\n", SAME),
        case("cas bad unique", b"cas k 0 0 1 abc\r\nx\r\n", b"CLIENT_ERROR bad command line format\r\nERROR\r\n", SAME),
        // The protocol asks clients not to, but memcached takes any byte but a space.
        case("control characters in keys", b"get a\x01b\r\nset a\x01b 0 0 1\r\nx\r\nset c\x7f\td 0 0 1\r\ny\r\nget a\x01b c\x7f\td\r\n",
            b"END\r\nSTORED\r\nSTORED\r\nVALUE a\x01b 0 1\r\nx\r\nVALUE c\x7f\td 0 1\r\ny\r\nEND\r\n", SAME),
        case("noreply silences argument errors", b"verbosity noreply\r\nverbosity foo bar my\r\nset k abc 0 1 noreply\r\nx\r\nincr k abc noreply\r\n", b"ERROR\r\nERROR\r\n", SAME),
        case("stats unknown group", b"stats nonsense\r\n", b"ERROR\r\n", SAME),
        // A long line that arrived whole is parsed like any other.
        case("a long complete line", &long_line, b"ERROR\r\n", SAME),
        case("a long complete set line", &long_set, b"CLIENT_ERROR bad command line format\r\nERROR\r\n", SAME),
        case("stats sizes", b"stats sizes\r\n", b"STAT sizes_status disabled\r\nEND\r\n", SAME),
        // memcached: 0-2 set the slab rebalancer (kvlab keeps the setting: no slab classes to
        // move), above 2 or missing is unknown, a non-number a bad line. Left at the default, 1.
        case("slabs automove", b"slabs automove 0\r\nslabs automove 2\r\nslabs automove 3\r\nslabs automove invalid\r\nslabs automove\r\nslabs\r\nslabs foo\r\nslabs automove 1\r\n",
            b"OK\r\nOK\r\nERROR\r\nCLIENT_ERROR bad command line format\r\nERROR\r\nERROR\r\nERROR\r\nOK\r\n", SAME),
    ]
}

/// Meta commands.
fn meta_cases() -> Vec<Case> {
    let long_key = "a".repeat(251);
    // base64 of 187 and 186 `k`s: 252 and 248 bytes ("kkk" encodes as "a2tr", "k" as "aw==")
    let b64_187 = format!("{}aw==", "a2tr".repeat(62));
    let b64_186 = "a2tr".repeat(62);
    let mut ms_too_large = b"ms k 2000000\r\n".to_vec();
    ms_too_large.extend(std::iter::repeat_n(b'x', 2_000_000));
    ms_too_large.extend_from_slice(b"\r\n");
    vec![
        case("mn", b"mn\r\n", b"MN\r\n", SAME),
        case("mg without key", b"mg\r\nmg  \r\n", b"ERROR\r\nERROR\r\n", SAME),
        case("ms then mg with flags", b"ms k 2\r\nhi\r\nmg k v f t s k\r\n", b"HD\r\nVA 2 f0 t-1 s2 kk\r\nhi\r\n", SAME),
        case("mg hit without flags", b"ms k 2\r\nhi\r\nmg k\r\n", b"HD\r\nHD\r\n", SAME),
        case("mg miss echoes k and O", b"mg m1 v k O99 f\r\nmg m1 v q\r\n", b"EN km1 O99\r\n", SAME),
        case("ms flags and ttl, mg order", b"ms m1 2 F7 T100\r\nhi\r\nmg m1 O1 k v f t s h\r\nmg m1 h\r\n",
            b"HD\r\nVA 2 O1 km1 f7 t100 s2 h0\r\nhi\r\nHD h1\r\n", SAME),
        case("ms modes", b"ms m1 2\r\nhi\r\nms m1 2 MA\r\nxx\r\nms m1 2 MP\r\nyy\r\nmg m1 v\r\nms nope 2 MA\r\nzz\r\nms nope 2 ME\r\nzz\r\nms nope 2 ME\r\nzz\r\nms gone 2 MR\r\nzz\r\n",
            b"HD\r\nHD\r\nHD\r\nVA 6\r\nyyhixx\r\nNS\r\nHD\r\nNS\r\nNS\r\n", SAME),
        case("ms invalid mode swallows data", b"ms m1 2 MX\r\nhi\r\n", b"CLIENT_ERROR invalid mode for ms M token\r\n", SAME),
        case("ms compare cas", b"ms m1 2\r\nhi\r\nms m1 2 C1\r\nhi\r\nms m1 2 q\r\nhi\r\nms m1 2 C1 q\r\nhi\r\n", b"HD\r\nEX\r\nEX\r\n", SAME),
        case("ms bad token swallows data", b"ms k 2 Tabc\r\nhi\r\n", b"CLIENT_ERROR bad token in command line format\r\n", SAME),
        case("ms without length", b"ms k\r\nms k S2 T0\r\nhi\r\n", b"CLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\nERROR\r\n", SAME),
        case("ms negative ttl", b"ms k 2 T-1\r\nhi\r\nmg k v\r\n", b"HD\r\nEN\r\n", SAME),
        case("ms invalidate without cas", b"ms k 2 I\r\nhi\r\n", b"HD\r\n", SAME),
        case("ms too large", &ms_too_large, b"SERVER_ERROR object too large for cache\r\n", SAME),
        case("ma", b"ma cnt\r\nma cnt N0 J13\r\nma cnt v\r\nma cnt MD D10 v\r\n", b"NF\r\nHD\r\nVA 2\r\n14\r\nVA 1\r\n4\r\n", SAME),
        case("ma non-numeric", b"ms m1 2\r\nhi\r\nma m1\r\n", b"HD\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n", SAME),
        case("ma bad mode and delta", b"ma cnt MX\r\nma cnt D-1\r\n", b"CLIENT_ERROR invalid mode for ma M token\r\nCLIENT_ERROR invalid or duplicate flag\r\n", SAME),
        case("md quiet", b"ms k 2\r\nhi\r\nmd k q\r\nmd k\r\nmd missing q\r\n", b"HD\r\nNF\r\nNF\r\n", SAME),
        case("md compare cas", b"ms k 2\r\nhi\r\nmd k C1\r\n", b"HD\r\nEX\r\n", SAME),
        case("invalidate gives stale and one win", b"ms s1 2 T0\r\nhi\r\nmd s1 I T30\r\nmg s1 v\r\nmg s1 v\r\nms s1 2\r\nnw\r\nmg s1 v\r\n",
            b"HD\r\nHD\r\nVA 2 X W\r\nhi\r\nVA 2 Z X\r\nhi\r\nHD\r\nVA 2\r\nnw\r\n", SAME),
        case("vivify on miss", b"mg v1 v N30 t\r\nmg v1 v N30\r\nmg v1 v\r\n", b"VA 0 t30 W\r\n\r\nVA 0 Z\r\n\r\nVA 0 Z\r\n\r\n", SAME),
        case("recache", b"ms r1 2 T10\r\nhi\r\nmg r1 v R30\r\nmg r1 v R30\r\n", b"HD\r\nVA 2 W\r\nhi\r\nVA 2 Z\r\nhi\r\n", SAME),
        case("mg touch", b"ms m1 2\r\nhi\r\nmg m1 T60 t v\r\nmg m1 t\r\n", b"HD\r\nVA 2 t60\r\nhi\r\nHD t60\r\n", SAME),
        case("mg flag errors", b"mg k zz\r\nmg k v v\r\nmg k v Oabcdefghijklmnopqrstuvwxyz0123456789abcdefghijklm\r\n",
            b"CLIENT_ERROR invalid flag\r\nCLIENT_ERROR duplicate flag\r\nCLIENT_ERROR opaque token too long\r\n", SAME),
        case("base64 keys", b"ms a2V5 2 b\r\nhi\r\nmg a2V5 b v k\r\nget key\r\n", b"HD\r\nVA 2 ka2V5 b\r\nhi\r\nVALUE key 0 2\r\nhi\r\nEND\r\n", SAME),
        case("bad base64 key", b"mg !!! b\r\nms !!! 2 b\r\nhi\r\n", b"CLIENT_ERROR error decoding key\r\nCLIENT_ERROR error decoding key\r\n", SAME),
        case("mg key too long", format!("mg {long_key} v\r\n").as_bytes(), b"CLIENT_ERROR bad command line format\r\n", SAME),
        // memcached limits the key as sent: base64 text over 250 bytes is refused before decoding
        // (and the `ms` data line is then read as a command); 248 bytes (186 decoded) pass.
        case("base64 key too long", format!("ms {b64_187} 1 b\r\nx\r\nmg {b64_187} b v\r\n").as_bytes(),
            b"CLIENT_ERROR bad command line format\r\nERROR\r\nCLIENT_ERROR bad command line format\r\n", SAME),
        case("longest base64 key", format!("ms {b64_186} 1 b\r\nx\r\nmg {b64_186} b v\r\n").as_bytes(),
            b"HD\r\nVA 1\r\nx\r\n", SAME),
    ]
}

/// Administration (one server's: the proxy answers ERROR).
fn admin_cases() -> Vec<Case> {
    vec![
        // `-A` is off here: the servers with it are tested on their own, since `shutdown`
        // stops them.
        case("shutdown without -A", b"shutdown\r\nshutdown graceful\r\nshutdown foo\r\n",
            &b"ERROR: shutdown not enabled\r\n".repeat(3), SAME).server_only(),
        // megabytes; at least 8, at most 10^9; noreply silences even the errors. Ends where
        // every server here started (64 MB).
        case("cache_memlimit", b"cache_memlimit\r\ncache_memlimit abc\r\ncache_memlimit -5\r\ncache_memlimit 7\r\ncache_memlimit 99999999999\r\ncache_memlimit 8 9 10\r\ncache_memlimit 1 noreply\r\ncache_memlimit 8\r\ncache_memlimit 100 x\r\ncache_memlimit 64 noreply\r\n",
            b"ERROR\r\nERROR\r\nERROR\r\nMEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\nMEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\nERROR\r\nOK\r\nOK\r\n", SAME).server_only(),
        // No slab pages to move: memcached's answers for a class without a spare page.
        case("slabs reassign", b"slabs reassign 1 2\r\nslabs reassign 39 1\r\nslabs reassign 0 2\r\nslabs reassign 1 1\r\nslabs reassign -1 -1\r\nslabs reassign -1 2\r\nslabs reassign 40 1\r\nslabs reassign 1 -2\r\nslabs reassign a b\r\nslabs reassign 1\r\nslabs reassign 1 2 3\r\nslabs reassign\r\n",
            b"NOSPARE source class has no spare pages\r\nNOSPARE source class has no spare pages\r\nNOSPARE source class has no spare pages\r\nSAME src and dst class are identical\r\nSAME src and dst class are identical\r\nBADCLASS invalid src or dst class id\r\nBADCLASS invalid src or dst class id\r\nBADCLASS invalid src or dst class id\r\nCLIENT_ERROR bad command line format\r\nERROR\r\nERROR\r\nERROR\r\n", SAME).server_only(),
        case("stats detail usage", b"stats detail\r\nstats detail foo\r\nstats detail off x\r\n",
            b"CLIENT_ERROR usage: stats detail on|off|dump\r\nCLIENT_ERROR usage: stats detail on|off|dump\r\nOK\r\n", SAME).server_only(),
        // Per-prefix counts of text gets (a hit or not, gat too), stores and deletes; meta
        // commands and keys without the delimiter are not counted; prefixes in memcached's
        // own order (its hash buckets); `stats reset` forgets them.
        case("stats detail dump",
            b"stats reset\r\nstats detail on\r\nset a:b 0 0 1\r\nx\r\nget a:b a:c b:x nodelim\r\ndelete a:b\r\nset b:1 0 0 1\r\nx\r\nadd c:1 0 0 1\r\nx\r\nmg a:z v\r\nms a:q 1\r\nx\r\nmd a:q\r\ngat 0 d:1\r\nincr a:n 1\r\nstats detail off\r\nget a:b\r\nstats detail dump\r\nstats reset\r\nstats detail dump\r\n",
            b"RESET\r\nOK\r\nSTORED\r\nVALUE a:b 0 1\r\nx\r\nEND\r\nDELETED\r\nSTORED\r\nSTORED\r\nEN\r\nHD\r\nHD\r\nEND\r\nNOT_FOUND\r\nOK\r\nEND\r\nPREFIX b get 1 hit 0 set 1 del 0\r\nPREFIX c get 0 hit 0 set 1 del 0\r\nPREFIX d get 1 hit 0 set 0 del 0\r\nPREFIX a get 2 hit 1 set 1 del 1\r\nEND\r\nRESET\r\nEND\r\n", SAME).server_only(),
        // One crawl only: a second one while the first runs is `BUSY` in both.
        case("lru_crawler", b"lru_crawler crawl hash\r\nlru_crawler crawl 1,2\r\nlru_crawler crawl 0\r\nlru_crawler crawl 64\r\nlru_crawler crawl abc\r\nlru_crawler crawl 1,x\r\nlru_crawler\r\nlru_crawler foo\r\nlru_crawler metadump\r\nlru_crawler crawl all x\r\nlru_crawler tocrawl x\r\nlru_crawler sleep 2000000\r\nlru_crawler sleep 100\r\nlru_crawler tocrawl 0\r\n",
            b"ERROR an unknown error happened\r\nOK\r\nBADCLASS invalid class id\r\nBADCLASS invalid class id\r\nBADCLASS invalid class id\r\nBADCLASS invalid class id\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\nCLIENT_ERROR bad command line format\r\nCLIENT_ERROR sleep must be one second or less\r\nOK\r\nOK\r\n", SAME).server_only(),
    ]
}

/// Requests after which the server closes the connection: the bytes it sends first.
pub fn closing_table() -> Vec<Case> {
    vec![
        // Past 2048 bytes without a newline (not a retrieval): closed without a word.
        case("a long line without its newline", &[b'a'; 3000], b"", SAME),
        case("HTTP GET", b"GET / HTTP/1.0\r\n", b"", SAME),
        case("HTTP PUT", b"PUT /a/b HTTP/1.1\r\n", b"", SAME),
        case("HTTP without a path", b"DELETE HTTP/1.1\r\n", b"", SAME),
        case("HTTP/ as the whole line", b"HTTP/1.1\r\n", b"", SAME),
        case(
            "HTTP after answered requests",
            b"mn\r\nFOO a b HTTP/2\r\n",
            b"MN\r\n",
            SAME,
        ),
    ]
}

/// Runs the closing cases (only those marked [`SAME`] if `only_same`) against `addr`: each
/// must get its bytes, then the close (a reset counts as a close); returns the mismatches.
pub fn run_closing(addr: SocketAddr, only_same: bool) -> Vec<String> {
    let mut failures = Vec::new();
    for c in closing_table()
        .into_iter()
        .filter(|c| c.same_as_memcached || !only_same)
    {
        let mut s = connect(addr);
        let got = exchange(&mut s, &c.request, b"<EOF>");
        let mut want = c.reply.clone();
        want.extend_from_slice(b"<EOF>");
        let reset = {
            let mut w = c.reply.clone();
            w.extend_from_slice(b"<RESET>");
            w
        };
        if got != want && got != reset {
            failures.push(format!(
                "{}: want {:?} then the close\n   got {:?}",
                c.name,
                String::from_utf8_lossy(&c.reply),
                String::from_utf8_lossy(&got)
            ));
        }
    }
    failures
}

/// Runs the cases (only those marked [`SAME`] if `only_same`) against `addr`; returns a
/// description of each mismatch.
pub fn run_table(addr: SocketAddr, only_same: bool) -> Vec<String> {
    run_cases(addr, table(), only_same)
}

/// [`run_table`] for a proxy: without the cases of one server's own administration
/// ([`Case::server_only`]).
pub fn run_table_proxied(addr: SocketAddr, only_same: bool) -> Vec<String> {
    let cases = table().into_iter().filter(|c| !c.server_only).collect();
    run_cases(addr, cases, only_same)
}

/// Runs `cases` (only those marked [`SAME`] if `only_same`) against `addr`, each on a fresh
/// connection after a `flush_all` and followed by [`SYNC`]; returns a description of each
/// mismatch.
pub fn run_cases(addr: SocketAddr, cases: Vec<Case>, only_same: bool) -> Vec<String> {
    run_cases_on(|| connect(addr), cases, only_same)
}

/// [`run_table`] over a unix-domain socket (`kvlab server -s PATH`).
pub fn run_table_unix(path: &std::path::Path, only_same: bool) -> Vec<String> {
    let connect = || {
        let s = std::os::unix::net::UnixStream::connect(path).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        s
    };
    run_cases_on(connect, table(), only_same)
}

/// [`run_cases`] on connections that `connect` opens.
fn run_cases_on<S: Read + Write>(
    connect: impl Fn() -> S,
    cases: Vec<Case>,
    only_same: bool,
) -> Vec<String> {
    let mut failures = Vec::new();
    for c in cases
        .into_iter()
        .filter(|c| c.same_as_memcached || !only_same)
    {
        let mut s = connect();
        // Flushed in its own exchange: memcached drops replies pipelined before a `get` with
        // a too-long key, which is not what the table is about.
        assert_eq!(exchange(&mut s, b"flush_all\r\n", b"\r\n"), b"OK\r\n");
        let mut req = c.request.clone();
        req.extend_from_slice(SYNC);
        let mut want = c.reply.clone();
        want.extend_from_slice(SYNC_REPLY);
        let got = exchange(&mut s, &req, SYNC_REPLY);
        if got != want {
            failures.push(format!(
                "{}: want {:?}\n   got {:?}",
                c.name,
                String::from_utf8_lossy(&want),
                String::from_utf8_lossy(&got)
            ));
        }
    }
    failures
}

/// Connects with a 5 s read timeout and `TCP_NODELAY`.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Sends `req`, then reads until the reply ends with `until` (or EOF, or 5 s).
pub fn exchange<S: Read + Write>(s: &mut S, req: &[u8], until: &[u8]) -> Vec<u8> {
    s.write_all(req).expect("write");
    read_until(s, until)
}

/// Reads until the bytes end with `until`; EOF appends `<EOF>`, a reset `<RESET>`.
pub fn read_until<S: Read>(s: &mut S, until: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !got.ends_with(until) {
        match s.read(&mut buf) {
            Ok(0) => {
                got.extend_from_slice(b"<EOF>");
                break;
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                got.extend_from_slice(b"<RESET>");
                break;
            }
            Err(_) => {
                got.extend_from_slice(b"<TIMEOUT>");
                break;
            }
        }
    }
    got
}
