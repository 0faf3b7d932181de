//! Queueing models fed with measured inputs, whose predictions are set beside the
//! measurements (see [`crate::compare`]).
//!
//! Units: λ in requests per second, service times and demands in seconds; any
//! consistent units work. Formulas follow Jain ch. 31 and 34 (and Lazowska et al.,
//! *Quantitative System Performance*, ch. 5–6).
//!
//! **M/M/1** (Poisson arrivals λ, exponential service S = 1/μ, one server):
//! ρ = λS; mean number in system N = ρ/(1−ρ); mean in queue N_q = ρ²/(1−ρ);
//! mean response time R = S/(1−ρ); mean wait W = ρS/(1−ρ). The response time is
//! exponential with rate μ − λ, so its p-quantile is R · ln(1/(1−p)).
//!
//! **M/M/m** (m servers): offered load a = λS (Erlangs), ρ = a/m;
//! Erlang C C(m, a) = P(an arrival waits) = [aᵐ/m! · 1/(1−ρ)] / [Σ_{k<m} aᵏ/k! + aᵐ/m! · 1/(1−ρ)];
//! W = C·S / (m(1−ρ)); R = W + S; N_q = λW; N = λR; P(wait > t) = C·e^{−(mμ−λ)t}.
//! C is computed from the Erlang B recursion B(0) = 1, B(k) = a·B(k−1)/(k + a·B(k−1))
//! and C = B / (1 − ρ(1 − B)): no factorials or powers, stable for m in the thousands.
//!
//! **Closed network, exact MVA** (N customers; K centers with demands D_k = V_k·S_k;
//! think time Z at a delay "terminal" center). With Q_k(0) = 0, for n = 1 … N:
//! R_k(n) = D_k · (1 + Q_k(n−1)) at a queueing center, R_k(n) = D_k at a delay center;
//! R(n) = Σ R_k(n); X(n) = n / (R(n) + Z); Q_k(n) = X(n) · R_k(n); U_k(n) = X(n) · D_k.
//!
//! **Asymptotic bounds** (D = Σ D_k, D_max = max over queueing centers):
//! N/(N·D + Z) ≤ X(N) ≤ min(N/(D + Z), 1/D_max);
//! max(D, N·D_max − Z) ≤ R(N) ≤ N·D; the bounds cross at N* = (D + Z)/D_max.

use serde::{Deserialize, Serialize};

use crate::error::{non_negative, positive, AnalysisError, Result};

/// M/M/1 results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MM1 {
    /// Arrival rate λ (req/s).
    pub arrival_rate: f64,
    /// Mean service time S = 1/μ (s).
    pub service_time: f64,
    /// Utilization ρ = λS.
    pub utilization: f64,
    /// Mean number in the system N = ρ/(1−ρ).
    pub mean_number: f64,
    /// Mean number waiting N_q = ρ²/(1−ρ).
    pub mean_queue_length: f64,
    /// Mean response time R = S/(1−ρ) (s).
    pub response_time: f64,
    /// Mean waiting time W = ρS/(1−ρ) (s).
    pub waiting_time: f64,
}

/// Solves an M/M/1 queue with arrival rate `arrival_rate` (req/s) and mean service time
/// `service_time` (s). Error [`AnalysisError::Unstable`] when ρ ≥ 1.
pub fn mm1(arrival_rate: f64, service_time: f64) -> Result<MM1> {
    non_negative("arrival rate λ", arrival_rate)?;
    positive("service time S", service_time)?;
    let rho = arrival_rate * service_time;
    if rho >= 1.0 {
        return Err(AnalysisError::Unstable { utilization: rho });
    }
    Ok(MM1 {
        arrival_rate,
        service_time,
        utilization: rho,
        mean_number: rho / (1.0 - rho),
        mean_queue_length: rho * rho / (1.0 - rho),
        response_time: service_time / (1.0 - rho),
        waiting_time: rho * service_time / (1.0 - rho),
    })
}

