package redlockdriver_test

import (
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/dlocktest"
	_ "github.com/dlock-dev/dlock/drivers/redlockdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// BenchmarkLocker runs dlocktest's common benchmarks (uncontended
// Acquire+Release with 1, 8 and 64 clients; a handoff of one key between 8)
// through the dlock API against a real server started here.
func BenchmarkLocker(b *testing.B) {
	rs := testservers.StartRedisN(b, 5)
	addrs := make([]string, len(rs))
	for i, r := range rs {
		addrs[i] = r.Addr()
	}
	dlocktest.Benchmark(b, dlocktest.Harness{Name: "redlock", NewDriver: dlocktest.URLDriver("redlock://" + strings.Join(addrs, ","))})
}
