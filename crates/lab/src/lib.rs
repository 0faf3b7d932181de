//! kvlab's lab: experiments end to end — start systems, load them, repeat, analyse, report —
//! as a library; `kvlab lab` is a thin command line over it.
//!
//! - [`spec`]: the experiment file (TOML) resolved into parts, points and planned runs;
//! - [`system`]: the systems under test (kvlab's server, memcached, an external address);
//! - [`runner`]: every point × repetition × system, raw results and metadata on disk;
//! - [`analyse`]: raw results → statistics, model checks and the HTML report;
//! - [`scaling`]: `kind = "scaling"` experiments — a kvlab cluster under a verified load
//!   while nodes are added, removed or killed on a schedule;
//! - [`generator`]: external load generators (memcaslap, memtier_benchmark) for a
//!   workload's `generator` key: its keys mapped onto their flags, their output read;
//! - [`ring`]: `kind = "storage-ring"` experiments — durable cluster nodes (bounded caches
//!   over their stores) loaded with real messages: throughput against servers × clients and
//!   cache size × policy, scale up and down by one server, a published evaluation beside;
//!   memcached behind the same client ring as a second system; the throughput part's nodes
//!   and clients placed on hosts (the clients as `kvlab lab ring-clients` there);
//! - [`faults`]: `kind = "faults"` experiments — kvlab's fault-injection harness
//!   (`kvlab_faults`) over seeds and configurations, each run's history checked, anomalies
//!   at the top of the report and a timeline per run;
//! - [`workflow`]: the control workflow — a server under a random rate trace, batch jobs,
//!   and `kvlab control` moving cores between them, per seed × interval × policy × system;
//! - [`placement`]: an experiment's processes on its `[[host]]`s over ssh (through
//!   `kvlab_hosts`): started, read, stopped and their logs brought back;
//! - [`speedup`]: the batch jobs' runtime against their core count, for a
//!   characterisation report's `[speedup]` table.
//!
//! ```text
//! Source (file | shipped) + Overrides
//!   ─► spec::Experiment::parse ─► parts × points × systems × repetitions (PlannedRun)
//!   ─► runner::run_experiment
//!        system::Instance::start (kvlab_process: free port, wait for `version`,
//!        threads from `stats`; a proxy's backends first) ─► kvlab_bench run (or an
//!        external generator, `generator`) ─► /proc CPU (a proxy's `stats` too)
//!        ─► raw/NNNN.json, meta.json
//!   ─► analyse::analyse (kvlab_analysis) ─► analyse::write (kvlab_report) ─► report/
//! ```
//!
//! [`Lab::run`] does all of it for one experiment; [`analyse_dir`] redoes the analysis of a
//! results directory. The kvlab servers it starts are [`Lab::kvlab_bin`] (default
//! `$KVLAB_BIN`, else the running `kvlab`). Errors are `anyhow` for now, with context. The
//! command line over it (`crates/kvlab/src/lab_cmd.rs`):
//!
//! ```text
//! kvlab lab                          the quick standard experiment (experiments/quick.toml,
//!                                    built in): kvlab's server, and memcached beside it when
//!                                    it is on PATH; prints a summary and the report's path
//! kvlab lab run FILE|NAME [--out D]  an experiment file, or a shipped one by name
//! kvlab lab analyse DIR              re-analyse DIR/raw/*.json and rewrite DIR/report/
//! kvlab lab list                     the shipped experiments
//! kvlab lab show NAME                print a shipped experiment file
//! ```
//!
//! Results go to `results/<name>-<YYYYMMDD-HHMMSS>/` (see [`runner`] for the layout).
//!
//! `kvlab lab run` (and `kvlab lab`) take overrides of the file's values for a quick run of a
//! big file, applied to every part alike (the top level and each `[[part]]`):
//!
//! ```text
//! --repetitions N          every `repetitions`
//! --duration S             every `duration` (a trace still lasts its qps_list)
//! --warmup S               every `warmup`
//! --set KEY=VALUE          a workload key, in every part's workload (repeatable; a later one
//!                          wins). VALUE is read as TOML (4096, 0.5, true, [1, 2], "text") or
//!                          else taken as text (mix=get=9,set=1, protocol=http). A key that a
//!                          part varies as a factor is an error.
//! ```
//!
//! They are checked with the file's rules and messages, printed at the start, stored in
//! `meta.json` (`overrides`, so `kvlab lab analyse DIR` resolves the experiment as it was
//! run) and shown in the report's metadata; the report's part descriptions give the resolved
//! values.
//!
//! # Experiment files (TOML)
//!
//! Every key is optional unless marked *required*; the default follows `=`.
//!
//! ```toml
//! name = "<file stem>"        # names the results directory
//! description = ""
//! repetitions = 3             # runs per point and system (95 % CIs need >= 2)
//! duration = 10.0             # measured seconds per run (a trace lasts its qps_list)
//! warmup = 1.0                # seconds run and discarded before each measurement
//! confidence = 0.95           # level of every confidence interval
//! tolerance = 0.10            # model checks: |predicted - measured| / measured that still
//!                             # agrees when the prediction is outside the measured CI
//! slo_p95_us = 1000.0         # rate scans: the sustained rate is the largest offered rate
//!                             # with p95 below this (µs) and >= 99 % of it achieved, every
//!                             # lower rate of the scan passing too
//! slo_mean_us = <none>        # instead: the bound is on the mean latency (µs); not both
//! seed = 1                    # repetition i uses seed + i
//! corunner = <none>           # a command run beside every run (sh -c, its own process
//!                             # group, killed after the run; "{factor}" allowed), e.g.
//!                             # "stress-ng --{stressor} 1 --taskset 0": interference; the
//!                             # raw run keeps it and its CPU (cores busy)
//! agents = []                 # hosts whose kvlab bench agents generate the load (per part
//!                             # too): clients split evenly, histograms merged
//!
//! [[host]]                    # the hosts roles name (docs/lab.md, Hosts); or from
//! name = <required>           # `--hosts FILE`
//! ssh = <none>                # "user@address[:port]"; without it the host is this machine
//! local = <true without ssh>  # (not both)
//! dir = "/tmp/kvlab-hosts"    # its directory (shipped binary, run directories)
//! clock = "date +%s%N"        # the command that prints its time, ns
//! address = <reached by>      # where its systems listen and clients reach them (default:
//!                             # the ssh address; 127.0.0.1 for a local host)
//! pool = <none>               # instead of all the above: "NAME:PORT", a pool of agents
//!                             # someone else runs (Kubernetes), one per address NAME
//!                             # resolves to; only `agents` names it
//!
//! [ssh]                       # identity, known_hosts, options = [], connect_timeout = 5
//!
//! [[system]]                  # one or more; *required*
//! name = "kvlab"              # *required*, unique
//! kind = "kvlab"              # kvlab | memcached | proxy | external; default from the
//!                             # name (kvlab, memcached and proxy), required otherwise
//! args = []                   # extra flags; "{factor}" takes the point's level, e.g.
//!                             # ["-t", "{server_threads}", "-m", "64"]; "{data_dir}" is a
//!                             # fresh empty directory for every start of the system,
//!                             # removed when it stops (a durable server's --data-dir,
//!                             # under the results' logs/). The lab adds the
//!                             # address: kvlab `server -l 127.0.0.1 -p PORT` (and
//!                             # `--http-port PORT2` when a point of the part speaks HTTP),
//!                             # memcached `-U 0 -l 127.0.0.1 -p PORT` (and `-u root` as root),
//!                             # proxy `proxy -l 127.0.0.1 -p PORT --backend ADDR` (one per
//!                             # backend) `--log-dir <its log>.windows`
//! binary = <kvlab_bin> | "memcached"   # program, looked up on PATH; kvlab_bin is the
//!                             # lab's (`$KVLAB_BIN`, else the running kvlab); a proxy's is
//!                             # kvlab_bin
//! backends = 1                # proxy: backends the lab starts first, each on its own port
//!                             # with its own log (<its log>.backend<i>.log), stopped after
//!                             # the proxy; "{factor}" lets a factor vary it (1..=64)
//! backend = "kvlab"           # proxy: the backends' server: kvlab (kvlab_bin `server`) or
//!                             # memcached (on PATH; missing + optional = skipped)
//! backend_args = []           # proxy: every backend's flags, "{factor}" as in args
//! address = ""                # external: host:port (*required* for external)
//! pid = <none>                # external: a pid whose CPU is read from /proc/<pid>/stat
//! optional = false            # a missing binary skips the system instead of failing; so
//!                             # does a point it cannot serve (HTTP on memcached), with a note
//! start_timeout = 10.0        # seconds to wait for an answer to `version` (and to `GET /`
//!                             # on the HTTP port)
//! host = <here>               # a [[host]] name, or a list (an instance on each); the lab
//!                             # starts it there, listening on the host's address
//! backend_hosts = []          # proxy: backend i on backend_hosts[i % len] (default: the
//!                             # proxy's first host)
//! fresh = false               # start it afresh for every run: an empty cache each time
//!                             # (cold-cache runs; with load = true a fill before every run)
//! cpus = <any>                # a CPU list ("0", "0-1,3"; "{factor}" allowed): every
//!                             # thread of the system is pinned there once it is up (a
//!                             # proxy's own threads, not its backends')
//!
//! [workload]                  # everything `kvlab bench` takes
//! clients = <none>            # closed loop: total connections (= threads x connections,
//!                             # threads lowered to a divisor); overrides `connections`
//! threads = 1                 # generator threads
//! connections = 4             # connections per generator thread
//! depth = 1 | 1024            # requests in flight per connection (closed | open loop)
//! think_us = 0                # closed loop think time Z, µs
//! qps = <none>                # open loop: total rate, req/s (none = closed loop)
//! arrival = "poisson"         # open loop: poisson | fixed
//! qps_list = <none>           # trace: rates (req/s), each for qps_interval seconds
//! qps_interval = 1.0
//! preset = <none>             # "etc": Facebook ETC key/value sizes, get:set 30:1
//! keys = 100000
//! key_prefix = "key:"
//! key_size = 16               # bytes, or "A-B", "normal:M,SD", "gev:L,S,K", …
//! key_dist = "uniform"        # uniform | sequential | gaussian[:M,SD] | zipf:S | hot:F:P
//! value_size = 100            # bytes, or a distribution as key_size
//! mix = "get=9,set=1"         # weights of get, set, delete
//! multiget = 1
//! verify = false
//! load = <gets in mix>        # fill the key space once per fresh server (and workload)
//! interval = 1.0              # time-series interval, s
//! timeout_ms = 5000
//! protocol = "memcached"      # memcached | meta | http. meta: memcached's meta protocol
//!                             # (mg/ms/md, quiet multi-gets) on the memcached port, served
//!                             # by every system. http: HTTP/1.1 to a kvlab server's REST
//!                             # interface (keep-alive, pipelined); only kind = "kvlab" serves
//!                             # it, so a memcached or external system in such a part is an
//!                             # error unless optional. A factor too: protocol = ["memcached",
//!                             # "http"] compares both on one server
//! meta_base64 = false         # meta: send keys base64-encoded (b flag; keys <= 186 bytes)
//! generator = "kvlab"         # kvlab (kvlab bench, in process) | memcaslap | memtier_benchmark
//!                             # (programs on PATH; a point whose program is missing is left
//!                             # out with a note). A factor too. An external generator gets
//!                             # the keys it can express (threads, connections, depth, mix of
//!                             # gets and sets, keys, key and value sizes, duration, warm-up
//!                             # as a discarded first invocation; whole seconds) and refuses
//!                             # the others by name (open loop, deletes, …): see [`generator`].
//!                             # memcaslap reports no percentiles: "–" in the tables
//! generator_cpus = <any>      # a CPU list ("1", "0-1"): the generator runs there (kvlab
//!                             # bench's threads, or the external program), e.g. beside a
//!                             # system pinned with cpus = "0": each side on its own core
//!
//! [factors]                   # factor = [levels]; a workload key, or a {name} in args
//! clients = [1, 2, 4, 8]
//! qps = { from = 5000, to = 125000, step = 5000 }   # or { from = 1, to = 64, times = 2 }
//! design = "full"             # full (every combination) | 2k (two levels each) | points
//! points = []                 # design "points": [{ clients = 1, value_size = 100 }, …]
//!
//! [[part]]                    # several studies in one file: each part has its own
//! name = "part<i>"            # name, description, systems = [names], repetitions,
//!                             # duration, warmup, corunner, [part.workload] (over
//!                             # [workload]), [part.factors], design, points
//!
//! [speedup]                   # after the parts: each batch job of a job file alone at
//! jobs = <required>           # each of its core counts (threads = cores, pinned with
//! cpus = <any>                # taskset to that many of `cpus`), `repetitions` times;
//! repetitions = 1             # jobs: shipped (control-jobs, -medium, -quick) or a path
//!                             # next to this file; stored in speedup.json, reported as a
//!                             # plot and a table of runtime vs cores (`speedup`)
//! ```
//!
//! A proxy's CPU (the runner's /proc reading) is the proxy process' own; for each run the
//! runner also stores the proxy's stage times over the measured time, from its `stats` read
//! at the same moments ([`runner::ProxyFigures`]), and its backends' summed CPU.
//!
//! What the analysis does with a part depends on its factors: `clients` in closed loop →
//! throughput/response time vs clients, knee, interactive law, MVA and its bounds (and for a
//! proxy an MVA of its network of queues: network thread, workers, backends); `qps` →
//! rate scan with p95 and server CPU, the sustained rate under `slo_p95_us`, M/M/1 and
//! M/M/m; `design = "2k"` → effects and allocation of variation (throughput); `qps_list` →
//! p95, rate and CPU over time. A part with a proxy gets a table of where a request's time
//! goes (net, queue, worker, backend, outside the proxy). Every part gets a table of all
//! points, percentiles vs its first factor and latency histograms. Points an external
//! generator measured are in the table of all points only (with "–" where it reports no
//! figure), never in a curve or a model.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod analyse;
pub mod faults;
pub mod generator;
mod nodes;
pub mod placement;
pub mod ring;
pub mod runner;
pub mod scaling;
pub mod spec;
pub mod speedup;
pub mod system;
pub mod workflow;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

