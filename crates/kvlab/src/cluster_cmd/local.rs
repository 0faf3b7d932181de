//! The nodes of a cluster that run on this machine: `up` and `add --start` start them (each
//! a `kvlab server --cluster` in its own process group, so it outlives the command), check
//! that the process answering at each address is the one they started, and stop what they
//! started when something fails; `down` finds them from the topology — each node reports
//! its pid in `cluster status` — whatever directory it is run from, and stops them.
//!
//! The `pids` file beside the topology (`PID NODE` lines, appended by every start) is the
//! fallback for a node that does not answer.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_client::cluster::resolve;
use kvlab_cluster::coordinator::node_status;
use kvlab_cluster::{ClusterError, NodeCommand, Topology};

/// How long a started node may take to answer `cluster status`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a node may take to exit after SIGTERM before it gets SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How long a node may take to disappear after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// A node this command started.
pub struct Started {
    /// Its name in the topology, `HOST:PORT`.
    pub node: String,
    child: Child,
    log: PathBuf,
    /// Where this start's lines begin in the log (a restarted node's log goes on).
    log_from: u64,
}

impl Started {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Fails, naming the address, if one of `nodes` cannot be listened on (most often: it is
/// in use), so that nothing is started on ports that are not free.
pub fn check_free(nodes: &[String]) -> anyhow::Result<()> {
    for n in nodes {
        let addr = resolve(n).with_context(|| format!("{n}: not an address"))?;
        match TcpListener::bind(addr) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => bail!(
                "address {n} is in use (another program — a server, another cluster — listens \
                 there): nothing was started"
            ),
            Err(e) => bail!("cannot listen on {n}: {e}: nothing was started"),
        }
    }
    Ok(())
}

/// A node's own flags from the flags every local node gets: `--data-dir DIR` becomes
/// `DIR/node-PORT` (absolute, so that `cluster start` finds it from any directory), so the
/// nodes of one machine keep their data apart.
fn node_args(extra: &[String], port: &str) -> Vec<String> {
    let own = |dir: &str| {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| PathBuf::from(dir));
        dir.join(format!("node-{port}")).display().to_string()
    };
    let mut out = Vec::with_capacity(extra.len());
    let mut data_dir_next = false;
    for a in extra {
        if data_dir_next {
            out.push(own(a));
            data_dir_next = false;
        } else if let Some(dir) = a.strip_prefix("--data-dir=") {
            out.push(format!("--data-dir={}", own(dir)));
        } else {
            data_dir_next = a == "--data-dir";
            out.push(a.clone());
        }
    }
    out
}

/// Starts `kvlab server --cluster TOPOLOGY` for `node` in the background (its own process
/// group, so it outlives this command), logging to `DIR/node-PORT.log`; its pid goes to
/// `DIR/pids`, and its own flags to `DIR/node-PORT.args` (for [`restart`]). A `--data-dir
/// DIR` among `extra` is the node's `DIR/node-PORT`.
pub fn start(dir: &Path, topology: &str, node: &str, extra: &[String]) -> anyhow::Result<Started> {
    let (_, port) = split(node)?;
    let own = node_args(extra, port);
    let args_path = args_file(dir, port);
    let text = serde_json::to_string(&own).context("the node's flags")?;
    std::fs::write(&args_path, text + "\n")
        .with_context(|| format!("recording node {node}'s flags in {}", args_path.display()))?;
    spawn(dir, topology, node, &own, false)
}

/// Starts `node` again, a member that stopped (crashed, killed, or stopped by hand), with
/// the flags it was first started with (`DIR/node-PORT.args`): over its own data directory.
pub fn restart(dir: &Path, topology: &str, node: &str) -> anyhow::Result<Started> {
    let (_, port) = split(node)?;
    let args_path = args_file(dir, port);
    let text = match std::fs::read_to_string(&args_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{node} was not started by `kvlab cluster up` or `add --start` of this topology \
             (no {}): start it by hand as it was started before (`kvlab server … --cluster \
             TOPOLOGY --cluster-node {node}`, with its own --data-dir)",
            args_path.display()
        ),
        Err(e) => bail!("reading {}: {e}", args_path.display()),
    };
    let own: Vec<String> = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a list of flags", args_path.display()))?;
    // Its log goes on after what it said before it stopped.
    spawn(dir, topology, node, &own, true)
}