impl MM1 {
    /// The p-quantile (0 ≤ p < 1) of the response time (s): R · ln(1/(1−p)), since the
    /// response time is exponential with mean R. E.g. p = 0.99 → 4.6·R.
    pub fn response_time_quantile(&self, p: f64) -> Result<f64> {
        check_probability(p)?;
        Ok(-self.response_time * (1.0 - p).ln())
    }
}

/// M/M/m results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MMm {
    /// Number of servers m.
    pub servers: u32,
    /// Arrival rate λ (req/s).
    pub arrival_rate: f64,
    /// Mean service time S = 1/μ (s).
    pub service_time: f64,
    /// Offered load a = λS (Erlangs).
    pub offered_load: f64,
    /// Utilization of each server ρ = a/m.
    pub utilization: f64,
    /// Erlang C: probability that an arrival has to wait, C(m, a).
    pub prob_queueing: f64,
    /// Mean waiting time W = C·S/(m(1−ρ)) (s).
    pub waiting_time: f64,
    /// Mean response time R = W + S (s).
    pub response_time: f64,
    /// Mean number waiting N_q = λW.
    pub mean_queue_length: f64,
    /// Mean number in the system N = λR.
    pub mean_number: f64,
}

/// Solves an M/M/m queue with `servers` servers. Error [`AnalysisError::Unstable`] when
/// ρ = λS/m ≥ 1.
pub fn mmm(arrival_rate: f64, service_time: f64, servers: u32) -> Result<MMm> {
    non_negative("arrival rate λ", arrival_rate)?;
    positive("service time S", service_time)?;
    let a = arrival_rate * service_time;
    let c = erlang_c(servers, a)?;
    let m = f64::from(servers);
    let rho = a / m;
    let w = c * service_time / (m * (1.0 - rho));
    let r = w + service_time;
    Ok(MMm {
        servers,
        arrival_rate,
        service_time,
        offered_load: a,
        utilization: rho,
        prob_queueing: c,
        waiting_time: w,
        response_time: r,
        mean_queue_length: arrival_rate * w,
        mean_number: arrival_rate * r,
    })
}

impl MMm {
    /// The p-quantile (0 ≤ p < 1) of the waiting time (s), from
    /// P(W > t) = C·e^{−(mμ−λ)t}: 0 when p ≤ 1 − C, else ln(C/(1−p)) / (mμ − λ).
    pub fn waiting_time_quantile(&self, p: f64) -> Result<f64> {
        check_probability(p)?;
        if p <= 1.0 - self.prob_queueing {
            return Ok(0.0);
        }
        let rate = f64::from(self.servers) / self.service_time - self.arrival_rate;
        Ok((self.prob_queueing / (1.0 - p)).ln() / rate)
    }
}

/// Erlang B: probability that all `m` servers are busy in a loss system with offered
/// load `a` Erlangs, by the stable recursion B(k) = a·B(k−1)/(k + a·B(k−1)), B(0) = 1.
pub fn erlang_b(m: u32, a: f64) -> Result<f64> {
    non_negative("offered load a", a)?;
    let mut b = 1.0;
    for k in 1..=m {
        b = a * b / (f64::from(k) + a * b);
    }
    Ok(b)
}

/// Erlang C: probability that an arrival waits in an M/M/m queue with offered load `a`
/// = λS Erlangs, C = B / (1 − ρ(1 − B)) with ρ = a/m. Error when m = 0 or ρ ≥ 1.
/// For m = 1 it reduces to ρ.
pub fn erlang_c(m: u32, a: f64) -> Result<f64> {
    if m == 0 {
        return Err(AnalysisError::InvalidArgument {
            what: "number of servers m",
            value: 0.0,
            expected: "at least 1",
        });
    }
    let b = erlang_b(m, a)?;
    let rho = a / f64::from(m);
    if rho >= 1.0 {
        return Err(AnalysisError::Unstable { utilization: rho });
    }
    Ok(b / (1.0 - rho * (1.0 - b)))
}

