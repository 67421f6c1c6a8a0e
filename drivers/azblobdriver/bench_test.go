package azblobdriver_test

import (
	"testing"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// BenchmarkLocker runs dlocktest's common benchmarks (uncontended
// Acquire+Release with 1, 8 and 64 clients; a handoff of one key between 8)
// through the dlock API against Azurite's blob service started here. The
// figures are the emulator's: they say nothing about Azure's latency.
func BenchmarkLocker(b *testing.B) {
	az := testservers.StartAzurite(b)
	dlocktest.Benchmark(b, dlocktest.Harness{Name: "azblob", NewDriver: dlocktest.URLDriver(az.URL("bench"))})
}
