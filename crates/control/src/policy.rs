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
//! With a segment budget ([`Slack::segment_budget`]) the guard judges what the SLO is
//! counted on, the load's trace segment: its slack is the budget left of the share of the
//! segment's requests allowed over the SLO, so jobs run while the segment can afford them.
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
    /// The load's requests so far in its current trace segment, and how many of them were
    /// slower than the SLO (with [`Slack::segment_budget`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<SegmentCount>,
    /// Cores of the managed CPUs left idle over the last sample (`/proc/stat`: idle and
    /// iowait), whoever kept the others busy: what idle-priority work could still get.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_cores: Option<f64>,
}

/// Requests of the current trace segment so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentCount {
    /// The segment (the load's rate step).
    pub step: usize,
    /// Requests completed in it so far.
    pub requests: u64,
    /// Of those, slower than the SLO.
    pub slow: u64,
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
    /// Judge the trace segment instead of the newest interval: keep the share of the
    /// current segment's requests slower than the SLO below this share (a p95 SLO allows
    /// 0.05; half of that leaves the rest for the load's own slow requests). The slack is
    /// then `1 - share / budget`, the segment counted from the load's `--live` rows since
    /// its step began; a failed shrink does not lengthen the hold (the budget bounds what a
    /// probe costs). `None`: the p95 decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_budget: Option<f64>,
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
    segment_budget: None,
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
    /// The `kvlab control` flags that give this policy, all but the SLO (`--slo-p95-us`,
    /// which the command takes once, for the policy and for the summary): how the lab runs
    /// the controller on another host.
    pub fn flags(&self) -> Vec<String> {
        let mut f = vec!["--policy".to_string(), self.name().to_string()];
        let mut push = |k: &str, v: String| {
            f.push(k.to_string());
            f.push(v);
        };
        let slack = match self {
            PolicySpec::Static { cores } => {
                push("--static-cores", cores.to_string());
                return f;
            }
            PolicySpec::Reactive { slack } => slack,
            PolicySpec::Predictive {
                slack,
                capacity,
                headroom,
            } => {
                if !capacity.is_empty() {
                    let list: Vec<String> = capacity.iter().map(f64::to_string).collect();
                    push("--capacity", list.join(","));
                }
                push("--headroom", headroom.to_string());
                slack
            }
        };
        push("--grow-slack", slack.grow_slack.to_string());
        push("--shrink-slack", slack.shrink_slack.to_string());
        push("--hold", slack.hold.to_string());
        push("--latency", slack.latency.name().to_string());
        if let Some(q) = slack.max_queued {
            push("--max-queued", q.to_string());
        }
        push(
            "--latency-window",
            (slack.latency_window_ms as f64 / 1000.0).to_string(),
        );
        if let Some(b) = slack.segment_budget {
            push("--segment-budget", b.to_string());
        }
        f
    }

    /// The SLO its slack keeps, µs (none for a static split).
    pub fn slo_p95_us(&self) -> Option<f64> {
        match self {
            PolicySpec::Static { .. } => None,
            PolicySpec::Reactive { slack } | PolicySpec::Predictive { slack, .. } => {
                Some(slack.slo_p95_us)
            }
        }
    }

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
        let Some((slack, what)) = guard_slack(k, s) else {
            let cores = floor.max(current);
            return Decision {
                cores,
                reason: "no latency measured yet".into(),
            };
        };
        let failed_shrink = self.since_shrink.is_some() && k.segment_budget.is_none();
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
                Some((q, max)) if slack >= k.grow_slack => {
                    format!("{q:.1} connections queued > {max:.1} ({what}, slack {slack:.2})")
                }
                _ => format!(
                    "slack {slack:.2} < {:.2} ({what}, SLO {:.0} µs)",
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
                        "slack {slack:.2} > {:.2} for {} samples ({what})",
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

/// The guard's slack and what it was taken on: the segment's slow share against the budget
/// when there is one and the segment has requests, else the p95 against the SLO.
fn guard_slack(k: &Slack, s: &Signal) -> Option<(f64, String)> {
    if let (Some(budget), Some(seg)) = (k.segment_budget, s.segment) {
        if seg.requests > 0 {
            let share = seg.slow as f64 / seg.requests as f64;
            return Some((
                1.0 - share / budget,
                format!(
                    "segment {}: {} of {} requests over the SLO, {:.2}% of a {:.2}% budget",
                    seg.step,
                    seg.slow,
                    seg.requests,
                    share * 100.0,
                    budget * 100.0
                ),
            ));
        }
    }
    let (p95, what) = s.latency(k.latency)?;
    Some((1.0 - p95 / k.slo_p95_us, format!("{what} {p95:.0} µs")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget_policy() -> Policy {
        Policy::new(PolicySpec::Reactive {
            slack: Slack {
                segment_budget: Some(0.025),
                hold: 3,
                ..DEFAULT_SLACK
            },
        })
    }

    /// A sample whose newest interval's p95 is `p95_us` and whose segment so far has
    /// `slow` of `requests` over the SLO.
    fn signal(p95_us: f64, requests: u64, slow: u64) -> Signal {
        Signal {
            p95_us: Some(p95_us),
            segment: Some(SegmentCount {
                step: 1,
                requests,
                slow,
            }),
            ..Signal::default()
        }
    }

    #[test]
    fn a_segment_budget_judges_the_segment_not_the_newest_interval() {
        let mut p = budget_policy();
        // The newest 100 ms is over the SLO, but 1% of the segment is slow: within budget.
        let d = p.decide(&signal(1800.0, 10_000, 100), 1, 1, 2);
        assert_eq!(d.cores, 1, "{}", d.reason);
        // 3% of the segment slow: over the 2.5% budget, whatever the newest interval says.
        let d = p.decide(&signal(200.0, 10_000, 300), 1, 1, 2);
        assert_eq!(d.cores, 2, "{}", d.reason);
        assert!(d.reason.contains("300 of 10000"), "{}", d.reason);
        // Without the budget the newest p95 decides, as before.
        let mut plain = Policy::new(PolicySpec::Reactive {
            slack: DEFAULT_SLACK,
        });
        assert_eq!(plain.decide(&signal(1800.0, 10_000, 100), 1, 1, 2).cores, 2);
        // No segment figure yet: the p95 decides.
        let s = Signal {
            p95_us: Some(1800.0),
            ..Signal::default()
        };
        assert_eq!(budget_policy().decide(&s, 1, 1, 2).cores, 2);
    }

    #[test]
    fn under_a_budget_a_failed_shrink_does_not_lengthen_the_hold() {
        let mut p = budget_policy();
        // Calm for the hold (3 samples): one core given back.
        let calm = signal(100.0, 10_000, 0);
        assert_eq!(p.decide(&calm, 2, 1, 2).cores, 2);
        assert_eq!(p.decide(&calm, 2, 1, 2).cores, 2);
        assert_eq!(p.decide(&calm, 2, 1, 2).cores, 1);
        // Over budget right after: the core comes back, and the hold stays 3 samples.
        assert_eq!(p.decide(&signal(100.0, 10_000, 400), 1, 1, 2).cores, 2);
        assert_eq!(p.hold, 3);
        assert_eq!(p.decide(&calm, 2, 1, 2).cores, 2);
        assert_eq!(p.decide(&calm, 2, 1, 2).cores, 2);
        assert_eq!(p.decide(&calm, 2, 1, 2).cores, 1);
        // The p95 guard doubles it in the same case.
        let mut q = Policy::new(PolicySpec::Reactive {
            slack: Slack {
                hold: 3,
                ..DEFAULT_SLACK
            },
        });
        let fast = signal(100.0, 0, 0);
        for _ in 0..3 {
            q.decide(&fast, 2, 1, 2);
        }
        assert_eq!(q.decide(&signal(1800.0, 0, 0), 1, 1, 2).cores, 2);
        assert_eq!(q.hold, 6);
    }
}
