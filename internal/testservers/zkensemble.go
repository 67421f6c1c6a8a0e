package testservers

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ZooKeeperEnsemble is a replicated ZooKeeper (QuorumPeerMain) of n
// members on loopback, started by a test.
type ZooKeeperEnsemble struct {
	t       TB
	members []*zkMember
}

// zkMember is one member: its ports, config and process.
type zkMember struct {
	id                       int // myid, 1-based
	dir                      string
	client, quorum, election int
	zkProc
}

// ZooKeeperEnsembleOptions configures StartZooKeeperEnsemble.
type ZooKeeperEnsembleOptions struct {
	// Peer, when not nil, returns the address member from (0-based) uses
	// to reach member to's quorum or election port at addr
	// ("127.0.0.1:port"), so that a test can put a proxy on each
	// member-to-member link: every member has a config of its own, and
	// ZooKeeper dials a peer only at the address its own config names.
	// It is called once per (from, to, port) before any member starts.
	Peer func(from, to int, addr string) string
}

// StartZooKeeperEnsemble starts n ZooKeeper members (n ≥ 3, odd) forming
// one ensemble, each on free loopback ports with its data in a temp dir,
// tickTime 200 ms (initLimit 2 s, syncLimit 1 s, so a lost leader is
// noticed within about a second), forceSync=no as StartZooKeeper; it
// waits until every member serves requests (one of them the leader) and
// stops them by PID when the test ends. A missing java or zookeeper.jar
// fails the test with the install command.
func StartZooKeeperEnsemble(t TB, n int, o ZooKeeperEnsembleOptions) *ZooKeeperEnsemble {
	t.Helper()
	if n < 3 || n%2 == 0 {
		t.Fatalf("testservers: a ZooKeeper ensemble of %d members: want an odd number ≥ 3", n)
	}
	java, cp := zkClasspath(t)
	e := &ZooKeeperEnsemble{t: t}
	root := t.TempDir()
	for i := range n {
		dir := filepath.Join(root, fmt.Sprintf("zk%d", i+1))
		if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
			t.Fatalf("testservers: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "data", "myid"), []byte(fmt.Sprintf("%d\n", i+1)), 0o644); err != nil {
			t.Fatalf("testservers: %v", err)
		}
		e.members = append(e.members, &zkMember{
			id: i + 1, dir: dir, client: FreePort(t), quorum: FreePort(t), election: FreePort(t),
			zkProc: zkProc{
				java: java, cp: cp, main: "org.apache.zookeeper.server.quorum.QuorumPeerMain",
				cfgPath: filepath.Join(dir, "zoo.cfg"), logPath: filepath.Join(dir, "zookeeper.log"),
			},
		})
	}
	peer := func(from, to int, port int) string {
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if o.Peer == nil || from == to {
			return addr
		}
		return o.Peer(from, to, addr)
	}
	for i, m := range e.members {
		var servers strings.Builder
		for j, p := range e.members {
			q := peer(i, j, p.quorum)
			el := peer(i, j, p.election)
			qh, qp, _ := net.SplitHostPort(q)
			_, ep, _ := net.SplitHostPort(el)
			if qh == "" {
				t.Fatalf("testservers: Peer(%d, %d) returned %q: want host:port", i, j, q)
			}
			fmt.Fprintf(&servers, "server.%d=%s:%s:%s\n", p.id, qh, qp, ep)
		}
		cfg := fmt.Sprintf("%sinitLimit=10\nsyncLimit=5\nstandaloneEnabled=false\nreconfigEnabled=false\ndataDir=%s\nclientPort=%d\n%s",
			zkBaseConfig, filepath.Join(m.dir, "data"), m.client, servers.String())
		if err := os.WriteFile(m.cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatalf("testservers: %v", err)
		}
	}
	t.Cleanup(func() {
		for i, m := range e.members {
			e.Stop(i)
			logTailOnFailure(t, fmt.Sprintf("zookeeper member %d", m.id), m.logPath)
		}
	})
	// Start every member before waiting: none serves until a quorum runs.
	for i := range e.members {
		if err := e.spawn(i); err != nil {
			t.Fatalf("testservers: %v", err)
		}
	}
	for i := range e.members {
		if err := e.waitServing(i, 60*time.Second); err != nil {
			t.Fatalf("testservers: %v", err)
		}
	}
	return e
}

