//! The open client connections, for `stats conns`: each connection registers its socket
//! when it opens and leaves when its state is dropped (a `watch` connection when its
//! watcher goes). `stats conns` lists them by socket, as memcached lists its connections by
//! descriptor: `<fd>:addr`, `<fd>:listen_addr`, `<fd>:state`, `<fd>:secs_since_last_cmd`,
//! with the listening socket (`addr`, `state conn_listening`, `secs_since_last_cmd`) in its
//! place among them.
//!
//! As memcached keeps a table of connections indexed by descriptor, a connection's entry is
//! a slot of a table indexed by its descriptor (24 bytes, in chunks of [`CHUNK`] made when
//! a descriptor of theirs is first used), so an open connection costs the registry no
//! allocation of its own. The slot is written by the thread that serves the connection (its
//! last command's time from the coarse monotonic clock, a relaxed store per request) and
//! read only by `stats conns`. What a slot cannot hold goes to a small map under a lock: a
//! watcher handed over to the watch thread (it stays listed under its old descriptor,
//! which a later connection may get too), a descriptor whose slot its closed predecessor
//! has not yet left, or one past the table.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

/// Slots per chunk of the table.
const CHUNK: usize = 512;

/// The registry of open connections.
pub struct Conns {
    /// Slots by descriptor, in chunks made on first use; as many chunks as cover the
    /// open-file hard limit when the registry was made.
    table: Box<[OnceLock<Arc<[Slot; CHUNK]>>]>,
    /// Entries no slot holds, by descriptor, then registration.
    others: Mutex<BTreeMap<(RawFd, u64), Arc<Entry>>>,
    /// Registration ids (from 1: a slot's 0 is "free").
    next_id: AtomicU64,
}

/// One descriptor's slot.
#[derive(Default)]
struct Slot {
    /// The registration in it (0: free).
    id: AtomicU64,
    /// [`seconds`] at its last command (at its opening, before any).
    last_cmd: AtomicU64,
    /// It is a `watch` log stream.
    watching: AtomicBool,
}

/// A connection listed outside the table.
struct Entry {
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
    id: u64,
    place: Place,
}

/// Where a registration is listed.
enum Place {
    /// In slot `.1` of a chunk of the table (held, so a request stamps it without a
    /// lookup).
    Slot(Arc<[Slot; CHUNK]>, usize),
    /// In the map.
    Entry(Arc<Entry>),
}

impl Default for Conns {
    fn default() -> Self {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a valid rlimit struct.
        let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            lim.rlim_max
        } else {
            1 << 20
        };
        // At most 2^24 descriptors in slots (32,768 chunk pointers); past it, the map.
        let descriptors = usize::try_from(max)
            .unwrap_or(usize::MAX)
            .clamp(CHUNK, 1 << 24);
        Conns {
            table: (0..descriptors.div_ceil(CHUNK))
                .map(|_| OnceLock::new())
                .collect(),
            others: Mutex::default(),
            next_id: AtomicU64::new(1),
        }
    }
}

impl Conns {
    /// Registers the connection on socket `fd`, opened now.
    pub fn register(self: &Arc<Self>, fd: RawFd) -> Registration {
        let id = self.next_id.fetch_add(1, Relaxed);
        let now = seconds();
        let slot = usize::try_from(fd).ok().and_then(|i| {
            let chunk = self.table.get(i / CHUNK)?;
            let chunk = chunk.get_or_init(|| Arc::new(std::array::from_fn(|_| Slot::default())));
            let slot = &chunk[i % CHUNK];
            // Taken only if free: a closed predecessor may not have left it yet.
            slot.id.compare_exchange(0, id, Relaxed, Relaxed).ok()?;
            slot.last_cmd.store(now, Relaxed);
            slot.watching.store(false, Relaxed);
            Some(Place::Slot(chunk.clone(), i % CHUNK))
        });
        Registration {
            conns: self.clone(),
            fd,
            id,
            place: slot.unwrap_or_else(|| Place::Entry(self.enter(fd, id, now))),
        }
    }

    /// An entry in the map for registration `id` on `fd`.
    fn enter(&self, fd: RawFd, id: u64, last_cmd: u64) -> Arc<Entry> {
        let entry = Arc::new(Entry {
            last_cmd: AtomicU64::new(last_cmd),
            watching: AtomicBool::new(false),
            handed_over: OnceLock::new(),
        });
        self.others.lock().insert((fd, id), entry.clone());
        entry
    }

