#!/usr/bin/env bash
# kvlab proxy against twemproxy (Debian's nutcracker), both in front of the same memcached
# backends on this machine, loaded by the same client (kvlab bench: 1 thread x 50
# connections, 1:10 set:get, 100-byte values), A B A B, median of ROUNDS; depth 1 and 16.
# Then going direct to one of the memcached backends (the proxy's cost), and the fully
# replicated setup (3 backends, R = 3: every set to all three, gets spread over them). Prints
# a Markdown table with each process's CPU (% of one core, from /proc) so the regime of every
# ratio is on record, and the whole machine's busy CPU per request (user, system, irq and
# softirq time of both cores over the run, /proc/stat: what a request costs everything on the
# box together, the kernel's loopback TCP work included) and its steal time (% of the run the
# hypervisor gave the cores to others: rounds with much of it are noise).
#
#   scripts/proxy-vs-twemproxy.sh            # needs memcached, nutcracker (.ci/run installs them)
#   ROUNDS=5 SECONDS_PER_RUN=10 scripts/proxy-vs-twemproxy.sh
#   WORKERS="1 2" scripts/proxy-vs-twemproxy.sh   # a kvlab proxy per -t, each in the rotation
#   VARIANT="--no-record" WORKERS=1 DEPTHS=16 scripts/proxy-vs-twemproxy.sh
#       # one more kvlab proxy (-t of the first of WORKERS) with these flags in the rotation:
#       # what a flag costs or saves, measured side by side
#   VARIANT_BIN=/tmp/kvlab-before WORKERS=1 scripts/proxy-vs-twemproxy.sh
#       # the variant proxy from another build: a change's effect, side by side
#   CLIENT=memcaslap DEPTHS=1 scripts/proxy-vs-twemproxy.sh
#       # the same closed loop driven by another client (libmemcached-tools' memcaslap: 1
#       # thread x 50 connections, one request in flight each, 100 B values, get:set 10:1;
#       # depth 1 only): a ratio one client alone shows is not yet a claim. Its latency
#       # column is memcaslap's mean (it reports no percentiles).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_PER_RUN:-5}
WORKERS=${WORKERS:-1 2}
DEPTHS=${DEPTHS:-1 16}
CLIENT=${CLIENT:-kvlab}
case "$CLIENT" in
  kvlab) lat="p99 µs" ;;
  memcaslap) lat="mean µs"
    command -v memcaslap >/dev/null || { echo "memcaslap missing: apt-get install libmemcached-tools" >&2; exit 1; }
    [ "$DEPTHS" = 1 ] || { echo "memcaslap keeps one request in flight per connection: DEPTHS=1" >&2; exit 1; } ;;
  *) echo "CLIENT: kvlab or memcaslap" >&2; exit 1 ;;
