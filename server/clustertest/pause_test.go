package clustertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestPausedOldLeader stops the leader with SIGSTOP past the election
// timeout while a holder's renewals and fresh grant requests queue up on
// its sockets (sent straight to it, marked as forwarded so that it answers
// them itself), lets the majority elect, and continues it with SIGCONT
// before the majority hands the holder's key on. The old leader must
// acknowledge nothing it cannot commit:
//
//   - no queued renewal is acknowledged (one would extend the holder's
//     validity past the majority's grant: historytest.Check reports it);
//   - every grant it acknowledges is in the cluster's state afterwards
//     (Inspect on the leader shows that fence).
func TestPausedOldLeader(t *testing.T) {
	w := newWorld(t, 3, servertest.ClusterOptions{})
	c := w.c
	old := w.leader(20 * time.Second)
	const ttl = 2 * time.Second
	probe := w.raw(old)
	owner := "paused-holder-1"
	fence, err := probe.acquire(w.ctx(5*time.Second), "paused", owner, ttl)
	if err != nil {
		t.Fatal(err)
	}

	w.ensureLeader(old)
	pausedAt := time.Now()
	if err := c.Pause(old); err != nil {
		t.Fatal(err)
	}
	// Queue renewals and fresh grants on the paused leader.
	type grant struct {
		key, owner string
		fence      uint64
	}
	var (
		mu     sync.Mutex
		grants []grant
		renews int
		wg     sync.WaitGroup
	)
	queueCtx, stopQueue := context.WithCancel(context.Background())
	defer stopQueue()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := 0; queueCtx.Err() == nil; k++ {
			wg.Add(2)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
				defer cancel()
				if ok, _ := probe.renew(ctx, "paused", owner, ttl); ok {
					mu.Lock()
					renews++
					mu.Unlock()
				}
			}()
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
				defer cancel()
				key, o := fmt.Sprintf("paused-fresh-%d", k), fmt.Sprintf("fresh-owner-%d", k)
				if f, err := probe.acquire(ctx, key, o, 30*time.Second); err == nil {
					mu.Lock()
					grants = append(grants, grant{key, o, f})
					mu.Unlock()
				}
			}()
			select {
			case <-queueCtx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	newL := w.leader(10*time.Second, old)
	electedAfter := time.Since(pausedAt)
	// The majority's client waits for the holder's key: the new leader
	// expires the holder's grant a full TTL after its election.
	b, _ := w.client(c.URL(others(3, old)...), dlock.WithTTL(ttl))
	type result struct {
		ls  *dlock.Lease
		err error
	}
	bres := make(chan result, 1)
	go func() {
		ls, err := b.Acquire(w.ctx(15*time.Second), "paused")
		bres <- result{ls, err}
	}()
	if d := 1500*time.Millisecond - time.Since(pausedAt); d > 0 {
		time.Sleep(d)
	}
	if err := c.Resume(old); err != nil {
		t.Fatal(err)
	}
	t.Logf("paused %s; %s elected within %v; resumed after %v", c.Node(old).ID, c.Node(newL).ID,
		electedAfter.Round(time.Millisecond), time.Since(pausedAt).Round(time.Millisecond))
	// Keep asking the resumed old leader for a second.
	time.Sleep(time.Second)
	stopQueue()
	wg.Wait()

	r := <-bres
	if r.err != nil {
		t.Fatalf("majority acquire of the paused holder's key: %v", r.err)
	}
	if r.ls.Fence() <= fence {
		t.Errorf("majority granted fence %d, not greater than the paused holder's %d", r.ls.Fence(), fence)
	}
	_ = r.ls.Release(context.Background())

	mu.Lock()
	defer mu.Unlock()
	t.Logf("the old leader acknowledged %d queued renewals and %d fresh grants", renews, len(grants))
	if renews > 0 {
		t.Errorf("the paused old leader acknowledged %d renewals it had queued while a new leader was elected", renews)
	}
	// Every acknowledged grant is committed: the cluster shows it.
	insp, _ := w.client("")
	for _, g := range grants {
		hi, err := insp.Inspect(w.ctx(5*time.Second), g.key)
		if err != nil || hi.Fence != g.fence {
			t.Errorf("grant of %s (fence %d) acknowledged by the resumed old leader is not in the cluster: %+v, %v", g.key, g.fence, hi, err)
		}
	}
	w.check()
}
