//! Distributions of the workload: sizes (keys, values) and key choice.
//!
//! Sizes are continuous distributions sampled by inverse CDF and rounded, so one uniform draw
//! maps to one size: a key's size can then be derived from a hash of the key (the same key
//! always has the same size) and a verified value's size from its key and version. Key choice
//! uses `rand_distr` where it has the distribution (normal, Zipf).
//!
//! The Facebook ETC preset ([`etc_key_size`], [`etc_value_size`]) follows Atikoglu et al.
//! (SIGMETRICS 2012) as mutilate encodes it: key size GEV(μ 30.7984, σ 8.20449, ξ 0.078688),
//! value size generalized Pareto(μ 15, σ 214.476, ξ 0.348238).

use std::fmt;

use rand::Rng;
use rand_distr::{Distribution, Normal, Zipf};
use serde::{Deserialize, Serialize};

use crate::BenchError;

/// A size distribution (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum SizeDist {
    /// Always `n`.
    Fixed {
        /// The size.
        n: u64,
    },
    /// Uniform on the integers `min..=max`.
    Uniform {
        /// Smallest.
        min: u64,
        /// Largest.
        max: u64,
    },
    /// Normal, rounded.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        sd: f64,
    },
    /// Exponential, rounded.
    Exp {
        /// Mean.
        mean: f64,
    },
    /// Generalized extreme value (location μ, scale σ, shape ξ), rounded.
    Gev {
        /// μ
        loc: f64,
        /// σ
        scale: f64,
        /// ξ
        shape: f64,
    },
    /// Generalized Pareto (location μ, scale σ, shape ξ), rounded.
    GPareto {
        /// μ
        loc: f64,
        /// σ
        scale: f64,
        /// ξ
        shape: f64,
    },
}

/// ETC key sizes (bytes).
pub fn etc_key_size() -> SizeDist {
    SizeDist::Gev {
        loc: 30.7984,
        scale: 8.20449,
        shape: 0.078688,
    }
}

/// ETC value sizes (bytes).
pub fn etc_value_size() -> SizeDist {
    SizeDist::GPareto {
        loc: 15.0,
        scale: 214.476,
        shape: 0.348238,
    }
}

