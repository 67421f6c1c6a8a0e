#!/usr/bin/env bash
# The main job (make demo): dlock on its embedded default store, a single-node
# dlockd started here, with no other server. It
#   1. builds dlock, dlockd and the settlement example;
#   2. starts dlockd on loopback with its data in a temp dir;
#   3. runs the monthly payout brief: six workers start
#      `dlock run payout:2026-09 -- …` at the same moment; exactly one runs,
#      the other five exit 75;
#   4. runs the nightly settlement on dlockd with an embedded SQLite ledger and
#      a worker paused past its TTL, and prints the report;
#   5. stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
dlockd_pid=""
cleanup() {
  if [ -n "$dlockd_pid" ] && kill -0 "$dlockd_pid" 2>/dev/null; then
    kill -TERM "$dlockd_pid" 2>/dev/null || true
    wait "$dlockd_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*"; }

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

say "building dlock, dlockd and the settlement example"
go build -o "$work/dlock" ./cmd/dlock
go build -o "$work/dlockd" ./cmd/dlockd
go build -o "$work/settlement" ./examples/settlement

# dlockd's default port is 7450 (Raft on 7451); take the next free pair if busy.
port=7450
while port_busy "$port" || port_busy "$((port + 1))"; do port=$((port + 2)); done
store="dlockd://127.0.0.1:$port"

say "starting dlockd (single voter, fsync on) on 127.0.0.1:$port, data in $work/data"
"$work/dlockd" --listen "127.0.0.1:$port" --raft-bind "127.0.0.1:$((port + 1))" --data "$work/data" \
  2> "$work/dlockd.log" &
dlockd_pid=$!
for _ in $(seq 1 100); do
  if "$work/dlock" --store "$store" status demo:ready >/dev/null 2>&1; then break; fi
  if ! kill -0 "$dlockd_pid" 2>/dev/null; then cat "$work/dlockd.log"; echo "dlockd exited"; exit 1; fi
  sleep 0.1
done
head -n 1 "$work/dlockd.log"

say "monthly payout: six workers run 'dlock run payout:2026-09 -- …' at the same moment"
pids=()
for i in 1 2 3 4 5 6; do
  "$work/dlock" --store "$store" run --ttl 10s payout:2026-09 -- \
    sh -c "echo \"  worker $i: paying every vendor for 2026-09 under fence \$DLOCK_FENCE\"; sleep 2" \
    2>> "$work/payout-worker-$i.err" &
  pids+=($!)
done
ran=0 skipped=0 other=0
for i in "${!pids[@]}"; do
  code=0
  wait "${pids[$i]}" || code=$?
  case $code in
    0) ran=$((ran + 1)) ;;
    75) skipped=$((skipped + 1)); echo "  worker $((i + 1)): exit 75, not run ($(tail -n 1 "$work/payout-worker-$((i + 1)).err"))" ;;
    *) other=$((other + 1)); echo "  worker $((i + 1)): exit $code"; cat "$work/payout-worker-$((i + 1)).err" ;;
  esac
done
echo "  => $ran ran the payout, $skipped skipped (exit 75), $other other"
if [ "$ran" -ne 1 ] || [ "$skipped" -ne 5 ]; then
  echo "payout: expected exactly one run and five skips"; exit 1
fi

say "nightly settlement on dlockd, SQLite ledger, worker 3 paused past its TTL"
"$work/settlement" --store "$store" --ledger "sqlite:$work/ledger.db" --merchants 1000 --workers 8 \
  --ttl 2s --pause-worker 3 2> "$work/settlement.log" || { cat "$work/settlement.log"; exit 1; }
grep -E 'pausing|stale write' "$work/settlement.log" | sed 's/^/  log: /' || true

say "stopping dlockd"
kill -TERM "$dlockd_pid"
wait "$dlockd_pid" || true
dlockd_pid=""
echo "  done"
