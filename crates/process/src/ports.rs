//! Free ports that stay free until the child binds them, and the check that a port answers
//! from the child that was started for it.
//!
//! ```text
//!  free_ports(n)   a port below the kernel's ephemeral range (32768–60999 by default:
//!                  what bind(0) and outgoing connections take), free to bind now, and
//!                  reserved machine-wide by an abstract unix socket `kvlab-port-N` that
//!                  this process holds: no other kvlab process hands it out meanwhile
//!  owned_by(pid)   /proc/PID/net/tcp{,6}: the LISTEN sockets on the probe's address;
//!                  /proc/PID/fd (and its descendants'): is one of them the child's?
//! ```
//!
//! Why both: a port found by bind(0) and released can be handed by the kernel to another
//! process before the child binds it, and that process's server then answers the child's
//! readiness probe — a cluster would add a node that is not its own. The reservation keeps
//! kvlab processes off each other's ports; the ownership check catches any other process:
//! its answer does not count, and a child that then exits is said to have found its port
//! taken.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::ops::Range;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// How many reservations one process keeps; the oldest is released past this (its child
/// bound the port long ago, or is gone).
const HELD_MAX: usize = 4096;

/// This process's reservations, oldest first.
static HELD: Mutex<VecDeque<UnixListener>> = Mutex::new(VecDeque::new());

/// Where the next search starts, as an offset into the range (0: not yet chosen).
static CURSOR: AtomicU32 = AtomicU32::new(0);

/// The ports handed out: the half of the port space below the ephemeral range's start.
/// `None` when that range starts too low to leave room (then bind(0) chooses).
fn range() -> Option<Range<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok();
    let low: u16 = text
        .as_deref()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    (low >= 8192).then_some(low / 2..low)
}

/// Reserves `port` for this process's lifetime (machine-wide, among kvlab processes in
/// this network namespace); `None` if another process holds it.
fn reserve(port: u16) -> io::Result<Option<UnixListener>> {
    let name = format!("kvlab-port-{port}");
    match UnixListener::bind_addr(&UnixAddr::from_abstract_name(name.as_bytes())?) {
        Ok(l) => Ok(Some(l)),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Ok(None),
        Err(e) => Err(e),
    }
}

/// `n` distinct 127.0.0.1 ports that nothing listens on and no other kvlab process has
/// handed out (see the module doc).
pub fn free_ports(n: usize) -> io::Result<Vec<u16>> {
    take(n, 1)
}

/// The first of `n` consecutive such ports (for a command that numbers its ports from a
/// base, as `kvlab cluster up --base-port`).
pub fn free_consecutive_ports(n: u16) -> io::Result<u16> {
    Ok(take(1, n)?[0])
}

/// `n` runs of `run` consecutive free ports each, reserved; the first port of each.
fn take(n: usize, run: u16) -> io::Result<Vec<u16>> {
    let Some(range) = range() else {
        return match run {
            1 => kernel_ports(n),
            _ => Err(io::Error::other(
                "the ephemeral port range starts too low for consecutive ports",
            )),
        };
    };
    let size = u32::from(range.end - range.start - run.min(range.end - range.start) + 1);
    if CURSOR.load(Ordering::Relaxed) == 0 {
        // A start that differs between processes, so that they rarely search the same
        // ports (the reservation, not this, keeps them apart).
        let seed = std::process::id().wrapping_mul(2_654_435_761)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
        let _ = CURSOR.compare_exchange(0, seed % size + 1, Ordering::Relaxed, Ordering::Relaxed);
    }
    let mut out = Vec::with_capacity(n);
    let mut held = Vec::with_capacity(n * usize::from(run));
    // Each bound until all are found, so that none is handed out twice.
    let mut bound = Vec::with_capacity(n * usize::from(run));
    'search: for _ in 0..size {
        if out.len() == n {
            break;
        }
        let first =
            range.start + (CURSOR.fetch_add(u32::from(run), Ordering::Relaxed) % size) as u16;
        let (mut h, mut b) = (Vec::new(), Vec::new());
        for port in first..first + run {
            let Some(reservation) = reserve(port)? else {
                continue 'search;
            };
            h.push(reservation);
            // Free now?
            match TcpListener::bind(("127.0.0.1", port)) {
                Ok(l) => b.push(l),
                Err(_) => continue 'search,
            }
        }
        out.push(first);
        held.extend(h);
        bound.extend(b);
    }
    if out.len() < n {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "no {n} free ports in {}..{} (each listened on or held by another kvlab process)",
                range.start, range.end
            ),
        ));
    }
    let mut all = HELD.lock().unwrap_or_else(|e| e.into_inner());
    all.extend(held);
    while all.len() > HELD_MAX {
        all.pop_front();
    }
    Ok(out)
}

