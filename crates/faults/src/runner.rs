//! One run, end to end, and a soak of many:
//!
//! ```text
//!  schedule(seed) ─► System::start (topology store, create, nodes, proxy)
//!     ─► clients (N threads) ┐ for the run's duration
//!     ─► nemesis (2 lanes)   ┘
//!     ─► stop the clients ─► the nemesis ends its last fault ─► heal (continue, restart,
//!        resume; wait until at rest) ─► read every key ─► check ─► write the files
//!     ─► stop everything (always)
//! ```
//!
//! Every step is bounded: a client stuck in a request, a fault that does not end, a cluster
//! that does not come to rest, a final read that does not answer — each is reported in the
//! run's `error` (and the run goes on to check what it has) rather than hanging. The run's
//! directory gets `schedule.json`, `history.jsonl`, `anomalies.json` (the checker's
//! report), `timeline.txt`, `summary.json`, and the logs of every node, coordinator and etcd
//! member.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use kvlab_cluster::CopyWritePolicy;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::checker::{self, Report};
use crate::clients::{self, Target, Workload, IN_FLIGHT};
use crate::history::{Clock, History, Op};
use crate::nemesis::Nemesis;
use crate::schedule::{Capabilities, Mix, RingBounds, Schedule};
use crate::system::{Durable, System, SystemConfig, TopologyKind};

/// How clients reach the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientKind {
    /// Cluster-aware (`ClusterClient`: routes by the ring, follows redirects).
    Cluster,
    /// Plain memcached text protocol through `kvlab proxy --cluster`.
    Proxy,
    /// Plain memcached text protocol through `kvlab proxy` over a pool of plain servers
    /// (`--replicas` copies of every key), no cluster.
    Pool,
}

/// One run's settings.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Draws the schedule and the clients' choices.
    pub seed: u64,
    /// How long clients and nemesis run.
    pub duration: Duration,
    /// Nodes at the start.
    pub nodes: usize,
    /// Copies of every key.
    pub replicas: u32,
    /// When the cluster acknowledges a write with copies; under `owner` the checker sets
    /// aside the acknowledged writes nobody read ([`checker::owner_view`]).
    pub write_policy: CopyWritePolicy,
    /// Where the topology lives.
    pub topology: TopologyKind,
    /// How clients reach the cluster.
    pub client: ClientKind,
    /// The fault kinds to draw (`None`: [`Mix::default_for`] the run's capabilities).
    pub mix: Option<Mix>,
    /// What the clients do.
    pub workload: Workload,
    /// The kvlab binary (nodes, proxy and coordinators are its subcommands).
    pub exe: PathBuf,
    /// This run's directory (emptied first).
    pub dir: PathBuf,
    /// Flags for every node's `kvlab server`.
    pub server_args: Vec<String>,
    /// Run every node, etcd member and the proxy in a network namespace of its own (root;
    /// see [`crate::netns`]), which lets the nemesis partition and delay them.
    pub netns: bool,
    /// Durable nodes ([`Durable`]): each keeps its keys in a data directory of its own
    /// under `dir/data/`, opened again when it is restarted after `kill -9`.
    pub durable: Option<Durable>,
    /// Set to end the run early (a signal): clients and nemesis stop, the heal and the
    /// final reads are skipped, what was recorded is checked, everything is stopped.
    pub interrupt: Arc<AtomicBool>,
}

impl RunConfig {
    /// What this run offers the nemesis.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            replicas: self.replicas,
            etcd: matches!(self.topology, TopologyKind::Etcd { .. }),
            netns: self.netns,
            pool: self.client == ClientKind::Pool,
            durable: self.durable.is_some() && Durable::syncs(&self.server_args),
        }
    }
}

