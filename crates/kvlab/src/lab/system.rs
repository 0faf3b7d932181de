//! Systems under test as separate processes: start on a free port, wait until they answer
//! `version`, read their CPU time from /proc/<pid>/stat, stop with SIGTERM (SIGKILL after a
//! timeout).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::spec::{SystemKind, SystemSpec};

/// A started (or external) system.
pub struct Instance {
    /// Index of its spec.
    pub system: usize,
    /// Its rendered flags (the lab's port flags not included).
    pub args: Vec<String>,
    /// Program and arguments as started (or the address, external).
    pub command: Vec<String>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its process id, when known.
    pub pid: Option<u32>,
    /// What it answered to `version`.
    pub version: String,
    /// The key space it holds (reload when the workload's changes).
    pub loaded: Option<String>,
    child: Option<Child>,
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
pub fn program(spec: &SystemSpec) -> anyhow::Result<Option<PathBuf>> {
    match spec.kind()? {
        SystemKind::External => Ok(None),
        SystemKind::Kvlab => match &spec.binary {
            Some(b) => which(b)
                .map(Some)
                .with_context(|| format!("system {:?}: {b:?} not found", spec.name)),
            None => Ok(Some(
                std::env::current_exe().context("finding the kvlab executable")?,
            )),
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

fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// Sends `version` and returns the reply line, within `timeout`.
pub fn probe(addr: SocketAddr, timeout: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(b"version\r\n")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    let line = line.trim_end().to_string();
    if line.starts_with("VERSION") {
        Ok(line)
    } else {
        Err(std::io::Error::other(format!(
            "unexpected reply to version: {line:?}"
        )))
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl Instance {
    /// Starts system `index` (`spec`) with `args`, its output going to `log`.
    pub fn start(
        index: usize,
        spec: &SystemSpec,
        args: Vec<String>,
        log: &Path,
    ) -> anyhow::Result<Instance> {
        let timeout = Duration::from_secs_f64(spec.start_timeout.unwrap_or(10.0).clamp(0.1, 600.0));
        let Some(prog) = program(spec)? else {
            let a = spec.address.as_deref().unwrap_or_default();
            let addr = a
                .to_socket_addrs()
                .with_context(|| format!("system {:?}: bad address {a:?}", spec.name))?
                .next()
                .with_context(|| format!("system {:?}: {a:?} resolves to nothing", spec.name))?;
            let version = wait_ready(addr, timeout, &mut || Ok(()))
                .with_context(|| format!("system {:?} at {addr} does not answer", spec.name))?;
            return Ok(Instance {
                system: index,
                command: vec![addr.to_string()],
                args,
                addr,
                pid: spec.pid,
                version,
                loaded: None,
                child: None,
            });
        };
        let port = free_port()?;
        let mut full: Vec<String> = Vec::new();
        match spec.kind()? {
            SystemKind::Kvlab => {
                full.extend(["server".into(), "-l".into(), "127.0.0.1".into()]);
                full.extend(["-p".into(), port.to_string()]);
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
        full.extend(args.iter().cloned());
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
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
        let ready = wait_ready(addr, timeout, &mut || match child.try_wait() {
            Ok(Some(status)) => bail!("it exited ({status})"),
            _ => Ok(()),
        });
        let version = match ready {
            Ok(v) => v,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
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
            pid: Some(child.id()),
            version,
            loaded: None,
            child: Some(child),
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

/// Polls `version` until the server answers (bounded back-off between attempts), calling
/// `alive` before each attempt to notice a process that died.
fn wait_ready(
    addr: SocketAddr,
    timeout: Duration,
    alive: &mut dyn FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    let mut wait = Duration::from_millis(1);
    loop {
        alive()?;
        match probe(addr, Duration::from_millis(500)) {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => {
                bail!(
                    "no answer to `version` within {:.1} s: {e}",
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
