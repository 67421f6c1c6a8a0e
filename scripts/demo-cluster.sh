#!/usr/bin/env bash
# The main job on a 3-node dlockd cluster (make demo-cluster). It
#   1. builds dlock, dlockd and the settlement example;
#   2. starts three dlockd nodes on loopback (--initial-cluster), each with
#      its data in a temp dir, and shows `dlock cluster status`;
#   3. runs the monthly payout brief against dlockd://<the 3 members>: six
#      workers start `dlock run payout:2026-09 -- …` at the same moment;
#      exactly one runs, the other five exit 75;
#   4. runs the nightly settlement against the same URL (SQLite ledger, a
#      worker paused past its TTL) and, once a quarter of the merchants are
#      settled, kills the leader with kill -9; the settlement rides through
#      the election, and the report must show every merchant settled once,
#      0 duplicates and the paused worker's stale write rejected;
#   5. restarts the killed node on its data, shows it back in the cluster,
#      and stops what it started (by PID).
# Environment: MERCHANTS (default 3000), TTL (settlement lease TTL, default 5s).
set -euo pipefail
cd "$(dirname "$0")/.."

merchants=${MERCHANTS:-3000}
ttl=${TTL:-5s}
work=$(mktemp -d)
declare -a node_pid=("" "" "")
settle_pid=""

cleanup() {
  if [ -n "$settle_pid" ] && kill -0 "$settle_pid" 2>/dev/null; then
    kill -TERM "$settle_pid" 2>/dev/null || true
    wait "$settle_pid" 2>/dev/null || true
  fi
  for i in 0 1 2; do
    p=${node_pid[$i]}
    if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
      kill -TERM "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*"; }