esac
VARIANT=${VARIANT:-}
KVLAB=${KVLAB:-target/release/kvlab}
VARIANT_BIN=${VARIANT_BIN:-$KVLAB}
variant=""
if [ -n "$VARIANT" ] || [ "$VARIANT_BIN" != "$KVLAB" ]; then variant="kvlab-proxy-t${WORKERS%% *} $VARIANT"; fi
if [ "$VARIANT_BIN" != "$KVLAB" ]; then variant+=" ($VARIANT_BIN)"; fi
[ -x "$KVLAB" ] || cargo build --release -q -p kvlab
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }
user=(); [ "$(id -u)" = 0 ] && user=(-u root)
memcached_on() { memcached "${user[@]}" -U 0 -l 127.0.0.1 -p "$1" -t 1 -m 256 & pids+=($!); wait_port "$1"; }
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
# The machine's CPU ticks: busy (user, nice, system, irq, softirq), steal, and all.
machine() { awk '/^cpu / {print $2+$3+$4+$7+$8, $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }

mc=(); for _ in 1 2 3; do p=$(port); memcached_on "$p"; mc+=("$p"); done
mc_pids=("${pids[@]}")

nut=$(port)
cat > "$dir/nut.yml" <<EOF
pool:
  listen: 127.0.0.1:$nut
  hash: md5
  distribution: ketama
  timeout: 2000
  servers:
   - 127.0.0.1:${mc[0]}:1
   - 127.0.0.1:${mc[1]}:1
EOF
nutcracker -c "$dir/nut.yml" -s "$(port)" -p "$dir/nut.pid" -o "$dir/nut.log" & pids+=($!); nut_pid=$!; wait_port "$nut"

kps=(); kp_pids=()
for w in $WORKERS; do
  kp=$(port)
  "$KVLAB" proxy -p "$kp" -t "$w" --backend "127.0.0.1:${mc[0]}" --backend "127.0.0.1:${mc[1]}" 2>"$dir/kp-$w.log" & pids+=($!); kp_pids+=($!); wait_port "$kp"
  kps+=("$kp")
done
if [ -n "$variant" ]; then
  kv=$(port)
  # shellcheck disable=SC2086 # VARIANT is a list of flags
  "$VARIANT_BIN" proxy -p "$kv" -t "${WORKERS%% *}" $VARIANT --backend "127.0.0.1:${mc[0]}" --backend "127.0.0.1:${mc[1]}" 2>"$dir/kv.log" & pids+=($!); kp_pids+=($!); wait_port "$kv"
fi
kr=$(port)
"$KVLAB" proxy -p "$kr" -t "${WORKERS##* }" --replicas 3 --backend "127.0.0.1:${mc[0]}" --backend "127.0.0.1:${mc[1]}" --backend "127.0.0.1:${mc[2]}" 2>"$dir/kr.log" & pids+=($!); kr_pid=$!; wait_port "$kr"

tick=$(getconf CLK_TCK)
# memcaslap's workload (CLIENT=memcaslap): random 32 B keys, 100 B values, get:set 10:1.
cat > "$dir/caslap.cfg" <<EOF
key
32 32 1
value
100 100 1
cmd
0 0.0909
1 0.9091
EOF
# run TARGET DEPTH PID...: one bench run; prints "req/s p99_us bench_cpu cpu_of_each_pid..."
run() {
  local target=$1 depth=$2; shift 2
  local before=() p
  for p in "$@"; do before+=("$(cpu "$p")"); done
  local m0; m0=$(machine)
  local t0; t0=$(date +%s.%N)
  local rps p99 out
  if [ "$CLIENT" = memcaslap ]; then
    memcaslap -s "127.0.0.1:$target" -T 1 -c 50 -t "${SECS}s" -S "${SECS}s" -F "$dir/caslap.cfg" \
      > "$dir/run.out" 2>&1 &
    # its CPU over all but the last half second of the run (it is gone at the end)
    local client=$! c0 c1 span; span=$(echo "$SECS - 0.5" | bc -l)
    c0=$(cpu "$client"); sleep "$span"; c1=$(cpu "$client")
    wait "$client"
    rps=$(awk '/^Run time/ {print $7}' "$dir/run.out")
    p99=$(awk '/^Total Statistics/ {t=1} t && /Avg:/ {print $2; exit}' "$dir/run.out")
    out="$rps $p99 $(echo "($c1 - $c0) * 100 / $tick / $span" | bc -l | xargs printf '%.0f')"
  else
    "$KVLAB" bench -s "127.0.0.1:$target" -T 1 -c 50 -d "$depth" --mix get=10,set=1 --value-size 100 \
      --keys 10000 --duration "$SECS" --warmup 0.5 -q > "$dir/run.out" 2>&1 &
    wait $!
    rps=$(awk '/measured/ {print $6}' "$dir/run.out")
    p99=$(awk '/from send/ {print $8}' "$dir/run.out")
    out="$rps $p99 $(awk '/generator CPU/ {print $(NF-1)}' "$dir/run.out")"
  fi
  local t1; t1=$(date +%s.%N)
  local m1; m1=$(machine)
  local el; el=$(echo "$t1 - $t0" | bc -l)
  local i=0
  for p in "$@"; do out+=" $(echo "($(cpu "$p") - ${before[$i]}) * 100 / $tick / $el" | bc -l | xargs printf '%.0f')"; i=$((i+1)); done
  # the whole machine over the run (start-up included): busy µs per request, steal %
  local busy0 steal0 all0 busy1 steal1 all1
  read -r busy0 steal0 all0 <<< "$m0"; read -r busy1 steal1 all1 <<< "$m1"
  out+=" $(echo "($busy1 - $busy0) * 1000000 / $tick / ($rps * $el)" | bc -l | xargs printf '%.1f')"
  out+=" $(echo "($steal1 - $steal0) * 100 / ($all1 - $all0)" | bc -l | xargs printf '%.0f')"
  echo "$out"
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# Each row: setup, depth, target port, label, pids to read.
declare -a rows
measure() {
  local depth=$1; shift
  local -a names=() ports=() 
  while [ $# -gt 0 ]; do names+=("$1"); ports+=("$2"); shift 2; done
  local r i
  for r in $(seq "$ROUNDS"); do
    for i in "${!names[@]}"; do
      echo "$(run "${ports[$i]}" "$depth" "$nut_pid" "${kp_pids[@]}" "$kr_pid" "${mc_pids[@]}")" >> "$dir/${names[$i]//[^A-Za-z0-9-]/_}-$depth"
    done
  done
  for i in "${!names[@]}"; do
    local f="$dir/${names[$i]//[^A-Za-z0-9-]/_}-$depth"
    # fields: req/s p99 bench twemproxy, then each kvlab proxy (-t of WORKERS, then R = 3),
    # then the three memcached
    rows+=("| ${names[$i]} | $depth | $(awk '{print $1}' "$f" | median) | $(awk '{print $2}' "$f" | median) | $(awk '{print $3}' "$f" | median) | $(awk '{print $4}' "$f" | median) | $(awk -v k="$nk" '{s=0; for (j=5; j<5+k; j++) s+=$j; print s}' "$f" | median) | $(awk -v k="$nk" '{print $(5+k)+$(6+k)+$(7+k)}' "$f" | median) | $(awk '{print $(NF-1)}' "$f" | median) | $(awk '{print $NF}' "$f" | median) |")
  done
}

nk=$(( ${#kp_pids[@]} + 1 ))
setups=(twemproxy "$nut")
i=0; for w in $WORKERS; do setups+=("kvlab-proxy-t$w" "${kps[$i]}"); i=$((i+1)); done
[ -n "$variant" ] && setups+=("$variant" "$kv")
for depth in $DEPTHS; do
  measure "$depth" "${setups[@]}" direct-to-one "${mc[0]}"
  measure "$depth" kvlab-proxy-R3 "$kr"
done

echo "kvlab proxy (--io reactor, -t each of: $WORKERS; R = 3 with -t ${WORKERS##* }) vs twemproxy $(nutcracker --version 2>&1 | head -1 | awk '{print $NF}'), memcached -t 1 backends; $CLIENT -T 1 -c 50, get:set 10:1, 100 B values, ${SECS} s runs, median of $ROUNDS (A B A B)"
echo
echo "| setup | depth | req/s | $lat | $CLIENT CPU % | twemproxy CPU % | kvlab proxies CPU % | memcached CPU % (all) | machine busy µs / req | steal % |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
