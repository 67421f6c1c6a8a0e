package consuldriver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/consuldriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// ignoreOpenCensus: fake-gcs-server, which the dlock CLI links (through
// verify/matrix's gcs target), starts opencensus's view worker in an init.
var ignoreOpenCensus = goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, ignoreOpenCensus) }

// TestConformance runs the dlock conformance suite against a real Consul
// v1.16.0 server (Raft on disk, so a restart keeps keys and indexes), each
// driver opened by URL with its own HTTP connections, as a process would.
func TestConformance(t *testing.T) {
	c := testservers.StartConsul(t)
	freezer := testservers.NewFreezer(t, func() []int { return []int{c.PID()} })
	dlocktest.Run(t, dlocktest.Harness{
		Name: "consul",
		NewDriver: func(ctx context.Context) (driver.Driver, error) {
			return consuldriver.Open(ctx, c.URL())
		},
		StopStore:   c.Stop,
		StartStore:  c.Start,
		FreezeStore: freezer.Freeze,
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return consuldriver.Open(ctx, strings.Replace(c.URL(), c.Addr(), via(c.Addr()), 1))
		},
		TTL: 500 * time.Millisecond,
	})
}
