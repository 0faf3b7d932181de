//! Load generators other than kvlab's own: a workload's `generator` key.
//!
//! `generator = "kvlab"` (the default) runs `kvlab bench` in the lab's process. An external
//! generator is a program the lab runs once per run against the system's address:
//!
//! - `memcaslap` (Debian's `libmemcached-tools`): closed loop, one request in flight per
//!   connection; it reports its throughput ("Run time: … Ops: … TPS: …") and, per request,
//!   only a mean, a minimum and a maximum — no percentiles;
//! - `memtier_benchmark` (Redis' memtier, not a Debian package: build it from
//!   <https://github.com/RedisLabs/memtier_benchmark>); closed loop with a pipeline depth; its
//!   JSON file gives throughput, the mean and percentiles.
//!
//! Each workload key a generator can express is mapped onto its flags ([`Invocation::plan`]);
//! one it cannot (an open-loop rate, deletes, a key distribution it does not have, …) is an
//! error when the experiment is read, naming the key. Keys that only shape kvlab bench's
//! reporting (`interval`, `timeout_ms`, `seed`) are not passed on.
//!
//! A run: a warm-up invocation of `warmup` seconds (discarded; neither tool has a warm-up of
//! its own), then the measured invocation of `duration` seconds, during which the runner
//! reads the system every [`POLL`] and the lab the generator's own CPU time. Neither tool
//! loads from its first instant to its last (memcaslap lingers about a second after its
//! run), so the window of the system's and the generator's CPU is the samples around the
//! generator's activity: the last before its CPU time first grew, the first after it last
//! grew. Both tools take whole seconds.
//!
//! ```text
//! runner::measure ─► Invocation::plan (workload → flags) ─► run: warm-up ─► measured
//!   invocation, sampled every POLL (the system's readings, the generator's CPU) ─► parse
//!   (memcaslap text | memtier JSON) ─► ExternalRun + the active window in raw/NNNN.json
//! ```

mod parse;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use kvlab_bench::dist::{KeyDist, SizeDist};
use kvlab_bench::load::Load;
use kvlab_bench::Protocol;
use serde::{Deserialize, Serialize};

use crate::spec::WorkloadSpec;

pub use parse::{parse_memcaslap, parse_memtier, Measured};

/// Which program loads the systems.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Generator {
    /// `kvlab bench`, in the lab's process.
    #[default]
    #[serde(rename = "kvlab")]
    Kvlab,
    /// libmemcached-tools' `memcaslap` (on PATH).
    #[serde(rename = "memcaslap")]
    Memcaslap,
    /// `memtier_benchmark` (on PATH).
    #[serde(rename = "memtier_benchmark", alias = "memtier")]
    Memtier,
}

impl Generator {
    /// The names a workload file may give.
    pub const NAMES: &'static str = "kvlab, memcaslap, memtier_benchmark";

    /// Its name in files and tables.
    pub fn name(self) -> &'static str {
        match self {
            Generator::Kvlab => "kvlab",
            Generator::Memcaslap => "memcaslap",
            Generator::Memtier => "memtier_benchmark",
        }
    }

    /// The program the lab runs (none: kvlab bench in process).
    pub fn program(self) -> Option<&'static str> {
        match self {
            Generator::Kvlab => None,
            other => Some(other.name()),
        }
    }

    /// How to install it, for the note when it is missing.
    pub fn install_hint(self) -> &'static str {
        match self {
            Generator::Kvlab => "",
            Generator::Memcaslap => "apt-get install libmemcached-tools",
            Generator::Memtier => {
                "not a Debian package: build it from https://github.com/RedisLabs/memtier_benchmark \
                 (autoreconf -ivf && ./configure && make && make install; see docs/lab.md)"
            }
        }
    }

    /// Why a run of this generator has no latency percentiles (none: it reports them).
    pub fn no_percentiles(self) -> Option<&'static str> {
        match self {
            Generator::Memcaslap => Some(
                "memcaslap reports no percentiles, only a mean (and a minimum and maximum) per \
                 request, timed from its send",
            ),
            _ => None,
        }
    }
}

/// One external generator's command for a run: the measured invocation and its warm-up.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// The generator.
    pub generator: Generator,
    /// Its flags, the target's and the time's excepted (`-s`/`-p`, `-t`/`--test-time`).
    pub args: Vec<String>,
    /// memcaslap's configuration file (`-F`): key and value sizes, the get/set mix.
    pub config: Option<String>,
    /// Warm-up, whole seconds (0: none).
    pub warmup_s: u64,
    /// Measured time, whole seconds.
    pub duration_s: u64,
}

