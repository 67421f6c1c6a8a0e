package dlockddriver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/internal/netproxy"
	"github.com/dlock-dev/dlock/server/servertest"
)

// openShared opens n Drivers on addr through the registry, closed at the
// end of the test.
func openShared(t *testing.T, addr string, n int) []driver.Driver {
	t.Helper()
	ds := make([]driver.Driver, n)
	for i := range ds {
		d, err := openURL(t.Context(), addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		ds[i] = d
	}
	return ds
}

// cycle takes key with d and gives it back.
func cycle(ctx context.Context, d driver.Driver, key string) error {
	owner := fmt.Sprintf("owner-%s-%d", key, time.Now().UnixNano())
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: 10 * time.Second}); err != nil {
		return err
	}
	return d.Release(ctx, key, owner)
}

// TestDriver_SharesConnectionInProcess: the Drivers of one process opened
// on the same member share one gRPC connection (the server, behind a
// proxy, is dialled once for eight Drivers), private_conn=1 dials its own,
// and the connection is closed with the last Driver.
func TestDriver_SharesConnectionInProcess(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	p := netproxy.Start(t, srv.Addr(), 1)
	before := dlockddriver.SharedConns()
	ds := openShared(t, p.Addr(), 8)
	for i, d := range ds {
		if err := cycle(t.Context(), d, fmt.Sprintf("share:%d", i)); err != nil {
			t.Fatalf("driver %d: %v", i, err)
		}
	}
	if n := p.Stats().Conns; n != 1 {
		t.Fatalf("8 Drivers made %d connections to the server, want 1 shared", n)
	}
	if n := dlockddriver.SharedConns() - before; n != 1 {
		t.Fatalf("%d shared connections open, want 1", n)
	}
	own, err := openURL(t.Context(), p.Addr()+"?private_conn=1")
	if err != nil {
		t.Fatal(err)
	}
	if err := cycle(t.Context(), own, "share:own"); err != nil {
		t.Fatal(err)
	}
	if n := p.Stats().Conns; n != 2 {
		t.Fatalf("with a private_conn=1 Driver: %d connections, want 2", n)
	}
	if err := own.Close(); err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		if err := d.Close(); err != nil {
			t.Fatalf("close driver %d: %v", i, err)
		}
		if i < len(ds)-1 {
			// The others still work on the connection.
			if err := cycle(t.Context(), ds[len(ds)-1], "share:last"); err != nil {
				t.Fatalf("after %d of %d Drivers closed: %v", i+1, len(ds), err)
			}
		}
	}
	if n := dlockddriver.SharedConns() - before; n != 0 {
		t.Fatalf("%d shared connections still open after every Driver closed, want 0", n)
	}
	if _, err := openURL(t.Context(), p.Addr()+"?private_conn=maybe"); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("private_conn=maybe: %v, want ErrInvalidArgument", err)
	}
}

// TestDriver_SharedConnectionHoldsAtMostDriversPerConn: one Driver more
// than DriversPerConn dials a second connection, and both are closed with
// their last Drivers.
func TestDriver_SharedConnectionHoldsAtMostDriversPerConn(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	p := netproxy.Start(t, srv.Addr(), 1)
	before := dlockddriver.SharedConns()
	ds := openShared(t, p.Addr(), dlockddriver.DriversPerConn+1)
	for i, d := range ds {
		if err := cycle(t.Context(), d, fmt.Sprintf("cap:%d", i)); err != nil {
			t.Fatalf("driver %d: %v", i, err)
		}
	}
	if n := p.Stats().Conns; n != 2 {
		t.Fatalf("%d Drivers made %d connections, want 2", len(ds), n)
	}
	for _, d := range ds {
		_ = d.Close()
	}
	if n := dlockddriver.SharedConns() - before; n != 0 {
		t.Fatalf("%d shared connections still open after every Driver closed, want 0", n)
	}
}

