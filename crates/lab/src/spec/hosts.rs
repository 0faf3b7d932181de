//! Hosts in the experiment file: the `[[host]]` table (a name and how to reach it: `local`,
//! the default, or `ssh = "user@address[:port]"`; or a pool of `kvlab bench agent`s someone
//! else keeps running, `pool = "NAME:PORT"`), the `[ssh]` settings every ssh host is
//! reached with, and the checks of every role's `host` against the table. A host table can
//! also come from a file of its own (`kvlab lab run X --hosts FILE`), replacing the
//! experiment's: the same experiment then runs on namespaces or on real machines.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{bail, Context};
use kvlab_hosts::{Host, Settings};
use serde::{Deserialize, Serialize};

/// A `[[host]]` as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HostFile {
    name: String,
    ssh: Option<String>,
    local: Option<bool>,
    dir: Option<String>,
    clock: Option<String>,
    address: Option<String>,
    pool: Option<String>,
}

/// A pool of `kvlab bench agent`s that someone else keeps running (a Kubernetes
/// Deployment behind a headless Service): a name and where they listen, `NAME:PORT`, every
/// address the name resolves to when a run starts one agent. The lab connects to nothing
/// else there: it starts, reads and stops nothing, and takes the agents' clocks as its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPool {
    /// What `agents = [...]` names.
    pub name: String,
    /// `NAME:PORT` (or `ADDRESS:PORT`).
    pub address: String,
}

impl AgentPool {
    /// Its agents: every address its name resolves to now, in order.
    pub fn resolve(&self) -> anyhow::Result<Vec<std::net::SocketAddr>> {
        use std::net::ToSocketAddrs as _;
        let mut v: Vec<std::net::SocketAddr> = self
            .address
            .to_socket_addrs()
            .with_context(|| format!("agent pool {}: resolving {}", self.name, self.address))?
            .collect();
        v.sort();
        v.dedup();
        if v.is_empty() {
            bail!(
                "agent pool {}: {} resolves to no address",
                self.name,
                self.address
            );
        }
        Ok(v)
    }
}

/// The `[ssh]` table as written: how every ssh host is reached.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SshSpec {
    /// The private key (`ssh -i`); ssh's own choice if absent.
    pub identity: Option<PathBuf>,
    /// A `known_hosts` file checked strictly; the user's own if absent.
    pub known_hosts: Option<PathBuf>,
    /// More `-o KEY=VALUE` options for ssh.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Seconds connecting may take (default 5).
    pub connect_timeout: Option<f64>,
}

impl SshSpec {
    /// The engine's settings (its defaults for what is not said).
    pub fn settings(&self) -> Settings {
        let mut s = Settings {
            identity: self.identity.clone(),
            known_hosts: self.known_hosts.clone(),
            ssh_options: self.options.clone(),
            ..Settings::default()
        };
        if let Some(t) = self.connect_timeout {
            s.connect_timeout = std::time::Duration::from_secs_f64(t.clamp(1.0, 600.0));
        }
        s
    }
}

/// A host table in a file of its own (`--hosts FILE`): `[[host]]`s and an optional `[ssh]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    #[serde(default, rename = "host")]
    hosts: Vec<HostFile>,
    ssh: Option<SshSpec>,
}

/// A host table given on the command line: where it came from and its text (kept in
/// `meta.json`, so that a re-analysis resolves the experiment as it ran).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostTable {
    /// The file's path as given.
    pub file: String,
    /// Its text.
    pub text: String,
}

impl HostTable {
    /// Reads `--hosts FILE`.
    pub fn read(file: &str) -> anyhow::Result<HostTable> {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("--hosts {file}: reading it"))?;
        Ok(HostTable {
            file: file.to_string(),
            text,
        })
    }

    /// Its `[[host]]`s and `[ssh]`.
    pub(crate) fn parse(&self) -> anyhow::Result<(Vec<HostFile>, Option<SshSpec>)> {
        let t: TableFile = toml::from_str(&self.text)
            .map_err(|e| anyhow::anyhow!("--hosts {}: {e}", self.file))?;
        if t.hosts.is_empty() {
            bail!("--hosts {}: no [[host]] in it", self.file);
        }
        Ok((t.hosts, t.ssh))
    }
}

