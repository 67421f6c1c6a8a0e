package clustertest

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestMembership_GrowRemoveTransfer grows a cluster from 1 voter to 5 (one
// --join at a time, each waiting for the configuration to commit) while 8
// clients hold leases (TTL 5s) and 4 acquire and release, on a URL naming
// all five slots; then removes a voter and transfers leadership. No live
// client loses its lease, the churn goes on, and the history is clean.
func TestMembership_GrowRemoveTransfer(t *testing.T) {
	w := newWorld(t, 1, servertest.ClusterOptions{Spares: 4})
	c := w.c
	const ttl = 5 * time.Second
	h := w.hold(8, "grow-hold", "", ttl)
	ch := w.churn(4, 8, "grow-churn", "", 2*time.Second)
	progress := func(what string) {
		t.Helper()
		before := ch.grants.Load()
		deadline := time.Now().Add(10 * time.Second)
		for ch.grants.Load() < before+10 {
			if time.Now().After(deadline) {
				t.Fatalf("churn stalled after %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	voters := []int{0}
	for i := 1; i < 5; i++ {
		start := time.Now()
		if err := c.Join(i, voters[len(voters)-1]); err != nil {
			t.Fatal(err)
		}
		voters = append(voters, i)
		if err := c.WaitMembers(w.ctx(20*time.Second), voters...); err != nil {
			t.Fatal(err)
		}
		w.knowsLeader(i, 10*time.Second)
		progress("join of " + c.Node(i).ID)
		t.Logf("%s joined in %v", c.Node(i).ID, time.Since(start).Round(time.Millisecond))
	}

	// Remove a voter that is not the leader, then stop it.
	l := w.leader(10 * time.Second)
	rm := (l + 1) % 5
	if err := c.RemoveServer(w.ctx(10*time.Second), rm); err != nil {
		t.Fatal(err)
	}
	rest := others(5, rm)
	if err := c.WaitMembers(w.ctx(20*time.Second), rest...); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(rm); err != nil {
		t.Logf("stop of the removed %s: %v", c.Node(rm).ID, err)
	}
	progress("removal of " + c.Node(rm).ID)

	// Transfer leadership to a chosen voter.
	to := rest[0]
	if to == l {
		to = rest[1]
	}
	if err := c.TransferLeader(w.ctx(10*time.Second), to); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		cur, err := c.Leader(w.ctx(2 * time.Second))
		if err == nil && cur == to {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leadership did not move to %s (leader %d, %v)", c.Node(to).ID, cur, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	progress("transfer to " + c.Node(to).ID)
	time.Sleep(ttl) // renewals at the new leader
	ch.halt()
	t.Logf("churn: %d grants, %d errors", ch.grants.Load(), ch.errs.Load())
	if n, why := h.losses(); n > 0 {
		t.Errorf("%d of 8 live holders lost their lease:\n%s", n, why)
	}
	h.release()
	w.check()
}

// logHas polls node i's log for up to d for any of subs.
func logHas(c *servertest.Cluster, i int, d time.Duration, subs ...string) bool {
	deadline := time.Now().Add(d)
	for {
		b, _ := os.ReadFile(c.Node(i).LogPath)
		for _, s := range subs {
			if strings.Contains(string(b), s) {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWipedMember_JoinRefused wipes a follower's data directory and starts
// it again with --join, as an operator replacing a disk would: the leader
// refuses it (MEMBER_CONFLICT) and it takes no part in Raft, so with the
// other follower down the leader has no quorum and grants nothing; once
// that follower is back, the cluster serves again with every grant as it
// was.
func TestWipedMember_JoinRefused(t *testing.T) {
	w := newWorld(t, 3, servertest.ClusterOptions{})
	c := w.c
	l := w.leader(20 * time.Second)
	x, y := (l+1)%3, (l+2)%3
	holder, _ := w.client("", dlock.WithTTL(30*time.Second))
	ls, err := holder.Acquire(w.ctx(10*time.Second), "wiped")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WipeAndRestart(x, "--join", c.Node(l).Addr); err != nil {
		t.Logf("wiped %s did not start: %v", c.Node(x).ID, err)
	}
	if !logHas(c, x, 15*time.Second, "MEMBER_CONFLICT", "cannot rejoin") {
		t.Errorf("wiped %s was not told it cannot rejoin", c.Node(x).ID)
	}
	// Without y, the leader and the wiped node must not make a quorum.
	if err := c.Kill(y); err != nil {
		t.Fatal(err)
	}
	probe, _ := w.client(c.URL(l, x), dlock.WithOpTimeout(time.Second))
	tctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	if g, err := probe.Acquire(tctx, "wiped-fresh", dlock.WithRetryFor(3*time.Second)); err == nil {
		t.Errorf("granted wiped-fresh (fence %d) with only the leader and the wiped member up: the wiped member counted in a quorum", g.Fence())
		_ = g.Release(context.Background())
	} else if !errors.Is(err, dlock.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("acquire without a quorum: %v, want ErrUnavailable", err)
	}
	cancel()
	if err := c.Restart(y); err != nil {
		t.Fatal(err)
	}
	w.leader(15*time.Second, x)
	hi, err := probe.Inspect(w.ctx(10*time.Second), "wiped")
	if err != nil || hi.Fence != ls.Fence() {
		t.Errorf("after the wipe, wiped is %+v (%v); its holder has fence %d", hi, err, ls.Fence())
	}
	_ = ls.Release(context.Background())
	w.check()
}

// TestWipedMember_InitialClusterAgain wipes a member and starts it again
// with its first start's flags (--initial-cluster), the operator's likely
// mistake, in the one situation where that matters: the leader is down and
// the other follower lags behind a committed grant (it was partitioned
// away when the grant was made). If the wiped member voted, the lagging
// follower could be elected without the grant, and the key would be
// granted again, possibly with a smaller fence. The grant must survive:
// nobody else gets the key while its holder is valid, and fences only
// grow (historytest.Check); the wiped member says why it takes no part
// (refused: the cluster records another data directory under its ID; or
// held back until every initial member, the dead leader included, can
// answer).
func TestWipedMember_InitialClusterAgain(t *testing.T) {
	w := newWorld(t, 3, servertest.ClusterOptions{})
	c := w.c
	l := w.leader(20 * time.Second)
	lag, wiped := (l+1)%3, (l+2)%3
	boot := []string{"--initial-cluster", initialCluster(c)}
	w.ensureLeader(l)
	c.Partition([]int{lag}, []int{l, wiped})
	holder, _ := w.client(c.URL(l), dlock.WithTTL(5*time.Second))
	ls, err := holder.Acquire(w.ctx(10*time.Second), "wiped-grant")
	if err != nil {
		t.Fatal(err)
	}
	// Let the entry commit on the leader and the soon-wiped follower only.
	if err := c.Kill(l); err != nil {
		t.Fatal(err)
	}
	if err := c.WipeAndRestart(wiped, boot...); err != nil {
		t.Logf("wiped %s did not start: %v", c.Node(wiped).ID, err)
	}
	c.Heal()
	other, _ := w.client(c.URL(lag, wiped), dlock.WithTTL(5*time.Second), dlock.WithOpTimeout(time.Second))
	tctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	g, err := other.Acquire(tctx, "wiped-grant")
	cancel()
	if err == nil {
		t.Errorf("the lagging follower and the wiped member granted wiped-grant again: fence %d (the lost grant had %d)", g.Fence(), ls.Fence())
		_ = g.Release(context.Background())
	}
	// Refused (a member records another data directory under its ID) or
	// held back (the member that could tell is down): either way it says so.
	if !logHas(c, wiped, 5*time.Second, "another data directory", "waiting for the other initial members") {
		t.Errorf("wiped %s does not say why it takes no part", c.Node(wiped).ID)
	}
	if err := c.Restart(l); err != nil {
		t.Fatal(err)
	}
	w.check()
}

// initialCluster returns the --initial-cluster value of c's first start.
func initialCluster(c *servertest.Cluster) string {
	var parts []string
	for i := 0; i < c.N(); i++ {
		parts = append(parts, c.Node(i).ID+"="+c.Node(i).RaftAddr)
	}
	return strings.Join(parts, ",")
}
