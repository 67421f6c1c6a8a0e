package consuldriver_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/consuldriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// The focused tests below check what the suite cannot see from outside:
// the entries, the sessions, the fences' source and the options.

const (
	ownerA = "owner-a-0123456789abcdef"
	ownerB = "owner-b-0123456789abcdef"
	ownerC = "owner-c-0123456789abcdef"
)

func req(key, owner string, ttl time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl, Holder: "test " + owner}
}

// fixture is the shared Consul server of TestDriver and the KV prefix of
// one subtest, so that subtests do not see each other's keys.
type fixture struct {
	c      *testservers.Consul
	prefix string
}

// url returns the store URL of the subtest's prefix, plus query (may be "").
func (f *fixture) url(query string) string {
	u := "consul://" + f.c.Addr() + "/" + f.prefix
	if query != "" {
		u += "?" + query
	}
	return u
}

// open opens a driver on the subtest's URL plus query, closed when the
// test ends.
func (f *fixture) open(t *testing.T, query string) *consuldriver.Driver {
	t.Helper()
	d, err := consuldriver.Open(t.Context(), f.url(query))
	if err != nil {
		t.Fatalf("Open(%s): %v", f.url(query), err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// entry reads the lock entry of key under the subtest's prefix (nil when
// missing).
func (f *fixture) entry(t *testing.T, cl *api.Client, key string) *api.KVPair {
	t.Helper()
	kv, _, err := cl.KV().Get(f.prefix+"/.locks/"+escape(key), nil)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// apiClient returns a Consul API client of c, with its HTTP requests going
// through rt when it is not nil.
func apiClient(t *testing.T, c *testservers.Consul, rt http.RoundTripper) *api.Client {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address = c.Addr()
	tr := cfg.Transport
	if rt != nil {
		cfg.HttpClient = &http.Client{Transport: rt}
	}
	cl, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return cl
}

func mustGrant(t *testing.T, d driver.Driver, r driver.AcquireRequest) driver.Grant {
	t.Helper()
	g, err := d.TryAcquire(t.Context(), r)
	if err != nil {
		t.Fatalf("TryAcquire(%q, %s): %v", r.Key, r.Owner, err)
	}
	if g.Fence == 0 {
		t.Fatal("fence 0")
	}
	return g
}

func mustHeld(t *testing.T, d driver.Driver, r driver.AcquireRequest) {
	t.Helper()
	if g, err := d.TryAcquire(t.Context(), r); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) of a held key = %+v, %v; want ErrNotAcquired", r.Key, g, err)
	}
}

// escape is the driver's escaping, written out again: letters, digits, '-'
// and '_' stay, every other byte is %XX.
func escape(k string) string {
	var b strings.Builder
	for i := 0; i < len(k); i++ {
		c := k[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// TestDriver runs the focused tests against one shared Consul server, each
// subtest under a KV prefix of its own. The restart comes last.
func TestDriver(t *testing.T) {
	c := testservers.StartConsul(t)
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, f *fixture)
	}{
		{"Fence_RaftIndexSurvivesKeyDeletion", testFence_RaftIndexSurvivesKeyDeletion},
		{"BehaviorRelease_KeepsEntry", testBehaviorRelease_KeepsEntry},
		{"Session_TTLNoChecksLockDelay", testSession_TTLNoChecksLockDelay},
		{"LockDelay", testLockDelay},
		{"PausedHolder_TakenOverWithGreaterFence", testPausedHolder_TakenOverWithGreaterFence},
		{"Ambiguous_RenewalReplyLostIsNotALoss", testAmbiguous_RenewalReplyLostIsNotALoss},
		{"Ambiguous_GrantReplyLostLeavesNothing", testAmbiguous_GrantReplyLostLeavesNothing},
		{"Wait_CancelledLeavesNothing", testWait_CancelledLeavesNothing},
		{"Wait_WokenByReleaseNotByPolling", testWait_WokenByReleaseNotByPolling},
		{"Keys_EscapedAndListed", testKeys_EscapedAndListed},
		{"Open_URL", testOpen_URL},
		{"CLI_StatusListRelease", testCLI_StatusListRelease},
		{"Fence_IncreasesAcrossServerRestart", testFence_IncreasesAcrossServerRestart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, &fixture{c: c, prefix: "t/" + strings.ReplaceAll(tc.name, "_", "-")})
		})
	}
}

// testFence_RaftIndexSurvivesKeyDeletion: the fence is the Raft index of
// the grant, not the entry's LockIndex. With behavior delete every release
// deletes the entry, so its LockIndex starts again at 1 for each grant;
// an operator's delete of a held entry does the same. Fences still grow.
func testFence_RaftIndexSurvivesKeyDeletion(t *testing.T, f *fixture) {
	c := f.c
	d := f.open(t, "")
	cl := apiClient(t, c, nil)
	var last uint64
	for i := range 5 {
		owner := fmt.Sprintf("owner-%02d-0123456789abcdef", i)
		g := mustGrant(t, d, req("k", owner, 10*time.Second))
		if g.Fence <= last {
			t.Fatalf("grant %d: fence %d not greater than %d", i, g.Fence, last)
		}
		last = g.Fence
		e := f.entry(t, cl, "k")
		if e == nil || e.ModifyIndex != g.Fence || e.LockIndex != 1 {
			t.Fatalf("grant %d: entry %+v; want ModifyIndex = fence %d and LockIndex 1 (a new entry)", i, e, g.Fence)
		}
		if err := d.Release(t.Context(), "k", owner); err != nil {
			t.Fatal(err)
		}
		if e := f.entry(t, cl, "k"); e != nil {
			t.Fatalf("entry still there after release: %+v", e)
		}
	}
	// An operator deletes the held entry: the holder's renewal reports
	// the loss, and the next grant's fence is still greater.
	g := mustGrant(t, d, req("k", ownerA, 10*time.Second))
	if _, err := cl.KV().Delete(f.prefix+"/.locks/k", nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Renew(t.Context(), "k", ownerA, 10*time.Second); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after the entry was deleted = %v, want ErrLeaseLost", err)
	}
	g2 := mustGrant(t, d, req("k", ownerB, 10*time.Second))
	if g2.Fence <= g.Fence {
		t.Fatalf("fence %d after the deletion is not greater than %d", g2.Fence, g.Fence)
	}
	if e := f.entry(t, cl, "k"); e.LockIndex != 1 {
		t.Fatalf("LockIndex %d after the deletion; want 1 (it restarted: why it is not the fence)", e.LockIndex)
	}
}

// testFence_IncreasesAcrossServerRestart: Raft indexes are persisted, so
// fences keep growing after a crash and restart of the server.
func testFence_IncreasesAcrossServerRestart(t *testing.T, f *fixture) {
	c := f.c
	d := f.open(t, "")
	g := mustGrant(t, d, req("k", ownerA, 10*time.Second))
	if err := d.Release(t.Context(), "k", ownerA); err != nil {
		t.Fatal(err)
	}
	c.Kill()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	var g2 driver.Grant
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		g2, err = d.TryAcquire(t.Context(), req("k", ownerB, 10*time.Second))
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("TryAcquire after the restart: %v", err)
	}
	if g2.Fence <= g.Fence {
		t.Fatalf("fence %d after a crash is not greater than %d", g2.Fence, g.Fence)
	}
}

