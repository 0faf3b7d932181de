//! The nodes of a cluster that run on this machine: `up` and `add --start` start them (each
//! a `kvlab server --cluster` in its own process group, so it outlives the command), check
//! that the process answering at each address is the one they started, and stop what they
//! started when something fails.
//!
//! Every start appends `PID NODE` to the `pids` file beside the topology.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_client::cluster::resolve;
use kvlab_cluster::coordinator::node_status;
use kvlab_cluster::ClusterError;

/// How long a started node may take to answer `cluster status`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a node may take to exit after SIGTERM before it gets SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A node this command started.
pub struct Started {
    /// Its name in the topology, `HOST:PORT`.
    pub node: String,
    child: Child,
    log: PathBuf,
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

/// Starts `kvlab server --cluster TOPOLOGY` for `node` in the background (its own process
/// group, so it outlives this command), logging to `DIR/node-PORT.log`; its pid goes to
/// `DIR/pids`.
pub fn start(dir: &Path, topology: &str, node: &str, extra: &[String]) -> anyhow::Result<Started> {
    let (host, port) = node
        .rsplit_once(':')
        .with_context(|| format!("{node}: expected HOST:PORT"))?;
    let log_path = dir.join(format!("node-{port}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding the kvlab binary")?;
    use std::os::unix::process::CommandExt;
    let child = Command::new(exe)
        .args([
            "server",
            "-l",
            host,
            "-p",
            port,
            "--cluster",
            topology,
            "--cluster-node",
            node,
        ])
        .args(extra)
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
                log_error(&s.log)
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
fn log_error(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
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
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is the caller's own child.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_log_is_quoted_by_its_error_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("node.log");
        std::fs::write(
            &log,
            "error: unexpected argument '--x' found\n\nUsage: kvlab server [OPTIONS]\n",
        )
        .unwrap();
        assert_eq!(log_error(&log), "error: unexpected argument '--x' found");
        std::fs::write(
            &log,
            "Error: starting server on 127.0.0.1:7101\n\nCaused by:\n    Address already in use \
             (os error 98)\n\nStack backtrace:\n   0: anyhow::error\n",
        )
        .unwrap();
        assert_eq!(
            log_error(&log),
            "Error: starting server on 127.0.0.1:7101: Address already in use (os error 98)"
        );
        std::fs::write(&log, "Error: a\n\nCaused by:\n    0: b\n    1: c\n").unwrap();
        assert_eq!(log_error(&log), "Error: a: b: c");
        std::fs::write(&log, "listening\nshutting down\n").unwrap();
        assert_eq!(log_error(&log), "shutting down");
    }
}
