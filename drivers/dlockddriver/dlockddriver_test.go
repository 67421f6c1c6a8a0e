package dlockddriver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/internal/testservers"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server/servertest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	servertest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// openURL opens a driver through the registry, as dlock.Open would.
func openURL(ctx context.Context, addr string) (driver.Driver, error) {
	u, err := url.Parse("dlockd://" + addr)
	if err != nil {
		return nil, err
	}
	open, err := driver.Lookup(u.Scheme)
	if err != nil {
		return nil, err
	}
	return open(ctx, u)
}

// Both conformance runs use the durable default (fsync on): the suite
// scales its cancel-race window to the store's commit latency.
func TestConformance_Embedded(t *testing.T) {
	cfg := servertest.Config(t, t.TempDir())
	srv := servertest.StartEmbedded(t, cfg)
	dlocktest.Run(t, dlocktest.Harness{
		Name:       "dlockd",
		NewDriver:  func(ctx context.Context) (driver.Driver, error) { return openURL(ctx, srv.Addr()) },
		StopStore:  srv.Stop,
		StartStore: srv.Start,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return openURL(ctx, via(srv.Addr()))
		},
		NoFreezeReason: "the embedded server runs in the test process, which SIGSTOP would stop too (TestConformance_Subprocess freezes its dlockd)",
		TTL:            time.Second,
	})
}

func TestConformance_Subprocess(t *testing.T) {
	p := servertest.StartProcess(t)
	freezer := testservers.NewFreezer(t, func() []int { return []int{p.PID()} })
	dlocktest.Run(t, dlocktest.Harness{
		Name:        "dlockd",
		NewDriver:   func(ctx context.Context) (driver.Driver, error) { return openURL(ctx, p.Addr()) },
		StopStore:   p.Stop,
		StartStore:  p.Start,
		FreezeStore: freezer.Freeze,
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return openURL(ctx, via(p.Addr()))
		},
		TTL: time.Second,
	})
}

// TestOpen_LazyThenClosed: Open does not connect (no server listens at
// the URL), and a closed Driver refuses calls with ErrClosed.
func TestOpen_LazyThenClosed(t *testing.T) {
	u, _ := url.Parse("dlockd://127.0.0.1:" + dlockddriver.DefaultPort)
	d, err := dlockddriver.Open(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(t.Context(), driver.AcquireRequest{Key: "k", Owner: "0123456789abcdef", TTL: time.Second}); err != driver.ErrClosed {
		t.Fatalf("TryAcquire after Close = %v, want ErrClosed", err)
	}
	u, _ = url.Parse("redis://x")
	if _, err := dlockddriver.Open(t.Context(), u); err == nil {
		t.Fatal("Open(redis://) succeeded")
	}
}

// TestDriver_LostPushedOnExpiry: a grant that is not renewed is expired by
// the server, which tells the driver through its Watch stream: Grant.Lost
// closes, not before the TTL.
func TestDriver_LostPushedOnExpiry(t *testing.T) {
	cfg := servertest.Config(t, t.TempDir())
	srv := servertest.StartEmbedded(t, cfg)
	d, err := dlockddriver.Dial(srv.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ttl := 300 * time.Millisecond
	// Let the Watch stream subscribe first.
	defer http.DefaultClient.CloseIdleConnections()
	waitUntil(t, func() bool {
		resp, err := http.Get("http://" + srv.Addr() + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "dlockd_watch_sessions 1")
	})
	sent := time.Now()
	g, err := d.TryAcquire(t.Context(), driver.AcquireRequest{Key: "k", Owner: "owner-a-0123456789", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if g.Lost == nil {
		t.Fatal("Grant.Lost is nil")
	}
	select {
	case <-g.Lost:
		if since := time.Since(sent); since < ttl {
			t.Fatalf("Lost closed after %v, before the TTL %v", since, ttl)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after expiry")
	}
	if err := d.Renew(t.Context(), "k", "owner-a-0123456789", ttl); !errors.Is(err, driver.ErrLeaseLost) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Renew after expiry = %v, want ErrLeaseLost saying the server expired it", err)
	}
	if err := d.Release(t.Context(), "k", "owner-a-0123456789"); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Release after expiry = %v, want ErrLeaseLost", err)
	}
}

// TestDriver_WaitCancelLeavesNothing: a Wait whose context ends returns
// the context's error only after its queue entry is gone.
func TestDriver_WaitCancelLeavesNothing(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	d, err := dlockddriver.Dial(srv.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := t.Context()
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: "k", Owner: "owner-a-0123456789", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		wctx, cancel := context.WithTimeout(ctx, time.Duration(50+10*i)*time.Millisecond)
		_, err := d.Wait(wctx, driver.AcquireRequest{Key: "k", Owner: fmt.Sprintf("owner-w-%010d", i), TTL: time.Minute})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait = %v, want DeadlineExceeded", err)
		}
		info, err := d.Inspect(ctx, "k")
		if err != nil || info.Waiters != 0 {
			t.Fatalf("after a cancelled Wait: %d waiters (%v), want 0", info.Waiters, err)
		}
	}
	ok, err := d.CheckFence(ctx, "k", 1)
	if err != nil || ok {
		t.Fatalf("CheckFence(k, 1) = %v, %v; want false", ok, err)
	}
	list, err := d.List(ctx, "")
	if err != nil || len(list) != 1 || list[0].Key != "k" || list[0].Remaining <= 0 {
		t.Fatalf("List = %+v, %v", list, err)
	}
}

// awaitWatchSessions waits until the server counts n subscribed Watch
// sessions, so that loss news cannot be missed by a stream not yet open.
func awaitWatchSessions(t *testing.T, addr string, n int) {
	t.Helper()
	defer http.DefaultClient.CloseIdleConnections()
	want := fmt.Sprintf("dlockd_watch_sessions %d\n", n)
	waitUntil(t, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), want)
	})
}

