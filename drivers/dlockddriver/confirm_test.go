package dlockddriver_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
)

// TestWaiter_WaitUnconfirmedReturnsTheHandoverUnclaimed: WaitUnconfirmed
// returns a handed-over grant at once with
// the server's claim window in Grant.ConfirmWithin and sends no claim, so
// the server passes the key to the next waiter when the window ends; the
// root package claims it with its first renewal, so a lease acquired
// through it keeps the key past the window, and one released at once hands
// the key on without ever claiming it.
func TestWaiter_WaitUnconfirmedReturnsTheHandoverUnclaimed(t *testing.T) {
	const window = 300 * time.Millisecond
	srv, req := startClaimWindow(t, window, "confirm/k")
	ctx := t.Context()

	t.Run("driver: not claimed, passed on after the window", func(t *testing.T) {
		a, b, c := dial(t, srv.Addr(), nil), dial(t, srv.Addr(), nil), dial(t, srv.Addr(), nil)
		if _, err := a.TryAcquire(ctx, req("a")); err != nil {
			t.Fatal(err)
		}
		bWait := make(chan waitResult, 1)
		go func() {
			g, err := b.WaitUnconfirmed(ctx, req("b"))
			bWait <- waitResult{g, err}
		}()
		awaitWaiters(t, a, "confirm/k", 1)
		cWait := goWait(ctx, c, req("c"))
		awaitWaiters(t, a, "confirm/k", 2)
		if err := a.Release(ctx, "confirm/k", req("a").Owner); err != nil {
			t.Fatal(err)
		}
		gb := recvWait(t, bWait, 5*time.Second)
		if gb.ConfirmWithin != window {
			t.Fatalf("ConfirmWithin = %v, want the server's claim window %v", gb.ConfirmWithin, window)
		}
		// b never renews: the server passes the key to c.
		gc := recvWait(t, cWait, 5*time.Second)
		if gc.Fence <= gb.Fence || gc.ConfirmWithin != 0 {
			t.Fatalf("c's grant %+v after b's fence %d, want a greater fence, claimed by Wait", gc, gb.Fence)
		}
		select {
		case <-gb.Lost:
		case <-time.After(5 * time.Second):
			t.Fatal("b's unclaimed grant was passed on, but b did not hear of its loss")
		}
		if err := c.Release(ctx, "confirm/k", req("c").Owner); err != nil {
			t.Fatal(err)
		}
	})

	for _, c := range []struct {
		name string
		wrap func(driver.Driver) driver.Driver
	}{
		{"root: claimed by the first renewal", func(d driver.Driver) driver.Driver { return d }},
		// The conformance suite and dlock verify wrap every driver so.
		{"root over dlocktest's FaultDriver: the same", func(d driver.Driver) driver.Driver { return dlocktest.NewFaultDriver(d, nil) }},
	} {
		t.Run(c.name, func(t *testing.T) { rootClaims(t, srv.Addr(), window, c.wrap) })
	}
}

// rootClaims: a lease acquired through the root package on a handed-over
// grant is bounded by the claim window until its first renewal claims it,
// and then keeps the key past the window. The root package takes the
// grant unconfirmed only while it arrives early in its window (less than
// half of the window less the drift, about 99 ms here, after the Wait was
// sent); a loaded machine that takes longer to set the handover up (the
// waiter seen, the holder's release) gets a grant confirmed before
// Acquire returns, which is right but not what this checks: such a try
// is made again, up to five times.
func rootClaims(t *testing.T, addr string, window time.Duration, wrap func(driver.Driver) driver.Driver) {
	ctx := t.Context()
	la, lb := dlock.New(dial(t, addr, nil)), dlock.New(wrap(dial(t, addr, nil)))
	defer la.Close()
	defer lb.Close()
	inspector := dial(t, addr, nil)
	const ttl = 10 * time.Second // drift 102 ms, less than the window
	usable := (window - 102*time.Millisecond) / 2
	type result struct {
		ls   *dlock.Lease
		sent time.Time
		err  error
	}
	var r result
	for try := 1; ; try++ {
		key := fmt.Sprintf("confirm/k%d", try)
		held, err := la.TryAcquire(ctx, key, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan result, 1)
		go func() {
			sent := time.Now()
			ls, err := lb.Acquire(ctx, key, dlock.WithTTL(ttl))
			got <- result{ls, sent, err}
		}()
		awaitWaiters(t, inspector, key, 1)
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		r = <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		if left := r.ls.Deadline().Sub(r.sent); left <= window {
			break // taken unconfirmed, bounded by the window: what this checks
		}
		// Confirmed before Acquire returned: right when the grant came
		// too late in its window (its arrival, after the release, is not
		// seen here), so try again; a root package that always confirms
		// fails all five tries.
		t.Logf("try %d: the handover came %v after the wait was sent (unconfirmed use needs under %v): confirmed at once; again", try, released.Sub(r.sent), usable)
		if err := r.ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if try == 5 {
			t.Fatalf("five handovers in a row were confirmed before Acquire returned (the last released %v after its wait was sent; unconfirmed use needs the grant within %v): want the lease bounded by the claim window %v until its first renewal", released.Sub(r.sent), usable, window)
		}
	}
	time.Sleep(3 * window)
	if err := r.ls.Err(); err != nil {
		t.Fatalf("after 3 claim windows the lease is %v, want held (claimed by its renewal)", err)
	}
	if cur, err := inspector.CheckFence(ctx, r.ls.Key(), r.ls.Fence()); err != nil || !cur {
		t.Fatalf("CheckFence = %v, %v; want the lease's grant current", cur, err)
	}
	if left := time.Until(r.ls.Deadline()); left < 8*time.Second {
		t.Fatalf("validity left %v after the claim, want about a full TTL", left)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
