//! The controller's log: one JSON object per line for every sample, every change of cores
//! and every job event, each with its time, the reason and the signal that caused it.
//!
//! ```text
//! {"t_s":1.2,"unix_ms":…,"event":"cores","from":2,"to":1,"server_cpus":"0","job_cpus":"1",
//!  "readback":"0","reason":"slack 0.41 > 0.20 for 10 samples (p95 590 µs)","signal":{…}}
//! {"t_s":1.2,"unix_ms":…,"event":"resume","job":"zstd","cores":1,"reason":"…","signal":{…}}
//! ```
//!
//! Each line is flushed as it is written, so a run that is stopped keeps its log.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::policy::Signal;
use crate::ControlError;

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum What {
    /// One sample and the share after it.
    Sample {
        /// The server's cores.
        cores: usize,
        /// Jobs running.
        running: usize,
        /// Jobs paused.
        paused: usize,
    },
    /// The server's cores changed.
    Cores {
        /// Cores before.
        from: usize,
        /// Cores after.
        to: usize,
        /// The server's CPUs now.
        server_cpus: String,
        /// The jobs' CPUs now (empty: none, every job paused).
        job_cpus: String,
        /// What the kernel reports back for the server (`Cpus_allowed_list` or the
        /// cgroup's `cpuset.cpus`).
        readback: String,
    },
    /// The jobs may (`on`) or may no longer use the server's CPUs at idle priority
    /// (`Share::idle_jobs`; off: every job paused, the server has every core).
    Idle {
        /// Whether they may.
        on: bool,
        /// The jobs' CPUs now.
        job_cpus: String,
    },
    /// A job started.
    Start {
        /// The job.
        job: String,
        /// Cores it holds.
        cores: usize,
        /// Its process id.
        pid: Option<u32>,
    },
    /// A job was paused.
    Pause {
        /// The job.
        job: String,
    },
    /// A job was resumed.
    Resume {
        /// The job.
        job: String,
        /// Cores it holds.
        cores: usize,
    },
    /// A job exited.
    End {
        /// The job.
        job: String,
        /// Its exit code (`null`: killed by a signal).
        exit: Option<i32>,
        /// Its runtime without paused spans, s.
        runtime_s: f64,
        /// Time it was paused, s.
        paused_s: f64,
        /// Times it was paused.
        pauses: u32,
    },
    /// The run ended.
    Stop {
        /// Why.
        why: String,
    },
}

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Seconds since the controller started.
    pub t_s: f64,
    /// Wall-clock time, ms since the Unix epoch.
    pub unix_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub what: What,
    /// Why (empty for samples).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The sample that caused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<Signal>,
}

/// This machine's clock minus the clock the controller's times are in, µs: 0 (this
/// machine's) unless [`set_clock_offset_us`] says otherwise.
static CLOCK_OFFSET_US: AtomicI64 = AtomicI64::new(0);

/// Puts every time this process reads with [`unix_ms`] (its events', and the freshness of
/// the load's rows) in another machine's clock: this one's minus `offset_us`. A controller
/// that the lab starts on another host is given that host's offset to the lab's machine,
/// which writes the load's rows, so that rows and events line up.
pub fn set_clock_offset_us(offset_us: i64) {
    CLOCK_OFFSET_US.store(offset_us, Ordering::Relaxed);
}

/// Now, ms since the Unix epoch (in the clock [`set_clock_offset_us`] chose).
pub fn unix_ms() -> u64 {
    let us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    (us - CLOCK_OFFSET_US.load(Ordering::Relaxed)).max(0) as u64 / 1000
}

/// Where events go: a file (JSON lines) and memory (every event but samples).
#[derive(Debug, Default)]
pub struct EventLog {
    file: Option<BufWriter<File>>,
    /// Events other than samples, in order.
    pub events: Vec<Event>,
}

impl EventLog {
    /// A log kept in memory only.
    pub fn memory() -> EventLog {
        EventLog::default()
    }

    /// A log written to `path` (created or truncated) and kept in memory.
    pub fn file(path: &Path) -> Result<EventLog, ControlError> {
        let f = File::create(path)
            .map_err(|e| ControlError::io(format!("creating {}", path.display()), e))?;
        Ok(EventLog {
            file: Some(BufWriter::new(f)),
            events: Vec::new(),
        })
    }

    /// Writes one event.
    pub fn push(&mut self, e: Event) -> Result<(), ControlError> {
        if let Some(f) = &mut self.file {
            let line = serde_json::to_string(&e).map_err(|e| ControlError::Spec(e.to_string()))?;
            writeln!(f, "{line}")
                .and_then(|()| f.flush())
                .map_err(|e| ControlError::io("writing the control log", e))?;
        }
        if !matches!(e.what, What::Sample { .. }) {
            self.events.push(e);
        }
        Ok(())
    }
}

/// Reads a log written by [`EventLog::file`] (samples included).
pub fn read_log(path: &Path) -> Result<Vec<Event>, ControlError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ControlError::io(format!("reading {}", path.display()), e))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(n, l)| {
            serde_json::from_str(l)
                .map_err(|e| ControlError::Spec(format!("{} line {}: {e}", path.display(), n + 1)))
        })
        .collect()
}
