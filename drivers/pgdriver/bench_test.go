package pgdriver_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/drivers/pgdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// BenchmarkLocker measures the root API over pgdriver against a real
// PostgreSQL (fsync and synchronous_commit on: every grant and release is a
// durable commit): uncontended Acquire+Release cycles with 1, 8 and 64
// goroutines, each on its own key, and a handoff of one key between 8
// goroutines. cycles/s counts acquire+release pairs.
func BenchmarkLocker(b *testing.B) {
	pg := testservers.StartPostgres(b)
	pool, err := pgxpool.New(b.Context(), pg.URL()+"&pool_max_conns=64")
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	d, err := pgdriver.New(pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	l := dlock.New(d)
	defer l.Close()
	if err := d.Migrate(b.Context()); err != nil {
		b.Fatal(err)
	}
	for _, g := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("uncontended/goroutines=%d", g), func(b *testing.B) {
			benchCycles(b, l, g, func(i int) string { return fmt.Sprintf("bench:%s:%d", b.Name(), i) })
		})
	}
	b.Run("contended/goroutines=8", func(b *testing.B) {
		benchCycles(b, l, 8, func(int) string { return "bench:contended:" + b.Name() })
	})
}

// benchCycles runs b.N Acquire+Release cycles shared by g goroutines, the
// i-th using key(i), and reports cycles per second.
func benchCycles(b *testing.B, l *dlock.Locker, g int, key func(i int) string) {
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, g)
	b.ResetTimer()
	start := time.Now()
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := key(i)
			for next.Add(1) <= int64(b.N) {
				ls, err := l.Acquire(ctx, k)
				if err != nil {
					errs <- err
					return
				}
				if err := ls.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
}
