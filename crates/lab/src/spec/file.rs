//! The experiment file as written (TOML → the raw file spec, before any default or check),
//! and the command-line overrides written into it.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::hosts::{HostFile, HostTable, SshSpec};
use super::system::SystemSpec;
use super::workload::check_workload_key;

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileSpec {
    pub(super) name: Option<String>,
    pub(super) description: Option<String>,
    pub(super) repetitions: Option<usize>,
    pub(super) duration: Option<f64>,
    pub(super) warmup: Option<f64>,
    pub(super) confidence: Option<f64>,
    pub(super) tolerance: Option<f64>,
    pub(super) slo_p95_us: Option<f64>,
    pub(super) slo_mean_us: Option<f64>,
    pub(super) seed: Option<u64>,
    pub(super) corunner: Option<String>,
    #[serde(default, rename = "system")]
    pub(super) systems: Vec<SystemSpec>,
    #[serde(default)]
    pub(super) workload: toml::Table,
    #[serde(default)]
    pub(super) factors: toml::Table,
    pub(super) design: Option<String>,
    #[serde(default)]
    pub(super) points: Vec<toml::Table>,
    #[serde(default, rename = "part")]
    pub(super) parts: Vec<PartSpec>,
    pub(super) speedup: Option<SpeedupFile>,
    #[serde(default, rename = "host")]
    pub(super) hosts: Vec<HostFile>,
    pub(super) ssh: Option<SshSpec>,
    pub(super) agents: Option<Vec<String>>,
}

/// A `[speedup]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SpeedupFile {
    pub(super) jobs: String,
    pub(super) cpus: Option<String>,
    pub(super) repetitions: Option<usize>,
}

/// A `[[part]]` as written (the file's top level is one too, when it has no parts).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PartSpec {
    pub(super) name: Option<String>,
    pub(super) description: Option<String>,
    pub(super) systems: Option<Vec<String>>,
    pub(super) repetitions: Option<usize>,
    pub(super) duration: Option<f64>,
    pub(super) warmup: Option<f64>,
    pub(super) corunner: Option<String>,
    pub(super) agents: Option<Vec<String>>,
    #[serde(default)]
    pub(super) workload: toml::Table,
    #[serde(default)]
    pub(super) factors: toml::Table,
    pub(super) design: Option<String>,
    #[serde(default)]
    pub(super) points: Vec<toml::Table>,
}

/// Command-line overrides of an experiment file's values, for every part (the file's top
/// level and each `[[part]]` alike). Stored in `meta.json`, so a re-analysis resolves the
/// experiment as it was run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Overrides {
    /// Runs per point and system (overrides every `repetitions` of the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetitions: Option<usize>,
    /// Measured seconds per run (overrides every `duration`; a trace still lasts its
    /// qps_list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// Warm-up seconds per run (overrides every `warmup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<f64>,
    /// A workload key for every part, as in [workload]; repeatable, a later one wins. VALUE is
    /// read as TOML (4096, 0.5, true, [1, 2], "text") or else taken as text (get=9,set=1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<String>,
    /// A host table in place of the file's (`--hosts FILE`): the same experiment on other
    /// machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<HostTable>,
}

impl Overrides {
    /// Whether nothing is overridden.
    pub fn is_empty(&self) -> bool {
        *self == Overrides::default()
    }

    /// The overrides as the flags that give them, e.g. `--repetitions 1 --set keys=1000`.
    pub fn flags(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        if let Some(n) = self.repetitions {
            out.push(format!("--repetitions {n}"));
        }
        if let Some(s) = self.duration {
            out.push(format!("--duration {s}"));
        }
        if let Some(s) = self.warmup {
            out.push(format!("--warmup {s}"));
        }
        out.extend(self.set.iter().map(|kv| format!("--set {kv}")));
        if let Some(h) = &self.hosts {
            out.push(format!("--hosts {}", h.file));
        }
        out.join(" ")
    }

    /// The `--set` assignments, each key checked and its value read.
    pub(super) fn assignments(&self) -> anyhow::Result<Vec<(String, toml::Value)>> {
        self.set
            .iter()
            .map(|kv| {
                let Some((k, v)) = kv.split_once('=') else {
                    bail!("--set {kv}: expected KEY=VALUE, e.g. --set keys=1000");
                };
                let k = k.trim();
                check_workload_key(k).with_context(|| format!("--set {kv}"))?;
                // A TOML value when it is one (numbers, booleans, arrays, quoted strings),
                // else the text as a string: `mix=get=9,set=1`, `protocol=http`.
                let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
                    .ok()
                    .and_then(|mut t| t.remove("v"))
                    .unwrap_or_else(|| toml::Value::String(v.to_string()));
                Ok((k.to_string(), value))
            })
            .collect()
    }

    /// Writes the overrides into the file's values (top level and every part); returns the
    /// `--set` assignments.
    pub(super) fn apply(&self, f: &mut FileSpec) -> anyhow::Result<Vec<(String, toml::Value)>> {
        let sets = self.assignments()?;
        f.repetitions = self.repetitions.or(f.repetitions);
        f.duration = self.duration.or(f.duration);
        f.warmup = self.warmup.or(f.warmup);
        f.workload.extend(sets.iter().cloned());
        for p in &mut f.parts {
            p.repetitions = self.repetitions.or(p.repetitions);
            p.duration = self.duration.or(p.duration);
            p.warmup = self.warmup.or(p.warmup);
            p.workload.extend(sets.iter().cloned());
        }
        Ok(sets)
    }
}
