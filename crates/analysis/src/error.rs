//! The one error type of the crate: each variant says what input was wrong.

use thiserror::Error;

/// `Result` with [`AnalysisError`].
pub type Result<T> = std::result::Result<T, AnalysisError>;

/// Why an analysis could not be carried out.
#[derive(Debug, Error)]
pub enum AnalysisError {
    /// Fewer samples (or points) than the computation needs.
    #[error("{what}: need at least {needed}, got {got}")]
    TooFew {
        /// What was counted.
        what: &'static str,
        /// How many the computation needs.
        needed: usize,
        /// How many it got.
        got: usize,
    },
    /// A NaN or infinite input.
    #[error("{what} is not a finite number")]
    NonFinite {
        /// Which input.
        what: &'static str,
    },
    /// A confidence level outside the open interval (0, 1).
    #[error("confidence level {0} is not in (0, 1)")]
    InvalidConfidence(f64),
    /// A parameter outside its domain.
    #[error("{what} = {value}: expected {expected}")]
    InvalidArgument {
        /// Which parameter.
        what: &'static str,
        /// The value given.
        value: f64,
        /// The domain it must be in.
        expected: &'static str,
    },
    /// An open queue whose utilization ρ is at least 1 has no steady state.
    #[error("utilization ρ = {utilization} ≥ 1: the queue is unstable (grows without bound)")]
    Unstable {
        /// The utilization ρ.
        utilization: f64,
    },
    /// A factorial design whose observations do not fit 2^k rows of r replications.
    #[error("factorial design: {0}")]
    DesignShape(String),
    /// A `/proc/<pid>/stat` line that could not be parsed.
    #[error("cannot parse /proc/<pid>/stat: {0}")]
    ProcStat(String),
    /// Reading a file (e.g. `/proc/<pid>/stat`) failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<kvlab_procfs::ProcfsError> for AnalysisError {
    fn from(e: kvlab_procfs::ProcfsError) -> Self {
        use kvlab_procfs::ProcfsError;
        match e {
            ProcfsError::Parse(why) => AnalysisError::ProcStat(why),
            ProcfsError::Read { path, source } => AnalysisError::Io { path, source },
            // Only setting a process's affinity fails so; no reading does.
            other => AnalysisError::ProcStat(other.to_string()),
        }
    }
}

/// Checks that `x` is finite.
pub(crate) fn finite(what: &'static str, x: f64) -> Result<f64> {
    if x.is_finite() {
        Ok(x)
    } else {
        Err(AnalysisError::NonFinite { what })
    }
}

/// Checks that `x` is finite and `>= 0`.
pub(crate) fn non_negative(what: &'static str, x: f64) -> Result<f64> {
    finite(what, x)?;
    if x >= 0.0 {
        Ok(x)
    } else {
        Err(AnalysisError::InvalidArgument {
            what,
            value: x,
            expected: "a finite number >= 0",
        })
    }
}

/// Checks that `x` is finite and `> 0`.
pub(crate) fn positive(what: &'static str, x: f64) -> Result<f64> {
    finite(what, x)?;
    if x > 0.0 {
        Ok(x)
    } else {
        Err(AnalysisError::InvalidArgument {
            what,
            value: x,
            expected: "a finite number > 0",
        })
    }
}
