//! Start a system (kvlab's server, memcached, any program) on a free port and wait until it
//! answers — the one way the lab, the workspace's tests and tools do it.
//!
//! ```text
//! let port = free_port()?;                       the kernel picks a free 127.0.0.1 port
//! Spawn::new(program).args([.., "-p", port])     what to run
//!     .ready(Probe::Version(addr))               ready when `version` answers there
//!     .ready(Probe::HttpGet(http_addr))          (and, optionally, `GET /` answers 200)
//!     .timeout(10 s).start()?  ──► Process       pid for CPU readings; SIGTERM on drop,
//!                                                SIGKILL after a grace period
//! ```
//!
//! Readiness is polled (a bounded back-off between probes, at most 50 ms), never assumed
//! after a sleep; a child that exits while it is awaited fails at once with its status.
//! A free port comes from below the kernel's ephemeral range, reserved machine-wide among
//! kvlab processes until this one ends; a probe counts only when the child (or a process it
//! started) holds the socket that answered, so a server another process left on the port
//! is never taken for the child (the `ports` module says how).
//!
//! [`stats`] asks a running server for its `stats` (e.g. `threads`), the same for kvlab
//! and memcached; [`StatsConn`] keeps one connection to ask them every sample. [`Etcd`]
//! starts Debian's etcd this way (the lab's cluster experiments
//! keep their topology in one).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod ports;
pub use ports::{free_consecutive_ports, free_ports};

/// Why a system did not start or did not become ready.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The program could not be started.
    #[error("cannot start {program}: {source}")]
    Start {
        /// The program.
        program: String,
        /// What spawning it said.
        source: io::Error,
    },
    /// The program exited while it was awaited.
    #[error("{program} exited ({status}) before it answered {what}")]
    Exited {
        /// The program.
        program: String,
        /// Its exit status.
        status: ExitStatus,
        /// The probe awaited.
        what: String,
    },
    /// Another process held the port and answered the probe; the program then exited (it
    /// could not bind it).
    #[error("{program} exited ({status}): {addr} is taken — another process listens there and answered {what}")]
    Taken {
        /// The program.
        program: String,
        /// Its exit status.
        status: ExitStatus,
        /// The address another process holds.
        addr: SocketAddr,
        /// The probe awaited.
        what: String,
    },
    /// No answer within the timeout.
    #[error("no answer to {what} within {:.1} s: {last}", timeout.as_secs_f64())]
    NotReady {
        /// The probe awaited.
        what: String,
        /// The timeout.
        timeout: Duration,
        /// The last probe's failure.
        last: io::Error,
    },
    /// Finding a free port or opening the output file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
}

/// A readiness probe: what must answer before a system counts as up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `version\r\n` on the memcached protocol answers `VERSION …`.
    Version(SocketAddr),
    /// `GET /` over HTTP/1.1 answers `200`.
    HttpGet(SocketAddr),
    /// `version\r\n` on the memcached protocol gets any reply line (a server that wants
    /// authentication first answers `CLIENT_ERROR unauthenticated`).
    Answers(SocketAddr),
    /// A TCP connection is accepted (a TLS port, where a plaintext request gets no reply).
    Connects(SocketAddr),
    /// `GET <path>` over HTTP/1.1 answers `200` (e.g. etcd's `/health`).
    HttpGetPath(SocketAddr, &'static str),
}

impl Probe {
    /// Asks once, waiting at most `timeout`; returns the reply's first line.
    pub fn ask(&self, timeout: Duration) -> io::Result<String> {
        match *self {
            Probe::Version(addr) => probe_version(addr, timeout),
            Probe::HttpGet(addr) => probe_http(addr, timeout),
            Probe::Answers(addr) => ask(addr, b"version\r\n", "", timeout),
            Probe::Connects(addr) => std::net::TcpStream::connect_timeout(&addr, timeout)
                .map(|_| format!("connected to {addr}")),
            Probe::HttpGetPath(addr, path) => probe_http_path(addr, path, timeout),
        }
    }