// TestDriver_SharedConnectionCallsAreIndependent: calls of many Drivers
// interleaved on one connection get each its own answer: the ones the
// server refuses (a key over its limit) fail alone, the valid ones run,
// and a Wait whose context ends meanwhile returns its context's error and
// leaves nothing queued or granted behind.
func TestDriver_SharedConnectionCallsAreIndependent(t *testing.T) {
	cfg := servertest.Config(t, t.TempDir())
	cfg.MaxKeyBytes = 64
	srv := servertest.StartEmbedded(t, cfg)
	p := netproxy.Start(t, srv.Addr(), 1)
	ds := openShared(t, p.Addr(), 16)
	ctx := t.Context()

	// A key held by ds[0], waited on by ds[1] until its context ends.
	const held = "indep:held"
	if _, err := ds[0].TryAcquire(ctx, driver.AcquireRequest{Key: held, Owner: "owner-held-0000", TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	wctx, cancelWait := context.WithCancel(ctx)
	defer cancelWait()
	go func() {
		_, err := ds[1].(driver.Waiter).Wait(wctx, driver.AcquireRequest{Key: held, Owner: "owner-wait-0001", TTL: 30 * time.Second})
		waitErr <- err
	}()

	long := strings.Repeat("k", 100)
	var wg sync.WaitGroup
	errs := make(chan error, len(ds)*20)
	for i := 2; i < len(ds); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				if i%2 == 0 {
					if err := cycle(ctx, ds[i], fmt.Sprintf("indep:%d", i)); err != nil {
						errs <- fmt.Errorf("driver %d cycle %d: %w", i, j, err)
					}
					continue
				}
				_, err := ds[i].TryAcquire(ctx, driver.AcquireRequest{Key: long, Owner: fmt.Sprintf("owner-bad-%04d", i), TTL: 10 * time.Second})
				if !errors.Is(err, driver.ErrInvalidKey) {
					errs <- fmt.Errorf("driver %d refused call %d: %v, want ErrInvalidKey", i, j, err)
				}
			}
		}()
		if i == len(ds)/2 {
			cancelWait() // in the middle of the others' calls
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	select {
	case err := <-waitErr:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Wait: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled Wait did not return within 10s")
	}
	if err := ds[0].Release(ctx, held, "owner-held-0000"); err != nil {
		t.Fatal(err)
	}
	// The cancelled waiter was not granted the key on release.
	if err := cycle(ctx, ds[2], held); err != nil {
		t.Fatalf("key after its holder released and its waiter cancelled: %v", err)
	}
	if n := p.Stats().Conns; n != 1 {
		t.Fatalf("%d connections, want 1 shared", n)
	}
}

// TestDriver_CloseEndsOnlyItsCallsOnSharedConnection: closing a Driver
// ends its own running Wait at once, as closing its own connection did,
// while the Drivers sharing its connection keep their grants and calls;
// once all are closed no goroutine is left.
func TestDriver_CloseEndsOnlyItsCallsOnSharedConnection(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ignore := goleak.IgnoreCurrent()
	before := dlockddriver.SharedConns()
	ctx := t.Context()
	var ds []driver.Driver
	for range 3 {
		d, err := openURL(ctx, srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	a, b, c := ds[0], ds[1], ds[2]
	const key = "close:k"
	if _, err := a.TryAcquire(ctx, driver.AcquireRequest{Key: key, Owner: "owner-a-00000", TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, err := b.(driver.Waiter).Wait(context.Background(), driver.AcquireRequest{Key: key, Owner: "owner-b-00000", TTL: 30 * time.Second})
		waitErr <- err
	}()
	time.Sleep(200 * time.Millisecond) // let the wait queue (it may also not have yet: both are fine)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waitErr:
		if err == nil {
			t.Fatal("Wait of a closed Driver was granted")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return within 10s of its Driver's Close")
	}
	if err := a.Renew(ctx, key, "owner-a-00000", 30*time.Second); err != nil {
		t.Fatalf("renew on the shared connection after another Driver closed: %v", err)
	}
	if err := cycle(ctx, c, "close:other"); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, key, "owner-a-00000"); err != nil {
		t.Fatal(err)
	}
	if err := cycle(ctx, c, key); err != nil { // b's wait left no grant behind
		t.Fatalf("key after release: %v", err)
	}
	if n := dlockddriver.SharedConns() - before; n != 1 {
		t.Fatalf("%d shared connections, want 1", n)
	}
	_ = a.Close()
	_ = c.Close()
	if n := dlockddriver.SharedConns() - before; n != 0 {
		t.Fatalf("%d shared connections after every Driver closed, want 0", n)
	}
	goleak.VerifyNone(t, ignore)
}
