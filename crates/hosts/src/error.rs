//! What can go wrong on a host; every error names the host.

use std::time::Duration;

/// `Result` with [`HostError`].
pub type Result<T> = std::result::Result<T, HostError>;

/// Why an operation on a host failed. Every variant names the host, so that a run over many
/// hosts says which one failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The host cannot be reached, or its control connection was lost: ssh could not
    /// connect, authenticate, or the connection dropped (ssh's exit status 255, or the
    /// control master gone).
    #[error("host {host}: unreachable: {detail}")]
    Unreachable {
        /// The host's name.
        host: String,
        /// What ssh said.
        detail: String,
    },
    /// An operation did not finish in its time; whatever it ran was killed.
    #[error("host {host}: {what}: no answer in {after:?}")]
    Timeout {
        /// The host's name.
        host: String,
        /// The operation.
        what: String,
        /// Its time limit.
        after: Duration,
    },
    /// A command ran on the host and failed.
    #[error("host {host}: {what}: {status}{}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    Failed {
        /// The host's name.
        host: String,
        /// The operation.
        what: String,
        /// Its exit status, as text.
        status: String,
        /// The end of what it wrote to stderr.
        stderr: String,
    },
    /// A local I/O step failed (starting ssh, a pipe, a file).
    #[error("host {host}: {what}: {source}")]
    Io {
        /// The host's name.
        host: String,
        /// The step.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The host answered something this crate could not read.
    #[error("host {host}: {what}: cannot read {text:?}")]
    Parse {
        /// The host's name.
        host: String,
        /// What was read.
        what: String,
        /// What the host said.
        text: String,
    },
    /// A host description that cannot be used (`ssh = "…"` malformed, a bad name).
    #[error("host {host}: {detail}")]
    Config {
        /// The host's name.
        host: String,
        /// What is wrong.
        detail: String,
    },
    /// Tools missing on hosts, found before anything started: each host with what it lacks.
    #[error("missing on hosts: {}", missing.iter().map(|(h, t)| format!("host {h} lacks {}", t.join(", "))).collect::<Vec<_>>().join("; "))]
    MissingTools {
        /// Each host that lacks tools, and those tools.
        missing: Vec<(String, Vec<String>)>,
    },
    /// Several hosts failed at once (e.g. a teardown): each error in host order.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<HostError>),
}

impl HostError {
    /// The host the error is about (the first, for [`HostError::Several`] and
    /// [`HostError::MissingTools`]).
    pub fn host(&self) -> Option<&str> {
        match self {
            HostError::Unreachable { host, .. }
            | HostError::Timeout { host, .. }
            | HostError::Failed { host, .. }
            | HostError::Io { host, .. }
            | HostError::Parse { host, .. }
            | HostError::Config { host, .. } => Some(host),
            HostError::MissingTools { missing } => missing.first().map(|(h, _)| h.as_str()),
            HostError::Several(errors) => errors.first().and_then(HostError::host),
        }
    }

    /// Whether the host was lost (unreachable), rather than a command failing on it.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, HostError::Unreachable { .. })
    }
}
