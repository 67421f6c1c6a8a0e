package redisdriver

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestNotRedis_IsInvalidArgument (issue 13 F6): a redis:// URL that points
// at a server that answers but does not speak Redis's protocol (a plain
// HTTP/1.1 server, a real dlockd) is a configuration error: Open returns
// driver.ErrInvalidArgument with a message that says so, never
// driver.ErrUnavailable, and through the root package WithFailOpen returns
// that error rather than a degraded lease.
func TestNotRedis_IsInvalidArgument(t *testing.T) {
	h1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello\n") }))
	defer h1.Close()
	d := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	for name, addr := range map[string]string{
		"HTTP/1.1": strings.TrimPrefix(h1.URL, "http://"),
		"dlockd":   d.Addr(),
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			drv, err := Open(ctx, "redis://"+addr)
			if err == nil {
				_ = drv.Close()
				t.Fatal("Open accepted a server that is not Redis")
			}
			t.Logf("Open: %v", err)
			if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
				t.Errorf("Open = %v; want ErrInvalidArgument, not ErrUnavailable", err)
			}
			if !strings.Contains(err.Error(), "does not speak the Redis protocol (is it Redis?)") {
				t.Errorf("Open: %q does not say the server is not Redis", err)
			}
			l, err := dlock.Open(ctx, "redis://"+addr)
			if err == nil {
				ls, err := l.TryAcquire(ctx, "k", dlock.WithFailOpen())
				_ = l.Close()
				if err == nil {
					t.Fatalf("root TryAcquire with WithFailOpen: a lease (degraded %v), want an error", ls.Degraded())
				}
			}
			if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
				t.Errorf("root = %v; want ErrInvalidArgument, not ErrUnavailable", err)
			}
		})
	}
}
