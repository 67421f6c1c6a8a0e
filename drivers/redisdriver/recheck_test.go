package redisdriver

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// awaitSubscribers waits until the key's release channel has at least n
// subscribers on the server (PUBSUB NUMSUB), so a message published next
// reaches them.
func awaitSubscribers(t *testing.T, r *testservers.Redis, d *Driver, key string, n int64) {
	t.Helper()
	c := newClient(t, r)
	_, _, channel := d.keys(key)
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := c.PubSubNumSub(t.Context(), channel).Result()
		if err != nil {
			t.Fatal(err)
		}
		if m[channel] >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("channel %q: %d subscribers after 5s, want %d", channel, m[channel], n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// forceReleaseEnds force-releases key through admin and fails t unless
// lease ls (TTL 30 s, so its next renewal is 10 s away) ends with
// ErrLeaseLost within a second; it returns how long that took.
func forceReleaseEnds(t *testing.T, admin *dlock.Locker, ls *dlock.Lease, key string) time.Duration {
	t.Helper()
	began := time.Now()
	if _, err := admin.ForceRelease(t.Context(), key, "test: holder presumed dead"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ls.Context().Done():
	case <-time.After(time.Second):
		t.Fatalf("lease on %q still held 1s after a force release (TTL 30s): %v", key, ls.Err())
	}
	if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("lease on %q after a force release: %v, want ErrLeaseLost", key, ls.Err())
	}
	return time.Since(began)
}

// TestRecheck_ForceReleaseEndsLeaseAtOnce: a holder whose grant (TTL 30 s,
// so its next renewal is 10 s away) is force-released by another client
// learns of the loss within a second, by the release hint, not at its next
// renewal; a forged hint while the grant is still there renews it and ends
// nothing.
func TestRecheck_ForceReleaseEndsLeaseAtOnce(t *testing.T) {
	r := testservers.StartRedis(t)
	hd := openDriver(t, r.URL())
	holder := dlock.New(hd, dlock.WithTTL(30*time.Second))
	defer holder.Close()
	admin := dlock.New(openDriver(t, r.URL()))
	defer admin.Close()
	c := newClient(t, r)
	ctx := t.Context()

	// A forged hint with the grant still present: the lease renews and
	// stays held.
	const key = "recheck/{forged} 🔔"
	ls, err := holder.Acquire(ctx, key, dlock.WithHolder("holder"))
	if err != nil {
		t.Fatal(err)
	}
	awaitSubscribers(t, r, hd, key, 1)
	lock, _, channel := hd.keys(key)
	time.Sleep(1500 * time.Millisecond) // let the store's TTL run down
	before, err := c.PTTL(ctx, lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, channel, "released").Err(); err != nil {
		t.Fatal(err)
	}
	renewed := false
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if after, err := c.PTTL(ctx, lock).Result(); err == nil && after > before+time.Second {
			renewed = true
			break
		}
	}
	if !renewed {
		t.Fatalf("a hint did not renew the grant within 1s (PTTL was %v before it)", before)
	}
	select {
	case <-ls.Done():
		t.Fatalf("a forged hint ended the lease: %v", ls.Err())
	case <-time.After(200 * time.Millisecond):
	}
	if ls.Err() != nil {
		t.Fatalf("lease after a forged hint: %v", ls.Err())
	}
	if info, err := admin.Inspect(ctx, key); err != nil || info.Fence != ls.Fence() {
		t.Fatalf("Inspect after a forged hint = %+v, %v; want the holder's grant", info, err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := hd.watching(); n != 0 {
		t.Fatalf("%d grants still watched after the release", n)
	}

	// A force release by another client ends the lease within a second.
	const key2 = "recheck/{forced}"
	ls, err = holder.Acquire(ctx, key2)
	if err != nil {
		t.Fatal(err)
	}
	awaitSubscribers(t, r, hd, key2, 1)
	took := forceReleaseEnds(t, admin, ls, key2)
	if !errors.Is(context.Cause(ls.Context()), dlock.ErrLeaseLost) {
		t.Fatalf("lease after a force release: Err %v, cause %v; want ErrLeaseLost", ls.Err(), context.Cause(ls.Context()))
	}
	if err := ls.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of the force-released lease = %v, want ErrLeaseLost", err)
	}
	t.Logf("force release to lease end: %v", took)
	waitUnwatched(t, hd)
}

// TestRecheck_ForceReleaseBeforeSubscriptionIsFound: a force release in
// the grant's first watchDelay, before the recheck subscription exists,
// publishes its hint to no one; the watch's first recheck, once subscribed,
// still finds the loss within a second (the next renewal of a 30 s lease is
// 10 s away).
func TestRecheck_ForceReleaseBeforeSubscriptionIsFound(t *testing.T) {
	r := testservers.StartRedis(t)
	hd := openDriver(t, r.URL())
	holder := dlock.New(hd, dlock.WithTTL(30*time.Second))
	defer holder.Close()
	admin := dlock.New(openDriver(t, r.URL()))
	defer admin.Close()
	ctx := t.Context()
	c := newClient(t, r)

	for i := range 3 {
		key := "recheck/{early}/" + strconv.Itoa(i)
		ls, err := holder.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		_, _, channel := hd.keys(key)
		if m, err := c.PubSubNumSub(ctx, channel).Result(); err != nil || m[channel] != 0 {
			t.Fatalf("NUMSUB %q right after the grant = %v, %v; want 0 (the test needs a force release before the subscription)", channel, m, err)
		}
		took := forceReleaseEnds(t, admin, ls, key)
		t.Logf("force release to lease end: %v", took.Round(time.Millisecond))
	}
	waitUnwatched(t, hd)
}

// TestRecheck_WatchEndsWithGrant: the driver stops watching a grant when it
// is released, found lost, or left a TTL unrenewed, and at Close.
func TestRecheck_WatchEndsWithGrant(t *testing.T) {
	r := testservers.StartRedis(t)
	d := openDriver(t, r.URL())
	ctx := t.Context()
	req := driver.AcquireRequest{Key: "watch/k", Owner: "owner-a-0000", TTL: 200 * time.Millisecond}
	g, err := d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if g.Recheck == nil {
		t.Fatal("Grant.Recheck is nil with release hints on")
	}
	if d.watching() != 1 {
		t.Fatalf("watching %d grants, want 1", d.watching())
	}
	waitUnwatched(t, d) // unrenewed past its TTL

	if _, err := d.TryAcquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := d.Renew(ctx, req.Key, "someone-else", time.Second); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatal(err)
	}
	if d.watching() != 1 {
		t.Fatal("another owner's refused renewal ended the watch")
	}
	if err := d.Release(ctx, req.Key, req.Owner); err != nil {
		t.Fatal(err)
	}
	if d.watching() != 0 {
		t.Fatal("still watching after the release")
	}

	off := openDriver(t, r.URL()+"?hints=false")
	if g, err := off.TryAcquire(ctx, driver.AcquireRequest{Key: "watch/off", Owner: "owner-b-0000", TTL: time.Second}); err != nil || g.Recheck != nil {
		t.Fatalf("hints off: Recheck %v, err %v; want nil", g.Recheck, err)
	}

	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: "watch/closed", Owner: "owner-c-0000", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if d.watching() != 0 {
		t.Fatal("still watching after Close")
	}
}

