//! The crawler thread: reclaims expired and flushed items in the background, like
//! memcached 1.6's LRU crawler, so that they stop counting in `curr_items` and `bytes`
//! (and stop holding memory) without a client touching their keys.
//!
//! ```text
//!  kvlab-crawler (one thread)                       worker threads
//!   wait `interval` since the last pass began ◄──── shutdown wakes it at once
//!   pass: cursor = start
//!     Store::crawl_step(cursor, step_slots) ──────► locks ONE shard for at most
//!     pause `pause`                                  `step_slots` slot visits, then
//!     … until the cursor wraps                       releases it to the workers
//! ```
//!
//! A step holds one shard's lock for at most [`CrawlerConfig::step_slots`] slab slot
//! visits. Examining a live item costs a few nanoseconds, reclaiming a dead one about
//! 0.3 µs (rehash its key, unlink it from the table and the eviction order, free its
//! block: a handful of cache misses), so with the default 256 slots a step holds the
//! lock ~1 µs over live items and up to ~100 µs (p99; 150 µs max) when half of them
//! are dead, measured with 1 M items by `cargo bench -p kvlab-store --bench crawl`.
//! Only requests for keys of that one shard (1/64 of them or fewer) can wait on it.
//! After every step that looked at something the crawler pauses at least
//! [`CrawlerConfig::pause`] and at least 4× the step's own time, so even a pass
//! that reclaims everything uses at most a fifth of a core. Pacing is by the real
//! time (`Instant`); whether an item is dead is judged by the store's clock, so tests
//! that drive a `ManualClock` see the crawler reclaim what that clock expired.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvlab_store::{CrawlCursor, Store};
use parking_lot::{Condvar, Mutex};

/// How the crawler runs (`--crawler-interval-ms`; the rest are fixed defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrawlerConfig {
    /// Time from the start of one pass over the whole store to the start of the next
    /// (a pass that takes longer is followed by the next at once).
    pub interval: Duration,
    /// Slab slots one step examines under one shard lock.
    pub step_slots: usize,
    /// Least pause after each step that examined a slot (the pause is also at least
    /// 4× the step's own time).
    pub pause: Duration,
}

impl Default for CrawlerConfig {
    /// A pass at most every 2 s, in steps of 256 slots at least 200 µs apart. With
    /// 1 M live items in 64 shards that is ~4,000 steps, a pass of about a second
    /// that costs ~20 ms of CPU.
    fn default() -> Self {
        CrawlerConfig {
            interval: Duration::from_secs(2),
            step_slots: 256,
            pause: Duration::from_micros(200),
        }
    }
}

/// What the thread waits on: a stop, a kick (`lru_crawler crawl`), or its next pass;
/// and whether passes run at all (`lru_crawler enable|disable`, `-o no_lru_crawler`).
pub struct Control {
    state: Mutex<State>,
    cv: Condvar,
    enabled: AtomicBool,
}

#[derive(Default)]
struct State {
    stopped: bool,
    kicked: bool,
}

impl Control {
    /// A control whose passes run (`enabled`) or wait for `lru_crawler enable`.
    pub fn new(enabled: bool) -> Arc<Control> {
        Arc::new(Control {
            state: Mutex::default(),
            cv: Condvar::new(),
            enabled: AtomicBool::new(enabled),
        })
    }

    /// Whether passes run.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// `lru_crawler enable|disable`: a pass in progress finishes its step and stops.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Relaxed);
        self.cv.notify_all();
    }

    /// `lru_crawler crawl`: start a pass now (if none is running).
    pub fn kick(&self) {
        self.state.lock().kicked = true;
        self.cv.notify_all();
    }

    fn stop(&self) {
        self.state.lock().stopped = true;
        self.cv.notify_all();
    }

    fn stopped(&self) -> bool {
        self.state.lock().stopped
    }

    /// Waits until `deadline`, a kick or a stop; returns whether to stop.
    fn wait_until(&self, deadline: Instant) -> bool {
        let mut state = self.state.lock();
        while !state.stopped && !state.kicked {
            if self.cv.wait_until(&mut state, deadline).timed_out() {
                break;
            }
        }
        state.kicked = false;
        state.stopped
    }

    /// Waits until `deadline` or a stop (a kick does not cut a pause short).
    fn pause_until(&self, deadline: Instant) -> bool {
        let mut state = self.state.lock();
        while !state.stopped {
            if self.cv.wait_until(&mut state, deadline).timed_out() {
                break;
            }
        }
        state.stopped
    }
}

/// A running crawler thread.
/// The crawler thread's own figures (what it reclaims is counted by the store).
#[derive(Default)]
pub struct CrawlerStats {
    /// A pass is in progress (memcached `lru_crawler_running`).
    pub running: AtomicBool,
    /// Passes started (memcached `lru_crawler_starts`).
    pub starts: AtomicU64,
}

/// The running crawler thread; dropping it stops the thread.
pub struct Crawler {
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
}

impl Crawler {
    /// Starts the thread; its first pass begins one `interval` from now, or at a kick
    /// (while `control` is enabled).
    pub fn start(
        store: Arc<Store>,
        stats: Arc<CrawlerStats>,
        config: CrawlerConfig,
        control: Arc<Control>,
    ) -> io::Result<Crawler> {
        let thread = std::thread::Builder::new()
            .name("kvlab-crawler".into())
            .spawn({
                let control = control.clone();
                move || run(&store, &stats, config, &control)
            })?;
        Ok(Crawler {
            control,
            thread: Some(thread),
        })
    }

    /// Stops the thread (after at most the step in progress) and waits for it.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.control.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Crawler {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn run(store: &Store, stats: &CrawlerStats, config: CrawlerConfig, control: &Control) {
    let mut next_pass = Instant::now() + config.interval;
    loop {
        if control.wait_until(next_pass) {
            return;
        }
        if !control.enabled() {
            next_pass = Instant::now() + config.interval;
            continue;
        }
        let began = Instant::now();
        stats.starts.fetch_add(1, Relaxed);
        stats.running.store(true, Relaxed);
        let finished = pass(store, config, control);
        stats.running.store(false, Relaxed);
        if !finished {
            return;
        }
        next_pass = (began + config.interval).max(Instant::now());
    }
}

/// One pass over the whole store; false if stopped before it wrapped (a pass cut
/// short by `lru_crawler disable` counts as finished).
fn pass(store: &Store, config: CrawlerConfig, control: &Control) -> bool {
    let mut cursor = CrawlCursor::default();
    loop {
        if !control.enabled() {
            return true;
        }
        let began = Instant::now();
        let step = store.crawl_step(&mut cursor, config.step_slots);
        if step.wrapped {
            return true;
        }
        // Steps over empty shards cost no lock time worth resting from.
        let now = Instant::now();
        let pause = config.pause.max((now - began) * 4);
        if step.examined > 0 && control.pause_until(now + pause) {
            return false;
        }
        if step.examined == 0 && control.stopped() {
            return false;
        }
    }
}
