//! Runs every point × repetition of an experiment and stores the raw results.
//!
//! ```text
//! results/<experiment>-<date>/
//!   meta.json            kvlab version + commit, machine, date, command, the experiment text
//!   raw/NNNN.json        one per run: levels, system, flags, bench RunResult, latency
//!                        histogram (or an external generator's figures and CPU,
//!                        `external`), the system's CPU time from /proc/<pid>/stat
//!   logs/<system>-N.log  each started system's output (a proxy's backends':
//!                        <system>-N.backend<i>.log; the proxy's window CSVs:
//!                        <system>-N.windows/); an external generator's output:
//!                        run-NNNN.<generator>.txt (.cfg, .json, .warmup.txt)
//!   report/index.html    written by the analysis (`kvlab lab analyse DIR` rewrites it)
//! ```
//!
//! Runs are interleaved (repetition-major: every point and system once, then again) so a
//! slow drift of the machine spreads over all points instead of biasing one.
//!
//! This file holds the run loop; `results` what a run stores (records, meta, their JSON);
//! `readings` what is read about a system around a run.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use kvlab_analysis::laws;
use kvlab_bench::run::IntervalRow;
use kvlab_bench::Protocol;

mod readings;
mod results;

use readings::{Reader, Reading};
pub use results::{
    commit, load, rfc3339, stamp, write_json, AgentShare, CpuSample, Hist, MachineCpu, Meta,
    ProxyFigures, RawRun,
};

use crate::generator::{self, Generator, Invocation};
use crate::placement::Placement;
use crate::spec::{levels_text, Experiment, Flags, PlannedRun};
use crate::system::{self, Instance};

fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    format!("{}:{:02}", s / 60, s % 60)
}

/// Runs the experiment into `out`, starting `kvlab_bin` for kvlab systems without a `binary`.
/// Returns the stored runs.
pub fn run_experiment(
    exp: &Experiment,
    meta: &mut Meta,
    out: &Path,
    kvlab_bin: Option<&Path>,
) -> anyhow::Result<Vec<RawRun>> {
    let raw_dir = out.join("raw");
    std::fs::create_dir_all(&raw_dir).with_context(|| format!("creating {}", raw_dir.display()))?;
    let available = available_systems(exp, meta, kvlab_bin)?;
    let missing = missing_generators(exp, meta);
    let runs: Vec<PlannedRun> = exp
        .runs()
        .into_iter()
        .filter(|r| available[r.system] && !missing.contains(&(r.part, r.point)))
        .collect();
    if runs.is_empty() {
        anyhow::bail!("no runs: every system was skipped");
    }
    meta.runs = runs.len();
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let placement = Placement::open(exp, kvlab_bin, &crate::placement::run_name(out), &logs)?;
    if let Some(pl) = &placement {
        meta.hosts = pl.meta(&Default::default());
    }
    write_json(&out.join("meta.json"), meta)?;
    let planned_total: f64 = runs.iter().map(|r| exp.planned_seconds(r)).sum();
    eprintln!(
        "experiment {}: {} runs ({} parts, {} systems), about {} of measurement; results in {}",
        exp.name,
        runs.len(),
        exp.parts.len(),
        available.iter().filter(|a| **a).count(),
        fmt_secs(planned_total),
        out.display()
    );
    let t0 = Instant::now();
    let mut planned_done = 0.0;
    let mut stored = Vec::new();
    let mut running: Vec<Instance> = Vec::new();
    let mut starts = 0usize;
    let mut current_part = usize::MAX;
    let tty = std::io::stderr().is_terminal();
    for (i, r) in runs.iter().enumerate() {
        let part = &exp.parts[r.part];
        if r.part != current_part {
            // Each part starts from fresh systems.
            for inst in running.drain(..) {
                inst.stop();
            }
            current_part = r.part;
            match &part.description {
                Some(d) => eprintln!("part {}: {d}", part.name),
                None => eprintln!("part {}", part.name),
            }
        }
        let spec = &exp.systems[r.system];
        let levels = part.points[r.point].clone();
        let flags = spec
            .render(&levels)
            .with_context(|| format!("part {:?}", part.name))?;
        let inst_index = instance_for(
            &mut running,
            exp,
            r,
            flags,
            &mut starts,
            out,
            kvlab_bin,
            placement.as_ref(),
        )?;
        let inst = &mut running[inst_index];
        let desc = levels_text(&levels);
        let elapsed = t0.elapsed().as_secs_f64();
        let eta = if planned_done > 0.0 {
            (planned_total - planned_done) * elapsed / planned_done
        } else {
            planned_total
        };
        eprintln!(
            "[{:>3}/{}] {} {} {} rep {}/{}   elapsed {}, about {} left",
            i + 1,
            runs.len(),
            part.name,
            spec.name,
            desc,
            r.repetition + 1,
            part.repetitions,
            fmt_secs(elapsed),
            fmt_secs(eta)
        );
        let raw = one_run(exp, r, i, inst, tty, &logs, placement.as_deref());
        print_outcome(&raw);
        write_json(&raw_dir.join(format!("{i:04}.json")), &raw)?;
        let failed = raw.error.is_some();
        stored.push(raw);
        planned_done += exp.planned_seconds(r);
        if let (true, Some(pl)) = (failed, &placement) {
            // A run that failed may have lost a host: that ends the experiment, by name.
            pl.check().context("after a failed run")?;
        }
    }
    for inst in running.drain(..) {
        inst.stop();
    }
    if let Some(pl) = placement {
        let end = pl.finish()?;
        meta.hosts = pl.meta(&end);
    }
    meta.elapsed_s = t0.elapsed().as_secs_f64();
    write_json(&out.join("meta.json"), meta)?;
    Ok(stored)
}

