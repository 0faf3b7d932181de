//! A host as an experiment names it: a name and how to reach it.

use crate::error::{HostError, Result};

/// How a host is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// This machine, without ssh (today's behaviour; the default).
    Local,
    /// Another machine over OpenSSH.
    Ssh(SshTarget),
}

/// `user@address[:port]`, as written in `ssh = "…"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// The remote user; ssh's default (the local user, or the ssh configuration's) if absent.
    pub user: Option<String>,
    /// A host name or an address (an IPv6 address without its brackets).
    pub address: String,
    /// The port; 22 (or the ssh configuration's) if absent.
    pub port: Option<u16>,
}

impl SshTarget {
    /// Parses `[user@]address[:port]`; an IPv6 address takes brackets: `root@[fd00::1]:2222`.
    pub fn parse(text: &str) -> std::result::Result<SshTarget, String> {
        let text = text.trim();
        let (user, rest) = match text.rsplit_once('@') {
            Some((u, r)) => (Some(u), r),
            None => (None, text),
        };
        if let Some(u) = user {
            if u.is_empty()
                || !u
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            {
                return Err(format!("{text:?}: the user {u:?} is not a user name"));
            }
        }
        let (address, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (a, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("{text:?}: no ']' after an IPv6 address"))?;
            match after {
                "" => (a, None),
                p => (
                    a,
                    Some(p.strip_prefix(':').ok_or_else(|| {
                        format!("{text:?}: expected ':PORT' after ']', not {p:?}")
                    })?),
                ),
            }
        } else {
            match rest.split_once(':') {
                Some((a, p)) => (a, Some(p)),
                None => (rest, None),
            }
        };
        if address.is_empty()
            || !address
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c))
        {
            return Err(format!(
                "{text:?}: expected user@address[:port], the address is {address:?}"
            ));
        }
        let port = match port {
            None => None,
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| format!("{text:?}: the port {p:?} is not 1..65535"))?,
            ),
        };
        Ok(SshTarget {
            user: user.map(str::to_string),
            address: address.to_string(),
            port,
        })
    }

    /// `user@address` (or `address`) as ssh takes it, without the port.
    pub fn destination(&self) -> String {
        match &self.user {
            Some(u) => format!("{u}@{}", self.address),
            None => self.address.clone(),
        }
    }
}

impl std::fmt::Display for SshTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(u) = &self.user {
            write!(f, "{u}@")?;
        }
        if self.address.contains(':') {
            write!(f, "[{}]", self.address)?;
        } else {
            write!(f, "{}", self.address)?;
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// A host: a name (what roles refer to) and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Its name: letters, digits, `.`, `_`, `-`, at most 64 characters.
    pub name: String,
    /// How to reach it.
    pub reach: Reach,
    /// Its directory for kvlab's files (the shipped binary under `bin/`, runs under
    /// `runs/`); `/tmp/kvlab-hosts` if absent (for a local host, under the temporary
    /// directory). Hosts that share a filesystem (namespaces of one machine) need one each.
    pub dir: Option<String>,
    /// The command that prints the host's time in nanoseconds since the epoch: `date +%s%N`
    /// if absent. (A test shifts one host's clock by wrapping it in `faketime`.)
    pub clock: Option<String>,
    /// The address its systems listen on and clients reach it at, when not the one it is
    /// reached by (the ssh target's, or `127.0.0.1` for the local machine): e.g. a local
    /// host's address on a bridge that namespace hosts reach it through.
    pub listen: Option<String>,
}

impl Host {
    /// This machine, named `name`.
    pub fn local(name: &str) -> Host {
        Host {
            name: name.to_string(),
            reach: Reach::Local,
            dir: None,
            clock: None,
            listen: None,
        }
    }

    /// A host over ssh, `target` written `user@address[:port]`.
    pub fn ssh(name: &str, target: &str) -> Result<Host> {
        let target = SshTarget::parse(target).map_err(|detail| HostError::Config {
            host: name.to_string(),
            detail: format!("ssh = {detail}"),
        })?;
        let host = Host {
            name: name.to_string(),
            reach: Reach::Ssh(target),
            dir: None,
            clock: None,
            listen: None,
        };
        host.validate()?;
        Ok(host)
    }