fail() { printf 'demo-cluster: %s\n' "$*" >&2; exit 1; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

say "building dlock, dlockd and the settlement example"
go build -o "$work/dlock" ./cmd/dlock
go build -o "$work/dlockd" ./cmd/dlockd
go build -o "$work/settlement" ./examples/settlement

# Node i (0-2) serves its API on base+10i and Raft on base+10i+1; take the
# next free block when 7450.. is busy (a local dlockd, another demo).
base=7450
block_busy() {
  for i in 0 1 2; do
    if port_busy $(($1 + 10 * i)) || port_busy $(($1 + 10 * i + 1)); then return 0; fi
  done
  return 1
}
while block_busy "$base"; do base=$((base + 100)); done
api() { echo "127.0.0.1:$((base + 10 * $1))"; }
raft() { echo "127.0.0.1:$((base + 10 * $1 + 1))"; }
initial="n1=$(raft 0),n2=$(raft 1),n3=$(raft 2)"
store="dlockd://$(api 0),$(api 1),$(api 2)"
dlock() { "$work/dlock" --store "$store" "$@"; }

start_node() { # start_node I [extra flags]: node n(I+1), data in $work/data-I
  local i=$1
  shift
  "$work/dlockd" --node-id "n$((i + 1))" --listen "$(api "$i")" --raft-bind "$(raft "$i")" \
    --data "$work/data-$i" "$@" 2>> "$work/dlockd-$i.log" &
  node_pid[$i]=$!
}

# leader_id prints the leader's node ID from `dlock cluster status -o json`
# (empty when none is known).
leader_id() {
  dlock cluster status -o json --retry-for 2s 2>/dev/null |
    sed -n 's/^  "leader_id": "\(.*\)",$/\1/p' | head -n 1
}

wait_leader() { # wait_leader SECONDS [NOT]: until a leader other than NOT is known
  local deadline=$((SECONDS + $1)) l
  while :; do
    l=$(leader_id)
    if [ -n "$l" ] && [ "$l" != "${2:-}" ]; then return 0; fi
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# all_registered: every member reports its state (its API address is
# registered and it answers).
all_registered() {
  local st
  st=$(dlock cluster status -o json --retry-for 2s 2>/dev/null) || return 1
  [ "$(printf '%s\n' "$st" | grep -c '"state": "[A-Z]')" -eq 3 ] &&
    ! printf '%s\n' "$st" | grep -q '"error": "[^"]'
}

say "starting 3 dlockd nodes (fsync on) on $(api 0), $(api 1), $(api 2); Raft on $(raft 0), $(raft 1), $(raft 2)"
for i in 0 1 2; do start_node "$i" --initial-cluster "$initial"; done
if ! wait_leader 30; then
  for i in 0 1 2; do echo "-- dlockd n$((i + 1)) log:"; tail -n 20 "$work/dlockd-$i.log"; done
  fail "no leader elected within 30 s"
fi
deadline=$((SECONDS + 30))
until all_registered; do
  [ "$SECONDS" -lt "$deadline" ] || break # shown as it is below
  sleep 0.1
done
dlock cluster status | sed 's/^/  /'
echo "  store URL: $store"

say "monthly payout: six workers run 'dlock run payout:2026-09 -- …' at the same moment"
pids=()
for i in 1 2 3 4 5 6; do
  dlock run --ttl 10s payout:2026-09 -- \
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
  fail "payout: expected exactly one run and five skips"
fi

say "nightly settlement of $merchants merchants on the cluster (TTL $ttl, worker 3 paused past its TTL); the leader is killed midway"
ledger="$work/ledger.db"
"$work/settlement" --store "$store" --ledger "sqlite:$ledger" --merchants "$merchants" --workers 8 \
  --ttl "$ttl" --pause-worker 3 > "$work/settlement.out" 2> "$work/settlement.log" &
settle_pid=$!

# settled_rows prints how many merchants the ledger holds so far (sqlite3
# when installed; else nothing).
settled_rows() {
  if command -v sqlite3 >/dev/null && [ -f "$ledger" ]; then
    sqlite3 -cmd '.timeout 2000' "$ledger" 'SELECT count(DISTINCT merchant) FROM settlements' 2>/dev/null || true
  fi
}
# Wait until a quarter of the merchants are settled (or, without sqlite3,
# until the paused worker has paused and a second more has passed).
deadline=$((SECONDS + 60))
while kill -0 "$settle_pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
  if command -v sqlite3 >/dev/null; then
    n=$(settled_rows)
    [ -n "$n" ] && [ "$n" -ge $((merchants / 4)) ] && break
  elif grep -q 'pausing inside the critical section' "$work/settlement.log" 2>/dev/null; then
    sleep 1
    break
  fi
  sleep 0.05
done
kill -0 "$settle_pid" 2>/dev/null || fail "the settlement ended before the leader could be killed (raise MERCHANTS): $(cat "$work/settlement.out" "$work/settlement.log")"

leader=$(leader_id)
[ -n "$leader" ] || fail "no leader known before the kill"
k=$((${leader#n} - 1))
before=$(settled_rows)
killed_at=$(date +%s%N)
kill -KILL "${node_pid[$k]}"
wait "${node_pid[$k]}" 2>/dev/null || true
echo "  kill -9 of the leader $leader (pid ${node_pid[$k]}) with ${before:-some} of $merchants merchants settled"
node_pid[$k]=""
if wait_leader 30 "$leader"; then
  echo "  new leader: $(leader_id), known $(( ($(date +%s%N) - killed_at) / 1000000 )) ms after the kill"
else
  fail "no new leader within 30 s of the kill"
fi

code=0
wait "$settle_pid" || code=$?
settle_pid=""
sed 's/^/  /' "$work/settlement.out"
grep -E 'pausing|stale write' "$work/settlement.log" | sed 's/^/  log: /' || true
if [ "$code" -ne 0 ]; then
  sed 's/^/  settlement: /' "$work/settlement.log" | tail -n 20
  fail "the settlement failed (exit $code)"
fi
grep -Eq "settled +$merchants / $merchants" "$work/settlement.out" || fail "not every merchant settled"
grep -Eq 'duplicates +0$' "$work/settlement.out" || fail "duplicates in the ledger"
grep -Eq 'stale rejected +[1-9]' "$work/settlement.out" || fail "the paused worker's stale write was not rejected"
echo "  => every merchant settled once, 0 duplicates, the stale write rejected, through a leader kill"

say "restarting $leader on its data"
start_node "$k"
# member_state ID prints the Raft state member ID reports (Follower, …).
member_state() {
  dlock cluster status -o json --retry-for 2s 2>/dev/null |
    awk -v id="\"$1\"," '$1 == "\"id\":" { cur = $2 } $1 == "\"state\":" && cur == id { gsub(/[",]/, "", $2); print $2 }'
}
deadline=$((SECONDS + 30))
until [ "$(member_state "$leader")" = "Follower" ] && all_registered; do
  [ "$SECONDS" -lt "$deadline" ] || { dlock cluster status | sed 's/^/  /'; fail "$leader did not come back as a follower within 30 s"; }
  sleep 0.2
done
dlock cluster status | sed 's/^/  /'

say "stopping the 3 nodes"
for i in 0 1 2; do
  p=${node_pid[$i]}
  if [ -n "$p" ]; then
    kill -TERM "$p"
    wait "$p" || true
    node_pid[$i]=""
  fi
done
echo "  done"
