package redisdriver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// trickyKeys are lock names that need escaping, or look like escapes.
var trickyKeys = []string{
	"plain",
	"a/b/c",
	"with space",
	"colon:separated:key",
	"{",
	"}",
	"{}",
	"}{",
	"{tag}",
	"a{b}c{d}",
	"%",
	"%7B",
	"%7b",
	"%25",
	"%%7D",
	"glob*?[x]\\",
	"émoji 🔒🚀",
	"tab\tnewline\n",
	strings.Repeat("{", 512),
	strings.Repeat("}", 512),
	strings.Repeat("%", 512),
	strings.Repeat("🔒", 128), // 512 bytes
	strings.Repeat("x", 511) + "}",
}

// hashTag is Redis Cluster's hash-tag rule: the text between the first '{'
// and the first '}' after it, when not empty; otherwise the whole key.
func hashTag(k string) string {
	s := strings.IndexByte(k, '{')
	if s < 0 {
		return k
	}
	e := strings.IndexByte(k[s+1:], '}')
	if e <= 0 {
		return k
	}
	return k[s+1 : s+1+e]
}

func newClient(t *testing.T, r *testservers.Redis) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func openDriver(t testing.TB, rawURL string) *Driver {
	t.Helper()
	d, err := Open(t.Context(), rawURL)
	if err != nil {
		t.Fatalf("Open(%q): %v", rawURL, err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func acquire(t testing.TB, d *Driver, key, owner string, ttl time.Duration) uint64 {
	t.Helper()
	g, err := d.TryAcquire(t.Context(), driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl, Holder: "holder of " + owner})
	if err != nil {
		t.Fatalf("TryAcquire(%q, %s): %v", key, owner, err)
	}
	if g.Fence == 0 {
		t.Fatalf("TryAcquire(%q): fence 0", key)
	}
	return g.Fence
}

func TestKeys_EscapingIsInjectiveAndTagged(t *testing.T) {
	d := New(nil, nil)
	seen := map[string]string{}
	for _, k := range trickyKeys {
		lock, fence, channel := d.keys(k)
		for _, rk := range []string{lock, channel, d.legacyFenceKey(k)} {
			if got := hashTag(rk); got != escape(k) {
				t.Errorf("key %q: Redis name %q has hash tag %q, want %q", k, rk, got, escape(k))
			}
		}
		// The shared counter has its own tag, in the lock's slot.
		if slot(hashTag(fence)) != slot(hashTag(lock)) || !strings.HasSuffix(fence, "}:fences") {
			t.Errorf("key %q: counter %q (slot %d) not in the slot of %q (%d)", k, fence, slot(hashTag(fence)), lock, slot(hashTag(lock)))
		}
		if !strings.HasPrefix(lock, "dlock:{") {
			t.Errorf("key %q: lock %q is not under the default prefix", k, lock)
		}
		if prev, dup := seen[lock]; dup {
			t.Errorf("keys %q and %q share the lock name %q", prev, k, lock)
		}
		seen[lock] = k
		if back, ok := d.keyOfLock(lock); !ok || back != k {
			t.Errorf("keyOfLock(%q) = %q, %v; want %q", lock, back, ok, k)
		}
	}
	// A prefix with braces is escaped too, so the tag stays the key's.
	p := New(nil, &Options{Prefix: "app{1}"})
	lock, fence, _ := p.keys("k{")
	if hashTag(lock) != "k%7B" || slot(hashTag(fence)) != slot("k%7B") || !strings.HasPrefix(fence, "app%7B1%7D:{") {
		t.Errorf("prefix app{1}: lock %q fence %q, want hash tag k%%7B and its slot", lock, fence)
	}
	if _, ok := p.keyOfLock(lock); !ok {
		t.Errorf("keyOfLock(%q) rejected its own lock name", lock)
	}
}

func TestDriver_FenceStrictlyIncreasing(t *testing.T) {
	r := testservers.StartRedis(t)
	a, b := openDriver(t, r.URL()), openDriver(t, r.URL())
	const key = "fence/key"
	var last uint64
	for i := range 50 {
		d, owner := a, fmt.Sprintf("a%032d", i)
		if i%2 == 1 {
			d, owner = b, fmt.Sprintf("b%032d", i)
		}
		f := acquire(t, d, key, owner, time.Second)
		if f <= last {
			t.Fatalf("grant %d: fence %d not greater than %d", i, f, last)
		}
		last = f
		if err := d.Release(t.Context(), key, owner); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	// After an expiry, not a release.
	acquire(t, a, key, "expiring", 100*time.Millisecond)
	time.Sleep(250 * time.Millisecond)
	if f := acquire(t, b, key, "after-expiry", time.Second); f <= last+1 {
		t.Fatalf("fence after expiry %d, want > %d", f, last+1)
	}
	// A key whose slot's counter was never used starts at 1.
	if f := acquire(t, a, "fence/other", "o", time.Second); f != 1 {
		t.Fatalf("first fence of a new key = %d, want 1", f)
	}
}

func TestDriver_FenceSurvivesRestart(t *testing.T) {
	r := testservers.StartRedis(t)
	d := openDriver(t, r.URL())
	const key = "restart/key"
	f1 := acquire(t, d, key, "before", 10*time.Second)
	if err := r.Stop(); err != nil { // SIGTERM: Redis flushes its AOF
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(t.Context(), driver.AcquireRequest{Key: key, Owner: "down", TTL: time.Second}); err == nil ||
		errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire with the server down = %v, want a store error", err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	// The grant survived the restart too.
	if _, err := d.TryAcquire(t.Context(), driver.AcquireRequest{Key: key, Owner: "other", TTL: time.Second}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire after restart on a held key = %v, want ErrNotAcquired", err)
	}
	if err := d.Release(t.Context(), key, "before"); err != nil {
		t.Fatalf("Release after restart: %v", err)
	}
	if f2 := acquire(t, d, key, "after", time.Second); f2 <= f1 {
		t.Fatalf("fence after restart %d, want > %d", f2, f1)
	}
}

func TestDriver_OwnerCheckedRenewRelease(t *testing.T) {
	r := testservers.StartRedis(t)
	a, b := openDriver(t, r.URL()), openDriver(t, r.URL())
	ctx := t.Context()
	for _, key := range []string{"owner/key", "{", "émoji 🔒"} {
		f := acquire(t, a, key, "ownerA", 5*time.Second)
		if _, err := b.TryAcquire(ctx, driver.AcquireRequest{Key: key, Owner: "ownerB", TTL: time.Second}); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("%q: TryAcquire of a held key = %v, want ErrNotAcquired", key, err)
		}
		if err := b.Renew(ctx, key, "ownerB", time.Second); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("%q: Renew by a non-owner = %v, want ErrLeaseLost", key, err)
		}
		if err := b.Release(ctx, key, "ownerB"); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("%q: Release by a non-owner = %v, want ErrLeaseLost", key, err)
		}
		info, err := b.Inspect(ctx, key)
		if err != nil || info.Fence != f || info.TTL != 5*time.Second {
			t.Fatalf("%q: after foreign renew/release, Inspect = %+v, %v; want fence %d, TTL 5s", key, info, err, f)
		}
		// The same owner asking again gets the same grant (a retried attempt).
		if g, err := a.TryAcquire(ctx, driver.AcquireRequest{Key: key, Owner: "ownerA", TTL: 5 * time.Second}); err != nil || g.Fence != f {
			t.Fatalf("%q: repeated TryAcquire by the owner = %+v, %v; want fence %d", key, g, err, f)
		}
		if err := a.Renew(ctx, key, "ownerA", 7*time.Second); err != nil {
			t.Fatalf("%q: Renew by the owner: %v", key, err)
		}
		if info, err := b.Inspect(ctx, key); err != nil || info.TTL != 7*time.Second || info.Remaining <= 5*time.Second {
			t.Fatalf("%q: after renewal to 7s, Inspect = %+v, %v", key, info, err)
		}
		if err := a.Release(ctx, key, "ownerA"); err != nil {
			t.Fatalf("%q: Release by the owner: %v", key, err)
		}
		if err := a.Release(ctx, key, "ownerA"); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("%q: second Release = %v, want ErrLeaseLost", key, err)
		}
		if err := a.Renew(ctx, key, "ownerA", time.Second); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("%q: Renew after Release = %v, want ErrLeaseLost", key, err)
		}
		// A lapsed owner cannot renew or release its successor's grant.
		acquire(t, a, key, "lapsed", 100*time.Millisecond)
		time.Sleep(200 * time.Millisecond)
		f2 := acquire(t, b, key, "successor", 5*time.Second)
		if err := a.Renew(ctx, key, "lapsed", time.Second); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("%q: Renew by a lapsed owner = %v, want ErrLeaseLost", key, err)
		}
		if err := a.Release(ctx, key, "lapsed"); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("%q: Release by a lapsed owner = %v, want ErrLeaseLost", key, err)
		}
		if info, err := a.Inspect(ctx, key); err != nil || info.Fence != f2 || info.Holder != "holder of successor" {
			t.Fatalf("%q: successor's grant after the lapsed owner's calls: %+v, %v", key, info, err)
		}
		if err := b.Release(ctx, key, "successor"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestKeys_TrickyKeysOnRedis(t *testing.T) {
	r := testservers.StartRedis(t)
	d := openDriver(t, r.URL())
	c := newClient(t, r)
	ctx := t.Context()
	fences := map[string]uint64{}
	for i, k := range trickyKeys {
		fences[k] = acquire(t, d, k, fmt.Sprintf("owner%d", i), 10*time.Second)
	}
	// Distinct names never share a grant: one hash per name, and one
	// shared counter per hash slot used, nothing else.
	counters := map[string]bool{}
	for k, f := range fences {
		if f == 0 {
			t.Errorf("key %q: fence 0", k)
		}
		_, fence, _ := d.keys(k)
		counters[fence] = true
	}
	n, err := c.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len(trickyKeys) + len(counters)); n != want {
		t.Errorf("DBSIZE = %d, want %d", n, want)
	}
	for i, k := range trickyKeys {
		info, err := d.Inspect(ctx, k)
		if err != nil || info.Key != k || info.Holder != fmt.Sprintf("holder of owner%d", i) {
			t.Errorf("Inspect(%q) = %+v, %v", k, info, err)
		}
	}
	list, err := d.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, info := range list {
		got = append(got, info.Key)
	}
	want := slices.Clone(trickyKeys)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("List(\"\") keys =\n%q\nwant\n%q", got, want)
	}
	for i, k := range trickyKeys {
		if err := d.Release(ctx, k, fmt.Sprintf("owner%d", i)); err != nil {
			t.Errorf("Release(%q): %v", k, err)
		}
	}
}

