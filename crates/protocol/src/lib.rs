//! The memcached text and meta protocol, for both directions.
//!
//! - [`request`] parses client requests (server side) and [`response`] composes replies;
//! - [`admin`] parses memcached's administration commands (`shutdown`, `cache_memlimit`,
//!   `slabs reassign`, `stats detail`, `lru_crawler`, `watch`);
//! - [`facts`] states what a request is — its keys, its effect, its family — once, for every
//!   layer that asks;
//! - [`meta`] holds the meta commands' keys and flags, shared by both directions;
//! - `lex` holds the lexical rules both share (keys, numbers);
//! - [`binary`] serves memcached's binary protocol by translating it to and from meta;
//! - [`client`] composes requests and parses replies (used by the proxy, bench and cluster).
//!
//! Parsing is incremental and zero-copy: a parsed request borrows its keys and data from the
//! input buffer, and [`Parsed::Incomplete`] says more bytes are needed — an expected outcome,
//! not an error.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod admin;
pub mod binary;
pub mod client;
mod error;
pub mod facts;
mod lex;
mod limits;
pub mod meta;
pub mod request;
pub mod response;

pub use admin::{Admin, Cachedump, LruCrawler, ShutdownMode, Watch};
pub use facts::{Effect, Family, RequestKeys};
pub use meta::{MetaCommand, MetaError, MetaFlags, MetaKey};
pub use request::{
    parse, Binding, Keys, Limits, Parsed, ProtocolError, Request, StoreCommand, MAX_KEY_LEN,
};
