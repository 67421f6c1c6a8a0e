package dlocktest

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-dev/dlock"
)

// testMaxHold: WithMaxHold (issue 15 item 5). The lease renews past its TTL
// until the bound, then ends at grant + bound (not earlier, and promptly)
// with cause ErrMaxHoldReached, which matches ErrLeaseLost; renewals stop,
// so the grant expires on the store by its TTL and another client gets it
// with a greater fence; a Release after that returns the max-hold error
// and leaves the successor's grant alone.
func (s *suite) testMaxHold(t TB) {
	ttl := s.h.TTL
	a, fa := s.locker(t)
	b, _ := s.locker(t)
	c, _ := s.locker(t)
	k := key(t, "k")
	probe := startProbe(t)
	hold := ttl + ttl/2 // past one TTL: only renewals keep it that long

	before := time.Now()
	la := mustAcquire(t, a, k, dlock.WithTTL(ttl), dlock.WithMaxHold(hold))
	after := time.Now()
	var doneAt time.Time
	select {
	case <-la.Done():
		doneAt = time.Now()
	case <-time.After(hold + 5*ttl):
		t.Fatalf("lease with max hold %v still held after %v", hold, time.Since(before))
	}
	if held := doneAt.Sub(before); held < hold {
		t.Fatalf("lease ended %v after Acquire was called, before its max hold %v: %v", held, hold, la.Err())
	}
	slack := probe.slack(lossBase)
	if late := doneAt.Sub(after.Add(hold)); late > slack {
		t.Errorf("lease ended %v after grant + max hold, more than the %v allowed", late, slack)
	}
	cause := context.Cause(la.Context())
	if !errors.Is(cause, dlock.ErrMaxHoldReached) || !errors.Is(cause, dlock.ErrLeaseLost) {
		t.Fatalf("context cause after max hold = %v, want ErrMaxHoldReached matching ErrLeaseLost", cause)
	}
	if !errors.Is(la.Err(), dlock.ErrMaxHoldReached) {
		t.Errorf("Err() = %v, want ErrMaxHoldReached", la.Err())
	}

	// Renewals stopped: the store expires the grant by its TTL, and only
	// then does B get the key, with a greater fence. (A store whose grants
	// outlast the TTL by design, say azblob's 15 s service leases, is made
	// to end them by the harness's ForceExpiry, as in the expiry subtests.)
	ctx, cancel := context.WithTimeout(t.Context(), 5*ttl+10*time.Second)
	defer cancel()
	if s.h.ForceExpiry != nil {
		if err := s.h.ForceExpiry(ctx, fa.Inner()); err != nil {
			t.Fatalf("ForceExpiry: %v", err)
		}
	}
	lb, err := b.Acquire(ctx, k, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatalf("B could not acquire after A's max hold: %v", err)
	}
	t.Logf("B granted %v after A's max hold ended the lease (TTL %v)", time.Since(doneAt), ttl)
	if !s.h.NoFence && lb.Fence() <= la.Fence() {
		t.Errorf("B's fence %d not greater than A's %d", lb.Fence(), la.Fence())
	}
	if err := la.Release(t.Context()); !errors.Is(err, dlock.ErrMaxHoldReached) {
		t.Errorf("Release after max hold = %v, want ErrMaxHoldReached", err)
	}
	assertHeld(t, c, k)
	release(t, lb)
}
