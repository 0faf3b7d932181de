#!/usr/bin/env bash
# What a proxy costs per request, counted rather than timed (so a busy machine cannot move
# it): kvlab proxy and twemproxy (Debian's nutcracker), each in front of two fresh memcached
# backends, loaded as the lab's proxy-vs-twemproxy experiment loads them (kvlab bench -T 1 -c 50,
# get:set 10:1, 100 B values, 10k keys, closed loop) at each depth.
#
#   scripts/proxy-costs.sh                     # syscalls (perf), both proxies, depth 1 and 16
#   COUNT=instructions scripts/proxy-costs.sh  # the proxy under callgrind instead
#   PROXIES=kvlab KVLAB=old/kvlab scripts/proxy-costs.sh
#
# Each setup runs twice, with N1 then N2 requests (after the same fill); the difference of
# the two counts divided by N2 - N1 is the cost of one request, start-up and fill cancelled.
#   COUNT=syscalls: system calls entered (perf's raw_syscalls:sys_enter tracepoint, attached
#     to the running processes, so it hardly slows them), of the proxy and of both backends
#     together, and the proxy's CPU time (utime + stime from /proc, µs; a timing, so noisy).
#   COUNT=instructions: instructions the proxy executes in user space (valgrind callgrind;
#     every thread; the proxy runs ~50x slower, so it batches more than it would at speed).
# Env: PROXIES ("kvlab nutcracker"), DEPTHS ("1 16"), N1 (20000), N2 (100000; instructions:
#      5000 / 25000), KVLAB (target/release/kvlab), PROXY_FLAGS ("--io reactor -t 2"),
#      COUNT (syscalls | instructions).
set -euo pipefail
cd "$(dirname "$0")/.."
KVLAB=${KVLAB:-target/release/kvlab}
PROXIES=${PROXIES:-kvlab nutcracker}
DEPTHS=${DEPTHS:-1 16}
COUNT=${COUNT:-syscalls}
PROXY_FLAGS=${PROXY_FLAGS:---io reactor -t 2}
if [ "$COUNT" = instructions ]; then N1=${N1:-5000} N2=${N2:-25000}; else N1=${N1:-20000} N2=${N2:-100000}; fi
[ -x "$KVLAB" ] || { echo "no $KVLAB (cargo build --release -p kvlab)" >&2; exit 1; }
dir=$(mktemp -d -t kvlab-proxy-costs.XXXXXX)
echo "raw results in $dir" >&2
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done
  echo "port $1 never opened" >&2; exit 1
}
user=(); [ "$(id -u)" = 0 ] && user=(-u root)
cpu_us() { awk -v t="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000000 / t}' "/proc/$1/stat"; }
# the pid of the proxy itself (under valgrind the valgrind process is the proxy)
stop() { kill -INT "$1" 2>/dev/null || true; for _ in $(seq 200); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done; kill -9 "$1" 2>/dev/null || true; }

# one PROXY DEPTH N -> "proxy_count backends_count proxy_cpu_us"
one() {
  local proxy=$1 depth=$2 n=$3 tag="$dir/$1-d$2-n$3" mc=() mcp=() p pp
  for _ in 1 2; do
    p=$(port); memcached "${user[@]}" -U 0 -l 127.0.0.1 -p "$p" -t 1 -m 256 & mcp+=($!); pids+=($!); wait_port "$p"; mc+=("$p")
  done
  pp=$(port)
  local cmd
  if [ "$proxy" = nutcracker ]; then
    cat > "$tag.yml" <<EOF
pool:
  listen: 127.0.0.1:$pp
  hash: md5
  distribution: ketama
  timeout: 2000
  servers:
   - 127.0.0.1:${mc[0]}:1
   - 127.0.0.1:${mc[1]}:1
EOF
    cmd=(nutcracker -c "$tag.yml" -s "$(port)" -p "$tag.pid" -o "$tag.log")
  else
    # shellcheck disable=SC2206
    cmd=("$KVLAB" proxy -p "$pp" $PROXY_FLAGS --backend "127.0.0.1:${mc[0]}" --backend "127.0.0.1:${mc[1]}")
  fi
  if [ "$COUNT" = instructions ]; then
    valgrind --tool=callgrind --callgrind-out-file="$tag.cg" "${cmd[@]}" 2>"$tag.err" &
  else
    "${cmd[@]}" 2>"$tag.err" &
  fi
  local proxy_pid=$!; pids+=("$proxy_pid"); wait_port "$pp"
  local perfs=()
  if [ "$COUNT" = syscalls ]; then
    perf stat -x, -e raw_syscalls:sys_enter -p "$proxy_pid" -o "$tag.perf-proxy" & perfs+=($!)
    perf stat -x, -e raw_syscalls:sys_enter -p "${mcp[0]},${mcp[1]}" -o "$tag.perf-mc" & perfs+=($!)
    perf stat -x, -e 'syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_readv,syscalls:sys_enter_writev,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_recvmsg,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_poll,syscalls:sys_enter_ppoll,syscalls:sys_enter_futex' \
      -p "$proxy_pid" -o "$tag.perf-calls" & perfs+=($!)
    perf stat -x, -e 'syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_readv,syscalls:sys_enter_writev,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_recvmsg,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_poll,syscalls:sys_enter_ppoll,syscalls:sys_enter_futex' \
      -p "${mcp[0]},${mcp[1]}" -o "$tag.perf-mc-calls" & perfs+=($!)
    sleep 0.5   # perf attaches
  fi
  local c0; c0=$(cpu_us "$proxy_pid")
  timeout 600 "$KVLAB" bench -s "127.0.0.1:$pp" -q --requests "$n" -T 1 -c 50 -d "$depth" \
    --mix get=10,set=1 --value-size 100 --keys 10000 >"$tag.bench" 2>&1
  local c1; c1=$(cpu_us "$proxy_pid")
  for p in "${perfs[@]}"; do kill -INT "$p"; wait "$p" 2>/dev/null || true; done
  stop "$proxy_pid"; wait "$proxy_pid" 2>/dev/null || true
  for p in "${mcp[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
  pids=()
  if [ "$COUNT" = instructions ]; then
    echo "$(awk '/^summary:|^totals:/ {print $2; exit}' "$tag.cg") 0 $(echo "$c1 - $c0" | bc)"
  else
    echo "$(awk -F, '/sys_enter/ {print $1; exit}' "$tag.perf-proxy") $(awk -F, '/sys_enter/ {print $1; exit}' "$tag.perf-mc") $(echo "$c1 - $c0" | bc)"
  fi
}

per() { python3 -c 'import sys; a,b,n=map(float,sys.argv[1:]); print(f"{(b-a)/n:,.2f}")' "$1" "$2" "$3"; }
calls() {  # the proxy's calls of each kind per request, from the two runs' breakdowns
  python3 - "$1" "$2" "$3" <<'EOF'
import sys, collections
def load(f):
    d = collections.Counter()
    for line in open(f):
        parts = line.strip().split(',')
        if len(parts) > 2 and 'sys_enter_' in parts[2]:
            try: d[parts[2].split('sys_enter_')[1]] += int(parts[0])
            except ValueError: pass
    return d
a, b, n = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
print(' '.join(f"{k} {(b[k]-a[k])/n:.2f}" for k in sorted(b, key=lambda k: -(b[k]-a[k])) if (b[k]-a[k])/n >= 0.005))
EOF
}

n=$((N2 - N1))
if [ "$COUNT" = instructions ]; then
  echo "| proxy | depth | instructions per request (callgrind, user space, all threads) |"
  echo "|---|---:|---:|"
else
  echo "| proxy | depth | proxy syscalls / req | backends syscalls / req | proxy CPU µs / req | proxy calls / req | backends calls / req |"
  echo "|---|---:|---:|---:|---:|---|---|"
fi
for depth in $DEPTHS; do
  for proxy in $PROXIES; do
    read -r a1 m1 c1 < <(one "$proxy" "$depth" "$N1")
    read -r a2 m2 c2 < <(one "$proxy" "$depth" "$N2")
    echo "$proxy d$depth: $a1 $m1 $c1 / $a2 $m2 $c2" >&2
    name=$proxy; [ "$proxy" = kvlab ] && name="kvlab ($PROXY_FLAGS)"
    if [ "$COUNT" = instructions ]; then
      echo "| $name | $depth | $(per "$a1" "$a2" "$n") |"
    else
      echo "| $name | $depth | $(per "$a1" "$a2" "$n") | $(per "$m1" "$m2" "$n") | $(per "$c1" "$c2" "$n") | $(calls "$dir/$proxy-d$depth-n$N1.perf-calls" "$dir/$proxy-d$depth-n$N2.perf-calls" "$n") | $(calls "$dir/$proxy-d$depth-n$N1.perf-mc-calls" "$dir/$proxy-d$depth-n$N2.perf-mc-calls" "$n") |"
    fi
  done
done
echo
echo "(kvlab bench -T 1 -c 50 -d DEPTH, get:set 10:1, 100 B values, 10k keys; two memcached -t 1 backends; the difference of runs of $N1 and $N2 requests, per request)"
