package server_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/internal/netproxy"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// startTLS starts a dlockd whose API serves TLS with a certificate of a
// new CA (edit, when not nil, changes the configuration), and returns it
// with the CA and the certificate.
func startTLS(t *testing.T, edit func(*server.Config)) (*servertest.Embedded, *servertest.CA, *servertest.Leaf) {
	t.Helper()
	ca := servertest.NewCA(t, "dlockd API CA")
	leaf := ca.Issue(t, "dlockd")
	srv := start(t, func(c *server.Config) {
		c.TLSCertFile, c.TLSKeyFile = leaf.CertFile, leaf.KeyFile
		if edit != nil {
			edit(c)
		}
	})
	return srv, ca, leaf
}

// httpsClient returns an HTTP client trusting ca and presenting leaves,
// that offers h2 and http/1.1 as browsers do.
func httpsClient(t *testing.T, ca *servertest.CA, leaves ...*servertest.Leaf) *http.Client {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: ca.ClientTLS(leaves...), ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// postJSON posts body to url with c and decodes the JSON answer.
func postJSON(t *testing.T, c *http.Client, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("POST %s: answer %q is not JSON: %v", url, b, err)
	}
	return resp.StatusCode, m
}

// TestTLS_GRPCAndHTTPSOnOnePort: one TLS port serves the driver's gRPC
// (acquire, renew, a wait handed the key on release) and JSON over HTTPS
// to a client offering h2 and http/1.1 (it gets HTTP/1.1, as a browser
// does); they see each other's grants.
func TestTLS_GRPCAndHTTPSOnOnePort(t *testing.T) {
	srv, ca, _ := startTLS(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	u, _ := url.Parse("dlockd://" + srv.Addr() + "?tls=1&ca=" + url.QueryEscape(ca.CertFile))
	d, err := dlockddriver.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a, b := strings.Repeat("a", 32), strings.Repeat("b", 32)
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: "k", Owner: a, TTL: 5 * time.Second, Holder: "grpc"})
	if err != nil {
		t.Fatalf("acquire over gRPC+TLS: %v", err)
	}
	if err := d.Renew(ctx, "k", a, 5*time.Second); err != nil {
		t.Fatalf("renew over gRPC+TLS: %v", err)
	}

	hc := httpsClient(t, ca)
	resp, err := hc.Get("https://" + srv.Addr() + "/v1/inspect?key=k")
	if err != nil {
		t.Fatalf("HTTPS GET: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || resp.Proto != "HTTP/1.1" || !strings.Contains(string(body), `"grpc"`) {
		t.Fatalf("HTTPS inspect: %s %s %s, want 200 over HTTP/1.1 showing the gRPC grant", resp.Proto, resp.Status, body)
	}
	code, m := postJSON(t, hc, "https://"+srv.Addr()+"/v1/acquire", `{"key":"k","ttl":"5s"}`)
	if code != http.StatusConflict || m["reason"] != "LOCK_HELD" {
		t.Fatalf("HTTPS acquire of a held key: %d %v", code, m)
	}

	done := make(chan error, 1)
	var g2 driver.Grant
	go func() {
		var err error
		g2, err = d.Wait(ctx, driver.AcquireRequest{Key: "k", Owner: b, TTL: 5 * time.Second})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := d.Release(ctx, "k", a); err != nil {
		t.Fatalf("release over gRPC+TLS: %v", err)
	}
	if err := <-done; err != nil || g2.Fence <= g.Fence {
		t.Fatalf("wait over gRPC+TLS: %v, fence %d after %d", err, g2.Fence, g.Fence)
	}
	code, m = postJSON(t, hc, "https://"+srv.Addr()+"/v1/release", `{"key":"k","owner":"`+b+`"}`)
	if code != 200 {
		t.Fatalf("HTTPS release of the waiter's grant: %d %v", code, m)
	}
	// /healthz and /metrics are served over TLS too.
	resp, err = hc.Get("https://" + srv.Addr() + "/metrics")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("HTTPS /metrics: %v %v", resp, err)
	}
	_ = resp.Body.Close()
}

