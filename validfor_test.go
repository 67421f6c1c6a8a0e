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
// ValidFor less the drift, not the TTL, and the lease renews it before half
// of ValidFor has passed (not at the heartbeat interval, a third of the
// TTL), which restores a full TTL; no renewal is sent before TryAcquire
// returns.
func TestTryAcquire_ShortGrantIsBoundedUntilRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 30 * time.Second
		s := newShortGrants(20 * time.Second)
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
		if got, want := ls.Deadline(), sent.Add(20*time.Second-drift30s); !got.Equal(want) {
			t.Fatalf("deadline %v after the send, want %v (ValidFor less drift, not the TTL)", got.Sub(sent), want.Sub(sent))
		}
		time.Sleep(9 * time.Second) // before ValidFor/2 = 10 s
		if n := s.renewCount(); n != 0 {
			t.Fatalf("%d renewals 9 s after the grant, want none before half of ValidFor", n)
		}
		time.Sleep(2 * time.Second)
		if n := s.renewCount(); n != 1 {
			t.Fatalf("%d renewals 11 s after the grant, want 1 (at half of ValidFor, 10 s; the heartbeat interval is 10 s too here)", n)
		}
		if left := time.Until(ls.Deadline()); left < ttl-2*time.Second {
			t.Fatalf("validity left %v after the first renewal, want about a full TTL", left)
		}
		if err := ls.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestTryAcquire_ShortGrantRenewsEarlierThanTheHeartbeat: with ValidFor at
// 12 s of a 30 s TTL the first renewal comes at 6 s, before the heartbeat's
// 10 s, so the lease never runs on less than half of ValidFor.
func TestTryAcquire_ShortGrantRenewsEarlierThanTheHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newShortGrants(12 * time.Second)
		l := dlock.New(s)
		defer l.Close()
		ls, err := l.TryAcquire(t.Context(), "k", dlock.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5900 * time.Millisecond)
		if n := s.renewCount(); n != 0 {
			t.Fatalf("%d renewals before 6 s", n)
		}
		time.Sleep(200 * time.Millisecond)
		if n := s.renewCount(); n != 1 {
			t.Fatalf("%d renewals at 6.1 s, want the first at half of ValidFor (6 s)", n)
		}
		if err := ls.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
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
