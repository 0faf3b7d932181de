//! The real machine: the server's and the jobs' CPUs, and the jobs' processes.
//!
//! CPUs, by the first that works (or as asked):
//! - cgroup v1 cpuset (`/sys/fs/cgroup/cpuset`): `kvlab-control-<pid>/{server,jobs}`; the
//!   server's process moves into `server` (all its threads: `cgroup.procs`), each job joins
//!   `jobs` before it runs its command (in the child, between fork and exec, so nothing it
//!   starts escapes); a change writes `cpuset.cpus`;
//! - cgroup v2 with the cpuset controller: the same tree under the unified mount, each job
//!   in its own leaf `jobs/<i>` (a v2 cgroup with children holds no processes);
//! - `sched_setaffinity` on every thread of the server and of every process of each job's
//!   process group (no cgroup needed, any user may do it for their own processes; threads
//!   started later inherit their creator's mask).
//!
//! Pausing a job, by the first that works (or as asked):
//! - cgroup v1 freezer: `freezer/kvlab-control-<pid>/<i>`, `freezer.state` FROZEN/THAWED;
//! - cgroup v2: `cgroup.freeze` of the job's leaf;
//! - SIGSTOP/SIGCONT to the job's process group (its own: it is started as a group leader).
//!
//! Every cgroup made is removed when the machine is dropped, after the server is moved
//! back where it was and the jobs are ended. The server's CPUs are read back from
//! `/proc/PID/status` (`Cpus_allowed_list`) after every change.

use std::ffi::CString;
use std::fs::{self, File};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::controller::Machine;
use crate::cpus::{allowed_list, CpuSet};
use crate::jobs::JobSpec;
use crate::ControlError;

/// Where cgroup v1 hierarchies are mounted.
pub const CGROUP_V1: &str = "/sys/fs/cgroup";
/// Where the unified (v2) hierarchy is mounted: the root on a pure v2 system, `unified` on
/// a hybrid one.
pub const CGROUP_V2: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// How CPUs are moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuMethod {
    /// The first that works.
    Auto,
    /// cgroup v1 cpuset.
    CgroupV1,
    /// cgroup v2 cpuset.
    CgroupV2,
    /// `sched_setaffinity`.
    Affinity,
}

/// How jobs are paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMethod {
    /// The first that works.
    Auto,
    /// The cgroup freezer (v1 `freezer.state`, or v2 `cgroup.freeze` with cgroup v2 CPUs).
    Freezer,
    /// SIGSTOP/SIGCONT.
    Signal,
}

impl std::str::FromStr for CpuMethod {
    type Err = ControlError;
    fn from_str(s: &str) -> Result<CpuMethod, ControlError> {
        Ok(match s {
            "auto" => CpuMethod::Auto,
            "cgroup-v1" => CpuMethod::CgroupV1,
            "cgroup-v2" => CpuMethod::CgroupV2,
            "affinity" => CpuMethod::Affinity,
            _ => {
                return Err(ControlError::Spec(format!(
                    "CPU method {s:?}: auto, cgroup-v1, cgroup-v2 or affinity"
                )))
            }
        })
    }
}

impl std::str::FromStr for PauseMethod {
    type Err = ControlError;
    fn from_str(s: &str) -> Result<PauseMethod, ControlError> {
        Ok(match s {
            "auto" => PauseMethod::Auto,
            "freezer" => PauseMethod::Freezer,
            "signal" => PauseMethod::Signal,
            _ => {
                return Err(ControlError::Spec(format!(
                    "pause method {s:?}: auto, freezer or signal"
                )))
            }
        })
    }
}

/// The CPU side as set up.
#[derive(Debug)]
enum Cpus {
    V1 { dir: PathBuf },
    V2 { dir: PathBuf },
    Affinity,
}

/// The pause side as set up.
#[derive(Debug)]
enum Pause {
    FreezerV1 { dir: PathBuf },
    FreezerV2,
    Signal,
}

struct Job {
    child: Child,
    pgid: i32,
    frozen: bool,
    done: bool,
}

