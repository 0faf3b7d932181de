//! Distributed load: `kvlab bench agent` and the master's side of the link.
//!
//! The link is line-delimited JSON over TCP, one master at a time per agent:
//!
//! ```text
//!  master                                   agent
//!    ── {"type":"prepare", config, participant, participants} ──►  spawn T threads, connect
//!    ◄── {"type":"ready"} ────────────────────────────────────────  (or {"type":"error"})
//!    ── {"type":"start", start_unix_ns} ──────────────────────────►  all begin at that instant
//!    ◄── {"type":"msg", msg: Interval{…histograms…}} … ────────────  as intervals finish
//!    ◄── {"type":"msg", msg: Done{…}} ×T, then {"type":"finished"}
//! ```
//!
//! Every participant (the master and each agent) runs `threads × connections`; the total rate
//! is split evenly over all connections, so each agent sends its share. Histograms travel in
//! HdrHistogram's V2 format, so the master's merge is exact. The start instant is wall-clock
//! time: agents on other machines need synchronised clocks (NTP), as with mcperf.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::{mono_ns, wall_ns};
use crate::config::{BenchConfig, Stop};
use crate::generator::{Msg, Phase};
use crate::local::{spawn_threads, wait_ready};
use crate::BenchError;

/// Master → agent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ToAgent {
    Prepare {
        config: Box<BenchConfig>,
        participant: u32,
        participants: u32,
    },
    Start {
        start_unix_ns: u64,
    },
    /// End the run early (the master was interrupted): as [`crate::config::Stop`].
    Stop,
}

/// Agent → master.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum FromAgent {
    Ready,
    Msg { msg: Msg },
    Finished,
    Error { message: String },
}

fn send_line<T: Serialize>(w: &mut impl Write, m: &T) -> Result<(), BenchError> {
    let mut line = serde_json::to_vec(m).map_err(|e| BenchError::Internal(e.to_string()))?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()?;
    Ok(())
}

fn read_line<T: for<'de> Deserialize<'de>>(r: &mut impl BufRead) -> Result<T, BenchError> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(BenchError::Agent("connection closed".into()));
    }
    serde_json::from_str(&line).map_err(|e| BenchError::Agent(format!("bad message: {e}")))
}

