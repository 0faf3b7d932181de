#!/usr/bin/env bash
# Time to add a 4th node to a 3-node kvlab cluster holding KEYS keys of VALUE bytes, under a
# moderate verified open-loop load; throughput and p99 per interval before, during and after
# the migration. Every process runs on this machine (127.0.0.1); each node has one worker
# thread.
#
#   scripts/cluster-add-node.sh [KEYS] [VALUE] [QPS] [TOPOLOGY]
#
# KEYS=1000000 VALUE=100 QPS=20000; TOPOLOGY defaults to a file in a temp dir (pass
# etcd://127.0.0.1:2379/bench to use a running etcd). Needs a release build
# (cargo build --release -p kvlab).
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${1:-1000000}
VALUE=${2:-100}
QPS=${3:-20000}
K=${KVLAB:-target/release/kvlab}
WORK=$(mktemp -d)
TOPOLOGY=${4:-$WORK/topology.json}
BASE=${BASE_PORT:-7301}
trap '$K cluster --topology "$TOPOLOGY" down >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

$K cluster --topology "$TOPOLOGY" up --nodes 3 --base-port "$BASE" -- -t 1 -m 1024 >/dev/null
SEED=127.0.0.1:$BASE
echo "filling $KEYS keys of $VALUE bytes ..."
$K bench --cluster "$SEED" --keys "$KEYS" --value-size "$VALUE" --load --requests 1 \
  -T 1 -c 8 >/dev/null
for n in 0 1 2; do
  printf '  node %s: ' "$((BASE + n))"
  $K cluster --topology "$TOPOLOGY" status --json | python3 -c "
import json,sys; d=json.load(sys.stdin); print(d['nodes']['127.0.0.1:$((BASE + n))']['items'], 'items')"
done

echo "load: open loop $QPS req/s (get=9,set=1, verified) for 24 s; the 4th node joins at ~8 s"
$K bench --cluster "$SEED" --keys "$KEYS" --value-size "$VALUE" --verify --qps "$QPS" \
  --duration 24 --interval 0.5 -T 1 -c 16 --mix get=9,set=1 --json "$WORK/bench.json" \
  >"$WORK/bench.txt" 2>&1 &
BENCH=$!
sleep 8
T0=$(date +%s%3N)
$K cluster --topology "$TOPOLOGY" add --start "127.0.0.1:$((BASE + 3))" -- -t 1 -m 1024 \
  | tee "$WORK/add.txt"
T1=$(date +%s%3N)
wait $BENCH
sed -n '1,6p' "$WORK/bench.txt"
# Every key read back through the ring once the load is over: a miss is a lost write (every
# key was set before the run and nothing deletes), a wrong value a verification error.
$K bench --cluster "$SEED" --keys "$KEYS" --value-size "$VALUE" --key-dist sequential \
  --mix get=1 --verify --requests "$KEYS" --duration 600 -T 1 -c 8 --json "$WORK/readback.json" \
  >/dev/null 2>&1
python3 - "$WORK/readback.json" "$KEYS" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))["runs"][0]["counters"]
print(f"read back {c['gets']} of {sys.argv[2]} keys: lost {c['misses']}, "
      f"wrong {c['verify_errors']}, errors {c['errors']}, timeouts {c['timeouts']}")
EOF
python3 - "$WORK/bench.json" "$T0" "$T1" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]
t0, t1 = int(sys.argv[2]), int(sys.argv[3])
phases = {"before": [], "during": [], "after": []}
for i in run["intervals"]:
    if i["warmup"]:
        continue
    s, e = i["ts_start"], i["ts_end"]
    key = "before" if e <= t0 else "after" if s >= t1 else "during"
    phases[key].append(i)
print(f"{'phase':8} {'intervals':>9} {'req/s':>9} {'p99 µs (worst interval)':>24} {'errors':>7}")
for k, iv in phases.items():
    if not iv:
        continue
    qps = sum(i["achieved_qps"] for i in iv) / len(iv)
    p99 = max(i["latency"]["p99_us"] for i in iv)
    err = sum(i["counters"]["errors"] for i in iv)
    print(f"{k:8} {len(iv):9} {qps:9.0f} {p99:24.0f} {err:7}")
c = run["counters"]
print(f"whole run: errors {c['errors']} (verification {c['verify_errors']}), "
      f"misses {c['misses']}, timeouts {c['timeouts']}, redirects followed {c.get('redirects', 0)}")
EOF