// testBehaviorRelease_KeepsEntry: with behavior=release a released or
// expired grant leaves its entry (no session), LockIndex keeps counting,
// and fences still come from the Raft index.
func testBehaviorRelease_KeepsEntry(t *testing.T, f *fixture) {
	c := f.c
	d := f.open(t, "behavior=release")
	cl := apiClient(t, c, nil)
	g1 := mustGrant(t, d, req("k", ownerA, 10*time.Second))
	if err := d.Release(t.Context(), "k", ownerA); err != nil {
		t.Fatal(err)
	}
	e := f.entry(t, cl, "k")
	if e == nil || e.Session != "" {
		t.Fatalf("entry after release = %+v; want it kept, without a session", e)
	}
	g2 := mustGrant(t, d, req("k", ownerB, 200*time.Millisecond))
	if g2.Fence <= g1.Fence {
		t.Fatalf("fence %d not greater than %d", g2.Fence, g1.Fence)
	}
	if e := f.entry(t, cl, "k"); e.LockIndex != 2 || e.ModifyIndex != g2.Fence {
		t.Fatalf("entry after the second grant = %+v; want LockIndex 2 and ModifyIndex = fence %d", e, g2.Fence)
	}
	// No renewal: the session expires (after one to two TTLs), the entry
	// stays, and the key is free.
	waitUntil(t, 5*time.Second, "the unrenewed session to expire", func() bool {
		e := f.entry(t, cl, "k")
		return e != nil && e.Session == ""
	})
	if _, err := d.Inspect(t.Context(), "k"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect of an expired key = %v, want ErrNotAcquired", err)
	}
	g3 := mustGrant(t, d, req("k", ownerC, 10*time.Second))
	if g3.Fence <= g2.Fence {
		t.Fatalf("fence %d not greater than %d", g3.Fence, g2.Fence)
	}
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testSession_TTLNoChecksLockDelay: the grant's session carries the
// lease's TTL, no health checks, the driver's behavior and lock-delay.
func testSession_TTLNoChecksLockDelay(t *testing.T, f *fixture) {
	c := f.c
	d := f.open(t, "lock_delay=250ms")
	cl := apiClient(t, c, nil)
	mustGrant(t, d, req("k", ownerA, 1500*time.Millisecond))
	e := f.entry(t, cl, "k")
	s, _, err := cl.Session().Info(e.Session, nil)
	if err != nil || s == nil {
		t.Fatalf("session %s: %+v, %v", e.Session, s, err)
	}
	if s.TTL != "1.5s" || s.Behavior != "delete" || s.LockDelay != 250*time.Millisecond || len(s.NodeChecks) != 0 || len(s.Checks) != 0 || len(s.ServiceChecks) != 0 {
		t.Fatalf("session = %+v; want TTL 1.5s, behavior delete, lock-delay 250ms, no checks", s)
	}
	// Release destroys it.
	if err := d.Release(t.Context(), "k", ownerA); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "the released grant's session to be destroyed", func() bool {
		s, _, err := cl.Session().Info(e.Session, nil)
		return err == nil && s == nil
	})
}

