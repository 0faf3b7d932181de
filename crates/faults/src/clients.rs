//! Clients that record: N threads, each a loop bounded by a count and a deadline, writing
//! unique values to and reading a small set of keys (so keys are contended), recording
//! every operation with its invoke and complete times and its outcome.
//!
//! ```text
//!  client 0..N (a thread each) ── key: uniform over `keys`; write c<id>-<seq> or read
//!     │ paced at `rate` operations a second, stops at the deadline, the stop flag or
//!     │ `max_ops`
//!     ▼
//!  Kv: ClusterClient (routes by the ring, follows redirects)
//!      │ or a plain memcached connection to `kvlab proxy --cluster`
//!      ▼
//!  Vec<Op> per thread ── merged by the runner into the history
//! ```
//!
//! Outcomes: a request that could not be sent (no connection) failed; one the server
//! refused (`NOT_STORED`) failed; any other error after sending (timeout, closed
//! connection, an error reply: a proxy's `SERVER_ERROR` may come after a backend applied
//! the write) is unknown. A connection that erred is dropped and made anew for the next
//! operation.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvlab_client::{Client, ClusterClient, ConnError};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::history::{Clock, Op, OpKind, Outcome};

/// Where the clients send their requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Cluster-aware clients, seeded with these nodes.
    Cluster(Vec<SocketAddr>),
    /// Plain memcached clients through this proxy (`kvlab proxy --cluster`).
    Proxy(SocketAddr),
}

/// What the clients do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Workload {
    /// Client threads.
    pub clients: u32,
    /// Keys `fk:0` … `fk:<keys-1>`.
    pub keys: u32,
    /// Share of writes among operations (the rest are reads).
    pub write_share: f64,
    /// Operations a second per client (at most).
    pub rate: u32,
    /// Operations per client (at most).
    pub max_ops: u64,
    /// Socket timeout of one request (connect, send, receive).
    pub timeout: Duration,
}

impl Default for Workload {
    /// 4 clients over 200 keys, half writes, 250 operations a second each, 1 s timeouts.
    fn default() -> Workload {
        Workload {
            clients: 4,
            keys: 200,
            write_share: 0.5,
            rate: 250,
            max_ops: 1_000_000,
            timeout: Duration::from_secs(1),
        }
    }
}

/// The name of key `i`.
pub fn key_name(i: u32) -> String {
    format!("fk:{i}")
}

/// The value client `client` writes in its `seq`-th operation: unique in the run.
pub fn value_name(client: u32, seq: u64) -> String {
    format!("c{client}-{seq}")
}

/// One client's connection, made on first use and again after an error.
pub struct Kv {
    target: Target,
    timeout: Duration,
    cluster: Option<ClusterClient>,
    plain: Option<Client>,
}

/// What one request came to.
struct Answer {
    outcome: Outcome,
    value: Option<String>,
    error: Option<String>,
}

impl Kv {
    /// A client for `target` with per-request `timeout` (not connected yet).
    pub fn new(target: Target, timeout: Duration) -> Kv {
        Kv {
            target,
            timeout,
            cluster: None,
            plain: None,
        }
    }

    /// Connects if not connected; `Err`: nothing could be sent.
    fn connect(&mut self) -> Result<(), String> {
        match &self.target {
            Target::Cluster(seeds) if self.cluster.is_none() => {
                let c = ClusterClient::connect(seeds, self.timeout).map_err(|e| e.to_string())?;
                self.cluster = Some(c);
            }
            Target::Proxy(addr) if self.plain.is_none() => {
                let c = Client::connect(*addr, self.timeout).map_err(|e| e.to_string())?;
                self.plain = Some(c);
            }
            _ => {}
        }
        Ok(())
    }

    fn write(&mut self, key: &str, value: &str) -> Answer {
        let not_sent = |error: String| Answer {
            outcome: Outcome::Failed,
            value: Some(value.to_string()),
            error: Some(error),
        };
        if let Err(e) = self.connect() {
            return not_sent(e);
        }
        let r = match (&mut self.cluster, &mut self.plain) {
            (Some(c), _) => c.set(key.as_bytes(), value.as_bytes()),
            (_, Some(c)) => c.set(key.as_bytes(), value.as_bytes()),
            _ => return not_sent("not connected".into()),
        };
        match r {
            Ok(true) => Answer {
                outcome: Outcome::Ok,
                value: Some(value.to_string()),
                error: None,
            },
            Ok(false) => Answer {
                outcome: Outcome::Failed,
                value: Some(value.to_string()),
                error: Some("NOT_STORED".into()),
            },
            Err(e) => {
                self.drop_conn(&e);
                Answer {
                    outcome: Outcome::Unknown,
                    value: Some(value.to_string()),
                    error: Some(readable(&e)),
                }
            }
        }
    }

