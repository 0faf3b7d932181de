//! Systems under test as separate processes: start on a free port (and a kvlab server that
//! will be loaded over HTTP on a second one, `--http-port`), wait until they answer `version`
//! (and `GET /`), read their CPU time from /proc/<pid>/stat, stop with SIGTERM (SIGKILL after
//! a timeout).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::spec::{SystemKind, SystemSpec, DATA_DIR};

/// A started (or external) system.
pub struct Instance {
    /// Index of its spec.
    pub system: usize,
    /// Its rendered flags (the lab's port flags not included).
    pub args: Vec<String>,
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
    /// The key space it holds (reload when the workload's changes).
    pub loaded: Option<String>,
    child: Option<Child>,
    /// The fresh directory that `{data_dir}` named, removed when the system stops.
    data_dir: Option<PathBuf>,
}

/// Finds a program on PATH (or checks a path).
pub fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The program a system runs, or `None` for an external one; an error when it is missing.
/// `kvlab_bin` is the kvlab executable for a kvlab system without a `binary`.
pub fn program(spec: &SystemSpec, kvlab_bin: Option<&Path>) -> anyhow::Result<Option<PathBuf>> {
    match spec.kind()? {
        SystemKind::External => Ok(None),
        SystemKind::Kvlab => match &spec.binary {
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
        SystemKind::Memcached => {
            let b = spec.binary.as_deref().unwrap_or("memcached");
            which(b).map(Some).with_context(|| {
                format!(
                    "system {:?}: {b:?} not found on PATH (install memcached, e.g. \
                     `apt-get install memcached`, or mark the system optional = true)",
                    spec.name
                )
            })
        }
    }
}

/// `n` distinct free ports (each listener is held until all are found, so the kernel cannot
/// hand out the same port twice).
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").context("finding a free port"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// Sends `request` to `addr` and returns the first reply line if it starts with `expect`,
/// within `timeout`.
fn ask(
    addr: SocketAddr,
    request: &[u8],
    expect: &str,
    timeout: Duration,
) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(request)?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    let line = line.trim_end().to_string();
    if line.starts_with(expect) {
        Ok(line)
    } else {
        Err(std::io::Error::other(format!("unexpected reply: {line:?}")))
    }
}

/// Sends `version` and returns the reply line, within `timeout`.
pub fn probe(addr: SocketAddr, timeout: Duration) -> std::io::Result<String> {
    ask(addr, b"version\r\n", "VERSION", timeout)
}

