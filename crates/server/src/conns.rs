//! The open client connections, for `stats conns`: each connection registers its socket
//! when it opens and leaves when its state is dropped (a `watch` connection when its
//! watcher goes). `stats conns` lists them by socket, as memcached lists its connections by
//! descriptor: `<fd>:addr`, `<fd>:listen_addr`, `<fd>:state`, `<fd>:secs_since_last_cmd`,
//! with the listening socket (`addr`, `state conn_listening`, `secs_since_last_cmd`) in its
//! place among them.
//!
//! A connection's entry is written by the thread that serves it (its last command's time
//! from the coarse monotonic clock, a relaxed store per request) and read under the
//! registry's lock only by `stats conns`; the registry's lock is taken when a connection
//! opens or closes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

/// The registry of open connections.
#[derive(Default)]
pub struct Conns {
    /// By descriptor, then registration (a watcher keeps its connection's descriptor
    /// number, which a later connection may get too).
    open: Mutex<BTreeMap<(RawFd, u64), Arc<Entry>>>,
    next_id: AtomicU64,
}

/// One open connection.
struct Entry {
    /// Tells this connection from a later one on the same descriptor.
    id: u64,
    /// [`seconds`] at its last command (at its opening, before any).
    last_cmd: AtomicU64,
    /// It is a `watch` log stream.
    watching: AtomicBool,
    /// A watcher's addresses (peer, local), read from its own socket when it was handed
    /// over: its connection's descriptor is no longer its socket.
    handed_over: OnceLock<(String, String)>,
}

/// A connection's place in the registry: dropping it takes the connection out.
pub struct Registration {
    conns: Arc<Conns>,
    fd: RawFd,
    entry: Arc<Entry>,
}

impl Conns {
    /// Registers the connection on socket `fd`, opened now.
    pub fn register(self: &Arc<Self>, fd: RawFd) -> Registration {
        let entry = Arc::new(Entry {
            id: self.next_id.fetch_add(1, Relaxed),
            last_cmd: AtomicU64::new(seconds()),
            watching: AtomicBool::new(false),
            handed_over: OnceLock::new(),
        });
        self.open.lock().insert((fd, entry.id), entry.clone());
        Registration {
            conns: self.clone(),
            fd,
            entry,
        }
    }

    /// `stats conns` lines (name, value): every connection by socket, and the listening
    /// socket `listener` (if any, with the seconds since the server started) in its
    /// place; `caller` is the socket of the connection that asks.
    pub fn lines(&self, listener: Option<(RawFd, u64)>, caller: RawFd) -> Vec<(String, String)> {
        let now = seconds();
        let open = self.open.lock();
        let mut out = Vec::with_capacity(4 * (open.len() + 1));
        let mut listed = |fd: RawFd, lines: &[(&str, String)]| {
            for (name, value) in lines {
                out.push((format!("{fd}:{name}"), value.clone()));
            }
        };
        let mut listener = listener.filter(|(l, _)| !open.keys().any(|(fd, _)| fd == l));
        for (&(fd, _), entry) in open.iter() {
            if let Some((l, secs)) = listener.filter(|&(l, _)| l < fd) {
                listed(l, &listening(l, secs));
                listener = None;
            }
            let (peer, local) = match entry.handed_over.get() {
                Some(addrs) => addrs.clone(),
                None => (address(fd, true), address(fd, false)),
            };
            let state = if entry.watching.load(Relaxed) {
                "conn_watch"
            } else if fd == caller {
                "conn_parse_cmd"
            } else {
                "conn_read"
            };
            listed(
                fd,
                &[
                    ("addr", peer),
                    ("listen_addr", local),
                    ("state", state.to_string()),
                    (
                        "secs_since_last_cmd",
                        now.saturating_sub(entry.last_cmd.load(Relaxed)).to_string(),
                    ),
                ],
            );
        }
        if let Some((l, secs)) = listener {
            listed(l, &listening(l, secs));
        }
        out
    }
}

/// The listening socket's lines, as memcached's: its own address, no `listen_addr`.
fn listening(fd: RawFd, secs: u64) -> [(&'static str, String); 3] {
    [
        ("addr", address(fd, false)),
        ("state", "conn_listening".to_string()),
        ("secs_since_last_cmd", secs.to_string()),
    ]
}

/// The peer's (`peer`) or the local (`!peer`) address of socket `fd`, as memcached writes
/// it: `tcp:1.2.3.4:5`, `tcp6:[::1]:5`, `unix:/path` (a unix socket's client is unnamed:
/// `unix:`). A descriptor closed meanwhile, or reused by something else than a socket, is
/// `<closed>`.
fn address(fd: RawFd, peer: bool) -> String {
    // SAFETY: a zeroed sockaddr_storage is a valid value; getpeername and getsockname
    // write at most `len` bytes into it, and fail harmlessly on any descriptor.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = std::ptr::addr_of_mut!(ss).cast::<libc::sockaddr>();
    // SAFETY: as above.
    let rc = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    if rc != 0 {
        return "<closed>".to_string();
    }
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a: libc::sockaddr_in = unsafe { std::ptr::read(std::ptr::addr_of!(ss).cast()) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            format!("tcp:{}", SocketAddr::from((ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a: libc::sockaddr_in6 = unsafe { std::ptr::read(std::ptr::addr_of!(ss).cast()) };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            format!("tcp6:{}", SocketAddr::from((ip, u16::from_be(a.sin6_port))))
        }
        libc::AF_UNIX => {
            // SAFETY: the family says the storage holds a sockaddr_un.
            let a: libc::sockaddr_un = unsafe { std::ptr::read(std::ptr::addr_of!(ss).cast()) };
            // The path's bytes: what `len` covers past the family, up to a NUL.
            let n = (len as usize)
                .saturating_sub(std::mem::size_of::<libc::sa_family_t>())
                .min(a.sun_path.len());
            let path: Vec<u8> = a.sun_path[..n]
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            format!("unix:{}", String::from_utf8_lossy(&path))
        }
        _ => "<closed>".to_string(),
    }
}

/// Seconds of the coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`: read from the vDSO
/// without a system call, at the kernel tick's resolution; a request stamps its connection
/// with it).
fn seconds() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0)
}

impl Registration {
    /// The connection's command, now.
    #[inline]
    pub fn command(&self) {
        self.entry.last_cmd.store(seconds(), Relaxed);
    }

    /// The connection has become a `watch` log stream.
    pub fn watching(&self) {
        self.entry.watching.store(true, Relaxed);
    }

    /// The connection goes on as a watcher on socket `fd`, a duplicate of its own: it
    /// stays listed under its descriptor, as memcached lists a watcher, with the
    /// addresses of `fd`.
    pub fn handed_over(&self, fd: RawFd) {
        let _ = self
            .entry
            .handed_over
            .set((address(fd, true), address(fd, false)));
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.conns.open.lock().remove(&(self.fd, self.entry.id));
    }
}
