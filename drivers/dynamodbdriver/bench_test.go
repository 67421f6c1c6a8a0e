package dynamodbdriver_test

import (
	"testing"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// BenchmarkLocker runs dlocktest's common benchmarks (uncontended
// Acquire+Release with 1, 8 and 64 clients; a handoff of one key between 8)
// through the dlock API against dynalite, an emulator started here: the
// figures say nothing about DynamoDB's own latency.
func BenchmarkLocker(b *testing.B) {
	dl := testservers.StartDynalite(b)
	url := dl.URL("dlock_bench") + "&create_table=true"
	dlocktest.Benchmark(b, dlocktest.Harness{Name: "dynamodb (dynalite emulator)", NewDriver: dlocktest.URLDriver(url)})
}
