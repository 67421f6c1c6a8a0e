package dynamodbdriver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// Ambiguous writes: the write landed on DynamoDB but its reply was lost,
// so the client saw an error (a timeout, to it).

// testAmbiguousRenewalReplyLostIsNotALoss: a renewal whose reply is lost
// is a store error, never ErrLeaseLost; the item still names the grant,
// and the next renewal (conditioned on the owner, not on the version the
// client could not learn) succeeds.
func testAmbiguousRenewalReplyLostIsNotALoss(t *testing.T, s *store) {
	drop := newReplyDropper(t)
	a := s.newDriver(t, s.client(t, drop), nil)
	other := s.open(t)
	g := mustGrant(t, a, req("k", ownerA, time.Second))
	before := s.item(t, "k")

	drop.arm("UpdateItem")
	err := a.Renew(t.Context(), "k", ownerA, time.Second)
	if err == nil || errors.Is(err, driver.ErrLeaseLost) || errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("Renew with a lost reply = %v; want a store error", err)
	}
	if drop.drops.Load() != 1 {
		t.Fatal("no reply was dropped")
	}
	after := s.item(t, "k")
	if rb, _ := attrS(before, "rvn"); rb == func() string { v, _ := attrS(after, "rvn"); return v }() {
		t.Fatal("the renewal did not land (record version unchanged): the test proves nothing")
	}
	if info, err := other.Inspect(t.Context(), "k"); err != nil || info.Fence != g.Fence {
		t.Fatalf("after the lost reply: Inspect = %+v, %v; want the grant", info, err)
	}
	if err := a.Renew(t.Context(), "k", ownerA, time.Second); err != nil {
		t.Fatalf("the renewal after a lost reply = %v, want nil", err)
	}
	mustHeld(t, other, req("k", ownerB, time.Second))
}

// testAmbiguousGrantReplyLostIsAdopted: an acquisition whose grant landed
// but whose reply was lost is found again by the next attempt with the same
// owner token (the driver re-reads the item and renews its own grant),
// with the fence the grant got.
func testAmbiguousGrantReplyLostIsAdopted(t *testing.T, s *store) {
	drop := newReplyDropper(t)
	a := s.newDriver(t, s.client(t, drop), nil)
	other := s.open(t)
	// The key's item exists and is free: the first write is the grant.
	first := mustGrant(t, a, req("k", ownerC, time.Second))
	if err := a.Release(t.Context(), "k", ownerC); err != nil {
		t.Fatal(err)
	}

	drop.arm("UpdateItem")
	if g, err := a.TryAcquire(t.Context(), req("k", ownerA, time.Second)); err == nil || errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire with a lost reply = %+v, %v; want a store error", g, err)
	}
	info, err := other.Inspect(t.Context(), "k")
	if err != nil || info.Holder != "test "+ownerA || info.Fence <= first.Fence {
		t.Fatalf("after the lost reply: Inspect = %+v, %v; want ownerA's grant", info, err)
	}
	g, err := a.TryAcquire(t.Context(), req("k", ownerA, time.Second))
	if err != nil || g.Fence != info.Fence {
		t.Fatalf("the retried TryAcquire = %+v, %v; want the landed grant's fence %d", g, err, info.Fence)
	}
	mustHeld(t, other, req("k", ownerB, time.Second))
	if err := a.Release(t.Context(), "k", ownerA); err != nil {
		t.Fatal(err)
	}
}

// testAmbiguousLeaseSurvivesALostRenewalReply: through the root package,
// a lease one of whose renewals lost its reply stays held (the heartbeat
// renews again within the lease), and another client cannot take it.
func testAmbiguousLeaseSurvivesALostRenewalReply(t *testing.T, s *store) {
	drop := newReplyDropper(t)
	l := dlock.New(s.newDriver(t, s.client(t, drop), nil), dlock.WithStoreName("dynamodb"))
	defer l.Close()
	other, err := dlock.Open(t.Context(), s.url())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	const ttl = 900 * time.Millisecond
	ls, err := l.TryAcquire(t.Context(), "k", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	drop.arm("UpdateItem") // the next renewal's reply
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		select {
		case <-ls.Done():
			t.Fatalf("lease lost after a renewal's reply was lost: %v", ls.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if drop.drops.Load() != 1 {
		t.Fatal("no renewal reply was dropped")
	}
	if _, err := other.TryAcquire(t.Context(), "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("another client's TryAcquire = %v, want ErrNotAcquired", err)
	}
	if err := ls.Release(context.WithoutCancel(t.Context())); err != nil {
		t.Fatal(err)
	}
}
