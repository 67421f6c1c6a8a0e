package memdriver_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func harness(name string, wrap func(driver.Driver) driver.Driver) dlocktest.Harness {
	s := memdriver.NewStore()
	return dlocktest.Harness{
		Name: name,
		NewDriver: func(context.Context) (driver.Driver, error) {
			return wrap(memdriver.New(s)), nil
		},
		StopStore:  func() error { s.SetDown(true); return nil },
		StartStore: func() error { s.SetDown(false); return nil },
		TTL:        300 * time.Millisecond,
		// mem lacks FreezeStore/ThawStore and NewDriverVia by nature:
		NoFreezeReason: "in-process store: there is no server process to stop, and a call cannot hang on it",
		NoLinkReason:   "in-process store: there is no network link to hold or reset",
	}
}

// TestConformance_Queue runs the suite with waiting by the store's queue.
func TestConformance_Queue(t *testing.T) {
	dlocktest.Run(t, harness("mem", func(d driver.Driver) driver.Driver { return d }))
}

// TestConformance_Polling runs the suite with the Waiter hidden, so the
// root package's backoff polling is what waits.
func TestConformance_Polling(t *testing.T) {
	dlocktest.Run(t, harness("mem-polling", dlocktest.WithoutWaiter))
}
