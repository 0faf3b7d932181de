//! kvlab's proxy: a memcached front end whose service talks to several backends (issue 11).
//!
//! This first part is the routing of keys to backends, [`ring`]: twemproxy's and
//! libmemcached's `ketama` (consistent hashing, weighted) and `modula` distributions with
//! `md5` key hashing, reproduced bit for bit so that a kvlab proxy and a nutcracker in front
//! of the same backends agree on every key (`tests/twemproxy.rs` checks 10,000 keys against
//! Debian's nutcracker). The proxy service itself — a `kvlab_net::Service` that forwards
//! requests over multiplexed backend connections — builds on it.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod ring;

pub use ring::{key_hash, Backend, Distribution, Ring, RingError, KETAMA_POINTS_PER_BACKEND};
