// Package oncetest holds the tests every once.Ledger passes against its
// real store (the ledger's rules) and the 8-node skew-and-crash scenario,
// shared by the ledgers' test packages.
package oncetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/recipe/once"
)

// LedgerRules checks the rules of the Ledger contract on l, a fresh
// ledger whose clock should be close to this host's.
func LedgerRules(t *testing.T, l once.Ledger) {
	ctx := t.Context()
	job := fmt.Sprintf("rules-%d", time.Now().UnixNano())
	now, err := l.Now(ctx)
	if err != nil || now.Sub(time.Now()).Abs() > 5*time.Second {
		t.Fatalf("Now = %v, %v; the host's clock says %v", now, err, time.Now())
	}
	if _, err := l.Get(ctx, job, "w"); !errors.Is(err, once.ErrNoRecord) {
		t.Fatalf("Get of nothing = %v", err)
	}
	r, err := l.Start(ctx, once.StartRequest{Job: job, Window: "w", Fence: 10, Owner: "o1", Node: "n1"})
	if err != nil || r.State != once.Started || r.Fence != 10 || r.Attempt != 1 || r.Owner != "o1" || r.Node != "n1" ||
		r.Job != job || r.Window != "w" || r.StartedAt.Sub(now).Abs() > 5*time.Second {
		t.Fatalf("Start = %+v, %v", r, err)
	}
	if r, err := l.Start(ctx, once.StartRequest{Job: job, Window: "w", Fence: 10, Owner: "o2"}); !errors.Is(err, dlock.ErrStaleFence) || r.Fence != 10 || !strings.Contains(err.Error(), "fence 10") {
		t.Fatalf("Start with the same fence = %+v, %v; want ErrStaleFence", r, err)
	}
	if _, err := l.Finish(ctx, job, "w", 9, ""); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("Finish with another fence = %v; want ErrStaleFence", err)
	}
	if _, err := l.Finish(ctx, job, "other", 10, ""); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("Finish of a window without a record = %v; want ErrStaleFence", err)
	}
	if r, err := l.Finish(ctx, job, "w", 10, "exit status 3"); err != nil || r.State != once.Failed || r.Error != "exit status 3" || r.FinishedAt.IsZero() {
		t.Fatalf("Finish failed = %+v, %v", r, err)
	}
	if _, err := l.Finish(ctx, job, "w", 10, ""); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("second Finish = %v; want ErrStaleFence", err)
	}
	r, err = l.Start(ctx, once.StartRequest{Job: job, Window: "w", Fence: 12, Owner: "o3"})
	if err != nil || r.Attempt != 2 || r.State != once.Started || r.Error != "" || !r.FinishedAt.IsZero() {
		t.Fatalf("retry Start = %+v, %v", r, err)
	}
	// A stale holder (fence 11) neither starts nor finishes.
	if _, err := l.Start(ctx, once.StartRequest{Job: job, Window: "w", Fence: 11}); !errors.Is(err, once.ErrStaleFence) {
		t.Fatalf("stale Start = %v", err)
	}
	if _, err := l.Finish(ctx, job, "w", 11, ""); !errors.Is(err, once.ErrStaleFence) {
		t.Fatalf("stale Finish = %v", err)
	}
	if r, err := l.Finish(ctx, job, "w", 12, ""); err != nil || r.State != once.Finished || r.Fence != 12 {
		t.Fatalf("Finish = %+v, %v", r, err)
	}
	if _, err := l.Start(ctx, once.StartRequest{Job: job, Window: "w", Fence: 99}); !errors.Is(err, once.ErrFinished) {
		t.Fatalf("Start of a finished window = %v; want ErrFinished", err)
	}
	if r, err := l.Get(ctx, job, "w"); err != nil || r.State != once.Finished || r.Fence != 12 || r.Attempt != 2 || r.Owner != "o3" {
		t.Fatalf("Get = %+v, %v", r, err)
	}
	// Fences beyond 2^53 compare exactly.
	big := uint64(1)<<60 + 1
	if _, err := l.Start(ctx, once.StartRequest{Job: job, Window: "big", Fence: big}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Start(ctx, once.StartRequest{Job: job, Window: "big", Fence: big - 1}); !errors.Is(err, once.ErrStaleFence) {
		t.Fatalf("Start with a fence 1 below 2^60+1 = %v; want ErrStaleFence", err)
	}
	if _, err := l.Start(ctx, once.StartRequest{Job: job, Window: "w2"}); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Start with fence 0 = %v; want ErrInvalidArgument", err)
	}
	// Jobs and windows with any character are kept apart.
	for _, k := range [][2]string{{job + ":a", "b"}, {job, "a:b"}, {job + "\u00e9 /{x}", "w"}} {
		if _, err := l.Start(ctx, once.StartRequest{Job: k[0], Window: k[1], Fence: 1}); err != nil {
			t.Fatalf("Start %q: %v", k, err)
		}
	}
}

// Node is one node of EightNodes: a Locker over its own driver on the real
// store (through a FaultDriver, whose faults the scenario uses) and its own
// ledger handle.
type Node struct {
	Locker *dlock.Locker
	Faults *dlocktest.FaultDriver
	Ledger once.Ledger
}

