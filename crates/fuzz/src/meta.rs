//! Meta flags and keys: `MetaFlags::parse` on the server side, `meta_flag` on the client
//! side, `MetaKey::new` for plain and base64 keys.

use base64::Engine as _;
use kvlab_protocol::client::meta_flag;
use kvlab_protocol::request::{valid_key, MAX_KEY_LEN};
use kvlab_protocol::{MetaCommand, MetaFlags, MetaKey};

/// The first byte picks the command; the rest up to a newline is a key, after it the flags.
pub fn check(data: &[u8]) {
    let (select, rest) = crate::selector(data);
    let command = MetaCommand::ALL[usize::from(select) % MetaCommand::ALL.len()];
    let (key, flags) = match rest.iter().position(|&b| b == b'\n') {
        Some(nl) => (&rest[..nl], &rest[nl + 1..]),
        None => (&[][..], rest),
    };
    if let Ok(parsed) = MetaFlags::parse(command, flags) {
        check_flags(&parsed, flags);
    }
    check_key(key, false);
    check_key(key, true);
}

fn check_flags(parsed: &MetaFlags<'_>, raw: &[u8]) {
    assert_eq!(parsed.text(), raw);
    for letter in parsed.letters() {
        assert!(
            parsed.has(letter),
            "letter {:?} not present",
            letter as char
        );
    }
    // The client reads a reply's flags with `meta_flag`: on the same text it must find the
    // tokens the server parsed.
    assert_eq!(meta_flag(raw, b'O'), parsed.opaque, "opaque");
    let number = |flag| meta_flag(raw, flag).map(|t| String::from_utf8_lossy(t).into_owned());
    for (flag, value) in [
        (b'R', parsed.recache),
        (b'C', parsed.compare_cas),
        (b'E', parsed.new_cas),
        (b'D', parsed.delta),
        (b'J', parsed.initial),
        (b'F', parsed.client_flags.map(u64::from)),
    ] {
        match (value, number(flag)) {
            // The token is the number, perhaps with leading zeros.
            (Some(v), Some(token)) => assert_eq!(
                token.trim_start_matches('0').parse::<u64>().unwrap_or(0),
                v,
                "flag {}",
                flag as char
            ),
            (None, None) => {}
            (v, token) => panic!(
                "flag {}: parsed {v:?}, client found {token:?}",
                flag as char
            ),
        }
    }
}

fn check_key(raw: &[u8], base64: bool) {
    let Ok(key) = MetaKey::new(raw, base64) else {
        return;
    };
    assert_eq!(key.raw(), raw);
    let decoded = key.with(<[u8]>::to_vec);
    assert!(
        valid_key(&decoded),
        "decoded key {decoded:?} is not a valid key"
    );
    if base64 {
        assert!(raw.len() <= MAX_KEY_LEN);
        let reference = base64::engine::general_purpose::STANDARD.decode(raw);
        assert_eq!(reference.ok(), Some(decoded), "base64 decoding of {raw:?}");
    } else {
        assert_eq!(decoded, raw);
    }
}
