package redisdriver

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// BenchmarkUncontended measures Acquire+Release cycles through the root API,
// each goroutine on its own key, against a real redis-server on loopback
// (AOF, appendfsync everysec). One op is one cycle (two script round trips).
func BenchmarkUncontended(b *testing.B) {
	r := testservers.StartRedis(b)
	for _, g := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			l := dlock.New(openDriver(b, r.URL()), dlock.WithTTL(10*time.Second))
			defer l.Close()
			ctx := context.Background()
			var (
				wg    sync.WaitGroup
				left  atomic.Int64
				fails atomic.Int64
			)
			left.Store(int64(b.N))
			b.ResetTimer()
			start := time.Now()
			for i := range g {
				key := fmt.Sprintf("bench/uncontended/%d/%d", g, i)
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						ls, err := l.Acquire(ctx, key)
						if err != nil {
							fails.Add(1)
							continue
						}
						if err := ls.Release(ctx); err != nil {
							fails.Add(1)
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if n := fails.Load(); n > 0 {
				b.Fatalf("%d of %d cycles failed", n, b.N)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
		})
	}
}

// BenchmarkContendedHandoff measures handoffs of one key between 8
// goroutines, each with its own Locker and driver (as 8 processes would),
// through the root API: Acquire waits by full-jitter backoff (defaults: 5 ms
// to 1 s), woken early by release hints when they are on. One op is one
// grant; switches/s counts the grants that went to a different goroutine
// than the previous grant (polling lets the releaser re-acquire at once,
// which inflates grants/s without moving the lock).
func BenchmarkContendedHandoff(b *testing.B) {
	r := testservers.StartRedis(b)
	const g = 8
	for _, hints := range []bool{true, false} {
		b.Run(fmt.Sprintf("goroutines=%d/hints=%v", g, hints), func(b *testing.B) {
			key := fmt.Sprintf("bench/contended/%v", hints)
			lockers := make([]*dlock.Locker, g)
			for i := range lockers {
				lockers[i] = dlock.New(openDriver(b, fmt.Sprintf("%s?hints=%v", r.URL(), hints)), dlock.WithTTL(10*time.Second))
				defer lockers[i].Close()
			}
			ctx := context.Background()
			var (
				wg    sync.WaitGroup
				left  atomic.Int64
				fails atomic.Int64
				held  atomic.Int32
				last  atomic.Int64 // goroutine of the previous grant
				moves atomic.Int64
			)
			last.Store(-1)
			left.Store(int64(b.N))
			b.ResetTimer()
			start := time.Now()
			for id, l := range lockers {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						ls, err := l.Acquire(ctx, key)
						if err != nil {
							fails.Add(1)
							continue
						}
						if held.Add(1) != 1 {
							fails.Add(1) // two holders at once
						}
						if last.Swap(int64(id)) != int64(id) {
							moves.Add(1)
						}
						held.Add(-1)
						if err := ls.Release(ctx); err != nil {
							fails.Add(1)
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if n := fails.Load(); n > 0 {
				b.Fatalf("%d of %d handoffs failed", n, b.N)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "grants/s")
			b.ReportMetric(float64(moves.Load())/elapsed.Seconds(), "switches/s")
		})
	}
}

// BenchmarkWaitReplicas measures TryAcquire+Release cycles of one
// goroutine on the driver itself against a real primary with one replica
// on loopback, with wait_replicas off and at 1: one op is one cycle (two
// script round trips; with wait_replicas=1 also a WAIT, after the grant,
// that returns once the replica acknowledged it).
func BenchmarkWaitReplicas(b *testing.B) {
	p := testservers.StartRedis(b)
	testservers.StartRedisReplica(b, p)
	waitLink(b, p, 1)
	for _, n := range []int{0, 1} {
		b.Run(fmt.Sprintf("wait_replicas=%d", n), func(b *testing.B) {
			d := openDriver(b, fmt.Sprintf("%s?wait_replicas=%d", p.URL(), n))
			ctx := context.Background()
			req := driver.AcquireRequest{Key: fmt.Sprintf("bench/wait/%d", n), Owner: "benchowner", TTL: 10 * time.Second}
			for b.Loop() {
				if _, err := d.TryAcquire(ctx, req); err != nil {
					b.Fatal(err)
				}
				if err := d.Release(ctx, req.Key, req.Owner); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
