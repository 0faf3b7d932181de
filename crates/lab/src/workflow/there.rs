//! The controller and its jobs on the server's host, when that host is reached over ssh: the
//! lab hands `kvlab control` there what it would run here, as flags — the job file (written
//! once, its inputs made once), the calibration (`--calibrate-only`), the jobs alone on one
//! core (`--speedup`), and each run (the policy's own flags, `--pid` of the server placed
//! there; started before the load, it becomes the controller at the load's first row)
//! — streams the load's rows, which the lab writes, into the file the controller reads, and
//! brings the control log and the outcome back; the run's figures are counted from the lab's
//! own rows. The controller reads its times
//! in the lab's clock (`--clock-offset-us`, the host's offset measured when it connected),
//! so that its events and the load's rows line up as they do here.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_control::app::{self, Outcome};
use kvlab_control::calibrate::{CalibrateSpec, Calibration};
use kvlab_control::speedup::SpeedupRow;
use kvlab_control::{CpuSet, JobFile};
use kvlab_hosts::{quote, Started};

use crate::placement::Placement;

/// How long making the jobs' inputs, or running them alone, may take on the host.
const LONG: Duration = Duration::from_secs(1800);
/// How often the lab looks whether the controller is still running.
const POLL: Duration = Duration::from_millis(200);
/// How often the load's new rows go to the host.
const FORWARD: Duration = Duration::from_millis(10);

/// `kvlab control` on one host: its run directory, the job file there, and the host's clock.
pub(super) struct There {
    pl: Arc<Placement>,
    host: String,
    kvlab: String,
    dir: String,
    /// The host's clock minus the lab's, µs.
    offset_us: i64,
}

impl There {
    /// Prepares host `host` for the controller: the job file in its run directory and the
    /// jobs' inputs made there (`kvlab control --prepare-only`). Refused when the host's
    /// clock is known no better than `interval` (the load's rows could not be lined up with
    /// the controller's events).
    pub(super) fn open(
        pl: &Arc<Placement>,
        host: &str,
        jobs: &JobFile,
        interval: Duration,
    ) -> anyhow::Result<There> {
        let clock = pl
            .clock(host)
            .with_context(|| format!("host {host}: its clock was not read"))?;
        if u128::from(clock.bound_ns) > interval.as_nanos() {
            bail!(
                "host {host}: its clock is known to ±{:.3} ms, more than the load's rows' \
                 {:?}: the controller there could not line its events up with them",
                clock.bound_ns as f64 / 1e6,
                interval
            );
        }
        let there = There {
            pl: pl.clone(),
            host: host.to_string(),
            kvlab: pl.kvlab(host)?,
            dir: pl.run_dir(host)?,
            offset_us: clock.offset_ns / 1000,
        };
        pl.write(host, &there.path("jobs.toml"), &jobs.to_toml())?;
        eprintln!("making the jobs' inputs on host {host}");
        there.kvlab_control(
            "making the jobs' inputs",
            &[
                "--prepare-only".into(),
                "--jobs".into(),
                there.path("jobs.toml"),
                "--work-dir".into(),
                there.work(),
            ],
            LONG,
        )?;
        Ok(there)
    }

    /// The host's name.
    pub(super) fn host(&self) -> &str {
        &self.host
    }

