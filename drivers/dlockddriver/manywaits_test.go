package dlockddriver_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestWaits_MoreThanAConnectionsStreams: a process whose Waits outnumber
// the streams dlockd allows on one connection still reaches the server's
// queue with every Wait, and its unary calls (Inspect, List, ForceRelease)
// on the same Driver are answered while they wait. Before, the Waits took
// every stream of the connection: the rest of them, and every unary call,
// waited for one until their op timeout (ErrUnavailable).
func TestWaits_MoreThanAConnectionsStreams(t *testing.T) {
	const streams = 600 // the server's limit per connection
	n := 2*dlockddriver.WaitsPerConn + 76
	p := servertest.StartProcess(t, fmt.Sprintf("--max-streams-per-connection=%d", streams))
	ctx := t.Context()
	holder := dial(t, p.Addr(), &dlockddriver.Options{PrivateConn: true})
	w := dial(t, p.Addr(), nil)
	const key = "many/k"
	req := func(i int) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Owner: fmt.Sprintf("owner-%06d-waits", i), TTL: time.Minute}
	}
	if _, err := holder.TryAcquire(ctx, req(-1)); err != nil {
		t.Fatal(err)
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	granted := make(chan int, n) // the granted Waits, by index
	errs := make(chan error, n)
	// The first two queue in turn, the rest together.
	for i := range n {
		if i <= 2 {
			awaitWaiters(t, w, key, i)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := w.Wait(wctx, req(i)); err != nil {
				errs <- err
				return
			}
			granted <- i
		}()
	}
	// Every Wait queued: asked through w itself, whose connection carries
	// the Waits.
	deadline := time.Now().Add(time.Minute)
	for {
		info, err := w.Inspect(ctx, key)
		if err != nil {
			t.Fatalf("Inspect on the waiting Driver: %v", err)
		}
		if info.Waiters == n {
			break
		}
		if time.Now().After(deadline) {
			first, extras := dlockddriver.WaitStreams(w)
			t.Fatalf("%d of %d Waits queued after a minute (Wait streams: %d on the first connection, %v on extra ones)", info.Waiters, n, first, extras)
		}
		time.Sleep(50 * time.Millisecond)
	}
	first, extras := dlockddriver.WaitStreams(w)
	sum := first
	for _, e := range extras {
		sum += e
	}
	if first > dlockddriver.WaitsPerConn || sum != n {
		t.Fatalf("Wait streams: %d on the first connection, %v on extra ones; want at most %d on the first, %d in all", first, extras, dlockddriver.WaitsPerConn, n)
	}
	// The unary calls of the waiting Driver are answered.
	if _, err := w.List(ctx, "many/"); err != nil {
		t.Fatalf("List on the waiting Driver: %v", err)
	}
	if _, err := w.ForceRelease(ctx, "many/free", "test"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("ForceRelease of a free key on the waiting Driver: %v, want ErrNotAcquired", err)
	}

	// A release hands the key to the first Wait (FIFO), which was on the
	// first connection.
	if err := holder.Release(ctx, key, req(-1).Owner); err != nil {
		t.Fatal(err)
	}
	select {
	case i := <-granted:
		if i != 0 {
			t.Fatalf("granted to waiter %d, want the first", i)
		}
		if err := w.Release(ctx, key, req(i).Owner); err != nil {
			t.Fatal(err)
		}
	case err := <-errs:
		t.Fatalf("a Wait failed: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no Wait was granted within 30 s of the release")
	}
	// The next waiter gets it; then everyone else gives up.
	select {
	case i := <-granted:
		if i != 1 {
			t.Fatalf("granted to waiter %d, want the second", i)
		}
	case err := <-errs:
		t.Fatalf("a Wait failed: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the second waiter was not granted within 30 s")
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled Wait returned %v, want context.Canceled", err)
		}
	}
	if len(granted) != 0 {
		t.Fatalf("%d more Waits were granted", len(granted))
	}
	// Nothing is left queued, and every Wait stream's place is given back.
	awaitWaiters(t, w, key, 0)
	waitUntil(t, func() bool {
		first, extras := dlockddriver.WaitStreams(w)
		for _, e := range extras {
			first += e
		}
		return first == 0
	})
}
