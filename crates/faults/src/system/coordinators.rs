//! Coordinators: `kvlab cluster add|remove|resume|abort`, a process each (so that one can
//! be killed mid-migration), with a log of its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::System;

/// How long a coordinator may run before it is killed and reported stuck (a migration
/// that makes no progress for 60 s fails by itself).
pub const COORDINATOR_TIMEOUT: Duration = Duration::from_secs(90);

/// What a coordinator said, on one line: its output up to a backtrace, the last `n`
/// characters of it.
fn said(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let text = text.split("Stack backtrace:").next().unwrap_or_default();
    let text = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    let start = text.char_indices().rev().nth(n).map_or(0, |(i, _)| i);
    text[start..].to_string()
}

impl System {
    /// Starts `kvlab cluster --topology SPEC <args>` in the background; its output goes to
    /// a log of its own. Returns its id.
    pub fn coordinator_start(&self, args: &[&str]) -> Result<u64, String> {
        let id = self.next_coordinator.fetch_add(1, Ordering::Relaxed);
        let log = self.coordinator_log(id, args);
        let f = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let g = f.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&self.cfg.exe)
            .args(["cluster", "--topology", &self.spec])
            .args(args)
            .stdin(Stdio::null())
            .stdout(f)
            .stderr(g)
            .spawn()
            .map_err(|e| format!("starting kvlab cluster {}: {e}", args.join(" ")))?;
        self.coordinators.lock().insert(id, child);
        Ok(id)
    }

    fn coordinator_log(&self, id: u64, args: &[&str]) -> PathBuf {
        let what: String = args
            .iter()
            .map(|a| a.replace([':', '.'], "_"))
            .collect::<Vec<_>>()
            .join("-");
        self.cfg
            .dir
            .join("coordinators")
            .join(format!("{id:03}-{what}.log"))
    }

    /// Whether coordinator `id` has ended; `Some((success, what it said last))` once it has.
    pub fn coordinator_poll(&self, id: u64, args: &[&str]) -> Option<(bool, String)> {
        let mut running = self.coordinators.lock();
        let child = running.get_mut(&id)?;
        match child.try_wait() {
            Ok(None) => None,
            Ok(Some(status)) => {
                running.remove(&id);
                Some((status.success(), said(&self.coordinator_log(id, args), 300)))
            }
            Err(e) => {
                running.remove(&id);
                Some((false, e.to_string()))
            }
        }
    }

    /// `kill -9` coordinator `id` (and reap it): `None` if it was killed, its result if it
    /// had already ended.
    pub fn coordinator_kill(&self, id: u64, args: &[&str]) -> Option<(bool, String)> {
        let mut child = self.coordinators.lock().remove(&id)?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some((status.success(), said(&self.coordinator_log(id, args), 300)));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Waits for coordinator `id` (at most [`COORDINATOR_TIMEOUT`]; then kills it).
    pub fn coordinator_wait(&self, id: u64, args: &[&str]) -> (bool, String) {
        let deadline = Instant::now() + COORDINATOR_TIMEOUT;
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(r) = self.coordinator_poll(id, args) {
                return r;
            }
            if Instant::now() >= deadline {
                if let Some(r) = self.coordinator_kill(id, args) {
                    return r;
                }
                return (
                    false,
                    format!(
                        "no end within {} s (killed): {}",
                        COORDINATOR_TIMEOUT.as_secs(),
                        said(&self.coordinator_log(id, args), 300)
                    ),
                );
            }
            // Polling a child's exit: a bounded back-off.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Runs a coordinator to its end: `(success, what it said last)`.
    pub fn coordinator(&self, args: &[&str]) -> (bool, String) {
        match self.coordinator_start(args) {
            Ok(id) => self.coordinator_wait(id, args),
            Err(e) => (false, e),
        }
    }
}
