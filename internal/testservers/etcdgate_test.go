package testservers

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestEtcdGates_CutBySocketAndHeader runs the gates in front of three
// echo servers, with this test process as member 0 (by /proc) and headers
// naming members 0 and 2: a cut link closes its open connections at once
// and every new one on arrival, other senders pass, and Close ends every
// goroutine.
func TestEtcdGates_CutBySocketAndHeader(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the /proc lookup is Linux's")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var wg sync.WaitGroup
	defer wg.Wait()
	echo := make([]string, 3)
	for i := range echo {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = io.Copy(c, c); c.Close() }()
			}
		}()
		echo[i] = ln.Addr().String()
	}
	self := os.Getpid()
	g, err := startEtcdGates(echo, func(i int) int {
		if i == 0 {
			return self
		}
		return 0
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close() // before the echo servers' wg.Wait: it closes their connections
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	gate := func(i int) string { return strings.TrimPrefix(g.URL(i), "http://") }

	// dial sends a request head (naming X-PeerURLs when from is not "")
	// through member to's gate and reports whether its echo comes back.
	dial := func(to int, from string) (net.Conn, bool) {
		t.Helper()
		c, err := net.Dial("tcp", gate(to))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		head := "GET /raft/probing HTTP/1.1\r\nHost: x\r\n\r\n"
		if from != "" {
			head = "POST /raft HTTP/1.1\r\nHost: x\r\nX-Peerurls: " + from + "\r\n\r\n"
		}
		return c, roundTrip(c, head)
	}
	bySocket, ok := dial(1, "")
	if !ok {
		t.Fatal("an uncut connection did not pass")
	}
	byHeader, ok := dial(1, g.URL(2))
	if !ok {
		t.Fatal("an uncut connection naming member 2 did not pass")
	}
	g.partition([]int{0, 1, 1})
	if !g.isCut(1, 0) || !g.isCut(0, 2) || g.isCut(1, 2) {
		t.Fatal("partition [0] | [1 2] did not cut exactly 0–1 and 0–2, both ways")
	}
	if roundTrip(bySocket, "more") {
		t.Fatal("member 0's open connection to member 1 survived the cut")
	}
	if _, ok := dial(1, ""); ok {
		t.Fatal("a new connection from member 0 (by /proc) passed the cut")
	}
	if _, ok := dial(1, g.URL(0)); ok {
		t.Fatal("a new connection naming member 0 passed the cut")
	}
	if _, ok := dial(2, ""); ok {
		t.Fatal("a new connection from member 0 to member 2 passed the cut")
	}
	if !roundTrip(byHeader, "more") {
		t.Fatal("member 2's connection to member 1 was closed by the cut of member 0")
	}
	g.partition([]int{0, 0, 0})
	if g.isCut(0, 1) {
		t.Fatal("the heal left 0–1 cut")
	}
	if _, ok := dial(1, ""); !ok {
		t.Fatal("member 0's new connection to member 1 did not pass after the heal")
	}
}

// roundTrip writes s to c and reports whether it is echoed within 2 s.
func roundTrip(c net.Conn, s string) bool {
	if _, err := io.WriteString(c, s); err != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, len(s))
	_, err := io.ReadFull(c, buf)
	return err == nil && string(buf) == s
}

// TestEtcdCluster_IsolateLeader isolates the leader of a gated 3-member
// cluster: the other two elect a leader and commit, the old one cannot;
// after Heal there is one leader, the old one has the writes of the
// majority, and every member commits.
func TestEtcdCluster_IsolateLeader(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t.Run("cluster", isolateLeader)
}

