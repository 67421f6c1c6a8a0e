#!/usr/bin/env bash
# Installs the store servers the tests start (Debian packages), when missing.
# The tests start and stop each server themselves on free loopback ports.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
[ -d /usr/share/zookeeper ] || missing+=(zookeeper)
# promtool checks deploy/prometheus's alert rules; Chromium drives the
# dashboard's browser test (headless, started by the test itself).
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# systemd-analyze verifies deploy/systemd's unit.
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
# Node.js runs the cloud stores' emulators (npm packages, installed below
# into a cache directory, never globally).
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing test servers: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts the packaged services; the tests use their own instances.
  for svc in redis-server postgresql etcd zookeeper prometheus prometheus-node-exporter; do
    $SUDO service "$svc" stop >/dev/null 2>&1 || true
  done
fi

# The emulators and Go-built test servers of the other stores, each by its
# own script (idempotent: a cached install is kept).
for dep in "$(dirname "$0")"/test-deps/*.sh; do
  [ -e "$dep" ] || continue
  bash "$dep"
done
