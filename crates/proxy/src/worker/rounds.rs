//! A worker's rounds: on a helper thread (`--io epoll`) a batch runs to its end (started,
//! then the backends are `poll`ed until every request is decided); on an event loop
//! (`--io reactor`) a round's requests are started together and each backend's readiness,
//! the clock's ticks and the round's end move them on. Works a cluster node redirected go
//! again from here, and a reload is taken up once nothing is in flight.

use std::io;
use std::time::{Duration, Instant};

use kvlab_net::Completion;

use super::{Class, Fail, Job, ProxyWork, Worker, REDO_PAUSE, REDO_PAUSE_MAX};

impl Worker {
    /// Runs one batch to its end (a helper thread): every work gets its completion through
    /// `done`, with its index in `works`, which it leaves empty.
    pub(crate) fn batch(
        &mut self,
        works: &mut Vec<ProxyWork>,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let mut tagged = std::mem::take(&mut self.tagged);
        tagged.extend(works.drain(..).enumerate());
        // Replies owed from earlier batches (a majority write's slow replica): read what
        // has arrived, then fail the connections whose oldest reply is past its deadline.
        for b in 0..self.conns.len() {
            if !self.conns[b].expect.is_empty() && self.conns[b].is_connected() {
                self.read_replies(b);
            }
        }
        self.expire(Instant::now());
        self.start(&mut tagged, done);
        self.tagged = tagged;
        while self.live > 0 || !self.redo.is_empty() || !self.held.is_empty() {
            self.wait(done);
        }
        self.record();
    }

    /// Starts `works` (each with its ticket): routed, their requests composed and written,
    /// one write per backend. Each is decided when its replies arrive.
    pub(crate) fn start(
        &mut self,
        works: &mut Vec<(usize, ProxyWork)>,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        self.now = Instant::now();
        if self.shared.record {
            self.shared.queue.leave(self.now, works.len() as u64);
        }
        for (_, work) in works.iter_mut() {
            work.dequeued = self.now;
        }
        if self.reload_pending() || !self.held.is_empty() {
            self.held.append(works);
            self.take_up_reload(done);
            return;
        }
        self.route_all(works, done);
    }

    /// Routes and sends `works`, then decides what can be at once.
    fn route_all(
        &mut self,
        works: &mut Vec<(usize, ProxyWork)>,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let now = self.now;
        for (ticket, work) in works.drain(..) {
            let i = match self.free_jobs.pop() {
                Some(i) => i as usize,
                None => {
                    self.jobs.push(Job::new(Class::Get));
                    self.works.push(ProxyWork::vacant(now));
                    self.jobs.len() - 1
                }
            };
            self.live += 1;
            let job = &mut self.jobs[i];
            job.active = true;
            job.ticket = ticket;
            job.client = work.client;
            self.works[i] = work;
            let work = std::mem::replace(&mut self.works[i], ProxyWork::vacant(now));
            self.route(i, &work);
            self.works[i] = work;
            if self.jobs[i].parts == 0 {
                // Nothing could be sent (not a forwarded request): fail it now.
                let mut works = std::mem::take(&mut self.works);
                self.jobs[i].failed += 1;
                self.decide(i, &mut works, done);
                self.works = works;
            }
        }
        self.settle_all(done);
        self.flush_all(done);
    }

    /// With nothing in flight, takes up a pending reload and starts the works held for it.
    fn take_up_reload(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        if self.live > 0 {
            return;
        }
        self.refresh();
        if !self.held.is_empty() {
            let mut held = std::mem::take(&mut self.held);
            self.route_all(&mut held, done);
            if self.held.is_empty() {
                self.held = held;
            }
        }
    }

    /// The socket of backend `b` is ready: writes what waits, reads what arrived.
    pub(super) fn ready(&mut self, b: usize, readable: bool, writable: bool) {
        if b >= self.conns.len() {
            return;
        }
        self.now = Instant::now();
        if writable && self.conns[b].wants_write() && self.conns[b].flush().is_err() {
            self.fail_conn(b, Fail::Closed);
            return;
        }
        if readable && self.conns[b].is_connected() {
            self.read_replies(b);
        }
    }

    /// The clock moved on: replies past their deadline fail their connections, redirected
    /// works due go again, a pending reload is taken up when nothing is in flight.
    pub(super) fn tick(&mut self, now: Instant, done: &mut dyn FnMut(usize, Completion)) {
        self.now = now.max(self.now);
        self.expire(self.now);
        self.settle_all(done);
        if self.redo_at().is_some_and(|at| self.now >= at) {
            self.redo_due(done);
        }
        if !self.held.is_empty() || self.reload_pending() {
            self.take_up_reload(done);
        }
        // Retries of reads that timed out go out now.
        self.flush_all(done);
    }

