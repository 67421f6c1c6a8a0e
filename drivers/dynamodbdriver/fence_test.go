package dynamodbdriver_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dynamodbdriver"
)

// testFenceEpochAndCounter: a key's first grant draws a fence epoch (E·2^24
// + 1), later grants of the same item add 1; each new key draws the next
// epoch; a release keeps the counter.
func testFenceEpochAndCounter(t *testing.T, s *store) {
	d := s.open(t)
	shift := dynamodbdriver.EpochBits()
	ga := mustGrant(t, d, req("a", ownerA, time.Minute))
	gb := mustGrant(t, d, req("b", ownerA, time.Minute))
	if ga.Fence != 1<<shift+1 || gb.Fence != 2<<shift+1 {
		t.Fatalf("first fences %d, %d; want %d, %d (epochs 1 and 2)", ga.Fence, gb.Fence, uint64(1<<shift+1), uint64(2<<shift+1))
	}
	if err := d.Release(t.Context(), "a", ownerA); err != nil {
		t.Fatal(err)
	}
	item := s.item(t, "a")
	if _, held := attrS(item, "owner"); held {
		t.Fatalf("released item still has an owner: %v", item)
	}
	if f, _ := attrN(t, item, "fence"); uint64(f) != ga.Fence {
		t.Fatalf("released item's fence %d, want %d kept", f, ga.Fence)
	}
	ga2 := mustGrant(t, d, req("a", ownerB, time.Minute))
	if ga2.Fence != ga.Fence+1 {
		t.Fatalf("second grant of a: fence %d, want %d", ga2.Fence, ga.Fence+1)
	}
	if _, ok := attrN(t, s.item(t, dynamodbdriver.EpochKey), "epoch"); !ok {
		t.Fatal("no epoch counter item")
	}
}

// testFenceIncreasesAcrossItemDeletion: an item deleted while free (by
// DynamoDB's TTL, or by hand) comes back with a greater fence: the new item
// starts a later epoch.
func testFenceIncreasesAcrossItemDeletion(t *testing.T, s *store) {
	d := s.open(t)
	var last uint64
	for i := range 3 {
		owner := fmt.Sprintf("owner-%d-0123456789abcdef", i)
		g := mustGrant(t, d, req("k", owner, time.Minute))
		if err := d.Release(t.Context(), "k", owner); err != nil {
			t.Fatal(err)
		}
		last = g.Fence
	}
	s.deleteItem(t, "k")
	g := mustGrant(t, d, req("k", ownerA, time.Minute))
	if g.Fence <= last {
		t.Fatalf("fence %d after the item's deletion, not greater than %d", g.Fence, last)
	}
	// A held item deleted by hand: its holder's renewal finds it gone.
	s.deleteItem(t, "k")
	if err := d.Renew(t.Context(), "k", ownerA, time.Minute); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew of a deleted item = %v, want ErrLeaseLost", err)
	}
}

// testFenceExhaustedEpochDrawsANewOne: when an item's counter reaches the
// end of its epoch, the next grant (of a free key, or a takeover) starts a
// new epoch, and fences still increase.
func testFenceExhaustedEpochDrawsANewOne(t *testing.T, s *store) {
	dynamodbdriver.SetEpochBits(t, 2) // 3 grants per epoch
	d, w := s.open(t), s.open(t)
	var last uint64
	epochs := map[uint64]bool{}
	for i := range 10 {
		owner := fmt.Sprintf("owner-%d-0123456789abcdef", i)
		g := mustGrant(t, d, req("k", owner, time.Minute))
		if g.Fence <= last {
			t.Fatalf("grant %d: fence %d not greater than %d", i, g.Fence, last)
		}
		last = g.Fence
		epochs[g.Fence>>2] = true
		if err := d.Release(t.Context(), "k", owner); err != nil {
			t.Fatal(err)
		}
	}
	if len(epochs) < 4 {
		t.Fatalf("10 grants with 3 per epoch used %d epochs, want at least 4", len(epochs))
	}
	// Exhaust the epoch, let the holder die, and take over.
	for last&3 != 3 {
		g := mustGrant(t, d, req("k", ownerC, time.Minute))
		last = g.Fence
		if err := d.Release(t.Context(), "k", ownerC); err != nil {
			t.Fatal(err)
		}
	}
	const ttl = 200 * time.Millisecond
	dead := mustGrant(t, d, req("k", ownerA, ttl))
	if dead.Fence <= last {
		t.Fatalf("fence %d not greater than %d", dead.Fence, last)
	}
	for dead.Fence&3 != 3 { // make the dead holder's grant the epoch's last
		if err := d.Release(t.Context(), "k", ownerA); err != nil {
			t.Fatal(err)
		}
		dead = mustGrant(t, d, req("k", ownerA, ttl))
	}
	var g driver.Grant
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		g, err = w.TryAcquire(t.Context(), req("k", ownerB, time.Minute))
		if err == nil {
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("takeover of an exhausted epoch: %v", err)
		}
	}
	if g.Fence <= dead.Fence || g.Fence>>2 == dead.Fence>>2 {
		t.Fatalf("takeover fence %d after %d: want greater, in a new epoch", g.Fence, dead.Fence)
	}
}

// testGCReleaseMarksFreeItemsForTTL: with GCAfter, a release writes gc_at
// (now + GCAfter, Unix seconds) and the next grant removes it; GCAfter
// below MinGCAfter is refused, by New and by URL.
func testGCReleaseMarksFreeItemsForTTL(t *testing.T, s *store) {
	const after = 2 * time.Hour
	d := s.newDriver(t, s.client(t, nil), &dynamodbdriver.Options{GCAfter: after})
	mustGrant(t, d, req("k", ownerA, time.Minute))
	if _, ok := attrN(t, s.item(t, "k"), "gc_at"); ok {
		t.Fatal("a held item has gc_at")
	}
	if err := d.Release(t.Context(), "k", ownerA); err != nil {
		t.Fatal(err)
	}
	gc, ok := attrN(t, s.item(t, "k"), "gc_at")
	if want := time.Now().Add(after).Unix(); !ok || gc < want-60 || gc > want+60 {
		t.Fatalf("gc_at = %d (present %v), want about %d", gc, ok, want)
	}
	mustGrant(t, d, req("k", ownerB, time.Minute))
	if _, ok := attrN(t, s.item(t, "k"), "gc_at"); ok {
		t.Fatal("the grant kept gc_at")
	}

	if _, err := dynamodbdriver.New(s.client(t, nil), s.table, &dynamodbdriver.Options{GCAfter: 30 * time.Minute}); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("New with GCAfter 30m = %v, want ErrInvalidArgument", err)
	}
	if _, err := dynamodbdriver.Open(t.Context(), s.url()+"&gc_after=30m"); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("Open with gc_after=30m = %v, want ErrInvalidArgument", err)
	}
	u, err := dynamodbdriver.Open(t.Context(), s.url()+"&gc_after=24h")
	if err != nil {
		t.Fatal(err)
	}
	u.Close()

	// Migrate enables the TTL on gc_at. dynalite has no UpdateTimeToLive:
	// the table is created all the same, and the error names the step.
	other, err := dynamodbdriver.New(s.client(t, nil), s.table+"_gc", &dynamodbdriver.Options{GCAfter: after})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	err = other.Migrate(t.Context())
	if err == nil || !strings.Contains(err.Error(), "TTL") {
		t.Fatalf("Migrate with GCAfter on dynalite = %v; want the TTL step's error (dynalite has no UpdateTimeToLive)", err)
	}
	mustGrant(t, other, req("k", ownerA, time.Minute))
}
