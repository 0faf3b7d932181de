#!/usr/bin/env bash
# I/O-model comparison of kvlab server with durability on (issue 5). Results: docs/io-models.md.
#
# For each I/O model (--io reactor|threaded|epoll|signal), every server started fresh with
#   --data-dir $(mktemp -d) --durability interval -t 2 -m 256
# 1. Sustainable rate (all models first), on the REFERENCE workload (1 KB values, get:set 90:10, --hot 0.1:0.9,
#    $KEYS keys set first with `kvlab populate`): `kvlab bench --find-sustained --p95-below
#    $BOUND`, i.e. the largest open-loop (Poisson) offered rate whose p95 latency from the
#    planned send stays under $BOUND while >= 99 % of the planned requests are answered
#    (achieved within 1 % of the offer). One search per model, not per cell (time budget).
# 2. Nine cells: values 100 B, 1 KB, 10 KB x get:set 90:10, 10:90, 50:50, keys --hot 0.1:0.9
#    (10 % of the keys get 90 % of the requests), open loop at 80 % of the model's sustained
#    rate, $WARM s warm-up then $DUR s measured. One fresh server per value size, filled with
#    `kvlab populate` ($KEYS keys of that size, so gets hit and everything fits in -m 256);
#    the models take turns within each value size (so background load hits all alike);
#    the three mixes then run on it in turn, after $SETTLE s of unmeasured load (the write-back
#    of what populate set).
# Prints a markdown table: p50/p95 of gets and of sets (µs, from the planned send time).
#
# Usage: experiments/io-models.sh        (builds target/release/kvlab first)
# Env:   BOUND (1ms), KEYS (10000), DUR (5 s), WARM (1 s), SETTLE (3 s), STEP (search step, 2 s),
#        SEARCH_MAX (search budget per model, 75 s), CONNS (bench connections, 8),
#        MODELS ("reactor threaded epoll signal"), OUT (raw JSON; default a temp dir)
# Bounded: every bench and populate runs under `timeout`; about 10-12 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
KVLAB=target/release/kvlab
BOUND=${BOUND:-1ms}
KEYS=${KEYS:-10000}
DUR=${DUR:-5}
WARM=${WARM:-1}
SETTLE=${SETTLE:-3}
STEP=${STEP:-2}
SEARCH_MAX=${SEARCH_MAX:-75}
CONNS=${CONNS:-8}
MODELS=${MODELS:-reactor threaded epoll signal}
OUT=${OUT:-$(mktemp -d -t kvlab-io-models.XXXXXX)}
SIZES=(100 1024 10240)
CELL_TIMEOUT=$(python3 -c "import sys; print(int(float(sys.argv[1]) + float(sys.argv[2])) + 60)" "$DUR" "$WARM")
MIXES=(get=9,set=1 get=1,set=9 get=5,set=5)

cargo build --release -p kvlab >&2
mkdir -p "$OUT"
echo "raw results in $OUT; load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores" >&2
T0=$(date +%s)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits until the server answers `version` (a readiness probe, bounded to ~10 s).
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

SPID=""; DATA=""
stop_server() {
  if [ -n "$SPID" ]; then kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; fi
  if [ -n "$DATA" ]; then rm -rf "$DATA"; fi
  SPID=""; DATA=""
}
trap stop_server EXIT

# start_server MODEL: a fresh durable server; sets PORT.
start_server() {
  PORT=$(free_port); DATA=$(mktemp -d -t kvlab-io-data.XXXXXX)
  "$KVLAB" server -l 127.0.0.1 -p "$PORT" --io "$1" -t 2 -m 256 \
    --data-dir "$DATA" --durability interval 2>"$OUT/server-$1.log" &
  SPID=$!
  wait_ready "$PORT"
}

# populate SIZE: sets the key space with values of SIZE bytes.
populate() {
  timeout 120 "$KVLAB" populate -s "127.0.0.1:$PORT" --keys "$KEYS" --value-size "$1" \
    -c 4 >"$OUT/populate.log" 2>&1 || { cat "$OUT/populate.log" >&2; return 1; }
}

