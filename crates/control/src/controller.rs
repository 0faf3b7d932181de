//! The controller: one step per sample — reap the jobs that ended, ask the policy for the
//! server's cores, move the cores, then pause, resume and start jobs so that they fit in
//! the rest — and the loop that samples every 100 ms.
//!
//! ```text
//! every interval:  Sensor::sample ──► Signal ──► Controller::step
//!                                                 ├─ Machine::ended ─► Queue::ended   (end)
//!                                                 ├─ Policy::decide ─► Machine::set_cpus (cores)
//!                                                 └─ Queue::fit ─► Machine::pause/resume/start
//!                  every event ──► EventLog (JSON lines)
//! ```
//!
//! The controller never reads a clock: the time comes with the signal, so tests drive it
//! with a simulated server and clock ([`Machine`] is the seam) and never sleep.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cpus::CpuSet;
use crate::event::{unix_ms, Event, EventLog, What};
use crate::jobs::JobSpec;
use crate::policy::{Decision, Policy, PolicySpec, Signal};
use crate::probe::{PauseProbe, Verdict};
use crate::queue::{Action, Queue, State};
use crate::ControlError;

/// What the controller acts on: the server's and the jobs' CPUs, and the jobs' processes.
pub trait Machine {
    /// Gives the server `server` and the jobs `jobs` (empty: every job is paused, their
    /// CPUs are left as they were); returns what the kernel reports for the server.
    fn set_cpus(&mut self, server: &CpuSet, jobs: &CpuSet) -> Result<String, ControlError>;
    /// Starts job `i`; returns its process id, if it has one.
    fn start(&mut self, i: usize, job: &JobSpec) -> Result<Option<u32>, ControlError>;
    /// Pauses job `i`.
    fn pause(&mut self, i: usize) -> Result<(), ControlError>;
    /// Resumes job `i`.
    fn resume(&mut self, i: usize) -> Result<(), ControlError>;
    /// Jobs that exited since the last call, with their exit codes.
    fn ended(&mut self) -> Vec<(usize, Option<i32>)>;
    /// Jobs started from now on run at idle priority (`SCHED_IDLE`), so that they may share
    /// the server's CPUs: the server preempts them. Called once, before any job starts.
    fn idle_jobs(&mut self) -> Result<(), ControlError> {
        Ok(())
    }
    /// Ends every job still running or paused (the run is over).
    fn stop_all(&mut self);
}

/// Cores and their bounds.
#[derive(Debug, Clone)]
pub struct Share {
    /// The CPUs shared between the server and the jobs.
    pub cpus: CpuSet,
    /// The fewest the server gets.
    pub min_server: usize,
    /// The jobs also run on the server's CPUs, at idle priority (`SCHED_IDLE`): the server
    /// preempts them, so the jobs get its idle time. The policy then has one more step
    /// beyond all cores to the server: the jobs paused (off the server's CPUs too).
    pub idle_jobs: bool,
}

impl Share {
    /// The policy's steps: 1 ..= CPUs are the server's cores; with idle jobs one more
    /// (every core to the server and the jobs paused).
    pub fn levels(&self) -> usize {
        self.cpus.len() + usize::from(self.idle_jobs)
    }

    /// The server's cores at `level`.
    pub fn server_cores(&self, level: usize) -> usize {
        level.min(self.cpus.len())
    }

    /// The cores the jobs may use at `level` (with idle jobs: all of them, the server's at
    /// idle priority, until the last level).
    pub fn job_cores(&self, level: usize) -> usize {
        match self.idle_jobs {
            true if level <= self.cpus.len() => self.cpus.len(),
            true => 0,
            false => self.cpus.len() - self.server_cores(level),
        }
    }

    /// The server's and the jobs' CPUs at `level`.
    pub fn cpus_at(&self, level: usize) -> (CpuSet, CpuSet) {
        let (server, jobs) = self.cpus.split(self.server_cores(level));
        if self.idle_jobs && level <= self.cpus.len() {
            (server, self.cpus.clone())
        } else {
            (server, jobs)
        }
    }
}

/// The controller's state.
pub struct Controller<M: Machine> {
    /// What it acts on.
    pub machine: M,
    /// The jobs.
    pub queue: Queue,
    /// Its log.
    pub log: EventLog,
    policy: Policy,
    share: Share,
    /// The policy's step (the server's cores, or one more: see [`Share::levels`]).
    level: usize,
    last: Duration,
    /// With idle jobs and a latency guard: whether a pause of the jobs helps.
    probe: Option<PauseProbe>,
}