pub use spec::{Experiment, Overrides};

/// The experiments shipped in `experiments/`, built in: (name, file text).
pub const SHIPPED: &[(&str, &str)] = &[
    ("quick", include_str!("../../../experiments/quick.toml")),
    (
        "baseline-clients",
        include_str!("../../../experiments/baseline-clients.toml"),
    ),
    (
        "rate-scan",
        include_str!("../../../experiments/rate-scan.toml"),
    ),
    (
        "control-characterise",
        include_str!("../../../experiments/control-characterise.toml"),
    ),
    (
        "control-workflow",
        include_str!("../../../experiments/control-workflow.toml"),
    ),
    (
        "control-interval",
        include_str!("../../../experiments/control-interval.toml"),
    ),
    (
        "control-workflow-quick",
        include_str!("../../../experiments/control-workflow-quick.toml"),
    ),
    (
        "control-workflow-idle",
        include_str!("../../../experiments/control-workflow-idle.toml"),
    ),
    (
        "control-workflow-calibrated",
        include_str!("../../../experiments/control-workflow-calibrated.toml"),
    ),
    (
        "factorial-2k",
        include_str!("../../../experiments/factorial-2k.toml"),
    ),
    (
        "protocols",
        include_str!("../../../experiments/protocols.toml"),
    ),
    (
        "io-models",
        include_str!("../../../experiments/io-models.toml"),
    ),
    (
        "proxy-middleware",
        include_str!("../../../experiments/proxy-middleware.toml"),
    ),
    (
        "proxy-replication",
        include_str!("../../../experiments/proxy-replication.toml"),
    ),
    (
        "proxy-multiget",
        include_str!("../../../experiments/proxy-multiget.toml"),
    ),
    (
        "proxy-2k",
        include_str!("../../../experiments/proxy-2k.toml"),
    ),
    (
        "middleware-hosts",
        include_str!("../../../experiments/middleware-hosts.toml"),
    ),
    (
        "control-hosts",
        include_str!("../../../experiments/control-hosts.toml"),
    ),
    (
        "proxy-vs-twemproxy",
        include_str!("../../../experiments/proxy-vs-twemproxy.toml"),
    ),
    (
        "compare-regimes",
        include_str!("../../../experiments/compare-regimes.toml"),
    ),
    (
        "compare-memcached",
        include_str!("../../../experiments/compare-memcached.toml"),
    ),
    (
        "bench-vs-memcaslap",
        include_str!("../../../experiments/bench-vs-memcaslap.toml"),
    ),
    (
        "sustained-ab",
        include_str!("../../../experiments/sustained-ab.toml"),
    ),
    (
        "sustained-etc",
        include_str!("../../../experiments/sustained-etc.toml"),
    ),
    (
        "cluster-scaling",
        include_str!("../../../experiments/cluster-scaling.toml"),
    ),
    (
        "cluster-failure",
        include_str!("../../../experiments/cluster-failure.toml"),
    ),
    (
        "cluster-scaling-hosts",
        include_str!("../../../experiments/cluster-scaling-hosts.toml"),
    ),
    (
        "storage-ring",
        include_str!("../../../experiments/storage-ring.toml"),
    ),
    (
        "storage-ring-hosts",
        include_str!("../../../experiments/storage-ring-hosts.toml"),
    ),
    (
        "faults-quick",
        include_str!("../../../experiments/faults-quick.toml"),
    ),
    (
        "faults-soak",
        include_str!("../../../experiments/faults-soak.toml"),
    ),
];

