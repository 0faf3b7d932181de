//! When requests are planned: open-loop arrival processes and rate plans.
//!
//! A [`RatePlan`] is the total request rate over time, as segments (a fixed `--qps`, the steps
//! of a `--scan`, a random trace redrawn every interval, or an explicit list). Each
//! connection owns an [`Arrivals`] schedule: it draws the gap to its next planned send time
//! from the rate in force (`total rate / all connections` of all agents), exponential for
//! Poisson arrivals or constant for fixed ones. The first planned time is drawn at a random
//! phase so connections never send together. A request is timed from its planned time,
//! whenever it actually goes out.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp1};
use serde::{Deserialize, Serialize};

use crate::BenchError;

/// Inter-arrival distribution of open-loop requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Exponential gaps (a Poisson process).
    #[default]
    Poisson,
    /// Constant gaps.
    Fixed,
}

/// One stretch of constant total rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Length in nanoseconds.
    pub duration_ns: u64,
    /// Total target rate, requests per second (all connections of all agents).
    pub qps: f64,
}

/// The total target rate over time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RatePlan {
    /// Consecutive segments.
    pub segments: Vec<Segment>,
}

const NS: f64 = 1e9;

fn secs_to_ns(s: f64) -> Result<u64, BenchError> {
    if !(s > 0.0 && s.is_finite()) {
        return Err(BenchError::Spec(format!("duration {s} s must be > 0")));
    }
    Ok((s * NS) as u64)
}

impl RatePlan {
    /// One segment of `qps` for `duration_s`.
    pub fn fixed(qps: f64, duration_s: f64) -> Result<Self, BenchError> {
        Self::from_rates(&[qps], duration_s)
    }

    /// `--scan MIN:MAX:STEP`: MIN, MIN+STEP, … up to MAX, each for `step_s`.
    pub fn scan(min: f64, max: f64, step: f64, step_s: f64) -> Result<Self, BenchError> {
        if !(min > 0.0 && max >= min && step > 0.0) {
            return Err(BenchError::Spec(format!("bad scan {min}:{max}:{step}")));
        }
        let n = ((max - min) / step + 1e-9).floor() as usize + 1;
        if n > 10_000 {
            return Err(BenchError::Spec(format!(
                "scan {min}:{max}:{step} has {n} steps"
            )));
        }
        let rates: Vec<f64> = (0..n).map(|i| min + step * i as f64).collect();
        Self::from_rates(&rates, step_s)
    }

    /// A random trace: every `interval_s` a new total rate drawn uniformly from
    /// `[min, max]`, for `duration_s` in all; the same seed gives the same trace.
    pub fn random(
        interval_s: f64,
        min: f64,
        max: f64,
        seed: u64,
        duration_s: f64,
    ) -> Result<Self, BenchError> {
        if !(min >= 0.0 && max >= min) {
            return Err(BenchError::Spec(format!("bad rate range {min}..{max}")));
        }
        let n = (duration_s / interval_s).ceil().max(1.0) as usize;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let rates: Vec<f64> = (0..n).map(|_| rng.gen_range(min..=max)).collect();
        let mut plan = Self::from_rates(&rates, interval_s)?;
        // The last segment ends at duration_s exactly.
        let total = secs_to_ns(duration_s)?;
        let before: u64 = plan.segments[..n - 1].iter().map(|s| s.duration_ns).sum();
        if let Some(last) = plan.segments.last_mut() {
            last.duration_ns = total.saturating_sub(before).max(1);
        }
        Ok(plan)
    }

    /// Each rate for `each_s` seconds.
    pub fn from_rates(rates: &[f64], each_s: f64) -> Result<Self, BenchError> {
        let d = secs_to_ns(each_s)?;
        if rates.is_empty() {
            return Err(BenchError::Spec("empty rate list".into()));
        }
        if let Some(r) = rates.iter().find(|r| !(**r >= 0.0 && r.is_finite())) {
            return Err(BenchError::Spec(format!("bad rate {r}")));
        }
        Ok(RatePlan {
            segments: rates
                .iter()
                .map(|&qps| Segment {
                    duration_ns: d,
                    qps,
                })
                .collect(),
        })
    }