    /// The address it asks.
    pub fn addr(&self) -> SocketAddr {
        match *self {
            Probe::Version(a)
            | Probe::HttpGet(a)
            | Probe::Answers(a)
            | Probe::Connects(a)
            | Probe::HttpGetPath(a, _) => a,
        }
    }

    fn describe(&self) -> String {
        match self {
            Probe::Version(a) => format!("`version` at {a}"),
            Probe::HttpGet(a) => format!("`GET /` at http://{a}"),
            Probe::Answers(a) => format!("any reply to `version` at {a}"),
            Probe::Connects(a) => format!("a connection to {a}"),
            Probe::HttpGetPath(a, p) => format!("`GET {p}` at http://{a}"),
        }
    }
}

/// Where a child's stdout and stderr go.
#[derive(Debug, Clone, Default)]
pub enum Output {
    /// Discarded.
    #[default]
    Null,
    /// This process' own stdout and stderr.
    Inherit,
    /// Both into one file (created, or truncated).
    File(PathBuf),
}

/// How long one probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What to start and when it is ready; [`Spawn::start`] starts it.
#[derive(Debug, Clone)]
pub struct Spawn {
    program: OsString,
    args: Vec<OsString>,
    probes: Vec<Probe>,
    timeout: Duration,
    grace: Duration,
    output: Output,
}

impl Spawn {
    /// Runs `program` (a path, or a name looked up on PATH). Defaults: no arguments, no
    /// probe, a 10 s timeout, a 5 s grace between SIGTERM and SIGKILL, output discarded.
    pub fn new(program: impl Into<OsString>) -> Spawn {
        Spawn {
            program: program.into(),
            args: Vec::new(),
            probes: Vec::new(),
            timeout: Duration::from_secs(10),
            grace: Duration::from_secs(5),
            output: Output::Null,
        }
    }

    /// Adds an argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Spawn {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Spawn
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds a readiness probe; probes are awaited in order, within one timeout.
    pub fn ready(mut self, probe: Probe) -> Spawn {
        self.probes.push(probe);
        self
    }

    /// How long all probes together may take (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Spawn {
        self.timeout = timeout;
        self
    }

    /// How long a stop waits after SIGTERM before SIGKILL (default 5 s).
    pub fn grace(mut self, grace: Duration) -> Spawn {
        self.grace = grace;
        self
    }

    /// Where the child's output goes (default: discarded).
    pub fn output(mut self, output: Output) -> Spawn {
        self.output = output;
        self
    }

    /// The program and arguments, as text (for messages and records).
    pub fn command(&self) -> Vec<String> {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// Starts the program and waits until every probe answers. On failure the child is
    /// killed and reaped.
    pub fn start(self) -> Result<Process, SpawnError> {
        let program = self.program.to_string_lossy().into_owned();
        let (out, err) = match &self.output {
            Output::Null => (Stdio::null(), Stdio::null()),
            Output::Inherit => (Stdio::inherit(), Stdio::inherit()),
            Output::File(path) => {
                let io_err = |source| SpawnError::Io {
                    what: format!("creating {}", path.display()),
                    source,
                };
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(io_err)?;
                }
                let f = std::fs::File::create(path).map_err(io_err)?;
                let g = f.try_clone().map_err(io_err)?;
                (Stdio::from(f), Stdio::from(g))
            }
        };
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| SpawnError::Start {
                program: program.clone(),
                source,
            })?;
        let mut process = Process {
            command: self.command(),
            child: Some(child),
            probes: self.probes,
            grace: self.grace,
            answer: None,
        };
        let deadline = Instant::now() + self.timeout;
        let mut answer = None;
        for probe in process.probes.clone() {
            let left = deadline.saturating_duration_since(Instant::now());
            let child = process.child.as_mut();
            let reply = wait_for(&probe, left, &program, child).inspect_err(|_| process.kill())?;
            answer.get_or_insert(reply);
        }
        process.answer = answer;
        Ok(process)
    }
}

