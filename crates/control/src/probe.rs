//! Whether pausing the jobs helps: with idle-priority jobs the policy's last step pauses them
//! all, and a pause is a probe — if the load's requests stay over the SLO while nothing but
//! the server runs, the violation is the machine's (on a virtual machine, a sleeping CPU's
//! wake-up at a low rate; jobs that keep the CPUs busy can even shorten it), and the pause
//! only costs the jobs their time.
//!
//! Every pause is judged, the initial one (the policy starts from every core to the server)
//! and a long one again after each verdict that it helped: a load that falls back to where
//! the machine alone is slow ends it too.
//!
//! ```text
//! policy wants the pause ─► cooling down and the rate ≤ 1.25 × the failed probe's? ─► no pause
//!                        └► pause; its first `samples` samples counted (requests, slow ones)
//!                              ├─ slow share ≤ budget: it helped — cool-down back to its base
//!                              └─ over budget: it did not — resume, no pause for the
//!                                 cool-down (doubling, up to MAX_COOLDOWN) at rates up to
//!                                 1.25 × this one
//! ```
//!
//! The slow share is counted as the guard counts it: the load's trace-segment counts
//! (requests since the pause, across segment boundaries) when there are any, else the
//! samples whose latency was over the SLO against half of them.

use std::time::Duration;

use crate::policy::{SegmentCount, Signal, Slack};

/// The first cool-down after a pause that did not help.
pub const BASE_COOLDOWN: Duration = Duration::from_secs(2);
/// The longest cool-down.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(32);
/// A failed probe holds pauses off at rates up to this factor of its own: a load that
/// grew beyond it is a new question.
pub const RATE_FACTOR: f64 = 1.25;

/// A pause under way and what it has seen.
#[derive(Debug, Clone, Default)]
struct Open {
    samples: u32,
    requests: u64,
    slow: u64,
    over: u32,
    qps: f64,
    last: Option<SegmentCount>,
}

/// What a probe concluded.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Still counting (or no pause under way).
    Pending,
    /// The pause brought the latency back within the SLO.
    Helped,
    /// It did not: resume the jobs; why, for the log.
    Useless(String),
}

/// The probe's state across pauses.
#[derive(Debug, Clone)]
pub struct PauseProbe {
    slack: Slack,
    samples: u32,
    open: Option<Open>,
    cooldown: Duration,
    /// No pause before this, at rates up to `held_qps`.
    until: Duration,
    held_qps: f64,
}

impl PauseProbe {
    /// A probe that judges a pause by its first `samples` samples against `slack`'s SLO
    /// (and its segment budget, when it has one).
    pub fn new(slack: Slack, samples: u32) -> PauseProbe {
        PauseProbe {
            slack,
            samples: samples.max(1),
            open: None,
            cooldown: BASE_COOLDOWN,
            until: Duration::ZERO,
            held_qps: 0.0,
        }
    }

    /// Why a pause may not start now (`None`: it may): a recent pause at a similar rate did
    /// not help.
    pub fn hold_off(&self, s: &Signal) -> Option<String> {
        if s.t >= self.until {
            return None;
        }
        let qps = s.qps.unwrap_or(0.0);
        (qps <= self.held_qps * RATE_FACTOR).then(|| {
            format!(
                "no pause until {:.1} s at up to {:.0} req/s: the last one did not help",
                self.until.as_secs_f64(),
                self.held_qps * RATE_FACTOR
            )
        })
    }

    /// A pause begins with sample `s` (counted from the next sample on).
    pub fn start(&mut self, s: &Signal) {
        self.open = Some(Open {
            qps: s.qps.unwrap_or(0.0),
            last: s.segment,
            ..Open::default()
        });
    }

    /// Whether a pause is being judged.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// The pause ended before its verdict (the policy resumed the jobs itself).
    pub fn abandon(&mut self) {
        self.open = None;
    }

