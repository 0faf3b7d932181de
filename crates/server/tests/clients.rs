//! Real clients against `kvlab server`: pymemcache (PyPI) and memccapable (Debian
//! libmemcached-tools). `.ci/run` installs both; a missing one fails the test with a clear
//! message rather than skipping it.

mod common;

use std::process::Command;

use common::*;
use kvlab_server::IoModel;

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn pymemcache_round_trips_every_command() {
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |_| {});
        let out = Command::new("python3")
            .arg(repo_root().join("tests/python/pymemcache_roundtrip.py"))
            .arg(server.addr().port().to_string())
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "io {}: pymemcache round trip failed (is pymemcache installed? .ci/run does it)\n{}{}",
            io.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// memccapable's tests of one protocol (`-a` ascii, `-b` binary) under every I/O model.
fn memccapable_passes(protocol: &str) {
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |_| {});
        let out = Command::new("memccapable")
            .args([
                protocol,
                "-h",
                "127.0.0.1",
                "-p",
                &server.addr().port().to_string(),
            ])
            .output()
            .expect("memccapable runs (Debian libmemcached-tools; .ci/run installs it)");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("All tests passed"),
            "io {}:\n{text}",
            io.name()
        );
        assert!(!text.contains("[FAIL]"), "{text}");
    }
}

#[test]
fn memccapable_passes_every_ascii_test() {
    memccapable_passes("-a");
}

#[test]
fn memccapable_passes_every_binary_test() {
    memccapable_passes("-b");
}