/// The real machine: a server process and the jobs' processes.
pub struct System {
    server: u32,
    cpus: Cpus,
    pause: Pause,
    work: PathBuf,
    jobs: Vec<Option<Job>>,
    job_cpus: CpuSet,
    /// The server's cgroup before it was moved (v1 cpuset or v2), to move it back.
    server_home: Option<PathBuf>,
    /// Jobs start at `SCHED_IDLE` ([`Machine::idle_jobs`]).
    idle: bool,
}

/// Whether process `pid` runs at `SCHED_IDLE` (`None`: it is gone).
pub fn sched_idle(pid: u32) -> Option<bool> {
    // SAFETY: sched_getscheduler reads a process's policy; no memory is passed.
    let p = unsafe { libc::sched_getscheduler(pid as libc::pid_t) };
    (p >= 0).then_some(p == libc::SCHED_IDLE)
}

fn write(path: &Path, text: &str) -> Result<(), ControlError> {
    fs::write(path, text)
        .map_err(|e| ControlError::io(format!("writing {text:?} to {}", path.display()), e))
}

fn read(path: &Path) -> Result<String, ControlError> {
    fs::read_to_string(path).map_err(|e| ControlError::io(format!("reading {}", path.display()), e))
}

fn mkdir(path: &Path) -> Result<(), ControlError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(ControlError::io(format!("creating {}", path.display()), e)),
    }
}

/// The v2 mount that offers the cpuset controller.
fn v2_root() -> Option<PathBuf> {
    CGROUP_V2.iter().map(PathBuf::from).find(|p| {
        fs::read_to_string(p.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpuset"))
    })
}

/// The process' cgroup path in a hierarchy: v1 by controller name, v2 by `""`.
fn cgroup_of(pid: u32, controller: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let _id = parts.next()?;
        let ctrls = parts.next()?;
        let path = parts.next()?;
        let hit = if controller.is_empty() {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == controller)
        };
        hit.then(|| path.to_string())
    })
}

impl System {
    /// Sets up for `server` (a running process) with jobs working in `work`, by `cpus` and
    /// `pause` (or the first method that works); `all` are the CPUs to share.
    pub fn new(
        server: u32,
        all: &CpuSet,
        cpus: CpuMethod,
        pause: PauseMethod,
        work: &Path,
    ) -> Result<System, ControlError> {
        let tag = format!("kvlab-control-{}", std::process::id());
        let mut errors = Vec::new();
        let mut made = None;
        let v1 = Path::new(CGROUP_V1).join("cpuset");
        if matches!(cpus, CpuMethod::Auto | CpuMethod::CgroupV1) {
            match setup_v1(&v1.join(&tag), all) {
                Ok(()) => made = Some(Cpus::V1 { dir: v1.join(&tag) }),
                Err(e) => errors.push(format!("cgroup v1 cpuset: {e}")),
            }
        }
        if made.is_none() && matches!(cpus, CpuMethod::Auto | CpuMethod::CgroupV2) {
            match v2_root() {
                Some(root) => match setup_v2(&root, &root.join(&tag), all) {
                    Ok(()) => {
                        made = Some(Cpus::V2 {
                            dir: root.join(&tag),
                        })
                    }
                    Err(e) => errors.push(format!("cgroup v2 cpuset: {e}")),
                },
                None => errors.push("cgroup v2: no hierarchy offers cpuset".into()),
            }
        }
        if made.is_none() && matches!(cpus, CpuMethod::Auto | CpuMethod::Affinity) {
            made = Some(Cpus::Affinity);
        }
        let Some(cpu_side) = made else {
            return Err(ControlError::Spec(format!(
                "cannot move CPUs as asked: {}",
                errors.join("; ")
            )));
        };
        let pause_side = match (pause, &cpu_side) {
            (PauseMethod::Signal, _) => Pause::Signal,
            (_, Cpus::V2 { .. }) => Pause::FreezerV2,
            (p, _) => {
                let dir = Path::new(CGROUP_V1).join("freezer").join(&tag);
                match mkdir(&dir) {
                    Ok(()) => Pause::FreezerV1 { dir },
                    Err(e) if p == PauseMethod::Freezer => {
                        return Err(ControlError::Spec(format!("cannot use the freezer: {e}")))
                    }
                    Err(_) => Pause::Signal,
                }
            }
        };
        let server_home = match &cpu_side {
            Cpus::V1 { dir } => {
                let home = cgroup_of(server, "cpuset").map(|p| v1.join(p.trim_start_matches('/')));
                write(&dir.join("server/cgroup.procs"), &server.to_string())?;
                home
            }
            Cpus::V2 { dir } => {
                let root = dir.parent().map(Path::to_path_buf).unwrap_or_default();
                let home = cgroup_of(server, "").map(|p| root.join(p.trim_start_matches('/')));
                write(&dir.join("server/cgroup.procs"), &server.to_string())?;
                home
            }
            Cpus::Affinity => None,
        };
        Ok(System {
            server,
            cpus: cpu_side,
            pause: pause_side,
            work: work.to_path_buf(),
            jobs: Vec::new(),
            job_cpus: all.clone(),
            server_home,
            idle: false,
        })
    }