func isolateLeader(t *testing.T) {
	c, check := startGatedEtcd(t)
	old := waitEtcdLeader(t, c, -1)
	for i := range 3 {
		mustPut(t, c, i, "k", fmt.Sprint("before-", i))
	}
	c.Isolate(old)
	cutAt := time.Now()
	for i := range 3 {
		for j := range 3 {
			if want := i != j && (i == old || j == old); c.Partitioned(i, j) != want {
				t.Fatalf("Partitioned(%d, %d) = %v after Isolate(%d)", i, j, !want, old)
			}
		}
	}
	// The others elect a leader within an election timeout or two; the old
	// one steps down as soon (etcd runs raft with CheckQuorum) and cannot
	// commit meanwhile.
	next, elected, stepped := -1, time.Duration(0), time.Duration(0)
	waitEtcd(5*time.Second, func() bool {
		for _, i := range others(old) {
			if next < 0 && etcdIsLeader(c, i) {
				next, elected = i, time.Since(cutAt)
			}
		}
		if stepped == 0 && !etcdIsLeader(c, old) {
			stepped = time.Since(cutAt)
		}
		return next >= 0 && stepped > 0
	})
	if next < 0 {
		t.Fatalf("no member but the isolated %d leads 5 s after the cut", old)
	}
	if stepped == 0 {
		t.Errorf("the isolated old leader %d still says it leads 5 s after the cut", old)
	}
	t.Logf("isolated leader %d; member %d leads after %v; the old one stepped down after %v",
		old, next, elected.Round(time.Millisecond), stepped.Round(time.Millisecond))
	mustPut(t, c, next, "k", "during")
	if err := tryPut(c, old, "k", "isolated", time.Second); err == nil {
		t.Fatalf("the isolated old leader %d committed a put", old)
	}

	c.Heal()
	healAt := time.Now()
	if c.Partitioned(0, 1) || c.Partitioned(old, next) {
		t.Fatal("Partitioned after Heal")
	}
	waitOneEtcdLeader(t, c, 10*time.Second)
	if v := mustGet(t, c, old, "k"); v != "during" {
		t.Fatalf("after the heal the old leader reads k = %q, want the majority's %q", v, "during")
	}
	for i := range 3 {
		mustPut(t, c, i, "k", fmt.Sprint("after-", i))
	}
	t.Logf("every member committed %v after the heal", time.Since(healAt).Round(time.Millisecond))
	check()
}

// TestEtcdCluster_PartitionAndRestart splits a gated cluster [0] | [1 2]:
// member 0 cannot commit, 1 and 2 can; after Heal all three can, and a
// member killed and restarted behind its gate serves again.
func TestEtcdCluster_PartitionAndRestart(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t.Run("cluster", partitionAndRestart)
}

func partitionAndRestart(t *testing.T) {
	c, check := startGatedEtcd(t)
	waitEtcdLeader(t, c, -1)
	c.Partition([]int{0}, []int{1, 2})
	if !c.Partitioned(0, 1) || !c.Partitioned(2, 0) || c.Partitioned(1, 2) {
		t.Fatal("Partition([0], [1 2]) cut the wrong links")
	}
	l := waitEtcdLeaderAmong(t, c, []int{1, 2}, 5*time.Second)
	mustPut(t, c, 1, "p", "one")
	mustPut(t, c, 2, "p", "two")
	if err := tryPut(c, 0, "p", "zero", time.Second); err == nil {
		t.Fatal("member 0, in the minority, committed a put")
	}
	t.Logf("minority [0] refused; member %d leads [1 2]", l)

	c.Heal()
	waitOneEtcdLeader(t, c, 10*time.Second)
	for i := range 3 {
		mustPut(t, c, i, "p", fmt.Sprint("healed-", i))
	}

	c.Kill(1)
	if err := c.Restart(1); err != nil {
		t.Fatal(err)
	}
	mustPut(t, c, 1, "p", "restarted")
	if v := mustGet(t, c, 0, "p"); v != "restarted" {
		t.Fatalf("member 0 reads p = %q after the restarted member's put", v)
	}
	check()
}

