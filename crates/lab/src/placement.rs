//! An experiment's processes placed on its hosts, through [`kvlab_hosts`]: every host a role
//! names connected once (one ssh control connection each), the tools each needs checked
//! before anything starts, the kvlab binary shipped, a run directory made, clocks compared
//! at the start and the end; systems and `kvlab bench agent`s started there, read (their CPU,
//! the host's busy, steal and load from `/proc`), stopped, their logs brought back; and on
//! success, error, Ctrl-C or a lost host, everything stopped on every host.
//!
//! ```text
//! runner ── Placement::open(exp) ── Fleet::connect ─ check_tools ─ ship ─ run dirs ─ clocks
//!   │  system::Instance::start(.., Some(placement))  start ─ ready over the network
//!   │  Placement::agents(part)                        `kvlab bench agent --listen ADDR:PORT` once
//!   │  Placement::read(procs)                         every host at once, each interval
//!   └─ Placement::finish                              clocks again, teardown, logs fetched
//! ```
//!
//! ssh carries control only: systems listen on their host's address, the load (agents) and
//! the lab's readiness probes and `stats` go over the network.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_hosts::{ClockOffset, Fleet, Host, MachineReading, Remote, Started};
use kvlab_process::Probe;
use serde::{Deserialize, Serialize};

use crate::spec::{AgentPool, Experiment, SshSpec, SystemKind, SystemSpec};

/// Round trips per clock estimate (the tightest is kept).
const CLOCK_ROUNDS: u32 = 8;
/// The first port the lab tries on a host (then upwards, skipping those in use).
const FIRST_PORT: u16 = 21_000;
/// How long an agent has to listen.
const AGENT_READY: Duration = Duration::from_secs(20);

/// A host's clock against the lab's, as stored in `meta.json`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Clock {
    /// The host's clock minus the lab's, ns.
    pub offset_ns: i64,
    /// How far the true offset may be from it, ns.
    pub bound_ns: u64,
}

impl From<ClockOffset> for Clock {
    fn from(o: ClockOffset) -> Clock {
        Clock {
            offset_ns: o.offset_ns,
            bound_ns: o.bound_ns,
        }
    }
}

impl std::fmt::Display for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:+.3} ms ± {:.3} ms",
            self.offset_ns as f64 / 1e6,
            self.bound_ns as f64 / 1e6
        )
    }
}

/// A host of the experiment as `meta.json` keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostMeta {
    /// Its name.
    pub name: String,
    /// How it was reached (`local`, `ssh user@address`).
    pub reach: String,
    /// The address its systems listened on.
    pub address: String,
    /// Its clock at the start of the experiment.
    pub clock_start: Option<Clock>,
    /// And at the end.
    pub clock_end: Option<Clock>,
}

/// A process the lab placed on a host, as a raw run names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedProcess {
    /// What it is (`proxy-3`, `proxy-3.backend0`, `agent-c1-0`).
    pub name: String,
    /// Its host.
    pub host: String,
    /// Its pid there.
    pub pid: u32,
    /// Its network namespace there (the inode `/proc/PID/ns/net` names), read when it
    /// started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<u64>,
}

/// A host's machine over one run's measured time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostCpu {
    /// The host.
    pub host: String,
    /// CPUs busy, cores.
    pub busy_cores: f64,
    /// Its CPUs (the ticks of all its CPUs over the time, in seconds of it; 0: not read).
    #[serde(default)]
    pub cpus: usize,
    /// Stolen time, share of all its CPUs' time.
    pub steal: f64,
    /// Its 1-minute load average at the end.
    pub load1: f64,
    /// The lab's processes on it: name and CPU (cores busy) over the measured time.
    pub processes: Vec<(String, f64)>,
}

/// What an experiment places: the hosts some role names, the agent pools, how ssh
/// reaches them, and its systems (what each host needs to run is checked).
#[derive(Debug, Clone, Copy)]
pub struct Roles<'a> {
    /// The hosts some role names.
    pub hosts: &'a [Host],
    /// The agent pools some role names.
    pub pools: &'a [AgentPool],
    /// How ssh hosts are reached.
    pub ssh: &'a SshSpec,
    /// The systems, some placed on `hosts`.
    pub systems: &'a [SystemSpec],
    /// On Ctrl-C or SIGTERM: tear everything down on every host and exit (130). Without
    /// it, the experiment stops by its own handler and tears down as it ends (or when the
    /// placement is dropped).
    pub exit_on_interrupt: bool,
}

