#!/usr/bin/env bash
# The largest open-loop rate with p95 < BOUND for each I/O model, of two kvlab builds side by
# side (A B A B ...), with 95 % confidence intervals over REPS repetitions. A benchmark, not a
# test: it answers "did a change cost speed?" for every I/O model.
#
#   scripts/sustained-ab.sh A_BIN B_BIN [A_NAME] [B_NAME]
#
# For every model and repetition, each build in turn: a fresh server pinned to CPU $SERVER_CPU
# (`kvlab server --io MODEL -t $THREADS -m 256`), then, from ONE client (A_BIN's `kvlab bench`,
# the same for both builds) pinned to CPU $CLIENT_CPU:
#   1. `kvlab bench --find-sustained --p95-below $BOUND` (1 KB values, get:set 90:10, $KEYS keys,
#      -c $CONNS, 1 s steps): the largest rate whose p95 from the planned send stays below the
#      bound with >= 99 % of planned requests answered;
#   2. a $CONFIRM s run at that rate, during which each process's CPU is read from
#      /proc/PID/stat, so the table says which side was the bottleneck (the regime).
# Env: MODELS ("reactor threaded epoll signal"), REPS (3), BOUND (1ms), KEYS (10000), CONNS (16),
#      THREADS (1), CONFIRM (3), SERVER_CPU (1), CLIENT_CPU (0), EXTRA (more server flags,
#      e.g. "--data-dir {dir} --durability interval": {dir} becomes a fresh temp dir).
# Bounded: every bench runs under `timeout`.
set -euo pipefail
A=$1 B=$2 AN=${3:-before} BN=${4:-after}
MODELS=${MODELS:-reactor threaded epoll signal}
REPS=${REPS:-3} BOUND=${BOUND:-1ms} KEYS=${KEYS:-10000} CONNS=${CONNS:-16} THREADS=${THREADS:-1}
CONFIRM=${CONFIRM:-3} SERVER_CPU=${SERVER_CPU:-1} CLIENT_CPU=${CLIENT_CPU:-0} EXTRA=${EXTRA:-}
OUT=$(mktemp -d -t kvlab-sustained-ab.XXXXXX)
echo "raw results in $OUT; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }   # utime + stime of a process, clock ticks
hz=$(getconf CLK_TCK)

# run_one BIN MODEL REP -> appends "model name rep sustained server_cpu% client_cpu%" to $OUT/rows
run_one() {
  local bin=$1 name=$2 model=$3 rep=$4 dir extra log port srv
  dir=$(mktemp -d -p "$OUT") extra=${EXTRA//\{dir\}/$dir} log="$OUT/$name-$model-$rep"
  # shellcheck disable=SC2086
  taskset -c "$SERVER_CPU" "$bin" server -p 0 -t "$THREADS" -m 256 --io "$model" $extra 2>"$log.server" &
  srv=$!
  for _ in $(seq 200); do
    port=$(grep -o '127.0.0.1:[0-9]*' "$log.server" 2>/dev/null | head -1 || true)
    [ -n "$port" ] && break
    timeout 0.05 tail -f /dev/null || true   # poll while the server starts
  done
  [ -n "$port" ] || { echo "server $name $model did not start" >&2; kill "$srv"; return 1; }
  timeout 120 taskset -c "$CLIENT_CPU" "$A" bench -s "$port" -q --find-sustained --p95-below "$BOUND" \
    --qps-min 8000 --max-time 60 --duration 1 --value-size 1024 --mix get=9,set=1 --keys "$KEYS" \
    -c "$CONNS" --json "$log.search.json" >"$log.search.txt" 2>&1 || true
  local rate
  rate=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["searches"][0]["sustained_qps"] or 0))' "$log.search.json")
  # The confirmation run at the sustained rate, with both processes' CPU.
  local s0 t0 c0 s1 t1 cl
  # (no `timeout` wrapper: its pid would be read instead of the client's; --duration bounds it)
  taskset -c "$CLIENT_CPU" "$A" bench -s "$port" -q --noload --qps "$rate" --duration "$CONFIRM" \
    --value-size 1024 --mix get=9,set=1 --keys "$KEYS" -c "$CONNS" --json "$log.confirm.json" >"$log.confirm.txt" 2>&1 &
  cl=$!
  s0=$(ticks "$srv") t0=$(date +%s.%N) c0=$(ticks "$cl")
  local c1=$c0
  while kill -0 "$cl" 2>/dev/null; do
    c1=$(ticks "$cl" 2>/dev/null || echo "$c1") s1=$(ticks "$srv") t1=$(date +%s.%N)
    timeout 0.2 tail -f /dev/null || true
  done
  wait "$cl" || true
  kill "$srv"; wait "$srv" 2>/dev/null || true
  python3 - "$model" "$name" "$rep" "$rate" "$s0" "$s1" "$c0" "$c1" "$t0" "$t1" "$hz" >>"$OUT/rows" <<'EOF'
import sys
m, n, r, rate, s0, s1, c0, c1, t0, t1, hz = sys.argv[1:]
dt = float(t1) - float(t0)
cpu = lambda a, b: 100.0 * (int(b) - int(a)) / int(hz) / dt if dt > 0 else 0.0
print(m, n, r, rate, f"{cpu(s0, s1):.0f}", f"{cpu(c0, c1):.0f}")
EOF
  tail -1 "$OUT/rows" >&2
}

for model in $MODELS; do
  for rep in $(seq "$REPS"); do
    run_one "$A" "$AN" "$model" "$rep"
    run_one "$B" "$BN" "$model" "$rep"
  done
done

python3 - "$OUT/rows" "$AN" "$BN" "$BOUND" <<'EOF'
import sys, statistics as st
from collections import defaultdict
rows = [l.split() for l in open(sys.argv[1])]
an, bn, bound = sys.argv[2], sys.argv[3], sys.argv[4]
t975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
by = defaultdict(list)
for m, n, r, rate, scpu, ccpu in rows:
    by[(m, n)].append((float(rate), float(scpu), float(ccpu)))
def ci(xs):
    mean = st.mean(xs)
    half = t975.get(len(xs) - 1, 1.96) * st.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")
    return mean, half
print(f"| I/O model | {an}: sustained req/s (95 % CI) | {bn}: sustained req/s (95 % CI) | {bn}/{an} | server CPU % {an} / {bn} | client CPU % {an} / {bn} |")
print("|---|---:|---:|---:|---:|---:|")
for m in dict.fromkeys(r[0] for r in rows):
    a, b = by[(m, an)], by[(m, bn)]
    (ma, ha), (mb, hb) = ci([x[0] for x in a]), ci([x[0] for x in b])
    sa, sb = st.mean(x[1] for x in a), st.mean(x[1] for x in b)
    ca, cb = st.mean(x[2] for x in a), st.mean(x[2] for x in b)
    print(f"| {m} | {ma:,.0f} ± {ha:,.0f} | {mb:,.0f} ± {hb:,.0f} | {mb / ma:.3f} | {sa:.0f} / {sb:.0f} | {ca:.0f} / {cb:.0f} |")
print(f"\n(p95 < {bound}, 1 KB values, get:set 90:10; every run: {' '.join(f'{r[0]}/{r[1]}/{r[2]}={r[3]}' for r in rows)})")
EOF
