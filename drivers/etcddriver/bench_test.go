package etcddriver_test

import (
	"testing"

	"github.com/dlock-dev/dlock/dlocktest"
	_ "github.com/dlock-dev/dlock/drivers/etcddriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// BenchmarkLocker runs dlocktest's common benchmarks (uncontended
// Acquire+Release with 1, 8 and 64 clients; a handoff of one key between 8)
// through the dlock API against a real server started here.
func BenchmarkLocker(b *testing.B) {
	e := testservers.StartEtcd(b)
	dlocktest.Benchmark(b, dlocktest.Harness{Name: "etcd", NewDriver: dlocktest.URLDriver(e.URL())})
}
