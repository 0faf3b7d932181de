//! What kvlab reads from and asks of Linux about a process: its CPU time from
//! `/proc/<pid>/stat` and the unit it is counted in (`CLK_TCK`), the processes of a process
//! group, and the CPUs its threads may run on (`sched_setaffinity`); and the whole machine's
//! CPU time (`/proc/stat`: busy and stolen).
//!
//! One parser of `/proc/<pid>/stat` for the lab's utilization law (`kvlab-analysis`), the
//! controller's CPU sensor and its affinity method (`kvlab-control`), and the lab's
//! corunners and pinned systems (`kvlab-lab`).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// `Result` with [`ProcfsError`].
pub type Result<T> = std::result::Result<T, ProcfsError>;

/// Why a process could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum ProcfsError {
    /// A `/proc/<pid>/stat` line that could not be parsed.
    #[error("cannot parse /proc/<pid>/stat: {0}")]
    Parse(String),
    /// Reading a file (e.g. `/proc/<pid>/stat`) failed.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A CPU number beyond what an affinity mask holds (`CPU_SETSIZE`).
    #[error("CPU {0} is beyond the affinity mask's {max} CPUs", max = CPU_SETSIZE)]
    Cpu(usize),
}

/// How many CPUs an affinity mask (`cpu_set_t`) holds.
pub const CPU_SETSIZE: usize = libc::CPU_SETSIZE as usize;

/// The fields of `/proc/<pid>/stat` that kvlab reads (see proc(5)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcStat {
    /// Field 1: process id.
    pub pid: u32,
    /// Field 2: the command name, without its parentheses (may contain spaces and
    /// parentheses itself).
    pub comm: String,
    /// Field 3: state (`R`, `S`, `D`, `Z`, …).
    pub state: char,
    /// Field 14: user-mode CPU time, in clock ticks.
    pub utime: u64,
    /// Field 15: kernel-mode CPU time, in clock ticks.
    pub stime: u64,
    /// Field 20: number of threads.
    pub num_threads: u64,
}

impl ProcStat {
    /// utime + stime, in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        self.utime + self.stime
    }
}

/// Parses one line of `/proc/<pid>/stat`.
///
/// The command name (field 2) is in parentheses and may itself contain spaces and
/// parentheses (a process may name itself `a) (b`), so it runs from the first `(` to
/// the *last* `)`; the remaining fields are split on whitespace after that.
pub fn parse_proc_stat(line: &str) -> Result<ProcStat> {
    let bad = |why: &str| ProcfsError::Parse(format!("{why} in {line:?}"));
    let open = line.find('(').ok_or_else(|| bad("no '('"))?;
    let close = line.rfind(')').ok_or_else(|| bad("no ')'"))?;
    if close < open {
        return Err(bad("')' before '('"));
    }
    let pid = line[..open]
        .trim()
        .parse::<u32>()
        .map_err(|_| bad("bad pid"))?;
    let comm = line[open + 1..close].to_string();
    // rest[0] is field 3 (state), so field k is rest[k - 3].
    let rest: Vec<&str> = line[close + 1..].split_whitespace().collect();
    let field = |k: usize| -> Result<&str> {
        rest.get(k - 3)
            .copied()
            .ok_or_else(|| bad(&format!("missing field {k}")))
    };
    let number = |k: usize| -> Result<u64> {
        field(k)?
            .parse::<u64>()
            .map_err(|_| bad(&format!("field {k} is not a number")))
    };
    let mut state_chars = field(3)?.chars();
    let state = match (state_chars.next(), state_chars.next()) {
        (Some(c), None) => c,
        _ => return Err(bad("field 3 (state) is not one character")),
    };
    Ok(ProcStat {
        pid,
        comm,
        state,
        utime: number(14)?,
        stime: number(15)?,
        num_threads: number(20)?,
    })
}

/// Reads and parses `/proc/<pid>/stat`.
pub fn read_proc_stat(pid: u32) -> Result<ProcStat> {
    read_proc_stat_at(format!("/proc/{pid}/stat"))
}

