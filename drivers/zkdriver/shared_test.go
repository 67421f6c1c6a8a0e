package zkdriver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/recipe/rwlock"
)

// TestRWLock runs the read-write lock checks (Curator's
// InterProcessReadWriteLock) against a real ZooKeeper: kinds, an overlap
// detector, a writer behind a stream of readers, per-grant TTLs.
func TestRWLock(t *testing.T) {
	e := newEnv(t)
	dlocktest.RunRWLock(t, "zk", func(ctx context.Context) (driver.Driver, error) {
		d, _, err := e.open(ctx)
		return d, err
	})
}

// TestRWLock_SharesPlainKeySpace: an Exclusive grant is a plain lock of the
// key, so a plain lock and readers exclude each other, and a waiting plain
// lock holds back later readers.
func TestRWLock_SharesPlainKeySpace(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	open := func() *dlock.Locker {
		d, _, err := e.open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l := dlock.New(d)
		t.Cleanup(func() { l.Close() })
		return l
	}
	l1, l2 := open(), open()
	key := fmt.Sprintf("plain-rw/%d", time.Now().UnixNano())
	rw, err := rwlock.New(l1, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	r, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l2.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("plain TryAcquire of a read-locked key = %v, want ErrNotAcquired", err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		ls, err := l2.Acquire(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r2, err := rw.TryRLock(ctx)
		if errors.Is(err, dlock.ErrNotAcquired) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		r2.Release(ctx)
		if time.Now().After(deadline) {
			t.Fatal("a waiting plain lock did not hold back readers")
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.Release(ctx)
	p := <-got
	if p == nil {
		t.FailNow()
	}
	if p.Fence() <= r.Fence() {
		t.Fatalf("plain lock fence %d not above the reader's %d", p.Fence(), r.Fence())
	}
	if _, err := rw.TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock while a plain lock holds = %v, want ErrNotAcquired", err)
	}
	p.Release(ctx)
}

// TestRWLock_SessionLossIsPushed: when the reader's connection is cut, its
// lease ends at once (Grant.Lost), and a writer gets the lock once the
// server has expired the session.
func TestRWLock_SessionLossIsPushed(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	da, cd, err := e.open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	la := dlock.New(da)
	defer la.Close()
	dw, _, err := e.open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lw := dlock.New(dw)
	defer lw.Close()
	key := fmt.Sprintf("rw-lost:%d", time.Now().UnixNano())
	a, err := rwlock.New(la, key)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	w, err := rwlock.New(lw, key)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := a.RLock(ctx, dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cd.Cut(true)
	defer cd.Cut(false)
	select {
	case <-r.Done():
	case <-time.After(3 * sessionTimeout):
		t.Fatal("a reader whose connection was cut kept its lease")
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	wl, err := w.Lock(wctx)
	if err != nil {
		t.Fatalf("Lock after the reader's session was lost: %v", err)
	}
	if wl.Fence() <= r.Fence() {
		t.Fatalf("writer fence %d not above the lost reader's %d", wl.Fence(), r.Fence())
	}
	wl.Release(ctx)
}
