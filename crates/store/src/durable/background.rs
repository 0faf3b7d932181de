//! The flusher thread and the purge passes it runs between commit rounds: dead records
//! (expired, or of an older flush generation) deleted from the disk.

use std::hash::BuildHasher;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::backend::Batch;
use super::record::Head;
use super::{Durability, Durable};
use crate::shard::shard_of;

/// Records one purge step scans (holding no lock) before it yields to the
/// flusher's other work.
pub(crate) const PURGE_CHUNK: usize = 1024;
/// Dead records a purge step re-checks and deletes per turn as leader: bounds how
/// long a commit waits for the purge (at most this many point reads and one
/// unsynced batch).
const PURGE_BATCH: usize = 128;
/// The flusher starts a purge pass for expired records at most once per this many
/// flush intervals (and only when a record on disk may have expired since the
/// last pass). A pass for a new flush generation starts at once.
const PURGE_EVERY: u32 = 60;

/// Where a purge pass over the engine is.
pub(crate) struct PurgePass {
    /// The last key scanned; `None` at the start.
    after: Option<Box<[u8]>>,
    /// The committed flush generation the pass judges by.
    gen: u64,
    /// The earliest exptime among the live records scanned (`u64::MAX` if none).
    min_exp: u64,
}

impl PurgePass {
    pub(crate) fn new(gen: u64) -> PurgePass {
        PurgePass {
            after: None,
            gen,
            min_exp: u64::MAX,
        }
    }
}

/// The flusher's purge state.
struct Background {
    pass: Option<PurgePass>,
    /// Generation the last pass judged by (or the one at open).
    gen: u64,
    last_start: Instant,
}

impl Durable {
    /// One step of a purge pass: scans up to [`PURGE_CHUNK`] records after the
    /// pass's cursor and deletes the dead ones that nothing newer is about to
    /// replace. Returns how many it deleted and whether the pass is complete. If
    /// the committed flush generation moved on, the pass starts over (what it
    /// scanned was judged by the older one).
    ///
    /// Never holds a shard lock during engine I/O. A delete must not remove a
    /// record that a round rewrote after the scan saw it dead, so the deletes are
    /// decided and written while holding the leader role (no round writes then),
    /// [`PURGE_BATCH`] at a time: if any other round or purge write ran since the
    /// scan started (or since the previous batch), each dead record is read again
    /// first. Then, under its shard's lock, a key is skipped if it has a
    /// queued op (a newer version or delete is coming) or a resident version other
    /// than the clean copy of that very record (which is then as dead as it is).
    /// A write after that check queues an op that a later round commits, after
    /// this delete.
    pub(crate) fn purge_step(&self, pass: &mut PurgePass) -> io::Result<(u64, bool)> {
        let now = self.clock.now();
        let gen = self.committed_gen(now);
        if gen > pass.gen {
            *pass = PurgePass::new(gen);
        }
        let (epoch, busy) = {
            let st = self.commit.lock();
            (st.epoch, st.leader)
        };
        let mut dead: Vec<(Box<[u8]>, u64)> = Vec::new();
        let mut last = Vec::new();
        let mut min_exp = pass.min_exp;
        let n = self
            .backend
            .scan(pass.after.as_deref(), PURGE_CHUNK, &mut |k, v| {
                last.clear();
                last.extend_from_slice(k);
                match Head::decode(v) {
                    Some(h) if !h.visible(now, gen) => dead.push((k.into(), h.cas)),
                    Some(h) if h.exptime != 0 => min_exp = min_exp.min(h.exptime),
                    // Live forever, or a format this version does not know: kept.
                    _ => {}
                }
            })?;
        self.purge_scanned.fetch_add(n as u64, Ordering::Relaxed);
        pass.min_exp = min_exp;
        let mut deleted = 0;
        if !dead.is_empty() {
            #[cfg(test)]
            {
                let hook = self.after_scan.lock().take();
                if let Some(f) = hook {
                    f();
                }
            }
            // In batches, so that a commit waits for at most one batch.
            let (mut idle, mut epoch) = (!busy, epoch);
            let mut dead = dead.into_iter();
            loop {
                let batch: Vec<_> = dead.by_ref().take(PURGE_BATCH).collect();
                if batch.is_empty() {
                    break;
                }
                self.acquire_leader();
                let res = self.purge_delete(batch, now, gen, idle, epoch, &mut pass.min_exp);
                // Only another leader between now and the next batch changes it.
                (idle, epoch) = (true, self.release_leader());
                deleted += res?;
            }
        }
        if n < PURGE_CHUNK {
            return Ok((deleted, true));
        }
        pass.after = Some(last.into_boxed_slice());
        Ok((deleted, false))
    }

