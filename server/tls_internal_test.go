package server

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/dlock-dev/dlock/internal/testcerts"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
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
// either is accepted; memberCert is true only for a peer CA certificate
// whose CN or DNS SAN is a node ID of the Raft configuration (with that
// ID), or whose CN is the node ID of an AddVoter call in flight (for that
// call only); false for a peer CA certificate naming no member (a client
// certificate wrongly issued by the peer CA), the client CA's, and a
// plaintext caller. The state reaches tlsStateFromContext through the
// HTTP connection context and through the gRPC credentials' AuthInfo.
func TestMemberCert(t *testing.T) {
	apiCA := testcerts.NewCA(t, "API CA")
	peerCA := testcerts.NewCA(t, "peer CA")
	clients := testcerts.NewCA(t, "clients CA")
	api := apiCA.Issue(t, "n1-api")
	peerLeaf := peerCA.Issue(t, "n1")
	cfg := testConfig(t)
	cfg.NodeID = "n1"
	cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSClientCAFile = api.CertFile, api.KeyFile, clients.CertFile
	cfg.PeerCertFile, cfg.PeerKeyFile, cfg.PeerCAFile = peerLeaf.CertFile, peerLeaf.KeyFile, peerCA.CertFile
	s := startTestServer(t, cfg)
	a := s.tls

	member := handshake(t, a, apiCA.ClientTLS(peerCA.Issue(t, "n1")))
	bySAN := handshake(t, a, apiCA.ClientTLS(peerCA.IssueWith(t, "node-one", testcerts.LeafOptions{DNSNames: []string{"n1"}})))
	alice := handshake(t, a, apiCA.ClientTLS(peerCA.Issue(t, "alice")))
	app := handshake(t, a, apiCA.ClientTLS(clients.Issue(t, "app")))
	if member == nil || bySAN == nil || alice == nil || app == nil {
		t.Fatal("a client certificate of the peer CA or of the client CA was refused")
	}
	if handshake(t, a, apiCA.ClientTLS(testcerts.NewCA(t, "x").Issue(t, "x"))) == nil {
		// A Go client does not send a certificate of a CA the server
		// does not name: the handshake passes without one (the call is
		// then refused for want of a certificate).
		t.Fatal("a client with a certificate of another CA (which it does not send) failed the handshake")
	}

	for name, c := range map[string]struct {
		conn   *tls.Conn
		wantID string
	}{
		"peer CA, CN n1 (a member)":        {member, "n1"},
		"peer CA, DNS SAN n1 (a member)":   {bySAN, "n1"},
		"peer CA, CN alice (not a member)": {alice, ""},
		"client CA, CN app (not a member)": {app, ""},
	} {
		st := c.conn.ConnectionState()
		if id, ok := s.memberCert(&st); ok != (c.wantID != "") || id != c.wantID {
			t.Errorf("memberCert(%s) = %q %v, want %q %v", name, id, ok, c.wantID, c.wantID != "")
		}
	}
	if _, ok := s.memberCert(nil); ok {
		t.Fatal("memberCert(nil) = true")
	}
	// A node joining as "alice": her peer certificate is a member during
	// her AddVoter call (the interceptor's copy of the state) only.
	st := alice.ConnectionState()
	var during string
	var duringOK bool
	_, _ = s.requireClientCertUnary(peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: st}}),
		&dlockv1.AddVoterRequest{Id: "alice"}, &grpc.UnaryServerInfo{FullMethod: dlockv1.Cluster_AddVoter_FullMethodName},
		func(ctx context.Context, _ any) (any, error) {
			during, duringOK = s.memberCert(tlsStateFromContext(ctx))
			return nil, nil
		})
	if !duringOK || during != "alice" {
		t.Fatalf("memberCert during alice's AddVoter = %q %v, want alice true", during, duringOK)
	}
	_, _ = s.requireClientCertUnary(peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: st}}),
		&dlockv1.AddVoterRequest{Id: "bob"}, &grpc.UnaryServerInfo{FullMethod: dlockv1.Cluster_AddVoter_FullMethodName},
		func(ctx context.Context, _ any) (any, error) {
			during, duringOK = s.memberCert(tlsStateFromContext(ctx))
			return nil, nil
		})
	if duringOK {
		t.Fatalf("memberCert during an AddVoter of bob with alice's certificate = %q true", during)
	}
	if id, ok := s.memberCert(&st); ok {
		t.Fatalf("memberCert(alice) after her AddVoter = %q true", id)
	}

	// HTTP: ConnContext on the mux's wrapped connection.
	ctx := s.httpConnContext(context.Background(), &prefixConn{Conn: member})
	if got := tlsStateFromContext(ctx); got == nil || got.PeerCertificates[0].Subject.CommonName != "n1" {
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

// tlsPeer is a TLS server for member dials: it serves leaf, asks any
// client certificate, and sends the serial of each client's certificate
// (nil: none) on got.
func tlsPeer(t *testing.T, leaf *testcerts.Leaf) (addr string, got <-chan *tls.ConnectionState) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf.Pair}, ClientAuth: tls.RequireAnyClientCert, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ch := make(chan *tls.ConnectionState, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				tc := c.(*tls.Conn)
				if tc.Handshake() == nil {
					st := tc.ConnectionState()
					ch <- &st
				}
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return ln.Addr().String(), ch
}

