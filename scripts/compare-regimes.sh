#!/usr/bin/env bash
# kvlab server against Debian's memcached, side by side (A B A B ...), in named regimes, so no
# ratio is read out of context. Server and client are pinned to separate cores and each
# process's CPU is read during every run, which says which side was the bottleneck.
#
#   scripts/compare-regimes.sh [KVLAB_BIN=target/release/kvlab]
#
# Both servers: `-t $THREADS -m 256`, pinned to CPU $SERVER_CPU. Clients, pinned to CPU
# $CLIENT_CPU, closed loop, 90:10 get:set, 100 B values, $KEYS keys:
#   depth1     kvlab bench -T 1 -c 50 -d 1     (one request in flight per connection)
#   pipelined  kvlab bench -T 1 -c 4 -d 16     (16 in flight per connection)
#   memcaslap  memcaslap -T 1 -c 50            (a second, independent client, depth 1)
# Each regime: $REPS rounds of (kvlab, memcached), $SECS s each; the table gives medians.
# Env: REPS (3), SECS (8), THREADS (1), KEYS (100000), SERVER_CPU (1), CLIENT_CPU (0),
#      REGIMES ("depth1 pipelined memcaslap").
set -euo pipefail
cd "$(dirname "$0")/.."
KV=${1:-target/release/kvlab}
REPS=${REPS:-3} SECS=${SECS:-8} THREADS=${THREADS:-1} KEYS=${KEYS:-100000}
SERVER_CPU=${SERVER_CPU:-1} CLIENT_CPU=${CLIENT_CPU:-0}
REGIMES=${REGIMES:-depth1 pipelined memcaslap}
OUT=$(mktemp -d -t kvlab-regimes.XXXXXX)
echo "raw results in $OUT; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    timeout 0.05 tail -f /dev/null || true   # poll while the server starts
  done
  echo "nothing listens on $1" >&2; return 1
}
kv_port=$(free_port) mc_port=$(free_port)
taskset -c "$SERVER_CPU" "$KV" server -p "$kv_port" -t "$THREADS" -m 256 2>/dev/null & kv=$!
as_root=(); [ "$(id -u)" = 0 ] && as_root=(-u root)
taskset -c "$SERVER_CPU" memcached "${as_root[@]}" -U 0 -l 127.0.0.1 -p "$mc_port" -t "$THREADS" -m 256 & mc=$!
trap 'kill $kv $mc 2>/dev/null; wait 2>/dev/null' EXIT
wait_port "$kv_port"; wait_port "$mc_port"
for p in "$kv_port" "$mc_port"; do   # both servers hold every key before the first run
  taskset -c "$CLIENT_CPU" "$KV" populate -s "127.0.0.1:$p" --keys "$KEYS" --value-size 100 >/dev/null 2>&1
done

# one REGIME SERVER_NAME PORT SERVER_PID REP -> a row: regime server rep throughput p99_us server% client%
one() {
  local regime=$1 name=$2 port=$3 spid=$4 rep=$5 log="$OUT/$1-$2-$5" s0 s1 t0 t1 tput p99 ccpu
  s0=$(ticks "$spid") t0=$(date +%s.%N)
  case $regime in
    depth1|pipelined)
      local c=50 d=1; [ "$regime" = pipelined ] && c=4 d=16
      taskset -c "$CLIENT_CPU" "$KV" bench -s "127.0.0.1:$port" -q --noload -T 1 -c $c -d $d \
        --duration "$SECS" --keys "$KEYS" --value-size 100 --mix get=9,set=1 --json "$log.json" >"$log.txt" 2>&1
      read -r tput p99 ccpu < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["runs"][0]; print(r["throughput_qps"], r["latency"]["p99_us"], 100*sum(r["thread_cpu"]))' "$log.json")
      ;;
    memcaslap)
      /usr/bin/time -f "%U %S %e" -o "$log.time" taskset -c "$CLIENT_CPU" \
        timeout $((SECS + 30)) memcaslap -s "127.0.0.1:$port" -t "${SECS}s" -c 50 -T 1 >"$log.txt" 2>&1 || true
      tput=$(awk '/^Run time/ {print $7}' "$log.txt")
      p99=NA
      ccpu=$(awk '{printf "%.0f", 100 * ($1 + $2) / $3}' "$log.time")
      ;;
  esac
  s1=$(ticks "$spid") t1=$(date +%s.%N)
  python3 -c 'import sys; r,n,k,tp,p,c,s0,s1,t0,t1,hz=sys.argv[1:]; print(r,n,k,tp,p, f"{100*(int(s1)-int(s0))/int(hz)/(float(t1)-float(t0)):.0f}", f"{float(c):.0f}")' \
    "$regime" "$name" "$rep" "$tput" "$p99" "$ccpu" "$s0" "$s1" "$t0" "$t1" "$hz" | tee -a "$OUT/rows" >&2
}

for regime in $REGIMES; do
  for rep in $(seq "$REPS"); do
    one "$regime" kvlab "$kv_port" "$kv" "$rep"
    one "$regime" memcached "$mc_port" "$mc" "$rep"
  done
done

python3 - "$OUT/rows" "$THREADS" "$SECS" "$REPS" <<'EOF'
import sys, statistics as st
from collections import defaultdict
rows = [l.split() for l in open(sys.argv[1])]
threads, secs, reps = sys.argv[2:]
by = defaultdict(list)
for reg, name, rep, tput, p99, scpu, ccpu in rows:
    by[(reg, name)].append((float(tput), None if p99 == "NA" else float(p99), float(scpu), float(ccpu)))
med = lambda xs: st.median(xs) if xs else float("nan")
def regime_of(s, c):
    return "server-bound" if s >= 90 and c < 90 else "client-bound" if c >= 90 and s < 90 else "both saturated" if s >= 90 else "neither saturated"
print("| regime | server | throughput (req/s, median) | p99 (µs) | server CPU % | client CPU % | bottleneck | kvlab/memcached |")
print("|---|---|---:|---:|---:|---:|---|---:|")
for reg in dict.fromkeys(r[0] for r in rows):
    k = med([x[0] for x in by[(reg, "kvlab")]])
    m = med([x[0] for x in by[(reg, "memcached")]])
    for name in ("kvlab", "memcached"):
        xs = by[(reg, name)]
        p99s = [x[1] for x in xs if x[1] is not None]
        s, c = med([x[2] for x in xs]), med([x[3] for x in xs])
        ratio = f"**{k / m:.3f}**" if name == "kvlab" else ""
        p99 = f"{med(p99s):,.0f}" if p99s else "—"
        print(f"| {reg} | {name} | {med([x[0] for x in xs]):,.0f} | {p99} | {s:.0f} | {c:.0f} | {regime_of(s, c)} | {ratio} |")
print(f"\n(servers -t {threads} -m 256 pinned to one core, client pinned to the other; {reps} alternating {secs} s runs per regime; runs: "
      + "; ".join(f"{r[0]}/{r[1]}/{r[2]}={float(r[3]):.0f}" for r in rows) + ")")
EOF
