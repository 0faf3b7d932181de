//! The hosts of one run, connected together, and the promise that everything started on
//! any of them is stopped: [`Fleet::teardown`] on success, the fleet's drop on an error
//! path (or a panic), [`teardown_on_interrupt`] on Ctrl-C or SIGTERM. A host lost mid-run
//! does not stop the others' teardown; its own failure is reported by name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::clock::{self, ClockOffset};
use crate::error::{HostError, Result};
use crate::host::Host;
use crate::remote::{Remote, Started, Stopped};
use crate::Settings;

/// Control directories made by this process so far (part of the next one's name).
static DIRS: AtomicU32 = AtomicU32::new(0);

struct Inner {
    remotes: Vec<Remote>,
    control_dir: PathBuf,
    /// Held while tearing down: a second teardown (a signal during the drop's) waits, then
    /// finds nothing left.
    teardown: Mutex<bool>,
}

/// Several connected hosts (see the module docs).
pub struct Fleet {
    inner: Arc<Inner>,
}

/// A handle that tears a fleet down from anywhere (a signal handler's thread); does nothing
/// once the fleet is gone.
#[derive(Clone)]
pub struct Teardown(Weak<Inner>);

impl Teardown {
    /// Stops everything the fleet started and closes its connections (see
    /// [`Fleet::teardown`]).
    pub fn run(&self) -> Result<Vec<(Started, Stopped)>> {
        match self.0.upgrade() {
            Some(inner) => teardown(&inner),
            None => Ok(Vec::new()),
        }
    }
}

