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
// its claim window, returns each grant unconfirmed (Grant.ConfirmWithin)
// when the request allows it, after delay.
type handoverWaiter struct {
	*countingDriver
	within time.Duration
	delay  time.Duration
	asked  []bool // each Wait's req.ConfirmLater
}

func (h *handoverWaiter) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	h.mu.Lock()
	h.asked = append(h.asked, req.ConfirmLater)
	h.mu.Unlock()
	g, err := h.Driver.(driver.Waiter).Wait(ctx, req)
	time.Sleep(h.delay)
	if err == nil && req.ConfirmLater {
		g.ConfirmWithin = h.within
	}
	return g, err
}

// TestAcquire_UnconfirmedHandoverIsBoundedUntilRenewed: a grant handed over
// unconfirmed is returned at once, valid only to the request's sending plus
// the confirmation window, and the lease's first renewal (its
// confirmation) follows within milliseconds and restores a full TTL.
func TestAcquire_UnconfirmedHandoverIsBoundedUntilRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &handoverWaiter{countingDriver: &countingDriver{Driver: memdriver.New(memdriver.NewStore())}, within: time.Second}
		l := dlock.New(h)
		defer l.Close()
		sent := time.Now()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if len(h.asked) != 1 || !h.asked[0] {
			t.Fatalf("Wait saw ConfirmLater %v, want true", h.asked)
		}
		if n := h.renewCount(); n != 0 {
			t.Fatalf("%d renewals before Acquire returned, want none (the handover is confirmed after)", n)
		}
		drift := 30*time.Second/100 + 2*time.Millisecond
		if got, want := ls.Deadline(), sent.Add(time.Second-drift); !got.Equal(want) {
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
		h := &handoverWaiter{countingDriver: &countingDriver{Driver: memdriver.New(memdriver.NewStore())}, within: time.Second}
		h.renewErr = driver.ErrLeaseLost
		l := dlock.New(h)
		defer l.Close()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		<-ls.Done()
		if d := time.Since(start); d > 10*time.Millisecond {
			t.Fatalf("lost %v after the grant, want at the confirmation (a few ms)", d)
		}
		if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("Err = %v, want ErrLeaseLost", ls.Err())
		}
	})
}

// TestAcquire_UnconfirmedHandoverUnansweredExpiresInTheWindow: a store
// that does not answer the confirmation leaves the lease valid only to the
// window's end, not the TTL's.
func TestAcquire_UnconfirmedHandoverUnansweredExpiresInTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &handoverWaiter{countingDriver: &countingDriver{Driver: memdriver.New(memdriver.NewStore())}, within: time.Second}
		h.renewErr = errors.New("connection reset")
		l := dlock.New(h)
		defer l.Close()
		sent := time.Now()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		<-ls.Done()
		drift := 30*time.Second/100 + 2*time.Millisecond
		if d := time.Since(sent); d != time.Second-drift {
			t.Fatalf("lost %v after the send, want at the window's end (%v)", d, time.Second-drift)
		}
		if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("Err = %v, want ErrLeaseLost", ls.Err())
		}
	})
}

// TestAcquire_LateUnconfirmedHandoverIsConfirmedFirst: a handover that
// arrives after half its window is confirmed before Acquire returns, and
// the lease then runs from that confirmation.
func TestAcquire_LateUnconfirmedHandoverIsConfirmedFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &handoverWaiter{countingDriver: &countingDriver{Driver: memdriver.New(memdriver.NewStore())}, within: time.Second, delay: 600 * time.Millisecond}
		l := dlock.New(h)
		defer l.Close()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if n := h.renewCount(); n != 1 {
			t.Fatalf("%d renewals before Acquire returned, want the one confirmation", n)
		}
		drift := 30*time.Second/100 + 2*time.Millisecond
		if left := time.Until(ls.Deadline()); left != 30*time.Second-drift {
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
		// TTL 30 s: drift 302 ms, more than the window.
		h := &handoverWaiter{countingDriver: &countingDriver{Driver: memdriver.New(memdriver.NewStore())}, within: 200 * time.Millisecond}
		l := dlock.New(h)
		defer l.Close()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if n := h.renewCount(); n != 1 {
			t.Fatalf("%d renewals before Acquire returned, want the one confirmation", n)
		}
		if left := time.Until(ls.Deadline()); left != 30*time.Second-302*time.Millisecond {
			t.Fatalf("validity left %v, want a full TTL less drift from the confirmation", left)
		}
		_ = ls.Release(t.Context())
	})
}
