//! The storage ring's clients the original's way, wherever they run: `clients` threads,
//! each sending `ops` requests of random messages one at a time (PUT, or GET verified byte
//! for byte), routed by the client ring — a kvlab cluster's, fetched from its nodes, or a
//! fixed ring over plain memcached servers, by the same consistent hashing. The lab runs
//! them as threads of its own process, or on a client host as `kvlab lab ring-clients`
//! ([`ClientsJob`]), which prints (or writes) a [`ClientsOutcome`] the lab collects.
//!
//! ```text
//! ClientsJob ─► Messages (the data set, or the synthetic maildir written on the host first:
//!   the same n and seed write the same bytes; `digest` proves it) ─► each thread connects
//!   ─► all wait for the start (a barrier; on a host, also the instant the lab set on that
//!   host's clock) ─► each sends its `ops`, its ops/s over its own time ─► ClientsOutcome
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use kvlab_bench::data::{DataKey, DataSet, DataSpec, DEFAULT_MAX_ITEM_SIZE};
use kvlab_client::ClusterClient;
use serde::{Deserialize, Serialize};

/// How long a client waits for one answer.
pub(super) const TIMEOUT: Duration = Duration::from_secs(5);
/// The seed of the synthetic maildir's bytes.
const SYNTHETIC_SEED: u64 = 7;

/// The messages: the data set's first `n` records.
pub(super) struct Messages {
    pub set: Arc<DataSet>,
    pub n: u64,
    pub path: PathBuf,
}

impl Messages {
    /// The data set at `path` (a synthetic maildir of `n` messages written there first
    /// when `synthetic` and it is absent); its first `n` records.
    pub fn load(path: &Path, n: usize, synthetic: bool) -> anyhow::Result<Messages> {
        if synthetic && !path.exists() {
            kvlab_bench::maildir::write_synthetic_maildir(path, n, SYNTHETIC_SEED)
                .with_context(|| format!("writing a synthetic maildir in {}", path.display()))?;
        }
        let set = DataSet::shared(&DataSpec {
            path: path.to_path_buf(),
            key: DataKey::Path,
            max_item_size: DEFAULT_MAX_ITEM_SIZE,
            base64_keys: false,
        })?;
        let n = (n as u64).min(set.len() as u64);
        Ok(Messages {
            set,
            n,
            path: path.to_path_buf(),
        })
    }

    pub fn key(&self, i: u64) -> &[u8] {
        self.set.key(i)
    }

    pub fn value(&self, i: u64) -> &[u8] {
        self.set.value(i)
    }

    /// The messages' fingerprint: their count and an FNV-1a hash of every key and value in
    /// order — equal on two machines when they hold the same messages.
    pub fn digest(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes.iter().chain(&(bytes.len() as u64).to_le_bytes()) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        for i in 0..self.n {
            eat(self.key(i));
            eat(self.value(i));
        }
        format!("{} messages, fnv1a {h:016x}", self.n)
    }
}

/// Where the clients' requests go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Route {
    /// A kvlab cluster: its ring fetched from these nodes, redirects followed.
    Cluster(Vec<SocketAddr>),
    /// Plain servers (memcached) behind a fixed client ring of them.
    Fixed(Vec<SocketAddr>),
}

impl Route {
    pub(super) fn connect(&self) -> anyhow::Result<ClusterClient> {
        Ok(match self {
            Route::Cluster(seeds) => ClusterClient::connect(seeds, TIMEOUT)?,
            Route::Fixed(nodes) => ClusterClient::fixed(nodes, kvlab_ring::DEFAULT_VNODES, TIMEOUT),
        })
    }
}

/// One measured run of clients, as `kvlab lab ring-clients` is given it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientsJob {
    /// Where the requests go.
    pub route: Route,
    /// The data set (on the host that runs the clients).
    pub data: PathBuf,
    /// Write a synthetic maildir of `messages` at `data` first when it is absent.
    pub synthetic: bool,
    /// Messages used: the data set's first.
    pub messages: usize,
    /// Client threads.
    pub clients: usize,
    /// The first thread's index among all the run's clients (every thread's choice of
    /// messages follows from the seed and its index, wherever it runs).
    pub first: usize,
    /// Requests each sends.
    pub ops: usize,
    /// PUTs (else GETs).
    pub put: bool,
    /// The run's seed.
    pub seed: u64,
    /// When to start, ns since the Unix epoch on this host's clock (none: once connected).
    pub start_at_ns: Option<u64>,
}

