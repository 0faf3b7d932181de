//! Fault-injection experiments: `kind = "faults"` runs kvlab's fault-injection harness
//! ([`kvlab_faults`]: recording clients, a seeded nemesis, the history checker) once per
//! seed and configuration, stores every run's files and reports what the checker found,
//! with a timeline of each run.
//!
//! ```text
//! kind = "faults" experiment (+ overrides)
//!   ─► configurations: topology × replicas × client (each key one value or a list)
//!   ─► for every seed, every configuration: kvlab_faults::run — a cluster of its own
//!      through the kvlab binary, clients and nemesis for `duration`, heal, final reads,
//!      check ─► runs/<configuration>/seed-<n>/ (schedule.json, history.jsonl,
//!      anomalies.json, timeline.txt, summary.json, every process' log)
//!   ─► faults.json (the experiment as run, a summary per run)
//!   ─► report: anomalies and failed runs at the top; a table per configuration (a row
//!      per seed, then the totals); per run a timeline (operations per interval by outcome,
//!      the nemesis's actions as marks, anomalies on the right-hand axis)
//! ```
//!
//! The file (every key optional but `kind`; the default follows `=`):
//!
//! ```toml
//! kind = "faults"             # *required*: this kind of experiment
//! name = "<file stem>"
//! description = ""
//! seeds = [1, 2, 3]           # or { from = 1, to = 50 }: one run per seed and configuration
//! duration = 20.0             # seconds of load and faults per run (heal, final reads and
//!                             # the check come after)
//! nodes = 3                   # nodes at the start
//! replicas = 1                # copies of every key; a list ([1, 2]) makes a configuration
//!                             # of each value
//! topology = "file"           # file | etcd (Debian's etcd, started per run), or a list
//! etcd_members = 1            # etcd: 1, or 3 (a quorum survives one member's death)
//! netns = false               # nodes, etcd and proxy in network namespaces of their own
//!                             # (root): the nemesis may then partition and delay them
//! durable = false             # durable nodes: a data directory each (the run's data/),
//!                             # --durability sync, restarted over it after kill -9; with
//!                             # a file topology kill is then drawn with one copy too
//! cache_items = 64            # durable: the entries each node's write-back cache holds
//! client = "cluster"          # cluster (cluster-aware) | proxy (plain clients through
//!                             # `kvlab proxy --cluster`), or a list
//! faults = <default>          # the kinds the nemesis draws, e.g. ["pause", "add", "remove"]
//!                             # (kill, pause, add, remove, add-two, remove-two,
//!                             # coordinator-kill, etcd-kill, flush). Default: what each
//!                             # configuration is expected to survive (kill only with 2
//!                             # copies or durable nodes on a file, etcd-kill only with
//!                             # etcd, never flush)
//! clients = 4                 # client threads
//! keys = 200                  # keys they share
//! rate = 250                  # operations a second per client, at most
//! write_share = 0.5           # share of writes
//! timeout_ms = 1000           # one request's timeout (then its outcome is unknown)
//! node_args = ["-t", "2", "-m", "64"]   # every node's `kvlab server` flags
//! interval = 0.5              # seconds per point of the timelines
//! ```
//!
//! The command line's overrides: `--duration S` is every run's duration, `--repetitions N`
//! keeps the first N seeds, `--set KEY=VALUE` sets any key above but `kind` (VALUE read as
//! TOML, else as text: `--set seeds=[1]`, `--set keys=50`, `--set topology=etcd`);
//! `--warmup` is an error (the clients need none). They are stored in `faults.json`.
//!
//! A run's checker verdict is the experiment's finding, not its failure: `kvlab lab run`
//! succeeds when every run was carried out and checked, whatever it found, and the report
//! puts anomalies — lost writes, stale reads, values never written, histories with no
//! linearization — and runs that did not go as planned at its top.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use kvlab_faults::RunSummary;
#[cfg(test)]
use kvlab_faults::{History, Outcome};
use serde::{Deserialize, Serialize};

use crate::spec::Overrides;

mod report;
mod spec;
mod timeline;

use report::write;
pub use spec::{is_faults, Configuration, FaultsSpec, OneOrMany, Seeds};
#[cfg(test)]
use timeline::timeline;

/// One run of a faults experiment, as `faults.json` keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// The configuration.
    pub configuration: Configuration,
    /// The seed.
    pub seed: u64,
    /// Its files, relative to the results directory.
    pub dir: String,
    /// What the harness said of it.
    pub summary: RunSummary,
}

/// A faults experiment's results (`faults.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultsResult {
    /// The experiment file as given.
    pub spec_text: String,
    /// The command line's overrides.
    #[serde(default)]
    pub overrides: Overrides,
    /// The experiment as run (overrides applied).
    pub spec: FaultsSpec,
    /// Every run, in the order they ran.
    pub runs: Vec<RunRecord>,
    /// Whether a signal ended the experiment before its last run.
    #[serde(default)]
    pub interrupted: bool,
}

