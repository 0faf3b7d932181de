//! Systems under test as separate processes: start on a free port (and a kvlab server that
//! will be loaded over HTTP on a second one, `--http-port`), wait until they answer `version`
//! (and `GET /`), ask their worker threads (`stats`), stop with SIGTERM (SIGKILL after a
//! grace period) — all through [`kvlab_process`]. The runner reads their CPU time
//! from `/proc/<pid>/stat`.
//!
//! A system with `cpus` has every thread pinned to those CPUs once it is up.
//!
//! A proxy system is `kvlab proxy` in front of backends the lab starts first, each as a
//! system of its own (kvlab's server or memcached, on its own free port, with its own log
//! `<log>.backend<i>.log`); the proxy gets `--backend` for each and `--log-dir <log>.windows`,
//! and is stopped before its backends. Its `pid` (the CPU the runner reads) is the proxy's;
//! [`Instance::backend_pids`] are the backends'. A twemproxy system is the same with
//! `nutcracker` in front, its pool written to `<log>.yml`; it has one thread and no `stats`
//! the lab reads.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_process::{self as process, Output, Probe, Process, Spawn};

use crate::spec::{Flags, SystemKind, SystemSpec, DATA_DIR};

/// A started (or external) system.
pub struct Instance {
    /// Index of its spec.
    pub system: usize,
    /// How it was started.
    pub kind: SystemKind,
    /// Its rendered flags (the lab's port flags not included) and a proxy's backends'.
    pub flags: Flags,
    /// Program and arguments as started (or the address, external).
    pub command: Vec<String>,
    /// Where it listens (memcached protocol).
    pub addr: SocketAddr,
    /// Where it serves HTTP, when started with `--http-port`.
    pub http: Option<SocketAddr>,
    /// Its process id, when known.
    pub pid: Option<u32>,
    /// What it answered to `version`.
    pub version: String,
    /// Its worker threads, as it reports them (`threads` in `stats`).
    pub threads: u32,
    /// The key space it holds (reload when the workload's changes).
    pub loaded: Option<String>,
    /// A proxy's backends, started before it and stopped after it.
    pub backends: Vec<Instance>,
    process: Option<Process>,
    /// The fresh directory that `{data_dir}` named, removed when the system stops.
    data_dir: Option<PathBuf>,
}

/// Finds a program on PATH (or checks a path).
pub fn which(program: &str) -> Option<PathBuf> {
    process::which(program)
}

