#!/usr/bin/env bash
# A kvlab cluster on several "machines" of one box: each node (`kvlab server --cluster`) runs
# in its own network namespace with its own address, joined to the others by a veth pair on
# a bridge in the root namespace; latency, loss and partitions are injected per node.
#
#   scripts/cluster-netns.sh up N [-- SERVER_FLAGS]   namespaces, nodes 1..N, the cluster of them
#   scripts/cluster-netns.sh start K [-- FLAGS]       namespace and node K, not in the ring
#                                                     (then: kvlab cluster --topology T add ADDR)
#   scripts/cluster-netns.sh stop K [-9]              stop node K's process (-9: kill it)
#   scripts/cluster-netns.sh netem K delay 20ms | loss 1% | clear
#   scripts/cluster-netns.sh partition K | heal K     drop all of K's traffic | let it flow again
#   scripts/cluster-netns.sh exec K CMD...            run CMD inside node K's namespace
#   scripts/cluster-netns.sh addr K | topology | status
#   scripts/cluster-netns.sh down                     stop everything, remove all it made
#
# Addresses: node K is SUBNET.(10+K):PORT (10.77.0.11:11211 for node 1), the bridge is
# SUBNET.1, reachable from the root namespace (so `kvlab bench --cluster 10.77.0.11:11211`
# runs from there). The namespaces have no default route: their traffic cannot leave the
# bridge. The nodes share a topology file in the state directory (one machine, one
# filesystem; across machines the topology would be etcd).
#
# Delay and loss use `tc qdisc ... netem` on the node's interface (egress, so a delay adds
# once to every round trip). Kernels built without sch_netem get the same effect from
# iptables in the node's namespace: loss by `-m statistic`, delay by NFQUEUE and
# scripts/nfqueue-delay.py holding each outgoing packet. A partition is iptables DROP of
# everything in and out of the node's interface (its links stay up, packets vanish).
#
# Environment: KVNET (name, ≤ 8 characters; default kvnet) names the namespaces KVNET-K, the
# bridge KVNET-br, host-side veths KVNET-vK; KVNET_SUBNET (default 10.77.0, a /24 inside
# 10.77.0.0/16); KVNET_PORT (default 11211); KVNET_DIR (state: topology, logs, pids; default
# /tmp/kvnet-KVNET); KVLAB (the binary; default kvlab on PATH, else target/debug/kvlab).
# Needs root, iproute2 (ip, tc) and, for partitions and where netem is missing, iptables.
# Every wait is bounded; `up` cleans up what it made if it fails; `down` is idempotent.
set -euo pipefail

KVNET=${KVNET:-kvnet}
SUBNET=${KVNET_SUBNET:-10.77.0}
PORT=${KVNET_PORT:-11211}
DIR=${KVNET_DIR:-/tmp/kvnet-$KVNET}
BR="$KVNET-br"
HERE=$(cd "$(dirname "$0")" && pwd)
TOPOLOGY="$DIR/topology.json"
MAX_NODES=100

die() { echo "cluster-netns: $*" >&2; exit 1; }
say() { echo "cluster-netns: $*" >&2; }

