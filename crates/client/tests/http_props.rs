//! Properties of the HTTP/1.1 response parser: every proper prefix of a valid response is
//! `Incomplete`, the whole response parses to exactly its length with its status and body, no
//! input panics, and percent-encoded keys decode back to themselves.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use kvlab_client::http::{parse_response, push_key, Method, ParsedResponse};
use proptest::prelude::*;

/// A response as a server might frame it: a status, a few headers, a body by Content-Length.
fn response(status: u16, body: &[u8], extra: &[(String, String)], lower: bool) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} Whatever Reason\r\n").into_bytes();
    for (k, v) in extra {
        out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    let cl = if lower {
        "content-length"
    } else {
        "Content-Length"
    };
    out.extend_from_slice(format!("{cl}:  {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    out
}

fn chunked(body: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let mut rest = body;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].clamp(1, rest.len());
        out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
        i += 1;
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn header() -> impl Strategy<Value = (String, String)> {
    ("[A-Za-z][A-Za-z0-9-]{0,15}", "[ -~]{0,40}").prop_filter("not a framing header", |(k, _)| {
        let k = k.to_ascii_lowercase();
        k != "content-length" && k != "transfer-encoding" && k != "connection"
    })
}

proptest! {
    #[test]
    fn every_prefix_is_incomplete_and_the_whole_parses(
        status in prop_oneof![Just(200u16), Just(201), Just(404), Just(413), Just(500)],
        body in proptest::collection::vec(any::<u8>(), 0..300),
        extra in proptest::collection::vec(header(), 0..4),
        lower in any::<bool>(),
        trailing in proptest::collection::vec(any::<u8>(), 0..20),
    ) {
        let full = response(status, &body, &extra, lower);
        for cut in 0..full.len() {
            prop_assert_eq!(parse_response(&full[..cut], Method::Get), Ok(ParsedResponse::Incomplete), "cut {}", cut);
        }
        let mut buf = full.clone();
        buf.extend_from_slice(&trailing); // the next response's bytes are not consumed
        match parse_response(&buf, Method::Get) {
            Ok(ParsedResponse::Complete { response, len }) => {
                prop_assert_eq!(len, full.len());
                prop_assert_eq!(response.status, status);
                prop_assert_eq!(response.body, &body[..]);
                prop_assert!(!response.close);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn chunked_bodies_are_framed_exactly(
        body in proptest::collection::vec(any::<u8>(), 0..300),
        sizes in proptest::collection::vec(1usize..70, 1..5),
    ) {
        let full = chunked(&body, &sizes);
        for cut in 0..full.len() {
            prop_assert_eq!(parse_response(&full[..cut], Method::Get), Ok(ParsedResponse::Incomplete), "cut {}", cut);
        }
        let ok = matches!(parse_response(&full, Method::Get), Ok(ParsedResponse::Complete { len, .. }) if len == full.len());
        prop_assert!(ok);
    }

    #[test]
    fn no_input_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), head in any::<bool>()) {
        let m = if head { Method::Head } else { Method::Get };
        if let Ok(ParsedResponse::Complete { len, response }) = parse_response(&bytes, m) {
            prop_assert!(len > 0 && len <= bytes.len());
            prop_assert!(response.body.len() <= len);
        }
        // With a valid status line in front, the rest is arbitrary header/body bytes.
        let mut b = b"HTTP/1.1 200 OK\r\n".to_vec();
        b.extend_from_slice(&bytes);
        if let Ok(ParsedResponse::Complete { len, .. }) = parse_response(&b, m) {
            prop_assert!(len > 0 && len <= b.len());
        }
    }

    #[test]
    fn encoded_keys_decode_to_themselves(key in proptest::collection::vec(any::<u8>(), 1..60)) {
        let mut enc = Vec::new();
        push_key(&mut enc, &key);
        // One path segment of visible ASCII with nothing a URL parser would act on.
        prop_assert!(enc.iter().all(|&b| b.is_ascii_graphic() && !b"/?#%+&=;"
            .contains(&b) || b == b'%'));
        let mut dec = Vec::new();
        let mut i = 0;
        while i < enc.len() {
            if enc[i] == b'%' {
                let h = std::str::from_utf8(&enc[i + 1..i + 3]).unwrap();
                dec.push(u8::from_str_radix(h, 16).unwrap());
                i += 3;
            } else {
                dec.push(enc[i]);
                i += 1;
            }
        }
        prop_assert_eq!(dec, key);
    }
}
