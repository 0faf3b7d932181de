//! Small helpers for the shell and its children, below both the transports and the script
//! runner: quoting words for `sh`, and waiting for (or killing) a started child.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// `s` as one word of `sh`: unchanged when it is plain, else single-quoted.
pub fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Words quoted and joined with spaces: a command line for `sh`.
pub fn quote_all<S: AsRef<str>>(words: &[S]) -> String {
    words
        .iter()
        .map(|w| quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Waits for `child` at most `limit` (polling with a back-off up to 20 ms); `None` if it
/// is still running then.
pub(crate) fn wait_bounded(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Kills `child`'s process group (it was started as its leader) and reaps it.
pub(crate) fn kill_group(child: &mut Child) {
    // SAFETY: kill has no memory preconditions; the group is our child's own.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.kill();
    let _ = child.wait();
}
