//! Invariants of the models over random inputs.

use kvlab_analysis::{factorial, laws, queueing, summary};
use proptest::prelude::*;

proptest! {
    /// Exact MVA always lies within the asymptotic bounds and obeys Little's law on the
    /// whole loop, N = X·(R + Z).
    #[test]
    fn mva_within_bounds(
        demands in prop::collection::vec(0.0f64..1.0, 1..6),
        z in 0.0f64..5.0,
        n_max in 1u32..60,
    ) {
        prop_assume!(demands.iter().sum::<f64>() > 1e-6);
        let pts = queueing::mva(&demands, z, n_max).unwrap();
        for p in &pts {
            let n = f64::from(p.population);
            let b = queueing::asymptotic_bounds(&demands, z, n).unwrap();
            let eps = 1e-9 * (1.0 + b.throughput_upper);
            prop_assert!(p.throughput <= b.throughput_upper + eps);
            prop_assert!(p.throughput >= b.throughput_lower - eps);
            prop_assert!(p.response_time >= b.response_time_lower - 1e-9 * (1.0 + p.response_time));
            prop_assert!(p.response_time <= b.response_time_upper + 1e-9 * (1.0 + p.response_time));
            prop_assert!((p.throughput * (p.response_time + z) - n).abs() <= 1e-9 * n);
            let q: f64 = p.queue_lengths.iter().sum();
            prop_assert!((q - p.throughput * p.response_time).abs() <= 1e-9 * (1.0 + q));
        }
    }

    /// Erlang C is a probability, is at least Erlang B, and M/M/m obeys Little's law.
    #[test]
    fn erlang_c_is_a_probability(m in 1u32..200, rho in 0.0f64..0.999) {
        let a = rho * f64::from(m);
        let c = queueing::erlang_c(m, a).unwrap();
        let b = queueing::erlang_b(m, a).unwrap();
        prop_assert!((0.0..=1.0).contains(&c));
        prop_assert!(c >= b - 1e-15);
        let q = queueing::mmm(a, 1.0, m).unwrap();
        prop_assert!((q.mean_number - q.arrival_rate * q.response_time).abs() <= 1e-9 * (1.0 + q.mean_number));
    }

    /// The allocation of variation adds up to 100 % and the model fits the run means.
    #[test]
    fn factorial_variation_adds_up(
        k in 1usize..5,
        r in 1usize..4,
        seed in prop::collection::vec(-100.0f64..100.0, 64),
    ) {
        let n = 1usize << k;
        let runs: Vec<Vec<f64>> = (0..n)
            .map(|i| (0..r).map(|j| seed[(i * r + j) % seed.len()] + i as f64).collect())
            .collect();
        let a = factorial::analyze(&["A", "B", "C", "D"][..k], &runs, 0.9).unwrap();
        let total: f64 = a.effects.iter().filter_map(|e| e.percent_variation).sum::<f64>()
            + a.error_percent_variation.unwrap_or(0.0);
        if a.ss_total > 1e-9 {
            prop_assert!((total - 100.0).abs() < 1e-6, "{total}");
        }
        for (i, m) in a.run_means.iter().enumerate() {
            let y = a.predict(&factorial::run_levels(k, i)).unwrap();
            prop_assert!((y - m).abs() < 1e-9 * (1.0 + m.abs()));
        }
    }

    /// The confidence interval contains the mean and widens with the confidence level.
    #[test]
    fn ci_contains_mean(xs in prop::collection::vec(-1e6f64..1e6, 2..30)) {
        let s90 = summary::summarize(&xs, 0.90).unwrap();
        let s99 = summary::summarize(&xs, 0.99).unwrap();
        let (lo, hi) = s90.ci().unwrap();
        prop_assert!(lo <= s90.mean && s90.mean <= hi);
        prop_assert!(s99.ci_half_width.unwrap() >= s90.ci_half_width.unwrap());
    }

    /// The /proc parser never panics.
    #[test]
    fn proc_parser_never_panics(line in ".{0,200}") {
        let _ = laws::parse_proc_stat(&line);
    }
}