/// The text of a shipped experiment.
pub fn shipped(name: &str) -> Option<&'static str> {
    SHIPPED.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The first line of a shipped experiment's description ("" when it has none).
pub fn shipped_summary(name: &str) -> String {
    if let Some(text) = shipped(name).filter(|t| scaling::is_scaling(t)) {
        return scaling::ScalingSpec::parse(text, name)
            .map(|s| s.description)
            .unwrap_or_default();
    }
    if let Some(text) = shipped(name).filter(|t| ring::is_ring(t)) {
        return ring::RingSpec::parse(text, name)
            .map(|s| s.description)
            .unwrap_or_default();
    }
    if let Some(text) = shipped(name).filter(|t| faults::is_faults(t)) {
        return faults::FaultsSpec::parse(text, name, &Overrides::default())
            .map(|s| s.description)
            .unwrap_or_default();
    }
    shipped(name)
        .and_then(|text| match workflow::is_workflow(text) {
            true => workflow::WorkflowSpec::parse(text).ok()?.description(),
            false => {
                Experiment::parse(text, name, &Overrides::default())
                    .ok()?
                    .description
            }
        })
        .and_then(|d| d.lines().next().map(str::to_string))
        .unwrap_or_default()
}

/// An experiment's text and where it came from.
#[derive(Debug, Clone)]
pub struct Source {
    /// How to name it in messages and `meta.json`: the path, or
    /// `(built in) experiments/NAME.toml`.
    pub label: String,
    /// The TOML text.
    pub text: String,
    /// The default experiment name (the file's stem).
    pub stem: String,
}