/// What an external generator measured in one run (stored in the raw run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalRun {
    /// The generator.
    pub generator: Generator,
    /// The measured invocation.
    pub command: Vec<String>,
    /// Where its output is kept (under the results' logs/).
    pub output: PathBuf,
    /// Its own figures.
    pub measured: Measured,
    /// Its CPU while it loaded (user + system time over the samples around its activity,
    /// from `/proc/<pid>/stat`), cores busy.
    pub cpu: Option<f64>,
    /// Wall time of those samples, s: its activity to within [`POLL`].
    pub elapsed_s: f64,
}

fn whole_seconds(what: &str, v: f64, min: u64, g: Generator) -> anyhow::Result<u64> {
    if v.fract() != 0.0 || v < min as f64 {
        bail!(
            "{what} = {v}: {} runs whole seconds (at least {min}); give {what} = {}",
            g.name(),
            v.ceil().max(min as f64)
        );
    }
    Ok(v as u64)
}

/// An error naming `key` and what `g` cannot do.
fn cannot(g: Generator, key: &str, why: &str) -> anyhow::Error {
    anyhow::anyhow!("generator = \"{}\" cannot express {key}: {why}", g.name())
}

/// `(min, max)` of a fixed or uniform size, else none.
fn size_range(d: &SizeDist) -> Option<(u64, u64)> {
    match d {
        SizeDist::Fixed { n } => Some((*n, *n)),
        SizeDist::Uniform { min, max } => Some((*min, *max)),
        _ => None,
    }
}

impl Invocation {
    /// The command of generator `g` for workload `wl` (none for kvlab bench), or an error
    /// naming the first key it cannot express.
    pub fn plan(
        g: Generator,
        wl: &WorkloadSpec,
        duration: f64,
        warmup: f64,
    ) -> anyhow::Result<Option<Invocation>> {
        if g == Generator::Kvlab {
            return Ok(None);
        }
        let load = wl.load(duration, warmup, 1)?;
        refuse_common(g, wl, &load)?;
        let duration_s = whole_seconds("duration", duration, 1, g)?;
        let warmup_s = whole_seconds("warmup", warmup, 0, g)?;
        let (args, config) = match g {
            Generator::Memcaslap => memcaslap_args(wl, &load)?,
            _ => (memtier_args(wl, &load)?, None),
        };
        Ok(Some(Invocation {
            generator: g,
            args,
            config,
            warmup_s,
            duration_s,
        }))
    }

    /// The full command line of one invocation of `secs` against `target`; `config` is
    /// memcaslap's configuration file, `json` memtier's output file.
    pub fn command(
        &self,
        target: std::net::SocketAddr,
        secs: u64,
        config: &Path,
        json: &Path,
    ) -> Vec<String> {
        let mut c = vec![self.generator.name().to_string()];
        match self.generator {
            Generator::Memcaslap => c.extend([
                "-s".into(),
                target.to_string(),
                "-t".into(),
                format!("{secs}s"),
                // One statistics dump at the end: the mean latency comes with it.
                "-S".into(),
                format!("{secs}s"),
                "-F".into(),
                config.display().to_string(),
            ]),
            _ => c.extend([
                "-s".into(),
                target.ip().to_string(),
                "-p".into(),
                target.port().to_string(),
                "--protocol=memcache_text".into(),
                format!("--test-time={secs}"),
                "--hide-histogram".into(),
                "--print-percentiles=50,95,99,99.9".into(),
                format!("--json-out-file={}", json.display()),
            ]),
        }
        c.extend(self.args.iter().cloned());
        c
    }
}