/// Whether a center of a closed network queues or only delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CenterKind {
    /// A load-independent queueing center (one server, FCFS/PS): requests queue.
    Queueing,
    /// A delay (infinite-server) center, e.g. a fixed network latency: no queueing.
    Delay,
}

/// One center of a closed network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Center {
    /// Name for the report, e.g. `"server CPU"`.
    pub name: String,
    /// Service demand D_k = V_k · S_k (s per request, all visits together).
    pub demand: f64,
    /// Queueing or delay.
    pub kind: CenterKind,
}

impl Center {
    /// A queueing center with demand `demand` (s).
    pub fn queueing(name: impl Into<String>, demand: f64) -> Self {
        Center {
            name: name.into(),
            demand,
            kind: CenterKind::Queueing,
        }
    }

    /// A delay center with demand `demand` (s).
    pub fn delay(name: impl Into<String>, demand: f64) -> Self {
        Center {
            name: name.into(),
            demand,
            kind: CenterKind::Delay,
        }
    }
}

/// MVA's solution at one population N.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MvaPoint {
    /// Population N (customers, e.g. closed-loop clients).
    pub population: u32,
    /// System throughput X(N) (req/s).
    pub throughput: f64,
    /// Response time R(N) = Σ R_k(N), excluding the think time (s).
    pub response_time: f64,
    /// Residence time R_k(N) at each center (s), in the order of the centers.
    pub residence_times: Vec<f64>,
    /// Mean number Q_k(N) at each center.
    pub queue_lengths: Vec<f64>,
    /// Utilization U_k(N) = X(N)·D_k of each center.
    pub utilizations: Vec<f64>,
}

/// Exact MVA for a closed network of queueing centers with demands `demands` (s) and
/// think time `think_time` (s), for N = 1 … `max_population`.
pub fn mva(demands: &[f64], think_time: f64, max_population: u32) -> Result<Vec<MvaPoint>> {
    let centers: Vec<Center> = demands
        .iter()
        .enumerate()
        .map(|(k, &d)| Center::queueing(format!("center {}", k + 1), d))
        .collect();
    mva_centers(&centers, think_time, max_population)
}

/// Exact MVA with queueing and delay centers; see the module documentation.
pub fn mva_centers(
    centers: &[Center],
    think_time: f64,
    max_population: u32,
) -> Result<Vec<MvaPoint>> {
    check_network(centers, think_time)?;
    if max_population == 0 {
        return Err(AnalysisError::TooFew {
            what: "population",
            needed: 1,
            got: 0,
        });
    }
    let mut q = vec![0.0; centers.len()];
    let mut out = Vec::with_capacity(max_population as usize);
    for n in 1..=max_population {
        let residence: Vec<f64> = centers
            .iter()
            .zip(&q)
            .map(|(c, &qk)| match c.kind {
                CenterKind::Queueing => c.demand * (1.0 + qk),
                CenterKind::Delay => c.demand,
            })
            .collect();
        let r: f64 = residence.iter().sum();
        // r + Z > 0: check_network demands a positive total.
        let x = f64::from(n) / (r + think_time);
        q = residence.iter().map(|rk| x * rk).collect();
        out.push(MvaPoint {
            population: n,
            throughput: x,
            response_time: r,
            residence_times: residence,
            queue_lengths: q.clone(),
            utilizations: centers.iter().map(|c| x * c.demand).collect(),
        });
    }
    Ok(out)
}

/// Asymptotic (balanced-job-free) bounds of a closed network at population N.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bounds {
    /// Population N.
    pub population: f64,
    /// N/(N·D + Z) (req/s).
    pub throughput_lower: f64,
    /// min(N/(D + Z), 1/D_max) (req/s).
    pub throughput_upper: f64,
    /// max(D, N·D_max − Z) (s).
    pub response_time_lower: f64,
    /// N·D (s).
    pub response_time_upper: f64,
    /// N* = (D + Z)/D_max, where the two upper throughput bounds cross (customers).
    pub knee_population: f64,
}