/// Which systems can run; systems that cannot start (a missing optional binary) are skipped
/// with a note, as are those no part serves.
fn available_systems(
    exp: &Experiment,
    meta: &mut Meta,
    kvlab_bin: Option<&Path>,
) -> anyhow::Result<Vec<bool>> {
    let mut available = vec![true; exp.systems.len()];
    for (i, s) in exp.systems.iter().enumerate() {
        if !s.hosts().is_empty() {
            // Its program is on its hosts: checked there (`Placement::open`).
            continue;
        }
        if let Err(e) = system::program(s, kvlab_bin) {
            if s.optional {
                eprintln!("note: skipping system {:?}: {e:#}", s.name);
                meta.skipped.push((s.name.clone(), format!("{e:#}")));
                available[i] = false;
            } else {
                return Err(e);
            }
        }
    }
    for (name, why) in exp.unserved() {
        eprintln!("note: system {name:?}: {why}");
        meta.skipped.push((name, why));
    }
    Ok(available)
}

/// The points (part, point) whose external generator is not on PATH: left out, with a note
/// per part and generator (in `meta.skipped` too).
fn missing_generators(exp: &Experiment, meta: &mut Meta) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (pi, part) in exp.parts.iter().enumerate() {
        let mut notes: Vec<(Generator, usize)> = Vec::new();
        for (k, g) in part.generators.iter().enumerate() {
            let Some(program) = g.program() else { continue };
            if system::which(program).is_some() {
                continue;
            }
            out.push((pi, k));
            match notes.iter_mut().find(|(n, _)| n == g) {
                Some((_, count)) => *count += 1,
                None => notes.push((*g, 1)),
            }
        }
        for (g, n) in notes {
            let why = format!(
                "part {}: {n} of {} points not run: {} is not on PATH ({})",
                part.name,
                part.points.len(),
                g.name(),
                g.install_hint()
            );
            eprintln!("note: generator {}: {why}", g.name());
            meta.skipped.push((format!("generator {}", g.name()), why));
        }
    }
    out
}

/// The index in `running` of an instance of run `r`'s system started with `flags`: this
/// system's instances with other flags are stopped, an exited one is replaced, and one is
/// started if needed.
#[allow(clippy::too_many_arguments)] // the run's context, passed down
fn instance_for(
    running: &mut Vec<Instance>,
    exp: &Experiment,
    r: &PlannedRun,
    flags: Flags,
    starts: &mut usize,
    out: &Path,
    kvlab_bin: Option<&Path>,
    placement: Option<&std::sync::Arc<Placement>>,
) -> anyhow::Result<usize> {
    let (system, spec, part) = (r.system, &exp.systems[r.system], &exp.parts[r.part]);
    let mut keep = Vec::new();
    for inst in running.drain(..) {
        if inst.system == system && (inst.flags != flags || spec.fresh) {
            inst.stop();
        } else {
            keep.push(inst);
        }
    }
    *running = keep;
    let mut pos = running.iter().position(|x| x.system == system);
    if let Some(p) = pos {
        if running[p].exited() {
            eprintln!("note: system {:?} exited; restarting it", spec.name);
            running.remove(p).stop();
            pos = None;
        }
    }
    Ok(match pos {
        Some(p) => p,
        None => {
            *starts += 1;
            let log = out
                .join("logs")
                .join(format!("{}-{}.log", spec.name, *starts));
            let http = part.uses_http(spec);
            let inst = Instance::start_in(system, spec, flags, http, &log, kvlab_bin, placement)?;
            running.push(inst);
            running.len() - 1
        }
    })
}

