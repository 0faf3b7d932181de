//! The batch jobs' speed-up curve in a characterisation report: an experiment's
//! `[speedup]` table names a job file, and after its parts the lab runs each job alone at
//! each of its core counts (threads = cores, pinned: [`kvlab_control::speedup`]), repeated,
//! into `speedup.json`; the report gains a section with each job's runtime against its core
//! count (a plot and a table) — what tells the controller which jobs gain from a core.
//!
//! ```toml
//! [speedup]
//! jobs = "control-jobs"   # a shipped job file or a path next to the experiment file
//! cpus = "0-1"            # the CPUs to pin to (default: all this process may use)
//! repetitions = 3         # runs per job and core count (default 1)
//! ```

use std::path::Path;

use anyhow::Context;
use kvlab_control::speedup::SpeedupRow;
use kvlab_control::CpuSet;
use kvlab_report::{Item, LinePlot, LineStyle, Point, Row, Section, Series, Table};
use serde::{Deserialize, Serialize};

use crate::analyse::Analysis;
use crate::spec::SpeedupSpec;
use crate::workflow::{job_file, mean_sd};

/// Where the rows are stored, in the results directory.
pub const FILE: &str = "speedup.json";

/// What `speedup.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stored {
    /// The job file as named.
    pub jobs: String,
    /// The CPUs pinned to.
    pub cpus: String,
    /// Every run: (repetition, row).
    pub runs: Vec<(usize, SpeedupRow)>,
}

/// Runs `spec` (the job file resolved next to `base`) into `out/speedup.json`; its inputs
/// are made in a scratch directory under `out` that is removed afterwards.
pub fn run(spec: &SpeedupSpec, base: &Path, out: &Path) -> anyhow::Result<Stored> {
    let (_, jobs) = job_file(&spec.jobs, base)?;
    let cpus = match &spec.cpus {
        Some(c) => c
            .parse::<CpuSet>()
            .map_err(|e| anyhow::anyhow!("[speedup] cpus {c:?}: {e}"))?,
        None => CpuSet::allowed_now().context("reading this process's CPUs")?,
    };
    let work = out.join("speedup-work");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    eprintln!(
        "speed-up: {} job(s) of {} alone at each core count on CPUs {cpus}, {} repetition(s)",
        jobs.jobs.len(),
        spec.jobs,
        spec.repetitions
    );
    let result = (|| -> anyhow::Result<Vec<(usize, SpeedupRow)>> {
        kvlab_control::controller::prepare(&jobs.prepare, &work)?;
        let mut runs = Vec::new();
        for rep in 0..spec.repetitions {
            for row in kvlab_control::speedup::speedup(&jobs, &cpus, &work)? {
                eprintln!(
                    "  {} on {} core(s): {:.2} s (rep {}/{})",
                    row.job,
                    row.cores,
                    row.wall_s,
                    rep + 1,
                    spec.repetitions
                );
                runs.push((rep, row));
            }
        }
        Ok(runs)
    })();
    let _ = std::fs::remove_dir_all(&work);
    let stored = Stored {
        jobs: spec.jobs.clone(),
        cpus: cpus.to_string(),
        runs: result?,
    };
    let text = serde_json::to_string_pretty(&stored)?;
    std::fs::write(out.join(FILE), text)
        .with_context(|| format!("writing {}", out.join(FILE).display()))?;
    Ok(stored)
}

/// Adds the speed-up section to `a` when `dir` holds a `speedup.json`.
pub fn add_stored(dir: &Path, a: &mut Analysis) -> anyhow::Result<()> {
    let p = dir.join(FILE);
    if !p.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    let stored: Stored =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
    add(&stored, a);
    Ok(())
}

/// One job at one core count over its repetitions.
struct Cell {
    job: String,
    cores: usize,
    wall: Vec<f64>,
    cpu: Vec<f64>,
    failed: usize,
}

fn cells(stored: &Stored) -> Vec<Cell> {
    let mut out: Vec<Cell> = Vec::new();
    for (_, r) in &stored.runs {
        let i = match out
            .iter()
            .position(|c| c.job == r.job && c.cores == r.cores)
        {
            Some(i) => i,
            None => {
                out.push(Cell {
                    job: r.job.clone(),
                    cores: r.cores,
                    wall: Vec::new(),
                    cpu: Vec::new(),
                    failed: 0,
                });
                out.len() - 1
            }
        };
        if r.exit == Some(0) {
            out[i].wall.push(r.wall_s);
            out[i].cpu.push(r.cpu_s);
        } else {
            out[i].failed += 1;
        }
    }
    out
}

