#!/usr/bin/env bash
# How much CPU a cache's load leaves to batch work at idle priority, per request rate: the
# most `kvlab control --idle-jobs` can give its jobs. A kvlab server (`-t 2`) on CPUS, the
# load (`kvlab bench`, open loop, 8 connections, 50k keys, 100 B, get=9,set=1) on
# GENERATOR_CPUS, and at each rate an idle-priority CPU burner (`stress-ng --cpu N` under
# `chrt -i 0`, one worker per CPU) whose work per second is compared with its work with no
# load at all. Idle cores = that fraction times the CPUs. The burner keeps no cache warm
# and scales perfectly, so real jobs get at most this.
#
#   KVLAB=target/release/kvlab [CPUS=0-1] [GENERATOR_CPUS=1] [DURATION=10] \
#     scripts/idle-capacity.sh [RATE...]
#
# Rates default to 10000 20000 ... 80000 (control-workflow's trace spans 10k-80k req/s).
# Needs stress-ng.
set -euo pipefail
KVLAB=${KVLAB:-target/release/kvlab}
CPUS=${CPUS:-0-1}
GENERATOR_CPUS=${GENERATOR_CPUS:-1}
SECONDS_PER_RATE=${DURATION:-10}
PORT=${PORT:-11391}
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(10000 20000 30000 40000 50000 60000 70000 80000)
command -v stress-ng >/dev/null || { echo "idle-capacity.sh needs stress-ng" >&2; exit 1; }
n=$(taskset -c "$CPUS" nproc)

server=""
cleanup() { [ -z "$server" ] || kill "$server" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

burn() { # the idle-priority burner's bogo-ops per second over SECONDS_PER_RATE
  chrt -i 0 taskset -c "$CPUS" stress-ng --cpu "$n" --cpu-method int64 \
    -t "$SECONDS_PER_RATE" --metrics-brief 2>&1 | awk '$4 == "cpu" { print $9 }'
}

alone=$(burn)
echo "alone: $alone bogo-ops/s on $n CPU(s) ($CPUS)"
taskset -c "$CPUS" "$KVLAB" server -p "$PORT" -t 2 -m 256 >/dev/null 2>&1 &
server=$!
# Ready when it answers `version` (bounded: 10 s, or at once if it exited, e.g. port in use).
for _ in $(seq 100); do
  kill -0 "$server" 2>/dev/null || { echo "kvlab server on port $PORT exited" >&2; exit 1; }
  printf 'version\r\n' | timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT; cat >&3; head -c 7 <&3" \
    >/dev/null 2>&1 && break
  sleep 0.1
done
printf '%8s %10s %11s %s\n' "req/s" "achieved" "idle cores" "load p95 (µs)"
for q in "${rates[@]}"; do
  json=$(mktemp)
  taskset -c "$GENERATOR_CPUS" "$KVLAB" bench -s "127.0.0.1:$PORT" --qps "$q" \
    --duration $((SECONDS_PER_RATE + 4)) -c 8 --keys 50000 --value-size 100 \
    --mix get=9,set=1 --json "$json" >/dev/null 2>&1 &
  bench=$!
  sleep 2
  got=$(burn)
  wait "$bench"
  read -r achieved p95 < <(python3 -c 'import json,sys
r=json.load(open(sys.argv[1]))["runs"][0]
print(round(r["throughput_qps"]), round(r["latency"]["p95_us"]))' "$json")
  rm -f "$json"
  awk -v q="$q" -v a="$alone" -v g="$got" -v n="$n" -v ach="$achieved" -v p="$p95" \
    'BEGIN { printf "%8d %10s %11.2f %s\n", q, ach, g / a * n, p }'
done
