package dlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// BenchmarkLocker_AcquireRelease measures the library's own cost of one
// uncontended cycle (TryAcquire, then Release) over the in-memory driver,
// whose calls cost next to nothing: the allocations and CPU per cycle are
// the root package's (contexts, timers, the Lease and its heartbeat set-up),
// the part of every store's cycle that dlock adds to the store's own.
func BenchmarkLocker_AcquireRelease(b *testing.B) {
	for _, wait := range []bool{false, true} {
		name := "TryAcquire"
		if wait {
			name = "Acquire"
		}
		b.Run(name, func(b *testing.B) {
			l := dlock.New(memdriver.New(memdriver.NewStore()))
			defer l.Close()
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Sprintf("bench/%p", pb)
				for pb.Next() {
					var lease *dlock.Lease
					var err error
					if wait {
						lease, err = l.Acquire(ctx, key, dlock.WithTTL(30*time.Second))
					} else {
						lease, err = l.TryAcquire(ctx, key, dlock.WithTTL(30*time.Second))
					}
					if err != nil {
						b.Error(err)
						return
					}
					if err := lease.Release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
