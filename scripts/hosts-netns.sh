#!/usr/bin/env bash
# Hosts for the lab's multi-host tests on one box: N network namespaces on a bridge (made by
# cluster-netns.sh beside this script, whose naming they share), each with a `tc netem` delay
# on its link and its own OpenSSH server listening on its address, reachable with a key made
# for this set of hosts alone.
#
#   scripts/hosts-netns.sh up N     hosts 1..N; prints one line per host: NAME ADDRESS NAMESPACE
#   scripts/hosts-netns.sh ssh K [CMD...]   ssh to host K with the hosts' key (a shell without CMD)
#   scripts/hosts-netns.sh status   the hosts, their sshd and their delay
#   scripts/hosts-netns.sh down     stop every sshd and every process in the namespaces, remove
#                                   the namespaces, veths, bridge and the state directory
#
# Host K is namespace KVHOSTS-K at SUBNET.(10+K) (10.77.40.11 for host 1), as cluster-netns.sh
# numbers its nodes; the bridge is SUBNET.1, in the root namespace. Every packet a host sends
# is delayed by 0.10-0.25 ms (host K: 0.10 + 0.05 × ((K-1) mod 4) ms, by `tc netem` on its
# interface, or cluster-netns.sh's NFQUEUE delayer where the kernel has no netem): between two
# hosts each direction is delayed once, as on a data-centre link.
#
# The state directory (KVHOSTS_DIR) holds everything `up` makes, and `down` removes it:
#   id_ed25519, id_ed25519.pub   the client key (made at `up`, no passphrase)
#   authorized_keys              that key, the only one any host's sshd accepts
#   known_hosts                  every host's key by address (StrictHostKeyChecking can stay on)
#   ssh_config                   `Host KVHOSTS-K` entries: ssh -F DIR/ssh_config KVHOSTS-1
#   hosts                        one line per host: NAME ADDRESS NAMESPACE
#   host-K/                      host K's sshd: sshd_config, host key, pid, log
#   net/, net.log                cluster-netns.sh's state and what it said
# Each sshd is Debian's /usr/sbin/sshd (openssh-server) with its own configuration: key
# authentication only, as root, no PAM, port 22 on the host's address only.
#
# Environment: KVHOSTS (name, ≤ 8 lower-case letters and digits; default kvhost), KVHOSTS_SUBNET
# (default 10.77.40; 10.77.X as cluster-netns.sh requires), KVHOSTS_DIR (default
# /tmp/kvhosts-KVHOSTS), SSHD (default /usr/sbin/sshd). Needs root, iproute2, openssh-server and
# openssh-client (ssh-keygen, ssh). Every wait is bounded; `up` removes what it made if it
# fails; `down` is idempotent.
set -euo pipefail

KVHOSTS=${KVHOSTS:-kvhost}
SUBNET=${KVHOSTS_SUBNET:-10.77.40}
DIR=${KVHOSTS_DIR:-/tmp/kvhosts-$KVHOSTS}
SSHD=${SSHD:-/usr/sbin/sshd}
HERE=$(cd "$(dirname "$0")" && pwd)
NET="$HERE/cluster-netns.sh"
MAX_HOSTS=100

die() { echo "hosts-netns: $*" >&2; exit 1; }
say() { echo "hosts-netns: $*" >&2; }

