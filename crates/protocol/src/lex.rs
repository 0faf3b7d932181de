//! The protocol's lexical rules, shared by requests ([`crate::request`]) and meta commands
//! ([`crate::meta`]): what a key may be and how numbers are read.

/// Keys longer than this are refused (memcached's `KEY_MAX_LENGTH`).
pub const MAX_KEY_LEN: usize = 250;

/// A key as memcached 1.6 accepts it: 1..=250 bytes of anything but a space (which
/// separates tokens). The protocol asks clients not to send control characters, but the
/// server takes them (`get a\x01b` is a plain miss), so kvlab does too; kvlab's own
/// clients refuse to send them ([`crate::client`]).
pub fn valid_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && !key.contains(&b' ')
}

/// [`valid_key`] for a token of [`Tokens`], which never holds a space: only its length is
/// left to check (the space scan is most of what checking a short key costs).
pub(crate) fn valid_key_token(key: &[u8]) -> bool {
    debug_assert!(!key.contains(&b' '));
    !key.is_empty() && key.len() <= MAX_KEY_LEN
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

/// Splits a command line on spaces (memcached's tokenizer: runs of spaces are one separator).
#[derive(Clone)]
pub(crate) struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    pub(crate) fn new(line: &'a [u8]) -> Self {
        Tokens { rest: line }
    }

    /// The unsplit remainder, leading spaces removed.
    pub(crate) fn remainder(&self) -> &'a [u8] {
        let start = self
            .rest
            .iter()
            .position(|&b| b != b' ')
            .unwrap_or(self.rest.len());
        &self.rest[start..]
    }

    pub(crate) fn rest_is_empty(&self) -> bool {
        self.remainder().is_empty()
    }

    pub(crate) fn token_count(&self) -> usize {
        self.clone().fold(0, |n, _| n + 1)
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.remainder();
        if rest.is_empty() {
            self.rest = rest;
            return None;
        }
        // Tokens are short (a command, a key of at most 250 bytes, a number): a plain scan
        // beats memchr's set-up for each.
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        self.rest = &rest[end..];
        Some(&rest[..end])
    }
}
