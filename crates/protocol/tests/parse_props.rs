//! Property tests of the request parser: every strict prefix of a valid request is
//! `Incomplete`, the whole request parses and uses exactly its bytes, and no input panics.

use kvlab_protocol::{parse, Limits, Parsed, Request};
use proptest::prelude::*;

fn key() -> impl Strategy<Value = String> {
    "[!-~]{1,250}"
}

fn data() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..300)
}

/// A valid request in wire form.
fn valid_request() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(key(), 1..5)
            .prop_map(|ks| format!("get {}\r\n", ks.join(" ")).into_bytes()),
        prop::collection::vec(key(), 1..5)
            .prop_map(|ks| format!("gats 100 {}\r\n", ks.join(" ")).into_bytes()),
        (
            prop::sample::select(vec!["set", "add", "replace", "append", "prepend"]),
            key(),
            any::<u32>(),
            -5i64..5_000_000,
            data(),
            any::<bool>()
        )
            .prop_map(|(cmd, k, f, e, d, nr)| {
                let mut v = format!(
                    "{cmd} {k} {f} {e} {}{}\r\n",
                    d.len(),
                    if nr { " noreply" } else { "" }
                )
                .into_bytes();
                v.extend_from_slice(&d);
                v.extend_from_slice(b"\r\n");
                v
            }),
        (key(), any::<u64>(), data()).prop_map(|(k, c, d)| {
            let mut v = format!("cas {k} 0 0 {} {c}\r\n", d.len()).into_bytes();
            v.extend_from_slice(&d);
            v.extend_from_slice(b"\r\n");
            v
        }),
        (key(), any::<u64>(), any::<bool>()).prop_map(|(k, d, i)| format!(
            "{} {k} {d}\r\n",
            if i { "incr" } else { "decr" }
        )
        .into_bytes()),
        key().prop_map(|k| format!("delete {k} noreply\r\n").into_bytes()),
        (key(), -10i64..100).prop_map(|(k, e)| format!("touch {k} {e}\r\n").into_bytes()),
        (0i64..100).prop_map(|d| format!("flush_all {d}\r\n").into_bytes()),
        Just(b"version\r\n".to_vec()),
        Just(b"stats\r\n".to_vec()),
        Just(b"mn\r\n".to_vec()),
        (
            key(),
            prop::sample::subsequence(
                vec!["v", "k", "c", "f", "s", "t", "h", "l", "q", "O42", "T30"],
                0..8
            )
        )
            .prop_map(|(k, fl)| format!("mg {k} {}\r\n", fl.join(" ")).into_bytes()),
        (key(), data()).prop_map(|(k, d)| {
            let mut v = format!("ms {k} {} T10 F3 c\r\n", d.len()).into_bytes();
            v.extend_from_slice(&d);
            v.extend_from_slice(b"\r\n");
            v
        }),
        key().prop_map(|k| format!("md {k} q\r\n").into_bytes()),
        key().prop_map(|k| format!("ma {k} N0 J5 D2 v\r\n").into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_prefix_is_incomplete(req in valid_request()) {
        let limits = Limits::default();
        for cut in 0..req.len() {
            prop_assert_eq!(parse(&req[..cut], &limits), Parsed::Incomplete, "prefix of {} bytes", cut);
        }
        match parse(&req, &limits) {
            Parsed::Request { consumed, .. } => prop_assert_eq!(consumed, req.len()),
            other => prop_assert!(false, "valid request did not parse: {:?}", other),
        }
    }

    #[test]
    fn pipelined_requests_parse_one_by_one(reqs in prop::collection::vec(valid_request(), 1..6)) {
        let limits = Limits::default();
        let buf: Vec<u8> = reqs.concat();
        let mut at = 0;
        for r in &reqs {
            match parse(&buf[at..], &limits) {
                Parsed::Request { consumed, .. } => { prop_assert_eq!(consumed, r.len()); at += consumed; }
                other => prop_assert!(false, "{:?}", other),
            }
        }
        prop_assert_eq!(at, buf.len());
    }

    #[test]
    fn no_input_panics_and_progress_is_made(input in prop::collection::vec(any::<u8>(), 0..600)) {
        let limits = Limits { item_size_max: 64, max_line: 128, max_get_line: 256, ..Limits::default() };
        let mut at = 0;
        while at < input.len() {
            match parse(&input[at..], &limits) {
                Parsed::Request { consumed, .. } => { prop_assert!(consumed > 0); at += consumed; }
                Parsed::Error { consumed, swallow, .. } => { prop_assert!(consumed > 0); at += consumed + swallow; }
                Parsed::Incomplete => {
                    // Incomplete is only allowed while the buffered line is within the limits.
                    prop_assert!(input.len() - at <= limits.max_get_line + limits.item_size_max + 2);
                    break;
                }
            }
        }
    }

    #[test]
    fn garbage_lines_made_of_tokens_never_panic(words in prop::collection::vec(
        prop::sample::select(vec!["get", "set", "mg", "ms", "md", "ma", "cas", "incr", "0", "-1", "18446744073709551616", "noreply", "k", "T", "Oxx", "q", "b", "4294967296", "\r", ""]), 0..8)) {
        let line = format!("{}\r\n", words.join(" "));
        let _ = parse(line.as_bytes(), &Limits::default());
    }
}

#[test]
fn data_is_borrowed_from_the_input() {
    let buf = b"set k 1 2 5\r\nhello\r\n";
    let Parsed::Request {
        request: Request::Store { data, key, .. },
        ..
    } = parse(buf, &Limits::default())
    else {
        panic!("no store")
    };
    assert_eq!(data.as_ptr(), buf[13..].as_ptr());
    assert_eq!(key.as_ptr(), buf[4..].as_ptr());
}
