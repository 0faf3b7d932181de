//! Policies: how many of the managed cores the server gets, from one sample.
//!
//! - `static`: a fixed number, whatever happens (the baseline a policy must beat).
//! - `reactive`: PARTIES-style slack on the measured latency, `slack = 1 - p95 / SLO`:
//!   below `grow_slack` the server gets one more core at once; above `shrink_slack` for
//!   `hold` samples in a row it gives one back. After a shrink that ends in a violation the
//!   hold doubles (up to 64 samples), so a load that needs the core is not probed again
//!   and again; it halves back on every shrink that holds.
//! - `predictive`: the fewest cores whose capacity (requests/s within the SLO, from the
//!   characterisation) covers the measured rate with `headroom` to spare — a load step is
//!   answered in the sample that sees it, before the latency moves — with the reactive rule
//!   as a guard: slack below `grow_slack` adds a core beyond the prediction, and a core is
//!   given back only when both the prediction and the slack allow it.
//!
//! The latency is the load's p95 (`kvlab bench --live`) or, without it or by choice
//! ([`LatencySource`]), the server's own windowed p95 (kvlab's `stats latency`); with
//! `max_queued`, connections queued for the server's event loops beyond it count as no
//! slack too. A missing signal (no latency figure yet, no rate) holds the current share.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One sample of the server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Signal {
    /// When, since the controller started.
    #[serde(skip)]
    pub t: Duration,
    /// The latency's 95th percentile over the last interval, µs.
    pub p95_us: Option<f64>,
    /// Requests/s over the last sample.
    pub qps: Option<f64>,
    /// The server's CPU over the last sample, cores busy.
    pub cpu: Option<f64>,
    /// Open connections (kvlab server and memcached `stats`).
    pub conns: Option<u64>,
    /// The server's own latency over the last sample, µs (kvlab's `stats latency`): the p95
    /// of its service times plus the p95 of its connections' waits for an event loop; 0
    /// when it served nothing in the sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_p95_us: Option<f64>,
    /// Connections waiting for the server's event loops, on average over the last sample
    /// (kvlab's `stats latency`: the waits' sum over the sample's length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<f64>,
}

/// Which latency the slack is taken on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LatencySource {
    /// The load's p95 when there is one (a fresh `--live` interval), else the server's.
    #[default]
    Auto,
    /// Only the load's p95 (the one the SLO is about).
    Client,
    /// Only the server's own windowed p95 (attached to a server under someone else's
    /// load; it lacks the network's and the client's time, so give a tighter SLO).
    Server,
}

impl LatencySource {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LatencySource::Auto => "auto",
            LatencySource::Client => "client",
            LatencySource::Server => "server",
        }
    }
}

impl std::str::FromStr for LatencySource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(LatencySource::Auto),
            "client" => Ok(LatencySource::Client),
            "server" => Ok(LatencySource::Server),
            _ => Err(format!("latency source {s:?}: auto, client or server")),
        }
    }
}

impl Signal {
    /// The latency the slack is taken on, and what it is.
    pub fn latency(&self, source: LatencySource) -> Option<(f64, &'static str)> {
        match source {
            LatencySource::Client => self.p95_us.map(|p| (p, "p95")),
            LatencySource::Server => self.server_p95_us.map(|p| (p, "server p95")),
            LatencySource::Auto => self
                .p95_us
                .map(|p| (p, "p95"))
                .or(self.server_p95_us.map(|p| (p, "server p95"))),
        }
    }
}

/// Reactive thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Slack {
    /// The latency bound: p95, µs.
    pub slo_p95_us: f64,
    /// Grow below this slack.
    pub grow_slack: f64,
    /// Shrink above this slack ...
    pub shrink_slack: f64,
    /// ... held for this many samples in a row.
    pub hold: u32,
    /// Which latency.
    #[serde(default)]
    pub latency: LatencySource,
    /// Grow too when more connections than this wait for the server's event loops on
    /// average over a sample ([`Signal::queued`]); none: the queue is only logged.
    #[serde(default)]
    pub max_queued: Option<f64>,
    /// The load's p95 is taken over its intervals of the last this many ms, their
    /// histograms added up (0: the newest interval's own p95). A longer window weighs a
    /// burst by the share of requests it slowed, as a trace segment's p95 does.
    #[serde(default)]
    pub latency_window_ms: u64,
}

/// PARTIES' thresholds, a 1 ms p95 and a 1 s hold at 100 ms samples; the load's p95 when
/// there is one, else the server's; the queue not used.
pub const DEFAULT_SLACK: Slack = Slack {
    slo_p95_us: 1000.0,
    grow_slack: 0.05,
    shrink_slack: 0.20,
    hold: 10,
    latency: LatencySource::Auto,
    max_queued: None,
    latency_window_ms: 0,
};

/// Default headroom of the predictive policy: plan for 25% more than the measured rate.
pub const DEFAULT_HEADROOM: f64 = 0.25;

/// What a policy is and its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "lowercase")]
pub enum PolicySpec {
    /// A fixed share.
    Static {
        /// The server's cores.
        cores: usize,
    },
    /// Slack thresholds.
    Reactive {
        /// Thresholds.
        slack: Slack,
    },
    /// Capacity per core count plus the reactive guard.
    Predictive {
        /// Thresholds of the guard.
        slack: Slack,
        /// Requests/s within the SLO with 1, 2, … cores (`capacity[c - 1]`).
        capacity: Vec<f64>,
        /// Fraction of spare capacity planned for.
        headroom: f64,
    },
}