    /// One sample during the pause.
    pub fn sample(&mut self, s: &Signal) -> Verdict {
        let Some(open) = &mut self.open else {
            return Verdict::Pending;
        };
        open.samples += 1;
        if let Some(seg) = s.segment {
            let (req, slow) = match open.last {
                Some(l) if l.step == seg.step => (
                    seg.requests.saturating_sub(l.requests),
                    seg.slow.saturating_sub(l.slow),
                ),
                _ => (seg.requests, seg.slow),
            };
            open.requests += req;
            open.slow += slow;
            open.last = Some(seg);
        }
        if s.latency(self.slack.latency)
            .is_some_and(|(p, _)| p > self.slack.slo_p95_us)
        {
            open.over += 1;
        }
        if open.samples < self.samples {
            return Verdict::Pending;
        }
        let open = self.open.take().unwrap_or_default();
        let (failed, what) = match self.slack.segment_budget {
            Some(budget) if open.requests > 0 => {
                let share = open.slow as f64 / open.requests as f64;
                (
                    share > budget,
                    format!(
                        "{} of {} requests over the SLO in the pause's first {} samples \
                         ({:.2}% against a {:.2}% budget)",
                        open.slow,
                        open.requests,
                        open.samples,
                        share * 100.0,
                        budget * 100.0
                    ),
                )
            }
            _ => (
                2 * open.over > open.samples,
                format!(
                    "{} of the pause's first {} samples over the SLO",
                    open.over, open.samples
                ),
            ),
        };
        if !failed {
            self.cooldown = BASE_COOLDOWN;
            return Verdict::Helped;
        }
        self.until = s.t + self.cooldown;
        self.held_qps = open.qps.max(s.qps.unwrap_or(0.0));
        let why = format!(
            "pausing the jobs did not help: {what}; they run again, no pause for {:.0} s at \
             up to {:.0} req/s",
            self.cooldown.as_secs_f64(),
            self.held_qps * RATE_FACTOR
        );
        self.cooldown = (self.cooldown * 2).min(MAX_COOLDOWN);
        Verdict::Useless(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::DEFAULT_SLACK;

    fn probe() -> PauseProbe {
        PauseProbe::new(
            Slack {
                segment_budget: Some(0.025),
                ..DEFAULT_SLACK
            },
            3,
        )
    }

    fn sig(t: f64, qps: f64, step: usize, requests: u64, slow: u64) -> Signal {
        Signal {
            t: Duration::from_secs_f64(t),
            qps: Some(qps),
            p95_us: Some(500.0),
            segment: Some(SegmentCount {
                step,
                requests,
                slow,
            }),
            ..Signal::default()
        }
    }

    #[test]
    fn a_pause_that_leaves_the_requests_slow_is_ended_and_held_off_at_that_rate() {
        let mut p = probe();
        // The segment already had 100 slow of 1,000 when the pause began; during it another
        // 60 of 1,500 (4%): the pause did not help, whatever came before it.
        p.start(&sig(1.0, 20_000.0, 4, 1_000, 100));
        assert_eq!(
            p.sample(&sig(1.1, 20_000.0, 4, 1_500, 120)),
            Verdict::Pending
        );
        assert_eq!(
            p.sample(&sig(1.2, 20_000.0, 4, 2_000, 140)),
            Verdict::Pending
        );
        let v = p.sample(&sig(1.3, 20_000.0, 4, 2_500, 160));
        assert!(
            matches!(&v, Verdict::Useless(w) if w.contains("60 of 1500")),
            "{v:?}"
        );
        // Held off for 2 s at rates up to 25,000; a load beyond that is tried again.
        assert!(p.hold_off(&sig(2.0, 24_000.0, 5, 0, 0)).is_some());
        assert!(p.hold_off(&sig(2.0, 30_000.0, 5, 0, 0)).is_none());
        assert!(p.hold_off(&sig(3.4, 20_000.0, 5, 0, 0)).is_none());
        // The next failure holds off twice as long.
        p.start(&sig(4.0, 20_000.0, 6, 0, 0));
        for i in 1..=3 {
            p.sample(&sig(4.0 + i as f64 * 0.1, 20_000.0, 6, i * 100, i * 10));
        }
        assert!(p.hold_off(&sig(7.0, 20_000.0, 7, 0, 0)).is_some());
        assert!(p.hold_off(&sig(8.4, 20_000.0, 7, 0, 0)).is_none());
    }

    #[test]
    fn a_pause_that_brings_the_latency_back_resets_the_cool_down() {
        let mut p = probe();
        p.start(&sig(0.0, 20_000.0, 1, 0, 0));
        for i in 1..=3 {
            p.sample(&sig(i as f64 * 0.1, 20_000.0, 1, i * 100, i * 10));
        }
        assert_eq!(p.cooldown, BASE_COOLDOWN * 2);
        // Counted across a segment boundary: 2 slow of 1,000 + 0 of 500.
        p.start(&sig(5.0, 80_000.0, 2, 9_000, 300));
        assert_eq!(
            p.sample(&sig(5.1, 80_000.0, 2, 10_000, 302)),
            Verdict::Pending
        );
        assert_eq!(p.sample(&sig(5.2, 80_000.0, 3, 200, 0)), Verdict::Pending);
        assert_eq!(p.sample(&sig(5.3, 80_000.0, 3, 500, 0)), Verdict::Helped);
        assert_eq!(p.cooldown, BASE_COOLDOWN);
        // Nothing open: samples say nothing.
        assert_eq!(p.sample(&sig(5.4, 80_000.0, 3, 600, 0)), Verdict::Pending);
    }

    #[test]
    fn without_segment_counts_the_samples_over_the_slo_decide() {
        let mut p = PauseProbe::new(DEFAULT_SLACK, 4);
        let at = |t: f64, p95: f64| Signal {
            t: Duration::from_secs_f64(t),
            qps: Some(10_000.0),
            p95_us: Some(p95),
            ..Signal::default()
        };
        p.start(&at(0.0, 3_000.0));
        for (i, p95) in [2_000.0, 900.0, 1_500.0].into_iter().enumerate() {
            assert_eq!(p.sample(&at(0.1 * (i + 1) as f64, p95)), Verdict::Pending);
        }
        assert!(matches!(
            p.sample(&at(0.4, 1_200.0)),
            Verdict::Useless(w) if w.contains("3 of the pause's first 4")
        ));
    }
}
