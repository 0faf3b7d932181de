#!/usr/bin/env bash
# Write throughput of a cluster with two copies of every key against one, side by side:
# PAIRS alternating pairs of 3-node clusters (file topology, `-t 1` nodes), each loaded by
# WRITERS closed-loop writers (depth 1, 100-byte values over 10,000 keys) for DURATION
# seconds. The client: `kvlab bench --cluster` (CLIENT=kvlab, the default), or memcaslap
# from libmemcached-tools through `kvlab proxy --cluster` (CLIENT=memcaslap; the proxy, one
# thread, is counted with the client). Prints one line per run (sets/s, errors, the nodes'
# and the client's CPU seconds, the nodes' CPU time and context switches per set) and the
# ratio of each pair. POLICY=owner creates the clusters with `--write-policy owner` (a write
# acknowledged once its owner applied it; default: all, once every copy is confirmed).
#
#   KVLAB=target/release/kvlab [CLIENT=kvlab|memcaslap] [POLICY=all|owner] scripts/cluster-copies.sh [PAIRS] [WRITERS] [DURATION]
set -euo pipefail
KVLAB=${KVLAB:-target/release/kvlab}
PAIRS=${1:-3}
WRITERS=${2:-8}
DURATION=${3:-5}
BASE_PORT=${BASE_PORT:-17601}
CLIENT=${CLIENT:-kvlab}
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
  "$KVLAB" cluster --topology "$topo" create --replicas "$r" \
    ${POLICY:+--write-policy "$POLICY"} "${names[@]}" >/dev/null
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
  if [ "$CLIENT" = memcaslap ]; then
    local proxy=$((BASE_PORT + 9)) px p0 pcpu
    "$KVLAB" proxy -l 127.0.0.1 -p "$proxy" -t 1 --cluster "${names[0]}" --no-record \
      2>"$dir/proxy-$r.log" &
    px=$!
    until (exec 3<>"/dev/tcp/127.0.0.1/$proxy") 2>/dev/null; do sleep 0.1; done
    printf 'key\n32 32 1\nvalue\n100 100 1\ncmd\n0 1\n1 0\n' >"$dir/sets.cfg"
    p0=$(ticks "$px")
    /usr/bin/time -f '%U %S' -o "$dir/bench-time" memcaslap -s "127.0.0.1:$proxy" \
      -F "$dir/sets.cfg" -T 1 -c "$WRITERS" -t "${DURATION}s" -S "${DURATION}s" \
      >"$dir/caslap.txt" 2>&1
    pcpu=$(echo "$(ticks "$px") - $p0" | bc)
    kill "$px"
  else
    /usr/bin/time -f '%U %S' -o "$dir/bench-time" "$KVLAB" bench --cluster "${names[0]}" \
      --keys 10000 --value-size 100 --mix set=1 -c "$WRITERS" -T 1 --duration "$DURATION" \
      --json "$dir/bench.json" >/dev/null 2>"$dir/bench.log"
  fi
  for p in "${pids[@]}"; do after=$(echo "$after + $(ticks "$p")" | bc); cs1=$((cs1 + $(switches "$p"))); done
  for p in "${pids[@]}"; do kill "$p"; done
  wait 2>/dev/null || true
  pids=()
  if [ "$CLIENT" = memcaslap ]; then
    # memcaslap's "Run time: 4.0s Ops: N TPS: X Net_rate: ..." line.
    python3 - "$dir/caslap.txt" "$(echo "$after - $before" | bc)" "$(cat "$dir/bench-time")" \
      "$((cs1 - cs0))" "$pcpu" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"Run time: ([0-9.]+)s Ops: (\d+) TPS: (\d+)", t)
if not m:
    sys.exit("memcaslap printed no totals:\n" + t)
ops, tps = int(m.group(2)), int(m.group(3))
u, s = map(float, sys.argv[3].split())
cpu = float(sys.argv[2])
client = u + s + float(sys.argv[5])
print(f"{tps} - {cpu:.1f} {client:.1f} {cpu / max(ops, 1) * 1e6:.1f} {int(sys.argv[4]) / max(ops, 1):.2f}")
EOF
    return
  fi
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

echo "client: $CLIENT"
echo "pair replicas sets/s errors nodes_cpu_s client_cpu_s nodes_cpu_us_per_set nodes_switches_per_set"
for pair in $(seq 1 "$PAIRS"); do
  read -r one rest <<<"$(run 1)"
  echo "$pair 1 $one $rest"
  read -r two rest <<<"$(run 2)"
  echo "$pair 2 $two $rest"
  echo "$pair ratio $(echo "scale=2; $two / $one" | bc)"
done