/// The program a system runs, or `None` for an external one; an error when it is missing.
/// `kvlab_bin` is the kvlab executable for a kvlab system without a `binary`.
/// A proxy's program is the kvlab executable, and its backends' program must be there too.
pub fn program(spec: &SystemSpec, kvlab_bin: Option<&Path>) -> anyhow::Result<Option<PathBuf>> {
    let kind = spec.kind()?;
    if kind.has_backends() {
        program(&spec.backend_spec(0, Vec::new()), kvlab_bin)
            .with_context(|| format!("system {:?}: its backends", spec.name))?;
    }
    match kind {
        SystemKind::External => Ok(None),
        SystemKind::Kvlab | SystemKind::Proxy => match &spec.binary {
            Some(b) => which(b)
                .map(Some)
                .with_context(|| format!("system {:?}: {b:?} not found", spec.name)),
            None => match kvlab_bin {
                Some(b) => which(&b.to_string_lossy()).map(Some).with_context(|| {
                    format!("system {:?}: kvlab executable {b:?} not found", spec.name)
                }),
                None => bail!(
                    "system {:?}: no kvlab executable known (set $KVLAB_BIN, or give the \
                     system a binary)",
                    spec.name
                ),
            },
        },
        SystemKind::Memcached | SystemKind::Twemproxy => {
            // The program on PATH, what it is, and the Debian package that has it.
            let (program, what) = match kind {
                SystemKind::Twemproxy => ("nutcracker", "twemproxy"),
                _ => ("memcached", "memcached"),
            };
            let b = spec.binary.as_deref().unwrap_or(program);
            which(b).map(Some).with_context(|| {
                format!(
                    "system {:?}: {b:?} not found on PATH (install {what}, e.g. \
                     `apt-get install {program}`, or mark the system optional = true)",
                    spec.name
                )
            })
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl Instance {
    /// Starts system `index` (`spec`) with `flags`, its output going to `log`; with `http`, a
    /// kvlab server also serves HTTP (`--http-port`), and is ready when both ports answer.
    /// `kvlab_bin` is the kvlab executable for a kvlab system (or proxy, or kvlab backend)
    /// without a `binary`. A proxy's backends are started first (see the module doc).
    pub fn start(
        index: usize,
        spec: &SystemSpec,
        flags: Flags,
        http: bool,
        log: &Path,
        kvlab_bin: Option<&Path>,
    ) -> anyhow::Result<Instance> {
        let timeout = Duration::from_secs_f64(spec.start_timeout.unwrap_or(10.0).clamp(0.1, 600.0));
        let Some(prog) = program(spec, kvlab_bin)? else {
            return Instance::external(index, spec, flags, http, timeout);
        };
        let kind = spec.kind()?;
        if http && kind != SystemKind::Kvlab {
            bail!("system {:?}: only a kvlab server serves HTTP", spec.name);
        }
        // A proxy's backends first; dropping them (an error below) stops them.
        let backends = Instance::start_backends(index, spec, &flags, log, kvlab_bin)?;
        let args = &flags.args;
        // A second port: a kvlab server's HTTP, or twemproxy's stats port (its default,
        // 22222, would be shared by every twemproxy on the machine).
        let second = http || kind == SystemKind::Twemproxy;
        let ports =
            process::free_ports(if second { 2 } else { 1 }).context("finding a free port")?;
        let port = ports[0];
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let http_addr: Option<SocketAddr> = http
            .then(|| ports.get(1).map(|&p| ([127, 0, 0, 1], p).into()))
            .flatten();
        let mut full = lab_args(kind, &ports, http_addr, &backends, log)?;
        let placeholder = format!("{{{DATA_DIR}}}");
        let data_dir = fresh_data_dir(args, &placeholder, log)?;
        full.extend(args.iter().map(|a| match &data_dir {
            Some(d) => a.replace(&placeholder, &d.display().to_string()),
            None => a.clone(),
        }));
        let mut spawn = Spawn::new(&prog)
            .args(&full)
            .output(Output::File(log.to_path_buf()))
            .ready(Probe::Version(addr))
            .timeout(timeout);
        if let Some(h) = http_addr {
            spawn = spawn.ready(Probe::HttpGet(h));
        }
        let command = spawn.command();
        let deadline = Instant::now() + timeout;
        let started = spawn.start().map_err(anyhow::Error::from).and_then(|p| {
            if kind == SystemKind::Twemproxy {
                // One thread, and no `stats` of memcached's kind.
                return Ok((p, 1));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let threads = threads_of(addr, left.max(Duration::from_secs(1)))?;
            Ok((p, threads))
        });
        let (process, threads) = match started {
            Ok(v) => v,
            Err(e) => return Err(not_ready(spec, &command, log, data_dir.as_deref(), e)),
        };
        if let Some(c) = &flags.cpus {
            pin(process.pid(), c).with_context(|| format!("system {:?}: cpus", spec.name))?;
        }
        Ok(Instance {
            system: index,
            kind,
            flags,
            command,
            addr,
            http: http_addr,
            pid: Some(process.pid()),
            version: process.answer().unwrap_or_default().to_string(),
            threads,
            loaded: None,
            backends,
            process: Some(process),
            data_dir,
        })
    }

    /// An external system (`address`, no program): checks that it answers and asks its
    /// worker threads.
    fn external(
        index: usize,
        spec: &SystemSpec,
        flags: Flags,
        http: bool,
        timeout: Duration,
    ) -> anyhow::Result<Instance> {
        let a = spec.address.as_deref().unwrap_or_default();
        let addr = a
            .to_socket_addrs()
            .with_context(|| format!("system {:?}: bad address {a:?}", spec.name))?
            .next()
            .with_context(|| format!("system {:?}: {a:?} resolves to nothing", spec.name))?;
        if http {
            bail!(
                "system {:?}: an external system is not loaded over HTTP",
                spec.name
            );
        }
        let version = process::wait_ready(&Probe::Version(addr), timeout)
            .with_context(|| format!("system {:?} at {addr} does not answer", spec.name))?;
        let threads = threads_of(addr, timeout)
            .with_context(|| format!("system {:?} at {addr}", spec.name))?;
        Ok(Instance {
            system: index,
            kind: SystemKind::External,
            command: vec![addr.to_string()],
            flags,
            addr,
            http: None,
            pid: spec.pid,
            version,
            threads,
            loaded: None,
            backends: Vec::new(),
            process: None,
            data_dir: None,
        })
    }

    /// Starts a proxy's backends (none for other systems), each logging to
    /// `<log stem>.backend<i>.log`.
    fn start_backends(
        index: usize,
        spec: &SystemSpec,
        flags: &Flags,
        log: &Path,
        kvlab_bin: Option<&Path>,
    ) -> anyhow::Result<Vec<Instance>> {
        let mut backends = Vec::new();
        if let Some((n, args)) = &flags.backends {
            let stem = log
                .file_stem()
                .map_or("proxy".into(), |s| s.to_string_lossy().into_owned());
            for i in 0..*n {
                let blog = log.with_file_name(format!("{stem}.backend{i}.log"));
                let bflags = Flags {
                    args: args.clone(),
                    backends: None,
                    cpus: None,
                };
                let b = Instance::start(
                    index,
                    &spec.backend_spec(i, args.clone()),
                    bflags,
                    false,
                    &blog,
                    kvlab_bin,
                )
                .with_context(|| format!("system {:?}: starting backend {i}", spec.name))?;
                backends.push(b);
            }
        }
        Ok(backends)
    }

    /// A proxy's backends' process ids (empty for other systems).
    pub fn backend_pids(&self) -> Vec<u32> {
        self.backends.iter().filter_map(|b| b.pid).collect()
    }

    /// A proxy's backends' commands (empty for other systems).
    pub fn backend_commands(&self) -> Vec<Vec<String>> {
        self.backends.iter().map(|b| b.command.clone()).collect()
    }

    /// Whether a started process (or one of a proxy's backends) has exited.
    pub fn exited(&mut self) -> bool {
        self.process.as_mut().is_some_and(Process::exited)
            || self.backends.iter_mut().any(Instance::exited)
    }

    /// Stops a started process: SIGTERM, then SIGKILL after 5 s (an external system is left
    /// running); removes its `{data_dir}`; then a proxy's backends alike. Dropping an
    /// instance does the same.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(p) = self.process.take() {
            p.stop();
        }
        if let Some(d) = self.data_dir.take() {
            if let Err(e) = std::fs::remove_dir_all(&d) {
                eprintln!("note: could not remove {}: {e}", d.display());
            }
        }
        for b in self.backends.drain(..) {
            b.stop();
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Pins every thread of `pid` to the CPU list `cpus` (threads it starts later inherit the
/// mask of the thread that starts them).
pub fn pin(pid: u32, cpus: &str) -> anyhow::Result<()> {
    let set: kvlab_control::CpuSet = cpus.parse()?;
    kvlab_control::machine::set_affinity(pid, &set)?;
    Ok(())
}

/// The server's worker threads as it reports them: `threads` in `stats` (kvlab's server and
/// memcached alike), asked once it is up.
fn threads_of(addr: SocketAddr, timeout: Duration) -> anyhow::Result<u32> {
    let stats = process::stats(addr, None, timeout).context("asking `stats`")?;
    let (_, v) = stats
        .iter()
        .find(|(k, _)| k == "threads")
        .context("its `stats` has no `threads` (worker threads)")?;
    v.parse()
        .with_context(|| format!("its `stats` says threads {v:?}, not a number"))
}

/// The arguments the lab itself gives a system of `kind` on `ports` (its own first): where
/// to listen (and serve HTTP), and a proxy's backends and window log directory, or
/// twemproxy's pool file (written here) and stats port. The system's own flags follow them.
fn lab_args(
    kind: SystemKind,
    ports: &[u16],
    http_addr: Option<SocketAddr>,
    backends: &[Instance],
    log: &Path,
) -> anyhow::Result<Vec<String>> {
    let port = ports[0];
    let mut full: Vec<String> = Vec::new();
    match kind {
        SystemKind::Kvlab => {
            full.extend(["server".into(), "-l".into(), "127.0.0.1".into()]);
            full.extend(["-p".into(), port.to_string()]);
            if let Some(h) = http_addr {
                full.extend(["--http-port".into(), h.port().to_string()]);
            }
        }
        SystemKind::Memcached => {
            if is_root() {
                full.extend(["-u".into(), "root".into()]);
            }
            full.extend(["-U".into(), "0".into(), "-l".into(), "127.0.0.1".into()]);
            full.extend(["-p".into(), port.to_string()]);
        }
        SystemKind::Proxy => {
            full.extend(["proxy".into(), "-l".into(), "127.0.0.1".into()]);
            full.extend(["-p".into(), port.to_string()]);
            for b in backends {
                full.extend(["--backend".into(), b.addr.to_string()]);
            }
            let windows = log.with_extension("windows");
            full.extend(["--log-dir".into(), windows.display().to_string()]);
        }
        SystemKind::Twemproxy => {
            let pool = log.with_extension("yml");
            let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
            std::fs::write(&pool, twemproxy_pool(port, &addrs))
                .with_context(|| format!("writing {}", pool.display()))?;
            full.extend(["-c".into(), pool.display().to_string()]);
            full.extend(["-s".into(), ports[1].to_string()]);
        }
        SystemKind::External => {}
    }
    Ok(full)
}

/// twemproxy's configuration: one pool on 127.0.0.1:`port` over `backends` (weight 1 each),
/// ketama over MD5 (twemproxy's usual memcached set-up), a 2 s backend timeout, hosts never
/// ejected (a comparison sees every request, as kvlab proxy's do).
fn twemproxy_pool(port: u16, backends: &[SocketAddr]) -> String {
    let mut s = format!(
        "pool:\n  listen: 127.0.0.1:{port}\n  hash: md5\n  distribution: ketama\n  \
         timeout: 2000\n  auto_eject_hosts: false\n  servers:\n"
    );
    for b in backends {
        s.push_str(&format!("   - {b}:1\n"));
    }
    s
}

/// A fresh, empty `<log>.data` when a flag uses the data directory `placeholder`.
fn fresh_data_dir(
    args: &[String],
    placeholder: &str,
    log: &Path,
) -> anyhow::Result<Option<PathBuf>> {
    let data_dir = args
        .iter()
        .any(|a| a.contains(placeholder))
        .then(|| log.with_extension("data"));
    if let Some(d) = &data_dir {
        // A fresh directory for every start: nothing recovered from an earlier run.
        if d.exists() {
            std::fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
        }
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    Ok(data_dir)
}

/// The error of a system that did not become ready, with the last lines of its output; its
/// data directory, if any, is removed.
fn not_ready(
    spec: &SystemSpec,
    command: &[String],
    log: &Path,
    data_dir: Option<&Path>,
    e: anyhow::Error,
) -> anyhow::Error {
    if let Some(d) = data_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    let tail = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = tail.lines().rev().take(5).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    anyhow::anyhow!(
        "system {:?} ({}) did not become ready: {e:#}{}",
        spec.name,
        command.join(" "),
        if tail.is_empty() {
            String::new()
        } else {
            format!("; its output: {}", tail.join(" | "))
        }
    )
}
