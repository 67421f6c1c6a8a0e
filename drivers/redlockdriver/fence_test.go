package redlockdriver_test

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/redlockdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// sharingCounter returns n lock names, made by format, that draw their
// fences from the same shared counter.
func sharingCounter(t *testing.T, d *redlockdriver.Driver, n int, format string) []string {
	t.Helper()
	byCounter := map[string][]string{}
	for i := range 1_000_000 {
		k := fmt.Sprintf(format, i)
		c := d.FenceCounterKey(k)
		byCounter[c] = append(byCounter[c], k)
		if len(byCounter[c]) == n {
			return byCounter[c]
		}
	}
	t.Fatalf("no %d names of %q share a counter", n, format)
	return nil
}

// TestFence_IncreasingWithSharedCounters checks that every key's fences
// strictly increase across release/acquire cycles, by two clients, and
// across a restart of every node (AOF), also for keys that share a
// counter, whose fences interleave and are never equal.
func TestFence_IncreasingWithSharedCounters(t *testing.T) {
	rs := testservers.StartRedisN(t, 3)
	a, b := openDriver(t, redlockURL(rs)), openDriver(t, redlockURL(rs))
	ctx := t.Context()
	shared := sharingCounter(t, a, 3, "shared/%d")
	keys := append(shared, "alone/1", "alone/2")
	last := map[string]uint64{}
	seen := map[uint64]string{}
	cycle := func(round int) {
		t.Helper()
		for i, k := range keys {
			d := a
			if (round+i)%2 == 1 {
				d = b
			}
			r := req(k, time.Minute)
			g, err := d.TryAcquire(ctx, r)
			if err != nil {
				t.Fatalf("round %d: TryAcquire(%q): %v", round, k, err)
			}
			if g.Fence <= last[k] {
				t.Fatalf("round %d: %q got fence %d after %d", round, k, g.Fence, last[k])
			}
			last[k] = g.Fence
			if i < len(shared) {
				if other, dup := seen[g.Fence]; dup {
					t.Fatalf("fence %d issued to %q and %q, which share a counter", g.Fence, other, k)
				}
				seen[g.Fence] = k
			}
			if err := d.Release(ctx, k, r.Owner); err != nil {
				t.Fatal(err)
			}
		}
	}
	for round := range 10 {
		cycle(round)
	}
	// SIGTERM makes each node write its AOF, which it replays.
	if err := each(rs, (*testservers.Redis).Stop); err != nil {
		t.Fatal(err)
	}
	if err := each(rs, (*testservers.Redis).Start); err != nil {
		t.Fatal(err)
	}
	for round := 10; round < 20; round++ {
		cycle(round)
	}
}

// legacyLockScript and legacyFenceScript are the first and second rounds of
// an acquisition in versions before the shared counters (one counter per
// lock name on each node), to write a data set as they did.
var (
	legacyLockScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif cur ~= ARGV[1] then
  return {0, 0}
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {1, redis.call('INCR', KEYS[2])}
`)
	legacyFenceScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
return 1
`)
)