func TestDriver_PrefixKeepsApplicationDataApart(t *testing.T) {
	r := testservers.StartRedis(t)
	c := newClient(t, r)
	ctx := t.Context()
	// The application's own keys, named like the lock and like our keys
	// without the prefix.
	for _, k := range []string{"orders", "{orders}:lock", "{orders}:fence"} {
		if err := c.Set(ctx, k, "app data", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	d := openDriver(t, r.URL())
	other := openDriver(t, r.URL()+"?prefix=other%7Bns%7D&hints=false")
	f := acquire(t, d, "orders", "o1", time.Second)
	// Another prefix is another namespace: same name, separate lock.
	if g := acquire(t, other, "orders", "o2", time.Second); g != 1 || f != 1 {
		t.Fatalf("fences %d and %d, want 1 and 1 (separate namespaces)", f, g)
	}
	for _, k := range []string{"orders", "{orders}:lock", "{orders}:fence"} {
		if v, err := c.Get(ctx, k).Result(); err != nil || v != "app data" {
			t.Fatalf("application key %q = %q, %v", k, v, err)
		}
	}
	_, counter, _ := d.keys("orders")
	if n, err := c.Exists(ctx, "dlock:{orders}:lock", counter, "other%7Bns%7D:{orders}:lock").Result(); err != nil || n != 3 {
		t.Fatalf("EXISTS of the namespaced keys = %d, %v; want 3", n, err)
	}
	if err := d.Release(ctx, "orders", "o1"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Inspect(ctx, "orders"); err != nil {
		t.Fatalf("the other namespace's grant is gone: %v", err)
	}
	if _, _, err := other.Hint(ctx, "orders"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Hint with hints=false = %v, want ErrUnsupported", err)
	}
}

func TestInspector_InspectAndList(t *testing.T) {
	r := testservers.StartRedis(t)
	d := openDriver(t, r.URL())
	ctx := t.Context()
	if _, err := d.Inspect(ctx, "list/free"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect of a free key = %v, want ErrNotAcquired", err)
	}
	held := []string{"list/b", "list/a*", "list/[x]", "list/a", "list/%7B"}
	fences := map[string]uint64{}
	for _, k := range held {
		fences[k] = acquire(t, d, k, fmt.Sprintf("owner-%x", k), 3*time.Second)
	}
	acquire(t, d, "lisT/other", "o", 3*time.Second)
	acquire(t, d, "list-no-slash", "o", 3*time.Second)
	acquire(t, d, "list/gone", "g", 3*time.Second)
	if err := d.Release(ctx, "list/gone", "g"); err != nil {
		t.Fatal(err)
	}
	// Another namespace in the same database is not listed.
	other := New(newClient(t, r), &Options{Prefix: "else"})
	acquire(t, other, "list/elsewhere", "o", 3*time.Second)

	infos, err := d.List(ctx, "list/")
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(held)
	slices.Sort(want)
	if len(infos) != len(want) {
		t.Fatalf("List(list/) = %+v, want keys %q", infos, want)
	}
	for i, info := range infos {
		if info.Key != want[i] || info.Fence != fences[info.Key] || info.Holder != fmt.Sprintf("holder of owner-%x", info.Key) ||
			info.TTL != 3*time.Second || info.Remaining <= 0 || info.Remaining > 3*time.Second || info.Waiters != 0 {
			t.Errorf("List[%d] = %+v; want key %q fence %d", i, info, want[i], fences[want[i]])
		}
	}
	// Glob characters in the namespace are literal too.
	globNS, plainNS := New(newClient(t, r), &Options{Prefix: "n?[s]*"}), New(newClient(t, r), &Options{Prefix: "nx[s]zz"})
	acquire(t, globNS, "k1", "o", 3*time.Second)
	acquire(t, plainNS, "k2", "o", 3*time.Second)
	if infos, err := globNS.List(ctx, ""); err != nil || len(infos) != 1 || infos[0].Key != "k1" {
		t.Errorf("List in namespace n?[s]* = %+v, %v; want only k1", infos, err)
	}
	// Glob characters in the prefix are literal.
	for prefix, wantKeys := range map[string][]string{
		"list/[": {"list/[x]"},
		"list/a": {"list/a", "list/a*"},
		"list/*": nil,
		"list/%": {"list/%7B"},
		"list/{": nil,
	} {
		infos, err := d.List(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, info := range infos {
			got = append(got, info.Key)
		}
		if !slices.Equal(got, wantKeys) {
			t.Errorf("List(%q) = %q, want %q", prefix, got, wantKeys)
		}
	}
}

func TestHinter_HintArrivesOnRelease(t *testing.T) {
	r := testservers.StartRedis(t)
	holder, waiter := openDriver(t, r.URL()), openDriver(t, r.URL())
	ctx := t.Context()
	const key = "hint/{key} 🔔"
	acquire(t, holder, key, "h", 10*time.Second)

	hints, stop, err := waiter.Hint(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	otherHints, stopOther, err := waiter.Hint(ctx, "hint/other")
	if err != nil {
		t.Fatal(err)
	}
	defer stopOther()
	// A second subscriber of the same key shares the subscription.
	hints2, stop2, err := waiter.Hint(ctx, key)
	if err != nil {
		t.Fatal(err)
	}

	// A refused release publishes nothing.
	if err := holder.Release(ctx, key, "not-the-owner"); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatal(err)
	}
	select {
	case <-hints:
		t.Fatal("hint after a refused release")
	case <-time.After(100 * time.Millisecond):
	}

	if err := holder.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	for i, ch := range []<-chan struct{}{hints, hints2} {
		select {
		case <-ch:
		case <-time.After(2 * time.Second):
			t.Fatalf("subscriber %d: no hint within 2s of the release", i)
		}
	}
	select {
	case <-otherHints:
		t.Fatal("a hint for another key")
	case <-time.After(50 * time.Millisecond):
	}

	// After stop, the subscriber gets nothing; the other one still does.
	stop2()
	stop2() // idempotent
	acquire(t, holder, key, "h2", 10*time.Second)
	if err := holder.Release(ctx, key, "h2"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hints:
	case <-time.After(2 * time.Second):
		t.Fatal("no hint for the remaining subscriber")
	}
	select {
	case <-hints2:
		t.Fatal("hint after stop")
	case <-time.After(50 * time.Millisecond):
	}
}

// TestHinter_AcquireWokenByHint checks, through the root package, that a
// waiter asleep in its backoff takes the key within a second of its
// release. The backoff is an hour (its full-jitter sleep is uniform in
// [0, 1 h), so it ends within a second about once in 3600 runs), and the
// release waits until the waiter has found the key held and subscribed to
// its hint channel: only the hint can wake it in time.
func TestHinter_AcquireWokenByHint(t *testing.T) {
	r := testservers.StartRedis(t)
	a := dlock.New(openDriver(t, r.URL()), dlock.WithTTL(10*time.Second))
	bd := openDriver(t, r.URL())
	b := dlock.New(bd, dlock.WithTTL(10*time.Second), dlock.WithBackoff(time.Hour, time.Hour))
	defer a.Close()
	defer b.Close()
	const key = "hint/acquire"
	held, err := a.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	awaitSubscribers(t, r, bd, key, 1) // the holder's recheck watch
	type result struct {
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	wctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // ends the waiter when the test fails first
	wg.Go(func() {
		ls, err := b.Acquire(wctx, key)
		got <- result{time.Now(), err}
		if err == nil {
			_ = ls.Release(context.Background())
		}
	})
	awaitHintSubscribers(t, r, bd, key)
	released := time.Now()
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-got:
		if res.err != nil {
			t.Fatalf("waiter: %v", res.err)
		}
		if wait := res.at.Sub(released); wait > time.Second {
			t.Fatalf("waiter took the key %v after its release; a hint should wake it at once", wait)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not granted within 5s of the release: the hint did not wake it")
	}
}

// awaitHintSubscribers waits (at most 10 s) until a waiter through d that
// has found key held is subscribed to the channel on which it is woken
// (PUBSUB NUMSUB): d's wake channel, where a release that hands it the key
// publishes (wait.go), so a release from now on reaches it.
func awaitHintSubscribers(t *testing.T, r *testservers.Redis, d *Driver, key string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	_, _, keyChannel := d.keys(key)
	channel := d.wakeChannel(keyChannel)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := c.PubSubNumSub(t.Context(), channel).Result()
		if err == nil && n[channel] >= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no subscriber on the wake channel %q of %q after 10s (last: %v, %v)", channel, key, n, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHinter_NoGoroutinesOutliveStop checks that the shared pub/sub
// connection and its goroutines end once no subscription has used it for the
// idle period, and on Close.
func TestHinter_NoGoroutinesOutliveStop(t *testing.T) {
	r := testservers.StartRedis(t)
	ignore := goleak.IgnoreCurrent()
	d := openDriver(t, r.URL())
	d.hub.idleClose = 200 * time.Millisecond
	d.hub.lingerFor = 50 * time.Millisecond
	subscribeAll := func() []func() {
		var stops []func()
		for i := range 20 {
			_, stop, err := d.Hint(t.Context(), fmt.Sprintf("leak/%d", i%5))
			if err != nil {
				t.Fatal(err)
			}
			stops = append(stops, stop)
		}
		return stops
	}
	stopAll := func(stops []func()) {
		var wg sync.WaitGroup
		for _, stop := range stops {
			wg.Go(stop)
		}
		wg.Wait()
	}
	stopAll(subscribeAll())
	// Within the idle period the connection is reused.
	d.hub.mu.Lock()
	kept := d.hub.shared
	d.hub.mu.Unlock()
	if kept == nil {
		t.Fatal("shared connection closed at once; want it kept for the idle period")
	}
	stops := subscribeAll()
	d.hub.mu.Lock()
	reused := d.hub.shared == kept
	d.hub.mu.Unlock()
	if !reused {
		t.Fatal("a new connection was opened within the idle period")
	}
	stopAll(stops)
	if err := goleak.Find(ignore); err != nil {
		t.Fatalf("after the idle period: %v", err)
	}
	// Close ends live subscriptions too.
	for i := range 3 {
		if _, _, err := d.Hint(t.Context(), fmt.Sprintf("leak/%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Hint(t.Context(), "leak/x"); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Hint after Close = %v, want ErrClosed", err)
	}
	if err := goleak.Find(ignore); err != nil {
		t.Fatalf("after Close: %v", err)
	}
}

func TestDriver_NewDoesNotOwnClient(t *testing.T) {
	r := testservers.StartRedis(t)
	c := newClient(t, r)
	d := New(c, nil)
	acquire(t, d, "own/k", "o", time.Second)
	if _, _, err := d.Hint(t.Context(), "own/k"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Hint with zero Options = %v, want ErrUnsupported", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := d.TryAcquire(t.Context(), driver.AcquireRequest{Key: "own/k2", Owner: "o", TTL: time.Second}); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("TryAcquire after Close = %v, want ErrClosed", err)
	}
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("the caller's client was closed by the driver: %v", err)
	}
}

func TestOpen_URL(t *testing.T) {
	for _, scheme := range []string{"redis", "rediss"} {
		if _, err := driver.Lookup(scheme); err != nil {
			t.Errorf("scheme %q not registered: %v", scheme, err)
		}
	}
	// An unreachable server fails Open at once.
	port := testservers.FreePort(t)
	began := time.Now()
	_, err := Open(t.Context(), fmt.Sprintf("redis://127.0.0.1:%d", port))
	if !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("Open of a closed port = %v, want ErrUnavailable", err)
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Fatalf("Open of a closed port took %v", d)
	}
	_, err = dlock.Open(t.Context(), fmt.Sprintf("redis://127.0.0.1:%d", port))
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("dlock.Open of a closed port = %v, want ErrUnavailable", err)
	}
	if _, err := Open(t.Context(), "redis://127.0.0.1:1?hints=maybe"); err == nil {
		t.Fatal("hints=maybe accepted")
	}

	r := testservers.StartRedis(t)
	u, _ := url.Parse(r.URL() + "/3?prefix=p&dial_timeout=2s")
	d, err := OpenURL(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	acquire(t, d, "url/k", "o", time.Second)
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), DB: 3})
	defer c.Close()
	if n, err := c.Exists(t.Context(), "p:{url/k}:lock").Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS p:{url/k}:lock in db 3 = %d, %v", n, err)
	}

	// Through the root package, by URL.
	l, err := dlock.Open(t.Context(), r.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ls, err := l.Acquire(t.Context(), "url/root", dlock.WithTTL(time.Second), dlock.WithHolder("test"))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := l.Inspect(t.Context(), "url/root"); err != nil || info.Fence != ls.Fence() || info.Holder != "test" {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	if err := ls.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestDriver_ContextBoundsCalls(t *testing.T) {
	r := testservers.StartRedis(t)
	d := openDriver(t, r.URL())
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: "ctx/k", Owner: "o", TTL: time.Second}); !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire with a cancelled context = %v, want context.Canceled", err)
	}
	// A server that stops answering (DEBUG SLEEP) is bounded by the deadline.
	c := newClient(t, r)
	go func() { _ = c.Do(context.Background(), "DEBUG", "SLEEP", "1").Err() }()
	time.Sleep(50 * time.Millisecond)
	dctx, dcancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer dcancel()
	began := time.Now()
	_, err := d.TryAcquire(dctx, driver.AcquireRequest{Key: "ctx/k", Owner: "o", TTL: time.Second})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire against a sleeping server = %v, want an error matching context.DeadlineExceeded", err)
	}
	if took := time.Since(began); took > 500*time.Millisecond {
		t.Fatalf("TryAcquire took %v past its 100ms deadline", took)
	}
}