/// One run's result, as `summary.json` holds it and one line prints it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunSummary {
    /// The seed.
    pub seed: u64,
    /// Faults scheduled, by kind (`pause=3 add=1`).
    pub mix: String,
    /// Nemesis actions recorded.
    pub actions: u64,
    /// Of which did not do what they meant to.
    pub actions_failed: u64,
    /// Of which were skipped (no fitting target then).
    pub actions_skipped: u64,
    /// Operations checked.
    pub ops: u64,
    /// Acknowledged.
    pub ok: u64,
    /// Certainly not applied.
    pub failed: u64,
    /// Of unknown effect.
    pub unknown: u64,
    /// All anomalies ([`Report::anomaly_count`]).
    pub anomalies: u64,
    /// Lost writes.
    pub lost_writes: u64,
    /// Stale reads.
    pub stale_reads: u64,
    /// Reads of values never written.
    pub never_written: u64,
    /// Keys found not linearizable by the search alone.
    pub not_linearizable: u64,
    /// Keys the search skipped.
    pub search_skipped: u64,
    /// Keys with an acknowledged write and no final read.
    pub unverified_keys: u64,
    /// Write policy `owner`: acknowledged writes nobody read, not checked.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub set_aside: u64,
    /// Why the run did not go as planned (it still checked what it had).
    pub error: Option<String>,
    /// Its directory.
    pub dir: String,
    /// Its wall-clock length, seconds.
    pub seconds: f64,
}

impl RunSummary {
    /// Whether nothing was found and nothing went wrong.
    pub fn clean(&self) -> bool {
        self.anomalies == 0 && self.error.is_none() && self.unverified_keys == 0
    }

    /// The run's verdict as an exit status ([`crate::checker::verdict_code`]): a run whose
    /// final reads did not cover every key it wrote fails, as one that went wrong does.
    pub fn exit_code(&self) -> i32 {
        crate::checker::verdict_code(self.anomalies, self.unverified_keys, self.error.is_some())
    }

    /// One line for a human.
    pub fn line(&self) -> String {
        let mut s = format!(
            "seed {}: faults {} ({} actions, {} failed, {} skipped); ops {} (ok {}, failed {}, \
             unknown {}); anomalies {} (lost {}, stale {}, never-written {}, \
             non-linearizable keys {})",
            self.seed,
            self.mix,
            self.actions,
            self.actions_failed,
            self.actions_skipped,
            self.ops,
            self.ok,
            self.failed,
            self.unknown,
            self.anomalies,
            self.lost_writes,
            self.stale_reads,
            self.never_written,
            self.not_linearizable
        );
        if self.unverified_keys > 0 {
            let _ = write!(
                s,
                "; {}",
                crate::checker::unverified_line(self.unverified_keys)
            );
        }
        if self.search_skipped > 0 {
            let _ = write!(s, "; {} keys too large to search", self.search_skipped);
        }
        if self.set_aside > 0 {
            let _ = write!(
                s,
                "; {} acknowledged writes nobody read set aside (write policy owner)",
                self.set_aside
            );
        }
        let _ = write!(s, "; {:.1} s", self.seconds);
        if let Some(e) = &self.error {
            let _ = write!(s, "; RUN FAILED: {e}");
        }
        s
    }
}

/// Several runs' verdict as one exit status: 1 when any run found anomalies; else 2 when
/// any went wrong or could not verify keys; else 0.
pub fn exit_code(runs: &[RunSummary]) -> i32 {
    runs.iter()
        .map(RunSummary::exit_code)
        .fold(0, |a, c| if a == 1 || c == 1 { 1 } else { a.max(c) })
}

