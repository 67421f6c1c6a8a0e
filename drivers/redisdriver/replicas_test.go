package redisdriver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/netproxy"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// waitLink waits, up to 15 s, until the primary counts want connected
// replicas and, when want > 0, a write on it is acknowledged by want
// replicas within 200 ms (WAIT). A replica's link may be up well before
// that: after a (re)synchronization, a primary streams to a replica, and
// counts its acknowledgements, only from the replica's first REPLCONF
// ACK, which it sends once a second.
func waitLink(t testing.TB, primary *testservers.Redis, want int) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: primary.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		pinfo, perr := primary.Command("INFO", "replication")
		ok := perr == nil && strings.Contains(pinfo, fmt.Sprintf("connected_slaves:%d\r", want))
		if ok && want > 0 {
			conn := c.Conn()
			n, err := conn.Incr(context.Background(), "replicas_test:probe").Result()
			if err == nil {
				n, err = conn.Wait(context.Background(), want, 200*time.Millisecond).Result()
			}
			_ = conn.Close()
			ok = err == nil && n >= int64(want)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("primary %s: not %d acknowledging replicas after 15 s: %v\n%s", primary.Addr(), want, perr, pinfo)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lagReplica re-points replica at primary through a proxy that delays the
// replication stream (and the primary's GETACK) by lo to hi, as the
// verifier's redis-failover target does, and waits for the link.
func lagReplica(t *testing.T, primary, replica *testservers.Redis, lo, hi time.Duration) {
	t.Helper()
	p := netproxy.Start(t, primary.Addr(), 7)
	p.SetDelay(netproxy.Downstream, lo, hi)
	host, port, _ := strings.Cut(p.Addr(), ":")
	if _, err := replica.Command("REPLICAOF", host, port); err != nil {
		t.Fatalf("REPLICAOF through the lag proxy: %v", err)
	}
	waitLink(t, primary, 1)
}

// TestWaitReplicas_GrantsAreOnTheReplica: with wait_replicas=1 and a
// replica whose stream lags 100 to 150 ms, a grant (TryAcquire, Wait, a
// hand-off claimed by a queued waiter, a read-write view's, Resume) and a
// renewal are on the replica, hash and fence counter, the moment the
// call returns; without the option the same grant is not there yet (which
// shows the lag is real). Release works and is not waited for.
func TestWaitReplicas_GrantsAreOnTheReplica(t *testing.T) {
	p := testservers.StartRedis(t)
	r := testservers.StartRedisReplica(t, p)
	const lagLo, lagHi = 100 * time.Millisecond, 150 * time.Millisecond
	lagReplica(t, p, r, lagLo, lagHi)
	onReplica := newClient(t, r)
	ctx := t.Context()

	// Control: without WaitReplicas, the replica lags behind the grant.
	plain := openDriver(t, p.URL())
	ctl := plain.keysFor(t, "ctl")
	acquire(t, plain, "ctl", "ctlowner", 10*time.Second)
	if n, err := onReplica.Exists(ctx, ctl.lock).Result(); err != nil || n != 0 {
		t.Fatalf("without wait_replicas, EXISTS %s on the replica right after the grant = %d, %v; want 0 (the stream lags)", ctl.lock, n, err)
	}

	d := openDriver(t, p.URL()+"?wait_replicas=1&wait_timeout=3s")
	d2 := openDriver(t, p.URL()+"?wait_replicas=1&wait_timeout=3s")
	if d.repl.n != 1 || d.repl.timeout != 3*time.Second {
		t.Fatalf("wait_replicas=1&wait_timeout=3s: WaitReplicas %d, WaitTimeout %v", d.repl.n, d.repl.timeout)
	}
	checkOnReplica := func(what, key, owner string, fence uint64, ttl time.Duration) {
		t.Helper()
		ks := d.keysFor(t, key)
		v, err := onReplica.HMGet(ctx, ks.lock, "owner", "fence", "ttl").Result()
		if err != nil || len(v) != 3 || v[0] != owner || v[1] != strconv.FormatUint(fence, 10) || v[2] != strconv.FormatInt(ttl.Milliseconds(), 10) {
			t.Fatalf("%s: on the replica, HMGET %s owner fence ttl = %v, %v; want %s %d %d", what, ks.lock, v, err, owner, fence, ttl.Milliseconds())
		}
		c, err := onReplica.Get(ctx, ks.counter).Uint64()
		if err != nil || c < fence {
			t.Fatalf("%s: on the replica, fence counter %s = %d, %v; want at least %d", what, ks.counter, c, err, fence)
		}
	}

	// TryAcquire.
	began := time.Now()
	f := acquire(t, d, "k", "owner1", 10*time.Second)
	if took := time.Since(began); took < lagLo/2 {
		t.Errorf("TryAcquire with wait_replicas=1 over a %v lag took %v: it did not wait", lagLo, took)
	}
	checkOnReplica("TryAcquire", "k", "owner1", f, 10*time.Second)

	// Renew.
	if err := d.Renew(ctx, "k", "owner1", 7*time.Second); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	checkOnReplica("Renew", "k", "owner1", f, 7*time.Second)

	// Resume, by another driver.
	if g, err := d2.Resume(ctx, driver.AcquireRequest{Key: "k", Owner: "owner1", TTL: 9 * time.Second}, f); err != nil || g.Fence != f {
		t.Fatalf("Resume = %+v, %v; want fence %d", g, err, f)
	}
	checkOnReplica("Resume", "k", "owner1", f, 9*time.Second)

	// A queued waiter's claim of the key handed over by the release.
	type result struct {
		g   driver.Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := d2.Wait(ctx, driver.AcquireRequest{Key: "k", Owner: "owner2", TTL: 5 * time.Second})
		got <- result{g, err}
	}()
	waitFor(t, 10*time.Second, "the waiter to queue", func() bool {
		info, err := d.Inspect(ctx, "k")
		return err == nil && info.Waiters == 1
	})
	if err := d.Release(ctx, "k", "owner1"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	res := <-got
	if res.err != nil || res.g.Fence <= f {
		t.Fatalf("Wait after the hand-off = %+v, %v; want a fence above %d", res.g, res.err, f)
	}
	checkOnReplica("Wait (hand-off)", "k", "owner2", res.g.Fence, 5*time.Second)
	if err := d2.Release(ctx, "k", "owner2"); err != nil {
		t.Fatalf("Release of the handed-off grant: %v", err)
	}

	// Wait on a free key.
	g, err := d.Wait(ctx, driver.AcquireRequest{Key: "free", Owner: "owner3", TTL: 4 * time.Second})
	if err != nil {
		t.Fatalf("Wait on a free key: %v", err)
	}
	checkOnReplica("Wait (free key)", "free", "owner3", g.Fence, 4*time.Second)
	if err := d.Release(ctx, "free", "owner3"); err != nil {
		t.Fatal(err)
	}

	// A read-write view: writer, then a renewal.
	w, err := d.SharedView(driver.SharedKind{Mode: driver.Exclusive})
	if err != nil {
		t.Fatal(err)
	}
	wg, err := w.TryAcquire(ctx, driver.AcquireRequest{Key: "rw", Owner: "writer", TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("write TryAcquire: %v", err)
	}
	rwKeys, _ := d.rwKeys("rw")
	if v, err := onReplica.HGet(ctx, rwKeys[0], "writer").Result(); err != nil || !strings.HasPrefix(v, fmt.Sprintf("w:%d:", wg.Fence)) {
		t.Fatalf("write grant on the replica: HGET %s writer = %q, %v; want w:%d:…", rwKeys[0], v, err, wg.Fence)
	}
	if err := w.Renew(ctx, "rw", "writer", 6*time.Second); err != nil {
		t.Fatalf("write Renew: %v", err)
	}
	if err := w.Release(ctx, "rw", "writer"); err != nil {
		t.Fatalf("write Release: %v", err)
	}

	// Through the root package.
	l := dlock.New(d, dlock.WithTTL(2*time.Second))
	ls, err := l.Acquire(ctx, "root")
	if err != nil {
		t.Fatalf("root Acquire: %v", err)
	}
	checkOnReplica("root Acquire", "root", ls.Token().Owner, ls.Fence(), 2*time.Second)
	if err := ls.Release(ctx); err != nil {
		t.Fatalf("root Release: %v", err)
	}
	_ = l.Close()
}

// TestWaitReplicas_ShortfallReleasesAndIsUnavailable: with the primary's
// only replica killed, an acquisition with wait_replicas=1 (TryAcquire,
// Wait, a hand-off to a queued waiter, a read-write view, through the
// root package) fails with ErrUnavailable after about wait_timeout, saying
// "replicated to 0 of 1 replicas within T", and leaves the key free on the
// primary; a renewal and a resumption fail with ErrUnavailable, not
// ErrLeaseLost, and leave the grant held; a short context deadline cuts
// WAIT short. Once the replica follows again, grants work.
func TestWaitReplicas_ShortfallReleasesAndIsUnavailable(t *testing.T) {
	p := testservers.StartRedis(t)
	r := testservers.StartRedisReplica(t, p)
	waitLink(t, p, 1)
	onPrimary := newClient(t, p)
	ctx := t.Context()
	const timeout = 300 * time.Millisecond
	d := openDriver(t, p.URL()+"?wait_replicas=1&wait_timeout=300ms")
	d2 := openDriver(t, p.URL()+"?wait_replicas=1&wait_timeout=300ms")
	w, err := d.SharedView(driver.SharedKind{Mode: driver.Exclusive})
	if err != nil {
		t.Fatal(err)
	}

	// Grants made while the replica follows.
	held := acquire(t, d, "held", "holder", 30*time.Second)
	if _, err := w.TryAcquire(ctx, driver.AcquireRequest{Key: "rwheld", Owner: "writer", TTL: 30 * time.Second}); err != nil {
		t.Fatalf("write TryAcquire with the replica up: %v", err)
	}

	r.Kill() // (Stop may wait 10 s: a replica that just synced refuses to exit while it writes its first AOF)
	waitLink(t, p, 0)

	isFree := func(what, key string) {
		t.Helper()
		if _, err := d.Inspect(ctx, key); !errors.Is(err, driver.ErrNotAcquired) {
			t.Errorf("%s: Inspect(%q) after the shortfall = %v; want ErrNotAcquired (the grant released)", what, key, err)
		}
		if n, err := onPrimary.Exists(ctx, d.keysFor(t, key).lock).Result(); err != nil || n != 0 {
			t.Errorf("%s: EXISTS of %q's lock hash on the primary = %d, %v; want 0", what, key, n, err)
		}
	}
	short := func(what string, err error, took time.Duration, within time.Duration) {
		t.Helper()
		t.Logf("%s: %v (%v)", what, err, took)
		if !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, driver.ErrLeaseLost) || errors.Is(err, driver.ErrNotAcquired) {
			t.Errorf("%s = %v; want ErrUnavailable (and neither ErrLeaseLost nor ErrNotAcquired)", what, err)
		}
		if want := fmt.Sprintf("replicated to 0 of 1 replicas within %v", within); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v does not say %q", what, err, want)
		}
		if took < within-20*time.Millisecond || took > within+time.Second {
			t.Errorf("%s took %v; want about %v", what, took, within)
		}
	}

	// TryAcquire.
	began := time.Now()
	_, err = d.TryAcquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o1", TTL: 30 * time.Second})
	short("TryAcquire", err, time.Since(began), timeout)
	if err != nil && !strings.Contains(err.Error(), "(released)") {
		t.Errorf("TryAcquire: %v does not say the grant was released", err)
	}
	isFree("TryAcquire", "k")

	// Wait on a free key.
	began = time.Now()
	_, err = d.Wait(ctx, driver.AcquireRequest{Key: "k", Owner: "o2", TTL: 30 * time.Second})
	short("Wait", err, time.Since(began), timeout)
	isFree("Wait", "k")

	// Renew and Resume leave the grant held.
	began = time.Now()
	err = d.Renew(ctx, "held", "holder", 30*time.Second)
	short("Renew", err, time.Since(began), timeout)
	began = time.Now()
	_, err = d2.Resume(ctx, driver.AcquireRequest{Key: "held", Owner: "holder", TTL: 30 * time.Second}, held)
	short("Resume", err, time.Since(began), timeout)
	if info, err := d.Inspect(ctx, "held"); err != nil || info.Fence != held {
		t.Fatalf("after the renewal's shortfall, Inspect(held) = %+v, %v; want the grant of fence %d still held", info, err, held)
	}

	// A queued waiter handed the key by the holder's release (which does
	// not wait) cannot confirm its claim: its Wait fails and the key is
	// released again.
	type result struct {
		g   driver.Grant
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		g, err := d2.Wait(ctx, driver.AcquireRequest{Key: "held", Owner: "waiter", TTL: 30 * time.Second})
		got <- result{g, err, time.Now()}
	}()
	waitFor(t, 10*time.Second, "the waiter to queue", func() bool {
		info, err := d.Inspect(ctx, "held")
		return err == nil && info.Waiters == 1
	})
	released := time.Now()
	if err := d.Release(ctx, "held", "holder"); err != nil {
		t.Fatalf("Release with no replica (not waited for): %v", err)
	}
	res := <-got
	short("Wait (hand-off)", res.err, res.at.Sub(released), timeout)
	isFree("Wait (hand-off)", "held")

	// A read-write view: an acquisition is released, a renewal is kept.
	began = time.Now()
	_, err = w.TryAcquire(ctx, driver.AcquireRequest{Key: "rwk", Owner: "writer2", TTL: 30 * time.Second})
	short("write TryAcquire", err, time.Since(began), timeout)
	rwKeys, _ := d.rwKeys("rwk")
	if n, err := onPrimary.HLen(ctx, rwKeys[0]).Result(); err != nil || n != 0 {
		t.Errorf("write grant after its shortfall: HLEN %s = %d, %v; want 0", rwKeys[0], n, err)
	}
	began = time.Now()
	_, err = w.(driver.Waiter).Wait(ctx, driver.AcquireRequest{Key: "rwk", Owner: "writer3", TTL: 30 * time.Second})
	short("write Wait", err, time.Since(began), timeout)
	if n, err := onPrimary.HLen(ctx, rwKeys[0]).Result(); err != nil || n != 0 {
		t.Errorf("write grant after a Wait's shortfall: HLEN %s = %d, %v; want 0", rwKeys[0], n, err)
	}
	began = time.Now()
	err = w.Renew(ctx, "rwheld", "writer", 30*time.Second)
	short("write Renew", err, time.Since(began), timeout)

	// A context deadline shorter than wait_timeout cuts WAIT short, with
	// room for Redis's late answer (up to 100 ms) and the release: with
	// 400 ms left the call ends by the deadline. With 150 ms left WAIT
	// gets half (75 ms) and Redis may answer after the deadline: the call
	// then fails with the deadline, still releasing the grant (under a
	// context of its own), within a round trip of the deadline.
	long := openDriver(t, p.URL()+"?wait_replicas=1&wait_timeout=5s")
	for _, left := range []time.Duration{400 * time.Millisecond, 150 * time.Millisecond} {
		cctx, cancel := context.WithTimeout(ctx, left)
		began = time.Now()
		_, err = long.TryAcquire(cctx, driver.AcquireRequest{Key: "k", Owner: "o3", TTL: 30 * time.Second})
		took := time.Since(began)
		cancel()
		t.Logf("TryAcquire with a %v deadline: %v (%v)", left, err, took)
		ok := errors.Is(err, driver.ErrUnavailable) && strings.Contains(err.Error(), "(released)") && took <= left+20*time.Millisecond
		if left < 200*time.Millisecond && !ok {
			ok = errors.Is(err, context.DeadlineExceeded) && strings.Contains(err.Error(), "was released") && took <= left+50*time.Millisecond
		}
		if !ok {
			t.Errorf("TryAcquire with a %v deadline and wait_timeout=5s = %v after %v; want ErrUnavailable (or, this short, the deadline), released, by the deadline", left, err, took)
		}
		isFree("TryAcquire (short deadline)", "k")
	}

	// With one pooled connection, the release of the grant that fell
	// short does not wait for the connection that ran the script and WAIT.
	one := openDriver(t, p.URL()+"?wait_replicas=1&wait_timeout=100ms&pool_size=1&pool_timeout=3s")
	began = time.Now()
	_, err = one.TryAcquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o5", TTL: 30 * time.Second})
	if took := time.Since(began); !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "(released)") || took > time.Second {
		t.Errorf("pool_size=1: TryAcquire = %v after %v; want ErrUnavailable, released, within about 100 ms", err, took)
	}
	isFree("TryAcquire (pool_size=1)", "k")

	// Through the root package: no lease, ErrUnavailable.
	l := dlock.New(openDriver(t, p.URL()+"?wait_replicas=1&wait_timeout=300ms"), dlock.WithTTL(5*time.Second))
	if ls, err := l.TryAcquire(ctx, "root"); !errors.Is(err, dlock.ErrUnavailable) || ls != nil {
		t.Errorf("root TryAcquire = %v, %v; want ErrUnavailable and no lease", ls, err)
	}
	isFree("root TryAcquire", "root")
	_ = l.Close()

	// The replica back (as a primary after its restart, so REPLICAOF
	// again): grants work again.
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Command("REPLICAOF", "127.0.0.1", testservers.Itoa(p.Port())); err != nil {
		t.Fatal(err)
	}
	waitLink(t, p, 1)
	acquire(t, d, "k", "o4", time.Second)
}