// TestDriver_ClusterClient runs the driver over a *redis.ClusterClient on a
// one-node Redis Cluster, where a script whose keys are in different slots
// fails with CROSSSLOT: it proves that a lock and its counter share a slot.
func TestDriver_ClusterClient(t *testing.T) {
	r := testservers.StartRedisCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{r.Addr()}, ContextTimeoutEnabled: true})
	defer cc.Close()
	d := New(cc, &Options{ReleaseHints: true})
	defer d.Close()
	ctx := t.Context()
	for i, k := range trickyKeys {
		lock, fence, _ := d.keys(k)
		s1, err1 := cc.ClusterKeySlot(ctx, lock).Result()
		s2, err2 := cc.ClusterKeySlot(ctx, fence).Result()
		s3, err3 := cc.ClusterKeySlot(ctx, d.legacyFenceKey(k)).Result()
		if err1 != nil || err2 != nil || err3 != nil || s1 != s2 || s1 != s3 || s1 != int64(slot(escape(k))) {
			t.Fatalf("key %q: slots %d (%v), %d (%v) and %d (%v); computed %d", k, s1, err1, s2, err2, s3, err3, slot(escape(k)))
		}
		owner := fmt.Sprintf("o%d", i)
		acquire(t, d, k, owner, 5*time.Second)
		if err := d.Renew(ctx, k, owner, 5*time.Second); err != nil {
			t.Fatalf("Renew(%q): %v", k, err)
		}
	}
	infos, err := d.List(ctx, "")
	if err != nil || len(infos) != len(trickyKeys) {
		t.Fatalf("List over the cluster = %d infos, %v; want %d", len(infos), err, len(trickyKeys))
	}
	hints, stop, err := d.Hint(ctx, trickyKeys[0])
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for i, k := range trickyKeys {
		if err := d.Release(ctx, k, fmt.Sprintf("o%d", i)); err != nil {
			t.Fatalf("Release(%q): %v", k, err)
		}
	}
	select {
	case <-hints:
	case <-time.After(2 * time.Second):
		t.Fatal("no release hint on the cluster")
	}
}

