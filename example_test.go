package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// Acquire a lease, do the work under its context, release it.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example") // or redis://, dlockd://, ...
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "settle:42:2026-09-30", dlock.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	defer lease.Release(context.Background())

	// Work under lease.Context(): it is cancelled the moment the lease can
	// no longer be trusted. Pass lease.Fence() to the resource.
	fmt.Println("holding", lease.Key(), "with a fence > 0:", lease.Fence() > 0)
	// Output: holding settle:42:2026-09-30 with a fence > 0: true
}

// TryAcquire skips the work when another process holds the key: the cron
// job that must run once on six pods.
func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	pod1, _ := dlock.Open(ctx, "mem://example-try")
	pod2, _ := dlock.Open(ctx, "mem://example-try")
	defer pod1.Close()
	defer pod2.Close()

	lease, _ := pod1.TryAcquire(ctx, "payout:2026-09")
	defer lease.Release(ctx)

	_, err := pod2.TryAcquire(ctx, "payout:2026-09")
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired))
	fmt.Println(err)
	// Output:
	// true
	// dlock: acquire "payout:2026-09" on mem://example-try: lock held
}

// A fence only grows: the resource keeps the greatest it has seen and
// rejects anything older (see package dlock/fence).
func ExampleLease_Fence() {
	ctx := context.Background()
	locker, _ := dlock.Open(ctx, "mem://example-fence")
	defer locker.Close()

	first, _ := locker.Acquire(ctx, "account:7")
	_ = first.Release(ctx)
	second, _ := locker.Acquire(ctx, "account:7")
	defer second.Release(ctx)

	fmt.Println(second.Fence() > first.Fence())
	// Output: true
}

// A holder that cannot renew (here: its heartbeats are blocked, as in a long
// GC pause or a partition) loses the lease at its validity deadline: Done
// closes and the lease's context is cancelled with ErrLeaseLost.
func ExampleLease_Done() {
	ctx := context.Background()
	faulty := dlocktest.NewFaultDriver(memdriver.New(memdriver.NewStore()), nil)
	locker := dlock.New(faulty)
	defer locker.Close()

	lease, _ := locker.Acquire(ctx, "leader", dlock.WithTTL(300*time.Millisecond))
	dlocktest.Faults(faulty).BlockRenewals(true)

	select {
	case <-lease.Done():
		fmt.Println("lost:", errors.Is(context.Cause(lease.Context()), dlock.ErrLeaseLost))
		fmt.Println("before its deadline + 50ms:", time.Now().Before(lease.Deadline().Add(50*time.Millisecond)))
	case <-time.After(5 * time.Second):
		fmt.Println("still held")
	}
	fmt.Println("release reports:", errors.Is(lease.Release(ctx), dlock.ErrLeaseLost))
	// Output:
	// lost: true
	// before its deadline + 50ms: true
	// release reports: true
}

// AcquireAll takes several keys in sorted order, all or nothing.
func ExampleLocker_AcquireAll() {
	ctx := context.Background()
	locker, _ := dlock.Open(ctx, "mem://example-all")
	defer locker.Close()

	set, err := locker.AcquireAll(ctx, []string{"account:9", "account:3", "account:9"})
	if err != nil {
		panic(err)
	}
	defer set.Release(ctx)
	fmt.Println(set.Keys())
	// Output: [account:3 account:9]
}
