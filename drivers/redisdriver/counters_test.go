package redisdriver

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestFence_CounterKeysBounded replays a public report against other lock
// systems: one fence counter per lock name, with no expiry, so every key
// ever locked leaves a key behind (a benchmark of 100k keys left 100,076).
// It locks many distinct keys through a Redis Cluster client, releases
// them, and counts what is left: only the shared counters, one per hash
// slot used, so never more than the 16384 slots. DLOCK_FENCE_KEYS sets the
// number of keys (default 5,000).
func TestFence_CounterKeysBounded(t *testing.T) {
	n := 5000
	if v := os.Getenv("DLOCK_FENCE_KEYS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("DLOCK_FENCE_KEYS=%q: %v", v, err)
		}
	}
	r := testservers.StartRedisCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{r.Addr()}, ContextTimeoutEnabled: true})
	defer cc.Close()
	d := New(cc, nil)
	defer d.Close()
	ctx := t.Context()

	// A nightly per-merchant lock: a new name every day.
	name := func(i int) string { return fmt.Sprintf("settle:merchant-%d:2025-%02d-%02d", i/365, i%365/28+1, i%28+1) }
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				k, owner := name(i), fmt.Sprintf("owner-%032d", i)
				g, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: k, Owner: owner, TTL: time.Minute})
				if err == nil && g.Fence == 0 {
					err = fmt.Errorf("fence 0")
				}
				if err == nil {
					err = d.Release(ctx, k, owner)
				}
				if err != nil {
					errs <- fmt.Errorf("%q: %w", k, err)
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

	// The slots the lock names hash to, as Redis itself computes them.
	pipe := cc.Pipeline()
	cmds := make([]*redis.IntCmd, n)
	for i := range n {
		lock, _, _ := d.keys(name(i))
		cmds[i] = pipe.ClusterKeySlot(ctx, lock)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	slots := map[int64]bool{}
	for _, c := range cmds {
		slots[c.Val()] = true
	}

	left, err := cc.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d distinct lock names over %d hash slots left %d counter keys", n, len(slots), left)
	if left > 16384 || left != int64(len(slots)) {
		t.Errorf("%d keys left after locking and releasing %d names in %d hash slots; want one shared counter per slot used (at most 16384)",
			left, n, len(slots))
	}
	var cursor uint64
	for {
		keys, next, err := cc.Scan(ctx, cursor, "*", 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if !strings.HasPrefix(k, "dlock:{") || !strings.HasSuffix(k, "}:fences") {
				t.Fatalf("key %q left behind; want only the shared counters dlock:{T}:fences", k)
			}
		}
		if next == 0 {
			break
		}
		cursor = next
	}
}
