package etcddriver_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/etcddriver"
	"github.com/dlock-dev/dlock/drivers/internal/resumetest"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestResume checks driver.Resumer against a real etcd: a grant made
// through one client is resumed by its lease ID through another, as by a
// restarted process, with its loss watch attached again.
func TestResume(t *testing.T) {
	e := testservers.StartEtcd(t)
	freezer := testservers.NewFreezer(t, func() []int { return []int{e.PID()} })
	open := func(ctx context.Context) (*etcddriver.Driver, error) {
		u, err := url.Parse("etcd://" + e.Addr() + "/resume?op_timeout=2s&dial_timeout=2s")
		if err != nil {
			return nil, err
		}
		return etcddriver.Open(ctx, u)
	}
	resumetest.Run(t, resumetest.Harness{
		Freeze:       freezer.Freeze,
		Thaw:         freezer.Thaw,
		Open:         func(ctx context.Context) (driver.Driver, error) { return open(ctx) },
		TTL:          time.Second,
		StoreExpires: true,
	})

	mustOpen := func(t *testing.T) *etcddriver.Driver {
		d, err := open(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}

	t.Run("WaiterEntryIsNotAGrant", func(t *testing.T) {
		a, w, b := mustOpen(t), mustOpen(t), mustOpen(t)
		holder := driver.AcquireRequest{Key: "resume-waiter", Owner: resumetest.Owner(), TTL: time.Second}
		if _, err := a.TryAcquire(t.Context(), holder); err != nil {
			t.Fatal(err)
		}
		waiter := driver.AcquireRequest{Key: holder.Key, Owner: resumetest.Owner(), TTL: time.Second}
		wctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { _, err := w.Wait(wctx, waiter); done <- err }()
		defer func() { cancel(); <-done }()
		// The waiter's entry, read straight from etcd.
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Addr()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		var rev int64
		for deadline := time.Now().Add(10 * time.Second); rev == 0; {
			resp, err := cli.Get(t.Context(), "/resume/.locks/"+holder.Key+"/"+waiter.Owner)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) > 0 {
				rev = resp.Kvs[0].CreateRevision
			} else if time.Now().After(deadline) {
				t.Fatal("the waiter's entry did not appear")
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if _, err := b.Resume(t.Context(), waiter, uint64(rev)); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Resume of a waiter's entry = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("LostPushedWhenTheLeaseIsRevoked", func(t *testing.T) {
		a, b := mustOpen(t), mustOpen(t)
		r := driver.AcquireRequest{Key: "resume-lost", Owner: resumetest.Owner(), TTL: time.Second}
		g, err := a.TryAcquire(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		_ = a.Close()
		rg, err := b.Resume(t.Context(), r, g.Fence)
		if err != nil {
			t.Fatal(err)
		}
		if rg.Lost == nil {
			t.Fatal("a resumed etcd grant has no Lost channel")
		}
		// Nobody renews: etcd expires the lease, and the watch tells.
		select {
		case <-rg.Lost:
		case <-time.After(15 * time.Second):
			t.Fatal("Lost did not close within 15 s of the lease's expiry")
		}
		if err := b.Renew(t.Context(), r.Key, r.Owner, r.TTL); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew after the loss = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("TTLLongerThanTheLeaseIsInvalid", func(t *testing.T) {
		a, b := mustOpen(t), mustOpen(t)
		r := driver.AcquireRequest{Key: "resume-ttl", Owner: resumetest.Owner(), TTL: 1500 * time.Millisecond}
		g, err := a.TryAcquire(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		r.TTL = 3 * time.Second // the lease is 2 s
		if _, err := b.Resume(t.Context(), r, g.Fence); !errors.Is(err, driver.ErrInvalidTTL) {
			t.Fatalf("Resume with a TTL longer than the lease = %v, want ErrInvalidTTL", err)
		}
		r.TTL = 2 * time.Second
		if _, err := b.Resume(t.Context(), r, g.Fence); err != nil {
			t.Fatalf("Resume with the lease's TTL: %v", err)
		}
		if err := b.Release(t.Context(), r.Key, r.Owner); err != nil {
			t.Fatal(err)
		}
	})
}
