//! The memcached text and meta protocol, for both directions.
//!
//! - [`request`] parses client requests (server side) and [`response`] composes replies;
//! - [`client`] composes requests and parses replies (used by the proxy, bench and cluster).
//!
//! Parsing is incremental and zero-copy: a parsed request borrows its keys and data from the
//! input buffer, and [`Parsed::Incomplete`] says more bytes are needed — an expected outcome,
//! not an error.

pub mod client;
