package semaphore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/recipe/semaphore"
	"github.com/dlock-dev/dlock/server/servertest"
)

// slotsOnly hides a driver's SharedLocker (keeping its Waiter), so that the
// semaphore falls back to its portable permit slots on a store that has
// native permits: the two constructions side by side on one store.
type slotsOnly struct {
	driver.Driver
	driver.Waiter
}

// BenchmarkSemaphore: 4 permits, 16 workers each acquiring (waiting) and
// releasing one permit per iteration with no work in between, so the
// figure is the store's permit handoff rate. Reported: handoffs/s and the
// p99 wait. dlockd-native is the server's FIFO permits; dlockd-slots and
// redis-slots the portable slot keys (dlockd's slots wait in each slot
// key's server queue, Redis's by backoff woken by release hints).
func BenchmarkSemaphore(b *testing.B) {
	dlockdURL := "dlockd://" + servertest.StartProcess(b).Addr()
	redisURL := testservers.StartRedis(b).URL()
	for _, c := range []struct {
		name, url string
		slots     bool
	}{
		{"dlockd-native", dlockdURL, false},
		{"dlockd-slots", dlockdURL, true},
		{"redis-slots", redisURL, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			l, err := dlock.Open(b.Context(), c.url)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			if c.slots {
				d := l.Driver()
				w, ok := d.(driver.Waiter)
				if !ok {
					b.Fatalf("%T is no Waiter", d)
				}
				l = dlock.New(slotsOnly{d, w})
			}
			sem, err := semaphore.New(l, "bench/"+c.name, 4)
			if err != nil {
				b.Fatal(err)
			}
			if want := c.name == "dlockd-native"; sem.Native() != want {
				b.Fatalf("semaphore native = %v on %s, want %v", sem.Native(), c.name, want)
			}
			var waits []time.Duration
			ch := make(chan time.Duration, 1<<16)
			b.SetParallelism(8) // 8 × GOMAXPROCS workers
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					t0 := time.Now()
					ls, err := sem.Acquire(ctx, dlock.WithTTL(10*time.Second))
					if err != nil {
						b.Error(err)
						return
					}
					select {
					case ch <- time.Since(t0):
					default:
					}
					if err := ls.Release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
			elapsed := time.Since(start)
			close(ch)
			for d := range ch {
				waits = append(waits, d)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "handoffs/s")
			b.ReportMetric(float64(p99(waits).Microseconds())/1000, "p99-wait-ms")
		})
	}
}

// p99 returns the 99th percentile of ds (0 when empty).
func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)*99/100]
}
