package redisdriver

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestForceReleaser_RemovesGrantWhoeverHoldsIt: ForceRelease removes the
// grant without its owner token and reports it; the owner's renewal and
// release then find it gone, the next grant gets a greater fence, and a
// free key answers ErrNotAcquired.
func TestForceReleaser_RemovesGrantWhoeverHoldsIt(t *testing.T) {
	r := testservers.StartRedis(t)
	d := openDriver(t, r.URL())
	ctx := t.Context()
	if _, err := d.ForceRelease(ctx, "force/k", "nothing to remove"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("ForceRelease of a free key = %v, want ErrNotAcquired", err)
	}
	fence := acquire(t, d, "force/k", "owner-a", time.Hour)
	info, err := d.ForceRelease(ctx, "force/k", "holder pod evicted")
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "force/k" || info.Fence != fence || info.Holder != "holder of owner-a" || info.TTL != time.Hour {
		t.Fatalf("ForceRelease = %+v, want the grant with fence %d", info, fence)
	}
	if err := d.Renew(ctx, "force/k", "owner-a", time.Hour); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after ForceRelease = %v, want ErrLeaseLost", err)
	}
	if err := d.Release(ctx, "force/k", "owner-a"); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Release after ForceRelease = %v, want ErrLeaseLost", err)
	}
	if next := acquire(t, d, "force/k", "owner-b", time.Hour); next <= fence {
		t.Fatalf("fence after ForceRelease %d, want > %d", next, fence)
	}
	if _, err := d.ForceRelease(ctx, "force/free", "x"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("ForceRelease of another free key = %v, want ErrNotAcquired", err)
	}
}
