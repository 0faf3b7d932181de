//! A run's own network: every node, etcd member and the proxy in a network namespace of its
//! own, joined by veth pairs to a bridge in the root namespace, so that partitions and
//! delays can be made between any two of them while the clients (threads of this process,
//! in the root namespace) reach them across the bridge.
//!
//! The plumbing is `scripts/cluster-netns.sh`, built into the harness (written into the
//! run's directory and run from there with `bash`), so what the harness makes is what the
//! script makes and documents: namespaces `KVNET-H`, veths `KVNET-vH`, bridge `KVNET-br`,
//! host H at `SUBNET.(10+H)`; a partition is iptables DROP inside a host's namespace (of
//! all its traffic, or of its traffic with one peer); a delay is `tc netem` on its
//! interface, or — on a kernel without netem — the script's NFQUEUE delayer
//! (`nfqueue-delay.py`, iptables and user space). The harness starts its processes itself
//! with `ip netns exec` (it must be able to kill and stop them); `down` removes everything
//! the network made, also when the run fails ([`Net`]'s drop), and a network left by a
//! killed harness is removed by the script's `down` with the same `KVNET`.
//!
//! Host numbers: etcd members 1–3, the proxy 9, nodes from 11 (a restarted node keeps its
//! host and address).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use parking_lot::Mutex;

/// The script, as the repository has it.
const SCRIPT: &str = include_str!("../../../scripts/cluster-netns.sh");
/// Its delayer for kernels without netem.
const DELAYER: &str = include_str!("../../../scripts/nfqueue-delay.py");

/// The first etcd member's host (members take the next ones).
pub const ETCD_HOST: u32 = 1;
/// The proxy's host.
pub const PROXY_HOST: u32 = 9;
/// The first node's host.
const FIRST_NODE_HOST: u32 = 11;
/// The script's largest host number.
const MAX_HOST: u32 = 100;

/// How long one call of the script may take.
const SCRIPT_TIMEOUT_S: u32 = 60;

/// Whether this process can make network namespaces, and why not: root, `ip` (iproute2),
/// `iptables` (partitions), `bash`, and a kernel that lets it add one.
pub fn preflight() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("network namespaces need root (run as root, or without --netns)".into());
    }
    let have = |program: &str, arg: &str| {
        Command::new(program)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have("ip", "-V") {
        return Err("no `ip` on PATH (apt-get install iproute2)".into());
    }
    if !have("iptables", "-V") {
        return Err(
            "no `iptables` on PATH, which partitions need (apt-get install iptables)".into(),
        );
    }
    if !have("bash", "--version") {
        return Err("no `bash` on PATH (the namespace script needs it)".into());
    }
    let probe = format!("kvfprobe{}", std::process::id());
    let add = Command::new("ip")
        .args(["netns", "add", &probe])
        .output()
        .map_err(|e| format!("ip netns add: {e}"))?;
    if !add.status.success() {
        return Err(format!(
            "this machine cannot create network namespaces: {}",
            String::from_utf8_lossy(&add.stderr).trim()
        ));
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).output();
    Ok(())
}

/// A run's network (see the module docs). Dropped, it is taken down.
pub struct Net {
    name: String,
    /// X of 10.77.X.0/24.
    subnet: u8,
    dir: PathBuf,
    script: PathBuf,
    netem: bool,
    /// The next node's host number.
    next_node: Mutex<u32>,
    down: Mutex<bool>,
}

