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

/// A fixed client ring over three memcached servers: every key is stored on the server the
/// ring names its owner (and on no other), every server holds some, and reads come back.
#[test]
fn a_fixed_ring_spreads_keys_over_plain_memcached_servers_by_the_ring() {
    let ms: Vec<Memcached> = (0..3)
        .map(|_| Memcached::start(1).expect("memcached (apt-get install memcached)"))
        .collect();
    let addrs: Vec<_> = ms.iter().map(|m| m.addr).collect();
    let timeout = Duration::from_secs(5);
    let mut ring = kvlab_client::ClusterClient::fixed(&addrs, kvlab_ring::DEFAULT_VNODES, timeout);
    let keys: Vec<String> = (0..300).map(|i| format!("message/{i}")).collect();
    for k in &keys {
        assert!(ring.set(k.as_bytes(), k.as_bytes()).unwrap());
    }
    let mut direct: Vec<Client> = addrs
        .iter()
        .map(|a| Client::connect(*a, timeout).unwrap())
        .collect();
    let mut held = [0usize; 3];
    for k in &keys {
        let owner = ring.ring().owner(k.as_bytes()).unwrap().to_string();
        for (i, c) in direct.iter_mut().enumerate() {
            let here = c.get(k.as_bytes()).unwrap();
            if addrs[i].to_string() == owner {
                assert_eq!(here.as_deref(), Some(k.as_bytes()), "{k} not on its owner");
                held[i] += 1;
            } else {
                assert_eq!(here, None, "{k} on {} as well as on {owner}", addrs[i]);
            }
        }
        assert_eq!(
            ring.get(k.as_bytes()).unwrap().as_deref(),
            Some(k.as_bytes())
        );
    }
    assert!(held.iter().all(|&n| n > 50), "{held:?}");
    assert_eq!(ring.redirects, 0);
}