/// Keys neither external generator expresses.
fn refuse_common(g: Generator, wl: &WorkloadSpec, load: &Load) -> anyhow::Result<()> {
    let o = &wl.options;
    if load.is_open() {
        bail!(cannot(
            g,
            "an open loop (qps, qps_list, …)",
            "it drives a closed loop; a rate it caps would be timed from the actual send, not \
             the planned one (use generator = \"kvlab\" for open-loop points)"
        ));
    }
    if load.protocol != Protocol::Memcached {
        bail!(cannot(
            g,
            &format!("protocol = \"{}\"", load.protocol.name()),
            "it speaks memcached's text protocol only"
        ));
    }
    if load.think_us() > 0 {
        bail!(cannot(g, "think_us", "it has no think time"));
    }
    let given = [
        ("preset", o.preset.is_some()),
        ("data", o.data.is_some()),
        ("data_key", o.data_key.is_some()),
        ("max_item_size", o.max_item_size.is_some()),
        ("verify", o.verify == Some(true)),
        ("exptime", o.exptime.is_some_and(|e| e > 0)),
        ("requests", o.requests.is_some()),
        ("hot", o.hot.is_some()),
        ("cluster", o.cluster == Some(true)),
        ("meta_base64", o.meta_base64 == Some(true)),
        ("load = true", o.load == Some(true)),
    ];
    if let Some((k, _)) = given.iter().find(|(_, set)| *set) {
        bail!(cannot(g, k, "it has no such setting; leave the key out"));
    }
    if load.workload.mix.delete > 0 {
        bail!(cannot(g, "deletes in mix", "it sends gets and sets only"));
    }
    if load.workload.mix.get + load.workload.mix.set == 0 {
        bail!(cannot(g, "this mix", "it needs gets or sets"));
    }
    Ok(())
}

/// memcaslap: `-T threads -c threads×connections -w (keys/connection)k [-d multiget]` and a
/// configuration file of key sizes, value sizes and the get/set proportions.
fn memcaslap_args(wl: &WorkloadSpec, load: &Load) -> anyhow::Result<(Vec<String>, Option<String>)> {
    let g = Generator::Memcaslap;
    let w = &load.workload;
    if load.depth() != 1 {
        bail!(cannot(
            g,
            &format!("depth = {}", load.depth()),
            "it keeps one request in flight per connection"
        ));
    }
    if wl.options.key_dist.is_some() && w.key_dist != KeyDist::Uniform {
        bail!(cannot(
            g,
            "key_dist",
            "its keys are uniform over its key windows"
        ));
    }
    if wl.options.key_prefix.is_some() {
        bail!(cannot(g, "key_prefix", "it makes random keys of its own"));
    }
    let (kmin, kmax) = size_range(&w.key_size)
        .ok_or_else(|| cannot(g, "key_size", "it takes a fixed size or a range A-B only"))?;
    let (vmin, vmax) = size_range(&w.value_size)
        .ok_or_else(|| cannot(g, "value_size", "it takes a fixed size or a range A-B only"))?;
    if !(16..=250).contains(&kmin) || kmax > 250 {
        bail!(cannot(
            g,
            &format!("key_size = {kmin}-{kmax}"),
            "its keys are 16 to 250 bytes"
        ));
    }
    let concurrency = (load.threads * load.connections) as u64;
    // memcaslap's key space: a window of keys per connection (-w), in whole thousands
    // ("-w 2k"; it refuses other counts), so keys = connections × window.
    let per = w.keys / concurrency;
    if !w.keys.is_multiple_of(concurrency) || !per.is_multiple_of(1000) || per == 0 {
        bail!(cannot(
            g,
            &format!("keys = {}", w.keys),
            &format!(
                "its key space is a window of whole thousands of keys per connection (-w Nk): \
                 with {concurrency} connections give keys = {} × N, e.g. {}",
                concurrency * 1000,
                concurrency * 1000 * (per / 1000).max(1)
            )
        ));
    }
    let mut args = vec![
        "-T".to_string(),
        load.threads.to_string(),
        "-c".into(),
        concurrency.to_string(),
        "-w".into(),
        format!("{}k", per / 1000),
    ];
    if w.multiget > 1 {
        args.extend(["-d".into(), w.multiget.to_string()]);
    }
    let total = f64::from(w.mix.get + w.mix.set);
    let config = format!(
        "key\n{kmin} {kmax} 1\nvalue\n{vmin} {vmax} 1\ncmd\n0 {:.4}\n1 {:.4}\n",
        f64::from(w.mix.set) / total,
        f64::from(w.mix.get) / total
    );
    Ok((args, Some(config)))
}

