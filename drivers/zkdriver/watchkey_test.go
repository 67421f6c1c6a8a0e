package zkdriver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
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

func drainNotes(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
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

func TestWatchKey_NotifiesGrantReleaseExpiry(t *testing.T) {
	e := newEnv(t)
	holder, _ := e.mustOpen(t)
	watcher, _ := e.mustOpen(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// A key whose node does not exist yet: the watch waits for its creation.
	key := fmt.Sprintf("watch/%d", time.Now().UnixNano())
	ch, err := watcher.WatchKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	other := req(key + "x")
	if _, err := holder.TryAcquire(ctx, other); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Fatal("notified of another key's grant")
	case <-time.After(300 * time.Millisecond):
	}
	for i := range 3 { // the watch is set again after each event
		r := req(key)
		if _, err := holder.TryAcquire(ctx, r); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		notified(t, ch, "grant", 5*time.Second)
		time.Sleep(50 * time.Millisecond)
		drainNotes(ch)
		if err := holder.Release(ctx, r.Key, r.Owner); err != nil {
			t.Fatal(err)
		}
		notified(t, ch, "release", 5*time.Second)
		time.Sleep(50 * time.Millisecond)
		drainNotes(ch)
	}
	// Expiry: a grant not renewed within its TTL (1 s) is deleted.
	r := req(key)
	if _, err := holder.TryAcquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	notified(t, ch, "grant before expiry", 5*time.Second)
	time.Sleep(50 * time.Millisecond)
	drainNotes(ch)
	notified(t, ch, "expiry", 10*time.Second)

	cancel()
	waitClosed(t, ch, "ctx ended")
}

func TestWatchKey_ClosedAndInvalid(t *testing.T) {
	e := newEnv(t)
	d, _ := e.mustOpen(t)
	if _, err := d.WatchKey(t.Context(), ""); !errors.Is(err, driver.ErrInvalidKey) {
		t.Fatalf("WatchKey(\"\") = %v, want ErrInvalidKey", err)
	}
	ch, err := d.WatchKey(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	_ = d.Close()
	waitClosed(t, ch, "Close")
	if _, err := d.WatchKey(t.Context(), "k"); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("WatchKey after Close = %v, want ErrClosed", err)
	}
}

// TestElection_ObservePushed: on ZooKeeper, Observe learns of each new
// leader by the watch, with a poll interval far longer than the test.
func TestElection_ObservePushed(t *testing.T) {
	e := newEnv(t)
	var ls []*dlock.Locker
	for range 2 {
		d, _ := e.mustOpen(t)
		l := dlock.New(d)
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
	}
	dlocktest.CheckObservePushed(t, ls[0], ls[1])
}
