#!/usr/bin/env bash
# Installs dynalite, the DynamoDB emulator that drivers/dynamodbdriver's tests
# start (internal/testservers/dynamodb.go), when missing: Debian's nodejs and
# npm first, then the pinned npm package into a cache directory (never a
# global npm install). Idempotent; the tests themselves need no network.
#
#   DLOCK_TEST_CACHE   cache root (default ~/.cache/dlock-test); dynalite goes
#                      to $DLOCK_TEST_CACHE/npm/dynalite
set -euo pipefail

DYNALITE_VERSION=4.0.0
cache="${DLOCK_TEST_CACHE:-$HOME/.cache/dlock-test}"
dir="$cache/npm/dynalite"
cli="$dir/node_modules/dynalite/cli.js"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "installing nodejs and npm (for dynalite)"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

installed=""
if [ -f "$dir/node_modules/dynalite/package.json" ]; then
  installed="$(node -p 'require(process.argv[1]).version' "$dir/node_modules/dynalite/package.json" 2>/dev/null || true)"
fi
if [ "$installed" = "$DYNALITE_VERSION" ] && [ -f "$cli" ]; then
  exit 0
fi
echo "installing dynalite@$DYNALITE_VERSION into $dir"
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "dynalite@$DYNALITE_VERSION" >/dev/null
test -f "$cli"
