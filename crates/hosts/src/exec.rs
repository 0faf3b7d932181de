//! Running one script on a host with a time limit: its output captured (or streamed to a
//! file), its input from nothing or a file, and its end bounded twice — by `timeout` on the
//! host (so nothing outlives its limit there) and by a kill of the local process group a
//! little later (so a lost connection cannot hold the caller).

use std::fs::File;
use std::io::Read;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use crate::error::{HostError, Result};
use crate::shell::{kill_group, wait_bounded};
use crate::transport::Transport;

pub use crate::shell::{quote, quote_all};

/// How much longer than the host-side limit the local one is.
const LOCAL_MARGIN: Duration = Duration::from_secs(2);
/// How much of stderr an error quotes.
const STDERR_TAIL: usize = 600;

/// A script's input.
pub(crate) enum Input {
    Null,
    File(File),
}

/// Where a script's standard output goes.
pub(crate) enum Output {
    Capture,
    File(File),
}

/// Runs `script` on `host` through `transport`, at most `limit`; returns its stdout
/// (empty when it went to a file).
pub(crate) fn run(
    host: &str,
    transport: &dyn Transport,
    what: &str,
    script: &str,
    limit: Duration,
    input: Input,
    output: Output,
) -> Result<Vec<u8>> {
    if let Err(detail) = transport.check() {
        return Err(HostError::Unreachable {
            host: host.to_string(),
            detail,
        });
    }
    let secs = limit.as_secs_f64().max(0.1);
    let bounded = format!("exec timeout -k 1 {secs:.1} sh -c {}", quote(script));
    let mut cmd = transport.command(&bounded);
    cmd.stdin(match input {
        Input::Null => Stdio::null(),
        Input::File(f) => Stdio::from(f),
    });
    let capture = matches!(output, Output::Capture);
    cmd.stdout(match output {
        Output::Capture => Stdio::piped(),
        Output::File(f) => Stdio::from(f),
    });
    cmd.stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| HostError::Io {
        host: host.to_string(),
        what: format!("{what}: starting it"),
        source,
    })?;
    let (out_rx, err_rx) = (
        child.stdout.take().map(drain),
        child.stderr.take().map(drain),
    );
    let Some(status) = wait_bounded(&mut child, limit + LOCAL_MARGIN) else {
        kill_group(&mut child);
        // A host that stopped answering is lost, not slow.
        if let Err(detail) = transport.check() {
            return Err(HostError::Unreachable {
                host: host.to_string(),
                detail,
            });
        }
        return Err(HostError::Timeout {
            host: host.to_string(),
            what: what.to_string(),
            after: limit,
        });
    };
    let collect = |rx: Option<mpsc::Receiver<Vec<u8>>>| {
        rx.and_then(|rx| rx.recv_timeout(LOCAL_MARGIN).ok())
            .unwrap_or_default()
    };
    let stdout = collect(out_rx);
    let stderr = String::from_utf8_lossy(&collect(err_rx)).trim().to_string();
    let stderr = tail(&stderr, STDERR_TAIL);
    if status.success() {
        return Ok(if capture { stdout } else { Vec::new() });
    }
    if transport.unreachable(status.code()) {
        let detail = match transport.check() {
            Err(lost) => lost,
            Ok(()) if stderr.is_empty() => "ssh failed (255)".into(),
            Ok(()) => stderr,
        };
        return Err(HostError::Unreachable {
            host: host.to_string(),
            detail,
        });
    }
    // `timeout` on the host: 124 when it stopped the script, 137 when it had to kill it.
    if matches!(status.code(), Some(124 | 137)) {
        return Err(HostError::Timeout {
            host: host.to_string(),
            what: what.to_string(),
            after: limit,
        });
    }
    Err(HostError::Failed {
        host: host.to_string(),
        what: what.to_string(),
        status: status.to_string(),
        stderr,
    })
}

/// Reads a pipe to its end on a thread of its own; the bytes arrive on the channel.
fn drain<R: Read + Send + 'static>(mut r: R) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

/// The last `n` bytes of `s` (on a character boundary).
fn tail(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut start = s.len() - n;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &s[start..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn quoting_survives_sh() {
        for word in ["plain", "", "a b", "it's", "$HOME", "x;y", "\"q\"", "a\nb"] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", quote(word)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), word);
        }
        assert_eq!(quote_all(&["a", "b c"]), "a 'b c'");
    }

    #[test]
    fn a_local_script_runs_fails_and_times_out() {
        let local = crate::transport::Local;
        let out = run(
            "l",
            &local,
            "echo",
            "echo hi",
            Duration::from_secs(5),
            Input::Null,
            Output::Capture,
        );
        assert_eq!(out.unwrap(), b"hi\n");
        let e = run(
            "l",
            &local,
            "false",
            "echo oops >&2; exit 3",
            Duration::from_secs(5),
            Input::Null,
            Output::Capture,
        )
        .unwrap_err();
        assert!(e.to_string().contains("exit status: 3: oops"), "{e}");
        let t0 = Instant::now();
        let e = run(
            "l",
            &local,
            "sleep",
            "sleep 30",
            Duration::from_millis(300),
            Input::Null,
            Output::Capture,
        )
        .unwrap_err();
        assert!(matches!(e, HostError::Timeout { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
}
