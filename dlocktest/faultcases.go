package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/netproxy"
)

// awaitWaiting waits until an acquisition of key through fd is waiting: a
// Wait call is in flight in the driver, or a polling attempt has found the
// key held. When the store reports its queue (an Inspector whose Waiters is
// not -1), it also waits until the store counts the waiter.
func awaitWaiting(t TB, fd *FaultDriver, probe *dlock.Locker, key string) {
	t.Helper()
	waitFor(t, 10*time.Second, func() bool { return fd.Waiting(key) > 0 || fd.Refused(key) > 0 },
		fmt.Sprintf("an acquisition of %q to be waiting", key))
	if fd.Waiting(key) == 0 {
		return // polling: it has seen the key held
	}
	if _, ok := probe.Driver().(driver.Inspector); !ok {
		return
	}
	waitFor(t, 10*time.Second, func() bool {
		info, err := probe.Inspect(t.Context(), key)
		return err == nil && (info.Waiters < 0 || info.Waiters >= 1)
	}, fmt.Sprintf("the store to queue the waiter on %q", key))
}

func (s *suite) skipNoFreeze(t TB) {
	t.Helper()
	if s.h.FreezeStore == nil || s.h.ThawStore == nil {
		t.Skipf("%s harness cannot freeze the store: %s", s.h.Name, orDefault(s.h.NoFreezeReason, "no FreezeStore/ThawStore"))
	}
}

func (s *suite) skipNoLink(t TB) {
	t.Helper()
	if s.h.NewDriverVia == nil {
		t.Skipf("%s harness cannot put a proxy on one client's link: %s", s.h.Name, orDefault(s.h.NoLinkReason, "no NewDriverVia"))
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// freeze freezes the store and makes sure it is thawed when the subtest
// ends, whatever happens. It returns the thaw function (safe to call more
// than once).
func (s *suite) freeze(t TB) (thaw func()) {
	t.Helper()
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			if err := s.h.ThawStore(); err != nil {
				t.Errorf("ThawStore: %v", err)
			}
		})
	}
	t.Cleanup(thaw)
	if err := s.h.FreezeStore(); err != nil {
		t.Fatalf("FreezeStore: %v", err)
	}
	return thaw
}

