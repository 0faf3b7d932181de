#!/usr/bin/env bash
# A kvlab cluster on several "machines" of one box: each node (`kvlab server --cluster`) runs
# in its own network namespace with its own address, joined to the others by a veth pair on
# a bridge in the root namespace; latency, loss and partitions are injected per node.
#
#   scripts/cluster-netns.sh up N [-- SERVER_FLAGS]   namespaces, nodes 1..N, the cluster of them
#   scripts/cluster-netns.sh start K [-- FLAGS]       namespace and node K, not in the ring
#                                                     (then: kvlab cluster --topology T add ADDR)
#   scripts/cluster-netns.sh stop K [-9]              stop node K's process (-9: kill it)
#   scripts/cluster-netns.sh netem H delay 20ms | loss 1% | clear
#   scripts/cluster-netns.sh partition H [PEER]       drop all of H's traffic, or only to and
#                                                     from PEER (a node, etcd or root)
#   scripts/cluster-netns.sh heal H                   let it all flow again
#   scripts/cluster-netns.sh exec H CMD...            run CMD inside H's namespace
#   scripts/cluster-netns.sh host H                   namespace H alone, no process (prints its
#                                                     address): for what you start yourself
#                                                     inside it (`exec H`, `ip netns exec`)
#   scripts/cluster-netns.sh addr H | topology | status
#   scripts/cluster-netns.sh down                     stop everything, remove all it made
#
# H is a node's number K or `etcd`. Addresses: node K is SUBNET.(10+K):PORT (10.77.0.11:11211
# for node 1), the bridge is SUBNET.1 (`root`), reachable from the root namespace (so
# `kvlab bench --cluster 10.77.0.11:11211` runs from there). The namespaces have no default
# route: their traffic cannot leave the bridge.
#
# The topology (KVNET_STORE, chosen at `up`): `file` (default), a JSON file in the state
# directory that all nodes share (one machine, one filesystem); or `etcd`, Debian's etcd
# (package etcd-server) started in a namespace of its own, KVNET-0 at SUBNET.10:2379, so
# that nodes reach their topology over the network and can be cut off from it
# (`partition K etcd`). `topology` prints the --topology/--cluster value either way.
#
# Delay and loss use `tc qdisc ... netem` on the node's interface (egress, so a delay adds
# once to every round trip). Kernels built without sch_netem get the same effect from
# iptables in the node's namespace: loss by `-m statistic`, delay by NFQUEUE and
# scripts/nfqueue-delay.py holding each outgoing packet. A partition is iptables DROP in the
# host's namespace of everything in and out of its interface, or of its traffic with one
# peer (its links stay up, packets vanish).
#
# Environment: KVNET (name, ≤ 8 characters; default kvnet) names the namespaces KVNET-K, the
# bridge KVNET-br, host-side veths KVNET-vK; KVNET_SUBNET (default 10.77.0, a /24 inside
# 10.77.0.0/16); KVNET_PORT (default 11211); KVNET_DIR (state: topology, logs, pids; default
# /tmp/kvnet-KVNET); KVNET_STORE (file or etcd, see above); KVLAB (the binary; default kvlab
# on PATH, else target/debug/kvlab). Needs root, iproute2 (ip, tc), for partitions and where
# netem is missing iptables, and for KVNET_STORE=etcd Debian's etcd-server.
# Every wait is bounded; `up` cleans up what it made if it fails; `down` is idempotent.
set -euo pipefail

KVNET=${KVNET:-kvnet}
SUBNET=${KVNET_SUBNET:-10.77.0}
PORT=${KVNET_PORT:-11211}
DIR=${KVNET_DIR:-/tmp/kvnet-$KVNET}
BR="$KVNET-br"
HERE=$(cd "$(dirname "$0")" && pwd)
MAX_NODES=100
ETCD_PORT=2379

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
# A host: a node's number, or `etcd` (host 0); prints its number.
host() {
  case "${1:-}" in
    etcd) echo 0 ;;
    *) check_k "${1:-}"; echo "$1" ;;
  esac
}
host_name() { if [ "$1" = 0 ]; then echo etcd; else echo "node $1"; fi; }