/// What one run of clients measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientsOutcome {
    /// Each client's ops/s (its requests over its own time).
    pub per_client: Vec<f64>,
    /// Failed requests, and GETs that missed or returned other bytes.
    pub errors: u64,
    /// Seconds from the start to the last client's end.
    pub wall_s: f64,
    /// CPU seconds this process used over that time.
    pub cpu_s: f64,
    /// Seconds the start came after the instant it was set for (0: on time).
    pub late_s: f64,
    /// The messages' [`Messages::digest`].
    pub digest: String,
}

/// A pseudo-random number generator (SplitMix64) for the clients' choice of messages.
pub(super) fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The fingerprint of the messages at `path` ([`Messages::digest`]; the synthetic maildir
/// written there first when `synthetic` and it is absent).
pub fn digest(path: &Path, n: usize, synthetic: bool) -> anyhow::Result<String> {
    Ok(Messages::load(path, n, synthetic)?.digest())
}

/// Runs `job` here (loading its messages); see the module docs.
pub fn run_job(job: &ClientsJob) -> anyhow::Result<ClientsOutcome> {
    let msgs = Messages::load(&job.data, job.messages, job.synthetic)?;
    let start_at = job
        .start_at_ns
        .map(|ns| UNIX_EPOCH + Duration::from_nanos(ns));
    let mut out = run(&msgs, job, start_at, &mut || {})?;
    out.digest = msgs.digest();
    Ok(out)
}

/// Runs `job`'s clients against `msgs`: every thread connected, then (at `start_at`, when
/// set) `at_start` and the requests.
pub(super) fn run(
    msgs: &Messages,
    job: &ClientsJob,
    start_at: Option<SystemTime>,
    at_start: &mut dyn FnMut(),
) -> anyhow::Result<ClientsOutcome> {
    let gate = Barrier::new(job.clients + 1);
    let mut started = Instant::now();
    let mut cpu0 = 0.0;
    let mut late_s = 0.0;
    let (ops, put, seed) = (job.ops, job.put, job.seed);
    let results: Vec<anyhow::Result<(f64, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..job.clients)
            .map(|t| {
                let (route, gate) = (&job.route, &gate);
                let t = (job.first + t) as u64;
                s.spawn(move || {
                    let client = route.connect();
                    gate.wait();
                    let mut c = client?;
                    let mut rng = seed ^ (t + 1).wrapping_mul(0xA076_1D64_78BD_642F);
                    let mut errors = 0;
                    let t0 = Instant::now();
                    for _ in 0..ops {
                        let i = next(&mut rng) % msgs.n;
                        let ok = if put {
                            matches!(c.set(msgs.key(i), msgs.value(i)), Ok(true))
                        } else {
                            matches!(c.get(msgs.key(i)), Ok(Some(v)) if v == msgs.value(i))
                        };
                        errors += u64::from(!ok);
                    }
                    Ok((ops as f64 / t0.elapsed().as_secs_f64().max(1e-9), errors))
                })
            })
            .collect();
        if let Some(at) = start_at {
            match at.duration_since(SystemTime::now()) {
                // Waiting for the instant the lab set: the clients on every host start
                // together.
                Ok(wait) => std::thread::sleep(wait),
                Err(e) => late_s = e.duration().as_secs_f64(),
            }
        }
        at_start();
        cpu0 = kvlab_procfs::own_cpu_s();
        started = Instant::now();
        gate.wait();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client panicked")))
            })
            .collect()
    });
    let mut out = ClientsOutcome {
        wall_s: started.elapsed().as_secs_f64(),
        cpu_s: (kvlab_procfs::own_cpu_s() - cpu0).max(0.0),
        late_s,
        ..ClientsOutcome::default()
    };
    for r in results {
        let (rate, errors) = r?;
        out.per_client.push(rate);
        out.errors += errors;
    }
    Ok(out)
}
