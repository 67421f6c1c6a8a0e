package dlock_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// handoverWaiter grants through memdriver's queue and, as dlockd does with
// its claim window, returns each grant of WaitUnconfirmed unconfirmed
// (Grant.ConfirmWithin), after delay.
type handoverWaiter struct {
	*countingDriver
	within time.Duration
	delay  time.Duration
	asked  int // WaitUnconfirmed calls
}

func (h *handoverWaiter) WaitUnconfirmed(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	h.mu.Lock()
	h.asked++
	h.mu.Unlock()
	g, err := h.Driver.(driver.Waiter).Wait(ctx, req)
	time.Sleep(h.delay)
	if err == nil {
		g.ConfirmWithin = h.within
	}
	return g, err
}

func (h *handoverWaiter) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return h.Driver.(driver.Waiter).Wait(ctx, req)
}

// newHandover returns a handoverWaiter over inner (memdriver's when nil)
// whose grants come with the confirmation window within.
func newHandover(inner driver.Driver, within time.Duration) *handoverWaiter {
	if inner == nil {
		inner = memdriver.New(memdriver.NewStore())
	}
	return &handoverWaiter{countingDriver: &countingDriver{Driver: inner}, within: within}
}

// acquireVia acquires "k" with ttl, waiting, through a Locker over d, and
// returns the lease and when the acquisition was sent.
func acquireVia(t *testing.T, d driver.Driver, ttl time.Duration) (*dlock.Lease, time.Time) {
	t.Helper()
	l := dlock.New(d)
	t.Cleanup(func() { l.Close() })
	sent := time.Now()
	ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	return ls, sent
}

// drift30s is the client's drift for a TTL of 30 s (1% + 2 ms).
const drift30s = 302 * time.Millisecond

// awaitLost waits for ls to end and checks that it was lost.
func awaitLost(t *testing.T, ls *dlock.Lease) {
	t.Helper()
	<-ls.Done()
	if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", ls.Err())
	}
}

// TestAcquire_UnconfirmedHandoverIsBoundedUntilRenewed: a grant handed over
// unconfirmed is returned at once, valid only to the request's sending plus
// the confirmation window, and the lease's first renewal (its
// confirmation) follows within milliseconds and restores a full TTL.
func TestAcquire_UnconfirmedHandoverIsBoundedUntilRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHandover(nil, time.Second)
		ls, sent := acquireVia(t, h, 30*time.Second)
		if h.asked != 1 {
			t.Fatalf("%d WaitUnconfirmed calls, want 1 (the root prefers it to Wait)", h.asked)
		}
		if n := h.renewCount(); n != 0 {
			t.Fatalf("%d renewals before Acquire returned, want none (the handover is confirmed after)", n)
		}
		if got, want := ls.Deadline(), sent.Add(time.Second-drift30s); !got.Equal(want) {
			t.Fatalf("deadline %v after the send, want %v (the confirmation window less drift, not the TTL)", got.Sub(sent), want.Sub(sent))
		}
		time.Sleep(50 * time.Millisecond)
		if n := h.renewCount(); n != 1 {
			t.Fatalf("%d renewals 50 ms after the grant, want the one confirmation", n)
		}
		if left := time.Until(ls.Deadline()); left < 29*time.Second {
			t.Fatalf("validity left %v after the confirmation, want about a full TTL", left)
		}
		time.Sleep(5 * time.Second) // well past the window: still held
		if err := ls.Err(); err != nil {
			t.Fatalf("lease lost after its confirmation: %v", err)
		}
		if err := ls.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestAcquire_UnconfirmedHandoverRefusedIsLost: when the confirmation is
// refused (the store already passed the key on), the lease is lost at once.
func TestAcquire_UnconfirmedHandoverRefusedIsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHandover(nil, time.Second)
		h.renewErr = driver.ErrLeaseLost
		ls, _ := acquireVia(t, h, 30*time.Second)
		start := time.Now()
		awaitLost(t, ls)
		if d := time.Since(start); d > 10*time.Millisecond {
			t.Fatalf("lost %v after the grant, want at the confirmation (a few ms)", d)
		}
	})
}

// TestAcquire_UnconfirmedHandoverLostAtItsWindow: a confirmation the
// client has not heard leaves the lease valid only to the window's end,
// not the TTL's: whether the store never answers it, or the confirmation
// reached the store and was answered after the window. (In the second case
// the store keeps the grant to its TTL, and a lock-delay after it, as for
// any renewal answered after its lease's deadline: the lease does not
// release it, so that the holder's in-flight writes land before the next
// holder starts.)
func TestAcquire_UnconfirmedHandoverLostAtItsWindow(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    func() *handoverWaiter
	}{
		{"unanswered", func() *handoverWaiter {
			h := newHandover(nil, time.Second)
			h.renewErr = errors.New("connection reset")
			return h
		}},
		{"answered late", func() *handoverWaiter {
			return newHandover(slowAnswer{memdriver.New(memdriver.NewStore()), 2 * time.Second}, time.Second)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ls, sent := acquireVia(t, tc.h(), 30*time.Second)
				awaitLost(t, ls)
				if d := time.Since(sent); d != time.Second-drift30s {
					t.Fatalf("lost %v after the send, want at the window's end (%v)", d, time.Second-drift30s)
				}
			})
		})
	}
}

