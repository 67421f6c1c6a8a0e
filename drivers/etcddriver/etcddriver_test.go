package etcddriver_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/etcddriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	e := testservers.StartEtcd(t)
	freezer := testservers.NewFreezer(t, func() []int { return []int{e.PID()} })
	open := func(ctx context.Context, addr string) (driver.Driver, error) {
		u, err := url.Parse("etcd://" + addr + "?op_timeout=2s&dial_timeout=1s")
		if err != nil {
			return nil, err
		}
		return etcddriver.Open(ctx, u)
	}
	dlocktest.Run(t, dlocktest.Harness{
		Name:        "etcd",
		NewDriver:   func(ctx context.Context) (driver.Driver, error) { return open(ctx, e.Addr()) },
		StopStore:   func() error { e.Stop(); return nil },
		StartStore:  e.Start,
		FreezeStore: freezer.Freeze,
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return open(ctx, via(e.Addr()))
		},
		TTL: time.Second,
	})
}

func openDriver(t testing.TB, rawURL string) *etcddriver.Driver {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	d, err := etcddriver.Open(context.Background(), u)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func rawClient(t testing.TB, e *testservers.Etcd) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func req(key string, ttl time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: fmt.Sprintf("%032x", time.Now().UnixNano()) + fmt.Sprint(ownerSeq.Add(1)), TTL: ttl, Holder: "test"}
}

var ownerSeq atomic.Int64

// entryLease returns the etcd lease of the entry of r, read from the store.
func entryLease(t *testing.T, cli *clientv3.Client, r driver.AcquireRequest) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(t.Context(), "/dlock/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if len(kv.Key) >= len(r.Owner) && string(kv.Key[len(kv.Key)-len(r.Owner):]) == r.Owner {
			return clientv3.LeaseID(kv.Lease)
		}
	}
	t.Fatalf("no entry for owner %s", r.Owner)
	return 0
}

