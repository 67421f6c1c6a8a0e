#!/usr/bin/env bash
# Builds Consul v1.16.0, the last release under the MPL-2.0 licence, for the
# tests of drivers/consuldriver (internal/testservers/consul.go starts it),
# when missing: from the Go module proxy, with the go command, into
# $DLOCK_TEST_CACHE/bin/consul-1.16.0. Idempotent: nothing is done when that
# binary exists and "consul version" says v1.16.0. The tests themselves need
# no network. The build takes several minutes (10 to 30 on 2 busy cores).
#
#   DLOCK_TEST_CACHE   cache root (default ~/.cache/dlock-test)
#
# How: Consul's go.mod replaces its nested modules (api, sdk, proto-public,
# envoyextensions, troubleshoot) with relative paths, which only work in
# Consul's own repository. consul-build/ is a module of its own that
# requires github.com/hashicorp/consul v1.16.0 and the published versions
# of that release's nested modules (api v1.22.0, sdk v0.14.0, proto-public
# v0.4.0), with Consul's own exclude of go-msgpack v1.1.5/v1.1.6; its go.sum
# pins every module. The module proxy refuses the two others
# (envoyextensions v0.3.0 and troubleshoot v0.3.0: "This module version is
# not available"), so consul-build/stub/ replaces them with small stand-in
# packages written for this build: the API surface the agent compiles
# against, with Envoy extensions and "consul troubleshoot" reporting that
# they are not available. The KV store, sessions, Raft and blocking queries
# the tests use are Consul's own unchanged v1.16.0 code.
set -euo pipefail

CONSUL_VERSION=1.16.0
CONSUL_COMMIT=192df66abfb08287f0c1f40d84c64f8a1cd961d2 # the v1.16.0 tag, as the module proxy reports it
cache="${DLOCK_TEST_CACHE:-$HOME/.cache/dlock-test}"
bin="$cache/bin/consul-$CONSUL_VERSION"

# The first line of "consul version", read whole first: piping it into
# head would let consul die of SIGPIPE writing its later lines, which
# pipefail turns into a failed check (and a rebuild, and a failed run).
version_line() {
  local out
  out="$("$1" version 2>/dev/null)" || return 1
  printf '%s\n' "${out%%$'\n'*}"
}

if [ -x "$bin" ] && [ "$(version_line "$bin")" = "Consul v$CONSUL_VERSION" ]; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "consul.sh: the go command is needed to build Consul v$CONSUL_VERSION" >&2
  exit 1
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/dlock-consul-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# The build module lives outside the project's tree, so that nothing of it
# reaches the project's go.mod.
cp -R "$here/consul-build/." "$work/"
mkdir -p "$cache/bin"
echo "building consul v$CONSUL_VERSION into $bin (several minutes)"
(
  cd "$work"
  # GOFLAGS from the caller (e.g. -mod=vendor) must not apply to this module.
  GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off \
    go build -o "$bin.tmp" \
    -ldflags "-s -w -X github.com/hashicorp/consul/version.GitCommit=${CONSUL_COMMIT:0:8}" \
    github.com/hashicorp/consul
)
mv "$bin.tmp" "$bin"
version_line "$bin"