/// memtier_benchmark: threads, connections, pipeline, get/set ratio, key range and pattern,
/// value size.
fn memtier_args(wl: &WorkloadSpec, load: &Load) -> anyhow::Result<Vec<String>> {
    let g = Generator::Memtier;
    let w = &load.workload;
    if wl.options.key_size.is_some() {
        bail!(cannot(
            g,
            "key_size",
            "its keys are key_prefix and a number (memtier-1, memtier-2, …)"
        ));
    }
    if w.multiget > 1 {
        bail!(cannot(g, "multiget", "it sends one key per get here"));
    }
    let pattern = match &w.key_dist {
        KeyDist::Uniform => "R:R",
        KeyDist::Sequential => "S:S",
        KeyDist::Gaussian {
            mean: None,
            sd: None,
        } => "G:G",
        _ => bail!(cannot(
            g,
            "key_dist",
            "it has uniform (R), sequential (S) and its own gaussian (G) only"
        )),
    };
    let mut args = vec![
        format!("--threads={}", load.threads),
        format!("--clients={}", load.connections),
        format!("--pipeline={}", load.depth()),
        format!("--ratio={}:{}", w.mix.set, w.mix.get),
        "--key-minimum=1".into(),
        format!("--key-maximum={}", w.keys.max(1)),
        format!("--key-pattern={pattern}"),
    ];
    if wl.options.key_prefix.is_some() {
        args.push(format!("--key-prefix={}", w.key_prefix));
    }
    match size_range(&w.value_size) {
        Some((a, b)) if a == b => args.push(format!("--data-size={a}")),
        Some((a, b)) => args.extend([
            format!("--data-size-range={a}-{b}"),
            "--data-size-pattern=R".into(),
        ]),
        None => bail!(cannot(
            g,
            "value_size",
            "it takes a fixed size or a range A-B only"
        )),
    }
    Ok(args)
}

/// Runs `inv` against `target`: the warm-up invocation, then the measured one, calling
/// `sample` (the runner's reading of the system) before it starts and every [`POLL`] while
/// it runs. Returns what it measured and the samples that bracket its activity: the last
/// before its CPU time first grew and the first after it last grew, or after its own run
/// time — neither tool loads from its first instant to its last (memcaslap lingers about a
/// second after its run), and the system's CPU is read over the load, not over the ends. Output files go to
/// `<stem>.warmup.txt`, `<stem>.txt` (and `<stem>.json`, memtier's; `<stem>.cfg`,
/// memcaslap's configuration).
pub fn run(
    inv: &Invocation,
    target: std::net::SocketAddr,
    stem: &Path,
    sample: &mut dyn FnMut(),
) -> anyhow::Result<(ExternalRun, (usize, usize))> {
    let with = |ext: &str| PathBuf::from(format!("{}.{ext}", stem.display()));
    let (config, json) = (with("cfg"), with("json"));
    if let Some(text) = &inv.config {
        std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
    }
    if inv.warmup_s > 0 {
        let cmd = inv.command(target, inv.warmup_s, &config, &with("warmup.json"));
        invoke(&cmd, &with("warmup.txt"), &mut || {})?;
    }
    let cmd = inv.command(target, inv.duration_s, &config, &json);
    let activity = invoke(&cmd, &with("txt"), sample)?;
    let measured = match inv.generator {
        Generator::Memcaslap => {
            let text = std::fs::read_to_string(with("txt"))?;
            parse_memcaslap(&text)
        }
        _ => {
            let json_text = std::fs::read_to_string(&json)
                .with_context(|| format!("reading memtier's {}", json.display()))?;
            let printed = std::fs::read_to_string(with("txt"))?;
            parse_memtier(&json_text, &printed, inv.duration_s as f64)
        }
    }
    .with_context(|| {
        format!(
            "reading {}'s output {}",
            inv.generator.name(),
            with("txt").display()
        )
    })?;
    let (first, mut last) = activity.window();
    // No longer than its own run time (and the next sample): what it does after the run
    // (memcaslap's statistics, its threads' exit) does not load the system.
    if let Some(end) =
        (first..=last).find(|&i| activity.at[i] >= activity.at[first] + measured.duration_s)
    {
        last = end;
    }
    Ok((
        ExternalRun {
            generator: inv.generator,
            command: cmd,
            output: with("txt"),
            measured,
            cpu: activity.cpu(first, last),
            elapsed_s: activity.at[last] - activity.at[first],
        },
        (first, last),
    ))
}

/// Runs `f` with the calling thread's CPU mask set to `cpus` ([`kvlab_control::cpus::pinned`]).
pub fn pinned<T>(cpus: Option<&kvlab_control::CpuSet>, f: impl FnOnce() -> T) -> anyhow::Result<T> {
    kvlab_control::cpus::pinned(cpus, f).map_err(|e| anyhow::anyhow!("generator_cpus: {e}"))
}

