#!/usr/bin/env bash
# Side-by-side throughput of kvlab server and Debian's memcached with the same client
# (memcaslap), thread count and memory, alternating runs (A B A B ...). Prints every run and
# the median ratio kvlab/memcached. A benchmark, not a test: run it on a quiet machine.
#
#   scripts/compare-memcached.sh [runs=3] [seconds=10] [connections=64] [server threads=4]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3} secs=${2:-10} conns=${3:-64} threads=${4:-4} mem=64
command -v memcaslap >/dev/null || { echo "memcaslap missing: apt-get install libmemcached-tools" >&2; exit 1; }
cargo build --release -q -p kvlab
kv_port=$((20000 + RANDOM % 10000)); mc_port=$((kv_port + 1))
target/release/kvlab server -p "$kv_port" -t "$threads" -m "$mem" 2>/dev/null & kv=$!
memcached -u root -U 0 -l 127.0.0.1 -p "$mc_port" -t "$threads" -m "$mem" & mc=$!
trap 'kill $kv $mc 2>/dev/null; wait 2>/dev/null' EXIT
for p in "$kv_port" "$mc_port"; do
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.05; done
done
tps() { memcaslap -s "127.0.0.1:$1" -t "${secs}s" -c "$conns" -T 1 2>&1 | awk '/^Run time/ {print $7}'; }
kv_runs=(); mc_runs=()
for i in $(seq "$runs"); do
  k=$(tps "$kv_port"); m=$(tps "$mc_port")
  kv_runs+=("$k"); mc_runs+=("$m")
  echo "run $i: kvlab ${k} ops/s   memcached ${m} ops/s"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
k=$(median "${kv_runs[@]}"); m=$(median "${mc_runs[@]}")
echo "median: kvlab ${k} ops/s, memcached ${m} ops/s, ratio kvlab/memcached $(awk -v a="$k" -v b="$m" 'BEGIN {printf "%.3f", a/b}')"
echo "(memcaslap -t ${secs}s -c ${conns} -T 1; servers -t ${threads} -m ${mem}; ${runs} alternating runs)"