/// A soak's table: one row per seed, then the totals.
pub fn table(runs: &[RunSummary]) -> String {
    let failed_runs = runs.iter().filter(|r| r.error.is_some()).count();
    let with_anomalies = runs.iter().filter(|r| r.anomalies > 0).count();
    let totals = format!("{} runs, {with_anomalies} with anomalies", runs.len());
    let w = runs
        .iter()
        .map(|r| r.mix.chars().count())
        .chain([totals.chars().count()])
        .max()
        .unwrap_or(0);
    let row = |seed: &str, mix: &str, r: &RunSummary, error: &str| {
        format!(
            "{seed:>6}  {mix:<w$}  {:>8} {:>7} {:>7} {:>5} {:>5} {:>5} {:>6} {:>9} {:>10}  {error}\n",
            r.ops,
            r.failed,
            r.unknown,
            r.lost_writes,
            r.stale_reads,
            r.never_written,
            r.not_linearizable,
            r.anomalies,
            r.unverified_keys,
        )
    };
    let mut out = format!(
        "{:>6}  {:<w$}  {:>8} {:>7} {:>7} {:>5} {:>5} {:>5} {:>6} {:>9} {:>10}  {}\n",
        "seed",
        "faults",
        "ops",
        "failed",
        "unknown",
        "lost",
        "stale",
        "never",
        "nonlin",
        "anomalies",
        "unverified",
        "error"
    );
    let mut total = RunSummary::default();
    for r in runs {
        out.push_str(&row(
            &r.seed.to_string(),
            &r.mix,
            r,
            r.error.as_deref().unwrap_or(""),
        ));
        total.ops += r.ops;
        total.failed += r.failed;
        total.unknown += r.unknown;
        total.lost_writes += r.lost_writes;
        total.stale_reads += r.stale_reads;
        total.never_written += r.never_written;
        total.not_linearizable += r.not_linearizable;
        total.anomalies += r.anomalies;
        total.unverified_keys += r.unverified_keys;
    }
    let failed = if failed_runs > 0 {
        format!("{failed_runs} runs failed")
    } else {
        String::new()
    };
    out.push_str(&row("total", &totals, &total, &failed));
    out
}

/// How long after the end clients may take to leave their last request.
const CLIENT_GRACE: Duration = Duration::from_secs(30);
/// How long after the end the nemesis may take to end its last fault (a coordinator may
/// run for its whole timeout, twice: a kill, then resume).
const NEMESIS_GRACE: Duration = Duration::from_secs(200);
/// How long the heal may take.
const HEAL_LIMIT: Duration = Duration::from_secs(150);
/// How long the final reads may take, all keys together.
const FINAL_READS_LIMIT: Duration = Duration::from_secs(60);

