//! Operational laws (Denning & Buzen; Jain ch. 33) and the CPU time of a process.
//!
//! Units: times in seconds (s), throughputs in requests per second (req/s), numbers of
//! users or requests dimensionless. Any consistent units work.
//!
//! - Interactive response-time law: R = N / X − Z, for N users (closed-loop clients)
//!   each thinking Z between requests, at system throughput X.
//! - Utilization law: U = X · S (S service time per request at one resource); and
//!   its inverse, the service demand D = U / X. For a multi-threaded server U is in
//!   CPU-seconds per second and may exceed 1 (one unit per busy core); D is then the
//!   CPU-seconds consumed per request.
//! - Little's law: N = X · R (mean number in a system = throughput × time in it).
//! - CPU utilization of a process from two readings of `/proc/<pid>/stat`:
//!   U = ((utime + stime)₂ − (utime + stime)₁) / (clock ticks per second · Δt).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::compare::ModelCheck;
use crate::error::{non_negative, positive, AnalysisError, Result};

/// Interactive response-time law: R = N / X − Z (s), for `n` users, throughput `x`
/// (req/s) and think time `z` (s). The result may be negative when the inputs are
/// inconsistent (e.g. measured over different intervals); that is for the caller to
/// report, so it is returned as is.
pub fn response_time(n: f64, x: f64, z: f64) -> Result<f64> {
    non_negative("number of users N", n)?;
    positive("throughput X", x)?;
    non_negative("think time Z", z)?;
    Ok(n / x - z)
}

/// Checks the interactive response-time law against a measured mean response time:
/// predicted R = N/X − Z beside `measured_r`, agreeing within `tolerance` (relative).
pub fn check_response_time(
    n: f64,
    x: f64,
    z: f64,
    measured_r: f64,
    tolerance: f64,
) -> Result<ModelCheck> {
    let predicted = response_time(n, x, z)?;
    Ok(ModelCheck::new(
        "interactive response-time law R = N/X - Z",
        "s",
        predicted,
        measured_r,
        tolerance,
    ))
}

/// Utilization law: U = X · S (dimensionless; busy fraction, or busy cores).
pub fn utilization(x: f64, s: f64) -> Result<f64> {
    Ok(non_negative("throughput X", x)? * non_negative("service time S", s)?)
}

/// Service demand from the utilization law: D = U / X (s per request), for utilization
/// `u` (e.g. CPU-seconds per second) at throughput `x` (req/s).
pub fn service_demand(u: f64, x: f64) -> Result<f64> {
    Ok(non_negative("utilization U", u)? / positive("throughput X", x)?)
}

/// Little's law: mean number in the system N = X · R, for throughput `x` (req/s) and
/// mean time in the system `r` (s).
pub fn littles_law(x: f64, r: f64) -> Result<f64> {
    Ok(non_negative("throughput X", x)? * non_negative("residence time R", r)?)
}

/// The fields of `/proc/<pid>/stat` that the laws need (see proc(5)).
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
    let bad = |why: &str| AnalysisError::ProcStat(format!("{why} in {line:?}"));
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
    let text = std::fs::read_to_string(path).map_err(|source| AnalysisError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_proc_stat(text.trim_end())
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

/// CPU utilization between two readings of the same process, in CPU-seconds per second
/// (1.0 = one core fully busy; up to the number of cores for a multi-threaded process):
/// U = (ticks₂ − ticks₁) / (ticks_per_second · elapsed_seconds).
pub fn cpu_utilization(
    before: &ProcStat,
    after: &ProcStat,
    elapsed_seconds: f64,
    ticks_per_second: u64,
) -> Result<f64> {
    positive("elapsed time", elapsed_seconds)?;
    if ticks_per_second == 0 {
        return Err(AnalysisError::InvalidArgument {
            what: "clock ticks per second",
            value: 0.0,
            expected: "a number > 0",
        });
    }
    if before.pid != after.pid {
        return Err(AnalysisError::ProcStat(format!(
            "readings of different processes ({} and {})",
            before.pid, after.pid
        )));
    }
    let (t1, t2) = (before.cpu_ticks(), after.cpu_ticks());
    if t2 < t1 {
        return Err(AnalysisError::ProcStat(format!(
            "CPU time went backwards ({t1} → {t2} ticks): readings swapped, or the pid was reused"
        )));
    }
    Ok((t2 - t1) as f64 / (ticks_per_second as f64 * elapsed_seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real line (from a memcached process), fields 1..52.
    const LINE: &str = "4242 (memcached) S 1 4242 4242 0 -1 4194560 3101 0 0 0 \
        1234 567 0 0 20 0 4 0 123456 1700000000 2500 18446744073709551615 1 1 0 0 0 0 \
        0 4096 17131 0 0 0 17 3 0 0 0 0 0 0 0 0 0 0 0 0 0";

    #[test]
    fn interactive_law_on_simple_numbers() {
        // 10 users, 50 req/s, think 0.1 s: R = 10/50 - 0.1 = 0.1 s.
        assert!((response_time(10.0, 50.0, 0.1).unwrap() - 0.1).abs() < 1e-12);
        let c = check_response_time(10.0, 50.0, 0.1, 0.105, 0.10).unwrap();
        assert!(c.agrees && (c.relative_error + 0.047619).abs() < 1e-6);
        let c = check_response_time(10.0, 50.0, 0.1, 0.2, 0.10).unwrap();
        assert!(!c.agrees);
        assert!(response_time(10.0, 0.0, 0.1).is_err());
    }

    #[test]
    fn utilization_law_and_little() {
        // 200 req/s × 2 ms = 0.4 busy; 0.4 / 200 = 2 ms per request.
        assert!((utilization(200.0, 0.002).unwrap() - 0.4).abs() < 1e-12);
        assert!((service_demand(0.4, 200.0).unwrap() - 0.002).abs() < 1e-12);
        // Multi-core: 2.5 CPU-s/s at 10 000 req/s = 250 µs of CPU per request.
        assert!((service_demand(2.5, 10_000.0).unwrap() - 250e-6).abs() < 1e-15);
        assert!((littles_law(80.0, 0.05).unwrap() - 4.0).abs() < 1e-12);
        assert!(service_demand(0.4, 0.0).is_err());
    }

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

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_proc_self_stat() {
        let before = read_proc_stat_at("/proc/self/stat").unwrap();
        assert_eq!(before.pid, std::process::id());
        assert!(before.num_threads >= 1);
        // Burn some CPU so that the second reading is not smaller.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let after = read_proc_stat(std::process::id()).unwrap();
        let u = cpu_utilization(&before, &after, 1.0, clock_ticks_per_second()).unwrap();
        assert!(u >= 0.0);
        assert!(clock_ticks_per_second() > 0);
    }

    #[test]
    fn cpu_utilization_between_readings() {
        let a = parse_proc_stat(LINE).unwrap();
        let mut b = a.clone();
        b.utime += 150;
        b.stime += 50;
        // 200 ticks at 100 Hz over 2 s = 1 CPU-second per second.
        assert!((cpu_utilization(&a, &b, 2.0, 100).unwrap() - 1.0).abs() < 1e-12);
        assert!(cpu_utilization(&b, &a, 2.0, 100).is_err());
        assert!(cpu_utilization(&a, &b, 0.0, 100).is_err());
    }
}