fn split(node: &str) -> anyhow::Result<(&str, &str)> {
    node.rsplit_once(':')
        .with_context(|| format!("{node}: expected HOST:PORT"))
}

/// Where a local node's own flags are kept: `DIR/node-PORT.args` (a JSON list).
fn args_file(dir: &Path, port: &str) -> PathBuf {
    dir.join(format!("node-{port}.args"))
}

/// Spawns the node with its own flags `own` (see [`start`]), its log new or `appended`.
fn spawn(
    dir: &Path,
    topology: &str,
    node: &str,
    own: &[String],
    appended: bool,
) -> anyhow::Result<Started> {
    let (host, port) = split(node)?;
    let log_path = dir.join(format!("node-{port}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(appended)
        .truncate(!appended)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let log_from = log.metadata().map_or(0, |m| m.len());
    let exe = std::env::current_exe().context("finding the kvlab binary")?;
    use std::os::unix::process::CommandExt;
    let child = Command::new(exe)
        .args(
            NodeCommand::node(host, port, topology, node)
                .args(own)
                .to_args(),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting node {node}"))?;
    let started = Started {
        node: node.to_string(),
        child,
        log: log_path,
        log_from,
    };
    let pids_path = dir.join("pids");
    let recorded = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&pids_path)
        .and_then(|mut f| writeln!(f, "{} {node}", started.pid()));
    if let Err(e) = recorded {
        stop_started(vec![started], dir);
        bail!(
            "recording node {node}'s pid in {}: {e}",
            pids_path.display()
        );
    }
    Ok(started)
}

/// Waits until `s` answers `cluster status` as the process this command started (its pid).
/// Fails at once if it exits (quoting its log) or if another process answers there.
pub fn wait(s: &mut Started) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = s.child.try_wait()? {
            bail!(
                "node {} exited ({status}) before it answered; its log {} says: {}",
                s.node,
                s.log.display(),
                log_error(&s.log, s.log_from)
            );
        }
        match node_status(&s.node) {
            Ok(v) => {
                return match v["pid"].as_u64() {
                    Some(pid) if pid == u64::from(s.pid()) => Ok(()),
                    other => bail!(
                        "{} is answered by another process (pid {}), not by the node this \
                         command started (pid {}): another cluster runs on that address",
                        s.node,
                        other.map_or("unknown".into(), |p| p.to_string()),
                        s.pid()
                    ),
                };
            }
            Err(e @ ClusterError::NotANode { .. }) => {
                bail!("address {} is held by another program: {e}", s.node)
            }
            Err(e) if Instant::now() >= deadline => bail!(
                "node {} did not answer within {} s: {e} (its log: {})",
                s.node,
                START_TIMEOUT.as_secs(),
                s.log.display()
            ),
            // Polling readiness: a bounded back-off between probes.
            Err(_) => std::thread::sleep(pause),
        }
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// What a node's log says about why it stopped: its `Error:` line with the causes under it
/// (`Caused by:`), or a command-line `error:`; else its last line.
fn log_error(log: &Path, from: u64) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let Some(at) = lines
        .iter()
        .position(|l| l.starts_with("Error:") || l.starts_with("error:"))
    else {
        return lines
            .last()
            .map_or("nothing".into(), |l| l.trim().to_string());
    };
    let mut said = lines[at].to_string();
    if lines.get(at + 1).map(|l| l.trim()) == Some("Caused by:") {
        for cause in lines[at + 2..].iter().take_while(|l| l.starts_with(' ')) {
            // Several causes are numbered (`0: …`).
            let cause = cause.trim();
            let cause = match cause.split_once(": ") {
                Some((n, rest)) if n.parse::<u32>().is_ok() => rest,
                _ => cause,
            };
            said.push_str(": ");
            said.push_str(cause);
        }
    }
    said
}

/// Stops nodes this command started (SIGTERM, SIGKILL after the grace period) and removes
/// them from `DIR/pids`. Returns what it had to kill, for the message.
pub fn stop_started(started: Vec<Started>, dir: &Path) -> Vec<String> {
    let mut notes = Vec::new();
    for s in &started {
        // One that has exited already is reaped below.
        let _ = signal(s.pid() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + STOP_GRACE;
    let mut pids = Vec::new();
    for mut s in started {
        pids.push(s.pid());
        let mut pause = Duration::from_millis(1);
        loop {
            match s.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    // Polling the child's exit: a bounded back-off.
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                _ => {
                    notes.push(format!(
                        "node {} (pid {}) did not stop within {} s of SIGTERM: killed it with \
                         SIGKILL",
                        s.node,
                        s.pid(),
                        STOP_GRACE.as_secs()
                    ));
                    let _ = s.child.kill();
                    let _ = s.child.wait();
                    break;
                }
            }
        }
    }
    forget(dir, |pid| pids.contains(&pid));
    notes
}

/// Sends `sig` to `pid`; the OS error if it could not.
fn signal(pid: i32, sig: libc::c_int) -> std::io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions; every caller checked that `pid`
    // is a kvlab cluster node (its own child, or a process whose command line says so).
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The `PID NODE` lines of `DIR/pids`.
fn recorded(dir: &Path) -> Vec<(u32, String)> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (pid, node) = l.trim().split_once(' ')?;
            Some((pid.parse().ok()?, node.trim().to_string()))
        })
        .collect()
}

