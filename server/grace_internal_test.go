package server

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// queuedOwners returns the owners queued on key, in queue order.
func queuedOwners(s *Server, key string) []string {
	s.fsm.mu.RLock()
	defer s.fsm.mu.RUnlock()
	var out []string
	if e := s.fsm.locks.get(key); e != nil {
		e.q.each(func(w *waiter) { out = append(out, w.owner) })
	}
	return out
}

// pollUntil polls cond every 5 ms until it holds or d passes.
func pollUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestServer_WaiterGraceAfterRestart: a restarted node (the new leader)
// keeps the queue entries of clients that are not connected to it for
// their grace (their TTL from its election): a waiter that reconnects
// within it keeps its place ahead of a later waiter; one that does not is
// purged after its grace, not before.
func TestServer_WaiterGraceAfterRestart(t *testing.T) {
	cfg := testConfig(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var started time.Time
	start := func() *Server {
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		started = time.Now()
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		if err := s.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := start()
	const grace = 1500 * time.Millisecond
	if _, err := s.acquire(ctx, acquireIn{key: "k", owner: "owner-holder", ttl: time.Hour}, nil, nil); err != nil {
		t.Fatal(err)
	}
	// Two waiters of the old leader: queue entries whose requests wait on
	// no node (proposed without a waiting request, as after a crash).
	for i, owner := range []string{"owner-aaaaaa", "owner-bbbbbb"} {
		r, err := s.propose(&command{op: opAcquire, key: "k", owner: owner, ttl: grace, wait: true, maxWaiters: 10, maxLeases: 10})
		if err != nil || r.code != resQueued || r.position != i+1 {
			t.Fatalf("queue %s: %+v %v", owner, r, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = start()
	defer s.Close()
	if got := queuedOwners(s, "k"); !slices.Equal(got, []string{"owner-aaaaaa", "owner-bbbbbb"}) {
		t.Fatalf("queue right after the restart: %v, want both waiters kept for their grace", got)
	}

	// a reconnects within its grace; c queues after.
	type result struct {
		out acquireOut
		err error
	}
	var wg sync.WaitGroup
	waitFor := func(owner string, pos *int, res *result) {
		wg.Add(1)
		queued := make(chan struct{})
		go func() {
			defer wg.Done()
			res.out, res.err = s.acquire(ctx, acquireIn{key: "k", owner: owner, ttl: 5 * time.Second, wait: true}, nil, func(p int) { *pos = p; close(queued) })
		}()
		select {
		case <-queued:
		case <-ctx.Done():
			t.Fatalf("%s never queued", owner)
		}
	}
	var posA, posC int
	var resA, resC result
	waitFor("owner-aaaaaa", &posA, &resA)
	waitFor("owner-cccccc", &posC, &resC)
	if posA != 1 || posC != 3 {
		t.Fatalf("re-attached a at %d (want 1), c at %d (want 3, behind b in its grace)", posA, posC)
	}

	// b is purged after its grace, not before.
	pollUntil(t, 10*time.Second, "b purged after its grace", func() bool { return !slices.Contains(queuedOwners(s, "k"), "owner-bbbbbb") })
	if since := time.Since(started); since < grace {
		t.Fatalf("b purged %v after the start, before its grace of %v", since, grace)
	}
	if got := queuedOwners(s, "k"); !slices.Equal(got, []string{"owner-aaaaaa", "owner-cccccc"}) {
		t.Fatalf("queue after the grace: %v, want a then c", got)
	}

	// FIFO: the holder's release goes to a, a's to c.
	if _, err := s.release("k", "owner-holder"); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 10*time.Second, "a granted", func() bool { v, _ := s.fsm.get("k"); return v.grant.owner == "owner-aaaaaa" })
	if _, err := s.release("k", "owner-aaaaaa"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if resA.err != nil || resC.err != nil || resA.out.fence == 0 || resC.out.fence <= resA.out.fence {
		t.Fatalf("grants: a %+v %v, c %+v %v", resA.out, resA.err, resC.out, resC.err)
	}
}