/// Runs one seed (see the module docs). Never panics on the system's failures: they are
/// the summary's `error`.
pub fn run(cfg: &RunConfig) -> RunSummary {
    let began = Instant::now();
    let mut summary = RunSummary {
        seed: cfg.seed,
        dir: cfg.dir.display().to_string(),
        ..RunSummary::default()
    };
    let mix = cfg
        .mix
        .clone()
        .unwrap_or_else(|| Mix::default_for(cfg.capabilities()));
    let ring = RingBounds::new(cfg.nodes, cfg.replicas);
    let schedule = Schedule::generate(cfg.seed, cfg.duration, &mix, ring);
    summary.mix = schedule.mix_text();
    let mut errors = Vec::new();
    // A port chosen free may be taken by another program before a node binds it: the
    // system is started again, from an empty directory, on other ports (a few times).
    let mut attempts = 0;
    let started = loop {
        attempts += 1;
        if let Err(e) = prepare_dir(&cfg.dir) {
            summary.error = Some(e);
            return summary;
        }
        if let Err(e) = write_json(&cfg.dir.join("schedule.json"), &schedule) {
            errors.push(e);
        }
        let started = System::start(SystemConfig {
            exe: cfg.exe.clone(),
            dir: cfg.dir.clone(),
            nodes: cfg.nodes,
            replicas: cfg.replicas,
            write_policy: cfg.write_policy,
            topology: cfg.topology,
            proxy: cfg.client != ClientKind::Cluster,
            pool: cfg.client == ClientKind::Pool,
            server_args: cfg.server_args.clone(),
            netns: cfg.netns,
            durable: cfg.durable,
        });
        match started {
            Err(e) if e.contains(crate::system::ADDRESS_TAKEN) && attempts < 3 => continue,
            other => break other,
        }
    };
    let sys = match started {
        Ok(s) => Arc::new(s),
        Err(e) => {
            summary.error = Some(format!("starting the cluster: {e}"));
            summary.seconds = began.elapsed().as_secs_f64();
            let _ = write_json(&cfg.dir.join("summary.json"), &summary);
            return summary;
        }
    };
    let (history, report) = drive(cfg, &sys, &schedule, &mut errors);
    sys.shutdown();

    if let Err(e) = write_outputs(&cfg.dir, &history, &report) {
        errors.push(e);
    }
    summary.actions = history.nemesis.len() as u64;
    let skipped = |e: &crate::NemesisEvent| {
        e.detail
            .as_deref()
            .is_some_and(|d| d.starts_with(crate::nemesis::SKIPPED))
    };
    summary.actions_skipped = history.nemesis.iter().filter(|e| skipped(e)).count() as u64;
    summary.actions_failed = history
        .nemesis
        .iter()
        .filter(|e| !e.ok && !skipped(e))
        .count() as u64;
    summary.ops = report.ops;
    summary.ok = report.ok;
    summary.failed = report.failed;
    summary.unknown = report.unknown;
    summary.anomalies = report.anomaly_count();
    summary.lost_writes = report.lost_writes;
    summary.stale_reads = report.stale_reads;
    summary.never_written = report.never_written;
    summary.not_linearizable = report.linearizability.not_linearizable.len() as u64;
    summary.search_skipped = report.linearizability.skipped.len() as u64;
    summary.unverified_keys = report.unverified_keys.len() as u64;
    summary.set_aside = report.set_aside;
    summary.error = (!errors.is_empty()).then(|| errors.join("; "));
    summary.seconds = began.elapsed().as_secs_f64();
    let _ = write_json(&cfg.dir.join("summary.json"), &summary);
    summary
}

/// Clients and nemesis for the duration, then heal, final reads and the check.
fn drive(
    cfg: &RunConfig,
    sys: &Arc<System>,
    schedule: &Schedule,
    errors: &mut Vec<String>,
) -> (History, Report) {
    let target = match cfg.client {
        ClientKind::Cluster => Target::Cluster(sys.seeds()),
        ClientKind::Proxy | ClientKind::Pool => match sys.proxy_addr() {
            Some(a) => Target::Proxy(a),
            None => {
                errors.push("no proxy runs".into());
                return (History::default(), Report::default());
            }
        },
    };
    let clock = Clock::start();
    let end = Instant::now() + cfg.duration;
    let stop = Arc::new(AtomicBool::new(false));
    let (logs, done_rx) = spawn_clients(cfg, &target, clock, end, &stop, errors);
    let nemesis = new_nemesis(cfg, sys, clock, end);
    let lanes = nemesis.start(schedule);

    // The run: its duration (in steps, to notice an interruption), then the clients stop.
    let interrupted = || cfg.interrupt.load(Ordering::Relaxed);
    while Instant::now() < end && !interrupted() {
        std::thread::sleep(
            end.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100)),
        );
    }
    stop.store(true, Ordering::Relaxed);
    await_clients(cfg, &done_rx, errors);
    await_lanes(&lanes, errors);
    if interrupted() {
        errors.push("interrupted: no heal, no final reads".into());
    } else if let Err(e) = nemesis.heal(HEAL_LIMIT) {
        errors.push(format!("heal: {e}"));
    }

    // Every node started so far seeds the final reader (the ring has changed).
    let target = match target {
        Target::Cluster(_) => Target::Cluster(sys.seeds()),
        proxy => proxy,
    };
    let finals = if interrupted() {
        Vec::new()
    } else {
        clients::final_reads(
            cfg.workload.clients,
            target,
            &cfg.workload,
            &clock,
            6,
            FINAL_READS_LIMIT,
        )
    };
    let mut ops = take_ops(logs, &clock);
    let read_back = finals
        .iter()
        .filter(|o| o.outcome == crate::Outcome::Ok)
        .count();
    if read_back < cfg.workload.keys as usize && !interrupted() {
        errors.push(format!(
            "final reads: {read_back} of {} keys read back",
            cfg.workload.keys
        ));
    }
    ops.extend(finals);
    let report = check_as(&ops, cfg.write_policy);
    let history = History {
        ops,
        nemesis: nemesis.events(),
    };
    (history, report)
}

