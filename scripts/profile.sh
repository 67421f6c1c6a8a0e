#!/usr/bin/env bash
# CPU profiles of one W1 cell against a single durable dlockd (issue 11,
# item 7): 64 clients (PROFILE_CLIENTS), each try-acquire + release on its
# own key, for PROFILE_SECONDS (default 20). It
#   1. builds dlockd and starts it on a free loopback port with --pprof and
#      its data in a temp dir (fsync on);
#   2. runs internal/bench's BenchmarkProfileCell with -cpuprofile (the client
#      side: the dlock library and the dlockd driver), and meanwhile takes
#      dlockd's own CPU profile from /debug/pprof/profile;
#   3. prints the top functions of both and the cell's cycles/s, and leaves
#      the profiles in PROFILE_OUT (default a temp dir, printed);
#   4. stops the dlockd it started, by PID.
# PROFILE_WORKLOAD=w2 profiles a W2 cell instead: the clients queue on one
# key, and a cycle is a handoff.
# Usage: scripts/profile.sh            (or PROFILE_OUT=/tmp/p PROFILE_SECONDS=30 ...)
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${PROFILE_SECONDS:-20}
clients=${PROFILE_CLIENTS:-64}
out=${PROFILE_OUT:-$(mktemp -d)}
mkdir -p "$out"
work=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/dlockd" ./cmd/dlockd
go test -c -o "$work/bench.test" ./internal/bench
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
raft=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$work/dlockd" --listen "127.0.0.1:$port" --raft-bind "127.0.0.1:$raft" --data "$work/data" --pprof \
  >"$out/dlockd.log" 2>&1 &
pid=$!
# Wait until dlockd leads (/readyz), not only until it answers HTTP: a
# client that dials before the election finds the Session stream refused
# and uses the unary RPCs until its retry (up to 2 s later), so the cell's
# first seconds would measure another path.
for _ in $(seq 200); do
  if curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then break; fi
  sleep 0.1
done

# The server profile covers the middle of the cell: it starts 2 s in and
# ends 2 s before the cell does.
( sleep 2; curl -fsS -o "$out/dlockd.prof" \
    "http://127.0.0.1:$port/debug/pprof/profile?seconds=$((secs - 4))" ) &
srv=$!
BENCH_PROFILE_STORE="dlockd://127.0.0.1:$port" BENCH_PROFILE_SERVER_PID=$pid BENCH_PROFILE_CLIENTS=$clients BENCH_DURATION=${secs}s \
  BENCH_PROFILE_WORKLOAD=${PROFILE_WORKLOAD:-w1} \
  "$work/bench.test" -test.run '^$' -test.bench ProfileCell -test.benchtime 1x \
  -test.cpuprofile "$out/client.prof" | tee "$out/bench.txt"
wait "$srv"
cp "$work/bench.test" "$out/bench.test"
cp "$work/dlockd" "$out/dlockd"

echo
echo "== dlockd: top functions (flat), $((secs - 4)) s of the cell"
go tool pprof -top -nodecount 25 "$out/dlockd" "$out/dlockd.prof" 2>/dev/null | sed -n '1,32p'
echo
echo "== client (dlock library + dlockd driver): top functions (flat)"
go tool pprof -top -nodecount 25 "$out/bench.test" "$out/client.prof" 2>/dev/null | sed -n '1,32p'
echo
echo "profiles and binaries in $out"