    /// `name` in the host's run directory.
    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.dir)
    }

    /// Where the jobs run and their inputs are, on the host.
    pub(super) fn work(&self) -> String {
        self.path("work")
    }

    /// Runs `kvlab control ARGS` on the host to its end (at most `limit`).
    fn kvlab_control(&self, what: &str, args: &[String], limit: Duration) -> anyhow::Result<()> {
        let mut argv = vec![self.kvlab.clone(), "control".into()];
        argv.extend_from_slice(args);
        let script = format!(
            "cd {} && {}",
            quote(&self.dir),
            kvlab_hosts::quote_all(&argv)
        );
        self.pl.run_for(&self.host, what, &script, limit)?;
        Ok(())
    }

    /// Fetches the host's file `name` (in its run directory) to `local` and parses it.
    fn fetch_json<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
        local: &Path,
    ) -> anyhow::Result<T> {
        self.pl.remote(&self.host)?.fetch(&self.path(name), local)?;
        let text = std::fs::read_to_string(local)?;
        serde_json::from_str(&text).with_context(|| format!("reading {}", local.display()))
    }

    /// The server `pid` (listening at `addr`) calibrated on the host, as
    /// [`kvlab_control::calibrate::calibrate`] does here: the generator of `kvlab control
    /// --calibrate-only` runs on the host too. Kept in `local`.
    pub(super) fn calibrate(
        &self,
        pid: u32,
        addr: std::net::SocketAddr,
        cpus: &CpuSet,
        c: &CalibrateSpec,
        workload: &toml::Table,
        local: &Path,
    ) -> anyhow::Result<Calibration> {
        let mut args = vec![
            "--calibrate-only".into(),
            "--pid".into(),
            pid.to_string(),
            "--addr".into(),
            addr.to_string(),
            "--cpus".into(),
            cpus.to_string(),
            "--slo-p95-us".into(),
            c.slo_p95_us.to_string(),
            "--calibrate-time".into(),
            c.max_time_s.to_string(),
            "--calibrate-from".into(),
            c.start_qps.to_string(),
            "--summary".into(),
            self.path("calibration.json"),
        ];
        if let Some(g) = &c.generator_cpus {
            args.extend(["--generator-cpus".into(), g.to_string()]);
        }
        for (k, v) in workload {
            let v = match v {
                toml::Value::String(s) => s.clone(),
                o => o.to_string(),
            };
            args.extend(["--calibrate-load".into(), format!("{k}={v}")]);
        }
        // Each core count's search is bounded by the calibration's time, and then some.
        let limit = Duration::from_secs_f64(c.max_time_s * 1.5 * cpus.len() as f64 + 60.0);
        self.kvlab_control("calibrating", &args, limit)?;
        self.fetch_json("calibration.json", local)
    }

    /// `jobs` alone at each of their core counts on the host (`kvlab control --speedup`),
    /// kept in `local`.
    pub(super) fn speedup(
        &self,
        jobs: &JobFile,
        cpus: &CpuSet,
        local: &Path,
    ) -> anyhow::Result<Vec<SpeedupRow>> {
        self.pl
            .write(&self.host, &self.path("jobs-alone.toml"), &jobs.to_toml())?;
        self.kvlab_control(
            "running the jobs alone",
            &[
                "--speedup".into(),
                "--no-prepare".into(),
                "--jobs".into(),
                self.path("jobs-alone.toml"),
                "--work-dir".into(),
                self.work(),
                "--cpus".into(),
                cpus.to_string(),
                "--summary".into(),
                self.path("jobs-alone.json"),
            ],
            LONG,
        )?;
        self.fetch_json("jobs-alone.json", local)
    }

    /// Starts one run's controller on the host: `o` as `kvlab control` flags, `methods` how
    /// CPUs move and jobs pause, the load's rows from `o.live` (a file here the load writes)
    /// streamed to it. Started before the load — its directory, job file, stream and process
    /// made over ssh, however long that takes — it becomes `kvlab control` once the load's
    /// first row is there, as a controller here starts with the trace. [`Running::finish`]
    /// waits for it; dropped unfinished (the load failed or wrote nothing), it is stopped.
    pub(super) fn start_control(
        &self,
        index: usize,
        o: &app::Options,
        methods: (&str, &str),
    ) -> anyhow::Result<Running<'_>> {
        let rdir = self.path(&format!("runs/{index:04}"));
        self.pl.run(
            &self.host,
            "making the run's directory",
            &format!("mkdir -p {}", quote(&rdir)),
        )?;
        if let Some(slo) = o.policy.slo_p95_us() {
            if slo != o.slo_p95_us {
                bail!(
                    "the policy's SLO ({slo} µs) is not the run's ({} µs)",
                    o.slo_p95_us
                );
            }
        }
        let live = format!("{rdir}/live.jsonl");
        // `sh -c SCRIPT sh LIVE KVLAB ARGS…`: waits for the first row, then is the controller.
        let mut argv = vec![
            "sh".into(),
            "-c".into(),
            "f=$1; shift; until [ -s \"$f\" ]; do sleep 0.01; done; exec \"$@\"".into(),
            "sh".into(),
            live.clone(),
            self.kvlab.clone(),
            "control".into(),
            "--pid".into(),
            o.pid.to_string(),
            "--work-dir".into(),
            self.work(),
            "--no-prepare".into(),
            "--slo-p95-us".into(),
            o.slo_p95_us.to_string(),
            "--cpus".into(),
            o.share.cpus.to_string(),
            "--min-server-cores".into(),
            o.share.min_server.to_string(),
            "--cpu-method".into(),
            methods.0.into(),
            "--pause-method".into(),
            methods.1.into(),
            "--live".into(),
            live.clone(),
            "--interval-ms".into(),
            o.interval.as_millis().max(1).to_string(),
            "--duration".into(),
            o.max.as_secs_f64().to_string(),
            "--log".into(),
            format!("{rdir}/control.jsonl"),
            "--summary".into(),
            format!("{rdir}/outcome.json"),
            "--clock-offset-us".into(),
            self.offset_us.to_string(),
        ];
        argv.extend(o.policy.flags());
        if let Some(a) = o.stats {
            argv.extend(["--addr".into(), a.to_string()]);
        }
        if !o.jobs.jobs.is_empty() {
            self.pl
                .write(&self.host, &format!("{rdir}/jobs.toml"), &o.jobs.to_toml())?;
            argv.extend(["--jobs".into(), format!("{rdir}/jobs.toml")]);
        }
        if o.share.idle_jobs {
            argv.push("--idle-jobs".into());
        }
        if !o.until_jobs_done {
            argv.push("--keep-running".into());
        }
        let local = o
            .live
            .clone()
            .context("a controller on a host steers by the load's rows (--live)")?;
        let remote = self.pl.remote(&self.host)?;
        let rows = remote.append_to(&live)?;
        let done = Arc::new(AtomicBool::new(false));
        let forward = {
            let done = done.clone();
            std::thread::Builder::new()
                .name("kvlab-rows".into())
                .spawn(move || forward_rows(&local, rows, &done))
                .context("starting the rows' stream")?
        };
        let name = format!("control-{index:04}");
        let mut running = Running {
            there: self,
            index,
            here: o.log.with_file_name(format!("{name}.log")),
            started: None,
            forward: Some((forward, done)),
        };
        running.started = Some(self.pl.start(&self.host, &name, &argv)?);
        Ok(running)
    }

    /// Waits until `p` has ended (stopping it at `stop()` or after `limit`); a lost host is
    /// an error naming it.
    fn wait(&self, p: &Started, limit: Duration, stop: &dyn Fn() -> bool) -> anyhow::Result<()> {
        let remote = self.pl.remote(&self.host)?;
        let deadline = Instant::now() + limit;
        loop {
            if !remote
                .running(p)
                .with_context(|| format!("the controller on host {}", self.host))?
            {
                return Ok(());
            }
            if stop() || Instant::now() > deadline {
                remote.stop(p)?;
                return Ok(());
            }
            std::thread::sleep(POLL);
        }
    }
}