// TestTLS_PlaintextClientsRefused: a plaintext HTTP request to a TLS port
// is answered 400 with a line saying to use https; a plaintext gRPC
// client fails at once (UNAVAILABLE, the connection closed before the
// server preface); nothing is served in clear.
func TestTLS_PlaintextClientsRefused(t *testing.T) {
	srv, _, _ := startTLS(t, nil)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + srv.Addr() + "/healthz")
	if err != nil {
		t.Fatalf("plaintext GET: %v, want a 400 answer", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "https://") {
		t.Fatalf("plaintext GET: %s %q, want 400 saying to use https://", resp.Status, body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err = grpcClient(t, srv.Addr()).Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "server preface") {
		t.Fatalf("plaintext gRPC: %v, want UNAVAILABLE before the server preface", err)
	}
	t.Logf("plaintext gRPC: %v", err)
}

// TestTLS_ClientCertificates: with --tls-client-ca, an expired client
// certificate fails the handshake (HTTPS and gRPC); a client without one,
// or with one of another CA (which a Go client does not send), reaches
// the public routes (/healthz, /readyz, /metrics, /ui/) but every other
// HTTPS route answers 401 and every gRPC call UNAUTHENTICATED, "a client
// certificate is required", with or without an auth file; one of the
// client CA is served.
func TestTLS_ClientCertificates(t *testing.T) {
	for _, withAuth := range []bool{false, true} {
		t.Run(map[bool]string{false: "no auth file", true: "auth file"}[withAuth], func(t *testing.T) {
			clients := servertest.NewCA(t, "clients CA")
			srv, ca, _ := startTLS(t, func(c *server.Config) {
				c.TLSClientCAFile = clients.CertFile
				if withAuth {
					dir := t.TempDir()
					c.AuthFile = servertest.WriteAuthFile(t, dir, []servertest.Identity{{Name: "app", Token: "-", CertCN: []string{"app"}, Rules: map[string][]string{"": {"lock", "read"}}}})
				}
			})
			other := servertest.NewCA(t, "other CA")
			expired := clients.IssueWith(t, "app", servertest.LeafOptions{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Minute)})
			grpcInspect := func(t *testing.T, leaves ...*servertest.Leaf) error {
				t.Helper()
				cc, err := grpc.NewClient("passthrough:///"+srv.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientTLS(leaves...))))
				if err != nil {
					t.Fatal(err)
				}
				defer cc.Close()
				ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
				defer cancel()
				_, err = dlockv1.NewLockClient(cc).Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
				return err
			}
			t.Run("expired", func(t *testing.T) {
				if resp, err := httpsClient(t, ca, expired).Get("https://" + srv.Addr() + "/healthz"); err == nil {
					_ = resp.Body.Close()
					t.Fatalf("HTTPS: %s, want a refused handshake", resp.Status)
				}
				if err := grpcInspect(t, expired); err == nil || status.Code(err) == codes.OK {
					t.Fatal("gRPC served with an expired client certificate")
				}
			})
			for name, leaves := range map[string][]*servertest.Leaf{
				"no certificate": nil,
				"another CA":     {other.Issue(t, "app")},
			} {
				t.Run(name, func(t *testing.T) {
					hc := httpsClient(t, ca, leaves...)
					for _, path := range []string{"/healthz", "/readyz", "/metrics", "/ui/"} {
						resp, err := hc.Get("https://" + srv.Addr() + path)
						if err != nil {
							t.Fatalf("HTTPS GET %s: %v, want it served without a client certificate", path, err)
						}
						_ = resp.Body.Close()
						if resp.StatusCode != 200 {
							t.Fatalf("HTTPS GET %s: %s, want 200 (a public route)", path, resp.Status)
						}
					}
					for _, path := range []string{"/v1/inspect?key=k", "/v1/list", "/v1/cluster/status", "/ui/api/keys"} {
						resp, err := hc.Get("https://" + srv.Addr() + path)
						if err != nil {
							t.Fatalf("HTTPS GET %s: %v", path, err)
						}
						b, _ := io.ReadAll(resp.Body)
						_ = resp.Body.Close()
						if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), "client certificate is required") {
							t.Fatalf("HTTPS GET %s: %s %s, want 401 saying a client certificate is required", path, resp.Status, b)
						}
					}
					code, m := postJSON(t, hc, "https://"+srv.Addr()+"/v1/acquire", `{"key":"k","owner":"owner-http-0123456789","ttl":"30s"}`)
					if code != http.StatusUnauthorized {
						t.Fatalf("HTTPS POST /v1/acquire: %d %v, want 401", code, m)
					}
					err := grpcInspect(t, leaves...)
					if status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), "client certificate is required") {
						t.Fatalf("gRPC Inspect: %v, want UNAUTHENTICATED saying a client certificate is required", err)
					}
				})
			}
			good := clients.Issue(t, "app")
			resp, err := httpsClient(t, ca, good).Get("https://" + srv.Addr() + "/v1/inspect?key=k")
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("HTTPS with a valid client certificate: %v %v", resp, err)
			}
			_ = resp.Body.Close()
			if err := grpcInspect(t, good); err != nil {
				t.Fatalf("gRPC with a valid client certificate: %v", err)
			}
		})
	}
}

