package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// node is one in-process cluster member of a test.
type node struct {
	cfg server.Config

	mu      sync.Mutex
	srv     *server.Server
	started bool // has run once: its addresses are known to the others
}

func (n *node) server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// start starts the node (again, on its data) and returns once it listens.
func (n *node) start(t *testing.T) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		srv, err := server.New(n.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err = srv.Start(); err == nil {
			n.srv, n.started = srv, true
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("start %s: %v", n.cfg.NodeID, err)
		}
		// A port picked free a while ago may since be another
		// connection's local port: a node that never ran takes new ones
		// (but keeps a Raft address other members were told).
		if !n.started && strings.Contains(err.Error(), "address already in use") {
			if strings.Contains(err.Error(), "dlockd: listen") {
				n.cfg.Listen = servertest.FreePort(t)
			} else if len(n.cfg.InitialCluster) == 0 {
				n.cfg.RaftBind = servertest.FreePort(t)
			}
		}
		time.Sleep(50 * time.Millisecond) // a port still held by the previous run
	}
}

func (n *node) stop(t *testing.T) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv == nil {
		return
	}
	if err := n.srv.Close(); err != nil {
		t.Errorf("stop %s: %v", n.cfg.NodeID, err)
	}
	n.srv = nil
}

// clusterConfig returns the configuration of test node id, with Raft
// timings that hold up on a loaded machine under -race.
func clusterConfig(t *testing.T, id string) server.Config {
	cfg := servertest.Config(t, filepath.Join(t.TempDir(), id))
	cfg.NodeID = id
	cfg.HeartbeatTimeout = 300 * time.Millisecond
	cfg.ElectionTimeout = 300 * time.Millisecond
	cfg.LeaderLeaseTimeout = 150 * time.Millisecond
	return cfg
}

// startCluster starts n nodes bootstrapped with --initial-cluster of all of
// them, and stops them when the test ends.
func startCluster(t *testing.T, n int, edit func(i int, c *server.Config)) []*node {
	t.Helper()
	nodes := make([]*node, n)
	var peers []server.Peer
	for i := range nodes {
		cfg := clusterConfig(t, fmt.Sprintf("n%d", i+1))
		nodes[i] = &node{cfg: cfg}
		peers = append(peers, server.Peer{ID: cfg.NodeID, RaftAddr: cfg.RaftBind})
	}
	for i, nd := range nodes {
		nd.cfg.InitialCluster = peers
		if edit != nil {
			edit(i, &nd.cfg)
		}
	}
	for _, nd := range nodes {
		nd.start(t)
	}
	t.Cleanup(func() {
		for _, nd := range nodes {
			nd.stop(t)
		}
	})
	return nodes
}

// waitLeader waits until one running node is ready (the leader, caught
// up), and returns its index.
func waitLeader(t *testing.T, nodes []*node, not int) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for i, nd := range nodes {
			if srv := nd.server(); srv != nil && i != not && srv.Ready() {
				return i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader within 20s")
	return -1
}

// waitUntil polls cond until it holds or 20s pass.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitUntilWithin(t, 20*time.Second, what, cond)
}