/// Runs an agent on `listen`: serves masters one after another (`once`: just one).
/// `on_listen` receives the bound address (useful with port 0).
pub fn serve(
    listen: SocketAddr,
    once: bool,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<(), BenchError> {
    let l = TcpListener::bind(listen)?;
    on_listen(l.local_addr()?);
    loop {
        let (stream, _) = l.accept()?;
        let r = serve_master(stream);
        if once {
            return r;
        }
        if let Err(e) = r {
            eprintln!("kvlab bench agent: master session failed: {e}");
        }
    }
}

fn serve_master(stream: TcpStream) -> Result<(), BenchError> {
    stream.set_nodelay(true)?;
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    let ToAgent::Prepare {
        config,
        participant,
        participants,
    } = read_line(&mut r)?
    else {
        return Err(BenchError::Agent("expected prepare".into()));
    };
    let mut cfg = *config;
    // A data set is named by its path: the agent reads its own copy there.
    if let Err(e) = cfg.workload.attach_data().and_then(|()| cfg.validate()) {
        send_line(
            &mut w,
            &FromAgent::Error {
                message: e.to_string(),
            },
        )?;
        return Err(e);
    }
    let (tx, rx) = channel();
    // Set when the session's run is over, however it ends: the watcher of the master
    // then returns, and the scope can end.
    let finished = &AtomicBool::new(false);
    std::thread::scope(|s| -> Result<(), BenchError> {
        let _finish = SetOnDrop(finished);
        let starts = match spawn_threads(s, &cfg, participant, participants, Phase::Run, &tx)
            .and_then(|st| wait_ready(&rx, cfg.threads).map(|_| st))
        {
            Ok(st) => st,
            Err(e) => {
                send_line(
                    &mut w,
                    &FromAgent::Error {
                        message: e.to_string(),
                    },
                )?;
                return Err(e);
            }
        };
        drop(tx);
        send_line(&mut w, &FromAgent::Ready)?;
        let start = match read_line(&mut r)? {
            ToAgent::Start { start_unix_ns } => {
                // Convert the wall-clock instant into this machine's monotonic clock.
                let (wall, mono) = (wall_ns(), mono_ns());
                mono.saturating_add(start_unix_ns.saturating_sub(wall))
            }
            ToAgent::Prepare { .. } | ToAgent::Stop => {
                for st in &starts {
                    let _ = st.send(None);
                }
                return Err(BenchError::Agent("expected start".into()));
            }
        };
        for st in &starts {
            let _ = st.send(Some(start));
        }
        // The master may end the run early; a master that went away (its connection
        // closed) ends it too, so that an agent never runs on for no one.
        let stop = cfg.stop.clone();
        s.spawn(move || watch_master(r, &stop, finished));
        let mut done = 0;
        while done < cfg.threads {
            let Ok(msg) = rx.recv() else { break };
            match &msg {
                Msg::Done(_) | Msg::Failed(_) => done += 1,
                _ => {}
            }
            send_line(&mut w, &FromAgent::Msg { msg })?;
        }
        send_line(&mut w, &FromAgent::Finished)
    })
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Reads the master's messages during a run: `stop`, or the connection's end, raises
/// `stop`. Returns once the run has `finished` (looked at every second).
fn watch_master(mut r: BufReader<TcpStream>, stop: &Stop, finished: &AtomicBool) {
    let _ = r.get_ref().set_read_timeout(Some(Duration::from_secs(1)));
    while !finished.load(Ordering::Relaxed) {
        match read_line::<ToAgent>(&mut r) {
            Ok(ToAgent::Stop) => stop.raise(),
            Ok(_) => {}
            Err(BenchError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                stop.raise();
                return;
            }
        }
    }
}

/// The master's way to end an agent's run early ([`ToAgent::Stop`]).
pub struct AgentStop {
    addr: SocketAddr,
    w: TcpStream,
}

impl AgentStop {
    /// Tells the agent to end its run now (best effort: an agent that cannot be told is
    /// gone, and its link reports that).
    pub fn stop(&mut self) {
        if let Err(e) = send_line(&mut self.w, &ToAgent::Stop) {
            eprintln!("kvlab bench: cannot tell agent {} to stop: {e}", self.addr);
        }
    }
}

/// The master's link to one agent.
pub struct AgentLink {
    addr: SocketAddr,
    run_ns: u64,
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl AgentLink {
    /// Connects, sends the configuration and waits until the agent's threads are connected.
    pub fn prepare(
        addr: SocketAddr,
        cfg: &BenchConfig,
        participant: u32,
        participants: u32,
    ) -> Result<Self, BenchError> {
        let fail = |e: BenchError| BenchError::Agent(format!("agent {addr}: {e}"));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| fail(e.into()))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut w = stream.try_clone()?;
        let mut r = BufReader::new(stream);
        let msg = ToAgent::Prepare {
            config: Box::new(cfg.clone()),
            participant,
            participants,
        };
        send_line(&mut w, &msg).map_err(fail)?;
        match read_line(&mut r).map_err(fail)? {
            FromAgent::Ready => Ok(AgentLink {
                addr,
                run_ns: cfg.warmup_ns() + cfg.interval_ns(),
                w,
                r,
            }),
            FromAgent::Error { message } => Err(fail(BenchError::Agent(message))),
            other => Err(fail(BenchError::Agent(format!("unexpected {other:?}")))),
        }
    }

    /// Sends the start instant and relays the agent's messages to `tx` from a scoped thread.
    pub fn start<'s, 'e>(
        mut self,
        start_unix_ns: u64,
        tx: Sender<Msg>,
        s: &'s std::thread::Scope<'s, 'e>,
    ) -> Result<AgentStop, BenchError> {
        send_line(&mut self.w, &ToAgent::Start { start_unix_ns })?;
        let stop = AgentStop {
            addr: self.addr,
            w: self.w.try_clone()?,
        };
        // An agent reports at every interval boundary; one silent for the longest interval
        // (warm-up or interval) plus a minute has failed, and the read error ends the run.
        let limit = Duration::from_nanos(self.run_ns) + Duration::from_secs(60);
        let _ = self.r.get_ref().set_read_timeout(Some(limit));
        s.spawn(move || loop {
            match read_line::<FromAgent>(&mut self.r) {
                Ok(FromAgent::Msg { msg }) => {
                    if tx.send(msg).is_err() {
                        return;
                    }
                }
                Ok(FromAgent::Finished) => return,
                Ok(FromAgent::Error { message }) => {
                    let _ = tx.send(Msg::Failed(format!("agent {}: {message}", self.addr)));
                    return;
                }
                Ok(FromAgent::Ready) => {}
                Err(e) => {
                    let _ = tx.send(Msg::Failed(format!("agent {}: {e}", self.addr)));
                    return;
                }
            }
        });
        Ok(stop)
    }
}
