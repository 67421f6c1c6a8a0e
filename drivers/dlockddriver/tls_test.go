package dlockddriver_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/internal/netproxy"
	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// tlsServer starts a dlockd serving TLS with a certificate of a new CA,
// edited by edit (nil: none), and returns it with the CA.
func tlsServer(t *testing.T, edit func(*server.Config, *servertest.CA)) (*servertest.Embedded, *servertest.CA) {
	t.Helper()
	ca := servertest.NewCA(t, "dlockd test CA")
	leaf := ca.Issue(t, "dlockd")
	cfg := servertest.Config(t, t.TempDir())
	cfg.TLSCertFile, cfg.TLSKeyFile = leaf.CertFile, leaf.KeyFile
	if edit != nil {
		edit(&cfg, ca)
	}
	return servertest.StartEmbedded(t, cfg), ca
}

// openTLS opens a Driver for "dlockd://addr?query" through the registry.
func openTLS(ctx context.Context, addr, query string) (driver.Driver, error) {
	return openURL(ctx, addr+"?"+query)
}

// The conformance suite over TLS (tls=1&ca=FILE).
func TestConformance_TLS(t *testing.T) {
	srv, ca := tlsServer(t, nil)
	q := "tls=1&ca=" + url.QueryEscape(ca.CertFile)
	dlocktest.Run(t, dlocktest.Harness{
		Name:       "dlockd-tls",
		NewDriver:  func(ctx context.Context) (driver.Driver, error) { return openTLS(ctx, srv.Addr(), q) },
		StopStore:  srv.Stop,
		StartStore: srv.Start,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return openTLS(ctx, via(srv.Addr()), q)
		},
		NoFreezeReason: "the embedded server runs in the test process, which SIGSTOP would stop too",
		TTL:            time.Second,
	})
}

// TestTLS_DriverCalls: TryAcquire, Renew, Wait (handed over on Release)
// and Release through a TLS Driver; ca implies tls.
func TestTLS_DriverCalls(t *testing.T) {
	srv, ca := tlsServer(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	d, err := openTLS(ctx, srv.Addr(), "ca="+url.QueryEscape(ca.CertFile))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	w := d.(driver.Waiter)
	a, b := owner(1, "tls"), owner(2, "tls")
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: "tls:k", Owner: a, TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("TryAcquire over TLS: %v", err)
	}
	if err := d.Renew(ctx, "tls:k", a, 5*time.Second); err != nil {
		t.Fatalf("Renew over TLS: %v", err)
	}
	got := make(chan error, 1)
	var g2 driver.Grant
	go func() {
		var err error
		g2, err = w.Wait(ctx, driver.AcquireRequest{Key: "tls:k", Owner: b, TTL: 5 * time.Second})
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := d.Release(ctx, "tls:k", a); err != nil {
		t.Fatalf("Release over TLS: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Wait over TLS: %v", err)
	}
	if g2.Fence <= g.Fence {
		t.Fatalf("waiter's fence %d not above the first holder's %d", g2.Fence, g.Fence)
	}
	if err := d.Release(ctx, "tls:k", b); err != nil {
		t.Fatal(err)
	}
}

// TestTLS_PlaintextDriverToTLSPort: a Driver without tls=1 is refused by a
// TLS port: ErrUnavailable at the root, with a hint at tls=1. A TLS
// Driver to a plaintext port gets ErrInvalidArgument (a configuration
// error, not retried) saying the port does not serve TLS.
func TestTLS_PlaintextDriverToTLSPort(t *testing.T) {
	srv, _ := tlsServer(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, "dlockd://"+srv.Addr(), dlock.WithOpTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.TryAcquire(ctx, "k")
	if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), "tls=1") {
		t.Fatalf("plaintext Driver to a TLS port: %v, want ErrUnavailable hinting at tls=1", err)
	}
	t.Logf("plaintext to TLS: %v", err)

	plain := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ca := servertest.NewCA(t, "any")
	l2, err := dlock.Open(ctx, "dlockd://"+plain.Addr()+"?ca="+url.QueryEscape(ca.CertFile), dlock.WithOpTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	_, err = l2.TryAcquire(ctx, "k")
	if !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "does not serve TLS") {
		t.Fatalf("TLS Driver to a plaintext port: %v, want ErrInvalidArgument saying the port does not serve TLS", err)
	}
	t.Logf("TLS to plaintext: %v", err)
}