/// The hosts of one experiment, connected (see the module docs).
pub struct Placement {
    fleet: Fleet,
    /// Each host's path to the kvlab binary.
    bins: HashMap<String, String>,
    /// Each host's user is root (memcached then needs `-u root`).
    root: HashMap<String, bool>,
    /// The next port to try, per host.
    ports: Mutex<HashMap<String, u16>>,
    /// Agents started: (host, instance) → where they listen, and the process.
    agents: Mutex<Vec<(String, usize, SocketAddr, Started)>>,
    clocks: HashMap<String, Clock>,
    /// Each started process' network namespace on its host: (host, pid) → inode.
    netns: Mutex<HashMap<(String, u32), u64>>,
    /// Where fetched logs go.
    logs: PathBuf,
    /// Pools of agents someone else runs (named by `agents` like hosts).
    pools: Vec<AgentPool>,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("fleet", &self.fleet)
            .finish_non_exhaustive()
    }
}

/// The name of a run's directory on its hosts: the results directory's name, its other
/// characters than letters, digits and `._-` as `_`.
pub fn run_name(out: &Path) -> String {
    out.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Which programs each of `hosts` needs for the roles placed on it (`systems` theirs).
fn tools<'a>(hosts: &[Host], systems: &'a [SystemSpec]) -> Vec<(String, Vec<&'a str>)> {
    let mut needs: HashMap<String, BTreeSet<&str>> = HashMap::new();
    let base = ["sh", "setsid", "timeout", "sha256sum", "cat"];
    for h in hosts {
        needs.entry(h.name.clone()).or_default().extend(base);
    }
    for s in systems {
        let Ok(kind) = s.kind() else { continue };
        let program = match (kind, &s.binary) {
            (SystemKind::External, _) => None,
            (_, Some(b)) => Some(b.as_str()),
            (SystemKind::Memcached, None) => Some("memcached"),
            (SystemKind::Twemproxy, None) => Some("nutcracker"),
            _ => None,
        };
        for h in s.hosts() {
            let e = needs.entry(h).or_default();
            e.extend(program);
            if s.cpus.is_some() {
                e.insert("taskset");
            }
        }
        if kind.has_backends() {
            let b = s.backend_spec(0, Vec::new());
            let hosts = if s.backend_hosts.is_empty() {
                b.hosts()
            } else {
                s.backend_hosts.clone()
            };
            if b.kind == Some(SystemKind::Memcached) {
                for h in hosts {
                    needs.entry(h).or_default().insert("memcached");
                }
            }
        }
    }
    let mut out: Vec<(String, Vec<&str>)> = needs
        .into_iter()
        .map(|(h, t)| (h, t.into_iter().collect()))
        .collect();
    out.sort();
    out
}

impl Placement {
    /// Connects the experiment's hosts and prepares them for run `run` (a directory name):
    /// `None` when no role names a host. Fails — naming each host and what is wrong, with
    /// nothing started anywhere — when a host cannot be reached or lacks a tool.
    pub fn open(
        exp: &Experiment,
        kvlab_bin: Option<&Path>,
        run: &str,
        logs: &Path,
    ) -> anyhow::Result<Option<Arc<Placement>>> {
        let hosts = exp.used_hosts();
        let pools: Vec<AgentPool> = exp
            .pools
            .iter()
            .filter(|p| exp.parts.iter().any(|part| part.agents.contains(&p.name)))
            .cloned()
            .collect();
        let roles = Roles {
            hosts: &hosts,
            pools: &pools,
            ssh: &exp.ssh,
            systems: &exp.systems,
            exit_on_interrupt: true,
        };
        Placement::open_hosts(&roles, kvlab_bin, run, logs)
    }

