package dlock_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// TestMaxHold_EndsAtBoundAndStopsRenewing: with WithMaxHold(2.5 s) and a
// 3 s TTL (renewals every 1 s), the lease renews twice, ends at exactly
// grant + 2.5 s with cause ErrMaxHoldReached (matching ErrLeaseLost), sends
// no renewal after that, and its grant stays on the store until it expires
// by its TTL (3 s after the last renewal, at 5 s), when another client
// gets the key with a greater fence.
func TestMaxHold_EndsAtBoundAndStopsRenewing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memdriver.NewStore()
		cd := &countingDriver{Driver: memdriver.New(store)}
		rec := &recorder{}
		l := dlock.New(cd, dlock.WithObserver(rec))
		defer l.Close()
		other := dlock.New(memdriver.New(store))
		defer other.Close()
		start := time.Now()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(3*time.Second), dlock.WithMaxHold(2500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		<-ls.Done()
		if held := time.Since(start); held != 2500*time.Millisecond {
			t.Fatalf("lease ended after %v, want exactly the max hold 2.5s", held)
		}
		cause := context.Cause(ls.Context())
		if !errors.Is(cause, dlock.ErrMaxHoldReached) || !errors.Is(cause, dlock.ErrLeaseLost) || !errors.Is(ls.Err(), dlock.ErrMaxHoldReached) {
			t.Fatalf("cause %v, Err %v; want ErrMaxHoldReached (matching ErrLeaseLost)", cause, ls.Err())
		}
		if errors.Is(dlock.ErrLeaseLost, dlock.ErrMaxHoldReached) {
			t.Error("ErrLeaseLost matches ErrMaxHoldReached: an ordinary loss would pass for a max hold")
		}
		if n := cd.renewCount(); n != 2 {
			t.Errorf("%d renewals before the max hold, want 2 (at 1 s and 2 s)", n)
		}
		if _, err := other.TryAcquire(t.Context(), "k"); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("right after the max hold TryAcquire = %v, want ErrNotAcquired (the grant expires by its TTL)", err)
		}
		time.Sleep(2499 * time.Millisecond) // 4.999 s: the grant renewed at 2 s still holds
		if _, err := other.TryAcquire(t.Context(), "k"); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("before the TTL ran out TryAcquire = %v, want ErrNotAcquired", err)
		}
		time.Sleep(2 * time.Millisecond)
		next, err := other.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatalf("after the TTL ran out TryAcquire = %v", err)
		}
		if next.Fence() <= ls.Fence() {
			t.Errorf("next fence %d not greater than %d", next.Fence(), ls.Fence())
		}
		if n := cd.renewCount(); n != 2 {
			t.Errorf("%d renewals, want none after the max hold", n)
		}
		// A Release now reports the max hold and leaves the successor alone.
		if err := ls.Release(t.Context()); !errors.Is(err, dlock.ErrMaxHoldReached) {
			t.Errorf("Release after the max hold = %v, want ErrMaxHoldReached", err)
		}
		if err := ls.Release(t.Context()); !errors.Is(err, dlock.ErrMaxHoldReached) {
			t.Errorf("second Release = %v, want ErrMaxHoldReached", err)
		}
		if next.Err() != nil {
			t.Fatalf("successor's lease ended: %v", next.Err())
		}
		_ = next.Release(t.Context())
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.ends) != 1 || !rec.ends[0].Lost || rec.ends[0].LostReason != dlock.LostMaxHold || rec.ends[0].Held != 2500*time.Millisecond {
			t.Errorf("end events %+v, want one lost with reason %q after 2.5s", rec.ends, dlock.LostMaxHold)
		}
	})
}

// TestMaxHold_ReleaseFreesKey: a holder that stops when its context ends
// and releases frees the key at once (owner-checked), instead of leaving it
// to expire; Close does the same for a lease not released.
func TestMaxHold_ReleaseFreesKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memdriver.NewStore()
		l := dlock.New(memdriver.New(store), dlock.WithTTL(time.Minute))
		other := dlock.New(memdriver.New(store))
		defer other.Close()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithMaxHold(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ls2, err := l.Acquire(t.Context(), "k2", dlock.WithMaxHold(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		<-ls.Done()
		if err := ls.Release(t.Context()); !errors.Is(err, dlock.ErrMaxHoldReached) {
			t.Fatalf("Release = %v, want ErrMaxHoldReached", err)
		}
		if n, err := other.TryAcquire(t.Context(), "k"); err != nil {
			t.Fatalf("key not free after Release of a max-held lease: %v", err)
		} else {
			_ = n.Release(t.Context())
		}
		<-ls2.Done()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if n, err := other.TryAcquire(t.Context(), "k2"); err != nil {
			t.Fatalf("key not free after Close with a max-held lease: %v", err)
		} else {
			_ = n.Release(t.Context())
		}
	})
}

// TestMaxHold_Options: a negative bound is ErrInvalidArgument before any
// store call; zero is no bound; a Locker default applies to every lease.
func TestMaxHold_Options(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := dlock.New(memdriver.New(memdriver.NewStore()), dlock.WithTTL(time.Second), dlock.WithMaxHold(3*time.Second))
		defer l.Close()
		if _, err := l.Acquire(t.Context(), "neg", dlock.WithMaxHold(-time.Second)); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Fatalf("negative max hold: %v, want ErrInvalidArgument", err)
		}
		unbounded, err := l.Acquire(t.Context(), "zero", dlock.WithMaxHold(0))
		if err != nil {
			t.Fatal(err)
		}
		bounded, err := l.Acquire(t.Context(), "default")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		if unbounded.Err() != nil {
			t.Errorf("WithMaxHold(0) lease ended: %v", unbounded.Err())
		}
		if !errors.Is(bounded.Err(), dlock.ErrMaxHoldReached) {
			t.Errorf("lease under the Locker's max hold: Err %v, want ErrMaxHoldReached", bounded.Err())
		}
		_ = unbounded.Release(t.Context())
	})
}

// TestMaxHold_DegradedLease: a degraded lease (WithFailOpen, store down)
// has no store grant, but its context still ends at the bound.
func TestMaxHold_DegradedLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memdriver.NewStore()
		store.SetDown(true)
		l := dlock.New(memdriver.New(store))
		defer l.Close()
		start := time.Now()
		ls, err := l.TryAcquire(t.Context(), "k", dlock.WithFailOpen(), dlock.WithMaxHold(time.Minute))
		if err != nil || !ls.Degraded() {
			t.Fatalf("degraded TryAcquire: %v", err)
		}
		<-ls.Done()
		if time.Since(start) != time.Minute || !errors.Is(context.Cause(ls.Context()), dlock.ErrMaxHoldReached) {
			t.Fatalf("degraded lease ended after %v with %v", time.Since(start), context.Cause(ls.Context()))
		}
		if err := ls.Release(t.Context()); !errors.Is(err, dlock.ErrMaxHoldReached) {
			t.Errorf("Release = %v", err)
		}
	})
}
