package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// runCLI runs dlock with args and returns its exit code, stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	t.Setenv("DLOCK_CONFIG", "")
	t.Setenv("XDG_CONFIG_HOME", t.TempDir()) // no configuration file
	code := Main(t.Context(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// testNode is one in-process dlockd of a test cluster.
type testNode struct {
	cfg server.Config
	mu  sync.Mutex
	srv *server.Server
}

func (n *testNode) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		_ = n.srv.Close()
		n.srv = nil
	}
}

func (n *testNode) start(t *testing.T) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	srv, err := server.New(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	n.srv = srv
}

// testRaftTimeout is the Raft heartbeat and election timeout of the test
// nodes: elections within a second or two on a loaded 2-core machine
// (under -race), without the spurious ones of shorter timings.
const testRaftTimeout = 500 * time.Millisecond

// startTestCluster starts n in-process dlockd nodes n1..nN as one static
// cluster (InitialCluster) on loopback, stopped when the test ends.
func startTestCluster(t *testing.T, n int) []*testNode {
	t.Helper()
	var nodes []*testNode
	var peers []server.Peer
	for i := range n {
		cfg := servertest.Config(t, t.TempDir())
		cfg.NodeID = fmt.Sprintf("n%d", i+1)
		cfg.Advertise = cfg.Listen
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = testRaftTimeout, testRaftTimeout, testRaftTimeout/2
		cfg.NoSync = true
		nodes = append(nodes, &testNode{cfg: cfg})
		peers = append(peers, server.Peer{ID: cfg.NodeID, RaftAddr: cfg.RaftBind})
	}
	for _, nd := range nodes {
		nd.cfg.InitialCluster = peers
	}
	t.Cleanup(func() {
		for _, nd := range nodes {
			nd.stop()
		}
	})
	for _, nd := range nodes {
		nd.start(t)
	}
	return nodes
}

func storeOf(nodes []*testNode) string {
	addrs := make([]string, len(nodes))
	for i, nd := range nodes {
		addrs[i] = nd.cfg.Listen
	}
	return "dlockd://" + strings.Join(addrs, ",")
}

// statusJSON runs dlock cluster status -o json against store until it
// shows a leader and want(status) holds, or fails the test after 20 s.
func waitStatus(t *testing.T, store string, want func(*clusterStatus) bool) *clusterStatus {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		code, out, errOut := runCLI(t, "--store", store, "cluster", "status", "-o", "json", "--retry-for", "1s")
		if code == 0 {
			var st clusterStatus
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatalf("cluster status -o json is not JSON: %v\n%s", err, out)
			}
			if st.LeaderID != "" && want(&st) {
				return &st
			}
			last = out
		} else {
			last = fmt.Sprintf("exit %d: %s%s", code, out, errOut)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("cluster status never showed what the test waits for; last:\n%s", last)
	return nil
}

