//! The lab's hosts: a machine by name, reached locally or over OpenSSH, and everything the
//! lab does on one — the engine behind `[[host]]` in an experiment file.
//!
//! ```text
//! Host { name, local | ssh = "user@address[:port]" }
//!   Fleet::connect(hosts, Settings)      one multiplexed ssh connection per host (control
//!        │                               master, private socket directory, BatchMode, key
//!        │                               auth, ConnectTimeout, ServerAliveInterval)
//!        ├─ check_tools                  `command -v` per host: what is missing, said per
//!        │                               host before anything starts
//!        ├─ ship(kvlab)                  once per host, by sha256 (skipped when it matches)
//!        ├─ make_run_dirs(run)           ROOT/runs/RUN on each host
//!        ├─ Remote::start(name, argv)    setsid in the run directory, NAME.log, pid recorded
//!        ├─ Remote::cpu_seconds, machine /proc/PID/stat; /proc/stat steal, /proc/loadavg
//!        ├─ Remote::fetch                a file back (over the connection: `cat`)
//!        ├─ Remote::append_to            a file there written as it grows here (a stream:
//!        │                               `cat >> FILE`), e.g. rows a controller there reads
//!        ├─ clock_offsets                tightest of several round trips: offset ± RTT/2
//!        └─ teardown (and drop, and      TERM then KILL of everything started, every host at
//!           teardown_on_interrupt)       once; a lost host named, the others still cleaned
//! ```
//!
//! Everything is built on three calls of a [`Transport`] (a command that runs a script on
//! the host, whether its connection lives, whether an exit status means "not reached"):
//! [`transport::Local`] is `sh -c` here, [`transport::Ssh`] the same through the control
//! master, so a `local` host and an ssh one run the very same scripts. Every operation is
//! bounded in time twice — `timeout` on the host and a kill of the local process group a
//! little later — so a lost host is an error naming it ([`HostError::Unreachable`] or
//! [`HostError::Timeout`]), never a hang.
//!
//! Why a crate of its own rather than a module of `kvlab-lab`: the roles that are placed on
//! hosts live in several crates — the lab's systems and generator agents, but also the
//! controller and its batch jobs (`kvlab-control`, below the lab) and the fault harness's
//! processes (`kvlab-faults`) — and a lower crate may not import a higher one. This crate
//! needs only `kvlab-procfs` (the parsers of `/proc/<pid>/stat` and `/proc/stat`, applied
//! to what the host returns), so any of them can use it.
//!
//! The hosts of the tests are network namespaces with an sshd each
//! (`scripts/hosts-netns.sh`, `kvlab_testkit::hosts`); the same calls reach real machines.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod append;
pub mod clock;
mod error;
pub mod exec;
mod fleet;
mod host;
mod remote;
mod shell;
pub mod transport;

use std::path::PathBuf;
use std::time::Duration;

pub use append::Appender;
pub use clock::ClockOffset;
pub use error::{HostError, Result};
pub use exec::{quote, quote_all};
pub use fleet::{teardown_on_interrupt, Fleet, Teardown};
pub use host::{valid_name, Host, Reach, SshTarget};
pub use remote::{MachineReading, Remote, Started, Stopped};
pub use transport::Transport;

/// How hosts are reached and how long each step may take.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The private key (`ssh -i`, with `IdentitiesOnly`); ssh's own choice if absent.
    pub identity: Option<PathBuf>,
    /// A `known_hosts` file to check the hosts' keys against (strictly); the user's own
    /// (and ssh's configuration) if absent.
    pub known_hosts: Option<PathBuf>,
    /// How long connecting may take (`ConnectTimeout`, whole seconds).
    pub connect_timeout: Duration,
    /// How often a silent connection is probed (`ServerAliveInterval`, whole seconds)…
    pub alive_interval: Duration,
    /// …and how many unanswered probes end it (`ServerAliveCountMax`): a connection whose
    /// host went silent is an error within about interval × (count + 1) and a few seconds
    /// (6.5 s with the defaults, measured over a namespace link).
    pub alive_count: u32,
    /// How long one command may take.
    pub command_timeout: Duration,
    /// How long shipping a binary or fetching a file may take.
    pub ship_timeout: Duration,
    /// How long a process has between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// More `-o KEY=VALUE` options for ssh.
    pub ssh_options: Vec<String>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            identity: None,
            known_hosts: None,
            connect_timeout: Duration::from_secs(5),
            alive_interval: Duration::from_secs(1),
            alive_count: 3,
            command_timeout: Duration::from_secs(30),
            ship_timeout: Duration::from_secs(300),
            stop_grace: Duration::from_secs(5),
            ssh_options: Vec::new(),
        }
    }
}
