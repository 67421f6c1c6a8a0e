package dlock_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// shortGrants is a driver whose TryAcquire grants are kept by the store
// only validFor from the request unless renewed (Grant.ValidFor), as the
// etcd driver's are when its shared lease was kept alive before the
// request; the answer comes after delay.
type shortGrants struct {
	*countingDriver
	validFor time.Duration
	delay    time.Duration
}

func (s *shortGrants) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := s.Driver.TryAcquire(ctx, req)
	time.Sleep(s.delay)
	if err == nil {
		g.ValidFor = s.validFor
	}
	return g, err
}

func newShortGrants(validFor time.Duration) *shortGrants {
	return &shortGrants{countingDriver: &countingDriver{Driver: memdriver.New(memdriver.NewStore())}, validFor: validFor}
}

// TestTryAcquire_ShortGrantIsBoundedUntilRenewed: a grant the store keeps
// less than the TTL (Grant.ValidFor) is valid to the request's send plus
// ValidFor less the drift, not the TTL, and the lease renews it a third of
// the way into ValidFor (not at the heartbeat interval, a third of the
// TTL), which restores a full TTL; no renewal is sent before TryAcquire
// returns.
func TestTryAcquire_ShortGrantIsBoundedUntilRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 30 * time.Second
		s := newShortGrants(21 * time.Second)
		l := dlock.New(s)
		defer l.Close()
		sent := time.Now()
		ls, err := l.TryAcquire(t.Context(), "k", dlock.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		if n := s.renewCount(); n != 0 {
			t.Fatalf("%d renewals before TryAcquire returned, want none", n)
		}
		if got, want := ls.Deadline(), sent.Add(21*time.Second-drift30s); !got.Equal(want) {
			t.Fatalf("deadline %v after the send, want %v (ValidFor less drift, not the TTL)", got.Sub(sent), want.Sub(sent))
		}
		time.Sleep(6900 * time.Millisecond) // a third of ValidFor is 7 s; the heartbeat's interval 10 s
		if n := s.renewCount(); n != 0 {
			t.Fatalf("%d renewals 6.9 s after the grant, want none before a third of ValidFor", n)
		}
		time.Sleep(200 * time.Millisecond)
		if n := s.renewCount(); n != 1 {
			t.Fatalf("%d renewals 7.1 s after the grant, want 1 (at a third of ValidFor, 7 s)", n)
		}
		if left := time.Until(ls.Deadline()); left < ttl-2*time.Second {
			t.Fatalf("validity left %v after the first renewal, want about a full TTL", left)
		}
		time.Sleep(9 * time.Second)
		if n := s.renewCount(); n != 1 {
			t.Fatalf("%d renewals 16 s after the grant, want the next at the interval after the first (17 s)", n)
		}
		if err := ls.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// shortWaiter is a driver.Waiter whose grants come after delay with
// Grant.ValidFor set.
type shortWaiter struct {
	*shortGrants
}

func (w shortWaiter) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := w.Driver.(driver.Waiter).Wait(ctx, req)
	time.Sleep(w.delay)
	if err == nil {
		g.ValidFor = w.validFor
	}
	return g, err
}

// TestAcquire_ShortGrantByWait: a waited grant with ValidFor that came
// early in its window becomes a lease bounded by it, with no renewal
// before Acquire returns; one that came after half of it (less the drift)
// is renewed first.
func TestAcquire_ShortGrantByWait(t *testing.T) {
	for _, tc := range []struct {
		name    string
		delay   time.Duration
		renewed bool
	}{
		{"early", 100 * time.Millisecond, false},
		{"late", 9 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newShortGrants(18 * time.Second)
				s.delay = tc.delay
				l := dlock.New(shortWaiter{s})
				defer l.Close()
				sent := time.Now()
				ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(30*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				if n := s.renewCount(); (n == 1) != tc.renewed || n > 1 {
					t.Fatalf("%d renewals before Acquire returned, want renewed: %v", n, tc.renewed)
				}
				want := sent.Add(18*time.Second - drift30s)
				if tc.renewed {
					want = sent.Add(tc.delay + 30*time.Second - drift30s)
				}
				if got := ls.Deadline(); !got.Equal(want) {
					t.Fatalf("deadline %v after the send, want %v", got.Sub(sent), want.Sub(sent))
				}
				if err := ls.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestTryAcquire_ShortGrantTooShortIsRenewedFirst: a ValidFor that the
// drift would more than halve, or an answer that took half of it, is
// renewed before TryAcquire returns, so the lease starts with a full TTL
// from that renewal.
func TestTryAcquire_ShortGrantTooShortIsRenewedFirst(t *testing.T) {
	for _, tc := range []struct {
		name            string
		validFor, delay time.Duration
	}{
		{"window under twice the drift", 500 * time.Millisecond, 0},
		{"answer took half the window", 4 * time.Second, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newShortGrants(tc.validFor)
				s.delay = tc.delay
				l := dlock.New(s)
				defer l.Close()
				ls, err := l.TryAcquire(t.Context(), "k", dlock.WithTTL(30*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				if n := s.renewCount(); n != 1 {
					t.Fatalf("%d renewals before TryAcquire returned, want 1", n)
				}
				if left := time.Until(ls.Deadline()); left < 29*time.Second {
					t.Fatalf("validity left %v, want a full TTL from the renewal", left)
				}
				if err := ls.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