// TestDriver_Ring runs the driver over a *redis.Ring of two independent
// servers: each lock lives on the shard of its hash tag, List visits every
// shard, and release hints come from each key's own shard.
func TestDriver_Ring(t *testing.T) {
	rs := testservers.StartRedisN(t, 2)
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:                 map[string]string{"a": rs[0].Addr(), "b": rs[1].Addr()},
		ContextTimeoutEnabled: true,
	})
	defer ring.Close()
	d := New(ring, &Options{ReleaseHints: true})
	defer d.Close()
	ctx := t.Context()
	const n = 40
	var keys []string
	for i := range n {
		k := fmt.Sprintf("ring/{%02d}", i)
		keys = append(keys, k)
		acquire(t, d, k, "o", 10*time.Second)
	}
	// Both shards hold locks, and each lock's fence counter is on its
	// lock's shard (the script runs on the shard of its first key).
	for _, r := range rs {
		c := newClient(t, r)
		size, err := c.DBSize(ctx).Result()
		if err != nil || size == 0 {
			t.Fatalf("shard %s: DBSIZE %d, %v; want > 0", r.Addr(), size, err)
		}
		for _, k := range keys {
			lock, fence, _ := d.keys(k)
			held, err1 := c.Exists(ctx, lock).Result()
			counted, err2 := c.Exists(ctx, fence).Result()
			if err1 != nil || err2 != nil || held == 1 && counted != 1 {
				t.Fatalf("shard %s holds %q (%d, %v) without its counter %q (%d, %v)", r.Addr(), lock, held, err1, fence, counted, err2)
			}
		}
	}
	infos, err := d.List(ctx, "ring/")
	if err != nil || len(infos) != n {
		t.Fatalf("List over the ring = %d infos, %v; want %d", len(infos), err, n)
	}
	for i, info := range infos {
		if info.Key != keys[i] {
			t.Fatalf("List[%d] = %q, want %q", i, info.Key, keys[i])
		}
	}
	// Hints for keys on both shards.
	var chans []<-chan struct{}
	for _, k := range keys[:6] {
		ch, stop, err := d.Hint(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		chans = append(chans, ch)
	}
	for i, k := range keys[:6] {
		if err := d.Release(ctx, k, "o"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-chans[i]:
		case <-time.After(2 * time.Second):
			t.Fatalf("no release hint for %q on the ring", k)
		}
	}
}

