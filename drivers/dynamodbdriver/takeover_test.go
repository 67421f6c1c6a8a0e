package dynamodbdriver_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

// The record-version scheme, seen from the driver: a waiter takes a key
// over only after seeing the same record version for a full lease on its
// own clock, and only with a write conditioned on that version.

const (
	ownerA = "owner-a-0123456789abcdef"
	ownerB = "owner-b-0123456789abcdef"
	ownerC = "owner-c-0123456789abcdef"
)

// testTakeoverLiveHolderIsNeverTakenOver: a holder that renews keeps the
// key however long a waiter polls: each renewal writes a new record
// version, so the waiter's observation starts over. Every TryAcquire
// answers ErrNotAcquired at once.
func testTakeoverLiveHolderIsNeverTakenOver(t *testing.T, s *store) {
	a, b := s.open(t), s.open(t)
	const ttl = 300 * time.Millisecond
	ga := mustGrant(t, a, req("k", ownerA, ttl))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(ttl / 4)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if err := a.Renew(t.Context(), "k", ownerA, ttl); err != nil {
					t.Errorf("Renew: %v", err)
					return
				}
			}
		}
	}()
	for end := time.Now().Add(4 * ttl); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		began := time.Now()
		if g, err := b.TryAcquire(t.Context(), req("k", ownerB, ttl)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a renewed key = %+v, %v; want ErrNotAcquired", g, err)
		}
		if took := time.Since(began); took > 2*time.Second {
			t.Fatalf("TryAcquire of a held key took %v, want at once", took)
		}
	}
	close(stop)
	wg.Wait()
	if err := a.Release(t.Context(), "k", ownerA); err != nil {
		t.Fatal(err)
	}
	gb := mustGrant(t, b, req("k", ownerB, ttl))
	if gb.Fence <= ga.Fence {
		t.Fatalf("fence after the release %d, not greater than %d", gb.Fence, ga.Fence)
	}
}

// testTakeoverDeadHolderAfterOwnObservation: a holder that stopped
// renewing is taken over by a waiter only a full lease after the waiter
// first saw its record version, however long ago the holder stopped; a
// fresh driver's first TryAcquire never takes it. The takeover's fence is
// greater, and the dead holder's late renewal and release are refused.
func testTakeoverDeadHolderAfterOwnObservation(t *testing.T, s *store) {
	a, b := s.open(t), s.open(t)
	const ttl = 400 * time.Millisecond
	ga := mustGrant(t, a, req("k", ownerA, ttl))
	time.Sleep(ttl + 200*time.Millisecond) // the holder is long past its lease

	firstCall := time.Now()
	mustHeld(t, b, req("k", ownerB, ttl)) // first observation
	// Another fresh driver has not observed anything: held, for it too.
	mustHeld(t, s.open(t), req("k", ownerC, ttl))
	var gb driver.Grant
	for {
		g, err := b.TryAcquire(t.Context(), req("k", ownerB, ttl))
		if err == nil {
			gb = g
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatal(err)
		}
		if time.Since(firstCall) > ttl+5*time.Second {
			t.Fatalf("no takeover %v after the first observation", time.Since(firstCall))
		}
		time.Sleep(10 * time.Millisecond)
	}
	waited := time.Since(firstCall)
	t.Logf("taken over %v after the waiter's first TryAcquire (lease %v)", waited, ttl)
	if waited < ttl {
		t.Fatalf("taken over %v after the first observation, less than the lease %v", waited, ttl)
	}
	if gb.Fence <= ga.Fence {
		t.Fatalf("takeover fence %d, not greater than the dead holder's %d", gb.Fence, ga.Fence)
	}
	if err := a.Renew(t.Context(), "k", ownerA, ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("the dead holder's Renew = %v, want ErrLeaseLost", err)
	}
	if err := a.Release(t.Context(), "k", ownerA); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("the dead holder's Release = %v, want ErrLeaseLost", err)
	}
	if info, err := a.Inspect(t.Context(), "k"); err != nil || info.Fence != gb.Fence || info.Holder != "test "+ownerB {
		t.Fatalf("Inspect after the takeover = %+v, %v", info, err)
	}
	if b.Observations() != 0 {
		t.Errorf("the waiter still keeps %d observations after its grant", b.Observations())
	}
}

// testTakeoverRenewalBeforeTakeoverWins: a renewal that lands after the
// waiter's observation but before its takeover changes the record version,
// so the takeover's condition fails and the holder keeps the key.
func testTakeoverRenewalBeforeTakeoverWins(t *testing.T, s *store) {
	a, b := s.open(t), s.open(t)
	const ttl = 300 * time.Millisecond
	mustGrant(t, a, req("k", ownerA, ttl))
	mustHeld(t, b, req("k", ownerB, ttl)) // observes version 1
	time.Sleep(ttl / 2)
	if err := a.Renew(t.Context(), "k", ownerA, ttl); err != nil { // version 2
		t.Fatal(err)
	}
	time.Sleep(ttl/2 + 100*time.Millisecond) // version 1 seen a lease ago
	mustHeld(t, b, req("k", ownerB, ttl))    // the takeover of version 1 is refused
	if err := a.Renew(t.Context(), "k", ownerA, ttl); err != nil {
		t.Fatalf("the holder lost the key to a takeover of an old version: %v", err)
	}
}

// testTakeoverLeaseIsTheHolders: the waiter waits the lease the holder
// wrote, not its own TTL.
func testTakeoverLeaseIsTheHolders(t *testing.T, s *store) {
	a, b := s.open(t), s.open(t)
	const holderTTL = 800 * time.Millisecond
	mustGrant(t, a, req("k", ownerA, holderTTL))
	began := time.Now()
	mustHeld(t, b, req("k", ownerB, 100*time.Millisecond))
	for {
		_, err := b.TryAcquire(t.Context(), req("k", ownerB, 100*time.Millisecond))
		if err == nil {
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if waited := time.Since(began); waited < holderTTL {
		t.Fatalf("taken over after %v, before the holder's lease of %v", waited, holderTTL)
	}
}