/// Polls `probe` until it answers, for at most `timeout`; returns the first reply line.
/// For a system this process did not start (an address given to the lab, say).
pub fn wait_ready(probe: &Probe, timeout: Duration) -> Result<String, SpawnError> {
    wait_for(probe, timeout, "", None)
}

fn wait_for(
    probe: &Probe,
    timeout: Duration,
    program: &str,
    mut child: Option<&mut Child>,
) -> Result<String, SpawnError> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    // Set when the probe was answered by a process other than the child.
    let mut stranger = None;
    loop {
        if let Some(c) = child.as_deref_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                let (program, what) = (program.to_string(), probe.describe());
                return Err(match stranger {
                    Some(addr) => SpawnError::Taken {
                        program,
                        status,
                        addr,
                        what,
                    },
                    None => SpawnError::Exited {
                        program,
                        status,
                        what,
                    },
                });
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let answer = probe.ask(PROBE_TIMEOUT.min(left.max(Duration::from_millis(10))));
        // An answer counts when the child holds the socket that gave it.
        let answer = match (answer, child.as_deref()) {
            (Ok(reply), Some(c)) if ports::owned_by(c.id(), probe.addr()) == Some(false) => {
                stranger = Some(probe.addr());
                Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{} answered {reply:?}, but from a process other than {program} (pid {}): the port is taken",
                        probe.addr(),
                        c.id()
                    ),
                ))
            }
            (answer, _) => answer,
        };
        match answer {
            Ok(reply) => return Ok(reply),
            Err(last) if Instant::now() >= deadline => {
                return Err(SpawnError::NotReady {
                    what: probe.describe(),
                    timeout,
                    last,
                })
            }
            // Polling readiness: a bounded back-off between probes, not a synchronisation
            // sleep.
            Err(_) => std::thread::sleep(pause.min(left)),
        }
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// A started, ready child process. Dropping it stops it: SIGTERM, then SIGKILL after the
/// grace period.
#[derive(Debug)]
pub struct Process {
    command: Vec<String>,
    child: Option<Child>,
    probes: Vec<Probe>,
    grace: Duration,
    answer: Option<String>,
}

impl Process {
    /// Its process id (for CPU readings from `/proc/<pid>/stat`); 0 once stopped.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Program and arguments as started.
    pub fn command(&self) -> &[String] {
        &self.command
    }

    /// The first probe's reply line (`VERSION 1.6.21`), if it had a probe.
    pub fn answer(&self) -> Option<&str> {
        self.answer.as_deref()
    }

    /// The address of its first memcached-protocol probe.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.probes.iter().find_map(|p| match p {
            Probe::Version(a) | Probe::Answers(a) | Probe::Connects(a) => Some(*a),
            Probe::HttpGet(_) | Probe::HttpGetPath(..) => None,
        })
    }

    /// Whether it has exited (or was stopped).
    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// SIGKILL now (`kill -9`, as a crash) and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops it: SIGTERM, then SIGKILL after the grace period; returns how it exited.
    pub fn stop(mut self) -> Option<ExitStatus> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill has no memory-safety preconditions; pid is our own child, not yet
            // reaped (so the id cannot have been reused).
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + self.grace;
        let mut pause = Duration::from_millis(1);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Err(_) => return None,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    return child.wait().ok();
                }
                // Polling the child's exit: a bounded back-off, not a synchronisation sleep.
                Ok(None) => std::thread::sleep(pause),
            }
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// A free 127.0.0.1 port, reserved until the child binds it (see [`free_ports`]).
pub fn free_port() -> io::Result<u16> {
    Ok(free_ports(1)?[0])
}

fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// Sends `request` and returns the first reply line if it starts with `expect`.
fn ask(addr: SocketAddr, request: &[u8], expect: &str, timeout: Duration) -> io::Result<String> {
    let mut s = connect(addr, timeout)?;
    s.write_all(request)?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    let line = line.trim_end().to_string();
    if line.starts_with(expect) {
        Ok(line)
    } else {
        Err(io::Error::other(format!("unexpected reply: {line:?}")))
    }
}

/// Sends `version` and returns the reply line (`VERSION …`).
pub fn probe_version(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    ask(addr, b"version\r\n", "VERSION", timeout)
}

