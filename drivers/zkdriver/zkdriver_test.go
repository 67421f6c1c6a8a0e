package zkdriver_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/zkdriver"
	"github.com/dlock-dev/dlock/internal/netproxy"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const sessionTimeout = 2 * time.Second

// cutDialer dials normally until cut; cutting closes its connections and
// refuses new ones, as a partition between one client and the server.
type cutDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (c *cutDialer) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return nil, errors.New("cutDialer: cut off")
	}
	conn, err := net.DialTimeout(network, addr, timeout)
	if err == nil {
		c.conns = append(c.conns, conn)
	}
	return conn, err
}

func (c *cutDialer) Cut(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = on
	if on {
		for _, conn := range c.conns {
			conn.Close()
		}
		c.conns = nil
	}
}

type env struct {
	z       *testservers.ZooKeeper
	mu      sync.Mutex
	dialers map[driver.Driver]*cutDialer
	bg      sync.WaitGroup
}

func newEnv(t *testing.T) *env {
	e := &env{z: testservers.StartZooKeeper(t), dialers: map[driver.Driver]*cutDialer{}}
	t.Cleanup(e.bg.Wait)
	return e
}

func (e *env) open(ctx context.Context) (*zkdriver.Driver, *cutDialer, error) {
	u, err := url.Parse(e.z.URL() + fmt.Sprintf("?session_timeout=%s&op_timeout=1s", sessionTimeout))
	if err != nil {
		return nil, nil, err
	}
	cd := &cutDialer{}
	d, err := zkdriver.Open(ctx, u, &zkdriver.Options{Dialer: cd.Dial})
	if err != nil {
		return nil, nil, err
	}
	e.mu.Lock()
	e.dialers[d] = cd
	e.mu.Unlock()
	return d, cd, nil
}

func (e *env) mustOpen(t *testing.T) (*zkdriver.Driver, *cutDialer) {
	t.Helper()
	d, cd, err := e.open(t.Context())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d, cd
}

// mustOpenProxied opens a driver that reaches the server through a
// netproxy.Proxy, and returns both.
func (e *env) mustOpenProxied(t *testing.T) (*zkdriver.Driver, *netproxy.Proxy) {
	t.Helper()
	p, err := netproxy.New(e.z.Addr(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Release()
		_ = p.Close()
	})
	u, err := url.Parse(strings.Replace(e.z.URL(), e.z.Addr(), p.Addr(), 1) + fmt.Sprintf("?session_timeout=%s&op_timeout=1s", sessionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	d, err := zkdriver.Open(t.Context(), u, nil)
	if err != nil {
		t.Fatalf("Open via proxy: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d, p
}

// expire cuts d off for longer than the session timeout, so that the
// server expires its session, then lets it reconnect (with a new session).
// It returns at once; the reconnection happens in the background.
func (e *env) expire(d driver.Driver) error {
	e.mu.Lock()
	cd := e.dialers[d]
	e.mu.Unlock()
	if cd == nil {
		return fmt.Errorf("no dialer for %T", d)
	}
	cd.Cut(true)
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		time.Sleep(sessionTimeout + time.Second)
		cd.Cut(false)
	}()
	return nil
}

func TestConformance(t *testing.T) {
	e := newEnv(t)
	freezer := testservers.NewFreezer(t, func() []int { return []int{e.z.PID()} })
	dlocktest.Run(t, dlocktest.Harness{
		Name: "zk",
		NewDriver: func(ctx context.Context) (driver.Driver, error) {
			d, _, err := e.open(ctx)
			return d, err
		},
		StopStore:   func() error { e.z.Stop(); return nil },
		StartStore:  e.z.Start,
		FreezeStore: freezer.Freeze,
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			u, err := url.Parse(strings.Replace(e.z.URL(), e.z.Addr(), via(e.z.Addr()), 1) +
				fmt.Sprintf("?session_timeout=%s&op_timeout=1s", sessionTimeout))
			if err != nil {
				return nil, err
			}
			return zkdriver.Open(ctx, u, nil)
		},
		ResetEndsLease:       true,
		ResetEndsLeaseReason: "the driver declares every grant of a connection lost when the connection drops (it cannot tell a reset from a partition the server will expire)",
		TTL:                  time.Second,
		ForceExpiry:          func(ctx context.Context, d driver.Driver) error { return e.expire(d) },
	})
}

var ownerSeq atomic.Int64

func req(key string) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: fmt.Sprintf("%016x%016x", time.Now().UnixNano(), ownerSeq.Add(1)), TTL: time.Second, Holder: "test"}
}

