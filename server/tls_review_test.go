package server_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestTLS_PeerCertificateOfANonMemberIsNotAMember: a certificate signed by
// the peer CA whose CN names no node of the Raft configuration (a client
// certificate wrongly issued by the peer CA: gen-certs.sh tls alice) is
// not a cluster member: it gets no permission, and the identity it names
// (dlock-identity) is not believed; the node's own certificate (CN = its
// node ID) still is a member. It used to be a member with every
// permission, able to act for anyone.
func TestTLS_PeerCertificateOfANonMemberIsNotAMember(t *testing.T) {
	apiCA := servertest.NewCA(t, "API CA")
	clients := servertest.NewCA(t, "clients CA")
	peers := servertest.NewCA(t, "peer CA")
	dir := t.TempDir()
	ids := []servertest.Identity{{Name: "ops", Token: "-", CertCN: []string{"ops"}, Rules: map[string][]string{"": {"admin", "lock"}}}}
	authFile := servertest.WriteAuthFile(t, dir, ids)
	srvLeaf := apiCA.Issue(t, "dlockd")
	node := peers.Issue(t, "dlockd-1")
	e := start(t, func(c *server.Config) {
		c.NodeID = "dlockd-1"
		c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile = srvLeaf.CertFile, srvLeaf.KeyFile, clients.CertFile
		c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile = node.CertFile, node.KeyFile, peers.CertFile
		c.AuthFile = authFile
	})
	ctx := t.Context()
	alice := certClient(t, e.Addr(), apiCA, peers.Issue(t, "alice"))
	_, err := alice.ForceRelease(ctx, &dlockv1.ForceReleaseRequest{Key: "payout:1", Reason: "x"})
	wantCode(t, "peer CA certificate of alice (not a member) force-releases", err, codes.Unauthenticated, `"alice"`)
	_, err = alice.Acquire(metadata.AppendToOutgoingContext(ctx, "dlock-identity", "ops"), acquireReq("payout:1"))
	wantCode(t, "alice naming ops", err, codes.Unauthenticated)
	// HTTPS: the same.
	hc := httpsClient(t, apiCA, peers.Issue(t, "alice"))
	req, _ := http.NewRequest(http.MethodPost, "https://"+e.Addr()+"/v1/force-release", strings.NewReader(`{"key":"payout:1","reason":"x"}`))
	req.Header.Set("Dlock-Identity", "ops")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("HTTPS force release by alice naming ops: %s, want 401", resp.Status)
	}
	// The node's own certificate is a member's.
	member := certClient(t, e.Addr(), apiCA, peers.Issue(t, "dlockd-1"))
	_, err = member.Acquire(ctx, acquireReq("payout:1"))
	wantCode(t, "member dlockd-1 acquires", err, codes.OK)
	_, err = member.ForceRelease(ctx, &dlockv1.ForceReleaseRequest{Key: "payout:1", Reason: "member"})
	wantCode(t, "member dlockd-1 force-releases", err, codes.OK)
}

// probeRaft dials the Raft port at addr over TLS with cfg and asks a
// membership probe (what the stream layer answers to members only). It
// returns the server's certificate and nil when the probe was answered,
// or the error.
func probeRaft(addr string, cfg *tls.Config) (*tls.ConnectionState, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	body := []byte(`{"id":"probe"}`)
	msg := append([]byte{0xD1}, binary.BigEndian.AppendUint32(nil, uint32(len(body)))...)
	if _, err := c.Write(append(msg, body...)); err != nil {
		return nil, err
	}
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(c, make([]byte, binary.BigEndian.Uint32(hdr[:]))); err != nil {
		return nil, err
	}
	st := c.ConnectionState()
	return &st, nil
}

