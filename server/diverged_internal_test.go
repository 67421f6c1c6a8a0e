package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCluster_MemberThatCannotDecodeAnEntryStopsServing: a member whose FSM
// meets a committed entry it cannot decode (here a follower that reads the
// log as a dlockd from before batched entries, in a cluster told to batch)
// used to skip it silently, its table then lacking grants and releases
// every other member applied: after a failover it could grant a key twice.
// Now it fails closed: Failed reports ErrUndecodableEntry, it never becomes
// ready (not even when it wins an election), and its calls are answered
// UNAVAILABLE (DIVERGED). The other two members keep serving.
func TestCluster_MemberThatCannotDecodeAnEntryStopsServing(t *testing.T) {
	c := startLeaseCluster(t, 3, func(cfg *Config) { cfg.Batching = BatchAlways })
	leader := c.leader(20 * time.Second)
	var old *Server
	for _, s := range c.nodes {
		if s != leader {
			old = s
			break
		}
	}
	old.fsm.beforeBatches.Store(true)

	// Concurrent acquisitions on the leader, so that some share an entry.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				key, owner := fmt.Sprintf("div/%d/%d", w, i), fmt.Sprintf("owner-%d-%d-00000000", w, i)
				if _, err := leader.acquire(ctx, acquireIn{key: key, owner: owner, ttl: time.Minute}, nil, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("acquire on the leader: %v", err)
	}

	select {
	case err := <-old.Failed():
		if !errors.Is(err, ErrUndecodableEntry) {
			t.Fatalf("Failed of the member that cannot decode batches = %v, want ErrUndecodableEntry", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the member that cannot decode batch entries did not report it within 10 s (was anything batched?)")
	}
	if old.Ready() {
		t.Fatal("the diverged member says it is ready")
	}
	_, err := old.acquire(ctx, acquireIn{key: "div/probe", owner: "owner-probe-00000000", ttl: time.Minute}, nil, nil)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("acquire on the diverged member = %v, want UNAVAILABLE (DIVERGED)", err)
	}
	if r, _ := statusReason(err); r != ReasonDiverged {
		t.Fatalf("acquire on the diverged member: reason %q (%v), want %s", r, err, ReasonDiverged)
	}
	// It never takes up leadership.
	if err := old.becomeLeader(); !errors.Is(err, ErrUndecodableEntry) {
		t.Fatalf("becomeLeader on the diverged member = %v, want ErrUndecodableEntry", err)
	}
	// The others still serve.
	if _, err := leader.acquire(ctx, acquireIn{key: "div/after", owner: "owner-after-00000000", ttl: time.Minute}, nil, nil); err != nil {
		t.Fatalf("acquire on the leader after a member diverged: %v", err)
	}
}

// TestServer_DivergedLeaderNeverBecomesReady: a node whose FSM skips an
// entry while it takes up leadership (the barrier applies what it had not
// applied yet) does not end up ready: becomeLeader checks again after the
// barrier and the no-op, so the node does not expire, purge or serve from
// its table.
func TestServer_DivergedLeaderNeverBecomesReady(t *testing.T) {
	s := startTestServer(t, testConfig(t))
	old := becomeLeaderHook
	// The hook runs after becomeLeader's first check: an entry that fails
	// to decode now is one the barrier applies.
	becomeLeaderHook = func() error { s.undecodable(7, errCorrupt); return nil }
	defer func() { becomeLeaderHook = old }()
	if err := s.becomeLeader(); !errors.Is(err, ErrUndecodableEntry) {
		t.Fatalf("becomeLeader with an entry that did not decode during it = %v, want ErrUndecodableEntry", err)
	}
	if s.Ready() {
		t.Fatal("the diverged leader is ready")
	}
	select {
	case err := <-s.Failed():
		if !errors.Is(err, ErrUndecodableEntry) {
			t.Fatalf("Failed = %v, want ErrUndecodableEntry", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Failed did not report the divergence")
	}
	_, err := s.acquire(t.Context(), acquireIn{key: "k", owner: "owner-probe-00000000", ttl: time.Minute}, nil, nil)
	if r, _ := statusReason(err); r != ReasonDiverged {
		t.Fatalf("acquire on the diverged leader = %v, want reason %s", err, ReasonDiverged)
	}
}
