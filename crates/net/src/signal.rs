//! The `signal` I/O driver: one event-loop thread woken by signal-driven I/O.
//!
//! ```text
//!  clients ──► kernel: data/space on fd ──► queued real-time signal (si_fd = fd)
//!                                                   │  F_SETOWN_EX → this thread only
//!              ┌────────────────────────────────────▼─────┐
//!              │ event loop (1 thread): read(signalfd) →  │  listener fd → accept
//!              │   pump the connection named by si_fd     │  wake pipe   → shutdown / completions
//!              └──────────────────────────────────────────┘
//! ```
//!
//! Every socket is non-blocking with `O_ASYNC`, owned by the loop thread (`F_SETOWN_EX` with
//! `F_OWNER_TID`) and set to raise `SIGRTMIN+3` (`F_SETSIG`), so each readiness change queues a
//! real-time signal whose `si_fd` names the socket. The loop blocks those signals and reads
//! them from a `signalfd`, many at a time. Like edge-triggered epoll, a signal only says that
//! something changed, so a connection is pumped until its input is drained. If the kernel's
//! real-time signal queue overflows it raises a plain `SIGIO` without an fd; the loop then
//! pumps every connection and the listener, so nothing is lost. Other threads (shutdown, the
//! `-t` helpers of [`crate::pool`] that run deferred work) wake the loop by writing to a pipe
//! that is itself signal-driven; the loop never blocks on deferred work.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use kvlab_protocol::Limits;

use crate::driver::{self, Pump};
use crate::pool::{Done, HelperPool};
use crate::service::{App, Service, WorkOf};
use crate::session::Session;
use crate::DriverConfig;

/// The real-time signal that carries readiness (SIGRTMIN+3 leaves the low ones to libraries).
fn io_signal() -> i32 {
    libc::SIGRTMIN() + 3
}

/// A running signal-driven driver.
pub struct SignalDriver {
    thread: Option<JoinHandle<()>>,
    wake: Arc<OwnedFd>,
}

