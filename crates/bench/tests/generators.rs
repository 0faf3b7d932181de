//! The generators against their definitions, with fixed seeds: key choice (chi-square), key
//! and value sizes (KS on the continuous draw, chi-square on the sizes actually composed),
//! Poisson and fixed arrivals (mean, coefficient of variation, KS), random phases, and the
//! reproducibility of seeded rate traces. Each statistic is also shown to reject a wrong
//! distribution, so the bounds are not vacuous.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use kvlab_bench::dist::{
    etc_key_size, etc_value_size, key_probability, mix64, KeyChooser, KeyDist, SizeDist,
};
use kvlab_bench::schedule::{Arrival, Arrivals, RatePlan};
use kvlab_bench::stats::{ks_critical_001, ks_statistic};
use kvlab_bench::workload::Workload;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Pearson's chi-square of observed counts against expected counts, pooling neighbouring
/// cells until each expects at least 20. Returns (statistic, degrees of freedom).
fn chi_square(observed: &[u64], expected: &[f64]) -> (f64, usize) {
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut o, mut e) = (0.0, 0.0);
    for (ob, ex) in observed.iter().zip(expected) {
        o += *ob as f64;
        e += ex;
        if e >= 20.0 {
            stat += (o - e) * (o - e) / e;
            cells += 1;
            o = 0.0;
            e = 0.0;
        }
    }
    if e > 0.0 {
        stat += (o - e) * (o - e) / e.max(1e-9);
        cells += 1;
    }
    (stat, cells.saturating_sub(1))
}

/// A bound the statistic exceeds with probability far below 0.1 % under the hypothesis:
/// df + 5·√(2·df) (the chi-square is ≈ normal with mean df, variance 2·df for large df).
fn chi_bound(df: usize) -> f64 {
    df as f64 + 5.0 * (2.0 * df as f64).sqrt()
}

fn key_counts(dist: KeyDist, keys: u64, n: usize, seed: u64) -> Vec<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut c = KeyChooser::new(dist, keys, 0).unwrap();
    let mut counts = vec![0u64; keys as usize];
    for _ in 0..n {
        counts[c.next(&mut rng) as usize] += 1;
    }
    counts
}

fn expected(dist: KeyDist, keys: u64, n: usize) -> Vec<f64> {
    (0..keys)
        .map(|k| key_probability(dist, keys, k) * n as f64)
        .collect()
}

#[test]
fn key_choice_matches_each_distribution() {
    let keys = 1000;
    let n = 200_000;
    let dists = [
        KeyDist::Uniform,
        KeyDist::Sequential,
        KeyDist::Zipf { s: 0.99 },
        KeyDist::Zipf { s: 1.5 },
        KeyDist::Hot {
            fraction: 0.1,
            probability: 0.9,
        },
        KeyDist::Gaussian {
            mean: None,
            sd: None,
        },
        KeyDist::Gaussian {
            mean: Some(100.0),
            sd: Some(50.0),
        },
    ];
    for (i, d) in dists.into_iter().enumerate() {
        let counts = key_counts(d, keys, n, 42 + i as u64);
        let (stat, df) = chi_square(&counts, &expected(d, keys, n));
        assert!(df >= 10, "{d:?}: {df} cells");
        assert!(
            stat < chi_bound(df),
            "{d:?}: chi-square {stat:.1} with {df} df"
        );
    }
    // Hot set: 10 % of keys get 90 % of requests.
    let hot = key_counts(
        KeyDist::Hot {
            fraction: 0.1,
            probability: 0.9,
        },
        keys,
        n,
        1,
    );
    let share = hot[..100].iter().sum::<u64>() as f64 / n as f64;
    assert!((share - 0.9).abs() < 0.005, "hot share {share}");
}

#[test]
fn key_choice_test_rejects_a_wrong_distribution() {
    let keys = 1000;
    let n = 200_000;
    let counts = key_counts(KeyDist::Zipf { s: 0.99 }, keys, n, 3);
    let (stat, df) = chi_square(&counts, &expected(KeyDist::Zipf { s: 0.9 }, keys, n));
    assert!(
        stat > chi_bound(df),
        "zipf 0.99 passed as zipf 0.9: {stat:.1} ({df} df)"
    );
    let counts = key_counts(KeyDist::Uniform, keys, n, 3);
    let wrong = KeyDist::Hot {
        fraction: 0.1,
        probability: 0.15,
    };
    let (stat, df) = chi_square(&counts, &expected(wrong, keys, n));
    assert!(
        stat > chi_bound(df),
        "uniform passed as a mild hot set: {stat:.1}"
    );
}