    /// When [`Worker::tick`] must run next: the earliest reply deadline, or redirected
    /// works' next try.
    pub(super) fn deadline(&self) -> Option<Instant> {
        let timeout = self.timeout();
        let mut due = self.redo_at();
        for conn in &self.conns {
            if let Some(head) = conn.expect.front() {
                let d = head.sent + timeout;
                due = Some(due.map_or(d, |x| x.min(d)));
            }
        }
        if !self.held.is_empty() {
            // A reload waits for the last reply in flight; look again soon.
            let soon = self.now + Duration::from_millis(1);
            due = Some(due.map_or(soon, |x| x.min(soon)));
        }
        due
    }

    /// A helper thread's wait: `poll` the backends with replies owed until something is
    /// ready or a deadline passes, then act on it.
    fn wait(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        self.pollfds.clear();
        self.polled.clear();
        for (b, conn) in self.conns.iter().enumerate() {
            let Some(fd) = conn.fd() else {
                continue;
            };
            if conn.expect.is_empty() && !conn.wants_write() {
                continue;
            }
            let mut events = libc::POLLIN;
            if conn.wants_write() {
                events |= libc::POLLOUT;
            }
            self.pollfds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
            self.polled.push(b);
        }
        let Some(deadline) = self.deadline() else {
            // Undecided jobs with nothing in flight cannot happen; fail them rather than
            // hang.
            self.fail_undecided(done);
            return;
        };
        let wait = deadline.saturating_duration_since(Instant::now());
        let ms = wait.as_millis().min(i32::MAX as u128) as i32 + 1;
        // SAFETY: `pollfds` is a valid, initialised array of `len` pollfd structs.
        let n = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                ms,
            )
        };
        if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            self.fail_undecided(done);
            return;
        }
        for k in 0..self.pollfds.len() {
            let revents = self.pollfds[k].revents;
            if revents == 0 {
                continue;
            }
            let readable = revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
            self.ready(self.polled[k], readable, revents & libc::POLLOUT != 0);
        }
        self.settle_all(done);
        self.flush_all(done);
        self.tick(Instant::now(), done);
    }

    /// When the first redirected work may go again (those behind it wait for it).
    fn redo_at(&self) -> Option<Instant> {
        self.redo.first().map(|&(_, _, at)| at)
    }

    /// Redirected works whose pause is over, in the order they were redirected (the first
    /// not yet due holds back those behind it, so a connection's requests keep their
    /// order): those redirected for too long are answered with an error; the rest go again
    /// by the cluster's newest ring. The ring is asked for first (unless a reload is already
    /// pending here, and no more often than a pause that doubles while the ring stays the
    /// same): if it moved on (here, or through another worker) they wait for this worker to
    /// take it up; if not (a hand-off under way: the node's data is still arriving) they go
    /// again by the same ring. A redirect never reaches the client: a node redirects before
    /// it applies anything, so sending again is safe.
    fn redo_due(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        let now = self.now;
        let due = self.redo.iter().take_while(|(_, _, at)| *at <= now).count();
        let mut go = std::mem::take(&mut self.redo_go);
        for (ticket, mut work, _) in self.redo.drain(..due) {
            let first = *work.redirected.get_or_insert(now);
            if now.saturating_duration_since(first) <= kvlab_client::cluster::REDIRECT_PATIENCE {
                go.push((ticket, work));
                continue;
            }
            let mut reply = std::mem::take(&mut work.buf);
            reply.clear();
            if !work.noreply {
                reply.extend_from_slice(b"SERVER_ERROR proxy: the cluster still redirects\r\n");
            }
            done(ticket, Completion::Reply(reply));
        }
        if !go.is_empty() {
            let ask = self
                .followed
                .is_none_or(|t| now.saturating_duration_since(t) >= self.follow_pause);
            if ask && !self.reload_pending() {
                self.followed = Some(now);
                self.follow_pause = if self.shared.follow_cluster() {
                    REDO_PAUSE
                } else {
                    (self.follow_pause * 2).min(REDO_PAUSE_MAX)
                };
            }
            if self.reload_pending() || !self.held.is_empty() {
                self.held.append(&mut go);
                self.take_up_reload(done);
            } else {
                self.route_all(&mut go, done);
            }
        }
        self.redo_go = go;
    }

    /// Decides what the replies read so far allow, then frees the jobs decided.
    pub(crate) fn settle_all(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        if !self.ready.is_empty() {
            let mut works = std::mem::take(&mut self.works);
            self.settle(&mut works, done);
            self.works = works;
        }
        self.free_finished();
    }

    /// Writes every backend's waiting requests (one write each); a connection that fails
    /// fails its requests, and what that decides is decided.
    pub(crate) fn flush_all(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        loop {
            for b in 0..self.conns.len() {
                if self.conns[b].wants_write() && self.conns[b].flush().is_err() {
                    self.fail_conn(b, Fail::Closed);
                }
            }
            if self.ready.is_empty() {
                return;
            }
            self.settle_all(done);
        }
    }
}
