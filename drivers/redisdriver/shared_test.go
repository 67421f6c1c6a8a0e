package redisdriver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/recipe/rwlock"
)

// TestRWLock runs the read-write lock checks (owner-checked Lua over a
// hash of grants and a FIFO wait list) against a real redis-server: kinds,
// an overlap detector, a writer behind a stream of readers, per-grant TTLs.
func TestRWLock(t *testing.T) {
	r := testservers.StartRedis(t)
	dlocktest.RunRWLock(t, "redis", func(ctx context.Context) (driver.Driver, error) {
		return Open(ctx, r.URL())
	})
}

// TestRWLock_NoHints: the same checks without release hints (pure
// polling).
func TestRWLock_NoHints(t *testing.T) {
	r := testservers.StartRedis(t)
	dlocktest.RunRWLock(t, "redis-nohints", func(ctx context.Context) (driver.Driver, error) {
		return Open(ctx, r.URL()+"?hints=false")
	})
}

func openLocker(t *testing.T, rawURL string) (*dlock.Locker, *Driver) {
	t.Helper()
	d, err := Open(t.Context(), rawURL)
	if err != nil {
		t.Fatal(err)
	}
	l := dlock.New(d, dlock.WithBackoff(time.Millisecond, 20*time.Millisecond))
	t.Cleanup(func() { l.Close() })
	return l, d
}

// TestRWLock_OwnKeySpace: on Redis the read-write lock keeps keys of its
// own: a plain lock of the same name does not exclude it, and nothing is
// left in Redis once every grant is released.
func TestRWLock_OwnKeySpace(t *testing.T) {
	r := testservers.StartRedis(t)
	l, d := openLocker(t, r.URL())
	ctx := t.Context()
	key := fmt.Sprintf("own{space}:%d", time.Now().UnixNano())
	rw, err := rwlock.New(l, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	p, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	w, err := rw.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock beside a plain lock of the same name: %v (the key spaces are separate on Redis)", err)
	}
	if w.Fence() <= p.Fence() {
		t.Fatalf("fences of one name from one slot counter: writer %d after plain %d", w.Fence(), p.Fence())
	}
	w.Release(ctx)
	p.Release(ctx)
	keys, _ := d.rwKeys(key)
	n, err := d.client.(*redis.Client).Exists(ctx, keys[:4]...).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d read-write lock keys left in Redis after every grant was released", n)
	}
}

// TestRWLock_CrashedWaiterExpires: a writer that queued and then stopped
// polling (its process died) holds readers back only until its queue entry
// expires.
func TestRWLock_CrashedWaiterExpires(t *testing.T) {
	r := testservers.StartRedis(t)
	l, d := openLocker(t, r.URL())
	ctx := t.Context()
	key := fmt.Sprintf("crashed-waiter:%d", time.Now().UnixNano())
	rw, err := rwlock.New(l, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	rd, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// One refused, queued attempt of a writer, as Wait makes, and no more.
	wv, _ := d.SharedView(driver.SharedKind{Mode: driver.Exclusive})
	g, err := wv.(*rwView).attempt(ctx, driver.AcquireRequest{Key: key, Owner: "crashed-writer", TTL: time.Second}, true, 600*time.Millisecond)
	if err != nil || g.Fence != 0 {
		t.Fatalf("queued attempt = %v, %v; want refused", g, err)
	}
	if _, err := rw.TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock while a writer is queued = %v, want ErrNotAcquired", err)
	}
	time.Sleep(700 * time.Millisecond)
	r2, err := rw.TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock after the crashed writer's queue entry expired: %v", err)
	}
	r2.Release(ctx)
	rd.Release(ctx)
}

// TestRWLock_ScriptsRefuseOthers: Renew and Release are owner-checked; a
// reader's release does not touch the writer's or another reader's grant.
func TestRWLock_ScriptsRefuseOthers(t *testing.T) {
	r := testservers.StartRedis(t)
	_, d := openLocker(t, r.URL())
	ctx := t.Context()
	key := fmt.Sprintf("owners:%d", time.Now().UnixNano())
	rv, _ := d.SharedView(driver.SharedKind{Mode: driver.Shared})
	wv, _ := d.SharedView(driver.SharedKind{Mode: driver.Exclusive})
	req := func(owner string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Owner: owner, TTL: 5 * time.Second}
	}
	g1, err := rv.TryAcquire(ctx, req("r1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := rv.TryAcquire(ctx, req("r1"))
	if err != nil || again.Fence != g1.Fence {
		t.Fatalf("a repeated attempt of the same owner = %v, %v; want the same grant (fence %d)", again, err, g1.Fence)
	}
	if err := rv.Release(ctx, key, "r2"); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Release by a non-holder = %v, want ErrLeaseLost", err)
	}
	if err := wv.Renew(ctx, key, "w", time.Second); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew by a non-holder = %v, want ErrLeaseLost", err)
	}
	if _, err := wv.TryAcquire(ctx, req("w")); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("writer TryAcquire beside a reader = %v, want ErrNotAcquired", err)
	}
	if err := rv.Release(ctx, key, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := rv.Release(ctx, key, "r1"); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second Release = %v, want ErrLeaseLost", err)
	}
	gw, err := wv.TryAcquire(ctx, req("w"))
	if err != nil {
		t.Fatal(err)
	}
	if gw.Fence <= g1.Fence {
		t.Fatalf("writer fence %d not above the reader's %d", gw.Fence, g1.Fence)
	}
	if _, err := rv.TryAcquire(ctx, req("r3")); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("reader TryAcquire beside a writer = %v, want ErrNotAcquired", err)
	}
	if err := wv.Release(ctx, key, "w"); err != nil {
		t.Fatal(err)
	}
}

// TestRWLock_ClusterClient: the read-write lock's keys and its fence
// counter share one hash slot, so its scripts run on Redis Cluster.
func TestRWLock_ClusterClient(t *testing.T) {
	r := testservers.StartRedisCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{r.Addr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	dlocktest.RunRWLock(t, "redis-cluster", func(ctx context.Context) (driver.Driver, error) {
		return New(cc, &Options{ReleaseHints: true}), nil
	})
}
