package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/recipe/semaphore"
)

// testSemaphore (Recipe_Semaphore): package semaphore on this store, from
// two clients (two processes). It is native where the driver keeps counted
// Shared grants (driver.SharedLocker accepting a semaphore kind) and
// portable slots elsewhere; every store supports it. Two permits of two are
// granted with their own fences, a third holder is refused, a waiter gets
// the permit a release frees, and a holder paused past its TTL has lost its
// lease (Done closed, by its deadline) before anyone else is granted its
// permit: never more than N valid holders.
func (s *suite) testSemaphore(t TB) {
	ttl := s.h.TTL
	a, fa := s.locker(t)
	b, _ := s.locker(t)
	name := key(t, "sem")
	semA, err := semaphore.New(a, name, 2)
	if err != nil {
		t.Fatalf("semaphore.New: %v", err)
	}
	semB, err := semaphore.New(b, name, 2)
	if err != nil {
		t.Fatalf("semaphore.New: %v", err)
	}
	wantNative := false
	if sl, ok := fa.Inner().(driver.SharedLocker); ok {
		_, err := sl.SharedView(driver.SharedKind{Mode: driver.Shared, Limit: 2})
		wantNative = err == nil
	}
	if semA.Native() != wantNative || semB.Native() != wantNative {
		t.Fatalf("Native() = %v, want %v (the driver's SharedView of a semaphore kind)", semA.Native(), wantNative)
	}
	if _, err := semaphore.New(a, name, 0); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("New with 0 permits: %v, want ErrInvalidArgument", err)
	}

	try := func(sem *semaphore.Semaphore, what string) *dlock.Lease {
		t.Helper()
		ls, err := sem.TryAcquire(t.Context(), dlock.WithTTL(ttl))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return ls
	}
	a1 := try(semA, "first permit")
	b1 := try(semB, "second permit")
	if !s.h.NoFence && a1.Key() == b1.Key() && a1.Fence() == b1.Fence() {
		t.Errorf("two permits with one fence %d", a1.Fence())
	}
	if a1.Key() == b1.Key() && !wantNative {
		t.Errorf("two portable permits on one slot %q", a1.Key())
	}
	if ls, err := semB.TryAcquire(t.Context(), dlock.WithTTL(ttl)); !errors.Is(err, dlock.ErrNotAcquired) {
		if ls != nil {
			_ = ls.Release(t.Context())
		}
		t.Fatalf("third holder of 2 permits: %v, want ErrNotAcquired", err)
	}
	if wantNative {
		// The store counts the permits: another N is refused while the
		// key has permits of this one.
		other, err := semaphore.New(b, name, 3)
		if err != nil {
			t.Fatalf("semaphore.New(3): %v", err)
		}
		if ls, err := other.TryAcquire(t.Context(), dlock.WithTTL(ttl)); !errors.Is(err, dlock.ErrInvalidArgument) {
			if ls != nil {
				_ = ls.Release(t.Context())
			}
			t.Errorf("a 3-permit holder of a 2-permit semaphore: %v, want ErrInvalidArgument", err)
		}
	}

	// A waiter gets the permit a release frees.
	type result struct {
		ls  *dlock.Lease
		err error
	}
	waited := make(chan result, 1)
	wctx, wcancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer wcancel()
	go func() {
		ls, err := semB.Acquire(wctx, dlock.WithTTL(ttl))
		waited <- result{ls, err}
	}()
	time.Sleep(20 * time.Millisecond)
	release(t, a1)
	r := <-waited
	if r.err != nil {
		t.Fatalf("waiter after a release: %v", r.err)
	}
	b2 := r.ls
	if !s.h.NoFence && b2.Key() == a1.Key() && b2.Fence() <= a1.Fence() {
		t.Errorf("freed permit granted with fence %d, not above the released %d", b2.Fence(), a1.Fence())
	}
	release(t, b1)

	// A holder paused past its TTL: its lease ends by its deadline, before
	// its permit is granted to anyone else.
	a2 := try(semA, "permit to pause")
	s.expireA(t, fa)
	defer fa.BlockRenewals(false)
	ctx, cancel := context.WithTimeout(t.Context(), 10*ttl+10*time.Second)
	defer cancel()
	b3, err := semB.Acquire(ctx, dlock.WithTTL(ttl))
	granted := time.Now()
	if err != nil {
		t.Fatalf("taking the paused holder's permit: %v", err)
	}
	select {
	case <-a2.Done():
	case <-time.After(time.Second):
		t.Fatal("paused holder's Done still open after its permit was granted again: 3 holders of 2 permits")
	}
	if dl := a2.Deadline(); !dl.Before(granted) {
		t.Errorf("paused holder's permit granted again %v before its deadline", dl.Sub(granted))
	}
	if !errors.Is(a2.Err(), dlock.ErrLeaseLost) {
		t.Errorf("paused holder's Err() = %v, want ErrLeaseLost", a2.Err())
	}
	fa.BlockRenewals(false)
	if err := a2.Release(t.Context()); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("releasing the lost permit: %v, want ErrLeaseLost", err)
	}
	release(t, b2)
	release(t, b3)
	t.Logf("semaphore on %s: %s", s.h.Name, map[bool]string{true: "native (counted Shared grants, FIFO)", false: fmt.Sprintf("portable (slots %s .. %s)", semaphore.SlotKey(name, 0), semaphore.SlotKey(name, 1))}[wantNative])
}
