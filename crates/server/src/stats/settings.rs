//! The `stats settings` lines: memcached's defaults, the process's, the administration
//! commands', TLS's, and the idle timeout's and crawler's settings.

use std::sync::atomic::Ordering::Relaxed;

use kvlab_store::{Policy, Store};

use super::ServerStats;

impl ServerStats {
    /// `stats settings` lines.
    pub fn settings(&self, store: &Store) -> Vec<(&'static str, String)> {
        let mut all = self.process_settings(store);
        all.extend(
            Self::MEMCACHED_DEFAULTS
                .iter()
                .map(|&(name, value)| (name, value.to_string())),
        );
        // `-o lru_maintainer|no_lru_maintainer` as given (memcached's default: on), which
        // decides whether `stats` lists the maintainer's fields; kvlab has no such thread.
        let at = all
            .iter()
            .position(|(name, _)| *name == "lru_segmented")
            .unwrap_or(all.len());
        all.insert(
            at,
            (
                "lru_maintainer_thread",
                yes_no(self.admin.accepted.lru_maintainer).to_string(),
            ),
        );
        // `-X` as given, in memcached's place for it.
        let at = all
            .iter()
            .position(|(name, _)| *name == "hash_algorithm")
            .unwrap_or(all.len());
        all.insert(
            at,
            ("dump_enabled", yes_no(self.admin.dumps_enabled).to_string()),
        );
        all.extend(self.admin_settings());
        all.extend(self.tls_settings());
        all.extend(self.idle_and_crawler_settings());
        all
    }

    /// memcached's defaults for what kvlab has no use for (no slab pages to move, no segmented
    /// LRU, no logger buffers), shown as memcached shows them: `slab_automove_ratio` …
    /// `slab_automove_freeratio` (`lru_maintainer_thread`, as given, is put in its place).
    const MEMCACHED_DEFAULTS: [(&'static str, &'static str); 17] = [
        ("slab_automove_ratio", "0.80"),
        ("slab_automove_window", "30"),
        ("slab_chunk_max", "524288"),
        ("tail_repair_time", "0"),
        // kvlab's shards hash keys with hashbrown's default hasher.
        ("hash_algorithm", "foldhash"),
        ("lru_segmented", "no"),
        ("hot_lru_pct", "20"),
        ("warm_lru_pct", "40"),
        ("hot_max_factor", "0.20"),
        ("warm_max_factor", "2.00"),
        ("temp_lru", "no"),
        ("temporary_ttl", "61"),
        ("watcher_logbuf_size", "262144"),
        ("worker_logbuf_size", "65536"),
        ("track_sizes", "no"),
        ("inline_ascii_response", "no"),
        ("slab_automove_freeratio", "0.010"),
    ];

    /// The process, its listener and its store: `maxbytes` … `hashpower_init`.
    fn process_settings(&self, store: &Store) -> Vec<(&'static str, String)> {
        vec![
            ("maxbytes", store.stats().limit_maxbytes.to_string()),
            ("maxconns", self.max_connections.to_string()),
            ("tcpport", self.port.to_string()),
            ("udpport", "0".into()),
            ("inter", self.listen.to_string()),
            ("verbosity", self.verbosity.load(Relaxed).to_string()),
            ("oldest", "0".into()),
            (
                "slab_automove",
                self.slab_automove.load(Relaxed).to_string(),
            ),
            (
                "evictions",
                if self.policy == Policy::None {
                    "off"
                } else {
                    "on"
                }
                .to_string(),
            ),
            ("eviction_policy", self.policy.to_string()),
            ("domain_socket", "NULL".into()),
            ("umask", "700".into()),
            ("num_threads", self.threads.to_string()),
            ("num_threads_per_udp", self.threads.to_string()),
            ("tcp_backlog", self.backlog.to_string()),
            ("auth_enabled_sasl", "no".into()),
            ("maxconns_fast", "yes".into()),
            ("hashpower_init", "0".into()),
        ]
    }

