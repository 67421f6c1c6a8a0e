package dlock_test

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

// closeCounter counts Close calls on the driver under a view.
type closeCounter struct {
	driver.Driver
	closes atomic.Int32
}

func (c *closeCounter) Close() error { c.closes.Add(1); return nil }

// TestView_ClosesWithParentAndOwnsNoDriver: a view's leases end with
// ErrClosed when its parent closes, and closing a view closes no driver.
func TestView_ClosesWithParentAndOwnsNoDriver(t *testing.T) {
	ctx := context.Background()
	l := dlock.New(memdriver.New(memdriver.NewStore()))
	cc := &closeCounter{Driver: l.Driver()}
	v := l.View(cc)

	lease, err := v.TryAcquire(ctx, "view-key", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "view-key"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("parent TryAcquire of a key its view holds: %v, want ErrNotAcquired", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the view's lease outlived its parent's Close")
	}
	if !errors.Is(lease.Err(), dlock.ErrClosed) {
		t.Fatalf("lease.Err() = %v, want ErrClosed", lease.Err())
	}
	if n := cc.closes.Load(); n != 0 {
		t.Fatalf("the view closed its driver %d times, want 0 (the parent owns it)", n)
	}
	if _, err := v.TryAcquire(ctx, "other"); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryAcquire on a view of a closed locker: %v, want ErrClosed", err)
	}
	if _, err := l.View(cc).TryAcquire(ctx, "other"); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryAcquire on a view made after Close: %v, want ErrClosed", err)
	}
}

// TestView_CloseEndsOnlyItsLeases: closing a view ends its leases and leaves
// its parent's running.
func TestView_CloseEndsOnlyItsLeases(t *testing.T) {
	ctx := context.Background()
	l := dlock.New(memdriver.New(memdriver.NewStore()))
	defer l.Close()
	v := l.View(l.Driver())
	vl, err := v.TryAcquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	pl, err := l.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	<-vl.Done()
	if pl.Err() != nil {
		t.Fatalf("parent lease ended with its view: %v", pl.Err())
	}
	if _, err := l.TryAcquire(ctx, "a"); err != nil {
		t.Fatalf("key of the closed view's lease still held: %v", err)
	}
}