fn ks_of(d: SizeDist, against: SizeDist, n: usize, seed: u64) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut xs: Vec<f64> = (0..n)
        .map(|_| d.quantile(rand::Rng::gen::<f64>(&mut rng)))
        .collect();
    ks_statistic(&mut xs, |x| against.cdf(x))
}

#[test]
fn size_draws_match_their_distributions() {
    let n = 20_000;
    for (i, d) in [
        etc_key_size(),
        etc_value_size(),
        SizeDist::Normal {
            mean: 500.0,
            sd: 100.0,
        },
        SizeDist::Exp { mean: 300.0 },
        SizeDist::Uniform { min: 10, max: 1000 },
    ]
    .into_iter()
    .enumerate()
    {
        let d_stat = ks_of(d, d, n, 10 + i as u64);
        assert!(d_stat < ks_critical_001(n), "{d}: KS D {d_stat:.4}");
    }
    // Power: a modestly different shape is rejected.
    let wrong = SizeDist::GPareto {
        loc: 15.0,
        scale: 240.0,
        shape: 0.348238,
    };
    let d_stat = ks_of(etc_value_size(), wrong, n, 5);
    assert!(
        d_stat > ks_critical_001(n),
        "scale 214 passed as 240: D {d_stat:.4}"
    );
    let d_stat = ks_of(
        etc_key_size(),
        SizeDist::Normal {
            mean: 35.0,
            sd: 10.0,
        },
        n,
        5,
    );
    assert!(
        d_stat > ks_critical_001(n),
        "GEV passed as normal: D {d_stat:.4}"
    );
}

#[test]
fn etc_key_sizes_of_composed_keys_follow_the_gev() {
    // The sizes of the keys actually composed (derived from a hash of each key), rounded
    // down: P(size = L) = F(L+1) − F(L), and the short ones are raised to the minimum length.
    let wl = Workload {
        keys: 1_000_000,
        key_prefix: "k".into(),
        key_size: etc_key_size(),
        ..Workload::default()
    };
    let gev = etc_key_size();
    let n = 50_000u64;
    let mut buf = [0u8; 256];
    let mut counts = vec![0u64; 251];
    for k in 0..n {
        counts[wl.key(k * 17, &mut buf).len()] += 1;
    }
    let min = 8; // "k" + up to 7 digits
    let exp: Vec<f64> = (0..251)
        .map(|l| {
            let p = match l {
                l if l < min => 0.0,
                l if l == min => gev.cdf((min + 1) as f64),
                250 => 1.0 - gev.cdf(250.0),
                l => gev.cdf(l as f64 + 1.0) - gev.cdf(l as f64),
            };
            p * n as f64
        })
        .collect();
    let (stat, df) = chi_square(&counts, &exp);
    assert!(
        df > 20 && stat < chi_bound(df),
        "chi-square {stat:.1} ({df} df)"
    );
    let mean = counts
        .iter()
        .enumerate()
        .map(|(l, c)| l as f64 * *c as f64)
        .sum::<f64>()
        / n as f64;
    assert!((mean - 35.0).abs() < 1.5, "mean key size {mean} bytes");
}

#[test]
fn verified_value_sizes_follow_the_value_distribution() {
    // Sizes of verifiable values (derived from key and version), rounded down:
    // P(size = L) = F(L+1) − F(L); sizes of 2000 bytes and more are pooled.
    let wl = Workload {
        value_size: etc_value_size(),
        verify: true,
        ..Workload::default()
    };
    let g = etc_value_size();
    let n = 50_000u64;
    let cap = 2000usize;
    let mut counts = vec![0u64; cap + 1];
    for i in 0..n {
        counts[wl.verified_len(i, i * 3 + 1).min(cap)] += 1;
    }
    let exp: Vec<f64> = (0..=cap)
        .map(|l| {
            let p = if l == cap {
                1.0 - g.cdf(cap as f64)
            } else {
                g.cdf(l as f64 + 1.0) - g.cdf(l as f64)
            };
            p * n as f64
        })
        .collect();
    let (stat, df) = chi_square(&counts, &exp);
    assert!(
        df > 20 && stat < chi_bound(df),
        "chi-square {stat:.1} ({df} df)"
    );
}

