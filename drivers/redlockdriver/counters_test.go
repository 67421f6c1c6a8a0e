package redlockdriver_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestFence_CounterKeysBounded replays a public report against other lock
// systems: one fence counter per lock name, with no expiry, so every key
// ever locked leaves a key behind on every node. It locks 5,000 distinct
// keys over three nodes, releases them, and counts what is left on each
// node: only the shared counters, at most 1,024.
func TestFence_CounterKeysBounded(t *testing.T) {
	const n = 5000
	rs := testservers.StartRedisN(t, 3)
	d := openDriver(t, redlockURL(rs))
	ctx := t.Context()

	name := func(i int) string { return fmt.Sprintf("settle:merchant-%d:2025-%02d-%02d", i/365, i%365/28+1, i%28+1) }
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				r := req(name(i), time.Minute)
				g, err := d.TryAcquire(ctx, r)
				if err == nil && g.Fence == 0 {
					err = fmt.Errorf("fence 0")
				}
				if err == nil {
					err = d.Release(ctx, r.Key, r.Owner)
				}
				if err != nil {
					errs <- fmt.Errorf("%q: %w", r.Key, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	for i, r := range rs {
		c := client(t, r)
		left, err := c.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("node %d: %d distinct lock names left %d keys", i, n, left)
		if left > 1024 {
			t.Errorf("node %d: %d keys left after locking and releasing %d names; want at most 1024 shared counters", i, left, n)
		}
		keys, err := c.Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if !strings.HasPrefix(k, "dlock:redlock:fences:") {
				t.Fatalf("node %d: key %q left behind; want only the shared counters dlock:redlock:fences:N", i, k)
			}
		}
	}
}
