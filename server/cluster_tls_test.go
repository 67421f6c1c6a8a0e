package server_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

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
	ca := servertest.NewCA(t, "dlock test CA")
	nodes := startCluster(t, 3, func(i int, c *server.Config) {
		leaf := ca.Issue(t, c.NodeID)
		c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile = leaf.CertFile, leaf.KeyFile, ca.CertFile
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
	opair := servertest.NewCA(t, "intruder CA").Issue(t, "intruder").Pair
	roots := ca.Pool
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