/// The experiment's hosts, resolved: the table (the file's, or `--hosts`'s in its place),
/// its agent pools, and the ssh settings.
pub(crate) fn resolve(
    file_hosts: Vec<HostFile>,
    file_ssh: Option<SshSpec>,
    given: Option<&HostTable>,
) -> anyhow::Result<(Vec<Host>, Vec<AgentPool>, SshSpec)> {
    let (hosts, ssh) = match given {
        Some(t) => t.parse()?,
        None => (file_hosts, file_ssh),
    };
    let mut names = BTreeSet::new();
    let mut out = Vec::new();
    let mut pools = Vec::new();
    for h in hosts {
        if !names.insert(h.name.clone()) {
            bail!("two hosts are named {:?}", h.name);
        }
        if let Some(address) = h.pool {
            if h.ssh.is_some() || h.local.is_some() || h.dir.is_some() || h.clock.is_some() {
                bail!(
                    "host {:?}: pool = \"…\" is a pool of running agents, reached by no ssh: \
                     it takes no ssh, local, dir or clock",
                    h.name
                );
            }
            if !kvlab_hosts::valid_name(&h.name) || address.rsplit_once(':').is_none() {
                bail!(
                    "host {:?}: pool = {address:?}: NAME:PORT (the agents' Service and port)",
                    h.name
                );
            }
            pools.push(AgentPool {
                name: h.name,
                address,
            });
            continue;
        }
        let host = match (&h.ssh, h.local) {
            (Some(_), Some(true)) => bail!(
                "host {:?}: local = true and ssh = \"…\" both set: a host is reached one way \
                 (remove one)",
                h.name
            ),
            (Some(target), _) => {
                Host::ssh(&h.name, target).map_err(|e| anyhow::anyhow!("[[host]] {e}"))?
            }
            (None, Some(false)) => bail!(
                "host {:?}: local = false needs ssh = \"user@address[:port]\"",
                h.name
            ),
            (None, _) => Host::local(&h.name),
        };
        let host = match h.dir {
            Some(d) => host.with_dir(d),
            None => host,
        };
        let host = match h.clock {
            Some(c) => host.with_clock(c),
            None => host,
        };
        let host = match h.address {
            Some(a) => host.with_address(a),
            None => host,
        };
        host.validate()
            .map_err(|e| anyhow::anyhow!("[[host]] {e}"))?;
        out.push(host);
    }
    Ok((out, pools, ssh.unwrap_or_default()))
}

/// An error unless `name` is in `hosts`, naming `role` and the table's names.
pub(crate) fn check_defined(hosts: &[Host], role: &str, name: &str) -> anyhow::Result<()> {
    check_agent_host(hosts, &[], role, name)
}

/// An error unless `name` is in `hosts` or `pools` (where agents may run), naming `role`
/// and the table's names.
pub(crate) fn check_agent_host(
    hosts: &[Host],
    pools: &[AgentPool],
    role: &str,
    name: &str,
) -> anyhow::Result<()> {
    if hosts.iter().any(|h| h.name == name) || pools.iter().any(|p| p.name == name) {
        return Ok(());
    }
    let known: Vec<&str> = hosts
        .iter()
        .map(|h| h.name.as_str())
        .chain(pools.iter().map(|p| p.name.as_str()))
        .collect();
    bail!(
        "{role}: host {name:?} is not defined ({}): add [[host]] name = {name:?} with ssh = \
         \"user@address\" (or local = true)",
        if known.is_empty() {
            "the experiment has no [[host]] table".to_string()
        } else {
            format!("[[host]] names: {}", known.join(", "))
        }
    )
}

/// One host name or several, as `host = "a"` or `host = ["a", "b"]` is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HostNames {
    /// One host.
    One(String),
    /// Several (a system with an instance on each).
    Many(Vec<String>),
}

impl HostNames {
    /// The names, in order.
    pub fn names(&self) -> Vec<String> {
        match self {
            HostNames::One(n) => vec![n.clone()],
            HostNames::Many(v) => v.clone(),
        }
    }
}
