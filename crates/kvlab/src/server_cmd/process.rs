//! The server as a Unix process, as memcached runs: detached as a daemon (`-d`), its pid
//! in a file (`-P`), its memory locked (`-k`), core dumps allowed (`-r`).

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The daemon's side of `-d`: a pipe to the waiting parent, told once the server listens.
pub struct Daemon {
    ready: std::fs::File,
}

/// Forks: the parent waits until the child says it listens (exit 0) or the child ends
/// without saying so (exit 1: its error went to the shared stderr); the child, in a new
/// session, returns. Call before any thread starts.
pub fn daemonize() -> anyhow::Result<Daemon> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two new descriptors on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error()).context("-d: pipe");
    }
    // SAFETY: the descriptors are new and owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process has one thread here (the caller's promise), so the child may go
    // on running Rust code.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()).context("-d: fork"),
        0 => {
            drop(r);
            // SAFETY: a plain system call; the child is not a process group leader.
            unsafe { libc::setsid() };
            Ok(Daemon { ready: w.into() })
        }
        _ => {
            drop(w);
            let mut said = [0u8; 1];
            let mut r = std::fs::File::from(r);
            let code = match r.read(&mut said) {
                Ok(1) => 0,
                _ => 1,
            };
            std::process::exit(code);
        }
    }
}

impl Daemon {
    /// The server listens: the parent may return. The standard streams go to /dev/null
    /// unless `verbose` (as memcached keeps them under -v).
    pub fn ready(mut self, verbose: bool) {
        if !verbose {
            if let Ok(null) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                use std::os::fd::AsRawFd;
                for fd in 0..3 {
                    // SAFETY: dup2 onto the standard descriptors, which stay open.
                    unsafe { libc::dup2(null.as_raw_fd(), fd) };
                }
            }
        }
        let _ = self.ready.write_all(b"1");
    }
}

/// `-P`: the pid file, removed when dropped (at shutdown).
pub struct PidFile(PathBuf);

impl PidFile {
    /// Writes this process's pid to `path`; a file that cannot be written is a warning,
    /// as memcached warns and runs on.
    pub fn write(path: &Path) -> Option<PidFile> {
        match std::fs::write(path, format!("{}\n", std::process::id())) {
            Ok(()) => Some(PidFile(path.to_path_buf())),
            Err(e) => {
                eprintln!(
                    "kvlab server: could not open the pid file {} for writing: {e}",
                    path.display()
                );
                None
            }
        }
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// memcached's port file (`MEMCACHED_PORT_FILENAME`): the TCP port the server listens on,
/// as `TCP INET: <port>` (`TCP INET6` on IPv6), written to a temporary file beside it and
/// renamed, so a reader that sees the file sees all of it. Left in place at exit, as
/// memcached leaves it; a file that cannot be written is a warning.
pub fn write_port_file(path: &Path, addr: std::net::SocketAddr) {
    let family = if addr.is_ipv4() { "INET" } else { "INET6" };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".lck");
    let tmp = PathBuf::from(tmp);
    let written = std::fs::write(&tmp, format!("TCP {family}: {}\n", addr.port()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        eprintln!(
            "kvlab server: could not write the port file {}: {e}",
            path.display()
        );
    }
}

/// `-k` and `-r`: lock memory, raise the core file limit; what fails is a warning, as in
/// memcached.
pub fn limits(lock_memory: bool, core_dumps: bool) {
    if lock_memory {
        // SAFETY: mlockall only changes how the process's pages are kept.
        if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
            eprintln!(
                "kvlab server: warning: -k invalid, mlockall() failed: {} (ulimit -l)",
                std::io::Error::last_os_error()
            );
        }
    }
    if core_dumps {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit on a valid rlimit struct.
        let ok = unsafe {
            libc::getrlimit(libc::RLIMIT_CORE, &mut lim) == 0 && {
                lim.rlim_cur = lim.rlim_max;
                libc::setrlimit(libc::RLIMIT_CORE, &lim) == 0
            }
        };
        if !ok {
            eprintln!("kvlab server: failed to ensure corefile creation");
        }
    }
}
