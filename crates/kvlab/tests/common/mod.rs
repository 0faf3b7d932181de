//! What the cluster tests share.

pub mod cluster;

/// A `kvlab bench --cluster --verify --json` run over a key space set before it: it did
/// work, saw no error or timeout, and lost nothing (a miss is a lost key).
pub fn assert_clean(run: &serde_json::Value) {
    let k = &run["counters"];
    let n = |f: &str| k[f].as_u64().unwrap_or(u64::MAX);
    assert!(n("completed") > 1000, "{k}");
    assert_eq!(
        (n("errors"), n("verify_errors"), n("timeouts")),
        (0, 0, 0),
        "bench saw errors: {k}"
    );
    assert_eq!(n("misses"), 0, "keys lost: {k}");
}
