package semaphore_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/memdriver" // registers mem://
	"github.com/dlock-dev/dlock/recipe/semaphore"
)

// Up to two holders of "backups" at once; a third is refused (TryAcquire)
// or waits (Acquire). Each permit is a lease with its own fence.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://semaphore-example")
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	sem, err := semaphore.New(locker, "backups", 2)
	if err != nil {
		panic(err)
	}
	a, _ := sem.Acquire(ctx)
	b, _ := sem.Acquire(ctx)
	_, err = sem.TryAcquire(ctx)
	fmt.Println("native:", sem.Native())
	fmt.Println("third holder refused:", errors.Is(err, dlock.ErrNotAcquired))
	fmt.Println("own fences:", a.Fence() != b.Fence())

	_ = a.Release(ctx) // frees a permit for the next holder
	c, err := sem.Acquire(ctx)
	fmt.Println("after a release:", err == nil, c.Fence() > b.Fence())
	_ = b.Release(ctx)
	_ = c.Release(ctx)
	// Output:
	// native: true
	// third holder refused: true
	// own fences: true
	// after a release: true true
}

// The one-liner: wait for one of 3 permits of "reports", work under the
// permit's context, release.
func ExampleAcquire() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://semaphore-example")
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	lease, err := semaphore.Acquire(ctx, locker, "reports", 3, dlock.WithTTL(dlock.DefaultTTL))
	if err != nil {
		panic(err)
	}
	defer lease.Release(ctx)
	work := lease.Context() // cancelled if the permit is lost
	fmt.Println(lease.Key(), work.Err() == nil)
	// Output: reports/permit-shared true
}
