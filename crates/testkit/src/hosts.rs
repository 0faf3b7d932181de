//! Hosts for the multi-host tests: network namespaces on a bridge, each running its own
//! `sshd`, made by `scripts/hosts-netns.sh` (which reuses `scripts/cluster-netns.sh` for the
//! namespaces and their delay) for one test and removed when it drops.
//!
//! ```ignore
//! let Some(hosts) = NetnsHosts::for_test("my_test", 3) else { return }; // skipped, said why
//! let target = hosts.ssh_target(0);          // "root@10.77.X.11"
//! let key = hosts.identity();                // the client key made for these hosts
//! ```
//!
//! Every such network is named after this process (`kh<pid><n>`) on one of a few subnets kept
//! for these tests (10.77.250–254: the faults harness and the storage ring take 1–99, the
//! cluster's netns tests 100–249), and one test of a process holds hosts at a time (they
//! share two cores with everything else). Dropped, the hosts are taken down: every sshd and
//! every process in the namespaces stopped, the namespaces, veths and bridge removed, the
//! temporary directory deleted.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The script, in this checkout.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/hosts-netns.sh");
/// The subnets (10.77.X) kept for these tests.
const SUBNETS: std::ops::RangeInclusive<u32> = 250..=254;
/// How long one call of the script may take.
const SCRIPT_TIMEOUT_S: u32 = 120;

/// One test of this process at a time holds hosts.
static TURN: Mutex<()> = Mutex::new(());
/// Networks made by this process so far (part of the next one's name).
static MADE: AtomicU32 = AtomicU32::new(0);

/// One namespace host.
#[derive(Debug, Clone)]
pub struct NetnsHost {
    /// Its name, which is also its namespace's (`kh12345-1`).
    pub name: String,
    /// Its address on the bridge, where its sshd listens (port 22).
    pub addr: Ipv4Addr,
}

/// N namespace hosts with sshd, taken down on drop.
pub struct NetnsHosts {
    hosts: Vec<NetnsHost>,
    name: String,
    subnet: String,
    /// The test's directory: `state/` is the script's, the rest is the test's own.
    dir: tempfile::TempDir,
    down: bool,
    _turn: MutexGuard<'static, ()>,
}

/// Why these tests cannot run here, or `None` when they can: root, `ip`, `bash`,
/// `/usr/sbin/sshd`, `ssh` and `ssh-keygen`.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    if !Path::new("/usr/sbin/sshd").is_file() {
        return Some("no /usr/sbin/sshd (apt-get install openssh-server)".into());
    }
    for (program, package) in [
        ("ip", "iproute2"),
        ("bash", "bash"),
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
    ] {
        if kvlab_process::which(program).is_none() {
            return Some(format!(
                "no `{program}` on PATH (apt-get install {package})"
            ));
        }
    }
    None
}

impl NetnsHosts {
    /// `n` hosts for the test `test`, or `None` (having said why on stderr) when this machine
    /// cannot make them ([`unavailable`]). Panics if it can but making them fails.
    pub fn for_test(test: &str, n: usize) -> Option<NetnsHosts> {
        if let Some(why) = unavailable() {
            eprintln!("{test}: skipped: {why}");
            return None;
        }
        match NetnsHosts::up(n) {
            Ok(hosts) => Some(hosts),
            Err(e) => panic!("{test}: making {n} namespace hosts: {e}"),
        }
    }

    /// Makes `n` hosts (see the module docs).
    pub fn up(n: usize) -> Result<NetnsHosts, String> {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        let made = MADE.fetch_add(1, Ordering::Relaxed);
        let name = format!("kh{}{}", pid % 100_000, made % 10);
        let dir = tempfile::Builder::new()
            .prefix("kvlab-hosts-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        let mut hosts = NetnsHosts {
            hosts: Vec::new(),
            name,
            subnet: String::new(),
            dir,
            down: false,
            _turn: turn,
        };
        let mut tried = Vec::new();
        let span = SUBNETS.end() - SUBNETS.start() + 1;
        for i in 0..span {
            hosts.subnet = format!("10.77.{}", SUBNETS.start() + (pid + made + i) % span);
            // A failed `up` has taken down what it made: the next subnet starts afresh.
            match hosts.script(&["up", &n.to_string()]) {
                Ok(out) => {
                    hosts.hosts = parse_hosts(&out)?;
                    if hosts.hosts.len() != n {
                        return Err(format!("asked for {n} hosts, the script made: {out}"));
                    }
                    return Ok(hosts);
                }
                Err(e) => tried.push(format!("{}: {e}", hosts.subnet)),
            }
        }
        hosts.down = true;
        Err(tried.join("; "))
    }

    /// The hosts, in order (host 1 first).
    pub fn hosts(&self) -> &[NetnsHost] {
        &self.hosts
    }

    /// Host `i`'s (from 0) ssh destination, `root@ADDRESS`.
    pub fn ssh_target(&self, i: usize) -> String {
        format!("root@{}", self.hosts[i].addr)
    }

    /// The bridge's address in the root namespace: where the hosts reach this machine.
    pub fn bridge(&self) -> String {
        format!("{}.1", self.subnet)
    }

