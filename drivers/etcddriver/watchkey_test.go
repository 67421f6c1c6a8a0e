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
)

// notified waits for a value on ch, failing after limit or when ch closes.
func notified(t *testing.T, ch <-chan struct{}, what string, limit time.Duration) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("%s: watch channel closed", what)
		}
	case <-time.After(limit):
		t.Fatalf("%s: no notification within %v", what, limit)
	}
}

// drain empties ch of pending notifications.
func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func TestWatchKey_NotifiesGrantReleaseExpiry(t *testing.T) {
	e := testservers.StartEtcd(t)
	url := "etcd://" + e.Addr() + "?op_timeout=2s"
	holder := openDriver(t, url)
	watcher := openDriver(t, url)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	key := fmt.Sprintf("watch/%d", time.Now().UnixNano())
	ch, err := watcher.WatchKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// Another key's changes do not reach this watch, even one whose
	// name extends this one.
	other := req(key+"x", 5*time.Second)
	if _, err := holder.TryAcquire(ctx, other); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Fatal("notified of another key's grant")
	case <-time.After(300 * time.Millisecond):
	}

	r := req(key, 5*time.Second)
	if _, err := holder.TryAcquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	notified(t, ch, "grant", 5*time.Second)
	drain(ch)
	if err := holder.Release(ctx, r.Key, r.Owner); err != nil {
		t.Fatal(err)
	}
	notified(t, ch, "release", 5*time.Second)
	drain(ch)

	// Expiry: a grant nobody renews goes when its etcd lease does.
	r = req(key, time.Second)
	if _, err := holder.TryAcquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	notified(t, ch, "grant before expiry", 5*time.Second)
	drain(ch)
	_ = holder.Close() // stops nothing on the store: the lease runs out
	notified(t, ch, "expiry", 10*time.Second)

	cancel()
	select {
	case _, ok := <-ch:
		for ok {
			_, ok = <-ch
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch channel open 5 s after ctx ended")
	}
}

func TestWatchKey_ClosedAndInvalid(t *testing.T) {
	e := testservers.StartEtcd(t)
	d := openDriver(t, "etcd://"+e.Addr()+"?op_timeout=2s")
	if _, err := d.WatchKey(t.Context(), ""); !errors.Is(err, driver.ErrInvalidKey) {
		t.Fatalf("WatchKey(\"\") = %v, want ErrInvalidKey", err)
	}
	ch, err := d.WatchKey(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	_ = d.Close()
	select {
	case _, ok := <-ch:
		for ok {
			_, ok = <-ch
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch channel open 5 s after Close")
	}
	if _, err := d.WatchKey(t.Context(), "k"); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("WatchKey after Close = %v, want ErrClosed", err)
	}
}

// TestElection_ObservePushed: on etcd, Observe learns of each new leader
// by the watch, with a poll interval far longer than the test.
func TestElection_ObservePushed(t *testing.T) {
	e := testservers.StartEtcd(t)
	var ls []*dlock.Locker
	for range 2 {
		l := dlock.New(openDriver(t, "etcd://"+e.Addr()+"?op_timeout=2s"))
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
	}
	dlocktest.CheckObservePushed(t, ls[0], ls[1])
}
