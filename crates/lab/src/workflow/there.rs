//! The controller and its jobs on the server's host, when that host is reached over ssh: the
//! lab hands `kvlab control` there what it would run here, as flags — the job file (written
//! once, its inputs made once), the calibration (`--calibrate-only`), the jobs alone on one
//! core (`--speedup`), and each run (the policy's own flags, `--pid` of the server placed
//! there) — streams the load's rows, which the lab writes, into the file the controller
//! reads, and brings the control log and the outcome back. The controller reads its times
//! in the lab's clock (`--clock-offset-us`, the host's offset measured when it connected),
//! so that its events and the load's rows line up as they do here.

use std::io::Read;
use std::path::Path;
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

    /// One run's controller on the host: `o` as `kvlab control` flags (`o.log` and the
    /// outcome brought back beside `o.log` here), the load's rows from `o.live` (a file here
    /// the load writes) streamed to it while it runs; `methods` how CPUs move and jobs
    /// pause. Also the controller's process (ended by the time this returns). A stop ends
    /// it as a signal ends `kvlab control`: the jobs stopped, the outcome written.
    pub(super) fn control(
        &self,
        index: usize,
        o: &app::Options,
        methods: (&str, &str),
        stop: &dyn Fn() -> bool,
    ) -> anyhow::Result<(Outcome, Started)> {
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
        let mut argv = vec![
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
        let started = self.pl.start(&self.host, &name, &argv);
        let waited = started
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e:#}"))
            .and_then(|p| self.wait(p, o.max + Duration::from_secs(60), stop));
        done.store(true, Ordering::Relaxed);
        let forwarded = forward
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the rows' stream panicked")));
        let started = started?;
        let here = o.log.with_file_name(format!("{name}.log"));
        self.pl.stop(&started, &here);
        waited?;
        forwarded.with_context(|| format!("streaming the load's rows to host {}", self.host))?;
        remote.fetch(&format!("{rdir}/control.jsonl"), &o.log)?;
        let summary = o.log.with_file_name("outcome.json");
        let mut outcome: Outcome = self
            .fetch_json(&format!("runs/{index:04}/outcome.json"), &summary)
            .with_context(|| {
                format!(
                    "the controller on host {} wrote no outcome (its output: {})",
                    self.host,
                    here.display()
                )
            })?;
        outcome.capacity = app::capacity_used(&o.policy, o.calibration.as_ref());
        outcome.calibration = o.calibration.clone();
        Ok((outcome, started))
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