impl SizeDist {
    /// Parses `N`, `A-B`, `fixed:N`, `uniform:A,B`, `normal:MEAN,SD`, `exp:MEAN`,
    /// `gev:LOC,SCALE,SHAPE`, `gpareto:LOC,SCALE,SHAPE` or `etc-key` / `etc-value`.
    pub fn parse(s: &str) -> Result<Self, BenchError> {
        let bad = || BenchError::Spec(format!("bad size distribution {s:?}"));
        if s == "etc-key" {
            return Ok(etc_key_size());
        }
        if s == "etc-value" {
            return Ok(etc_value_size());
        }
        if let Ok(n) = s.parse::<u64>() {
            return Ok(SizeDist::Fixed { n });
        }
        if let Some((a, b)) = s.split_once('-') {
            if let (Ok(min), Ok(max)) = (a.parse::<u64>(), b.parse::<u64>()) {
                return check(SizeDist::Uniform { min, max }, s);
            }
        }
        let (name, args) = s.split_once(':').ok_or_else(bad)?;
        let nums: Vec<f64> = args
            .split(',')
            .map(|x| x.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        let d = match (name, nums.as_slice()) {
            ("fixed", &[n]) => SizeDist::Fixed { n: n as u64 },
            ("uniform", &[a, b]) => SizeDist::Uniform {
                min: a as u64,
                max: b as u64,
            },
            ("normal", &[mean, sd]) => SizeDist::Normal { mean, sd },
            ("exp", &[mean]) => SizeDist::Exp { mean },
            ("gev", &[loc, scale, shape]) => SizeDist::Gev { loc, scale, shape },
            ("gpareto", &[loc, scale, shape]) => SizeDist::GPareto { loc, scale, shape },
            _ => return Err(bad()),
        };
        check(d, s)
    }

    /// The inverse CDF at `u` in (0, 1), before rounding.
    pub fn quantile(&self, u: f64) -> f64 {
        let u = u.clamp(1e-12, 1.0 - 1e-12);
        match *self {
            SizeDist::Fixed { n } => n as f64,
            // Continuous on [min, max+1), floored by `size`, so each integer gets 1/(max-min+1).
            SizeDist::Uniform { min, max } => min as f64 + u * ((max - min + 1) as f64),
            SizeDist::Normal { mean, sd } => mean + sd * inverse_normal_cdf(u),
            SizeDist::Exp { mean } => -mean * (1.0 - u).ln(),
            SizeDist::Gev { loc, scale, shape } => {
                let t = -u.ln();
                if shape.abs() < 1e-12 {
                    loc - scale * t.ln()
                } else {
                    loc + scale * (t.powf(-shape) - 1.0) / shape
                }
            }
            SizeDist::GPareto { loc, scale, shape } => {
                if shape.abs() < 1e-12 {
                    loc - scale * (1.0 - u).ln()
                } else {
                    loc + scale * ((1.0 - u).powf(-shape) - 1.0) / shape
                }
            }
        }
    }

    /// The CDF at `x` (of the continuous distribution [`quantile`](Self::quantile) inverts).
    pub fn cdf(&self, x: f64) -> f64 {
        match *self {
            SizeDist::Fixed { n } => {
                if x >= n as f64 {
                    1.0
                } else {
                    0.0
                }
            }
            SizeDist::Uniform { min, max } => {
                ((x - min as f64) / ((max - min + 1) as f64)).clamp(0.0, 1.0)
            }
            SizeDist::Normal { mean, sd } => {
                0.5 * erfc(-(x - mean) / (sd * std::f64::consts::SQRT_2))
            }
            SizeDist::Exp { mean } => {
                if x <= 0.0 {
                    0.0
                } else {
                    1.0 - (-x / mean).exp()
                }
            }
            SizeDist::Gev { loc, scale, shape } => {
                let z = (x - loc) / scale;
                if shape.abs() < 1e-12 {
                    (-(-z).exp()).exp()
                } else {
                    let t = 1.0 + shape * z;
                    if t <= 0.0 {
                        return if shape > 0.0 { 0.0 } else { 1.0 };
                    }
                    (-t.powf(-1.0 / shape)).exp()
                }
            }
            SizeDist::GPareto { loc, scale, shape } => {
                if x <= loc {
                    return 0.0;
                }
                let z = (x - loc) / scale;
                if shape.abs() < 1e-12 {
                    1.0 - (-z).exp()
                } else {
                    let t = 1.0 + shape * z;
                    if t <= 0.0 {
                        return 1.0;
                    }
                    1.0 - t.powf(-1.0 / shape)
                }
            }
        }
    }

    /// The size for uniform draw `u`, rounded down and clamped to `min..=max`.
    pub fn size(&self, u: f64, min: u64, max: u64) -> u64 {
        let x = self.quantile(u);
        let x = if x.is_finite() {
            x.floor().max(0.0)
        } else {
            max as f64
        };
        (x as u64).clamp(min, max)
    }

    /// Draws a size from `rng`.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R, min: u64, max: u64) -> u64 {
        match *self {
            SizeDist::Fixed { n } => n.clamp(min, max),
            _ => self.size(rng.gen::<f64>(), min, max),
        }
    }

    /// An upper bound of the sizes drawn (before clamping to a caller's maximum).
    pub fn max_hint(&self) -> Option<u64> {
        match *self {
            SizeDist::Fixed { n } => Some(n),
            SizeDist::Uniform { max, .. } => Some(max),
            _ => None,
        }
    }
}

fn check(d: SizeDist, s: &str) -> Result<SizeDist, BenchError> {
    let ok = match d {
        SizeDist::Fixed { .. } => true,
        SizeDist::Uniform { min, max } => min <= max,
        SizeDist::Normal { sd, .. } => sd > 0.0,
        SizeDist::Exp { mean } => mean > 0.0,
        SizeDist::Gev { scale, .. } | SizeDist::GPareto { scale, .. } => scale > 0.0,
    };
    if ok {
        Ok(d)
    } else {
        Err(BenchError::Spec(format!(
            "invalid parameters in size distribution {s:?}"
        )))
    }
}

impl fmt::Display for SizeDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SizeDist::Fixed { n } => write!(f, "{n}"),
            SizeDist::Uniform { min, max } => write!(f, "uniform:{min},{max}"),
            SizeDist::Normal { mean, sd } => write!(f, "normal:{mean},{sd}"),
            SizeDist::Exp { mean } => write!(f, "exp:{mean}"),
            SizeDist::Gev { loc, scale, shape } => write!(f, "gev:{loc},{scale},{shape}"),
            SizeDist::GPareto { loc, scale, shape } => write!(f, "gpareto:{loc},{scale},{shape}"),
        }
    }
}