/// How often the lab samples the system and the generator while an external generator runs.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// The generator's CPU time (clock ticks) at each sample, and when (s from the first).
struct Activity {
    at: Vec<f64>,
    ticks: Vec<Option<u64>>,
}

impl Activity {
    /// The samples around the generator's activity: the last before its CPU time first grew
    /// and the first after it last grew (all of them when it never grew between two).
    fn window(&self) -> (usize, usize) {
        let grew =
            |i: usize| matches!((self.ticks[i - 1], self.ticks[i]), (Some(a), Some(b)) if b > a);
        let n = self.at.len();
        let first = (1..n).find(|&i| grew(i)).map_or(0, |i| i - 1);
        let last = (1..n).rev().find(|&i| grew(i)).unwrap_or(n - 1);
        (first, last.max(first))
    }

    /// Its CPU between two samples, cores busy.
    fn cpu(&self, first: usize, last: usize) -> Option<f64> {
        let (a, b) = (self.ticks[first]?, self.ticks[last]?);
        let dt = self.at[last] - self.at[first];
        let tps = kvlab_procfs::clock_ticks_per_second() as f64;
        (dt > 0.0).then(|| b.saturating_sub(a) as f64 / tps / dt)
    }
}

/// Runs `cmd` to its end with its output (both streams) in `out`, calling `sample` before it
/// starts and every [`POLL`] while it runs (the last call after it has ended), each time
/// with the generator's CPU time read too.
fn invoke(cmd: &[String], out: &Path, sample: &mut dyn FnMut()) -> anyhow::Result<Activity> {
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut act = Activity {
        at: Vec::new(),
        ticks: Vec::new(),
    };
    let started = Instant::now();
    let mut child = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting {}", cmd.join(" ")))?;
    let pid = child.id();
    let status = loop {
        let ticks = kvlab_procfs::read_proc_stat(pid)
            .ok()
            .map(|s| s.cpu_ticks());
        let exited = child.try_wait()?;
        // A zombie's /proc/<pid>/stat still holds its time; once reaped it is gone.
        act.ticks
            .push(ticks.or_else(|| act.ticks.last().copied().flatten()));
        act.at.push(started.elapsed().as_secs_f64());
        sample();
        if let Some(status) = exited {
            break status;
        }
        std::thread::sleep(POLL);
    };
    if !status.success() {
        bail!(
            "{} ended with {status}; its output: {}",
            cmd.join(" "),
            out.display()
        );
    }
    Ok(act)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Experiment, Overrides};

    fn parse(workload: &str, head: &str) -> anyhow::Result<Experiment> {
        Experiment::parse(
            &format!("{head}\n[[system]]\nname = \"memcached\"\n[workload]\n{workload}\n"),
            "x",
            &Overrides::default(),
        )
    }

    fn err(workload: &str) -> String {
        format!("{:#}", parse(workload, "warmup = 0").unwrap_err())
    }

    #[test]
    fn the_generator_key_and_its_factor() {
        let e = parse("", "").unwrap();
        assert_eq!(e.parts[0].generators, [Generator::Kvlab]);
        let e = parse(
            "clients = 4\nkeys = 4000\n",
            "warmup = 0\n[factors]\ngenerator = [\"kvlab\", \"memcaslap\", \"memtier\"]",
        )
        .unwrap();
        assert_eq!(
            e.parts[0].generators,
            [Generator::Kvlab, Generator::Memcaslap, Generator::Memtier]
        );
        let e = err("generator = \"wrk\"");
        assert!(e.contains("generator") && e.contains("memcaslap"), "{e}");
        let e = parse("generator_cpus = \"0-1,3\"", "").unwrap();
        let p = &e.parts[0];
        let wl = p.workload_of(&p.points[0]).unwrap();
        assert_eq!(
            wl.generator_cpus.map(|c| c.iter().collect::<Vec<_>>()),
            Some(vec![0, 1, 3])
        );
        let e = err("generator_cpus = \"one\"");
        assert!(e.contains("not a CPU list"), "{e}");
    }

    /// The external generator's invocation for the one point of an experiment with this
    /// workload and these experiment-level keys.
    fn planned(workload: &str, experiment: &str) -> Invocation {
        let e = parse(workload, experiment).unwrap();
        let p = &e.parts[0];
        let wl = p.workload_of(&p.points[0]).unwrap();
        Invocation::plan(wl.generator, &wl, p.duration, p.warmup)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn memcaslap_maps_what_it_can_express() {
        let inv = planned(
            "generator = \"memcaslap\"\nclients = 4\nthreads = 2\nkeys = 8000\n\
             key_size = 32\nvalue_size = \"100-200\"\nmix = \"get=3,set=1\"\nmultiget = 4",
            "warmup = 2\nduration = 3",
        );
        assert_eq!(
            inv.args,
            ["-T", "2", "-c", "4", "-w", "2k", "-d", "4"].map(String::from)
        );
        assert_eq!(
            inv.config.as_deref(),
            Some("key\n32 32 1\nvalue\n100 200 1\ncmd\n0 0.2500\n1 0.7500\n")
        );
        assert_eq!((inv.warmup_s, inv.duration_s), (2, 3));
        let target = "127.0.0.1:11211".parse().unwrap();
        let cmd = inv.command(target, 3, Path::new("c.cfg"), Path::new("x.json"));
        assert_eq!(
            cmd[..9],
            [
                "memcaslap",
                "-s",
                "127.0.0.1:11211",
                "-t",
                "3s",
                "-S",
                "3s",
                "-F",
                "c.cfg"
            ]
        );
    }

    #[test]
    fn memcaslap_refuses_what_it_cannot_express() {
        let caslap = "generator = \"memcaslap\"\nclients = 4\nkeys = 4000\n";
        for (extra, want) in [
            ("qps = 1000", "open loop"),
            ("depth = 4", "depth = 4"),
            ("mix = \"get=8,set=1,delete=1\"", "deletes"),
            ("key_dist = \"zipf:0.99\"", "key_dist"),
            ("value_size = \"normal:100,10\"", "value_size"),
            ("protocol = \"meta\"", "protocol = \"meta\""),
            ("think_us = 100", "think_us"),
            ("preset = \"etc\"", "preset"),
            ("load = true", "load = true"),
            ("key_prefix = \"k\"", "key_prefix"),
        ] {
            let e = err(&format!("{caslap}{extra}"));
            assert!(
                e.contains("cannot express") && e.contains(want),
                "{extra}: {e}"
            );
        }
        let e = err("generator = \"memcaslap\"\nclients = 50\nkeys = 10000");
        assert!(
            e.contains("keys = 10000") && e.contains("e.g. 50000"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            parse(caslap, "duration = 1.5\nwarmup = 0").unwrap_err()
        );
        assert!(
            e.contains("whole seconds") && e.contains("duration = 2"),
            "{e}"
        );
        let e = format!("{:#}", parse(caslap, "warmup = 0.5").unwrap_err());
        assert!(e.contains("warmup = 1"), "{e}");
    }

    #[test]
    fn the_window_is_the_generators_activity() {
        let act = Activity {
            at: vec![0.0, 0.1, 0.2, 0.3, 0.4, 0.5],
            ticks: [0, 0, 5, 10, 10, 10].map(Some).to_vec(),
        };
        assert_eq!(act.window(), (1, 3));
        let cpu = act.cpu(1, 3).unwrap();
        let tps = kvlab_procfs::clock_ticks_per_second() as f64;
        assert!((cpu - 10.0 / tps / 0.2).abs() < 1e-9, "{cpu}");
        // Never grew between two samples: every sample.
        let idle = Activity {
            at: vec![0.0, 0.1, 0.2],
            ticks: vec![Some(3), None, Some(3)],
        };
        assert_eq!(idle.window(), (0, 2));
    }

    #[test]
    fn memtier_maps_depth_and_refuses_key_sizes() {
        let inv = planned(
            "generator = \"memtier_benchmark\"\nclients = 50\ndepth = 16\nkeys = 10000\n\
             mix = \"get=10,set=1\"\nvalue_size = 100",
            "warmup = 1",
        );
        assert_eq!(
            inv.args,
            [
                "--threads=1",
                "--clients=50",
                "--pipeline=16",
                "--ratio=1:10",
                "--key-minimum=1",
                "--key-maximum=10000",
                "--key-pattern=R:R",
                "--data-size=100"
            ]
            .map(String::from)
        );
        for (extra, want) in [
            ("key_size = 32", "key_size"),
            ("qps = 100", "open loop"),
            ("multiget = 3", "multiget"),
            ("key_dist = \"zipf:1\"", "key_dist"),
        ] {
            let e = err(&format!("generator = \"memtier\"\n{extra}"));
            assert!(
                e.contains("cannot express") && e.contains(want),
                "{extra}: {e}"
            );
        }
    }
}
