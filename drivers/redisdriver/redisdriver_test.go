package redisdriver

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestConformance runs the dlock conformance suite against a real
// redis-server (AOF, appendfsync everysec), opened by URL as a user would.
func TestConformance(t *testing.T) {
	r := testservers.StartRedis(t)
	freezer := testservers.NewFreezer(t, func() []int { return []int{r.PID()} })
	dlocktest.Run(t, dlocktest.Harness{
		Name: "redis",
		NewDriver: func(ctx context.Context) (driver.Driver, error) {
			return Open(ctx, r.URL())
		},
		StopStore:   r.Stop,
		StartStore:  r.Start,
		FreezeStore: freezer.Freeze,
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return Open(ctx, "redis://"+via(r.Addr()))
		},
		TTL: time.Second,
	})
}