/// One log of operations per client.
type ClientLogs = Vec<Arc<Mutex<Vec<Op>>>>;

/// Starts the clients, each on a thread of its own recording into its log until `stop` (or
/// `end`); each sends its id on the returned channel when it has stopped.
fn spawn_clients(
    cfg: &RunConfig,
    target: &Target,
    clock: Clock,
    end: Instant,
    stop: &Arc<AtomicBool>,
    errors: &mut Vec<String>,
) -> (ClientLogs, mpsc::Receiver<u32>) {
    let (done_tx, done_rx) = mpsc::channel();
    let mut logs = Vec::new();
    for id in 0..cfg.workload.clients {
        let log = Arc::new(Mutex::new(Vec::new()));
        logs.push(Arc::clone(&log));
        let (target, w, stop, done) = (
            target.clone(),
            cfg.workload.clone(),
            Arc::clone(stop),
            done_tx.clone(),
        );
        let seed = cfg.seed;
        let spawned = std::thread::Builder::new()
            .name(format!("kvlab-client-{id}"))
            .spawn(move || {
                clients::run_client(id, target, &w, clock, seed, &stop, end, &log);
                let _ = done.send(id);
            });
        if let Err(e) = spawned {
            errors.push(format!("starting client {id}: {e}"));
        }
    }
    drop(done_tx);
    (logs, done_rx)
}

/// The nemesis for this run, with a first event describing the network namespaces when the
/// system runs in them.
fn new_nemesis(cfg: &RunConfig, sys: &Arc<System>, clock: Clock, end: Instant) -> Arc<Nemesis> {
    let ring = RingBounds::new(cfg.nodes, cfg.replicas);
    let nemesis = Arc::new(Nemesis::new(
        Arc::clone(sys),
        clock,
        end,
        Arc::clone(&cfg.interrupt),
        ring.min,
        ring.max,
    ));
    if let Some(d) = cfg.durable {
        nemesis.record(
            0,
            "durable",
            "",
            true,
            format!(
                "every node keeps its keys in data/node-ADDRESS ({}, a cache of {} items \
                 unless the server flags say otherwise); kill -9 restarts a node over its \
                 directory",
                if Durable::syncs(&cfg.server_args) {
                    "--durability sync"
                } else {
                    "--durability as the server flags say"
                },
                d.cache_items
            ),
        );
    }
    if let Some(net) = sys.net() {
        nemesis.record(
            0,
            "netns",
            "",
            true,
            format!(
                "every node, etcd member and proxy in a namespace of its own ({}-H on {}); \
                 tc netem: {}",
                net.name(),
                net.subnet(),
                if net.netem() {
                    "yes"
                } else {
                    "no, this kernel lacks it: delays by the NFQUEUE delayer (iptables)"
                }
            ),
        );
    }
    nemesis
}

/// Waits up to [`CLIENT_GRACE`] for every client to stop.
fn await_clients(cfg: &RunConfig, done_rx: &mpsc::Receiver<u32>, errors: &mut Vec<String>) {
    let grace = Instant::now() + CLIENT_GRACE;
    let mut stopped = 0;
    while stopped < cfg.workload.clients {
        match done_rx.recv_timeout(grace.saturating_duration_since(Instant::now())) {
            Ok(_) => stopped += 1,
            Err(_) => break,
        }
    }
    if stopped < cfg.workload.clients {
        errors.push(format!(
            "{} clients were still in a request {} s after the end",
            cfg.workload.clients - stopped,
            CLIENT_GRACE.as_secs()
        ));
    }
}

