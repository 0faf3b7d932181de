#!/usr/bin/env bash
# Does `kvlab bench` measure what memcaslap measures? Both drive the same memcached with a
# closed loop of the same shape (one generator thread, C connections, one request in
# flight each, 64 B keys, 1 KB values, 9:1 get:set), alternating runs (A B A B ...).
# memcached is pinned to CPU 0 with one worker thread and the generators to CPU 1, so the
# server — not the generator — is the bottleneck and both tools should see the same
# throughput and, by Little's law, the same mean latency. Prints every run and the median
# ratios kvlab bench / memcaslap. A benchmark, not a test: run it on a quiet machine.
#
#   scripts/bench-vs-memcaslap.sh [pairs=3] [seconds=10] [connections=16]
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-3} secs=${2:-10} conns=${3:-16}
command -v memcaslap >/dev/null || { echo "memcaslap missing: apt-get install libmemcached-tools" >&2; exit 1; }
command -v taskset >/dev/null || { echo "taskset missing (util-linux)" >&2; exit 1; }
cargo build --release -q -p kvlab
port=$((20000 + RANDOM % 10000))
taskset -c 0 memcached -u root -U 0 -l 127.0.0.1 -p "$port" -t 1 -m 1024 & mc=$!
trap 'kill $mc 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
# memcaslap: "Run time: 10.0s Ops: N TPS: X ..." and the "Total Statistics" block's Avg (µs).
caslap() {
  taskset -c 1 memcaslap -s "127.0.0.1:$port" -t "${secs}s" -c "$conns" -T 1 -S "${secs}s" 2>&1 |
    awk '/^Total Statistics/ {t=1} t && /Avg:/ {avg=$2; t=0} /^Run time/ {tps=$7} END {print tps, avg}'
}
# kvlab bench: the "measured" line's req/s and the "from planned" row's mean (last column).
kvbench() {
  taskset -c 1 target/release/kvlab bench -s "127.0.0.1:$port" -q -T 1 -c "$conns" -d 1 \
    --duration "$secs" --keys 10000 --key-size 64 --value-size 1024 --mix get=9,set=1 2>&1 |
    awk '/measured/ {for (i=1;i<=NF;i++) if ($i=="req/s;") tps=$(i-1)} /from planned/ {avg=$NF} END {print tps, avg}'
}
# memcached's CPU time (utime + stime, clock ticks) from /proc: its share of CPU 0 during a
# run tells whether the server was the bottleneck (near 100 %) or the generator was.
ticks() { awk '{print $14 + $15}' "/proc/$mc/stat"; }
hz=$(getconf CLK_TCK)
busy() { awk -v a="$1" -v b="$2" -v hz="$hz" -v s="$secs" 'BEGIN {printf "%.0f", 100 * (b - a) / hz / s}'; }
kb=(); kl=(); cb=(); cl=()
for i in $(seq "$pairs"); do
  # The kvlab run includes its load phase (10k keys), a fraction of a second.
  a=$(ticks); read -r t1 l1 < <(kvbench); b=$(ticks)
  read -r t2 l2 < <(caslap); c=$(ticks)
  kb+=("$t1"); kl+=("$l1"); cb+=("$t2"); cl+=("$l2")
  echo "pair $i: kvlab bench ${t1} req/s mean ${l1} µs (memcached CPU ~$(busy "$a" "$b") %)   memcaslap ${t2} ops/s mean ${l2} µs (memcached CPU ~$(busy "$b" "$c") %)"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
a=$(median "${kb[@]}"); b=$(median "${cb[@]}"); c=$(median "${kl[@]}"); d=$(median "${cl[@]}")
echo "median: kvlab bench ${a} req/s, ${c} µs; memcaslap ${b} ops/s, ${d} µs"
echo "ratio kvlab bench / memcaslap: throughput $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", a/b}'), mean latency $(awk -v a="$c" -v b="$d" 'BEGIN {printf "%.3f", a/b}')"
echo "(memcached -t 1 on CPU 0; generators on CPU 1; -T 1 -c ${conns}, ${secs} s runs, ${pairs} pairs)"