/// Prints one run's outcome under its progress line.
fn print_outcome(raw: &RawRun) {
    let cpu = raw
        .cpu
        .as_ref()
        .map(|c| format!(", server CPU {:.2} cores", c.utilization))
        .unwrap_or_default();
    let opt = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.1}"));
    if let Some(e) = &raw.error {
        eprintln!("        failed: {e}");
    } else if let Some(x) = &raw.external {
        let m = &x.measured;
        eprintln!(
            "        {:.0} req/s, mean {} µs, p99 {} µs ({}){cpu}, generator CPU {}",
            m.throughput_qps,
            opt(m.mean_us),
            opt(m.p99_us),
            x.generator.name(),
            x.cpu.map_or("–".to_string(), |c| format!("{c:.2} cores"))
        );
    } else if let Some(res) = &raw.result {
        eprintln!(
            "        {:.0} req/s, mean {:.1} µs, p99 {:.1} µs{cpu}{}",
            res.throughput_qps,
            res.latency.mean_us,
            res.latency.p99_us,
            raw.proxy
                .as_ref()
                .map(|p| format!(
                    "; proxy {:.1} µs (queue {:.1}, backend {:.1})",
                    p.total_us, p.queue_us, p.backend_us
                ))
                .unwrap_or_default()
        );
    }
}

fn one_run(
    exp: &Experiment,
    r: &PlannedRun,
    index: usize,
    inst: &mut Instance,
    tty: bool,
    logs: &Path,
    placement: Option<&Placement>,
) -> RawRun {
    let part = &exp.parts[r.part];
    let levels = part.points[r.point].clone();
    let mut raw = RawRun {
        index,
        part: part.name.clone(),
        point: r.point,
        levels,
        system: exp.systems[r.system].name.clone(),
        protocol: part.protocols[r.point],
        repetition: r.repetition,
        args: inst.flags.args.clone(),
        command: inst.command.clone(),
        version: inst.version.clone(),
        server_threads: inst.threads,
        population: 0,
        think_s: 0.0,
        started: rfc3339(std::time::SystemTime::now()),
        cpu: None,
        backends: inst.backend_commands(),
        proxy: None,
        backend_cpu: None,
        machine: None,
        cpus: inst.flags.cpus.clone(),
        corunner: None,
        result: None,
        external: None,
        latency_hist: None,
        error: None,
        placed: inst.placed_list(),
        hosts: Vec::new(),
        agents: Vec::new(),
    };
    if let Err(e) = measure(exp, r, inst, tty, logs, placement, &mut raw) {
        raw.error = Some(format!("{e:#}"));
    }
    raw
}