    /// As [`Placement::open`], for `roles`: the other kinds of experiment (the control
    /// workflow) place their roles through it.
    pub fn open_hosts(
        roles: &Roles,
        kvlab_bin: Option<&Path>,
        run: &str,
        logs: &Path,
    ) -> anyhow::Result<Option<Arc<Placement>>> {
        let Roles {
            hosts,
            pools,
            ssh,
            systems,
            exit_on_interrupt,
        } = *roles;
        if hosts.is_empty() && pools.is_empty() {
            return Ok(None);
        }
        for p in pools {
            // Reachable now, or nothing starts.
            let agents = p.resolve()?;
            eprintln!(
                "hosts: agent pool {} at {}: {} agents",
                p.name,
                p.address,
                agents.len()
            );
        }
        let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
        eprintln!("hosts: connecting {}", names.join(", "));
        let fleet = Fleet::connect(hosts, ssh.settings()).context("connecting the hosts")?;
        let needs = tools(hosts, systems);
        let needs: Vec<(&str, Vec<&str>)> =
            needs.iter().map(|(h, t)| (h.as_str(), t.clone())).collect();
        fleet
            .check_tools(&needs)
            .context("before any run: the hosts' tools")?;
        let bin = kvlab_bin.context(
            "roles placed on hosts run the kvlab executable there: set KVLAB_BIN (or run the lab \
             from kvlab)",
        )?;
        let bins = fleet.ship(bin).context("shipping kvlab to the hosts")?;
        fleet
            .make_run_dirs(run)
            .context("making the hosts' run directories")?;
        let root = fleet
            .each(|r| {
                Ok((
                    r.name().to_string(),
                    r.run("asking the user", "id -u")?.trim() == "0",
                ))
            })
            .into_iter()
            .collect::<kvlab_hosts::Result<HashMap<_, _>>>()?;
        let clocks: HashMap<String, Clock> = fleet
            .clock_offsets(CLOCK_ROUNDS)
            .context("measuring the hosts' clocks")?
            .into_iter()
            .map(|(h, o)| (h, o.into()))
            .collect();
        for (h, c) in &clocks {
            eprintln!("hosts: {h}: clock {c}");
        }
        if exit_on_interrupt {
            kvlab_hosts::teardown_on_interrupt(fleet.teardown_handle())
                .context("watching for Ctrl-C")?;
        }
        Ok(Some(Arc::new(Placement {
            fleet,
            bins,
            root,
            ports: Mutex::new(HashMap::new()),
            agents: Mutex::new(Vec::new()),
            clocks,
            netns: Mutex::new(HashMap::new()),
            logs: logs.to_path_buf(),
            pools: pools.to_vec(),
        })))
    }

    /// The connected host `name`.
    pub fn remote(&self, name: &str) -> anyhow::Result<&Remote> {
        self.fleet
            .get(name)
            .with_context(|| format!("host {name:?} is not connected"))
    }

    /// The address systems on host `name` listen on.
    pub fn address(&self, name: &str) -> anyhow::Result<String> {
        Ok(self.remote(name)?.host().address().to_string())
    }

    /// The kvlab executable on host `name`.
    pub fn kvlab(&self, name: &str) -> anyhow::Result<String> {
        self.bins
            .get(name)
            .cloned()
            .with_context(|| format!("host {name:?}: kvlab was not shipped there"))
    }

    /// Whether host `name`'s user is root.
    pub fn is_root(&self, name: &str) -> bool {
        self.root.get(name).copied().unwrap_or(false)
    }

    /// Host `name`'s run directory.
    pub fn run_dir(&self, name: &str) -> anyhow::Result<String> {
        self.remote(name)?
            .run_dir()
            .with_context(|| format!("host {name:?}: no run directory"))
    }