/// The asymptotic bounds for queueing-center demands `demands` (s), think time
/// `think_time` (s) and population `population`.
pub fn asymptotic_bounds(demands: &[f64], think_time: f64, population: f64) -> Result<Bounds> {
    let centers: Vec<Center> = demands.iter().map(|&d| Center::queueing("", d)).collect();
    asymptotic_bounds_centers(&centers, think_time, population)
}

/// The asymptotic bounds with queueing and delay centers: a delay center adds to D but
/// not to D_max (it never saturates).
pub fn asymptotic_bounds_centers(
    centers: &[Center],
    think_time: f64,
    population: f64,
) -> Result<Bounds> {
    check_network(centers, think_time)?;
    let n = positive("population N", population)?;
    let d: f64 = centers.iter().map(|c| c.demand).sum();
    let d_max = centers
        .iter()
        .filter(|c| c.kind == CenterKind::Queueing)
        .map(|c| c.demand)
        .fold(0.0, f64::max);
    let (x_upper, r_lower, knee) = if d_max > 0.0 {
        (
            (n / (d + think_time)).min(1.0 / d_max),
            d.max(n * d_max - think_time),
            (d + think_time) / d_max,
        )
    } else {
        // Only delay centers: nothing saturates.
        (n / (d + think_time), d, f64::INFINITY)
    };
    Ok(Bounds {
        population: n,
        throughput_lower: n / (n * d + think_time),
        throughput_upper: x_upper,
        response_time_lower: r_lower,
        response_time_upper: n * d,
        knee_population: knee,
    })
}

fn check_network(centers: &[Center], think_time: f64) -> Result<()> {
    if centers.is_empty() {
        return Err(AnalysisError::TooFew {
            what: "centers",
            needed: 1,
            got: 0,
        });
    }
    for c in centers {
        non_negative("service demand D_k", c.demand)?;
    }
    non_negative("think time Z", think_time)?;
    let total: f64 = centers.iter().map(|c| c.demand).sum::<f64>() + think_time;
    if total <= 0.0 {
        return Err(AnalysisError::InvalidArgument {
            what: "total demand plus think time",
            value: total,
            expected: "a number > 0",
        });
    }
    Ok(())
}