[[ $KVNET =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "KVNET=$KVNET: 1-8 lower-case letters and digits"
if ! [[ $SUBNET =~ ^10\.77\.([0-9]{1,3})$ ]] || ((BASH_REMATCH[1] > 255)); then
  die "KVNET_SUBNET=$SUBNET: must be 10.77.X (the script's private range)"
fi

kvlab_bin() {
  if [ -n "${KVLAB:-}" ]; then echo "$KVLAB"; return; fi
  if command -v kvlab >/dev/null; then command -v kvlab; return; fi
  local b="$HERE/../target/debug/kvlab"
  [ -x "$b" ] || die "no kvlab binary: set KVLAB, put kvlab on PATH or cargo build -p kvlab"
  echo "$b"
}

ns() { echo "$KVNET-$1"; }
veth() { echo "$KVNET-v$1"; }
ip_of() { echo "$SUBNET.$((10 + $1))"; }
addr() { echo "$(ip_of "$1"):$PORT"; }
check_k() {
  if ! [[ ${1:-} =~ ^[0-9]+$ ]] || (($1 < 1 || $1 > MAX_NODES)); then
    die "node: a number 1..$MAX_NODES, not '${1:-}'"
  fi
}
in_ns() { local k=$1; shift; ip netns exec "$(ns "$k")" "$@"; }
have_ns() { ip netns list | awk '{print $1}' | grep -qx "$(ns "$1")"; }
our_namespaces() { ip netns list | awk '{print $1}' | grep -E "^$KVNET-[0-9]+$" | sort -t- -k2 -n || true; }

# One invocation at a time per KVNET (bounded wait). Processes started in the background
# must not inherit fd 9 (`9>&-`), or they would hold the lock for their lifetime.
lock() {
  exec 9>"/tmp/kvnet-$KVNET.lock"
  flock -w 60 9 || die "another cluster-netns.sh on $KVNET holds the lock"
}

# The subnet must be ours alone: a route to it through anything but our bridge means the
# addresses exist elsewhere, and the script would send traffic there. Refuse.
check_subnet_free() {
  local other
  other=$(ip -4 route show | awk -v net="$SUBNET.0/24" -v br="$BR" '$1 == net && $0 !~ ("dev " br " ")' || true)
  [ -z "$other" ] || die "$SUBNET.0/24 is already routed here ($other): choose another KVNET_SUBNET"
}

bridge_up() {
  check_subnet_free
  if ! ip link show "$BR" >/dev/null 2>&1; then
    ip link add "$BR" type bridge
    ip addr add "$SUBNET.1/24" dev "$BR"
  fi
  ip link set "$BR" up
}

# Namespace K with its veth on the bridge and its address (idempotent).
ns_up() {
  local k=$1 n v
  n=$(ns "$k") v=$(veth "$k")
  have_ns "$k" || ip netns add "$n"
  if ! ip link show "$v" >/dev/null 2>&1; then
    ip link add "$v" type veth peer name eth0 netns "$n"
  fi
  ip link set "$v" master "$BR" up
  in_ns "$k" ip link set lo up
  in_ns "$k" ip addr replace "$(ip_of "$k")/24" dev eth0
  in_ns "$k" ip link set eth0 up
}

pid_of() { cat "$DIR/node-$1.pid" 2>/dev/null || true; }
running() {
  local p
  p=$(pid_of "$1")
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null && grep -q kvlab "/proc/$p/cmdline" 2>/dev/null
}

# Asks node K for its version from the root namespace, through the bridge (≤ 1 s).
probe() {
  timeout 1 bash -c "exec 3<>/dev/tcp/$(ip_of "$1")/$PORT && printf 'version\r\n' >&3 && read -r -t 1 line <&3 && [[ \$line == VERSION* ]]" 2>/dev/null
}

wait_ready() {
  local k=$1 deadline=$((SECONDS + 15))
  until probe "$k"; do
    running "$k" || { grep -m3 -v '^ ' "$DIR/node-$k.log" >&2 || true; die "node $k exited"; }
    ((SECONDS < deadline)) || die "node $k ($(addr "$k")) not ready in 15 s"
    sleep 0.1
  done
}

node_start() {
  local k=$1; shift
  running "$k" && return 0
  local bin
  bin=$(kvlab_bin)
  ip netns exec "$(ns "$k")" "$bin" server -l "$(ip_of "$k")" -p "$PORT" \
    --cluster "$TOPOLOGY" --cluster-node "$(addr "$k")" "$@" \
    </dev/null >"$DIR/node-$k.log" 2>&1 9>&- &
  echo $! >"$DIR/node-$k.pid"
}

up_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    say "up failed: removing what it made"
    cmd_down_locked
  fi
}

cmd_up() {
  local n=${1:-}; shift || true
  [ "${1:-}" = "--" ] && shift
  check_k "$n"
  lock
  mkdir -p "$DIR"
  trap up_exit EXIT
  trap 'exit 130' INT TERM
  bridge_up
  local k nodes=()
  for ((k = 1; k <= n; k++)); do nodes+=("$(addr "$k")"); done
  # The topology first: a node reads it when it starts.
  if [ ! -s "$TOPOLOGY" ]; then
    timeout 30 "$(kvlab_bin)" cluster --topology "$TOPOLOGY" create "${nodes[@]}" >&2
  fi
  for ((k = 1; k <= n; k++)); do
    ns_up "$k"
    node_start "$k" "$@"
  done
  for ((k = 1; k <= n; k++)); do wait_ready "$k"; done
  trap - EXIT
  say "up: ${nodes[*]} (topology $TOPOLOGY)"
}

cmd_start() {
  local k=${1:-}; shift || true
  [ "${1:-}" = "--" ] && shift
  check_k "$k"
  lock
  mkdir -p "$DIR"
  [ -s "$TOPOLOGY" ] || die "no cluster yet (up first)"
  bridge_up
  ns_up "$k"
  node_start "$k" "$@"
  wait_ready "$k"
  addr "$k"
}

cmd_stop() {
  local k=${1:-} sig=TERM
  check_k "$k"
  [ "${2:-}" = "-9" ] && sig=KILL
  running "$k" || { say "node $k is not running"; return 0; }
  kill -s "$sig" "$(pid_of "$k")"
  local deadline=$((SECONDS + 5))
  while running "$k" && ((SECONDS < deadline)); do sleep 0.1; done
  if running "$k"; then kill -KILL "$(pid_of "$k")" 2>/dev/null || true; fi
}

# Whether this kernel has netem (asked once, in a throw-away qdisc on node K's loopback).
have_netem() {
  if in_ns "$1" tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    in_ns "$1" tc qdisc del dev lo root 2>/dev/null || true
    return 0
  fi
  return 1
}

need_iptables() { command -v iptables >/dev/null || die "iptables is needed for this (apt-get install iptables)"; }

# Removes delay and loss from node K (not a partition).
emulation_clear() {
  local k=$1
  in_ns "$k" tc qdisc del dev eth0 root 2>/dev/null || true
  if command -v iptables >/dev/null; then
    while in_ns "$k" iptables -D OUTPUT -o eth0 -j NFQUEUE --queue-num 0 --queue-bypass 2>/dev/null; do :; done
    local rule
    while rule=$(in_ns "$k" iptables -S OUTPUT 2>/dev/null | grep -m1 -- '--mode random' | sed 's/^-A /-D /') && [ -n "$rule" ]; do
      # shellcheck disable=SC2086
      in_ns "$k" iptables $rule
    done
  fi
  local p
  p=$(cat "$DIR/delay-$k.pid" 2>/dev/null || true)
  if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
    kill "$p" 2>/dev/null || true
    local deadline=$((SECONDS + 3))
    while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
  fi
  rm -f "$DIR/delay-$k.pid"
}

cmd_netem() {
  local k=${1:-} what=${2:-} value=${3:-}
  check_k "$k"
  have_ns "$k" || die "no node $k"
  case "$what" in
    clear)
      emulation_clear "$k"
      say "node $k: no delay, no loss"
      ;;
    delay)
      [[ $value =~ ^([0-9]+(\.[0-9]+)?)ms$ ]] || die "delay: e.g. 20ms, not '$value'"
      local ms=${BASH_REMATCH[1]}
      emulation_clear "$k"
      if have_netem "$k"; then
        in_ns "$k" tc qdisc add dev eth0 root netem delay "${ms}ms"
        say "node $k: +${ms} ms on every packet it sends (tc netem)"
      else
        need_iptables
        ip netns exec "$(ns "$k")" python3 "$HERE/nfqueue-delay.py" --queue 0 --delay-ms "$ms" --max-seconds 86400 \
          </dev/null >"$DIR/delay-$k.log" 2>&1 9>&- &
        echo $! >"$DIR/delay-$k.pid"
        local deadline=$((SECONDS + 5))
        until grep -q '^nfqueue-delay:' "$DIR/delay-$k.log" 2>/dev/null; do
          kill -0 "$(cat "$DIR/delay-$k.pid")" 2>/dev/null || { cat "$DIR/delay-$k.log" >&2; die "the delayer exited"; }
          ((SECONDS < deadline)) || die "the delayer did not start in 5 s"
          sleep 0.05
        done
        in_ns "$k" iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0 --queue-bypass
        say "node $k: +${ms} ms on every packet it sends (NFQUEUE delayer: this kernel has no netem)"
      fi
      ;;
    loss)
      [[ $value =~ ^([0-9]+(\.[0-9]+)?)%$ ]] || die "loss: e.g. 1%, not '$value'"
      local pct=${BASH_REMATCH[1]}
      emulation_clear "$k"
      if have_netem "$k"; then
        in_ns "$k" tc qdisc add dev eth0 root netem loss "${pct}%"
        say "node $k: ${pct}% of the packets it sends lost (tc netem)"
      else
        need_iptables
        local p
        p=$(awk -v x="$pct" 'BEGIN { printf "%.6f", x / 100 }')
        in_ns "$k" iptables -A OUTPUT -o eth0 -m statistic --mode random --probability "$p" -j DROP
        say "node $k: ${pct}% of the packets it sends lost (iptables statistic: this kernel has no netem)"
      fi
      ;;
    *) die "netem K delay Nms | loss P% | clear" ;;
  esac
}