/// Reads and parses a stat file at `path` (e.g. `/proc/self/stat`).
pub fn read_proc_stat_at(path: impl AsRef<Path>) -> Result<ProcStat> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| ProcfsError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_proc_stat(text.trim_end())
}

/// CPU time this process has used (every thread, user and system), seconds, to the
/// nanosecond (`CLOCK_PROCESS_CPUTIME_ID`): a short phase of its work reads as what it
/// took, where `/proc`'s ticks (10 ms each, charged to whoever runs when one falls) may
/// round it to none. 0 if the clock cannot be read.
pub fn own_cpu_s() -> f64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant.
        if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
        }
    }
    0.0
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, the unit of utime and stime); 100,
/// the value on every mainstream Linux build, if the call fails or is unavailable.
pub fn clock_ticks_per_second() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions; it only reads a configuration value.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if ticks > 0 {
            return ticks as u64;
        }
    }
    100
}

/// The whole machine's CPU time from the `cpu` line of `/proc/stat`, in clock ticks summed
/// over its CPUs (see proc(5)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineTicks {
    /// user + nice + system + irq + softirq: time the CPUs worked (the kernel's network work
    /// in softirq included).
    pub busy: u64,
    /// steal: time the hypervisor gave the CPUs to other guests.
    pub steal: u64,
    /// Every field up to steal (idle and iowait too).
    pub total: u64,
}

/// Parses the `cpu` line of `/proc/stat` (`text`: the whole file or that line).
pub fn parse_machine_stat(text: &str) -> Result<MachineTicks> {
    let line = text
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or_else(|| ProcfsError::Parse("no `cpu ` line in /proc/stat".into()))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse::<u64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| ProcfsError::Parse(format!("/proc/stat {line:?}: {e}")))?;
    if f.len() < 8 {
        return Err(ProcfsError::Parse(format!(
            "/proc/stat {line:?}: fewer than 8 fields"
        )));
    }
    // user nice system idle iowait irq softirq steal
    Ok(MachineTicks {
        busy: f[0] + f[1] + f[2] + f[5] + f[6],
        steal: f[7],
        total: f.iter().sum(),
    })
}

/// The machine's CPU time now (`/proc/stat`).
pub fn read_machine_ticks() -> Result<MachineTicks> {
    let text = fs::read_to_string("/proc/stat").map_err(|source| ProcfsError::Read {
        path: "/proc/stat".into(),
        source,
    })?;
    parse_machine_stat(&text)
}

/// Idle time (idle + iowait) of the CPUs `cpus` from their `cpuN` lines of `/proc/stat`
/// (`text`: the whole file), in clock ticks summed over them: what those CPUs left unused.
pub fn parse_cpus_idle(text: &str, cpus: &[usize]) -> Result<u64> {
    let mut idle = 0;
    for &c in cpus {
        let name = format!("cpu{c}");
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            .ok_or_else(|| ProcfsError::Parse(format!("no `{name}` line in /proc/stat")))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(5)
            .map(|v| v.parse::<u64>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| ProcfsError::Parse(format!("/proc/stat {line:?}: {e}")))?;
        // user nice system idle iowait
        idle += f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
    }
    Ok(idle)
}

/// [`parse_cpus_idle`] of `/proc/stat` now.
pub fn read_cpus_idle(cpus: &[usize]) -> Result<u64> {
    let text = fs::read_to_string("/proc/stat").map_err(|source| ProcfsError::Read {
        path: "/proc/stat".into(),
        source,
    })?;
    parse_cpus_idle(&text, cpus)
}

/// The process ids whose process group is `pgid` (from `/proc/*/stat`).
pub fn processes_in_group(pgid: i32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                // After the command name in parentheses: state, ppid, pgrp.
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<i32>().ok())
                    == Some(pgid)
            })
        })
        .collect()
}

