# dlock — common tasks. `make test` is the command CI runs.
GO ?= go

.PHONY: all build test test-deps vet fmt bench bench-stores bench-cluster demo demo-cluster clean proto

all: build

build:
	$(GO) build ./...

## test: install the store servers when missing, then run every test with the race detector.
## The dashboard's browser tests (server/uitest) run without the race detector: they drive
## Chromium against a server filled with 100,000 leases, which -race slows several-fold, and
## the server code they exercise is race-tested by ./server's own tests.
## verify/matrix goes first (3.5 minutes, one test of 22 fault cells of ~8 s each): go test starts
## packages in the order given, two at a time, and as the last one it ran alone for minutes after
## every other package had finished. The rest keep their order: putting every slow package first
## (tried) ran dlockd's multi-node tests of drivers/dlockddriver and server side by side, and two of
## their timing-bound tests failed in clean-clone runs.
FIRST_TESTS := ./verify/matrix
test: test-deps
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m $(FIRST_TESTS) \
		$$($(GO) list ./... | grep -v '/server/uitest$$' | grep -v -x -F "$$($(GO) list $(FIRST_TESTS))")
	$(GO) test -count=1 -timeout 5m ./server/uitest

test-deps:
	./scripts/install-test-deps.sh

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || (gofmt -l .; echo "gofmt: files above need formatting"; exit 1)

fmt:
	gofmt -w .

## bench: driver benchmarks (bounded: 2 s per benchmark), figures as b.ReportMetric columns.
## The side-by-side comparison of every store is not bounded that way: it is make bench-stores.
bench: test-deps
	$(GO) test -run '^$$' -bench . -skip 'SideBySide|BenchmarkCluster' -benchtime 2s -timeout 30m ./...

## demo: the main job, on the embedded default store; needs no external server.
demo:
	./scripts/demo.sh

## demo-cluster: the main job on 3 dlockd nodes, with the leader killed (kill -9) midway through the settlement.
demo-cluster:
	./scripts/demo-cluster.sh

clean:
	rm -rf bin dlockd-data

## proto: regenerate the committed dlockd API code from proto/dlock/v1/dlock.proto
## (protoc and its well-known types from Debian's protobuf-compiler and libprotobuf-dev;
## the plugins from the module proxy).
PROTOC_GEN_GO_VERSION ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.6.2
proto:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" protoc -I proto \
		--go_out=. --go_opt=module=github.com/dlock-dev/dlock \
		--go-grpc_out=. --go-grpc_opt=module=github.com/dlock-dev/dlock \
		proto/dlock/v1/dlock.proto

## bench-stores: every store side by side (starts its own servers), written to docs/BENCHMARKS-run.md.
bench-stores: test-deps
	mkdir -p docs
	BENCH_OUT=$(CURDIR)/docs/BENCHMARKS-run.md $(GO) test -run '^$$' -bench SideBySide -benchtime 1x -timeout 60m ./internal/bench

## bench-cluster: 3-node etcd, 3- and 5-node dlockd side by side (W1, W2, failover), written to docs/BENCHMARKS-cluster-run.md.
bench-cluster: test-deps
	mkdir -p docs
	BENCH_OUT=$(CURDIR)/docs/BENCHMARKS-cluster-run.md $(GO) test -run '^$$' -bench 'BenchmarkCluster' -benchtime 1x -timeout 30m ./internal/bench

## nemesis: the dlockd cluster's nemesis run (random partitions, pauses, kills, leader
## transfers; history and fenced register checked) for NEMESIS_DURATION (default 60s;
## `make nemesis NEMESIS_DURATION=10m` for the long run). make test runs it for 60s too.
NEMESIS_DURATION ?= 60s
.PHONY: nemesis
nemesis:
	DLOCK_NEMESIS_DURATION=$(NEMESIS_DURATION) $(GO) test -race -count=1 -v -timeout 60m -run '^TestNemesis$$' ./server/clustertest/

## verify: the full store × fault matrix of dlock verify (starts and stops every server
## itself, about 25 minutes on 2 cores); writes docs/GUARANTEES.md and docs/verify-report.html,
## and fails when a cell is UNSAFE (a checker failed where the store promises safety).
## make test runs the short matrix (verify/matrix TestMatrix_Short).
.PHONY: verify
verify: test-deps
	@bin=$$(mktemp -d) && $(GO) build -buildvcs=auto -o $$bin/dlock ./cmd/dlock && \
	$$bin/dlock verify matrix --out docs --results $${VERIFY_RESULTS:-$$(mktemp -d)}; rc=$$?; rm -rf $$bin; exit $$rc