// TestWaitReplicas_NeedsASingleNodeClient: WaitReplicas over a Redis
// Cluster client, a Ring or another Scripter, and a negative WaitReplicas
// or WaitTimeout over any client, make every call that would wait return
// an error matching driver.ErrInvalidArgument that says why, before
// anything is sent (the custom Scripter panics if called). With
// WaitReplicas 0 the driver runs on the client itself: no Conn, no WAIT.
func TestWaitReplicas_NeedsASingleNodeClient(t *testing.T) {
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = cluster.Close() })
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = single.Close() })
	scripter := scriptOnly{calls: new(atomic.Int64)}

	for _, tc := range []struct {
		name   string
		client Client
		opts   Options
		want   string
	}{
		{"ClusterClient", cluster, Options{WaitReplicas: 1}, "needs a single-node *redis.Client"},
		{"Ring", ring, Options{WaitReplicas: 2}, "needs a single-node *redis.Client"},
		{"Scripter", scripter, Options{WaitReplicas: 1}, "needs a single-node *redis.Client"},
		{"negative WaitReplicas", single, Options{WaitReplicas: -1}, "WaitReplicas is -1"},
		{"negative WaitTimeout", single, Options{WaitReplicas: 1, WaitTimeout: -time.Second}, "WaitTimeout is -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scripter.calls.Store(0)
			d := New(tc.client, &tc.opts)
			defer d.Close()
			ctx := t.Context()
			req := driver.AcquireRequest{Key: "k", Owner: "owner", TTL: time.Second}
			check := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s = %v; want ErrInvalidArgument saying %q", op, err, tc.want)
				}
			}
			_, err := d.TryAcquire(ctx, req)
			check("TryAcquire", err)
			_, err = d.Wait(ctx, req)
			check("Wait", err)
			check("Renew", d.Renew(ctx, "k", "owner", time.Second))
			_, err = d.Resume(ctx, req, 1)
			check("Resume", err)
			for _, kind := range []driver.SharedKind{{Mode: driver.Exclusive}, {Mode: driver.Shared}} {
				v, err := d.SharedView(kind)
				if err != nil {
					t.Fatal(err)
				}
				_, err = v.TryAcquire(ctx, req)
				check("view TryAcquire", err)
				_, err = v.(driver.Waiter).Wait(ctx, req)
				check("view Wait", err)
				check("view Renew", v.Renew(ctx, "k", "owner", time.Second))
			}
			if n := scripter.calls.Load(); n != 0 {
				t.Fatalf("the Scripter was called %d times; want none (refused before anything is sent)", n)
			}
			// Through the root package: invalid, never unavailable (so
			// WithFailOpen does not run work). (The root's clean-up
			// releases the owner token after the error: Release does not
			// wait for replicas, so it goes to the client.)
			l := dlock.New(New(tc.client, &tc.opts), dlock.WithOpTimeout(200*time.Millisecond))
			defer l.Close()
			if _, err := l.TryAcquire(ctx, "k", dlock.WithFailOpen()); !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
				t.Errorf("root TryAcquire = %v; want ErrInvalidArgument", err)
			}
		})
	}

	// WaitReplicas 0 (the hot path): the client itself, no Conn.
	for _, c := range []Client{cluster, ring, single, scripter} {
		s, err := New(c, nil).session("acquire")
		if err != nil || s.conn != nil || s.c != c {
			t.Errorf("%T, WaitReplicas 0: session = %+v, %v; want the client itself", c, s, err)
		}
	}
	// A *redis.Client with WaitReplicas: a Conn of it.
	d := New(single, &Options{WaitReplicas: 1})
	s, err := d.session("acquire")
	if err != nil || s.conn == nil || d.repl.timeout != DefaultWaitTimeout {
		t.Errorf("*redis.Client, WaitReplicas 1: session = %+v, %v, timeout %v; want a Conn, the default timeout", s, err, d.repl.timeout)
	}
	s.close()
	// WAIT counts milliseconds: a sub-millisecond timeout rounds up, never to 0.
	if d := New(single, &Options{WaitReplicas: 1, WaitTimeout: 300 * time.Microsecond}); d.repl.timeout != time.Millisecond {
		t.Errorf("WaitTimeout 300µs: %v, want 1ms", d.repl.timeout)
	}
}

