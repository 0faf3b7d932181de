//! The client against Debian's memcached.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use kvlab_client::Client;
use kvlab_testkit::Memcached;

#[test]
fn blocking_client_round_trips_against_memcached() {
    let m = Memcached::start(1).expect("memcached (apt-get install memcached)");
    let mut c = Client::connect(m.addr, Duration::from_secs(5)).unwrap();
    assert!(c.version().unwrap().starts_with('1'));
    assert_eq!(c.get(b"k").unwrap(), None);
    assert!(c.set(b"k", b"hello\r\nworld").unwrap());
    assert_eq!(
        c.get(b"k").unwrap().as_deref(),
        Some(&b"hello\r\nworld"[..])
    );
    assert!(c.delete(b"k").unwrap());
    assert!(!c.delete(b"k").unwrap());
}