func TestDriver(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d1 := openDriver(t, e.URL())
	d2 := openDriver(t, e.URL())

	t.Run("TryAcquireRenewReleaseFence", func(t *testing.T) {
		ctx := t.Context()
		r1 := req("k1", time.Second)
		g1, err := d1.TryAcquire(ctx, r1)
		if err != nil || g1.Fence == 0 || g1.Lost == nil {
			t.Fatalf("TryAcquire = %+v, %v", g1, err)
		}
		if _, err := d2.TryAcquire(ctx, req("k1", time.Second)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("second TryAcquire err = %v, want ErrNotAcquired", err)
		}
		if err := d1.Renew(ctx, "k1", r1.Owner, time.Second); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if err := d2.Renew(ctx, "k1", "nobody", time.Second); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew unknown owner err = %v, want ErrLeaseLost", err)
		}
		if err := d2.Release(ctx, "k1", "nobody"); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Release unknown owner err = %v, want ErrLeaseLost", err)
		}
		if err := d1.Release(ctx, "k1", r1.Owner); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := d1.Release(ctx, "k1", r1.Owner); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("second Release err = %v, want ErrLeaseLost", err)
		}
		select {
		case <-g1.Lost:
			t.Fatal("Lost closed by our own release")
		default:
		}
		r2 := req("k1", time.Second)
		g2, err := d2.TryAcquire(ctx, r2)
		if err != nil {
			t.Fatalf("TryAcquire after release: %v", err)
		}
		if g2.Fence <= g1.Fence {
			t.Fatalf("fence %d not greater than %d", g2.Fence, g1.Fence)
		}
		// Another driver instance (another process) can renew and release
		// by owner token alone.
		if err := d1.Renew(ctx, "k1", r2.Owner, time.Second); err != nil {
			t.Fatalf("Renew from another driver: %v", err)
		}
		if err := d1.Release(ctx, "k1", r2.Owner); err != nil {
			t.Fatalf("Release from another driver: %v", err)
		}
		// No entry is left behind by the failed TryAcquire.
		resp, err := cli.Get(ctx, "/dlock/.locks/k1/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 0 {
			t.Fatalf("entries left: %v, %v", resp.Count, err)
		}
	})

	t.Run("KeysWithSlashAndPercent", func(t *testing.T) {
		ctx := t.Context()
		keys := []string{"a", "a/b", "a%2Fb", "a/b/c", "a/", "/", "%", "x y:{z} ☃"}
		var reqs []driver.AcquireRequest
		for _, k := range keys {
			r := req(k, 2*time.Second)
			if _, err := d1.TryAcquire(ctx, r); err != nil {
				t.Fatalf("TryAcquire %q: %v", k, err)
			}
			reqs = append(reqs, r)
		}
		for _, k := range keys {
			info, err := d2.Inspect(ctx, k)
			if err != nil || info.Key != k || info.Holder != "test" || info.Waiters != 0 {
				t.Fatalf("Inspect %q = %+v, %v", k, info, err)
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
		if fmt.Sprint(got) != "[a/ a/b a/b/c]" {
			t.Fatalf("List(a/) = %v", got)
		}
		for _, r := range reqs {
			if err := d1.Release(ctx, r.Key, r.Owner); err != nil {
				t.Fatalf("Release %q: %v", r.Key, err)
			}
		}
		if _, err := d2.Inspect(ctx, "a/b"); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("Inspect after release err = %v", err)
		}
	})

	t.Run("WaitFIFO", func(t *testing.T) {
		ctx := t.Context()
		holder := req("fifo", 2*time.Second)
		if _, err := d1.TryAcquire(ctx, holder); err != nil {
			t.Fatal(err)
		}
		const n = 4
		order := make(chan int, n)
		var wg sync.WaitGroup
		reqs := make([]driver.AcquireRequest, n)
		for i := range n {
			reqs[i] = req("fifo", 2*time.Second)
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := d1
				if i%2 == 1 {
					d = d2
				}
				g, err := d.Wait(ctx, reqs[i])
				if err != nil {
					t.Errorf("Wait %d: %v", i, err)
					return
				}
				order <- i
				time.Sleep(20 * time.Millisecond)
				if g.Fence == 0 {
					t.Errorf("fence 0")
				}
				if err := d.Release(ctx, "fifo", reqs[i].Owner); err != nil {
					t.Errorf("Release %d: %v", i, err)
				}
			}()
			// Make sure waiter i is queued before waiter i+1.
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

	t.Run("CancelledWaiterLeavesNothing", func(t *testing.T) {
		ctx := t.Context()
		holder := req("cancel", 2*time.Second)
		if _, err := d1.TryAcquire(ctx, holder); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := d2.Wait(wctx, req("cancel", 2*time.Second))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait err = %v, want DeadlineExceeded", err)
		}
		resp, err := cli.Get(ctx, "/dlock/.locks/cancel/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 1 {
			t.Fatalf("entries = %d, %v; want only the holder", resp.Count, err)
		}
		if err := d1.Release(ctx, "cancel", holder.Owner); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("WaiterLeaseRevokedStopsWaiting", func(t *testing.T) {
		ctx := t.Context()
		holder := req("wrevoke", 2*time.Second)
		if _, err := d1.TryAcquire(ctx, holder); err != nil {
			t.Fatal(err)
		}
		defer d1.Release(ctx, "wrevoke", holder.Owner)
		w := req("wrevoke", 2*time.Second)
		errc := make(chan error, 1)
		go func() {
			_, err := d2.Wait(ctx, w)
			errc <- err
		}()
		waitFor(t, func() bool {
			info, err := d2.Inspect(ctx, "wrevoke")
			return err == nil && info.Waiters == 1
		})
		if _, err := cli.Revoke(ctx, entryLease(t, cli, w)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errc:
			if !errors.Is(err, driver.ErrLeaseLost) {
				t.Fatalf("Wait err = %v, want ErrLeaseLost", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Wait did not stop after its lease was revoked")
		}
	})

	t.Run("RevokedGrantIsPushedLost", func(t *testing.T) {
		ctx := t.Context()
		r := req("revoked", 5*time.Second)
		g, err := d1.TryAcquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Revoke(ctx, entryLease(t, cli, r)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-g.Lost:
		case <-time.After(5 * time.Second):
			t.Fatal("Grant.Lost not closed after revoke")
		}
		if err := d1.Renew(ctx, "revoked", r.Owner, 5*time.Second); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew err = %v, want ErrLeaseLost", err)
		}
		if err := d1.Release(ctx, "revoked", r.Owner); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Release err = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("DeletedEntryIsLost", func(t *testing.T) {
		ctx := t.Context()
		r := req("deleted", 5*time.Second)
		g, err := d1.TryAcquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Delete(ctx, "/dlock/.locks/deleted/"+r.Owner); err != nil {
			t.Fatal(err)
		}
		select {
		case <-g.Lost:
		case <-time.After(5 * time.Second):
			t.Fatal("Grant.Lost not closed after delete")
		}
		if err := d2.Renew(ctx, "deleted", r.Owner, 5*time.Second); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew err = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("ExpiryIsPushedLost", func(t *testing.T) {
		ctx := t.Context()
		r := req("expiry", 200*time.Millisecond) // lease of 1 s
		g, err := d1.TryAcquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		select {
		case <-g.Lost:
		case <-time.After(5 * time.Second):
			t.Fatal("Grant.Lost not closed after expiry")
		}
		if el := time.Since(start); el < 200*time.Millisecond {
			t.Fatalf("lost after %v, before the TTL", el)
		}
		g2, err := d2.TryAcquire(ctx, req("expiry", time.Second))
		if err != nil || g2.Fence <= g.Fence {
			t.Fatalf("TryAcquire after expiry = %+v, %v", g2, err)
		}
	})

	t.Run("RootAPILostLease", func(t *testing.T) {
		ctx := t.Context()
		locker, err := dlock.Open(ctx, e.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer locker.Close()
		lease, err := locker.Acquire(ctx, "root/lost", dlock.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Revoke(ctx, entryLeaseByOwner(t, cli, lease.Owner())); err != nil {
			t.Fatal(err)
		}
		select {
		case <-lease.Done():
		case <-time.After(3 * time.Second):
			t.Fatal("lease not lost")
		}
		if err := lease.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
			t.Fatalf("lease.Err = %v", err)
		}
		if !errors.Is(context.Cause(lease.Context()), dlock.ErrLeaseLost) {
			t.Fatalf("cause = %v", context.Cause(lease.Context()))
		}
		if err := lease.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
			t.Fatalf("Release after loss = %v", err)
		}
	})

	t.Run("RootAPIWaitHandoff", func(t *testing.T) {
		ctx := t.Context()
		locker, err := dlock.Open(ctx, e.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer locker.Close()
		l1, err := locker.Acquire(ctx, "root/handoff", dlock.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *dlock.Lease, 1)
		go func() {
			l2, err := locker.Acquire(ctx, "root/handoff", dlock.WithTTL(time.Second))
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
			got <- l2
		}()
		time.Sleep(1500 * time.Millisecond) // longer than a heartbeat: the waiter's lease is kept alive
		if err := l1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l2 := <-got
		if l2 == nil {
			return
		}
		if l2.Fence() <= l1.Fence() {
			t.Fatalf("fence %d not greater than %d", l2.Fence(), l1.Fence())
		}
		if err := l2.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func entryLeaseByOwner(t *testing.T, cli *clientv3.Client, owner string) clientv3.LeaseID {
	return entryLease(t, cli, driver.AcquireRequest{Owner: owner})
}

func TestDriver_StoreOutage(t *testing.T) {
	e := testservers.StartEtcd(t)
	ctx := t.Context()
	locker, err := dlock.Open(ctx, e.URL()+"?dial_timeout=1s&op_timeout=1s", dlock.WithOpTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	lease, err := locker.Acquire(ctx, "outage", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	e.Stop()
	select {
	case <-lease.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("lease not lost within its TTL while the store is down")
	}
	start := time.Now()
	_, err = locker.TryAcquire(ctx, "outage2", dlock.WithTTL(time.Second))
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("TryAcquire with store down err = %v, want ErrUnavailable", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("ErrUnavailable after %v", el)
	}
	start = time.Now()
	// No retry budget: a waiting Acquire reports the outage at its first
	// store error (by default it retries until its ctx ends).
	_, err = locker.Acquire(ctx, "outage2", dlock.WithTTL(time.Second), dlock.WithRetryFor(0))
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Acquire with store down err = %v, want ErrUnavailable", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("ErrUnavailable after %v", el)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	l2, err := locker.Acquire(ctx, "outage", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatalf("Acquire after restart: %v", err)
	}
	if l2.Fence() <= lease.Fence() {
		t.Fatalf("fence %d after restart not greater than %d", l2.Fence(), lease.Fence())
	}
	_ = l2.Release(ctx)
}

func TestOpen_UnreachableIsUnavailable(t *testing.T) {
	port := testservers.FreePort(t)
	start := time.Now()
	_, err := dlock.Open(t.Context(), fmt.Sprintf("etcd://127.0.0.1:%d?dial_timeout=500ms", port))
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Open of an unreachable etcd = %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Open took %v", took)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
