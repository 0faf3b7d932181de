//! A counter's value as memcached reads it and writes it (`incr`, `decr`, meta arithmetic).

/// Parses 1 to 20 ASCII digits that fit a `u64`.
/// A counter's value as memcached reads it (`strtoull`, then its checks): leading
/// whitespace, an optional sign (`-` only for zero), 1 or more digits fitting a `u64`,
/// then the end or whitespace (anything after that whitespace is ignored).
pub(crate) fn parse_counter(v: &[u8]) -> Option<u64> {
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r');
    let start = v.iter().position(|&b| !space(b))?;
    let mut rest = &v[start..];
    let negative = match rest.first() {
        Some(b'-') => true,
        Some(b'+') => false,
        _ => {
            return digits_then_space(rest, space);
        }
    };
    rest = &rest[1..];
    let n = digits_then_space(rest, space)?;
    if negative && n != 0 {
        // strtoull negates it; memcached refuses a negative result with a `-` in it.
        return None;
    }
    Some(n)
}

fn digits_then_space(v: &[u8], space: impl Fn(u8) -> bool) -> Option<u64> {
    let end = v
        .iter()
        .position(|&b| !b.is_ascii_digit())
        .unwrap_or(v.len());
    // strtoull stops at the first non-digit; memcached accepts the number when that is
    // whitespace or a NUL (the end of a C string: `00\0abc` reads as 0).
    if end == 0 || !(end == v.len() || space(v[end]) || v[end] == 0) {
        return None;
    }
    // strtoull: any number of leading zeros; overflow is an error.
    v[..end].iter().try_fold(0u64, |acc, &b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// Writes `v` in decimal into `buf`, returning the length.
pub(super) fn format_u64(mut v: u64, buf: &mut [u8; 20]) -> usize {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let n = tmp.len() - i;
    buf[..n].copy_from_slice(&tmp[i..]);
    n
}
