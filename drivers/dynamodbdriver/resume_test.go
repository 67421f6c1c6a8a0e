package dynamodbdriver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dynamodbdriver"
	"github.com/dlock-dev/dlock/drivers/internal/resumetest"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestResume checks driver.Resumer against dynalite: a grant made through
// one client is resumed through another, as by a restarted process.
func TestResume(t *testing.T) {
	dl := testservers.StartDynalite(t)
	s := newStore(t, dl)
	freezer := testservers.NewFreezer(t, func() []int { return []int{dl.PID()} })
	resumetest.Run(t, resumetest.Harness{
		Freeze: freezer.Freeze,
		Thaw:   freezer.Thaw,
		Open: func(ctx context.Context) (driver.Driver, error) {
			return dynamodbdriver.Open(ctx, s.url())
		},
		TTL: time.Second, // slack for a loaded machine: each renewal has a whole second to land
	})
	t.Run("LateResumeBeatsAWaitersTakeover", func(t *testing.T) { testLateResumeBeatsTakeover(t, s) })
}

// testLateResumeBeatsTakeover: a grant left unrenewed past its TTL, that a
// waiter has watched long enough to take over, is resumed before the
// takeover: the resume writes a new record version, so the waiter's
// takeover (conditioned on the version it watched) is refused, and the
// item keeps the resumed grant's owner and fence.
func testLateResumeBeatsTakeover(t *testing.T, s *store) {
	a, b, c := s.open(t), s.open(t), s.open(t)
	r := req("late-resume", resumetest.Owner(), 500*time.Millisecond)
	g := mustGrant(t, a, r)
	_ = a.Close()
	waiter := req(r.Key, resumetest.Owner(), r.TTL)
	mustHeld(t, c, waiter) // c starts watching the record version
	time.Sleep(r.TTL + 200*time.Millisecond)
	rg, err := b.Resume(t.Context(), r, g.Fence)
	if err != nil || rg.Fence != g.Fence {
		t.Fatalf("late Resume = %d, %v; want %d, nil", rg.Fence, err, g.Fence)
	}
	if _, err := c.TryAcquire(t.Context(), waiter); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("the waiter's takeover after a Resume = %v, want ErrNotAcquired", err)
	}
	item := s.item(t, r.Key)
	if owner, _ := attrS(item, "owner"); owner != r.Owner {
		t.Fatalf("item owner %q after the refused takeover, want %q", owner, r.Owner)
	}
	if f, _ := attrN(t, item, "fence"); uint64(f) != g.Fence {
		t.Fatalf("item fence %d, want %d", f, g.Fence)
	}
	if err := b.Release(t.Context(), r.Key, r.Owner); err != nil {
		t.Fatalf("Release of the resumed grant: %v", err)
	}
}
