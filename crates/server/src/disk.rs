//! Helper threads for blocking disk work, so that an event loop never blocks on disk.
//!
//! ```text
//!  event loop ──Job{conn, work}──► channel ──► helper 1..n: work.run(store) (blocks on disk)
//!      ▲                                                │
//!      └──── wake (eventfd / pipe) ◄── Done{conn, result} ◄┘
//! ```
//!
//! The loop hands a session's [`Blocking`] work over with the connection's id; a helper runs
//! it against the store and sends the result back, then wakes the loop, which completes the
//! session and carries on with its next requests. Meanwhile the loop keeps serving every
//! other connection.

use std::io;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use kvlab_store::Store;
use parking_lot::Mutex;

use crate::engine::Blocking;

/// A connection as an event loop names it: its slot and that slot's generation, so a
/// result for a closed connection is not delivered to a new one in the same slot.
pub type ConnId = (usize, u64);

/// Finished work, for the loop.
pub struct Done {
    pub conn: ConnId,
    pub work: Blocking,
    pub result: io::Result<()>,
}

struct Job {
    conn: ConnId,
    work: Blocking,
}

/// A pool of disk helper threads.
pub struct DiskPool {
    jobs: Option<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl DiskPool {
    /// Starts `n` helpers working on `store`; each result goes to `done`, then `wake` is
    /// called to wake the loop.
    pub fn start(
        n: usize,
        store: Arc<Store>,
        done: mpsc::Sender<Done>,
        wake: Arc<dyn Fn() + Send + Sync>,
    ) -> io::Result<DiskPool> {
        let (tx, rx) = mpsc::channel::<Job>();
        // Helpers share the queue; the lock is held only to take one job.
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let (rx, store, done, wake) = (rx.clone(), store.clone(), done.clone(), wake.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("kvlab-disk-{i}"))
                    .spawn(move || loop {
                        let job = rx.lock().recv();
                        let Ok(Job { conn, work }) = job else {
                            return;
                        };
                        let result = work.run(&store);
                        if done.send(Done { conn, work, result }).is_err() {
                            return;
                        }
                        wake();
                    })?,
            );
        }
        Ok(DiskPool {
            jobs: Some(tx),
            threads,
        })
    }

    /// Queues `work` for connection `conn`.
    pub fn submit(&self, conn: ConnId, work: Blocking) {
        if let Some(tx) = &self.jobs {
            let _ = tx.send(Job { conn, work });
        }
    }
}

impl Drop for DiskPool {
    fn drop(&mut self) {
        self.jobs.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