// TestTLS_ReloadRotatesEveryFile: Reload (SIGHUP) re-reads the peer
// certificate and key (served on the Raft port), the peer CA (verified on
// the Raft port) and the client CA (on the API port), not only the API
// certificate; a reload with a broken file changes nothing and names the
// file. The Raft port used to keep its certificate and CA until a restart.
func TestTLS_ReloadRotatesEveryFile(t *testing.T) {
	apiCA := servertest.NewCA(t, "API CA")
	clients1 := servertest.NewCA(t, "clients CA 1")
	peers1 := servertest.NewCA(t, "peer CA 1")
	srvLeaf := apiCA.Issue(t, "dlockd")
	node1 := peers1.Issue(t, "dlockd-1")
	e := start(t, func(c *server.Config) {
		c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile = srvLeaf.CertFile, srvLeaf.KeyFile, clients1.CertFile
		c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile = node1.CertFile, node1.KeyFile, peers1.CertFile
	})
	raftAddr := e.Cfg.RaftBind
	member := func(ca *servertest.CA) *tls.Config {
		cfg := ca.ClientTLS(ca.Issue(t, "dlockd-2"))
		cfg.ServerName = "127.0.0.1"
		return cfg
	}
	st, err := probeRaft(raftAddr, member(peers1))
	if err != nil {
		t.Fatalf("Raft probe with a peer CA 1 certificate: %v", err)
	}
	if got := st.PeerCertificates[0].SerialNumber; got.Cmp(node1.Cert.SerialNumber) != 0 {
		t.Fatalf("Raft port serves serial %v, want node1's %v", got, node1.Cert.SerialNumber)
	}
	apiInspect := func(leaf *servertest.Leaf) error {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err := certClient(t, e.Addr(), apiCA, leaf).Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
		return err
	}
	if err := apiInspect(clients1.Issue(t, "app")); err != nil {
		t.Fatalf("API with a client CA 1 certificate: %v", err)
	}

	// Rotate: a new peer CA and a node certificate of it, a new client CA.
	peers2 := servertest.NewCA(t, "peer CA 2")
	clients2 := servertest.NewCA(t, "clients CA 2")
	node2 := peers2.Issue(t, "dlockd-1")
	for _, f := range [][2]string{
		{node1.CertFile, string(node2.CertPEM)}, {node1.KeyFile, string(node2.KeyPEM)},
		{peers1.CertFile, string(peers2.PEM)}, {clients1.CertFile, string(clients2.PEM)},
	} {
		if err := os.WriteFile(f[0], []byte(f[1]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Server().Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	st, err = probeRaft(raftAddr, member(peers2))
	if err != nil {
		t.Fatalf("after the reload, Raft probe with a peer CA 2 certificate: %v", err)
	}
	if got := st.PeerCertificates[0].SerialNumber; got.Cmp(node2.Cert.SerialNumber) != 0 {
		t.Fatalf("after the reload, the Raft port serves serial %v, want node2's %v", got, node2.Cert.SerialNumber)
	}
	if _, err := probeRaft(raftAddr, member(peers1)); err == nil {
		t.Fatal("after the reload, the Raft port still accepts the old peer CA")
	}
	if err := apiInspect(clients2.Issue(t, "app")); err != nil {
		t.Fatalf("after the reload, API with a client CA 2 certificate: %v", err)
	}
	if err := apiInspect(clients1.Issue(t, "app")); status.Code(err) != codes.Unauthenticated && status.Code(err) != codes.Unavailable {
		t.Fatalf("after the reload, API with a client CA 1 certificate: %v, want it refused", err)
	}

	// A broken peer CA: the reload fails naming it, nothing changes.
	if err := os.WriteFile(peers1.CertFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.Server().Reload(); err == nil || !strings.Contains(err.Error(), peers1.CertFile) {
		t.Fatalf("Reload with a broken peer CA: %v, want an error naming %s", err, peers1.CertFile)
	}
	if _, err := probeRaft(raftAddr, member(peers2)); err != nil {
		t.Fatalf("after a failed reload, Raft probe with a peer CA 2 certificate: %v", err)
	}
}

// TestTLS_HandshakeFailuresCountedAndExplained: a client certificate the
// server refuses (expired) reaches the client as the server's alert
// ("remote error: tls: ..."), every time, not as a reset connection; each
// failed handshake is counted in dlockd_tls_handshake_failures_total by
// reason (client_cert, protocol for a plaintext client) and logged at
// info at most once per 10 s.
func TestTLS_HandshakeFailuresCountedAndExplained(t *testing.T) {
	clients := servertest.NewCA(t, "clients CA")
	var logs syncBuffer
	srv, ca, _ := startTLS(t, func(c *server.Config) {
		c.TLSClientCAFile = clients.CertFile
		logTo(&logs)(c)
	})
	expired := clients.IssueWith(t, "app", servertest.LeafOptions{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Minute)})
	const n = 5
	for i := range n {
		cc, err := grpc.NewClient("passthrough:///"+srv.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientTLS(expired))))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		_, err = dlockv1.NewLockClient(cc).Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
		cancel()
		_ = cc.Close()
		if !strings.Contains(err.Error(), "remote error: tls: ") || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("call %d with an expired client certificate: %v, want the server's alert (remote error: tls: ... certificate)", i, err)
		}
	}
	plain, err := http.Get("http://" + srv.Addr() + "/healthz")
	if err == nil {
		_ = plain.Body.Close()
	}
	// /metrics is public: no client certificate needed.
	hc := httpsClient(t, ca)
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := hc.Get("https://" + srv.Addr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		body := string(b)
		if strings.Contains(body, `dlockd_tls_handshake_failures_total{reason="client_cert"} 5`) &&
			strings.Contains(body, `dlockd_tls_handshake_failures_total{reason="protocol"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			var lines []string
			for _, l := range strings.Split(body, "\n") {
				if strings.HasPrefix(l, "dlockd_tls_handshake_failures_total") {
					lines = append(lines, l)
				}
			}
			t.Fatalf("handshake failures: %v, want client_cert 5 and protocol 1", lines)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c := strings.Count(logs.String(), "TLS handshake failed"); c != 1 {
		t.Fatalf("%d log lines of failed handshakes, want 1 (at most one per 10 s):\n%s", c, logs.String())
	}
}

// TestLimits_MaxConnectionsPerIP: a source address with
// MaxConnectionsPerIP connections open gets the next one closed at once
// (counted as limit connections_per_ip), while another source address is
// still served; a freed slot serves again.
func TestLimits_MaxConnectionsPerIP(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.MaxConnectionsPerIP = 3 })
	dial := func(local string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 3 * time.Second}
		c, err := d.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	closedAtOnce := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return false
		}
		return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
	}
	var held []net.Conn
	for range 3 {
		held = append(held, dial("127.0.0.1"))
	}
	if !closedAtOnce(dial("127.0.0.1")) {
		t.Fatal("4th connection from 127.0.0.1 was not closed at once")
	}
	// Another source address (the loopback network is 127/8).
	other := dial("127.0.0.2")
	if closedAtOnce(other) {
		t.Fatal("a connection from 127.0.0.2 was closed: the cap is per address")
	}
	_ = held[0].Close()
	waitFor(t, func() bool {
		c := dial("127.0.0.1")
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.0\r\n\r\n"); err != nil {
			return false
		}
		b, _ := io.ReadAll(c)
		return strings.Contains(string(b), "200 OK")
	})
	if n := refusals(t, srv.Addr(), "connections_per_ip"); n < 1 {
		t.Fatalf("connections_per_ip refusals: %d, want at least 1", n)
	}
	// The default is 1,000; 0 is no cap.
	if d := server.DefaultConfig().MaxConnectionsPerIP; d != 1000 {
		t.Fatalf("default MaxConnectionsPerIP %d, want 1000", d)
	}
	c := server.DefaultConfig()
	c.MaxConnectionsPerIP = -1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "MaxConnectionsPerIP") {
		t.Fatalf("Validate(MaxConnectionsPerIP -1) = %v", err)
	}
}

// TestTLS_JoinWithAuthAndPeerCertificates: a node joins a cluster whose
// API serves TLS with an auth file; before it is in the Raft
// configuration its peer certificate counts as a member for its own
// AddVoter calls only (memberCert), so the join and its registration go
// through, and it then serves as a member.
func TestTLS_JoinWithAuthAndPeerCertificates(t *testing.T) {
	apiCA := servertest.NewCA(t, "API CA")
	peers := servertest.NewCA(t, "peer CA")
	dir := t.TempDir()
	authFile := servertest.WriteAuthFile(t, dir, []servertest.Identity{{Name: "ops", Rules: map[string][]string{"": {"admin"}}}})
	cfgOf := func(id string) server.Config {
		c := servertest.Config(t, t.TempDir())
		c.NodeID, c.Advertise = id, c.Listen
		p := peers.Issue(t, id)
		c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile = p.CertFile, p.KeyFile, peers.CertFile
		a := apiCA.Issue(t, id+"-api")
		c.TLSCertFile, c.TLSKeyFile, c.TLSCAFile = a.CertFile, a.KeyFile, apiCA.CertFile
		c.AuthFile = authFile
		return c
	}
	n1 := servertest.StartEmbedded(t, cfgOf("n1"))
	c2 := cfgOf("n2")
	c2.Join = n1.Addr()
	n2, err := server.New(c2)
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n2.Close() })
	waitFor(t, func() bool {
		ms := n1.Server().Members()
		return len(ms) == 2 && ms[1].ID == "n2" && ms[1].APIAddr == c2.Listen
	})
}

// TestTLS_WarnsWhenClientCAIsThePeerCA: a --tls-client-ca naming the
// peer CA's certificate (client certificates from the members' CA) is
// warned about at start; separate CAs are not.
func TestTLS_WarnsWhenClientCAIsThePeerCA(t *testing.T) {
	for _, same := range []bool{true, false} {
		peers := servertest.NewCA(t, "peer CA")
		clients := peers
		if !same {
			clients = servertest.NewCA(t, "clients CA")
		}
		node := peers.Issue(t, "dlockd-1")
		var logs syncBuffer
		startTLS(t, func(c *server.Config) {
			c.TLSClientCAFile = clients.CertFile
			c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile = node.CertFile, node.KeyFile, peers.CertFile
			logTo(&logs)(c)
		})
		warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "--tls-client-ca names a certificate of --peer-ca")
		if warned != same {
			t.Fatalf("client CA is the peer CA: %v; warned: %v\n%s", same, warned, logs.String())
		}
	}
}
