//! The protocol's lexical rules, shared by requests ([`crate::request`]) and meta commands
//! ([`crate::meta`]): what a key may be and how numbers are read.

/// Keys longer than this are refused (memcached's `KEY_MAX_LENGTH`).
pub const MAX_KEY_LEN: usize = 250;

/// A key as memcached accepts it: 1..=250 bytes, no control characters (spaces can't occur:
/// they separate tokens).
pub fn valid_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && key.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// An unsigned decimal of at most 20 digits; `None` on empty, non-digits or overflow.
pub fn parse_u64(t: &[u8]) -> Option<u64> {
    if t.is_empty() || t.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in t {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// A signed decimal (`-` then digits); `None` when it does not fit an `i64`.
pub(crate) fn parse_i64(t: &[u8]) -> Option<i64> {
    match t {
        [b'-', digits @ ..] => parse_u64(digits).and_then(|v| 0i64.checked_sub_unsigned(v)),
        _ => parse_u64(t).and_then(|v| i64::try_from(v).ok()),
    }
}