/// Sends `GET /` (HTTP/1.1) and returns the status line if it is 200.
pub fn probe_http(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    probe_http_path(addr, "/", timeout)
}

/// `GET <path>` over HTTP/1.1; the status line if it is `200`.
pub fn probe_http_path(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<String> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    ask(addr, request.as_bytes(), "HTTP/1.1 200", timeout)
}

/// Asks `stats` (or `stats ARG`, e.g. `settings`) and returns the `STAT name value` pairs in
/// order. kvlab's server and memcached answer alike (`threads` in `stats`, `num_threads` in
/// `stats settings`).
pub fn stats(
    addr: SocketAddr,
    arg: Option<&str>,
    timeout: Duration,
) -> io::Result<Vec<(String, String)>> {
    let answer = StatsConn::new(addr, timeout).ask(&[arg])?.pop();
    answer
        .unwrap_or_else(|| Err(String::new()))
        .map_err(|l| io::Error::other(format!("unexpected reply: {l:?}")))
}

/// Appends `stats` (or `stats ARG`) and its line end to `into`.
fn push_request(into: &mut String, arg: Option<&str>) {
    into.push_str("stats");
    if let Some(a) = arg {
        into.push(' ');
        into.push_str(a);
    }
    into.push_str("\r\n");
}

/// One `stats` answer: its `STAT name value` pairs up to `END`, or the server's one-line
/// refusal (`ERROR`: memcached asked for a group it does not know).
pub type StatsAnswer = Result<Vec<(String, String)>, String>;

/// Reads one [`StatsAnswer`].
fn read_stats(r: &mut BufReader<TcpStream>, line: &mut String) -> io::Result<StatsAnswer> {
    let mut out = Vec::new();
    loop {
        line.clear();
        if r.read_line(line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before END",
            ));
        }
        let l = line.trim_end();
        if l == "END" {
            return Ok(Ok(out));
        }
        match l.strip_prefix("STAT ").and_then(|kv| kv.split_once(' ')) {
            Some((k, v)) => out.push((k.to_string(), v.to_string())),
            None if out.is_empty() => return Ok(Err(l.to_string())),
            None => return Err(io::Error::other(format!("unexpected reply: {l:?}"))),
        }
    }
}

/// A kept connection to ask a server's `stats` again and again (a sampler's every 100 ms):
/// the groups asked together in one write and answered in one round trip, no connection
/// opened per sample (the server being watched accepts nothing new for it). A failed ask
/// (a timeout, a closed connection) drops the connection, since a late answer would be read
/// as the next one's; the next ask connects again.
#[derive(Debug)]
pub struct StatsConn {
    addr: SocketAddr,
    timeout: Duration,
    conn: Option<BufReader<TcpStream>>,
    request: String,
    line: String,
}

impl StatsConn {
    /// Asks at `addr`, each connect, write and read bounded by `timeout`.
    pub fn new(addr: SocketAddr, timeout: Duration) -> StatsConn {
        StatsConn {
            addr,
            timeout,
            conn: None,
            request: String::new(),
            line: String::new(),
        }
    }

    /// Asks each of `groups` (`None`: plain `stats`; `Some("latency")`: `stats latency`) and
    /// returns their answers in order: the pairs, or the server's refusal line.
    pub fn ask(&mut self, groups: &[Option<&str>]) -> io::Result<Vec<StatsAnswer>> {
        let answers = self.ask_on(groups);
        if answers.is_err() {
            self.conn = None;
        }
        answers
    }

    fn ask_on(&mut self, groups: &[Option<&str>]) -> io::Result<Vec<StatsAnswer>> {
        let r = match &mut self.conn {
            Some(r) => r,
            None => self
                .conn
                .insert(BufReader::new(connect(self.addr, self.timeout)?)),
        };
        self.request.clear();
        for g in groups {
            push_request(&mut self.request, *g);
        }
        r.get_mut().write_all(self.request.as_bytes())?;
        groups
            .iter()
            .map(|_| read_stats(r, &mut self.line))
            .collect()
    }
}