    /// The client key every host's sshd accepts.
    pub fn identity(&self) -> PathBuf {
        self.state().join("id_ed25519")
    }

    /// A `known_hosts` file with every host's key by address.
    pub fn known_hosts(&self) -> PathBuf {
        self.state().join("known_hosts")
    }

    /// A directory for the test's own files, removed with the hosts.
    pub fn scratch(&self) -> PathBuf {
        let d = self.dir.path().join("scratch");
        let _ = std::fs::create_dir_all(&d);
        d
    }

    /// The inode of host `i`'s network namespace (what `/proc/PID/ns/net` of a process
    /// inside it resolves to).
    pub fn netns_inode(&self, i: usize) -> std::io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::metadata(format!("/run/netns/{}", self.hosts[i].name))?.ino())
    }

    /// The processes in host `i`'s namespace (`ip netns pids`), sshd's own included.
    pub fn pids(&self, i: usize) -> Vec<u32> {
        Command::new("ip")
            .args(["netns", "pids", &self.hosts[i].name])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The processes in host `i`'s namespace that are not the host's own — its sshd, an
    /// ssh session's server side, the link's delayer (`nfqueue-delay.py`, on a kernel
    /// without netem) — with their command names: what a test started there and left.
    pub fn others(&self, i: usize) -> Vec<(u32, String)> {
        self.pids(i)
            .into_iter()
            .filter_map(|p| Some((p, comm(p)?)))
            .filter(|(p, c)| !c.starts_with("sshd") && !is_delayer(*p))
            .collect()
    }

    /// Polls (every 20 ms, at most `within`) until host `i` runs nothing but its sshd;
    /// returns what still runs otherwise.
    pub fn wait_quiet(&self, i: usize, within: Duration) -> Result<(), Vec<(u32, String)>> {
        let deadline = Instant::now() + within;
        loop {
            let left = self.others(i);
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(left);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The TCP ports listening in host `i`'s namespace (`ss -Hltn`), sshd's 22 included.
    pub fn listening(&self, i: usize) -> Vec<u16> {
        Command::new("ip")
            .args(["netns", "exec", &self.hosts[i].name, "ss", "-Hltn"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter_map(|l| {
                        l.split_whitespace()
                            .nth(3)?
                            .rsplit(':')
                            .next()?
                            .parse()
                            .ok()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Kills (SIGKILL) host `i`'s sshd and every ssh session's server side in its namespace:
    /// the host stops answering ssh, and live connections to it break.
    pub fn kill_sshd(&self, i: usize) {
        for p in self.pids(i) {
            if comm(p).is_some_and(|c| c.starts_with("sshd")) {
                // SAFETY: kill has no memory preconditions; p is a process of our namespace.
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
        }
    }

    /// Cuts host `i` off without a word: iptables drops everything in and out of its link
    /// (connections to it go silent, as when a machine or its switch dies). The hosts'
    /// `down` removes the rules with the namespace.
    pub fn cut_off(&self, i: usize) -> Result<(), String> {
        for rule in [["INPUT", "-i"], ["OUTPUT", "-o"]] {
            let out = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.hosts[i].name,
                    "iptables",
                    "-I",
                    rule[0],
                    "1",
                ])
                .args([rule[1], "eth0", "-j", "DROP"])
                .output()
                .map_err(|e| format!("iptables: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "iptables in {}: {}",
                    self.hosts[i].name,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        Ok(())
    }

    /// Takes the hosts down now (as dropping them does), saying what failed.
    pub fn down(mut self) -> Result<(), String> {
        self.down = true;
        self.script(&["down"]).map(|_| ())
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn script(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("timeout")
            .arg(SCRIPT_TIMEOUT_S.to_string())
            .arg("bash")
            .arg(SCRIPT)
            .args(args)
            .env("KVHOSTS", &self.name)
            .env("KVHOSTS_SUBNET", &self.subnet)
            .env("KVHOSTS_DIR", self.state())
            .output()
            .map_err(|e| format!("running {SCRIPT}: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "hosts-netns.sh {} ({}): {}{}",
                args.join(" "),
                out.status,
                stdout,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for NetnsHosts {
    fn drop(&mut self) {
        if !self.down {
            self.down = true;
            if let Err(e) = self.script(&["down"]) {
                eprintln!("taking the namespace hosts down: {e}");
            }
        }
    }
}

/// Whether `pid` is cluster-netns.sh's NFQUEUE delayer.
fn is_delayer(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("nfqueue-delay"))
}

/// A process's command name (`/proc/PID/comm`), if it still exists.
fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_string())
}

/// The script's `up` output: `NAME ADDRESS NAMESPACE` a line.
fn parse_hosts(out: &str) -> Result<Vec<NetnsHost>, String> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            let (Some(name), Some(addr)) = (w.next(), w.next()) else {
                return Err(format!("not a host line: {l:?}"));
            };
            let addr = addr.parse().map_err(|_| format!("not an address: {l:?}"))?;
            Ok(NetnsHost {
                name: name.to_string(),
                addr,
            })
        })
        .collect()
}