// TestAcquire_LateUnconfirmedHandoverIsConfirmedFirst: a handover that
// arrives after half its window is confirmed before Acquire returns, and
// the lease then runs from that confirmation.
func TestAcquire_LateUnconfirmedHandoverIsConfirmedFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHandover(nil, time.Second)
		h.delay = 600 * time.Millisecond
		ls, _ := acquireVia(t, h, 30*time.Second)
		if n := h.renewCount(); n != 1 {
			t.Fatalf("%d renewals before Acquire returned, want the one confirmation", n)
		}
		if left := time.Until(ls.Deadline()); left != 30*time.Second-drift30s {
			t.Fatalf("validity left %v, want a full TTL less drift from the confirmation", left)
		}
		time.Sleep(20 * time.Millisecond)
		if n := h.renewCount(); n != 1 {
			t.Fatalf("%d renewals 20 ms later, want no second confirmation", n)
		}
		_ = ls.Release(t.Context())
	})
}

// TestAcquire_ShortWindowHandoverIsConfirmedFirst: a confirmation window
// that the drift would use up is never relied on: the grant is confirmed
// before Acquire returns.
func TestAcquire_ShortWindowHandoverIsConfirmedFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHandover(nil, 200*time.Millisecond) // TTL 30 s: drift 302 ms, more than the window
		ls, _ := acquireVia(t, h, 30*time.Second)
		if n := h.renewCount(); n != 1 {
			t.Fatalf("%d renewals before Acquire returned, want the one confirmation", n)
		}
		if left := time.Until(ls.Deadline()); left != 30*time.Second-drift30s {
			t.Fatalf("validity left %v, want a full TTL less drift from the confirmation", left)
		}
		_ = ls.Release(t.Context())
	})
}

// slowAnswer renews on the store at once but answers only after delay (a
// slow way back: the store has the confirmation, the client does not yet).
type slowAnswer struct {
	*memdriver.Driver
	delay time.Duration
}

func (s slowAnswer) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	err := s.Driver.Renew(context.WithoutCancel(ctx), key, owner, ttl)
	select {
	case <-time.After(s.delay):
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestAcquire_ThinWindowHandoverIsConfirmedFirst: a window that the drift
// nearly uses up (dlockd's default 5 s against a TTL of 8m15s: drift
// 4.952 s, 48 ms left) is not relied on: the grant is confirmed before
// Acquire returns, and a confirmation answered in 50 ms keeps the lease.
func TestAcquire_ThinWindowHandoverIsConfirmedFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHandover(slowAnswer{memdriver.New(memdriver.NewStore()), 50 * time.Millisecond}, 5*time.Second)
		ls, _ := acquireVia(t, h, 8*time.Minute+15*time.Second)
		if n := h.renewCount(); n != 1 {
			t.Fatalf("%d renewals before Acquire returned, want the one confirmation", n)
		}
		time.Sleep(200 * time.Millisecond)
		if err := ls.Err(); err != nil {
			t.Fatalf("lease lost 200 ms after a healthy handover: %v", err)
		}
		_ = ls.Release(t.Context())
	})
}

// TestAcquire_WrapperWithoutWaitUnconfirmedUsesWait: a driver that is only
// a Waiter (a wrapper written before driver.UnconfirmedWaiter, which
// forwards Wait alone) is waited on with Wait, whose grants are confirmed,
// and its lease runs a full TTL from the send.
func TestAcquire_WrapperWithoutWaitUnconfirmedUsesWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHandover(nil, time.Second)
		var d driver.Driver = struct {
			driver.Driver
			driver.Waiter
		}{h, h}
		if _, ok := d.(driver.UnconfirmedWaiter); ok {
			t.Fatal("the wrapper implements UnconfirmedWaiter")
		}
		ls, sent := acquireVia(t, d, 30*time.Second)
		if h.asked != 0 {
			t.Fatalf("%d WaitUnconfirmed calls through a wrapper that does not forward it", h.asked)
		}
		if got := ls.Deadline().Sub(sent); got != 30*time.Second-drift30s {
			t.Fatalf("deadline %v after the send, want a full TTL less drift", got)
		}
		_ = ls.Release(t.Context())
	})
}