impl<M: Machine> Controller<M> {
    /// A controller over `machine`; gives the server its initial share at once.
    pub fn new(
        mut machine: M,
        policy: Policy,
        jobs: Vec<JobSpec>,
        share: Share,
        mut log: EventLog,
    ) -> Result<Controller<M>, ControlError> {
        let max = share.cpus.len();
        if max == 0 || share.min_server == 0 || share.min_server > max {
            return Err(ControlError::Spec(format!(
                "{} CPU(s) managed, the server's minimum {}: give at least one CPU and a \
                 minimum between 1 and the CPUs",
                max, share.min_server
            )));
        }
        let level = policy.initial(share.levels()).max(share.min_server);
        let server = share.server_cores(level);
        let (s, j) = share.cpus_at(level);
        if share.idle_jobs {
            machine.idle_jobs()?;
        }
        let readback = machine.set_cpus(&s, &j)?;
        log.push(Event {
            t_s: 0.0,
            unix_ms: unix_ms(),
            what: What::Cores {
                from: max,
                to: server,
                server_cpus: s.to_string(),
                job_cpus: j.to_string(),
                readback,
            },
            reason: format!("initial share ({})", policy.spec().name()),
            signal: None,
        })?;
        if share.idle_jobs {
            log.push(Event {
                t_s: 0.0,
                unix_ms: unix_ms(),
                what: What::Idle {
                    on: level <= max,
                    job_cpus: j.to_string(),
                },
                reason: "initial share: jobs at idle priority (SCHED_IDLE) may use the \
                         server's CPUs"
                    .into(),
                signal: None,
            })?;
        }
        let probe = match policy.spec() {
            PolicySpec::Reactive { slack } | PolicySpec::Predictive { slack, .. }
                if share.idle_jobs =>
            {
                Some(PauseProbe::new(*slack, slack.hold))
            }
            _ => None,
        };
        Ok(Controller {
            machine,
            queue: Queue::new(jobs),
            log,
            policy,
            share,
            level,
            last: Duration::ZERO,
            probe,
        })
    }

    /// The server's cores now.
    pub fn server_cores(&self) -> usize {
        self.share.server_cores(self.level)
    }

    /// Whether the jobs may run on the server's CPUs now (at idle priority).
    pub fn jobs_share_server_cpus(&self) -> bool {
        self.share.idle_jobs && self.level <= self.share.cpus.len()
    }

    /// One sample: jobs that ended, the policy's share, the jobs fitted to it.
    pub fn step(&mut self, s: &Signal) -> Result<(), ControlError> {
        let now = s.t;
        self.last = now;
        for (i, exit) in self.machine.ended() {
            if self.queue.entries[i].state == State::Done {
                continue;
            }
            self.queue.ended(i, exit, now);
            let e = &self.queue.entries[i];
            let what = What::End {
                job: e.spec.name.clone(),
                exit,
                runtime_s: e.runtime(now).as_secs_f64(),
                paused_s: e.paused.as_secs_f64(),
                pauses: e.pauses,
            };
            self.event(now, what, String::new(), None)?;
        }
        let decision =
            self.policy
                .decide(s, self.level, self.share.min_server, self.share.levels());
        let Decision {
            cores: level,
            reason,
        } = self.probe_pause(s, decision);
        if level != self.level {
            let (from, was_shared) = (self.server_cores(), self.jobs_share_server_cpus());
            let grow = level > self.level;
            self.level = level;
            let (sc, jc) = self.share.cpus_at(level);
            if grow {
                // Jobs leave the cores first, then the server takes them.
                self.fit(now, s, &reason)?;
            }
            if was_shared != self.jobs_share_server_cpus() {
                let what = What::Idle {
                    on: !was_shared,
                    job_cpus: jc.to_string(),
                };
                self.event(now, what, reason.clone(), Some(s.clone()))?;
            }
            if self.server_cores() != from {
                let readback = self.machine.set_cpus(&sc, &jc)?;
                let what = What::Cores {
                    from,
                    to: self.server_cores(),
                    server_cpus: sc.to_string(),
                    job_cpus: jc.to_string(),
                    readback,
                };
                self.event(now, what, reason.clone(), Some(s.clone()))?;
            }
        }
        self.fit(now, s, &reason)?;
        let what = What::Sample {
            cores: self.server_cores(),
            running: self.count(State::Running),
            paused: self.count(State::Paused),
        };
        self.event(now, what, String::new(), Some(s.clone()))
    }

    /// Ends the run: stops the jobs left, gives the server every CPU back, logs why.
    pub fn finish(&mut self, why: &str) -> Result<(), ControlError> {
        self.machine.stop_all();
        let all = self.share.cpus.clone();
        let readback = self.machine.set_cpus(&all, &CpuSet::default())?;
        if self.server_cores() != all.len() {
            let what = What::Cores {
                from: self.server_cores(),
                to: all.len(),
                server_cpus: all.to_string(),
                job_cpus: String::new(),
                readback,
            };
            self.level = self.share.levels();
            self.event(self.last, what, "the run ended".into(), None)?;
        }
        self.event(
            self.last,
            What::Stop { why: why.into() },
            String::new(),
            None,
        )
    }

