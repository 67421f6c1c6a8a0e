package redisdriver

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestForceReleaser_RemovesGrantWhoeverHoldsIt: ForceRelease removes the
// grant without its owner token and reports it; the owner's renewal and
// release then find it gone, the next grant gets a greater fence, and a
// free key answers ErrNotAcquired.
func TestForceReleaser_RemovesGrantWhoeverHoldsIt(t *testing.T) {
	r := testservers.StartRedis(t)
	d := openDriver(t, r.URL())
	ctx := t.Context()
	if _, err := d.ForceRelease(ctx, "force/k", "nothing to remove"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("ForceRelease of a free key = %v, want ErrNotAcquired", err)
	}
	fence := acquire(t, d, "force/k", "owner-a", time.Hour)
	info, err := d.ForceRelease(ctx, "force/k", "holder pod evicted")
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "force/k" || info.Fence != fence || info.Holder != "holder of owner-a" || info.TTL != time.Hour {
		t.Fatalf("ForceRelease = %+v, want the grant with fence %d", info, fence)
	}
	if err := d.Renew(ctx, "force/k", "owner-a", time.Hour); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after ForceRelease = %v, want ErrLeaseLost", err)
	}
	if err := d.Release(ctx, "force/k", "owner-a"); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Release after ForceRelease = %v, want ErrLeaseLost", err)
	}
	if next := acquire(t, d, "force/k", "owner-b", time.Hour); next <= fence {
		t.Fatalf("fence after ForceRelease %d, want > %d", next, fence)
	}
	if _, err := d.ForceRelease(ctx, "force/free", "x"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("ForceRelease of another free key = %v, want ErrNotAcquired", err)
	}
}

// TestForceReleaser_HandsKeyToQueuedWaiter: a force release hands the key
// to the first waiter queued on it, in the same script, as the holder's own
// release would: right after ForceRelease returns the key is held by that
// waiter with a greater fence (it does not lie free until the waiter's next
// poll, where a newcomer could take it), and the waiter's Wait returns that
// grant.
func TestForceReleaser_HandsKeyToQueuedWaiter(t *testing.T) {
	r := testservers.StartRedis(t)
	ctx := t.Context()
	const key = "force/{queued}"
	holder := openDriver(t, r.URL())
	fence := acquire(t, holder, key, "owner-holder", time.Hour)
	waiter := openDriver(t, r.URL())
	type result struct {
		g   driver.Grant
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := waiter.Wait(ctx, driver.AcquireRequest{Key: key, Owner: "owner-waiter", TTL: time.Hour, Holder: "the waiter"})
		done <- result{g, err}
	}()
	waitQueued(t, holder, key, 1)

	admin := openDriver(t, r.URL())
	if _, err := admin.ForceRelease(ctx, key, "test: holder presumed dead"); err != nil {
		t.Fatal(err)
	}
	info, err := admin.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect right after the force release = %v, want the waiter's grant", err)
	}
	if info.Holder != "the waiter" || info.Fence <= fence || info.Waiters != 0 {
		t.Fatalf("Inspect right after the force release = %+v; want held by the waiter with a fence > %d and an empty queue", info, fence)
	}
	select {
	case res := <-done:
		if res.err != nil || res.g.Fence != info.Fence {
			t.Fatalf("the waiter's Wait = %+v, %v; want the handed-off grant (fence %d)", res.g, res.err, info.Fence)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter's Wait did not return 5s after the hand-off")
	}
	if err := holder.Release(ctx, key, "owner-holder"); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("the old holder's Release = %v, want ErrLeaseLost", err)
	}
	if err := waiter.Release(ctx, key, "owner-waiter"); err != nil {
		t.Fatalf("the waiter's Release = %v", err)
	}
}