impl Net {
    /// Makes the bridge of a network named `name` (1–8 lower-case letters and digits) on
    /// `10.77.<subnet>.0/24`, with its state, script and logs under `dir`. Fails if that
    /// subnet is routed anywhere else on this machine.
    pub fn up(name: &str, subnet: u8, dir: &Path) -> Result<Net, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let script = dir.join("cluster-netns.sh");
        for (file, text) in [(&script, SCRIPT), (&dir.join("nfqueue-delay.py"), DELAYER)] {
            std::fs::write(file, text).map_err(|e| format!("{}: {e}", file.display()))?;
        }
        let mut net = Net {
            name: name.to_string(),
            subnet,
            dir: dir.to_path_buf(),
            script,
            netem: false,
            next_node: Mutex::new(FIRST_NODE_HOST),
            down: Mutex::new(false),
        };
        // The first node's namespace makes the bridge, and tells whether this kernel has
        // netem.
        net.host(FIRST_NODE_HOST)?;
        let netem = Command::new("ip")
            .args(["netns", "exec", &net.ns(FIRST_NODE_HOST)])
            .args([
                "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
            ])
            .output()
            .is_ok_and(|o| o.status.success());
        if netem {
            let _ = Command::new("ip")
                .args(["netns", "exec", &net.ns(FIRST_NODE_HOST)])
                .args(["tc", "qdisc", "del", "dev", "lo", "root"])
                .output();
        }
        net.netem = netem;
        Ok(net)
    }

    /// `KVNET` of this network.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its subnet, `10.77.X.0/24`.
    pub fn subnet(&self) -> String {
        format!("10.77.{}.0/24", self.subnet)
    }

    /// Whether this kernel has `tc netem` (else delays go through the NFQUEUE delayer).
    pub fn netem(&self) -> bool {
        self.netem
    }

    /// Host `h`'s namespace.
    pub fn ns(&self, h: u32) -> String {
        format!("{}-{h}", self.name)
    }

    /// Host `h`'s address.
    pub fn ip(&self, h: u32) -> Ipv4Addr {
        // Host numbers are at most MAX_HOST (100): the address's last byte fits.
        Ipv4Addr::new(10, 77, self.subnet, (10 + h.min(MAX_HOST)) as u8)
    }

    /// Makes host `h`'s namespace (idempotent); returns its address.
    pub fn host(&self, h: u32) -> Result<Ipv4Addr, String> {
        self.script(&["host", &h.to_string()])?;
        Ok(self.ip(h))
    }

    /// A new node's host, its namespace made.
    pub fn new_node_host(&self) -> Result<u32, String> {
        let h = {
            let mut next = self.next_node.lock();
            if *next > MAX_HOST {
                return Err(format!(
                    "no host numbers left for another node (at most {})",
                    MAX_HOST - FIRST_NODE_HOST + 1
                ));
            }
            *next += 1;
            *next - 1
        };
        self.host(h)?;
        Ok(h)
    }

    /// The arguments of `ip` that run a program inside host `h`'s namespace (`ip netns
    /// exec NS PROGRAM ARGS…` execs it: the process is the program's own, to signal).
    pub fn exec_args(&self, h: u32) -> [String; 3] {
        ["netns".into(), "exec".into(), self.ns(h)]
    }

    /// Drops all of host `h`'s traffic, or only its traffic with host `peer`; returns what
    /// the script said.
    pub fn partition(&self, h: u32, peer: Option<u32>) -> Result<String, String> {
        let (h, peer) = (h.to_string(), peer.map(|p| p.to_string()));
        let mut args = vec!["partition", h.as_str()];
        args.extend(peer.as_deref());
        self.script(&args)
    }

    /// Removes every partition of host `h`.
    pub fn heal(&self, h: u32) -> Result<String, String> {
        self.script(&["heal", &h.to_string()])
    }

    /// Delays every packet host `h` sends by `ms`.
    pub fn delay(&self, h: u32, ms: u32) -> Result<String, String> {
        self.script(&["netem", &h.to_string(), "delay", &format!("{ms}ms")])
    }

    /// Removes host `h`'s delay.
    pub fn clear(&self, h: u32) -> Result<String, String> {
        self.script(&["netem", &h.to_string(), "clear"])
    }

    /// Stops whatever still runs in the network's namespaces and removes them, their
    /// veths, the bridge and its iptables rule (idempotent).
    pub fn down(&self) -> Result<(), String> {
        let mut down = self.down.lock();
        if *down {
            return Ok(());
        }
        self.script(&["down"])?;
        *down = true;
        Ok(())
    }

    /// Runs the script with `args`; returns what it said (its messages, on one line).
    fn script(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("timeout")
            .arg(SCRIPT_TIMEOUT_S.to_string())
            .arg("bash")
            .arg(&self.script)
            .args(args)
            .env("KVNET", &self.name)
            .env("KVNET_SUBNET", format!("10.77.{}", self.subnet))
            .env("KVNET_DIR", self.dir.join("state"))
            // Keep the delayers' logs after `down`: they are part of the run's record.
            .env("KVNET_KEEP", "1")
            .output()
            .map_err(|e| format!("running {}: {e}", self.script.display()))?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let said = said
            .lines()
            .map(|l| l.trim().trim_start_matches("cluster-netns: "))
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" | ");
        if out.status.success() {
            Ok(said)
        } else {
            Err(format!("cluster-netns.sh {}: {said}", args.join(" ")))
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Err(e) = self.down() {
            eprintln!(
                "kvlab faults: taking network {} down: {e} (run `KVNET={} KVNET_SUBNET=10.77.{} \
                 scripts/cluster-netns.sh down`)",
                self.name, self.name, self.subnet
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_have_the_scripts_addresses_and_namespaces() {
        let net = Net {
            name: "kvf1".into(),
            subnet: 42,
            dir: PathBuf::new(),
            script: PathBuf::new(),
            netem: false,
            next_node: Mutex::new(FIRST_NODE_HOST),
            down: Mutex::new(true),
        };
        assert_eq!(net.ip(ETCD_HOST), Ipv4Addr::new(10, 77, 42, 11));
        assert_eq!(net.ip(PROXY_HOST), Ipv4Addr::new(10, 77, 42, 19));
        assert_eq!(net.ip(FIRST_NODE_HOST), Ipv4Addr::new(10, 77, 42, 21));
        assert_eq!(net.ns(12), "kvf1-12");
        assert_eq!(net.subnet(), "10.77.42.0/24");
        // The script it runs is the repository's.
        assert!(SCRIPT.contains("cmd_host") && DELAYER.contains("NFQUEUE"));
    }
}