// testFrozen: the store accepts connections but never answers (its
// processes are stopped). Every call that touches it returns within the op
// timeout plus slack: acquisitions, a renewal and a release with
// ErrUnavailable (the renewal with some error), and Close of a locker that
// holds a lease and has an acquisition pending returns at all. A held
// lease is lost by its deadline. After the thaw the store works again.
func (s *suite) testFrozen(t TB) {
	s.skipNoFreeze(t)
	const op = 2 * time.Second
	ttl := s.h.TTL
	a, fa := s.locker(t, dlock.WithOpTimeout(op))
	b, _ := s.locker(t, dlock.WithOpTimeout(op))
	c, fc := s.locker(t, dlock.WithOpTimeout(op))
	k := key(t, "k")
	held := mustAcquire(t, a, k, dlock.WithTTL(ttl))
	toRelease := mustAcquire(t, a, key(t, "released"), dlock.WithTTL(30*time.Second))
	toRenew := mustAcquire(t, a, key(t, "renewed"), dlock.WithTTL(30*time.Second))
	mustAcquire(t, c, key(t, "closed"), dlock.WithTTL(30*time.Second)) // ended by c.Close
	blocker := mustAcquire(t, b, key(t, "blocked"), dlock.WithTTL(30*time.Second))
	pending := make(chan error, 1)
	var pendingAt time.Time
	go func() {
		ls, err := c.Acquire(t.Context(), blocker.Key())
		pendingAt = time.Now()
		if err == nil {
			_ = ls.Release(t.Context())
			err = errors.New("granted a held key")
		}
		pending <- err
	}()
	awaitWaiting(t, fc, b, blocker.Key())

	probe := startProbe(t)
	heldLost := watchDone(t, held)
	thaw := s.freeze(t)
	frozenAt := time.Now()
	type result struct {
		what string
		took time.Duration
		err  error
	}
	results := make(chan result, 5)
	timed := func(what string, fn func() error) {
		go func() {
			began := time.Now()
			err := fn()
			results <- result{what, time.Since(began), err}
		}()
	}
	timed("TryAcquire", func() error {
		ls, err := b.TryAcquire(t.Context(), key(t, "try"))
		if err == nil {
			_ = ls.Release(t.Context())
		}
		return err
	})
	timed("Acquire", func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		// No retry budget: one attempt, bounded by the op timeout (by
		// default a waiting Acquire retries until its ctx ends).
		ls, err := b.Acquire(ctx, key(t, "wait"), dlock.WithRetryFor(0))
		if err == nil {
			_ = ls.Release(t.Context())
		}
		return err
	})
	timed("Release", func() error { return toRelease.Release(t.Context()) })
	timed("Renew", func() error {
		ctx, cancel := context.WithTimeout(t.Context(), op)
		defer cancel()
		return fa.Inner().Renew(ctx, toRenew.Key(), toRenew.Owner(), 30*time.Second)
	})
	timed("Close", c.Close)

	awaitLost(t, probe, held, "held lease with the store frozen", 10*time.Second, heldLost)
	for range 5 {
		r := <-results
		limit := op + probe.slack(time.Second)
		t.Logf("%s with the store frozen: %v after %v (allowed %v)", r.what, r.err, r.took, limit)
		if r.took > limit {
			t.Errorf("%s took %v with the store frozen, more than the op timeout %v plus slack", r.what, r.took, op)
		}
		switch r.what {
		case "Close":
			// Close reports nothing about the store; that it returned in
			// time is the point.
		case "Renew":
			if r.err == nil {
				t.Errorf("driver Renew with the store frozen = nil, want an error")
			}
		default:
			if !errors.Is(r.err, dlock.ErrUnavailable) {
				t.Errorf("%s with the store frozen = %v, want ErrUnavailable", r.what, r.err)
			}
		}
	}
	// The pending acquisition ends when Close starts; its clean-up on the
	// store (a Waiter's queue entry) is bounded by the op timeout too.
	select {
	case err := <-pending:
		took, limit := pendingAt.Sub(frozenAt), op+probe.slack(time.Second)
		t.Logf("pending Acquire returned %v after Close began (allowed %v): %v", took, limit, err)
		if !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("pending Acquire after Close with the store frozen = %v, want ErrClosed", err)
		}
		if took > limit {
			t.Errorf("pending Acquire returned %v after Close began with the store frozen, more than the op timeout %v plus slack", took, op)
		}
	case <-time.After(time.Until(frozenAt.Add(2*op + 10*time.Second))):
		t.Fatal("pending Acquire did not return after Close with the store frozen")
	}

	thaw()
	// The store works again: through a client that was connected before
	// the freeze, a new key at once, and the lost lease's key once the
	// store has expired its grant.
	var after *dlock.Lease
	waitFor(t, 30*time.Second, func() bool {
		var err error
		after, err = a.TryAcquire(t.Context(), key(t, "after"))
		return err == nil
	}, "acquisitions to work after the thaw")
	release(t, after)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	lb, err := b.Acquire(ctx, k, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatalf("the frozen lease's key after the thaw: %v", err)
	}
	release(t, lb)
	_ = blocker.Release(t.Context())
}

