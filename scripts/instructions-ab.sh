#!/usr/bin/env bash
# CPU instructions the server spends per request, for each I/O model, of two kvlab builds:
# a speed comparison that the machine's noise cannot move (callgrind counts instructions,
# not seconds). The complement of `kvlab lab run sustained-ab`, whose rates a busy machine blurs.
#
#   scripts/instructions-ab.sh A_BIN B_BIN [A_NAME] [B_NAME]
#
# For every model and build: the server runs under `valgrind --tool=callgrind` (`-t 1 -m 64
# --crawler-interval-ms 0`), A_BIN's `kvlab bench` sends first $N1 then (on a fresh server)
# $N2 requests, closed loop, $CONNS connections, depth $DEPTH, 1 KB values, get:set 90:10,
# 1000 keys (filled first, on both); the server's instruction count Ir of the two runs differ
# by the cost of N2 - N1 requests, so start-up and shutdown cancel out.
# With COUNT=syscalls the server runs under `strace -f -c` instead and the table gives system
# calls per request (the other cost a refactor could add on the hot path).
# Env: MODELS ("reactor threaded epoll signal"), N1 (5000), N2 (25000), CONNS (4), DEPTH (1),
#      COUNT (instructions | syscalls).
set -euo pipefail
A=$1 B=$2 AN=${3:-before} BN=${4:-after}
MODELS=${MODELS:-reactor threaded epoll signal}
N1=${N1:-5000} N2=${N2:-25000} CONNS=${CONNS:-4} DEPTH=${DEPTH:-1}
COUNT=${COUNT:-instructions}
OUT=$(mktemp -d -t kvlab-instructions-ab.XXXXXX)
echo "raw results in $OUT" >&2

# ir BIN MODEL N -> the server's total instructions (Ir) for a run of N requests
ir() {
  local bin=$1 model=$2 n=$3 tag="$OUT/$AN-$BN-$RANDOM" port srv
  if [ "$COUNT" = syscalls ]; then
    strace -f -c -o "$tag.cg" "$bin" server -p 0 -t 1 -m 64 \
      --io "$model" --crawler-interval-ms 0 2>"$tag.server" &
  else
    valgrind --tool=callgrind --callgrind-out-file="$tag.cg" "$bin" server -p 0 -t 1 -m 64 \
      --io "$model" --crawler-interval-ms 0 2>"$tag.server" &
  fi
  srv=$!
  for _ in $(seq 600); do
    port=$(grep -o '127.0.0.1:[0-9]*' "$tag.server" 2>/dev/null | head -1 || true)
    [ -n "$port" ] && break
    timeout 0.1 tail -f /dev/null || true   # poll while the server starts under valgrind
  done
  [ -n "$port" ] || { echo "server $bin $model did not start" >&2; kill "$srv"; return 1; }
  timeout 300 "$A" bench -s "$port" -q --requests "$n" -c "$CONNS" -d "$DEPTH" --value-size 1024 \
    --mix get=9,set=1 --keys 1000 >"$tag.bench" 2>&1
  # under strace, stop the server itself (strace then writes its table and exits)
  if [ "$COUNT" = syscalls ]; then pkill -INT -P "$srv" || true; else kill -INT "$srv"; fi
  wait "$srv" 2>/dev/null || true
  if [ "$COUNT" = syscalls ]; then
    awk '$NF == "total" {print $4 + 0; exit}' "$tag.cg"   # the calls column of the total line
  else
    awk '/^summary:|^totals:/ {print $2; exit}' "$tag.cg"
  fi
}

printf '| I/O model | %s: %s per request | %s: %s per request | %s/%s |\n' "$AN" "$COUNT" "$BN" "$COUNT" "$BN" "$AN"
printf '|---|---:|---:|---:|\n'
for model in $MODELS; do
  a1=$(ir "$A" "$model" "$N1"); a2=$(ir "$A" "$model" "$N2")
  b1=$(ir "$B" "$model" "$N1"); b2=$(ir "$B" "$model" "$N2")
  echo "$model $AN: $a1 / $a2, $BN: $b1 / $b2" >&2
  python3 -c 'import sys; m,a1,a2,b1,b2,n=sys.argv[1:]; n=int(n); a=(int(a2)-int(a1))/n; b=(int(b2)-int(b1))/n; print(f"| {m} | {a:,.2f} | {b:,.2f} | {b/a:.3f} |")' \
    "$model" "$a1" "$a2" "$b1" "$b2" "$((N2 - N1))"
done
echo
echo "(server -t 1 under $([ "$COUNT" = syscalls ] && echo "strace -f -c" || echo callgrind); $N1 and $N2 requests, closed loop, $CONNS connections, depth $DEPTH, 1 KB values, get:set 90:10; the difference of the two runs' counts per request)"
