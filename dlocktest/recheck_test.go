package dlocktest_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// hinting wraps memdriver and gives every grant a Recheck channel the test
// sends on, counting renewals.
type hinting struct {
	*memdriver.Driver
	recheck chan struct{}
	renews  atomic.Int64
}

func (d *hinting) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := d.Driver.TryAcquire(ctx, req)
	g.Recheck = d.recheck
	return g, err
}

func (d *hinting) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	d.renews.Add(1)
	return d.Driver.Renew(ctx, key, owner, ttl)
}

// TestLease_RecheckRenewsAtOnce: a Grant.Recheck hint makes the lease renew
// at once (its next beat is 10 s away); a hint while the grant is on the
// store ends nothing, a hint after the grant was removed loses the lease
// at once, and a flood of hints costs at most one renewal per 20 ms.
func TestLease_RecheckRenewsAtOnce(t *testing.T) {
	store := memdriver.NewStore()
	d := &hinting{Driver: memdriver.New(store), recheck: make(chan struct{}, 1)}
	l := dlock.New(d, dlock.WithTTL(30*time.Second))
	defer l.Close()
	admin := dlock.New(memdriver.New(store))
	defer admin.Close()
	ls, err := l.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	waitRenews := func(n int64) {
		t.Helper()
		for end := time.Now().Add(time.Second); d.renews.Load() < n; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%d renewals 1s after the hint, want %d", d.renews.Load(), n)
			}
		}
	}

	// A hint with the grant present: one renewal, the lease goes on.
	d.recheck <- struct{}{}
	waitRenews(1)
	time.Sleep(50 * time.Millisecond)
	if ls.Err() != nil {
		t.Fatalf("lease after a hint with the grant present: %v", ls.Err())
	}

	// A flood: at most one renewal per 20 ms.
	began := time.Now()
	before := d.renews.Load()
	for time.Since(began) < 200*time.Millisecond {
		select {
		case d.recheck <- struct{}{}:
		default:
		}
		time.Sleep(100 * time.Microsecond)
	}
	time.Sleep(30 * time.Millisecond)
	if n := d.renews.Load() - before; n < 2 || n > 13 {
		t.Errorf("%d renewals for 200 ms of hints, want 2 to 13 (one per 20 ms)", n)
	}
	if ls.Err() != nil {
		t.Fatalf("lease after a flood of hints: %v", ls.Err())
	}

	// The grant removed, then a hint: lost at once.
	time.Sleep(50 * time.Millisecond) // past the gap
	if _, err := admin.ForceRelease(t.Context(), "k", "test"); err != nil {
		t.Fatal(err)
	}
	hinted := time.Now()
	d.recheck <- struct{}{}
	select {
	case <-ls.Done():
		t.Logf("lost %v after the hint", time.Since(hinted))
	case <-time.After(time.Second):
		t.Fatal("lease still held 1s after a hint for a removed grant (TTL 30s)")
	}
	if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", ls.Err())
	}
}
