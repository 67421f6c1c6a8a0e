package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// leaseCluster is n in-process nodes of one cluster (internal access).
type leaseCluster struct {
	tb    testing.TB
	nodes []*Server
}

// startLeaseCluster starts n nodes bootstrapped with an initial cluster of
// all of them, waits for a ready leader, and closes them when the test ends.
func startLeaseCluster(tb testing.TB, n int, edit func(c *Config)) *leaseCluster {
	tb.Helper()
	cfgs := make([]Config, n)
	var peers []Peer
	for i := range cfgs {
		cfgs[i] = testConfig(tb)
		cfgs[i].NodeID = fmt.Sprintf("n%d", i+1)
		cfgs[i].HeartbeatTimeout, cfgs[i].ElectionTimeout, cfgs[i].LeaderLeaseTimeout = 300*time.Millisecond, 300*time.Millisecond, 150*time.Millisecond
		peers = append(peers, Peer{ID: cfgs[i].NodeID, RaftAddr: cfgs[i].RaftBind})
	}
	c := &leaseCluster{tb: tb}
	for i := range cfgs {
		cfgs[i].InitialCluster = peers
		if edit != nil {
			edit(&cfgs[i])
		}
		s, err := New(cfgs[i])
		if err != nil {
			tb.Fatal(err)
		}
		if err := s.Start(); err != nil {
			tb.Fatal(err)
		}
		c.nodes = append(c.nodes, s)
	}
	tb.Cleanup(func() {
		for _, s := range c.nodes {
			_ = s.Close()
		}
	})
	c.leader(20 * time.Second)
	return c
}