// scriptOnly is a Client that is neither a single-node client nor a
// cluster or ring. It counts its calls and fails each (a test using it can
// check that nothing was sent).
type scriptOnly struct{ calls *atomic.Int64 }

func (s scriptOnly) fail(ctx context.Context) *redis.Cmd {
	s.calls.Add(1)
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(errors.New("scriptOnly: no server"))
	return cmd
}
func (s scriptOnly) Eval(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return s.fail(ctx)
}
func (s scriptOnly) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return s.fail(ctx)
}
func (s scriptOnly) EvalRO(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return s.fail(ctx)
}
func (s scriptOnly) EvalShaRO(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return s.fail(ctx)
}
func (s scriptOnly) ScriptExists(ctx context.Context, _ ...string) *redis.BoolSliceCmd {
	s.calls.Add(1)
	cmd := redis.NewBoolSliceCmd(ctx)
	cmd.SetErr(errors.New("scriptOnly: no server"))
	return cmd
}
func (s scriptOnly) ScriptLoad(ctx context.Context, _ string) *redis.StringCmd {
	s.calls.Add(1)
	cmd := redis.NewStringCmd(ctx)
	cmd.SetErr(errors.New("scriptOnly: no server"))
	return cmd
}

// TestWaitReplicas_WaitTimeoutIsCutByTheDeadline: WAIT's timeout is
// WaitTimeout, cut short of the context's deadline by 100 ms plus a tenth
// of the time left (at most half of it), in whole milliseconds, never 0.
func TestWaitReplicas_WaitTimeoutIsCutByTheDeadline(t *testing.T) {
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = single.Close() })
	d := New(single, &Options{WaitReplicas: 1, WaitTimeout: 2 * time.Second})
	if got := d.waitTimeout(context.Background()); got != 2*time.Second {
		t.Errorf("no deadline: %v, want 2s", got)
	}
	for _, tc := range []struct {
		left     time.Duration
		min, max time.Duration
	}{
		{10 * time.Second, 2 * time.Second, 2 * time.Second},
		{2 * time.Second, 1690 * time.Millisecond, 1700 * time.Millisecond},      // 2 s − 100 ms − 200 ms
		{500 * time.Millisecond, 340 * time.Millisecond, 350 * time.Millisecond}, // 500 − 100 − 50
		{150 * time.Millisecond, 70 * time.Millisecond, 75 * time.Millisecond},   // half
		{time.Microsecond, time.Millisecond, time.Millisecond},
		{-time.Second, time.Millisecond, time.Millisecond},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), tc.left)
		got := d.waitTimeout(ctx)
		cancel()
		if got < tc.min || got > tc.max || got%time.Millisecond != 0 {
			t.Errorf("%v left: WAIT timeout %v, want whole ms in [%v, %v]", tc.left, got, tc.min, tc.max)
		}
	}
}

