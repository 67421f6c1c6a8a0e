package server

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/dlock-dev/dlock/internal/testcerts"
)

// handshake runs the API port's server handshake (a.base) against a
// client configured by cc over a pipe, and returns the server side's
// connection (nil when the handshake failed).
func handshake(t *testing.T, a *apiTLS, cc *tls.Config) *tls.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		c   *tls.Conn
		err error
	}
	res := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			res <- result{err: err}
			return
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		srv := tls.Server(c, a.base)
		err = srv.Handshake()
		_ = c.SetDeadline(time.Time{})
		res <- result{srv, err}
	}()
	cc = cc.Clone()
	cc.ServerName = "127.0.0.1"
	cl, err := tls.Dial("tcp", ln.Addr().String(), cc)
	if err == nil {
		t.Cleanup(func() { _ = cl.Close() })
	}
	r := <-res
	if r.c != nil {
		t.Cleanup(func() { _ = r.c.Close() })
	}
	if r.err != nil || err != nil {
		return nil
	}
	return r.c
}

// TestMemberCert: with a client CA and a peer CA, a client certificate of
// either is accepted; memberCert is true for the peer CA's only (with its
// CN), false for the client CA's and for a plaintext caller; the state
// reaches tlsStateFromContext through the HTTP connection context and
// through the gRPC credentials' AuthInfo.
func TestMemberCert(t *testing.T) {
	apiCA := testcerts.NewCA(t, "API CA")
	peerCA := testcerts.NewCA(t, "peer CA")
	clients := testcerts.NewCA(t, "clients CA")
	api := apiCA.Issue(t, "n1-api")
	peerLeaf := peerCA.Issue(t, "n1")
	cfg := DefaultConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSClientCAFile = api.CertFile, api.KeyFile, clients.CertFile
	cfg.PeerCertFile, cfg.PeerKeyFile, cfg.PeerCAFile = peerLeaf.CertFile, peerLeaf.KeyFile, peerCA.CertFile
	a, err := newAPITLS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: cfg, tls: a}

	member := handshake(t, a, apiCA.ClientTLS(peerCA.Issue(t, "n2")))
	app := handshake(t, a, apiCA.ClientTLS(clients.Issue(t, "app")))
	if member == nil || app == nil {
		t.Fatal("a client certificate of the peer CA or of the client CA was refused")
	}
	if handshake(t, a, apiCA.ClientTLS()) != nil {
		t.Fatal("no client certificate accepted with --tls-client-ca")
	}
	if handshake(t, a, apiCA.ClientTLS(testcerts.NewCA(t, "x").Issue(t, "x"))) != nil {
		t.Fatal("a certificate of another CA accepted")
	}

	st := member.ConnectionState()
	if id, ok := s.memberCert(&st); !ok || id != "n2" {
		t.Fatalf("memberCert(peer CA's n2) = %q %v, want n2 true", id, ok)
	}
	st = app.ConnectionState()
	if id, ok := s.memberCert(&st); ok {
		t.Fatalf("memberCert(client CA's app) = %q true, want false", id)
	}
	if _, ok := s.memberCert(nil); ok {
		t.Fatal("memberCert(nil) = true")
	}

	// HTTP: ConnContext on the mux's wrapped connection.
	ctx := s.httpConnContext(context.Background(), &prefixConn{Conn: member})
	if got := tlsStateFromContext(ctx); got == nil || got.PeerCertificates[0].Subject.CommonName != "n2" {
		t.Fatalf("HTTP: tlsStateFromContext = %v", got)
	}
	// gRPC: the credentials' AuthInfo, as peer.FromContext gives it.
	_, info, err := apiCreds{}.ServerHandshake(&prefixConn{Conn: app})
	if err != nil {
		t.Fatal(err)
	}
	ctx = peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
	if got := tlsStateFromContext(ctx); got == nil || got.PeerCertificates[0].Subject.CommonName != "app" {
		t.Fatalf("gRPC: tlsStateFromContext = %v", got)
	}
	// Plaintext: no state.
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	if tlsStateFromContext(s.httpConnContext(context.Background(), &prefixConn{Conn: c1})) != nil {
		t.Fatal("plaintext HTTP connection has a TLS state")
	}
	if _, info, _ := (apiCreds{}).ServerHandshake(c1); info != nil {
		t.Fatal("plaintext gRPC connection has AuthInfo")
	}

	// Members dial with their peer certificate, trusting the API CA
	// (TLSCAFile, else PeerCAFile).
	mc := s.memberTLSConfig("127.0.0.1")
	if mc == nil || len(mc.Certificates) != 1 || mc.ServerName != "127.0.0.1" {
		t.Fatalf("memberTLSConfig = %+v", mc)
	}
	if (&Server{}).memberTLSConfig("x") != nil {
		t.Fatal("memberTLSConfig without API TLS is not nil")
	}
}
