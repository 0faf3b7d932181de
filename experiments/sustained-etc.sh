#!/usr/bin/env bash
# Sustained throughput of kvlab server, cold cache vs warm cache, over the memcached protocol
# and over HTTP (issue 6).
#
# Workload: Facebook ETC key/value sizes, mix get=21,delete=8,set=1, uniform keys.
# Each of the four searches runs against a FRESH `kvlab server` (so "cold" really is empty):
#   cold: --noload            (every get misses until a set lands)
#   warm: the key space is set first (the bench's load phase), and again before every step
#         (--reload-each-step): with 8 deletes per 30 requests the cache would otherwise
#         empty itself within the first steps of the search and "warm" would turn cold.
# The search: largest open-loop rate whose mean latency from the planned send is below
# $BOUND with >= 99 % of planned requests answered (kvlab bench --find-sustained).
#
# (The REST listener sets TCP_NODELAY; without it a response that follows another on the same
# connection waited ~40 ms for the client's delayed ACK, which this script first exposed.)
#
# Usage: experiments/sustained-etc.sh            (builds target/release/kvlab if missing)
# Env:   KVLAB (binary), BOUND (1ms), KEYS (100000), STEP (2 seconds per step),
#        CONNS (connections per thread, 8), THREADS (generator threads, 1),
#        DEPTH (requests in flight per connection, 1: arrivals stay independent; larger
#        values let requests queue up and leave as pipelined bursts at high rates),
#        SERVER_THREADS (4), SERVER_MEM (MiB, 64), OUT (directory for JSON/CSV, ./sustained-out)
set -euo pipefail
cd "$(dirname "$0")/.."
KVLAB=${KVLAB:-target/release/kvlab}
BOUND=${BOUND:-1ms}
KEYS=${KEYS:-100000}
STEP=${STEP:-2}
CONNS=${CONNS:-8}
DEPTH=${DEPTH:-1}
THREADS=${THREADS:-1}
SERVER_THREADS=${SERVER_THREADS:-4}
SERVER_MEM=${SERVER_MEM:-64}
OUT=${OUT:-sustained-out}
[ -x "$KVLAB" ] || cargo build --release -p kvlab
mkdir -p "$OUT"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits until the server answers `version` on the memcached port (no sleeps as sync).
wait_ready() {
  for _ in $(seq 1 200); do
    if { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null; then
      printf 'version\r\n' >&3
      if timeout 1 head -c 7 <&3 | grep -q VERSION; then exec 3>&-; return 0; fi
      exec 3>&-
    fi
    timeout 0.05 tail -f /dev/null || true   # poll interval while the server starts
  done
  echo "server on port $1 not ready" >&2; return 1
}

declare -A RESULT
for proto in memcached http; do
  for cache in cold warm; do
    mport=$(free_port); hport=$(free_port)
    "$KVLAB" server -l 127.0.0.1 -p "$mport" --http-port "$hport" -t "$SERVER_THREADS" -m "$SERVER_MEM" &
    spid=$!
    trap 'kill $spid 2>/dev/null || true' EXIT
    wait_ready "$mport"
    port=$mport; [ "$proto" = http ] && port=$hport
    load=(--noload); [ "$cache" = warm ] && load=(--load --reload-each-step)
    name="$OUT/$proto-$cache"
    "$KVLAB" bench -s "127.0.0.1:$port" --protocol "$proto" \
      --workload etc --mix get=21,delete=8,set=1 --keys "$KEYS" \
      -T "$THREADS" -c "$CONNS" -d "$DEPTH" --duration "$STEP" \
      --find-sustained --mean-below "$BOUND" "${load[@]}" \
      --json "$name.json" --csv "$name.csv" | tee "$name.txt"
    RESULT[$proto-$cache]=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["searches"][0]; q=s["sustained_qps"]; print("none" if q is None else "%.0f" % q)' "$name.json")
    kill "$spid"; wait "$spid" 2>/dev/null || true
    trap - EXIT
  done
done
echo
echo "sustained throughput (mean latency from planned send < $BOUND), requests/s:"
printf '  %-10s %12s %12s\n' protocol cold warm
for proto in memcached http; do
  printf '  %-10s %12s %12s\n' "$proto" "${RESULT[$proto-cold]}" "${RESULT[$proto-warm]}"
done