/// How keys are chosen from `0..keys`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum KeyDist {
    /// Every key equally likely.
    Uniform,
    /// 0, 1, 2, … (each thread starts at its own offset), wrapping.
    Sequential,
    /// Normal around `mean` (default the middle) with `sd` (default keys/6), in key indices;
    /// draws outside the key space are redrawn.
    Gaussian {
        /// Mean key index.
        mean: Option<f64>,
        /// Standard deviation in keys.
        sd: Option<f64>,
    },
    /// Zipf with exponent `s`: key `i` (rank i+1) has probability ∝ 1/(i+1)^s.
    Zipf {
        /// Exponent.
        s: f64,
    },
    /// A fraction `fraction` of the keys (the lowest indices) gets `probability` of requests.
    Hot {
        /// Fraction of keys that are hot.
        fraction: f64,
        /// Fraction of requests that go to them.
        probability: f64,
    },
}

impl KeyDist {
    /// Parses `uniform`, `sequential`, `gaussian[:MEAN,SD]`, `zipf:S`, `hot:F:P`.
    pub fn parse(s: &str) -> Result<Self, BenchError> {
        let bad = || BenchError::Spec(format!("bad key distribution {s:?}"));
        let (name, args) = s.split_once(':').unwrap_or((s, ""));
        let nums = |sep: char| -> Result<Vec<f64>, BenchError> {
            if args.is_empty() {
                return Ok(vec![]);
            }
            args.split(sep)
                .map(|x| x.trim().parse::<f64>().map_err(|_| bad()))
                .collect()
        };
        let d = match name {
            "uniform" | "random" if args.is_empty() => KeyDist::Uniform,
            "sequential" | "seq" if args.is_empty() => KeyDist::Sequential,
            "gaussian" | "normal" => match nums(',')?.as_slice() {
                [] => KeyDist::Gaussian {
                    mean: None,
                    sd: None,
                },
                &[mean, sd] if sd > 0.0 => KeyDist::Gaussian {
                    mean: Some(mean),
                    sd: Some(sd),
                },
                _ => return Err(bad()),
            },
            "zipf" => match nums(',')?.as_slice() {
                &[s] if s > 0.0 => KeyDist::Zipf { s },
                _ => return Err(bad()),
            },
            "hot" => match nums(':')?.as_slice() {
                &[f, p] => Self::hot(f, p)?,
                _ => return Err(bad()),
            },
            _ => return Err(bad()),
        };
        Ok(d)
    }

    /// The hot-set distribution, checked.
    pub fn hot(fraction: f64, probability: f64) -> Result<Self, BenchError> {
        if !(fraction > 0.0 && fraction < 1.0 && (0.0..=1.0).contains(&probability)) {
            return Err(BenchError::Spec(format!(
                "hot set {fraction}:{probability}: fraction must be in (0,1), probability in [0,1]"
            )));
        }
        Ok(KeyDist::Hot {
            fraction,
            probability,
        })
    }
}

/// Draws key indices for one thread.
pub struct KeyChooser {
    keys: u64,
    kind: Chooser,
}

enum Chooser {
    Uniform,
    Sequential { next: u64 },
    Gaussian(Normal<f64>),
    Zipf(Zipf<f64>),
    Hot { hot: u64, probability: f64 },
}

impl KeyChooser {
    /// A chooser over `0..keys`; `start` is where a sequential walk begins.
    pub fn new(dist: KeyDist, keys: u64, start: u64) -> Result<Self, BenchError> {
        if keys == 0 {
            return Err(BenchError::Spec("the key space is empty".into()));
        }
        let bad = |e: String| BenchError::Spec(format!("key distribution {dist:?}: {e}"));
        let kind = match dist {
            KeyDist::Uniform => Chooser::Uniform,
            KeyDist::Sequential => Chooser::Sequential { next: start % keys },
            KeyDist::Gaussian { mean, sd } => Chooser::Gaussian(
                Normal::new(
                    mean.unwrap_or(keys as f64 / 2.0),
                    sd.unwrap_or(keys as f64 / 6.0),
                )
                .map_err(|e| bad(e.to_string()))?,
            ),
            KeyDist::Zipf { s } => {
                Chooser::Zipf(Zipf::new(keys, s).map_err(|e| bad(e.to_string()))?)
            }
            KeyDist::Hot {
                fraction,
                probability,
            } => Chooser::Hot {
                hot: ((keys as f64 * fraction).round() as u64).clamp(1, keys.max(2) - 1),
                probability,
            },
        };
        Ok(KeyChooser { keys, kind })
    }

