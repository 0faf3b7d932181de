//! Experiment files: parsing, checking, and expansion into the list of runs.
//!
//! The format is documented in the module doc of [the crate root](crate). Parsing is strict
//! (unknown keys are errors, with the key's name) so a typo never silently falls back to a
//! default.
//!
//! Here: the resolved experiment ([`Experiment`], its [`Part`]s and [`PlannedRun`]s) and the
//! defaults; `file` (the file as written, and the command-line [`Overrides`] written into
//! it), `resolve` ([`Experiment::parse`]: defaults, checks, each part resolved step by step),
//! `expand` (factors' levels, designs, points), `system` (the systems under test and their
//! flags at a point), `workload` (the workload keys, one run's load).

use kvlab_bench::Protocol;

use crate::generator::Generator;

mod expand;
mod file;
mod hosts;
mod resolve;
mod system;
mod workload;

pub use expand::{Design, Level};
pub use file::Overrides;
pub(crate) use hosts::{check_agent_host, check_defined, resolve as resolve_hosts, HostFile};
pub use hosts::{AgentPool, HostNames, HostTable, SshSpec};
pub use system::{BackendCount, BackendKind, Flags, SystemKind, SystemSpec, MAX_BACKENDS};
pub use workload::{WorkloadSpec, WORKLOAD_KEYS};

use system::render;

/// Default repetitions per point.
pub const DEFAULT_REPETITIONS: usize = 3;
/// Default measured seconds per run.
pub const DEFAULT_DURATION: f64 = kvlab_bench::load::DEFAULT_DURATION_S;
/// Default warm-up seconds per run.
pub const DEFAULT_WARMUP: f64 = 1.0;
/// Default confidence level of intervals.
pub const DEFAULT_CONFIDENCE: f64 = 0.95;
/// Default relative tolerance of model checks.
pub const DEFAULT_TOLERANCE: f64 = 0.10;
/// The built-in placeholder of a system's args: a fresh empty directory for every start of
/// the system (a durable server's `--data-dir`), removed when it stops.
pub const DATA_DIR: &str = "data_dir";
/// Default latency bound of a rate scan's sustained rate: p95 below this, µs.
pub const DEFAULT_SLO_P95_US: f64 = 1000.0;

/// One part of an experiment, resolved.
#[derive(Debug, Clone)]
pub struct Part {
    /// Name (unique in the experiment).
    pub name: String,
    /// What it is for.
    pub description: Option<String>,
    /// Indices into [`Experiment::systems`].
    pub systems: Vec<usize>,
    /// Repetitions per point.
    pub repetitions: usize,
    /// Measured seconds per run.
    pub duration: f64,
    /// Warm-up seconds per run.
    pub warmup: f64,
    /// The workload table (experiment's, overridden by the part's).
    pub workload: toml::Table,
    /// Factors and their levels, in file order.
    pub factors: Vec<(String, Vec<Level>)>,
    /// The design.
    pub design: Design,
    /// The points: each a level per factor, in factor order.
    pub points: Vec<Vec<(String, Level)>>,
    /// The protocol each point speaks (parallel to `points`).
    pub protocols: Vec<Protocol>,
    /// The load generator of each point (parallel to `points`).
    pub generators: Vec<Generator>,
    /// A command run beside each run (`sh -c`, its own process group, ended after the run):
    /// interference such as `stress-ng --cache 1 --taskset 1`; `{factor}` placeholders.
    pub corunner: Option<String>,
    /// The hosts whose `kvlab bench agent`s generate the load (empty: kvlab bench in the
    /// lab's process): the load split evenly over them, their histograms merged exactly.
    pub agents: Vec<String>,
}

impl Part {
    /// The co-runner's command at one point (`None`: none, or it renders empty).
    pub fn corunner_of(&self, levels: &[(String, Level)]) -> Option<String> {
        let c = render(std::slice::from_ref(self.corunner.as_ref()?), levels).remove(0);
        (!c.trim().is_empty()).then_some(c)
    }