declare -A SUST RATE ROW
# 1. The sustainable rate of every model on the reference workload.
for model in $MODELS; do
  start_server "$model"
  populate 1024
  echo "[$(( $(date +%s) - T0 )) s] $model: searching the sustainable rate" >&2
  timeout $((SEARCH_MAX + 60)) "$KVLAB" bench -s "127.0.0.1:$PORT" --noload -q \
    --keys "$KEYS" --value-size 1024 --mix get=9,set=1 --hot 0.1:0.9 -T 1 -c "$CONNS" \
    --find-sustained --p95-below "$BOUND" --duration "$STEP" --max-time "$SEARCH_MAX" \
    --json "$OUT/$model-search.json" >"$OUT/$model-search.txt"
  stop_server
  SUST[$model]=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["searches"][0]; q=s["sustained_qps"]; print(0 if q is None else round(q))' "$OUT/$model-search.json")
  if [ "${SUST[$model]}" = 0 ]; then
    echo "$model: no rate sustained; cells measured at 800 req/s" >&2
  fi
  RATE[$model]=$(python3 -c "import sys; s=int(sys.argv[1]); print(round(0.8*s) if s else 800)" "${SUST[$model]}")
  echo "[$(( $(date +%s) - T0 )) s] $model: sustained ${SUST[$model]} req/s; cells at ${RATE[$model]} req/s" >&2
done

# 2. The nine cells at 80 % of each model's rate. Models take turns within each value size,
# so that load from other processes on the machine spreads over all of them alike.
for size in "${SIZES[@]}"; do
  for model in $MODELS; do
    rate=${RATE[$model]}
    start_server "$model"
    populate "$size"
    # Settle, unmeasured: populate leaves up to 100 MB dirty for the write-back flusher;
    # run the first mix for $SETTLE s so the cells see the flusher in its steady state.
    timeout "$CELL_TIMEOUT" "$KVLAB" bench -s "127.0.0.1:$PORT" --noload -q \
      --keys "$KEYS" --value-size "$size" --mix "${MIXES[0]}" --hot 0.1:0.9 -T 1 -c "$CONNS" \
      --qps "$rate" --duration "$SETTLE" >/dev/null
    for mix in "${MIXES[@]}"; do
      name="$OUT/$model-$size-${mix//[=,]/_}"
      timeout "$CELL_TIMEOUT" "$KVLAB" bench -s "127.0.0.1:$PORT" --noload -q \
        --keys "$KEYS" --value-size "$size" --mix "$mix" --hot 0.1:0.9 -T 1 -c "$CONNS" \
        --qps "$rate" --warmup "$WARM" --duration "$DUR" --json "$name.json" >"$name.txt"
      ROW[$model-$size-$mix]=$(python3 - "$name.json" "$model" "$size" "$mix" "${SUST[$model]}" "$rate" <<'PY'
import json, sys
path, model, size, mix, sust, rate = sys.argv[1:]
r = json.load(open(path))["runs"][0]
by = r["latency_by_op"]
g, s = by.get("get"), by.get("set")
mix = ":".join(x.split("=")[1] for x in mix.split(","))
f = lambda p, k: "%.0f" % p[k] if p else "-"
c = r["counters"]
hit = 100.0 * c["hits"] / max(1, c["hits"] + c["misses"])
print("| %s | %s | %s | %s | %s | %.0f | %s / %s | %s / %s | %.1f | %d |" % (
    model, size, mix, sust, rate, r["throughput_qps"],
    f(g, "p50_us"), f(g, "p95_us"), f(s, "p50_us"), f(s, "p95_us"),
    hit, c["errors"] + c["timeouts"]))
PY
)
      echo "[$(( $(date +%s) - T0 )) s] ${ROW[$model-$size-$mix]}" >&2
    done
    stop_server
  done
done

echo
echo "Sustainable rate: largest open-loop offered rate with p95 (from the planned send) < $BOUND"
echo "and >= 99 % of planned requests answered, on 1 KB values, get:set 90:10, --hot 0.1:0.9."
echo "Cells: open loop at 80 % of it, ${WARM} s warm-up + ${DUR} s measured; latencies in µs."
echo
echo "| I/O model | value (B) | get:set | sustained (req/s) | offered (req/s) | achieved (req/s) | get p50 / p95 (µs) | set p50 / p95 (µs) | get hits (%) | errors+timeouts |"
echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
for model in $MODELS; do
  for size in "${SIZES[@]}"; do
    for mix in "${MIXES[@]}"; do echo "${ROW[$model-$size-$mix]}"; done
  done
done
echo
echo "total $(( $(date +%s) - T0 )) s; load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