impl SignalDriver {
    /// Starts the loop on `listener`, with `config.threads` helper threads.
    pub fn start<A: App>(
        listener: TcpListener,
        app: Arc<A>,
        config: DriverConfig,
    ) -> io::Result<SignalDriver> {
        listener.set_nonblocking(true)?;
        let (wake_r, wake_w) = pipe()?;
        let wake_w = Arc::new(wake_w);
        let service = app.service(0);
        let (done_tx, done_rx) = mpsc::channel();
        let waker = wake_w.clone();
        let wake_fn: Arc<dyn Fn() + Send + Sync> = Arc::new(move || wake(&waker));
        let workers = (0..config.threads.max(1)).map(|i| app.helper(i)).collect();
        let pool = HelperPool::start("kvlab-helper", workers, done_tx, wake_fn)?;
        let (limits, idle) = (config.limits, config.idle_timeout);
        let buffers = config.buffers.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kvlab-signal".into())
            .spawn(move || {
                match Loop::new(listener, wake_r, service, app, limits, pool, done_rx) {
                    Ok(mut l) => {
                        l.idle = driver::Idle::new(idle);
                        l.buffers = buffers;
                        l.idle_timeout = idle.is_some();
                        let _ = ready_tx.send(Ok(()));
                        l.run();
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| io::Error::other("signal loop died during setup"))??;
        Ok(SignalDriver {
            thread: Some(thread),
            wake: wake_w,
        })
    }

    /// Wakes the loop so it notices the stop, and waits for it.
    pub fn stop(mut self) {
        wake(&self.wake);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Wakes the loop by writing a byte to its signal-driven pipe.
fn wake(fd: &OwnedFd) {
    // SAFETY: writing one byte from a valid buffer to a valid fd.
    unsafe { libc::write(fd.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) })?;
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

// Linux fcntl ABI not exported by the libc crate (values from <asm-generic/fcntl.h>).
const F_SETSIG: libc::c_int = 10;
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;

#[repr(C)]
struct FOwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// Makes `fd` raise the I/O signal at thread `tid` on every readiness change.
fn make_signal_driven(fd: RawFd, tid: libc::pid_t) -> io::Result<()> {
    let owner = FOwnerEx {
        kind: F_OWNER_TID,
        pid: tid,
    };
    // SAFETY: fcntl on a valid fd with the argument types the commands expect.
    unsafe {
        cvt(libc::fcntl(fd, F_SETOWN_EX, &owner as *const FOwnerEx))?;
        cvt(libc::fcntl(fd, F_SETSIG, io_signal()))?;
        let flags = cvt(libc::fcntl(fd, libc::F_GETFL))?;
        cvt(libc::fcntl(
            fd,
            libc::F_SETFL,
            flags | libc::O_ASYNC | libc::O_NONBLOCK,
        ))?;
    }
    Ok(())
}

struct Conn<A: App> {
    stream: TcpStream,
    session: Session<A::Service>,
    generation: u64,
    /// The helper running this connection's work while any is in flight.
    helper: Option<usize>,
    /// When it was last served (with an idle timeout; see [`driver::Idle`]).
    last_active: std::time::Instant,
    /// What the socket may hold unread (see [`driver::pump`]).
    input: driver::Input,
}

struct Loop<A: App> {
    listener: TcpListener,
    wake_r: OwnedFd,
    signalfd: OwnedFd,
    tid: libc::pid_t,
    service: A::Service,
    app: Arc<A>,
    limits: Limits,
    /// Connections indexed by fd (fds are small and dense).
    conns: Vec<Option<Conn<A>>>,
    /// Connections with completions to act on (reused).
    touched: Vec<usize>,
    generation: u64,
    pool: HelperPool<WorkOf<A>>,
    done: mpsc::Receiver<Done>,
    /// The clock of idle connections (buffers given back, the idle timeout).
    idle: driver::Idle,
    /// An idle timeout is set.
    idle_timeout: bool,
    /// Where sessions charge their buffers.
    buffers: Option<Arc<crate::BufferBudget>>,
}

impl<A: App> Loop<A> {
    /// Runs on the loop thread: blocks the signals here and routes them to a signalfd.
    fn new(
        listener: TcpListener,
        wake_r: OwnedFd,
        service: A::Service,
        app: Arc<A>,
        limits: Limits,
        pool: HelperPool<WorkOf<A>>,
        done: mpsc::Receiver<Done>,
    ) -> io::Result<Loop<A>> {
        // SAFETY: plain libc calls on a local sigset and this thread's mask.
        let signalfd = unsafe {
            let mut set = MaybeUninit::<libc::sigset_t>::uninit();
            cvt(libc::sigemptyset(set.as_mut_ptr()))?;
            let mut set = set.assume_init();
            cvt(libc::sigaddset(&mut set, io_signal()))?;
            cvt(libc::sigaddset(&mut set, libc::SIGIO))?;
            let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if r != 0 {
                return Err(io::Error::from_raw_os_error(r));
            }
            OwnedFd::from_raw_fd(cvt(libc::signalfd(-1, &set, libc::SFD_CLOEXEC))?)
        };
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        make_signal_driven(listener.as_raw_fd(), tid)?;
        make_signal_driven(wake_r.as_raw_fd(), tid)?;
        Ok(Loop {
            listener,
            wake_r,
            signalfd,
            tid,
            service,
            app,
            limits,
            conns: Vec::new(),
            touched: Vec::new(),
            generation: 0,
            pool,
            done,
            idle: driver::Idle::new(None),
            idle_timeout: false,
            buffers: None,
        })
    }

    fn run(&mut self) {
        // Anything that arrived before O_ASYNC was set raised no signal: look once.
        self.accept();
        let mut infos: [MaybeUninit<libc::signalfd_siginfo>; 64] = [MaybeUninit::uninit(); 64];
        while !self.app.stopping() {
            if self.idle_timeout {
                // With an idle timeout, wait at most a second for signals, then look at
                // idle connections (without one, the sweep after each round of signals
                // is enough to give idle buffers back: no extra system call per wake).
                let mut pfd = libc::pollfd {
                    fd: self.signalfd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ms = driver::Idle::EVERY.as_millis() as libc::c_int;
                // SAFETY: one valid pollfd for the call's duration.
                let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
                self.idle.tick();
                if ready <= 0 {
                    self.close_idle();
                    continue;
                }
            }
            let want = size_of::<libc::signalfd_siginfo>() * infos.len();
            // SAFETY: reading into a buffer of `want` bytes; the kernel writes whole records.
            let n =
                unsafe { libc::read(self.signalfd.as_raw_fd(), infos.as_mut_ptr().cast(), want) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(%e, "signalfd read failed");
                break;
            }
            self.idle.tick();
            let count = n as usize / size_of::<libc::signalfd_siginfo>();
            for info in &infos[..count] {
                // SAFETY: the kernel filled the first `count` records.
                let info = unsafe { info.assume_init_ref() };
                if info.ssi_signo == libc::SIGIO as u32 {
                    // The real-time queue overflowed: readiness of some fds is unknown.
                    self.accept();
                    self.pump_all();
                    continue;
                }
                let fd = info.ssi_fd;
                if fd == self.listener.as_raw_fd() {
                    self.accept();
                } else if fd == self.wake_r.as_raw_fd() {
                    self.drain_wake();
                } else {
                    self.serve(fd, true);
                }
            }
            self.close_idle();
        }
        for fd in 0..self.conns.len() {
            if let Some(conn) = self.conns[fd].as_mut() {
                driver::flush_on_close(&mut conn.stream, &conn.session);
            }
            self.drop_conn(fd as RawFd);
        }
    }

    fn drain_wake(&mut self) {
        let mut buf = [0u8; 64];
        // SAFETY: reading into a local buffer from a valid non-blocking fd.
        while unsafe { libc::read(self.wake_r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0
        {
        }
        // Finished work: complete the sessions, then let each one touched carry on once.
        let mut touched = std::mem::take(&mut self.touched);
        while let Ok(done) = self.done.try_recv() {
            let (idx, generation) = done.conn;
            let Some(conn) = self.conns.get_mut(idx).and_then(Option::as_mut) else {
                continue;
            };
            if conn.generation == generation {
                if let Some(buf) = conn.session.complete(done.slot, done.completion) {
                    self.service.recycle(buf);
                }
                if !conn.session.is_waiting() {
                    conn.helper = None;
                }
                if !touched.contains(&idx) {
                    touched.push(idx);
                }
            }
        }
        for &idx in &touched {
            self.serve(idx as RawFd, false);
        }
        touched.clear();
        self.touched = touched;
    }

    fn accept(&mut self) {
        loop {
            match driver::accept_fd(self.listener.as_raw_fd())
                .map(|(fd, peer)| (TcpStream::from(fd), peer))
            {
                Ok((mut stream, peer)) => {
                    if !driver::admit(&*self.app, &mut stream, peer) {
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let fd = stream.as_raw_fd();
                    if let Err(e) = make_signal_driven(fd, self.tid) {
                        tracing::warn!(%e, "cannot make connection signal-driven");
                        self.app.release();
                        continue;
                    }
                    let idx = fd as usize;
                    if self.conns.len() <= idx {
                        self.conns.resize_with(idx + 1, || None);
                    }
                    self.generation += 1;
                    self.conns[idx] = Some(Conn {
                        stream,
                        session: Session::with_budget(self.limits, self.buffers.as_ref()),
                        generation: self.generation,
                        helper: None,
                        last_active: self.idle.now(),
                        // Bytes and a FIN that came before O_ASYNC raised no signal.
                        input: driver::Input::ToEnd,
                    });
                    if let Some(conn) = self.conns[idx].as_mut() {
                        conn.session.opened(&mut self.service, fd, false);
                    }
                    self.serve(fd, false);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(%e, "accept failed");
                    return;
                }
            }
        }
    }

    /// Pumps the connection on `fd`; `signalled` when a signal said its socket changed
    /// (rather than deferred work completing).
    fn serve(&mut self, fd: RawFd, signalled: bool) {
        let Some(conn) = usize::try_from(fd)
            .ok()
            .and_then(|i| self.conns.get_mut(i))
            .and_then(Option::as_mut)
        else {
            // A signal queued before its connection closed.
            return;
        };
        conn.last_active = self.idle.now();
        if signalled {
            // A signal's band does not tell a FIN from data, but a FIN raises a signal of
            // its own (queued: real-time signals are not merged).
            conn.input = conn.input.on_event(false);
        }
        let pumped = driver::pump(
            &mut conn.stream,
            &mut conn.session,
            &mut self.service,
            false,
            &mut conn.input,
        );
        if pumped == Pump::Closed {
            self.drop_conn(fd);
            return;
        }
        while let Some((id, work)) = conn.session.take_work() {
            let helper = *conn.helper.get_or_insert_with(|| self.pool.pick());
            self.pool
                .submit(helper, (fd as usize, conn.generation), id, work);
        }
    }

    /// Once a second: connections idle a while give their buffers back; those idle past
    /// the idle timeout are closed.
    fn close_idle(&mut self) {
        if !self.idle.sweep_due() {
            return;
        }
        for fd in 0..self.conns.len() {
            let Some(c) = self.conns[fd].as_mut() else {
                continue;
            };
            if self.idle.expired(c.last_active, &c.session) {
                self.app.idle_kick();
                self.drop_conn(fd as RawFd);
            } else if self.idle.stale(c.last_active) {
                c.session.shrink();
            }
        }
    }

    fn pump_all(&mut self) {
        for fd in 0..self.conns.len() {
            if let Some(conn) = self.conns[fd].as_mut() {
                // A lost signal may have been a FIN's.
                conn.input = conn.input.on_event(true);
                self.serve(fd as RawFd, false);
            }
        }
    }

    fn drop_conn(&mut self, fd: RawFd) {
        if let Some(conn) = usize::try_from(fd)
            .ok()
            .and_then(|i| self.conns.get_mut(i))
            .and_then(Option::take)
        {
            drop(conn);
            self.app.release();
        }
    }
}
