//! One participant's generator threads: spawn them (each an [`crate::generator`] event loop)
//! and wait until all have connected. The master (`run`) and an agent (`agent`) both start
//! their threads here, so neither imports the other for it.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Duration;

use crate::config::BenchConfig;
use crate::generator::{thread_main, Msg, Phase, ThreadCtx};
use crate::BenchError;

/// Spawns `cfg.threads` generator threads of participant `participant`; returns their
/// start-time senders.
pub(crate) fn spawn_threads<'s, 'e: 's>(
    s: &'s std::thread::Scope<'s, 'e>,
    cfg: &'e BenchConfig,
    participant: u32,
    participants: u32,
    phase: Phase,
    tx: &Sender<Msg>,
) -> Result<Vec<Sender<Option<u64>>>, BenchError> {
    let threads = cfg.threads as u64;
    let conns = cfg.connections as u64;
    let mut starts = Vec::new();
    for t in 0..cfg.threads {
        let global = u64::from(participant) * threads + t as u64;
        let ctx = ThreadCtx {
            participant,
            thread: t as u32,
            global_thread: global,
            total_threads: u64::from(participants) * threads,
            conn_offset: global * conns,
            total_conns: u64::from(participants) * threads * conns,
        };
        let (stx, srx) = channel();
        let tx = tx.clone();
        std::thread::Builder::new()
            .name(format!("kvlab-gen-{t}"))
            .spawn_scoped(s, move || thread_main(cfg, ctx, phase, srx, tx))
            .map_err(BenchError::Io)?;
        starts.push(stx);
    }
    Ok(starts)
}

pub(crate) fn wait_ready(rx: &Receiver<Msg>, n: usize) -> Result<(), BenchError> {
    let mut ready = 0;
    while ready < n {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Msg::Ready) => ready += 1,
            Ok(Msg::Failed(e)) => return Err(BenchError::Run(e)),
            Ok(_) => {}
            Err(_) => return Err(BenchError::Run("threads not ready after 30 s".into())),
        }
    }
    Ok(())
}
