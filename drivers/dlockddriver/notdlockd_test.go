package dlockddriver_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestNotDlockd_IsInvalidArgument (issue 13 F6): a dlockd:// URL that points
// at a server that answers but does not speak dlockd's protocol (a real
// redis-server, a plain HTTP/1.1 server) is a configuration
// error: every call returns driver.ErrInvalidArgument with a message that
// says so, never driver.ErrUnavailable, and through the root package
// WithFailOpen returns that error rather than a degraded lease.
func TestNotDlockd_IsInvalidArgument(t *testing.T) {
	r := testservers.StartRedis(t)
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello\n") })
	h1 := httptest.NewServer(handler)
	defer h1.Close()
	servers := map[string]string{
		"redis":    r.Addr(),
		"HTTP/1.1": strings.TrimPrefix(h1.URL, "http://"),
	}
	for name, addr := range servers {
		t.Run(name, func(t *testing.T) {
			u, _ := url.Parse("dlockd://" + addr)
			d, err := dlockddriver.Open(t.Context(), u)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			req := driver.AcquireRequest{Key: "k", Owner: "owner-0123456789", TTL: 10 * time.Second}
			calls := map[string]func(ctx context.Context) error{
				"TryAcquire": func(ctx context.Context) error { _, err := d.TryAcquire(ctx, req); return err },
				"Release":    func(ctx context.Context) error { return d.Release(ctx, req.Key, req.Owner) },
				"Renew":      func(ctx context.Context) error { return d.Renew(ctx, req.Key, req.Owner, req.TTL) },
				"Wait":       func(ctx context.Context) error { _, err := d.Wait(ctx, req); return err },
			}
			for call, fn := range calls {
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				err := fn(ctx)
				cancel()
				if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
					t.Errorf("%s = %v; want ErrInvalidArgument, not ErrUnavailable", call, err)
					continue
				}
				if !strings.Contains(err.Error(), "does not speak the dlockd protocol (is it dlockd?)") {
					t.Errorf("%s: %q does not say the server is not dlockd", call, err)
				}
				t.Logf("%s: %v", call, err)
			}
			l, err := dlock.Open(t.Context(), "dlockd://"+addr)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			ls, err := l.TryAcquire(ctx, "k", dlock.WithFailOpen())
			if err == nil {
				t.Fatalf("root TryAcquire with WithFailOpen: a lease (degraded %v), want an error", ls.Degraded())
			}
			if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
				t.Errorf("root TryAcquire with WithFailOpen = %v; want ErrInvalidArgument, not ErrUnavailable", err)
			}
			if !strings.Contains(err.Error(), addr) {
				t.Errorf("root error %q does not name the address %s", err, addr)
			}
			t.Logf("root: %v", err)
		})
	}
}