func TestCluster_StatusTransferAddRemove(t *testing.T) {
	nodes := startTestCluster(t, 3)
	store := storeOf(nodes)

	// Every member registered its API address (each does once it has a
	// leader) and answers.
	st := waitStatus(t, store, func(st *clusterStatus) bool {
		if len(st.Members) != 3 || st.LeaderAPI == "" {
			return false
		}
		for _, m := range st.Members {
			if m.APIAddr == "" || m.Error != "" {
				return false
			}
		}
		return true
	})
	leaders := 0
	for _, m := range st.Members {
		if !m.Voter || m.RaftAddr == "" {
			t.Errorf("member %+v: want a voter with its Raft address", m)
		}
		if m.Leader {
			leaders++
			if m.ID != st.LeaderID {
				t.Errorf("member %s marked leader, leader_id %s", m.ID, st.LeaderID)
			}
		}
	}
	if leaders != 1 || st.Term == 0 || st.LeaderAPI == "" {
		t.Fatalf("status: %d leaders, term %d, leader API %q: %+v", leaders, st.Term, st.LeaderAPI, st)
	}
	leaderIdx := int(st.LeaderID[1] - '1')
	if got := nodes[leaderIdx].cfg.Listen; st.LeaderAPI != got {
		t.Errorf("leader_api %q, want %s's API %s", st.LeaderAPI, st.LeaderID, got)
	}

	// The text table names every member, marks the leader, gives the term
	// (a spurious election meanwhile shows "no leader known": asked again).
	var code int
	var out, errOut string
	for range 50 {
		code, out, errOut = runCLI(t, "--store", store, "cluster", "status")
		if code != 0 && (code != ExitUnavailable || !strings.HasPrefix(out, "no leader known")) {
			t.Fatalf("cluster status: exit %d: %s", code, errOut)
		}
		if strings.HasPrefix(out, "leader ") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	st = waitStatus(t, store, func(*clusterStatus) bool { return true })
	for _, want := range []string{"ID", "API", "RAFT", "VOTER", "LEADER", "LAST CONTACT", "APPLIED", "READS BATCHES", "n1", "n2", "n3", "*", "term "} {
		if !strings.Contains(out, want) {
			t.Errorf("status table lacks %q:\n%s", want, out)
		}
	}
	// Every member decodes batch entries, so once the leader's probe has
	// their answers it batches, and says so: asked of a follower too (the
	// CLI then asks the leader for it).
	var follower0 int
	for i := range nodes {
		if fmt.Sprintf("n%d", i+1) != st.LeaderID {
			follower0 = i
			break
		}
	}
	st = waitStatus(t, "dlockd://"+nodes[follower0].cfg.Listen, func(st *clusterStatus) bool { return st.Batching != nil && *st.Batching })
	if st.NodeID == st.LeaderID {
		t.Fatalf("the status came from the leader %s, want a follower's", st.NodeID)
	}
	for _, m := range st.Members {
		if m.BatchEntries == nil || !*m.BatchEntries {
			t.Errorf("member %s: batch_entries %v, want true", m.ID, m.BatchEntries)
		}
	}
	_, out, _ = runCLI(t, "--store", "dlockd://"+st.LeaderAPI, "cluster", "status")
	if !strings.Contains(out, "; batching on;") {
		t.Errorf("status from the leader does not say it batches:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "n") && f[len(f)-1] != "yes" {
			t.Errorf("member row %q: READS BATCHES (last column) is not yes:\n%s", line, out)
		}
	}
	leaderIdx = int(st.LeaderID[1] - '1')

	// A member that is down, listed first, is skipped; a follower alone
	// answers (forwarding to the leader, or from its own view).
	follower := (leaderIdx + 1) % 3
	dead := servertest.FreePort(t)
	code, out, errOut = runCLI(t, "--store", "dlockd://"+dead+","+nodes[follower].cfg.Listen, "cluster", "status", "-o", "json")
	if code != 0 || !strings.Contains(out, `"leader_id": "`+st.LeaderID+`"`) {
		t.Fatalf("status via a dead member then a follower: exit %d\n%s%s", code, out, errOut)
	}

	// transfer-leader to a named follower.
	target := fmt.Sprintf("n%d", follower+1)
	code, out, errOut = runCLI(t, "--store", store, "cluster", "transfer-leader", target)
	if code != 0 || !strings.Contains(out, "leadership moved from "+st.LeaderID+" to "+target) {
		t.Fatalf("transfer-leader %s: exit %d\n%s%s", target, code, out, errOut)
	}
	waitStatus(t, store, func(st *clusterStatus) bool { return st.LeaderID == target })
	// To the leader itself: nothing to do.
	code, out, _ = runCLI(t, "--store", store, "cluster", "transfer-leader", target)
	if code != 0 || !strings.Contains(out, target+" is already the leader") {
		t.Fatalf("transfer-leader to the leader: exit %d\n%s", code, out)
	}
	// Without an ID: to any other voter.
	code, out, errOut = runCLI(t, "--store", store, "cluster", "transfer-leader")
	if code != 0 || !strings.Contains(out, "leadership moved from "+target+" to n") {
		t.Fatalf("transfer-leader (any): exit %d\n%s%s", code, out, errOut)
	}

	// add: a fourth node that asks to join through n1, and the operator's
	// add of it (whichever comes first, the other finds it a member).
	cfg := servertest.Config(t, t.TempDir())
	cfg.NodeID = "n4"
	cfg.Advertise = cfg.Listen
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = testRaftTimeout, testRaftTimeout, testRaftTimeout/2
	cfg.NoSync = true
	cfg.Join = nodes[0].cfg.Listen
	n4 := &testNode{cfg: cfg}
	t.Cleanup(n4.stop)
	n4.start(t)
	code, out, errOut = runCLI(t, "--store", store, "cluster", "add", "--id", "n4", "--raft-addr", cfg.RaftBind, "--api-addr", cfg.Listen)
	if code != 0 || !strings.Contains(out, "4 members: ") {
		t.Fatalf("cluster add n4: exit %d\n%s%s", code, out, errOut)
	}
	st = waitStatus(t, store, func(st *clusterStatus) bool {
		m := st.member("n4")
		return m != nil && m.Voter && m.APIAddr == cfg.Listen
	})

	// add of n4 again under another Raft address: refused, exit 1, clear.
	code, _, errOut = runCLI(t, "--store", store, "cluster", "add", "--id", "n4", "--raft-addr", servertest.FreePort(t))
	if code != 1 || !strings.Contains(errOut, "cluster add:") {
		t.Fatalf("add of a member under another Raft address: exit %d: %s", code, errOut)
	}

	// remove n4 (down: a stopped node cannot ask to be added back): three
	// members again.
	n4.stop()
	code, out, errOut = runCLI(t, "--store", store, "cluster", "remove", "n4")
	if code != 0 || !strings.Contains(out, "removed n4; 3 members") {
		t.Fatalf("cluster remove n4: exit %d\n%s%s", code, out, errOut)
	}
	st = waitStatus(t, store, func(st *clusterStatus) bool { return st.member("n4") == nil && len(st.Members) == 3 })

	// remove of an unknown member: exit 1, naming it.
	code, _, errOut = runCLI(t, "--store", store, "cluster", "remove", "n9")
	if code != 1 || !strings.Contains(errOut, "n9") {
		t.Fatalf("remove of an unknown member: exit %d: %s", code, errOut)
	}
}

func TestCluster_ErrorsAreClear(t *testing.T) {
	dead1, dead2 := servertest.FreePort(t), servertest.FreePort(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--store", "redis://127.0.0.1:6379", "cluster", "status"}, ExitUnsupported, "dlockd only"},
		{[]string{"--store", "127.0.0.1:7450", "cluster", "status"}, ExitUsage, "did you mean --store dlockd://127.0.0.1:7450"},
		{[]string{"--store", "dlockd://127.0.0.1:99999", "cluster", "status"}, ExitUsage, "not a TCP port"},
		{[]string{"--store", "dlockd://" + dead1 + "," + dead2, "cluster", "status", "--retry-for", "200ms"}, ExitUnavailable, dead2 + ": connection refused"},
		{[]string{"cluster"}, ExitUsage, "needs a command"},
		{[]string{"cluster", "frob"}, ExitUsage, `unknown command "frob"`},
		{[]string{"cluster", "add", "--raft-addr", "127.0.0.1:7451"}, ExitUsage, "a node ID is required"},
		{[]string{"cluster", "add", "--id", "n4"}, ExitUsage, "--raft-addr"},
		{[]string{"cluster", "add", "--id", "n 4", "--raft-addr", "127.0.0.1:7451"}, ExitUsage, "must not hold spaces"},
		{[]string{"cluster", "add", "--id", "n4", "--raft-addr", "nohostport"}, ExitUsage, "is not HOST:PORT"},
		{[]string{"cluster", "remove"}, ExitUsage, "usage: dlock cluster remove ID"},
		{[]string{"cluster", "transfer-leader", "a", "b"}, ExitUsage, "usage: dlock cluster transfer-leader [ID]"},
	} {
		code, out, errOut := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("dlock %s: exit %d, stderr %q (stdout %q); want exit %d mentioning %q", strings.Join(tc.args, " "), code, errOut, out, tc.code, tc.want)
		}
	}

	// -o json: the error object on stdout.
	code, out, _ := runCLI(t, "--store", "dlockd://"+dead1, "cluster", "status", "-o", "json", "--retry-for", "0s")
	var e errorJSON
	if code != ExitUnavailable || json.Unmarshal([]byte(out), &e) != nil || e.Code != codeUnavailable {
		t.Fatalf("-o json error: exit %d, %q", code, out)
	}
}