// awaitWaiters waits until key has n queued waiters.
func awaitWaiters(t *testing.T, d *dlockddriver.Driver, key string, n int) {
	t.Helper()
	waitUntil(t, func() bool {
		info, err := d.Inspect(t.Context(), key)
		return (err == nil || errors.Is(err, driver.ErrNotAcquired)) && info.Waiters == n
	})
}

func dial(t *testing.T, addr string, opts *dlockddriver.Options) *dlockddriver.Driver {
	t.Helper()
	d, err := dlockddriver.Dial(addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

type waitResult struct {
	g   driver.Grant
	err error
}

// goWait runs d.Wait in a goroutine; the channel receives its result.
func goWait(ctx context.Context, d *dlockddriver.Driver, req driver.AcquireRequest) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		g, err := d.Wait(ctx, req)
		ch <- waitResult{g, err}
	}()
	return ch
}

func recvWait(t *testing.T, ch <-chan waitResult, within time.Duration) driver.Grant {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("Wait: %v", r.err)
		}
		return r.g
	case <-time.After(within):
		t.Fatalf("Wait not granted within %v", within)
	}
	return driver.Grant{}
}

// TestForceReleaser_PushesLossAndHandsOver: ForceRelease removes a live
// holder's grant; the holder's Grant.Lost closes at once (its TTL is a
// minute), its renewal is refused with the reason, and the queued waiter is
// granted with a greater fence.
func TestForceReleaser_PushesLossAndHandsOver(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ctx := t.Context()
	holder := dial(t, srv.Addr(), nil)
	awaitWatchSessions(t, srv.Addr(), 1)
	op := dial(t, srv.Addr(), &dlockddriver.Options{NoWatch: true})

	if _, err := op.ForceRelease(ctx, "force/k", "nothing there"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("ForceRelease of a free key = %v, want ErrNotAcquired", err)
	}
	const owner = "owner-holder-0123456789"
	g1, err := holder.TryAcquire(ctx, driver.AcquireRequest{Key: "force/k", Owner: owner, TTL: time.Minute, Holder: "pod-7"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.ForceRelease(ctx, "force/k", "  "); err == nil || errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("ForceRelease without a reason = %v, want a refusal", err)
	}
	waited := goWait(ctx, op, driver.AcquireRequest{Key: "force/k", Owner: "owner-waiter-0123456789", TTL: time.Minute})
	awaitWaiters(t, op, "force/k", 1)

	info, err := op.ForceRelease(ctx, "force/k", "pod-7 evicted, node lost")
	returned := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "force/k" || info.Fence != g1.Fence || info.Holder != "pod-7" || info.TTL != time.Minute {
		t.Fatalf("ForceRelease = %+v, want the holder's grant (fence %d)", info, g1.Fence)
	}
	select {
	case <-g1.Lost:
		t.Logf("Lost closed %v after ForceRelease returned", time.Since(returned))
		if since := time.Since(returned); since > 200*time.Millisecond {
			t.Fatalf("Lost closed %v after ForceRelease returned, want at once", since)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after ForceRelease (TTL 1m)")
	}
	g2 := recvWait(t, waited, 5*time.Second)
	if g2.Fence <= g1.Fence {
		t.Fatalf("waiter's fence %d, want > the removed grant's %d", g2.Fence, g1.Fence)
	}
	err = holder.Renew(ctx, "force/k", owner, time.Minute)
	if !errors.Is(err, driver.ErrLeaseLost) || !strings.Contains(err.Error(), "force-released") {
		t.Fatalf("holder's Renew = %v, want ErrLeaseLost saying it was force-released", err)
	}
	if cur, err := op.CheckFence(ctx, "force/k", g2.Fence); err != nil || !cur {
		t.Fatalf("CheckFence(waiter's fence) = %v, %v; want current", cur, err)
	}
}

// renewDelayer delays the first unary Renew of a Driver by delay (fault
// injection), and records whether the server then refused it.
type renewDelayer struct {
	delay   time.Duration
	delayed atomic.Bool
	refused atomic.Bool
}

func (r *renewDelayer) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	first := method == "/dlock.v1.Lock/Renew" && r.delayed.CompareAndSwap(false, true)
	if first {
		select {
		case <-time.After(r.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if first && err == nil {
		res := reply.(*dlockv1.RenewResponse).GetResults()
		r.refused.Store(len(res) == 1 && !res[0].GetOk())
	}
	return err
}

// startClaimWindow starts a dlockd whose claim window is window, and
// returns it with a maker of one-minute requests for key by owner tokens
// named after a tag.
func startClaimWindow(t *testing.T, window time.Duration, key string) (*servertest.Embedded, func(tag string) driver.AcquireRequest) {
	cfg := servertest.Config(t, t.TempDir())
	cfg.ClaimWindow = window
	srv := servertest.StartEmbedded(t, cfg)
	return srv, func(tag string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Owner: "owner-" + tag + "-0123456789", TTL: time.Minute}
	}
}

// TestWaiter_ClaimsHandedOverGrant: a grant handed over to a waiter is
// claimed by Wait before it returns, so the waiter keeps it past the
// server's claim window; a waiter whose claim comes too late (delayed by a
// fault) loses the grant to the next waiter, queues again by itself, and is
// granted after that one releases, with a greater fence.
func TestWaiter_ClaimsHandedOverGrant(t *testing.T) {
	const window = 300 * time.Millisecond
	srv, req := startClaimWindow(t, window, "claim/k")
	ctx := t.Context()

	t.Run("claimed in time", func(t *testing.T) {
		a, b := dial(t, srv.Addr(), nil), dial(t, srv.Addr(), nil)
		if _, err := a.TryAcquire(ctx, req("a")); err != nil {
			t.Fatal(err)
		}
		waited := goWait(ctx, b, req("b"))
		awaitWaiters(t, a, "claim/k", 1)
		if err := a.Release(ctx, "claim/k", req("a").Owner); err != nil {
			t.Fatal(err)
		}
		g := recvWait(t, waited, 5*time.Second)
		select {
		case <-g.Lost:
			t.Fatal("the handed-over grant was lost: not claimed")
		case <-time.After(3 * window):
		}
		if cur, err := a.CheckFence(ctx, "claim/k", g.Fence); err != nil || !cur {
			t.Fatalf("after 3 claim windows: CheckFence = %v, %v; want the waiter's grant current", cur, err)
		}
		if err := b.Release(ctx, "claim/k", req("b").Owner); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("claimed too late: queues again", func(t *testing.T) {
		delayer := &renewDelayer{delay: 3 * window}
		a := dial(t, srv.Addr(), nil)
		late := dial(t, srv.Addr(), &dlockddriver.Options{NoSession: true, DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(delayer.intercept)}})
		next := dial(t, srv.Addr(), nil)
		if _, err := a.TryAcquire(ctx, req("a2")); err != nil {
			t.Fatal(err)
		}
		lateWait := goWait(ctx, late, req("late"))
		awaitWaiters(t, a, "claim/k", 1)
		nextWait := goWait(ctx, next, req("next"))
		awaitWaiters(t, a, "claim/k", 2)
		if err := a.Release(ctx, "claim/k", req("a2").Owner); err != nil {
			t.Fatal(err)
		}
		// The late claim lets the window pass: the next waiter gets the key.
		gNext := recvWait(t, nextWait, 5*time.Second)
		// The late waiter hears its claim refused and queues again.
		awaitWaiters(t, a, "claim/k", 1)
		if !delayer.delayed.Load() || !delayer.refused.Load() {
			t.Fatalf("delayed claim: delayed %v, refused %v; want both", delayer.delayed.Load(), delayer.refused.Load())
		}
		select {
		case r := <-lateWait:
			t.Fatalf("late waiter returned %+v while the key is held by the next waiter", r)
		default:
		}
		if err := next.Release(ctx, "claim/k", req("next").Owner); err != nil {
			t.Fatal(err)
		}
		gLate := recvWait(t, lateWait, 5*time.Second)
		if gLate.Fence <= gNext.Fence {
			t.Fatalf("late waiter's fence %d, want > %d", gLate.Fence, gNext.Fence)
		}
		select {
		case <-gLate.Lost:
			t.Fatal("the late waiter's new grant is marked lost (news of its unclaimed grant?)")
		case <-time.After(2 * window):
		}
		if cur, err := a.CheckFence(ctx, "claim/k", gLate.Fence); err != nil || !cur {
			t.Fatalf("CheckFence(late waiter's grant) = %v, %v; want current", cur, err)
		}
	})
}

// TestInspector_ListFollowsPages: List returns every held key with the
// prefix, in key order, across many pages.
func TestInspector_ListFollowsPages(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ctx := t.Context()
	d := dial(t, srv.Addr(), &dlockddriver.Options{ListPageSize: 7})
	var want []string
	for i := range 30 {
		k := fmt.Sprintf("page/%02d", (i*7)%30) // acquired out of order
		if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: k, Owner: owner(i, "p"), TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		want = append(want, k)
	}
	for _, k := range []string{"pagf", "pag", "other/1"} {
		if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: k, Owner: owner(0, "x"), TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(want)
	list, err := d.List(ctx, "page/")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range list {
		got = append(got, h.Key)
		if h.Fence == 0 || h.TTL != time.Minute {
			t.Errorf("List entry %+v", h)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("List(page/) = %q, want %q", got, want)
	}
	all, err := d.List(ctx, "")
	if err != nil || len(all) != 33 || !slices.IsSortedFunc(all, func(a, b driver.HolderInfo) int { return strings.Compare(a.Key, b.Key) }) {
		t.Fatalf("List() = %d keys (%v), want 33 sorted", len(all), err)
	}
	if list, err := d.List(ctx, "none/"); err != nil || len(list) != 0 {
		t.Fatalf("List(none/) = %+v, %v", list, err)
	}
}

// TestOpen_LockDelayParameter: lock_delay is a configuration error when it
// is not a duration of 0 or more (never ErrUnavailable), unknown
// parameters are refused, and a valid lock_delay is sent with every grant:
// after a force release the key stays free of grants for that long.
func TestOpen_LockDelayParameter(t *testing.T) {
	for _, bad := range []string{"lock_delay=-1s", "lock_delay=soon", "lock_delay=5", "lockdelay=1s", "lock_delay=1s&x=1"} {
		u, _ := url.Parse("dlockd://127.0.0.1:1?" + bad)
		d, err := dlockddriver.Open(t.Context(), u)
		if err == nil {
			_ = d.Close()
			t.Errorf("Open(?%s) succeeded", bad)
			continue
		}
		if errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "dlockd: ") {
			t.Errorf("Open(?%s) = %v, want a configuration error", bad, err)
		}
	}
	for _, opts := range []dlockddriver.Options{{LockDelay: -time.Second}, {ListPageSize: -1}} {
		if d, err := dlockddriver.Dial("127.0.0.1:1", &opts); err == nil {
			_ = d.Close()
			t.Errorf("Dial(%+v) succeeded", opts)
		}
	}
	for _, good := range []string{"", "?lock_delay=0", "?lock_delay=2s"} {
		u, _ := url.Parse("dlockd://127.0.0.1:1" + good)
		d, err := dlockddriver.Open(t.Context(), u)
		if err != nil {
			t.Errorf("Open(%s): %v", good, err)
			continue
		}
		_ = d.Close()
	}

	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ctx := t.Context()
	const delay = 400 * time.Millisecond
	d, err := openURL(ctx, srv.Addr()+"?lock_delay="+delay.String())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	op := dial(t, srv.Addr(), nil)
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: "delay/k", Owner: owner(1, "d"), TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := op.ForceRelease(ctx, "delay/k", "test"); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	if _, err := op.TryAcquire(ctx, driver.AcquireRequest{Key: "delay/k", Owner: owner(2, "d"), TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire during the lock-delay = %v, want ErrNotAcquired", err)
	}
	waitUntil(t, func() bool {
		_, err := op.TryAcquire(ctx, driver.AcquireRequest{Key: "delay/k", Owner: owner(3, "d"), TTL: time.Minute})
		return err == nil
	})
	if since := time.Since(removed); since < delay-100*time.Millisecond {
		t.Fatalf("granted again %v after the force release, before the lock-delay %v", since, delay)
	}
	// A lock_delay longer than a grant's TTL is capped, not refused.
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: "delay/short", Owner: owner(4, "d"), TTL: 200 * time.Millisecond}); err != nil {
		t.Fatalf("TryAcquire with TTL < lock_delay: %v", err)
	}
}
