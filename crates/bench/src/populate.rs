//! `kvlab populate`: fill a server with a key space, as `kvlab bench` names it, and check a
//! sample.
//!
//! The fill is the bench's load phase (every connection sets its contiguous share of the key
//! space, pipelined, each reply counted) with verifiable values, so a following
//! `kvlab bench --noload` hits and `--verify` accepts what it finds. Counting replies rather
//! than sending `noreply` means a set the server refused is reported, never silently lost.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvlab_client::Client;
use serde::{Deserialize, Serialize};

use crate::config::Protocol;
use crate::load::{Closed, Load, Mode, Options};
use crate::workload::{Mix, Workload};
use crate::BenchError;

/// `kvlab populate`'s own defaults, where a fill differs from a measured run: deeper
/// pipelines (a fill wants throughput, not latency) and a longer request timeout.
pub fn defaults() -> Options {
    Options {
        depth: Some(128),
        timeout_ms: Some(10_000),
        ..Options::default()
    }
}

/// The fill that `opts` describes, with [`defaults`] for what it leaves out: closed loop over
/// memcached's protocol, sets only, verifiable values ([`fill_workload`]), the load phase on.
pub fn fill_load(opts: &Options) -> Result<Load, BenchError> {
    let mut load = opts.clone().or(defaults()).to_load()?;
    if load.is_open() {
        return Err(BenchError::Spec(
            "a fill runs in closed loop: leave out qps, scan, qps_list, qps_file and qps_min/qps_max"
                .into(),
        ));
    }
    if load.protocol != Protocol::Memcached {
        return Err(BenchError::Spec(format!(
            "a fill speaks memcached's text protocol (protocol = \"memcached\"), not \"{}\": \
             meta and http are for measured runs (kvlab bench), whose fills use them too",
            load.protocol.name()
        )));
    }
    load.workload = fill_workload(&load.workload);
    load.fill = Some(true);
    Ok(load)
}

/// What a fill did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PopulateReport {
    /// Keys set.
    pub keys: u64,
    /// Wall time, s.
    pub seconds: f64,
    /// Keys per second.
    pub keys_per_s: f64,
}

/// What a sample check found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleReport {
    /// Keys read.
    pub checked: u64,
    /// Found with their verifiable value.
    pub correct: u64,
    /// Not found.
    pub missing: u64,
    /// Found with a wrong value.
    pub wrong: u64,
}

/// `wl` made a fill: sets only, verifiable values.
pub fn fill_workload(wl: &Workload) -> Workload {
    Workload {
        mix: Mix {
            get: 0,
            set: 1,
            delete: 0,
        },
        verify: true,
        multiget: 1,
        ..wl.clone()
    }
}

/// Sets every key of `wl` (indices `0..wl.keys`) on `target` over the memcached protocol from
/// `threads` × `connections` connections with `depth` sets in flight on each (the other
/// settings are [`fill_load`]'s).
pub fn populate(
    target: SocketAddr,
    wl: &Workload,
    threads: usize,
    connections: usize,
    depth: usize,
) -> Result<PopulateReport, BenchError> {
    let mut load = fill_load(&Options::default())?;
    load.workload = fill_workload(wl);
    load.threads = threads;
    load.connections = connections;
    load.mode = Mode::Closed(Closed {
        depth,
        ..Closed::default()
    });
    populate_load(target, &load)
}

/// Runs the fill `load` (from [`fill_load`]) against `target`: its load phase only.
pub fn populate_load(target: SocketAddr, load: &Load) -> Result<PopulateReport, BenchError> {
    let cfg = load.config(target)?;
    let t0 = Instant::now();
    let c = crate::run::load_phase(&cfg)?;
    let seconds = t0.elapsed().as_secs_f64();
    Ok(PopulateReport {
        keys: c.completed,
        seconds,
        keys_per_s: c.completed as f64 / seconds.max(1e-9),
    })
}

/// Reads `n` keys spread evenly over the key space (first and last included) and checks each
/// value.
pub fn verify_sample(
    target: SocketAddr,
    wl: &Workload,
    n: u64,
) -> Result<SampleReport, BenchError> {
    let n = n.min(wl.keys);
    let mut client = Client::connect(target, Duration::from_secs(5))
        .map_err(|e| BenchError::Connect(target.to_string(), e.to_string()))?;
    let wl = fill_workload(wl);
    let mut buf = [0u8; 256];
    let mut r = SampleReport::default();
    for i in 0..n {
        let k = if n == 1 {
            0
        } else {
            (i as u128 * (wl.keys - 1) as u128 / (n - 1) as u128) as u64
        };
        let key = wl.key(k, &mut buf);
        let got = client
            .get(key)
            .map_err(|e| BenchError::Run(format!("verify get: {e}")))?;
        r.checked += 1;
        match got {
            Some(v) if wl.check_value(key, &v) => r.correct += 1,
            Some(_) => r.wrong += 1,
            None => r.missing += 1,
        }
    }
    Ok(r)
}
