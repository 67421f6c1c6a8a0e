package rwlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
	"github.com/dlock-dev/dlock/recipe/rwlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// plainOnly hides every optional capability of a driver, as a store with
// one grant per key has none (postgres, redlock, the cloud stores).
type plainOnly struct{ driver.Driver }

// memLockers returns n Lockers on one in-memory store (n processes).
func memLockers(t *testing.T, n int) []*dlock.Locker {
	t.Helper()
	s := memdriver.NewStore()
	var out []*dlock.Locker
	for range n {
		l := dlock.New(memdriver.New(s), dlock.WithTTL(5*time.Second), dlock.WithBackoff(time.Millisecond, 10*time.Millisecond))
		t.Cleanup(func() { l.Close() })
		out = append(out, l)
	}
	return out
}

func newRW(t *testing.T, l *dlock.Locker, name string) *rwlock.RWLock {
	t.Helper()
	rw, err := rwlock.New(l, name)
	if err != nil {
		t.Fatalf("rwlock.New: %v", err)
	}
	t.Cleanup(func() { rw.Close() })
	return rw
}

func TestNew_UnsupportedStoreNamesIt(t *testing.T) {
	l := dlock.New(plainOnly{memdriver.New(memdriver.NewStore())})
	defer l.Close()
	_, err := rwlock.New(l, "catalog")
	if !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("rwlock.New on a store without SharedLocker = %v, want ErrUnsupported", err)
	}
	if !strings.Contains(err.Error(), "rwlock_test") || !strings.Contains(err.Error(), "catalog") {
		t.Fatalf("error %q should name the store's driver and the lock", err)
	}
}

// limitedOnly is a SharedLocker that keeps semaphores but no read-write
// locks.
type limitedOnly struct{ driver.Driver }

func (limitedOnly) SharedView(k driver.SharedKind) (driver.Driver, error) {
	if k.Mode == driver.Shared && k.Limit > 0 {
		return nil, errors.New("not reached")
	}
	return nil, errors.ErrUnsupported
}

func TestNew_SharedLockerWithoutRWIsUnsupported(t *testing.T) {
	l := dlock.New(limitedOnly{memdriver.New(memdriver.NewStore())})
	defer l.Close()
	if _, err := rwlock.New(l, "x"); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("rwlock.New = %v, want ErrUnsupported", err)
	}
}

func TestNew_InvalidInput(t *testing.T) {
	l := memLockers(t, 1)[0]
	for _, name := range []string{"", "a\x00b", strings.Repeat("k", 513), "\xff"} {
		if _, err := rwlock.New(l, name); !errors.Is(err, dlock.ErrInvalidKey) || !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("rwlock.New(%q) = %v, want ErrInvalidKey", name, err)
		}
	}
	if _, err := rwlock.New(nil, "x"); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("rwlock.New(nil) = %v, want ErrInvalidArgument", err)
	}
	rw := newRW(t, l, "x")
	if _, err := rw.RLock(t.Context(), dlock.WithTTL(time.Millisecond)); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("RLock with a 1 ms TTL = %v, want ErrInvalidTTL", err)
	}
}

func TestRWLock_ReadersShareWriterExcludes(t *testing.T) {
	ls := memLockers(t, 3)
	ctx := t.Context()
	a, b, c := newRW(t, ls[0], "k"), newRW(t, ls[1], "k"), newRW(t, ls[2], "k")
	r1, err := a.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock beside a reader: %v", err)
	}
	if _, err := c.TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryLock while read-locked = %v, want ErrNotAcquired", err)
	}
	// The writer lock is a plain lock of the same key on mem.
	if _, err := ls[2].TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("plain TryAcquire of a read-locked key = %v, want ErrNotAcquired", err)
	}
	r1.Release(ctx)
	r2.Release(ctx)
	w, err := c.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock on a free lock: %v", err)
	}
	if w.Fence() <= max(r1.Fence(), r2.Fence()) {
		t.Fatalf("writer fence %d not above readers' %d, %d", w.Fence(), r1.Fence(), r2.Fence())
	}
	if _, err := a.TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock while write-locked = %v, want ErrNotAcquired", err)
	}
	w.Release(ctx)
}

func TestRWLock_CloseEndsItsLeases(t *testing.T) {
	l := memLockers(t, 1)[0]
	rw, err := rwlock.New(l, "k")
	if err != nil {
		t.Fatal(err)
	}
	r, err := rw.RLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := rw.Close(); err != nil {
		t.Fatal(err)
	}
	<-r.Done()
	if !errors.Is(r.Err(), dlock.ErrClosed) {
		t.Fatalf("lease after Close: %v, want ErrClosed", r.Err())
	}
	if _, err := rw.Lock(t.Context()); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Lock after Close = %v, want ErrClosed", err)
	}
	// The grant was released: a writer gets the key at once.
	w, err := l.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatalf("TryAcquire after Close: %v", err)
	}
	w.Release(t.Context())
}

// TestRWLock_Overlap_Mem: readers never overlap a writer (overlap detector,
// run it with -race), with the waiting of the store's queue.
func TestRWLock_Overlap_Mem(t *testing.T) {
	var rws []*rwlock.RWLock
	for _, l := range memLockers(t, 4) {
		rws = append(rws, newRW(t, l, "k"))
	}
	f := dlocktest.RWLockOverlap(t, rws, 3, time.Second)
	t.Logf("mem: %v", f)
	if f.Writes == 0 || f.Reads == 0 || f.MaxReaders < 2 {
		t.Fatalf("the run did not exercise both kinds and shared reads: %v", f)
	}
}

// TestRWLock_WriterNotStarved_Mem: a stream of overlapping readers does
// not starve a writer.
func TestRWLock_WriterNotStarved_Mem(t *testing.T) {
	ls := memLockers(t, 7)
	var readers []*rwlock.RWLock
	for _, l := range ls[:6] {
		readers = append(readers, newRW(t, l, "k"))
	}
	waited, during := dlocktest.RWLockWriterNotStarved(t, readers, newRW(t, ls[6], "k"), 100*time.Millisecond, 10*time.Second)
	t.Logf("mem: the writer waited %v; %d reader grants meanwhile", waited, during)
}

// TestRWLock_CancelledWriterLeavesNothing: a writer whose context ends
// while it waits leaves no queue entry that would hold readers back.
func TestRWLock_CancelledWriterLeavesNothing(t *testing.T) {
	ls := memLockers(t, 2)
	a, b := newRW(t, ls[0], "k"), newRW(t, ls[1], "k")
	r, err := a.RLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock = %v, want DeadlineExceeded", err)
	}
	r2, err := b.TryRLock(t.Context())
	if err != nil {
		t.Fatalf("TryRLock after the writer gave up: %v", err)
	}
	r2.Release(t.Context())
	r.Release(t.Context())
}

// TestRWLock_MemChecks runs dlocktest.RunRWLock on mem: kinds, overlap,
// writer not starved, per-grant TTLs.
func TestRWLock_MemChecks(t *testing.T) {
	s := memdriver.NewStore()
	dlocktest.RunRWLock(t, "mem", func(context.Context) (driver.Driver, error) { return memdriver.New(s), nil })
}