    /// With idle jobs, the policy's last step (the jobs paused) goes through the probe: a
    /// pause that does not bring the latency back ends, and is not tried again for a while
    /// at a similar rate ([`crate::probe`]).
    fn probe_pause(&mut self, s: &Signal, mut d: Decision) -> Decision {
        let Some(probe) = &mut self.probe else {
            return d;
        };
        let pause = self.share.levels();
        let paused = self.level == pause;
        if paused && !probe.is_open() {
            // The initial pause, or one whose last verdict was that it helped: judged again.
            probe.start(s);
        } else if paused {
            if let Verdict::Useless(why) = probe.sample(s) {
                d = Decision {
                    cores: pause - 1,
                    reason: why,
                };
            }
        }
        if d.cores == pause && !paused {
            match probe.hold_off(s) {
                Some(why) => {
                    d.cores = pause - 1;
                    d.reason = format!("{}; {why}", d.reason);
                }
                None => probe.start(s),
            }
        }
        if paused && d.cores != pause {
            probe.abandon();
        }
        d
    }

    fn count(&self, st: State) -> usize {
        self.queue.entries.iter().filter(|e| e.state == st).count()
    }

    fn fit(&mut self, now: Duration, s: &Signal, reason: &str) -> Result<(), ControlError> {
        let free = self.share.job_cores(self.level);
        for a in self.queue.fit(free, now) {
            let (what, why) = match a {
                Action::Start(i, cores) => {
                    let pid = self.machine.start(i, &self.queue.entries[i].spec)?;
                    let job = self.queue.entries[i].spec.name.clone();
                    (
                        What::Start { job, cores, pid },
                        format!("{free} core(s) free"),
                    )
                }
                Action::Pause(i) => {
                    self.machine.pause(i)?;
                    let job = self.queue.entries[i].spec.name.clone();
                    (
                        What::Pause { job },
                        format!("the server took the cores: {reason}"),
                    )
                }
                Action::Resume(i, cores) => {
                    self.machine.resume(i)?;
                    let job = self.queue.entries[i].spec.name.clone();
                    (What::Resume { job, cores }, format!("{free} core(s) free"))
                }
            };
            self.event(now, what, why, Some(s.clone()))?;
        }
        Ok(())
    }

    fn event(
        &mut self,
        now: Duration,
        what: What,
        reason: String,
        signal: Option<Signal>,
    ) -> Result<(), ControlError> {
        self.log.push(Event {
            t_s: now.as_secs_f64(),
            unix_ms: unix_ms(),
            what,
            reason,
            signal,
        })
    }
}

/// Something that samples the server (see [`crate::sensor`]).
pub trait Sensor {
    /// One sample at `t` since the start.
    fn sample(&mut self, t: Duration) -> Signal;
}

/// When the loop stops.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    /// Time between samples.
    pub interval: Duration,
    /// Stop after this long at the latest.
    pub max: Duration,
    /// Stop when every job has ended.
    pub until_jobs_done: bool,
}

/// Samples every `interval` (on an absolute schedule: a late sample does not shift the
/// next), steps the controller, until the limits or `stop` say so; then
/// [`Controller::finish`]. Returns why it stopped.
pub fn run<M: Machine>(
    c: &mut Controller<M>,
    sensor: &mut dyn Sensor,
    limits: RunLimits,
    stop: &dyn Fn() -> bool,
) -> Result<String, ControlError> {
    let start = Instant::now();
    let mut next = start;
    let why = loop {
        next += limits.interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            // Far behind (a stalled machine): skip the missed ticks.
            next = now;
        }
        let t = start.elapsed();
        let s = sensor.sample(t);
        c.step(&s)?;
        if limits.until_jobs_done && c.queue.all_done() {
            break "every job ended".to_string();
        }
        if t >= limits.max {
            break format!("time limit ({:.0} s)", limits.max.as_secs_f64());
        }
        if stop() {
            break "asked to stop".to_string();
        }
    };
    c.finish(&why)?;
    Ok(why)
}

/// Runs the job file's `prepare` commands in `work` (sh -c, in order); a failure stops.
pub fn prepare(commands: &[String], work: &Path) -> Result<(), ControlError> {
    for cmd in commands {
        let text = crate::jobs::fill(cmd, work);
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(&text)
            .current_dir(work)
            .status()
            .map_err(|e| ControlError::io(format!("running {text:?}"), e))?;
        if !status.success() {
            return Err(ControlError::Spec(format!(
                "prepare command {text:?} failed ({status})"
            )));
        }
    }
    Ok(())
}