# The topology store: chosen by KVNET_STORE at `up`, then remembered in the state directory.
store_kind() {
  local k
  k=$(cat "$DIR/store" 2>/dev/null || echo "${KVNET_STORE:-file}")
  case "$k" in file | etcd) echo "$k" ;; *) die "KVNET_STORE=$k: file or etcd" ;; esac
}
topology() {
  if [ "$(store_kind)" = etcd ]; then
    echo "etcd://$(ip_of 0):$ETCD_PORT/$KVNET"
  else
    echo "$DIR/topology.json"
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
  # With br_netfilter, bridged packets (node to node) pass the root namespace's FORWARD
  # chain; where its policy drops (a Docker host), let our bridge's own traffic through.
  # `down` removes the rule (found by its comment).
  if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo 0)" = 1 ] &&
    command -v iptables >/dev/null &&
    ! iptables -S FORWARD 2>/dev/null | grep -qx -- '-P FORWARD ACCEPT' &&
    ! iptables -C FORWARD -i "$BR" -o "$BR" -m comment --comment "$BR" -j ACCEPT 2>/dev/null; then
    iptables -I FORWARD 1 -i "$BR" -o "$BR" -m comment --comment "$BR" -j ACCEPT
  fi
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

etcd_running() {
  local p
  p=$(cat "$DIR/etcd.pid" 2>/dev/null || true)
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null && grep -q etcd "/proc/$p/cmdline" 2>/dev/null
}

# etcd in namespace 0 (one member, data in the state directory), ready when /health says so.
etcd_up() {
  local bin ip
  bin=$(command -v etcd || true)
  [ -n "$bin" ] || die "KVNET_STORE=etcd needs etcd (apt-get install etcd-server)"
  ip=$(ip_of 0)
  ns_up 0
  if ! etcd_running; then
    ip netns exec "$(ns 0)" "$bin" --name "$KVNET" --data-dir "$DIR/etcd" \
      --listen-client-urls "http://$ip:$ETCD_PORT" --advertise-client-urls "http://$ip:$ETCD_PORT" \
      --listen-peer-urls "http://$ip:2380" --initial-advertise-peer-urls "http://$ip:2380" \
      --initial-cluster "$KVNET=http://$ip:2380" \
      </dev/null >"$DIR/etcd.log" 2>&1 9>&- &
    echo $! >"$DIR/etcd.pid"
  fi
  local deadline=$((SECONDS + 15))
  until timeout 1 bash -c "exec 3<>/dev/tcp/$ip/$ETCD_PORT && printf 'GET /health HTTP/1.0\r\n\r\n' >&3 && grep -q '\"health\":\"true\"' <&3" 2>/dev/null; do
    kill -0 "$(cat "$DIR/etcd.pid")" 2>/dev/null || { tail -3 "$DIR/etcd.log" >&2 || true; die "etcd exited"; }
    ((SECONDS < deadline)) || die "etcd ($ip:$ETCD_PORT) not healthy in 15 s"
    sleep 0.2
  done
}

# Creates the cluster of NODES unless the store holds one.
create_cluster() {
  local out
  if [ "$(store_kind)" = file ] && [ -s "$(topology)" ]; then return 0; fi
  if out=$(timeout 30 "$(kvlab_bin)" cluster --topology "$(topology)" create "$@" 2>&1); then
    echo "$out" >&2
  elif echo "$out" | grep -q "already exists"; then
    :
  else
    echo "$out" >&2
    die "creating the cluster failed"
  fi
}

# Asks node K for its version from the root namespace, through the bridge (≤ 1 s).
probe() {
  timeout 1 bash -c "exec 3<>/dev/tcp/$(ip_of "$1")/$PORT && printf 'version\r\n' >&3 && read -r -t 1 line <&3 && [[ \$line == VERSION* ]]" 2>/dev/null
}

wait_ready() {
  local k=$1 deadline=$((SECONDS + 15))
  until probe "$k"; do
    # Alive is enough here: just started, it may not have become kvlab (exec) yet.
    kill -0 "$(pid_of "$k")" 2>/dev/null || { grep -m3 -v '^ ' "$DIR/node-$k.log" >&2 || true; die "node $k exited"; }
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
    --cluster "$(topology)" --cluster-node "$(addr "$k")" "$@" \
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
  store_kind >"$DIR/store.new" && mv "$DIR/store.new" "$DIR/store"
  bridge_up
  [ "$(store_kind)" = etcd ] && etcd_up
  local k nodes=()
  for ((k = 1; k <= n; k++)); do nodes+=("$(addr "$k")"); done
  # The topology first: a node reads it when it starts.
  create_cluster "${nodes[@]}"
  for ((k = 1; k <= n; k++)); do
    ns_up "$k"
    node_start "$k" "$@"
  done
  for ((k = 1; k <= n; k++)); do wait_ready "$k"; done
  trap - EXIT
  say "up: ${nodes[*]} (topology $(topology))"
}

