//! A host's clock offset, estimated over its control connection: a script on the host reads
//! its clock once for every line it is sent; each round trip brackets that reading between
//! two local clock readings, so the host's time at the midpoint differs from ours by the
//! offset, give or take half the round trip. The tightest of several round trips is kept
//! (the offset and its bound = half that round trip): a remote reading taken at time `r`
//! when our clock said `t0` before and `t1` after has a true offset in
//! `[r − t1, r − t0]` = offset ± bound.
//!
//! Each reading on the host runs its clock command (`date +%s%N`, or the host's `clock`), so
//! a round trip includes starting it: the bound says how much that costs, and a report
//! prints it beside the offset.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{HostError, Result};
use crate::remote::Remote;
use crate::shell::{kill_group, wait_bounded};

/// The clock command when the host names none.
pub const DEFAULT_CLOCK: &str = "date +%s%N";

/// A host's clock against ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockOffset {
    /// The host's clock minus ours, nanoseconds.
    pub offset_ns: i64,
    /// How far the true offset may be from `offset_ns` (half the tightest round trip), ns.
    pub bound_ns: u64,
    /// Round trips made.
    pub rounds: u32,
}

impl ClockOffset {
    /// A time read on the host (ns since the epoch) in our clock.
    pub fn to_local(&self, remote_ns: i64) -> i64 {
        remote_ns - self.offset_ns
    }

    /// Whether series sampled every `interval` may be merged after correction: the bound
    /// is at most the interval.
    pub fn fits(&self, interval: Duration) -> bool {
        u128::from(self.bound_ns) <= interval.as_nanos()
    }
}

impl std::fmt::Display for ClockOffset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:+.6} s ± {:.3} ms ({} round trips)",
            self.offset_ns as f64 / 1e9,
            self.bound_ns as f64 / 1e6,
            self.rounds
        )
    }
}

/// Our clock, ns since the epoch.
fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// Estimates `remote`'s clock offset over `rounds` round trips (at least 1), each at most
/// the settings' command timeout.
pub fn offset(remote: &Remote, rounds: u32) -> Result<ClockOffset> {
    let host = remote.name().to_string();
    if let Err(detail) = remote.transport().check() {
        return Err(HostError::Unreachable { host, detail });
    }
    let clock = remote.host().clock.as_deref().unwrap_or(DEFAULT_CLOCK);
    let limit = remote.settings().command_timeout;
    let script = format!("while read -r _; do {clock} || exit 1; done");
    let mut child = remote
        .transport()
        .command(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|source| HostError::Io {
            host: host.clone(),
            what: "starting the clock reader".into(),
            source,
        })?;
    let (Some(mut input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
        kill_group(&mut child);
        return Err(HostError::Io {
            host,
            what: "the clock reader's pipes".into(),
            source: std::io::Error::other("missing"),
        });
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut best: Option<(i128, i128)> = None; // (round trip, offset)
    let mut result = Ok(());
    for _ in 0..rounds.max(1) {
        let t0 = now_ns();
        if input.write_all(b"\n").and_then(|()| input.flush()).is_err() {
            result = Err("the clock reader closed its input".to_string());
            break;
        }
        let line = match rx.recv_timeout(limit) {
            Ok(l) => l,
            Err(_) => {
                result = Err(format!("no clock reading in {limit:?}"));
                break;
            }
        };
        let t1 = now_ns();
        let Ok(remote_ns) = line.trim().parse::<i128>() else {
            kill_group(&mut child);
            return Err(HostError::Parse {
                host,
                what: format!("the clock command `{clock}`"),
                text: line,
            });
        };
        let rtt = t1 - t0;
        let offset = remote_ns - (t0 + rtt / 2);
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    drop(input);
    if wait_bounded(&mut child, Duration::from_secs(2)).is_none() {
        kill_group(&mut child);
    }
    if let Err(detail) = result {
        if let Err(lost) = remote.transport().check() {
            return Err(HostError::Unreachable { host, detail: lost });
        }
        return Err(HostError::Timeout {
            host,
            what: format!("reading the clock: {detail}"),
            after: limit,
        });
    }
    let (rtt, offset) = best.unwrap_or((0, 0));
    Ok(ClockOffset {
        offset_ns: offset as i64,
        // ceil: the midpoint was rounded down.
        bound_ns: ((rtt + 1) / 2).max(0) as u64,
        rounds: rounds.max(1),
    })
}