fn check_probability(p: f64) -> Result<()> {
    if (0.0..1.0).contains(&p) {
        Ok(())
    } else {
        Err(AnalysisError::InvalidArgument {
            what: "probability p",
            value: p,
            expected: "a number in [0, 1)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn mm1_by_hand() {
        // λ = 80/s, S = 10 ms: ρ = 0.8; R = 0.01/0.2 = 50 ms; N = 0.8/0.2 = 4;
        // W = 0.8·0.01/0.2 = 40 ms; N_q = 0.64/0.2 = 3.2; Little: N = λR = 80·0.05 = 4.
        let q = mm1(80.0, 0.010).unwrap();
        assert!(close(q.utilization, 0.8, 1e-12));
        assert!(close(q.response_time, 0.050, 1e-12));
        assert!(close(q.mean_number, 4.0, 1e-12));
        assert!(close(q.waiting_time, 0.040, 1e-12));
        assert!(close(q.mean_queue_length, 3.2, 1e-12));
        assert!(close(
            q.arrival_rate * q.response_time,
            q.mean_number,
            1e-12
        ));
        // 90th percentile: 0.05 · ln 10 = 0.115129 s.
        assert!(close(
            q.response_time_quantile(0.9).unwrap(),
            0.115129,
            1e-6
        ));
        assert_eq!(q.response_time_quantile(0.0).unwrap(), 0.0);
    }

    #[test]
    fn unstable_queues_are_errors() {
        assert!(matches!(
            mm1(100.0, 0.010),
            Err(AnalysisError::Unstable { .. })
        ));
        assert!(matches!(
            mmm(2.0, 1.0, 2),
            Err(AnalysisError::Unstable { .. })
        ));
        assert!(mmm(1.0, 1.0, 0).is_err());
    }

    #[test]
    fn mmm_by_hand() {
        // m = 2, λ = 1.5/s, μ = 1/s: a = 1.5, ρ = 0.75.
        // Direct: Σ_{k<2} aᵏ/k! = 1 + 1.5 = 2.5; a²/2! = 1.125; /(1−ρ) → 4.5;
        //   C = 4.5 / (2.5 + 4.5) = 9/14 = 0.642857.
        // Recursion: B(1) = 1.5/2.5 = 0.6; B(2) = 0.9/2.9 = 0.310345;
        //   C = 0.310345 / (1 − 0.75·0.689655) = 0.642857.
        // W = C·S/(m(1−ρ)) = 0.642857/0.5 = 1.285714 s; R = 2.285714 s;
        // N_q = λW = 1.928571; N = λR = 3.428571.
        let q = mmm(1.5, 1.0, 2).unwrap();
        assert!(close(q.prob_queueing, 9.0 / 14.0, 1e-12));
        assert!(close(q.waiting_time, 9.0 / 7.0, 1e-12));
        assert!(close(q.response_time, 16.0 / 7.0, 1e-12));
        assert!(close(q.mean_queue_length, 1.5 * 9.0 / 7.0, 1e-12));
        assert!(close(q.mean_number, 1.5 * 16.0 / 7.0, 1e-12));
        assert!(close(erlang_b(2, 1.5).unwrap(), 0.9 / 2.9, 1e-12));
        // Waiting-time quantiles: P(W > t) = C e^{-(2 − 1.5)t}.
        assert_eq!(q.waiting_time_quantile(0.3).unwrap(), 0.0); // 0.3 ≤ 1 − C = 0.357
        let t = q.waiting_time_quantile(0.9).unwrap();
        assert!(close(t, (q.prob_queueing / 0.1).ln() / 0.5, 1e-12));
        assert!(close(q.prob_queueing * (-0.5 * t).exp(), 0.1, 1e-12));
    }

    #[test]
    fn erlang_c_for_one_server_is_rho_and_mmm_matches_mm1() {
        for rho in [0.0, 0.1, 0.5, 0.8, 0.99] {
            assert!(close(erlang_c(1, rho).unwrap(), rho, 1e-12));
        }
        let a = mm1(80.0, 0.01).unwrap();
        let b = mmm(80.0, 0.01, 1).unwrap();
        assert!(close(a.response_time, b.response_time, 1e-12));
        assert!(close(a.mean_number, b.mean_number, 1e-12));
    }

    #[test]
    fn erlang_c_is_stable_for_many_servers() {
        // m = 128, ρ = 0.9: the direct formula needs a¹²⁸/128! (≈ 10⁻¹³ relative to
        // e^a); the recursion stays in [0, 1]. Compare against the direct sum done in
        // log space.
        let m = 128u32;
        let a = 0.9 * f64::from(m);
        let c = erlang_c(m, a).unwrap();
        let ln_term =
            |k: u32| f64::from(k) * a.ln() - (1..=k).map(|i| f64::from(i).ln()).sum::<f64>();
        let top = (ln_term(m) - (1.0f64 - 0.9).ln()).exp();
        let sum: f64 = (0..m).map(|k| ln_term(k).exp()).sum();
        let direct = top / (sum + top);
        assert!(c > 0.0 && c < 1.0);
        assert!(close(c, direct, 1e-9), "{c} vs {direct}");
        // More servers at the same ρ: less queueing.
        assert!(erlang_c(1024, 0.9 * 1024.0).unwrap() < c);
    }

    #[test]
    fn mva_by_hand() {
        // D = (0.2, 0.1) s, Z = 1 s.
        // N=1: R1 = 0.2, R2 = 0.1, R = 0.3, X = 1/1.3 = 0.769231,
        //      Q1 = 0.153846, Q2 = 0.076923.
        // N=2: R1 = 0.2·1.153846 = 0.230769, R2 = 0.1·1.076923 = 0.107692,
        //      R = 0.338462, X = 2/1.338462 = 1.494253,
        //      Q1 = 0.344828, Q2 = 0.160920.
        // N=3: R1 = 0.2·1.344828 = 0.268966, R2 = 0.1·1.160920 = 0.116092,
        //      R = 0.385057, X = 3/1.385057 = 2.165975,
        //      Q1 = 0.582573, Q2 = 0.251452.
        let pts = mva(&[0.2, 0.1], 1.0, 3).unwrap();
        let want = [
            (0.769231, 0.3, [0.153846, 0.076923]),
            (1.494253, 0.338462, [0.344828, 0.160920]),
            (2.165975, 0.385057, [0.582573, 0.251452]),
        ];
        for (p, (x, r, q)) in pts.iter().zip(want) {
            assert!(close(p.throughput, x, 1e-6), "{p:?}");
            assert!(close(p.response_time, r, 1e-6), "{p:?}");
            assert!(close(p.queue_lengths[0], q[0], 1e-6), "{p:?}");
            assert!(close(p.queue_lengths[1], q[1], 1e-6), "{p:?}");
            // Little's law on the whole loop: N = X (R + Z).
            let n = f64::from(p.population);
            assert!(close(p.throughput * (p.response_time + 1.0), n, 1e-12));
        }
        assert!(close(pts[2].utilizations[0], 2.165975 * 0.2, 1e-6));
    }

    #[test]
    fn mva_respects_and_approaches_the_bounds() {
        let d = [0.2, 0.1];
        let pts = mva(&d, 1.0, 200).unwrap();
        for p in &pts {
            let b = asymptotic_bounds(&d, 1.0, f64::from(p.population)).unwrap();
            assert!(p.throughput <= b.throughput_upper + 1e-12, "{p:?} {b:?}");
            assert!(p.throughput >= b.throughput_lower - 1e-12, "{p:?} {b:?}");
            assert!(
                p.response_time >= b.response_time_lower - 1e-12,
                "{p:?} {b:?}"
            );
            assert!(
                p.response_time <= b.response_time_upper + 1e-12,
                "{p:?} {b:?}"
            );
        }
        let b = asymptotic_bounds(&d, 1.0, 200.0).unwrap();
        assert!(close(b.knee_population, 6.5, 1e-12));
        assert!(close(b.throughput_upper, 5.0, 1e-12));
        assert!(close(b.response_time_lower, 39.0, 1e-12));
        // Far past N* the bottleneck saturates: X → 1/D_max, R → N·D_max − Z.
        let last = &pts[199];
        assert!(close(last.throughput, 5.0, 1e-6), "{last:?}");
        assert!(close(last.response_time, 39.0, 1e-4), "{last:?}");
        assert!(close(last.utilizations[0], 1.0, 1e-6));
    }

    #[test]
    fn delay_centers_do_not_queue() {
        // One queueing center D = 0.1 plus a 0.05 s network delay, Z = 0.
        // N=1: R = 0.15, X = 6.6667; Q1 = 0.6667.
        // N=2: R1 = 0.1·1.6667 = 0.16667, R = 0.21667, X = 9.2308.
        let c = [Center::queueing("cpu", 0.1), Center::delay("net", 0.05)];
        let pts = mva_centers(&c, 0.0, 2).unwrap();
        assert!(close(pts[0].throughput, 1.0 / 0.15, 1e-9));
        assert!(close(pts[1].residence_times[1], 0.05, 1e-12));
        assert!(close(
            pts[1].throughput,
            2.0 / (0.1 * (1.0 + 0.1 / 0.15) + 0.05),
            1e-9
        ));
        let b = asymptotic_bounds_centers(&c, 0.0, 100.0).unwrap();
        assert!(close(b.throughput_upper, 10.0, 1e-12));
        assert!(close(b.knee_population, 1.5, 1e-12));
    }

    #[test]
    fn mva_rejects_bad_input() {
        assert!(mva(&[], 1.0, 3).is_err());
        assert!(mva(&[0.1], 1.0, 0).is_err());
        assert!(mva(&[-0.1], 1.0, 3).is_err());
        assert!(mva(&[0.0], 0.0, 3).is_err());
        assert!(asymptotic_bounds(&[0.1], 1.0, 0.0).is_err());
    }
}