cmd_start() {
  local k=${1:-}; shift || true
  [ "${1:-}" = "--" ] && shift
  check_k "$k"
  lock
  mkdir -p "$DIR"
  [ -s "$DIR/store" ] || die "no cluster yet (up first)"
  running "$k" && { addr "$k"; return 0; }
  START_K=$k
  trap start_exit EXIT
  trap 'exit 130' INT TERM
  bridge_up
  ns_up "$k"
  node_start "$k" "$@"
  wait_ready "$k"
  trap - EXIT
  addr "$k"
}

# A failed `start K` removes node K's process, namespace and veth (the rest stays).
start_exit() {
  local rc=$? k=${START_K:-}
  if [ "$rc" -ne 0 ] && [ -n "$k" ]; then
    say "start $k failed: removing node $k"
    local p
    for p in $(ip netns pids "$(ns "$k")" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip link del "$(veth "$k")" 2>/dev/null || true
    ip netns del "$(ns "$k")" 2>/dev/null || true
    rm -f "$DIR/node-$k.pid"
  fi
}

# Namespace K (and the bridge) without a process: `kvlab faults run --netns` starts its
# nodes, etcd members and proxy itself (so it can kill and stop them) in namespaces made so.
cmd_host() {
  local k
  k=$(host "${1:-}")
  lock
  mkdir -p "$DIR"
  bridge_up
  ns_up "$k"
  ip_of "$k"
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
    while alive "$p" && ((SECONDS < deadline)); do sleep 0.05; done
  fi
  rm -f "$DIR/delay-$k.pid"
}

cmd_netem() {
  local k what=${2:-} value=${3:-}
  k=$(host "${1:-}")
  have_ns "$k" || die "no $(host_name "$k")"
  case "$what" in
    clear)
      emulation_clear "$k"
      say "$(host_name "$k"): no delay, no loss"
      ;;
    delay)
      [[ $value =~ ^([0-9]+(\.[0-9]+)?)ms$ ]] || die "delay: e.g. 20ms, not '$value'"
      local ms=${BASH_REMATCH[1]}
      emulation_clear "$k"
      if have_netem "$k"; then
        in_ns "$k" tc qdisc add dev eth0 root netem delay "${ms}ms"
        say "$(host_name "$k"): +${ms} ms on every packet it sends (tc netem)"
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
        say "$(host_name "$k"): +${ms} ms on every packet it sends (NFQUEUE delayer: this kernel has no netem)"
      fi
      ;;
    loss)
      [[ $value =~ ^([0-9]+(\.[0-9]+)?)%$ ]] || die "loss: e.g. 1%, not '$value'"
      local pct=${BASH_REMATCH[1]}
      emulation_clear "$k"
      if have_netem "$k"; then
        in_ns "$k" tc qdisc add dev eth0 root netem loss "${pct}%"
        say "$(host_name "$k"): ${pct}% of the packets it sends lost (tc netem)"
      else
        need_iptables
        local p
        p=$(awk -v x="$pct" 'BEGIN { printf "%.6f", x / 100 }')
        in_ns "$k" iptables -A OUTPUT -o eth0 -m statistic --mode random --probability "$p" -j DROP
        say "$(host_name "$k"): ${pct}% of the packets it sends lost (iptables statistic: this kernel has no netem)"
      fi
      ;;
    *) die "netem K delay Nms | loss P% | clear" ;;
  esac
}

# iptables rules (in H's namespace) that drop its traffic, all or to and from one address.
partition_rules() {
  local k=$1 peer=${2:-}
  if [ -z "$peer" ]; then
    echo "INPUT -i eth0 -j DROP"
    echo "OUTPUT -o eth0 -j DROP"
  else
    echo "INPUT -i eth0 -s $peer/32 -j DROP"
    echo "OUTPUT -o eth0 -d $peer/32 -j DROP"
  fi
}