    /// The write half of [`Durable::purge_step`]; the caller holds the leader role.
    /// `idle`: no leader was active when the scan started, which began at `epoch`.
    fn purge_delete(
        &self,
        dead: Vec<(Box<[u8]>, u64)>,
        now: u64,
        gen: u64,
        idle: bool,
        epoch: u64,
        min_exp: &mut u64,
    ) -> io::Result<u64> {
        let unchanged = idle && self.commit.lock().epoch == epoch;
        let mut batch = Batch::default();
        for (k, cas) in dead {
            let cas = if unchanged {
                cas
            } else {
                match self
                    .backend
                    .get_uncounted(&k)?
                    .as_deref()
                    .and_then(Head::decode)
                {
                    Some(h) if !h.visible(now, gen) => h.cas,
                    Some(h) => {
                        // Rewritten since the scan: live now.
                        if h.exptime != 0 {
                            *min_exp = (*min_exp).min(h.exptime);
                        }
                        continue;
                    }
                    None => continue,
                }
            };
            let hash = self.hasher.hash_one(&*k);
            let si = shard_of(hash, self.mask);
            if self.shards[si].0.lock().purge_allowed(hash, &k, cas) {
                batch.items.push((k, None));
            }
        }
        let n = batch.items.len() as u64;
        if n > 0 {
            // Not fsynced: a lost delete of a dead record is harmless, and the
            // journal keeps it behind the flush-generation entry it relies on.
            self.backend.write(batch, false)?;
            self.purged.fetch_add(n, Ordering::Relaxed);
        }
        Ok(n)
    }

    /// A whole purge pass on the calling thread (after a commit round, so that a
    /// preceding `flush_all` counts); returns the records it deleted.
    pub(crate) fn purge_all(&self) -> io::Result<u64> {
        self.commit(false)?;
        let mut pass = PurgePass::new(self.committed_gen(self.clock.now()));
        let mut deleted = 0;
        loop {
            let (n, done) = self.purge_step(&mut pass)?;
            deleted += n;
            if done {
                break;
            }
        }
        self.purge_passes.fetch_add(1, Ordering::Relaxed);
        Ok(deleted)
    }

    /// The flusher's share of the purge: starts a pass when the committed flush
    /// generation moved on, or (at an interval `tick`) when a record on disk may
    /// have expired and the last pass started [`PURGE_EVERY`] intervals ago; then
    /// runs one step of the pass in progress.
    fn purge_background(&self, bg: &mut Background, tick: bool) {
        #[cfg(test)]
        if self.no_background_purge.load(Ordering::Relaxed) {
            return;
        }
        let pass = match &mut bg.pass {
            Some(p) => p,
            None => {
                let now = self.clock.now();
                let gen = self.committed_gen(now);
                let expiry_due = tick
                    && self.next_expiry.load(Ordering::Relaxed) <= now
                    && bg.last_start.elapsed() >= self.interval * PURGE_EVERY;
                if gen <= bg.gen && !expiry_due {
                    return;
                }
                bg.last_start = Instant::now();
                // Writes during the pass lower it again; the pass adds what it saw.
                self.next_expiry.store(u64::MAX, Ordering::Relaxed);
                bg.pass.insert(PurgePass::new(gen))
            }
        };
        match self.purge_step(pass) {
            Ok((_, false)) => {}
            Ok((_, true)) => {
                self.next_expiry.fetch_min(pass.min_exp, Ordering::Relaxed);
                bg.gen = bg.gen.max(pass.gen);
                bg.pass = None;
                self.purge_passes.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.flush_errors.fetch_add(1, Ordering::Relaxed);
                bg.gen = bg.gen.max(pass.gen);
                // Retried by the next expiry pass.
                self.next_expiry.store(0, Ordering::Relaxed);
                bg.pass = None;
            }
        }
    }
}

/// The flusher thread: every `interval` (in `interval`/`sync` modes) queues the
/// dirty items, and on every wake-up (interval or kick) runs a commit round. While
/// a purge pass is in progress it runs one purge step per turn without waiting,
/// still committing at once when kicked.
pub(crate) fn flusher(d: Arc<Durable>) {
    let mut next = Instant::now() + d.interval;
    let mut bg = Background {
        pass: None,
        gen: d.committed_gen(d.clock.now()),
        last_start: Instant::now(),
    };
    loop {
        let kicked;
        {
            let mut s = d.shared.signal.lock();
            loop {
                if s.stop {
                    return;
                }
                if s.kicked || bg.pass.is_some() {
                    break;
                }
                let now = Instant::now();
                if now >= next {
                    break;
                }
                d.shared.wake.wait_for(&mut s, next - now);
            }
            kicked = s.kicked;
            s.kicked = false;
            d.shared.kicked.store(false, Ordering::Release);
        }
        let now = Instant::now();
        let tick = now >= next;
        if tick {
            if d.mode != Durability::None && d.collect_dirty().is_err() {
                d.flush_errors.fetch_add(1, Ordering::Relaxed);
            }
            next = now + d.interval;
        }
        if (kicked || tick) && d.commit(false).is_err() {
            d.flush_errors.fetch_add(1, Ordering::Relaxed);
        }
        d.purge_background(&mut bg, tick);
    }
}