    /// The workload of one point.
    pub fn workload_of(&self, levels: &[(String, Level)]) -> anyhow::Result<WorkloadSpec> {
        let mut t = self.workload.clone();
        for (f, l) in levels {
            if WORKLOAD_KEYS.contains(&f.as_str()) {
                t.insert(f.clone(), l.to_toml());
            }
        }
        toml::Value::Table(t)
            .try_into::<WorkloadSpec>()
            .map_err(|e| anyhow::anyhow!("part {:?}: workload: {}", self.name, e.message()))
    }

    /// Whether the part is a trace run (a changing open-loop rate).
    pub fn is_trace(&self) -> bool {
        self.workload.contains_key("qps_list")
    }

    /// Whether `system` can serve point `k` (its protocol).
    pub fn serves(&self, system: &SystemSpec, k: usize) -> bool {
        system
            .kind()
            .is_ok_and(|kind| kind.serves(self.protocols[k]))
    }

    /// Whether the part loads `system` over HTTP at some point: the lab then starts it with
    /// `--http-port`.
    pub fn uses_http(&self, system: &SystemSpec) -> bool {
        (0..self.points.len())
            .any(|k| self.protocols[k] == Protocol::Http && self.serves(system, k))
    }
}

/// `factor=level …`, for messages.
pub fn levels_text(levels: &[(String, Level)]) -> String {
    levels
        .iter()
        .map(|(f, l)| format!("{f}={l}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn protocol_name(p: Protocol) -> &'static str {
    p.name()
}

/// A whole experiment, resolved and checked.
#[derive(Debug, Clone)]
pub struct Experiment {
    /// Name (used in the output directory).
    pub name: String,
    /// What it is for.
    pub description: Option<String>,
    /// Confidence level of intervals.
    pub confidence: f64,
    /// Relative tolerance of model checks.
    pub tolerance: f64,
    /// A rate scan's sustained rate is the largest offered rate whose p95 stays below this
    /// (µs), with every lower rate of the scan passing too.
    pub slo_p95_us: f64,
    /// Instead: the sustained rate's bound is on the mean latency (µs).
    pub slo_mean_us: Option<f64>,
    /// Base seed (repetition i uses seed + i).
    pub seed: u64,
    /// Systems under test.
    pub systems: Vec<SystemSpec>,
    /// Parts, run in order.
    pub parts: Vec<Part>,
    /// The batch jobs' speed-up runs after the parts, if any.
    pub speedup: Option<SpeedupSpec>,
    /// The host table (`[[host]]`, or `--hosts FILE`'s).
    pub hosts: Vec<kvlab_hosts::Host>,
    /// How ssh hosts are reached (`[ssh]`).
    pub ssh: SshSpec,
    /// Pools of running agents (`[[host]]`s with `pool`).
    pub pools: Vec<AgentPool>,
}

/// An experiment's `[speedup]`: each batch job of a job file alone at each of its core
/// counts, after the parts (see [`crate::speedup`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedupSpec {
    /// The job file: shipped (`control-jobs`, `control-jobs-medium`, `control-jobs-quick`) or a path next to the
    /// experiment file.
    pub jobs: String,
    /// The CPUs to pin to (default: all this process may use).
    pub cpus: Option<String>,
    /// Runs per job and core count.
    pub repetitions: usize,
}

impl Experiment {
    /// The host named `name`.
    pub fn host(&self, name: &str) -> Option<&kvlab_hosts::Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// The hosts some role of the experiment names, in table order (a role placed on a
    /// `local` host runs here, through the same engine as on an ssh one).
    pub fn used_hosts(&self) -> Vec<kvlab_hosts::Host> {
        let mut used: Vec<String> = Vec::new();
        for s in &self.systems {
            used.extend(s.hosts());
            used.extend(s.backend_hosts.iter().cloned());
        }
        for p in &self.parts {
            used.extend(p.agents.iter().cloned());
        }
        self.hosts
            .iter()
            .filter(|h| used.contains(&h.name))
            .cloned()
            .collect()
    }

    /// Runs in the order they are measured.
    pub fn runs(&self) -> Vec<PlannedRun> {
        let mut out = Vec::new();
        for (pi, p) in self.parts.iter().enumerate() {
            for rep in 0..p.repetitions {
                for k in 0..p.points.len() {
                    for &s in p.systems.iter().filter(|&&s| p.serves(&self.systems[s], k)) {
                        out.push(PlannedRun {
                            part: pi,
                            point: k,
                            system: s,
                            repetition: rep,
                        });
                    }
                }
            }
        }
        out
    }

    /// Runs left out because an optional system cannot serve a point's protocol: (system,
    /// why), one per part and system.
    pub fn unserved(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for p in &self.parts {
            for &s in &p.systems {
                let sys = &self.systems[s];
                let not: Vec<usize> = (0..p.points.len()).filter(|&k| !p.serves(sys, k)).collect();
                if let Some(&k) = not.first() {
                    let which = if not.len() == p.points.len() {
                        "any point".to_string()
                    } else {
                        format!(
                            "{} of {} points, e.g. {}",
                            not.len(),
                            p.points.len(),
                            levels_text(&p.points[k])
                        )
                    };
                    out.push((
                        sys.name.clone(),
                        format!(
                            "part {}: not run at {which}: protocol = \"{}\" is served only by \
                             a kvlab system",
                            p.name,
                            protocol_name(p.protocols[k])
                        ),
                    ));
                }
            }
        }
        out
    }

    /// Planned seconds of one run (warm-up + measured), for the progress estimate.
    pub fn planned_seconds(&self, r: &PlannedRun) -> f64 {
        let p = &self.parts[r.part];
        // The plan's length: the duration, or a trace's own length.
        let secs = p
            .workload_of(&p.points[r.point])
            .and_then(|w| Ok(w.load(p.duration, p.warmup, self.seed)?.plan()?))
            .map_or(p.duration, |plan| plan.duration_ns() as f64 / 1e9);
        secs + p.warmup
    }
}

/// One run to do: a point of a part against a system, one repetition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedRun {
    /// Index of the part.
    pub part: usize,
    /// Index of the point in the part.
    pub point: usize,
    /// Index of the system.
    pub system: usize,
    /// Repetition, from 0.
    pub repetition: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_experiments_parse() {
        for (name, text) in crate::SHIPPED {
            if crate::workflow::is_workflow(text) {
                crate::workflow::WorkflowSpec::parse(text)
                    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
                continue;
            }
            if crate::scaling::is_scaling(text) {
                crate::scaling::ScalingSpec::parse(text, name)
                    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
                continue;
            }
            if crate::faults::is_faults(text) {
                crate::faults::FaultsSpec::parse(text, name, &Overrides::default())
                    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
                continue;
            }
            if crate::ring::is_ring(text) {
                crate::ring::RingSpec::parse(text, name)
                    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
                continue;
            }
            let e = Experiment::parse(text, name, &Overrides::default())
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert!(!e.runs().is_empty(), "{name}");
        }
    }

    /// Every `experiments/*.toml` is built in (so `shipped_experiments_parse` reads it):
    /// an experiment in `SHIPPED`, or a job file in `workflow::SHIPPED_JOBS`, with the
    /// file's text.
    #[test]
    fn every_experiment_file_is_built_in() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|x| x != "toml") {
                continue;
            }
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            let built_in = crate::SHIPPED
                .iter()
                .chain(crate::workflow::SHIPPED_JOBS)
                .find(|(name, _)| *name == stem)
                .unwrap_or_else(|| panic!("{} is not in lib.rs' SHIPPED", path.display()));
            assert_eq!(built_in.1, text, "{stem}");
            n += 1;
        }
        assert_eq!(
            n,
            crate::SHIPPED.len() + crate::workflow::SHIPPED_JOBS.len()
        );
    }

    #[test]
    fn data_dir_is_built_in_and_other_placeholders_need_a_factor() {
        let file = |arg: &str| {
            format!(
                "[[system]]\nname = \"kvlab\"\nargs = [\"--data-dir\", \"{arg}\"]\n\
                 [factors]\nclients = [1, 2]\n"
            )
        };
        let e = Experiment::parse(&file("{data_dir}"), "x", &Overrides::default()).unwrap();
        assert_eq!(
            e.systems[0].render_args(&e.parts[0].points[0])[1],
            "{data_dir}"
        );
        let err = Experiment::parse(&file("{dir}"), "x", &Overrides::default()).unwrap_err();
        assert!(format!("{err:#}").contains("no factor \"dir\""), "{err:#}");
    }

    #[test]
    fn cpus_and_the_corunner_are_factors() {
        let e = Experiment::parse(
            r#"
            corunner = "stress-ng --{stressor} 1 --taskset 0"
            [[system]]
            name = "kvlab"
            args = ["-t", "{threads}"]
            cpus = "{cpus}"
            [workload]
            qps = 1000
            [factors]
            threads = [1, 2]
            cpus = ["0", "0-1"]
            stressor = ["cpu", "stream"]
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let p = &e.parts[0];
        let last = p.points.last().unwrap();
        assert_eq!(
            e.systems[0].render(last).unwrap().cpus.as_deref(),
            Some("0-1")
        );
        assert_eq!(
            p.corunner_of(last).as_deref(),
            Some("stress-ng --stream 1 --taskset 0")
        );
        // A corunner placeholder needs its factor; a bad CPU list is refused.
        for (text, want) in [
            (
                "corunner = \"x {k}\"\n[[system]]\nname = \"kvlab\"\n",
                "no factor \"k\"",
            ),
            (
                "[[system]]\nname = \"kvlab\"\ncpus = \"{c}\"\n[factors]\nc = [\"a\"]\n",
                "not a CPU list",
            ),
        ] {
            let err = Experiment::parse(text, "x", &Overrides::default()).unwrap_err();
            assert!(format!("{err:#}").contains(want), "{err:#}");
        }
    }

    #[test]
    fn ranges_and_2k_expand() {
        let e = Experiment::parse(
            r#"
            design = "2k"
            [[system]]
            name = "kvlab"
            args = ["-t", "{server_threads}"]
            [workload]
            clients = 4
            [factors]
            server_threads = [1, 4]
            value_size = [100, 10000]
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let p = &e.parts[0];
        assert_eq!(p.points.len(), 4);
        assert_eq!(p.points[1][0].1, Level::Int(4));
        assert_eq!(p.points[1][1].1, Level::Int(100));
        let e = Experiment::parse(
            r#"
            [[system]]
            name = "kvlab"
            [factors]
            qps = { from = 5000, to = 125000, step = 5000 }
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(e.parts[0].points.len(), 25);
    }

    #[test]
    fn typos_are_errors() {
        let err = Experiment::parse(
            "[[system]]\nname = \"kvlab\"\n[workload]\nclient = 3\n",
            "x",
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("client"), "{err:#}");
        let err = Experiment::parse(
            "[[system]]\nname = \"kvlab\"\n[factors]\nserver_threads = [1, 2]\n",
            "x",
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("server_threads"), "{err:#}");
    }

    #[test]
    fn http_points_leave_out_optional_systems_that_cannot_serve_them() {
        let e = Experiment::parse(
            r#"
            [[system]]
            name = "kvlab"
            [[system]]
            name = "memcached"
            optional = true
            [factors]
            protocol = ["memcached", "http"]
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let p = &e.parts[0];
        assert_eq!(p.protocols, [Protocol::Memcached, Protocol::Http]);
        let runs: Vec<(usize, usize)> = e.runs().iter().map(|r| (r.point, r.system)).collect();
        assert_eq!(runs.len(), 3 * DEFAULT_REPETITIONS);
        assert!(!runs.contains(&(1, 1)), "memcached at the HTTP point");
        assert!(p.uses_http(&e.systems[0]) && !p.uses_http(&e.systems[1]));
        assert_eq!(e.unserved().len(), 1);
        assert!(
            e.unserved()[0].1.contains("protocol=http"),
            "{:?}",
            e.unserved()
        );
    }

    #[test]
    fn meta_points_are_served_by_every_system() {
        let e = Experiment::parse(
            r#"
            [[system]]
            name = "kvlab"
            [[system]]
            name = "memcached"
            [workload]
            meta_base64 = true
            [factors]
            protocol = ["memcached", "meta"]
            "#,
            "x",
            &Overrides::default(),
        );
        // meta_base64 with the text protocol is refused...
        let err = e.unwrap_err();
        assert!(format!("{err:#}").contains("needs protocol"), "{err:#}");
        // ...and a meta point runs on both systems, over their memcached port.
        let e = Experiment::parse(
            r#"
            [[system]]
            name = "kvlab"
            [[system]]
            name = "memcached"
            [workload]
            protocol = "meta"
            meta_base64 = true
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let p = &e.parts[0];
        assert_eq!(p.protocols, [Protocol::Meta]);
        assert_eq!(e.runs().len(), 2 * DEFAULT_REPETITIONS);
        assert!(e.unserved().is_empty());
        assert!(!p.uses_http(&e.systems[0]) && !p.uses_http(&e.systems[1]));
    }

    #[test]
    fn set_values_are_toml_or_text() {
        let ov = Overrides {
            set: [
                "keys=1000",
                "mix=get=9,set=1",
                "verify=true",
                "qps_list=[1, 2.5]",
            ]
            .map(String::from)
            .to_vec(),
            ..Overrides::default()
        };
        let a = ov.assignments().unwrap();
        assert_eq!(a[0], ("keys".into(), toml::Value::Integer(1000)));
        assert_eq!(
            a[1],
            ("mix".into(), toml::Value::String("get=9,set=1".into()))
        );
        assert_eq!(a[2], ("verify".into(), toml::Value::Boolean(true)));
        assert!(a[3].1.is_array());
        assert_eq!(
            ov.flags(),
            "--set keys=1000 --set mix=get=9,set=1 --set verify=true --set qps_list=[1, 2.5]"
        );
    }

    #[test]
    fn proxy_systems_render_their_backends_and_are_checked() {
        let e = Experiment::parse(
            r#"
            [[system]]
            name = "proxy"
            args = ["-t", "{workers}", "--io", "epoll"]
            backends = "{backends}"
            backend = "memcached"
            backend_args = ["-m", "{mem}"]
            [factors]
            backends = [1, 3]
            workers = [8]
            mem = [64]
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let sys = &e.systems[0];
        assert_eq!(sys.kind().unwrap(), SystemKind::Proxy);
        let flags = sys.render(&e.parts[0].points[1]).unwrap();
        assert_eq!(flags.args, ["-t", "8", "--io", "epoll"]);
        assert_eq!(flags.backends, Some((3, vec!["-m".into(), "64".into()])));
        let b = sys.backend_spec(2, vec!["-m".into(), "64".into()]);
        assert_eq!(b.kind, Some(SystemKind::Memcached));
        assert_eq!(b.name, "proxy-backend2");
        // Defaults: one kvlab backend, no flags.
        let e = Experiment::parse(
            "[[system]]\nname = \"p\"\nkind = \"proxy\"\n",
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let flags = e.systems[0].render(&[]).unwrap();
        assert_eq!(flags.backends, Some((1, Vec::new())));
        assert_eq!(
            e.systems[0].backend_spec(0, Vec::new()).kind,
            Some(SystemKind::Kvlab)
        );
        // A kvlab server has no backends.
        let e = Experiment::parse("[[system]]\nname = \"kvlab\"\n", "x", &Overrides::default())
            .unwrap();
        assert_eq!(e.systems[0].render(&[]).unwrap().backends, None);

        let err = |text: &str| {
            let e = Experiment::parse(text, "x", &Overrides::default()).unwrap_err();
            format!("{e:#}")
        };
        let proxy = "[[system]]\nname = \"p\"\nkind = \"proxy\"\n";
        let e = err(&format!("{proxy}backends = 0\n"));
        assert!(e.contains("1 to 64 backends"), "{e}");
        let e = err(&format!(
            "{proxy}backends = \"{{n}}\"\n[factors]\nn = [1, 0]\nclients = [1]\n"
        ));
        assert!(e.contains("backends = 0"), "{e}");
        let e = err(&format!(
            "{proxy}backends = \"{{n}}\"\n[factors]\nn = [\"two\"]\n"
        ));
        assert!(e.contains("not a number"), "{e}");
        let e = err(&format!("{proxy}backends = \"three\"\n"));
        assert!(e.contains("give a number"), "{e}");
        let e = err(&format!("{proxy}address = \"127.0.0.1:1\"\n"));
        assert!(e.contains("address is only for"), "{e}");
        let e = err(&format!("{proxy}args = [\"--backend\", \"127.0.0.1:1\"]\n"));
        assert!(e.contains("remove --backend"), "{e}");
        let e = err(&format!("{proxy}backend = \"redis\"\n"));
        assert!(e.contains("redis"), "{e}");
        let e = err("[[system]]\nname = \"kvlab\"\nbackends = 3\nbackend_args = [\"-t\"]\n");
        assert!(
            e.contains("backends, backend_args are only for kind = \"proxy\""),
            "{e}"
        );
        let e = err(&format!("{proxy}backend_arg = []\n"));
        assert!(e.contains("backend_arg"), "{e}");
        // A proxy has no HTTP interface.
        let e = err(&format!("{proxy}[workload]\nprotocol = \"http\"\n"));
        assert!(e.contains("cannot serve protocol"), "{e}");
    }

    #[test]
    fn a_mean_bound_and_fresh_systems() {
        let e = Experiment::parse(
            "slo_mean_us = 1000\n[[system]]\nname = \"kvlab\"\nfresh = true\n",
            "x",
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(e.slo_mean_us, Some(1000.0));
        assert!(e.systems[0].fresh);
        let err = Experiment::parse(
            "slo_mean_us = 1000\nslo_p95_us = 900\n[[system]]\nname = \"kvlab\"\n",
            "x",
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("not both"), "{err:#}");
    }

    #[test]
    fn hosts_are_a_table_that_roles_name() {
        let base = r#"
            [[host]]
            name = "s1"
            ssh = "root@10.0.0.1"
            [[host]]
            name = "c1"
            ssh = "lab@10.0.0.2:2222"
            [[host]]
            name = "c2"
            ssh = "lab@10.0.0.3"
            [[host]]
            name = "here"
            [[system]]
            name = "kvlab"
            host = "s1"
            [workload]
            clients = 4
            "#;
        let e = Experiment::parse(
            &format!("agents = [\"c1\", \"c2\"]\n{base}"),
            "x",
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(e.parts[0].agents, ["c1", "c2"]);
        assert_eq!(e.systems[0].hosts(), ["s1"]);
        assert!(e.host("s1").is_some() && e.host("here").unwrap().is_local());
        let used: Vec<String> = e.used_hosts().into_iter().map(|h| h.name).collect();
        assert_eq!(used, ["s1", "c1", "c2"]);
        // Without hosts, nothing changes: every role runs here.
        let e = Experiment::parse("[[system]]\nname = \"kvlab\"\n", "x", &Overrides::default())
            .unwrap();
        assert!(e.hosts.is_empty() && e.used_hosts().is_empty());

        let err = |text: &str| {
            let e = Experiment::parse(text, "x", &Overrides::default()).unwrap_err();
            format!("{e:#}")
        };
        let e = err("[[system]]\nname = \"kvlab\"\nhost = \"nowhere\"\n");
        assert!(
            e.contains("system \"kvlab\": host \"nowhere\" is not defined (the experiment has no [[host]] table)"),
            "{e}"
        );
        let e = err(&format!("agents = [\"c9\"]\n{base}"));
        assert!(
            e.contains("agents: host \"c9\" is not defined ([[host]] names: s1, c1, c2, here)"),
            "{e}"
        );
        let e = err("[[host]]\nname = \"a\"\nssh = \"root@h\"\nlocal = true\n[[system]]\nname = \"kvlab\"\n");
        assert!(e.contains("local = true and ssh = \"…\" both set"), "{e}");
        let e = err("[[host]]\nname = \"a\"\nssh = \"root@\"\n[[system]]\nname = \"kvlab\"\n");
        assert!(e.contains("host a: ssh = "), "{e}");
        let e = err(&format!(
            "agents = [\"c1\", \"c2\"]\n{}",
            base.replace("clients = 4", "clients = 3")
        ));
        assert!(
            e.contains("clients = 3 at point  cannot be split evenly over 2 agents"),
            "{e}"
        );
        let e = err(&base.replace("host = \"s1\"", "host = [\"s1\", \"c1\"]"));
        assert!(e.contains("runs on 2 hosts: give the part agents"), "{e}");
        let e = err("[[system]]\nname = \"e\"\nkind = \"external\"\naddress = \"127.0.0.1:1\"\nhost = \"x\"\n");
        assert!(
            e.contains("an external system is reached at its address"),
            "{e}"
        );
        let e = err("[[system]]\nname = \"kvlab\"\nbackend_hosts = [\"s1\"]\n");
        assert!(e.contains("backend_hosts is only for kind"), "{e}");

        // A host table from a file of its own replaces the experiment's.
        let table = HostTable {
            file: "lab.toml".into(),
            text: "[ssh]\nidentity = \"/k\"\n[[host]]\nname = \"s1\"\nssh = \"me@node1.example\"\n\
                   [[host]]\nname = \"c1\"\nssh = \"me@node2\"\n[[host]]\nname = \"c2\"\nlocal = true\n"
                .into(),
        };
        let ov = Overrides {
            hosts: Some(table),
            ..Overrides::default()
        };
        let e = Experiment::parse(&format!("agents = [\"c1\", \"c2\"]\n{base}"), "x", &ov).unwrap();
        assert_eq!(e.host("s1").unwrap().address(), "node1.example");
        assert!(e.host("c2").unwrap().is_local());
        assert_eq!(e.ssh.identity.as_deref(), Some(std::path::Path::new("/k")));
        assert_eq!(ov.flags(), "--hosts lab.toml");
    }

    #[test]
    fn a_pool_of_running_agents_is_a_host_agents_name() {
        let text = |clients: u32| {
            format!(
                "agents = [\"k8s\"]\n[workload]\nclients = {clients}\n[[system]]\nname = \"kvlab\"\n\
                 host = \"s1\"\n[[host]]\nname = \"s1\"\nlocal = true\naddress = \"10.0.0.9\"\n\
                 [[host]]\nname = \"k8s\"\npool = \"kvlab-bench-agent:5556\"\n"
            )
        };
        // Clients split over the pool's agents when a run resolves it: 7 is not refused now.
        let e = Experiment::parse(&text(7), "x", &Overrides::default()).unwrap();
        assert_eq!(e.parts[0].agents, ["k8s"]);
        assert_eq!(
            e.pools,
            [AgentPool {
                name: "k8s".into(),
                address: "kvlab-bench-agent:5556".into()
            }]
        );
        // Not a host the lab connects to; the local one listens at its address.
        let used: Vec<String> = e.used_hosts().into_iter().map(|h| h.name).collect();
        assert_eq!(used, ["s1"]);
        assert_eq!(e.host("s1").unwrap().address(), "10.0.0.9");
        let pool = AgentPool {
            name: "p".into(),
            address: "127.0.0.1:5556".into(),
        };
        assert_eq!(pool.resolve().unwrap().len(), 1);
        for (from, to, says) in [
            ("pool = ", "ssh = \"root@h\"\npool = ", "takes no ssh"),
            ("kvlab-bench-agent:5556", "kvlab-bench-agent", "NAME:PORT"),
            (
                "address = \"10.0.0.9\"",
                "address = \"a b\"",
                "an IP address or a host name",
            ),
        ] {
            let e = Experiment::parse(&text(6).replace(from, to), "x", &Overrides::default())
                .unwrap_err();
            assert!(format!("{e:#}").contains(says), "{to}: {e:#}");
        }
    }

    #[test]
    fn clients_split_over_threads() {
        let mut w: WorkloadSpec = toml::from_str("clients = 6\nthreads = 4").unwrap();
        assert_eq!(w.threads_connections(), (3, 2));
        w.clients = Some(1);
        assert_eq!(w.threads_connections(), (1, 1));
    }
}
