//! Sets of CPUs in the kernel's list form (`0-3,6`), as `cpuset.cpus`, `taskset -c` and
//! `Cpus_allowed_list` write them, and the split of a machine's managed CPUs between the
//! server (the lowest-numbered ones) and the jobs (the rest).

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use crate::ControlError;

/// Runs `f` with the calling thread's CPU mask set to `cpus` (the threads it starts and the
/// programs it spawns inherit the mask), then gives the thread its mask back. `None`: `f` as
/// it is. What pins a load generator that runs in this process.
pub fn pinned<T>(cpus: Option<&CpuSet>, f: impl FnOnce() -> T) -> Result<T, ControlError> {
    let Some(cpus) = cpus else { return Ok(f()) };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set; pid 0 is the calling thread.
    let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, size, &mut old) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(ControlError::io("reading this thread's CPU mask", e));
    }
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in cpus.iter().filter(|&c| c < MAX_CPU) {
        // SAFETY: c is below the set's size.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: as above.
    if unsafe { libc::sched_setaffinity(0, size, &set) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(ControlError::io(format!("pinning to CPUs {cpus}"), e));
    }
    let out = f();
    // SAFETY: as above; the mask read before.
    unsafe { libc::sched_setaffinity(0, size, &old) };
    Ok(out)
}

/// A set of CPU numbers (in serde, its list form: `"0-3,6"`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct CpuSet(BTreeSet<usize>);

impl From<CpuSet> for String {
    fn from(c: CpuSet) -> String {
        c.to_string()
    }
}

impl TryFrom<String> for CpuSet {
    type Error = ControlError;
    fn try_from(s: String) -> Result<CpuSet, ControlError> {
        s.parse()
    }
}

/// The most CPUs a set may name (the size of `libc::cpu_set_t`).
pub const MAX_CPU: usize = 1024;

impl CpuSet {
    /// The set of these CPUs.
    pub fn of(cpus: impl IntoIterator<Item = usize>) -> CpuSet {
        CpuSet(cpus.into_iter().collect())
    }

    /// CPUs `0..n`.
    pub fn first(n: usize) -> CpuSet {
        CpuSet((0..n).collect())
    }

    /// The CPUs this process may run on now.
    pub fn allowed_now() -> Result<CpuSet, ControlError> {
        let status = std::fs::read_to_string("/proc/self/status")
            .map_err(|e| ControlError::io("reading /proc/self/status", e))?;
        allowed_list(&status)
            .ok_or_else(|| ControlError::Spec("no Cpus_allowed_list in /proc/self/status".into()))
    }

    /// Number of CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it names no CPU.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The CPUs in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    /// The server's share and the jobs' share when the server has `server` of these CPUs:
    /// the server takes the lowest-numbered ones.
    pub fn split(&self, server: usize) -> (CpuSet, CpuSet) {
        let s: BTreeSet<usize> = self.0.iter().copied().take(server).collect();
        let j: BTreeSet<usize> = self.0.iter().copied().skip(server).collect();
        (CpuSet(s), CpuSet(j))
    }
}

/// The `Cpus_allowed_list:` value of a `/proc/PID/status` text.
pub fn allowed_list(status: &str) -> Option<CpuSet> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|v| v.trim().parse().ok())
}

impl FromStr for CpuSet {
    type Err = ControlError;

    fn from_str(s: &str) -> Result<CpuSet, ControlError> {
        let bad = |why: &str| ControlError::Spec(format!("CPU list {s:?}: {why}"));
        let mut set = BTreeSet::new();
        for part in s.trim().split(',').filter(|p| !p.trim().is_empty()) {
            let part = part.trim();
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a, b),
                None => (part, part),
            };
            let a: usize = a.trim().parse().map_err(|_| bad("not a number"))?;
            let b: usize = b.trim().parse().map_err(|_| bad("not a number"))?;
            if a > b || b >= MAX_CPU {
                return Err(bad("bad range"));
            }
            set.extend(a..=b);
        }
        Ok(CpuSet(set))
    }
}

impl fmt::Display for CpuSet {
    /// The kernel's list form; ranges of three or more as `a-b`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v: Vec<usize> = self.0.iter().copied().collect();
        let mut i = 0;
        let mut first = true;
        while i < v.len() {
            let mut j = i;
            while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
                j += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if j > i {
                write!(f, "{}-{}", v[i], v[j])?;
            } else {
                write!(f, "{}", v[i])?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_print_as_the_kernel_writes_them() {
        let s: CpuSet = "0-3,6, 8-9".parse().unwrap();
        assert_eq!(s, CpuSet::of([0, 1, 2, 3, 6, 8, 9]));
        assert_eq!(s.to_string(), "0-3,6,8-9");
        assert_eq!(CpuSet::of([1]).to_string(), "1");
        assert_eq!("".parse::<CpuSet>().unwrap(), CpuSet::default());
        assert!("3-1".parse::<CpuSet>().is_err());
        assert!("x".parse::<CpuSet>().is_err());
        assert!("5000".parse::<CpuSet>().is_err());
    }

    #[test]
    fn the_server_takes_the_lowest_cpus() {
        let all: CpuSet = "2-5".parse().unwrap();
        let (s, j) = all.split(1);
        assert_eq!((s.to_string(), j.to_string()), ("2".into(), "3-5".into()));
        let (s, j) = all.split(4);
        assert_eq!((s.len(), j.len()), (4, 0));
    }

    #[test]
    fn allowed_list_is_read_from_a_status_text() {
        let st = "Name:\tx\nState:\tS (sleeping)\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\n";
        assert_eq!(allowed_list(st), Some(CpuSet::first(2)));
        assert!(!CpuSet::allowed_now().unwrap().is_empty());
    }
}
