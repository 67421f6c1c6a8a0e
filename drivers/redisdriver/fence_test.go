package redisdriver

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestKeys_SlotTags checks the slot function against Redis Cluster's
// specification and the counter table: every slot has its own counter,
// whose tag hashes to that slot.
func TestKeys_SlotTags(t *testing.T) {
	// The specification's CRC16 check value, and a slot Redis documents.
	if got := slot("123456789"); got != 0x31C3&(FenceCounters-1) {
		t.Errorf("slot(123456789) = %d, want %d", got, 0x31C3&(FenceCounters-1))
	}
	if got := slot("foo"); got != 12182 {
		t.Errorf("slot(foo) = %d, want 12182", got)
	}
	d := New(nil, nil)
	names := map[string]bool{}
	for s := range FenceCounters {
		name := d.counterKey(uint16(s))
		if got := slot(hashTag(name)); got != uint16(s) {
			t.Fatalf("counter %q of slot %d is in slot %d", name, s, got)
		}
		names[name] = true
	}
	if len(names) != FenceCounters {
		t.Fatalf("%d distinct counter names, want %d", len(names), FenceCounters)
	}
}

// sameSlot returns n lock names that share a hash slot (so a fence
// counter), found among names made by format.
func sameSlot(t *testing.T, n int, format string) []string {
	t.Helper()
	bySlot := map[uint16][]string{}
	for i := 0; i < 1_000_000; i++ {
		k := fmt.Sprintf(format, i)
		s := slot(escape(k))
		bySlot[s] = append(bySlot[s], k)
		if len(bySlot[s]) == n {
			return bySlot[s]
		}
	}
	t.Fatalf("no %d names of %q share a slot", n, format)
	return nil
}

