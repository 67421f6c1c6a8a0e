package rwlock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/memdriver"
	"github.com/dlock-dev/dlock/recipe/rwlock"
)

// Readers share the lock; a writer has it alone.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://")
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	rw, err := rwlock.New(locker, "catalog")
	if err != nil {
		panic(err) // dlock.ErrUnsupported on stores without read-write locks
	}
	defer rw.Close()

	r1, _ := rw.RLock(ctx)
	r2, _ := rw.RLock(ctx)
	fmt.Println("two readers:", r1.Fence() != r2.Fence())

	_, err = rw.TryLock(ctx)
	fmt.Println("writer while read-locked:", errors.Is(err, dlock.ErrNotAcquired))

	r1.Release(ctx)
	r2.Release(ctx)
	w, err := rw.Lock(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("writer fence above the readers':", w.Fence() > max(r1.Fence(), r2.Fence()))
	// Write under w.Context(), passing w.Fence() to the resource.
	w.Release(ctx)
	// Output:
	// two readers: true
	// writer while read-locked: true
	// writer fence above the readers': true
}

// A waiting writer holds back the readers that come after it.
func ExampleRWLock_Lock() {
	ctx := context.Background()
	locker, _ := dlock.Open(ctx, "mem://")
	defer locker.Close()
	rw, _ := rwlock.New(locker, "catalog")

	r, _ := rw.RLock(ctx)
	granted := make(chan *dlock.Lease)
	go func() {
		w, _ := rw.Lock(ctx) // waits for r
		granted <- w
	}()
	// Once the writer waits, a new reader is refused (writer preference).
	for {
		late, err := rw.TryRLock(ctx)
		if errors.Is(err, dlock.ErrNotAcquired) {
			break
		}
		late.Release(ctx) // the writer was not queued yet
	}
	fmt.Println("new reader refused while a writer waits")
	r.Release(ctx)
	w := <-granted
	fmt.Println("writer granted")
	w.Release(ctx)
	// Output:
	// new reader refused while a writer waits
	// writer granted
}

// New reports dlock.ErrUnsupported on stores without read-write locks.
func ExampleNew() {
	ctx := context.Background()
	locker, _ := dlock.Open(ctx, "mem://")
	defer locker.Close()
	if _, err := rwlock.New(locker, "catalog"); errors.Is(err, dlock.ErrUnsupported) {
		fmt.Println("use dlockd, etcd, zk or redis")
		return
	}
	fmt.Println("mem has read-write locks")
	// Output:
	// mem has read-write locks
}