func waitUnwatched(t *testing.T, d *Driver) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); d.watching() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("still watching %d grants after 5s", d.watching())
		}
	}
}

// TestOpen_InvalidURLIsInvalidArgument: every URL the driver or Redis
// refuses comes back matching driver.ErrInvalidArgument, never
// driver.ErrUnavailable (which would let WithFailOpen run work unlocked).
func TestOpen_InvalidURLIsInvalidArgument(t *testing.T) {
	r := testservers.StartRedis(t)
	urls := []string{
		"redis://127.0.0.1:99999",
		"redis://127.0.0.1:0",
		"redis://127.0.0.1:http",
		r.URL() + "/x",
		r.URL() + "/-1",
		r.URL() + "/1/2",
		r.URL() + "?no_such_option=1",
		r.URL() + "?dial_timeout=soon",
		r.URL() + "?hints=maybe",
		r.URL() + "/99",                     // beyond the server's 16 databases
		"redis://nobody:secret@" + r.Addr(), // a user the server does not know
		"http://" + r.Addr(),
		// An empty host is never go-redis's localhost, and an empty port
		// never 6379 (issue 13 F5).
		"redis://",
		"rediss://",
		"redis:///0",
		"redis://:6379",
		"redis://:" + strconv.Itoa(r.Port()),
		"redis://:secret@:" + strconv.Itoa(r.Port()) + "/0",
		"redis://127.0.0.1:",
	}
	dlocktest.OpenRefuses(t, Open, urls...)
	dlocktest.RootOpenNotUnavailable(t, urls...)
}
