//! How a script reaches a host: [`Local`] runs it with `sh -c` here, [`Ssh`] through one
//! multiplexed OpenSSH connection (a control master in a private directory) that every
//! command of the host shares.
//!
//! The master is this process's child, in a process group of its own (a Ctrl-C at the
//! terminal reaches the lab, which then stops what it started, and not ssh, which would cut
//! the hosts off first). `BatchMode` (no prompt ever: key authentication or failure),
//! `ConnectTimeout` (an absent host fails in bounded time) and `ServerAliveInterval` ×
//! `ServerAliveCountMax` (a connection whose peer went silent ends within that time, and
//! with it every command over it: an error, never a hang) are set on every call.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt;

use crate::error::{HostError, Result};
use crate::host::SshTarget;
use crate::shell::{quote, wait_bounded};
use crate::Settings;

/// What runs a shell script on a host. [`crate::Remote`] builds every operation on these
/// three calls, the same for a local host and an ssh one.
pub trait Transport: Send + Sync {
    /// A command that runs `script` with `sh -c` on the host (stdin, stdout and stderr
    /// are the caller's to set).
    fn command(&self, script: &str) -> Command;
    /// `Err(why)` if the host's control connection is gone (always `Ok` for a local host).
    fn check(&self) -> std::result::Result<(), String>;
    /// Whether a command's exit status means the host was not reached (ssh's 255), and
    /// not that the command failed.
    fn unreachable(&self, code: Option<i32>) -> bool;
    /// Closes the control connection (idempotent).
    fn close(&self);
}

/// This machine.
#[derive(Debug, Default)]
pub struct Local;

impl Transport for Local {
    fn command(&self, script: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script).process_group(0);
        c
    }

    fn check(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn unreachable(&self, _code: Option<i32>) -> bool {
        false
    }

    fn close(&self) {}
}

/// One host over OpenSSH: a control master and the options every call shares.
pub struct Ssh {
    target: SshTarget,
    socket: PathBuf,
    /// The options before the destination, shared by the master and every command.
    options: Vec<String>,
    master: Mutex<Option<Child>>,
    log: PathBuf,
    /// Why the master ended, once it has: what every later call reports.
    lost: Mutex<Option<String>>,
}

impl Ssh {
    /// Opens the control connection to `target` for host `host`, its socket and log in
    /// `control_dir` (private to this process), waiting at most the connect timeout plus
    /// 3 s for it to authenticate.
    pub fn connect(
        host: &str,
        target: &SshTarget,
        settings: &Settings,
        control_dir: &Path,
        index: usize,
    ) -> Result<Ssh> {
        let socket = control_dir.join(format!("cm{index}"));
        let log = control_dir.join(format!("cm{index}.log"));
        let secs = |d: Duration| d.as_secs().max(1).to_string();
        let mut options: Vec<String> = vec!["-S".into(), socket.display().to_string()];
        let mut o = |kv: String| {
            options.push("-o".into());
            options.push(kv);
        };
        o("BatchMode=yes".into());
        o(format!("ConnectTimeout={}", secs(settings.connect_timeout)));
        o(format!(
            "ServerAliveInterval={}",
            secs(settings.alive_interval)
        ));
        o(format!(
            "ServerAliveCountMax={}",
            settings.alive_count.max(1)
        ));
        o("LogLevel=ERROR".into());
        if settings.identity.is_some() {
            o("IdentitiesOnly=yes".into());
        }
        if let Some(k) = &settings.known_hosts {
            o(format!("UserKnownHostsFile={}", k.display()));
            o("StrictHostKeyChecking=yes".into());
        }
        for extra in &settings.ssh_options {
            o(extra.clone());
        }
        if let Some(i) = &settings.identity {
            options.push("-i".into());
            options.push(i.display().to_string());
        }
        if let Some(p) = target.port {
            options.push("-p".into());
            options.push(p.to_string());
        }
        let io = |what: &str, source| HostError::Io {
            host: host.to_string(),
            what: what.to_string(),
            source,
        };
        let err = File::create(&log).map_err(|e| io("the ssh log", e))?;
        let child = Command::new("ssh")
            .arg("-M")
            .arg("-N")
            .args(["-o", "ControlPersist=no"])
            .args(&options)
            .arg(target.destination())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(err))
            .process_group(0)
            .spawn()
            .map_err(|e| io("starting ssh", e))?;
        let ssh = Ssh {
            target: target.clone(),
            socket,
            options,
            master: Mutex::new(Some(child)),
            log,
            lost: Mutex::new(None),
        };
        let limit = settings.connect_timeout + Duration::from_secs(3);
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(5);
        loop {
            if let Err(detail) = ssh.check() {
                ssh.close();
                return Err(HostError::Unreachable {
                    host: host.to_string(),
                    detail: format!("ssh {target}: {detail}"),
                });
            }
            if ssh.socket.exists() && ssh.mux_check() {
                return Ok(ssh);
            }
            if Instant::now() >= deadline {
                ssh.close();
                return Err(HostError::Unreachable {
                    host: host.to_string(),
                    detail: format!("ssh {target}: no connection in {limit:?}"),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// `ssh -O check`: whether the master answers on its socket (at most 3 s).
    fn mux_check(&self) -> bool {
        self.control("check", Duration::from_secs(3))
    }

    /// `ssh -O <what>` on the master's socket, at most `limit`.
    fn control(&self, what: &str, limit: Duration) -> bool {
        let Ok(mut child) = Command::new("ssh")
            .args(["-S", &self.socket.display().to_string(), "-O", what])
            .arg(self.target.destination())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
        else {
            return false;
        };
        wait_bounded(&mut child, limit).is_some_and(|s| s.success())
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let text = text.trim();
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        if tail.is_empty() {
            "the control connection ended (the host stopped answering its keep-alive probes, \
             or closed it)"
                .into()
        } else {
            tail.join(" | ")
        }
    }
}

impl Transport for Ssh {
    fn command(&self, script: &str) -> Command {
        let mut c = Command::new("ssh");
        c.args(["-o", "ControlMaster=no"])
            .args(&self.options)
            .arg(self.target.destination())
            .arg(format!("exec sh -c {}", quote(script)))
            .process_group(0);
        c
    }

    fn check(&self) -> std::result::Result<(), String> {
        let mut master = self.master.lock().unwrap_or_else(|e| e.into_inner());
        let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = lost.as_ref() {
            return Err(why.clone());
        }
        match master.as_mut().map(Child::try_wait) {
            None => Err("the control connection was closed".into()),
            Some(Ok(None)) => Ok(()),
            Some(Ok(Some(status))) => {
                *master = None;
                let why = format!("ssh exited ({status}): {}", self.log_tail());
                *lost = Some(why.clone());
                Err(why)
            }
            Some(Err(e)) => Err(format!("ssh: {e}")),
        }
    }

    fn unreachable(&self, code: Option<i32>) -> bool {
        code == Some(255)
    }

    fn close(&self) {
        // A master that died on its own keeps its reason for later calls.
        let _ = self.check();
        let child = self.master.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            if matches!(child.try_wait(), Ok(None)) {
                self.control("exit", Duration::from_secs(2));
                if wait_bounded(&mut child, Duration::from_secs(2)).is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for Ssh {
    fn drop(&mut self) {
        self.close();
    }
}