// zkClasspath finds java and zookeeper.jar with its dependencies.
func zkClasspath(t TB) (java, cp string) {
	t.Helper()
	java = Binary(t, "java", zkInstallHint)
	jar := ""
	for _, dir := range zkJarDirs {
		p := filepath.Join(dir, "zookeeper.jar")
		if _, err := os.Stat(p); err == nil {
			jar = p
			break
		}
	}
	if jar == "" {
		t.Fatalf("testservers: zookeeper.jar not found in %v; install it: %s", zkJarDirs, zkInstallHint)
	}
	parts := []string{jar}
	for _, name := range []string{"zookeeper-jute.jar", "slf4j-api.jar", "slf4j-simple.jar"} {
		p := filepath.Join(filepath.Dir(jar), name)
		if _, err := os.Stat(p); err == nil {
			parts = append(parts, p)
		}
	}
	return java, strings.Join(parts, string(os.PathListSeparator))
}

// Len returns the number of members.
func (e *ZooKeeperEnsemble) Len() int { return len(e.members) }

// Addr returns member i's client address, "127.0.0.1:port".
func (e *ZooKeeperEnsemble) Addr(i int) string {
	return fmt.Sprintf("127.0.0.1:%d", e.members[i].client)
}

// PID returns member i's process id, or 0 when it is stopped.
func (e *ZooKeeperEnsemble) PID(i int) int { return e.members[i].pid() }

// spawn starts member i's process without waiting for it to serve.
func (e *ZooKeeperEnsemble) spawn(i int) error {
	if err := e.members[i].spawn(nil); err != nil {
		return fmt.Errorf("member %d: %w", e.members[i].id, err)
	}
	return nil
}

// waitServing waits until member i serves requests (it has joined a
// quorum), or fails when it exits or timeout passes.
func (e *ZooKeeperEnsemble) waitServing(i int, timeout time.Duration) error {
	m := e.members[i]
	p := m.running()
	if p == nil {
		return fmt.Errorf("zookeeper member %d is stopped", m.id)
	}
	if err := waitZKReady(e.Addr(i), p, timeout); err != nil {
		return fmt.Errorf("zookeeper member %d: %w (log: %s)", m.id, err, m.logPath)
	}
	return nil
}

// Start (re)starts member i on its data. It returns once the process runs:
// a member that restarts while its peers lack a quorum serves only once
// one forms, so Start does not wait for that (use WaitServing).
func (e *ZooKeeperEnsemble) Start(i int) error { return e.spawn(i) }

// WaitServing waits until member i serves requests, up to timeout.
func (e *ZooKeeperEnsemble) WaitServing(i int, timeout time.Duration) error {
	return e.waitServing(i, timeout)
}

// Kill kills member i with SIGKILL and waits for it to exit.
func (e *ZooKeeperEnsemble) Kill(i int) { e.members[i].stop(0) }

// Stop stops member i (SIGTERM, then SIGKILL) and waits for it to exit.
func (e *ZooKeeperEnsemble) Stop(i int) { e.members[i].stop(5 * time.Second) }

// Leader returns the index of the member that says it leads ("Mode:
// leader" in its srvr answer), or -1 when none does now.
func (e *ZooKeeperEnsemble) Leader() int {
	for i := range e.members {
		if zkMode(e.Addr(i)) == "leader" {
			return i
		}
	}
	return -1
}

// zkMode returns the Mode line of addr's srvr answer ("leader",
// "follower", "standalone"), or "" when it gives none.
func zkMode(addr string) string {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return ""
	}
	out, _ := io.ReadAll(c)
	for _, line := range strings.Split(string(out), "\n") {
		if mode, ok := strings.CutPrefix(strings.TrimSpace(line), "Mode:"); ok {
			return strings.TrimSpace(mode)
		}
	}
	return ""
}
