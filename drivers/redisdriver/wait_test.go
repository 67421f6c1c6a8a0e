package redisdriver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestHub_HandOffWakesOnlyItsWaiter: a hand-off message ("grant:" and an
// owner token) wakes only the waiter with that token; a plain release hint
// wakes every waiter, and every message wakes a subscriber with no owner
// (Hint, rechecks).
func TestHub_HandOffWakesOnlyItsWaiter(t *testing.T) {
	r := testservers.StartRedis(t)
	d := openDriver(t, r.URL())
	c := newClient(t, r)
	ctx := t.Context()
	const key = "hub/handoff"
	_, _, channel := d.keys(key)
	subs := map[string]<-chan struct{}{}
	for _, owner := range []string{"owner-a-0000", "owner-b-0000", ""} {
		ch, stop, err := d.hub.subscribeFor(ctx, channel, owner)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		subs[owner] = ch
	}
	woken := func(msg string) map[string]bool {
		t.Helper()
		if err := c.Publish(ctx, channel, msg).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // let the dispatcher deliver
		got := map[string]bool{}
		for owner, ch := range subs {
			select {
			case <-ch:
				got[owner] = true
			default:
			}
		}
		return got
	}
	if got := woken(grantPrefix + "owner-a-0000"); !got["owner-a-0000"] || got["owner-b-0000"] || !got[""] {
		t.Errorf("hand-off to a woke %v; want a and the owner-less subscriber only", got)
	}
	if got := woken("released"); len(got) != 3 {
		t.Errorf("a plain release hint woke %v; want all three", got)
	}
}

// TestWait_HandOffInQueueOrder: waiters that queued one after another on a
// held key are granted it in that order, each by the release before it,
// with a fence greater than the one before; the queue is empty after.
func TestWait_HandOffInQueueOrder(t *testing.T) {
	r := testservers.StartRedis(t)
	ctx := t.Context()
	const key = "wait/{order} 🔔"
	holder := openDriver(t, r.URL())
	fence := acquire(t, holder, key, "owner-holder", 30*time.Second)
	const n = 4
	type result struct {
		i     int
		fence uint64
		err   error
	}
	results := make(chan result, n)
	var owners []string
	for i := range n {
		d := openDriver(t, r.URL())
		owner := fmt.Sprintf("owner-waiter-%d", i)
		owners = append(owners, owner)
		go func() {
			g, err := d.Wait(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: 30 * time.Second})
			results <- result{i, g.Fence, err}
		}()
		waitQueued(t, holder, key, i+1)
	}
	last := fence
	current := "owner-holder"
	for want := range n {
		if err := holder.Release(ctx, key, current); err != nil {
			t.Fatalf("release by %s: %v", current, err)
		}
		var res result
		select {
		case res = <-results:
		case <-time.After(5 * time.Second):
			t.Fatalf("no waiter granted within 5s of release %d", want)
		}
		if res.err != nil || res.i != want || res.fence <= last {
			t.Fatalf("grant %d went to waiter %d (fence %d, err %v); want waiter %d, fence > %d", want, res.i, res.fence, res.err, want, last)
		}
		last, current = res.fence, owners[res.i]
	}
	if err := holder.Release(ctx, key, current); err != nil {
		t.Fatal(err)
	}
	keys, _ := holder.lockKeys(key)
	c := newClient(t, r)
	if n, err := c.HLen(ctx, keys[4]).Result(); err != nil || n != 0 {
		t.Fatalf("waiters' hash has %d entries (err %v) after every waiter was served", n, err)
	}
}

// TestWait_DeadWaiterHoldsKeyAtMostTheClaimWindow: a release hands the key
// to a queued waiter that has gone (crashed: its entry is there, nobody
// claims); the grant expires after the claim window, not the waiter's TTL,
// and the next waiter gets the key.
func TestWait_DeadWaiterHoldsKeyAtMostTheClaimWindow(t *testing.T) {
	r := testservers.StartRedis(t)
	ctx := t.Context()
	const key = "wait/dead"
	d := openDriver(t, r.URL())
	acquire(t, d, key, "owner-holder", 30*time.Second)
	// The crashed waiter: queued by the wait script itself, then never
	// heard of again (its TTL, 30 s, is what a hand-off would grant).
	keys, _ := d.lockKeys(key)
	if n, err := waitScript.Run(ctx, d.client, keys, "owner-dead", (30 * time.Second).Milliseconds(), "", waiterLiveness.Milliseconds(), "nobody-listens").Int64(); err != nil || n != 0 {
		t.Fatalf("queueing the dead waiter = %d, %v; want 0 (queued)", n, err)
	}
	live := dlock.New(openDriver(t, r.URL()))
	defer live.Close()
	type result struct {
		ls  *dlock.Lease
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		ls, err := live.Acquire(ctx, key)
		got <- result{ls, err, time.Now()}
	}()
	waitQueued(t, d, key, 2)
	began := time.Now()
	if err := d.Release(ctx, key, "owner-holder"); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if res.err != nil {
		t.Fatal(res.err)
	}
	defer res.ls.Release(ctx)
	took := res.at.Sub(began)
	if took < handoffClaim/2 || took > handoffClaim+2*time.Second {
		t.Fatalf("the live waiter got the key %v after the hand-off to the dead one; want about the claim window %v", took, handoffClaim)
	}
}