// A server without the cluster API (an older dlockd, or any HTTP server)
// is exit 78; a 503 naming the leader sends the call there; a mutation
// that got no answer is not retried elsewhere, and says so.
func TestCluster_ClientRouting(t *testing.T) {
	old := httptest.NewServer(http.NotFoundHandler())
	defer old.Close()
	code, _, errOut := runCLI(t, "--store", "dlockd://"+strings.TrimPrefix(old.URL, "http://"), "cluster", "status")
	if code != ExitUnsupported || !strings.Contains(errOut, "no cluster API") {
		t.Fatalf("older server: exit %d: %s", code, errOut)
	}

	statusBody := `{"members":[{"id":"n1","api_addr":"A","raft_addr":"R","voter":true,"leader":true,"applied_index":"42","last_contact":"0s","state":"Leader","term":"7"},` +
		`{"id":"n2","api_addr":"B","raft_addr":"S","voter":true,"applied_index":"0","last_contact":null,"state":"","error":"no answer"}],"leader_id":"n1","leader_api":"A","term":"7","node_id":"n1"}`
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(statusBody))
	}))
	defer leader.Close()
	leaderAddr := strings.TrimPrefix(leader.URL, "http://")
	follower := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Dlock-Leader", leaderAddr)
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"code":"UNAVAILABLE","reason":"NOT_LEADER","message":"not the leader (NOT_LEADER)","leader":"` + leaderAddr + `"}`))
	}))
	defer follower.Close()
	code, out, errOut := runCLI(t, "--store", "dlockd://"+strings.TrimPrefix(follower.URL, "http://"), "cluster", "status", "-o", "json")
	if code != 0 {
		t.Fatalf("status through a follower's hint: exit %d: %s", code, errOut)
	}
	var st clusterStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if st.AnsweredBy != leaderAddr || st.Term != 7 || len(st.Members) != 2 || *st.Members[0].AppliedIndex != 42 ||
		st.Members[1].AppliedIndex != nil || st.Members[1].LastContactSeconds != nil || st.Members[1].Error != "no answer" {
		t.Fatalf("decoded status %s", out)
	}
	code, out, _ = runCLI(t, "--store", "dlockd://"+leaderAddr, "cluster", "status")
	if code != 0 || !strings.Contains(out, "members whose own state is unknown:\n  n2: no answer") || !strings.Contains(out, "42") {
		t.Fatalf("status table:\n%s", out)
	}

	// A member that accepts the connection and never answers: a removal
	// is not sent to the next member (it may have been applied).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { <-ctx.Done(); c.Close() }()
		}
	}()
	code, _, errOut = runCLI(t, "--store", "dlockd://"+ln.Addr().String()+","+leaderAddr, "cluster", "remove", "n2", "--timeout", "300ms")
	if code != ExitUnavailable || !strings.Contains(errOut, "may or may not have been applied") {
		t.Fatalf("remove through a silent member: exit %d: %s", code, errOut)
	}
}

// TestCluster_StatusWithoutLeaderExits69: with two of three members down
// the survivor knows no leader: cluster status prints the table (or the
// -o json status) and exits 69, as its help says.
func TestCluster_StatusWithoutLeaderExits69(t *testing.T) {
	nodes := startTestCluster(t, 3)
	store := storeOf(nodes)
	waitStatus(t, store, func(st *clusterStatus) bool { return len(st.Members) == 3 })
	nodes[0].stop()
	nodes[1].stop()
	deadline := time.Now().Add(20 * time.Second)
	var code int
	var out, errOut string
	for {
		code, out, errOut = runCLI(t, "--store", store, "cluster", "status", "--retry-for", "0s")
		if code != 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // n3 still remembers the leader
	}
	if code != ExitUnavailable || !strings.HasPrefix(out, "no leader known") || !strings.Contains(out, "n3") || !strings.Contains(errOut, "knows no leader") {
		t.Fatalf("status without a leader: exit %d; stdout:\n%s\nstderr: %s; want exit 69 after the table", code, out, errOut)
	}
	code, out, _ = runCLI(t, "--store", store, "cluster", "status", "--retry-for", "0s", "-o", "json")
	var st clusterStatus
	if err := json.Unmarshal([]byte(out), &st); code != ExitUnavailable || err != nil || st.LeaderID != "" || len(st.Members) != 3 {
		t.Fatalf("status -o json without a leader: exit %d, %q (%v); want exit 69 and the status object", code, out, err)
	}
}

// TestCluster_TransferRefusedByTheLeader: a leader that refuses a transfer
// with 503 NOT_LEADER naming itself (an older dlockd on a single voter), or
// with 503 TRANSFER_FAILED, has answered: exit 1 at once with its message,
// never 69 "no leader" after retrying. A real single-voter cluster refuses
// too (exit 1).
func TestCluster_TransferRefusedByTheLeader(t *testing.T) {
	for _, answer := range []string{
		`{"code":"UNAVAILABLE","reason":"NOT_LEADER","message":"dlockd: leadership transfer failed: cannot find peer; leader n1 at ADDR (NOT_LEADER)","leader":"ADDR","leader_id":"n1"}`,
		`{"code":"UNAVAILABLE","reason":"TRANSFER_FAILED","message":"dlockd: leadership transfer failed: cannot find peer (TRANSFER_FAILED)"}`,
	} {
		var addr string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == clusterStatusPath {
				_, _ = fmt.Fprintf(w, `{"members":[{"id":"n1","api_addr":"%s","raft_addr":"R","voter":true,"leader":true}],"leader_id":"n1","leader_api":"%s","term":"2","node_id":"n1"}`, addr, addr)
				return
			}
			w.Header().Set("Dlock-Leader", addr)
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(strings.ReplaceAll(answer, "ADDR", addr)))
		}))
		addr = strings.TrimPrefix(srv.URL, "http://")
		start := time.Now()
		code, _, errOut := runCLI(t, "--store", "dlockd://"+addr, "cluster", "transfer-leader", "--retry-for", "5s")
		srv.Close()
		if took := time.Since(start); code != 1 || !strings.Contains(errOut, "leadership transfer failed: cannot find peer") ||
			strings.Contains(errOut, "no leader") || took > 3*time.Second {
			t.Errorf("transfer refused by the leader (%.40s...): exit %d after %v: %s; want exit 1 at once with the server's message", answer, code, took.Round(time.Millisecond), errOut)
		}
	}

	nodes := startTestCluster(t, 1)
	store := storeOf(nodes)
	waitStatus(t, store, func(*clusterStatus) bool { return true })
	start := time.Now()
	code, _, errOut := runCLI(t, "--store", store, "cluster", "transfer-leader", "--retry-for", "5s")
	if took := time.Since(start); code != 1 || strings.Contains(errOut, "no leader") || took > 3*time.Second {
		t.Fatalf("transfer-leader on a single voter: exit %d after %v: %s; want exit 1 at once", code, took.Round(time.Millisecond), errOut)
	}
	t.Logf("single voter: %s", strings.TrimSpace(errOut))
}

// TestCluster_TransferWonByAnotherVoter: a transfer to n3 whose election
// failed, so that n2 won the next one, exits 1 at once naming both, not
// "no new leader" after the timeout.
func TestCluster_TransferWonByAnotherVoter(t *testing.T) {
	var addr string
	var transferred atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == clusterStatusPath {
			leader, term := "n1", 2
			if transferred.Load() {
				leader, term = "n2", 4
			}
			_, _ = fmt.Fprintf(w, `{"members":[{"id":"n1","api_addr":"%[1]s","raft_addr":"R1","voter":true},{"id":"n2","api_addr":"%[1]s","raft_addr":"R2","voter":true},{"id":"n3","api_addr":"%[1]s","raft_addr":"R3","voter":true}],"leader_id":"%[2]s","leader_api":"%[1]s","term":"%[3]d","node_id":"%[2]s"}`, addr, leader, term)
			return
		}
		transferred.Store(true)
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	addr = strings.TrimPrefix(srv.URL, "http://")
	start := time.Now()
	code, _, errOut := runCLI(t, "--store", "dlockd://"+addr, "cluster", "transfer-leader", "n3", "--timeout", "10s")
	if took := time.Since(start); code != 1 || !strings.Contains(errOut, "moved from n1 to n2, not to n3") || took > 3*time.Second {
		t.Fatalf("transfer won by another voter: exit %d after %v: %s; want exit 1 at once naming n2 and n3", code, took.Round(time.Millisecond), errOut)
	}
}
