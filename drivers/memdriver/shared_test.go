package memdriver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

func view(t *testing.T, d *memdriver.Driver, mode driver.Mode, limit int) driver.Driver {
	t.Helper()
	v, err := d.SharedView(driver.SharedKind{Mode: mode, Limit: limit})
	if err != nil {
		t.Fatalf("SharedView(%v, %d): %v", mode, limit, err)
	}
	return v
}

func req(key string, i int) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: fmt.Sprintf("owner-%d", i), TTL: 10 * time.Second}
}

// waitAsync starts a Wait and returns the channel of its result.
func waitAsync(ctx context.Context, v driver.Driver, r driver.AcquireRequest) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := v.(driver.Waiter).Wait(ctx, r)
		ch <- err
	}()
	return ch
}

func queued(t *testing.T, d *memdriver.Driver, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, _ := d.Inspect(t.Context(), key)
		if info.Waiters == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters on %q, want %d", info.Waiters, key, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func pending(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned early: %v", what, err)
	case <-time.After(20 * time.Millisecond):
	}
}

func granted(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not granted", what)
	}
}

func TestSharedView_PermitLimitAndFences(t *testing.T) {
	d := memdriver.New(memdriver.NewStore())
	sem := view(t, d, driver.Shared, 2)
	var last uint64
	for i := range 2 {
		g, err := sem.TryAcquire(t.Context(), req("k", i))
		if err != nil || g.Fence <= last {
			t.Fatalf("permit %d: fence %d after %d, %v", i, g.Fence, last, err)
		}
		last = g.Fence
	}
	if _, err := sem.TryAcquire(t.Context(), req("k", 2)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("third permit of 2: %v, want ErrNotAcquired", err)
	}
	if _, err := d.TryAcquire(t.Context(), req("k", 3)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("plain lock of a key with permits: %v, want ErrNotAcquired", err)
	}
	other := view(t, d, driver.Shared, 3)
	if _, err := other.TryAcquire(t.Context(), req("k", 4)); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("limit 3 on a key of limit 2: %v, want ErrInvalidArgument", err)
	}
	if err := sem.Renew(t.Context(), "k", "owner-0", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := sem.Release(t.Context(), "k", "owner-0"); err != nil {
		t.Fatal(err)
	}
	if err := sem.Release(t.Context(), "k", "owner-0"); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second release: %v, want ErrLeaseLost", err)
	}
	g, err := sem.TryAcquire(t.Context(), req("k", 5))
	if err != nil || g.Fence <= last {
		t.Fatalf("freed permit: fence %d after %d, %v", g.Fence, last, err)
	}
	for _, k := range []driver.SharedKind{{Mode: driver.Shared, Limit: -1}, {Mode: driver.Exclusive, Limit: 2}, {Mode: 0}, {Mode: driver.Shared, Limit: driver.MaxPermits + 1}} {
		if _, err := d.SharedView(k); !errors.Is(err, driver.ErrInvalidArgument) {
			t.Fatalf("SharedView(%+v): %v, want ErrInvalidArgument", k, err)
		}
	}
}

// A queued writer holds back later readers (writer preference); its release
// grants every reader queued behind it in one step.
func TestSharedView_WriterPreference(t *testing.T) {
	d := memdriver.New(memdriver.NewStore())
	r, w := view(t, d, driver.Shared, 0), view(t, d, driver.Exclusive, 0)
	for i := range 3 {
		if _, err := r.TryAcquire(t.Context(), req("rw", i)); err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
	}
	writer := waitAsync(t.Context(), w, req("rw", 10))
	queued(t, d, "rw", 1)
	if _, err := r.TryAcquire(t.Context(), req("rw", 11)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("reader behind a queued writer: %v, want ErrNotAcquired", err)
	}
	late1 := waitAsync(t.Context(), r, req("rw", 12))
	late2 := waitAsync(t.Context(), r, req("rw", 13))
	queued(t, d, "rw", 3)
	for i := range 3 {
		pending(t, writer, "writer while readers hold")
		if err := r.Release(t.Context(), "rw", fmt.Sprintf("owner-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	granted(t, writer, "writer after the readers left")
	pending(t, late1, "reader while the writer holds")
	if err := w.Release(t.Context(), "rw", "owner-10"); err != nil {
		t.Fatal(err)
	}
	granted(t, late1, "first reader after the writer")
	granted(t, late2, "second reader after the writer")
}

// A waiter that gives up leaves nothing behind, and readers behind a writer
// that gave up are granted at once.
func TestSharedView_CancelledWaiterLeavesNothing(t *testing.T) {
	d := memdriver.New(memdriver.NewStore())
	r, w := view(t, d, driver.Shared, 0), view(t, d, driver.Exclusive, 0)
	if _, err := r.TryAcquire(t.Context(), req("c", 0)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	writer := waitAsync(ctx, w, req("c", 1))
	queued(t, d, "c", 1)
	reader := waitAsync(t.Context(), r, req("c", 2))
	queued(t, d, "c", 2)
	cancel()
	if err := <-writer; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled writer: %v", err)
	}
	granted(t, reader, "reader behind a writer that gave up")
	for _, o := range []string{"owner-0", "owner-2"} {
		if err := r.Release(t.Context(), "c", o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Inspect(t.Context(), "c"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("key after every holder left: %v, want free", err)
	}
}

// An expired permit is handed to the head waiter by the store's timer.
func TestSharedView_ExpiryHandsOver(t *testing.T) {
	d := memdriver.New(memdriver.NewStore())
	sem := view(t, d, driver.Shared, 1)
	r := req("e", 0)
	r.TTL = 100 * time.Millisecond
	if _, err := sem.TryAcquire(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	ch := waitAsync(t.Context(), sem, req("e", 1))
	granted(t, ch, "waiter after the permit expired")
	if err := sem.Renew(t.Context(), "e", "owner-0", time.Second); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("renewing the expired permit: %v, want ErrLeaseLost", err)
	}
}

// TestResume_KindMustMatch: a Shared grant is resumed only through a view
// of its kind (its limit too), a plain grant only through the Driver; any
// other Resume is ErrLeaseLost and leaves the grant as it was.
func TestResume_KindMustMatch(t *testing.T) {
	d := memdriver.New(memdriver.NewStore())
	defer d.Close()
	ctx := context.Background()
	permits := view(t, d, driver.Shared, 2)
	p := req("k-permit", 1)
	g, err := permits.TryAcquire(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	plain := req("k-plain", 2)
	pg, err := d.TryAcquire(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		r    driver.Resumer
		req  driver.AcquireRequest
		f    uint64
	}{
		{"permit through the Driver", d, p, g.Fence},
		{"permit through a view of another limit", view(t, d, driver.Shared, 3).(driver.Resumer), p, g.Fence},
		{"permit through a reader view", view(t, d, driver.Shared, 0).(driver.Resumer), p, g.Fence},
		{"plain grant through a permit view", permits.(driver.Resumer), plain, pg.Fence},
	} {
		if _, err := c.r.Resume(ctx, c.req, c.f); !errors.Is(err, driver.ErrLeaseLost) {
			t.Errorf("Resume of a %s = %v, want ErrLeaseLost", c.name, err)
		}
	}
	if _, err := permits.(driver.Resumer).Resume(ctx, p, g.Fence); err != nil {
		t.Errorf("Resume of a permit through its view: %v", err)
	}
	if _, err := d.Resume(ctx, plain, pg.Fence); err != nil {
		t.Errorf("Resume of a plain grant through the Driver: %v", err)
	}
}
