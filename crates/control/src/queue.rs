//! The job queue: which job starts next, which run, which are paused, and each job's
//! runtime without its paused spans. Pure bookkeeping over times the controller passes in
//! (`Duration` since the controller started), so tests drive it without a clock.
//!
//! Rules: jobs start in the job file's order, and a job never starts before an earlier one
//! has (the head of the queue waits for its dependencies and for cores, and the jobs behind
//! it wait with it). A job holds cores from start to end: the largest of its allowed core
//! counts that fits when it starts or resumes. When the jobs' cores shrink below what the
//! running jobs hold, the latest started are paused first; when cores come back, the paused
//! ones resume (earliest started first) before a new job starts.

use std::time::Duration;

use serde::Serialize;

use crate::jobs::JobSpec;

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Not started.
    Waiting,
    /// Running on `cores` cores.
    Running,
    /// Stopped by the controller.
    Paused,
    /// Exited.
    Done,
}

/// One job's bookkeeping.
#[derive(Debug, Clone)]
pub struct Entry {
    /// What it runs.
    pub spec: JobSpec,
    /// Where it is.
    pub state: State,
    /// Cores it holds while running (0 otherwise).
    pub cores: usize,
    /// When it started.
    pub started: Option<Duration>,
    /// When it ended.
    pub ended: Option<Duration>,
    /// Its exit code (`None`: killed by a signal, or not ended).
    pub exit: Option<i32>,
    /// Since when it is paused.
    paused_since: Option<Duration>,
    /// Paused time so far.
    pub paused: Duration,
    /// Times it was paused.
    pub pauses: u32,
}

impl Entry {
    /// Time it ran, paused spans excluded (up to `now` while it has not ended).
    pub fn runtime(&self, now: Duration) -> Duration {
        let Some(start) = self.started else {
            return Duration::ZERO;
        };
        let end = self.ended.unwrap_or(now);
        let open = self
            .paused_since
            .map_or(Duration::ZERO, |p| end.saturating_sub(p));
        end.saturating_sub(start)
            .saturating_sub(self.paused)
            .saturating_sub(open)
    }
}

/// A change the queue asks the machine to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Start job `i` on `cores` cores.
    Start(usize, usize),
    /// Pause job `i`.
    Pause(usize),
    /// Resume job `i` on `cores` cores.
    Resume(usize, usize),
}

/// The jobs in start order.
#[derive(Debug, Clone)]
pub struct Queue {
    /// Every job, in start order.
    pub entries: Vec<Entry>,
}

impl Queue {
    /// A queue of these jobs (already in start order, as [`crate::jobs::JobFile`] has them).
    pub fn new(jobs: Vec<JobSpec>) -> Queue {
        Queue {
            entries: jobs
                .into_iter()
                .map(|spec| Entry {
                    spec,
                    state: State::Waiting,
                    cores: 0,
                    started: None,
                    ended: None,
                    exit: None,
                    paused_since: None,
                    paused: Duration::ZERO,
                    pauses: 0,
                })
                .collect(),
        }
    }

    /// Whether every job has ended.
    pub fn all_done(&self) -> bool {
        self.entries.iter().all(|e| e.state == State::Done)
    }

