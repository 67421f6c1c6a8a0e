package testservers

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// EtcdCluster is an etcd cluster of several members started by a test, each
// its own etcd process on loopback.
type EtcdCluster struct {
	t       TB
	bin     string
	members []*etcdMember
	token   string
	gates   *etcdGates // nil unless started with EtcdClusterOptions.Gated
}

// etcdMember is one member of an EtcdCluster.
type etcdMember struct {
	name       string
	dataDir    string
	logPath    string
	clientPort int
	peerPort   int

	mu   sync.Mutex
	proc *Process
}

// EtcdClusterOptions configures StartEtcdClusterWith. The zero value is
// StartEtcdCluster's cluster.
type EtcdClusterOptions struct {
	// Gated puts a peer gate in front of each member's peer port, so that
	// Partition, Isolate and Heal can cut the links between members: each
	// member advertises its gate's URL (a free loopback port, fixed across
	// Restart) as its peer URL, and the gate forwards to the member's real
	// peer port every connection but those of members cut from it (see
	// etcdgate.go for how a gate tells its senders apart). The gates are
	// closed when the test ends. False: members dial each other's peer
	// ports directly, and Partition, Isolate and Heal panic.
	Gated bool

	// gateTap, tests only: see etcdGates.tap.
	gateTap func(to, owner int) io.Writer
}

// StartEtcdCluster starts an etcd cluster of n members (heartbeat 50 ms,
// election timeout 500 ms, as StartEtcd) on free loopback client and peer
// ports, waits until every member answers /health and the cluster has a
// leader, and stops every member by PID when the test ends. Each member's
// data lives in its own temp dir under /dev/shm when that exists (etcd
// fsyncs its WAL on every write; see StartEtcd), else under t.TempDir(). A
// missing etcd binary fails the test with the install command.
func StartEtcdCluster(t TB, n int) *EtcdCluster {
	t.Helper()
	return StartEtcdClusterWith(t, n, EtcdClusterOptions{})
}

// StartEtcdClusterWith is StartEtcdCluster with options: with o.Gated,
// the members' peer links run through gates that Partition, Isolate and
// Heal control. A gate that cannot listen fails the test.
//
// A member that exits before it is healthy (most often a port that
// FreePort found free and another process took before etcd listened on
// it) fails that attempt: its members are stopped and the cluster is
// started again on fresh ports and data dirs, up to startAttempts times in
// all; the test fails with the last attempt's error.
func StartEtcdClusterWith(t TB, n int, o EtcdClusterOptions) *EtcdCluster {
	t.Helper()
	if n < 1 || n > 9 {
		t.Fatalf("testservers: etcd cluster of %d members: want 1 to 9", n)
	}
	bin := Binary(t, "etcd", "apt-get install etcd-server (make test installs it)", "/usr/lib/etcd", "/usr/local/bin")
	const startAttempts = 3
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		var c *EtcdCluster
		if c, err = startEtcdClusterOnce(t, bin, n, o); err == nil {
			return c
		}
		if attempt < startAttempts {
			t.Logf("testservers: etcd cluster of %d, attempt %d of %d: %v; starting it again on fresh ports", n, attempt, startAttempts, err)
		}
	}
	t.Fatalf("testservers: %v", err)
	return nil
}

// beforeEtcdClusterStart, tests only: called with each attempt's cluster
// (ports chosen, nothing started) before its members start.
var beforeEtcdClusterStart func(c *EtcdCluster)