// proxied opens a Locker whose driver reaches the store through fault
// proxies (one per server address), and returns them.
func (s *suite) proxied(t TB, opts ...dlock.Option) (*dlock.Locker, *FaultDriver, *proxySet) {
	t.Helper()
	ps := &proxySet{seed: rand.Uint64()}
	t.Logf("proxy seed %d", ps.seed)
	t.Cleanup(ps.close)
	var failed error
	via := func(addr string) string {
		p, err := ps.start(addr)
		if err != nil {
			failed = err
			return addr
		}
		return p.Addr()
	}
	d, err := s.h.NewDriverVia(t.Context(), via)
	if failed != nil {
		if d != nil {
			_ = d.Close()
		}
		t.Fatalf("proxy: %v", failed)
	}
	if err != nil {
		t.Fatalf("%s: NewDriverVia: %v", s.h.Name, err)
	}
	if ps.len() == 0 {
		_ = d.Close()
		t.Fatalf("%s: NewDriverVia never called via: the driver does not go through the proxy", s.h.Name)
	}
	fd := NewFaultDriver(d, t.Logf)
	base := []dlock.Option{
		dlock.WithStoreName(s.h.Name + "-proxied"), dlock.WithTTL(10 * time.Second),
		dlock.WithBackoff(time.Millisecond, 25*time.Millisecond), dlock.WithOpTimeout(2 * time.Second),
	}
	l := dlock.New(fd, append(base, opts...)...)
	t.Cleanup(func() { _ = l.Close() })
	return l, Faults(fd), ps
}

// proxySet is the fault proxies of one proxied driver.
type proxySet struct {
	seed uint64
	mu   sync.Mutex
	ps   []*netproxy.Proxy
}

func (ps *proxySet) start(target string) (*netproxy.Proxy, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, err := netproxy.New(target, ps.seed+uint64(len(ps.ps)))
	if err != nil {
		return nil, err
	}
	ps.ps = append(ps.ps, p)
	return p, nil
}

func (ps *proxySet) each(fn func(p *netproxy.Proxy)) {
	ps.mu.Lock()
	list := append([]*netproxy.Proxy(nil), ps.ps...)
	ps.mu.Unlock()
	for _, p := range list {
		fn(p)
	}
}

func (ps *proxySet) len() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.ps)
}

func (ps *proxySet) close() {
	ps.each(func(p *netproxy.Proxy) {
		p.Release()
		_ = p.Close()
	})
}

// testLinkReset: every connection of one client is reset once while it
// holds a lease whose TTL leaves room for a reconnection. A store whose
// grants outlive a connection keeps the lease (the next renewal goes over a
// new connection); a store where a reset ends the client's grants
// (Harness.ResetEndsLease) must report the loss instead. Either way the key
// is then usable again.
func (s *suite) testLinkReset(t TB) {
	s.skipNoLink(t)
	// Long enough for a client library's reconnection backoff (gRPC's
	// first retry waits about a second).
	ttl := max(5*time.Second, 3*s.h.TTL)
	drift := ttl/100 + 2*time.Millisecond // the root's default
	a, _, ps := s.proxied(t)
	b, _ := s.locker(t)
	k := key(t, "k")
	la := mustAcquire(t, a, k, dlock.WithTTL(ttl))
	cutAt := time.Now()
	cut := 0
	ps.each(func(p *netproxy.Proxy) { cut += p.Cut() })
	t.Logf("reset %d connections of the proxied client", cut)
	if cut == 0 {
		t.Fatal("the proxied client had no open connection to reset")
	}
	// Kept means a renewal sent after the reset was confirmed: the
	// deadline moved past cutAt + TTL - drift.
	kept := func() bool { return la.Deadline().After(cutAt.Add(ttl - drift)) }
	timer := time.NewTimer(time.Until(cutAt.Add(ttl + 5*time.Second)))
	defer timer.Stop()
	for lost := false; !kept() && !lost; {
		select {
		case <-la.Done():
			lost = true
		case <-timer.C:
			t.Fatalf("lease neither renewed nor lost %v after the reset", time.Since(cutAt))
		case <-time.After(5 * time.Millisecond):
		}
	}
	select {
	case <-la.Done():
		if !errors.Is(la.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("lease ended after the reset with %v, want ErrLeaseLost", la.Err())
		}
		if !s.h.ResetEndsLease {
			t.Fatalf("lease lost %v after a connection reset, within its %v TTL: %v", time.Since(cutAt), ttl, la.Err())
		}
		t.Logf("lease lost %v after the reset, as %s's harness says it must be: %s", time.Since(cutAt), s.h.Name, s.h.ResetEndsLeaseReason)
		// The key comes free (the store ended the grant), and the client
		// acquires again over new connections.
		ctx, cancel := context.WithTimeout(t.Context(), 10*ttl+10*time.Second)
		defer cancel()
		lb, err := b.Acquire(ctx, k, dlock.WithTTL(ttl))
		if err != nil {
			t.Fatalf("another client after the reset ended the lease: %v", err)
		}
		release(t, lb)
	default:
		t.Logf("lease renewed over a new connection %v after the reset", time.Since(cutAt))
		if s.h.ResetEndsLease {
			t.Logf("%s's harness says a reset ends the lease (%s); this time a renewal was confirmed first", s.h.Name, s.h.ResetEndsLeaseReason)
		}
		assertHeld(t, b, k)
		release(t, la)
	}
	var again *dlock.Lease
	waitFor(t, 20*time.Second, func() bool {
		var err error
		again, err = a.TryAcquire(t.Context(), k, dlock.WithTTL(ttl))
		return err == nil
	}, "the reset client to acquire again")
	release(t, again)
}