/// Drops the lines of `DIR/pids` whose pid `gone` says; removes the file once empty.
fn forget(dir: &Path, gone: impl Fn(u32) -> bool) {
    let path = dir.join("pids");
    let keep: Vec<String> = recorded(dir)
        .into_iter()
        .filter(|(pid, _)| !gone(*pid))
        .map(|(pid, node)| format!("{pid} {node}\n"))
        .collect();
    let _ = if keep.is_empty() {
        std::fs::remove_file(&path)
    } else {
        std::fs::write(&path, keep.concat())
    };
}

/// Whether process `pid` runs (a zombie has exited: it only waits for its parent).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the command's closing parenthesis.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X') | None
        ),
        Err(_) => false,
    }
}

/// Whether process `pid` on this machine is a `kvlab server --cluster`, so that a pid from a
/// node in another pid namespace (a container) or a recorded pid reused since is never
/// signalled. With `node`, its `--cluster-node` must be that; with `topology`, its
/// `--cluster` must be that.
fn is_cluster_node(pid: u32, node: Option<&str>, topology: Option<&str>) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .skip(1)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    // `--flag VALUE` or `--flag=VALUE`.
    let value = |flag: &str| {
        args.iter().enumerate().find_map(|(i, a)| {
            if a == flag {
                args.get(i + 1).map(String::as_str)
            } else {
                a.strip_prefix(flag)?.strip_prefix('=')
            }
        })
    };
    let cluster = value("--cluster");
    running(pid)
        && args.iter().any(|a| a == "server")
        && cluster.is_some()
        && topology.is_none_or(|t| cluster == Some(t))
        && node.is_none_or(|n| value("--cluster-node") == Some(n))
}