    fn read(&mut self, key: &str) -> Answer {
        if let Err(e) = self.connect() {
            return failed(e);
        }
        let r = match (&mut self.cluster, &mut self.plain) {
            (Some(c), _) => c.get(key.as_bytes()),
            (_, Some(c)) => c.get(key.as_bytes()),
            _ => return failed("not connected".into()),
        };
        match r {
            Ok(v) => Answer {
                outcome: Outcome::Ok,
                value: v.map(|v| String::from_utf8_lossy(&v).into_owned()),
                error: None,
            },
            Err(e) => {
                self.drop_conn(&e);
                Answer {
                    outcome: Outcome::Unknown,
                    value: None,
                    error: Some(readable(&e)),
                }
            }
        }
    }

    /// After an error the connection's state is unknown (a reply may still come): a new
    /// one is made for the next request. A cluster client keeps its connections to other
    /// nodes; it is made anew only when it could not even reach a node.
    fn drop_conn(&mut self, e: &ConnError) {
        self.plain = None;
        if matches!(e, ConnError::Io(_) | ConnError::Closed) {
            self.cluster = None;
        }
    }

    /// Reads `key` once, recording the operation (a final read when `final_read`).
    pub fn recorded_read(&mut self, client: u32, key: &str, clock: &Clock, final_read: bool) -> Op {
        let invoke_ns = clock.now_ns();
        let a = self.read(key);
        op(client, key, OpKind::Read, a, invoke_ns, clock, final_read)
    }
}

/// An error as text, with a reply's bytes (`ServerError([98, 97, …])`, as the client
/// shows an unexpected reply) written as the text they are.
fn readable(e: &ConnError) -> String {
    let text = e.to_string();
    let (Some(open), Some(close)) = (text.find("(["), text.find("])")) else {
        return text;
    };
    if close < open {
        return text;
    }
    let bytes: Option<Vec<u8>> = text[open + 2..close]
        .split(',')
        .map(|n| n.trim().parse().ok())
        .collect();
    match bytes {
        Some(b) => format!(
            "{}({:?}){}",
            &text[..open],
            String::from_utf8_lossy(&b),
            &text[close + 2..]
        ),
        None => text,
    }
}

fn failed(error: String) -> Answer {
    Answer {
        outcome: Outcome::Failed,
        value: None,
        error: Some(error),
    }
}

fn op(
    client: u32,
    key: &str,
    kind: OpKind,
    a: Answer,
    invoke_ns: u64,
    clock: &Clock,
    final_read: bool,
) -> Op {
    Op {
        client,
        key: key.to_string(),
        kind,
        value: a.value,
        invoke_ns,
        complete_ns: clock.now_ns(),
        outcome: a.outcome,
        final_read,
        error: a.error,
    }
}

/// Runs client `id` until `deadline`, `stop` or `w.max_ops`, recording its operations in
/// `log`. `seed` fixes its choice of keys and of reads and writes.
///
/// An operation enters the log before its request is sent, as `unknown` and never
/// completing, and is completed there when its answer comes: a client stuck in a request
/// when the run ends still shows that request (a write that may yet take effect).
#[allow(clippy::too_many_arguments)]
pub fn run_client(
    id: u32,
    target: Target,
    w: &Workload,
    clock: Clock,
    seed: u64,
    stop: &AtomicBool,
    deadline: Instant,
    log: &Mutex<Vec<Op>>,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (u64::from(id) << 32) ^ 0x6661_756c_7473);
    let mut kv = Kv::new(target, w.timeout);
    let interval = Duration::from_secs_f64(1.0 / f64::from(w.rate.max(1)));
    let start = Instant::now();
    for seq in 0..w.max_ops {
        // Pacing: the next operation is due `seq` intervals after the start; a client that
        // fell behind (a slow answer) goes on at once rather than bursting to catch up.
        let due = start + interval.mul_f64(seq as f64);
        let now = Instant::now();
        if due > now {
            std::thread::sleep((due - now).min(deadline.saturating_duration_since(now)));
        }
        if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
            break;
        }
        let key = key_name(rng.gen_range(0..w.keys.max(1)));
        let write = rng.gen_bool(w.write_share.clamp(0.0, 1.0));
        let kind = if write { OpKind::Write } else { OpKind::Read };
        let value = write.then(|| value_name(id, seq));
        let invoke_ns = clock.now_ns();
        log.lock().push(Op {
            client: id,
            key: key.clone(),
            kind,
            value: value.clone(),
            invoke_ns,
            complete_ns: u64::MAX,
            outcome: Outcome::Unknown,
            final_read: false,
            error: Some(IN_FLIGHT.into()),
        });
        let a = match &value {
            Some(v) => kv.write(&key, v),
            None => kv.read(&key),
        };
        let done = op(id, &key, kind, a, invoke_ns, &clock, false);
        if let Some(last) = log.lock().last_mut() {
            *last = done;
        }
    }
}