    /// The item limit and the administration switches: `item_size_max` …
    /// `auth_enabled_ascii`.
    fn admin_settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("item_size_max", self.item_size_max.to_string()),
            ("cas_enabled", yes_no(self.admin.cas_enabled).to_string()),
            (
                "flush_enabled",
                yes_no(self.admin.flush_enabled).to_string(),
            ),
            (
                "reqs_per_event",
                self.admin
                    .accepted
                    .reqs_per_event
                    .unwrap_or(DEFAULT_REQS_PER_EVENT)
                    .to_string(),
            ),
            (
                "binding_protocol",
                self.admin.accepted.binding_protocol.to_string(),
            ),
            (
                "read_buf_mem_limit",
                self.admin.accepted.read_buf_mem_limit.to_string(),
            ),
            ("io_model", self.io_model.to_string()),
            (
                "shutdown_command",
                yes_no(self.admin.shutdown_command).to_string(),
            ),
            (
                "growth_factor",
                format!("{:.2}", self.admin.classes.factor()),
            ),
            ("chunk_size", self.admin.classes.chunk_size().to_string()),
            (
                "stat_key_prefix",
                char::from(self.admin.detail.delimiter()).to_string(),
            ),
            (
                "detail_enabled",
                yes_no(self.admin.detail.enabled()).to_string(),
            ),
            (
                "slab_reassign",
                yes_no(self.admin.slab_reassign).to_string(),
            ),
            (
                "auth_enabled_ascii",
                yes_no(self.admin.auth.is_some()).to_string(),
            ),
        ]
    }

    /// TLS: `ssl_enabled` … `ssl_min_version`.
    fn tls_settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ssl_enabled", yes_no(self.admin.tls.is_some()).to_string()),
            (
                "ssl_verify_mode",
                self.admin
                    .tls
                    .as_ref()
                    .map_or(0, |t| t.verify_mode)
                    .to_string(),
            ),
            (
                "ssl_chain_cert",
                tls_path(
                    self.admin.tls.as_ref().and_then(|t| t.chain_cert.as_ref()),
                    "(null)",
                ),
            ),
            (
                "ssl_key",
                tls_path(
                    self.admin.tls.as_ref().and_then(|t| t.key.as_ref()),
                    "(null)",
                ),
            ),
            // PEM (memcached's SSL_FILETYPE_PEM).
            ("ssl_keyformat", "1".into()),
            // rustls chooses among its own suites; memcached's default list is NULL.
            ("ssl_ciphers", "NULL".into()),
            (
                "ssl_ca_cert",
                tls_path(
                    self.admin.tls.as_ref().and_then(|t| t.ca_cert.as_ref()),
                    "NULL",
                ),
            ),
            ("ssl_wbuf_size", "16384".into()),
            // rustls's session cache is not configurable here: reported off.
            ("ssl_session_cache", "no".into()),
            ("ssl_kernel_tls", "no".into()),
            // rustls speaks TLS 1.2 and 1.3.
            ("ssl_min_version", "tlsv1.2".into()),
        ]
    }

    /// What memcached lists last: `num_napi_ids` and `memory_file` (features kvlab does not
    /// have, shown unset), the idle timeout and the LRU crawler.
    fn idle_and_crawler_settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("num_napi_ids", "(null)".into()),
            ("memory_file", "(null)".into()),
            (
                "idle_timeout",
                self.idle_timeout.map_or(0, |t| t.as_secs()).to_string(),
            ),
            (
                "lru_crawler",
                yes_no(self.admin.crawler.enabled()).to_string(),
            ),
            (
                "lru_crawler_sleep",
                self.crawler_config
                    .map_or(0, |c| c.pause.as_micros())
                    .to_string(),
            ),
            (
                "lru_crawler_tocrawl",
                self.admin.crawler_tocrawl.load(Relaxed).to_string(),
            ),
            (
                "lru_crawler_interval_ms",
                self.crawler_config
                    .map_or(0, |c| c.interval.as_millis())
                    .to_string(),
            ),
        ]
    }
}

/// A TLS file setting as memcached shows it: the path, or memcached's word for unset.
fn tls_path(path: Option<&std::path::PathBuf>, unset: &str) -> String {
    path.map_or_else(|| unset.to_string(), |p| p.display().to_string())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// memcached's `-R` default, shown in `stats settings` when `-R` is not given.
const DEFAULT_REQS_PER_EVENT: u32 = 20;
