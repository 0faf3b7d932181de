//! Factors and points: a factor's levels (a list or a range), the designs, and the
//! expansion of factors into a part's points.

use std::fmt;

use anyhow::bail;
use serde::{Deserialize, Serialize};

/// A factor's level: a TOML integer, float, string or boolean.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Level {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
}

impl Level {
    pub(super) fn from_toml(v: &toml::Value, what: &str) -> anyhow::Result<Level> {
        Ok(match v {
            toml::Value::Integer(i) => Level::Int(*i),
            toml::Value::Float(f) => Level::Float(*f),
            toml::Value::Boolean(b) => Level::Bool(*b),
            toml::Value::String(s) => Level::Str(s.clone()),
            other => bail!("{what}: a level must be a number, string or boolean, not {other}"),
        })
    }

    pub(super) fn to_toml(&self) -> toml::Value {
        match self {
            Level::Int(i) => toml::Value::Integer(*i),
            Level::Float(f) => toml::Value::Float(*f),
            Level::Bool(b) => toml::Value::Boolean(*b),
            Level::Str(s) => toml::Value::String(s.clone()),
        }
    }

    /// The level as a number, if it is one.
    pub fn number(&self) -> Option<f64> {
        match self {
            Level::Int(i) => Some(*i as f64),
            Level::Float(f) => Some(*f),
            _ => None,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Level::Int(i) => write!(f, "{i}"),
            Level::Float(x) => write!(f, "{x}"),
            Level::Bool(b) => write!(f, "{b}"),
            Level::Str(s) => f.write_str(s),
        }
    }
}

/// How a part's points are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Design {
    /// Every combination of the factors' levels.
    Full,
    /// 2^k: every factor has exactly two levels (low, high); analysed for effects.
    TwoK,
    /// The listed `points` only.
    Points,
}

/// The levels of factor `name`: a list, a range (`from`, `to`, and `step` or `times`) or a
/// single value.
pub(super) fn levels_of(name: &str, v: &toml::Value) -> anyhow::Result<Vec<Level>> {
    let what = format!("factor {name:?}");
    let levels = match v {
        toml::Value::Array(a) => a
            .iter()
            .map(|x| Level::from_toml(x, &what))
            .collect::<anyhow::Result<Vec<_>>>()?,
        toml::Value::Table(t) => {
            // { from = 5000, to = 125000, step = 5000 } or { values = [...] }
            let num = |k: &str| -> anyhow::Result<Option<f64>> {
                match t.get(k) {
                    None => Ok(None),
                    Some(toml::Value::Integer(i)) => Ok(Some(*i as f64)),
                    Some(toml::Value::Float(f)) => Ok(Some(*f)),
                    Some(o) => bail!("{what}: {k} must be a number, not {o}"),
                }
            };
            for k in t.keys() {
                if !["from", "to", "step", "times"].contains(&k.as_str()) {
                    bail!("{what}: unknown key {k:?} (a range has from, to, and step or times)");
                }
            }
            let (Some(from), Some(to)) = (num("from")?, num("to")?) else {
                bail!("{what}: a range needs from and to");
            };
            let ints = t.values().all(|v| v.is_integer());
            let mut out = Vec::new();
            match (num("step")?, num("times")?) {
                (Some(step), None) if step > 0.0 && to >= from => {
                    let n = ((to - from) / step + 1e-9).floor() as usize;
                    if n > 10_000 {
                        bail!("{what}: more than 10 000 levels");
                    }
                    for i in 0..=n {
                        out.push(from + step * i as f64);
                    }
                }
                (None, Some(times)) if times > 1.0 && to >= from && from > 0.0 => {
                    let mut x = from;
                    while x <= to * (1.0 + 1e-9) {
                        out.push(x);
                        x *= times;
                        if out.len() > 10_000 {
                            bail!("{what}: more than 10 000 levels");
                        }
                    }
                }
                _ => bail!(
                    "{what}: a range needs step > 0 (arithmetic) or times > 1 (geometric), \
                     and from <= to"
                ),
            }
            out.into_iter()
                .map(|x| {
                    if ints {
                        Level::Int(x.round() as i64)
                    } else {
                        Level::Float(x)
                    }
                })
                .collect()
        }
        other => Level::from_toml(other, &what).map(|l| vec![l])?,
    };
    if levels.is_empty() {
        bail!("{what} has no levels");
    }
    Ok(levels)
}

