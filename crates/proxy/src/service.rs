//! The proxy's network stage: a `kvlab_net` service on the event-loop thread. It answers
//! what needs no backend (`version`, `stats`, `verbosity`, `mn`, `quit`) and queues every
//! other request for the workers as [`ProxyWork`], in the form it is forwarded: the
//! request re-composed from its parsed fields, without `noreply` (the worker drops the
//! reply instead, so that every request sent to a backend has a reply to wait for), with
//! its shape (kind, where its keys lie): the request is parsed here, once.
//!
//! Request buffers cycle: the network thread fills one, the worker turns it into the reply,
//! and the session gives it back ([`kvlab_net::Service::recycle`]) — nothing is allocated per
//! request once the pool of buffers has grown to the load.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use kvlab_net::{App, Flow, Order, Service};
use kvlab_protocol::{MetaCommand, MetaKey, ProtocolError, Request};

use crate::forward::Shape;
use crate::worker::{ProxyWork, Worker};
use crate::ProxyState;

/// Most spare request buffers the network thread keeps.
const SPARE_BUFFERS: usize = 4096;
/// Spare buffers larger than this are dropped rather than kept.
const SPARE_MAX: usize = 64 * 1024;

/// The network thread's service.
pub struct ProxyService {
    shared: Arc<ProxyState>,
    /// Which serving thread it is (its recorder, in the reactor model).
    index: usize,
    spare: Vec<Vec<u8>>,
    /// The worker of this thread when the driver runs work on the serving thread itself
    /// (the reactor model); the epoll model's workers are helper threads.
    inline: Option<Worker>,
    /// The number the next client connection gets (see [`ProxyWork`]'s `client`).
    next_client: u32,
}

impl ProxyService {
    pub(crate) fn new(shared: Arc<ProxyState>, index: usize) -> ProxyService {
        ProxyService {
            shared,
            index,
            spare: Vec::new(),
            inline: None,
            next_client: 0,
        }
    }

    fn forward(&mut self, client: u32, req: &Request<'_>) -> ProxyWork {
        let mut buf = self.spare.pop().unwrap_or_default();
        let shape = crate::forward::compose(req, &mut buf);
        self.queue(client, buf, shape, req.noreply())
    }

    /// Queues `buf` (a request of `client` as forwarded, of `shape`), stamping its arrival
    /// and the queue it finds.
    fn queue(&mut self, client: u32, buf: Vec<u8>, shape: Shape, noreply: bool) -> ProxyWork {
        let arrival = Instant::now();
        let queued = if self.shared.record {
            self.shared.queue.arrive(arrival)
        } else {
            0
        };
        ProxyWork {
            buf,
            shape,
            noreply,
            arrival,
            queue_len: queued.min(u64::from(u32::MAX)) as u32,
            redirected: None,
            redirects: 0,
            dequeued: arrival,
            client,
        }
    }
}

impl Service for ProxyService {
    /// The client connection's number.
    type Conn = u32;
    type Work = ProxyWork;

    fn call(
        &mut self,
        conn: &mut u32,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        _rerun: bool,
    ) -> Flow<ProxyWork> {
        match req {
            Request::Version => {
                kvlab_protocol::response::version(out, crate::VERSION);
                Flow::Done
            }
            Request::Quit => Flow::Close,
            // A cluster node's own commands mean nothing to a proxy (memcached's answer).
            Request::Cluster { .. } => {
                out.extend_from_slice(b"ERROR\r\n");
                Flow::Done
            }
            Request::Stats { group } => {
                if !crate::render::stats(&self.shared, *group, out) {
                    out.extend_from_slice(b"ERROR\r\n");
                }
                Flow::Done
            }
            // One server's administration (`shutdown`, `cache_memlimit`, `slabs
            // reassign`, `stats detail`, `lru_crawler`, `watch`) has no meaning for a
            // proxy in front of several: unknown here, as in other memcached proxies.
            Request::Admin(_) => {
                out.extend_from_slice(b"ERROR\r\n");
                Flow::Done
            }
            Request::Verbosity { noreply, .. } => {
                if !noreply {
                    out.extend_from_slice(b"OK\r\n");
                }
                Flow::Done
            }
            // Nothing to ask a backend.
            Request::Get { keys, .. } | Request::Gat { keys, .. }
                if keys.iter().next().is_none() =>
            {
                out.extend_from_slice(b"END\r\n");
                Flow::Done
            }
            Request::Meta {
                command: MetaCommand::Noop,
                ..
            } => {
                out.extend_from_slice(b"MN\r\n");
                Flow::Done
            }
            // Every request that names a key, and the settings every backend takes.
            Request::Get { .. }
            | Request::Gat { .. }
            | Request::Store { .. }
            | Request::Arith { .. }
            | Request::Delete { .. }
            | Request::Touch { .. }
            | Request::Meta { .. }
            | Request::FlushAll { .. }
            | Request::SlabsAutomove { .. } => {
                Flow::Defer(self.forward(*conn, req), Order::Pipelined)
            }
        }
    }

    fn opened(&mut self, conn: &mut u32, _fd: std::os::fd::RawFd, _tls: bool) {
        *conn = self.next_client;
        self.next_client = self.next_client.wrapping_add(1);
    }

    fn worker(&mut self) -> &mut Worker {
        let (shared, index) = (self.shared.clone(), self.index);
        self.inline
            .get_or_insert_with(|| Worker::new(shared, index))
    }

    /// A `set` refused as too large drops the key's old value on its backends too, as one
    /// memcached would: a `delete` to every replica, its reply dropped (the client gets the
    /// error).
    fn drop_stale(&mut self, conn: &mut u32, key: MetaKey<'_>) -> Option<ProxyWork> {
        let mut buf = self.spare.pop().unwrap_or_default();
        let shape = key.with(|key| crate::forward::compose_delete(key, &mut buf));
        Some(self.queue(*conn, buf, shape, true))
    }

    fn protocol_error(&mut self, _error: ProtocolError) {
        self.shared.protocol_errors.fetch_add(1, Ordering::Relaxed);
    }

    fn record_service(&mut self, samples: &[u64]) {
        if self.shared.record && !samples.is_empty() {
            self.shared.net.lock().record(samples);
        }
    }

    fn bytes_read(&mut self, n: usize) {
        self.shared
            .bytes_read
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    fn bytes_written(&mut self, n: usize) {
        self.shared
            .bytes_written
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.spare.len() < SPARE_BUFFERS && buf.capacity() <= SPARE_MAX {
            buf.clear();
            self.spare.push(buf);
        }
    }
}

/// What the epoll driver serves: one network service, `workers` worker states.
pub struct ProxyApp {
    pub(crate) shared: Arc<ProxyState>,
}

impl App for ProxyApp {
    type Service = ProxyService;

    fn service(&self, index: usize) -> ProxyService {
        ProxyService::new(self.shared.clone(), index)
    }

    fn helper(&self, index: usize) -> Worker {
        Worker::new(self.shared.clone(), index)
    }

    fn admit(&self, _peer: SocketAddr) -> bool {
        let n = self.shared.curr_connections.fetch_add(1, Ordering::Relaxed);
        if n >= self.shared.conn_limit as u64 {
            self.shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
            self.shared
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.shared
            .total_connections
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    fn release(&self) {
        self.shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
    }

    fn stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Relaxed)
    }
}
