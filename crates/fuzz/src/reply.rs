//! The client's reply parser: `kvlab_protocol::client::parse_reply`.

use kvlab_protocol::client::{parse_reply, ParsedReply};

/// Parses the bytes frame by frame, as a client reading a server's replies would.
pub fn check(data: &[u8]) {
    let mut buf = data;
    while !buf.is_empty() {
        let parsed = parse_reply(buf);
        let len = match &parsed {
            Ok(ParsedReply::Complete { len, .. }) => *len,
            Ok(ParsedReply::Incomplete) | Err(_) => return,
        };
        assert!(
            len > 0 && len <= buf.len(),
            "frame of {len} in {}",
            buf.len()
        );
        assert_eq!(parse_reply(&buf[..len]), parsed, "re-parsed alone");
        for cut in crate::request::prefixes(len) {
            let early = parse_reply(&buf[..cut]);
            assert!(
                early == Ok(ParsedReply::Incomplete) || early == parsed,
                "prefix of {cut} bytes gave {early:?}, all {len} gave {parsed:?}"
            );
        }
        buf = &buf[len..];
    }
}