// TestOpenURL_WaitReplicasOptions: wait_replicas and wait_timeout are
// parsed (and not passed to go-redis, which would refuse them); malformed,
// negative or non-positive values are ErrInvalidArgument, never
// ErrUnavailable.
func TestOpenURL_WaitReplicasOptions(t *testing.T) {
	p := testservers.StartRedis(t)
	for _, tc := range []struct {
		query   string
		n       int
		timeout time.Duration
	}{
		{"", 0, 0},
		{"?wait_replicas=0", 0, 0},
		{"?wait_replicas=1", 1, DefaultWaitTimeout},
		{"?wait_replicas=2&wait_timeout=250ms", 2, 250 * time.Millisecond},
		{"?wait_timeout=2s&wait_replicas=1&hints=false&prefix=x", 1, 2 * time.Second},
		{"?wait_replicas=1&wait_timeout=1500us", 1, 2 * time.Millisecond},
		{"?wait_timeout=2s", 0, 0}, // ignored without wait_replicas
		{"?wait_replicas=0&wait_timeout=2s", 0, 0},
	} {
		d := openDriver(t, p.URL()+tc.query)
		if d.repl.n != tc.n || d.repl.timeout != tc.timeout || d.repl.err != nil {
			t.Errorf("%q: WaitReplicas %d, timeout %v, err %v; want %d, %v", tc.query, d.repl.n, d.repl.timeout, d.repl.err, tc.n, tc.timeout)
		}
	}
	for _, query := range []string{
		"?wait_replicas=-1", "?wait_replicas=x", "?wait_replicas=", "?wait_replicas=1.5", "?wait_replicas=1e3",
		"?wait_timeout=-1s", "?wait_timeout=0", "?wait_timeout=0s", "?wait_timeout=abc", "?wait_timeout=", "?wait_timeout=10",
		"?wait_replicas=1&wait_timeout=-5ms",
	} {
		d, err := Open(t.Context(), p.URL()+query)
		if err == nil {
			_ = d.Close()
			t.Errorf("%q: Open accepted it", query)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "wait_") {
			t.Errorf("%q: Open = %v; want ErrInvalidArgument naming the option", query, err)
		}
	}
}