// startGatedEtcd starts a gated 3-member cluster whose gates copy what
// each sender sends to a scanner, and returns it with check, which fails
// the test unless every X-PeerURLs header on every connection named the
// member holding the connection's socket (by /proc): a connection carries
// one member's requests only, and the header names that member.
func startGatedEtcd(t *testing.T) (*EtcdCluster, func()) {
	t.Helper()
	var mu sync.Mutex
	var scans []*peerURLScan
	c := StartEtcdClusterWith(t, 3, EtcdClusterOptions{Gated: true, gateTap: func(to, owner int) io.Writer {
		s := &peerURLScan{to: to, owner: owner}
		mu.Lock()
		scans = append(scans, s)
		mu.Unlock()
		return s
	}})
	if c.Len() != 3 || !strings.HasPrefix(c.advertisedPeerURL(0), "http://127.0.0.1:") || c.advertisedPeerURL(0) == c.members[0].peerURL() {
		t.Fatalf("gated member 0 advertises %q, its real peer URL is %q", c.advertisedPeerURL(0), c.members[0].peerURL())
	}
	return c, func() {
		t.Helper()
		if runtime.GOOS != "linux" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		var conns, passed, unowned, named, late, headers int
		for _, s := range scans {
			s.mu.Lock()
			conns++
			if s.wrote {
				passed++
				if s.owner < 0 {
					unowned++
				}
			}
			if len(s.named) > 0 {
				named++
				headers += len(s.named)
			}
			if len(s.named) > 0 && !s.firstNamed {
				late++ // first request without X-PeerURLs, a later one with it
			}
			for _, u := range s.named {
				if from := c.gates.member(u); from != s.owner || from == s.to {
					t.Errorf("a connection to member %d held by member %d carried X-PeerURLs %q (member %d)", s.to, s.owner, u, from)
				}
			}
			s.mu.Unlock()
		}
		t.Logf("gates: %d connections, %d passed (%d of them held by no member by /proc), %d carried %d X-PeerURLs headers, each naming the member holding its socket (%d only after a first request without one)",
			conns, passed, unowned, named, headers, late)
		if named == 0 {
			t.Error("no connection through the gates carried X-PeerURLs")
		}
	}
}

// peerURLScan collects the X-PeerURLs values in one connection's bytes
// from its sender.
type peerURLScan struct {
	to, owner int

	mu         sync.Mutex
	wrote      bool     // the gate forwarded bytes (did not refuse it)
	seen       bool     // the first request head has been scanned
	firstNamed bool     // it had X-PeerURLs
	named      []string // every X-PeerURLs value, in order
	buf        []byte   // unscanned tail
}

var peerURLsLine = []byte("\r\nx-peerurls:")

func (s *peerURLScan) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wrote = true
	s.buf = append(s.buf, p...)
	if !s.seen {
		end := bytes.Index(s.buf, []byte("\r\n\r\n"))
		if end < 0 && len(s.buf) < gateHeadBytes {
			return len(p), nil
		}
		s.seen = true
		s.firstNamed = end >= 0 && bytes.Contains(asciiLower(s.buf[:end+2]), peerURLsLine)
	}
	lower := asciiLower(s.buf)
	for {
		i := bytes.Index(lower, peerURLsLine)
		if i < 0 {
			keep := min(len(s.buf), len(peerURLsLine))
			s.buf = append(s.buf[:0], s.buf[len(s.buf)-keep:]...)
			return len(p), nil
		}
		v := i + len(peerURLsLine)
		n := bytes.Index(s.buf[v:], []byte("\r\n"))
		if n < 0 {
			if len(s.buf)-i > 4096 {
				s.buf = s.buf[:0] // not a header after all
			} else {
				s.buf = append(s.buf[:0], s.buf[i:]...)
			}
			return len(p), nil
		}
		for _, u := range strings.Split(string(s.buf[v:v+n]), ",") {
			s.named = append(s.named, strings.TrimSpace(u))
		}
		s.buf, lower = s.buf[v+n:], lower[v+n:]
	}
}

// asciiLower returns a copy of b with A-Z lowered and every other byte
// kept, so that its indexes are b's (bytes.ToLower turns invalid UTF-8,
// as in a protobuf body, into longer U+FFFD).
func asciiLower(b []byte) []byte {
	l := make([]byte, len(b))
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		l[i] = c
	}
	return l
}

