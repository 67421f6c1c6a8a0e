package gcsdriver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/gcsdriver"
	"github.com/dlock-dev/dlock/drivers/internal/resumetest"
	"github.com/dlock-dev/dlock/internal/testservers/gcsfake"
)

// TestResume checks driver.Resumer against fake-gcs-server: a grant made
// through one client is resumed through another, as by a restarted
// process.
func TestResume(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	resumetest.Run(t, resumetest.Harness{
		Freeze: fake.Freeze,
		Thaw:   fake.Thaw,
		Open: func(ctx context.Context) (driver.Driver, error) {
			return gcsdriver.Open(ctx, fake.URL(bucket, "locks"))
		},
		TTL: time.Second, // slack for a loaded machine: each renewal has a whole second to land
	})
	t.Run("LateResumeBeatsAWaitersTakeover", func(t *testing.T) { testLateResumeBeatsTakeover(t, fake) })
}

// testLateResumeBeatsTakeover: a grant left unrenewed past its TTL, that a
// waiter has watched long enough to take over, is resumed before the
// takeover: the resume writes a new generation, so the waiter's takeover
// (conditioned on the generation it watched) is refused, and the record
// keeps the resumed grant's owner and fence.
func testLateResumeBeatsTakeover(t *testing.T, fake *gcsfake.Server) {
	a, b, c := open(t, fake), open(t, fake), open(t, fake)
	r := req("late-resume", resumetest.Owner(), 500*time.Millisecond)
	g := mustGrant(t, a, r)
	_ = a.Close()
	waiter := req(r.Key, resumetest.Owner(), r.TTL)
	if _, err := c.TryAcquire(t.Context(), waiter); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key = %v, want ErrNotAcquired", err) // c starts watching
	}
	time.Sleep(r.TTL + 200*time.Millisecond)
	rg, err := b.Resume(t.Context(), r, g.Fence)
	if err != nil || rg.Fence != g.Fence {
		t.Fatalf("late Resume = %d, %v; want %d, nil", rg.Fence, err, g.Fence)
	}
	if _, err := c.TryAcquire(t.Context(), waiter); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("the waiter's takeover after a Resume = %v, want ErrNotAcquired", err)
	}
	md := record(t, fake, r.Key).Metadata
	if md["dlock-owner"] != r.Owner || md["dlock-fence"] != fmt.Sprint(g.Fence) {
		t.Fatalf("record after the refused takeover: %v, want owner %q and fence %d", md, r.Owner, g.Fence)
	}
	if err := b.Renew(t.Context(), r.Key, r.Owner, r.TTL); err != nil {
		t.Fatalf("Renew of the resumed grant: %v", err)
	}
	if err := b.Release(t.Context(), r.Key, r.Owner); err != nil {
		t.Fatalf("Release of the resumed grant: %v", err)
	}
}