// TestTLS_CertificateRotation: after the certificate files are replaced
// and Reload (SIGHUP) runs, new connections get the new certificate
// without a restart; a reload with a broken file fails naming it, and
// the last good certificate stays.
func TestTLS_CertificateRotation(t *testing.T) {
	srv, ca, leaf := startTLS(t, nil)
	served := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", srv.Addr(), &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatalf("TLS dial: %v", err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if cn := served(); cn != "dlockd" {
		t.Fatalf("served certificate CN %q, want dlockd", cn)
	}
	next := ca.Issue(t, "dlockd-rotated")
	for _, f := range [][2]string{{leaf.CertFile, string(next.CertPEM)}, {leaf.KeyFile, string(next.KeyPEM)}} {
		if err := os.WriteFile(f[0], []byte(f[1]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if cn := served(); cn != "dlockd" {
		t.Fatalf("before the reload: CN %q, want the old dlockd", cn)
	}
	if err := srv.Server().Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if cn := served(); cn != "dlockd-rotated" {
		t.Fatalf("after the reload: CN %q, want dlockd-rotated", cn)
	}
	if err := os.WriteFile(leaf.CertFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := srv.Server().Reload()
	if err == nil || !strings.Contains(err.Error(), leaf.CertFile) {
		t.Fatalf("Reload with a broken certificate: %v, want an error naming %s", err, leaf.CertFile)
	}
	if cn := served(); cn != "dlockd-rotated" {
		t.Fatalf("after a failed reload: CN %q, want dlockd-rotated kept", cn)
	}
}

// TestConfig_ListenNeedsTLS: a Listen that is not loopback is refused
// without TLS, in one line naming --insecure-listen; TLS or the flag
// allow it.
func TestConfig_ListenNeedsTLS(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:7450", "[::]:7450", "192.168.1.10:7450", "dlock.example:7450"} {
		c := server.DefaultConfig()
		c.Listen = listen
		err := c.Validate()
		if err == nil {
			t.Fatalf("Listen %s without TLS: Validate() = nil", listen)
		}
		msg := err.Error()
		if strings.Contains(msg, "\n") || !strings.Contains(msg, "--insecure-listen") || !strings.Contains(msg, "--tls-cert") || !strings.Contains(msg, listen) {
			t.Fatalf("Listen %s: %q, want one line naming the address, --tls-cert and --insecure-listen", listen, msg)
		}
		c.InsecureListen = true
		if err := c.Validate(); err != nil {
			t.Fatalf("Listen %s with InsecureListen: %v", listen, err)
		}
		c.InsecureListen = false
		c.TLSCertFile, c.TLSKeyFile = "cert.pem", "key.pem"
		if err := c.Validate(); err != nil {
			t.Fatalf("Listen %s with TLS: %v", listen, err)
		}
	}
	for _, listen := range []string{"127.0.0.1:7450", "[::1]:7450", "localhost:7450", "127.0.0.1:0"} {
		c := server.DefaultConfig()
		c.Listen = listen
		if err := c.Validate(); err != nil {
			t.Fatalf("loopback Listen %s: %v", listen, err)
		}
	}
	bad := map[string]struct {
		edit func(*server.Config)
		want string
	}{
		"cert without key":      {func(c *server.Config) { c.TLSCertFile = "c" }, "both TLSCertFile and TLSKeyFile"},
		"key without cert":      {func(c *server.Config) { c.TLSKeyFile = "k" }, "both TLSCertFile and TLSKeyFile"},
		"client CA without TLS": {func(c *server.Config) { c.TLSClientCAFile = "ca" }, "--tls-client-ca"},
		"tls-ca without TLS":    {func(c *server.Config) { c.TLSCAFile = "ca" }, "--tls-ca"},
	}
	for name, b := range bad {
		c := server.DefaultConfig()
		b.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: Validate() = %v, want %q", name, err, b.want)
		}
	}
}

// TestTLS_StartRefusesBadFiles: a TLS file that is missing or does not
// parse, or a key that is not the certificate's, stops Start with an
// error naming the file.
func TestTLS_StartRefusesBadFiles(t *testing.T) {
	ca := servertest.NewCA(t, "CA")
	leaf := ca.Issue(t, "dlockd")
	otherKey := ca.Issue(t, "other").KeyFile
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for name, c := range map[string]struct {
		edit func(*server.Config)
		want string
	}{
		"missing cert":      {func(c *server.Config) { c.TLSCertFile = missing }, missing},
		"cert not PEM":      {func(c *server.Config) { c.TLSCertFile = garbage }, garbage},
		"key of another":    {func(c *server.Config) { c.TLSKeyFile = otherKey }, otherKey},
		"missing client CA": {func(c *server.Config) { c.TLSClientCAFile = missing }, missing},
		"client CA not PEM": {func(c *server.Config) { c.TLSClientCAFile = garbage }, garbage},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := servertest.Config(t, t.TempDir())
			cfg.TLSCertFile, cfg.TLSKeyFile = leaf.CertFile, leaf.KeyFile
			c.edit(&cfg)
			srv, err := server.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = srv.Start()
			_ = srv.Close()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Start = %v, want an error naming %s", err, c.want)
			}
		})
	}
}

