package dlockddriver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server/servertest"
)

// watchNotified waits for a value on ch, failing after limit or when ch
// closes.
func watchNotified(t *testing.T, ch <-chan struct{}, what string, limit time.Duration) {
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

func watchDrain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func watchClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timer.C:
			t.Fatalf("watch channel open 5 s after %s", what)
		}
	}
}

func openWatchDriver(t *testing.T, addr string) *dlockddriver.Driver {
	t.Helper()
	d, err := openURL(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d.(*dlockddriver.Driver)
}

func TestWatchKey_NotifiesGrantReleaseExpiry(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	holder := openWatchDriver(t, srv.Addr())
	watcher := openWatchDriver(t, srv.Addr())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	key := fmt.Sprintf("watch/%d", time.Now().UnixNano())
	ch, err := watcher.WatchKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	owner := func(i int) string { return fmt.Sprintf("%032x", time.Now().UnixNano()+int64(i)) }
	other := driver.AcquireRequest{Key: key + "x", Owner: owner(0), TTL: 5 * time.Second}
	if _, err := holder.TryAcquire(ctx, other); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Fatal("notified of another key's grant")
	case <-time.After(300 * time.Millisecond):
	}
	r := driver.AcquireRequest{Key: key, Owner: owner(1), TTL: 5 * time.Second, Holder: "a"}
	if _, err := holder.TryAcquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	watchNotified(t, ch, "grant", 5*time.Second)
	watchDrain(ch)
	if err := holder.Release(ctx, r.Key, r.Owner); err != nil {
		t.Fatal(err)
	}
	watchNotified(t, ch, "release", 5*time.Second)
	watchDrain(ch)
	r = driver.AcquireRequest{Key: key, Owner: owner(2), TTL: 300 * time.Millisecond}
	if _, err := holder.TryAcquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	watchNotified(t, ch, "grant before expiry", 5*time.Second)
	watchDrain(ch)
	watchNotified(t, ch, "expiry", 10*time.Second) // nobody renews it
	cancel()
	watchClosed(t, ch, "ctx ended")
}

func TestWatchKey_ClosedAndInvalid(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	d := openWatchDriver(t, srv.Addr())
	if _, err := d.WatchKey(t.Context(), ""); !errors.Is(err, driver.ErrInvalidKey) {
		t.Fatalf("WatchKey(\"\") = %v, want ErrInvalidKey", err)
	}
	ch, err := d.WatchKey(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	_ = d.Close()
	watchClosed(t, ch, "Close")
	if _, err := d.WatchKey(t.Context(), "k"); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("WatchKey after Close = %v, want ErrClosed", err)
	}
}

// TestElection_ObservePushed: on dlockd, Observe learns of each new leader
// by the key watch, with a poll interval far longer than the test.
func TestElection_ObservePushed(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	var ls []*dlock.Locker
	for range 2 {
		l := dlock.New(openWatchDriver(t, srv.Addr()))
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
	}
	dlocktest.CheckObservePushed(t, ls[0], ls[1])
}
