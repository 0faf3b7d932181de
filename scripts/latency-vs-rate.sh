#!/usr/bin/env bash
# The server's latency at fixed rates, alone and beside an idle-priority CPU burner: what
# the control workflow's SLO meets on this machine before any job runs. kvlab server `-t 2`
# on SERVER_CPUS, `kvlab bench` (open loop, 8 connections, the workflow's workload) on
# GEN_CPU, each rate for SECONDS; prints the per-second p95 (from the planned send): its
# median and how many seconds were over SLO_US. With BURNER=1 each rate runs twice more
# beside `chrt -i 0 stress-ng --cpu N` on the server's CPUs (A B A B): on a virtual machine
# whose idle vCPUs halt, the wake-up a sleeping server thread pays can make latency fall as
# the rate rises, and busy idle-priority work can make it shorter.
#
#   scripts/latency-vs-rate.sh [KVLAB]     (default target/release/kvlab)
# Env: RATES ("20000 40000 80000"), SECONDS (20), SLO_US (1000), SERVER_CPUS (0-1),
#      GEN_CPU (1), BURNER (0), PORT (17411).
set -euo pipefail
K=$(realpath "${1:-target/release/kvlab}")
RATES=${RATES:-20000 40000 80000} SECONDS_EACH=${SECONDS:-20} SLO_US=${SLO_US:-1000}
SERVER_CPUS=${SERVER_CPUS:-0-1} GEN_CPU=${GEN_CPU:-1} BURNER=${BURNER:-0} PORT=${PORT:-17411}
dir=$(mktemp -d -t kvlab-latency-vs-rate.XXXXXX)
taskset -c "$SERVER_CPUS" "$K" server -p "$PORT" -t 2 -m 256 >"$dir/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do
  "$K" bench -s "127.0.0.1:$PORT" --keys 1 --requests 1 -q >/dev/null 2>&1 && break
  sleep 0.1
done
W=(--keys 50000 --value-size 100 --mix "get=9,set=1" -T 1 -c 8 --noload)
taskset -c "$GEN_CPU" "$K" bench -s "127.0.0.1:$PORT" --keys 50000 --value-size 100 --load \
  --requests 1 -q >/dev/null
run() { # RATE LABEL
  taskset -c "$GEN_CPU" "$K" bench -s "127.0.0.1:$PORT" "${W[@]}" --qps "$1" \
    --duration "$SECONDS_EACH" --interval 1 --csv "$dir/run.csv" -q >/dev/null
  python3 - "$dir/run.csv" "$1" "$2" "$SLO_US" <<'PY'
import csv, sys
path, rate, label, slo = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
v = sorted(float(r["p95_us"]) for r in csv.DictReader(open(path)) if r["p95_us"])
print(f"{int(rate):>7} req/s {label:<14} per-second p95 median {v[len(v) // 2]:7.0f} µs, "
      f"over {slo:.0f} µs in {sum(x > slo for x in v)} of {len(v)} s")
PY
}
ncpu=$(taskset -c "$SERVER_CPUS" nproc)
for q in $RATES; do
  run "$q" alone
  if [ "$BURNER" = 1 ]; then
    for label in "idle burner" alone "idle burner"; do
      if [ "$label" = alone ]; then run "$q" alone; continue; fi
      chrt -i 0 stress-ng --cpu "$ncpu" --taskset "$SERVER_CPUS" --timeout $((SECONDS_EACH + 3)) \
        >/dev/null 2>&1 &
      burner=$!
      sleep 0.5
      run "$q" "$label"
      wait "$burner" || true
    done
  fi
done