/// Every combination of the factors' levels.
pub(super) fn expand_full(factors: &[(String, Vec<Level>)]) -> Vec<Vec<(String, Level)>> {
    // Standard order: the first factor varies fastest (as in a 2^k sign table).
    let total: usize = factors.iter().map(|(_, l)| l.len()).product();
    (0..total)
        .map(|mut i| {
            factors
                .iter()
                .map(|(f, ls)| {
                    let l = ls[i % ls.len()].clone();
                    i /= ls.len();
                    (f.clone(), l)
                })
                .collect()
        })
        .collect()
}

/// A part's points under `design`, from its `factors` and the points it lists. Under
/// `points`, the factors become the ones the points name, each with the levels they use.
pub(super) fn points(
    design: Design,
    factors: &mut Vec<(String, Vec<Level>)>,
    listed: &[toml::Table],
) -> anyhow::Result<Vec<Vec<(String, Level)>>> {
    match design {
        Design::Full => {
            if !listed.is_empty() {
                bail!("points are listed but design = \"full\": use design = \"points\"");
            }
            Ok(expand_full(factors))
        }
        Design::TwoK => {
            check_two_k(factors, listed)?;
            Ok(expand_full(factors))
        }
        Design::Points => {
            let (order, pts) = listed_points(factors, listed)?;
            *factors = levels_used(&order, &pts);
            Ok(pts)
        }
    }
}

/// A 2^k design needs 1 to 10 factors of exactly two levels each, and no listed points.
fn check_two_k(factors: &[(String, Vec<Level>)], listed: &[toml::Table]) -> anyhow::Result<()> {
    if factors.is_empty() {
        bail!("design = \"2k\" needs factors");
    }
    if factors.len() > 10 {
        bail!("design = \"2k\": at most 10 factors");
    }
    for (f, ls) in factors {
        if ls.len() != 2 {
            bail!(
                "design = \"2k\": factor {f:?} has {} levels; give exactly two [low, high]",
                ls.len()
            );
        }
    }
    if !listed.is_empty() {
        bail!("points are listed but design = \"2k\"");
    }
    Ok(())
}

/// The listed points, each a level per factor in factor order (the factors table, then the
/// points' keys in order of first appearance), with that order. A point that leaves a factor
/// out takes its level when the factors table gives it exactly one.
#[allow(clippy::type_complexity)]
fn listed_points(
    factors: &[(String, Vec<Level>)],
    listed: &[toml::Table],
) -> anyhow::Result<(Vec<String>, Vec<Vec<(String, Level)>>)> {
    if listed.is_empty() {
        bail!("design = \"points\" needs points = [{{ factor = level, … }}, …]");
    }
    // Factor order: the factors table, then keys in order of first appearance.
    let mut order: Vec<String> = factors.iter().map(|(f, _)| f.clone()).collect();
    for pt in listed {
        for k in pt.keys() {
            if !order.contains(k) {
                order.push(k.clone());
            }
        }
    }
    let mut pts = Vec::new();
    for (i, pt) in listed.iter().enumerate() {
        let mut row = Vec::new();
        for f in &order {
            let l = match pt.get(f) {
                Some(v) => Level::from_toml(v, &format!("point {} factor {f:?}", i + 1))?,
                None => match factors.iter().find(|(n, _)| n == f) {
                    Some((_, ls)) if ls.len() == 1 => ls[0].clone(),
                    _ => bail!("point {} has no level for factor {f:?}", i + 1),
                },
            };
            row.push((f.clone(), l));
        }
        pts.push(row);
    }
    Ok((order, pts))
}

/// Each factor of `order` with the levels the points use, in order of first use.
fn levels_used(order: &[String], pts: &[Vec<(String, Level)>]) -> Vec<(String, Vec<Level>)> {
    order
        .iter()
        .map(|f| {
            let mut ls: Vec<Level> = Vec::new();
            for row in pts {
                for (n, l) in row {
                    if n == f && !ls.contains(l) {
                        ls.push(l.clone());
                    }
                }
            }
            (f.clone(), ls)
        })
        .collect()
}