// testLinkHealed: one client's link to the store is held (a blackhole: the
// connections stay open, nothing is delivered) while it holds a key, until
// the store has expired its grant and another client has been granted the
// key; then the link heals. The held lease is lost by its deadline, before
// the other client's grant; the healed client never adopts its old grant
// (a release with its owner token leaves the new holder alone), and it can
// acquire again within a bounded time (a client library that was
// disconnected past its session must establish a new one).
func (s *suite) testLinkHealed(t TB) {
	s.skipNoLink(t)
	ttl := s.h.TTL
	a, fa, ps := s.proxied(t)
	b, _ := s.locker(t)
	c, _ := s.locker(t)
	k := key(t, "k")
	la := mustAcquire(t, a, k, dlock.WithTTL(ttl))
	probe := startProbe(t)
	lost := watchDone(t, la)
	ps.each(func(p *netproxy.Proxy) { p.Hold() })
	heal := sync.OnceFunc(func() { ps.each(func(p *netproxy.Proxy) { p.Release() }) })
	t.Cleanup(heal)
	heldAt := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 10*ttl+20*time.Second)
	defer cancel()
	lb, err := b.Acquire(ctx, k, dlock.WithTTL(ttl))
	grantedB := time.Now()
	if err != nil {
		t.Fatalf("another client could not take the key %v after the holder's link was held: %v", time.Since(heldAt), err)
	}
	defer func() { _ = lb.Release(context.WithoutCancel(t.Context())) }()
	t.Logf("B granted %v after the holder's link was held", grantedB.Sub(heldAt))
	awaitLost(t, probe, la, "lease of the client whose link is held", 5*time.Second, lost)
	if !la.Deadline().Before(grantedB) {
		t.Errorf("B was granted %v before A's deadline", la.Deadline().Sub(grantedB))
	}

	heal()
	healedAt := time.Now()
	// The old grant is not adopted: A's owner token releases nothing.
	err = storeAnswer(t, func(ctx context.Context) error { return fa.Inner().Release(ctx, k, la.Owner()) })
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("driver Release with the lost owner's token after the heal = %v, want ErrLeaseLost", err)
	}
	assertHeld(t, c, k)
	if lb.Err() != nil {
		t.Fatalf("B's lease ended: %v", lb.Err())
	}
	release(t, lb)

	// A acquires again, within a bounded time of the heal.
	const bound = 20 * time.Second
	var again *dlock.Lease
	var last error
	deadline := healedAt.Add(bound)
	for {
		actx, acancel := context.WithTimeout(t.Context(), 2*time.Second)
		again, last = a.Acquire(actx, k, dlock.WithTTL(ttl))
		acancel()
		if last == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the healed client still cannot acquire %v after the heal: %v", time.Since(healedAt), last)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the healed client acquired again %v after the heal", time.Since(healedAt))
	assertHeld(t, c, k)
	release(t, again)
}