    /// The next key index.
    pub fn next<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        let n = self.keys;
        match &mut self.kind {
            Chooser::Uniform => rng.gen_range(0..n),
            Chooser::Sequential { next } => {
                let k = *next;
                *next = if k + 1 >= n { 0 } else { k + 1 };
                k
            }
            Chooser::Gaussian(d) => {
                // Redraw outside the key space (bounded: after 64 tries fall back to uniform,
                // which only a mean far outside the space could reach).
                for _ in 0..64 {
                    let x = d.sample(rng);
                    if x >= 0.0 && x < n as f64 {
                        return x as u64;
                    }
                }
                rng.gen_range(0..n)
            }
            Chooser::Zipf(d) => (d.sample(rng) as u64).clamp(1, n) - 1,
            Chooser::Hot { hot, probability } => {
                if n == 1 {
                    0
                } else if rng.gen::<f64>() < *probability {
                    rng.gen_range(0..*hot)
                } else {
                    rng.gen_range(*hot..n)
                }
            }
        }
    }
}

/// The probability of key `k` under `dist` over `0..keys` (for goodness-of-fit tests and
/// reports). Sequential is treated as uniform (every key equally often).
pub fn key_probability(dist: KeyDist, keys: u64, k: u64) -> f64 {
    let n = keys as f64;
    match dist {
        KeyDist::Uniform | KeyDist::Sequential => 1.0 / n,
        KeyDist::Gaussian { mean, sd } => {
            let (m, s) = (mean.unwrap_or(n / 2.0), sd.unwrap_or(n / 6.0));
            let d = SizeDist::Normal { mean: m, sd: s };
            let mass = d.cdf(n) - d.cdf(0.0);
            (d.cdf(k as f64 + 1.0) - d.cdf(k as f64)) / mass
        }
        KeyDist::Zipf { s } => {
            let h: f64 = (1..=keys).map(|i| (i as f64).powf(-s)).sum();
            ((k + 1) as f64).powf(-s) / h
        }
        KeyDist::Hot {
            fraction,
            probability,
        } => {
            let hot = ((n * fraction).round() as u64).clamp(1, keys.max(2) - 1) as f64;
            if (k as f64) < hot {
                probability / hot
            } else {
                (1.0 - probability) / (n - hot)
            }
        }
    }
}

/// A 64-bit mix (splitmix64's finaliser): a cheap, well-spread hash of an integer.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Maps a hash to a uniform draw in (0, 1).
pub fn unit(h: u64) -> f64 {
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// Complementary error function (Numerical Recipes' erfcc; relative error < 1.2e-7).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Inverse standard normal CDF (Acklam's rational approximation; relative error < 1.2e-9).
pub fn inverse_normal_cdf(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_size_specs() {
        assert_eq!(SizeDist::parse("100").unwrap(), SizeDist::Fixed { n: 100 });
        assert_eq!(
            SizeDist::parse("10-20").unwrap(),
            SizeDist::Uniform { min: 10, max: 20 }
        );
        assert_eq!(SizeDist::parse("etc-value").unwrap(), etc_value_size());
        assert!(matches!(
            SizeDist::parse("gev:1,2,0.1").unwrap(),
            SizeDist::Gev { .. }
        ));
        assert!(SizeDist::parse("20-10").is_err());
        assert!(SizeDist::parse("normal:10,-1").is_err());
        assert!(SizeDist::parse("bogus:1").is_err());
    }

    #[test]
    fn parses_key_specs() {
        assert_eq!(
            KeyDist::parse("zipf:0.99").unwrap(),
            KeyDist::Zipf { s: 0.99 }
        );
        assert_eq!(
            KeyDist::parse("hot:0.1:0.9").unwrap(),
            KeyDist::Hot {
                fraction: 0.1,
                probability: 0.9
            }
        );
        assert!(KeyDist::parse("hot:1.5:0.9").is_err());
        assert!(KeyDist::parse("gaussian:1").is_err());
        assert!(KeyDist::parse("sequential").is_ok());
    }

    #[test]
    fn quantile_inverts_cdf() {
        for d in [
            etc_key_size(),
            etc_value_size(),
            SizeDist::Normal {
                mean: 50.0,
                sd: 5.0,
            },
            SizeDist::Exp { mean: 7.0 },
            SizeDist::Gev {
                loc: 10.0,
                scale: 2.0,
                shape: -0.2,
            },
        ] {
            for u in [0.001, 0.1, 0.5, 0.9, 0.999] {
                let x = d.quantile(u);
                assert!(
                    (d.cdf(x) - u).abs() < 1e-6,
                    "{d}: u {u} x {x} cdf {}",
                    d.cdf(x)
                );
            }
        }
    }

    #[test]
    fn normal_helpers_are_accurate() {
        assert!((erfc(0.0) - 1.0).abs() < 1e-7);
        assert!((0.5 * erfc(-1.959_964 / std::f64::consts::SQRT_2) - 0.975).abs() < 1e-6);
        assert!((inverse_normal_cdf(0.975) - 1.959_964).abs() < 1e-5);
    }
}