// startEtcdClusterOnce makes one attempt of StartEtcdClusterWith. On an
// error it has stopped every member it started (and closed the gates).
func startEtcdClusterOnce(t TB, bin string, n int, o EtcdClusterOptions) (*EtcdCluster, error) {
	dir := t.TempDir()
	c := &EtcdCluster{t: t, bin: bin, token: fmt.Sprintf("dlocktest-%d", time.Now().UnixNano())}
	for i := range n {
		m := &etcdMember{
			name:       fmt.Sprintf("e%d", i+1),
			dataDir:    filepath.Join(dir, fmt.Sprintf("data-%d", i+1)),
			logPath:    filepath.Join(dir, fmt.Sprintf("etcd-%d.log", i+1)),
			clientPort: FreePort(t),
			peerPort:   FreePort(t),
		}
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			if d, err := os.MkdirTemp("/dev/shm", "dlocktest-etcd-"); err == nil {
				t.Cleanup(func() { os.RemoveAll(d) })
				m.dataDir = d
			}
		}
		c.members = append(c.members, m)
	}
	if o.Gated {
		var targets []string
		for _, m := range c.members {
			targets = append(targets, fmt.Sprintf("127.0.0.1:%d", m.peerPort))
		}
		g, err := startEtcdGates(targets, c.PID, o.gateTap)
		if err != nil {
			t.Fatalf("testservers: %v", err)
		}
		c.gates = g
		t.Cleanup(func() { g.Close() }) // after the members stop (cleanups run last first)
	}
	stopAll := func() {
		for _, m := range c.members {
			m.stop()
		}
	}
	failed := false
	t.Cleanup(func() {
		stopAll()
		if failed {
			return // its logs went with its error
		}
		for _, m := range c.members {
			logTailOnFailure(t, "etcd "+m.name, m.logPath)
		}
	})
	fail := func(err error) (*EtcdCluster, error) {
		failed = true
		stopAll()
		if c.gates != nil {
			c.gates.Close()
		}
		for _, m := range c.members {
			if b, rerr := os.ReadFile(m.logPath); rerr == nil && len(b) > 0 {
				t.Logf("testservers: etcd %s's log (failed start):\n%s", m.name, logTail(string(b), 2000))
			}
		}
		return nil, err
	}
	if beforeEtcdClusterStart != nil {
		beforeEtcdClusterStart(c)
	}
	// Every member must be started before any can become healthy (the
	// first start waits for a quorum).
	for i := range c.members {
		if err := c.start(i, "new"); err != nil {
			return fail(err)
		}
	}
	for i, m := range c.members {
		if err := waitEtcdHealthy(m.clientURL()+"/health", m.process(), 30*time.Second); err != nil {
			return fail(fmt.Errorf("etcd member %d: %w (log: %s)", i+1, err, m.logPath))
		}
	}
	return c, nil
}

func (m *etcdMember) clientURL() string { return fmt.Sprintf("http://127.0.0.1:%d", m.clientPort) }
func (m *etcdMember) peerURL() string   { return fmt.Sprintf("http://127.0.0.1:%d", m.peerPort) }

func (m *etcdMember) process() *Process {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc
}

func (m *etcdMember) stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		m.proc.Stop(5 * time.Second)
		m.proc = nil
	}
}

// start starts member i with --initial-cluster-state state ("new" on the
// first start; ignored by etcd once the data dir holds a member).
func (c *EtcdCluster) start(i int, state string) error {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		return nil
	}
	var initial []string
	for j, o := range c.members {
		initial = append(initial, o.name+"="+c.advertisedPeerURL(j))
	}
	cmd := exec.Command(c.bin,
		"--name", m.name,
		"--data-dir", m.dataDir,
		"--listen-client-urls", m.clientURL(),
		"--advertise-client-urls", m.clientURL(),
		"--listen-peer-urls", m.peerURL(),
		"--initial-advertise-peer-urls", c.advertisedPeerURL(i),
		"--initial-cluster", strings.Join(initial, ","),
		"--initial-cluster-state", state,
		"--initial-cluster-token", c.token,
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--log-level", "warn",
	)
	p, err := StartProcess(cmd, m.logPath)
	if err != nil {
		return fmt.Errorf("start etcd member %s: %w", m.name, err)
	}
	m.proc = p
	return nil
}

// advertisedPeerURL returns the peer URL member i advertises: its gate's,
// or its real peer port's on a cluster without gates.
func (c *EtcdCluster) advertisedPeerURL(i int) string {
	if c.gates != nil {
		return c.gates.URL(i)
	}
	return c.members[i].peerURL()
}