/// Sends `GET /` to a kvlab server's REST interface and returns its status line if it is
/// 200, within `timeout`.
pub fn probe_http(addr: SocketAddr, timeout: Duration) -> std::io::Result<String> {
    let request = format!("GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    ask(addr, request.as_bytes(), "HTTP/1.1 200", timeout)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl Instance {
    /// Starts system `index` (`spec`) with `args`, its output going to `log`; with `http`, a
    /// kvlab server also serves HTTP (`--http-port`), and is ready when both ports answer.
    pub fn start(
        index: usize,
        spec: &SystemSpec,
        args: Vec<String>,
        http: bool,
        log: &Path,
        kvlab_bin: Option<&Path>,
    ) -> anyhow::Result<Instance> {
        let timeout = Duration::from_secs_f64(spec.start_timeout.unwrap_or(10.0).clamp(0.1, 600.0));
        let Some(prog) = program(spec, kvlab_bin)? else {
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
            let version = wait_ready("`version`", timeout, &mut || Ok(()), &|| {
                probe(addr, PROBE_TIMEOUT)
            })
            .with_context(|| format!("system {:?} at {addr} does not answer", spec.name))?;
            return Ok(Instance {
                system: index,
                command: vec![addr.to_string()],
                args,
                addr,
                http: None,
                pid: spec.pid,
                version,
                loaded: None,
                child: None,
                data_dir: None,
            });
        };
        let kind = spec.kind()?;
        if http && kind != SystemKind::Kvlab {
            bail!("system {:?}: only a kvlab server serves HTTP", spec.name);
        }
        let ports = free_ports(if http { 2 } else { 1 })?;
        let port = ports[0];
        let http_addr: Option<SocketAddr> = ports.get(1).map(|&p| ([127, 0, 0, 1], p).into());
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
            SystemKind::External => {}
        }
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let placeholder = format!("{{{DATA_DIR}}}");
        let data_dir = args
            .iter()
            .any(|a| a.contains(&placeholder))
            .then(|| log.with_extension("data"));
        if let Some(d) = &data_dir {
            // A fresh directory for every start: nothing recovered from an earlier run.
            if d.exists() {
                std::fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
            }
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        full.extend(args.iter().map(|a| match &data_dir {
            Some(d) => a.replace(&placeholder, &d.display().to_string()),
            None => a.clone(),
        }));
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let mut child = Command::new(&prog)
            .args(&full)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", prog.display()))?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut command = vec![prog.display().to_string()];
        command.extend(full);
        let deadline = Instant::now() + timeout;
        let mut alive = || match child.try_wait() {
            Ok(Some(status)) => bail!("it exited ({status})"),
            _ => Ok(()),
        };
        let ready = wait_ready("`version`", timeout, &mut alive, &|| {
            probe(addr, PROBE_TIMEOUT)
        })
        .and_then(|version| {
            if let Some(h) = http_addr {
                let left = deadline.saturating_duration_since(Instant::now());
                wait_ready("`GET /` over HTTP", left, &mut alive, &|| {
                    probe_http(h, PROBE_TIMEOUT)
                })?;
            }
            Ok(version)
        });
        let version = match ready {
            Ok(v) => v,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                if let Some(d) = &data_dir {
                    let _ = std::fs::remove_dir_all(d);
                }
                let tail = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!(
                    "system {:?} ({}) did not become ready: {e:#}{}",
                    spec.name,
                    command.join(" "),
                    if tail.is_empty() {
                        String::new()
                    } else {
                        format!("; its output: {}", tail.join(" | "))
                    }
                );
            }
        };
        Ok(Instance {
            system: index,
            args,
            command,
            addr,
            http: http_addr,
            pid: Some(child.id()),
            version,
            loaded: None,
            child: Some(child),
            data_dir,
        })
    }

    /// Whether a started process has exited.
    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Stops a started process: SIGTERM, then SIGKILL after 5 s.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.stop_child();
        if let Some(d) = self.data_dir.take() {
            if let Err(e) = std::fs::remove_dir_all(&d) {
                eprintln!("note: could not remove {}: {e}", d.display());
            }
        }
    }

    fn stop_child(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill has no memory-safety preconditions; pid is our own child, not yet
            // reaped (so the id cannot have been reused).
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut wait = Duration::from_millis(1);
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
                // Polling the child's exit: bounded back-off, not a synchronisation sleep.
                Ok(None) => std::thread::sleep(wait),
            }
            wait = (wait * 2).min(Duration::from_millis(50));
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// How long one readiness probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Polls `probe` (asking `what`) until the server answers (bounded back-off between
/// attempts), calling `alive` before each attempt to notice a process that died.
fn wait_ready(
    what: &str,
    timeout: Duration,
    alive: &mut dyn FnMut() -> anyhow::Result<()>,
    probe: &dyn Fn() -> std::io::Result<String>,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    let mut wait = Duration::from_millis(1);
    loop {
        alive()?;
        match probe() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => {
                bail!(
                    "no answer to {what} within {:.1} s: {e}",
                    timeout.as_secs_f64()
                )
            }
            Err(_) => std::thread::sleep(wait),
        }
        wait = (wait * 2).min(Duration::from_millis(50));
    }
}

/// The server's worker threads, from `-t N` / `--threads N` / `--threads=N` (default 4,
/// memcached's and kvlab's).
pub fn server_threads(args: &[String]) -> u32 {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "-t" || a == "--threads" {
            if let Some(v) = it.next().and_then(|v| v.parse().ok()) {
                return v;
            }
        } else if let Some(v) = a.strip_prefix("--threads=").and_then(|v| v.parse().ok()) {
            return v;
        } else if let Some(v) = a.strip_prefix("-t").and_then(|v| v.parse().ok()) {
            return v;
        }
    }
    4
}