impl Fleet {
    /// Connects to every host at once (ssh hosts: one control connection each, in a private
    /// directory). If any cannot be reached, the others are closed and the error names each
    /// host that failed.
    pub fn connect(hosts: &[Host], settings: Settings) -> Result<Fleet> {
        let mut seen = HashMap::new();
        for h in hosts {
            h.validate()?;
            if seen.insert(h.name.as_str(), ()).is_some() {
                return Err(HostError::Config {
                    host: h.name.clone(),
                    detail: "named twice".into(),
                });
            }
        }
        let control_dir = private_dir().map_err(|source| HostError::Io {
            host: hosts.first().map(|h| h.name.clone()).unwrap_or_default(),
            what: "making the ssh control directory".into(),
            source,
        })?;
        let settings = Arc::new(settings);
        let results: Vec<Result<Remote>> = std::thread::scope(|s| {
            let handles: Vec<_> = hosts
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    let (settings, dir) = (settings.clone(), control_dir.as_path());
                    s.spawn(move || Remote::connect(h, settings, dir, i))
                })
                .collect();
            handles
                .into_iter()
                .zip(hosts)
                .map(|(h, host)| {
                    h.join().unwrap_or_else(|_| {
                        Err(HostError::Config {
                            host: host.name.clone(),
                            detail: "connecting panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let (mut remotes, mut errors) = (Vec::new(), Vec::new());
        for r in results {
            match r {
                Ok(remote) => remotes.push(remote),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            for r in &remotes {
                r.close();
            }
            let _ = std::fs::remove_dir_all(&control_dir);
            return Err(if errors.len() == 1 {
                errors.remove(0)
            } else {
                HostError::Several(errors)
            });
        }
        Ok(Fleet {
            inner: Arc::new(Inner {
                remotes,
                control_dir,
                teardown: Mutex::new(false),
            }),
        })
    }

    /// The hosts, in the order given.
    pub fn remotes(&self) -> &[Remote] {
        &self.inner.remotes
    }

    /// The host named `name`.
    pub fn get(&self, name: &str) -> Option<&Remote> {
        self.inner.remotes.iter().find(|r| r.name() == name)
    }

    /// Runs `f` on every host at once; the results in host order.
    pub fn each<T: Send>(&self, f: impl Fn(&Remote) -> Result<T> + Sync) -> Vec<Result<T>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .inner
                .remotes
                .iter()
                .map(|r| {
                    let f = &f;
                    s.spawn(move || f(r))
                })
                .collect();
            handles
                .into_iter()
                .zip(&self.inner.remotes)
                .map(|(h, r)| {
                    h.join().unwrap_or_else(|_| {
                        Err(HostError::Config {
                            host: r.name().to_string(),
                            detail: "an operation panicked".into(),
                        })
                    })
                })
                .collect()
        })
    }

    /// Checks, before anything starts, that each host has the tools it needs
    /// (`needs`: host name → programs); one error listing every host's missing tools.
    pub fn check_tools(&self, needs: &[(&str, Vec<&str>)]) -> Result<()> {
        for (h, _) in needs {
            if self.get(h).is_none() {
                return Err(HostError::Config {
                    host: (*h).to_string(),
                    detail: "no such host".into(),
                });
            }
        }
        let results = self.each(|r| {
            let tools: Vec<&str> = needs
                .iter()
                .filter(|(h, _)| *h == r.name())
                .flat_map(|(_, t)| t.iter().copied())
                .collect();
            r.missing_tools(&tools)
        });
        let mut missing = Vec::new();
        let mut errors = Vec::new();
        for (r, res) in self.inner.remotes.iter().zip(results) {
            match res {
                Ok(m) if m.is_empty() => {}
                Ok(m) => missing.push((r.name().to_string(), m)),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(several(errors));
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(HostError::MissingTools { missing })
        }
    }

    /// Ships `local` to every host at once ([`Remote::ship`]); each host's path to it.
    pub fn ship(&self, local: &Path) -> Result<HashMap<String, String>> {
        let results = self.each(|r| r.ship(local).map(|p| (r.name().to_string(), p)));
        collect(results)
    }

    /// Makes the run directory `run` on every host; each host's path to it.
    pub fn make_run_dirs(&self, run: &str) -> Result<HashMap<String, String>> {
        let results = self.each(|r| r.make_run_dir(run).map(|p| (r.name().to_string(), p)));
        collect(results)
    }

    /// Every host's clock offset ([`clock::offset`], `rounds` round trips each, the hosts
    /// one after another so that they do not slow each other's round trips).
    pub fn clock_offsets(&self, rounds: u32) -> Result<Vec<(String, ClockOffset)>> {
        self.inner
            .remotes
            .iter()
            .map(|r| clock::offset(r, rounds).map(|o| (r.name().to_string(), o)))
            .collect()
    }

    /// A handle that tears this fleet down from another thread.
    pub fn teardown_handle(&self) -> Teardown {
        Teardown(Arc::downgrade(&self.inner))
    }

    /// Stops everything started on every host (all hosts at once: SIGTERM, SIGKILL after
    /// the grace period) and closes every connection. Idempotent. An error names each host
    /// that could not be cleaned up (a lost host: what may still run there).
    pub fn teardown(&self) -> Result<Vec<(Started, Stopped)>> {
        teardown(&self.inner)
    }
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("remotes", &self.inner.remotes)
            .finish()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Err(e) = teardown(&self.inner) {
            eprintln!("tearing down the hosts: {e}");
        }
    }
}

fn teardown(inner: &Inner) -> Result<Vec<(Started, Stopped)>> {
    let mut done_flag = inner.teardown.lock().unwrap_or_else(|e| e.into_inner());
    // Per host: what it had started, and how stopping it went.
    type Outcome = (Vec<Started>, Result<Vec<(Started, Stopped)>>);
    let results: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = inner
            .remotes
            .iter()
            .map(|r| s.spawn(move || (r.started(), r.stop_all())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| (Vec::new(), Ok(Vec::new()))))
            .collect()
    });
    let mut stopped = Vec::new();
    let mut errors = Vec::new();
    for (r, (before, res)) in inner.remotes.iter().zip(results) {
        match res {
            Ok(s) => stopped.extend(s),
            Err(e) => {
                // Reported once: a later teardown (the drop's) does not try them again.
                let left: Vec<String> = r
                    .abandon()
                    .iter()
                    .filter(|p| before.contains(p))
                    .map(|p| format!("{} (pid {})", p.name, p.pid))
                    .collect();
                errors.push(if left.is_empty() {
                    e
                } else {
                    HostError::Failed {
                        host: r.name().to_string(),
                        what: "teardown".into(),
                        status: format!("may still run: {}", left.join(", ")),
                        stderr: e.to_string(),
                    }
                });
            }
        }
        r.close();
    }
    if !*done_flag {
        *done_flag = true;
        let _ = std::fs::remove_dir_all(&inner.control_dir);
    }
    if errors.is_empty() {
        Ok(stopped)
    } else {
        Err(several(errors))
    }
}

/// On SIGINT or SIGTERM, tears `fleet` down (saying so on stderr) and exits with 128 + the
/// signal. For a program whose run has nothing else to save; one that does registers its
/// own handler and calls [`Teardown::run`] from it.
pub fn teardown_on_interrupt(fleet: Teardown) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new()
        .name("kvlab-hosts-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                eprintln!("interrupted: stopping what was started on the hosts");
                if let Err(e) = fleet.run() {
                    eprintln!("{e}");
                }
                std::process::exit(128 + signal);
            }
        })?;
    Ok(())
}

fn several(mut errors: Vec<HostError>) -> HostError {
    if errors.len() == 1 {
        errors.remove(0)
    } else {
        HostError::Several(errors)
    }
}

fn collect(results: Vec<Result<(String, String)>>) -> Result<HashMap<String, String>> {
    let mut map = HashMap::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok((k, v)) => {
                map.insert(k, v);
            }
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(map)
    } else {
        Err(several(errors))
    }
}

/// A new directory only we can enter, with a short path (ssh's control sockets live in it,
/// and a socket's path has at most 107 bytes).
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let n = DIRS.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(format!("/tmp/kvlab-ssh-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}
