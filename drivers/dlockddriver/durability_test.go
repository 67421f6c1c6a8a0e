package dlockddriver_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server/servertest"
)

type held struct {
	key, owner string
	fence      uint64
}

func owner(i int, tag string) string { return fmt.Sprintf("owner-%s-%08d-0123456789abcdef", tag, i) }

// TestDurability_Kill9 holds leases, queues waiters and keeps acquiring
// while dlockd (fsync on) is killed with SIGKILL, then restarts it on the
// same data: every acknowledged grant is still held with its fence and can
// be renewed, nothing is granted twice, the waiters keep their queue places
// across the restart (the driver re-attaches them) and leave nothing when
// cancelled, and every fence issued afterwards is greater than every fence
// issued before.
func TestDurability_Kill9(t *testing.T) {
	p := servertest.StartProcess(t)
	ctx := t.Context()
	d1, err := dlockddriver.Dial(p.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d1.Close()
	d2, err := dlockddriver.Dial(p.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	const ttl = 30 * time.Second

	var mu sync.Mutex
	var grants []held
	var maxFence uint64
	record := func(h held) {
		mu.Lock()
		grants = append(grants, h)
		maxFence = max(maxFence, h.fence)
		mu.Unlock()
	}
	// Leases held, and churn that issues and retires fences.
	for i := range 20 {
		k := fmt.Sprintf("durable/held/%d", i)
		g, err := d1.TryAcquire(ctx, driver.AcquireRequest{Key: k, Owner: owner(i, "h"), TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		record(held{k, owner(i, "h"), g.Fence})
		o := owner(i, "c")
		g, err = d1.TryAcquire(ctx, driver.AcquireRequest{Key: "durable/churn", Owner: o, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		maxFence = max(maxFence, g.Fence)
		mu.Unlock()
		if err := d1.Release(ctx, "durable/churn", o); err != nil {
			t.Fatal(err)
		}
	}
	// Waiters queued behind held keys, from another client. They ride
	// through the kill: their queue entries are in the log, and the
	// driver re-attaches to them (same owner tokens) after the restart.
	var wg sync.WaitGroup
	waitErrs := make(chan error, 5)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := d2.Wait(wctx, driver.AcquireRequest{Key: "durable/held/0", Owner: owner(i, "w"), TTL: ttl})
			waitErrs <- err
		}()
	}
	waitUntil(t, func() bool {
		info, err := d1.Inspect(ctx, "durable/held/0")
		return err == nil && info.Waiters == 5
	})
	// Acquirers racing the kill: every acknowledged grant must survive.
	stop := make(chan struct{})
	var acq sync.WaitGroup
	for w := range 4 {
		acq.Add(1)
		go func() {
			defer acq.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("durable/race/%d/%d", w, i)
				o := owner(i, fmt.Sprintf("r%d", w))
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				g, err := d1.TryAcquire(cctx, driver.AcquireRequest{Key: k, Owner: o, TTL: ttl})
				cancel()
				if err != nil {
					return // the server is gone
				}
				record(held{k, o, g.Fence})
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	acq.Wait()
	mu.Lock()
	before := append([]held(nil), grants...)
	fenceBefore := maxFence
	mu.Unlock()
	t.Logf("killed with %d acknowledged grants held, greatest fence %d", len(before), fenceBefore)
	if len(before) < 30 {
		t.Fatalf("only %d grants before the kill: the race did not run", len(before))
	}

	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	// Every grant is still held, by the same owner with the same fence.
	for _, h := range before {
		info, err := d1.Inspect(ctx, h.key)
		if err != nil {
			t.Fatalf("after restart, %q: %v", h.key, err)
		}
		if info.Fence != h.fence {
			t.Fatalf("after restart, %q has fence %d, want %d", h.key, info.Fence, h.fence)
		}
		ok, err := d1.CheckFence(ctx, h.key, h.fence)
		if err != nil || !ok {
			t.Fatalf("CheckFence(%q, %d) = %v, %v; want current", h.key, h.fence, ok, err)
		}
		_, err = d2.TryAcquire(ctx, driver.AcquireRequest{Key: h.key, Owner: owner(0, fmt.Sprintf("x%x", h.key[8:])), TTL: ttl})
		if !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("after restart, another client's TryAcquire(%q) = %v, want ErrNotAcquired", h.key, err)
		}
	}
	// Holders renew (batched) and keep their grants.
	items := make([]dlockddriver.RenewItem, len(before))
	for i, h := range before {
		items[i] = dlockddriver.RenewItem{Key: h.key, Owner: h.owner}
	}
	errs, err := d1.RenewBatch(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("renew %q after restart: %v", before[i].key, err)
		}
	}
	// The waiters are still queued (re-attached within their grace), none
	// was granted the held key or gave up; cancelling them removes their
	// entries on the restarted server.
	info, err := d1.Inspect(ctx, "durable/held/0")
	if err != nil || info.Waiters != 5 {
		t.Fatalf("after restart, waiters on durable/held/0 = %d (%v), want the 5 queued before the kill", info.Waiters, err)
	}
	select {
	case err := <-waitErrs:
		t.Fatalf("a waiter returned across the restart: %v", err)
	default:
	}
	wcancel()
	wg.Wait()
	close(waitErrs)
	for err := range waitErrs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled waiter = %v; want context.Canceled (never a grant of the held key)", err)
		}
	}
	if info, err := d1.Inspect(ctx, "durable/held/0"); err != nil || info.Waiters != 0 {
		t.Fatalf("after the waiters' cancellation, waiters on durable/held/0 = %d (%v), want 0", info.Waiters, err)
	}
	// Fences issued afterwards are greater than every fence before.
	for i := range 10 {
		k := fmt.Sprintf("durable/after/%d", i)
		g, err := d2.TryAcquire(ctx, driver.AcquireRequest{Key: k, Owner: owner(i, "a"), TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if g.Fence <= fenceBefore {
			t.Fatalf("fence %d after restart is not greater than %d before", g.Fence, fenceBefore)
		}
	}
	// Handoff: releasing a held key grants nobody (its waiters are gone),
	// and the next grant's fence is new.
	if err := d1.Release(ctx, before[0].key, before[0].owner); err != nil {
		t.Fatal(err)
	}
	g, err := d2.TryAcquire(ctx, driver.AcquireRequest{Key: before[0].key, Owner: owner(1, "z"), TTL: ttl})
	if err != nil || g.Fence <= fenceBefore {
		t.Fatalf("re-acquire after release: fence %d, %v; want > %d", g.Fence, err, fenceBefore)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
