//! What the prober does when an ejected backend answers again.
//!
//! - In a kvlab cluster's pool (`--cluster`), or a pool with one copy of each key, the
//!   backend rejoins as it is: the cluster owns its copies, and a lone copy cannot hold a
//!   value that a newer write replaced (a write to it failed while it was out, and the client
//!   was told so). Flushing it would only destroy acknowledged writes.
//! - In a replicated pool it may hold older values of the keys whose writes it missed; the
//!   workers recorded them ([`Health::missed`]). Each is repaired from the peer replicas
//!   before the backend serves again: read there with the meta protocol (`mg KEY v f t`:
//!   value, client flags, remaining TTL), written to it (`ms KEY LEN F T`), or deleted from
//!   it when no peer has the key. Passes repeat until one finds nothing left to repair, and
//!   the backend is put back under the record's lock. A backend that missed a `flush_all`,
//!   or more keys than are recorded, is flushed first.
//!
//! ```text
//!  prober ── version ──► backend B (ejected): answers
//!     │  take B's missed keys (workers record more meanwhile: B stays out)
//!     ├── mg KEY v f t ──► every serving peer replica of KEY (they must agree); none
//!     │                    serving: those that missed no write of KEY (they must answer)
//!     ├── ms KEY … / md KEY ──► B
//!     └── nothing left: B back in (under the lock workers record under)
//! ```
//!
//! Every serving peer is asked, and they must agree: a write a peer has not applied yet (a
//! majority write's slowest replica) shows as a disagreement, and the key is read again.
//! A worker records a key again once every replica has answered the write it missed, so a
//! repair that read the peers too early is done again.

use std::collections::HashMap;
use std::io::{self, Read as _, Write as _};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use kvlab_protocol::client::{parse_reply, ParsedReply, Reply};

#[cfg(doc)]
use crate::backend::Health;
use crate::backend::{self, frame, Frame};
use crate::config::ReplicaWritePolicy;
use crate::route::Routing;

