// Package fencetest holds what the tests of fence/fencesql and
// fence/fenceredis share: the scenario fencing exists for, played with real
// leases, and running the packages' examples as written.
package fencetest

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
)

// TTL is the lease TTL of the scenario.
const TTL = 300 * time.Millisecond

// PausedHolder plays the scenario on key: holder A acquires it through a
// driver from open with TTL and is then paused (its renewals never reach
// the store, as if the process were stopped), the store expires A's grant,
// and B acquires with a greater fence. It returns both leases; the test then
// has B write and A write late with its old fence. open must return a new
// driver reaching the same store on each call; the leases and lockers are
// released and closed at cleanup.
func PausedHolder(t *testing.T, open func(t *testing.T) driver.Driver, key string) (a, b *dlock.Lease) {
	t.Helper()
	newLocker := func() (*dlock.Locker, *dlocktest.FaultDriver) {
		fd := dlocktest.NewFaultDriver(open(t), t.Logf)
		l := dlock.New(fd, dlock.WithTTL(TTL), dlock.WithBackoff(time.Millisecond, 20*time.Millisecond))
		t.Cleanup(func() { _ = l.Close() })
		return l, dlocktest.Faults(fd)
	}
	la, fa := newLocker()
	lb, _ := newLocker()
	a, err := la.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	fa.BlockRenewals(true) // A is paused: its lease runs out on the store
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	b, err = lb.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("B could not acquire after A's TTL: %v", err)
	}
	t.Cleanup(func() { _ = b.Release(context.Background()) })
	if b.Fence() <= a.Fence() {
		t.Fatalf("B's fence %d not greater than A's %d", b.Fence(), a.Fence())
	}
	return a, b
}

// Output runs example (an Example function, which prints to os.Stdout and
// ends the program with log.Fatal on an error, as a program would) and
// returns what it printed. Tests call it to run the examples as written
// against real servers, which go test cannot give them.
func Output(t *testing.T, example func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	out := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(r)
		out <- string(b)
	}()
	defer func() {
		os.Stdout = stdout
		w.Close()
		r.Close()
	}()
	example()
	os.Stdout = stdout
	w.Close()
	return <-out
}