// TestConformance_WaitReplicas runs the conformance suite with
// wait_replicas=1 against a primary with one replica: every grant and
// renewal waits for the replica. The replica follows on across the
// suite's stops and restarts of the primary (and its freezes).
func TestConformance_WaitReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("the conformance suite over wait_replicas=1 takes about 30 s")
	}
	p := testservers.StartRedis(t)
	testservers.StartRedisReplica(t, p)
	waitLink(t, p, 1)
	const q = "?wait_replicas=1"
	freezer := testservers.NewFreezer(t, func() []int { return []int{p.PID()} })
	dlocktest.Run(t, dlocktest.Harness{
		Name: "redis-wait-replicas",
		NewDriver: func(ctx context.Context) (driver.Driver, error) {
			return Open(ctx, p.URL()+q)
		},
		StopStore:   p.Stop,
		StartStore:  p.Start,
		FreezeStore: freezer.Freeze,
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return Open(ctx, "redis://"+via(p.Addr())+q)
		},
		TTL: time.Second,
	})
	// The suite's grants and renewals did wait (counted since the
	// primary's last restart).
	if info, err := p.Command("INFO", "commandstats"); err != nil || !strings.Contains(info, "cmdstat_wait:calls=") {
		t.Errorf("the primary ran no WAIT: %v\n%s", err, info)
	}
}

// lockNames are the Redis names of one lock key (for tests).
type lockNames struct{ lock, counter string }

func (d *Driver) keysFor(t *testing.T, key string) lockNames {
	t.Helper()
	lock, counter, _ := d.keys(key)
	return lockNames{lock, counter}
}

// waitFor polls cond every 5 ms until it holds, failing t after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
