#!/usr/bin/env bash
# Makes sure drivers/gcsdriver's test server is in the Go module cache: the
# tests run fake-gcs-server (github.com/fsouza/fake-gcs-server, the version
# go.mod pins) inside the test process, on a free loopback port
# (internal/testservers/gcsfake), so there is no binary to build or install;
# this downloads the module and the Cloud Storage client it serves, with the
# go command, from the Go module proxy, so that the tests themselves need no
# network. Idempotent: go mod download does nothing when they are cached.
set -euo pipefail

cd "$(dirname "$0")/../.."
if ! command -v go >/dev/null 2>&1; then
  echo "gcs.sh: the go command is missing (the Go toolchain builds and runs dlock's tests)" >&2
  exit 1
fi
go mod download github.com/fsouza/fake-gcs-server cloud.google.com/go/storage
