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
//!
//! A system with a `host` (and a backend with one) is started there through
//! [`crate::placement`]: on a port free on that host, listening on the host's address, under
//! its run directory, ready when it answers over the network; stopped there, its log brought
//! back. A system on several hosts has an instance on each ([`Instance::replicas`]), a
//! proxy's all in front of the same backends.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_process::{self as process, Output, Probe, Process, Spawn};

use crate::placement::{PlacedProcess, Placement};
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
    /// The system's other instances, one on each further host it names (a proxy's in
    /// front of the same backends).
    pub replicas: Vec<Instance>,
    /// Where it runs, when placed on a host.
    pub placed: Option<Placed>,
    process: Option<Process>,
    /// The fresh directory that `{data_dir}` named, removed when the system stops.
    data_dir: Option<PathBuf>,
}

/// A system's process on a host.
pub struct Placed {
    placement: Arc<Placement>,
    /// The process there.
    pub started: kvlab_hosts::Started,
    /// Where its log is brought back to.
    log: PathBuf,
    /// Its `{data_dir}` on the host, removed when it stops.
    data_dir: Option<String>,
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

pub(crate) fn is_root() -> bool {
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
        Instance::start_in(index, spec, flags, http, log, kvlab_bin, None)
    }

    /// As [`Instance::start`], a system with a `host` started there through `placement`
    /// (see the module doc).
    pub fn start_in(
        index: usize,
        spec: &SystemSpec,
        flags: Flags,
        http: bool,
        log: &Path,
        kvlab_bin: Option<&Path>,
        placement: Option<&Arc<Placement>>,
    ) -> anyhow::Result<Instance> {
        let timeout = Duration::from_secs_f64(spec.start_timeout.unwrap_or(10.0).clamp(0.1, 600.0));
        if let (Some(pl), false) = (placement, spec.hosts().is_empty()) {
            return Instance::start_placed(index, spec, flags, http, log, kvlab_bin, pl, timeout);
        }
        let Some(prog) = program(spec, kvlab_bin)? else {
            return Instance::external(index, spec, flags, http, timeout);
        };
        let kind = spec.kind()?;
        if http && kind != SystemKind::Kvlab {
            bail!("system {:?}: only a kvlab server serves HTTP", spec.name);
        }
        // A proxy's backends first; dropping them (an error below) stops them.
        let backends = Instance::start_backends(index, spec, &flags, log, kvlab_bin, placement)?;
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
        let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
        let (mut full, pool) =
            lab_args(kind, &ports, http_addr, &addrs, log, "127.0.0.1", is_root());
        if let Some((path, text)) = pool {
            std::fs::write(&path, text).with_context(|| format!("writing {path}"))?;
        }
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
            replicas: Vec::new(),
            placed: None,
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
            replicas: Vec::new(),
            placed: None,
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
        placement: Option<&Arc<Placement>>,
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
                let b = Instance::start_in(
                    index,
                    &spec.backend_spec(i, args.clone()),
                    bflags,
                    false,
                    &blog,
                    kvlab_bin,
                    placement,
                )
                .with_context(|| format!("system {:?}: starting backend {i}", spec.name))?;
                backends.push(b);
            }
        }
        Ok(backends)
    }

    /// A proxy's backends' process ids (empty for other systems), those started here.
    pub fn backend_pids(&self) -> Vec<u32> {
        self.backends
            .iter()
            .filter(|b| b.placed.is_none())
            .filter_map(|b| b.pid)
            .collect()
    }

    /// Every address the system serves at (its instances': this one's first).
    pub fn addrs(&self) -> Vec<SocketAddr> {
        std::iter::once(self.addr)
            .chain(self.replicas.iter().map(|r| r.addr))
            .collect()
    }

    /// The processes of this system placed on hosts: its instances' first, then its
    /// backends'.
    pub fn placed_processes(&self) -> (Vec<kvlab_hosts::Started>, Vec<kvlab_hosts::Started>) {
        let own = std::iter::once(self)
            .chain(&self.replicas)
            .filter_map(|i| i.placed.as_ref().map(|p| p.started.clone()))
            .collect();
        let backends = self
            .backends
            .iter()
            .filter_map(|b| b.placed.as_ref().map(|p| p.started.clone()))
            .collect();
        (own, backends)
    }

    /// The placement its processes run through, if any.
    pub fn placement(&self) -> Option<Arc<Placement>> {
        std::iter::once(self)
            .chain(&self.backends)
            .find_map(|i| i.placed.as_ref().map(|p| p.placement.clone()))
    }

    /// Its processes on hosts, named, for a raw run.
    pub fn placed_list(&self) -> Vec<PlacedProcess> {
        let Some(pl) = self.placement() else {
            return Vec::new();
        };
        let (own, backends) = self.placed_processes();
        own.iter()
            .chain(&backends)
            .map(|p| pl.described(p))
            .collect()
    }

    /// A proxy's backends' commands (empty for other systems).
    pub fn backend_commands(&self) -> Vec<Vec<String>> {
        self.backends.iter().map(|b| b.command.clone()).collect()
    }

    /// Whether a started process (or one of a proxy's backends) has exited.
    pub fn exited(&mut self) -> bool {
        let placed_gone = self.placed.as_ref().is_some_and(|p| {
            p.placement
                .remote(&p.started.host)
                .and_then(|r| Ok(r.running(&p.started)?))
                .is_ok_and(|running| !running)
        });
        placed_gone
            || self.process.as_mut().is_some_and(Process::exited)
            || self.replicas.iter_mut().any(Instance::exited)
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
        if let Some(p) = self.placed.take() {
            p.placement.stop(&p.started, &p.log);
            if let Some(d) = &p.data_dir {
                let script = format!("rm -rf {}", kvlab_hosts::quote(d));
                if let Err(e) = p
                    .placement
                    .run(&p.started.host, "removing {data_dir}", &script)
                {
                    eprintln!("note: {e:#}");
                }
            }
        }
        for r in self.replicas.drain(..) {
            r.stop();
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

/// The arguments the lab itself gives a system of `kind` on `ports` (its own first),
/// listening on `listen`: where to listen (and serve HTTP), and a proxy's backends and window
/// log directory, or twemproxy's stats port and pool file (returned, path and text, for the
/// caller to write where the system runs). `root`: the system runs as root (memcached then
/// needs `-u root`). The system's own flags follow them.
fn lab_args(
    kind: SystemKind,
    ports: &[u16],
    http_addr: Option<SocketAddr>,
    backends: &[SocketAddr],
    log: &Path,
    listen: &str,
    root: bool,
) -> (Vec<String>, Option<(String, String)>) {
    let port = ports[0];
    let mut full: Vec<String> = Vec::new();
    let mut pool = None;
    match kind {
        SystemKind::Kvlab => {
            full.extend(["server".into(), "-l".into(), listen.into()]);
            full.extend(["-p".into(), port.to_string()]);
            if let Some(h) = http_addr {
                full.extend(["--http-port".into(), h.port().to_string()]);
            }
        }
        SystemKind::Memcached => {
            if root {
                full.extend(["-u".into(), "root".into()]);
            }
            full.extend(["-U".into(), "0".into(), "-l".into(), listen.into()]);
            full.extend(["-p".into(), port.to_string()]);
        }
        SystemKind::Proxy => {
            full.extend(["proxy".into(), "-l".into(), listen.into()]);
            full.extend(["-p".into(), port.to_string()]);
            for b in backends {
                full.extend(["--backend".into(), b.to_string()]);
            }
            let windows = log.with_extension("windows");
            full.extend(["--log-dir".into(), windows.display().to_string()]);
        }
        SystemKind::Twemproxy => {
            let path = log.with_extension("yml").display().to_string();
            full.extend(["-c".into(), path.clone()]);
            full.extend(["-s".into(), ports[1].to_string()]);
            pool = Some((path, twemproxy_pool(listen, port, backends)));
        }
        SystemKind::External => {}
    }
    (full, pool)
}

/// twemproxy's configuration: one pool on `listen`:`port` over `backends` (weight 1 each),
/// ketama over MD5 (twemproxy's usual memcached set-up), a 2 s backend timeout, hosts never
/// ejected (a comparison sees every request, as kvlab proxy's do).
fn twemproxy_pool(listen: &str, port: u16, backends: &[SocketAddr]) -> String {
    let mut s = format!(
        "pool:\n  listen: {listen}:{port}\n  hash: md5\n  distribution: ketama\n  \
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
    anyhow::anyhow!(
        "system {:?} ({}) did not become ready: {e:#}{}",
        spec.name,
        command.join(" "),
        output_tail(log)
    )
}

/// `; its output: …` with the last lines of `log` (its file here), or nothing.
fn output_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    if tail.is_empty() {
        String::new()
    } else {
        format!("; its output: {}", tail.join(" | "))
    }
}

impl Instance {
    /// A system with hosts: a proxy's backends first (each where its spec places it), then
    /// an instance on each of the system's hosts, the first holding the backends.
    #[allow(clippy::too_many_arguments)] // start_in's, and the placement
    fn start_placed(
        index: usize,
        spec: &SystemSpec,
        flags: Flags,
        http: bool,
        log: &Path,
        kvlab_bin: Option<&Path>,
        pl: &Arc<Placement>,
        timeout: Duration,
    ) -> anyhow::Result<Instance> {
        let kind = spec.kind()?;
        if http && kind != SystemKind::Kvlab {
            bail!("system {:?}: only a kvlab server serves HTTP", spec.name);
        }
        let backends = Instance::start_backends(index, spec, &flags, log, kvlab_bin, Some(pl))?;
        let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
        let hosts = spec.hosts();
        let stem = log
            .file_stem()
            .map_or("system".into(), |s| s.to_string_lossy().into_owned());
        let mut first = None;
        let mut replicas = Vec::new();
        for (j, host) in hosts.iter().enumerate() {
            let log = match j {
                0 => log.to_path_buf(),
                j => log.with_file_name(format!("{stem}.{j}.log")),
            };
            let one = OnHost {
                index,
                spec,
                kind,
                flags: &flags,
                http,
                log: &log,
                pl,
                host,
                timeout,
            };
            let inst = one.start(&addrs)?;
            match first {
                None => first = Some(inst),
                Some(_) => replicas.push(inst),
            }
        }
        let mut first = first.with_context(|| format!("system {:?}: no host", spec.name))?;
        first.backends = backends;
        first.replicas = replicas;
        Ok(first)
    }
}

/// One instance of a system on one host.
struct OnHost<'a> {
    index: usize,
    spec: &'a SystemSpec,
    kind: SystemKind,
    flags: &'a Flags,
    http: bool,
    log: &'a Path,
    pl: &'a Arc<Placement>,
    host: &'a str,
    timeout: Duration,
}

impl OnHost<'_> {
    fn start(&self, backends: &[SocketAddr]) -> anyhow::Result<Instance> {
        let (spec, kind, pl, host) = (self.spec, self.kind, self.pl, self.host);
        let prog = match (kind, &spec.binary) {
            (_, Some(b)) => b.clone(),
            (SystemKind::Kvlab | SystemKind::Proxy, None) => pl.kvlab(host)?,
            (SystemKind::Memcached, None) => "memcached".into(),
            (SystemKind::Twemproxy, None) => "nutcracker".into(),
            (SystemKind::External, None) => bail!("system {:?}: external, not started", spec.name),
        };
        let listen = pl.address(host)?;
        let ip = format!("{listen}:0")
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .with_context(|| format!("host {host}: its address {listen:?} does not resolve"))?
            .ip();
        let second = self.http || kind == SystemKind::Twemproxy;
        let ports = pl.free_ports(host, if second { 2 } else { 1 })?;
        let addr = SocketAddr::new(ip, ports[0]);
        let http_addr = self.http.then(|| SocketAddr::new(ip, ports[1]));
        let name = self
            .log
            .file_stem()
            .map_or("system".into(), |s| s.to_string_lossy().into_owned());
        let run_dir = pl.run_dir(host)?;
        let remote_log = PathBuf::from(format!("{run_dir}/{name}.log"));
        let (mut full, pool) = lab_args(
            kind,
            &ports,
            http_addr,
            backends,
            &remote_log,
            &listen,
            pl.is_root(host),
        );
        if let Some((path, text)) = pool {
            pl.write(host, &path, &text)?;
        }
        let placeholder = format!("{{{DATA_DIR}}}");
        let data_dir = self
            .flags
            .args
            .iter()
            .any(|a| a.contains(&placeholder))
            .then(|| format!("{run_dir}/{name}.data"));
        if let Some(d) = &data_dir {
            let q = kvlab_hosts::quote(d);
            pl.run(
                host,
                "a fresh {data_dir}",
                &format!("rm -rf {q} && mkdir -p {q}"),
            )?;
        }
        full.extend(self.flags.args.iter().map(|a| match &data_dir {
            Some(d) => a.replace(&placeholder, d),
            None => a.clone(),
        }));
        let mut argv = vec![prog];
        argv.extend(full);
        let started = pl.start(host, &name, &argv)?;
        let mut inst = Instance {
            system: self.index,
            kind,
            flags: self.flags.clone(),
            command: argv.clone(),
            addr,
            http: http_addr,
            pid: Some(started.pid),
            version: String::new(),
            threads: 1,
            loaded: None,
            backends: Vec::new(),
            replicas: Vec::new(),
            placed: Some(Placed {
                placement: pl.clone(),
                started,
                log: self.log.to_path_buf(),
                data_dir,
            }),
            process: None,
            data_dir: None,
        };
        // Dropping `inst` on an error below stops it there and brings its log back.
        match self.ready(&mut inst) {
            Ok(()) => Ok(inst),
            Err(e) => {
                drop(inst);
                Err(anyhow::anyhow!(
                    "system {:?} on host {host} ({}) did not become ready: {e:#}{}",
                    spec.name,
                    argv.join(" "),
                    output_tail(self.log)
                ))
            }
        }
    }

    /// Waits until `inst` answers over the network, asks its threads, pins it.
    fn ready(&self, inst: &mut Instance) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.timeout;
        inst.version = process::wait_ready(&Probe::Version(inst.addr), self.timeout)?;
        if let Some(h) = inst.http {
            let left = deadline.saturating_duration_since(Instant::now());
            process::wait_ready(&Probe::HttpGet(h), left.max(Duration::from_secs(1)))?;
        }
        if self.kind != SystemKind::Twemproxy {
            let left = deadline.saturating_duration_since(Instant::now());
            inst.threads = threads_of(inst.addr, left.max(Duration::from_secs(1)))?;
        }
        if let (Some(c), Some(pid)) = (&self.flags.cpus, inst.pid) {
            self.pl.run(
                self.host,
                "pinning (taskset)",
                &format!(
                    "taskset -a -p -c {} {pid} >/dev/null",
                    kvlab_hosts::quote(c)
                ),
            )?;
        }
        Ok(())
    }
}