/// Puts backend `b` (ejected, answering again) back in service, repairing it first in a
/// replicated pool. `Ok` with the keys repaired, or why it stays out (the prober tries again
/// at its next round).
pub(crate) fn rejoin(routing: &Routing, b: usize, stopping: &AtomicBool) -> Result<u64, String> {
    let health = &routing.backends[b];
    if !routing.repair[b] {
        // Nothing it missed can be stale (a reload may have left a record of an earlier
        // replicated pool: it no longer applies).
        *health.missed.lock() = backend::Missed::default();
        return match health.rejoin() {
            true => Ok(0),
            false => Err("a write it missed was recorded meanwhile".into()),
        };
    }
    let mut repair = Repair {
        routing,
        b,
        timeout: routing.config.timeout,
        links: HashMap::new(),
        replicas: Vec::new(),
    };
    let mut repaired = 0;
    loop {
        if stopping.load(Ordering::Relaxed) {
            return Err("the proxy is stopping".into());
        }
        let (flush, keys) = {
            let mut missed = health.missed.lock();
            (
                std::mem::take(&mut missed.flush),
                std::mem::take(&mut missed.keys),
            )
        };
        if flush {
            if let Err(e) = repair.flush() {
                let mut missed = health.missed.lock();
                missed.flush = true;
                missed.keys.extend(keys);
                return Err(format!("would not flush: {e}"));
            }
            health.flushes.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                backend = %health.name,
                "backend flushed: it missed a flush_all, or more writes than are recorded"
            );
        }
        if keys.is_empty() {
            if !flush && health.rejoin() {
                return Ok(repaired);
            }
            continue;
        }
        let mut keys = keys.into_iter();
        while let Some(key) = keys.next() {
            if let Err(e) = repair.key(&key) {
                let mut missed = health.missed.lock();
                missed.keys.insert(key);
                missed.keys.extend(keys);
                return Err(e);
            }
            repaired += 1;
            health.repaired.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A repair of backend `b` under way: connections to it and its peers, kept for the round.
struct Repair<'a> {
    routing: &'a Routing,
    b: usize,
    timeout: Duration,
    links: HashMap<usize, Link>,
    replicas: Vec<usize>,
}

/// A key as a peer holds it.
#[derive(Debug, PartialEq, Eq)]
enum Held {
    /// Its value, client flags and remaining TTL in seconds (-1: none).
    Value { data: Vec<u8>, flags: u32, ttl: i64 },
    /// Not there.
    Missing,
}

impl Repair<'_> {
    fn link(&mut self, backend: usize) -> &mut Link {
        let name = &self.routing.backends[backend].name;
        self.links.entry(backend).or_insert_with(|| Link {
            name: name.clone(),
            stream: None,
            buf: Vec::new(),
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        let (b, timeout) = (self.b, self.timeout);
        let reply = self.link(b).call(b"flush_all\r\n", Frame::Line, timeout)?;
        expect(&reply, b"OK")
    }

    /// Makes the backend's copy of `key` what its serving peers hold. With none serving
    /// (every other replica is out too), what the peers that did not miss a write of the key
    /// hold (each has every write of it that was sent: the newest state); they must answer,
    /// or the key waits. When every other replica missed a write of it too, none holds a
    /// newer state than this backend's own, which stays (the others are repaired from it
    /// once it serves). `Err` when a peer or the backend cannot be asked now (the key stays
    /// recorded).
    fn key(&mut self, key: &[u8]) -> Result<(), String> {
        let pool = self.routing.pool_of(key);
        self.routing.replicas(pool, key, &mut self.replicas);
        let b = self.b;
        let routing = self.routing;
        let mut peers = std::mem::take(&mut self.replicas);
        peers.retain(|&r| r != b);
        if peers.iter().all(|&r| routing.backends[r].is_ejected()) {
            peers.retain(|&r| {
                let missed = routing.backends[r].missed.lock();
                !missed.flush && !missed.keys.contains(key)
            });
            if peers.is_empty() {
                self.replicas = peers;
                // Under `all` a write is acknowledged only once every replica applied it,
                // so this copy holds the last acknowledged state or a newer one. Under
                // `majority` it may have missed an acknowledged write that the others
                // applied before they missed a later one: wait for one of them to serve.
                return match routing.pools[pool].pool.write_policy {
                    ReplicaWritePolicy::All => Ok(()),
                    ReplicaWritePolicy::Majority => Err(format!(
                        "every replica of {} missed a write of it: waiting for one to serve",
                        String::from_utf8_lossy(key)
                    )),
                };
            }
        } else {
            peers.retain(|&r| !routing.backends[r].is_ejected());
        }
        let result = self.settle(key, &peers);
        self.replicas = peers;
        let copy = result?;
        let (token, base64) = key_token(key);
        let mut request = Vec::with_capacity(token.len() + 64);
        match &copy {
            Held::Value { data, flags, ttl } => {
                request.extend_from_slice(b"ms ");
                request.extend_from_slice(&token);
                request.extend_from_slice(format!(" {}", data.len()).as_bytes());
                if base64 {
                    request.extend_from_slice(b" b");
                }
                // `t` says -1 for no expiry (`T0`), and 0 when less than a second is left.
                let ttl = match *ttl {
                    t if t < 0 => 0,
                    0 => 1,
                    t => t,
                };
                request.extend_from_slice(format!(" F{flags} T{ttl}\r\n").as_bytes());
                request.extend_from_slice(data);
                request.extend_from_slice(b"\r\n");
            }
            Held::Missing => {
                request.extend_from_slice(b"md ");
                request.extend_from_slice(&token);
                if base64 {
                    request.extend_from_slice(b" b");
                }
                request.extend_from_slice(b"\r\n");
            }
        }
        let timeout = self.timeout;
        let link = self.link(b);
        let reply = link
            .call(&request, Frame::Meta, timeout)
            .map_err(|e| format!("{}: {e}", link.name))?;
        // Stored; or deleted, or not there to delete.
        let done = match copy {
            Held::Value { .. } => reply.starts_with(b"HD"),
            Held::Missing => reply.starts_with(b"HD") || reply.starts_with(b"NF"),
        };
        if !done {
            return Err(format!(
                "{} answered {:?} to a repair",
                link.name,
                String::from_utf8_lossy(&reply).trim_end()
            ));
        }
        Ok(())
    }

    /// What `peers` agree `key` is. Peers that disagree are asked again (a write in flight reaches them within the
    /// request timeout); if they still do after it, the key counts as missing.
    fn settle(&mut self, key: &[u8], peers: &[usize]) -> Result<Held, String> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let mut agreed: Option<Held> = None;
            let mut differ = false;
            for &peer in peers {
                let timeout = self.timeout;
                let link = self.link(peer);
                let copy = read(link, key, timeout).map_err(|e| format!("{}: {e}", link.name))?;
                match &agreed {
                    None => agreed = Some(copy),
                    Some(seen) if !seen.same(&copy) => differ = true,
                    Some(_) => {}
                }
            }
            if !differ {
                return Ok(agreed.unwrap_or(Held::Missing));
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    backend = %self.routing.backends[self.b].name,
                    key = %String::from_utf8_lossy(key),
                    "peer replicas disagree on a key: deleted from the returning backend"
                );
                return Ok(Held::Missing);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Held {
    /// The same item (the TTL left may differ by the time between the reads).
    fn same(&self, other: &Held) -> bool {
        match (self, other) {
            (
                Held::Value { data, flags, .. },
                Held::Value {
                    data: d, flags: f, ..
                },
            ) => data == d && flags == f,
            (Held::Missing, Held::Missing) => true,
            _ => false,
        }
    }
}

/// `mg KEY v f t` on `link`.
fn read(link: &mut Link, key: &[u8], timeout: Duration) -> io::Result<Held> {
    let (token, base64) = key_token(key);
    let mut request = Vec::with_capacity(token.len() + 16);
    request.extend_from_slice(b"mg ");
    request.extend_from_slice(&token);
    if base64 {
        request.extend_from_slice(b" b");
    }
    request.extend_from_slice(b" v f t\r\n");
    let reply = link.call(&request, Frame::Meta, timeout)?;
    let bad = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{what}: {:?}",
                String::from_utf8_lossy(&reply[..reply.len().min(100)])
            ),
        )
    };
    match parse_reply(&reply) {
        Ok(ParsedReply::Complete {
            reply: Reply::MetaValue { flags, data },
            ..
        }) => {
            let mut client_flags = 0;
            let mut ttl = -1;
            for token in flags.split(|&c| c == b' ').filter(|t| !t.is_empty()) {
                let value = std::str::from_utf8(&token[1..]).ok();
                match token[0] {
                    b'f' => client_flags = value.and_then(|v| v.parse().ok()).unwrap_or(0),
                    b't' => ttl = value.and_then(|v| v.parse().ok()).unwrap_or(-1),
                    _ => {}
                }
            }
            Ok(Held::Value {
                data: data.to_vec(),
                flags: client_flags,
                ttl,
            })
        }
        Ok(ParsedReply::Complete {
            reply: Reply::MetaMiss,
            ..
        }) => Ok(Held::Missing),
        _ => Err(bad("unexpected reply to mg")),
    }
}