/// Runs a faults experiment into `out`, writes `faults.json` and the report; returns the
/// summary and the report's `index.html`.
pub fn run(
    spec: &FaultsSpec,
    text: &str,
    overrides: &Overrides,
    out: &Path,
    bin: &Path,
) -> anyhow::Result<(String, PathBuf, i32)> {
    // SIGINT or SIGTERM ends the run in progress early but cleanly (the harness stops every
    // process it started and checks what was recorded) and then the experiment.
    let interrupt = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&interrupt))
            .context("installing signal handlers")?;
    }
    let mut res = FaultsResult {
        spec_text: text.to_string(),
        overrides: overrides.clone(),
        spec: spec.clone(),
        runs: Vec::new(),
        interrupted: false,
    };
    let configs = spec.configurations();
    let seeds = spec.seeds.values();
    let total = configs.len() * seeds.len();
    'all: for &seed in &seeds {
        for c in &configs {
            if interrupt.load(Ordering::Relaxed) {
                res.interrupted = true;
                break 'all;
            }
            let rel = format!("runs/{}/seed-{seed}", c.slug());
            eprintln!(
                "run {} of {total}: seed {seed}, {} ({} s of faults)",
                res.runs.len() + 1,
                c.label(),
                spec.duration
            );
            let cfg = spec.run_config(c, seed, out.join(&rel), bin, &interrupt)?;
            let summary = kvlab_faults::run(&cfg);
            eprintln!("  {}", summary.line());
            res.runs.push(RunRecord {
                configuration: c.clone(),
                seed,
                dir: rel,
                summary,
            });
            // What ran so far is on disk whatever happens to the rest.
            crate::runner::write_json(&out.join("faults.json"), &res)?;
        }
    }
    res.interrupted |= interrupt.load(Ordering::Relaxed) && res.runs.len() < total;
    crate::runner::write_json(&out.join("faults.json"), &res)?;
    finish(out, &res)
}

/// The report written, and the verdict as an exit status
/// ([`kvlab_faults::runner::exit_code`]).
fn finish(dir: &Path, res: &FaultsResult) -> anyhow::Result<(String, PathBuf, i32)> {
    let (summary, report) = write(dir, res)?;
    let runs: Vec<RunSummary> = res.runs.iter().map(|r| r.summary.clone()).collect();
    Ok((summary, report, kvlab_faults::runner::exit_code(&runs)))
}

