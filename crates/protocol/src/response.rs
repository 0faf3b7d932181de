//! Server side: compose replies into an output buffer.
//!
//! Every function appends to a caller-owned `Vec<u8>` that is reused across requests, so a
//! reply costs no allocation once the buffer has grown to its working size.

/// `STORED`
pub const STORED: &[u8] = b"STORED\r\n";
/// `NOT_STORED`
pub const NOT_STORED: &[u8] = b"NOT_STORED\r\n";
/// `EXISTS`
pub const EXISTS: &[u8] = b"EXISTS\r\n";
/// `NOT_FOUND`
pub const NOT_FOUND: &[u8] = b"NOT_FOUND\r\n";
/// `DELETED`
pub const DELETED: &[u8] = b"DELETED\r\n";
/// `TOUCHED`
pub const TOUCHED: &[u8] = b"TOUCHED\r\n";
/// `END`
pub const END: &[u8] = b"END\r\n";
/// `OK`
pub const OK: &[u8] = b"OK\r\n";
/// `RESET`
pub const RESET: &[u8] = b"RESET\r\n";
/// `ERROR`
pub const ERROR: &[u8] = b"ERROR\r\n";
/// `SERVER_ERROR out of memory storing object`
pub const OUT_OF_MEMORY: &[u8] = b"SERVER_ERROR out of memory storing object\r\n";
/// `SERVER_ERROR out of memory`: an `incr`/`decr`/`ma` result that found no memory.
pub const ARITH_OUT_OF_MEMORY: &[u8] = b"SERVER_ERROR out of memory\r\n";
/// `SERVER_ERROR object too large for cache`
pub const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
/// `CLIENT_ERROR cannot increment or decrement non-numeric value`
pub const NON_NUMERIC: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
/// `ERROR Too many open connections`
pub const TOO_MANY_CONNECTIONS: &[u8] = b"ERROR Too many open connections\r\n";
/// `MN`
pub const MN: &[u8] = b"MN\r\n";

/// Appends the decimal form of `n`.
pub fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Appends the decimal form of `n`.
pub fn push_i64(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\n`
pub fn value(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    out.reserve(key.len() + data.len() + 48);
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    push_u64(out, u64::from(flags));
    out.push(b' ');
    push_u64(out, data.len() as u64);
    if let Some(cas) = cas {
        out.push(b' ');
        push_u64(out, cas);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// `<n>\r\n`, the reply to `incr`/`decr`.
pub fn number(out: &mut Vec<u8>, n: u64) {
    push_u64(out, n);
    out.extend_from_slice(b"\r\n");
}

/// `STAT <name> <value>\r\n`
pub fn stat(out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display) {
    use std::io::Write as _;
    // Writing into a Vec cannot fail.
    let _ = write!(out, "STAT {name} {value}\r\n");
}

/// `VERSION <version>\r\n`
pub fn version(out: &mut Vec<u8>, version: &str) {
    out.extend_from_slice(b"VERSION ");
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_line() {
        let mut out = Vec::new();
        value(&mut out, b"k", 5, b"hello", None);
        value(&mut out, b"k", 0, b"", Some(42));
        assert_eq!(out, b"VALUE k 5 5\r\nhello\r\nVALUE k 0 0 42\r\n\r\n");
    }
}