// TestWait_LostWakeUpFallsBackToPolling: a release that publishes nothing
// (a releaser with hints off; as a message lost on the way) still hands
// the key over: the waiter's fallback poll claims it within the claim
// window, with the hand-off's fence.
func TestWait_LostWakeUpFallsBackToPolling(t *testing.T) {
	r := testservers.StartRedis(t)
	ctx := t.Context()
	const key = "wait/lost"
	quiet := openDriver(t, r.URL()+"?hints=false")
	fence := acquire(t, quiet, key, "owner-holder", 30*time.Second)
	w := openDriver(t, r.URL())
	done := make(chan error, 1)
	var g driver.Grant
	go func() {
		var err error
		g, err = w.Wait(ctx, driver.AcquireRequest{Key: key, Owner: "owner-waiter", TTL: 30 * time.Second})
		done <- err
	}()
	waitQueued(t, quiet, key, 1)
	time.Sleep(2 * waitPollMax) // the waiter's polls have backed off
	if err := quiet.Release(ctx, key, "owner-holder"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(handoffClaim + 2*time.Second):
		t.Fatal("the waiter was not granted the key after a silent release")
	}
	info, err := quiet.Inspect(ctx, key)
	if err != nil || info.Fence != g.Fence || g.Fence <= fence || info.Remaining < 20*time.Second {
		t.Fatalf("after the claim: Inspect %+v, %v; grant fence %d (holder's %d); want the waiter's grant with its full TTL", info, err, g.Fence, fence)
	}
}

// TestWait_CanceledWaiterLeavesNothing: a waiter whose context ends
// returns an error matching it and removes its queue entry; a later release
// then frees the key instead of handing it to the waiter that left.
func TestWait_CanceledWaiterLeavesNothing(t *testing.T) {
	r := testservers.StartRedis(t)
	const key = "wait/canceled"
	d := openDriver(t, r.URL())
	acquire(t, d, key, "owner-holder", 30*time.Second)
	wctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := openDriver(t, r.URL()).Wait(wctx, driver.AcquireRequest{Key: key, Owner: "owner-gone", TTL: 30 * time.Second})
		done <- err
	}()
	waitQueued(t, d, key, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel = %v, want context.Canceled", err)
	}
	if info, err := d.Inspect(t.Context(), key); err != nil || info.Waiters != 0 {
		t.Fatalf("Inspect after the waiter left = %+v, %v; want no waiter", info, err)
	}
	if err := d.Release(t.Context(), key, "owner-holder"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Inspect(t.Context(), key); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect after the release = %v; want the key free", err)
	}
}

// waitQueued waits until n waiters are queued on key.
func waitQueued(t *testing.T, d *Driver, key string, n int) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		info, err := d.Inspect(t.Context(), key)
		if err == nil && info.Waiters == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d waiters queued on %q after 5s (err %v), want %d", info.Waiters, key, err, n)
		}
	}
}

// TestWait_HandOffHintsReaders: a release that hands the key to a queued
// waiter still sends a release hint on the key's channel, so a reader that
// holds nothing (Hint, as election observers use it) learns that the
// holder changed.
func TestWait_HandOffHintsReaders(t *testing.T) {
	r := testservers.StartRedis(t)
	ctx := t.Context()
	const key = "wait/hint-readers"
	d := openDriver(t, r.URL())
	acquire(t, d, key, "owner-holder", 30*time.Second)
	reader := openDriver(t, r.URL())
	hints, stop, err := reader.Hint(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	done := make(chan error, 1)
	go func() {
		_, err := openDriver(t, r.URL()).Wait(ctx, driver.AcquireRequest{Key: key, Owner: "owner-waiter", TTL: 30 * time.Second})
		done <- err
	}()
	waitQueued(t, d, key, 1)
	if err := d.Release(ctx, key, "owner-holder"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case <-hints:
	case <-time.After(time.Second):
		t.Fatal("the reader got no hint within 1s of a hand-off")
	}
}

// TestHub_ResubscribeWakesSubscribers: when the pub/sub connection drops,
// go-redis reconnects and subscribes again, but what was published in the
// gap reached no one (a force release's hint to its holder, a hand-off to a
// waiter). The hub wakes every subscriber of a channel when Redis confirms
// it again, so rechecks renew and waiters poll at once instead of at their
// next renewal or poll.
func TestHub_ResubscribeWakesSubscribers(t *testing.T) {
	r := testservers.StartRedis(t)
	d := openDriver(t, r.URL())
	c := newClient(t, r)
	ctx := t.Context()
	const key = "hub/resubscribe"
	_, _, channel := d.keys(key)
	ch, stop, err := d.hub.subscribe(ctx, channel)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	select {
	case <-ch:
		t.Fatal("woken before anything happened")
	case <-time.After(100 * time.Millisecond):
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("not woken within 10 s of the pub/sub connection's resubscription")
	}
	// Subscribed again: a publish still arrives.
	awaitSubscribers(t, r, d, key, 1)
	if err := c.Publish(ctx, channel, "released").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("a hint published after the resubscription did not arrive")
	}
}
