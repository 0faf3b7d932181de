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
//!   The readings and `CLK_TCK` are `kvlab-procfs`'s, re-exported here.

pub use kvlab_procfs::{
    clock_ticks_per_second, parse_proc_stat, read_proc_stat, read_proc_stat_at, ProcStat,
};

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
        let a = read_proc_stat(std::process::id()).unwrap();
        let mut b = a.clone();
        b.utime += 150;
        b.stime += 50;
        // 200 ticks at 100 Hz over 2 s = 1 CPU-second per second.
        assert!((cpu_utilization(&a, &b, 2.0, 100).unwrap() - 1.0).abs() < 1e-12);
        assert!(cpu_utilization(&b, &a, 2.0, 100).is_err());
        assert!(cpu_utilization(&a, &b, 0.0, 100).is_err());
    }
}
