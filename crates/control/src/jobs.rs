//! The job file (TOML): the batch jobs that use the cores the server does not need.
//!
//! ```toml
//! # Commands run once, in order, before the queue starts (not timed): they make the inputs.
//! prepare = ["head -c 64M /dev/urandom > {work}/random.bin"]
//!
//! [[job]]
//! name = "zstd"                     # required, unique
//! command = "zstd -T{threads} -q -f -o {work}/r.zst {work}/random.bin"   # required; sh -c
//! threads = 2                       # = 1; {threads} in the command
//! cores = [1, 2]                    # = [1]; core counts the job may run on: it starts (or
//!                                   #   resumes) when the jobs' free cores reach the smallest
//! order = 1                         # = its position; jobs start in this order, never one
//!                                   #   before an earlier one has started
//! after = ["prepare-images"]        # = []; jobs that must have ended before this one starts
//!                                   #   (jobs without such a link may run side by side)
//! ```
//!
//! Placeholders: `{work}` is the work directory (`--work-dir`), `{threads}` the job's threads,
//! `{name}` its name. Unknown keys are errors, so a typo never falls back to a default.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ControlError;

/// One batch job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Unique name.
    pub name: String,
    /// Shell command (`sh -c`), placeholders filled in.
    pub command: String,
    /// Worker threads it is told to use (`{threads}`).
    #[serde(default = "one")]
    pub threads: usize,
    /// Core counts it may run on (ascending).
    #[serde(default = "one_core")]
    pub cores: Vec<usize>,
    /// Start order (lower first; default: position in the file).
    pub order: Option<i64>,
    /// Jobs that must have ended before it starts.
    #[serde(default)]
    pub after: Vec<String>,
}

fn one() -> usize {
    1
}

fn one_core() -> Vec<usize> {
    vec![1]
}

impl JobSpec {
    /// The fewest cores it runs on.
    pub fn min_cores(&self) -> usize {
        self.cores.first().copied().unwrap_or(1)
    }

    /// The most cores it may take when `free` are free (`None`: it does not fit).
    pub fn cores_for(&self, free: usize) -> Option<usize> {
        self.cores.iter().copied().filter(|&c| c <= free).max()
    }

    /// The command with its placeholders filled in.
    pub fn render(&self, work: &Path) -> String {
        fill(&self.command, work)
            .replace("{threads}", &self.threads.to_string())
            .replace("{name}", &self.name)
    }
}

/// `{work}` filled in.
pub fn fill(text: &str, work: &Path) -> String {
    text.replace("{work}", &work.display().to_string())
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    prepare: Vec<String>,
    #[serde(default, rename = "job")]
    jobs: Vec<JobSpec>,
}

/// A checked job file: the jobs in start order.
#[derive(Debug, Clone, Default)]
pub struct JobFile {
    /// Commands that make the inputs, run in order before the queue starts.
    pub prepare: Vec<String>,
    /// The jobs, sorted by `order` (stable: ties keep the file's order).
    pub jobs: Vec<JobSpec>,
}