    /// `stats conns` lines (name, value): every connection by socket, and the listening
    /// socket `listener` (if any, with the seconds since the server started) in its
    /// place; `caller` is the socket of the connection that asks.
    pub fn lines(&self, listener: Option<(RawFd, u64)>, caller: RawFd) -> Vec<(String, String)> {
        let now = seconds();
        let mut open: Vec<Listed> = Vec::new();
        for (c, chunk) in self.table.iter().enumerate() {
            let Some(chunk) = chunk.get() else { continue };
            for (i, slot) in chunk.iter().enumerate() {
                let id = slot.id.load(Relaxed);
                if id != 0 {
                    let fd = RawFd::try_from(c * CHUNK + i).unwrap_or(RawFd::MAX);
                    let (last, watching) =
                        (slot.last_cmd.load(Relaxed), slot.watching.load(Relaxed));
                    open.push((fd, id, last, watching, None));
                }
            }
        }
        for (&(fd, id), e) in self.others.lock().iter() {
            let (last, watching) = (e.last_cmd.load(Relaxed), e.watching.load(Relaxed));
            open.push((fd, id, last, watching, e.handed_over.get().cloned()));
        }
        open.sort_unstable_by_key(|&(fd, id, ..)| (fd, id));
        let mut out = Vec::with_capacity(4 * (open.len() + 1));
        let mut listed = |fd: RawFd, lines: &[(&str, String)]| {
            for (name, value) in lines {
                out.push((format!("{fd}:{name}"), value.clone()));
            }
        };
        let mut listener = listener.filter(|(l, _)| !open.iter().any(|o| o.0 == *l));
        for (fd, _, last_cmd, watching, handed_over) in open {
            if let Some((l, secs)) = listener.filter(|&(l, _)| l < fd) {
                listed(l, &listening(l, secs));
                listener = None;
            }
            let (peer, local) =
                handed_over.unwrap_or_else(|| (address(fd, true), address(fd, false)));
            let state = if watching {
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
                        now.saturating_sub(last_cmd).to_string(),
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

/// A connection as `stats conns` lists it: descriptor, registration, last command,
/// watching, the addresses of a watcher handed over.
type Listed = (RawFd, u64, u64, bool, Option<(String, String)>);

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
        let now = seconds();
        match &self.place {
            Place::Slot(chunk, i) => chunk[*i].last_cmd.store(now, Relaxed),
            Place::Entry(e) => e.last_cmd.store(now, Relaxed),
        }
    }

    /// The connection has become a `watch` log stream.
    pub fn watching(&self) {
        match &self.place {
            Place::Slot(chunk, i) => chunk[*i].watching.store(true, Relaxed),
            Place::Entry(e) => e.watching.store(true, Relaxed),
        }
    }

    /// The connection goes on as a watcher on socket `fd`, a duplicate of its own: it
    /// stays listed under its descriptor, as memcached lists a watcher, with the
    /// addresses of `fd`. Its slot is left for the next connection on its descriptor.
    pub fn handed_over(&mut self, fd: RawFd) {
        if let Place::Slot(chunk, i) = &self.place {
            let slot = &chunk[*i];
            let entry = self
                .conns
                .enter(self.fd, self.id, slot.last_cmd.load(Relaxed));
            entry.watching.store(slot.watching.load(Relaxed), Relaxed);
            slot.id.store(0, Relaxed);
            self.place = Place::Entry(entry);
        }
        if let Place::Entry(e) = &self.place {
            let _ = e.handed_over.set((address(fd, true), address(fd, false)));
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        match &self.place {
            Place::Slot(chunk, i) => chunk[*i].id.store(0, Relaxed),
            Place::Entry(_) => {
                self.conns.others.lock().remove(&(self.fd, self.id));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The descriptors listed, in order, with their state.
    fn listed(conns: &Conns, caller: RawFd) -> Vec<String> {
        conns
            .lines(None, caller)
            .into_iter()
            .filter(|(name, _)| name.ends_with(":state"))
            .map(|(name, state)| format!("{} {state}", name.trim_end_matches(":state")))
            .collect()
    }

    #[test]
    fn slots_by_descriptor_and_the_map_for_what_they_cannot_hold() {
        let conns = Arc::new(Conns::default());
        let a = conns.register(700);
        let b = conns.register(5);
        assert!(matches!(
            (&a.place, &b.place),
            (Place::Slot(..), Place::Slot(..))
        ));
        // A descriptor reused before its closed predecessor left the slot: the map.
        let c = conns.register(700);
        assert!(matches!(c.place, Place::Entry(_)));
        assert_eq!(
            listed(&conns, 5),
            ["5 conn_parse_cmd", "700 conn_read", "700 conn_read"]
        );
        // The predecessor leaving does not take the later one out.
        drop(a);
        assert_eq!(listed(&conns, 5), ["5 conn_parse_cmd", "700 conn_read"]);
        drop(c);
        assert_eq!(listed(&conns, 5), ["5 conn_parse_cmd"]);
        // A watcher handed over stays listed under its descriptor, which is free again.
        let mut w = conns.register(9);
        w.command();
        w.handed_over(9);
        w.watching();
        let d = conns.register(9);
        assert!(matches!(d.place, Place::Slot(..)), "the slot is free again");
        assert_eq!(
            listed(&conns, 5),
            ["5 conn_parse_cmd", "9 conn_watch", "9 conn_read"]
        );
        drop(w);
        drop(d);
        drop(b);
        assert!(listed(&conns, 5).is_empty());
        assert!(conns.others.lock().is_empty());
    }

    #[test]
    fn a_descriptor_past_the_table_is_listed_from_the_map() {
        let conns = Arc::new(Conns::default());
        let fd = RawFd::try_from(conns.table.len() * CHUNK).unwrap_or(RawFd::MAX);
        let r = conns.register(fd);
        assert!(matches!(r.place, Place::Entry(_)));
        assert_eq!(listed(&conns, -1), [format!("{fd} conn_read")]);
    }
}