// TestFence_UpgradeFromPerKeyCounters writes a data set with the per-key
// counters of earlier versions (on every node, on a bare majority, and a
// lock still held by an old client), then upgrades: the old lock still
// excludes, an acquisition folds the old counter of each node it takes
// into the shared one (whichever is larger) and deletes it,
// MigrateFenceCounters folds the rest, and no key's fence goes back.
func TestFence_UpgradeFromPerKeyCounters(t *testing.T) {
	rs := testservers.StartRedisN(t, 3)
	d := openDriver(t, redlockURL(rs))
	ctx := t.Context()
	oldFence := map[string]uint64{}
	// oldGrant acquires key the old way on the given nodes; it releases
	// the grant unless hold.
	oldGrant := func(key string, nodes []int, hold bool) string {
		t.Helper()
		r := req(key, time.Minute)
		keys := []string{"dlock:redlock:lock:" + key, d.LegacyFenceKey(key)}
		var f uint64
		for _, i := range nodes {
			v, err := legacyLockScript.Run(ctx, client(t, rs[i]), keys, r.Owner, 60000).Int64Slice()
			if err != nil || len(v) != 2 || v[0] != 1 {
				t.Fatalf("old acquire of %q on node %d = %v, %v", key, i, v, err)
			}
			f = max(f, uint64(v[1]))
		}
		for _, i := range nodes {
			if err := legacyFenceScript.Run(ctx, client(t, rs[i]), keys, r.Owner, strconv.FormatUint(f, 10)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		oldFence[key] = f
		if !hold {
			if err := d.Release(ctx, key, r.Owner); err != nil {
				t.Fatalf("release of an old grant of %q: %v", key, err)
			}
		}
		return r.Owner
	}
	legacyOn := func(key string) (nodes []int) {
		t.Helper()
		for i, r := range rs {
			n, err := client(t, r).Exists(ctx, d.LegacyFenceKey(key)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				nodes = append(nodes, i)
			}
		}
		return nodes
	}
	all := []int{0, 1, 2}
	const keyA, keyB, keyF, keyHeld = "legacy/a", "legacy/b", "legacy/f *?[x]", "legacy/held"
	for range 4 {
		oldGrant(keyA, all, false)
	}
	for range 6 {
		oldGrant(keyB, []int{0, 1}, false) // node 2 was down: its counter is behind
	}
	for range 5 {
		oldGrant(keyF, all, false)
	}
	oldOwner := oldGrant(keyHeld, all, true)

	if _, err := d.TryAcquire(ctx, req(keyHeld, time.Minute)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a lock held by an old client = %v, want ErrNotAcquired", err)
	}
	if err := d.Release(ctx, keyHeld, oldOwner); err != nil {
		t.Fatal(err)
	}
	newGrant := func(key string) uint64 {
		t.Helper()
		r := req(key, time.Minute)
		g, err := d.TryAcquire(ctx, r)
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", key, err)
		}
		if err := d.Release(ctx, key, r.Owner); err != nil {
			t.Fatal(err)
		}
		return g.Fence
	}
	for _, k := range []string{keyA, keyHeld} {
		if f := newGrant(k); f <= oldFence[k] {
			t.Fatalf("%q: fence %d after the upgrade, want > %d", k, f, oldFence[k])
		}
		if on := legacyOn(k); len(on) != 0 {
			t.Fatalf("%q: old counters left on nodes %v after an acquisition on every node", k, on)
		}
	}
	// b's new majority meets its old one on node 1 alone.
	if err := rs[0].Stop(); err != nil {
		t.Fatal(err)
	}
	fb := newGrant(keyB)
	if fb <= oldFence[keyB] {
		t.Fatalf("%q: fence %d after the upgrade through nodes 1 and 2, want > %d", keyB, fb, oldFence[keyB])
	}
	if err := rs[0].Start(); err != nil {
		t.Fatal(err)
	}
	if on := legacyOn(keyB); len(on) != 1 || on[0] != 0 {
		t.Fatalf("%q: old counters on nodes %v, want on node 0 only (down during the acquisition)", keyB, on)
	}

	// The operator's clean-up folds what no acquisition did: f on every
	// node, b on node 0.
	n, err := d.MigrateFenceCounters(ctx)
	if err != nil || n != 4 {
		t.Fatalf("MigrateFenceCounters = %d, %v; want 4", n, err)
	}
	for _, k := range []string{keyA, keyB, keyF, keyHeld} {
		if on := legacyOn(k); len(on) != 0 {
			t.Fatalf("%q: old counters left on nodes %v after the migration", k, on)
		}
	}
	if f := newGrant(keyF); f <= oldFence[keyF] {
		t.Fatalf("%q: fence %d after the migration, want > %d", keyF, f, oldFence[keyF])
	}
	if f := newGrant(keyB); f <= fb {
		t.Fatalf("%q: fence %d after the migration, want > %d", keyB, f, fb)
	}
	if n, err := d.MigrateFenceCounters(ctx); err != nil || n != 0 {
		t.Fatalf("second MigrateFenceCounters = %d, %v; want 0", n, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.MigrateFenceCounters(ctx); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("MigrateFenceCounters after Close = %v, want ErrClosed", err)
	}
}
