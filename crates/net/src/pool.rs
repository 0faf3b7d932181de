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
//! completes; a helper runs it and sends the [`Completion`] back, then wakes the loop, which
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
                    .spawn(move || loop {
                        let job = rx.lock().recv();
                        let Ok(Job { conn, slot, work }) = job else {
                            return;
                        };
                        let completion = work.run(&mut worker);
                        let done_msg = Done {
                            conn,
                            slot,
                            completion,
                        };
                        if done.send(done_msg).is_err() {
                            return;
                        }
                        wake();
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