impl Source {
    /// The quick standard experiment (`experiments/quick.toml`, built in).
    pub fn quick() -> Source {
        Source::builtin(SHIPPED[0].0, SHIPPED[0].1)
    }

    fn builtin(name: &str, text: &str) -> Source {
        Source {
            label: format!("(built in) experiments/{name}.toml"),
            text: text.into(),
            stem: name.into(),
        }
    }

    /// An experiment file, or else a shipped experiment of that name.
    pub fn open(file_or_name: &str) -> anyhow::Result<Source> {
        let path = Path::new(file_or_name);
        if path.exists() {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "experiment".into());
            Ok(Source {
                label: file_or_name.into(),
                text,
                stem,
            })
        } else if let Some(text) = shipped(file_or_name) {
            Ok(Source::builtin(file_or_name, text))
        } else {
            bail!(
                "{file_or_name}: no such file, and no shipped experiment of that name (shipped: {})",
                SHIPPED
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    }
}

/// What a run or a re-analysis wrote.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The results directory.
    pub dir: PathBuf,
    /// The analysis' text summary (what `kvlab lab` prints).
    pub summary: String,
    /// The report's `index.html`.
    pub report: PathBuf,
    /// The verdict as an exit status: 0 for a measurement; a checked experiment (`faults`)
    /// gives 1 when it found anomalies and 2 when a run went wrong or keys it wrote could
    /// not be verified.
    pub exit_code: i32,
}