/// Sets the CPU mask of every thread of `pid` to `cpus` (threads it starts later inherit
/// the mask of the thread that starts them). A thread that exits meanwhile is no error.
pub fn set_affinity(pid: u32, cpus: impl IntoIterator<Item = usize>) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in cpus {
        if c >= CPU_SETSIZE {
            return Err(ProcfsError::Cpu(c));
        }
        // SAFETY: c < CPU_SETSIZE, the set's size (checked above).
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).map_err(|source| ProcfsError::Sys {
        what: format!("listing the threads of {pid}"),
        source,
    })?;
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: set is a valid cpu_set_t of the size given.
        let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            // A thread that exited meanwhile is no error.
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(ProcfsError::Sys {
                    what: format!("sched_setaffinity({tid})"),
                    source: e,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_machine_line_of_proc_stat() {
        let t =
            parse_machine_stat("cpu  100 5 50 1000 20 3 7 11 0 0\ncpu0 50 2 25 500 10 1 3 5 0 0\n")
                .unwrap();
        assert_eq!((t.busy, t.steal, t.total), (165, 11, 1196));
        assert!(parse_machine_stat("intr 1 2\n").is_err());
        assert!(read_machine_ticks().unwrap().total > 0);
    }

    use super::*;

    /// A millisecond of work reads as about that (a tick would be 10 ms, or none).
    #[test]
    fn own_cpu_reads_a_short_phase() {
        let t0 = own_cpu_s();
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < std::time::Duration::from_millis(2) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let used = own_cpu_s() - t0;
        // Preempted or not, the spin ran on a CPU for part of its 2 ms: never a zero, as a
        // reading in ticks (10 ms) would mostly be.
        assert!(used > 0.0 && used < 1.0, "{used}");
    }

    #[test]
    fn idle_of_some_cpus_is_their_idle_and_iowait() {
        let text =
            "cpu  10 0 10 100 5 0 0 0 0 0\ncpu0 4 0 6 60 1 0 0 0 0 0\ncpu1 6 0 4 40 4 0 0 0 0 0\n";
        assert_eq!(parse_cpus_idle(text, &[0]).unwrap(), 61);
        assert_eq!(parse_cpus_idle(text, &[1]).unwrap(), 44);
        assert_eq!(parse_cpus_idle(text, &[0, 1]).unwrap(), 105);
        assert!(parse_cpus_idle(text, &[2]).is_err());
    }

    // A real line (from a memcached process), fields 1..52.
    const LINE: &str = "4242 (memcached) S 1 4242 4242 0 -1 4194560 3101 0 0 0 \
        1234 567 0 0 20 0 4 0 123456 1700000000 2500 18446744073709551615 1 1 0 0 0 0 \
        0 4096 17131 0 0 0 17 3 0 0 0 0 0 0 0 0 0 0 0 0 0";

    #[test]
    fn parses_a_plain_line() {
        let s = parse_proc_stat(LINE).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.comm, "memcached");
        assert_eq!(s.state, 'S');
        assert_eq!((s.utime, s.stime, s.num_threads), (1234, 567, 4));
        assert_eq!(s.cpu_ticks(), 1801);
    }

    #[test]
    fn parses_a_comm_with_spaces_and_parentheses() {
        let line = LINE.replace("(memcached)", "(my (odd) ) name)");
        let s = parse_proc_stat(&line).unwrap();
        assert_eq!(s.comm, "my (odd) ) name");
        assert_eq!((s.utime, s.stime, s.num_threads), (1234, 567, 4));
        let line = LINE.replace("(memcached)", "( 1 2 3 4 5 6 7 8 9 10 11 12 13 14 )");
        let s = parse_proc_stat(&line).unwrap();
        assert_eq!((s.utime, s.stime), (1234, 567));
    }

    #[test]
    fn rejects_broken_lines() {
        assert!(parse_proc_stat("").is_err());
        assert!(parse_proc_stat("12 (x S 1 2").is_err());
        assert!(parse_proc_stat("12 (x) S 1 2 3").is_err());
        assert!(parse_proc_stat("x (y) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18").is_err());
        assert!(parse_proc_stat(&LINE.replace(" 1234 ", " -1 ")).is_err());
    }
}
