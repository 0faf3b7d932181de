//! The systems under test as the file describes them: kinds, a proxy's backends, `{factor}`
//! placeholders, and the flags a system runs with at one point.

use anyhow::bail;
use kvlab_bench::Protocol;
use serde::{Deserialize, Serialize};

use super::expand::Level;
use super::hosts::HostNames;

/// How a system under test is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SystemKind {
    /// `kvlab server` (this executable unless `binary` says otherwise).
    Kvlab,
    /// A memcached binary (`binary`, default `memcached` on PATH).
    Memcached,
    /// Already running at `address`; not started or stopped.
    External,
    /// `kvlab proxy` (this executable unless `binary` says otherwise) in front of `backends`
    /// servers of kind `backend`, each started by the lab on its own port.
    Proxy,
    /// twemproxy (`nutcracker` on PATH unless `binary` says otherwise: Debian's
    /// `nutcracker` package) in front of `backends` servers, as `proxy`: one pool, ketama
    /// over MD5, its configuration written by the lab; `args` are nutcracker's own flags.
    Twemproxy,
}

/// The server a proxy's backends run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// `kvlab server` (the lab's kvlab executable): runs anywhere the lab does.
    #[default]
    Kvlab,
    /// `memcached` on PATH.
    Memcached,
}

impl BackendKind {
    /// The system kind a backend is started as.
    pub fn system_kind(self) -> SystemKind {
        match self {
            BackendKind::Kvlab => SystemKind::Kvlab,
            BackendKind::Memcached => SystemKind::Memcached,
        }
    }
}

/// How many backends a proxy has: a number, or a `"{factor}"` text that a factor's level
/// fills in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BackendCount {
    /// A fixed number.
    Number(i64),
    /// Text with `{factor}` placeholders, e.g. `"{backends}"`.
    Text(String),
}

/// The most backends a proxy system may have.
pub const MAX_BACKENDS: usize = 64;

/// One system under test.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemSpec {
    /// Unique name, used in the report.
    pub name: String,
    /// How it starts; default: `kvlab` or `memcached` when the name is one of those.
    pub kind: Option<SystemKind>,
    /// Extra flags (`{factor}` is replaced by the point's level of that factor).
    #[serde(default)]
    pub args: Vec<String>,
    /// The program to run.
    pub binary: Option<String>,
    /// External systems: host:port.
    pub address: Option<String>,
    /// External systems: a pid whose CPU time is read from /proc.
    pub pid: Option<u32>,
    /// Skip the system (with a note) when its binary is missing.
    #[serde(default)]
    pub optional: bool,
    /// Seconds to wait for it to answer `version`.
    pub start_timeout: Option<f64>,
    /// A proxy's backends: how many (default 1; `"{factor}"` lets a factor vary it).
    pub backends: Option<BackendCount>,
    /// A proxy's backends: which server they run (default `kvlab`).
    pub backend: Option<BackendKind>,
    /// A proxy's backends: every backend's flags (`{factor}` placeholders as in `args`).
    #[serde(default)]
    pub backend_args: Vec<String>,
    /// The CPUs every thread of the system may run on, a CPU list (`"0"`, `"0-1"`; a
    /// `{factor}` placeholder lets a factor vary it); set once it is up. Default: any.
    pub cpus: Option<String>,
    /// Start it afresh for every run (an empty cache each time: cold-cache runs, or with
    /// the workload's `load` a fill before every run). Default: kept while its flags stay.
    #[serde(default)]
    pub fresh: bool,
    /// The host it runs on (a `[[host]]` name), or several: an instance on each (loaded by
    /// the part's agents, spread over them). Default: this machine.
    pub host: Option<HostNames>,
    /// A proxy's backends' hosts: backend i runs on `backend_hosts[i % len]`. Default: the
    /// proxy's (first) host.
    #[serde(default)]
    pub backend_hosts: Vec<String>,
}

/// What a system runs with at one point, its `{factor}` placeholders filled in: a running
/// instance serves a point only when these are the same.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// The system's own flags.
    pub args: Vec<String>,
    /// A proxy's backends: how many, and each one's flags.
    pub backends: Option<(usize, Vec<String>)>,
    /// The CPUs its threads may run on (a CPU list), when it is pinned.
    pub cpus: Option<String>,
}