/// The error of an operation whose answer had not come when the run ended.
pub const IN_FLIGHT: &str = "still in flight when the run ended";

/// Reads every key once the run is over (retrying a read that did not answer, at most
/// `tries` times, after a pause that doubles from 100 ms to 1 s: a proxy may still hold a
/// backend it could not reach ejected until its prober finds it again), within `budget`;
/// every attempt is recorded as a final read of client `id`.
pub fn final_reads(
    id: u32,
    target: Target,
    w: &Workload,
    clock: &Clock,
    tries: u32,
    budget: Duration,
) -> Vec<Op> {
    let deadline = Instant::now() + budget;
    let mut kv = Kv::new(target, w.timeout);
    let mut ops = Vec::new();
    'keys: for i in 0..w.keys {
        let key = key_name(i);
        let mut pause = Duration::from_millis(100);
        for _ in 0..tries.max(1) {
            if Instant::now() >= deadline {
                break 'keys;
            }
            let o = kv.recorded_read(id, &key, clock, true);
            let ok = o.outcome == Outcome::Ok;
            ops.push(o);
            if ok {
                break;
            }
            // Giving the system time to take its node back: a bounded back-off.
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

    /// A scripted memcached: stores in a map, answers `get` and `set`.
    fn fake_server(limit: usize) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            drop(l); // later connections are refused
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            let mut map = std::collections::HashMap::new();
            let mut line = String::new();
            for _ in 0..limit {
                line.clear();
                if r.read_line(&mut line).unwrap() == 0 {
                    return;
                }
                let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
                match words[0].as_str() {
                    "set" => {
                        let mut data = String::new();
                        r.read_line(&mut data).unwrap();
                        map.insert(words[1].clone(), data.trim_end().to_string());
                        w.write_all(b"STORED\r\n").unwrap();
                    }
                    "get" => {
                        if let Some(v) = map.get(&words[1]) {
                            let reply =
                                format!("VALUE {} 0 {}\r\n{v}\r\nEND\r\n", words[1], v.len());
                            w.write_all(reply.as_bytes()).unwrap();
                        } else {
                            w.write_all(b"END\r\n").unwrap();
                        }
                    }
                    _ => w.write_all(b"ERROR\r\n").unwrap(),
                }
            }
            // Then reads without answering (the client's request times out) until the
            // client hangs up.
            while r.read_line(&mut line).unwrap_or(0) > 0 {}
        });
        addr
    }

    #[test]
    fn an_unexpected_replys_bytes_read_as_text() {
        let e = ConnError::Unexpected {
            reply: "ServerError([98, 97, 99, 107])".into(),
            kind: None,
        };
        assert_eq!(
            readable(&e),
            "unexpected reply ServerError(\"back\") to a None request"
        );
        assert_eq!(readable(&ConnError::Closed), ConnError::Closed.to_string());
    }

    #[test]
    fn a_client_records_what_it_did_and_a_silent_server_makes_outcomes_unknown() {
        let addr = fake_server(40);
        let w = Workload {
            clients: 1,
            keys: 3,
            rate: 10_000,
            max_ops: 45,
            timeout: Duration::from_millis(200),
            ..Workload::default()
        };
        let clock = Clock::start();
        let stop = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_secs(20);
        let log = Mutex::new(Vec::new());
        run_client(0, Target::Proxy(addr), &w, clock, 1, &stop, deadline, &log);
        let ops = log.into_inner();
        assert_eq!(ops.len(), 45);
        let ok = ops.iter().filter(|o| o.outcome == Outcome::Ok).count();
        assert_eq!(ok, 40, "the first 40 answered");
        // The 41st timed out (unknown); the next ones could not connect (failed).
        assert_eq!(ops[40].outcome, Outcome::Unknown, "{:?}", ops[40]);
        assert!(ops[41..].iter().all(|o| o.outcome == Outcome::Failed));
        for o in &ops {
            assert!(o.invoke_ns <= o.complete_ns);
            if o.kind == OpKind::Write {
                assert!(o.value.as_deref().unwrap().starts_with("c0-"));
            }
        }
        let report = crate::check(&ops);
        assert_eq!(report.anomaly_count(), 0, "{:?}", report.anomalies);
    }
}