/// Whether `ip` is an address of this machine: loopback, or one a socket can be bound to.
fn on_this_machine(ip: IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified() || UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// What `down` found for one node.
enum Found {
    /// Its process on this machine, and how it was found.
    Pid(u32, &'static str),
    /// Nothing listens at its address, and no recorded process runs.
    NotRunning,
    /// Its address is not one of this machine's.
    Elsewhere,
    /// It may run here but its process cannot be found or is not a cluster node: why.
    Unknown(String),
}

/// Finds the process of `node`, which the topology names: the pid it reports, else the one
/// recorded for it.
fn find(node: &str, recorded: &[(u32, String)], dir: &Path) -> Found {
    // A name that does not resolve here is no address of this machine either.
    if !resolve(node).is_ok_and(|addr| on_this_machine(addr.ip())) {
        return Found::Elsewhere;
    }
    let status = node_status(node);
    if let Some(pid) = status
        .as_ref()
        .ok()
        .and_then(|v| v["pid"].as_u64())
        .and_then(|p| u32::try_from(p).ok())
    {
        return if is_cluster_node(pid, None, None) {
            Found::Pid(pid, "the pid it reports")
        } else {
            Found::Unknown(format!(
                "it reports pid {pid}, which is no kvlab cluster node on this machine (does it \
                 run in a container?)"
            ))
        };
    }
    // No pid from the node itself: the one `up` or `add --start` recorded, if it still runs.
    if let Some(pid) = recorded_pid(node, None, recorded) {
        return Found::Pid(pid, "its pid recorded by `up`");
    }
    match status {
        Err(ClusterError::Unreachable { .. }) => Found::NotRunning,
        Ok(_) => Found::Unknown(
            "it answers but reports no pid (a kvlab older than this one?): stop it by hand".into(),
        ),
        Err(e) => Found::Unknown(format!(
            "{e}; and no running pid is recorded for it in {}",
            dir.join("pids").display()
        )),
    }
}

/// The recorded pid of `node` if that process still runs as its node (of `topology`, when
/// given).
fn recorded_pid(node: &str, topology: Option<&str>, recorded: &[(u32, String)]) -> Option<u32> {
    recorded
        .iter()
        .rev()
        .find(|(pid, n)| n == node && is_cluster_node(*pid, Some(node), topology))
        .map(|(pid, _)| *pid)
}

/// What `down` did to the nodes.
pub struct Stopped {
    /// Nodes stopped.
    pub stopped: Vec<String>,
    /// Nodes that were not running.
    pub not_running: Vec<String>,
    /// Nodes whose address is not this machine's, left alone.
    pub elsewhere: Vec<String>,
    /// Nodes that had to be killed with SIGKILL.
    pub killed: Vec<String>,
    /// Nodes that could not be stopped, with why.
    pub failed: Vec<String>,
}

/// Stops every node of the topology `t` (stored at `topology`) that runs on this machine,
/// and any node of it `DIR/pids` records: SIGTERM, then SIGKILL after the grace period;
/// waits until each is gone.
pub fn stop_nodes(t: Option<&Topology>, topology: &str, dir: &Path) -> Stopped {
    let recorded = recorded(dir);
    let mut names: Vec<String> = Vec::new();
    if let Some(t) = t {
        names.extend(t.nodes.iter().cloned());
        names.extend(t.migration.iter().flat_map(|m| m.to.iter().cloned()));
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));

    let mut out = Stopped {
        stopped: Vec::new(),
        not_running: Vec::new(),
        elsewhere: Vec::new(),
        killed: Vec::new(),
        failed: Vec::new(),
    };
    let mut found: Vec<(String, Found)> = names
        .into_iter()
        .map(|n| {
            let f = find(&n, &recorded, dir);
            (n, f)
        })
        .collect();
    // A node recorded here that the topology does not name (one whose `add --start` was
    // interrupted, or every node when the topology is gone) counts only if its process
    // serves this topology: a `pids` file found under the working directory may be another
    // cluster's of the same name.
    for (_, n) in &recorded {
        if seen.insert(n.clone()) {
            if let Some(pid) = recorded_pid(n, Some(topology), &recorded) {
                found.push((n.clone(), Found::Pid(pid, "its pid recorded by `up`")));
            }
        }
    }
    let mut stopping: Vec<(String, u32)> = Vec::new();
    for (n, f) in found {
        match f {
            Found::Pid(pid, how) => match signal(pid as i32, libc::SIGTERM) {
                Ok(()) => stopping.push((n, pid)),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => out.not_running.push(n),
                Err(e) => out
                    .failed
                    .push(format!("{n}: SIGTERM to pid {pid} ({how}): {e}")),
            },
            Found::NotRunning => out.not_running.push(n),
            Found::Elsewhere => out.elsewhere.push(n),
            Found::Unknown(why) => out.failed.push(format!("{n}: {why}")),
        }
    }
    let gone = |list: &mut Vec<(String, u32)>, until: Instant| {
        let mut pause = Duration::from_millis(1);
        loop {
            list.retain(|(_, pid)| running(*pid));
            if list.is_empty() || Instant::now() >= until {
                return;
            }
            // Polling the nodes' exit: a bounded back-off.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    };
    let all: Vec<(String, u32)> = stopping.clone();
    gone(&mut stopping, Instant::now() + STOP_GRACE);
    let mut kill_errors = Vec::new();
    for (n, pid) in &stopping {
        match signal(*pid as i32, libc::SIGKILL) {
            Ok(()) => out.killed.push(format!(
                "{n} (pid {pid}) did not stop within {} s of SIGTERM: killed it with SIGKILL",
                STOP_GRACE.as_secs()
            )),
            Err(e) => kill_errors.push((*pid, e)),
        }
    }
    gone(&mut stopping, Instant::now() + KILL_WAIT);
    for (n, pid) in all {
        if !running(pid) {
            out.stopped.push(n);
        } else if let Some((_, e)) = kill_errors.iter().find(|(p, _)| *p == pid) {
            out.failed.push(format!("{n}: SIGKILL to pid {pid}: {e}"));
        } else {
            out.failed
                .push(format!("{n}: pid {pid} still runs after SIGKILL"));
        }
    }
    // Lines of processes that are gone are dropped; those still running stay.
    forget(dir, |pid| !running(pid));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_local_node_keeps_its_data_in_a_directory_of_its_own() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            node_args(
                &args(&["-m", "64", "--data-dir", "/d", "--durability", "sync"]),
                "7101"
            ),
            args(&[
                "-m",
                "64",
                "--data-dir",
                "/d/node-7101",
                "--durability",
                "sync"
            ])
        );
        assert_eq!(
            node_args(&args(&["--data-dir=/d"]), "7102"),
            args(&["--data-dir=/d/node-7102"])
        );
        assert_eq!(node_args(&args(&["-t", "1"]), "7103"), args(&["-t", "1"]));
    }

    #[test]
    fn this_machine_is_loopback_or_a_bindable_address() {
        assert!(on_this_machine("127.0.0.1".parse().unwrap()));
        assert!(on_this_machine("::1".parse().unwrap()));
        // TEST-NET-3: documentation only, never assigned to an interface.
        assert!(!on_this_machine("203.0.113.7".parse().unwrap()));
    }

    #[test]
    fn only_a_kvlab_cluster_node_is_ever_signalled() {
        // This test process is no `kvlab server --cluster`.
        assert!(running(std::process::id()));
        assert!(!is_cluster_node(std::process::id(), None, None));
        assert!(!is_cluster_node(u32::MAX, None, None));
    }

    #[test]
    fn a_recorded_pid_counts_only_for_its_node_and_topology() {
        // A stand-in whose command line is a node's (`sh -c SCRIPT NAME ARGS…`; the `:`
        // keeps the shell from replacing itself with `sleep`). Its first line says the shell
        // runs (its command line is in place).
        let mut child = Command::new("sh")
            .args([
                "-c",
                "echo up; sleep 30; :",
                "server",
                "--cluster",
                "etcd://h:1/a",
            ])
            .args(["--cluster-node", "127.0.0.1:7101"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "up\n");
        let pid = child.id();
        let etcd = Some("etcd://h:1/a");
        assert!(is_cluster_node(pid, None, None));
        assert!(is_cluster_node(pid, Some("127.0.0.1:7101"), etcd));
        assert!(!is_cluster_node(pid, Some("127.0.0.1:7102"), etcd));
        assert!(!is_cluster_node(
            pid,
            Some("127.0.0.1:7101"),
            Some("etcd://h:1/b")
        ));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!running(pid));
    }

    #[test]
    fn a_node_log_is_quoted_by_its_error_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("node.log");
        std::fs::write(
            &log,
            "error: unexpected argument '--x' found\n\nUsage: kvlab server [OPTIONS]\n",
        )
        .unwrap();
        assert_eq!(log_error(&log, 0), "error: unexpected argument '--x' found");
        std::fs::write(
            &log,
            "Error: starting server on 127.0.0.1:7101\n\nCaused by:\n    Address already in use \
             (os error 98)\n\nStack backtrace:\n   0: anyhow::error\n",
        )
        .unwrap();
        assert_eq!(
            log_error(&log, 0),
            "Error: starting server on 127.0.0.1:7101: Address already in use (os error 98)"
        );
        std::fs::write(&log, "Error: a\n\nCaused by:\n    0: b\n    1: c\n").unwrap();
        assert_eq!(log_error(&log, 0), "Error: a: b: c");
        std::fs::write(&log, "listening\nshutting down\n").unwrap();
        assert_eq!(log_error(&log, 0), "shutting down");
    }
}