    /// Parses a rate file: one segment per line, `RATE` (lasting `default_s`) or
    /// `SECONDS RATE`; `#` starts a comment.
    pub fn parse_file(text: &str, default_s: f64) -> Result<Self, BenchError> {
        let mut segments = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = || BenchError::Spec(format!("rate file line {}: {line:?}", i + 1));
            let nums: Vec<f64> = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| bad())?;
            let (secs, qps) = match nums.as_slice() {
                [q] => (default_s, *q),
                [s, q] => (*s, *q),
                _ => return Err(bad()),
            };
            if !(qps >= 0.0 && qps.is_finite()) {
                return Err(bad());
            }
            segments.push(Segment {
                duration_ns: secs_to_ns(secs).map_err(|_| bad())?,
                qps,
            });
        }
        if segments.is_empty() {
            return Err(BenchError::Spec("rate file has no rates".into()));
        }
        Ok(RatePlan { segments })
    }

    /// Total length in nanoseconds.
    pub fn duration_ns(&self) -> u64 {
        self.segments.iter().map(|s| s.duration_ns).sum()
    }

    /// The segment in force at `t_ns` after the start of the measured part, and its start;
    /// past the end, the last segment.
    pub fn at(&self, t_ns: u64) -> (usize, u64) {
        let mut start = 0;
        for (i, s) in self.segments.iter().enumerate() {
            if t_ns < start + s.duration_ns {
                return (i, start);
            }
            start += s.duration_ns;
        }
        let last = self.segments.len() - 1;
        (last, start - self.segments[last].duration_ns)
    }
}

/// One connection's planned send times.
pub struct Arrivals {
    arrival: Arrival,
    rng: ChaCha8Rng,
    next_ns: u64,
}

impl Arrivals {
    /// A schedule whose first planned time is at a random phase after `start_ns`, for a
    /// per-connection rate `rate` (requests/s).
    pub fn new(arrival: Arrival, seed: u64, start_ns: u64, rate: f64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let phase = if rate > 0.0 {
            match arrival {
                // Memoryless: the first gap is an ordinary exponential gap.
                Arrival::Poisson => Distribution::<f64>::sample(&Exp1, &mut rng) * NS / rate,
                Arrival::Fixed => rng.gen::<f64>() * NS / rate,
            }
        } else {
            0.0
        };
        Arrivals {
            arrival,
            rng,
            next_ns: start_ns + phase as u64,
        }
    }

    /// The next planned send time.
    pub fn next_ns(&self) -> u64 {
        self.next_ns
    }

    /// The gap to draw at per-connection `rate` (requests/s), in nanoseconds (fractional).
    pub fn gap_ns(&mut self, rate: f64) -> f64 {
        match self.arrival {
            Arrival::Poisson => {
                let e: f64 = Exp1.sample(&mut self.rng);
                e * NS / rate
            }
            Arrival::Fixed => NS / rate,
        }
    }

    /// Moves to the following planned time at `rate`; a zero rate skips to `not_before`.
    pub fn advance(&mut self, rate: f64, not_before: u64) -> u64 {
        if rate > 0.0 {
            // At least 1 ns so time always moves forward.
            self.next_ns += (self.gap_ns(rate) as u64).max(1);
        } else {
            self.next_ns = self.next_ns.max(not_before);
        }
        self.next_ns
    }

    /// Restarts at `t` (used when a zero-rate segment ends).
    pub fn reset_to(&mut self, t: u64, rate: f64) {
        self.next_ns = t;
        if rate > 0.0 {
            self.next_ns += (self.gap_ns(rate) as u64).max(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_has_one_segment_per_step() {
        let p = RatePlan::scan(1000.0, 3000.0, 1000.0, 2.0).unwrap();
        let r: Vec<f64> = p.segments.iter().map(|s| s.qps).collect();
        assert_eq!(r, [1000.0, 2000.0, 3000.0]);
        assert_eq!(p.duration_ns(), 6_000_000_000);
        assert_eq!(p.at(0), (0, 0));
        assert_eq!(p.at(2_000_000_000), (1, 2_000_000_000));
        assert_eq!(p.at(99_000_000_000), (2, 4_000_000_000));
        assert!(RatePlan::scan(3.0, 1.0, 1.0, 1.0).is_err());
    }

    #[test]
    fn rate_file_parses() {
        let p = RatePlan::parse_file("# trace\n1000\n2.5 3000 # burst\n\n", 1.0).unwrap();
        assert_eq!(p.segments.len(), 2);
        assert_eq!(
            p.segments[1],
            Segment {
                duration_ns: 2_500_000_000,
                qps: 3000.0
            }
        );
        assert!(RatePlan::parse_file("1 2 3", 1.0).is_err());
        assert!(RatePlan::parse_file("", 1.0).is_err());
    }
}