// Len returns the number of members.
func (c *EtcdCluster) Len() int { return len(c.members) }

// Addr returns "127.0.0.1:port" of member i's client endpoint.
func (c *EtcdCluster) Addr(i int) string { return fmt.Sprintf("127.0.0.1:%d", c.members[i].clientPort) }

// URL returns the dlock store URL naming every member,
// "etcd://127.0.0.1:p1,127.0.0.1:p2,...".
func (c *EtcdCluster) URL() string {
	addrs := make([]string, len(c.members))
	for i := range c.members {
		addrs[i] = c.Addr(i)
	}
	return "etcd://" + strings.Join(addrs, ",")
}

// PID returns member i's process id, or 0 when it is stopped.
func (c *EtcdCluster) PID(i int) int {
	if p := c.members[i].process(); p != nil {
		return p.PID()
	}
	return 0
}

// Kill sends SIGKILL to member i and waits for it to exit.
func (c *EtcdCluster) Kill(i int) {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		m.proc.Kill()
		m.proc = nil
	}
}

// Restart starts member i again on its data (after Kill) and waits until
// it answers /health, which it does only with a leader: a member cut from
// a majority by Partition fails it after 30 s.
func (c *EtcdCluster) Restart(i int) error {
	if err := c.start(i, "existing"); err != nil {
		return err
	}
	return waitEtcdHealthy(c.members[i].clientURL()+"/health", c.members[i].process(), 30*time.Second)
}

// Leader returns the index of the member that is the leader now, from each
// member's /metrics (etcd_server_is_leader), or -1 when none says so.
func (c *EtcdCluster) Leader() int {
	hc := &http.Client{Timeout: time.Second}
	for i, m := range c.members {
		if m.process() == nil {
			continue
		}
		resp, err := hc.Get(m.clientURL() + "/metrics")
		if err != nil {
			continue
		}
		buf := new(strings.Builder)
		_, _ = io.Copy(buf, io.LimitReader(resp.Body, 8<<20))
		resp.Body.Close()
		for _, line := range strings.Split(buf.String(), "\n") {
			if strings.HasPrefix(line, "etcd_server_is_leader ") && strings.TrimSpace(strings.TrimPrefix(line, "etcd_server_is_leader ")) == "1" {
				return i
			}
		}
	}
	return -1
}

// Partition cuts both directions of every link between members of
// different groups (indexes into the cluster, 0-based) and restores the
// links within each group; a member in no group is cut from every other.
// A cut link's open connections are closed at once, and its new ones
// closed as they arrive, until Heal or a Partition that joins the two
// members again. The client ports are not touched. It panics on a cluster
// started without EtcdClusterOptions.Gated.
func (c *EtcdCluster) Partition(groups ...[]int) {
	g := c.mustGates("Partition")
	group := make([]int, len(c.members))
	for i := range group {
		group[i] = -1 - i
	}
	for n, ms := range groups {
		for _, i := range ms {
			group[i] = n
		}
	}
	g.partition(group)
}

// Isolate cuts member i from every other member (Partition([]int{i},
// the rest)). It panics on a cluster started without gates.
func (c *EtcdCluster) Isolate(i int) {
	var rest []int
	for j := range c.members {
		if j != i {
			rest = append(rest, j)
		}
	}
	c.Partition([]int{i}, rest)
}

// Heal restores every link between members (Partition of one group of
// all). It panics on a cluster started without gates.
func (c *EtcdCluster) Heal() {
	var all []int
	for i := range c.members {
		all = append(all, i)
	}
	c.Partition(all)
}

// Partitioned reports whether the link between members i and j is cut;
// false on a cluster without gates.
func (c *EtcdCluster) Partitioned(i, j int) bool {
	return c.gates != nil && c.gates.isCut(i, j)
}

func (c *EtcdCluster) mustGates(op string) *etcdGates {
	if c.gates == nil {
		panic("testservers: EtcdCluster." + op + " on a cluster started without EtcdClusterOptions.Gated")
	}
	return c.gates
}