    /// Whether any job runs or is paused.
    pub fn any_active(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.state, State::Running | State::Paused))
    }

    /// Cores the running jobs hold.
    pub fn held(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| e.state == State::Running)
            .map(|e| e.cores)
            .sum()
    }

    /// What to do so that the running jobs fit in `cores` and as many as fit run: pauses
    /// first, then resumes, then starts, each applied to the queue at `now` as it is returned.
    pub fn fit(&mut self, cores: usize, now: Duration) -> Vec<Action> {
        let mut out = Vec::new();
        // Pause the latest started until the rest fit.
        while self.held() > cores {
            let Some(i) = self.running().max_by_key(|&i| self.entries[i].started) else {
                break;
            };
            self.pause(i, now);
            out.push(Action::Pause(i));
        }
        // Resume the earliest started that fit.
        let mut paused: Vec<usize> = (0..self.entries.len())
            .filter(|&i| self.entries[i].state == State::Paused)
            .collect();
        paused.sort_by_key(|&i| self.entries[i].started);
        for i in paused {
            let free = cores - self.held();
            if let Some(c) = self.entries[i].spec.cores_for(free) {
                self.resume(i, c, now);
                out.push(Action::Resume(i, c));
            }
        }
        // Start waiting jobs in order while the head fits and its dependencies have ended.
        while let Some(i) = self.entries.iter().position(|e| e.state == State::Waiting) {
            let free = cores - self.held();
            let deps_done = self.entries[i].spec.after.iter().all(|a| {
                self.entries
                    .iter()
                    .any(|e| &e.spec.name == a && e.state == State::Done)
            });
            match self.entries[i].spec.cores_for(free) {
                Some(c) if deps_done => {
                    let e = &mut self.entries[i];
                    e.state = State::Running;
                    e.cores = c;
                    e.started = Some(now);
                    out.push(Action::Start(i, c));
                }
                _ => break,
            }
        }
        out
    }

    /// Job `i` exited at `now` with `exit`.
    pub fn ended(&mut self, i: usize, exit: Option<i32>, now: Duration) {
        let e = &mut self.entries[i];
        if let Some(p) = e.paused_since.take() {
            e.paused += now.saturating_sub(p);
        }
        e.state = State::Done;
        e.cores = 0;
        e.ended = Some(now);
        e.exit = exit;
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.entries.len()).filter(|&i| self.entries[i].state == State::Running)
    }

    fn pause(&mut self, i: usize, now: Duration) {
        let e = &mut self.entries[i];
        e.state = State::Paused;
        e.cores = 0;
        e.paused_since = Some(now);
        e.pauses += 1;
    }

    fn resume(&mut self, i: usize, cores: usize, now: Duration) {
        let e = &mut self.entries[i];
        if let Some(p) = e.paused_since.take() {
            e.paused += now.saturating_sub(p);
        }
        e.state = State::Running;
        e.cores = cores;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::JobFile;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    fn queue(text: &str) -> Queue {
        Queue::new(JobFile::parse(text).unwrap().jobs)
    }

    #[test]
    fn paused_time_is_not_runtime() {
        let mut q = queue("[[job]]\nname = \"a\"\ncommand = \"x\"");
        assert_eq!(q.fit(1, s(0.0)), vec![Action::Start(0, 1)]);
        assert_eq!(q.fit(0, s(2.0)), vec![Action::Pause(0)]);
        assert_eq!(q.entries[0].runtime(s(3.0)), s(2.0));
        assert_eq!(q.fit(1, s(5.0)), vec![Action::Resume(0, 1)]);
        assert_eq!(q.fit(0, s(6.0)), vec![Action::Pause(0)]);
        // Ends while paused: the open paused span counts as paused too.
        q.ended(0, Some(0), s(7.0));
        let e = &q.entries[0];
        assert_eq!(e.runtime(s(100.0)), s(3.0));
        assert_eq!((e.pauses, e.paused), (2, s(4.0)));
        assert!(q.all_done());
    }

    #[test]
    fn order_and_dependencies_are_respected() {
        let mut q = queue(
            r#"
            [[job]]
            name = "a"
            command = "x"
            cores = [1, 2]
            [[job]]
            name = "b"
            command = "x"
            [[job]]
            name = "c"
            command = "x"
            after = ["a"]
            [[job]]
            name = "d"
            command = "x"
            "#,
        );
        // a takes both cores: b must wait; nothing jumps the queue.
        assert_eq!(q.fit(2, s(0.0)), vec![Action::Start(0, 2)]);
        assert_eq!(q.fit(2, s(1.0)), vec![]);
        q.ended(0, Some(0), s(2.0));
        // b starts on one core; c (after a, done) on the other; d waits for a core.
        assert_eq!(
            q.fit(2, s(2.0)),
            vec![Action::Start(1, 1), Action::Start(2, 1)]
        );
        q.ended(2, Some(0), s(3.0));
        assert_eq!(q.fit(2, s(3.0)), vec![Action::Start(3, 1)]);
    }

    #[test]
    fn a_dependency_blocks_the_jobs_behind_it() {
        let mut q = queue(
            "[[job]]\nname = \"a\"\ncommand = \"x\"\n[[job]]\nname = \"b\"\ncommand = \"x\"\nafter = [\"a\"]\n[[job]]\nname = \"c\"\ncommand = \"x\"",
        );
        assert_eq!(q.fit(3, s(0.0)), vec![Action::Start(0, 1)]);
        // b waits for a; c must not start before b although cores are free.
        assert_eq!(q.fit(3, s(1.0)), vec![]);
        q.ended(0, Some(0), s(2.0));
        assert_eq!(
            q.fit(3, s(2.0)),
            vec![Action::Start(1, 1), Action::Start(2, 1)]
        );
    }

    #[test]
    fn the_latest_started_pause_first_and_resume_last() {
        let mut q = queue(
            "[[job]]\nname = \"a\"\ncommand = \"x\"\n[[job]]\nname = \"b\"\ncommand = \"x\"\n[[job]]\nname = \"c\"\ncommand = \"x\"",
        );
        assert_eq!(q.fit(2, s(0.0)).len(), 2);
        assert_eq!(q.fit(0, s(1.0)), vec![Action::Pause(1), Action::Pause(0)]);
        assert_eq!(q.fit(1, s(2.0)), vec![Action::Resume(0, 1)]);
        // A paused job resumes before a new one starts.
        assert_eq!(q.fit(2, s(3.0)), vec![Action::Resume(1, 1)]);
        assert_eq!(q.entries[2].state, State::Waiting);
    }
}
