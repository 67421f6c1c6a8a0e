package dlockddriver_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server/servertest"
)

func view(t *testing.T, d *dlockddriver.Driver, mode driver.Mode, limit int) driver.Driver {
	t.Helper()
	v, err := d.SharedView(driver.SharedKind{Mode: mode, Limit: limit})
	if err != nil {
		t.Fatalf("SharedView(%v, %d): %v", mode, limit, err)
	}
	return v
}

// TestSharedView_Semaphore: a key of 2 permits grants two Shared grants
// with distinct, increasing fences, refuses a third, an Exclusive grant
// and a plain lock, refuses another limit naming the key's, and frees a
// permit on release.
func TestSharedView_Semaphore(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ctx := t.Context()
	d1, d2 := dial(t, srv.Addr(), nil), dial(t, srv.Addr(), nil)
	sem1, sem2 := view(t, d1, driver.Shared, 2), view(t, d2, driver.Shared, 2)
	req := func(i int) driver.AcquireRequest {
		return driver.AcquireRequest{Key: "sem", Owner: owner(i, "sem"), TTL: 10 * time.Second, Holder: "permit"}
	}
	g1, err := sem1.TryAcquire(ctx, req(1))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := sem2.TryAcquire(ctx, req(2))
	if err != nil {
		t.Fatal(err)
	}
	if g2.Fence <= g1.Fence {
		t.Fatalf("fences %d then %d, want increasing", g1.Fence, g2.Fence)
	}
	if _, err := sem1.TryAcquire(ctx, req(3)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("third permit of 2: %v, want ErrNotAcquired", err)
	}
	if _, err := view(t, d2, driver.Exclusive, 0).TryAcquire(ctx, req(4)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("exclusive grant of a key with permits taken: %v, want ErrNotAcquired", err)
	}
	if _, err := d2.TryAcquire(ctx, req(5)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("plain lock of a key with permits taken: %v, want ErrNotAcquired", err)
	}
	_, err = view(t, d2, driver.Shared, 3).TryAcquire(ctx, req(6))
	if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "limit of 2") {
		t.Fatalf("another limit: %v, want ErrInvalidArgument naming the key's limit 2", err)
	}
	if info, err := sem1.(driver.Inspector).Inspect(ctx, "sem"); err != nil || info.Fence != g1.Fence || info.Holder != "permit" {
		t.Fatalf("Inspect: %+v %v, want the oldest grant (fence %d)", info, err, g1.Fence)
	}
	if err := sem2.Renew(ctx, "sem", owner(2, "sem"), 5*time.Second); err != nil {
		t.Fatalf("Renew of a permit: %v", err)
	}
	if err := sem1.Release(ctx, "sem", owner(1, "sem")); err != nil {
		t.Fatal(err)
	}
	if err := sem1.Release(ctx, "sem", owner(1, "sem")); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second release: %v, want ErrLeaseLost", err)
	}
	g3, err := sem1.TryAcquire(ctx, req(3))
	if err != nil {
		t.Fatalf("permit after a release: %v", err)
	}
	if g3.Fence <= g2.Fence {
		t.Fatalf("fence %d after %d", g3.Fence, g2.Fence)
	}
	for _, k := range []driver.SharedKind{{Mode: driver.Shared, Limit: -1}, {Mode: driver.Shared, Limit: driver.MaxPermits + 1}, {Mode: driver.Exclusive, Limit: 2}, {}} {
		if _, err := d1.SharedView(k); !errors.Is(err, driver.ErrInvalidArgument) {
			t.Errorf("SharedView(%+v) = %v, want ErrInvalidArgument", k, err)
		}
	}
	if err := sem1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sem2.Release(ctx, "sem", owner(2, "sem")); err != nil { // the view's Close closed nothing
		t.Fatal(err)
	}
}

