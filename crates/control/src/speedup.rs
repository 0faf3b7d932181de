//! Each job's runtime against its core count: the job alone, its threads set to the core
//! count and every process pinned to that many CPUs (`taskset -c`), one run per count, in
//! the job file's order (so a job's dependencies ran before it). What the predictive policy
//! and the report use to see how much a job gains from a second core.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::cpus::CpuSet;
use crate::jobs::JobFile;
use crate::ControlError;

/// One job at one core count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeedupRow {
    /// The job.
    pub job: String,
    /// Cores (and threads).
    pub cores: usize,
    /// Wall time, s.
    pub wall_s: f64,
    /// CPU time of the job's processes, s (user + system of the reaped children).
    pub cpu_s: f64,
    /// Its exit code.
    pub exit: Option<i32>,
}

fn children_cpu() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return 0.0;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Runs every job at each of its allowed core counts that `cpus` can give, in `work`.
pub fn speedup(
    jobs: &JobFile,
    cpus: &CpuSet,
    work: &Path,
) -> Result<Vec<SpeedupRow>, ControlError> {
    let mut out = Vec::new();
    for job in &jobs.jobs {
        for &c in job.cores.iter().filter(|&&c| c <= cpus.len()) {
            let mut j = job.clone();
            j.threads = c;
            let (pin, _) = cpus.split(c);
            let text = j.render(work);
            let before = children_cpu();
            let t0 = Instant::now();
            let status = Command::new("taskset")
                .args(["-c", &pin.to_string(), "sh", "-c", &text])
                .current_dir(work)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .status()
                .map_err(|e| ControlError::io(format!("running {text:?} under taskset"), e))?;
            out.push(SpeedupRow {
                job: j.name.clone(),
                cores: c,
                wall_s: t0.elapsed().as_secs_f64(),
                cpu_s: children_cpu() - before,
                exit: status.code(),
            });
        }
    }
    Ok(out)
}
