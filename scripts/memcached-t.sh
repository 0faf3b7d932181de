#!/usr/bin/env bash
# Runs memcached's own test files (t/*.t of a memcached source tree) against a running
# `kvlab server`, and against memcached itself as the reference, through the test
# library's T_MEMD_USE_DAEMON=host:port mode (new_memcached connects to that daemon
# instead of starting memcached-debug).
#
#   scripts/memcached-t.sh SRC_DIR [KVLAB] [-- FILE.t ...]
#
# SRC_DIR is a memcached source tree (its t/ is used, nothing is built); KVLAB is the
# kvlab binary (default: target/release/kvlab). For each file, a fresh daemon is started
# on a free 127.0.0.1 port with the flags the file gives its first new_memcached(...)
# (kvlab: a -o option it does not know is dropped and shown), the file is run with
# `prove -v`, the daemon is stopped, and one line is printed:
#
#   FILE  memcached: pass|fail  kvlab: pass|fail  [flags kvlab dropped]
#
# followed by the first failing assertions of each failure and a summary. Every daemon
# of a file is the one daemon: a file that calls new_memcached again with other flags
# (or stops or restarts its server) gets the first one. Logs: $LOG_DIR (default
# /tmp/memcached-t). MEMCACHED names the reference binary (default: memcached on PATH;
# MEMCACHED=none skips it).
#
# The files of SPAWN (below: those that start several servers, or give a server flags
# only the test computes — a pid file, a socket path, a UDP port) run as memcached's
# own `make test` runs them: the test library starts each server itself, through the
# build directory's memcached-debug (here: the binary under test) and timedrun (here: a
# stub that runs its command, stopped after the seconds it is given). The library adds `-o relaxed_privileges` (a switch of
# memcached-debug's sandbox, refused by release builds) and `-U <port>` to every
# server: memcached-debug drops the first, and for kvlab the second too (kvlab serves
# no UDP: udp.t's UDP assertions fail on their own). Such a file's line says
# `[spawned]`.
set -u