// TestSharedView_RWLockWriterPreference: a waiting writer holds back a
// later reader; the readers' releases hand the key to the writer, whose
// release hands it to every reader queued behind it, in one entry, each
// with its own fence.
func TestSharedView_RWLockWriterPreference(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ctx := t.Context()
	d := dial(t, srv.Addr(), nil)
	r, w := view(t, d, driver.Shared, 0), view(t, d, driver.Exclusive, 0)
	req := func(i int) driver.AcquireRequest {
		return driver.AcquireRequest{Key: "rw", Owner: owner(i, "rw"), TTL: 10 * time.Second}
	}
	var readFences []uint64
	for i := 1; i <= 2; i++ {
		g, err := r.TryAcquire(ctx, req(i))
		if err != nil {
			t.Fatal(err)
		}
		readFences = append(readFences, g.Fence)
	}
	type res struct {
		g   driver.Grant
		err error
	}
	wch := make(chan res, 1)
	go func() {
		g, err := w.(driver.Waiter).Wait(ctx, req(10))
		wch <- res{g, err}
	}()
	waitUntil(t, func() bool {
		info, _ := r.(driver.Inspector).Inspect(ctx, "rw")
		return info.Waiters == 1
	})
	if _, err := r.TryAcquire(ctx, req(3)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("reader while a writer waits: %v, want ErrNotAcquired (writer preference)", err)
	}
	rch := make(chan res, 2)
	for i := 3; i <= 4; i++ {
		go func() {
			g, err := r.(driver.Waiter).Wait(ctx, req(i))
			rch <- res{g, err}
		}()
	}
	waitUntil(t, func() bool {
		info, _ := r.(driver.Inspector).Inspect(ctx, "rw")
		return info.Waiters == 3
	})
	for i := 1; i <= 2; i++ {
		select {
		case x := <-wch:
			t.Fatalf("writer granted while %d readers hold: %+v", 3-i, x)
		default:
		}
		if err := r.Release(ctx, "rw", owner(i, "rw")); err != nil {
			t.Fatal(err)
		}
	}
	var wg driver.Grant
	select {
	case x := <-wch:
		if x.err != nil {
			t.Fatal(x.err)
		}
		wg = x.g
	case <-time.After(10 * time.Second):
		t.Fatal("writer not granted after the readers left")
	}
	if wg.Fence <= readFences[1] {
		t.Fatalf("writer fence %d not after the readers' %v", wg.Fence, readFences)
	}
	select {
	case x := <-rch:
		t.Fatalf("reader granted while the writer holds: %+v", x)
	case <-time.After(100 * time.Millisecond):
	}
	if err := w.Release(ctx, "rw", owner(10, "rw")); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for range 2 {
		select {
		case x := <-rch:
			if x.err != nil {
				t.Fatal(x.err)
			}
			if x.g.Fence <= wg.Fence || seen[x.g.Fence] {
				t.Fatalf("reader fence %d (writer's %d, seen %v)", x.g.Fence, wg.Fence, seen)
			}
			seen[x.g.Fence] = true
		case <-time.After(10 * time.Second):
			t.Fatal("queued readers not granted after the writer left")
		}
	}
	for i := 3; i <= 4; i++ {
		if err := r.Release(ctx, "rw", owner(i, "rw")); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharedView_LossPushedAndHandedOver: a Shared grant that is not
// renewed expires; its loss is pushed (Grant.Lost) and its permit goes to
// the waiter.
func TestSharedView_LossPushedAndHandedOver(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ctx := t.Context()
	d1, d2 := dial(t, srv.Addr(), nil), dial(t, srv.Addr(), nil)
	sem1, sem2 := view(t, d1, driver.Shared, 1), view(t, d2, driver.Shared, 1)
	const ttl = 300 * time.Millisecond
	var g driver.Grant
	waitUntil(t, func() bool { // the Watch stream may still be subscribing
		var err error
		g, err = sem1.TryAcquire(ctx, driver.AcquireRequest{Key: "lost", Owner: owner(1, "lost"), TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if g.Lost == nil {
			t.Fatal("Grant.Lost is nil")
		}
		return true
	})
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g2, err := sem2.(driver.Waiter).Wait(wctx, driver.AcquireRequest{Key: "lost", Owner: owner(2, "lost"), TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g2.Fence <= g.Fence {
		t.Fatalf("fence %d after %d", g2.Fence, g.Fence)
	}
	select {
	case <-g.Lost:
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after the Shared grant expired")
	}
	if err := sem1.Renew(ctx, "lost", owner(1, "lost"), ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after expiry: %v, want ErrLeaseLost", err)
	}
}

// TestSharedView_FencesAfterRestart: fences of a key stay strictly
// increasing across a restart of the server, with Shared grants made in
// one entry before it.
func TestSharedView_FencesAfterRestart(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ctx := t.Context()
	d := dial(t, srv.Addr(), nil)
	r, w := view(t, d, driver.Shared, 0), view(t, d, driver.Exclusive, 0)
	gw, err := w.TryAcquire(ctx, driver.AcquireRequest{Key: "f", Owner: owner(1, "f"), TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan uint64, 3)
	for i := 2; i <= 4; i++ {
		go func() {
			g, err := r.(driver.Waiter).Wait(ctx, driver.AcquireRequest{Key: "f", Owner: owner(i, "f"), TTL: 30 * time.Second})
			if err != nil {
				t.Error(err)
			}
			ch <- g.Fence
		}()
	}
	waitUntil(t, func() bool {
		info, _ := w.(driver.Inspector).Inspect(ctx, "f")
		return info.Waiters == 3
	})
	if err := w.Release(ctx, "f", owner(1, "f")); err != nil { // grants three readers in one entry
		t.Fatal(err)
	}
	var most uint64
	for range 3 {
		f := <-ch
		if f <= gw.Fence {
			t.Fatalf("reader fence %d not after the writer's %d", f, gw.Fence)
		}
		most = max(most, f)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var g driver.Grant
	waitUntil(t, func() bool {
		g, err = r.TryAcquire(ctx, driver.AcquireRequest{Key: "f", Owner: owner(9, "f"), TTL: 30 * time.Second})
		return err == nil
	})
	if g.Fence <= most {
		t.Fatalf("fence %d after a restart, not above %d", g.Fence, most)
	}
	info, err := w.(driver.Inspector).Inspect(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	if info.Fence > most {
		t.Fatalf("the oldest grant after the restart has fence %d, want one of the readers' (<= %d)", info.Fence, most)
	}
}

// heldSpan is the time one client held a grant by its own clock: from the
// grant's answer to the earlier of its release request and its validity
// deadline (the last confirmed request's send time + TTL - drift), as the
// root package computes it.
type heldSpan struct {
	from, to  time.Time
	fence     uint64
	exclusive bool
}

// holdOnce acquires one grant through v (waiting or trying), holds it for
// about hold while renewing every TTL/3 unless paused, and releases it. It
// returns the span the client held it, or false when not granted.
func holdOnce(ctx context.Context, v driver.Driver, key, owner string, ttl, hold time.Duration, wait, pause bool) (heldSpan, bool) {
	drift := ttl/100 + 2*time.Millisecond
	req := driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl}
	sent := time.Now()
	var g driver.Grant
	var err error
	if wait {
		wctx, cancel := context.WithTimeout(ctx, 2*ttl)
		g, err = v.(driver.Waiter).Wait(wctx, req)
		cancel()
	} else {
		g, err = v.TryAcquire(ctx, req)
	}
	if err != nil {
		return heldSpan{}, false
	}
	s := heldSpan{from: time.Now(), fence: g.Fence}
	valid := sent.Add(ttl - drift)
	end := time.Now().Add(hold)
	for time.Now().Before(end) && time.Now().Before(valid) {
		time.Sleep(min(ttl/3, time.Until(end)))
		if pause {
			continue
		}
		rs := time.Now()
		if v.Renew(ctx, key, owner, ttl) != nil {
			break
		}
		valid = rs.Add(ttl - drift)
	}
	s.to = time.Now()
	_ = v.Release(ctx, key, owner)
	if s.to.After(valid) {
		s.to = valid
	}
	return s, true
}

// TestSharedView_RandomHistoryNeverOverLimit: clients of a semaphore of 2
// permits and of a read-write lock, on separate Drivers (processes), try
// and wait, hold for random times and sometimes stop renewing past the TTL;
// by the clients' own validity deadlines, never more than 2 permit holders
// at once, no writer overlapping any other holder, and every fence of a key
// issued once.
func TestSharedView_RandomHistoryNeverOverLimit(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ctx := t.Context()
	const ttl = 400 * time.Millisecond
	const clients = 5
	type result struct {
		key   string
		spans []heldSpan
	}
	out := make(chan result, 2*clients)
	deadline := time.Now().Add(3 * time.Second)
	for i := range 2 * clients {
		d := dial(t, srv.Addr(), &dlockddriver.Options{NoWatch: i%2 == 0})
		go func() {
			key := "hist/sem"
			var v driver.Driver
			writer := false
			if i < clients {
				v = view(t, d, driver.Shared, 2)
			} else {
				key = "hist/rw"
				writer = i%3 == 0
				if writer {
					v = view(t, d, driver.Exclusive, 0)
				} else {
					v = view(t, d, driver.Shared, 0)
				}
			}
			var spans []heldSpan
			for n := 0; time.Now().Before(deadline); n++ {
				hold := time.Duration((n*7+i*13)%10) * ttl / 8
				s, ok := holdOnce(ctx, v, key, owner(i*1000+n, "hist"), ttl, hold, (n+i)%3 != 0, (n+i)%5 == 0)
				if ok {
					s.exclusive = writer
					spans = append(spans, s)
				}
				time.Sleep(time.Duration((n*11+i)%5) * time.Millisecond)
			}
			out <- result{key, spans}
		}()
	}
	byKey := map[string][]heldSpan{}
	for range 2 * clients {
		r := <-out
		byKey[r.key] = append(byKey[r.key], r.spans...)
	}
	for key, spans := range byKey {
		fences := map[uint64]bool{}
		writers := 0
		for _, s := range spans {
			if fences[s.fence] {
				t.Fatalf("%s: fence %d issued twice", key, s.fence)
			}
			fences[s.fence] = true
			if s.exclusive {
				writers++
			}
		}
		if len(spans) < 5 {
			t.Fatalf("%s: only %d grants in the run", key, len(spans))
		}
		// At each span's start, count the spans that hold then.
		for _, s := range spans {
			n, excl := 0, 0
			for _, o := range spans {
				if !o.from.After(s.from) && o.to.After(s.from) {
					n++
					if o.exclusive {
						excl++
					}
				}
			}
			if key == "hist/sem" && n > 2 {
				t.Fatalf("%s: %d holders at once (limit 2)", key, n)
			}
			if excl > 0 && n > 1 {
				t.Fatalf("%s: a writer held with %d other holders", key, n-1)
			}
		}
		t.Logf("%s: %d grants (%d exclusive), fences unique, never over the limit", key, len(spans), writers)
	}
}

// TestSharedView_Resume: another Driver (a restarted process) resumes a
// Shared grant by its owner token and fence; a wrong fence or a released
// grant is ErrLeaseLost.
func TestSharedView_Resume(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ctx := t.Context()
	d1, d2 := dial(t, srv.Addr(), nil), dial(t, srv.Addr(), nil)
	req := driver.AcquireRequest{Key: "res", Owner: owner(1, "res"), TTL: 5 * time.Second}
	g, err := view(t, d1, driver.Shared, 3).TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	v2 := view(t, d2, driver.Shared, 3).(driver.Resumer)
	if _, err := v2.Resume(ctx, req, g.Fence+1); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("resume with a wrong fence: %v", err)
	}
	g2, err := v2.Resume(ctx, req, g.Fence)
	if err != nil || g2.Fence != g.Fence {
		t.Fatalf("resume: %+v %v", g2, err)
	}
	if err := d2.Release(ctx, "res", req.Owner); err != nil {
		t.Fatal(err)
	}
	if _, err := v2.Resume(ctx, req, g.Fence); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("resume after release: %v", err)
	}
}

// TestCluster_SharedWaitersKeepPlaceAcrossLeaderChange: two readers queued
// behind a writer on a 3-node cluster keep their places while leadership
// moves (their Drivers re-attach the Shared waits to the new leader within
// the grace), and the writer's release on the new leader grants both in
// one entry, with distinct fences above the writer's.
func TestCluster_SharedWaitersKeepPlaceAcrossLeaderChange(t *testing.T) {
	c := startTestCluster(t, 3)
	dw, d1, d2 := c.openDriver(), c.openDriver(), c.openDriver()
	const key, ttl = "rw-cluster", 2 * time.Second
	w := view(t, dw, driver.Exclusive, 0)
	gw, err := w.TryAcquire(opCtx(t, 5*time.Second), driver.AcquireRequest{Key: key, Owner: "owner-writer-001", TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	wait := func(d *dlockddriver.Driver, owner string) <-chan result {
		ch := make(chan result, 1)
		r := view(t, d, driver.Shared, 0).(driver.Waiter)
		go func() {
			ctx := driver.WithOpTimeout(opCtx(t, 60*time.Second), 2*time.Second)
			g, err := r.Wait(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl})
			ch <- result{g, err}
		}()
		return ch
	}
	waiters := func() int {
		info, err := dw.Inspect(opCtx(t, 5*time.Second), key)
		if err != nil {
			return -1
		}
		return info.Waiters
	}
	r1 := wait(d1, "owner-reader-001")
	waitCond(t, "the first reader queued", func() bool { return waiters() == 1 })
	r2 := wait(d2, "owner-reader-002")
	waitCond(t, "the second reader queued", func() bool { return waiters() == 2 })
	t.Logf("leadership moved to n%d", c.transfer()+1)
	time.Sleep(ttl + time.Second)
	if n := waiters(); n != 2 {
		t.Fatalf("%d readers queued after the leader change; want both (re-attached)", n)
	}
	if err := w.Release(opCtx(t, 5*time.Second), key, "owner-writer-001"); err != nil {
		t.Fatal(err)
	}
	fences := map[uint64]bool{}
	for _, ch := range []<-chan result{r1, r2} {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.g.Fence <= gw.Fence || fences[r.g.Fence] {
				t.Fatalf("reader fence %d (writer's %d, seen %v)", r.g.Fence, gw.Fence, fences)
			}
			fences[r.g.Fence] = true
		case <-time.After(10 * time.Second):
			t.Fatal("readers not granted within 10 s of the writer's release")
		}
	}
}