[[ $KVHOSTS =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "KVHOSTS=$KVHOSTS: 1-8 lower-case letters and digits"
[ -f "$NET" ] || die "no $NET (this script uses it for the namespaces)"

# cluster-netns.sh on our network and state.
net() { KVNET=$KVHOSTS KVNET_SUBNET=$SUBNET KVNET_DIR=$DIR/net KVNET_KEEP=1 bash "$NET" "$@"; }

ns() { echo "$KVHOSTS-$1"; }
ip_of() { echo "$SUBNET.$((10 + $1))"; }
# Host K's delay, ms: 0.10, 0.15, 0.20, 0.25, 0.10, …
delay_of() { echo "0.$((10 + 5 * (($1 - 1) % 4)))"; }
hdir() { echo "$DIR/host-$1"; }
sshd_pid() { cat "$(hdir "$1")/sshd.pid" 2>/dev/null || true; }
sshd_running() {
  local p
  p=$(sshd_pid "$1")
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null && grep -q sshd "/proc/$p/cmdline" 2>/dev/null
}
# The host numbers `up` made (a directory each, made before its sshd starts).
our_hosts() {
  local d
  for d in "$DIR"/host-*; do
    [ -d "$d" ] && echo "${d##*-}"
  done
  return 0
}

# The client key and the files every host shares.
keys_up() {
  mkdir -p "$DIR"
  chmod 700 "$DIR"
  if [ ! -f "$DIR/id_ed25519" ]; then
    ssh-keygen -q -t ed25519 -N '' -C "kvlab-hosts-$KVHOSTS" -f "$DIR/id_ed25519"
  fi
  cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
  chmod 600 "$DIR/authorized_keys"
  : >"$DIR/known_hosts"
  : >"$DIR/ssh_config"
  : >"$DIR/hosts"
}

sshd_config() {
  local k=$1 d
  d=$(hdir "$k")
  cat <<EOF
# sshd of namespace host $(ns "$k"), made by hosts-netns.sh
ListenAddress $(ip_of "$k"):22
HostKey $d/ssh_host_ed25519_key
PidFile $d/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers root
UsePAM no
# The files live under /tmp (world-writable): sshd's ownership walk would refuse them.
StrictModes no
# One multiplexed connection carries many sessions at once.
MaxSessions 64
MaxStartups 64:30:128
PrintMotd no
PrintLastLog no
UseDNS no
Subsystem sftp internal-sftp
EOF
}

# The first line sshd says (its banner), read from the root namespace across the bridge (≤ 1 s).
banner() {
  timeout 1 bash -c "exec 3<>/dev/tcp/$(ip_of "$1")/22 && read -r -t 1 line <&3 && [[ \$line == SSH-2.0-* ]]" 2>/dev/null
}

host_up() {
  local k=$1 d addr
  d=$(hdir "$k")
  addr=$(net host "$k" 2>>"$DIR/net.log") || { cat "$DIR/net.log" >&2; die "host $k: no namespace"; }
  [ "$addr" = "$(ip_of "$k")" ] || die "host $k: cluster-netns.sh made $addr, expected $(ip_of "$k")"
  net netem "$k" delay "$(delay_of "$k")ms" 2>>"$DIR/net.log" || { cat "$DIR/net.log" >&2; die "host $k: no delay"; }
  mkdir -p "$d"
  [ -f "$d/ssh_host_ed25519_key" ] ||
    ssh-keygen -q -t ed25519 -N '' -C "$(ns "$k")" -f "$d/ssh_host_ed25519_key"
  sshd_config "$k" >"$d/sshd_config"
  "$SSHD" -t -f "$d/sshd_config" || die "host $k: sshd rejects its configuration ($d/sshd_config)"
  if ! sshd_running "$k"; then
    # -D: stays in the foreground, so its pid is $! (sshd also writes it to its PidFile).
    ip netns exec "$(ns "$k")" "$SSHD" -D -e -f "$d/sshd_config" </dev/null >"$d/sshd.log" 2>&1 9>&- &
    echo $! >"$d/sshd.pid"
  fi
  echo "$(ip_of "$k") $(cut -d' ' -f1,2 "$d/ssh_host_ed25519_key.pub")" >>"$DIR/known_hosts"
  cat >>"$DIR/ssh_config" <<EOF
Host $(ns "$k")
  HostName $(ip_of "$k")
  User root
  IdentityFile $DIR/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $DIR/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 5
EOF
  echo "$(ns "$k") $(ip_of "$k") $(ns "$k")" >>"$DIR/hosts"
}

wait_sshd() {
  local k=$1 deadline=$((SECONDS + 10))
  until banner "$k"; do
    sshd_running "$k" || { tail -3 "$(hdir "$k")/sshd.log" >&2 || true; die "host $k: sshd exited"; }
    ((SECONDS < deadline)) || die "host $k: sshd ($(ip_of "$k"):22) silent for 10 s"
    sleep 0.05
  done
}

up_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    say "up failed: removing what it made"
    cmd_down
  fi
}

cmd_up() {
  local n=${1:-} k
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > MAX_HOSTS)); then
    die "up: a number of hosts 1..$MAX_HOSTS, not '$n'"
  fi
  [ -x "$SSHD" ] || die "no $SSHD (apt-get install openssh-server)"
  command -v ssh-keygen >/dev/null || die "no ssh-keygen (apt-get install openssh-client)"
  # sshd's privilege separation directory (Debian's package makes it at boot only).
  mkdir -p /run/sshd
  trap up_exit EXIT
  trap 'exit 130' INT TERM
  keys_up
  for ((k = 1; k <= n; k++)); do host_up "$k"; done
  for ((k = 1; k <= n; k++)); do wait_sshd "$k"; done
  trap - EXIT
  cat "$DIR/hosts"
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

cmd_down() {
  local k p pids=() deadline
  for k in $(our_hosts); do
    sshd_running "$k" && pids+=("$(sshd_pid "$k")")
  done
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    deadline=$((SECONDS + 5))
    while any_alive "${pids[@]}" && ((SECONDS < deadline)); do sleep 0.05; done
    kill -KILL "${pids[@]}" 2>/dev/null || true
  fi
  # Whatever else runs in the namespaces (sessions, what they started), the namespaces,
  # veths and bridge: cluster-netns.sh's own `down`.
  if [ -d "$DIR/net" ] || ip link show "$KVHOSTS-br" >/dev/null 2>&1; then
    net down
  fi
  rm -rf "$DIR"
  say "down: no sshd, namespace, veth, bridge or file of $KVHOSTS left"
}

cmd_ssh() {
  local k=${1:-}
  shift || true
  [ -f "$DIR/ssh_config" ] || die "no hosts (up first)"
  grep -q "^Host $(ns "$k")\$" "$DIR/ssh_config" || die "no host '$k'"
  exec ssh -F "$DIR/ssh_config" "$(ns "$k")" "$@"
}

cmd_status() {
  local k state delay
  [ -d "$DIR" ] || { echo "no hosts ($DIR)"; return 0; }
  for k in $(our_hosts); do
    state="sshd stopped"
    sshd_running "$k" && state="sshd running (pid $(sshd_pid "$k"))"
    delay=$(ip netns exec "$(ns "$k")" tc qdisc show dev eth0 2>/dev/null | grep -o 'netem.*' || true)
    [ -s "$DIR/net/delay-$k.pid" ] && delay="nfqueue delayer, $(delay_of "$k") ms"
    echo "$(ns "$k") $(ip_of "$k") $state [${delay:-no delay}]"
  done
}

[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
cmd=${1:-}
shift || true
case "$cmd" in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  ssh) cmd_ssh "$@" ;;
  status) cmd_status ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