func TestDriver(t *testing.T) {
	e := newEnv(t)
	d1, _ := e.mustOpen(t)
	d2, _ := e.mustOpen(t)

	t.Run("TryAcquireRenewReleaseFence", func(t *testing.T) {
		ctx := t.Context()
		r1 := req("k1")
		g1, err := d1.TryAcquire(ctx, r1)
		if err != nil || g1.Fence == 0 || g1.Lost == nil {
			t.Fatalf("TryAcquire = %+v, %v", g1, err)
		}
		if _, err := d2.TryAcquire(ctx, req("k1")); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("second TryAcquire err = %v, want ErrNotAcquired", err)
		}
		if err := d1.Renew(ctx, "k1", r1.Owner, time.Second); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if err := d1.Renew(ctx, "k1", "nobody", time.Second); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew unknown owner err = %v", err)
		}
		// Another session must not renew or release d1's node.
		if err := d2.Renew(ctx, "k1", r1.Owner, time.Second); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew from another session err = %v, want ErrLeaseLost", err)
		}
		if err := d2.Release(ctx, "k1", r1.Owner); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Release from another session err = %v, want ErrLeaseLost", err)
		}
		info, err := d2.Inspect(ctx, "k1")
		if err != nil || info.Fence != g1.Fence || info.Holder != "test" || info.TTL != time.Second {
			t.Fatalf("Inspect = %+v, %v", info, err)
		}
		if err := d1.Release(ctx, "k1", r1.Owner); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := d1.Release(ctx, "k1", r1.Owner); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("second Release err = %v, want ErrLeaseLost", err)
		}
		g2, err := d2.TryAcquire(ctx, req("k1"))
		if err != nil || g2.Fence <= g1.Fence {
			t.Fatalf("TryAcquire after release = %+v, %v (first fence %d)", g2, err, g1.Fence)
		}
	})

	t.Run("KeysWithSlashDotsAndEmoji", func(t *testing.T) {
		ctx := t.Context()
		keys := []string{"a", "a/b", "a%2Fb", "a/b/c", ".", "..", "/", "%", "x y:{z} ☃ 😀", "\u0001\u007f\uE000"}
		var reqs []driver.AcquireRequest
		for _, k := range keys {
			r := req(k)
			if _, err := d1.TryAcquire(ctx, r); err != nil {
				t.Fatalf("TryAcquire %q: %v", k, err)
			}
			reqs = append(reqs, r)
		}
		for _, k := range keys {
			if _, err := d2.TryAcquire(ctx, req(k)); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("TryAcquire %q by another = %v", k, err)
			}
		}
		list, err := d2.List(ctx, "a/")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range list {
			got = append(got, in.Key)
		}
		if fmt.Sprint(got) != "[a/b a/b/c]" {
			t.Fatalf("List(a/) = %q", got)
		}
		for _, r := range reqs {
			if err := d1.Release(ctx, r.Key, r.Owner); err != nil {
				t.Fatalf("Release %q: %v", r.Key, err)
			}
		}
	})

	t.Run("UnrenewedGrantIsFreedAfterTTL", func(t *testing.T) {
		ctx := t.Context()
		renewed := req("ttl/renewed")
		renewed.TTL = 300 * time.Millisecond
		stale := req("ttl/stale")
		stale.TTL = 300 * time.Millisecond
		for _, r := range []driver.AcquireRequest{renewed, stale} {
			if _, err := d1.TryAcquire(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		// One is renewed every 100 ms, the other never; the session lives.
		for range 6 {
			time.Sleep(100 * time.Millisecond)
			if err := d1.Renew(ctx, renewed.Key, renewed.Owner, renewed.TTL); err != nil {
				t.Fatalf("Renew: %v", err)
			}
		}
		if _, err := d2.TryAcquire(ctx, req("ttl/renewed")); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("renewed key: TryAcquire = %v, want ErrNotAcquired", err)
		}
		if _, err := d2.TryAcquire(ctx, req("ttl/stale")); err != nil {
			t.Fatalf("key not renewed for twice its TTL is still held: %v", err)
		}
		if err := d1.Renew(ctx, stale.Key, stale.Owner, stale.TTL); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew of the expired grant = %v, want ErrLeaseLost", err)
		}
		if err := d1.Release(ctx, renewed.Key, renewed.Owner); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("WaitFIFOAndCancel", func(t *testing.T) {
		ctx := t.Context()
		holder := req("fifo")
		if _, err := d1.TryAcquire(ctx, holder); err != nil {
			t.Fatal(err)
		}
		// A cancelled waiter leaves no node behind.
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := d2.Wait(cctx, req("fifo"))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait err = %v, want DeadlineExceeded", err)
		}
		if info, err := d2.Inspect(ctx, "fifo"); err != nil || info.Waiters != 0 {
			t.Fatalf("after cancel: Inspect = %+v, %v; want no waiters", info, err)
		}
		const n = 4
		order := make(chan int, n)
		var wg sync.WaitGroup
		for i := range n {
			r := req("fifo")
			d := d1
			if i%2 == 1 {
				d = d2
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := d.Wait(ctx, r); err != nil {
					t.Errorf("Wait %d: %v", i, err)
					return
				}
				order <- i
				time.Sleep(20 * time.Millisecond)
				if err := d.Release(ctx, "fifo", r.Owner); err != nil {
					t.Errorf("Release %d: %v", i, err)
				}
			}()
			waitFor(t, func() bool {
				info, err := d2.Inspect(ctx, "fifo")
				return err == nil && info.Waiters == i+1
			})
		}
		if err := d1.Release(ctx, "fifo", holder.Owner); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(order)
		var got []int
		for i := range order {
			got = append(got, i)
		}
		if fmt.Sprint(got) != "[0 1 2 3]" {
			t.Fatalf("grant order %v, want FIFO", got)
		}
	})
}