// TestDriver_FenceSurvivesCrashAfterFsync kills redis-server with SIGKILL
// (a crash) more than a second after the last grant: with appendfsync
// everysec the counter has reached the disk, so fences keep increasing.
// (Within that second they may not: see the package doc.)
func TestDriver_FenceSurvivesCrashAfterFsync(t *testing.T) {
	r := testservers.StartRedis(t)
	d := openDriver(t, r.URL())
	const key = "crash/key"
	var last uint64
	for i := range 5 {
		owner := fmt.Sprintf("o%d", i)
		last = acquire(t, d, key, owner, time.Second)
		if err := d.Release(t.Context(), key, owner); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2500 * time.Millisecond) // past the everysec fsync
	r.Kill()
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	if f := acquire(t, d, key, "after-crash", time.Second); f <= last {
		t.Fatalf("fence after a crash %d, want > %d", f, last)
	}
}

// TestHinter_StoreRestart checks hints across a store outage: a waiter
// subscribed to hints fails closed when the store goes down, nothing
// lingers after Close, and hints work again once the store is back.
func TestHinter_StoreRestart(t *testing.T) {
	r := testservers.StartRedis(t)
	ignore := goleak.IgnoreCurrent()
	func() {
		a := dlock.New(openDriver(t, r.URL()), dlock.WithTTL(10*time.Second))
		bd := openDriver(t, r.URL())
		b := dlock.New(bd, dlock.WithTTL(10*time.Second), dlock.WithOpTimeout(time.Second))
		defer a.Close()
		defer b.Close()
		const key = "hint/restart"
		if _, err := a.Acquire(t.Context(), key); err != nil {
			t.Fatal(err)
		}
		awaitSubscribers(t, r, bd, key, 1) // the holder's recheck watch
		done := make(chan error, 1)
		go func() {
			// No retry budget: the waiter reports the outage at its
			// first store error (by default it would retry until its ctx
			// ends).
			_, err := b.Acquire(t.Context(), key, dlock.WithRetryFor(0))
			done <- err
		}()
		// b has found the key held and waits, subscribed to hints.
		awaitHintSubscribers(t, r, bd, key)
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, dlock.ErrUnavailable) {
				t.Fatalf("waiter with the store down = %v, want ErrUnavailable", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("waiter did not fail within 5s of the store going down")
		}
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		// Hints work again on the same driver.
		d := b.Driver().(*Driver)
		ch, stop, err := d.Hint(t.Context(), "hint/after")
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		ad := a.Driver().(*Driver)
		acquire(t, ad, "hint/after", "o", time.Second)
		if err := ad.Release(t.Context(), "hint/after", "o"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
		case <-time.After(2 * time.Second):
			t.Fatal("no hint after the store came back")
		}
	}()
	// The restarted redis-server's process waiter is the test's own.
	if err := goleak.Find(ignore, goleak.IgnoreAnyFunction("github.com/dlock-dev/dlock/internal/testservers.StartProcess.func1")); err != nil {
		t.Fatalf("goroutines left after Close: %v", err)
	}
}
