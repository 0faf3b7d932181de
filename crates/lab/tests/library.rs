//! The lab through its library API (not the `kvlab` binary): a tiny experiment against a
//! kvlab server writes raw results, metadata and a report; the server's worker threads are
//! what it reports; `analyse_dir` rewrites the report byte for byte.
//!
//! The kvlab executable: `$KVLAB_BIN`, else `target/<profile>/kvlab`, built here by cargo
//! (a no-op when it is fresh).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;

use kvlab_lab::{analyse_dir, Lab, Overrides, Source};

/// The kvlab executable the lab starts.
fn kvlab_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("KVLAB_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    // This test runs as target/<profile>/deps/library-HASH; the binary is built beside deps/.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let mut build = Command::new(env!("CARGO"));
    build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet", "-p", "kvlab", "--bin", "kvlab"]);
    if release {
        build.arg("--release");
    }
    let status = build.status().unwrap();
    assert!(status.success(), "cargo build -p kvlab failed: {status}");
    let bin = profile_dir.join("kvlab");
    assert!(bin.is_file(), "no kvlab at {}", bin.display());
    bin
}

const TINY: &str = r#"
name = "tiny"
repetitions = 2
duration = 0.5
warmup = 0.2

[[system]]
name = "kvlab"
args = ["-t", "3", "-m", "16"]

[workload]
keys = 1000
value_size = 64

[factors]
clients = [1, 2]
"#;

fn raw_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("raw"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn tiny_experiment_through_the_library() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let source = Source {
        label: "tiny.toml".into(),
        text: TINY.into(),
        stem: "tiny".into(),
    };
    let lab = Lab::with_kvlab_bin(kvlab_bin());
    let done = lab
        .run(&source, &Overrides::default(), Some(out.clone()))
        .unwrap();
    assert_eq!(done.dir, out);
    assert!(done.summary.contains("max throughput"), "{}", done.summary);

    // 2 points × 2 repetitions × 1 system.
    let raws = raw_files(&out);
    assert_eq!(raws.len(), 4, "{raws:?}");
    for f in &raws {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        assert!(v["error"].is_null(), "{}: {}", f.display(), v["error"]);
        assert!(v["result"]["throughput_qps"].as_f64().unwrap() > 0.0);
        // Asked from the running server (`stats`), not parsed from `-t`.
        assert_eq!(v["server_threads"], 3, "{}", f.display());
    }
    assert!(out.join("meta.json").is_file());
    assert_eq!(done.report, out.join("report").join("index.html"));

    // Re-analysis from raw/ and meta.json rewrites the same report, byte for byte.
    let html = std::fs::read(&done.report).unwrap();
    let json = std::fs::read(out.join("report").join("report.json")).unwrap();
    std::fs::remove_dir_all(out.join("report")).unwrap();
    let again = analyse_dir(&out).unwrap();
    assert_eq!(again.summary, done.summary);
    assert!(
        std::fs::read(&again.report).unwrap() == html,
        "index.html differs"
    );
    assert!(
        std::fs::read(out.join("report").join("report.json")).unwrap() == json,
        "report.json differs"
    );
}

#[test]
fn a_kvlab_system_without_an_executable_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let lab = Lab { kvlab_bin: None };
    let err = lab
        .run(
            &Source::quick(),
            &Overrides::default(),
            Some(tmp.path().into()),
        )
        .unwrap_err();
    assert!(format!("{err:#}").contains("KVLAB_BIN"), "{err:#}");
}
