//! The request parser: `kvlab_protocol::parse`.

use kvlab_protocol::{parse, Limits, Parsed, ProtocolError};

/// Small limits reach the "too large" and "line too long" paths with short inputs.
const SMALL: Limits = Limits {
    item_size_max: 64,
    max_line: 48,
    max_get_line: 256,
    binding: kvlab_protocol::Binding::Auto,
};

/// The first byte picks the limits (memcached's defaults or small ones); the rest is parsed
/// request by request, as a connection would.
pub fn check(data: &[u8]) {
    let (select, mut buf) = crate::selector(data);
    let limits = if select & 1 == 0 {
        Limits::default()
    } else {
        SMALL
    };
    while !buf.is_empty() {
        let parsed = parse(buf, &limits);
        let consumed = match &parsed {
            Parsed::Incomplete => return,
            Parsed::Request { consumed, .. } => *consumed,
            Parsed::Error { consumed, .. } => *consumed,
        };
        assert!(
            consumed <= buf.len(),
            "consumed {consumed} of {}",
            buf.len()
        );
        if let Parsed::Request { .. } = parsed {
            assert!(consumed > 0, "a request uses some input");
            // A request is made of its own bytes only: what follows cannot change it.
            assert_eq!(parse(&buf[..consumed], &limits), parsed, "re-parsed alone");
        }
        // Fewer bytes (a read that stopped early) give nothing yet, or the same outcome: the
        // parser never decides differently for a prefix. (An error that closes the
        // connection drops whatever is buffered, so only its kind must agree; and a line
        // still without its newline past `max_line` closes the connection, as in memcached,
        // though the same line arriving whole would have been parsed.)
        for cut in prefixes(consumed) {
            let early = parse(&buf[..cut], &limits);
            let too_long = matches!(
                early,
                Parsed::Error { error: ProtocolError::LineTooLong, .. } if cut > limits.max_line
            );
            assert!(
                early == Parsed::Incomplete
                    || early == parsed
                    || same_closing_error(&early, &parsed)
                    || too_long,
                "prefix of {cut} bytes gave {early:?}, all {consumed} gave {parsed:?}"
            );
        }
        if consumed == 0 {
            return;
        }
        buf = &buf[consumed..];
    }
}

fn same_closing_error(a: &Parsed<'_>, b: &Parsed<'_>) -> bool {
    match (a, b) {
        (Parsed::Error { error: x, .. }, Parsed::Error { error: y, .. }) => x == y && x.closes(),
        _ => false,
    }
}

/// A few prefix lengths below `n`: every one for short requests, a spread for long ones.
pub(crate) fn prefixes(n: usize) -> impl Iterator<Item = usize> {
    let step = (n / 32).max(1);
    (0..n).step_by(step).chain(n.checked_sub(1))
}