    /// This host with its directory set.
    pub fn with_dir(mut self, dir: impl Into<String>) -> Host {
        self.dir = Some(dir.into());
        self
    }

    /// This host with its clock command set.
    pub fn with_clock(mut self, command: impl Into<String>) -> Host {
        self.clock = Some(command.into());
        self
    }

    /// This host with the address its systems listen on set (see [`Host::listen`]).
    pub fn with_address(mut self, address: impl Into<String>) -> Host {
        self.listen = Some(address.into());
        self
    }

    /// Checks the name, the directory and the address.
    pub fn validate(&self) -> Result<()> {
        let bad = |detail: String| HostError::Config {
            host: self.name.clone(),
            detail,
        };
        if !valid_name(&self.name) {
            return Err(bad(
                "a host name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
                    .into(),
            ));
        }
        if let Some(d) = &self.dir {
            if !d.starts_with('/') || d.contains(['\n', '\'']) {
                return Err(bad(format!(
                    "dir = {d:?}: an absolute path without quotes or newlines"
                )));
            }
        }
        if let Some(a) = &self.listen {
            if a.is_empty()
                || !a
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-:".contains(c))
            {
                return Err(bad(format!(
                    "address = {a:?}: an IP address or a host name"
                )));
            }
        }
        Ok(())
    }

    /// Whether this is the local machine.
    pub fn is_local(&self) -> bool {
        self.reach == Reach::Local
    }

    /// The address systems on this host listen on and clients connect to: its `listen`
    /// address if set, else the ssh target's address, or `127.0.0.1` for the local machine.
    pub fn address(&self) -> &str {
        if let Some(a) = &self.listen {
            return a;
        }
        match &self.reach {
            Reach::Local => "127.0.0.1",
            Reach::Ssh(t) => &t.address,
        }
    }

    /// What the reports say about how it is reached: `local` or `ssh user@address:port`.
    pub fn describe(&self) -> String {
        match &self.reach {
            Reach::Local => "local".into(),
            Reach::Ssh(t) => format!("ssh {t}"),
        }
    }
}

/// Whether `name` is a host name: 1-64 letters, digits, `.`, `_`, `-`, starting with a letter
/// or digit.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_targets_parse_with_and_without_user_and_port() {
        let t = SshTarget::parse("root@10.0.0.2:2222").unwrap();
        assert_eq!(t.user.as_deref(), Some("root"));
        assert_eq!(t.address, "10.0.0.2");
        assert_eq!(t.port, Some(2222));
        assert_eq!(t.to_string(), "root@10.0.0.2:2222");
        let t = SshTarget::parse("node-3.lab").unwrap();
        assert_eq!((t.user.as_deref(), t.port), (None, None));
        assert_eq!(t.destination(), "node-3.lab");
        let t = SshTarget::parse("me@[fd00::1]:22").unwrap();
        assert_eq!(t.address, "fd00::1");
        assert_eq!(t.to_string(), "me@[fd00::1]:22");
        for bad in [
            "", "@x", "root@", "a b", "x:0", "x:70000", "x:p", "[fd00::1", "u;rm@x",
        ] {
            assert!(SshTarget::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn host_names_and_dirs_are_checked() {
        assert!(Host::ssh("db-1", "root@10.0.0.1").is_ok());
        let e = Host::ssh("bad name", "root@10.0.0.1").unwrap_err();
        assert!(
            e.to_string().starts_with("host bad name: a host name"),
            "{e}"
        );
        let e = Host::ssh("a", "root@").unwrap_err();
        assert!(e.to_string().contains("ssh = "), "{e}");
        assert!(Host::local("x").with_dir("relative").validate().is_err());
        assert_eq!(Host::local("x").address(), "127.0.0.1");
        let on_bridge = Host::local("x").with_address("10.77.40.1");
        assert_eq!(on_bridge.address(), "10.77.40.1");
        assert!(on_bridge.validate().is_ok());
        assert!(Host::local("x").with_address("a b").validate().is_err());
        assert_eq!(Host::ssh("b", "u@h:2").unwrap().describe(), "ssh u@h:2");
    }
}