cmd_partition() {
  local k peer="" what="everything in and out dropped" rule
  k=$(host "${1:-}")
  have_ns "$k" || die "no $(host_name "$k")"
  case "${2:-}" in
    "") ;;
    root) peer="$SUBNET.1" what="cut off from the root namespace ($peer)" ;;
    *)
      local j
      j=$(host "$2")
      [ "$j" != "$k" ] || die "a host cannot be cut off from itself"
      peer=$(ip_of "$j") what="cut off from $(host_name "$j") ($peer)"
      ;;
  esac
  need_iptables
  while read -r chain rule; do
    # shellcheck disable=SC2086
    in_ns "$k" iptables -C "$chain" $rule 2>/dev/null || in_ns "$k" iptables -I "$chain" 1 $rule
  done < <(partition_rules "$k" "$peer")
  say "$(host_name "$k") partitioned: $what"
}

cmd_heal() {
  local k rule
  k=$(host "${1:-}")
  have_ns "$k" || die "no $(host_name "$k")"
  need_iptables
  # Every DROP rule on eth0 except the loss emulation's (statistic): all partitions.
  while rule=$(in_ns "$k" iptables -S 2>/dev/null | grep -E -- '^-A (INPUT|OUTPUT) .*-j DROP' | grep -v -m1 statistic | sed 's/^-A /-D /') && [ -n "$rule" ]; do
    # shellcheck disable=SC2086
    in_ns "$k" iptables $rule
  done
  say "$(host_name "$k") healed"
}

# A process that has exited but is not yet reaped (a zombie: its parent, often init, reaps
# it later, up to seconds later in some containers) counts as gone.
alive() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [ "${s%% *}" != Z ]
}

any_alive() {
  local p
  for p in "$@"; do alive "$p" && return 0; done
  return 1
}

cmd_down_locked() {
  local n k p f deadline pids=()
  # Every process inside our namespaces (nodes, delayers, anything run with `exec`), and
  # those whose pid files say they are ours (checked against their command line).
  for n in $(our_namespaces); do
    for p in $(ip netns pids "$n" 2>/dev/null); do pids+=("$p"); done
  done
  for f in "$DIR"/node-*.pid "$DIR"/delay-*.pid "$DIR"/etcd.pid; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    if grep -qE 'kvlab|nfqueue-delay|etcd' "/proc/$p/cmdline" 2>/dev/null; then pids+=("$p"); fi
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
  if command -v iptables >/dev/null; then
    while iptables -D FORWARD -i "$BR" -o "$BR" -m comment --comment "$BR" -j ACCEPT 2>/dev/null; do :; done
  fi
  # Deletion of a namespace's devices is asynchronous: wait (bounded) until they are gone.
  deadline=$((SECONDS + 5))
  while ip -o link show 2>/dev/null | grep -qE ": $KVNET-(v[0-9]+|br)[@:]" && ((SECONDS < deadline)); do sleep 0.1; done
  if [ -z "${KVNET_KEEP:-}" ]; then rm -rf "$DIR"; fi
  rm -f "/tmp/kvnet-$KVNET.lock"
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
    local state=stopped emu="" cut where
    if [ "$k" = 0 ]; then
      etcd_running && state="running (pid $(cat "$DIR/etcd.pid"))"
      where="$(ip_of 0):$ETCD_PORT"
    else
      running "$k" && state="running (pid $(pid_of "$k"))"
      where=$(addr "$k")
    fi
    emu=$(in_ns "$k" tc qdisc show dev eth0 2>/dev/null | grep -o 'netem.*' || true)
    [ -s "$DIR/delay-$k.pid" ] && emu="$emu nfqueue delayer"
    if command -v iptables >/dev/null; then
      cut=$(in_ns "$k" iptables -S INPUT 2>/dev/null | grep -- '-j DROP' | grep -v statistic | grep -oE -- '-s [0-9.]+' | sed 's/-s /from /; s|$| |' || true)
      in_ns "$k" iptables -C INPUT -i eth0 -j DROP 2>/dev/null && cut="everything "
      [ -n "$cut" ] && emu="$emu partitioned: ${cut% }"
    fi
    echo "$(host_name "$k") $where $state${emu:+ [${emu# }]}"
  done
  [ -s "$DIR/store" ] && echo "topology $(topology)"
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
  host) cmd_host "$@" ;;
  exec) k=$(host "${1:-}"); shift; have_ns "$k" || die "no $(host_name "$k")"; in_ns "$k" "$@" ;;
  addr) k=$(host "${1:-}"); if [ "$k" = 0 ]; then echo "$(ip_of 0):$ETCD_PORT"; else addr "$k"; fi ;;
  topology) topology ;;
  status) cmd_status ;;
  down) cmd_down ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