// testLockDelay: a holder's session ended by force (ForceRelease, as
// "consul session destroy") leaves the key in lock-delay for lock_delay; a
// release by the holder does not.
func testLockDelay(t *testing.T, f *fixture) {
	const delay = time.Second
	d := f.open(t, "lock_delay="+delay.String())
	other := f.open(t, "")

	mustGrant(t, d, req("released", ownerA, 10*time.Second))
	if err := d.Release(t.Context(), "released", ownerA); err != nil {
		t.Fatal(err)
	}
	mustGrant(t, other, req("released", ownerB, 10*time.Second)) // at once

	g := mustGrant(t, d, req("forced", ownerA, 10*time.Second))
	info, err := other.ForceRelease(t.Context(), "forced", "test")
	if err != nil || info.Fence != g.Fence || info.Holder != "test "+ownerA {
		t.Fatalf("ForceRelease = %+v, %v; want the grant", info, err)
	}
	forcedAt := time.Now()
	if _, err := other.Inspect(t.Context(), "forced"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect after ForceRelease = %v, want ErrNotAcquired", err)
	}
	mustHeld(t, other, req("forced", ownerB, 10*time.Second)) // free, but in lock-delay
	if err := d.Renew(t.Context(), "forced", ownerA, 10*time.Second); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("the forced holder's Renew = %v, want ErrLeaseLost", err)
	}
	// A waiter is granted once the lock-delay is over.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	g2, err := other.Wait(ctx, req("forced", ownerC, 10*time.Second))
	if err != nil {
		t.Fatalf("Wait through the lock-delay: %v", err)
	}
	if took := time.Since(forcedAt); took < delay-100*time.Millisecond {
		t.Fatalf("granted %v after the forced release, inside the %v lock-delay", took, delay)
	}
	if g2.Fence <= g.Fence {
		t.Fatalf("fence %d not greater than %d", g2.Fence, g.Fence)
	}
}