// TestTLS_UntrustedServer: a server certificate of another CA, or not
// valid for the dialled name, is refused; server_name fixes the name.
func TestTLS_UntrustedServer(t *testing.T) {
	srv, ca := tlsServer(t, nil)
	other := servertest.NewCA(t, "other CA")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for name, c := range map[string]struct{ query, want string }{
		"another CA":        {"ca=" + url.QueryEscape(other.CertFile), "certificate"},
		"system roots":      {"tls=1", "certificate"},
		"wrong server_name": {"ca=" + url.QueryEscape(ca.CertFile) + "&server_name=dlockd.example", `does not name "dlockd.example" (the name checked: server_name=dlockd.example); it names localhost, 127.0.0.1, ::1`},
	} {
		t.Run(name, func(t *testing.T) {
			l, err := dlock.Open(ctx, "dlockd://"+srv.Addr()+"?"+c.query, dlock.WithOpTimeout(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			_, err = l.TryAcquire(ctx, "k")
			if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "set server_name=NAME") {
				t.Fatalf("TryAcquire = %v, want ErrUnavailable naming %q", err, c.want)
			}
			t.Logf("%s: %v", name, err)
		})
	}
	// server_name: the certificate names localhost; dial 127.0.0.1 as it.
	l, err := dlock.Open(ctx, "dlockd://"+srv.Addr()+"?ca="+url.QueryEscape(ca.CertFile)+"&server_name=localhost")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("server_name=localhost: %v", err)
	}
	_ = lease.Release(ctx)
}

