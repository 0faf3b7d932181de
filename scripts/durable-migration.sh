#!/usr/bin/env bash
# Migration speed of durable nodes: NODES local nodes under `--durability sync`, KEYS values
# of VALUE bytes loaded through the ring, then one node removed and one added back; prints
# each migration's line (keys, MB moved, MB/s) and checks with `kvlab bench --verify` that
# every key reads back (0 misses, 0 errors) after each.
#
#   scripts/durable-migration.sh [KVLAB]        (default target/release/kvlab)
# Env: NODES (4), KEYS (10000), VALUE (4850, about an e-mail of the Enron set), BASE (7601).
set -euo pipefail
KVLAB=${1:-target/release/kvlab}
KVLAB=$(realpath "$KVLAB")
NODES=${NODES:-4} KEYS=${KEYS:-10000} VALUE=${VALUE:-4850} BASE=${BASE:-7601}
DIR=$(mktemp -d -t kvlab-durable-migration.XXXXXX)
cd "$DIR"
cleanup() { "$KVLAB" cluster down >/dev/null 2>&1 || true; rm -rf "$DIR"; }
trap cleanup EXIT
"$KVLAB" cluster up --nodes "$NODES" --base-port "$BASE" -- -t 2 -m 256 \
  --data-dir "$DIR/data" --durability sync >/dev/null
seed=127.0.0.1:$BASE
last=127.0.0.1:$((BASE + NODES - 1))
bench() { "$KVLAB" bench --cluster "$seed" --keys "$KEYS" --value-size "$VALUE" -T 1 -c 4 "$@"; }
bench --load --verify --requests 1 >/dev/null
verify() {
  local out
  out=$(bench --mix get=1 --key-dist sequential --requests "$KEYS" --verify --noload)
  if ! grep -q "misses 0)" <<<"$out" || ! grep -q "errors 0 (verification 0)" <<<"$out"; then
    echo "LOST OR WRONG after $1:"; echo "$out"; exit 1
  fi
  echo "  every one of $KEYS keys read back after $1"
}
echo "remove $last:"
"$KVLAB" cluster remove "$last" | grep migration
verify "the removal"
echo "add $last back:"
"$KVLAB" cluster add "$last" | grep migration
verify "the addition"
