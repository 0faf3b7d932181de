//! One connected host and everything the lab does there: run a script, check tools, ship
//! the kvlab binary, make a run directory, start and stop processes under it, read `/proc`,
//! fetch files. The same code serves a local host and an ssh one: only the
//! [`Transport`](crate::transport::Transport) differs.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::error::{HostError, Result};
use crate::exec::{self, quote, quote_all, Input, Output};
use crate::host::{Host, Reach};
use crate::transport::{Local, Ssh, Transport};
use crate::Settings;

/// A process started on a host, under its run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// The host's name.
    pub host: String,
    /// The name it was started under (its log is `NAME.log` in the run directory).
    pub name: String,
    /// Its pid on the host (also its process group and session: it was started with
    /// `setsid`).
    pub pid: u32,
    /// Its start time (field 22 of `/proc/PID/stat`, clock ticks after boot): with the pid,
    /// what tells it from a later process that got the same pid.
    pub start_time: u64,
    /// Its log (stdout and stderr) on the host.
    pub log: String,
}

/// How a process ended when it was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It had already exited.
    Gone,
    /// It exited on SIGTERM within the grace period.
    Terminated,
    /// It had to be killed (SIGKILL).
    Killed,
}

/// A host's CPU time and load, from `/proc/stat` and `/proc/loadavg`.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineReading {
    /// The `cpu` line of `/proc/stat` (busy, steal, total; clock ticks over all CPUs).
    pub ticks: kvlab_procfs::MachineTicks,
    /// The load averages over 1, 5 and 15 minutes.
    pub load: [f64; 3],
    /// The host's clock ticks per second.
    pub clk_tck: u64,
}

