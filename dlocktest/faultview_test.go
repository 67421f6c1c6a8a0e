package dlocktest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// plain hides every optional capability of a driver.
type plain struct{ driver.Driver }

// The FaultDriver's view of a SharedLocker goes through the same injectors
// and counters, and reports its FaultDriver; capabilities the wrapped
// driver lacks are errors.ErrUnsupported.
func TestFaultDriver_SharedView(t *testing.T) {
	ctx := t.Context()
	fd := dlocktest.NewFaultDriver(memdriver.New(memdriver.NewStore()), t.Logf)
	f := dlocktest.Faults(fd)
	v, err := fd.(driver.SharedLocker).SharedView(driver.SharedKind{Mode: driver.Shared, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if dlocktest.Faults(v) != f {
		t.Fatal("Faults(view) is not the view's FaultDriver")
	}
	if _, ok := v.(driver.Waiter); !ok {
		t.Fatal("view of a Waiter hides Waiter")
	}
	req := driver.AcquireRequest{Key: "k", Owner: "o1", TTL: time.Second}
	if _, err := v.TryAcquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	req2 := driver.AcquireRequest{Key: "k", Owner: "o2", TTL: time.Second}
	if _, err := v.TryAcquire(ctx, req2); !errors.Is(err, driver.ErrNotAcquired) || f.Refused("k") != 1 {
		t.Fatalf("second permit of 1: %v, refused %d", err, f.Refused("k"))
	}
	f.BlockRenewals(true)
	rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = v.Renew(rctx, "k", "o1", time.Second)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked renewal through the view: %v", err)
	}
	f.BlockRenewals(false)
	f.CutOff(true)
	if err := v.Release(ctx, "k", "o1"); !errors.Is(err, dlocktest.ErrCutOff) {
		t.Fatalf("release while cut off: %v", err)
	}
	f.CutOff(false)

	// Freeze: a call hangs until thawed, then reaches the store.
	f.Freeze(true)
	done := make(chan error, 1)
	go func() { done <- v.Release(ctx, "k", "o1") }()
	select {
	case err := <-done:
		t.Fatalf("release returned while frozen: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	f.Freeze(false)
	if err := <-done; err != nil {
		t.Fatalf("release after the thaw: %v", err)
	}

	// WithoutWaiter's views hide Waiter too.
	nw := dlocktest.WithoutWaiter(memdriver.New(memdriver.NewStore()))
	v2, err := nw.(driver.SharedLocker).SharedView(driver.SharedKind{Mode: driver.Exclusive})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := v2.(driver.Waiter); ok {
		t.Fatal("WithoutWaiter's view has Waiter")
	}
	if _, ok := v2.(driver.Inspector); !ok {
		t.Fatal("WithoutWaiter's view hides Inspector")
	}

	// A wrapped driver without the capabilities.
	pd := dlocktest.NewFaultDriver(plain{memdriver.New(memdriver.NewStore())}, nil)
	if _, err := pd.(driver.SharedLocker).SharedView(driver.SharedKind{Mode: driver.Shared, Limit: 2}); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("SharedView of a plain driver: %v, want ErrUnsupported", err)
	}
	if _, err := pd.(driver.SharedLocker).SharedView(driver.SharedKind{Mode: driver.Shared, Limit: -1}); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("SharedView of an invalid kind: %v, want ErrInvalidArgument", err)
	}
	if _, err := pd.(driver.Resumer).Resume(ctx, req, 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Resume through a plain driver: %v, want ErrUnsupported", err)
	}
	if _, err := pd.(driver.KeyWatcher).WatchKey(ctx, "k"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("WatchKey through a plain driver: %v, want ErrUnsupported", err)
	}
}
