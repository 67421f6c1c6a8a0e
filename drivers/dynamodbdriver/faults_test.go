package dynamodbdriver_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/internal/netproxy"
)

// proxied opens a Locker whose driver reaches the emulator through a fault
// proxy, and the proxy.
func (s *store) proxied(t *testing.T, opts ...dlock.Option) (*dlock.Locker, *netproxy.Proxy) {
	t.Helper()
	p := netproxy.Start(t, s.dl.Addr(), 1)
	t.Cleanup(p.Release)
	l, err := dlock.Open(t.Context(), strings.Replace(s.url(), s.dl.Addr(), p.Addr(), 1), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, p
}

// testFaultUnreachableFailsClosed: with the link to DynamoDB blackholed
// (connections open, nothing delivered), an acquisition fails with
// ErrUnavailable within the op timeout and no lease, and a held lease is
// lost by its validity deadline, not later.
func testFaultUnreachableFailsClosed(t *testing.T, s *store) {
	const op, ttl = time.Second, 800 * time.Millisecond
	l, p := s.proxied(t, dlock.WithOpTimeout(op))
	held, err := l.TryAcquire(t.Context(), "held", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	// Watched from before the fault: the deadline passes while the
	// TryAcquire below waits out its op timeout.
	lost := make(chan time.Time, 1)
	go func() { <-held.Done(); lost <- time.Now() }()
	p.Hold()
	began := time.Now()
	ls, err := l.TryAcquire(t.Context(), "other")
	if !errors.Is(err, dlock.ErrUnavailable) || ls != nil {
		t.Fatalf("TryAcquire with the link blackholed = %v, %v; want ErrUnavailable, no lease", ls, err)
	}
	if took := time.Since(began); took > op+2*time.Second {
		t.Fatalf("TryAcquire took %v with the link blackholed, op timeout %v", took, op)
	}
	select {
	case lostAt := <-lost:
		if !errors.Is(held.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("held lease ended with %v, want ErrLeaseLost", held.Err())
		}
		if late := lostAt.Sub(held.Deadline()); late > 500*time.Millisecond {
			t.Fatalf("held lease lost %v after its deadline", late)
		}
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("held lease not lost with the link blackholed")
	}
}

// testFaultPausedHolderTakenOverWithGreaterFence: a holder paused past its
// lease (its whole link held, as a stopped process's would be) loses the
// lease by its own deadline; a waiter polling meanwhile takes the key over
// only after that deadline, with a greater fence, and a fenced resource
// then refuses the paused holder's late write.
func testFaultPausedHolderTakenOverWithGreaterFence(t *testing.T, s *store) {
	const ttl = 600 * time.Millisecond
	a, p := s.proxied(t)
	b, err := dlock.Open(t.Context(), s.url())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	la, err := a.TryAcquire(t.Context(), "k", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	resource := newFencedResource()
	if err := resource.write(la.Fence()); err != nil {
		t.Fatal(err)
	}
	p.Hold() // the holder is paused: nothing it sends arrives
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	lb, err := b.Acquire(ctx, "k", dlock.WithTTL(ttl))
	grantedB := time.Now()
	if err != nil {
		t.Fatalf("the waiter could not take over a paused holder: %v", err)
	}
	defer lb.Release(context.WithoutCancel(t.Context()))
	select {
	case <-la.Done():
	case <-time.After(time.Second):
		t.Fatal("the paused holder's lease is still open after the takeover")
	}
	if !la.Deadline().Before(grantedB) {
		t.Fatalf("the waiter was granted %v before the paused holder's deadline", la.Deadline().Sub(grantedB))
	}
	if lb.Fence() <= la.Fence() {
		t.Fatalf("takeover fence %d, not greater than the paused holder's %d", lb.Fence(), la.Fence())
	}
	if err := resource.write(lb.Fence()); err != nil {
		t.Fatal(err)
	}
	p.Release() // the holder wakes and writes with its old fence
	if err := resource.write(la.Fence()); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("the paused holder's late write = %v, want ErrStaleFence", err)
	}
	if err := la.Release(t.Context()); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("the paused holder's Release = %v, want ErrLeaseLost", err)
	}
	if lb.Err() != nil {
		t.Fatalf("the new holder's lease ended: %v", lb.Err())
	}
}

// fencedResource is the resource side of fencing: it accepts a write only
// with a fence greater than or equal to the greatest it has seen.
type fencedResource struct{ last chan uint64 }

func newFencedResource() *fencedResource {
	r := &fencedResource{last: make(chan uint64, 1)}
	r.last <- 0
	return r
}

func (r *fencedResource) write(fence uint64) error {
	last := <-r.last
	defer func() { r.last <- last }()
	if fence < last {
		return dlock.ErrStaleFence
	}
	last = fence
	return nil
}
