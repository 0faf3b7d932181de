//! Resolving the file: defaults filled in, every value checked, each part's systems,
//! workload, factors and points resolved.

use std::collections::BTreeSet;

use anyhow::{bail, Context};

use crate::generator::Invocation;

use super::expand::{self, levels_of, Design, Level};
use super::file::{FileSpec, PartSpec};
use super::hosts;
use super::system::{placeholders_in, SystemSpec};
use super::workload::{check_workload_key, WORKLOAD_KEYS};
use super::{
    levels_text, protocol_name, Experiment, Overrides, Part, SpeedupSpec, DATA_DIR,
    DEFAULT_CONFIDENCE, DEFAULT_DURATION, DEFAULT_REPETITIONS, DEFAULT_SLO_P95_US,
    DEFAULT_TOLERANCE, DEFAULT_WARMUP,
};

impl Experiment {
    /// Parses and checks an experiment file with command-line `overrides`; `default_name`
    /// names it when the file does not.
    pub fn parse(
        text: &str,
        default_name: &str,
        overrides: &Overrides,
    ) -> anyhow::Result<Experiment> {
        let mut f: FileSpec = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        let sets = overrides.apply(&mut f)?;
        let confidence = f.confidence.unwrap_or(DEFAULT_CONFIDENCE);
        if !(confidence > 0.0 && confidence < 1.0) {
            bail!("confidence must be in (0, 1), e.g. 0.95");
        }
        let tolerance = f.tolerance.unwrap_or(DEFAULT_TOLERANCE);
        if !(tolerance >= 0.0 && tolerance.is_finite()) {
            bail!("tolerance must be >= 0, e.g. 0.10");
        }
        let slo_p95_us = f.slo_p95_us.unwrap_or(DEFAULT_SLO_P95_US);
        if !(slo_p95_us > 0.0 && slo_p95_us.is_finite()) {
            bail!("slo_p95_us must be > 0, e.g. 1000");
        }
        let slo_mean_us = f.slo_mean_us;
        if let Some(m) = slo_mean_us {
            if !(m > 0.0 && m.is_finite()) {
                bail!("slo_mean_us must be > 0, e.g. 1000");
            }
            if f.slo_p95_us.is_some() {
                bail!("give slo_p95_us or slo_mean_us, not both: a rate scan has one bound");
            }
        }
        if f.systems.is_empty() {
            bail!("no systems: add at least one [[system]] (e.g. name = \"kvlab\")");
        }
        let mut names = BTreeSet::new();
        for s in &f.systems {
            if !names.insert(s.name.clone()) {
                bail!("two systems are named {:?}", s.name);
            }
            s.check()?;
        }
        let (hosts, pools, ssh) = hosts::resolve(
            std::mem::take(&mut f.hosts),
            f.ssh.take(),
            overrides.hosts.as_ref(),
        )?;
        for s in &f.systems {
            for h in s.hosts().iter().chain(&s.backend_hosts) {
                hosts::check_defined(&hosts, &format!("system {:?}", s.name), h)?;
            }
        }
        let top = PartSpec {
            name: None,
            description: None,
            systems: None,
            repetitions: None,
            duration: None,
            warmup: None,
            corunner: None,
            agents: None,
            workload: toml::Table::new(),
            factors: f.factors.clone(),
            design: f.design.clone(),
            points: f.points.clone(),
        };
        let has_top_design = !f.factors.is_empty() || f.design.is_some() || !f.points.is_empty();
        let specs: Vec<PartSpec> = if f.parts.is_empty() {
            vec![top]
        } else {
            if has_top_design {
                bail!("with [[part]]s, put factors, design and points inside each part");
            }
            std::mem::take(&mut f.parts)
        };
        let mut parts = Vec::new();
        let mut part_names = BTreeSet::new();
        for (i, p) in specs.into_iter().enumerate() {
            let name = p.name.clone().unwrap_or_else(|| {
                if i == 0 {
                    "main".into()
                } else {
                    format!("part{}", i + 1)
                }
            });
            if !part_names.insert(name.clone()) {
                bail!("two parts are named {name:?}");
            }
            let part = resolve_part(&f, p, name.clone())
                .and_then(|part| check_agents(&f, &hosts, &pools, part))
                .with_context(|| format!("part {name:?}"))?;
            for (k, _) in &sets {
                if let Some((_, levels)) = part.factors.iter().find(|(f, _)| f == k) {
                    bail!(
                        "--set {k}: part {name:?} varies {k} as a factor ({} levels); a --set \
                         value would replace them all, so change the levels in the file instead",
                        levels.len()
                    );
                }
            }
            parts.push(part);
        }
        let speedup = match f.speedup {
            Some(sp) => {
                let repetitions = sp.repetitions.unwrap_or(1);
                if repetitions == 0 {
                    bail!("[speedup] repetitions must be at least 1");
                }
                Some(SpeedupSpec {
                    jobs: sp.jobs,
                    cpus: sp.cpus,
                    repetitions,
                })
            }
            None => None,
        };
        let name = f.name.clone().unwrap_or_else(|| default_name.to_string());
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            bail!("name {name:?}: use letters, digits, '-', '_' or '.' (it names a directory)");
        }
        Ok(Experiment {
            name,
            description: f.description,
            confidence,
            tolerance,
            slo_p95_us,
            slo_mean_us,
            seed: f.seed.unwrap_or(1),
            systems: f.systems,
            parts,
            speedup,
            hosts,
            ssh,
            pools,
        })
    }
}

