//! Replays every fuzz input kept in the repository — the corpora the fuzzers grew and the
//! inputs that once failed — through the same checks the fuzz targets run.

use std::path::{Path, PathBuf};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file());
    files.sort();
    files
}

#[test]
fn corpora_and_regressions_pass() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    for (name, check) in kvlab_fuzz::TARGETS {
        let corpus = inputs(&fuzz.join("corpus").join(name));
        assert!(!corpus.is_empty(), "fuzz/corpus/{name} has no seeds");
        let regressions = inputs(&fuzz.join("regressions").join(name));
        for file in corpus.iter().chain(&regressions) {
            let data = std::fs::read(file).expect("readable input");
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{name}: {} fails", file.display());
        }
        eprintln!(
            "{name}: {} corpus inputs, {} regressions",
            corpus.len(),
            regressions.len()
        );
    }
}