/// A controller started on its host ([`There::start_control`]).
pub(super) struct Running<'a> {
    there: &'a There,
    index: usize,
    /// Where its output goes here.
    here: PathBuf,
    started: Option<Started>,
    /// The rows' stream and the flag that ends it.
    forward: Option<(std::thread::JoinHandle<anyhow::Result<()>>, Arc<AtomicBool>)>,
}

impl Running<'_> {
    /// Waits for the controller to end (at most `o.max` and a minute; a stop ends it as a
    /// signal ends `kvlab control`: the jobs stopped, the outcome written), then brings its
    /// log (to `o.log`) and its outcome back. Also the controller's process.
    pub(super) fn finish(
        mut self,
        o: &app::Options,
        stop: &dyn Fn() -> bool,
    ) -> anyhow::Result<(Outcome, Started)> {
        let t = self.there;
        let started = self
            .started
            .take()
            .context("the controller was not started")?;
        let waited = t.wait(&started, o.max + Duration::from_secs(60), stop);
        let forwarded = self.end_stream();
        t.pl.stop(&started, &self.here);
        waited?;
        forwarded.with_context(|| format!("streaming the load's rows to host {}", t.host))?;
        let rdir = format!("runs/{:04}", self.index);
        let remote = t.pl.remote(&t.host)?;
        remote.fetch(&t.path(&format!("{rdir}/control.jsonl")), &o.log)?;
        let summary = o.log.with_file_name("outcome.json");
        let mut outcome: Outcome = t
            .fetch_json(&format!("{rdir}/outcome.json"), &summary)
            .with_context(|| {
                format!(
                    "the controller on host {} wrote no outcome (its output: {})",
                    t.host,
                    self.here.display()
                )
            })?;
        outcome.capacity = app::capacity_used(&o.policy, o.calibration.as_ref());
        outcome.calibration = o.calibration.clone();
        Ok((outcome, started))
    }

    /// Ends the rows' stream (what is left sent first).
    fn end_stream(&mut self) -> anyhow::Result<()> {
        let Some((thread, done)) = self.forward.take() else {
            return Ok(());
        };
        done.store(true, Ordering::Relaxed);
        thread
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the rows' stream panicked")))
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.started.take() {
            self.there.pl.stop(&p, &self.here);
        }
        if let Err(e) = self.end_stream() {
            eprintln!("note: the rows' stream to host {}: {e:#}", self.there.host);
        }
    }
}