// TestSession_ExpiryLosesAllGrantsAndNewSessionAdoptsNothing: a client cut
// off past the session timeout has every grant pushed lost at once, the
// server hands the keys to others, and after it reconnects with a new
// session it adopts none of its old nodes, nor another session's node
// named with its owner token.
func TestSession_ExpiryLosesAllGrantsAndNewSessionAdoptsNothing(t *testing.T) {
	e := newEnv(t)
	d1, cd := e.mustOpen(t)
	d2, _ := e.mustOpen(t)
	ctx := t.Context()
	ra, rb := req("sess/a"), req("sess/b")
	ga, err := d1.TryAcquire(ctx, ra)
	if err != nil {
		t.Fatal(err)
	}
	gb, err := d1.TryAcquire(ctx, rb)
	if err != nil {
		t.Fatal(err)
	}
	oldSession := d1.SessionID()
	cutAt := time.Now() // the session's expiry runs from the cut
	cd.Cut(true)
	for _, g := range []driver.Grant{ga, gb} {
		select {
		case <-g.Lost:
		case <-time.After(sessionTimeout):
			t.Fatal("Grant.Lost not closed after the connection was cut")
		}
	}
	// The server expires the session and deletes the nodes: d2 gets in.
	wctx, cancel := context.WithTimeout(ctx, 3*sessionTimeout)
	defer cancel()
	g2, err := d2.Wait(wctx, req("sess/a"))
	if err != nil {
		t.Fatalf("d2 Wait after d1's session expiry: %v", err)
	}
	if since := time.Since(cutAt); since < sessionTimeout/2 {
		t.Fatalf("d2 granted %v after the cut, before the session could expire", since)
	}
	if g2.Fence <= ga.Fence {
		t.Fatalf("fence %d not greater than %d", g2.Fence, ga.Fence)
	}
	cd.Cut(false)
	waitFor(t, func() bool { s := d1.SessionID(); return s != 0 && s != oldSession })
	for _, r := range []driver.AcquireRequest{ra, rb} {
		if err := d1.Renew(ctx, r.Key, r.Owner, time.Second); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew of %q after expiry = %v, want ErrLeaseLost", r.Key, err)
		}
	}
	// A node named with d1's owner token but owned by another session
	// (d2) is never taken as d1's.
	raw, _, err := zk.Connect([]string{e.z.Addr()}, sessionTimeout, zk.WithLogInfo(false), zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	r3 := req("sess/c")
	if _, err := d2.TryAcquire(ctx, r3); err != nil { // creates the key's node
		t.Fatal(err)
	}
	if err := d2.Release(ctx, r3.Key, r3.Owner); err != nil {
		t.Fatal(err)
	}
	foreign := req("sess/c")
	if _, err := raw.Create("/dlock/.locks/sess%2Fc/"+foreign.Owner+"-", nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if err := d1.Renew(ctx, foreign.Key, foreign.Owner, time.Second); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew of another session's node = %v, want ErrLeaseLost", err)
	}
	if err := d1.Release(ctx, foreign.Key, foreign.Owner); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Release of another session's node = %v, want ErrLeaseLost", err)
	}
	if info, err := d2.Inspect(ctx, "sess/c"); err != nil || info.Waiters != 0 {
		t.Fatalf("the foreign node was touched: Inspect = %+v, %v", info, err)
	}
}