/// A connected host (see the module docs).
pub struct Remote {
    host: Host,
    transport: Box<dyn Transport>,
    settings: Arc<Settings>,
    root: String,
    run_dir: Mutex<Option<String>>,
    started: Mutex<Vec<Started>>,
    clk_tck: OnceLock<u64>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("host", &self.host)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl Remote {
    /// Connects to `host` (for ssh: opens its control connection, with its socket in
    /// `control_dir`; `index` tells hosts' sockets apart).
    pub fn connect(
        host: &Host,
        settings: Arc<Settings>,
        control_dir: &Path,
        index: usize,
    ) -> Result<Remote> {
        host.validate()?;
        let transport: Box<dyn Transport> = match &host.reach {
            Reach::Local => Box::new(Local),
            Reach::Ssh(target) => Box::new(Ssh::connect(
                &host.name,
                target,
                &settings,
                control_dir,
                index,
            )?),
        };
        let root = host.dir.clone().unwrap_or_else(|| match host.reach {
            Reach::Local => std::env::temp_dir()
                .join("kvlab-hosts")
                .display()
                .to_string(),
            Reach::Ssh(_) => "/tmp/kvlab-hosts".into(),
        });
        Ok(Remote {
            host: host.clone(),
            transport,
            settings,
            root,
            run_dir: Mutex::new(None),
            started: Mutex::new(Vec::new()),
            clk_tck: OnceLock::new(),
        })
    }

    /// The host's name.
    pub fn name(&self) -> &str {
        &self.host.name
    }

    /// The host as described.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The host's directory for kvlab's files.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// Runs `script` with `sh -c` on the host within the settings' command timeout;
    /// returns its standard output.
    pub fn run(&self, what: &str, script: &str) -> Result<String> {
        self.run_for(what, script, self.settings.command_timeout)
    }

    /// Runs `script` on the host within `limit`; returns its standard output.
    pub fn run_for(&self, what: &str, script: &str, limit: Duration) -> Result<String> {
        let out = exec::run(
            self.name(),
            self.transport.as_ref(),
            what,
            script,
            limit,
            Input::Null,
            Output::Capture,
        )?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Which of `tools` the host lacks (`command -v` on its default PATH).
    pub fn missing_tools(&self, tools: &[&str]) -> Result<Vec<String>> {
        if tools.is_empty() {
            return Ok(Vec::new());
        }
        let script = format!(
            "for t in {}; do command -v \"$t\" >/dev/null 2>&1 || echo \"$t\"; done",
            quote_all(tools)
        );
        let out = self.run("checking tools", &script)?;
        Ok(out.lines().map(str::to_string).collect())
    }

    /// Puts the local executable `local` on the host once: as `ROOT/bin/NAME-HASH` (its
    /// sha256's first 16 hex digits), sent only if no file there has that sha256 already,
    /// and checked after it arrived. Returns its path on the host. A local host runs
    /// `local` itself.
    pub fn ship(&self, local: &Path) -> Result<String> {
        if self.host.is_local() {
            return Ok(local.display().to_string());
        }
        let hash = local_sha256(local).map_err(|source| HostError::Io {
            host: self.name().to_string(),
            what: format!("hashing {}", local.display()),
            source,
        })?;
        let stem = local
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "kvlab".into());
        let dir = format!("{}/bin", self.root);
        let path = format!("{dir}/{stem}-{}", &hash[..16]);
        let have = format!(
            "sha256sum {} 2>/dev/null | cut -c1-64 || true",
            quote(&path)
        );
        if self.run("checking the shipped binary", &have)?.trim() == hash {
            return Ok(path);
        }
        let part = format!("{path}.part");
        let script = format!(
            "mkdir -p {d} && cat > {p} && [ \"$(sha256sum < {p} | cut -c1-64)\" = {h} ] \
             && chmod 755 {p} && mv -f {p} {f} || {{ rm -f {p}; echo 'arrived with another sha256' >&2; exit 1; }}",
            d = quote(&dir),
            p = quote(&part),
            h = hash,
            f = quote(&path)
        );
        let file = File::open(local).map_err(|source| HostError::Io {
            host: self.name().to_string(),
            what: format!("opening {}", local.display()),
            source,
        })?;
        exec::run(
            self.name(),
            self.transport.as_ref(),
            &format!("shipping {}", local.display()),
            &script,
            self.settings.ship_timeout,
            Input::File(file),
            Output::Capture,
        )?;
        Ok(path)
    }

    /// Makes the run directory `ROOT/runs/RUN` on the host; returns it. Processes are
    /// started under it, their logs in it.
    pub fn make_run_dir(&self, run: &str) -> Result<String> {
        if run.is_empty()
            || !run
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(HostError::Config {
                host: self.name().to_string(),
                detail: format!("run {run:?}: letters, digits, '.', '_' or '-'"),
            });
        }
        let dir = format!("{}/runs/{run}", self.root);
        self.run(
            "making the run directory",
            &format!("mkdir -p {}", quote(&dir)),
        )?;
        *self.run_dir.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.clone());
        Ok(dir)
    }

    /// The run directory, once made.
    pub fn run_dir(&self) -> Option<String> {
        self.run_dir
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Starts `argv` in the background on the host, in the run directory, in a session of
    /// its own (`setsid`), its stdout and stderr in `NAME.log` there, its pid in `NAME.pid`
    /// and its network namespace (`net:[INODE]`, written by the process itself before it
    /// becomes `argv`, so known however soon it exits) in `NAME.netns`; records it, so that [`Remote::stop_all`] (and the fleet's teardown) stops
    /// it. Returns at once: readiness is the caller's to wait for, over the network.
    pub fn start(&self, name: &str, argv: &[String]) -> Result<Started> {
        let bad = |detail: String| HostError::Config {
            host: self.name().to_string(),
            detail,
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(bad(format!(
                "process name {name:?}: letters, digits, '.', '_' or '-'"
            )));
        }
        if argv.is_empty() {
            return Err(bad(format!("process {name}: nothing to run")));
        }
        let dir = self
            .run_dir()
            .ok_or_else(|| bad(format!("process {name}: no run directory yet")))?;
        let log = format!("{dir}/{name}.log");
        let script = format!(
            "cd {d} || exit 1\n\
             setsid sh -c 'readlink /proc/self/ns/net >\"$0.netns\" 2>/dev/null; exec \"$@\"' {name} {argv} </dev/null >{log} 2>&1 &\n\
             p=$!\n\
             echo \"$p\" > {pidf}\n\
             cat /proc/$p/stat",
            d = quote(&dir),
            argv = quote_all(argv),
            log = quote(&log),
            pidf = quote(&format!("{dir}/{name}.pid")),
        );
        let out = self.run(&format!("starting {name}"), &script)?;
        let (pid, start_time) = pid_and_start(&out).ok_or_else(|| HostError::Parse {
            host: self.name().to_string(),
            what: format!("starting {name}: its /proc/PID/stat"),
            text: out.clone(),
        })?;
        let started = Started {
            host: self.name().to_string(),
            name: name.to_string(),
            pid,
            start_time,
            log,
        };
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(started.clone());
        Ok(started)
    }

    /// What this host started and has not stopped yet.
    pub fn started(&self) -> Vec<Started> {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets everything this host started without stopping it (a lost host's processes,
    /// once reported); returns them.
    pub fn abandon(&self) -> Vec<Started> {
        std::mem::take(&mut *self.started.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether `p` still runs (the same process: pid and start time; a zombie does not run).
    pub fn running(&self, p: &Started) -> Result<bool> {
        let script = format!(
            "{ALIVE}\nif alive; then echo yes; else echo no; fi",
            ALIVE = alive_fn(p)
        );
        Ok(self.run("checking a process", &script)?.trim() == "yes")
    }

    /// Stops `p`: SIGTERM to its process group, SIGKILL after the settings' grace period;
    /// forgets it.
    pub fn stop(&self, p: &Started) -> Result<Stopped> {
        let ticks = (self.settings.stop_grace.as_millis() / 50).max(1);
        let script = format!(
            "{alive}\n\
             alive || {{ echo gone; exit 0; }}\n\
             kill -TERM -{pid} 2>/dev/null || kill -TERM {pid} 2>/dev/null || true\n\
             i=0; while alive && [ $i -lt {ticks} ]; do sleep 0.05; i=$((i+1)); done\n\
             if ! alive; then kill -KILL -{pid} 2>/dev/null; echo terminated; exit 0; fi\n\
             kill -KILL -{pid} 2>/dev/null || kill -KILL {pid} 2>/dev/null || true\n\
             i=0; while alive && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done\n\
             alive && {{ echo 'still running after SIGKILL' >&2; exit 1; }}\n\
             echo killed",
            alive = alive_fn(p),
            pid = p.pid,
        );
        let limit = self.settings.stop_grace + Duration::from_secs(10);
        let out = self.run_for(
            &format!("stopping {} (pid {})", p.name, p.pid),
            &script,
            limit,
        )?;
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|s| s != p);
        Ok(match out.trim() {
            "gone" => Stopped::Gone,
            "terminated" => Stopped::Terminated,
            _ => Stopped::Killed,
        })
    }

    /// Stops everything this host started, newest first; the first error after trying all.
    pub fn stop_all(&self) -> Result<Vec<(Started, Stopped)>> {
        let mut all = self.started();
        all.reverse();
        let mut done = Vec::new();
        let mut errors = Vec::new();
        for p in all {
            match self.stop(&p) {
                Ok(how) => done.push((p, how)),
                Err(e) => {
                    let lost = e.is_unreachable();
                    errors.push(e);
                    // A lost host answers nothing more: say so once.
                    if lost {
                        break;
                    }
                }
            }
        }
        match errors.len() {
            0 => Ok(done),
            1 => Err(errors.remove(0)),
            _ => Err(HostError::Several(errors)),
        }
    }

    /// The host's clock ticks per second (`getconf CLK_TCK`, asked once).
    pub fn clk_tck(&self) -> Result<u64> {
        if let Some(&t) = self.clk_tck.get() {
            return Ok(t);
        }
        let out = self.run("reading CLK_TCK", "getconf CLK_TCK")?;
        let t = out
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&t| t > 0)
            .ok_or_else(|| HostError::Parse {
                host: self.name().to_string(),
                what: "getconf CLK_TCK".into(),
                text: out.clone(),
            })?;
        Ok(*self.clk_tck.get_or_init(|| t))
    }

    /// `p`'s CPU time so far (utime + stime from `/proc/PID/stat` on the host), in seconds;
    /// an error if it no longer runs.
    pub fn cpu_seconds(&self, p: &Started) -> Result<f64> {
        let tck = self.clk_tck()?;
        let out = self.run(
            "reading a process's CPU",
            &format!("cat /proc/{}/stat", p.pid),
        )?;
        let stat = kvlab_procfs::parse_proc_stat(out.trim()).map_err(|_| HostError::Parse {
            host: self.name().to_string(),
            what: format!("/proc/{}/stat", p.pid),
            text: out.clone(),
        })?;
        if pid_and_start(&out).map(|(_, s)| s) != Some(p.start_time) {
            return Err(HostError::Failed {
                host: self.name().to_string(),
                what: format!("reading {}'s CPU", p.name),
                status: format!("pid {} is another process now", p.pid),
                stderr: String::new(),
            });
        }
        Ok(stat.cpu_ticks() as f64 / tck as f64)
    }

    /// The host's CPU time (busy, steal) and load, in one round trip.
    pub fn machine(&self) -> Result<MachineReading> {
        Ok(self.snapshot(&[])?.0)
    }

    /// The host's machine ([`Remote::machine`]) and the CPU seconds of each of `procs`
    /// (none for one that no longer runs), in one round trip: readings that bracket a
    /// short interval stay close to its ends.
    pub fn snapshot(&self, procs: &[Started]) -> Result<(MachineReading, Vec<Option<f64>>)> {
        let clk_tck = self.clk_tck()?;
        let mut script = String::from("head -n 1 /proc/stat && cat /proc/loadavg");
        for p in procs {
            script.push_str(&format!(
                "\n(cat /proc/{}/stat 2>/dev/null || echo gone)",
                p.pid
            ));
        }
        let out = self.run("reading /proc/stat, /proc/loadavg and processes", &script)?;
        let mut lines = out.lines();
        let parse = |lines: &mut std::str::Lines<'_>| -> Option<MachineReading> {
            let ticks = kvlab_procfs::parse_machine_stat(lines.next()?).ok()?;
            let mut load = [0.0; 3];
            let mut words = lines.next()?.split_whitespace();
            for l in &mut load {
                *l = words.next()?.parse().ok()?;
            }
            Some(MachineReading {
                ticks,
                load,
                clk_tck,
            })
        };
        let machine = parse(&mut lines).ok_or_else(|| HostError::Parse {
            host: self.name().to_string(),
            what: "/proc/stat and /proc/loadavg".into(),
            text: out.clone(),
        })?;
        let cpu = procs
            .iter()
            .map(|p| {
                let line = lines.next()?;
                // The same process: its pid and its start time.
                (pid_and_start(line).map(|(_, s)| s) == Some(p.start_time)).then_some(())?;
                let stat = kvlab_procfs::parse_proc_stat(line.trim()).ok()?;
                Some(stat.cpu_ticks() as f64 / clk_tck as f64)
            })
            .collect();
        Ok((machine, cpu))
    }

    /// Copies the host's file `remote` to `local` (over the control connection: `cat`);
    /// returns its size.
    pub fn fetch(&self, remote: &str, local: &Path) -> Result<u64> {
        let io = |what: String, source| HostError::Io {
            host: self.name().to_string(),
            what,
            source,
        };
        if let Some(parent) = local.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| io(format!("making {}", parent.display()), e))?;
        }
        let file =
            File::create(local).map_err(|e| io(format!("creating {}", local.display()), e))?;
        exec::run(
            self.name(),
            self.transport.as_ref(),
            &format!("fetching {remote}"),
            &format!("cat -- {}", quote(remote)),
            self.settings.ship_timeout,
            Input::Null,
            Output::File(file),
        )?;
        std::fs::metadata(local)
            .map(|m| m.len())
            .map_err(|e| io(format!("reading {}", local.display()), e))
    }

    /// The transport, for [`crate::clock`].
    pub(crate) fn transport(&self) -> &dyn Transport {
        self.transport.as_ref()
    }

    /// The settings.
    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Closes the control connection (processes it started are not stopped: see
    /// [`Remote::stop_all`]).
    pub fn close(&self) {
        self.transport.close();
    }
}