impl JobFile {
    /// Reads and checks a job file.
    pub fn load(path: &Path) -> Result<JobFile, ControlError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ControlError::io(format!("reading {}", path.display()), e))?;
        JobFile::parse(&text).map_err(|e| match e {
            ControlError::Spec(m) => ControlError::Spec(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Parses and checks a job file's text.
    pub fn parse(text: &str) -> Result<JobFile, ControlError> {
        let file: FileSpec = toml::from_str(text).map_err(|e| ControlError::Spec(e.to_string()))?;
        let mut jobs: Vec<(i64, JobSpec)> = file
            .jobs
            .into_iter()
            .enumerate()
            .map(|(i, j)| (j.order.unwrap_or(i as i64), j))
            .collect();
        jobs.sort_by_key(|(o, _)| *o);
        let jobs: Vec<JobSpec> = jobs.into_iter().map(|(_, j)| j).collect();
        let mut seen = HashMap::new();
        for (i, j) in jobs.iter().enumerate() {
            let bad = |why: String| ControlError::Spec(format!("job {:?}: {why}", j.name));
            if j.name.is_empty() {
                return Err(ControlError::Spec("a job without a name".into()));
            }
            if seen.insert(j.name.as_str(), i).is_some() {
                return Err(bad("named twice".into()));
            }
            if j.command.trim().is_empty() {
                return Err(bad("empty command".into()));
            }
            if j.threads == 0 {
                return Err(bad("threads = 0".into()));
            }
            if j.cores.is_empty()
                || j.cores.contains(&0)
                || j.cores.windows(2).any(|w| w[0] >= w[1])
            {
                return Err(bad(format!(
                    "cores = {:?}: give core counts > 0, ascending",
                    j.cores
                )));
            }
        }
        for j in &jobs {
            for a in &j.after {
                // A job waits only for jobs that start before it: otherwise the order and the
                // dependency would deadlock.
                match seen.get(a.as_str()) {
                    None => {
                        return Err(ControlError::Spec(format!(
                            "job {:?}: after {a:?}: no such job",
                            j.name
                        )))
                    }
                    Some(&k) if k >= seen[j.name.as_str()] => {
                        return Err(ControlError::Spec(format!(
                            "job {:?}: after {a:?}, which does not start before it (order)",
                            j.name
                        )))
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(JobFile {
            prepare: file.prepare,
            jobs,
        })
    }

    /// The file's text (TOML) that parses back to these jobs in this order (each job's
    /// `order` its place): how the lab hands a job file to a controller on another host.
    pub fn to_toml(&self) -> String {
        let file = FileSpec {
            prepare: self.prepare.clone(),
            jobs: self
                .jobs
                .iter()
                .enumerate()
                .map(|(i, j)| JobSpec {
                    order: Some(i as i64),
                    ..j.clone()
                })
                .collect(),
        };
        toml::to_string(&file).unwrap_or_default()
    }

    /// Index of a job by name.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.jobs.iter().position(|j| j.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_file_s_text_gives_it_back_in_its_order() {
        let f = JobFile::parse(
            "prepare = [\"seq 9 > {work}/n\"]\n\
             [[job]]\nname = \"late\"\ncommand = \"true\"\norder = 5\n\
             [[job]]\nname = \"x\"\ncommand = \"sort {work}/n\"\nthreads = 2\ncores = [1, 2]\norder = 100\n\
             [[job]]\nname = \"y\"\ncommand = \"true\"\norder = 100\nafter = [\"x\"]\n\
             [[job]]\nname = \"z\"\ncommand = \"true\"\norder = 100\n\
             [[job]]\nname = \"w\"\ncommand = \"true\"\norder = 100\n\
             [[job]]\nname = \"n\"\ncommand = \"true\"\n",
        )
        .unwrap();
        let names = |f: &JobFile| f.jobs.iter().map(|j| j.name.clone()).collect::<Vec<_>>();
        // "n" (no order: its place, 5) ties with "late" (5), which comes first in the file.
        assert_eq!(names(&f), ["late", "n", "x", "y", "z", "w"]);
        let back = JobFile::parse(&f.to_toml()).unwrap();
        assert_eq!(names(&back), names(&f));
        assert_eq!(back.prepare, f.prepare);
        for (a, b) in back.jobs.iter().zip(&f.jobs) {
            assert_eq!(
                JobSpec {
                    order: None,
                    ..a.clone()
                },
                JobSpec {
                    order: None,
                    ..b.clone()
                }
            );
        }
    }

    #[test]
    fn jobs_are_sorted_by_order_and_checked() {
        let f = JobFile::parse(
            r#"
            prepare = ["echo hi > {work}/x"]
            [[job]]
            name = "b"
            command = "sort --parallel={threads} {work}/x"
            threads = 2
            cores = [1, 2]
            order = 2
            after = ["a"]
            [[job]]
            name = "a"
            command = "true"
            order = 1
            "#,
        )
        .unwrap();
        assert_eq!(f.jobs[0].name, "a");
        assert_eq!(f.jobs[1].min_cores(), 1);
        assert_eq!(f.jobs[1].cores_for(5), Some(2));
        assert_eq!(f.jobs[0].cores_for(0), None);
        assert_eq!(
            f.jobs[1].render(Path::new("/w")),
            "sort --parallel=2 /w/x".to_string()
        );
        assert_eq!(fill(&f.prepare[0], Path::new("/w")), "echo hi > /w/x");
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let cases = [
            ("[[job]]\nname = \"a\"\ncommand = \"x\"\nthreds = 2", "threds"),
            ("[[job]]\nname = \"a\"\ncommand = \"\"", "empty command"),
            ("[[job]]\nname = \"a\"\ncommand = \"x\"\ncores = [2, 1]", "ascending"),
            ("[[job]]\nname = \"a\"\ncommand = \"x\"\nafter = [\"z\"]", "no such job"),
            (
                "[[job]]\nname = \"a\"\ncommand = \"x\"\nafter = [\"b\"]\n[[job]]\nname = \"b\"\ncommand = \"y\"",
                "does not start before",
            ),
            ("[[job]]\nname = \"a\"\ncommand = \"x\"\n[[job]]\nname = \"a\"\ncommand = \"y\"", "twice"),
        ];
        for (text, want) in cases {
            let e = JobFile::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
