package dlockddriver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
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
		TTL:        time.Second,
	})
}

func TestConformance_Subprocess(t *testing.T) {
	p := servertest.StartProcess(t)
	dlocktest.Run(t, dlocktest.Harness{
		Name:       "dlockd",
		NewDriver:  func(ctx context.Context) (driver.Driver, error) { return openURL(ctx, p.Addr()) },
		StopStore:  p.Stop,
		StartStore: p.Start,
		TTL:        time.Second,
	})
}

func TestOpen_DefaultPort(t *testing.T) {
	u, _ := url.Parse("dlockd://127.0.0.1")
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
	if err := d.Renew(t.Context(), "k", "owner-a-0123456789", ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after expiry = %v, want ErrLeaseLost", err)
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