/// Loads `inst` for run `r` and fills in `raw`: kvlab bench in this process, or an external
/// generator ([`generator`]) with the system's readings around its measured invocation.
fn measure(
    exp: &Experiment,
    r: &PlannedRun,
    inst: &mut Instance,
    tty: bool,
    logs: &Path,
    placement: Option<&Placement>,
    raw: &mut RawRun,
) -> anyhow::Result<()> {
    let part = &exp.parts[r.part];
    let levels = raw.levels.clone();
    let levels = &levels;
    let wl = part.workload_of(levels)?;
    if !part.agents.is_empty() {
        let pl = placement.context("agents need the experiment's hosts")?;
        return measure_on_agents(exp, r, inst, tty, pl, wl, raw);
    }
    let seed = exp.seed.wrapping_add(r.repetition as u64);
    let load = wl.load(part.duration, part.warmup, seed)?;
    raw.population = if load.is_open() { 0 } else { load.population() };
    raw.think_s = load.think_us() as f64 / 1e6;
    let target = match (load.protocol, inst.http) {
        (Protocol::Memcached | Protocol::Meta, _) => inst.addr,
        (Protocol::Http, Some(h)) => h,
        (Protocol::Http, None) => anyhow::bail!("the system was started without an HTTP port"),
    };
    let reader = Reader::of(inst, Vec::new());
    let ticks = laws::clock_ticks_per_second();
    let corunner = part
        .corunner_of(levels)
        .map(|c| Corunner::start(&c))
        .transpose()?;
    if let Some(inv) = Invocation::plan(wl.generator, &wl, part.duration, part.warmup)? {
        let stem = logs.join(format!("run-{:04}.{}", raw.index, inv.generator.name()));
        let mut readings: Vec<Reading> = Vec::new();
        let ext = generator::pinned(wl.generator_cpus.as_ref(), || {
            generator::run(&inv, target, &stem, &mut || {
                readings.push(reader.read(false))
            })
        })?;
        raw.corunner = corunner.map(Corunner::stop);
        let (ext, (first, last)) = ext?;
        // The readings around the generator's activity: the first marks the start.
        readings.truncate(last + 1);
        readings.drain(..first);
        if let Some(r) = readings.first_mut() {
            r.warmup = true;
        }
        raw.external = Some(ext);
        reader.record(raw, ticks, &readings);
        return Ok(());
    }
    let mut cfg = load.config(target)?;
    let sig = wl.data_signature();
    cfg.load = cfg.load && inst.loaded.as_deref() != Some(sig.as_str());
    // CPU readings (and a proxy's `stats`) at every interval boundary the generator reports:
    // the measured window is `window`'s.
    let mut readings: Vec<Reading> = Vec::new();
    let mut progress = progress(&reader, &mut readings, tty, &cfg);
    let before = reader.read_hosts();
    let result = generator::pinned(wl.generator_cpus.as_ref(), || {
        kvlab_bench::run(&cfg, &[], &mut progress)
    })?;
    let after = reader.read_hosts();
    drop(progress);
    raw.corunner = corunner.map(Corunner::stop);
    if tty {
        eprint!("\r\x1b[2K");
    }
    let mut res = result.map_err(|e| anyhow::anyhow!("{e}"))?;
    if cfg.load {
        inst.loaded = Some(sig);
    }
    raw.latency_hist = res.hist.take().map(|h| Hist(h.latency));
    reader.record(raw, ticks, &readings);
    reader.record_hosts(raw, ticks, before, after);
    raw.result = Some(res);
    Ok(())
}