// EightNodes plays the scenario of the issue: 8 nodes, made by newNode(i),
// their clocks skewed from −2 to +2 periods, call once.Run for one job in a
// loop for 5 periods of 3 s. One attempt crashes mid-run (its renewals stop;
// it wakes up after the retry finished and finishes late). Every window runs
// exactly once: one completed fn, a Finished record, no gap; the crashed
// window is retried only after the crashed lease was lost, with a greater
// fence, and the crashed attempt's late finish is refused. newNode's lockers
// must use ttl 600 ms (their WithTTL is overridden per call anyway).
func EightNodes(t *testing.T, newNode func(t *testing.T, i int) Node) {
	const (
		nodes   = 8
		periodD = 3 * time.Second
		ttl     = 600 * time.Millisecond
		windows = 5
	)
	period, _ := once.Every(periodD)
	job := fmt.Sprintf("eight-%s-%d", t.Name(), time.Now().UnixNano())
	testStart := time.Now()
	stop := testStart.Add(windows * periodD)
	type completion struct {
		node  int
		fence uint64
	}
	var (
		mu          sync.Mutex
		completions = map[string][]completion{}
		seen        = map[string]bool{} // every window a Run decided on
		outcomes    = map[once.Outcome]int{}
		running     atomic.Int32
		crashed     atomic.Bool
		crashFence  atomic.Uint64
		crashWindow atomic.Value // string
		crashLost   atomic.Int64 // unix nanos when the crashed lease was lost
		wg          sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(t.Context(), windows*periodD+30*time.Second)
	defer cancel()
	var checkLedger once.Ledger
	for i := range nodes {
		n := newNode(t, i)
		if i == 0 {
			checkLedger = n.Ledger
		}
		skew := time.Duration(2*i-(nodes-1)) * 2 * periodD / (nodes - 1) // −2 to +2 periods
		clock := func() time.Time { return time.Now().Add(skew) }
		fn := func(fctx context.Context, at once.Attempt) error {
			if n := running.Add(1); n > 1 {
				t.Errorf("node %d: %d attempts run at once", i, n)
			}
			if at.Number == 1 && at.Window.Start.After(testStart) && time.Since(at.Window.Start) < periodD/4 && crashed.CompareAndSwap(false, true) {
				// Crash mid-run: the store hears no more of this node.
				n.Faults.BlockRenewals(true)
				running.Add(-1)
				crashFence.Store(at.Fence)
				crashWindow.Store(at.Window.ID)
				t.Logf("node %d crashes in window %s (fence %d)", i, at.Window.ID, at.Fence)
				<-at.Lease.Done()
				crashLost.Store(time.Now().UnixNano())
				// Wake up once the retry has finished, and finish late.
				wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
				defer wcancel()
				for {
					if r, err := checkLedger.Get(wctx, job, at.Window.ID); err == nil && r.State == once.Finished || wctx.Err() != nil {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				n.Faults.BlockRenewals(false)
				return nil
			}
			defer running.Add(-1)
			select {
			case <-time.After(time.Duration(50+rand.IntN(100)) * time.Millisecond): // the work
			case <-fctx.Done():
				return context.Cause(fctx)
			}
			if at.Window.ID == crashWindow.Load() && crashLost.Load() == 0 {
				t.Errorf("node %d retried window %s before the crashed lease was lost", i, at.Window.ID)
			}
			mu.Lock()
			completions[at.Window.ID] = append(completions[at.Window.ID], completion{i, at.Fence})
			mu.Unlock()
			return nil
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) && ctx.Err() == nil {
				res, err := once.Run(ctx, n.Locker, n.Ledger, job, period, fn, once.WithClock(clock),
					once.WithNode(fmt.Sprintf("node-%d", i)), once.WithLockOptions(dlock.WithTTL(ttl)))
				switch {
				case err != nil && errors.Is(err, once.ErrStaleFence) && crashFence.Load() != 0 && res.Record.Fence > crashFence.Load():
					t.Logf("node %d: late finish refused as expected: %v", i, err)
				case err != nil:
					t.Errorf("node %d: Run: %+v, %v", i, res, err)
				case res.Outcome != once.OutcomeRan && res.Outcome != once.OutcomeDone:
					t.Errorf("node %d: outcome %v", i, res.Outcome)
				}
				if got := res.Skew - skew; got.Abs() > time.Second && err == nil {
					t.Errorf("node %d: Skew %v, its clock is %v off", i, res.Skew, skew)
				}
				mu.Lock()
				if res.Window.ID != "" {
					seen[res.Window.ID] = true
				}
				outcomes[res.Outcome]++
				mu.Unlock()
				time.Sleep(time.Duration(10+rand.IntN(100)) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if !crashed.Load() {
		t.Fatal("no attempt crashed: the test did not test the crash")
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if len(ids) < windows {
		t.Fatalf("%d windows over %d periods: %v", len(ids), windows, ids)
	}
	var prev time.Time
	for _, id := range ids {
		start, err := time.Parse(time.RFC3339Nano, strings.Split(id, "/")[0])
		if err != nil {
			t.Fatal(err)
		}
		if !prev.IsZero() && start.Sub(prev) != periodD {
			t.Errorf("gap in the windows: %v then %v", prev, start)
		}
		prev = start
		r, err := checkLedger.Get(t.Context(), job, id)
		c := completions[id]
		if err != nil || r.State != once.Finished || len(c) != 1 || r.Fence != c[0].fence {
			t.Errorf("window %s: record %+v (%v), completions %+v; want finished once", id, r, err, c)
		}
		if id == crashWindow.Load() {
			if r.Attempt != 2 || r.Fence <= crashFence.Load() {
				t.Errorf("crashed window %s: record %+v, crashed fence %d; want attempt 2 with a greater fence", id, r, crashFence.Load())
			}
		} else if r.Attempt != 1 {
			t.Errorf("window %s ran %d attempts", id, r.Attempt)
		}
	}
	t.Logf("%d windows, each finished once (window: [node fence]) %v; crash in %v; Run outcomes %v",
		len(ids), completions, crashWindow.Load(), outcomes)
}