/// Waits up to [`NEMESIS_GRACE`] for the nemesis's lanes to end.
fn await_lanes(lanes: &[std::thread::JoinHandle<()>], errors: &mut Vec<String>) {
    let grace = Instant::now() + NEMESIS_GRACE;
    while lanes.iter().any(|l| !l.is_finished()) && Instant::now() < grace {
        // Polling the lanes' end: a bounded wait.
        std::thread::sleep(Duration::from_millis(20));
    }
    if lanes.iter().any(|l| !l.is_finished()) {
        errors.push(format!(
            "the nemesis's last fault did not end within {} s of the end",
            NEMESIS_GRACE.as_secs()
        ));
    }
}

/// Every client's operations, in client order; those still in flight end now, as
/// [`IN_FLIGHT`] errors.
fn take_ops(logs: ClientLogs, clock: &Clock) -> Vec<Op> {
    let mut ops: Vec<Op> = Vec::new();
    let now = clock.now_ns();
    for log in logs {
        for mut o in std::mem::take(&mut *log.lock()) {
            if o.complete_ns == u64::MAX {
                o.complete_ns = now;
                o.error = Some(IN_FLIGHT.into());
            }
            ops.push(o);
        }
    }
    ops
}

fn prepare_dir(dir: &Path) -> Result<(), String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("emptying {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
}

fn write_outputs(dir: &Path, history: &History, report: &Report) -> Result<(), String> {
    let path = dir.join("history.jsonl");
    let f = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    history
        .write_jsonl(std::io::BufWriter::new(f))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    write_json(&dir.join("anomalies.json"), report)?;
    let path = dir.join("timeline.txt");
    std::fs::write(&path, history.timeline()).map_err(|e| format!("{}: {e}", path.display()))
}

/// Re-checks a history file (`history.jsonl`) of a cluster under `write_policy`.
pub fn check_file(
    path: &Path,
    write_policy: CopyWritePolicy,
) -> Result<Report, crate::FaultsError> {
    let f = std::fs::File::open(path).map_err(|source| crate::FaultsError::Io {
        what: path.display().to_string(),
        source,
    })?;
    let h = History::read_jsonl(std::io::BufReader::new(f), &path.display().to_string())?;
    Ok(check_as(&h.ops, write_policy))
}

/// Checks `ops` as `policy` promises: everything under `all`; under `owner`, without the
/// acknowledged writes nobody read.
fn check_as(ops: &[Op], policy: CopyWritePolicy) -> Report {
    match policy {
        CopyWritePolicy::All => checker::check(ops),
        CopyWritePolicy::Owner => {
            let (view, set_aside) = checker::owner_view(ops);
            Report {
                set_aside,
                ..checker::check(&view)
            }
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_soak_table_has_a_row_per_seed_and_the_totals() {
        let runs = [
            RunSummary {
                seed: 1,
                mix: "pause=2 add=1".into(),
                ops: 100,
                unknown: 3,
                ..RunSummary::default()
            },
            RunSummary {
                seed: 2,
                mix: "kill=1".into(),
                ops: 50,
                lost_writes: 2,
                anomalies: 2,
                error: Some("heal: stuck".into()),
                ..RunSummary::default()
            },
        ];
        let t = table(&runs);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].contains("anomalies") && lines[0].contains("faults"));
        assert!(lines[2].ends_with("heal: stuck"), "{t}");
        let total: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(total[0], "total");
        assert!(lines[3].contains("2 runs, 1 with anomalies") && lines[3].contains("150"));
        assert!(lines[3].ends_with("1 runs failed"), "{t}");
        assert!(runs[0].clean() && !runs[1].clean());
        assert!(runs[1].line().contains("RUN FAILED: heal: stuck"));
    }
}