// leader waits up to d for a ready node and returns it.
func (c *leaseCluster) leader(d time.Duration) *Server {
	c.tb.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, s := range c.nodes {
			if s.Ready() {
				return s
			}
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("no ready leader within %v", d)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ready returns the ready node, or nil.
func (c *leaseCluster) ready() *Server {
	for _, s := range c.nodes {
		if s.Ready() {
			return s
		}
	}
	return nil
}

// TestCluster_SuspectLeaseFreesUnderLeaderChurn is the liveness test of
// suspect leases (issue 10 item 3b): with a leadership transfer every TTL/2
// for 5 TTLs, a holder that stopped renewing loses its key to the next
// waiter within 2 TTLs of its last renewal (and not before its validity
// ended), while a live holder renewing every TTL/3 through whichever node
// leads never loses its lease. Without suspect leases every new leader
// restarts the dead holder's countdown at the full TTL, so the key never
// frees under this churn.
func TestCluster_SuspectLeaseFreesUnderLeaderChurn(t *testing.T) {
	const ttl = 2 * time.Second
	c := startLeaseCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	l := c.leader(10 * time.Second)

	// The live holder, the dead holder and its waiter (no lock-delay, so
	// the handover follows the expiry at once).
	live, err := l.acquire(ctx, acquireIn{key: "live", owner: "owner-live-0", ttl: ttl}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadSent := time.Now()
	dead, err := l.acquire(ctx, acquireIn{key: "dead", owner: "owner-dead-0", ttl: ttl, hasLockDelay: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := l.propose(&command{op: opAcquire, key: "dead", owner: "owner-waiter", ttl: 10 * time.Second, wait: true, maxWaiters: 10, maxLeases: 10}); err != nil || r.code != resQueued {
		t.Fatalf("queue the waiter: %+v %v", r, err)
	}

	// The live client: renews every TTL/3 through the ready node; its
	// validity is the send time of its last acknowledged renewal + TTL.
	var lost atomic.Value
	var renewals, viaRetry atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		valid := deadSent.Add(ttl)
		tick := time.NewTicker(ttl / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for try := 0; ; try++ {
				sent := time.Now()
				if !sent.Before(valid) {
					lost.Store(fmt.Sprintf("no renewal acknowledged before the validity ended (%v ago)", sent.Sub(valid)))
					return
				}
				var ok []bool
				err := fmt.Errorf("no ready node")
				if s := c.ready(); s != nil {
					ok, err = s.renew([]renewIn{{key: "live", owner: "owner-live-0"}})
				}
				if err == nil {
					if !ok[0] {
						lost.Store("renewal answered: lease lost")
						return
					}
					valid = sent.Add(ttl)
					renewals.Add(1)
					if try > 0 {
						viaRetry.Add(1)
					}
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}()

	// The churn: a leadership transfer every TTL/2 for 5 TTLs.
	var granted time.Time
	grantedTo := make(chan time.Time, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, s := range c.nodes {
				if v, ok := s.fsm.get("dead"); ok && v.held && v.grant.owner == "owner-waiter" {
					grantedTo <- time.Now()
					return
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	transfers := 0
	end := time.Now().Add(5 * ttl)
	for time.Now().Before(end) {
		select {
		case <-time.After(ttl / 2):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		old := c.leader(10 * time.Second)
		if err := old.transferLeadership(old.raft.LeadershipTransfer); err != nil {
			t.Logf("transfer from %s: %v", old.cfg.NodeID, err)
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if s := c.ready(); s != nil && s != old {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no new leader within 10s of a transfer")
			}
			time.Sleep(2 * time.Millisecond)
		}
		transfers++
	}
	select {
	case granted = <-grantedTo:
	default:
	}
	close(stop)
	wg.Wait()
	if v := lost.Load(); v != nil {
		t.Fatalf("the live holder lost its lease: %v", v)
	}
	if granted.IsZero() {
		t.Fatalf("the dead holder's key never reached the waiter in 5 TTLs of churn (%d transfers)", transfers)
	}
	freed := granted.Sub(deadSent)
	t.Logf("%d transfers; dead holder's key granted to the waiter %v after its last renewal (TTL %v); live holder: %d renewals, %d after a retry", transfers, freed.Round(time.Millisecond), ttl, renewals.Load(), viaRetry.Load())
	if freed < ttl {
		t.Fatalf("the dead holder's key was granted %v after its acquisition, before its TTL %v", freed, ttl)
	}
	if freed > 2*ttl {
		t.Fatalf("the dead holder's key reached the waiter %v after its last renewal, want within 2 TTLs (%v)", freed, 2*ttl)
	}
	s := c.leader(10 * time.Second)
	if err := s.readBarrier(); err != nil {
		t.Fatal(err)
	}
	if v, ok := s.fsm.get("live"); !ok || v.grant.owner != "owner-live-0" || v.grant.fence != live.fence {
		t.Fatalf("the live holder's grant after the churn: %+v (fence %d)", v.grant, live.fence)
	}
	_ = dead
}

// TestCluster_WaiterGraceAcrossLeaderChange: after a leadership transfer,
// a waiter whose request waited on the old leader keeps its place for its
// grace and gets the key in FIFO order when it re-attaches to the new
// leader; a waiter that does not re-attach is purged after its grace.
func TestCluster_WaiterGraceAcrossLeaderChange(t *testing.T) {
	c := startLeaseCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	l := c.leader(10 * time.Second)
	if _, err := l.acquire(ctx, acquireIn{key: "k", owner: "owner-holder", ttl: time.Minute}, nil, nil); err != nil {
		t.Fatal(err)
	}
	// a and b wait on the old leader.
	const grace = 2 * time.Second
	wctx, wcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, owner := range []string{"owner-aaaaaa", "owner-bbbbbb"} {
		queued := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = l.acquire(wctx, acquireIn{key: "k", owner: owner, ttl: grace, wait: true}, nil, func(int) { close(queued) })
		}()
		<-queued
	}
	if err := l.transferLeadership(l.raft.LeadershipTransfer); err != nil {
		t.Fatal(err)
	}
	var nl *Server
	pollUntil(t, 10*time.Second, "a new ready leader", func() bool { nl = c.ready(); return nl != nil && nl != l })
	changed := time.Now()
	// The old leader's requests end (their cancels fail: not the leader).
	wcancel()
	wg.Wait()
	if got := queuedOwners(nl, "k"); len(got) != 2 || got[0] != "owner-aaaaaa" || got[1] != "owner-bbbbbb" {
		t.Fatalf("queue on the new leader: %v, want a and b kept for their grace", got)
	}
	// a re-attaches to the new leader; c queues behind b.
	type res struct {
		pos int
		out acquireOut
		err error
	}
	results := map[string]*res{}
	for _, owner := range []string{"owner-aaaaaa", "owner-cccccc"} {
		r := &res{}
		results[owner] = r
		queued := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.out, r.err = nl.acquire(ctx, acquireIn{key: "k", owner: owner, ttl: 10 * time.Second, wait: true}, nil, func(p int) { r.pos = p; close(queued) })
		}()
		select {
		case <-queued:
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	if results["owner-aaaaaa"].pos != 1 || results["owner-cccccc"].pos != 3 {
		t.Fatalf("positions: a %d (want 1), c %d (want 3)", results["owner-aaaaaa"].pos, results["owner-cccccc"].pos)
	}
	pollUntil(t, 10*time.Second, "b purged after its grace", func() bool {
		got := queuedOwners(nl, "k")
		return len(got) == 2 && got[0] == "owner-aaaaaa" && got[1] == "owner-cccccc"
	})
	if since := time.Since(changed); since < grace-500*time.Millisecond {
		t.Fatalf("b purged %v after the leader change, before its grace %v", since, grace)
	}
	if _, err := nl.release("k", "owner-holder"); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 10*time.Second, "a granted", func() bool { v, _ := nl.fsm.get("k"); return v.grant.owner == "owner-aaaaaa" })
	if _, err := nl.release("k", "owner-aaaaaa"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	a, cc := results["owner-aaaaaa"], results["owner-cccccc"]
	if a.err != nil || cc.err != nil || cc.out.fence <= a.out.fence {
		t.Fatalf("grants: a %+v %v; c %+v %v", a.out, a.err, cc.out, cc.err)
	}
}

// benchRenewals runs b.N renewals from 64 goroutines, each renewing its own
// lease on s, and reports renewals/s and leadership checks per renewal.
func benchRenewals(b *testing.B, s *Server) {
	const workers = 64
	ctx := context.Background()
	for w := range workers {
		if _, err := s.acquire(ctx, acquireIn{key: fmt.Sprint("bench/renew/", w), owner: fmt.Sprintf("owner-%d-0123456789", w), ttl: time.Hour}, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	rounds0 := s.readIndex.rounds.Load()
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := []renewIn{{key: fmt.Sprint("bench/renew/", w), owner: fmt.Sprintf("owner-%d-0123456789", w)}}
			for next.Add(1) <= int64(b.N) {
				ok, err := s.renew(in)
				if err != nil || !ok[0] {
					b.Errorf("renew: %v %v", ok, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "renewals/s")
	if !soloLeaderCheck {
		b.ReportMetric(float64(s.readIndex.rounds.Load()-rounds0)/float64(b.N), "checks/renewal")
	}
}

// BenchmarkRenew64 measures 64 concurrent in-memory renewals, with the
// leadership check shared (read index) or one VerifyLeader per call (solo,
// as before), on one node and on a 3-node in-process cluster.
func BenchmarkRenew64(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		for _, mode := range []string{"shared", "solo"} {
			b.Run(fmt.Sprintf("nodes=%d/%s", nodes, mode), func(b *testing.B) {
				soloLeaderCheck = mode == "solo"
				defer func() { soloLeaderCheck = false }()
				var s *Server
				if nodes == 1 {
					cfg := testConfig(b)
					cfg.NoSync = true
					var err error
					if s, err = New(cfg); err != nil {
						b.Fatal(err)
					}
					if err := s.Start(); err != nil {
						b.Fatal(err)
					}
					defer s.Close()
					if err := s.WaitReady(context.Background()); err != nil {
						b.Fatal(err)
					}
				} else {
					s = startLeaseCluster(b, nodes, func(c *Config) { c.NoSync = true }).leader(20 * time.Second)
				}
				benchRenewals(b, s)
			})
		}
	}
}
