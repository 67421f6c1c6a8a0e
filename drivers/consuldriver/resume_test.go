package consuldriver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/consuldriver"
	"github.com/dlock-dev/dlock/drivers/internal/resumetest"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestResume checks driver.Resumer against a real Consul: a grant made
// through one client is resumed (its session renewed) through another, as
// by a restarted process.
func TestResume(t *testing.T) {
	c := testservers.StartConsul(t)
	freezer := testservers.NewFreezer(t, func() []int { return []int{c.PID()} })
	url := "consul://" + c.Addr() + "/resume"
	resumetest.Run(t, resumetest.Harness{
		Freeze: freezer.Freeze,
		Thaw:   freezer.Thaw,
		Open: func(ctx context.Context) (driver.Driver, error) {
			return consuldriver.Open(ctx, url)
		},
		TTL:          time.Second, // slack for a loaded machine: each renewal has a whole second to land
		StoreExpires: true,
	})
	t.Run("TTLLongerThanTheSessionsIsInvalid", func(t *testing.T) {
		a, err := consuldriver.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := consuldriver.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		r := driver.AcquireRequest{Key: "resume-ttl", Owner: resumetest.Owner(), TTL: time.Second}
		g, err := a.TryAcquire(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		r.TTL = 2 * time.Second
		if _, err := b.Resume(t.Context(), r, g.Fence); !errors.Is(err, driver.ErrInvalidTTL) {
			t.Fatalf("Resume with a TTL longer than the session's = %v, want ErrInvalidTTL", err)
		}
		r.TTL = 500 * time.Millisecond // shorter: the client gives up earlier than Consul; safe
		if _, err := b.Resume(t.Context(), r, g.Fence); err != nil {
			t.Fatalf("Resume with a shorter TTL: %v", err)
		}
		// b knows the session now: its Release is one transaction.
		if err := b.Release(t.Context(), r.Key, r.Owner); err != nil {
			t.Fatalf("Release of the resumed grant: %v", err)
		}
		if err := a.Renew(t.Context(), r.Key, r.Owner, time.Second); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("the first process's Renew after the resumer's Release = %v, want ErrLeaseLost", err)
		}
	})
}