    /// How CPUs move and jobs pause, in words (for the log and the report).
    pub fn describe(&self) -> String {
        let c = match &self.cpus {
            Cpus::V1 { dir } => format!("cgroup v1 cpuset ({})", dir.display()),
            Cpus::V2 { dir } => format!("cgroup v2 cpuset ({})", dir.display()),
            Cpus::Affinity => "sched_setaffinity".into(),
        };
        let p = match &self.pause {
            Pause::FreezerV1 { dir } => format!("cgroup v1 freezer ({})", dir.display()),
            Pause::FreezerV2 => "cgroup v2 cgroup.freeze".into(),
            Pause::Signal => "SIGSTOP/SIGCONT".into(),
        };
        format!("CPUs by {c}; pause by {p}")
    }

    /// Job `i`'s process id (its process group's leader).
    pub fn job_pid(&self, i: usize) -> Option<u32> {
        self.jobs.get(i)?.as_ref().map(|j| j.child.id())
    }

    /// Whether job `i` is stopped as the kernel reports it: `freezer.state` FROZEN (v1),
    /// `frozen 1` in `cgroup.events` (v2), or `State: T` (signals); `None` when unknown.
    pub fn job_stopped(&self, i: usize) -> Option<bool> {
        match &self.pause {
            Pause::FreezerV1 { dir } => {
                let st = fs::read_to_string(dir.join(i.to_string()).join("freezer.state")).ok()?;
                Some(st.trim() == "FROZEN")
            }
            Pause::FreezerV2 => {
                let ev = fs::read_to_string(self.job_leaf(i)?.join("cgroup.events")).ok()?;
                Some(ev.lines().any(|l| l.trim() == "frozen 1"))
            }
            Pause::Signal => Some(state(self.job_pid(i)?)? == 'T'),
        }
    }

    fn job_leaf(&self, i: usize) -> Option<PathBuf> {
        match &self.cpus {
            Cpus::V2 { dir } => Some(dir.join("jobs").join(i.to_string())),
            _ => None,
        }
    }

    fn set_freeze(&mut self, i: usize, frozen: bool) -> Result<(), ControlError> {
        let leaf = self.job_leaf(i);
        let Some(Some(job)) = self.jobs.get_mut(i) else {
            return Ok(());
        };
        if job.done || job.frozen == frozen {
            return Ok(());
        }
        match &self.pause {
            Pause::FreezerV1 { dir } => write(
                &dir.join(i.to_string()).join("freezer.state"),
                if frozen { "FROZEN" } else { "THAWED" },
            )?,
            Pause::FreezerV2 => {
                if let Some(l) = leaf {
                    write(&l.join("cgroup.freeze"), if frozen { "1" } else { "0" })?;
                }
            }
            Pause::Signal => {
                let sig = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
                // SAFETY: killpg has no memory preconditions; the group is the job's own.
                if unsafe { libc::killpg(job.pgid, sig) } != 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::ESRCH) {
                        return Err(ControlError::io(format!("signalling job {i}"), e));
                    }
                }
            }
        }
        job.frozen = frozen;
        Ok(())
    }

    /// Every process in job `i`'s process group (the affinity method's targets).
    fn job_pids(&self, i: usize) -> Vec<u32> {
        let Some(Some(job)) = self.jobs.get(i) else {
            return Vec::new();
        };
        processes_in_group(job.pgid)
    }
}