func others(i int) []int {
	var r []int
	for j := range 3 {
		if j != i {
			r = append(r, j)
		}
	}
	return r
}

// waitEtcd polls ok every 50 ms until it holds or limit passes.
func waitEtcd(limit time.Duration, ok func() bool) bool {
	for end := time.Now().Add(limit); ; time.Sleep(50 * time.Millisecond) {
		if ok() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// waitEtcdLeaderAmong waits up to limit for one of members to say it
// leads, and returns it.
func waitEtcdLeaderAmong(t *testing.T, c *EtcdCluster, members []int, limit time.Duration) int {
	t.Helper()
	l := -1
	if !waitEtcd(limit, func() bool {
		for _, i := range members {
			if etcdIsLeader(c, i) {
				l = i
				return true
			}
		}
		return false
	}) {
		t.Fatalf("none of members %v leads after %v", members, limit)
	}
	return l
}

// waitOneEtcdLeader waits up to limit until exactly one member says it
// leads.
func waitOneEtcdLeader(t *testing.T, c *EtcdCluster, limit time.Duration) {
	t.Helper()
	var leaders []int
	if !waitEtcd(limit, func() bool {
		leaders = leaders[:0]
		for i := range c.Len() {
			if etcdIsLeader(c, i) {
				leaders = append(leaders, i)
			}
		}
		return len(leaders) == 1
	}) {
		t.Fatalf("after %v the members leading are %v, want one", limit, leaders)
	}
}

// etcdHTTP is the tests' client of the members' client ports (the v3
// JSON gateway and /metrics), without keep-alives so that no connection
// outlives a test.
var etcdHTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// etcdIsLeader reports whether member i's /metrics says it leads.
func etcdIsLeader(c *EtcdCluster, i int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", c.members[i].clientURL()+"/metrics", nil)
	resp, err := etcdHTTP.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_server_is_leader "); ok {
			return strings.TrimSpace(v) == "1"
		}
	}
	return false
}

// etcdCall posts body to member i's v3 JSON gateway at path and decodes
// the answer into out, within limit.
func etcdCall(c *EtcdCluster, i int, path string, body, out any, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", c.members[i].clientURL()+path, bytes.NewReader(b))
	resp, err := etcdHTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("member %d %s: %s: %s", i, path, resp.Status, rb)
	}
	return json.Unmarshal(rb, out)
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// tryPut puts key=value through member i's client port, within limit.
func tryPut(c *EtcdCluster, i int, key, value string, limit time.Duration) error {
	var out map[string]any
	return etcdCall(c, i, "/v3/kv/put", map[string]string{"key": b64(key), "value": b64(value)}, &out, limit)
}

// mustPut puts key=value through member i, retrying for up to 10 s.
func mustPut(t *testing.T, c *EtcdCluster, i int, key, value string) {
	t.Helper()
	var err error
	if !waitEtcd(10*time.Second, func() bool { err = tryPut(c, i, key, value, 2*time.Second); return err == nil }) {
		t.Fatalf("put %s=%s through member %d: %v", key, value, i, err)
	}
}

// mustGet reads key through member i (linearizable), retrying for up to
// 10 s, and returns its value ("" when absent).
func mustGet(t *testing.T, c *EtcdCluster, i int, key string) string {
	t.Helper()
	var out struct {
		KVs []struct {
			Value string `json:"value"`
		} `json:"kvs"`
	}
	var err error
	if !waitEtcd(10*time.Second, func() bool {
		err = etcdCall(c, i, "/v3/kv/range", map[string]string{"key": b64(key)}, &out, 2*time.Second)
		return err == nil
	}) {
		t.Fatalf("get %s through member %d: %v", key, i, err)
	}
	if len(out.KVs) == 0 {
		return ""
	}
	v, _ := base64.StdEncoding.DecodeString(out.KVs[0].Value)
	return string(v)
}
