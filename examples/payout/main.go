// Command payout is dlock's main job in miniature: the monthly payout brief.
//
// Six workers (each with its own Locker and store connection, as six pods
// would have) start the payout for one month at the same moment. Exactly
// one runs it; the other five see the key held and skip. Then the example
// shows why the fence matters: a holder is paused past its TTL, loses its
// lease, a second holder takes over with a greater fence, and the ledger
// rejects the paused holder's late write as stale.
//
//	go run ./examples/payout                  # in-process store, no server
//	go run ./examples/payout --store redis://127.0.0.1:6379
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	_ "github.com/dlock-dev/dlock/drivers/memdriver"
)

func main() {
	store := flag.String("store", "mem://payout-demo", "lock store URL")
	workers := flag.Int("workers", 6, "workers racing for the payout")
	month := flag.String("month", "2026-09", "payout month")
	ttl := flag.Duration("ttl", time.Second, "lease TTL for the paused-holder part")
	flag.Parse()
	if err := run(context.Background(), *store, *workers, *month, *ttl); err != nil {
		slog.Error("payout demo failed", "err", err)
		os.Exit(1)
	}
}

// ledger is the protected resource: it remembers the greatest fence it has
// seen per account and refuses older ones, as package dlock/fence does for
// SQL and Redis.
type ledger struct {
	mu       sync.Mutex
	fences   map[string]uint64
	payments map[string]int
}

func (l *ledger) pay(account string, fence uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if fence <= l.fences[account] {
		return fmt.Errorf("ledger: payment for %s with fence %d, seen %d: %w", account, fence, l.fences[account], dlock.ErrStaleFence)
	}
	l.fences[account] = fence
	l.payments[account]++
	return nil
}

func run(ctx context.Context, store string, workers int, month string, ttl time.Duration) error {
	key := "payout:" + month
	book := &ledger{fences: map[string]uint64{}, payments: map[string]int{}}

	// Part 1: six workers, one run.
	lockers := make([]*dlock.Locker, workers)
	for i := range lockers {
		l, err := dlock.Open(ctx, store, dlock.WithHolder(fmt.Sprintf("worker-%d", i)))
		if err != nil {
			return err
		}
		defer l.Close()
		lockers[i] = l
	}
	var ran, skipped atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			lease, err := l.TryAcquire(ctx, key, dlock.WithTTL(10*time.Second))
			if errors.Is(err, dlock.ErrNotAcquired) {
				skipped.Add(1)
				fmt.Printf("worker-%d: %s is held, skipping\n", i, key)
				return
			}
			if err != nil {
				fmt.Printf("worker-%d: %v\n", i, err)
				return
			}
			defer lease.Release(context.WithoutCancel(ctx))
			ran.Add(1)
			fmt.Printf("worker-%d: running the payout for %s under fence %d\n", i, month, lease.Fence())
			for _, vendor := range []string{"vendor-a", "vendor-b", "vendor-c"} {
				if err := book.pay(vendor+":"+month, lease.Fence()); err != nil {
					fmt.Printf("worker-%d: %v\n", i, err)
				}
			}
			time.Sleep(100 * time.Millisecond) // still holding while the others try
		}()
	}
	close(start)
	wg.Wait()
	fmt.Printf("payout %s: %d worker ran it, %d skipped\n\n", month, ran.Load(), skipped.Load())
	if ran.Load() != 1 {
		return fmt.Errorf("%d workers ran the payout, want exactly 1", ran.Load())
	}

	// Part 2: a paused holder loses its lease; its late write is fenced out.
	fenceKey := "payout-fenced:" + month
	// A's store connection is wrapped in dlocktest's fault injector so the
	// demo can freeze its heartbeats, as a long GC pause or SIGSTOP would.
	a, faults, err := dlocktest.OpenFaulty(ctx, store, dlock.WithHolder("paused-holder"))
	if err != nil {
		return err
	}
	defer a.Close()
	b := lockers[1]
	la, err := a.Acquire(ctx, fenceKey, dlock.WithTTL(ttl), dlock.WithHeartbeat(ttl/3))
	if err != nil {
		return err
	}
	fmt.Printf("holder A: acquired %s, fence %d, valid until %s from now\n", fenceKey, la.Fence(), time.Until(la.Deadline()).Round(time.Millisecond))
	// Simulate a GC pause: A's heartbeat cannot reach the store, so the
	// store lets the grant expire while A is stuck.
	faults.BlockRenewals(true)
	lb, err := b.Acquire(ctx, fenceKey, dlock.WithTTL(10*time.Second))
	if err != nil {
		return err
	}
	defer lb.Release(context.WithoutCancel(ctx))
	fmt.Printf("holder B: took over after A's TTL, fence %d\n", lb.Fence())
	if err := book.pay("vendor-z:"+month, lb.Fence()); err != nil {
		return err
	}
	fmt.Printf("holder B: paid vendor-z with fence %d\n", lb.Fence())
	<-la.Done()
	fmt.Printf("holder A: wakes up; lease context says: %v\n", context.Cause(la.Context()))
	err = book.pay("vendor-z:"+month, la.Fence())
	fmt.Printf("holder A: late write anyway -> %v\n", err)
	if !errors.Is(err, dlock.ErrStaleFence) {
		return fmt.Errorf("the stale write was not rejected")
	}
	fmt.Printf("\nvendor-z paid %d time(s)\n", book.payments["vendor-z:"+month])
	return nil
}