/// The section (a plot of runtime against cores per job, one of speed-up, and a table)
/// and the summary's lines for `stored`.
pub fn add(stored: &Stored, a: &mut Analysis) {
    let cells = cells(stored);
    let mut jobs: Vec<&str> = Vec::new();
    for c in &cells {
        if !jobs.contains(&c.job.as_str()) {
            jobs.push(&c.job);
        }
    }
    let max_cores = cells.iter().map(|c| c.cores).max().unwrap_or(1);
    let mut runtime = Vec::new();
    let mut speedup = Vec::new();
    let mut rows = Vec::new();
    a.summary
        .push_str("\nspeed-up (each job alone; runtime by cores):\n");
    for (color, job) in jobs.iter().enumerate() {
        let mine: Vec<&Cell> = cells.iter().filter(|c| c.job == *job).collect();
        let base = mine
            .iter()
            .filter(|c| !c.wall.is_empty())
            .min_by_key(|c| c.cores)
            .map(|c| (c.cores, mean_sd(&c.wall).0));
        let mut line = format!("  {job}:");
        let mut pts = Vec::new();
        let mut ups = Vec::new();
        for c in &mine {
            let (m, sd) = mean_sd(&c.wall);
            let (cpu, _) = mean_sd(&c.cpu);
            let up = base.map(|(_, b)| b / m);
            if !m.is_nan() {
                pts.push(Point::with_ci(c.cores as f64, m, m - sd, m + sd));
                if let Some(u) = up {
                    ups.push(Point::new(c.cores as f64, u));
                }
                line.push_str(&format!(" {} core(s) {m:.2} s;", c.cores));
            }
            let runs = c.wall.len() + c.failed;
            rows.push(
                Row::new([
                    job.to_string(),
                    c.cores.to_string(),
                    if m.is_nan() {
                        "-".into()
                    } else {
                        format!("{m:.2} ± {sd:.2}")
                    },
                    up.filter(|u| u.is_finite())
                        .map_or("-".into(), |u| format!("{u:.2}×")),
                    if cpu.is_nan() {
                        "-".into()
                    } else {
                        format!("{cpu:.2}")
                    },
                    format!("{}/{runs}", c.wall.len()),
                ])
                .highlighted(c.failed > 0),
            );
        }
        a.summary.push_str(line.trim_end_matches(';'));
        a.summary.push('\n');
        runtime.push(Series {
            name: job.to_string(),
            color: Some(color),
            points: pts,
            ..Series::default()
        });
        speedup.push(Series {
            name: job.to_string(),
            color: Some(color),
            points: ups,
            ..Series::default()
        });
    }
    let ticks: Vec<(f64, String)> = (1..=max_cores).map(|c| (c as f64, c.to_string())).collect();
    speedup.push(Series {
        name: "linear".into(),
        style: LineStyle::Dashed,
        color: Some(jobs.len()),
        points: (1..=max_cores)
            .map(|c| Point::new(c as f64, c as f64))
            .collect(),
    });
    let sec = Section {
        title: "Batch jobs: runtime vs cores".into(),
        text: vec![format!(
            "Each job of {} alone, its threads set to its core count and every process pinned \
             to that many of CPUs {} (taskset), {} time(s) per count; runtime is wall time \
             (mean ± sd), speed-up is the runtime on the fewest cores over this one, CPU time \
             is the job's processes' user + system time.",
            stored.jobs,
            stored.cpus,
            stored.runs.iter().map(|(r, _)| r + 1).max().unwrap_or(0)
        )],
        items: vec![
            Item::LinePlot(LinePlot {
                title: "Batch jobs: runtime vs cores".into(),
                x_label: "cores (= threads)".into(),
                y_label: "runtime (s)".into(),
                x_ticks: Some(ticks.clone()),
                error_bars: Some("± 1 sd over repetitions".into()),
                series: runtime,
                ..LinePlot::default()
            }),
            Item::LinePlot(LinePlot {
                title: "Batch jobs: speed-up vs cores".into(),
                x_label: "cores (= threads)".into(),
                y_label: "speed-up (×)".into(),
                x_ticks: Some(ticks),
                series: speedup,
                ..LinePlot::default()
            }),
            Item::Table(Table {
                title: "Batch jobs: runtime by cores".into(),
                columns: [
                    "job",
                    "cores",
                    "runtime (s, mean ± sd)",
                    "speed-up",
                    "CPU time (s)",
                    "runs ok",
                ]
                .map(String::from)
                .to_vec(),
                rows,
                caption: Some("Highlighted: a run that did not exit 0 (left out).".into()),
            }),
        ],
    };
    a.report.sections.push(sec);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(job: &str, cores: usize, wall_s: f64, exit: i32) -> SpeedupRow {
        SpeedupRow {
            job: job.into(),
            cores,
            wall_s,
            cpu_s: wall_s * cores as f64,
            exit: Some(exit),
        }
    }

    fn empty() -> Analysis {
        Analysis {
            report: kvlab_report::Report {
                title: "t".into(),
                subtitle: None,
                metadata: Vec::new(),
                sections: Vec::new(),
            },
            summary: String::new(),
        }
    }

    #[test]
    fn the_section_has_each_job_s_runtime_and_speed_up_by_cores() {
        let stored = Stored {
            jobs: "jobs.toml".into(),
            cpus: "0-1".into(),
            runs: vec![
                (0, row("zstd", 1, 10.0, 0)),
                (0, row("zstd", 2, 6.0, 0)),
                (0, row("sort", 1, 4.0, 0)),
                (1, row("zstd", 1, 12.0, 0)),
                (1, row("zstd", 2, 5.0, 0)),
                (1, row("sort", 1, 9.0, 1)),
            ],
        };
        let mut a = empty();
        add(&stored, &mut a);
        let sec = &a.report.sections[0];
        let Item::LinePlot(runtime) = &sec.items[0] else {
            panic!("a plot first")
        };
        assert_eq!(runtime.series.len(), 2);
        let zstd = &runtime.series[0];
        assert_eq!(zstd.points.len(), 2);
        assert_eq!((zstd.points[0].x, zstd.points[0].y), (1.0, 11.0));
        assert_eq!((zstd.points[1].x, zstd.points[1].y), (2.0, 5.5));
        let Item::LinePlot(up) = &sec.items[1] else {
            panic!("the speed-up plot second")
        };
        assert_eq!(up.series[0].points[1].y, 2.0);
        // zstd, sort, and the linear reference.
        assert_eq!(up.series.len(), 3);
        let Item::Table(t) = &sec.items[2] else {
            panic!("a table last")
        };
        let cells: Vec<Vec<&str>> = t
            .rows
            .iter()
            .map(|r| r.cells.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            cells[0],
            ["zstd", "1", "11.00 ± 1.41", "1.00×", "11.00", "2/2"]
        );
        assert_eq!(
            cells[1],
            ["zstd", "2", "5.50 ± 0.71", "2.00×", "11.00", "2/2"]
        );
        // The failed run is left out and flagged.
        assert_eq!(
            cells[2],
            ["sort", "1", "4.00 ± 0.00", "1.00×", "4.00", "1/2"]
        );
        assert!(t.rows[2].highlight && !t.rows[0].highlight);
        assert!(
            a.summary
                .contains("zstd: 1 core(s) 11.00 s; 2 core(s) 5.50 s"),
            "{}",
            a.summary
        );
    }

    #[test]
    fn running_stores_every_job_at_every_core_count_and_cleans_up() {
        if kvlab_process::which("taskset").is_none() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("jobs.toml"),
            "prepare = [\"echo x > {work}/in\"]\n\
             [[job]]\nname = \"a\"\ncommand = \"cat {work}/in > /dev/null\"\ncores = [1, 2]\n\
             [[job]]\nname = \"b\"\ncommand = \"true\"\n",
        )
        .unwrap();
        let spec = SpeedupSpec {
            jobs: "jobs.toml".into(),
            cpus: Some("0".into()),
            repetitions: 2,
        };
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        let stored = run(&spec, dir.path(), &out).unwrap();
        // One CPU: job a at 1 core only (2 does not fit), b at 1; twice each.
        let seen: Vec<(usize, &str, usize)> = stored
            .runs
            .iter()
            .map(|(r, x)| (*r, x.job.as_str(), x.cores))
            .collect();
        assert_eq!(seen, [(0, "a", 1), (0, "b", 1), (1, "a", 1), (1, "b", 1)]);
        assert!(stored.runs.iter().all(|(_, x)| x.exit == Some(0)));
        assert!(!out.join("speedup-work").exists());
        let mut a = empty();
        add_stored(&out, &mut a).unwrap();
        assert_eq!(a.report.sections.len(), 1);
    }
}