fn gaps(arrival: Arrival, rate: f64, n: usize, seed: u64) -> Vec<f64> {
    let mut a = Arrivals::new(arrival, seed, 0, rate);
    let mut prev = a.next_ns();
    (0..n)
        .map(|_| {
            let t = a.advance(rate, 0);
            let g = (t - prev) as f64;
            prev = t;
            g
        })
        .collect()
}

fn mean_cv(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let v = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
    (m, v.sqrt() / m)
}

#[test]
fn poisson_arrivals_have_the_right_mean_cv_and_shape() {
    let rate = 2000.0; // per connection, requests/s: mean gap 500 µs
    let n = 100_000;
    let g = gaps(Arrival::Poisson, rate, n, 9);
    let (m, cv) = mean_cv(&g);
    // sd of the mean of 1e5 exponentials is 0.3 %: 1 % is > 3 sd.
    assert!((m / 500_000.0 - 1.0).abs() < 0.01, "mean gap {m} ns");
    assert!((cv - 1.0).abs() < 0.02, "CV {cv}");
    let mut s: Vec<f64> = g[..20_000].iter().map(|x| x / 500_000.0).collect();
    let d = ks_statistic(&mut s, |x| 1.0 - (-x).exp());
    assert!(d < ks_critical_001(20_000), "KS D {d}");
    // Power: the same gaps are not uniform on [0, 2·mean].
    let mut s: Vec<f64> = g[..20_000].iter().map(|x| x / 500_000.0).collect();
    let d = ks_statistic(&mut s, |x| (x / 2.0).clamp(0.0, 1.0));
    assert!(d > ks_critical_001(20_000));
}

#[test]
fn fixed_arrivals_are_constant_and_phases_are_random() {
    let g = gaps(Arrival::Fixed, 1000.0, 1000, 1);
    assert!(g.iter().all(|&x| x == 1_000_000.0), "gaps of exactly 1 ms");
    // First planned times of 5000 connections: uniform over one gap (KS against uniform).
    let mut phases: Vec<f64> = (0..5000)
        .map(|c| Arrivals::new(Arrival::Fixed, mix64(c), 0, 1000.0).next_ns() as f64 / 1e6)
        .collect();
    let d = ks_statistic(&mut phases, |x| x.clamp(0.0, 1.0));
    assert!(d < ks_critical_001(5000), "phases not uniform: D {d}");
    // Poisson phases: exponential.
    let mut phases: Vec<f64> = (0..5000)
        .map(|c| Arrivals::new(Arrival::Poisson, mix64(c), 0, 1000.0).next_ns() as f64 / 1e6)
        .collect();
    let d = ks_statistic(&mut phases, |x| 1.0 - (-x).exp());
    assert!(d < ks_critical_001(5000), "Poisson phases: D {d}");
}

#[test]
fn seeded_trace_is_reproducible_and_uniform_in_range() {
    let a = RatePlan::random(1.0, 1000.0, 5000.0, 42, 300.0).unwrap();
    let b = RatePlan::random(1.0, 1000.0, 5000.0, 42, 300.0).unwrap();
    let c = RatePlan::random(1.0, 1000.0, 5000.0, 43, 300.0).unwrap();
    assert_eq!(a, b, "same seed, same trace");
    assert_ne!(a, c, "another seed, another trace");
    assert_eq!(a.segments.len(), 300);
    assert_eq!(a.duration_ns(), 300_000_000_000);
    let mut rates: Vec<f64> = a.segments.iter().map(|s| s.qps).collect();
    assert!(rates.iter().all(|r| (1000.0..=5000.0).contains(r)));
    let d = ks_statistic(&mut rates, |x| ((x - 1000.0) / 4000.0).clamp(0.0, 1.0));
    assert!(d < ks_critical_001(300), "rates not uniform: D {d}");
    // A trace whose length is not a multiple of the interval ends exactly at the duration.
    let p = RatePlan::random(2.0, 1.0, 2.0, 1, 5.0).unwrap();
    assert_eq!(p.segments.len(), 3);
    assert_eq!(p.duration_ns(), 5_000_000_000);
}