/// `v` seconds of `what`, checked: finite, at most a day, and above zero unless `zero_ok`.
fn positive_secs(what: &str, v: f64, zero_ok: bool) -> anyhow::Result<f64> {
    if !v.is_finite() || v < 0.0 || (!zero_ok && v == 0.0) || v > 86_400.0 {
        bail!(
            "{what} = {v}: must be {} seconds (at most a day)",
            if zero_ok { ">= 0" } else { "> 0" }
        );
    }
    Ok(v)
}

/// One part resolved: its systems, runs' lengths, workload, factors and points, each step
/// checked in that order, then every point's placeholders, flags, workload and protocol.
fn resolve_part(f: &FileSpec, p: PartSpec, name: String) -> anyhow::Result<Part> {
    let systems = part_systems(f, &p)?;
    let repetitions = p
        .repetitions
        .or(f.repetitions)
        .unwrap_or(DEFAULT_REPETITIONS);
    if !(1..=1000).contains(&repetitions) {
        bail!("repetitions must be in 1..=1000");
    }
    let duration = positive_secs(
        "duration",
        p.duration.or(f.duration).unwrap_or(DEFAULT_DURATION),
        false,
    )?;
    let warmup = positive_secs(
        "warmup",
        p.warmup.or(f.warmup).unwrap_or(DEFAULT_WARMUP),
        true,
    )?;
    let workload = part_workload(f, p.workload)?;
    let mut factors = part_factors(&p.factors)?;
    let design = part_design(p.design.as_deref(), &p.points)?;
    let points = expand::points(design, &mut factors, &p.points)?;
    if points.len() > 100_000 {
        bail!("{} points: too many", points.len());
    }
    let corunner = p.corunner.clone().or_else(|| f.corunner.clone());
    let agents = p
        .agents
        .clone()
        .or_else(|| f.agents.clone())
        .unwrap_or_default();
    check_placeholders(f, &systems, &factors, &corunner)?;
    // A proxy's number of backends at every point, now.
    for &s in &systems {
        for pt in &points {
            f.systems[s].render(pt)?;
        }
    }
    let mut part = Part {
        name,
        description: p.description,
        systems,
        repetitions,
        duration,
        warmup,
        workload,
        factors,
        design,
        points,
        protocols: Vec::new(),
        generators: Vec::new(),
        corunner,
        agents,
    };
    check_workloads(&mut part)?;
    check_protocols(&f.systems, &part)?;
    Ok(part)
}

