# dlock — common tasks. `make test` is the command CI runs.
GO ?= go

.PHONY: all build test test-deps vet fmt bench demo clean

all: build

build:
	$(GO) build ./...

## test: install the store servers when missing, then run every test with the race detector.
test: test-deps
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./...

test-deps:
	./scripts/install-test-deps.sh

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || (gofmt -l .; echo "gofmt: files above need formatting"; exit 1)

fmt:
	gofmt -w .

## bench: driver benchmarks (bounded), figures as b.ReportMetric columns.
bench: test-deps
	$(GO) test -run '^$$' -bench . -benchtime 2s ./...

## demo: the main job, on the embedded default store; needs no external server.
demo:
	$(GO) run ./examples/payout

clean:
	rm -rf bin dlockd-data
