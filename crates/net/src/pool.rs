//! Helper threads for deferred work, so that an event loop never blocks on it (disk work of
//! a durable cache; a proxy's backend requests).
//!
//! ```text
//!  event loop ──Job{conn, slot, work}──► channel ──► helper 1..n: work.run(&mut worker)
//!      ▲                                                  │    (may block; each helper
//!      │                                                  │     owns its worker state)
//!      └── wake (eventfd / pipe) ◄── Done{conn, slot, completion} ◄┘
//! ```
//!
//! The loop hands a session's [`Work`] over with the connection's id and the reply slot it
//! completes; a helper takes it — with whatever else is queued, up to [`Work::BATCH`] works,
//! which [`Work::run_batch`] runs together — and sends each [`Completion`] back, then wakes
//! the loop once per batch, which
//! completes the session's slot and carries on with its next requests. Meanwhile the loop
//! keeps serving every other connection.

use std::io;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use parking_lot::Mutex;

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

/// A pool of helper threads, each owning one `W::Worker`.
pub struct HelperPool<W: Work> {
    jobs: Option<mpsc::Sender<Job<W>>>,
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
        let (tx, rx) = mpsc::channel::<Job<W>>();
        // Helpers share the queue; the lock is held only to take one job.
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for (i, mut worker) in workers.into_iter().enumerate() {
            let (rx, done, wake) = (rx.clone(), done.clone(), wake.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        let mut tags = Vec::with_capacity(W::BATCH);
                        let mut works = Vec::with_capacity(W::BATCH);
                        loop {
                            {
                                // One blocking take, then whatever else is queued, up to a batch.
                                let rx = rx.lock();
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
                            }
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
            jobs: Some(tx),
            threads,
        })
    }

    /// Queues `work` for reply slot `slot` of connection `conn`.
    pub fn submit(&self, conn: ConnId, slot: SlotId, work: W) {
        if let Some(tx) = &self.jobs {
            let _ = tx.send(Job { conn, slot, work });
        }
    }
}

impl<W: Work> Drop for HelperPool<W> {
    fn drop(&mut self) {
        self.jobs.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
