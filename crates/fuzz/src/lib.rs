//! What kvlab's fuzz targets check, one module per target.
//!
//! Each `check(data)` takes the fuzzer's bytes and panics when a property fails. The targets in
//! `fuzz/` (run with `cargo fuzz run TARGET`) are one line each around these functions, and
//! `tests/corpus.rs` replays every file of `fuzz/corpus/TARGET` and `fuzz/regressions/TARGET`
//! through the same function in the ordinary test run: a crash the fuzzer finds becomes a
//! regression test by copying its input into `fuzz/regressions/TARGET`.
//!
//! | target | what it feeds | properties |
//! |---|---|---|
//! | `request` | the server's request parser | no panic; a request parsed from a buffer parses the same from exactly its own bytes; a shorter prefix is incomplete or the same outcome; `consumed` within the input |
//! | `reply` | the client's reply parser | the same, for reply frames |
//! | `meta` | meta flags and keys | no panic; every letter parsed is reported present; the client's flag lookup agrees with the server's parse; base64 keys decode within bounds |
//! | `session` | a whole connection over a real store | the same replies whatever the split of the byte stream; buffers stay within the parser's limits; no panic |
//! | `rest` | the REST handlers | no panic and no 500; `-Y` refuses every request without valid credentials; a value stored by `PUT` reads back unchanged |

#![deny(missing_docs)]

pub mod meta;
pub mod reply;
pub mod request;
pub mod rest;
pub mod session;

/// A target's property check: panics when the input breaks it.
pub type Check = fn(&[u8]);

/// The fuzz targets by name, with their checks.
pub const TARGETS: &[(&str, Check)] = &[
    ("request", request::check),
    ("reply", reply::check),
    ("meta", meta::check),
    ("session", session::check),
    ("rest", rest::check),
];

/// Splits off the first byte (a selector); an empty input selects 0.
fn selector(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((&b, rest)) => (b, rest),
        None => (0, data),
    }
}
