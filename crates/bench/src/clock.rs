//! Clocks and a precise timer for the event loop.
//!
//! The loop keeps time as `CLOCK_MONOTONIC` nanoseconds. Waits end on a `timerfd` armed at an
//! absolute deadline: `epoll_wait`'s own timeout has millisecond resolution, which would
//! delay open-loop sends by up to a millisecond and show up as latency.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

fn now(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock ids are constants the kernel knows.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Monotonic time, ns.
#[inline]
pub fn mono_ns() -> u64 {
    now(libc::CLOCK_MONOTONIC)
}

/// Wall-clock time, ns since the Unix epoch.
pub fn wall_ns() -> u64 {
    now(libc::CLOCK_REALTIME)
}

/// CPU time used by the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    now(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// A monotonic timerfd armed at absolute deadlines.
pub struct Timer {
    fd: OwnedFd,
    armed: u64,
}

impl Timer {
    /// Creates the timer and registers it for readability under `token`.
    pub fn new(registry: &Registry, token: Token) -> io::Result<Self> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        registry.register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
        Ok(Timer { fd, armed: 0 })
    }

    /// Makes sure the timer fires no later than monotonic `deadline_ns`. An armed, pending
    /// expiry at or before it is kept (an early wake-up is harmless: the loop just finds
    /// nothing due), which saves the `timerfd_settime` call — the loop's most expensive
    /// syscall. Edge-triggered epoll reports every expiry, so the expiry count is never read.
    pub fn arm(&mut self, deadline_ns: u64, now_ns: u64) -> io::Result<()> {
        if self.armed > now_ns && self.armed <= deadline_ns {
            return Ok(());
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: valid fd and itimerspec; old value not requested.
        let r = unsafe {
            libc::timerfd_settime(
                self.fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        self.armed = deadline_ns;
        Ok(())
    }

    /// Forgets the armed deadline after it fired.
    pub fn fired(&mut self) {
        self.armed = 0;
    }
}