impl SystemKind {
    /// Whether a system of this kind can be loaded over `protocol` (every system speaks
    /// memcached's text and meta protocols; only a kvlab server the lab starts has an HTTP
    /// interface).
    pub fn serves(self, protocol: Protocol) -> bool {
        protocol.is_memcached_port() || self == SystemKind::Kvlab
    }

    /// Whether the lab starts backends for it (a proxy of either kind).
    pub fn has_backends(self) -> bool {
        matches!(self, SystemKind::Proxy | SystemKind::Twemproxy)
    }
}

/// The `{placeholders}` in `texts`, in order.
pub(super) fn placeholders_in<'a>(texts: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut out = Vec::new();
    for a in texts {
        let mut rest = a.as_str();
        while let Some(i) = rest.find('{') {
            let after = &rest[i + 1..];
            match after.find('}') {
                Some(j) => {
                    out.push(after[..j].to_string());
                    rest = &after[j + 1..];
                }
                None => break,
            }
        }
    }
    out
}

/// `texts` with the point's levels filled in.
pub(super) fn render(texts: &[String], levels: &[(String, Level)]) -> Vec<String> {
    texts
        .iter()
        .map(|a| {
            let mut s = a.clone();
            for (f, l) in levels {
                s = s.replace(&format!("{{{f}}}"), &l.to_string());
            }
            s
        })
        .collect()
}

impl SystemSpec {
    /// The kind, defaulted from the name.
    pub fn kind(&self) -> anyhow::Result<SystemKind> {
        match (self.kind, self.name.as_str()) {
            (Some(k), _) => Ok(k),
            (None, "kvlab") => Ok(SystemKind::Kvlab),
            (None, "memcached") => Ok(SystemKind::Memcached),
            (None, "proxy") => Ok(SystemKind::Proxy),
            (None, "twemproxy") => Ok(SystemKind::Twemproxy),
            (None, n) => bail!(
                "system {n:?}: say kind = \"kvlab\", \"memcached\", \"proxy\", \"twemproxy\" \
                 or \"external\""
            ),
        }
    }

    /// The `{placeholders}` used in `args` (and a proxy's `backends` and `backend_args`).
    pub fn placeholders(&self) -> Vec<String> {
        let count = match &self.backends {
            Some(BackendCount::Text(t)) => Some(t),
            _ => None,
        };
        placeholders_in(
            self.args
                .iter()
                .chain(&self.backend_args)
                .chain(count)
                .chain(&self.cpus),
        )
    }

    /// `args` with the point's levels filled in.
    pub fn render_args(&self, levels: &[(String, Level)]) -> Vec<String> {
        render(&self.args, levels)
    }

    /// Everything the system runs with at a point: its flags and, for a proxy, its backends'
    /// number and flags. An error when the number of backends is not a whole number in
    /// 1..=[`MAX_BACKENDS`].
    pub fn render(&self, levels: &[(String, Level)]) -> anyhow::Result<Flags> {
        let backends = match self.kind()? {
            SystemKind::Proxy | SystemKind::Twemproxy => {
                let n = match &self.backends {
                    None => 1,
                    Some(BackendCount::Number(n)) => *n,
                    Some(BackendCount::Text(t)) => {
                        let r = render(std::slice::from_ref(t), levels).remove(0);
                        r.trim().parse::<i64>().map_err(|_| {
                            anyhow::anyhow!(
                                "system {:?}: backends = {t:?} is {r:?}, not a number",
                                self.name
                            )
                        })?
                    }
                };
                if !(1..=MAX_BACKENDS as i64).contains(&n) {
                    bail!(
                        "system {:?}: backends = {n}: a proxy needs 1 to {MAX_BACKENDS} backends",
                        self.name
                    );
                }
                Some((n as usize, render(&self.backend_args, levels)))
            }
            _ => None,
        };
        let cpus = match &self.cpus {
            None => None,
            Some(c) => {
                let r = render(std::slice::from_ref(c), levels).remove(0);
                if r.trim().is_empty()
                    || !r.split(',').flat_map(|p| p.split('-')).all(|n| {
                        !n.trim().is_empty() && n.trim().bytes().all(|b| b.is_ascii_digit())
                    })
                {
                    bail!(
                        "system {:?}: cpus = {c:?} is {r:?}, not a CPU list such as \"0\" or \"0-1,3\"",
                        self.name
                    );
                }
                Some(r.trim().to_string())
            }
        };
        Ok(Flags {
            args: self.render_args(levels),
            backends,
            cpus,
        })
    }