impl Finished {
    /// The raw results' directory.
    pub fn raw_dir(&self) -> PathBuf {
        self.dir.join("raw")
    }
}

/// Why an experiment that starts kvlab found none ([`default_kvlab_bin`]).
const NEEDS_KVLAB: &str = "needs the kvlab executable: set KVLAB_BIN to it (the running \
    executable is taken only when its name is `kvlab`)";

/// The kvlab executable the lab starts for `kind = "kvlab"` systems by default: `$KVLAB_BIN`,
/// else the current executable when it is `kvlab` (the lab run from `kvlab lab`).
pub fn default_kvlab_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KVLAB_BIN").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::current_exe()
        .ok()
        .filter(|p| p.file_stem().is_some_and(|s| s == "kvlab"))
}

/// The experiment runner: runs experiments and writes their results and reports.
#[derive(Debug, Clone)]
pub struct Lab {
    /// The kvlab executable for `kind = "kvlab"` systems without a `binary` (none: such a
    /// system is an error). Default [`default_kvlab_bin`].
    pub kvlab_bin: Option<PathBuf>,
}

impl Default for Lab {
    fn default() -> Self {
        Lab {
            kvlab_bin: default_kvlab_bin(),
        }
    }
}

impl Lab {
    /// A lab that starts `kvlab_bin` for kvlab systems.
    pub fn with_kvlab_bin(kvlab_bin: impl Into<PathBuf>) -> Lab {
        Lab {
            kvlab_bin: Some(kvlab_bin.into()),
        }
    }