/// Finds a program on PATH (or checks a path: one with a `/`).
pub fn which(program: impl AsRef<Path>) -> Option<PathBuf> {
    let program = program.as_ref();
    if program.components().count() > 1 || program.is_absolute() {
        return program.is_file().then(|| program.to_path_buf());
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

/// Debian's `etcd` (v3) on free 127.0.0.1 ports with a data directory of its own, stopped
/// on drop (the directory is the caller's to remove).
pub struct Etcd {
    /// The process.
    pub process: Process,
    /// Its client address.
    pub addr: SocketAddr,
}

impl Etcd {
    /// The etcd program: `$ETCD`, else `/usr/bin/etcd`.
    pub fn program() -> String {
        std::env::var("ETCD").unwrap_or_else(|_| "/usr/bin/etcd".into())
    }

    /// Starts a one-member etcd keeping its data in `dir`, and returns once `GET /health`
    /// answers `200` (at most 15 s).
    pub fn start(dir: &std::path::Path) -> Result<Self, SpawnError> {
        let ports = free_ports(2).map_err(|source| SpawnError::Io {
            what: "finding free ports".into(),
            source,
        })?;
        let addr = SocketAddr::from(([127, 0, 0, 1], ports[0]));
        let peer = SocketAddr::from(([127, 0, 0, 1], ports[1]));
        let process = Spawn::new(Self::program())
            .args(Self::member_args(&dir.display().to_string(), addr, peer))
            .timeout(std::time::Duration::from_secs(15))
            .ready(Probe::HttpGetPath(addr, "/health"))
            .start()?;
        Ok(Etcd { process, addr })
    }

    /// The flags (after the program) of a one-member etcd keeping its data in `dir`,
    /// serving clients at `client` and listening for peers at `peer`: what [`Etcd::start`]
    /// runs here, and the lab runs on a host.
    pub fn member_args(dir: &str, client: SocketAddr, peer: SocketAddr) -> Vec<String> {
        let (client, peer) = (format!("http://{client}"), format!("http://{peer}"));
        [
            "--data-dir",
            dir,
            "--name",
            "kvlab",
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("kvlab={peer}"),
        ]
        .map(String::from)
        .to_vec()
    }

    /// The `--cluster`/`--topology` spelling of a cluster `name` in this etcd.
    pub fn spec(&self, name: &str) -> String {
        format!("etcd://{}/{name}", self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server of another process on the child's port answers the probe: that does not
    /// make the child ready. A child that stays is not ready within the timeout, and the
    /// error says the port is taken; one that exits after such an answer (a server that
    /// could not bind) is `Taken`.
    #[test]
    fn a_port_answered_by_another_process_is_not_the_child_ready() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let answering = std::thread::spawn(move || {
            for s in l.incoming() {
                if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let Ok(mut s) = s else { break };
                let mut line = String::new();
                let _ = BufReader::new(s.try_clone().unwrap()).read_line(&mut line);
                let _ = s.write_all(b"VERSION stranger\r\n");
            }
        });
        let stays = Spawn::new("sleep")
            .arg("30")
            .ready(Probe::Version(addr))
            .timeout(Duration::from_secs(1))
            .start()
            .unwrap_err();
        assert!(matches!(stays, SpawnError::NotReady { .. }), "{stays}");
        assert!(stays.to_string().contains("the port is taken"), "{stays}");
        let exits = Spawn::new("sh")
            .args(["-c", "sleep 1; exit 3"])
            .ready(Probe::Version(addr))
            .timeout(Duration::from_secs(20))
            .start()
            .unwrap_err();
        assert!(matches!(exits, SpawnError::Taken { .. }), "{exits}");
        assert!(exits.to_string().contains("is taken"), "{exits}");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = TcpStream::connect(addr);
        answering.join().unwrap();
    }

    #[test]
    fn a_child_that_exits_fails_at_once() {
        let port = free_port().unwrap();
        let err = Spawn::new("sh")
            .args(["-c", "exit 3"])
            .ready(Probe::Version(([127, 0, 0, 1], port).into()))
            .start()
            .unwrap_err();
        assert!(matches!(err, SpawnError::Exited { .. }), "{err}");
    }

    #[test]
    fn a_missing_program_is_a_start_error() {
        let err = Spawn::new("/nonexistent/kvlab-nothing")
            .start()
            .unwrap_err();
        assert!(matches!(err, SpawnError::Start { .. }), "{err}");
    }

    #[test]
    fn stats_and_version_from_a_scripted_server() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            for reply in [
                &b"VERSION 9.9\r\n"[..],
                b"STAT threads 3\r\nSTAT pid 7\r\nEND\r\n",
            ] {
                let (mut s, _) = l.accept().unwrap();
                let mut line = String::new();
                BufReader::new(s.try_clone().unwrap())
                    .read_line(&mut line)
                    .unwrap();
                s.write_all(reply).unwrap();
            }
        });
        let d = Duration::from_secs(5);
        assert_eq!(wait_ready(&Probe::Version(addr), d).unwrap(), "VERSION 9.9");
        let st = stats(addr, None, d).unwrap();
        assert_eq!(st[0], ("threads".into(), "3".into()));
        t.join().unwrap();
    }

    /// Against memcached (CI installs it): `stats` and a group it does not know asked
    /// together, many times over one connection (its `total_connections` does not grow);
    /// the refusal is that group's answer and the connection stays in step; after the
    /// server is gone an ask fails, and a new server at the address is asked again.
    #[test]
    fn a_kept_stats_connection_asks_memcached_again_and_again() {
        if which("memcached").is_none() {
            eprintln!("memcached is not installed: skipped");
            return;
        }
        let port = free_port().unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let start = || {
            Spawn::new("memcached")
                .args(["-u", "root", "-l", "127.0.0.1", "-U", "0", "-p"])
                .arg(port.to_string())
                .ready(Probe::Version(addr))
                .start()
                .unwrap()
        };
        let server = start();
        let mut conn = StatsConn::new(addr, Duration::from_secs(5));
        let total = |a: &[(String, String)]| {
            a.iter()
                .find(|(k, _)| k == "total_connections")
                .map(|(_, v)| v.parse::<u64>().unwrap())
                .unwrap()
        };
        let mut seen = Vec::new();
        for _ in 0..20 {
            let answers = conn.ask(&[None, Some("latency"), None]).unwrap();
            assert_eq!(answers.len(), 3);
            assert_eq!(answers[1], Err("ERROR".to_string()));
            seen.push(total(answers[0].as_ref().unwrap()));
            assert_eq!(total(answers[2].as_ref().unwrap()), seen[seen.len() - 1]);
        }
        assert!(seen.iter().all(|&n| n == seen[0]), "{seen:?}");
        drop(server);
        assert!(conn.ask(&[None]).is_err());
        let _again = start();
        assert!(conn.ask(&[None]).unwrap()[0].is_ok());
    }

    #[test]
    fn stop_is_sigterm_then_sigkill_after_the_grace() {
        use std::os::unix::process::ExitStatusExt;
        let p = Spawn::new("sleep").arg("30").start().unwrap();
        assert!(p.pid() > 0);
        assert_eq!(p.stop().unwrap().signal(), Some(libc::SIGTERM));
        // Ignores SIGTERM (an ignored signal stays ignored across exec): SIGKILL it is. The
        // marker file says the trap is set.
        let marker = std::env::temp_dir().join(format!("kvlab-spawn-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        let p = Spawn::new("sh")
            .arg("-c")
            .arg(format!(
                "trap '' TERM; touch {}; exec sleep 30",
                marker.display()
            ))
            .grace(Duration::from_millis(200))
            .start()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !marker.exists() {
            assert!(Instant::now() < deadline, "the child never set its trap");
            std::thread::yield_now();
        }
        let _ = std::fs::remove_file(&marker);
        assert_eq!(p.stop().unwrap().signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn which_finds_sh() {
        assert!(which("sh").is_some());
        assert!(which("/nonexistent/sh").is_none());
    }
}