// waitUntilWithin polls cond until it holds or limit passes.
func waitUntilWithin(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// registered reports whether every running node knows every member's API
// address, and the members number want.
func registered(nodes []*node, want int) bool {
	for _, nd := range nodes {
		srv := nd.server()
		if srv == nil {
			continue
		}
		ms := srv.Members()
		if len(ms) != want {
			return false
		}
		for _, m := range ms {
			if m.APIAddr == "" {
				return false
			}
		}
	}
	return true
}

func TestCluster_InitialClusterElectsAndGrantSurvivesTransfer(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	l := waitLeader(t, nodes, -1)
	waitUntil(t, "every member registered", func() bool { return registered(nodes, 3) })
	for _, nd := range nodes {
		for _, m := range nd.server().Members() {
			if !m.Voter {
				t.Fatalf("%s: member %s is not a voter", nd.cfg.NodeID, m.ID)
			}
			if m.APIAddr != nodes[int(m.ID[1]-'1')].cfg.Listen {
				t.Fatalf("%s: member %s API %s, want %s", nd.cfg.NodeID, m.ID, m.APIAddr, nodes[int(m.ID[1]-'1')].cfg.Listen)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lock := dlockv1.NewLockClient(dial(t, nodes[l].cfg.Listen))
	g, err := lock.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Ttl: durationpb.New(30 * time.Second), Holder: "test"})
	if err != nil {
		t.Fatal(err)
	}
	// Ask a follower to transfer leadership: it forwards to the leader.
	f := (l + 1) % 3
	tr, err := dlockv1.NewClusterClient(dial(t, nodes[f].cfg.Listen)).TransferLeader(ctx, &dlockv1.TransferLeaderRequest{})
	if err != nil {
		t.Fatalf("transfer leader via follower: %v", err)
	}
	if tr.GetLeaderId() == nodes[l].cfg.NodeID || tr.GetLeaderId() == "" {
		t.Fatalf("transfer: leader %q, want another than %s", tr.GetLeaderId(), nodes[l].cfg.NodeID)
	}
	l2 := waitLeader(t, nodes, l)
	if nodes[l2].cfg.NodeID != tr.GetLeaderId() {
		t.Fatalf("ready node %s, transfer said %s", nodes[l2].cfg.NodeID, tr.GetLeaderId())
	}
	in, err := dlockv1.NewLockClient(dial(t, nodes[l2].cfg.Listen)).Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if !in.GetHeld() || in.GetInfo().GetFence() != g.GetFence() || in.GetInfo().GetHolder() != "test" {
		t.Fatalf("after transfer: %v, want held with fence %d", in, g.GetFence())
	}
	// The new leader's API address is known to every node.
	waitUntil(t, "leader API known everywhere", func() bool {
		for _, nd := range nodes {
			st, err := dlockv1.NewClusterClient(dial(t, nd.cfg.Listen)).Status(ctx, &dlockv1.ClusterStatusRequest{})
			if err != nil || st.GetLeaderId() != nodes[l2].cfg.NodeID || st.GetLeaderApi() != nodes[l2].cfg.Listen {
				return false
			}
		}
		return true
	})
}

func TestCluster_RestartIgnoresInitialCluster(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	waitLeader(t, nodes, -1)
	for _, nd := range nodes {
		nd.stop(t)
	}
	// Restart with an initial cluster that names other addresses: the data
	// directory's configuration wins.
	for _, nd := range nodes {
		nd.cfg.InitialCluster = []server.Peer{{ID: nd.cfg.NodeID, RaftAddr: nd.cfg.RaftBind}}
		nd.start(t)
	}
	l := waitLeader(t, nodes, -1)
	if ms := nodes[l].server().Members(); len(ms) != 3 {
		t.Fatalf("after restart: %d members, want 3 (%v)", len(ms), ms)
	}
	var ids []string
	for _, m := range nodes[l].server().Members() {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "n1,n2,n3" {
		t.Fatalf("members %v", ids)
	}
}

// clusterLogBuffer is a goroutine-safe log sink.
type clusterLogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *clusterLogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *clusterLogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// voters returns the IDs of srv's members that are voters, in order.
func voters(srv *server.Server) string {
	var ids []string
	for _, m := range srv.Members() {
		if m.Voter {
			ids = append(ids, m.ID)
		}
	}
	return strings.Join(ids, ",")
}

func TestCluster_JoinOneThreeFiveAndRemove(t *testing.T) {
	nodes := make([]*node, 5)
	for i := range nodes {
		nodes[i] = &node{cfg: clusterConfig(t, fmt.Sprintf("n%d", i+1))}
	}
	t.Cleanup(func() {
		for _, nd := range nodes {
			nd.stop(t)
		}
	})
	nodes[0].start(t)
	waitLeader(t, nodes[:1], -1)
	// 1 -> 3: both ask n1 at once; the leader adds them one at a time.
	nodes[1].cfg.Join, nodes[2].cfg.Join = nodes[0].cfg.Listen, nodes[0].cfg.Listen
	nodes[1].start(t)
	nodes[2].start(t)
	waitUntil(t, "3 voters registered", func() bool { return registered(nodes[:3], 3) && voters(nodes[0].server()) == "n1,n2,n3" })
	// 3 -> 5, asking followers (they forward to the leader).
	nodes[3].cfg.Join, nodes[4].cfg.Join = nodes[2].cfg.Listen, nodes[1].cfg.Listen
	nodes[3].start(t)
	nodes[4].start(t)
	waitUntil(t, "5 voters registered", func() bool { return registered(nodes, 5) && voters(nodes[0].server()) == "n1,n2,n3,n4,n5" })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := waitLeader(t, nodes, -1)
	g, err := dlockv1.NewLockClient(dial(t, nodes[l].cfg.Listen)).Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Ttl: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	// Every member applies the grant.
	waitUntil(t, "grant applied on every member", func() bool {
		for _, nd := range nodes {
			for _, m := range nd.server().Members() {
				if m.ID == nd.cfg.NodeID && m.AppliedIndex < g.GetFence() {
					return false
				}
			}
		}
		return true
	})

	// Remove a follower over HTTP, asking another follower.
	f, victim := (l+1)%5, (l+2)%5
	code, m := post(t, nodes[f].cfg.Listen, "/v1/cluster/remove", fmt.Sprintf(`{"id":%q}`, nodes[victim].cfg.NodeID))
	if code != 200 {
		t.Fatalf("remove over HTTP: %d %v", code, m)
	}
	nodes[victim].stop(t)
	want := []string{}
	for i, nd := range nodes {
		if i != victim {
			want = append(want, nd.cfg.NodeID)
		}
	}
	waitUntil(t, "4 voters", func() bool { return voters(nodes[l].server()) == strings.Join(want, ",") })

	// Status from a follower, over gRPC and HTTP, once the follower has
	// applied the removal too (the leader's configuration changes first).
	waitUntil(t, "4 voters on the follower", func() bool { return voters(nodes[f].server()) == strings.Join(want, ",") })
	st, err := dlockv1.NewClusterClient(dial(t, nodes[f].cfg.Listen)).Status(ctx, &dlockv1.ClusterStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GetMembers()) != 4 || st.GetLeaderId() != nodes[l].cfg.NodeID || st.GetLeaderApi() != nodes[l].cfg.Listen || st.GetTerm() == 0 {
		t.Fatalf("status from a follower: %v", st)
	}
	for _, ms := range st.GetMembers() {
		if ms.GetAppliedIndex() < g.GetFence() || ms.GetApiAddr() == "" || ms.GetRaftAddr() == "" || !ms.GetVoter() || ms.GetLastContact() == nil || ms.GetError() != "" {
			t.Fatalf("status member %v", ms)
		}
	}
	resp, err := http.Get("http://" + nodes[f].cfg.Listen + "/v1/cluster/status")
	if err != nil {
		t.Fatal(err)
	}
	var hs struct {
		Members []struct {
			ID      string `json:"id"`
			APIAddr string `json:"api_addr"`
			Voter   bool   `json:"voter"`
		} `json:"members"`
		LeaderID  string `json:"leader_id"`
		LeaderAPI string `json:"leader_api"`
		Term      string `json:"term"`
	}
	err = json.NewDecoder(resp.Body).Decode(&hs)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || len(hs.Members) != 4 || hs.LeaderID != nodes[l].cfg.NodeID || hs.LeaderAPI != nodes[l].cfg.Listen || hs.Term == "" {
		t.Fatalf("HTTP status from a follower: %d %+v %v", resp.StatusCode, hs, err)
	}
	// The follower's own entry, never forwarded.
	resp, err = http.Get("http://" + nodes[f].cfg.Listen + "/v1/cluster/status?local=true")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&hs)
	resp.Body.Close()
	if err != nil || len(hs.Members) != 1 || hs.Members[0].ID != nodes[f].cfg.NodeID {
		t.Fatalf("local status: %+v %v", hs, err)
	}
}

// TestCluster_WipedMemberCannotRejoin: a member whose data directory was
// wiped is refused under its old ID (its Raft port stays shut, it applies
// nothing) until the operator removes the old member; then it joins anew.
func TestCluster_WipedMemberCannotRejoin(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	l := waitLeader(t, nodes, -1)
	waitUntil(t, "every member registered", func() bool { return registered(nodes, 3) })
	w := (l + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cluster := dlockv1.NewClusterClient(dial(t, nodes[l].cfg.Listen))

	// An operator's add of an existing ID under another Raft address.
	_, err := cluster.AddVoter(ctx, &dlockv1.AddVoterRequest{Id: nodes[w].cfg.NodeID, RaftAddr: "127.0.0.1:1"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "if that member is really gone, remove it first") {
		t.Fatalf("add of an existing ID at another address: %v", err)
	}
	// An existing address under another ID.
	_, err = cluster.AddVoter(ctx, &dlockv1.AddVoterRequest{Id: "other", RaftAddr: nodes[w].cfg.RaftBind})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "MEMBER_CONFLICT") {
		t.Fatalf("add of an existing address under another ID: %v", err)
	}

	// Wipe w's data and start it to join under its old ID.
	nodes[w].stop(t)
	if err := os.RemoveAll(nodes[w].cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	logs := &clusterLogBuffer{}
	nodes[w].cfg.InitialCluster = nil
	nodes[w].cfg.Join = nodes[l].cfg.Listen
	nodes[w].cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	nodes[w].start(t)
	waitUntil(t, "the refusal logged", func() bool {
		return strings.Contains(logs.String(), "cannot rejoin as if it held that member's log")
	})
	time.Sleep(3 * nodes[w].cfg.HeartbeatTimeout) // the leader keeps trying w's unchanged address
	if ms := nodes[w].server().Members(); len(ms) != 0 {
		t.Fatalf("the wiped node got a configuration: %v", ms)
	}
	// The operator removes the old member: the retried join succeeds.
	if _, err := cluster.RemoveServer(ctx, &dlockv1.RemoveServerRequest{Id: nodes[w].cfg.NodeID}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the wiped node rejoined", func() bool { return registered(nodes, 3) && voters(nodes[w].server()) == "n1,n2,n3" })
}

func TestConfig_ValidateCluster(t *testing.T) {
	three := []server.Peer{{ID: "dlockd-1", RaftAddr: "127.0.0.1:7451"}, {ID: "n2", RaftAddr: "127.0.0.1:7461"}, {ID: "n3", RaftAddr: "127.0.0.1:7471"}}
	ok := map[string]func(*server.Config){
		"three voters":    func(c *server.Config) { c.InitialCluster = three },
		"this node alone": func(c *server.Config) { c.InitialCluster = three[:1] },
		"join":            func(c *server.Config) { c.Join = "127.0.0.1:7460" },
		"tls off loopback": func(c *server.Config) {
			c.RaftBind = "0.0.0.0:7451"
			c.RaftAdvertise = "10.0.0.1:7451"
			c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile = "c", "k", "ca"
		},
		"advertise": func(c *server.Config) {
			c.Listen = "0.0.0.0:7450"
			c.InsecureListen = true // no API TLS in this case
			c.Advertise = "10.0.0.1:7450"
			c.Join = "10.0.0.2:7450"
		},
		"test dial rewrite": func(c *server.Config) { c.RaftDialRewrite = map[string]string{"127.0.0.1:7461": "127.0.0.1:9000"} },
		"free ports":        func(c *server.Config) { c.Listen, c.RaftBind = "127.0.0.1:0", "127.0.0.1:0" },
		"port 65535":        func(c *server.Config) { c.Listen = "127.0.0.1:65535" },
		"node ID charset":   func(c *server.Config) { c.NodeID = "Node_1.a-b" },
		"unspecified bind on the entry's port": func(c *server.Config) {
			c.InitialCluster = []server.Peer{{ID: "dlockd-1", RaftAddr: "10.0.0.1:7451"}, {ID: "n2", RaftAddr: "10.0.0.2:7451"}}
			c.RaftBind = "0.0.0.0:7451"
			c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile = "c", "k", "ca"
		},
	}
	for name, edit := range ok {
		c := server.DefaultConfig()
		edit(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	bad := map[string]struct {
		edit func(*server.Config)
		want string
	}{
		"without this node": {func(c *server.Config) { c.InitialCluster = three[1:] }, "does not include this node"},
		"duplicate ID": {func(c *server.Config) {
			c.InitialCluster = append([]server.Peer{{ID: "n2", RaftAddr: "127.0.0.1:7481"}}, three...)
		}, `node ID "n2" appears twice`},
		"duplicate address": {func(c *server.Config) {
			c.InitialCluster = append([]server.Peer{{ID: "n4", RaftAddr: "127.0.0.1:7461"}}, three...)
		}, "same Raft address"},
		"empty ID": {func(c *server.Config) {
			c.InitialCluster = append([]server.Peer{{RaftAddr: "127.0.0.1:7481"}}, three...)
		}, "empty ID"},
		"port 0": {func(c *server.Config) {
			c.InitialCluster = append([]server.Peer{{ID: "n4", RaftAddr: "127.0.0.1:0"}}, three...)
		}, "port is missing or 0"},
		"advertise mismatch":  {func(c *server.Config) { c.InitialCluster = three; c.RaftAdvertise = "127.0.0.1:9999" }, "must be the same"},
		"join and initial":    {func(c *server.Config) { c.InitialCluster = three; c.Join = "127.0.0.1:7460" }, "exclusive"},
		"bad join":            {func(c *server.Config) { c.Join = "nope" }, "Join"},
		"partial TLS":         {func(c *server.Config) { c.PeerCertFile = "c" }, "all three"},
		"no TLS off loopback": {func(c *server.Config) { c.RaftBind = "0.0.0.0:7451"; c.RaftAdvertise = "10.0.0.1:7451" }, "mutual TLS"},
		"unspecified listen":  {func(c *server.Config) { c.Listen = "0.0.0.0:7450"; c.Join = "10.0.0.2:7450" }, "set Advertise"},
		"bad advertise":       {func(c *server.Config) { c.Advertise = "0.0.0.0:7450" }, "Advertise"},
		"bad rewrite":         {func(c *server.Config) { c.RaftDialRewrite = map[string]string{"x": "127.0.0.1:1"} }, "RaftDialRewrite"},
		// Every host:port: a non-empty host, a numeric port in 1..65535
		// (0 only where a listen address may pick a free port).
		"initial cluster port 99999": {func(c *server.Config) {
			c.InitialCluster = []server.Peer{three[0], {ID: "n2", RaftAddr: "127.0.0.1:99999"}}
		}, `member "n2": Raft address "127.0.0.1:99999": port 99999 is outside 1..65535`},
		"join port 99999":           {func(c *server.Config) { c.Join = "127.0.0.1:99999" }, "Join \"127.0.0.1:99999\": port 99999"},
		"join port 0":               {func(c *server.Config) { c.Join = "127.0.0.1:0" }, "port is missing or 0"},
		"advertise port 99999":      {func(c *server.Config) { c.Advertise = "127.0.0.1:99999" }, "Advertise \"127.0.0.1:99999\": port 99999"},
		"raft advertise port 99999": {func(c *server.Config) { c.RaftAdvertise = "127.0.0.1:99999" }, "RaftAdvertise \"127.0.0.1:99999\": port 99999"},
		"raft advertise port 0":     {func(c *server.Config) { c.RaftAdvertise = "127.0.0.1:0" }, "RaftAdvertise"},
		"listen port 99999":         {func(c *server.Config) { c.Listen = "127.0.0.1:99999" }, "Listen \"127.0.0.1:99999\": port 99999"},
		"listen no host":            {func(c *server.Config) { c.Listen = ":7450" }, "Listen \":7450\": host is empty"},
		"raft bind port 99999":      {func(c *server.Config) { c.RaftBind = "127.0.0.1:99999" }, "RaftBind \"127.0.0.1:99999\": port 99999"},
		"raft bind port name":       {func(c *server.Config) { c.RaftBind = "127.0.0.1:http" }, "not a number"},
		"rewrite port 99999": {func(c *server.Config) {
			c.RaftDialRewrite = map[string]string{"127.0.0.1:1": "127.0.0.1:99999"}
		}, "RaftDialRewrite value"},
		// RaftBind is what others reach when RaftAdvertise is not set.
		"raft bind not the initial cluster entry": {func(c *server.Config) { c.InitialCluster = three; c.RaftBind = "127.0.0.1:7452" }, "RaftBind is 127.0.0.1:7452 and RaftAdvertise is not set"},
		"node ID with space, = and comma":         {func(c *server.Config) { c.NodeID = "a b=c,d" }, `NodeID: node ID "a b=c,d": byte ' '`},
		"node ID too long":                        {func(c *server.Config) { c.NodeID = strings.Repeat("n", 65) }, "want 1 to 64 bytes"},
		"node ID empty":                           {func(c *server.Config) { c.NodeID = "" }, "NodeID"},
		"initial cluster ID charset": {func(c *server.Config) {
			c.InitialCluster = append([]server.Peer{{ID: "n/4", RaftAddr: "127.0.0.1:7481"}}, three...)
		}, `member "n/4": node ID`},
	}
	for name, tc := range bad {
		c := server.DefaultConfig()
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error with %q", name, err, tc.want)
		}
	}
	peers, err := server.ParseInitialCluster("a=127.0.0.1:1, b=127.0.0.1:2")
	if err != nil || len(peers) != 2 || peers[1] != (server.Peer{ID: "b", RaftAddr: "127.0.0.1:2"}) || server.FormatInitialCluster(peers) != "a=127.0.0.1:1,b=127.0.0.1:2" {
		t.Fatalf("ParseInitialCluster: %v %v", peers, err)
	}
	if _, err := server.ParseInitialCluster("a=127.0.0.1:1,b"); err == nil {
		t.Fatal("ParseInitialCluster accepted an element without =")
	}
}

// TestCluster_WipedInitialMemberIsFenced: a member restarted with
// --initial-cluster on a wiped data directory probes the other members on
// their Raft port before it takes part; they record another incarnation
// under its ID, so it is refused (Failed receives ErrWipedMember) and never
// applies, votes or acknowledges anything.
func TestCluster_WipedInitialMemberIsFenced(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	l := waitLeader(t, nodes, -1)
	waitUntil(t, "every member registered", func() bool { return registered(nodes, 3) })
	w := (l + 1) % 3
	nodes[w].stop(t)
	if err := os.RemoveAll(nodes[w].cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	logs := &clusterLogBuffer{}
	nodes[w].cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	nodes[w].start(t)
	select {
	case err := <-nodes[w].server().Failed():
		if !errors.Is(err, server.ErrWipedMember) || !strings.Contains(err.Error(), "--join") {
			t.Fatalf("Failed: %v, want ErrWipedMember telling to use --join", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the wiped member was not refused within 20s; log:\n%s", logs.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l = waitLeader(t, nodes, w)
	g, err := dlockv1.NewLockClient(dial(t, nodes[l].cfg.Listen)).Acquire(ctx, &dlockv1.AcquireRequest{Key: "after", Ttl: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * nodes[w].cfg.HeartbeatTimeout)
	if term, applied := localState(t, nodes[w]); term != 0 || applied != 0 {
		t.Fatalf("the refused node took part: term %d, applied index %d (want 0, 0; grant at %d)", term, applied, g.GetFence())
	}
	if strings.Contains(logs.String(), "bootstrapped the initial cluster") {
		t.Fatal("the refused node bootstrapped")
	}
}

// TestCluster_NewClusterWaitsForEveryInitialMember: on a first start the
// members probe each other; none bootstraps (so none votes) until every
// initial member has answered, and then they form the cluster.
func TestCluster_NewClusterWaitsForEveryInitialMember(t *testing.T) {
	nodes := make([]*node, 3)
	var peers []server.Peer
	for i := range nodes {
		nodes[i] = &node{cfg: clusterConfig(t, fmt.Sprintf("n%d", i+1))}
		peers = append(peers, server.Peer{ID: nodes[i].cfg.NodeID, RaftAddr: nodes[i].cfg.RaftBind})
	}
	for _, nd := range nodes {
		nd.cfg.InitialCluster = peers
	}
	t.Cleanup(func() {
		for _, nd := range nodes {
			nd.stop(t)
		}
	})
	nodes[0].start(t)
	nodes[1].start(t)
	time.Sleep(time.Second) // n1 and n2 could elect each other here, were they not waiting for n3
	for _, nd := range nodes[:2] {
		if term, _ := localState(t, nd); term != 0 {
			t.Fatalf("%s took part (term %d) before every initial member answered", nd.cfg.NodeID, term)
		}
	}
	nodes[2].start(t)
	waitLeader(t, nodes, -1)
	waitUntil(t, "every member registered", func() bool { return registered(nodes, 3) })
}

// TestCluster_ForwardedErrorsPassThrough: a Cluster call a follower
// forwards answers the leader's status (code, reason, message), over gRPC
// and HTTP (404 NOT_FOUND, not 500 INTERNAL), and a forwarded call that
// reaches a follower answers NOT_LEADER with the leader hint.
func TestCluster_ForwardedErrorsPassThrough(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	l := waitLeader(t, nodes, -1)
	waitUntil(t, "every member registered", func() bool { return registered(nodes, 3) })
	f := (l + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cc := dlockv1.NewClusterClient(dial(t, nodes[f].cfg.Listen))
	_, err := cc.RemoveServer(ctx, &dlockv1.RemoveServerRequest{Id: "nobody"})
	if st, _ := status.FromError(err); st.Code() != codes.NotFound || !strings.HasSuffix(st.Message(), "(INVALID_REQUEST)") || strings.Contains(st.Message(), "rpc error") {
		t.Fatalf("forwarded RemoveServer of an unknown id: %v, want NotFound with the leader's message", err)
	}
	resp, err := http.Post("http://"+nodes[f].cfg.Listen+"/v1/cluster/remove", "application/json", strings.NewReader(`{"id":"nobody"}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct{ Code, Reason, Message string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || body.Code != "NOT_FOUND" || body.Reason != "INVALID_REQUEST" || strings.Contains(body.Message, "rpc error") {
		t.Fatalf("HTTP remove of an unknown id on a follower: %d %+v, want 404 NOT_FOUND with the leader's message", resp.StatusCode, body)
	}
	// A call already forwarded is not forwarded again: NOT_LEADER + hint.
	fctx := metadata.AppendToOutgoingContext(ctx, "dlock-forwarded", "1")
	_, err = cc.TransferLeader(fctx, &dlockv1.TransferLeaderRequest{})
	st, _ := status.FromError(err)
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if e, ok := d.(*errdetails.ErrorInfo); ok {
			info = e
		}
	}
	if st.Code() != codes.Unavailable || info == nil || info.GetReason() != "NOT_LEADER" || info.GetMetadata()["leader_id"] != nodes[l].cfg.NodeID || info.GetMetadata()["leader_api"] == "" {
		t.Fatalf("forwarded TransferLeader on a follower: %v (detail %v), want UNAVAILABLE NOT_LEADER naming %s", err, info, nodes[l].cfg.NodeID)
	}
}

// TestCluster_RemovedJoinedMemberStaysRemoved: a node started with Join
// and removed as soon as it is a voter does not add itself again (its join
// is done once; its registration never adds a voter), and says it was
// removed.
func TestCluster_RemovedJoinedMemberStaysRemoved(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	l := waitLeader(t, nodes, -1)
	n4 := &node{cfg: clusterConfig(t, "n4")}
	logs := &clusterLogBuffer{}
	n4.cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	n4.cfg.Join = nodes[(l+1)%3].cfg.Listen
	t.Cleanup(func() { n4.stop(t) })
	n4.start(t)
	leader := nodes[l].server()
	waitUntil(t, "n4 a voter", func() bool { return voters(leader) == "n1,n2,n3,n4" })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := dlockv1.NewClusterClient(dial(t, nodes[l].cfg.Listen)).RemoveServer(ctx, &dlockv1.RemoveServerRequest{Id: "n4"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if v := voters(leader); v != "n1,n2,n3" {
			t.Fatalf("voters after removing n4: %s, want n1,n2,n3", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// It learns it from its committed configuration, or by asking the
	// members once no leader has been heard from for 3 election timeouts;
	// a loaded machine (a make test run) once took more than 20 s: its
	// log is printed when the test fails.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("n4's log:\n%s", logs.String())
		}
	})
	waitUntilWithin(t, time.Minute, "n4 says it was removed", func() bool { return strings.Contains(logs.String(), "removed from the cluster") })

	// The removed node says so, with no leader hint, and its status is
	// its own entry, removed, with no leader.
	code, m := post(t, n4.cfg.Listen, "/v1/acquire", `{"key":"k","ttl":"10s"}`)
	if code != http.StatusServiceUnavailable || m["reason"] != "NOT_MEMBER" || !strings.Contains(fmt.Sprint(m["message"]), "was removed from the cluster") || m["leader"] != nil {
		t.Fatalf("acquire on the removed node: %d %v", code, m)
	}
	// gRPC Lock calls too: neither "not ready" nor forwarded.
	_, err := dlockv1.NewLockClient(dial(t, n4.cfg.Listen)).Acquire(ctx, &dlockv1.AcquireRequest{Key: "k"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "NOT_MEMBER") {
		t.Fatalf("gRPC acquire on the removed node: %v, want UNAVAILABLE NOT_MEMBER", err)
	}
	cc := dlockv1.NewClusterClient(dial(t, n4.cfg.Listen))
	_, err = cc.Status(ctx, &dlockv1.ClusterStatusRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "NOT_MEMBER") {
		t.Fatalf("status on the removed node: %v", err)
	}
	_, err = cc.TransferLeader(ctx, &dlockv1.TransferLeaderRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "NOT_MEMBER") {
		t.Fatalf("transfer-leader on the removed node: %v", err)
	}
	st, err := cc.Status(ctx, &dlockv1.ClusterStatusRequest{Local: true})
	if err != nil || st.GetLeaderId() != "" || st.GetLeaderApi() != "" || len(st.GetMembers()) != 1 || st.GetMembers()[0].GetState() != "Removed" || st.GetMembers()[0].GetLeader() || st.GetMembers()[0].GetVoter() {
		t.Fatalf("local status on the removed node: %v %v", st, err)
	}
	// Its Raft port may accept a TCP connection, but refuses Raft
	// messages: the connection is closed before an answer.
	tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	var aer raft.AppendEntriesResponse
	err = tr.AppendEntries("n4", raft.ServerAddress(n4.cfg.RaftBind), &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("x"), Addr: []byte("127.0.0.1:1")}, Term: 1 << 40,
	}, &aer)
	if err == nil {
		t.Fatalf("the removed node's Raft port answered an AppendEntries: %+v", aer)
	}
}

// TestCluster_SingleNodeRefusals: a single voter refuses an AddVoter with
// an invalid address or node ID (400 INVALID_REQUEST, nothing added), a
// leadership transfer (no other voter), and a restart of its data
// directory under another node ID with advice that does not run it as a
// live member.
func TestCluster_SingleNodeRefusals(t *testing.T) {
	n1 := &node{cfg: clusterConfig(t, "n1")}
	t.Cleanup(func() { n1.stop(t) })
	n1.start(t)
	waitLeader(t, []*node{n1}, -1)
	for _, body := range []string{
		`{"id":"n9","raft_addr":"127.0.0.1:99999"}`,
		`{"id":"n9","raft_addr":":7999"}`,
		`{"id":"n9","raft_addr":"127.0.0.1:7999","api_addr":"127.0.0.1:99999"}`,
		`{"id":"a b=c,d","raft_addr":"127.0.0.1:7999"}`,
		`{"id":"","raft_addr":"127.0.0.1:7999"}`,
	} {
		code, m := post(t, n1.cfg.Listen, "/v1/cluster/add", body)
		if code != http.StatusBadRequest || m["reason"] != "INVALID_REQUEST" {
			t.Errorf("add %s: %d %v, want 400 INVALID_REQUEST", body, code, m)
		}
	}
	if v := voters(n1.server()); v != "n1" {
		t.Fatalf("voters after refused adds: %s", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc := dlockv1.NewClusterClient(dial(t, n1.cfg.Listen))
	for _, id := range []string{"", "n2"} {
		_, err := cc.TransferLeader(ctx, &dlockv1.TransferLeaderRequest{Id: id})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "no other voter to transfer leadership to") {
			t.Fatalf("transfer %q on a single voter: %v", id, err)
		}
	}

	// Its data directory, started as another node ID (a removed node's
	// restart looks the same): the advice is not to use the other ID.
	n1.stop(t)
	cfg := n1.cfg
	cfg.NodeID, cfg.Join = "n4", "127.0.0.1:1"
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = srv.Start()
	_ = srv.Close()
	if err == nil || !strings.Contains(err.Error(), "was removed from the cluster") || !strings.Contains(err.Error(), "empty the data dir and start it with --join") || strings.Contains(err.Error(), "start with that node ID") {
		t.Fatalf("start of n1's data as n4: %v", err)
	}
}

// TestCluster_DuplicateNodeIDJoinIsRefused: a second process joining
// under the ID of a healthy member is refused with advice that does not
// remove the good member: the ID is taken (where, last contact), choose
// another --node-id unless that member is really gone.
func TestCluster_DuplicateNodeIDJoinIsRefused(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	l := waitLeader(t, nodes, -1)
	waitUntil(t, "every member registered", func() bool { return registered(nodes, 3) })
	w := (l + 1) % 3
	dup := &node{cfg: clusterConfig(t, nodes[w].cfg.NodeID)}
	logs := &clusterLogBuffer{}
	dup.cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	dup.cfg.Join = nodes[l].cfg.Listen
	t.Cleanup(func() { dup.stop(t) })
	dup.start(t)
	waitUntil(t, "the refusal logged", func() bool {
		out := logs.String()
		return strings.Contains(out, "is already a member at Raft address "+nodes[w].cfg.RaftBind) &&
			strings.Contains(out, "last contact with the leader") && strings.Contains(out, "otherwise choose another --node-id")
	})
	if strings.Contains(logs.String(), "remove the old member first") {
		t.Fatalf("the refusal advises removing a healthy member: %s", logs.String())
	}
	if v := voters(nodes[l].server()); v != "n1,n2,n3" {
		t.Fatalf("voters: %s", v)
	}
}

// localState returns the node's own Raft term and applied index, from its
// local cluster status.
func localState(t *testing.T, nd *node) (term, applied uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := dlockv1.NewClusterClient(dial(t, nd.cfg.Listen)).Status(ctx, &dlockv1.ClusterStatusRequest{Local: true})
	if err != nil || len(st.GetMembers()) != 1 {
		t.Fatalf("local status of %s: %v %v", nd.cfg.NodeID, st, err)
	}
	return st.GetTerm(), st.GetMembers()[0].GetAppliedIndex()
}
