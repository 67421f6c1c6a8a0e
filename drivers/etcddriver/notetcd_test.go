package etcddriver_test

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

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/etcddriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestOpen_NotEtcdIsInvalidArgument (issue 13 F6): an etcd:// URL that
// points at a server that answers but does not speak etcd's gRPC protocol
// (a real redis-server, a plain HTTP/1.1 server) is a configuration error:
// Open returns driver.ErrInvalidArgument saying so, never
// driver.ErrUnavailable.
func TestOpen_NotEtcdIsInvalidArgument(t *testing.T) {
	r := testservers.StartRedis(t)
	h1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello\n") }))
	defer h1.Close()
	for name, addr := range map[string]string{"redis": r.Addr(), "HTTP/1.1": strings.TrimPrefix(h1.URL, "http://")} {
		t.Run(name, func(t *testing.T) {
			u, _ := url.Parse("etcd://" + addr + "?dial_timeout=2s")
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			d, err := etcddriver.Open(ctx, u)
			if err == nil {
				_ = d.Close()
				t.Fatal("Open accepted a server that is not etcd")
			}
			t.Logf("Open: %v", err)
			if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
				t.Errorf("Open = %v; want ErrInvalidArgument, not ErrUnavailable", err)
			}
			if !strings.Contains(err.Error(), "does not speak etcd's protocol (is it etcd?)") {
				t.Errorf("Open: %q does not say the server is not etcd", err)
			}
		})
	}
}
