#!/usr/bin/env bash
# Installs Azurite, the Azure Storage emulator that drivers/azblobdriver's
# tests start (its blob service only, on a free loopback port), when it is
# missing: Debian's nodejs and npm first, then the npm package azurite at a
# pinned version into the test cache (never a global npm install):
#
#   ${DLOCK_TEST_CACHE:-$HOME/.cache/dlock-test}/npm/azurite/node_modules/.bin/azurite-blob
#
# internal/testservers/azurite.go looks for it there (or at $AZURITE_BLOB).
# Idempotent: a second run with the pinned version in place does nothing.
set -euo pipefail

AZURITE_VERSION=3.37.0
cache="${DLOCK_TEST_CACHE:-$HOME/.cache/dlock-test}"
prefix="$cache/npm/azurite"
bin="$prefix/node_modules/.bin/azurite-blob"
pkgjson="$prefix/node_modules/azurite/package.json"

installed_version() {
  [ -x "$bin" ] && [ -f "$pkgjson" ] || return 1
  node -e 'process.stdout.write(require(process.argv[1]).version)' "$pkgjson" 2>/dev/null
}

if [ "$(installed_version || true)" = "$AZURITE_VERSION" ]; then
  exit 0
fi

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "installing nodejs and npm (for Azurite)"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

echo "installing azurite@$AZURITE_VERSION into $prefix"
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION" >/dev/null
got="$(installed_version || true)"
if [ "$got" != "$AZURITE_VERSION" ]; then
  echo "azblob.sh: azurite $AZURITE_VERSION did not install into $prefix (found '${got}')" >&2
  exit 1
fi