// TestTLS_ClientCertificates: with --tls-client-ca, a Driver without a
// client certificate, with one of another CA (which it does not send), or
// with an expired one is refused with ErrPermissionDenied naming the cause
// (never ErrUnavailable: retrying cannot help, and the old "connection
// closed before the HTTP/2 preface" hinted at a server that was not
// running); one of the client CA is served.
func TestTLS_ClientCertificates(t *testing.T) {
	clients := servertest.NewCA(t, "clients CA")
	srv, ca := tlsServer(t, func(c *server.Config, _ *servertest.CA) { c.TLSClientCAFile = clients.CertFile })
	other := servertest.NewCA(t, "other CA")
	good := clients.Issue(t, "app")
	foreign := other.Issue(t, "app")
	expired := clients.IssueWith(t, "app", servertest.LeafOptions{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	q := func(l *servertest.Leaf) string {
		s := "ca=" + url.QueryEscape(ca.CertFile)
		if l != nil {
			s += "&cert=" + url.QueryEscape(l.CertFile) + "&key=" + url.QueryEscape(l.KeyFile)
		}
		return s
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for name, c := range map[string]struct {
		leaf *servertest.Leaf
		want string
	}{
		"no certificate": {nil, "client certificate is required"},
		"another CA":     {foreign, "client certificate is required"},
		"expired":        {expired, "certificate has expired"},
	} {
		t.Run(name, func(t *testing.T) {
			l, err := dlock.Open(ctx, "dlockd://"+srv.Addr()+"?"+q(c.leaf), dlock.WithOpTimeout(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			_, err = l.TryAcquire(ctx, "k")
			if !errors.Is(err, dlock.ErrPermissionDenied) || errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "preface") {
				t.Fatalf("TryAcquire = %v, want ErrPermissionDenied saying %q", err, c.want)
			}
			t.Logf("%s: %v", name, err)
		})
	}
	l, err := dlock.Open(ctx, "dlockd://"+srv.Addr()+"?"+q(good))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("valid client certificate: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTLSConfig_BadParameters: every bad TLS parameter is an
// ErrInvalidArgument from Open naming the parameter (and the file).
func TestTLSConfig_BadParameters(t *testing.T) {
	dir := t.TempDir()
	ca := servertest.NewCA(t, "CA")
	leaf := ca.Issue(t, "c")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	e := url.QueryEscape
	for name, c := range map[string]struct{ query, want string }{
		"tls not a boolean":  {"tls=yes", `tls="yes"`},
		"missing ca":         {"ca=" + e(missing), `ca="` + missing + `"`},
		"ca not PEM":         {"ca=" + e(garbage), `ca="` + garbage + `"`},
		"cert without key":   {"cert=" + e(leaf.CertFile), "cert and key"},
		"key without cert":   {"tls=1&key=" + e(leaf.KeyFile), "cert and key"},
		"missing cert":       {"cert=" + e(missing) + "&key=" + e(leaf.KeyFile), `cert="` + missing + `"`},
		"missing key":        {"cert=" + e(leaf.CertFile) + "&key=" + e(missing), `key="` + missing + `"`},
		"key is not the key": {"cert=" + e(leaf.CertFile) + "&key=" + e(garbage), `key="` + garbage + `"`},
		"ca with tls=0":      {"tls=0&ca=" + e(ca.CertFile), "tls=0"},
		"server_name alone":  {"server_name=x", "server_name"},
	} {
		t.Run(name, func(t *testing.T) {
			d, err := openURL(t.Context(), "127.0.0.1:7450?"+c.query)
			if err == nil {
				_ = d.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open = %v, want ErrInvalidArgument naming %s", err, c.want)
			}
		})
	}
	for _, q := range []string{"tls=1", "tls=true", "tls=0", "ca=" + e(ca.CertFile) + "&cert=" + e(leaf.CertFile) + "&key=" + e(leaf.KeyFile) + "&server_name=localhost"} {
		u, _ := url.Parse("dlockd://127.0.0.1:7450?" + q)
		d, err := dlockddriver.Open(t.Context(), u)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		_ = d.Close()
	}
}

// TestTLS_DriversShareConnection: TLS Drivers opened from the same URL
// parameters (the same files) share one connection; one with another CA
// does not ride on it: it dials its own and fails verification, while the
// others keep working.
func TestTLS_DriversShareConnection(t *testing.T) {
	srv, ca := tlsServer(t, nil)
	p := netproxy.Start(t, srv.Addr(), 1)
	other := servertest.NewCA(t, "other CA")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	q := "ca=" + url.QueryEscape(ca.CertFile)
	var ds []driver.Driver
	for range 3 {
		d, err := openTLS(ctx, p.Addr(), q)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds = append(ds, d)
	}
	for i, d := range ds {
		if err := cycle(ctx, d, "tlsshare:"+strconv.Itoa(i)); err != nil {
			t.Fatalf("driver %d: %v", i, err)
		}
	}
	if n := p.Stats().Conns; n != 1 {
		t.Fatalf("3 TLS Drivers of the same URL made %d connections, want 1", n)
	}
	bad, err := openTLS(ctx, p.Addr(), "ca="+url.QueryEscape(other.CertFile))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	bctx, bcancel := context.WithTimeout(ctx, 3*time.Second)
	defer bcancel()
	if err := cycle(bctx, bad, "tlsshare:bad"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Driver trusting another CA: %v, want a certificate error", err)
	}
	if err := cycle(ctx, ds[0], "tlsshare:after"); err != nil {
		t.Fatal(err)
	}
	if n := p.Stats().Conns; n < 2 {
		t.Fatalf("the Driver of another CA dialled no connection of its own (%d in all)", n)
	}
}