cmd_partition() {
  local k=${1:-}
  check_k "$k"
  have_ns "$k" || die "no node $k"
  need_iptables
  in_ns "$k" iptables -C INPUT -i eth0 -j DROP 2>/dev/null || in_ns "$k" iptables -I INPUT 1 -i eth0 -j DROP
  in_ns "$k" iptables -C OUTPUT -o eth0 -j DROP 2>/dev/null || in_ns "$k" iptables -I OUTPUT 1 -o eth0 -j DROP
  say "node $k ($(addr "$k")) partitioned: everything in and out dropped"
}

cmd_heal() {
  local k=${1:-}
  check_k "$k"
  have_ns "$k" || die "no node $k"
  need_iptables
  while in_ns "$k" iptables -D INPUT -i eth0 -j DROP 2>/dev/null; do :; done
  while in_ns "$k" iptables -D OUTPUT -o eth0 -j DROP 2>/dev/null; do :; done
  say "node $k healed"
}

any_alive() {
  local p
  for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}

cmd_down_locked() {
  local n k p f deadline pids=()
  # Every process inside our namespaces (nodes, delayers, anything run with `exec`), and
  # those whose pid files say they are ours (checked against their command line).
  for n in $(our_namespaces); do
    for p in $(ip netns pids "$n" 2>/dev/null); do pids+=("$p"); done
  done
  for f in "$DIR"/node-*.pid "$DIR"/delay-*.pid; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    if grep -qE 'kvlab|nfqueue-delay' "/proc/$p/cmdline" 2>/dev/null; then pids+=("$p"); fi
  done
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    deadline=$((SECONDS + 5))
    while any_alive "${pids[@]}" && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "${pids[@]}" 2>/dev/null || true
  fi
  for n in $(our_namespaces); do
    k=${n##*-}
    ip link del "$(veth "$k")" 2>/dev/null || true
    ip netns del "$n" 2>/dev/null || true
  done
  # Host-side veths left by a namespace deleted elsewhere, then the bridge.
  for p in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^$KVNET-v[0-9]+$" || true); do
    ip link del "$p" 2>/dev/null || true
  done
  ip link del "$BR" 2>/dev/null || true
  # Deletion of a namespace's devices is asynchronous: wait (bounded) until they are gone.
  deadline=$((SECONDS + 5))
  while ip -o link show 2>/dev/null | grep -qE ": $KVNET-(v[0-9]+|br)[@:]" && ((SECONDS < deadline)); do sleep 0.1; done
  if [ -z "${KVNET_KEEP:-}" ]; then rm -rf "$DIR"; fi
  say "down: no namespace, veth or bridge of $KVNET left"
}

cmd_down() {
  lock
  cmd_down_locked
}

cmd_status() {
  local n k
  echo "bridge $BR: $(ip -br addr show "$BR" 2>/dev/null | awk '{print $2, $3}' || echo absent)"
  for n in $(our_namespaces); do
    k=${n##*-}
    local state=stopped emu=""
    running "$k" && state="running (pid $(pid_of "$k"))"
    emu=$(in_ns "$k" tc qdisc show dev eth0 2>/dev/null | grep -o 'netem.*' || true)
    [ -s "$DIR/delay-$k.pid" ] && emu="$emu nfqueue delayer"
    command -v iptables >/dev/null && in_ns "$k" iptables -C INPUT -i eth0 -j DROP 2>/dev/null && emu="$emu PARTITIONED"
    echo "node $k $(addr "$k") $state${emu:+ [$emu]}"
  done
  [ -s "$TOPOLOGY" ] && echo "topology $TOPOLOGY"
  return 0
}

[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
command -v ip >/dev/null || die "needs iproute2 (apt-get install iproute2)"
# From inside a named namespace the bridge would land there while the node namespaces
# (named globally) would not: refuse.
inside=$(ip netns identify $$ 2>/dev/null || true)
[ -z "$inside" ] || die "run from the root network namespace, not from $inside"
cmd=${1:-}
shift || true
case "$cmd" in
  up) cmd_up "$@" ;;
  start) cmd_start "$@" ;;
  stop) cmd_stop "$@" ;;
  netem) cmd_netem "$@" ;;
  partition) cmd_partition "$@" ;;
  heal) cmd_heal "$@" ;;
  exec) k=${1:-}; check_k "$k"; shift; have_ns "$k" || die "no node $k"; in_ns "$k" "$@" ;;
  addr) check_k "${1:-}"; addr "$1" ;;
  topology) echo "$TOPOLOGY" ;;
  status) cmd_status ;;
  down) cmd_down ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