// testPausedHolder_TakenOverWithGreaterFence: a holder that stops renewing
// (a paused process) is taken over by a waiter once its session expires,
// with a greater fence; its late renewal and release are refused and leave
// the new grant alone.
func testPausedHolder_TakenOverWithGreaterFence(t *testing.T, f *fixture) {
	a := f.open(t, "")
	b := f.open(t, "")
	const ttl = 500 * time.Millisecond
	ga := mustGrant(t, a, req("k", ownerA, ttl))
	pausedAt := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	gb, err := b.Wait(ctx, req("k", ownerB, 10*time.Second))
	if err != nil {
		t.Fatalf("B's Wait: %v", err)
	}
	took := time.Since(pausedAt)
	t.Logf("B granted %v after A's last renewal (TTL %v; Consul expires after 1 to 2 TTLs)", took, ttl)
	if took < ttl {
		t.Fatalf("B granted %v after A's grant, before A's TTL %v", took, ttl)
	}
	if gb.Fence <= ga.Fence {
		t.Fatalf("B's fence %d not greater than A's %d", gb.Fence, ga.Fence)
	}
	if err := a.Renew(t.Context(), "k", ownerA, ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("A's late Renew = %v, want ErrLeaseLost", err)
	}
	if err := a.Release(t.Context(), "k", ownerA); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("A's late Release = %v, want ErrLeaseLost", err)
	}
	if info, err := a.Inspect(t.Context(), "k"); err != nil || info.Fence != gb.Fence || info.Holder != "test "+ownerB {
		t.Fatalf("Inspect after A's late calls = %+v, %v; want B's grant", info, err)
	}
}

// replyDropper performs requests but, once armed, loses the reply of the
// next one whose method and path match: the write lands on Consul, the
// client sees an error.
type replyDropper struct {
	base  http.RoundTripper
	match atomic.Value // string "METHOD /path-prefix"
	drops atomic.Int32
}

func (r *replyDropper) arm(method, pathPrefix string) { r.match.Store(method + " " + pathPrefix) }

func (r *replyDropper) RoundTrip(q *http.Request) (*http.Response, error) {
	resp, err := r.base.RoundTrip(q)
	m, _ := r.match.Load().(string)
	if err == nil && m != "" && strings.HasPrefix(q.Method+" "+q.URL.Path, m) {
		r.match.Store("")
		r.drops.Add(1)
		resp.Body.Close()
		return nil, errors.New("test: reply lost")
	}
	return resp, err
}

