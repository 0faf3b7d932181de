//! kvlab's memcached client, built on the shared `kvlab-protocol` crate.
//!
//! - [`conn`]: a non-blocking, pipelined connection for event loops (mio). Requests are
//!   composed into one reusable output buffer and written in one `write` per batch; replies
//!   are parsed in place from one reusable input buffer and matched to requests in order.
//!   It speaks memcached's text protocol, its meta protocol ([`Wire::Meta`]: `mg`/`ms`/`md`,
//!   quiet multi-gets ended by `mn`) or HTTP.
//! - [`http`]: the HTTP/1.1 side of kvlab's REST interface (compose requests, parse responses
//!   incrementally); [`Conn`] speaks it with [`Wire::Http`].
//! - [`blocking`]: a small blocking client for tools and tests.
//! - [`cluster`]: a blocking cluster-aware client: fetches a kvlab cluster's ring, routes
//!   keys by it and follows the nodes' redirects.
//!
//! The cluster's ring and its redirects are `kvlab-ring`'s; what a load generator measures
//! is `kvlab-measure`'s. Starting a system on a free port is `kvlab-process`'s; the tests'
//! scaffolding (the reference memcached, the wire table) is `kvlab-testkit`'s, a
//! dev-dependency.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod blocking;
pub mod cluster;
pub mod conn;
pub mod http;

pub use blocking::{Answer, Client};
pub use cluster::ClusterClient;
pub use conn::{Conn, ConnError, Event, Outcome, ReqKind, Status, Wire};
