//! The window logger (`--log-dir`): every `--log-interval` it writes one row per window to
//! `windows.csv` (throughput, hit ratio, mean queue length, mean and percentiles of each
//! stage), one row per backend to `backends.csv`, and the sampled request lines
//! (`--log-sample N`) to `requests.csv`.
//!
//! The queue length is given twice: as seen by each arrival (recorded with the request) and
//! as its exact time average over the window (integrated at every arrival and departure).
//! The second comes from counting, the mean time in the queue from per-request timestamps:
//! Little's law (mean queue length = arrival rate × mean time in the queue) checks that the
//! two agree.

use std::fs::File;
use std::io::{self, BufWriter, Write as _};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::render::stages;
use crate::stats::{Recorder, Stage};
use crate::{ProxyOptions, ProxyState};

/// How often the logger looks at the clock.
const TICK: Duration = Duration::from_millis(5);

/// The columns of `windows.csv`.
pub const WINDOW_COLUMNS: &str = "t_s,unix_time,window_s,requests,throughput_rps,reads,errors,retries,hit_ratio,queue_len_arrival,queue_len_mean";
/// The columns of `backends.csv`.
pub const BACKEND_COLUMNS: &str =
    "t_s,backend,requests,errors,timeouts,mean_us,p99_us,ejected,outstanding";
/// The columns of `requests.csv`.
pub const REQUEST_COLUMNS: &str =
    "arrival_s,kind,keys,hits,queue_len,queue_us,worker_us,backend_us,total_us,parts,outcome";

struct Files {
    windows: BufWriter<File>,
    backends: BufWriter<File>,
    requests: BufWriter<File>,
}

/// Writes the window logs.
pub struct Logger {
    shared: Arc<ProxyState>,
    interval: Duration,
    files: Option<Files>,
}

impl Logger {
    /// Creates the files under `options.log_dir` (nothing without one).
    pub fn new(shared: Arc<ProxyState>, options: &ProxyOptions) -> io::Result<Logger> {
        let files = match &options.log_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                let open = |name: &str| File::create(dir.join(name)).map(BufWriter::new);
                let mut f = Files {
                    windows: open("windows.csv")?,
                    backends: open("backends.csv")?,
                    requests: open("requests.csv")?,
                };
                let mut header = WINDOW_COLUMNS.to_string();
                for stage in ["net", "queue", "worker", "backend", "total"] {
                    for s in ["mean", "p50", "p95", "p99"] {
                        header.push_str(&format!(",{stage}_{s}_us"));
                    }
                }
                writeln!(f.windows, "{header}")?;
                writeln!(f.backends, "{BACKEND_COLUMNS}")?;
                writeln!(f.requests, "{REQUEST_COLUMNS}")?;
                f.windows.flush()?;
                Some(f)
            }
            None => None,
        };
        Ok(Logger {
            shared,
            interval: options.log_interval.max(Duration::from_millis(10)),
            files,
        })
    }

    /// Samples and writes until the proxy stops, then writes the last (partial) window.
    pub fn run(mut self) {
        let Some(mut files) = self.files.take() else {
            return;
        };
        let mut previous = Recorder::default();
        let mut previous_net = Stage::default();
        let mut start = Instant::now();
        let mut next = start + self.interval;
        self.shared.queue.take_area(start);
        loop {
            let stopping = self.shared.stopping.load(Ordering::Relaxed);
            std::thread::sleep(TICK);
            let now = Instant::now();
            if now < next && !stopping {
                continue;
            }
            let area = self.shared.queue.take_area(now);
            let mean_len = area as f64 / now.duration_since(start).as_nanos().max(1) as f64;
            let totals = self.shared.totals();
            let net = self.shared.net.lock().stage.clone();
            let window = totals.since(&previous);
            let mut net_window = net.clone();
            net_window.sub(&previous_net);
            let secs = now.duration_since(start).as_secs_f64();
            if let Err(e) = self.write(&mut files, &window, &net_window, secs, mean_len) {
                tracing::error!(%e, "cannot write the window logs; logging stops");
                return;
            }
            previous = totals;
            previous_net = net;
            start = now;
            next = now + self.interval;
            if stopping {
                return;
            }
        }
    }

    fn write(
        &self,
        f: &mut Files,
        w: &Recorder,
        net: &Stage,
        secs: f64,
        mean_len: f64,
    ) -> io::Result<()> {
        let t = self.shared.epoch.elapsed().as_secs_f64();
        let unix = self.shared.epoch_unix + t;
        let mut row = format!(
            "{t:.3},{unix:.3},{secs:.3},{},{:.1},{},{},{},{:.4},{:.3},{mean_len:.3}",
            w.requests,
            w.requests as f64 / secs.max(1e-9),
            w.reads,
            w.errors,
            w.retries,
            w.hit_ratio(),
            w.mean_queue_len(),
        );
        for (_, s) in stages(w, net) {
            row.push_str(&format!(
                ",{:.1},{:.1},{:.1},{:.1}",
                s.mean_us(),
                s.quantile_us(0.5),
                s.quantile_us(0.95),
                s.quantile_us(0.99)
            ));
        }
        writeln!(f.windows, "{row}")?;
        let (routing, _) = self.shared.routing();
        for (i, h) in routing.backends.iter().enumerate() {
            let b = w.backends.get(i).cloned().unwrap_or_default();
            writeln!(
                f.backends,
                "{t:.3},{},{},{},{},{:.1},{:.1},{},{}",
                h.name,
                b.requests,
                b.errors,
                b.timeouts,
                b.time.mean_us(),
                b.time.quantile_us(0.99),
                u8::from(h.is_ejected()),
                h.outstanding.load(Ordering::Relaxed).max(0),
            )?;
        }
        for r in &self.shared.recorders {
            let lines = std::mem::take(&mut r.lock().sampled);
            for line in lines {
                writeln!(f.requests, "{line}")?;
            }
        }
        f.windows.flush()?;
        f.backends.flush()?;
        f.requests.flush()
    }
}