impl PolicySpec {
    /// Its name.
    pub fn name(&self) -> &'static str {
        match self {
            PolicySpec::Static { .. } => "static",
            PolicySpec::Reactive { .. } => "reactive",
            PolicySpec::Predictive { .. } => "predictive",
        }
    }
}

/// A decision: the server's cores and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The server's cores.
    pub cores: usize,
    /// Why (for the log).
    pub reason: String,
}

/// A policy with its state.
#[derive(Debug, Clone)]
pub struct Policy {
    spec: PolicySpec,
    /// Samples in a row with slack above the shrink threshold.
    calm: u32,
    /// The current hold (grows after a shrink that failed).
    hold: u32,
    /// Samples since the last shrink, while fewer than the hold.
    since_shrink: Option<u32>,
}

impl Policy {
    /// A policy in its initial state.
    pub fn new(spec: PolicySpec) -> Policy {
        let hold = match &spec {
            PolicySpec::Static { .. } => 0,
            PolicySpec::Reactive { slack } | PolicySpec::Predictive { slack, .. } => slack.hold,
        };
        Policy {
            spec,
            calm: 0,
            hold: hold.max(1),
            since_shrink: None,
        }
    }

    /// What it is.
    pub fn spec(&self) -> &PolicySpec {
        &self.spec
    }

    /// The server's cores when the controller starts, with `max` cores managed: the static
    /// share, else all of them (the safe side; the policy gives back what is not needed).
    pub fn initial(&self, max: usize) -> usize {
        match self.spec {
            PolicySpec::Static { cores } => cores.clamp(1, max),
            _ => max,
        }
    }

    /// The server's cores after `s`, now `current`, within `min..=max`.
    pub fn decide(&mut self, s: &Signal, current: usize, min: usize, max: usize) -> Decision {
        let d = match self.spec.clone() {
            PolicySpec::Static { cores } => Decision {
                cores,
                reason: "static".into(),
            },
            PolicySpec::Reactive { slack } => self.reactive(&slack, s, current, min),
            PolicySpec::Predictive {
                slack,
                capacity,
                headroom,
            } => {
                let Some(qps) = s.qps else {
                    return self.hold_at(current, "no rate measured yet");
                };
                let need = qps * (1.0 + headroom);
                let want = capacity
                    .iter()
                    .position(|&c| c >= need)
                    .map_or(capacity.len().max(1), |i| i + 1);
                let mut d = self.reactive(&slack, s, current, want.max(min));
                if want > current && d.cores >= want {
                    d.reason = format!(
                        "predicted: {qps:.0} req/s + {:.0}% headroom needs {want} core(s)",
                        headroom * 100.0
                    );
                }
                d
            }
        };
        Decision {
            cores: d.cores.clamp(min.max(1), max.max(1)),
            reason: d.reason,
        }
    }

    fn hold_at(&self, current: usize, why: &str) -> Decision {
        Decision {
            cores: current,
            reason: why.into(),
        }
    }

    /// The slack rule from `current`; `floor` is the fewest cores the caller allows (the
    /// prediction; the minimum for the purely reactive policy): below it nothing shrinks, and
    /// a floor above `current` is granted at once.
    fn reactive(&mut self, k: &Slack, s: &Signal, current: usize, floor: usize) -> Decision {
        let Some((p95, what)) = s.latency(k.latency) else {
            let cores = floor.max(current);
            return Decision {
                cores,
                reason: "no latency measured yet".into(),
            };
        };
        let slack = 1.0 - p95 / k.slo_p95_us;
        let failed_shrink = self.since_shrink.is_some();
        self.since_shrink = self.since_shrink.map(|n| n + 1).filter(|&n| n < self.hold);
        let queued = match (k.max_queued, s.queued) {
            (Some(max), Some(q)) if q > max => Some((q, max)),
            _ => None,
        };
        if slack < k.grow_slack || queued.is_some() {
            self.calm = 0;
            if failed_shrink {
                // A violation soon after a shrink: the core was needed; wait longer before
                // the next try.
                self.hold = (self.hold * 2).min(64);
                self.since_shrink = None;
            }
            let reason = match queued {
                Some((q, max)) if slack >= k.grow_slack => format!(
                    "{q:.1} connections queued > {max:.1} ({what} {p95:.0} µs, slack {slack:.2})"
                ),
                _ => format!(
                    "slack {slack:.2} < {:.2} ({what} {p95:.0} µs, SLO {:.0} µs)",
                    k.grow_slack, k.slo_p95_us
                ),
            };
            return Decision {
                cores: floor.max(current + 1),
                reason,
            };
        }
        if floor > current {
            self.calm = 0;
            return Decision {
                cores: floor,
                reason: String::new(),
            };
        }
        if slack > k.shrink_slack {
            self.calm += 1;
            if self.calm >= self.hold && floor < current {
                self.calm = 0;
                // The previous shrink held (no violation within its hold): halve the hold back.
                self.hold = (self.hold / 2).max(k.hold.max(1));
                self.since_shrink = Some(0);
                return Decision {
                    cores: current - 1,
                    reason: format!(
                        "slack {slack:.2} > {:.2} for {} samples ({what} {p95:.0} µs)",
                        k.shrink_slack, self.hold
                    ),
                };
            }
        } else {
            self.calm = 0;
        }
        Decision {
            cores: current,
            reason: String::new(),
        }
    }
}