SRC=${1:?usage: $0 SRC_DIR [KVLAB] [-- FILE.t ...]}
shift
KVLAB=target/release/kvlab
if [ $# -gt 0 ] && [ "$1" != "--" ]; then KVLAB=$1; shift; fi
[ "${1:-}" = "--" ] && shift
FILES=("$@")
if [ ${#FILES[@]} -eq 0 ]; then
    FILES=(stats.t lru.t conn-limits.t dyn-maxbytes.t issue_50.t issue_61.t issue_183.t
        watcher_connid.t getset.t incrdecr.t cas.t noreply.t flush-all.t expirations.t
        multiversioning.t flags.t touch.t getandtouch.t 64bit.t issue_3.t issue_14.t
        issue_22.t issue_29.t issue_41.t issue_42.t issue_70.t issue_104.t issue_108.t)
fi
# Files that cannot pass against one already-running release daemon, whichever it is;
# they still run, and their result is shown with this note.
declare -A NOT_RUNNABLE=(
    [flush-all.t]="starts two more servers, new_memcached('-F') and new_memcached('-C'); a daemon keeps its first flags (tests 25-27)"
    [expirations.t]="moves the server's clock with debugtime, a command of memcached-debug builds only (tests 3, 8, 16, 17, 36)"
)
declare -A SPAWN=([daemonize.t]=1 [udp.t]=1 [stats-conns.t]=1 [lru-maintainer.t]=1
    [00-startup.t]=1 [item_size_max.t]=1 [issue_67.t]=1 [restart.t]=1)
MEMCACHED=${MEMCACHED:-$(command -v memcached || echo none)}
LOG_DIR=${LOG_DIR:-/tmp/memcached-t}
TIMEOUT=${TIMEOUT:-300}

SRC=$(cd "$SRC" && pwd) || exit 2
[ -f "$SRC/t/lib/MemcachedTest.pm" ] || { echo "no t/lib/MemcachedTest.pm in $SRC" >&2; exit 2; }
KVLAB=$(command -v "$KVLAB" || echo "$KVLAB")
[ -x "$KVLAB" ] || { echo "kvlab binary $KVLAB not found (cargo build --release -p kvlab)" >&2; exit 2; }
KVLAB=$(cd "$(dirname "$KVLAB")" && pwd)/$(basename "$KVLAB")
mkdir -p "$LOG_DIR"

# MemcachedTest.pm takes the current directory as memcached's build directory: it asks
# ./memcached-debug -h which features the daemon has (supports_unix_socket, ...). Each
# daemon gets a directory of its own with t/ and a memcached-debug that is that daemon.
setup_dir() { # kind
    local d=$LOG_DIR/$1.build
    mkdir -p "$d"
    ln -sfn "$SRC/t" "$d/t"
    # The binary under test as the library's memcached-debug: -o relaxed_privileges
    # (memcached-debug's sandbox switch, which release builds refuse) is dropped, and
    # for kvlab -U (UDP) too; the rest is passed as given.
    local exe drop_udp=0
    exe=$(printf %q "$MEMCACHED")
    [ "$1" = kvlab ] && exe="$(printf %q "$KVLAB") server" && drop_udp=1
    cat >"$d/memcached-debug" <<EOF
#!/usr/bin/env bash
args=()
while [ \$# -gt 0 ]; do
    case "\$1" in
    -o) if [ "\${2:-}" = relaxed_privileges ]; then shift 2; continue; fi ;;
    -U) if [ $drop_udp = 1 ]; then shift 2; continue; fi ;;
    esac
    args+=("\$1")
    shift
done
exec $exe "\${args[@]}"
EOF
    chmod +x "$d/memcached-debug"
    # memcached's timedrun (a build product): runs its command, stopped (SIGINT, then
    # SIGKILL) after the given seconds, so that a server the file never stops ends.
    printf '#!/bin/sh\nsecs=$1\nshift\nexec timeout -s INT -k 5 "$secs" "$@"\n' >"$d/timedrun"
    chmod +x "$d/timedrun"
    echo "$d"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The flags of a file's first new_memcached(...) call ('' when it passes none).
file_args() {
    perl -0ne 'if (/new_memcached\(\s*(?:(["\x27])(.*?)\1)?\s*[,)]/s) { print $2 // ""; }' "$1"
}

# The T_MEMD_* variables a file sets for the daemon it starts (memcached's test hooks).
file_env() {
    perl -ne 'print "$1=$3\n" if /\$ENV\{(T_MEMD_\w+)\}\s*=\s*(["\x27]?)([^"\x27;]*)\2/' "$1"
}

PID=
DROPPED=
# start_daemon KIND PORT ARGS... : starts it, waits for its port; returns 1 if it exits.
start_daemon() {
    local kind=$1 port=$2 log=$3
    shift 3
    local args=("$@")
    DROPPED=
    local env=()
    [ -n "${FILE_ENV:-}" ] && mapfile -t env <<<"$FILE_ENV"
    for _ in 1 2 3 4 5 6 7 8; do
        if [ "$kind" = kvlab ]; then
            env "${env[@]}" "$KVLAB" server -l 127.0.0.1 -p "$port" "${args[@]}" >"$log" 2>&1 &
        else
            local u=()
            [ "$(id -u)" = 0 ] && u=(-u root)
            env "${env[@]}" "$MEMCACHED" -l 127.0.0.1 -p "$port" -U 0 "${u[@]}" "${args[@]}" >"$log" 2>&1 &
        fi
        PID=$!
        for _ in $(seq 100); do
            if ! kill -0 "$PID" 2>/dev/null; then break; fi
            if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
            sleep 0.05
        done
        # Not answering on the port (a daemon on a unix socket only): stop it.
        kill "$PID" 2>/dev/null
        wait "$PID" 2>/dev/null
        PID=
        # kvlab refuses a -o option it does not know: drop it and try again.
        local opt
        opt=$(sed -n 's/.*unsupported -o option "\([^"]*\)".*/\1/p' "$log" | head -1)
        [ "$kind" = kvlab ] && [ -n "$opt" ] || return 1
        DROPPED="$DROPPED -o $opt"
        local new=() a
        local i=0
        while [ $i -lt ${#args[@]} ]; do
            a=${args[$i]}
            if [ "$a" = -o ] && [ $((i + 1)) -lt ${#args[@]} ]; then
                local v
                v=$(tr ',' '\n' <<<"${args[$((i + 1))]}" | grep -vxF -- "$opt" | paste -sd, -)
                [ -n "$v" ] && new+=(-o "$v")
                i=$((i + 2))
                continue
            fi
            new+=("$a")
            i=$((i + 1))
        done
        args=("${new[@]}")
    done
    return 1
}

stop_daemon() {
    [ -n "$PID" ] || return 0
    kill "$PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
}
trap 'stop_daemon' EXIT

# run_one KIND FILE -> sets RESULT (pass|fail|skip|error) and writes the log.
run_one() {
    local kind=$1 f=$2 dir port args log
    dir=$(setup_dir "$kind")
    log=$LOG_DIR/$kind.${f%.t}.log
    if [ -n "${SPAWN[$f]:-}" ]; then
        DROPPED=
        # The library starts (and stops) the servers; SIGINT ignored as below.
        (
            cd "$dir" || exit 1
            trap '' INT
            exec setsid timeout "$TIMEOUT" prove -v "t/$f"
        ) >"$log" 2>&1 </dev/null
        local rc=$?
        if [ $rc -eq 0 ]; then
            if grep -q "^t/$f \.* skipped" "$log"; then RESULT=skip; else RESULT=pass; fi
        else
            RESULT=fail
        fi
        return
    fi
    # The flags are words, as new_memcached splits them.
    read -r -a args <<<"$(file_args "$SRC/t/$f")"
    port=$(free_port)
    FILE_ENV=$(file_env "$SRC/t/$f")
    if ! start_daemon "$kind" "$port" "$log.daemon" "${args[@]}"; then
        RESULT=error
        { echo "$kind did not start with: ${args[*]}"; cat "$log.daemon"; } >"$log"
        return
    fi
    # A daemon handle's DESTROY signals its (absent) pid: run the file in a session of
    # its own, with SIGINT ignored, so that signal reaches nobody.
    (
        cd "$dir" || exit 1
        trap '' INT
        T_MEMD_USE_DAEMON=127.0.0.1:$port exec setsid timeout "$TIMEOUT" prove -v "t/$f"
    ) >"$log" 2>&1 </dev/null
    local rc=$?
    stop_daemon
    if [ $rc -eq 0 ]; then
        if grep -q "^t/$f \.* skipped" "$log"; then RESULT=skip; else RESULT=pass; fi
    else
        RESULT=fail
    fi
}

# The first failing assertions of a log (three at most, with what was got and expected).
failures() {
    awk '/^#   Failed test/ { n++; on = (n <= 3) } /^# Looks like/ { on = 0 } /^$/ { on = 0 }
        on { print "  " $0 }' "$1" | head -16
    grep -E 'Bad plan|Dubious|did not start|[Ff]ailed to connect|timeout|alarm' "$1" |
        head -3 | sed 's/^/  /'
}

echo "memcached: $MEMCACHED ($("$MEMCACHED" -V 2>/dev/null)); kvlab: $KVLAB; t/ of $SRC"
declare -A MR KR
for f in "${FILES[@]}"; do
    if [ ! -f "$SRC/t/$f" ]; then printf '%-20s (no such file)\n' "$f"; continue; fi
    if [ "$MEMCACHED" != none ]; then run_one memcached "$f"; MR[$f]=$RESULT; else MR[$f]=-; fi
    run_one kvlab "$f"
    KR[$f]=$RESULT
    note=
    [ -n "${NOT_RUNNABLE[$f]:-}" ] && note=" [not runnable against a daemon]"
    [ -n "${SPAWN[$f]:-}" ] && note=" [spawned]"
    printf '%-20s memcached: %-6s kvlab: %-6s%s%s\n' "$f" "${MR[$f]}" "${KR[$f]}" \
        "${DROPPED:+ kvlab dropped:$DROPPED}" "$note"
done

echo
for f in "${FILES[@]}"; do
    [ -n "${NOT_RUNNABLE[$f]:-}" ] && echo "--- $f: not runnable against a daemon: ${NOT_RUNNABLE[$f]}"
    for kind in memcached kvlab; do
        r=${MR[$f]:-}
        [ $kind = kvlab ] && r=${KR[$f]:-}
        [ "$r" = fail ] || [ "$r" = error ] || continue
        echo "--- $f ($kind: $r; log $LOG_DIR/$kind.${f%.t}.log)"
        if [ -n "${NOT_RUNNABLE[$f]:-}" ]; then
            grep '^not ok' "$LOG_DIR/$kind.${f%.t}.log" | sed 's/^/  /'
        else
            failures "$LOG_DIR/$kind.${f%.t}.log"
        fi
    done
done

n=0 mp=0 kp=0 both=0
for f in "${FILES[@]}"; do
    if [ -z "${KR[$f]:-}" ] || [ -n "${NOT_RUNNABLE[$f]:-}" ]; then continue; fi
    n=$((n + 1))
    [ "${MR[$f]}" = pass ] && mp=$((mp + 1))
    [ "${KR[$f]}" = pass ] && kp=$((kp + 1))
    [ "${MR[$f]}" = pass ] && [ "${KR[$f]}" != pass ] && both=$((both + 1))
done
echo
echo "summary: $n files runnable against a daemon; memcached passes $mp, kvlab passes $kp;" \
    "$both pass on memcached and not on kvlab"
[ "$both" -eq 0 ]