/// The part's systems: those it names (indices into the file's), else all of them.
fn part_systems(f: &FileSpec, p: &PartSpec) -> anyhow::Result<Vec<usize>> {
    let systems: Vec<usize> = match &p.systems {
        None => (0..f.systems.len()).collect(),
        Some(names) => names
            .iter()
            .map(|n| {
                f.systems
                    .iter()
                    .position(|s| &s.name == n)
                    .with_context(|| format!("unknown system {n:?} in systems"))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    if systems.is_empty() {
        bail!("no systems");
    }
    Ok(systems)
}

/// The file's workload overridden by the part's, every key checked.
fn part_workload(f: &FileSpec, own: toml::Table) -> anyhow::Result<toml::Table> {
    let mut workload = f.workload.clone();
    for (k, v) in own {
        workload.insert(k, v);
    }
    for k in workload.keys() {
        check_workload_key(k)?;
    }
    Ok(workload)
}

/// The part's factors and their levels, in file order.
fn part_factors(table: &toml::Table) -> anyhow::Result<Vec<(String, Vec<Level>)>> {
    let mut factors = Vec::new();
    for (k, v) in table {
        if [
            "design",
            "points",
            "repetitions",
            "duration",
            "warmup",
            "systems",
            "corunner",
        ]
        .contains(&k.as_str())
        {
            bail!(
                "{k:?} is inside [factors]: in TOML, keys after a [table] header belong to that \
                 table; move `{k} = …` above the [factors] header"
            );
        }
        factors.push((k.clone(), levels_of(k, v)?));
    }
    Ok(factors)
}

/// The part's design: as written, else `points` when it lists points, else `full`.
fn part_design(design: Option<&str>, points: &[toml::Table]) -> anyhow::Result<Design> {
    Ok(match design {
        None if !points.is_empty() => Design::Points,
        None | Some("full") => Design::Full,
        Some("2k") => Design::TwoK,
        Some("points") => Design::Points,
        Some(o) => bail!("design {o:?}: full, 2k or points"),
    })
}

/// Every factor must act on something (a workload key, or a `{factor}` placeholder of a
/// system or the corunner), and every placeholder must be a factor.
fn check_placeholders(
    f: &FileSpec,
    systems: &[usize],
    factors: &[(String, Vec<Level>)],
    corunner: &Option<String>,
) -> anyhow::Result<()> {
    let used: BTreeSet<String> = systems
        .iter()
        .flat_map(|&s| f.systems[s].placeholders())
        .chain(placeholders_in(corunner))
        .collect();
    for (fname, _) in factors {
        if !WORKLOAD_KEYS.contains(&fname.as_str()) && !used.contains(fname) {
            bail!(
                "factor {fname:?} is neither a workload key ({}) nor used as {{{fname}}} in a \
                 system's args or cpus, or the corunner",
                WORKLOAD_KEYS.join(", ")
            );
        }
    }
    for u in used.iter().filter(|u| u.as_str() != DATA_DIR) {
        if !factors.iter().any(|(f, _)| f == u) {
            bail!("a system's args (or cpus, or the corunner) use {{{u}}} but the part has no factor {u:?}");
        }
    }
    Ok(())
}

/// Checks every point's workload now, not an hour into the run (with its generator: a key
/// an external one cannot express is an error), and fills in the part's protocols and
/// generators (one per point).
fn check_workloads(part: &mut Part) -> anyhow::Result<()> {
    let dummy: std::net::SocketAddr = ([127, 0, 0, 1], 1).into();
    for pt in &part.points {
        let w = part.workload_of(pt)?;
        let cfg = w
            .config(dummy, part.duration, part.warmup, 1)
            .with_context(|| match pt.is_empty() {
                true => "the workload".to_string(),
                false => format!("point {}", levels_text(pt)),
            })?;
        part.protocols.push(cfg.protocol);
        Invocation::plan(w.generator, &w, part.duration, part.warmup).with_context(|| match pt
            .is_empty()
        {
            true => "the workload".to_string(),
            false => format!("point {}", levels_text(pt)),
        })?;
        part.generators.push(w.generator);
    }
    Ok(())
}

/// Every system of the part must serve every point's protocol, unless it is optional (then
/// its runs at those points are left out, see [`Experiment::unserved`]); a kvlab system that
/// speaks HTTP gets its `--http-port` from the lab.
fn check_protocols(systems: &[SystemSpec], part: &Part) -> anyhow::Result<()> {
    for &s in &part.systems {
        let sys = &systems[s];
        let kind = sys.kind()?;
        if let Some(&p) = part.protocols.iter().find(|&&p| !kind.serves(p)) {
            if !sys.optional {
                bail!(
                    "system {:?} cannot serve protocol = \"{}\": only a kvlab system has an HTTP \
                     interface; leave it out of this part (systems = [...]), or mark it \
                     optional = true to skip its runs at those points",
                    sys.name,
                    protocol_name(p)
                );
            }
        }
        if part.uses_http(sys)
            && sys
                .args
                .iter()
                .any(|a| a == "--http-port" || a.starts_with("--http-port="))
        {
            bail!(
                "system {:?}: remove --http-port from args; the lab picks the HTTP port itself",
                sys.name
            );
        }
    }
    let runnable =
        (0..part.points.len()).any(|k| part.systems.iter().any(|&s| part.serves(&systems[s], k)));
    if !runnable {
        bail!("no system of this part serves its protocol (only a kvlab system serves HTTP)");
    }
    Ok(())
}

/// The part's load placed on hosts (`agents`), checked: every agent host defined, every
/// point generated by kvlab bench (only it has agents), closed-loop `clients` split evenly
/// over the agents (times the instances of a system on several hosts); and a system on
/// several hosts has agents to spread over its instances.
fn check_agents(
    f: &FileSpec,
    hosts: &[kvlab_hosts::Host],
    pools: &[hosts::AgentPool],
    part: Part,
) -> anyhow::Result<Part> {
    let mut seen = BTreeSet::new();
    for a in &part.agents {
        hosts::check_agent_host(hosts, pools, "agents", a)?;
        if !seen.insert(a) {
            bail!("agents: host {a:?} is named twice (one agent per host and system instance)");
        }
    }
    for &s in &part.systems {
        let sys = &f.systems[s];
        let instances = sys.hosts().len().max(1);
        if instances > 1 && part.agents.is_empty() {
            bail!(
                "system {:?} runs on {instances} hosts: give the part agents = [\"HOST\", …] \
                 (every agent host loads each instance)",
                sys.name
            );
        }
        if part.agents.is_empty() {
            continue;
        }
        let pooled = part
            .agents
            .iter()
            .any(|a| pools.iter().any(|p| &p.name == a));
        if pooled && instances > 1 {
            bail!(
                "system {:?} runs on {instances} hosts: a pool's agents load one instance",
                sys.name
            );
        }
        let participants = part.agents.len() * instances;
        for (k, pt) in part.points.iter().enumerate() {
            if let Some(program) = part.generators[k].program() {
                bail!(
                    "agents: the load of point {} is {program}'s; only kvlab bench runs as \
                     agents on hosts (remove generator, or agents)",
                    levels_text(pt)
                );
            }
            let w = part.workload_of(pt)?;
            // A pool's agents are counted when a run starts (its Service resolved).
            if let (Some(c), false) = (w.clients, pooled) {
                if c % participants != 0 {
                    bail!(
                        "clients = {c} at point {} cannot be split evenly over {participants} \
                         agents ({} hosts x {instances} instances of system {:?})",
                        levels_text(pt),
                        part.agents.len(),
                        sys.name
                    );
                }
            }
        }
    }
    Ok(part)
}