    /// `n` ports no one listens on at host `name` (read from its `/proc/net/tcp*`), each
    /// above the last the lab handed out there.
    pub fn free_ports(&self, name: &str, n: usize) -> anyhow::Result<Vec<u16>> {
        let out = self.remote(name)?.run(
            "listing the listening ports",
            "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null",
        )?;
        // Lines: `sl local_address rem_address st …`; state 0A is LISTEN.
        let busy: BTreeSet<u16> = out
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let local = w.nth(1)?;
                let state = w.nth(1)?;
                (state == "0A")
                    .then(|| u16::from_str_radix(local.rsplit(':').next()?, 16).ok())
                    .flatten()
            })
            .collect();
        let mut ports = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        let next = ports.entry(name.to_string()).or_insert(FIRST_PORT);
        let mut out = Vec::new();
        while out.len() < n {
            if *next == u16::MAX {
                bail!("host {name}: no free port left above {FIRST_PORT}");
            }
            if !busy.contains(next) {
                out.push(*next);
            }
            *next += 1;
        }
        Ok(out)
    }

    /// Starts `argv` as `name` on host `host` (see [`Remote::start`]).
    pub fn start(&self, host: &str, name: &str, argv: &[String]) -> anyhow::Result<Started> {
        let r = self.remote(host)?;
        let p = r.start(name, argv)?;
        // `net:[INODE]`, as the process wrote it before it became `argv` (see
        // [`Remote::start`]); if it has not yet, as /proc says while it runs.
        let netns = format!("{}.netns", p.log.strip_suffix(".log").unwrap_or(&p.log));
        let ns = r
            .run(
                "reading its namespace",
                &format!(
                    "f={}; if [ -s \"$f\" ]; then cat \"$f\"; else readlink /proc/{}/ns/net || true; fi",
                    kvlab_hosts::quote(&netns),
                    p.pid
                ),
            )
            .ok()
            .and_then(|t| {
                t.trim()
                    .strip_prefix("net:[")?
                    .strip_suffix(']')?
                    .parse()
                    .ok()
            });
        if let Some(ns) = ns {
            self.lock_netns().insert((host.to_string(), p.pid), ns);
        }
        Ok(p)
    }

    fn lock_netns(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u32), u64>> {
        self.netns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `p` as a raw run names it.
    pub fn described(&self, p: &Started) -> PlacedProcess {
        PlacedProcess {
            name: p.name.clone(),
            host: p.host.clone(),
            pid: p.pid,
            netns: self.lock_netns().get(&(p.host.clone(), p.pid)).copied(),
        }
    }

    /// Stops `p` and brings its log back to `log` (a failure to is said, not fatal: the
    /// log stays in the host's run directory).
    pub fn stop(&self, p: &Started, log: &Path) {
        let r = match self.remote(&p.host) {
            Ok(r) => r,
            Err(e) => return eprintln!("note: {e:#}"),
        };
        if let Err(e) = r.stop(p) {
            eprintln!("note: stopping {} on host {}: {e}", p.name, p.host);
        }
        if let Err(e) = r.fetch(&p.log, log) {
            eprintln!("note: fetching {}'s log from host {}: {e}", p.name, p.host);
        }
    }

    /// `kill -9` of `p` on its host (a crash, as a scaling experiment's kill event): SIGKILL
    /// to its process group, if it is still the process started (pid and start time);
    /// waits until it is gone. It stays recorded: the teardown finds it gone.
    pub fn kill(&self, p: &Started) -> anyhow::Result<()> {
        let script = format!(
            "alive() {{ s=$(cat /proc/{pid}/stat 2>/dev/null) || return 1; s=${{s##*) }}; \
             set -- $s; [ \"$1\" != Z ] && [ \"${{20}}\" = {st} ]; }}\n\
             alive || {{ echo 'not running' >&2; exit 1; }}\n\
             kill -KILL -{pid} 2>/dev/null || kill -KILL {pid}\n\
             i=0; while alive && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done\n\
             ! alive",
            pid = p.pid,
            st = p.start_time
        );
        self.run(
            &p.host,
            &format!("kill -9 of {} (pid {})", p.name, p.pid),
            &script,
        )
        .map(|_| ())
    }

    /// Writes `text` to `path` on host `host`.
    pub fn write(&self, host: &str, path: &str, text: &str) -> anyhow::Result<()> {
        let q = kvlab_hosts::quote;
        self.remote(host)?.run(
            &format!("writing {path}"),
            &format!("printf '%s' {} > {}", q(text), q(path)),
        )?;
        Ok(())
    }

    /// Runs a script on host `host`.
    pub fn run(&self, host: &str, what: &str, script: &str) -> anyhow::Result<String> {
        Ok(self.remote(host)?.run(what, script)?)
    }

    /// Runs a script on host `host` that may take up to `limit`.
    pub fn run_for(
        &self,
        host: &str,
        what: &str,
        script: &str,
        limit: Duration,
    ) -> anyhow::Result<String> {
        Ok(self.remote(host)?.run_for(what, script, limit)?)
    }

    /// Checks that each host has the programs its roles need besides those of the
    /// experiment's systems (`needs`: host name → programs): one error listing every
    /// host's missing tools.
    pub fn check_tools(&self, needs: &[(&str, Vec<&str>)]) -> anyhow::Result<()> {
        Ok(self.fleet.check_tools(needs)?)
    }

    /// Host `host`'s clock at the start.
    pub fn clock(&self, host: &str) -> Option<Clock> {
        self.clocks.get(host).copied()
    }

    /// The part's agents, one on each of `hosts` for each of `targets` (a system's
    /// instances), started on first use and kept for the experiment: each as the bench
    /// master sees it, its clock offset measured at the start. Refused when a host's clock
    /// bound exceeds `interval`: its time series could not be merged with the others'. A
    /// pool named among `hosts` gives every agent its name resolves to now (one target
    /// only), its clocks taken as the lab's.
    pub fn agents(
        &self,
        hosts: &[String],
        targets: &[SocketAddr],
        interval: Duration,
    ) -> anyhow::Result<Vec<(String, kvlab_bench::run::Agent)>> {
        let mut out = Vec::new();
        for h in hosts {
            if let Some(pool) = self.pools.iter().find(|p| &p.name == h) {
                let [target] = targets else {
                    bail!("agent pool {h}: its agents load one system instance");
                };
                for addr in pool.resolve()? {
                    out.push((
                        h.clone(),
                        kvlab_bench::run::Agent {
                            addr,
                            target: Some(*target),
                            clock_offset_ns: 0,
                        },
                    ));
                }
                continue;
            }
            let clock = self.clock(h).unwrap_or(Clock {
                offset_ns: 0,
                bound_ns: 0,
            });
            if u128::from(clock.bound_ns) > interval.as_nanos() {
                bail!(
                    "host {h}: its clock's offset is known only to ± {:.3} ms, more than the \
                     series' interval ({:?}): its time series cannot be merged with the others' \
                     (a longer interval, or a host nearer the lab)",
                    clock.bound_ns as f64 / 1e6,
                    interval
                );
            }
            for (j, &target) in targets.iter().enumerate() {
                let addr = self.agent(h, j)?;
                out.push((
                    h.clone(),
                    kvlab_bench::run::Agent {
                        addr,
                        target: Some(target),
                        clock_offset_ns: clock.offset_ns,
                    },
                ));
            }
        }
        Ok(out)
    }

    /// The agent `j` on host `host`, started if it is not running yet.
    fn agent(&self, host: &str, j: usize) -> anyhow::Result<SocketAddr> {
        let mut agents = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, addr, _)) = agents.iter().find(|(h, i, _, _)| h == host && *i == j) {
            return Ok(*addr);
        }
        let port = self.free_ports(host, 1)?[0];
        let addr: SocketAddr = format!("{}:{port}", self.address(host)?)
            .parse()
            .with_context(|| format!("host {host}: its address is not an IP address"))?;
        let name = format!("agent-{host}-{j}");
        let p = self.start(
            host,
            &name,
            &[
                self.kvlab(host)?,
                "bench".into(),
                "agent".into(),
                "--listen".into(),
                addr.to_string(),
            ],
        )?;
        kvlab_process::wait_ready(&Probe::Connects(addr), AGENT_READY)
            .with_context(|| format!("host {host}: agent {name} at {addr} does not listen"))?;
        agents.push((host.to_string(), j, addr, p));
        Ok(addr)
    }

    /// The agents started so far, as processes.
    pub fn agent_processes(&self) -> Vec<Started> {
        let agents = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        agents.iter().map(|(_, _, _, p)| p.clone()).collect()
    }

    /// A reading of every host at once: its machine, and the CPU seconds of those of
    /// `procs` that run on it.
    pub fn read(&self, procs: &[Started]) -> HostsReading {
        let at = Instant::now();
        let per = self.fleet.each(|r| {
            let mine: Vec<(usize, Started)> = procs
                .iter()
                .enumerate()
                .filter(|(_, p)| p.host == r.name())
                .map(|(i, p)| (i, p.clone()))
                .collect();
            let list: Vec<Started> = mine.iter().map(|(_, p)| p.clone()).collect();
            let (machine, cpu) = match r.snapshot(&list) {
                Ok((m, c)) => (Some(m), c),
                Err(_) => (None, Vec::new()),
            };
            let cpu: Vec<(usize, Option<f64>)> = mine.iter().map(|(i, _)| *i).zip(cpu).collect();
            Ok((r.name().to_string(), machine, cpu))
        });
        // The moment of the reading: the middle of the round trips.
        let at = at + at.elapsed() / 2;
        let mut reading = HostsReading {
            at,
            machines: Vec::new(),
            cpu: vec![None; procs.len()],
        };
        for (name, machine, cpu) in per.into_iter().flatten() {
            reading.machines.push((name, machine));
            for (i, s) in cpu {
                reading.cpu[i] = s;
            }
        }
        reading
    }

    /// Whether every host still answers: an error naming each that does not.
    pub fn check(&self) -> anyhow::Result<()> {
        let errors: Vec<String> = self
            .fleet
            .each(|r| r.run("checking the host", "true").map(|_| ()))
            .into_iter()
            .filter_map(Result::err)
            .map(|e| e.to_string())
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            bail!("{}", errors.join("; "))
        }
    }

    /// Stops everything (agents' logs fetched into the logs directory), measures the
    /// clocks again: each host's end offset. Errors name the hosts that could not be
    /// cleaned up.
    pub fn finish(&self) -> anyhow::Result<HashMap<String, Clock>> {
        let clocks = self
            .fleet
            .clock_offsets(CLOCK_ROUNDS)
            .map(|v| v.into_iter().map(|(h, o)| (h, o.into())).collect())
            .unwrap_or_else(|e| {
                eprintln!("note: the hosts' clocks at the end: {e}");
                HashMap::new()
            });
        for p in self.agent_processes() {
            self.stop(&p, &self.logs.join(format!("{}.log", p.name)));
        }
        self.fleet
            .teardown()
            .context("stopping what ran on the hosts")?;
        Ok(clocks)
    }

    /// The hosts as `meta.json` keeps them (with their end clocks, once known).
    pub fn meta(&self, end: &HashMap<String, Clock>) -> Vec<HostMeta> {
        self.fleet
            .remotes()
            .iter()
            .map(|r| HostMeta {
                name: r.name().to_string(),
                reach: r.host().describe(),
                address: r.host().address().to_string(),
                clock_start: self.clock(r.name()),
                clock_end: end.get(r.name()).copied(),
            })
            .collect()
    }
}