/// Loads `inst` for run `r` from the part's agents on their hosts (the lab's process only
/// collects): each system instance filled first when the workload loads, then every agent
/// host running one agent per instance, its clock offset applied to the common start; each
/// agent's share and histogram stored beside the merged figures.
fn measure_on_agents(
    exp: &Experiment,
    r: &PlannedRun,
    inst: &mut Instance,
    tty: bool,
    pl: &Placement,
    mut wl: crate::spec::WorkloadSpec,
    raw: &mut RawRun,
) -> anyhow::Result<()> {
    let part = &exp.parts[r.part];
    let seed = exp.seed.wrapping_add(r.repetition as u64);
    let targets = inst.addrs();
    let interval = wl.load(part.duration, part.warmup, seed)?.interval_s;
    let agents = pl.agents(
        &part.agents,
        &targets,
        std::time::Duration::from_secs_f64(interval),
    )?;
    // The part's clients, split evenly over its agents (checked when it was read, or now
    // for a pool's, counted when its Service was resolved).
    if let Some(c) = wl.clients {
        if c % agents.len() != 0 {
            anyhow::bail!(
                "clients = {c} cannot be split evenly over the {} agents",
                agents.len()
            );
        }
        wl.clients = Some(c / agents.len());
    }
    let load = wl.load(part.duration, part.warmup, seed)?;
    if load.protocol == Protocol::Http {
        anyhow::bail!("agents load over the memcached protocol (not http)");
    }
    let mut cfg = load.config(targets[0])?;
    let per = if load.is_open() { 0 } else { load.population() };
    raw.population = per * agents.len();
    raw.think_s = load.think_us() as f64 / 1e6;
    let sig = wl.data_signature();
    if cfg.load && inst.loaded.as_deref() != Some(sig.as_str()) {
        for &t in &targets {
            let mut one = cfg.clone();
            one.target = t;
            kvlab_bench::run::load_phase(&one).map_err(|e| anyhow::anyhow!("filling {t}: {e}"))?;
        }
        inst.loaded = Some(sig);
    }
    cfg.load = false;
    let agent_procs = pl.agent_processes();
    raw.placed
        .extend(agent_procs.iter().map(|p| pl.described(p)));
    let reader = Reader::of(inst, agent_procs);
    let mut readings: Vec<Reading> = Vec::new();
    let mut progress = progress(&reader, &mut readings, tty, &cfg);
    let spread: Vec<kvlab_bench::run::Agent> = agents.iter().map(|(_, a)| *a).collect();
    let before = reader.read_hosts();
    let result = kvlab_bench::run::run_from(&cfg, false, &spread, &mut progress);
    let after = reader.read_hosts();
    drop(progress);
    if tty {
        eprint!("\r\x1b[2K");
    }
    let mut res = result.map_err(|e| anyhow::anyhow!("{e}"))?;
    raw.latency_hist = res.hist.take().map(|h| Hist(h.latency));
    for p in &mut res.by_participant {
        let Some((host, a)) = agents.get(p.participant as usize) else {
            continue;
        };
        raw.agents.push(AgentShare {
            host: host.clone(),
            target: a.target.map_or_else(String::new, |t| t.to_string()),
            population: per,
            completed: p.counters.completed,
            throughput_qps: p.throughput_qps,
            mean_us: p.latency.mean_us,
            latency_hist: p.hist.take().map(Hist),
        });
    }
    let ticks = laws::clock_ticks_per_second();
    reader.record(raw, ticks, &readings);
    reader.record_hosts(raw, ticks, before, after);
    raw.result = Some(res);
    Ok(())
}

/// What kvlab bench calls at every interval: a reading of the system (pushed onto
/// `readings`), and on a terminal the progress line.
fn progress<'a>(
    reader: &'a Reader,
    readings: &'a mut Vec<Reading>,
    tty: bool,
    cfg: &kvlab_bench::BenchConfig,
) -> impl FnMut(&IntervalRow) + 'a {
    let total_s = cfg.end_ns() as f64 / 1e9;
    let mut first_ts: Option<u64> = None;
    move |row: &IntervalRow| {
        readings.push(reader.read(row.warmup));
        if tty {
            let first = *first_ts.get_or_insert(row.ts_start);
            let el = row.ts_end.saturating_sub(first) as f64 / 1000.0;
            eprint!(
                "\r        {}",
                kvlab_bench::report::progress_line(row, el, total_s)
            );
        }
    }
}

/// A command run beside a run (interference): `sh -c` as the leader of its own process
/// group, so that ending it ends everything it started.
struct Corunner {
    command: String,
    child: std::process::Child,
    started: Instant,
}

impl Corunner {
    fn start(command: &str) -> anyhow::Result<Corunner> {
        use std::os::unix::process::CommandExt as _;
        let child = std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting the corunner {command:?}"))?;
        Ok(Corunner {
            command: command.to_string(),
            child,
            started: Instant::now(),
        })
    }

    /// Ends it; returns its command and the CPU its process group used over its life
    /// (cores busy: utime + stime of every live process of the group just before the end;
    /// `None` when none could be read).
    fn stop(mut self) -> (String, Option<f64>) {
        let elapsed = self.started.elapsed().as_secs_f64();
        let pgid = self.child.id() as i32;
        let ticks: Option<u64> = kvlab_control::machine::processes_in_group(pgid)
            .into_iter()
            .map(|p| laws::read_proc_stat(p).ok().map(|s| s.cpu_ticks()))
            .sum();
        // SAFETY: killpg has no memory preconditions; the group is the corunner's own.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
        let _ = self.child.wait();
        let tps = laws::clock_ticks_per_second() as f64;
        let cpu = ticks
            .filter(|_| elapsed > 0.0)
            .map(|t| t as f64 / tps / elapsed);
        (std::mem::take(&mut self.command), cpu)
    }
}

impl Drop for Corunner {
    fn drop(&mut self) {
        if !self.command.is_empty() {
            // SAFETY: as in stop.
            unsafe { libc::killpg(self.child.id() as i32, libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}