    /// Resolves `source` with `overrides`, runs it into `out` (default
    /// `results/<name>-<date>`, made unique), analyses it and writes the report.
    pub fn run(
        &self,
        source: &Source,
        overrides: &Overrides,
        out: Option<PathBuf>,
    ) -> anyhow::Result<Finished> {
        if workflow::is_workflow(&source.text) {
            let spec = workflow::WorkflowSpec::parse(&source.text)
                .with_context(|| format!("control experiment {}", source.label))?;
            let out = match out {
                Some(o) => o,
                None => default_out(&spec.name(&source.stem), std::time::SystemTime::now()),
            };
            let bin = self
                .kvlab_bin
                .as_deref()
                .with_context(|| format!("a control experiment {NEEDS_KVLAB}"))?;
            let base = Path::new(&source.label)
                .parent()
                .filter(|p| p.exists())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
            let report = workflow::run(&source.text, &base, &out, bin, overrides)?;
            return Ok(Finished {
                exit_code: 0,
                summary: workflow::summary_text(&out)?,
                dir: out,
                report,
            });
        }
        if scaling::is_scaling(&source.text) {
            return self.run_scaling(source, overrides, out);
        }
        if faults::is_faults(&source.text) {
            return self.run_faults(source, overrides, out);
        }
        if ring::is_ring(&source.text) {
            return self.run_ring(source, overrides, out);
        }
        let exp = Experiment::parse(&source.text, &source.stem, overrides).with_context(|| {
            if overrides.is_empty() {
                format!("experiment {}", source.label)
            } else {
                format!("experiment {} with {}", source.label, overrides.flags())
            }
        })?;
        let out = match out {
            Some(o) => o,
            None => default_out(&exp.name, std::time::SystemTime::now()),
        };
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let mut meta = runner::Meta::collect(&source.label, &source.text, overrides);
        let raws = runner::run_experiment(&exp, &mut meta, &out, self.kvlab_bin.as_deref())?;
        if let Some(sp) = &exp.speedup {
            let base = Path::new(&source.label)
                .parent()
                .filter(|p| p.exists())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
            speedup::run(sp, &base, &out)?;
        }
        let mut a = analyse::analyse(&exp, &meta, &raws)?;
        speedup::add_stored(&out, &mut a)?;
        let report = analyse::write(&out, &a)?;
        Ok(Finished {
            exit_code: 0,
            dir: out,
            summary: a.summary,
            report,
        })
    }
}

impl Lab {
    /// A `kind = "scaling"` experiment (see [`scaling`]): of the overrides, only a host
    /// table (`--hosts FILE`) applies.
    fn run_scaling(
        &self,
        source: &Source,
        overrides: &Overrides,
        out: Option<PathBuf>,
    ) -> anyhow::Result<Finished> {
        let mut spec = scaling::ScalingSpec::parse(&source.text, &source.stem)
            .with_context(|| format!("experiment {}", source.label))?;
        if let Some(table) = &overrides.hosts {
            spec.use_hosts(table)
                .with_context(|| format!("experiment {} with {}", source.label, table.file))?;
        }
        self.run_on_nodes(&spec.name, "a scaling", out, |out, bin| {
            scaling::run(&spec, &source.text, out, bin)
        })
    }