// TestReloadTLS_MemberDialsUseCurrentFiles: the credentials a member dials
// other members' APIs with (made once, kept by long-lived gRPC clients
// and the HTTP forwarder's transport) take the certificate and the CA of
// the last reload at every new connection: after --tls-ca and the peer
// certificate are rotated and Reload runs, a member whose certificate is
// of the new CA is trusted and is shown the new peer certificate. A server
// of an untrusted CA, or whose certificate does not name the dialled
// address, is still refused. They used to keep the files of the start.
func TestReloadTLS_MemberDialsUseCurrentFiles(t *testing.T) {
	api1 := testcerts.NewCA(t, "API CA 1")
	peerCA := testcerts.NewCA(t, "peer CA")
	apiLeaf := api1.Issue(t, "n1-api")
	node1 := peerCA.Issue(t, "n1")
	cfg := testConfig(t)
	cfg.NodeID = "n1"
	cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSCAFile = apiLeaf.CertFile, apiLeaf.KeyFile, api1.CertFile
	cfg.PeerCertFile, cfg.PeerKeyFile, cfg.PeerCAFile = node1.CertFile, node1.KeyFile, peerCA.CertFile
	s := startTestServer(t, cfg)
	creds := s.memberGRPCCreds()
	dialTLS := s.memberDialTLS(func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	})
	viaGRPC := func(addr string) error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, _, err = creds.ClientHandshake(ctx, addr, c)
		return err
	}
	viaHTTP := func(addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		c, err := dialTLS(ctx, "tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err
	}

	api2 := testcerts.NewCA(t, "API CA 2")
	peerAddr, got := tlsPeer(t, api2.Issue(t, "n2-api"))
	if viaGRPC(peerAddr) == nil || viaHTTP(peerAddr) == nil {
		t.Fatal("a member certificate of API CA 2 trusted before --tls-ca names it")
	}
	node2 := peerCA.Issue(t, "n1")
	for _, f := range [][2]string{{api1.CertFile, string(api2.PEM)}, {node1.CertFile, string(node2.CertPEM)}, {node1.KeyFile, string(node2.KeyPEM)}} {
		if err := os.WriteFile(f[0], []byte(f[1]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	for name, dial := range map[string]func(string) error{"gRPC credentials": viaGRPC, "HTTP transport": viaHTTP} {
		// Drain what the refused dials above left.
		for len(got) > 0 {
			<-got
		}
		if err := dial(peerAddr); err != nil {
			t.Fatalf("%s after the reload: %v, want API CA 2 trusted", name, err)
		}
		select {
		case st := <-got:
			if len(st.PeerCertificates) == 0 || st.PeerCertificates[0].SerialNumber.Cmp(node2.Cert.SerialNumber) != 0 {
				t.Fatalf("%s after the reload presented %v, want the new peer certificate", name, st.PeerCertificates)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: the peer saw no handshake", name)
		}
		untrusted, _ := tlsPeer(t, testcerts.NewCA(t, "rogue").Issue(t, "n2-api"))
		if err := dial(untrusted); err == nil {
			t.Fatalf("%s: a server of an untrusted CA was accepted", name)
		}
		misnamed, _ := tlsPeer(t, api2.IssueWith(t, "n3-api", testcerts.LeafOptions{DNSNames: []string{"n3.example"}}))
		if err := dial(misnamed); err == nil || !strings.Contains(err.Error(), "127.0.0.1") {
			t.Fatalf("%s: a server whose certificate does not name 127.0.0.1: %v, want refused", name, err)
		}
	}
}
