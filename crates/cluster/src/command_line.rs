//! The command line that starts a cluster node: `server -l HOST -p PORT --cluster TOPOLOGY
//! --cluster-node NAME`, then the caller's own flags. Written once, here, for everything that
//! starts nodes as processes (`kvlab cluster local`, the fault harness, the lab's ring and
//! scaling experiments).

use std::ffi::OsString;

/// The arguments (after the kvlab binary) of a `kvlab server` that serves as a cluster
/// node, or as a plain server with [`NodeCommand::server`].
#[derive(Clone, Debug)]
pub struct NodeCommand {
    host: String,
    port: String,
    /// The topology store and this node's name in it; `None`: a plain server.
    cluster: Option<(String, String)>,
    extra: Vec<OsString>,
}

impl NodeCommand {
    /// Node `name` of the cluster whose topology store is `topology`, listening on
    /// `host:port`.
    pub fn node(
        host: impl ToString,
        port: impl ToString,
        topology: &str,
        name: &str,
    ) -> NodeCommand {
        NodeCommand {
            cluster: Some((topology.to_string(), name.to_string())),
            ..NodeCommand::server(host, port)
        }
    }

    /// A plain `kvlab server` on `host:port` (no cluster: a pool member).
    pub fn server(host: impl ToString, port: impl ToString) -> NodeCommand {
        NodeCommand {
            host: host.to_string(),
            port: port.to_string(),
            cluster: None,
            extra: Vec::new(),
        }
    }

    /// Adds flags after the node's own (server flags, `--data-dir`…).
    pub fn args<I, S>(mut self, args: I) -> NodeCommand
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.extra.extend(args.into_iter().map(Into::into));
        self
    }

    /// The whole argument list, in order.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = ["server", "-l", &self.host, "-p", &self.port]
            .into_iter()
            .map(OsString::from)
            .collect();
        if let Some((topology, name)) = &self.cluster {
            for a in ["--cluster", topology, "--cluster-node", name] {
                out.push(a.into());
            }
        }
        out.extend(self.extra.iter().cloned());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_command_line() {
        let args = NodeCommand::node("10.0.0.2", 7101, "file:/t.json", "10.0.0.2:7101")
            .args(["--data-dir", "/d"])
            .to_args();
        assert_eq!(
            args,
            [
                "server",
                "-l",
                "10.0.0.2",
                "-p",
                "7101",
                "--cluster",
                "file:/t.json",
                "--cluster-node",
                "10.0.0.2:7101",
                "--data-dir",
                "/d"
            ]
        );
        let args = NodeCommand::server("127.0.0.1", 1)
            .args(["-t", "2"])
            .to_args();
        assert_eq!(args, ["server", "-l", "127.0.0.1", "-p", "1", "-t", "2"]);
    }
}