    /// An experiment that starts kvlab nodes (`what` names it in the error when there is no
    /// kvlab to start), its results in `out` (default: a new directory for `name`).
    fn run_on_nodes(
        &self,
        name: &str,
        what: &str,
        out: Option<PathBuf>,
        run: impl FnOnce(&Path, &Path) -> anyhow::Result<(String, PathBuf)>,
    ) -> anyhow::Result<Finished> {
        let out = match out {
            Some(o) => o,
            None => default_out(name, std::time::SystemTime::now()),
        };
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let bin = self
            .kvlab_bin
            .as_deref()
            .with_context(|| format!("{what} experiment starts kvlab nodes and {NEEDS_KVLAB}"))?;
        let (summary, report) = run(&out, bin)?;
        Ok(Finished {
            exit_code: 0,
            dir: out,
            summary,
            report,
        })
    }
}

impl Lab {
    /// A `kind = "storage-ring"` experiment (see [`ring`]): of the overrides, only a host
    /// table (`--hosts FILE`) applies.
    fn run_ring(
        &self,
        source: &Source,
        overrides: &Overrides,
        out: Option<PathBuf>,
    ) -> anyhow::Result<Finished> {
        let mut spec = ring::RingSpec::parse(&source.text, &source.stem)
            .with_context(|| format!("experiment {}", source.label))?;
        if let Some(table) = &overrides.hosts {
            spec.use_hosts(table)
                .with_context(|| format!("experiment {} with {}", source.label, table.file))?;
        }
        self.run_on_nodes(&spec.name, "a storage-ring", out, |out, bin| {
            ring::run(&spec, &source.text, out, bin)
        })
    }

    /// A `kind = "faults"` experiment (see [`faults`]).
    fn run_faults(
        &self,
        source: &Source,
        overrides: &Overrides,
        out: Option<PathBuf>,
    ) -> anyhow::Result<Finished> {
        let spec = faults::FaultsSpec::parse(&source.text, &source.stem, overrides)
            .with_context(|| format!("experiment {}", source.label))?;
        let out = match out {
            Some(o) => o,
            None => default_out(&spec.name, std::time::SystemTime::now()),
        };
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let bin = self
            .kvlab_bin
            .as_deref()
            .with_context(|| format!("a faults experiment starts kvlab nodes and {NEEDS_KVLAB}"))?;
        let (summary, report, exit_code) = faults::run(&spec, &source.text, overrides, &out, bin)?;
        Ok(Finished {
            exit_code,
            dir: out,
            summary,
            report,
        })
    }
}

/// `results/<name>-<date>`, with `-2`, `-3`, … when it exists.
pub fn default_out(name: &str, now: std::time::SystemTime) -> PathBuf {
    let base = PathBuf::from("results").join(format!("{name}-{}", runner::stamp(now)));
    let mut dir = base.clone();
    let mut i = 2;
    while dir.exists() {
        dir = PathBuf::from(format!("{}-{i}", base.display()));
        i += 1;
    }
    dir
}

/// Re-analyses a results directory's raw data (as the experiment stored in its `meta.json`
/// was run) and rewrites its report.
pub fn analyse_dir(dir: &Path) -> anyhow::Result<Finished> {
    if workflow::is_workflow_dir(dir) {
        return Ok(Finished {
            exit_code: 0,
            report: workflow::analyse(dir)?,
            summary: workflow::summary_text(dir)?,
            dir: dir.to_path_buf(),
        });
    }
    if dir.join("faults.json").exists() {
        let (summary, report, exit_code) = faults::analyse_dir(dir)?;
        return Ok(Finished {
            exit_code,
            dir: dir.to_path_buf(),
            summary,
            report,
        });
    }
    if dir.join("ring.json").exists() {
        let (summary, report) = ring::analyse_dir(dir)?;
        return Ok(Finished {
            exit_code: 0,
            dir: dir.to_path_buf(),
            summary,
            report,
        });
    }
    if dir.join("scaling.json").exists() {
        let (summary, report) = scaling::analyse_dir(dir)?;
        return Ok(Finished {
            exit_code: 0,
            dir: dir.to_path_buf(),
            summary,
            report,
        });
    }
    let (meta, raws) = runner::load(dir)?;
    let exp = Experiment::parse(&meta.experiment_text, "experiment", &meta.overrides)
        .context("the experiment stored in meta.json")?;
    let mut a = analyse::analyse(&exp, &meta, &raws)?;
    speedup::add_stored(dir, &mut a)?;
    let report = analyse::write(dir, &a)?;
    Ok(Finished {
        exit_code: 0,
        dir: dir.to_path_buf(),
        summary: a.summary,
        report,
    })
}