fn setup_v1(dir: &Path, all: &CpuSet) -> Result<(), ControlError> {
    let parent = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    if !parent.join("cpuset.cpus").exists() {
        return Err(ControlError::Spec(format!(
            "{} is not mounted",
            parent.display()
        )));
    }
    let mems = read(&parent.join("cpuset.mems"))?;
    mkdir(dir)?;
    for d in [dir.to_path_buf(), dir.join("server"), dir.join("jobs")] {
        mkdir(&d)?;
        write(&d.join("cpuset.mems"), mems.trim())?;
        write(&d.join("cpuset.cpus"), &all.to_string())?;
    }
    Ok(())
}

fn setup_v2(root: &Path, dir: &Path, all: &CpuSet) -> Result<(), ControlError> {
    write(&root.join("cgroup.subtree_control"), "+cpuset")?;
    mkdir(dir)?;
    write(&dir.join("cgroup.subtree_control"), "+cpuset")?;
    write(&dir.join("cpuset.cpus"), &all.to_string())?;
    for d in [dir.join("server"), dir.join("jobs")] {
        mkdir(&d)?;
        write(&d.join("cpuset.cpus"), &all.to_string())?;
    }
    write(&dir.join("jobs/cgroup.subtree_control"), "+cpuset")?;
    Ok(())
}

pub use kvlab_procfs::processes_in_group;

/// Sets the CPU mask of every thread of `pid`.
pub fn set_affinity(pid: u32, cpus: &CpuSet) -> Result<(), ControlError> {
    kvlab_procfs::set_affinity(pid, cpus.iter()).map_err(|e| match e {
        kvlab_procfs::ProcfsError::Sys { what, source } => ControlError::io(what, source),
        other => ControlError::Spec(other.to_string()),
    })
}

