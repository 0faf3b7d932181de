//! Every driver with a service whose replies complete later and out of order (a batch
//! completes last first): they still leave in request order — through helper threads
//! (epoll, signal), as one batch per round on the loop (reactor), or inline (threaded).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use kvlab_net::{App, Completion, Driver, DriverConfig, Flow, IoModel, Order, Service, Work};
use kvlab_protocol::{Limits, ProtocolError, Request};

/// A helper's state (nothing: the work is a lookup).
struct Helper;

struct Lookup(Vec<u8>);

impl Work for Lookup {
    type Worker = Helper;
    /// Batched, so the reactor runs a round's work as one batch on its loop.
    const BATCH: usize = 8;

    fn run(self, _: &mut Helper) -> Completion {
        let mut reply = b"VALUE ".to_vec();
        reply.extend_from_slice(&self.0);
        reply.extend_from_slice(b"\r\nEND\r\n");
        Completion::Reply(reply)
    }

    /// Completes a batch last first, as a proxy does when a later request's backend answers
    /// sooner.
    fn run_batch(
        works: &mut Vec<Self>,
        helper: &mut Helper,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let n = works.len();
        for (k, work) in works.drain(..).rev().enumerate() {
            done(n - 1 - k, work.run(helper));
        }
    }
}

struct Toy {
    inline: Helper,
}

impl Service for Toy {
    type Conn = ();
    type Work = Lookup;

    fn call(&mut self, _: &mut (), req: &Request<'_>, out: &mut Vec<u8>, _: bool) -> Flow<Lookup> {
        match *req {
            Request::Get { keys, .. } => match keys.iter().next() {
                Some(key) => return Flow::Defer(Lookup(key.to_vec()), Order::Pipelined),
                None => out.extend_from_slice(b"END\r\n"),
            },
            Request::Version => out.extend_from_slice(b"VERSION toy\r\n"),
            Request::Quit => return Flow::Close,
            _ => out.extend_from_slice(b"ERROR\r\n"),
        }
        Flow::Done
    }

    fn worker(&mut self) -> &mut Helper {
        &mut self.inline
    }

    fn protocol_error(&mut self, _: ProtocolError) {}
    fn record_service(&mut self, _: &[u64]) {}
    fn bytes_read(&mut self, _: usize) {}
    fn bytes_written(&mut self, _: usize) {}
}

#[derive(Default)]
struct ToyApp {
    conns: AtomicUsize,
    stop: AtomicBool,
}

impl App for ToyApp {
    type Service = Toy;

    fn service(&self, _: usize) -> Toy {
        Toy { inline: Helper }
    }

    fn helper(&self, _: usize) -> Helper {
        Helper
    }

    fn admit(&self, _: SocketAddr) -> bool {
        self.conns.fetch_add(1, SeqCst);
        true
    }

    fn release(&self) {
        self.conns.fetch_sub(1, SeqCst);
    }

    fn stopping(&self) -> bool {
        self.stop.load(SeqCst)
    }
}

#[test]
fn replies_completing_out_of_order_leave_in_request_order_under_every_driver() {
    for &io in IoModel::ALL {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Arc::new(ToyApp::default());
        let config = DriverConfig {
            threads: 2,
            limits: Limits::default(),
            idle_timeout: None,
            tls: None,
            reqs_per_event: None,
            buffers: None,
        };
        let driver = Driver::start(io, listener, app.clone(), config).unwrap();
        // The listener is bound: a connection waits in its backlog until accepted.
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(b"get p1\r\nget p2\r\nversion\r\nget p3\r\nget p4\r\nquit\r\n")
            .unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            "VALUE p1\r\nEND\r\nVALUE p2\r\nEND\r\nVERSION toy\r\nVALUE p3\r\nEND\r\nVALUE p4\r\nEND\r\n",
            "io {}",
            io.name()
        );
        app.stop.store(true, SeqCst);
        driver.stop();
    }
}