/// A remote controller's figures counted again here, from its log (brought back) and the
/// lab's own rows of the load: the rows streamed to the host can lag the load (a loaded
/// machine, a slow ssh), and a controller that ends when its jobs do may have counted too few
/// of them; the lab's are whole. As `kvlab control` counts them: the segments over the jobs'
/// span, or, when no job ran or one had not ended, the rows up to the controller's last
/// event (it saw no later ones).
pub(super) fn summary_here(
    events: &[kvlab_control::event::Event],
    rows: &[kvlab_bench::run::IntervalRow],
    slo_p95_us: f64,
) -> kvlab_control::summary::RunSummary {
    use kvlab_control::summary::{job_span, summarise};
    let end = match job_span(events) {
        (_, u64::MAX) => events.iter().map(|e| e.unix_ms).max().unwrap_or(u64::MAX),
        _ => u64::MAX,
    };
    let seen: Vec<kvlab_bench::run::IntervalRow> =
        rows.iter().filter(|r| r.ts_end <= end).cloned().collect();
    summarise(events, &seen, slo_p95_us)
}

/// The programs `jobs` run (their commands' and `prepare`'s): of each part of a command
/// line (split at `|`, `;`, `&&` and `||`), the first word after any `NAME=value`, when
/// it is a plain program name — what `command -v` must find on a host before any run.
pub(super) fn programs(jobs: &JobFile) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let lines = jobs
        .prepare
        .iter()
        .chain(jobs.jobs.iter().map(|j| &j.command));
    for line in lines {
        for part in line.split(['|', ';', '&']) {
            let word = part
                .split_whitespace()
                .find(|w| !w.contains('='))
                .unwrap_or_default();
            let plain = !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-+/".contains(c));
            if plain && !out.iter().any(|p| p == word) {
                out.push(word.to_string());
            }
        }
    }
    out
}