/// Every host read at one moment.
#[derive(Debug, Clone)]
pub struct HostsReading {
    /// When.
    pub at: Instant,
    /// Each host's machine (none when it could not be read).
    pub machines: Vec<(String, Option<MachineReading>)>,
    /// Each process' CPU seconds, in the order asked (none when unreadable).
    pub cpu: Vec<Option<f64>>,
}

/// Each host's machine and the lab's processes on it between two readings.
pub fn host_cpu(a: &HostsReading, b: &HostsReading, procs: &[Started]) -> Vec<HostCpu> {
    let elapsed = (b.at - a.at).as_secs_f64();
    if elapsed <= 0.0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (name, mb) in &b.machines {
        let Some(mb) = mb else { continue };
        let Some(Some(ma)) = a.machines.iter().find(|(n, _)| n == name).map(|(_, m)| m) else {
            continue;
        };
        let all = mb.ticks.total.saturating_sub(ma.ticks.total);
        if all == 0 || mb.clk_tck == 0 {
            continue;
        }
        let processes = procs
            .iter()
            .enumerate()
            .filter(|(_, p)| &p.host == name)
            .filter_map(|(i, p)| {
                let (s0, s1) = (a.cpu.get(i).copied()??, b.cpu.get(i).copied()??);
                Some((p.name.clone(), (s1 - s0).max(0.0) / elapsed))
            })
            .collect();
        out.push(HostCpu {
            host: name.clone(),
            busy_cores: mb.ticks.busy.saturating_sub(ma.ticks.busy) as f64
                / mb.clk_tck as f64
                / elapsed,
            cpus: (all as f64 / mb.clk_tck as f64 / elapsed).round() as usize,
            steal: mb.ticks.steal.saturating_sub(ma.ticks.steal) as f64 / all as f64,
            load1: mb.load[0],
            processes,
        });
    }
    out
}