/// `n` ports as bind(0) gives them (held together, so they are distinct).
fn kernel_ports(n: usize) -> io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// Whether a socket listening on `addr` (its address, or every address, at its port) in
/// process `pid`'s network namespace is held by `pid` or one of its descendants. `None`
/// when /proc cannot tell.
pub(crate) fn owned_by(pid: u32, addr: SocketAddr) -> Option<bool> {
    let inodes = listening(pid, addr)?;
    if inodes.is_empty() {
        return Some(false);
    }
    // The child's own descriptors must be readable for an answer either way.
    if holds(pid, &inodes)? {
        return Some(true);
    }
    let mut todo = vec![pid];
    let mut children: Option<HashMap<u32, Vec<u32>>> = None;
    while let Some(p) = todo.pop() {
        if p != pid && holds(p, &inodes) == Some(true) {
            return Some(true);
        }
        // The descendants are read only when the child itself does not hold it (a
        // wrapper that forked its server).
        let map = children.get_or_insert_with(children_of_all);
        todo.extend(map.get(&p).into_iter().flatten());
    }
    Some(false)
}

/// The inodes of the LISTEN sockets on `addr` in `pid`'s `/proc/PID/net/tcp{,6}`.
fn listening(pid: u32, addr: SocketAddr) -> Option<Vec<u64>> {
    let mut inodes = Vec::new();
    let mut read_any = false;
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        read_any = true;
        // `sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …`;
        // st 0A is LISTEN.
        for line in text.lines().skip(1) {
            let w: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(&"0A"), Some(inode)) = (w.get(1), w.get(3), w.get(9)) else {
                continue;
            };
            let Some((ip, port)) = local.split_once(':') else {
                continue;
            };
            if u16::from_str_radix(port, 16).ok() != Some(addr.port()) {
                continue;
            }
            if parse_ip(ip).is_some_and(|ip| covers(ip, addr.ip())) {
                inodes.extend(inode.parse::<u64>().ok());
            }
        }
    }
    read_any.then_some(inodes)
}

/// An address as /proc/net/tcp{,6} prints it: the bytes in memory, 32 bits at a time in
/// the machine's order.
fn parse_ip(hex: &str) -> Option<IpAddr> {
    let words = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<Vec<u32>>>()?;
    match words[..] {
        [a] => Some(IpAddr::V4(Ipv4Addr::from(a.to_ne_bytes()))),
        [a, b, c, d] => {
            let mut bytes = [0u8; 16];
            for (chunk, w) in bytes.chunks_mut(4).zip([a, b, c, d]) {
                chunk.copy_from_slice(&w.to_ne_bytes());
            }
            Some(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}

/// Whether a listener bound to `bound` accepts connections to `to`.
fn covers(bound: IpAddr, to: IpAddr) -> bool {
    if bound.is_unspecified() || bound == to {
        return true;
    }
    match (bound, to) {
        (IpAddr::V6(b), IpAddr::V4(t)) => b.to_ipv4_mapped() == Some(t),
        _ => false,
    }
}

/// Whether process `pid` has one of `inodes` open; `None` if its descriptors cannot be
/// read (another user's process, or gone).
fn holds(pid: u32, inodes: &[u64]) -> Option<bool> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).ok().is_some_and(|l| {
            l.to_str()
                .and_then(|s| s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
                .is_some_and(|i: u64| inodes.contains(&i))
        })
    }))
}

/// Every process's children, from `/proc/*/stat`.
fn children_of_all() -> HashMap<u32, Vec<u32>> {
    let mut map: HashMap<u32, Vec<u32>> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return map;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if let Some(pp) = ppid {
            map.entry(pp).or_default().push(pid);
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_below_the_ephemeral_range_and_are_held() {
        let ports = free_ports(4).unwrap();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 4, "{ports:?}");
        let r = range().expect("a range on this machine");
        let first = free_consecutive_ports(3).unwrap();
        for p in ports.iter().copied().chain(first..first + 3) {
            assert!(r.contains(&p), "{p} outside {r:?}");
            // Reserved: another kvlab process could not hand it out now.
            assert!(reserve(p).unwrap().is_none(), "{p} not reserved");
        }
    }

    #[test]
    fn a_listener_is_found_with_its_owner() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        assert_eq!(owned_by(std::process::id(), addr), Some(true));
        // Not held by a process with no such socket (a child of ours).
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(owned_by(child.id(), addr), Some(false));
        child.kill().unwrap();
        child.wait().unwrap();
        drop(l);
        assert_eq!(owned_by(std::process::id(), addr), Some(false));
    }

    #[test]
    fn addresses_as_proc_prints_them() {
        assert_eq!(parse_ip("0100007F"), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(
            parse_ip("00000000000000000000000000000000"),
            Some(IpAddr::V6(Ipv6Addr::UNSPECIFIED))
        );
        let mapped = parse_ip("0000000000000000FFFF00000100007F").unwrap();
        assert!(covers(mapped, IpAddr::V4(Ipv4Addr::LOCALHOST)), "{mapped}");
        assert!(!covers(
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        ));
    }
}