// TestFence_IncreasingWithSharedCounters checks that every key's fences
// strictly increase across release/acquire cycles, expiries and a
// redis-server restart (AOF), also when keys share a counter: their fences
// then interleave, and are never equal.
func TestFence_IncreasingWithSharedCounters(t *testing.T) {
	r := testservers.StartRedis(t)
	a, b := openDriver(t, r.URL()), openDriver(t, r.URL())
	keys := append(sameSlot(t, 3, "shared/{%d} 🔒"), "alone/1", "alone/2")
	last := map[string]uint64{}
	seen := map[uint64]string{} // fences of the shared slot
	shared := map[string]bool{keys[0]: true, keys[1]: true, keys[2]: true}
	cycle := func(round int) {
		t.Helper()
		for i, k := range keys {
			d, owner := a, fmt.Sprintf("a-%d-%d", round, i)
			if (round+i)%2 == 1 {
				d, owner = b, fmt.Sprintf("b-%d-%d", round, i)
			}
			f := acquire(t, d, k, owner, time.Minute)
			if f <= last[k] {
				t.Fatalf("round %d: %q got fence %d after %d", round, k, f, last[k])
			}
			last[k] = f
			if shared[k] {
				if other, dup := seen[f]; dup {
					t.Fatalf("fence %d issued to %q and %q, which share a counter", f, other, k)
				}
				seen[f] = k
			}
			if err := d.Release(t.Context(), k, owner); err != nil {
				t.Fatal(err)
			}
		}
	}
	for round := range 10 {
		cycle(round)
	}
	// An expiry instead of a release.
	acquire(t, a, keys[0], "expiring", 100*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		g, err := b.TryAcquire(t.Context(), driver.AcquireRequest{Key: keys[0], Owner: "after-expiry", TTL: time.Minute})
		if err == nil {
			if g.Fence <= last[keys[0]]+1 {
				t.Fatalf("fence after an expiry %d, want > %d", g.Fence, last[keys[0]]+1)
			}
			last[keys[0]] = g.Fence
			if err := b.Release(t.Context(), keys[0], "after-expiry"); err != nil {
				t.Fatal(err)
			}
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("TryAcquire after the TTL: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A restart: SIGTERM makes Redis write its AOF, which it replays.
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	for round := 10; round < 20; round++ {
		cycle(round)
	}
}

// legacyAcquireScript is the acquire script of versions before the shared
// counters (one INCR'd counter per lock name), to write a data set as they
// did. Their renew and release scripts are the current ones.
var legacyAcquireScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur then
  if cur == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('HSET', KEYS[1], 'ttl', ARGV[2])
    return tonumber(redis.call('HGET', KEYS[1], 'fence'))
  end
  return 0
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence, 'holder', ARGV[3], 'ttl', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
`)

// TestFence_UpgradeFromPerKeyCounters writes a data set with the per-key
// counters of earlier versions (a lock still held by an old client
// included), then upgrades: the old lock still excludes, the next
// acquisition of each key folds its old counter into the shared one
// (whichever is larger) and deletes it, MigrateFenceCounters folds the
// rest, and no key's fence goes back.
func TestFence_UpgradeFromPerKeyCounters(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(testservers.TB) *testservers.Redis
		open  func(*testservers.Redis) Client
	}{
		{"Node", testservers.StartRedis, func(r *testservers.Redis) Client {
			return redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
		}},
		{"Cluster", testservers.StartRedisCluster, func(r *testservers.Redis) Client {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{r.Addr()}, ContextTimeoutEnabled: true})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.start(t)
			c := tc.open(r)
			defer c.(interface{ Close() error }).Close()
			d := New(c, nil)
			ctx := t.Context()
			raw := newClient(t, r)

			oldFences := map[string]uint64{}
			oldAcquire := func(key, owner string) {
				t.Helper()
				lock, _, _ := d.keys(key)
				f, err := legacyAcquireScript.Run(ctx, c, []string{lock, d.legacyFenceKey(key)}, owner, 60000, "old").Int64()
				if err != nil || f <= 0 {
					t.Fatalf("old acquire of %q = %d, %v", key, f, err)
				}
				oldFences[key] = uint64(f)
			}
			oldCycles := func(key string, n int) {
				t.Helper()
				for i := range n {
					owner := fmt.Sprintf("old-%d", i)
					oldAcquire(key, owner)
					if err := d.Release(ctx, key, owner); err != nil {
						t.Fatal(err)
					}
				}
			}
			// b shares its slot with e, whose shared counter will be ahead
			// of b's old one; a's old counter is ahead of its shared one.
			be := sameSlot(t, 2, "legacy/b{%d}")
			keyA, keyB, keyE := "legacy/a", be[0], be[1]
			keyHeld, keyF := "legacy/{held}", "legacy/f 🔒*?[x]"
			oldCycles(keyA, 7)
			oldCycles(keyB, 3)
			oldCycles(keyF, 5)
			oldAcquire(keyHeld, "old-holder")
			// The application's own keys, named like counters, are not ours.
			appKeys := []string{"{orders}:fence", "other:{orders}:fence", "dlock:{a}b}:fence"}
			for _, k := range appKeys {
				if err := raw.Set(ctx, k, "app data", 0).Err(); err != nil {
					t.Fatal(err)
				}
			}

			// Upgraded clients.
			for i := range 10 {
				acquire(t, d, keyE, fmt.Sprintf("new-e-%d", i), time.Minute)
				if err := d.Release(ctx, keyE, fmt.Sprintf("new-e-%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: keyHeld, Owner: "new", TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("TryAcquire of a lock held by an old client = %v, want ErrNotAcquired", err)
			}
			if err := d.Release(ctx, keyHeld, "old-holder"); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{keyA, keyB, keyHeld} {
				f := acquire(t, d, k, "new", time.Minute)
				if f <= oldFences[k] {
					t.Fatalf("%q: fence %d after the upgrade, want > %d (its old counter)", k, f, oldFences[k])
				}
				if n, err := raw.Exists(ctx, d.legacyFenceKey(k)).Result(); err != nil || n != 0 {
					t.Fatalf("%q: old counter left after an acquisition folded it: %d, %v", k, n, err)
				}
				if err := d.Release(ctx, k, "new"); err != nil {
					t.Fatal(err)
				}
			}

			// The operator's clean-up folds what no acquisition did.
			n, err := d.MigrateFenceCounters(ctx)
			if err != nil || n != 1 {
				t.Fatalf("MigrateFenceCounters = %d, %v; want 1 (%q)", n, err, keyF)
			}
			if n, err := raw.Exists(ctx, d.legacyFenceKey(keyF)).Result(); err != nil || n != 0 {
				t.Fatalf("old counter of %q left after the migration: %d, %v", keyF, n, err)
			}
			if f := acquire(t, d, keyF, "new", time.Minute); f <= oldFences[keyF] {
				t.Fatalf("%q: fence %d after the migration, want > %d", keyF, f, oldFences[keyF])
			}
			if n, err := d.MigrateFenceCounters(ctx); err != nil || n != 0 {
				t.Fatalf("second MigrateFenceCounters = %d, %v; want 0", n, err)
			}
			for _, k := range appKeys {
				if v, err := raw.Get(ctx, k).Result(); err != nil || v != "app data" {
					t.Fatalf("application key %q = %q, %v", k, v, err)
				}
			}
			keys, err := raw.Keys(ctx, "dlock:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if strings.HasSuffix(k, "}:fence") && k != "dlock:{a}b}:fence" {
					t.Errorf("old counter %q left", k)
				}
			}
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := d.MigrateFenceCounters(ctx); !errors.Is(err, driver.ErrClosed) {
				t.Fatalf("MigrateFenceCounters after Close = %v, want ErrClosed", err)
			}
		})
	}
}
