package clustertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/server/historytest"
	"github.com/dlock-dev/dlock/server/servertest"
)

// lastOK returns the latest Complete, after after, of an acknowledged
// grant or renewal by one of clients, and that op (nil: none).
func lastOK(ops []historytest.Op, after time.Duration, clients ...int) (time.Duration, *historytest.Op) {
	var last time.Duration
	var op *historytest.Op
	for i := range ops {
		o := &ops[i]
		if o.Outcome != historytest.OK || o.Kind == historytest.Release || o.Complete < after {
			continue
		}
		for _, c := range clients {
			if o.Client == c && o.Complete > last {
				last, op = o.Complete, o
			}
		}
	}
	return last, op
}

// TestMinorityOldLeader cuts the leader off from both followers while its
// clients (whose URL names only it) hold and renew leases every 100ms:
//
//   - the old leader acknowledges no renewal and no grant once the
//     majority has elected (its last acknowledgment comes before the
//     majority's first grant, and within about a leader lease of the cut);
//   - its clients lose their leases by their own validity deadlines;
//   - the majority grants the same key only after the old holder's
//     validity ended, with a greater fence (historytest.Check on the whole
//     history).
func TestMinorityOldLeader(t *testing.T) {
	w := newWorld(t, 3, servertest.ClusterOptions{})
	c := w.c
	old := w.leader(20 * time.Second)
	major := others(3, old)
	const ttl = 3 * time.Second

	// The old leader's clients: two holders renewing every 100ms, and a
	// prober that keeps asking for fresh keys.
	onOld := c.URL(old)
	var held []*dlock.Lease
	var oldClients []int
	for i := 0; i < 2; i++ {
		l, id := w.client(onOld, dlock.WithTTL(ttl), dlock.WithHeartbeat(100*time.Millisecond), dlock.WithOpTimeout(time.Second))
		oldClients = append(oldClients, id)
		ls, err := l.Acquire(w.ctx(10*time.Second), fmt.Sprintf("minority-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ls)
	}
	prober, proberID := w.client(onOld, dlock.WithTTL(ttl), dlock.WithOpTimeout(500*time.Millisecond))
	oldClients = append(oldClients, proberID)
	if _, err := prober.TryAcquire(w.ctx(5*time.Second), "fresh-before"); err != nil {
		t.Fatalf("prober before the cut: %v", err)
	}

	w.ensureLeader(old)
	// Each old holder's loss is timed when it happens, not when the
	// checks below get to it, after an election and a first grant.
	lostAt := make([]chan time.Time, len(held))
	for i, ls := range held {
		lostAt[i] = make(chan time.Time, 1)
		go func() { <-ls.Done(); lostAt[i] <- time.Now() }()
	}
	cutAt := w.rec.Now()
	c.Isolate(old)
	t.Logf("isolated leader %s at %v", c.Node(old).ID, cutAt)

	probeCtx, stopProbe := context.WithCancel(context.Background())
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		for k := 0; probeCtx.Err() == nil; k++ {
			ls, err := prober.TryAcquire(probeCtx, fmt.Sprintf("fresh-%d", k))
			if err == nil {
				t.Errorf("the isolated old leader's side granted fresh-%d (fence %d)", k, ls.Fence())
				_ = ls.Release(context.Background())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	// The majority elects, and a client there (its URL names the two
	// majority nodes) waits for the first key.
	newL := w.leader(15*time.Second, old)
	b, bID := w.client(c.URL(major...), dlock.WithTTL(ttl))
	// A first grant on the majority side, of a fresh key: the new leader
	// commits by then.
	if _, err := b.TryAcquire(w.ctx(10*time.Second), "majority-fresh"); err != nil {
		t.Fatalf("majority side: %v", err)
	}
	// The old holders lose their leases by their own deadlines.
	for i, ls := range held {
		var at time.Time
		select {
		case at = <-lostAt[i]:
		case <-time.After(ttl + 2*time.Second):
			t.Fatalf("lease %s on the isolated old leader still held %v after the cut", ls.Key(), ttl+2*time.Second)
		}
		if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("lease %s ended with %v, want ErrLeaseLost", ls.Key(), ls.Err())
		}
		if late := at.Sub(ls.Deadline()); late > time.Second {
			t.Errorf("lease %s lost %v after its validity deadline", ls.Key(), late)
		}
	}
	lb, err := b.Acquire(w.ctx(20*time.Second), "minority-0")
	if err != nil {
		t.Fatalf("majority side acquire of the old holder's key: %v", err)
	}
	if lb.Fence() <= held[0].Fence() {
		t.Errorf("majority granted minority-0 with fence %d, not greater than the old holder's %d", lb.Fence(), held[0].Fence())
	}
	_ = lb.Release(context.Background())
	stopProbe()
	<-probeDone

	ops := w.rec.Ops()
	lastOld, lastOp := lastOK(ops, cutAt, oldClients...)
	firstMajority := time.Duration(1 << 62)
	for _, o := range ops {
		if o.Client == bID && o.Outcome == historytest.OK && o.Kind == historytest.Acquire && o.Complete < firstMajority {
			firstMajority = o.Complete
		}
	}
	if lastOp == nil {
		t.Logf("new leader %s; the old leader acknowledged nothing after the cut; majority's first grant %v after the cut",
			c.Node(newL).ID, firstMajority-cutAt)
	} else {
		t.Logf("new leader %s; the old leader's last acknowledgment was received %v after the cut (%v); majority's first grant %v after the cut",
			c.Node(newL).ID, lastOld-cutAt, lastOp, firstMajority-cutAt)
	}
	if lastOp != nil && lastOld >= firstMajority {
		t.Errorf("the isolated old leader acknowledged %v at %v, after the majority's first grant at %v", lastOp, lastOld, firstMajority)
	}
	c.Heal()
	w.check()
}
