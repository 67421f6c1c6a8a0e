package etcddriver_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/etcddriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func BenchmarkLocker(b *testing.B) {
	e := testservers.StartEtcd(b)
	benchLocker(b, func(b *testing.B) driver.Driver {
		u, _ := url.Parse(e.URL())
		d, err := etcddriver.Open(context.Background(), u)
		if err != nil {
			b.Fatal(err)
		}
		return d
	})
}

// benchLocker runs the root-API benchmarks over a locker from open:
// uncontended Acquire+Release with 1, 8 and 64 goroutines (each on its own
// key), and a contended handoff of one key between 8 goroutines. Each
// reports cycles/s.
func benchLocker(b *testing.B, open func(b *testing.B) driver.Driver) {
	for _, g := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("Uncontended/goroutines=%d", g), func(b *testing.B) {
			locker := dlock.New(open(b), dlock.WithTTL(30*time.Second))
			defer locker.Close()
			runCycles(b, g, func(i int) string { return fmt.Sprintf("bench/uncontended/%d", i) }, locker)
		})
	}
	b.Run("ContendedHandoff/goroutines=8", func(b *testing.B) {
		locker := dlock.New(open(b), dlock.WithTTL(30*time.Second))
		defer locker.Close()
		runCycles(b, 8, func(int) string { return "bench/contended" }, locker)
	})
}

func runCycles(b *testing.B, goroutines int, key func(i int) string, locker *dlock.Locker) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for i := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := key(i)
			for next.Add(1) <= int64(b.N) {
				actx, cancel := context.WithTimeout(ctx, 30*time.Second)
				ls, err := locker.Acquire(actx, k)
				cancel()
				if err != nil {
					failed.Store(err)
					return
				}
				if err := ls.Release(ctx); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "cycles/s")
}