/// `Cpus_allowed_list` of a process (its main thread).
pub fn cpus_allowed(pid: u32) -> Option<CpuSet> {
    allowed_list(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// The `State:` letter of a process (`T` stopped, `S` sleeping, …).
pub fn state(pid: u32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|v| v.trim().chars().next())
}

impl Machine for System {
    fn idle_jobs(&mut self) -> Result<(), ControlError> {
        self.idle = true;
        Ok(())
    }

    fn set_cpus(&mut self, server: &CpuSet, jobs: &CpuSet) -> Result<String, ControlError> {
        if !jobs.is_empty() {
            self.job_cpus = jobs.clone();
        }
        match &self.cpus {
            Cpus::V1 { dir } | Cpus::V2 { dir } => {
                if !jobs.is_empty() {
                    write(&dir.join("jobs/cpuset.cpus"), &jobs.to_string())?;
                }
                write(&dir.join("server/cpuset.cpus"), &server.to_string())?;
            }
            Cpus::Affinity => {
                if !jobs.is_empty() {
                    for i in 0..self.jobs.len() {
                        for pid in self.job_pids(i) {
                            set_affinity(pid, jobs)?;
                        }
                    }
                }
                set_affinity(self.server, server)?;
            }
        }
        Ok(cpus_allowed(self.server).map_or_else(|| "?".into(), |c| c.to_string()))
    }

    fn start(&mut self, i: usize, job: &JobSpec) -> Result<Option<u32>, ControlError> {
        let text = job.render(&self.work);
        let log = self.work.join(format!("{}.log", job.name));
        let out = File::create(&log)
            .map_err(|e| ControlError::io(format!("creating {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| ControlError::io("duplicating a file handle", e))?;
        // The cgroups the child joins before it runs the command.
        let mut join: Vec<CString> = Vec::new();
        match &self.cpus {
            Cpus::V1 { dir } => join.push(path_c(&dir.join("jobs/cgroup.procs"))?),
            Cpus::V2 { dir } => {
                let leaf = dir.join("jobs").join(i.to_string());
                mkdir(&leaf)?;
                join.push(path_c(&leaf.join("cgroup.procs"))?);
            }
            Cpus::Affinity => {}
        }
        if let Pause::FreezerV1 { dir } = &self.pause {
            let d = dir.join(i.to_string());
            mkdir(&d)?;
            join.push(path_c(&d.join("cgroup.procs"))?);
        }
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(&text)
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let affinity = matches!(self.cpus, Cpus::Affinity).then(|| self.job_cpus.clone());
        let idle = self.idle;
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (open, write, close, sched_setaffinity,
        // sched_setscheduler) on data made before the fork.
        unsafe {
            let mut mask: libc::cpu_set_t = std::mem::zeroed();
            if let Some(c) = &affinity {
                for cpu in c.iter() {
                    libc::CPU_SET(cpu, &mut mask);
                }
            }
            cmd.pre_exec(move || {
                for p in &join {
                    let fd = libc::open(p.as_ptr(), libc::O_WRONLY);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let r = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if r != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if affinity.is_some()
                    && libc::sched_setaffinity(0, std::mem::size_of_val(&mask), &mask) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // Idle priority, inherited by everything the job forks: it runs only when
                // no other thread wants the CPU (any process may lower its own policy).
                let param = libc::sched_param { sched_priority: 0 };
                if idle && libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| ControlError::io(format!("starting job {:?} ({text})", job.name), e))?;
        let pid = child.id();
        if self.jobs.len() <= i {
            self.jobs.resize_with(i + 1, || None);
        }
        self.jobs[i] = Some(Job {
            child,
            pgid: pid as i32,
            frozen: false,
            done: false,
        });
        Ok(Some(pid))
    }

    fn pause(&mut self, i: usize) -> Result<(), ControlError> {
        self.set_freeze(i, true)
    }

    fn resume(&mut self, i: usize) -> Result<(), ControlError> {
        self.set_freeze(i, false)?;
        if let Cpus::Affinity = self.cpus {
            // Its processes may hold an older mask (it was paused while the jobs' CPUs
            // changed and the group was not reached, or it forked since).
            let cpus = self.job_cpus.clone();
            for pid in self.job_pids(i) {
                set_affinity(pid, &cpus)?;
            }
        }
        Ok(())
    }

    fn ended(&mut self) -> Vec<(usize, Option<i32>)> {
        let mut out = Vec::new();
        for (i, j) in self.jobs.iter_mut().enumerate() {
            let Some(j) = j else { continue };
            if j.done {
                continue;
            }
            if let Ok(Some(status)) = j.child.try_wait() {
                j.done = true;
                out.push((i, status.code()));
            }
        }
        out
    }

    fn stop_all(&mut self) {
        for i in 0..self.jobs.len() {
            let Some(Some(j)) = self.jobs.get(i) else {
                continue;
            };
            if j.done {
                continue;
            }
            let pgid = j.pgid;
            // SAFETY: killpg has no memory preconditions; the group is the job's own.
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
            // A frozen task dies only once thawed.
            if let Some(Some(j)) = self.jobs.get_mut(i) {
                j.frozen = true;
            }
            let _ = self.set_freeze(i, false);
            if let Some(Some(j)) = self.jobs.get_mut(i) {
                let _ = j.child.wait();
                j.done = true;
            }
        }
    }
}

/// Removes a cgroup directory: a job's killed processes may still be exiting (a cgroup
/// with tasks cannot be removed), and a process that left the job's process group is
/// killed here too; gives up after 2 s with a note.
fn remove_cgroup(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // SAFETY: kill has no memory preconditions; the process is in our cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        if std::time::Instant::now() > deadline {
            eprintln!("note: could not remove {}", dir.display());
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn path_c(p: &Path) -> Result<CString, ControlError> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| ControlError::Spec(format!("{} has a NUL byte", p.display())))
}

impl Drop for System {
    fn drop(&mut self) {
        self.stop_all();
        let (dir, leaves) = match &self.cpus {
            Cpus::V1 { dir } => (
                Some(dir.clone()),
                vec![dir.join("server"), dir.join("jobs")],
            ),
            Cpus::V2 { dir } => {
                let mut l: Vec<PathBuf> = (0..self.jobs.len())
                    .map(|i| dir.join("jobs").join(i.to_string()))
                    .collect();
                l.extend([dir.join("server"), dir.join("jobs")]);
                (Some(dir.clone()), l)
            }
            Cpus::Affinity => (None, Vec::new()),
        };
        if let Some(home) = &self.server_home {
            let _ = fs::write(home.join("cgroup.procs"), self.server.to_string());
        }
        let mut dirs = leaves;
        dirs.extend(dir);
        if let Pause::FreezerV1 { dir } = &self.pause {
            dirs.extend((0..self.jobs.len()).map(|i| dir.join(i.to_string())));
            dirs.push(dir.clone());
        }
        for d in dirs {
            remove_cgroup(&d);
        }
    }
}
