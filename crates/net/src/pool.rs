//! Helper threads for deferred work, so that an event loop never blocks on it (disk work of
//! a durable cache; a proxy's backend requests).
//!
//! ```text
//!  event loop ──Job{conn, slot, work}──► queue of helper h ──► helper h: work.run(&mut worker)
//!      ▲                                                          │  (may block; each helper
//!      │                                                          │   owns its worker state)
//!      └── wake (eventfd / pipe) ◄── Done{conn, slot, completion} ◄┘
//! ```
//!
//! Each helper has its own queue. A connection's work goes to one helper while any of it is
//! in flight, so that pipelined requests of one connection run in order (a proxy's reach
//! each backend in the order the client sent them); a connection with nothing in flight
//! goes to the helper with the shortest queue ([`HelperPool::pick`]), which with requests
//! one at a time behaves like one queue shared by all helpers.
//!
//! The loop hands a session's [`Work`] over with the connection's id and the reply slot it
//! completes; a helper takes it — with whatever else is queued, up to [`Work::BATCH`] works,
//! which [`Work::run_batch`] runs together — and sends each [`Completion`] back, then wakes
//! the loop once per batch, which
//! completes the session's slot and carries on with its next requests. Meanwhile the loop
//! keeps serving every other connection.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::service::{Completion, Work};
use crate::session::SlotId;

/// A connection as an event loop names it: its slot and that slot's generation, so a
/// result for a closed connection is not delivered to a new one in the same slot.
pub type ConnId = (usize, u64);

/// Finished work, for the loop.
pub struct Done {
    /// The connection the work belongs to.
    pub conn: ConnId,
    /// The reply slot it completes.
    pub slot: SlotId,
    /// The outcome.
    pub completion: Completion,
}

struct Job<W> {
    conn: ConnId,
    slot: SlotId,
    work: W,
}

/// A pool of helper threads, each owning one `W::Worker` and its own queue.
pub struct HelperPool<W: Work> {
    queues: Vec<mpsc::Sender<Job<W>>>,
    /// Jobs queued or running, per helper.
    depth: Arc<Vec<AtomicUsize>>,
    threads: Vec<JoinHandle<()>>,
}

impl<W: Work> HelperPool<W> {
    /// Starts one helper per worker state in `workers` (named `name-<i>`); each result goes
    /// to `done`, then `wake` is called to wake the loop.
    pub fn start(
        name: &str,
        workers: Vec<W::Worker>,
        done: mpsc::Sender<Done>,
        wake: Arc<dyn Fn() + Send + Sync>,
    ) -> io::Result<HelperPool<W>> {
        let depth: Arc<Vec<AtomicUsize>> =
            Arc::new(workers.iter().map(|_| AtomicUsize::new(0)).collect());
        let mut threads = Vec::new();
        let mut queues = Vec::new();
        for (i, mut worker) in workers.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel::<Job<W>>();
            queues.push(tx);
            let (done, wake, depth) = (done.clone(), wake.clone(), depth.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        let mut tags = Vec::with_capacity(W::BATCH);
                        let mut works = Vec::with_capacity(W::BATCH);
                        loop {
                            // One blocking take, then whatever else is queued, up to a batch.
                            let Ok(first) = rx.recv() else {
                                return;
                            };
                            let mut next = Some(first);
                            while let Some(Job { conn, slot, work }) = next {
                                tags.push((conn, slot));
                                works.push(work);
                                next = if works.len() < W::BATCH {
                                    rx.try_recv().ok()
                                } else {
                                    None
                                };
                            }
                            let taken = works.len();
                            let mut gone = false;
                            W::run_batch(&mut works, &mut worker, &mut |i, completion| {
                                let (conn, slot) = tags[i];
                                gone |= done
                                    .send(Done {
                                        conn,
                                        slot,
                                        completion,
                                    })
                                    .is_err();
                            });
                            works.clear();
                            tags.clear();
                            depth[i].fetch_sub(taken, Ordering::Relaxed);
                            if gone {
                                return;
                            }
                            // One wake-up per batch: the loop takes every completion queued.
                            wake();
                        }
                    })?,
            );
        }
        Ok(HelperPool {
            queues,
            depth,
            threads,
        })
    }

    /// The helper with the fewest jobs queued or running.
    pub fn pick(&self) -> usize {
        (0..self.depth.len())
            .min_by_key(|&h| self.depth[h].load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Queues `work` for reply slot `slot` of connection `conn` on helper `helper`.
    pub fn submit(&self, helper: usize, conn: ConnId, slot: SlotId, work: W) {
        if let Some(tx) = self.queues.get(helper) {
            self.depth[helper].fetch_add(1, Ordering::Relaxed);
            let _ = tx.send(Job { conn, slot, work });
        }
    }
}

impl<W: Work> Drop for HelperPool<W> {
    fn drop(&mut self) {
        self.queues.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