// TestTLS_ClusterForwardsOverTLS: a 3-node cluster with API TLS, client
// certificates required (--tls-client-ca) and peer TLS. A follower
// forwards a gRPC call and an HTTPS call to the leader over TLS,
// presenting its peer certificate (accepted by the leader as a member's,
// though it is not of the client CA); the driver given only a follower
// reaches the leader. Members advertise localhost:PORT, the only name
// their API certificates hold, and every member-to-member dial goes
// through a proxy on 127.0.0.1 (RaftDialRewrite): TLS verifies the member
// under its real name, not the proxy's address.
func TestTLS_ClusterForwardsOverTLS(t *testing.T) {
	peerCA := servertest.NewCA(t, "peer CA")
	apiCA := servertest.NewCA(t, "API CA")
	clients := servertest.NewCA(t, "clients CA")
	rewrite := map[string]string{}
	nodes := startCluster(t, 3, func(i int, c *server.Config) {
		p := peerCA.Issue(t, c.NodeID)
		c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile = p.CertFile, p.KeyFile, peerCA.CertFile
		a := apiCA.IssueWith(t, c.NodeID+"-api", servertest.LeafOptions{DNSNames: []string{"localhost"}})
		c.TLSCertFile, c.TLSKeyFile, c.TLSCAFile = a.CertFile, a.KeyFile, apiCA.CertFile
		c.TLSClientCAFile = clients.CertFile
		_, port, _ := net.SplitHostPort(c.Listen)
		c.Advertise = "localhost:" + port
		rewrite[c.Advertise] = netproxy.Start(t, c.Listen, uint64(i)).Addr()
		c.RaftDialRewrite = rewrite // filled for every node before any starts
	})
	l := waitLeader(t, nodes, -1)
	waitUntil(t, "every member registered its API", func() bool { return registered(nodes, 3) })
	f := (l + 1) % 3
	follower := nodes[f].cfg.Listen
	app := clients.Issue(t, "app")
	appTLS := apiCA.ClientTLS(app)
	appTLS.ServerName = "localhost"

	// gRPC to the follower: its interceptor forwards to the leader.
	cc, err := grpc.NewClient("passthrough:///"+follower, grpc.WithTransportCredentials(credentials.NewTLS(appTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	g, err := dlockv1.NewLockClient(cc).Acquire(ctx, &dlockv1.AcquireRequest{Key: "fwd:grpc", Ttl: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatalf("gRPC acquire through the follower: %v", err)
	}
	if g.GetFence() == 0 {
		t.Fatal("no fence")
	}
	// HTTPS to the follower: forwarded to the leader's HTTPS.
	tr := &http.Transport{TLSClientConfig: appTLS}
	defer tr.CloseIdleConnections()
	code, m := postJSON(t, &http.Client{Transport: tr, Timeout: 10 * time.Second}, "https://"+follower+"/v1/acquire", `{"key":"fwd:http","ttl":"30s"}`)
	if code != 200 || m["fence"] == nil {
		t.Fatalf("HTTPS acquire through the follower: %d %v", code, m)
	}

	// The driver given only the follower finds the leader and is served.
	e := url.QueryEscape
	u, _ := url.Parse("dlockd://" + follower + "?ca=" + e(apiCA.CertFile) + "&cert=" + e(app.CertFile) + "&key=" + e(app.KeyFile) + "&server_name=localhost")
	d, err := dlockddriver.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: "fwd:driver", Owner: strings.Repeat("c", 32), TTL: 30 * time.Second}); err != nil {
		t.Fatalf("driver through the follower: %v", err)
	}
	waitUntil(t, "the driver to follow the leader", func() bool { return d.Leader() == nodes[l].cfg.Advertise })
	info, err := d.Inspect(ctx, "fwd:http")
	if err != nil || info.Fence == 0 {
		t.Fatalf("inspect on the leader: %+v %v", info, err)
	}
}

// TestTLS_ALPN: a client offering only h2 (gRPC's way) negotiates h2 and
// one offering http/1.1 and h2 (a browser's way) gets http/1.1, whose
// request the HTTP server answers.
func TestTLS_ALPN(t *testing.T) {
	srv, ca, _ := startTLS(t, nil)
	for _, c := range []struct {
		offer []string
		want  string
	}{{[]string{"h2"}, "h2"}, {[]string{"h2", "http/1.1"}, "http/1.1"}, {nil, ""}} {
		cfg := ca.ClientTLS()
		cfg.NextProtos = c.offer
		conn, err := tls.Dial("tcp", srv.Addr(), cfg)
		if err != nil {
			t.Fatalf("offer %v: %v", c.offer, err)
		}
		if got := conn.ConnectionState().NegotiatedProtocol; got != c.want {
			t.Errorf("offer %v: negotiated %q, want %q", c.offer, got, c.want)
		}
		if c.want != "h2" {
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil || resp.StatusCode != 200 {
				t.Errorf("offer %v: GET /healthz: %v %v", c.offer, resp, err)
			} else {
				_ = resp.Body.Close()
			}
		}
		_ = conn.Close()
	}
}
