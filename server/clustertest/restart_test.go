package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server/servertest"
)

// knowsLeader polls node i's cluster status until it names a leader (a
// restarted node has rejoined), for up to d.
func (w *world) knowsLeader(i int, d time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := w.c.Status(ctx, i)
		cancel()
		if err == nil && st.LeaderID != "" {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	w.t.Fatalf("%s names no leader %v after its restart (last error %v)", w.c.Node(i).ID, d, last)
}

// snapshots returns the completed snapshots in node i's data dir: their
// meta.json files. A snapshot being written is a directory named *.tmp
// that holds a meta.json too (hashicorp/raft's file store writes it
// first), and a node killed then restarts without it.
func snapshots(c *servertest.Cluster, i int) []string {
	m, _ := filepath.Glob(filepath.Join(c.Node(i).DataDir, "snapshots", "*", "meta.json"))
	var done []string
	for _, p := range m {
		if !strings.HasSuffix(filepath.Dir(p), ".tmp") {
			done = append(done, p)
		}
	}
	return done
}

// logSince returns node i's log after the last line containing marker.
func logSince(c *servertest.Cluster, i int, marker string) string {
	b, _ := os.ReadFile(c.Node(i).LogPath)
	s := string(b)
	if k := strings.LastIndex(s, marker); k >= 0 {
		return s[k:]
	}
	return s
}

// TestFollowerRestartFromSnapshot kills a follower that has taken a
// snapshot (--snapshot-threshold 64), keeps the cluster busy while it is
// down, and restarts it: it restores its snapshot, catches up, can make a
// quorum with the leader alone, and, made leader, holds exactly the grants
// the clients hold. No live holder loses its lease.
func TestFollowerRestartFromSnapshot(t *testing.T) {
	w := newWorld(t, 3, servertest.ClusterOptions{SnapshotThreshold: 64, SnapshotInterval: 100 * time.Millisecond})
	c := w.c
	l := w.leader(20 * time.Second)
	f, g := (l+1)%3, (l+2)%3
	// A TTL of 5s: the holders renew every 1.7s, through the follower's
	// absence and the leadership transfer.
	const ttl = 5 * time.Second
	h := w.hold(16, "snap-hold", "", ttl)
	ch := w.churn(4, 8, "snap-churn", "", 5*time.Second)

	deadline := time.Now().Add(20 * time.Second)
	for len(snapshots(c, f)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("follower %s took no snapshot within 20s (%d grants so far)", c.Node(f).ID, ch.grants.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := c.Kill(f); err != nil {
		t.Fatal(err)
	}
	before := ch.grants.Load()
	for ch.grants.Load() < before+150 {
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatalf("only %d grants while %s was down", ch.grants.Load()-before, c.Node(f).ID)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d grants while follower %s was down", ch.grants.Load()-before, c.Node(f).ID)
	if err := c.Restart(f); err != nil {
		t.Fatal(err)
	}
	w.knowsLeader(f, 15*time.Second)
	if log := logSince(c, f, "=== servertest: start"); !strings.Contains(log, "restored from snapshot") {
		t.Errorf("restarted %s did not restore a snapshot; its log:\n%s", c.Node(f).ID, log)
	}

	// The restarted follower alone with the leader makes a quorum.
	if err := c.Kill(g); err != nil {
		t.Fatal(err)
	}
	probe, _ := w.client("")
	ls, err := probe.Acquire(w.ctx(15*time.Second), "snap-after")
	if err != nil {
		t.Fatalf("no grant with the leader and the restarted follower only: %v", err)
	}
	_ = ls.Release(context.Background())
	if err := c.Restart(g); err != nil {
		t.Fatal(err)
	}
	ch.halt()
	t.Logf("churn: %d grants, %d errors", ch.grants.Load(), ch.errs.Load())

	// Made leader, the restarted follower holds exactly the clients' grants.
	tctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		cur, err := c.Leader(tctx)
		if err == nil && cur == f {
			break
		}
		if err := c.TransferLeader(tctx, f); err != nil {
			t.Logf("transfer to %s: %v", c.Node(f).ID, err)
		}
		if tctx.Err() != nil {
			t.Fatalf("leadership did not move to %s", c.Node(f).ID)
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.leader(10 * time.Second)
	time.Sleep(ttl) // renewals at the new leader
	for i, ls := range h.leases {
		hi, err := probe.Inspect(w.ctx(5*time.Second), fmt.Sprintf("snap-hold-%d", i))
		if err != nil || hi.Fence != ls.Fence() {
			t.Errorf("snap-hold-%d on the restarted node: %+v, %v; the client holds fence %d", i, hi, err, ls.Fence())
		}
	}
	if n, why := h.losses(); n > 0 {
		t.Errorf("%d live holders lost their lease:\n%s", n, why)
	}
	h.release()
	w.check()
}

// TestRollingRestart restarts the three nodes one after the other
// (SIGTERM, then start on the same data; the leader last) while 16 clients
// hold leases (TTL 5s, renewed every 1.7s) and 4 clients acquire and
// release: no live client loses its lease, the churn goes on after every
// step, and the history is clean.
func TestRollingRestart(t *testing.T) {
	w := newWorld(t, 3, servertest.ClusterOptions{})
	c := w.c
	l := w.leader(20 * time.Second)
	// A TTL of 5s: holders renew every 1.7s, at least once per step.
	const ttl = 5 * time.Second
	h := w.hold(16, "roll-hold", "", ttl)
	ch := w.churn(4, 8, "roll-churn", "", 5*time.Second)
	order := append(others(3, l), l)
	for _, i := range order {
		start := time.Now()
		if err := c.Stop(i); err != nil {
			t.Errorf("stop %s: %v", c.Node(i).ID, err)
		}
		if err := c.Restart(i); err != nil {
			t.Fatal(err)
		}
		w.knowsLeader(i, 15*time.Second)
		w.leader(15 * time.Second)
		before := ch.grants.Load()
		deadline := time.Now().Add(10 * time.Second)
		for ch.grants.Load() < before+20 {
			if time.Now().After(deadline) {
				t.Fatalf("churn stalled after restarting %s", c.Node(i).ID)
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(ttl / 2) // a renewal or two before the next step
		t.Logf("restarted %s in %v", c.Node(i).ID, time.Since(start).Round(time.Millisecond))
	}
	ch.halt()
	t.Logf("churn: %d grants, %d errors", ch.grants.Load(), ch.errs.Load())
	if n, why := h.losses(); n > 0 {
		t.Errorf("%d of 16 live holders lost their lease in the rolling restart:\n%s", n, why)
	}
	h.release()
	w.check()
}