// testAmbiguous_RenewalReplyLostIsNotALoss: a renewal whose reply is lost
// is a store error, never ErrLeaseLost; the session was renewed and still
// holds the entry, and the next renewal succeeds.
func testAmbiguous_RenewalReplyLostIsNotALoss(t *testing.T, f *fixture) {
	c := f.c
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	drop := &replyDropper{base: base}
	a, err := consuldriver.New(apiClient(t, c, drop), &consuldriver.Options{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	other := f.open(t, "")
	g := mustGrant(t, a, req("k", ownerA, time.Second))

	drop.arm("PUT", "/v1/session/renew/")
	err = a.Renew(t.Context(), "k", ownerA, time.Second)
	if err == nil || errors.Is(err, driver.ErrLeaseLost) || errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("Renew with a lost reply = %v; want a store error", err)
	}
	if drop.drops.Load() != 1 {
		t.Fatal("no reply was dropped")
	}
	if info, err := other.Inspect(t.Context(), "k"); err != nil || info.Fence != g.Fence {
		t.Fatalf("after the lost reply: Inspect = %+v, %v; want the grant", info, err)
	}
	if err := a.Renew(t.Context(), "k", ownerA, time.Second); err != nil {
		t.Fatalf("the renewal after a lost reply = %v, want nil", err)
	}
	mustHeld(t, other, req("k", ownerB, time.Second))

	// Through the root package: a lease one of whose renewals lost its
	// reply stays held past several TTLs.
	l := dlock.New(a, dlock.WithStoreName("consul"))
	ls, err := l.TryAcquire(t.Context(), "lease", dlock.WithTTL(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	drop.arm("PUT", "/v1/session/renew/")
	select {
	case <-ls.Done():
		t.Fatalf("lease lost after a renewal's reply was lost: %v", ls.Err())
	case <-time.After(2 * time.Second):
	}
	if drop.drops.Load() != 2 {
		t.Fatal("no renewal reply was dropped")
	}
	mustHeld(t, other, req("lease", ownerB, time.Second))
	if err := ls.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// testAmbiguous_GrantReplyLostLeavesNothing: an acquisition whose lock
// transaction landed but whose reply was lost returns a store error and
// destroys its session, which frees the key (no lock-delay by default).
func testAmbiguous_GrantReplyLostLeavesNothing(t *testing.T, f *fixture) {
	c := f.c
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	drop := &replyDropper{base: base}
	a, err := consuldriver.New(apiClient(t, c, drop), &consuldriver.Options{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	other := f.open(t, "")
	drop.arm("PUT", "/v1/txn")
	if g, err := a.TryAcquire(t.Context(), req("k", ownerA, 10*time.Second)); err == nil || errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire with a lost reply = %+v, %v; want a store error", g, err)
	}
	waitUntil(t, 5*time.Second, "the landed grant to be freed", func() bool {
		_, err := other.Inspect(t.Context(), "k")
		return errors.Is(err, driver.ErrNotAcquired)
	})
	mustGrant(t, other, req("k", ownerB, 10*time.Second))
}

// testWait_CancelledLeavesNothing: a waiter whose context ends removes its
// queue entry and its session; the holder's grant is untouched.
func testWait_CancelledLeavesNothing(t *testing.T, f *fixture) {
	c := f.c
	d := f.open(t, "")
	w := f.open(t, "")
	cl := apiClient(t, c, nil)
	g := mustGrant(t, d, req("k/1", ownerA, 10*time.Second))
	before, _, err := cl.Session().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, s := range before {
		known[s.ID] = true
	}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := w.Wait(ctx, req("k/1", ownerB, 10*time.Second))
		errc <- err
	}()
	waitUntil(t, 5*time.Second, "the waiter to be queued", func() bool {
		info, err := d.Inspect(t.Context(), "k/1")
		return err == nil && info.Waiters == 1
	})
	q, _, err := cl.KV().Keys(f.prefix+"/.queue/", "", nil)
	if err != nil || len(q) != 1 || q[0] != f.prefix+"/.queue/k%2F1/"+escape(ownerB) {
		t.Fatalf("queue keys = %q, %v", q, err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait = %v, want context.Canceled", err)
	}
	if q, _, err := cl.KV().Keys(f.prefix+"/.queue/", "", nil); err != nil || len(q) != 0 {
		t.Fatalf("queue keys after the cancelled wait = %q, %v; want none", q, err)
	}
	after, _, err := cl.Session().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range after {
		if !known[s.ID] {
			t.Fatalf("session %s (%s) left behind by the cancelled wait", s.ID, s.Name)
		}
	}
	if info, err := d.Inspect(t.Context(), "k/1"); err != nil || info.Fence != g.Fence || info.Waiters != 0 {
		t.Fatalf("Inspect = %+v, %v; want the holder's grant and no waiter", info, err)
	}
}

// testWait_WokenByReleaseNotByPolling: a waiter is granted within moments
// of the release, and while the key is held it sends no requests but its
// session renewals (one every TTL/3) and its one blocking query.
func testWait_WokenByReleaseNotByPolling(t *testing.T, f *fixture) {
	c := f.c
	d := f.open(t, "")
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	counter := &countingTransport{base: base}
	w, err := consuldriver.New(apiClient(t, c, counter), &consuldriver.Options{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mustGrant(t, d, req("k", ownerA, 10*time.Second))
	granted := make(chan time.Time, 1)
	go func() {
		if _, err := w.Wait(t.Context(), req("k", ownerB, 3*time.Second)); err != nil {
			t.Errorf("Wait: %v", err)
		}
		granted <- time.Now()
	}()
	waitUntil(t, 5*time.Second, "the waiter to be queued", func() bool {
		info, err := d.Inspect(t.Context(), "k")
		return err == nil && info.Waiters == 1
	})
	time.Sleep(200 * time.Millisecond)
	n0 := counter.n.Load()
	time.Sleep(2 * time.Second)
	n := counter.n.Load() - n0
	// 2 s at one renewal a second, plus slack: anything near a poll loop
	// would be tens.
	if n > 4 {
		t.Fatalf("the waiter sent %d requests in 2 s while the key was held; want only its renewals", n)
	}
	releasedAt := time.Now()
	if err := d.Release(t.Context(), "k", ownerA); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-granted:
		t.Logf("granted %v after the release", at.Sub(releasedAt))
		if at.Sub(releasedAt) > time.Second {
			t.Fatalf("granted %v after the release", at.Sub(releasedAt))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not granted after the release")
	}
	if err := w.Release(t.Context(), "k", ownerB); err != nil {
		t.Fatal(err)
	}
}

type countingTransport struct {
	base http.RoundTripper
	n    atomic.Int32
}

func (c *countingTransport) RoundTrip(q *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.base.RoundTrip(q)
}

// testKeys_EscapedAndListed: any key works and lists back unescaped, in
// byte order, by prefix; a prefix nested in another is independent.
func testKeys_EscapedAndListed(t *testing.T, f *fixture) {
	c := f.c
	d := f.open(t, "")
	cl := apiClient(t, c, nil)
	keys := []string{"a/b", "a%b", "a b", ".", "..", "a", "a?x#y", "émoji 🔒", "a.b", strings.Repeat("k", 512)}
	for _, k := range keys {
		mustGrant(t, d, req(k, ownerA, 10*time.Second))
	}
	e := f.entry(t, cl, "a/b")
	if e == nil || e.Key != f.prefix+"/.locks/a%2Fb" {
		t.Fatalf("entry of %q = %+v", "a/b", e)
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"a", []string{"a", "a b", "a%b", "a.b", "a/b", "a?x#y"}},
		{"a/", []string{"a/b"}},
		{".", []string{".", ".."}},
		{"é", []string{"émoji 🔒"}},
		{"zzz", nil},
	} {
		infos, err := d.List(t.Context(), tc.prefix)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range infos {
			got = append(got, in.Key)
			if in.Holder != "test "+ownerA || in.Fence == 0 || in.TTL != 10*time.Second {
				t.Errorf("List entry %+v", in)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
	all, err := d.List(t.Context(), "")
	if err != nil || len(all) != len(keys) {
		t.Fatalf("List(\"\") = %d keys, %v; want %d", len(all), err, len(keys))
	}
	// A prefix nested in this one is independent of it.
	c2, err := consuldriver.Open(t.Context(), f.url("")+"/app")
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	mustGrant(t, c2, req("a/b", ownerB, 10*time.Second))
	if infos, err := c2.List(t.Context(), ""); err != nil || len(infos) != 1 {
		t.Fatalf("List on the nested prefix = %+v, %v; want its one key", infos, err)
	}
	if all, err := d.List(t.Context(), ""); err != nil || len(all) != len(keys) {
		t.Fatalf("List on the outer prefix = %d keys, %v; want %d", len(all), err, len(keys))
	}
}

// testOpen_URL: what Open accepts and refuses.
func testOpen_URL(t *testing.T, f *fixture) {
	c := f.c
	dlocktest.OpenRefuses(t, consuldriver.Open,
		"etcd://"+c.Addr(),
		"consul://",
		"consul://127.0.0.1",
		"consul://127.0.0.1:",
		"consul://:8500",
		"consul://127.0.0.1:99999",
		"consul://a:1,b:2",
		"consul://u:p@"+c.Addr(),
		"consul://"+c.Addr()+"/.hidden",
		"consul://"+c.Addr()+"/a//b",
		"consul://"+c.Addr()+"?bogus=1",
		"consul://"+c.Addr()+"?lock_delay=61s",
		"consul://"+c.Addr()+"?lock_delay=500ns",
		"consul://"+c.Addr()+"?lock_delay=x",
		"consul://"+c.Addr()+"?behavior=keep",
		"consul://"+c.Addr()+"?op_timeout=0s",
		"consul://"+c.Addr()+"?tls=maybe",
		"consul://"+notHTTP(t)+"/dlock",   // another protocol on the port
		"consul://"+notConsul(t)+"/dlock", // an HTTP server that is not Consul
		"consul://"+c.Addr()+"/dlock?tls=true",
	)
	down := fmt.Sprintf("consul://127.0.0.1:%d/dlock?op_timeout=2s", testservers.FreePort(t))
	if _, err := consuldriver.Open(t.Context(), down); !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("Open with no server = %v, want ErrUnavailable", err)
	}
	l, err := dlock.Open(t.Context(), f.url("lock_delay=0s&behavior=release&op_timeout=3s&dc=dc1&tls=false"))
	if err != nil {
		t.Fatalf("dlock.Open: %v", err)
	}
	defer l.Close()
	ls, err := l.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := consuldriver.New(nil, nil); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("New(nil) = %v, want ErrInvalidArgument", err)
	}
}

// notHTTP returns the address of a server that answers the first line of
// every connection with a line of another protocol (as Redis would) and
// closes it.
func notHTTP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			// Read the request line first, as Redis reads a command.
			_, _ = bufio.NewReader(conn).ReadString('\n')
			_, _ = conn.Write([]byte("-ERR unknown command 'GET'\r\n"))
			conn.Close()
		}
	}()
	return ln.Addr().String()
}

// notConsul returns the address of an HTTP server that answers 404 to
// everything.
func notConsul(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