    /// The spec of a proxy's backend `i` (its kind, flags and start timeout), as a system of
    /// its own: what the lab starts for it.
    pub fn backend_spec(&self, i: usize, backend_args: Vec<String>) -> SystemSpec {
        let kind = self.backend.unwrap_or_default().system_kind();
        let host = match self.backend_hosts.len() {
            0 => self.hosts().into_iter().next().map(HostNames::One),
            n => Some(HostNames::One(self.backend_hosts[i % n].clone())),
        };
        SystemSpec {
            name: format!("{}-backend{i}", self.name),
            kind: Some(kind),
            args: backend_args,
            binary: None,
            address: None,
            pid: None,
            optional: self.optional,
            start_timeout: self.start_timeout,
            backends: None,
            backend: None,
            backend_args: Vec::new(),
            cpus: None,
            fresh: false,
            host,
            backend_hosts: Vec::new(),
        }
    }

    /// The hosts it runs on (empty: this machine).
    pub fn hosts(&self) -> Vec<String> {
        self.host.as_ref().map(HostNames::names).unwrap_or_default()
    }

    /// Checks what the file says of one system, before any point is resolved.
    pub(super) fn check(&self) -> anyhow::Result<()> {
        let kind = self.kind()?;
        let name = &self.name;
        match kind {
            SystemKind::External if self.address.is_none() => {
                bail!("system {name:?}: kind = \"external\" needs address = \"host:port\"")
            }
            SystemKind::Kvlab
            | SystemKind::Memcached
            | SystemKind::Proxy
            | SystemKind::Twemproxy
                if self.address.is_some() =>
            {
                bail!(
                    "system {name:?}: address is only for kind = \"external\" (the lab picks a \
                     port)"
                )
            }
            _ => {}
        }
        if kind == SystemKind::External && self.host.is_some() {
            bail!(
                "system {name:?}: an external system is reached at its address; host is for \
                 the systems the lab starts"
            );
        }
        if self.host.as_ref().is_some_and(|h| h.names().is_empty()) {
            bail!("system {name:?}: host = []: name a host, or leave host out (this machine)");
        }
        if !kind.has_backends() {
            let given: Vec<&str> = [
                ("backends", self.backends.is_some()),
                ("backend", self.backend.is_some()),
                ("backend_args", !self.backend_args.is_empty()),
                ("backend_hosts", !self.backend_hosts.is_empty()),
            ]
            .into_iter()
            .filter_map(|(k, set)| set.then_some(k))
            .collect();
            if !given.is_empty() {
                bail!(
                    "system {name:?}: {} only for kind = \"proxy\" or \"twemproxy\"",
                    match given.len() {
                        1 => format!("{} is", given[0]),
                        _ => format!("{} are", given.join(", ")),
                    }
                );
            }
            return Ok(());
        }
        match &self.backends {
            Some(BackendCount::Number(n)) if !(1..=MAX_BACKENDS as i64).contains(n) => {
                bail!("system {name:?}: backends = {n}: a proxy needs 1 to {MAX_BACKENDS} backends")
            }
            Some(BackendCount::Text(t)) if placeholders_in([t]).is_empty() => bail!(
                "system {name:?}: backends = {t:?}: give a number, or \"{{factor}}\" to vary it"
            ),
            _ => {}
        }
        for a in &self.args {
            let flag = a.split('=').next().unwrap_or_default();
            if [
                "--backend",
                "--config",
                "--log-dir",
                "-p",
                "--port",
                "-l",
                "--listen",
            ]
            .contains(&flag)
            {
                bail!(
                    "system {name:?}: remove {flag} from args; the lab starts the backends and \
                     gives the proxy its address, --backend for each and --log-dir"
                );
            }
        }
        Ok(())
    }
}
