#!/usr/bin/env bash
# Write throughput of a cluster with two copies of every key against one, side by side:
# PAIRS alternating pairs of 3-node clusters (file topology, `-t 1` nodes), each loaded by
# `kvlab bench --cluster` with WRITERS closed-loop writers (depth 1) for DURATION seconds.
# Prints one line per run (sets/s, errors, the nodes' and the bench's CPU seconds, the nodes'
# CPU time and context switches per set) and the ratio of each pair.
#
#   KVLAB=target/release/kvlab scripts/cluster-copies.sh [PAIRS] [WRITERS] [DURATION]
set -euo pipefail
KVLAB=${KVLAB:-target/release/kvlab}
PAIRS=${1:-3}
WRITERS=${2:-8}
DURATION=${3:-5}
BASE_PORT=${BASE_PORT:-17601}
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

ticks() { # CPU seconds (user + system) of process $1
  awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"
}

switches() { # context switches of every thread of process $1, so far
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { n += $2 } END { print n + 0 }'
}

run() { # replicas -> "sets/s errors nodes_cpu bench_cpu"
  local r=$1 topo="$dir/topology-$1-$RANDOM.json" names=() p
  pids=()
  for i in 0 1 2; do names+=("127.0.0.1:$((BASE_PORT + i))"); done
  "$KVLAB" cluster --topology "$topo" create --replicas "$r" "${names[@]}" >/dev/null
  for i in 0 1 2; do
    p=$((BASE_PORT + i))
    "$KVLAB" server -l 127.0.0.1 -p "$p" -t 1 -m 256 --cluster "$topo" \
      --cluster-node "127.0.0.1:$p" 2>"$dir/node-$r-$i.log" &
    pids+=($!)
  done
  for i in 0 1 2; do
    until printf 'version\r\n' | timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$((BASE_PORT + i)); cat >&3; head -c 7 <&3" >/dev/null 2>&1; do
      sleep 0.1
    done
  done
  sleep 1 # the nodes open their copy streams
  local before=0 after=0 cs0=0 cs1=0
  for p in "${pids[@]}"; do before=$(echo "$before + $(ticks "$p")" | bc); cs0=$((cs0 + $(switches "$p"))); done
  /usr/bin/time -f '%U %S' -o "$dir/bench-time" "$KVLAB" bench --cluster "${names[0]}" \
    --keys 10000 --value-size 100 --mix set=1 -c "$WRITERS" -T 1 --duration "$DURATION" \
    --json "$dir/bench.json" >/dev/null 2>"$dir/bench.log"
  for p in "${pids[@]}"; do after=$(echo "$after + $(ticks "$p")" | bc); cs1=$((cs1 + $(switches "$p"))); done
  for p in "${pids[@]}"; do kill "$p"; done
  wait 2>/dev/null || true
  pids=()
  python3 - "$dir/bench.json" "$(echo "$after - $before" | bc)" "$(cat "$dir/bench-time")" "$((cs1 - cs0))" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
c = r["counters"]
u, s = map(float, sys.argv[3].split())
sets = max(c["sets"], 1)
cpu = float(sys.argv[2])
print(f'{r["throughput_qps"]:.0f} {c["errors"] + c["timeouts"]} {cpu:.1f} {u + s:.1f} '
      f'{cpu / sets * 1e6:.1f} {int(sys.argv[4]) / sets:.2f}')
EOF
}

echo "pair replicas sets/s errors nodes_cpu_s bench_cpu_s nodes_cpu_us_per_set nodes_switches_per_set"
for pair in $(seq 1 "$PAIRS"); do
  read -r one rest <<<"$(run 1)"
  echo "$pair 1 $one $rest"
  read -r two rest <<<"$(run 2)"
  echo "$pair 2 $two $rest"
  echo "$pair ratio $(echo "scale=2; $two / $one" | bc)"
done