/// A shell function `alive` that succeeds while `p` (its pid and start time) runs.
fn alive_fn(p: &Started) -> String {
    format!(
        "alive() {{ s=$(cat /proc/{pid}/stat 2>/dev/null) || return 1; s=${{s##*) }}; \
         set -- $s; [ \"$1\" != Z ] && [ \"${{20}}\" = {st} ]; }}",
        pid = p.pid,
        st = p.start_time
    )
}

/// The pid (field 1) and start time (field 22) in a `/proc/PID/stat` line.
fn pid_and_start(line: &str) -> Option<(u32, u64)> {
    let line = line.trim();
    let pid = line.split_whitespace().next()?.parse().ok()?;
    let rest = &line[line.rfind(')')? + 1..];
    // rest's first word is field 3: field 22 is its 20th.
    let start = rest.split_whitespace().nth(19)?.parse().ok()?;
    Some((pid, start))
}

/// The sha256 of a local file (`sha256sum`: fast on a large debug build), remembered per
/// path, size and modification time.
fn local_sha256(path: &Path) -> std::io::Result<String> {
    type Key = (PathBuf, u64, std::time::SystemTime);
    static SEEN: Mutex<Option<HashMap<Key, String>>> = Mutex::new(None);
    let meta = std::fs::metadata(path)?;
    let key = (path.to_path_buf(), meta.len(), meta.modified()?);
    if let Some(h) = SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&key)
    {
        return Ok(h.clone());
    }
    let out = std::process::Command::new("sha256sum").arg(path).output()?;
    let hash = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    if !out.status.success() || hash.len() != 64 {
        return Err(std::io::Error::other(format!(
            "sha256sum: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    SEEN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, hash.clone());
    Ok(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_and_start_time_come_from_the_right_fields() {
        let line =
            "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(pid_and_start(line), Some((4242, 987654)));
        assert_eq!(pid_and_start("garbage"), None);
    }
}
