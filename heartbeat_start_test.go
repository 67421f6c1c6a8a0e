package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// signalDriver hands out grants whose Lost channel is already closed
// (lost: the store reported the grant gone before the caller saw it), or
// whose Recheck channel already holds a hint, and counts renewals.
type signalDriver struct {
	driver.Driver
	lost, recheck bool
	renews        atomic.Int32
}

func (s *signalDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := s.Driver.TryAcquire(ctx, req)
	if err != nil {
		return g, err
	}
	if s.lost {
		c := make(chan struct{})
		close(c)
		g.Lost = c
	}
	if s.recheck {
		c := make(chan struct{}, 1)
		c <- struct{}{}
		g.Recheck = c
	}
	return g, nil
}

func (s *signalDriver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	s.renews.Add(1)
	return s.Driver.Renew(ctx, key, owner, ttl)
}

// TestLease_SignalsBeforeTheHeartbeatStarts: the heartbeat goroutine starts
// a few milliseconds after the grant, yet a loss pushed at grant time ends
// the lease at once (within those milliseconds, not at the first renewal,
// 10 s later), and a recheck hint sent at grant time is answered by a
// renewal.
func TestLease_SignalsBeforeTheHeartbeatStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sd := &signalDriver{Driver: memdriver.New(memdriver.NewStore()), lost: true}
		l := dlock.New(sd, dlock.WithTTL(30*time.Second))
		defer l.Close()
		ls, err := l.TryAcquire(t.Context(), "lost")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		<-ls.Done()
		if d := time.Since(start); d > 10*time.Millisecond {
			t.Fatalf("a loss pushed at grant time ended the lease after %v, want within 10ms", d)
		}
		if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("Err = %v, want ErrLeaseLost", ls.Err())
		}

		sd.lost, sd.recheck = false, true
		ls, err = l.TryAcquire(t.Context(), "recheck")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if n := sd.renews.Load(); n != 1 {
			t.Fatalf("%d renewals 50ms after a recheck hint sent at grant time, want 1", n)
		}
		if err := ls.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLease_ReleasedAtOnceStartsNoHeartbeat: a lease released right after
// its grant leaves no heartbeat behind, and none starts later (no renewal
// is ever sent for it).
func TestLease_ReleasedAtOnceStartsNoHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sd := &signalDriver{Driver: memdriver.New(memdriver.NewStore())}
		l := dlock.New(sd, dlock.WithTTL(300*time.Millisecond))
		defer l.Close()
		for range 3 {
			ls, err := l.Acquire(t.Context(), "k")
			if err != nil {
				t.Fatal(err)
			}
			if err := ls.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := sd.renews.Load(); n != 0 {
			t.Fatalf("%d renewals of released leases", n)
		}
	})
}
