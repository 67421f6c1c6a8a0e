package pgadvisory_test

import (
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/dlocktest"
	_ "github.com/dlock-dev/dlock/drivers/pgadvisory"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// BenchmarkLocker runs dlocktest's common benchmarks (uncontended
// Acquire+Release with 1, 8 and 64 clients; a handoff of one key between 8)
// through the dlock API against a real server started here.
func BenchmarkLocker(b *testing.B) {
	pg := testservers.StartPostgres(b)
	u := strings.Replace(pg.URL(), "postgres://", "pgadvisory://", 1)
	dlocktest.Benchmark(b, dlocktest.Harness{Name: "pgadvisory", NewDriver: dlocktest.URLDriver(u)})
}
