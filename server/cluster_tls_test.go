package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
)

// testCA is a certificate authority made in the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a node certificate and key (PEM) for 127.0.0.1, usable as
// TLS server and client.
func (ca *testCA) issue(t *testing.T, name string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// dialLayer is an attacker's raft.StreamLayer: it dials with dial and
// accepts nothing.
type dialLayer struct {
	net.Listener
	dial func(addr string) (net.Conn, error)
}

func (d dialLayer) Dial(addr raft.ServerAddress, _ time.Duration) (net.Conn, error) {
	return d.dial(string(addr))
}

// forgeAppendEntries sends a well-formed AppendEntries with a huge term to
// the Raft address target over dial, as a member would, and returns the
// transport's error.
func forgeAppendEntries(t *testing.T, target string, dial func(addr string) (net.Conn, error)) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := raft.NewNetworkTransport(dialLayer{Listener: ln, dial: dial}, 1, 2*time.Second, io.Discard)
	defer tr.Close()
	var resp raft.AppendEntriesResponse
	return tr.AppendEntries("n1", raft.ServerAddress(target), &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte("127.0.0.1:1")},
		Term:      1 << 60, LeaderCommitIndex: 1 << 40,
	}, &resp)
}

// selfTerm returns the term srv reports for itself.
func selfTerm(srv *server.Server, id string) uint64 {
	for _, m := range srv.Members() {
		if m.ID == id {
			return m.Term
		}
	}
	return 0
}

func TestCluster_MutualTLSRaft(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "dlock test CA")
	caFile := writeFile(t, dir, "ca.pem", ca.pem)
	nodes := startCluster(t, 3, func(i int, c *server.Config) {
		cert, key := ca.issue(t, c.NodeID)
		c.PeerCertFile = writeFile(t, dir, c.NodeID+".pem", cert)
		c.PeerKeyFile = writeFile(t, dir, c.NodeID+"-key.pem", key)
		c.PeerCAFile = caFile
	})
	l := waitLeader(t, nodes, -1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := dlockv1.NewLockClient(dial(t, nodes[l].cfg.Listen)).Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Ttl: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the grant replicated over mTLS", func() bool {
		for _, nd := range nodes {
			for _, m := range nd.server().Members() {
				if m.ID == nd.cfg.NodeID && m.AppliedIndex < g.GetFence() {
					return false
				}
			}
		}
		return true
	})

	f := (l + 1) % 3
	target := nodes[f].cfg.RaftBind
	leaderID := nodes[l].cfg.NodeID
	before := selfTerm(nodes[f].server(), nodes[f].cfg.NodeID)

	// Raw bytes (a plain TCP AppendEntries), a client without a
	// certificate, and a client whose certificate another CA signed.
	other := newTestCA(t, "intruder CA")
	ocert, okey := other.issue(t, "intruder")
	opair, err := tls.X509KeyPair(ocert, okey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	attacks := map[string]func(addr string) (net.Conn, error){
		"plain TCP": func(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) },
		"TLS without a client certificate": func(addr string) (net.Conn, error) {
			return tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		},
		"TLS with another CA's certificate": func(addr string) (net.Conn, error) {
			return tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", Certificates: []tls.Certificate{opair}})
		},
	}
	for name, d := range attacks {
		if err := forgeAppendEntries(t, target, d); err == nil {
			t.Errorf("%s: the forged AppendEntries was answered", name)
		}
	}
	after := selfTerm(nodes[f].server(), nodes[f].cfg.NodeID)
	if after >= 1<<60 || after > before+2 {
		t.Fatalf("follower's term moved from %d to %d after the forged AppendEntries", before, after)
	}
	if lid, _ := leaderOf(nodes[f].server()); lid != leaderID && after == before {
		t.Fatalf("follower follows %q, want %s", lid, leaderID)
	}
	if !nodes[l].server().Ready() && after == before {
		t.Fatal("the leader stepped down")
	}
}

// leaderOf returns the leader as srv knows it.
func leaderOf(srv *server.Server) (string, bool) {
	for _, m := range srv.Members() {
		if m.Leader {
			return m.ID, true
		}
	}
	return "", false
}

// TestCluster_PlainRaftAcceptsForgedTerm is the control of
// TestCluster_MutualTLSRaft: over plain TCP (the loopback default) the same
// forged AppendEntries is obeyed, so the check above can fail.
func TestCluster_PlainRaftAcceptsForgedTerm(t *testing.T) {
	nodes := startCluster(t, 1, nil)
	waitLeader(t, nodes, -1)
	err := forgeAppendEntries(t, nodes[0].cfg.RaftBind, func(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) })
	if err != nil {
		t.Fatalf("plain forged AppendEntries: %v", err)
	}
	waitUntil(t, "the forged term adopted", func() bool { return selfTerm(nodes[0].server(), "n1") >= 1<<60 })
}
