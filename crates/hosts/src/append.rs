//! A file on a host written as it grows here: [`Remote::append_to`] opens a stream (one
//! `cat >> FILE` over the host's control connection) that bytes written here are appended
//! through — how a process on the host reads a series this machine produces (the load's
//! interval rows a controller there steers by) while it is produced.

use std::io::Write;
use std::process::{Child, ChildStdin, Stdio};
use std::time::Duration;

use crate::error::{HostError, Result};
use crate::exec::quote;
use crate::remote::Remote;
use crate::shell::{kill_group, wait_bounded};

/// How long the stream has to end once its input is closed.
const END: Duration = Duration::from_secs(5);

/// Bytes appended to a file on a host as they are written here.
pub struct Appender {
    host: String,
    path: String,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Remote {
    /// Opens `path` on this host for appending (created if missing) through a stream over
    /// the control connection. A write fails once the host is lost.
    pub fn append_to(&self, path: &str) -> Result<Appender> {
        if let Err(detail) = self.transport().check() {
            return Err(HostError::Unreachable {
                host: self.name().to_string(),
                detail,
            });
        }
        let mut cmd = self
            .transport()
            .command(&format!("exec cat >> {}", quote(path)));
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| HostError::Io {
                host: self.name().to_string(),
                what: format!("appending to {path}: starting it"),
                source,
            })?;
        let stdin = child.stdin.take();
        Ok(Appender {
            host: self.name().to_string(),
            path: path.to_string(),
            child,
            stdin,
        })
    }
}

impl Appender {
    /// Appends `bytes` (all of them, or an error naming the host and the file).
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        let io = |source| HostError::Io {
            host: self.host.clone(),
            what: format!("appending to {}", self.path),
            source,
        };
        let stdin = self.stdin.as_mut().ok_or_else(|| {
            io(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the stream is closed",
            ))
        })?;
        stdin
            .write_all(bytes)
            .and_then(|()| stdin.flush())
            .map_err(io)
    }

    /// Closes the stream and waits (bounded) for everything written to reach the file.
    pub fn finish(mut self) -> Result<()> {
        self.close()
    }

    fn close(&mut self) -> Result<()> {
        drop(self.stdin.take());
        match wait_bounded(&mut self.child, END) {
            Some(s) if s.success() => Ok(()),
            end => {
                if end.is_none() {
                    kill_group(&mut self.child);
                }
                Err(HostError::Io {
                    host: self.host.clone(),
                    what: format!("appending to {}", self.path),
                    source: std::io::Error::other(match end {
                        Some(s) => format!("the stream ended with {s}"),
                        None => format!("the stream did not end within {END:?}"),
                    }),
                })
            }
        }
    }
}

impl Drop for Appender {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.close();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use crate::{Host, Remote, Settings};

    #[test]
    fn bytes_written_here_are_appended_to_the_hosts_file() {
        let dir = tempfile::tempdir().unwrap();
        let host = Host::local("here").with_dir(dir.path().display().to_string());
        let r = Remote::connect(
            &host,
            std::sync::Arc::new(Settings::default()),
            dir.path(),
            0,
        )
        .unwrap();
        let path = dir.path().join("rows.jsonl");
        std::fs::write(&path, "first\n").unwrap();
        let mut a = r.append_to(&path.display().to_string()).unwrap();
        a.append(b"second\n").unwrap();
        a.append(b"third\n").unwrap();
        a.finish().unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "first\nsecond\nthird\n"
        );
    }
}
