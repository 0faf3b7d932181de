//! The administration family: `flush_all`, `verbosity`, `slabs automove`, `watch` and the
//! other administration commands, `version`, `cluster` (outside a cluster), `stats`.

use std::sync::atomic::Ordering::Relaxed;

use kvlab_protocol::response as r;
use kvlab_protocol::Admin;

use super::{Done, Engine, Flow, WorkerStats};
use crate::admin::{self, Next};
use crate::slabs;
use crate::stats::VERSION;

impl Engine {
    /// `flush_all [delay]`.
    pub(super) fn flush_all(&mut self, delay: i64, noreply: bool, out: &mut Vec<u8>) -> Done {
        WorkerStats::add(&self.worker.cmd_flush, 1);
        if !self.server.admin.flush_enabled {
            // `-F`: counted, refused, as memcached does.
            if !noreply {
                out.extend_from_slice(b"CLIENT_ERROR flush_all not allowed\r\n");
            }
            return Done::Unchanged;
        }
        self.store.flush_all(delay);
        if !noreply {
            out.extend_from_slice(r::OK);
        }
        // Items changed wholesale: made durable all at once under `sync`.
        Done::Changed
    }

    /// `verbosity <level>`.
    pub(super) fn verbosity(&mut self, level: u32, noreply: bool, out: &mut Vec<u8>) -> Done {
        self.server.verbosity.store(u64::from(level), Relaxed);
        if !noreply {
            out.extend_from_slice(r::OK);
        }
        Done::Unchanged
    }

    /// `slabs automove <mode>`.
    pub(super) fn slabs_automove(&mut self, mode: u8, out: &mut Vec<u8>) -> Done {
        self.server.slab_automove.store(u64::from(mode), Relaxed);
        out.extend_from_slice(r::OK);
        Done::Unchanged
    }

    /// `version`.
    pub(super) fn version(&mut self, out: &mut Vec<u8>) -> Done {
        r::version(out, VERSION);
        Done::Unchanged
    }

    /// `cluster …` outside a cluster: only a cluster node knows it (its service answers it
    /// before the engine); memcached's answer otherwise.
    pub(super) fn not_a_cluster(&mut self, out: &mut Vec<u8>) -> Done {
        out.extend_from_slice(r::ERROR);
        Done::Unchanged
    }

    /// An administration command; `watch` hands the connection over to the log thread.
    pub(super) fn admin(&mut self, cmd: Admin<'_>, out: &mut Vec<u8>) -> Done {
        let Admin::Watch { streams } = cmd else {
            if admin::execute(&self.server.admin, &self.store, cmd, out) == Next::Close {
                return Done::Flow(Flow::Close);
            }
            return Done::Unchanged;
        };
        if !self.server.admin.watch_enabled {
            out.extend_from_slice(b"CLIENT_ERROR watch commands not allowed\r\n");
            return Done::Unchanged;
        }
        let Some(streams) = streams else {
            out.extend_from_slice(r::ERROR);
            return Done::Unchanged;
        };
        // Replies composed before it leave first (memcached refuses a `watch`
        // behind unsent replies); input after it is not read.
        // A TLS connection's bytes are rustls's: the log thread cannot write to
        // its socket.
        if self.over_tls {
            out.extend_from_slice(b"WATCHER_FAILED failed to add log watcher\r\n");
            return Done::Unchanged;
        }
        if self.server.admin.watchers.check_room().is_err() {
            out.extend_from_slice(b"WATCHER_TOO_MANY log watcher limit reached\r\n");
            return Done::Unchanged;
        }
        out.extend_from_slice(r::OK);
        self.watch = streams;
        Done::Flow(Flow::HandOff)
    }

    /// `stats [group]`.
    pub(super) fn stats_command(&mut self, group: Option<&[u8]>, out: &mut Vec<u8>) -> Done {
        self.stats(group, out);
        Done::Unchanged
    }

    fn stats(&mut self, group: Option<&[u8]>, out: &mut Vec<u8>) {
        match group {
            None => {
                for stat in self.server.snapshot(&self.store).fields {
                    r::stat(out, stat.name, stat.value);
                }
            }
            Some(b"settings") => {
                for (name, value) in self.server.settings(&self.store) {
                    r::stat(out, name, value);
                }
            }
            // memcached's per-size histogram is off unless `stats sizes_enable`; kvlab has none.
            Some(b"sizes") => r::stat(out, "sizes_status", "disabled"),
            Some(b"items") => {
                let now = self.store.now_unix();
                let workers = self.server.all_workers();
                let admin = &self.server.admin;
                return slabs::stats_items(
                    &self.store,
                    &admin.evictions,
                    slabs::Workers(&workers),
                    admin.accepted.lru_maintainer,
                    now,
                    out,
                );
            }
            Some(b"slabs") => {
                let now = self.store.now_unix();
                let workers = self.server.all_workers();
                return slabs::stats_slabs(
                    &self.store,
                    &self.server.admin.evictions,
                    slabs::Workers(&workers),
                    now,
                    out,
                );
            }
            Some(b"kvlab") => {
                for stat in self.server.snapshot(&self.store).kvlab {
                    r::stat(out, stat.name, stat.value);
                }
            }
            Some(b"latency") => {
                for (name, value) in self.server.latency() {
                    r::stat(out, &name, value);
                }
            }
            Some(b"conns") => {
                let uptime = self.server.started.elapsed().as_secs();
                let listener = self.server.listen_fd.map(|fd| (fd, uptime));
                let lines = self.server.admin.conns.lines(listener, self.cfd);
                for (name, value) in lines {
                    r::stat(out, &name, value);
                }
            }
            Some(b"reset") => {
                self.server.reset(&self.store);
                self.server.admin.detail.clear();
                out.extend_from_slice(r::RESET);
                return;
            }
            Some(_) => {
                out.extend_from_slice(r::ERROR);
                return;
            }
        }
        out.extend_from_slice(r::END);
    }
}
