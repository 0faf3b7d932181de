//! A snapshot's lines: one figure ([`Stat`]), the whole [`Snapshot`], memcached's order of
//! its `stats` fields, and the Prometheus text of a snapshot.

use kvlab_store::{Figure, Kind};

/// One line of a snapshot: a name in memcached's `stats`, its value, and how it moves.
#[derive(Clone, Debug, PartialEq)]
pub struct Stat {
    /// The `stats` name (`/stats` key; `/metrics` adds the `kvlab_` prefix).
    pub name: &'static str,
    /// Counter or gauge (a text value is neither and is left out of `/metrics`).
    pub kind: Kind,
    /// The value.
    pub value: StatValue,
}

/// A stat's value, typed so that each rendering (text, JSON, Prometheus) needs no parsing.
#[derive(Clone, Debug, PartialEq)]
pub enum StatValue {
    /// A whole number.
    Int(u64),
    /// A real number and the decimals it is printed with.
    Real(f64, usize),
    /// Text (`version`, `libevent`).
    Text(String),
}

impl Stat {
    pub(super) fn count(name: &'static str, kind: Kind, value: u64) -> Stat {
        Stat {
            name,
            kind,
            value: StatValue::Int(value),
        }
    }

    pub(super) fn real(name: &'static str, kind: Kind, value: f64, decimals: usize) -> Stat {
        Stat {
            name,
            kind,
            value: StatValue::Real(value, decimals),
        }
    }

    pub(super) fn text(name: &'static str, value: impl Into<String>) -> Stat {
        Stat {
            name,
            kind: Kind::Gauge,
            value: StatValue::Text(value.into()),
        }
    }
}

impl From<Figure> for Stat {
    fn from(f: Figure) -> Stat {
        Stat::count(f.name, f.kind, f.value)
    }
}

impl std::fmt::Display for StatValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatValue::Int(n) => write!(f, "{n}"),
            StatValue::Real(x, decimals) => write!(f, "{x:.decimals$}"),
            StatValue::Text(t) => f.write_str(t),
        }
    }
}

/// A point-in-time snapshot of every figure, in memcached's names.
pub struct Snapshot {
    /// `stats`: memcached 1.6's fields in its order (those of a mechanism memcached lists
    /// only while it is on, only then), then a durable store's `durable_*`.
    pub fields: Vec<Stat>,
    /// `stats kvlab`: kvlab's own figures (protocol errors, cluster redirects, service
    /// times).
    pub kvlab: Vec<Stat>,
}

impl Snapshot {
    /// Every figure: `stats`' then `stats kvlab`'s (what `/stats` and `/metrics` show).
    pub fn all(self) -> impl Iterator<Item = Stat> {
        self.fields.into_iter().chain(self.kvlab)
    }
}

/// memcached 1.6.18's `stats` fields in its order (`server_stats` and
/// `item_stats_totals`), with every optional one: `idle_kicks` (with an idle timeout),
/// `slab_reassign_*` and `slabs_moved` (while slab reassign is allowed),
/// `lru_crawler_running` and `lru_crawler_starts` (while the crawler is enabled), and the
/// LRU maintainer's `lru_maintainer_juggles`, `evicted_active`, `moves_*`,
/// `direct_reclaims` and `lru_bumps_dropped` (unless `-o no_lru_maintainer`).
const MEMCACHED_STATS: [&str; 94] = [
    "pid",
    "uptime",
    "time",
    "version",
    "libevent",
    "pointer_size",
    "rusage_user",
    "rusage_system",
    "max_connections",
    "curr_connections",
    "total_connections",
    "rejected_connections",
    "connection_structures",
    "response_obj_oom",
    "response_obj_count",
    "response_obj_bytes",
    "read_buf_count",
    "read_buf_bytes",
    "read_buf_bytes_free",
    "read_buf_oom",
    "reserved_fds",
    "cmd_get",
    "cmd_set",
    "cmd_flush",
    "cmd_touch",
    "cmd_meta",
    "get_hits",
    "get_misses",
    "get_expired",
    "get_flushed",
    "delete_misses",
    "delete_hits",
    "incr_misses",
    "incr_hits",
    "decr_misses",
    "decr_hits",
    "cas_misses",
    "cas_hits",
    "cas_badval",
    "touch_hits",
    "touch_misses",
    "store_too_large",
    "store_no_memory",
    "auth_cmds",
    "auth_errors",
    "idle_kicks",
    "bytes_read",
    "bytes_written",
    "limit_maxbytes",
    "accepting_conns",
    "listen_disabled_num",
    "time_in_listen_disabled_us",
    "threads",
    "conn_yields",
    "hash_power_level",
    "hash_bytes",
    "hash_is_expanding",
    "slab_reassign_rescues",
    "slab_reassign_chunk_rescues",
    "slab_reassign_evictions_nomem",
    "slab_reassign_inline_reclaim",
    "slab_reassign_busy_items",
    "slab_reassign_busy_deletes",
    "slab_reassign_running",
    "slabs_moved",
    "lru_crawler_running",
    "lru_crawler_starts",
    "lru_maintainer_juggles",
    "malloc_fails",
    "log_worker_dropped",
    "log_worker_written",
    "log_watcher_skipped",
    "log_watcher_sent",
    "log_watchers",
    "unexpected_napi_ids",
    "round_robin_fallback",
    "bytes",
    "curr_items",
    "total_items",
    "slab_global_page_pool",
    "expired_unfetched",
    "evicted_unfetched",
    "evicted_active",
    "evictions",
    "reclaimed",
    "crawler_reclaimed",
    "crawler_items_checked",
    "lrutail_reflocked",
    "moves_to_cold",
    "moves_to_warm",
    "moves_within_lru",
    "direct_reclaims",
    "lru_bumps_dropped",
    // Not memcached's: kept last in `stats` with a durable store (as memcached adds
    // extstore's fields when it has one); every other name goes to `stats kvlab`.
    "durable_",
];

/// Where a figure goes: its place among [`MEMCACHED_STATS`], or `None` for `stats kvlab`.
pub(super) fn memcached_place(name: &str) -> Option<usize> {
    let durable = MEMCACHED_STATS.len() - 1;
    if name.starts_with(MEMCACHED_STATS[durable]) {
        return Some(durable);
    }
    MEMCACHED_STATS[..durable].iter().position(|n| *n == name)
}

/// Renders a snapshot in the Prometheus text exposition format (`kvlab_` prefix); text
/// figures are left out.
pub fn prometheus(snapshot: &Snapshot) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for stat in snapshot.fields.iter().chain(&snapshot.kvlab) {
        if matches!(stat.value, StatValue::Text(_)) {
            continue;
        }
        let kind = match stat.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let (name, value) = (stat.name, &stat.value);
        let _ = writeln!(out, "# TYPE kvlab_{name} {kind}\nkvlab_{name} {value}");
    }
    out
}
