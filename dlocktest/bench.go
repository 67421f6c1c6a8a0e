package dlocktest

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// Benchmark runs the common driver benchmarks through the public dlock API
// against the store behind h, each client on its own driver (connection):
//
//	Uncontended/goroutines=1,8,64  Acquire+Release, each goroutine on its own key: cycles/s
//	ContendedHandoff/goroutines=8  Acquire+Release of one key: handoffs/s and the
//	                               gap from a release to the next grant (p50, p99)
//
// A driver's bench_test.go calls it from a Benchmark function after starting
// its real server.
func Benchmark(b *testing.B, h Harness) {
	for _, g := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("Uncontended/goroutines=%d", g), func(b *testing.B) {
			benchCycles(b, h, g, false)
		})
	}
	b.Run("ContendedHandoff/goroutines=8", func(b *testing.B) { benchCycles(b, h, 8, true) })
}

func benchCycles(b *testing.B, h Harness, goroutines int, oneKey bool) {
	ctx := context.Background()
	lockers := make([]*dlock.Locker, goroutines)
	for i := range lockers {
		d, err := h.NewDriver(ctx)
		if err != nil {
			b.Fatalf("%s: NewDriver: %v", h.Name, err)
		}
		lockers[i] = dlock.New(d, dlock.WithTTL(30*time.Second), dlock.WithBackoff(time.Millisecond, 20*time.Millisecond))
		defer lockers[i].Close()
	}
	run := fmt.Sprintf("bench:%d:%s", time.Now().UnixNano(), b.Name())
	var (
		next        atomic.Int64
		failed      atomic.Value
		mu          sync.Mutex
		lastRelease time.Time
		gaps        []time.Duration
	)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("%s:%d", run, i)
			if oneKey {
				key = run
			}
			for next.Add(1) <= int64(b.N) {
				actx, cancel := context.WithTimeout(ctx, 30*time.Second)
				ls, err := l.Acquire(actx, key)
				cancel()
				if err != nil {
					failed.Store(err)
					return
				}
				if oneKey {
					mu.Lock()
					if !lastRelease.IsZero() {
						gaps = append(gaps, time.Since(lastRelease))
					}
					lastRelease = time.Now()
					mu.Unlock()
				}
				if err := ls.Release(ctx); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	if !oneKey {
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
		return
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "handoffs/s")
	if len(gaps) > 0 {
		slices.Sort(gaps)
		b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds()), "gap-p50-µs")
		b.ReportMetric(float64(gaps[(len(gaps)-1)*99/100].Microseconds()), "gap-p99-µs")
	}
}

// URLDriver returns a Harness.NewDriver that opens rawURL through the driver
// registry (driver.Lookup), as dlock.Open does.
func URLDriver(rawURL string) func(ctx context.Context) (driver.Driver, error) {
	return func(ctx context.Context) (driver.Driver, error) {
		u, err := url.Parse(rawURL)
		if err != nil {
			return nil, err
		}
		open, err := driver.Lookup(u.Scheme)
		if err != nil {
			return nil, err
		}
		return open(ctx, u)
	}
}
