package clustertest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestKillLeader_HoldersAndWaiters kills the leader with SIGKILL while 64
// clients hold and renew leases (TTL 10s) and 8 clients wait, in order, on
// one held key:
//
//   - no live client loses its lease;
//   - the first grant of a free key by the new leader comes within 3s of
//     the kill;
//   - after the key's holder releases it, the waiters are granted in their
//     queue order (each waiter reconnects to the new leader within its
//     grace and keeps its place);
//   - historytest.Check finds no violation.
func TestKillLeader_HoldersAndWaiters(t *testing.T) {
	w := newWorld(t, 3, servertest.ClusterOptions{})
	c := w.c
	old := w.leader(20 * time.Second)
	const ttl = 10 * time.Second
	h := w.hold(64, "kill-hold", "", ttl)

	// One key held, 8 waiters queued on it in order.
	owner, _ := w.client("", dlock.WithTTL(ttl))
	insp, _ := w.client("")
	head, err := owner.Acquire(w.ctx(10*time.Second), "kill-queue")
	if err != nil {
		t.Fatal(err)
	}
	const nWaiters = 8
	type grant struct {
		i   int
		at  time.Time
		err error
	}
	grants := make(chan grant, nWaiters)
	next := make([]chan struct{}, nWaiters)
	waitCtx, cancelWaits := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelWaits()
	var waiters sync.WaitGroup
	for i := 0; i < nWaiters; i++ {
		l, _ := w.client("", dlock.WithTTL(ttl))
		next[i] = make(chan struct{})
		waiters.Add(1)
		go func() {
			defer waiters.Done()
			ls, err := l.Acquire(waitCtx, "kill-queue")
			grants <- grant{i: i, at: time.Now(), err: err}
			if err != nil {
				return
			}
			select {
			case <-next[i]:
			case <-waitCtx.Done():
			}
			_ = ls.Release(context.Background())
		}()
		// The next waiter queues only once this one is in the queue.
		deadline := time.Now().Add(10 * time.Second)
		for {
			hi, err := insp.Inspect(w.ctx(5*time.Second), "kill-queue")
			if err == nil && hi.Waiters >= i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d not queued within 10s: %+v %v", i, hi, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Kill the leader; a prober asks for fresh keys until one is granted.
	prober, _ := w.client("", dlock.WithTTL(ttl), dlock.WithOpTimeout(500*time.Millisecond))
	w.ensureLeader(old)
	killedAt := time.Now()
	if err := c.Kill(old); err != nil {
		t.Fatal(err)
	}
	var firstGrant time.Duration
	for k := 0; ; k++ {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		ls, err := prober.TryAcquire(ctx, fmt.Sprintf("kill-fresh-%d", k))
		cancel()
		if err == nil {
			firstGrant = time.Since(killedAt)
			_ = ls.Release(context.Background())
			break
		}
		if time.Since(killedAt) > 15*time.Second {
			t.Fatalf("no grant within 15s of the kill: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	newL := w.leader(10*time.Second, old)
	t.Logf("killed %s; %s leads; first grant of a free key %v after the kill", c.Node(old).ID, c.Node(newL).ID, firstGrant.Round(time.Millisecond))
	if firstGrant > 3*time.Second {
		t.Errorf("first grant %v after the kill, want within 3s", firstGrant)
	}

	// Ride through: the holders renew at the new leader for a while
	// (past a heartbeat of TTL/3 and more).
	time.Sleep(5 * time.Second)
	if n, why := h.losses(); n > 0 {
		t.Errorf("%d of 64 live holders lost their lease across the leader's kill:\n%s", n, why)
	}

	// Hand the queue on: the holder releases, each waiter releases when
	// granted.
	if err := head.Release(w.ctx(5 * time.Second)); err != nil {
		t.Errorf("release of the queue's head: %v", err)
	}
	var order []int
	for range nWaiters {
		select {
		case g := <-grants:
			if g.err != nil {
				t.Errorf("waiter %d: %v", g.i, g.err)
				continue
			}
			order = append(order, g.i)
			close(next[g.i])
		case <-time.After(30 * time.Second):
			t.Fatalf("waiters granted so far %v; the others got nothing within 30s", order)
		}
	}
	cancelWaits()
	waiters.Wait()
	t.Logf("waiters granted in order %v", order)
	if !slices.IsSorted(order) {
		t.Errorf("waiters were granted in order %v, not their queue order (a waiter that reconnects within its grace keeps its place)", order)
	}
	h.release()
	w.check()
}