// TestSession_MissedSessionEventsDoNotStrandTheDriver: go-zookeeper sends
// session events into a channel of 6 and drops them when it is full, so a
// driver that follows only the events can miss the new session after an
// expiry (and stay without a session for good) or miss the expiry (and
// keep using a generation whose session is gone). Here the driver's event
// loop is stalled while one client's link is held past its session
// timeout, another client is granted the key, and the link heals: the
// healed driver must still declare its old grant lost, never adopt it, and
// acquire again within a bounded time, whether its event loop catches up
// after the heal or stays stalled. (When the loop read go-zookeeper's
// channel, the stall made the library drop StateHasSession: the driver
// stayed without a session for good, as reported; when stalled throughout,
// it kept the expired session's generation and never closed Grant.Lost.)
func TestSession_MissedSessionEventsDoNotStrandTheDriver(t *testing.T) {
	e := newEnv(t)
	d2, _ := e.mustOpen(t)
	for _, tc := range []struct {
		name            string
		resumeAfterHeal bool
	}{
		{"EventLoopResumedAfterHeal", true},
		{"EventLoopStalledThroughout", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			d1, p := e.mustOpenProxied(t)
			k := "missed/" + tc.name
			r := req(k)
			g, err := d1.TryAcquire(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			oldSession := d1.SessionID()
			resume := zkdriver.StallRunLoop(d1)
			t.Cleanup(resume)
			p.Hold()
			heal := sync.OnceFunc(p.Release)
			t.Cleanup(heal)
			// d2 is granted the key once the server has expired d1's
			// session.
			wctx, cancel := context.WithTimeout(ctx, 5*sessionTimeout)
			defer cancel()
			r2 := req(k)
			r2.TTL = time.Minute // not freed as unrenewed while the test runs
			g2, err := d2.Wait(wctx, r2)
			if err != nil {
				t.Fatalf("d2 Wait while d1's link is held: %v", err)
			}
			heal()
			healedAt := time.Now()
			// The client library gets a new session within a bounded
			// time of the heal; only then does the event loop resume,
			// when the events it missed are gone.
			waitFor(t, func() bool { s := zkdriver.ConnSession(d1); return s != 0 && s != oldSession })
			t.Logf("the connection has a new session %v after the heal", time.Since(healedAt))
			if tc.resumeAfterHeal {
				resume()
			}

			// The old grant is lost and never adopted: its owner token
			// releases nothing, and d2 keeps the key.
			rerr := storeAnswer(t, func() error { return d1.Release(ctx, k, r.Owner) })
			if !errors.Is(rerr, driver.ErrLeaseLost) {
				t.Fatalf("Release of the expired grant after the heal = %v, want ErrLeaseLost", rerr)
			}
			select {
			case <-g.Lost:
			default:
				t.Fatal("Grant.Lost of the expired session's grant still open after the heal")
			}
			if info, err := d2.Inspect(ctx, k); err != nil || info.Fence != g2.Fence {
				t.Fatalf("Inspect after the heal = %+v, %v; want d2's grant (fence %d)", info, err, g2.Fence)
			}
			if err := d2.Release(ctx, k, r2.Owner); err != nil {
				t.Fatal(err)
			}

			// d1 acquires again within a bounded time of the heal, in a
			// new session.
			const bound = 10 * time.Second
			var g3 driver.Grant
			r3 := req(k)
			r3.TTL = time.Minute
			for {
				g3, err = d1.TryAcquire(ctx, r3)
				if err == nil {
					break
				}
				if time.Since(healedAt) > bound {
					t.Fatalf("d1 still cannot acquire %v after the heal: %v", time.Since(healedAt), err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("d1 acquired again %v after the heal", time.Since(healedAt))
			if s := d1.SessionID(); s == 0 || s == oldSession {
				t.Fatalf("d1 acquired in session %x, want a new one (old %x)", s, oldSession)
			}
			if g3.Fence <= g2.Fence {
				t.Fatalf("fence %d not greater than %d", g3.Fence, g2.Fence)
			}
			resume()
			if err := d1.Renew(ctx, k, r3.Owner, time.Second); err != nil {
				t.Fatalf("Renew of the new grant: %v", err)
			}
			if err := d1.Release(ctx, k, r3.Owner); err != nil {
				t.Fatalf("Release of the new grant: %v", err)
			}
		})
	}
}

// TestSession_DisconnectLosesAndCleansUp: a short disconnect (the session
// survives) pushes the loss at once, and the nodes given up are deleted as
// soon as the session is back, so the key does not stay held.
func TestSession_DisconnectLosesAndCleansUp(t *testing.T) {
	e := newEnv(t)
	d1, cd := e.mustOpen(t)
	d2, _ := e.mustOpen(t)
	ctx := t.Context()
	r := req("blip")
	g, err := d1.TryAcquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	session := d1.SessionID()
	cd.Cut(true)
	select {
	case <-g.Lost:
	case <-time.After(sessionTimeout):
		t.Fatal("Grant.Lost not closed on disconnect")
	}
	time.Sleep(200 * time.Millisecond)
	cd.Cut(false)
	wctx, cancel := context.WithTimeout(ctx, sessionTimeout)
	defer cancel()
	if _, err := d2.Wait(wctx, req("blip")); err != nil {
		t.Fatalf("key still held after d1 reconnected: %v", err)
	}
	if d1.SessionID() != session {
		t.Logf("note: the session changed (%x → %x)", session, d1.SessionID())
	}
	if err := d1.Renew(ctx, "blip", r.Owner, time.Second); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after the loss = %v, want ErrLeaseLost", err)
	}
}

// TestLocker_CutOffLosesLeaseAtOnce checks through the root API that a
// client cut off from ZooKeeper loses its lease when the connection drops,
// long before its 30 s TTL and before the server could expire the session:
// Done closes with ErrLeaseLost.
func TestLocker_CutOffLosesLeaseAtOnce(t *testing.T) {
	e := newEnv(t)
	d1, cd := e.mustOpen(t)
	locker := dlock.New(d1, dlock.WithTTL(30*time.Second))
	defer locker.Close()
	lease, err := locker.Acquire(t.Context(), "root/expiry")
	if err != nil {
		t.Fatal(err)
	}
	cd.Cut(true)
	select {
	case <-lease.Done():
	case <-time.After(sessionTimeout):
		t.Fatal("lease not lost")
	}
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) || !errors.Is(context.Cause(lease.Context()), dlock.ErrLeaseLost) {
		t.Fatalf("Err %v cause %v", lease.Err(), context.Cause(lease.Context()))
	}
	cd.Cut(false)
}

// TestDriver_CallsReturnOnContextEnd: go-zookeeper's calls take no
// context; with the server paused (SIGSTOP) every driver call must still
// return when its context ends, and a node created by an abandoned call is
// deleted once the server answers.
func TestDriver_CallsReturnOnContextEnd(t *testing.T) {
	e := newEnv(t)
	d1, _ := e.mustOpen(t)
	d2, _ := e.mustOpen(t)
	ctx := t.Context()
	r := req("paused")
	if _, err := d1.TryAcquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	pid := e.z.PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The signal is asynchronous: wait until every thread has stopped.
	waitFor(t, func() bool { return allStopped(pid) })
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	calls := map[string]func(ctx context.Context) error{
		"TryAcquire": func(ctx context.Context) error { _, err := d2.TryAcquire(ctx, req("paused-2")); return err },
		"Wait":       func(ctx context.Context) error { _, err := d2.Wait(ctx, req("paused")); return err },
		"Renew":      func(ctx context.Context) error { return d1.Renew(ctx, "paused", "someone", time.Second) },
		"Inspect":    func(ctx context.Context) error { _, err := d2.Inspect(ctx, "paused"); return err },
	}
	for name, call := range calls {
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		start := time.Now()
		err := call(cctx)
		cancel()
		if took := time.Since(start); took > 700*time.Millisecond {
			t.Errorf("%s returned %v after its context ended", name, took-200*time.Millisecond)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with the server paused = %v, want DeadlineExceeded", name, err)
		}
	}
	resume()
	// The abandoned TryAcquire and Wait created nodes when the server woke
	// up; they are deleted, so only d1's holder is left.
	waitFor(t, func() bool {
		info, err := d2.Inspect(ctx, "paused")
		if err != nil || info.Waiters != 0 {
			return false
		}
		_, err = d2.Inspect(ctx, "paused-2")
		return errors.Is(err, driver.ErrNotAcquired)
	})
	if err := d1.Release(ctx, "paused", r.Owner); err != nil {
		t.Fatalf("Release after the pause: %v", err)
	}
}

func TestOpen_UnreachableIsUnavailable(t *testing.T) {
	port := testservers.FreePort(t)
	start := time.Now()
	_, err := dlock.Open(t.Context(), fmt.Sprintf("zk://127.0.0.1:%d/dlock?session_timeout=1s&op_timeout=500ms", port))
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Open of an unreachable ZooKeeper = %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("Open took %v", took)
	}
}

// allStopped reports whether every thread of process pid is stopped
// (state T in /proc/pid/task/*/stat).
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name in parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}

// storeAnswer calls fn until it returns something other than
// driver.ErrUnavailable (the store answered), for at most 10 s, and returns
// that.
func storeAnswer(t *testing.T, fn func() error) error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := fn()
		if !errors.Is(err, driver.ErrUnavailable) {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("store still unavailable after 10s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
