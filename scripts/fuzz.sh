#!/usr/bin/env bash
# Runs kvlab's coverage-guided fuzz targets (fuzz/: libFuzzer through cargo-fuzz, on the
# stable toolchain with `-s none`, i.e. without a sanitizer) one after another, SECONDS each.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      # default: 600 s, every target
#
# New inputs go to a scratch directory, so the repository's corpora (fuzz/corpus/TARGET)
# are only read; with MERGE=1, the inputs that reach new coverage are merged into them
# at the end (libFuzzer's -merge=1), which is how the corpora in the repository grew.
# A failing input is saved under fuzz/artifacts/TARGET/; copy it into
# fuzz/regressions/TARGET/ and `cargo test -p kvlab-fuzz` replays it from then on.
# FUZZ_SEED=N fixes libFuzzer's random seed (CI uses 1, so its short run explores the same
# way each time); unset, every run explores differently.
# Prints one line per target: executions, coverage (edges), features and corpus size.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request reply meta session rest)

command -v cargo-fuzz >/dev/null || cargo install -q cargo-fuzz --locked
cargo fuzz build -s none -O

max_len() {
  case $1 in
    meta) echo 1024 ;;
    rest) echo 4096 ;;
    *) echo 8192 ;;
  esac
}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t" "artifacts/$t"
  log="$scratch/$t.log"
  if cargo fuzz run -s none -O "$t" "$scratch/$t" "corpus/$t" -- \
      -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout=10 -seed="${FUZZ_SEED:-0}" \
      -print_final_stats=1 >"$log" 2>&1; then
    runs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | tail -1 | awk '{print $2}')
    final=$(grep -E '#[0-9]+[[:space:]]+DONE' "$log" | tail -1 | grep -o 'cov: [0-9]* ft: [0-9]* corp: [0-9]*/[0-9A-Za-z]*')
    echo "$t: ${seconds}s, ${runs:-?} executions, $final"
    if [ "${MERGE:-0}" = 1 ]; then
      cargo fuzz run -s none -O "$t" "corpus/$t" "$scratch/$t" -- -merge=1 \
        -max_len="$(max_len "$t")" >"$scratch/$t.merge" 2>&1
      echo "$t: corpus now $(find "corpus/$t" -type f | wc -l) inputs"
    fi
  else
    failed=1
    echo "$t: FAILED; input in fuzz/artifacts/$t/ — the log:"
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' -A3 "$log" | head -30
  fi
done
exit $failed
