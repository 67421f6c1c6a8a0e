package pgdriver_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/internal/resumetest"
	"github.com/dlock-dev/dlock/drivers/pgdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestResume checks driver.Resumer against a real PostgreSQL: a grant made
// through one pool is resumed through another, as by a restarted process.
func TestResume(t *testing.T) {
	pg := testservers.StartPostgres(t)
	freezer := testservers.NewFreezer(t, func() []int { return []int{pg.PID()} })
	resumetest.Run(t, resumetest.Harness{
		Freeze: freezer.Freeze,
		Thaw:   freezer.Thaw,
		Open: func(ctx context.Context) (driver.Driver, error) {
			return pgdriver.Open(ctx, pg.URL())
		},
		TTL:          time.Second, // slack for a loaded machine: each renewal has a whole second to land
		StoreExpires: true,
	})
}