/// Appends the lines the load adds to `local` to `rows` until `done` (then what is left).
fn forward_rows(
    local: &Path,
    mut rows: kvlab_hosts::Appender,
    done: &AtomicBool,
) -> anyhow::Result<()> {
    let mut at = 0u64;
    let mut pending = Vec::new();
    loop {
        let last = done.load(Ordering::Relaxed);
        if let Ok(mut f) = std::fs::File::open(local) {
            use std::io::Seek as _;
            f.seek(std::io::SeekFrom::Start(at))?;
            let n = f.read_to_end(&mut pending)?;
            at += n as u64;
            // Whole lines only: a row being written goes with the next pass.
            if let Some(end) = pending.iter().rposition(|&b| b == b'\n') {
                rows.append(&pending[..=end])?;
                pending.drain(..=end);
            }
        }
        if last {
            return Ok(rows.finish()?);
        }
        std::thread::sleep(FORWARD);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use super::*;

    /// The load as `kvlab bench --live` writes it, from t = 100 s: 1 s trace segments (steps
    /// 0..6) in 100 ms rows of 100 requests at 200 µs.
    fn load_rows() -> Vec<kvlab_bench::run::IntervalRow> {
        let mut h = kvlab_measure::new_histogram();
        for _ in 0..100 {
            kvlab_measure::record(&mut h, 200_000);
        }
        let hist = kvlab_measure::EncodedHistogram::encode(&h).unwrap();
        (0..60u64)
            .map(|i| {
                let mut r = kvlab_bench::run::IntervalRow {
                    ts_start: 100_000 + i * 100,
                    ts_end: 100_100 + i * 100,
                    warmup: false,
                    step: (i / 10) as usize,
                    target_qps: Some(1000.0),
                    achieved_qps: 1000.0,
                    counters: Default::default(),
                    latency: Default::default(),
                    latency_send: Default::default(),
                    latency_hist: Some(hist.clone()),
                };
                r.counters.completed = 100;
                r
            })
            .collect()
    }

    fn events(log: &str) -> Vec<kvlab_control::event::Event> {
        log.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn a_remote_controller_s_figures_are_counted_from_the_lab_s_rows() {
        use kvlab_control::summary::summarise;
        let rows = load_rows();
        let steps = |s: &kvlab_control::summary::RunSummary| -> Vec<usize> {
            s.segments.iter().map(|g| g.step).collect()
        };
        // The job ran from 102.5 s to 103.5 s: segments 2 and 3, whole in the lab's rows.
        // The host had been streamed rows up to 102.2 s when its controller ended (a lagging
        // stream): segment 2 unfinished there, it counted none (no baseline could follow).
        let job = events(
            r#"{"t_s":0.0,"unix_ms":100000,"event":"sample","cores":2,"running":0,"paused":0}
{"t_s":2.5,"unix_ms":102500,"event":"start","job":"a","cores":1,"pid":7,"reason":"1 core(s) free"}
{"t_s":3.5,"unix_ms":103500,"event":"end","job":"a","exit":0,"runtime_s":1.0,"paused_s":0.0,"pauses":0}
{"t_s":3.6,"unix_ms":103600,"event":"stop","why":"every job ended"}"#,
        );
        let lagged: Vec<_> = rows
            .iter()
            .filter(|r| r.ts_end <= 102_200)
            .cloned()
            .collect();
        let there = summarise(&job, &lagged, 1000.0);
        assert!(steps(&there).is_empty());
        let here = summary_here(&job, &rows, 1000.0);
        assert_eq!(steps(&here), [2, 3]);
        assert_eq!(here.segments[0].requests, 1000);
        assert_eq!(here.jobs.len(), 1);
        // No job (a baseline): the rows up to the controller's last event, 104 s, and no
        // later one the load wrote before the lab stopped it.
        let none = events(
            r#"{"t_s":0.0,"unix_ms":100000,"event":"sample","cores":2,"running":0,"paused":0}
{"t_s":4.0,"unix_ms":104000,"event":"stop","why":"time limit (4 s)"}"#,
        );
        let here = summary_here(&none, &rows, 1000.0);
        assert_eq!(steps(&here), [0, 1, 2, 3]);
        assert_eq!(here.intervals, 40);
    }

    #[test]
    fn the_programs_of_a_job_file_are_its_commands_first_words() {
        let jobs = JobFile::parse(
            "prepare = [\"vips gaussnoise {work}/n.v 10 10\", \"seq 9 > {work}/x\"]\n\
             [[job]]\nname = \"a\"\ncommand = \"VIPS_CONCURRENCY={threads} vips resize x y 2\"\n\
             [[job]]\nname = \"b\"\ncommand = \"head -c 9 {work}/x | xz -T{threads} > y && sync\"\n\
             [[job]]\nname = \"c\"\ncommand = \"stress-ng --cache 1 --cache-ops $((6 / 2)) -q\"\n",
        )
        .unwrap();
        assert_eq!(
            programs(&jobs),
            ["vips", "seq", "head", "xz", "sync", "stress-ng"]
        );
    }
}
