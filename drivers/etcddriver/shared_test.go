package etcddriver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/recipe/rwlock"
)

// TestRWLock runs the read-write lock checks (etcd's RWMutex recipe) against
// a real etcd: kinds, an overlap detector, a writer behind a stream of
// readers, per-grant TTLs.
func TestRWLock(t *testing.T) {
	e := testservers.StartEtcd(t)
	dlocktest.RunRWLock(t, "etcd", func(ctx context.Context) (driver.Driver, error) {
		return openDriver(t, e.URL()+"?op_timeout=2s"), nil
	})
}

// TestRWLock_SharesPlainKeySpace: an Exclusive grant is a plain lock of the
// key, so a plain lock and readers exclude each other, and a waiting plain
// lock holds back later readers.
func TestRWLock_SharesPlainKeySpace(t *testing.T) {
	e := testservers.StartEtcd(t)
	ctx := t.Context()
	l1 := dlock.New(openDriver(t, e.URL()))
	defer l1.Close()
	l2 := dlock.New(openDriver(t, e.URL()))
	defer l2.Close()
	key := fmt.Sprintf("plain-rw:%d", time.Now().UnixNano())
	rw, err := rwlock.New(l1, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	r, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l2.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("plain TryAcquire of a read-locked key = %v, want ErrNotAcquired", err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		ls, err := l2.Acquire(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r2, err := rw.TryRLock(ctx)
		if errors.Is(err, dlock.ErrNotAcquired) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		r2.Release(ctx)
		if time.Now().After(deadline) {
			t.Fatal("a waiting plain lock did not hold back readers")
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.Release(ctx)
	p := <-got
	if p == nil {
		t.FailNow()
	}
	if p.Fence() <= r.Fence() {
		t.Fatalf("plain lock fence %d not above the reader's %d", p.Fence(), r.Fence())
	}
	if _, err := rw.TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock while a plain lock holds = %v, want ErrNotAcquired", err)
	}
	p.Release(ctx)
}

// TestRWLock_ReaderLostIsPushed: a reader's grant deleted on the store
// (its etcd lease revoked) ends the lease at once (Grant.Lost).
func TestRWLock_ReaderLostIsPushed(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	l := dlock.New(openDriver(t, e.URL()))
	defer l.Close()
	key := fmt.Sprintf("rw-lost:%d", time.Now().UnixNano())
	rw, err := rwlock.New(l, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	r, err := rw.RLock(t.Context(), dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(t.Context(), "/dlock/.locks/"+key+"/"+r.Owner()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a reader whose entry was deleted kept its lease")
	}
	if !errors.Is(r.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("lease error %v, want ErrLeaseLost", r.Err())
	}
}

// TestRWLock_ReadLockNotResumedAsPlain: a read lock's token, given to a
// plain Locker's Resume, is ErrLeaseLost (the plain Driver resumes plain
// locks only): it would otherwise hand out an exclusive lease of a key
// other readers hold.
func TestRWLock_ReadLockNotResumedAsPlain(t *testing.T) {
	e := testservers.StartEtcd(t)
	ctx := t.Context()
	l1 := dlock.New(openDriver(t, e.URL()))
	defer l1.Close()
	l2 := dlock.New(openDriver(t, e.URL()))
	defer l2.Close()
	key := fmt.Sprintf("resume-rw:%d", time.Now().UnixNano())
	rw, err := rwlock.New(l1, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	r, err := rw.RLock(ctx) // the first entry of the key's directory
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release(ctx)
	if ls, err := l2.Resume(ctx, r.Token()); !errors.Is(err, dlock.ErrLeaseLost) {
		if ls != nil {
			_ = ls.Release(ctx)
		}
		t.Fatalf("plain Resume of a read lock's token = %v, want ErrLeaseLost", err)
	}
	if r.Err() != nil {
		t.Errorf("the read lock ended after the refused resume: %v", r.Err())
	}
}