/// `key` as a meta command carries it: as is, or in base64 (with the `b` flag) when it has
/// bytes a text key cannot (a binary key a client sent in base64).
fn key_token(key: &[u8]) -> (Vec<u8>, bool) {
    if !key.is_empty() && key.iter().all(|&c| c > b' ' && c != 0x7f) {
        (key.to_vec(), false)
    } else {
        let text = base64::engine::general_purpose::STANDARD.encode(key);
        (text.into_bytes(), true)
    }
}

fn expect(reply: &[u8], want: &[u8]) -> io::Result<()> {
    if reply.starts_with(want) {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("answered {:?}", String::from_utf8_lossy(reply).trim_end()),
        ))
    }
}

/// A blocking connection to one backend, one request at a time, opened when first used and
/// again after an error.
struct Link {
    name: String,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

impl Link {
    /// Sends `request` and returns its reply, framed as `kind`.
    fn call(&mut self, request: &[u8], kind: Frame, timeout: Duration) -> io::Result<Vec<u8>> {
        let result = self.exchange(request, kind, timeout);
        if result.is_err() {
            // Out of step or gone: a fresh connection next time.
            self.stream = None;
        }
        result
    }

    fn exchange(&mut self, request: &[u8], kind: Frame, timeout: Duration) -> io::Result<Vec<u8>> {
        if self.stream.is_none() {
            let s = backend::connect(&self.name, timeout)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            self.stream = Some(s);
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        self.buf.clear();
        stream.write_all(request)?;
        let deadline = Instant::now() + timeout;
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match frame(kind, &self.buf) {
                Ok(Some(f)) => {
                    let reply = self.buf[..f.len].to_vec();
                    if f.len != self.buf.len() {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "more than one reply",
                        ));
                    }
                    return Ok(reply);
                }
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            if Instant::now() > deadline {
                return Err(io::ErrorKind::TimedOut.into());
            }
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_keys_travel_as_they_are_and_binary_ones_in_base64() {
        assert_eq!(key_token(b"user:7"), (b"user:7".to_vec(), false));
        assert_eq!(key_token(b"a b"), (b"YSBi".to_vec(), true));
        assert_eq!(key_token(&[0, 1]), (b"AAE=".to_vec(), true));
    }

    #[test]
    fn copies_are_the_same_item_whatever_ttl_is_left() {
        let v = |data: &[u8], flags, ttl| Held::Value {
            data: data.to_vec(),
            flags,
            ttl,
        };
        assert!(v(b"x", 1, 10).same(&v(b"x", 1, 9)));
        assert!(!v(b"x", 1, 10).same(&v(b"y", 1, 10)));
        assert!(!v(b"x", 1, 10).same(&v(b"x", 2, 10)));
        assert!(!v(b"x", 1, 10).same(&Held::Missing));
        assert!(Held::Missing.same(&Held::Missing));
    }
}