/// Re-renders a faults results directory's report from `faults.json` and its runs' files.
pub fn analyse_dir(dir: &Path) -> anyhow::Result<(String, PathBuf, i32)> {
    let text = std::fs::read(dir.join("faults.json")).context("faults.json")?;
    let res: FaultsResult = serde_json::from_slice(&text).context("faults.json")?;
    finish(dir, &res)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlab_faults::{NemesisEvent, Op, OpKind};

    const QUICK: &str = include_str!("../../../../experiments/faults-quick.toml");
    const SOAK: &str = include_str!("../../../../experiments/faults-soak.toml");

    #[test]
    fn shipped_files_parse_into_their_runs() {
        let q = FaultsSpec::parse(QUICK, "faults-quick", &Overrides::default()).unwrap();
        assert_eq!(q.seeds.values().len(), 3);
        assert_eq!(q.configurations().len(), 1);
        let s = FaultsSpec::parse(SOAK, "faults-soak", &Overrides::default()).unwrap();
        let c = s.configurations();
        assert_eq!(c.len(), 8, "{c:?}");
        assert!(c.iter().any(|c| c.topology == "etcd" && c.replicas == 2));
        assert!(c.iter().any(|c| c.client == "proxy"));
        assert!(is_faults(QUICK) && !is_faults("kind = \"scaling\""));
    }

    #[test]
    fn overrides_shrink_a_faults_experiment() {
        let o = Overrides {
            repetitions: Some(1),
            duration: Some(3.0),
            set: vec!["keys=20".into(), "topology=etcd".into()],
            ..Overrides::default()
        };
        let s = FaultsSpec::parse(QUICK, "q", &o).unwrap();
        assert_eq!(s.seeds.values(), vec![1]);
        assert_eq!(s.duration, 3.0);
        assert_eq!(s.keys, 20);
        assert_eq!(s.configurations()[0].topology, "etcd");
        let bad = |o: Overrides| FaultsSpec::parse(QUICK, "q", &o).unwrap_err().to_string();
        assert!(bad(Overrides {
            warmup: Some(1.0),
            ..Overrides::default()
        })
        .contains("no warm-up"));
        assert!(bad(Overrides {
            repetitions: Some(9),
            ..Overrides::default()
        })
        .contains("seeds"));
        let e = format!(
            "{:#}",
            FaultsSpec::parse(
                QUICK,
                "q",
                &Overrides {
                    set: vec!["colour=red".into()],
                    ..Overrides::default()
                }
            )
            .unwrap_err()
        );
        assert!(e.contains("colour"), "{e}");
        // etcd-kill without etcd is refused, for the configuration that lacks it.
        let text = "kind = \"faults\"\ntopology = [\"file\", \"etcd\"]\nfaults = [\"etcd-kill\"]";
        let e = format!(
            "{:#}",
            FaultsSpec::parse(text, "x", &Overrides::default()).unwrap_err()
        );
        assert!(e.contains("file, 1 copy"), "{e}");
    }

    #[test]
    fn durable_nodes_reach_the_harness_and_draw_kills_with_one_copy() {
        let text = "kind = \"faults\"\ndurable = true\ncache_items = 32";
        let s = FaultsSpec::parse(text, "d", &Overrides::default()).unwrap();
        let c = &s.configurations()[0];
        let never = Arc::new(AtomicBool::new(false));
        let cfg = s
            .run_config(c, 1, PathBuf::from("r"), Path::new("kvlab"), &never)
            .unwrap();
        assert_eq!(cfg.durable, Some(kvlab_faults::Durable { cache_items: 32 }));
        let mix = kvlab_faults::Mix::default_for(cfg.capabilities());
        assert!(mix.kinds().contains(&kvlab_faults::FaultKind::Kill));
        let plain = FaultsSpec::parse(QUICK, "q", &Overrides::default()).unwrap();
        let cfg = plain
            .run_config(c, 1, PathBuf::from("r"), Path::new("kvlab"), &never)
            .unwrap();
        assert_eq!(cfg.durable, None);
        let pool = "kind = \"faults\"\ndurable = true\nclient = \"pool\"";
        let e = format!(
            "{:#}",
            FaultsSpec::parse(pool, "p", &Overrides::default()).unwrap_err()
        );
        assert!(e.contains("durable"), "{e}");
    }

    fn op(client: u32, kind: OpKind, value: &str, ms: (u64, u64), outcome: Outcome) -> Op {
        Op {
            client,
            key: "fk:1".into(),
            kind,
            value: (!value.is_empty()).then(|| value.to_string()),
            invoke_ns: ms.0 * 1_000_000,
            complete_ns: ms.1 * 1_000_000,
            outcome,
            final_read: false,
            error: None,
        }
    }

    #[test]
    fn a_timeline_counts_outcomes_marks_actions_and_anomalies() {
        let mut fin = op(0, OpKind::Read, "", (3000, 3010), Outcome::Ok);
        fin.final_read = true;
        let h = History {
            ops: vec![
                op(0, OpKind::Write, "c0-1", (100, 200), Outcome::Ok),
                op(1, OpKind::Write, "c1-1", (600, 700), Outcome::Unknown),
                op(1, OpKind::Read, "", (800, 900), Outcome::Failed),
                fin,
            ],
            nemesis: vec![
                NemesisEvent {
                    start_ns: 500_000_000,
                    end_ns: 1_500_000_000,
                    what: "pause".into(),
                    target: "127.0.0.1:7102".into(),
                    ok: true,
                    detail: None,
                },
                NemesisEvent {
                    start_ns: 600_000_000,
                    end_ns: 600_000_000,
                    what: "add".into(),
                    target: String::new(),
                    ok: false,
                    detail: Some(format!("{}no node", kvlab_faults::nemesis::SKIPPED)),
                },
            ],
        };
        let report = kvlab_faults::check(&h.ops);
        assert_eq!(report.lost_writes, 1);
        let p = timeline("t", &h, &report.anomalies, 0.5);
        assert!(p.problems().is_empty(), "{:?}", p.problems());
        let sum = |name: &str| -> f64 {
            p.series
                .iter()
                .find(|s| s.name == name)
                .map_or(0.0, |s| s.points.iter().map(|p| p.y).sum())
        };
        assert_eq!(
            (sum("ok"), sum("failed"), sum("unknown"), sum("final reads")),
            (1.0, 1.0, 1.0, 1.0)
        );
        let labels: Vec<&str> = p.marks.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(
            labels,
            ["pause :7102", "LOST WRITE fk:1"],
            "skipped: no mark"
        );
        // The lost write is placed where it was acknowledged.
        assert!((p.marks[1].x - 0.2).abs() < 1e-9);
        let y2 = p.y2.expect("anomalies on the right axis");
        assert_eq!(y2.series[0].points.iter().map(|p| p.y).sum::<f64>(), 1.0);
    }
}
