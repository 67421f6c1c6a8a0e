package servertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-dev/dlock/internal/netproxy"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// ClusterOptions configures StartCluster. The zero value is a cluster with
// the timings below, fsync off, and no spare slots.
type ClusterOptions struct {
	// Spares is the number of extra node slots prepared (addresses and
	// proxies on every link) but not started, for nodes that join later
	// (Cluster.Join).
	Spares int
	// HeartbeatTimeout, ElectionTimeout and LeaderLeaseTimeout are the Raft
	// timings of every node. Defaults 300ms, 300ms and 150ms: elections
	// within about a second on a loaded test machine, without the spurious
	// elections of 100ms timings there.
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// SnapshotThreshold, when not 0, is passed as --snapshot-threshold (and
	// SnapshotInterval as --snapshot-interval), so that a test can make
	// nodes snapshot after a few entries.
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	// Sync turns fsync of the Raft log on. Off by default: kill -9 keeps
	// what was written in the page cache, so the fault tests lose nothing
	// by it, and the shared test machine is spared the disk writes.
	Sync bool
	// LogLevel is every node's --log-level. Default "info" (leader changes,
	// Raft's elections), kept in each node's log file.
	LogLevel string
	// TestClock starts every node with --test-clock-offset-file
	// (Node.ClockOffsetFile), so that JumpClock can move its lease clock.
	TestClock bool
	// Args are extra flags for every node.
	Args []string
	// Seed seeds the proxies' random delays. Default: time-based.
	Seed uint64
}

// Cluster is a dlockd cluster of real processes (the binary built by
// Binary) on loopback, made by StartCluster. Every Raft link from node i to
// node j runs through its own netproxy.Proxy (RaftLink(i, j)): node i is
// started with --test-raft-dial-rewrite mapping node j's Raft address to
// that proxy. The same flag maps node j's API address to a proxy of its own
// (ForwardLink(i, j)), for the calls node i forwards to the leader, when
// the server applies the map to those dials. Each node's API is behind a
// proxy too (Node.API), whose address is the node's --advertise: clients
// (URL) and leader hints use it.
//
// Faults: Partition, Heal, Isolate, DelayLinks act on the node-to-node
// proxies; Pause and Resume send SIGSTOP and SIGCONT; Kill sends SIGKILL;
// Stop sends SIGTERM; Restart starts a node again on its ports and data;
// WipeAndRestart removes its data first. Methods are safe for concurrent
// use. Everything (processes by PID, proxies) is stopped when the test
// ends; on failure the tail of every node's log is written to the test log.
type Cluster struct {
	t     testservers.TB
	bin   string
	opts  ClusterOptions
	nodes []*Node
	// raft[i][j] and fwd[i][j] carry node i's Raft dials and forwarded
	// calls to node j (nil for i == j).
	raft, fwd [][]*netproxy.Proxy

	mu  sync.Mutex
	cut map[[2]int]bool // unordered pairs {i<j} partitioned
}

// Node is one member slot of a Cluster.
type Node struct {
	// Index is the node's position in the cluster, from 0; ID its
	// --node-id, "n1" for index 0.
	Index int
	ID    string
	// Addr is the address clients use: the API proxy, also the node's
	// --advertise. Listen is the real API address (the kit's own status
	// queries use it, so that API faults do not blind the test).
	Addr, Listen string
	// RaftAddr is the node's Raft address (--raft-bind), as every member's
	// configuration names it.
	RaftAddr string
	// DataDir is the node's data directory; LogPath its stderr log, kept
	// across restarts.
	DataDir, LogPath string
	// API is the proxy in front of the node's API.
	API *netproxy.Proxy
	// ClockOffsetFile is the node's --test-clock-offset-file, with
	// ClusterOptions.TestClock ("" without); JumpClock writes it.
	ClockOffsetFile string

	c           *Cluster
	mu          sync.Mutex
	cmd         *exec.Cmd
	exited      chan error
	paused      bool
	started     bool          // started at least once (a first start takes its boot flags)
	boot        []string      // the flags of the first start: --initial-cluster or --join
	clockOffset time.Duration // what ClockOffsetFile holds
	logf        *os.File
	// reserved holds the node's two ports (listeners opened by the kit)
	// until its first start, so that no other process takes them in the
	// meantime (a spare node may start minutes after StartCluster).
	reserved []net.Listener
}

// reservePort returns a free loopback host:port and the listener that
// holds it until it is closed.
func reservePort(t testservers.TB) (string, net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("servertest: free port: %v", err)
	}
	return ln.Addr().String(), ln
}

// release closes the node's reserved listeners (just before its process
// binds their ports).
func (nd *Node) release() {
	for _, ln := range nd.reserved {
		_ = ln.Close()
	}
	nd.reserved = nil
}

// Default timings of a cluster; see ClusterOptions.
const (
	DefaultClusterHeartbeat   = 300 * time.Millisecond
	DefaultClusterElection    = 300 * time.Millisecond
	DefaultClusterLeaderLease = 150 * time.Millisecond
)

// StartCluster starts an n-voter cluster (n ≥ 1) of dlockd processes, each
// first started with --initial-cluster naming the n voters, waits until
// every node serves HTTP and one of them is the leader, and stops it all
// when the test ends. It fails the test when the cluster does not come up
// within 30s.
func StartCluster(t testservers.TB, n int, opts ClusterOptions) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("servertest: StartCluster(%d): want at least one node", n)
	}
	if opts.HeartbeatTimeout == 0 {
		opts.HeartbeatTimeout = DefaultClusterHeartbeat
	}
	if opts.ElectionTimeout == 0 {
		opts.ElectionTimeout = DefaultClusterElection
	}
	if opts.LeaderLeaseTimeout == 0 {
		opts.LeaderLeaseTimeout = DefaultClusterLeaderLease
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "info"
	}
	if opts.Seed == 0 {
		opts.Seed = uint64(time.Now().UnixNano())
	}
	// Ports come from FreePort, which closes its listener: another test
	// process may take one before the node binds it. A cluster whose
	// first start hits a taken port is started again on fresh ports.
	for attempt := 1; ; attempt++ {
		c, err := startCluster(t, n, opts)
		if err == nil {
			return c
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("servertest: %v; starting the cluster again on other ports", err)
	}
}

// errPortTaken is returned by a node's first start when one of its ports
// was taken by another process between FreePort and the start.
var errPortTaken = errors.New("a port was taken by another process")

func startCluster(t testservers.TB, n int, opts ClusterOptions) (*Cluster, error) {
	total := n + opts.Spares
	c := &Cluster{t: t, bin: Binary(t), opts: opts, cut: map[[2]int]bool{}}
	dir := t.TempDir()
	for i := 0; i < total; i++ {
		nd := &Node{
			Index: i, ID: fmt.Sprintf("n%d", i+1),
			DataDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1), "data"),
			LogPath: filepath.Join(dir, fmt.Sprintf("n%d.log", i+1)),
			c:       c,
		}
		if opts.TestClock {
			nd.ClockOffsetFile = filepath.Join(dir, fmt.Sprintf("n%d.clock-offset", i+1))
		}
		var api, raft net.Listener
		nd.Listen, api = reservePort(t)
		nd.RaftAddr, raft = reservePort(t)
		nd.reserved = []net.Listener{api, raft}
		nd.API = netproxy.Start(t, nd.Listen, opts.Seed+uint64(i))
		nd.Addr = nd.API.Addr()
		c.nodes = append(c.nodes, nd)
	}
	c.raft = make([][]*netproxy.Proxy, total)
	c.fwd = make([][]*netproxy.Proxy, total)
	for i := range c.nodes {
		c.raft[i] = make([]*netproxy.Proxy, total)
		c.fwd[i] = make([]*netproxy.Proxy, total)
		for j, nj := range c.nodes {
			if i == j {
				continue
			}
			c.raft[i][j] = netproxy.Start(t, nj.RaftAddr, opts.Seed+uint64(1000+i*total+j))
			c.fwd[i][j] = netproxy.Start(t, nj.Listen, opts.Seed+uint64(5000+i*total+j))
		}
	}
	var initial []string
	for _, nd := range c.nodes[:n] {
		initial = append(initial, nd.ID+"="+nd.RaftAddr)
	}
	for _, nd := range c.nodes[:n] {
		nd.boot = []string{"--initial-cluster", strings.Join(initial, ",")}
	}
	// Registered after the proxies' and the temp dir's clean-ups, so it
	// runs before them: processes first.
	t.Cleanup(c.cleanup)
	errs := make(chan error, n)
	for _, nd := range c.nodes[:n] {
		go func() { errs <- nd.start() }()
	}
	var startErr error
	for range n {
		if err := <-errs; err != nil && (startErr == nil || errors.Is(err, errPortTaken)) {
			startErr = err
		}
	}
	if startErr != nil {
		c.stopAll()
		return nil, startErr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.WaitLeader(ctx); err != nil {
		return nil, fmt.Errorf("servertest: cluster of %d: %w", n, err)
	}
	return c, nil
}

// cleanup kills every process by PID and, when the test failed, logs the
// tail of every node's log.
func (c *Cluster) cleanup() {
	c.stopAll()
	if c.t.Failed() {
		c.DumpLogs(60)
	}
}

// stopAll kills every node's process by PID and closes the node logs.
func (c *Cluster) stopAll() {
	for _, nd := range c.nodes {
		_ = nd.signal(syscall.SIGKILL, 10*time.Second)
		nd.mu.Lock()
		nd.release()
		if nd.logf != nil {
			_ = nd.logf.Close()
			nd.logf = nil
		}
		nd.mu.Unlock()
	}
}

// DumpLogs writes the last lines of every node's log to the test log.
func (c *Cluster) DumpLogs(lines int) {
	for _, nd := range c.nodes {
		if _, err := os.Stat(nd.LogPath); err != nil {
			continue
		}
		c.t.Logf("--- %s (%s) last lines of %s:\n%s", nd.ID, nd.Addr, nd.LogPath, logTail(nd.LogPath, lines))
	}
}

// N returns the number of node slots (started or spare).
func (c *Cluster) N() int { return len(c.nodes) }

// Node returns node i (from 0).
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// RaftLink returns the proxy that carries node i's Raft connections to node
// j.
func (c *Cluster) RaftLink(i, j int) *netproxy.Proxy { return c.raft[i][j] }

// ForwardLink returns the proxy that carries node i's forwarded calls to
// node j's API (used when the server maps forwarding dials through
// --test-raft-dial-rewrite).
func (c *Cluster) ForwardLink(i, j int) *netproxy.Proxy { return c.fwd[i][j] }

// URL returns the store URL listing the API proxies of nodes idx (all
// slots, spares included, when idx is empty): dlockd://h1:p1,h2:p2,...
func (c *Cluster) URL(idx ...int) string {
	if len(idx) == 0 {
		for i := range c.nodes {
			idx = append(idx, i)
		}
	}
	addrs := make([]string, len(idx))
	for k, i := range idx {
		addrs[k] = c.nodes[i].Addr
	}
	return "dlockd://" + strings.Join(addrs, ",")
}

// Running returns the indexes of the nodes whose process runs (paused
// ones included).
func (c *Cluster) Running() []int {
	var r []int
	for i, nd := range c.nodes {
		if nd.PID() != 0 {
			r = append(r, i)
		}
	}
	return r
}

// args returns node nd's command line.
func (c *Cluster) args(nd *Node) []string {
	o := c.opts
	a := []string{
		"--node-id", nd.ID, "--listen", nd.Listen, "--advertise", nd.Addr,
		"--data", nd.DataDir, "--raft-bind", nd.RaftAddr,
		"--raft-heartbeat-timeout", o.HeartbeatTimeout.String(),
		"--raft-election-timeout", o.ElectionTimeout.String(),
		"--raft-leader-lease-timeout", o.LeaderLeaseTimeout.String(),
		"--log-level", o.LogLevel,
	}
	if !o.Sync {
		a = append(a, "--unsafe-no-fsync")
	}
	if o.SnapshotThreshold != 0 {
		a = append(a, "--snapshot-threshold", strconv.FormatUint(o.SnapshotThreshold, 10))
	}
	if o.SnapshotInterval != 0 {
		a = append(a, "--snapshot-interval", o.SnapshotInterval.String())
	}
	var rw []string
	for j, nj := range c.nodes {
		if j == nd.Index {
			continue
		}
		rw = append(rw, nj.RaftAddr+"="+c.raft[nd.Index][j].Addr(), nj.Addr+"="+c.fwd[nd.Index][j].Addr())
	}
	if len(rw) > 0 {
		a = append(a, "--test-raft-dial-rewrite", strings.Join(rw, ","))
	}
	if nd.ClockOffsetFile != "" {
		a = append(a, "--test-clock-offset-file", nd.ClockOffsetFile)
	}
	if !nd.started {
		a = append(a, nd.boot...)
	}
	return append(a, o.Args...)
}

// start starts the node's process and waits until its HTTP port answers
// /healthz (not until it is the leader or caught up). A process that
// exits at once (its port still held by the previous run) is started
// again, for up to 20s.
func (nd *Node) start() error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd != nil {
		return nil
	}
	if nd.logf == nil {
		if err := os.MkdirAll(filepath.Dir(nd.LogPath), 0o750); err != nil {
			return err
		}
		f, err := os.OpenFile(nd.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err != nil {
			return fmt.Errorf("servertest: node log: %w", err)
		}
		nd.logf = f
	}
	args := nd.c.args(nd)
	nd.release()
	deadline := time.Now().Add(20 * time.Second)
	for {
		fmt.Fprintf(nd.logf, "=== servertest: start %s: dlockd %s\n", nd.ID, strings.Join(args, " "))
		cmd := exec.Command(nd.c.bin, args...)
		cmd.Stdout = nd.logf
		cmd.Stderr = nd.logf
		cmd.SysProcAttr = testservers.ChildAttr(&syscall.SysProcAttr{}) // dies with the test or dlock verify
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("servertest: start %s: %w", nd.ID, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		err, gone := waitHTTP(nd.Listen, "/healthz", exited, deadline)
		if err == nil {
			nd.cmd, nd.exited, nd.paused, nd.started = cmd, exited, false, true
			return nil
		}
		if !gone {
			_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if !nd.started && gone && logSays(nd.LogPath, "address already in use") {
			return fmt.Errorf("servertest: start %s: %w (log: %s)", nd.ID, errPortTaken, nd.LogPath)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("servertest: %s not serving: %w (log: %s; its last lines:\n%s)", nd.ID, err, nd.LogPath, logTail(nd.LogPath, 15))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitHTTP polls GET path on addr until it answers 200; gone says the
// process exited (and its exit was consumed).
func waitHTTP(addr, path string, exited <-chan error, deadline time.Time) (err error, gone bool) {
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("exited: %v", err), true
		default:
		}
		resp, err := client.Get("http://" + addr + path)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil, false
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("timed out"), false
}

// PID returns the node's process ID, or 0 when it is not running.
func (nd *Node) PID() int {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return 0
	}
	return nd.cmd.Process.Pid
}

// Paused reports whether the node is stopped by Pause.
func (nd *Node) Paused() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.paused
}

// signal sends sig to the running process by PID and waits up to grace
// for it to exit, then kills it. A paused process is continued first so
// that it can act on SIGTERM.
func (nd *Node) signal(sig syscall.Signal, grace time.Duration) error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return nil
	}
	pid := nd.cmd.Process.Pid
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("servertest: kill -%d %s (pid %d): %w", sig, nd.ID, pid, err)
	}
	if nd.paused && sig != syscall.SIGKILL {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	var err error
	select {
	case err = <-nd.exited:
	case <-time.After(grace):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-nd.exited
		err = fmt.Errorf("servertest: %s (pid %d) did not exit within %v after signal %d", nd.ID, pid, grace, sig)
	}
	nd.cmd, nd.exited, nd.paused = nil, nil, false
	if sig == syscall.SIGKILL {
		return nil
	}
	return err
}

// Kill sends SIGKILL to node i (kill -9) and waits until it is reaped.
func (c *Cluster) Kill(i int) error { return c.nodes[i].signal(syscall.SIGKILL, 10*time.Second) }

// Stop sends SIGTERM to node i and waits for its graceful shutdown (it is
// killed after 15s). It returns an error when the process did not exit
// with status 0.
func (c *Cluster) Stop(i int) error { return c.nodes[i].signal(syscall.SIGTERM, 15*time.Second) }

// Restart starts node i again (it must be stopped or killed) on its ports
// and data, with the flags of a restart (no --initial-cluster or --join),
// and waits until it serves HTTP. It does not wait for the node to catch
// up; see WaitCaughtUp or WaitLeader.
func (c *Cluster) Restart(i int) error { return c.nodes[i].start() }

// Join starts spare node i for the first time with --join via node via's
// API address, and waits until it serves HTTP. Whether it became a voter
// is up to the cluster: see Status.
func (c *Cluster) Join(i, via int) error {
	nd := c.nodes[i]
	nd.mu.Lock()
	if nd.started {
		nd.mu.Unlock()
		return fmt.Errorf("servertest: Join(%d): %s was started before; use Restart", i, nd.ID)
	}
	nd.boot = []string{"--join", c.nodes[via].Addr}
	nd.mu.Unlock()
	return nd.start()
}

// WipeAndRestart kills node i, removes its data directory, and starts it
// again with boot as its first-start flags (for example
// "--initial-cluster", ... or "--join", addr; nil: none), as an operator
// who lost a disk and started the member again would. It returns the
// start's error (a node that refuses to start, as it should when it cannot
// rejoin, returns one; its log says why).
func (c *Cluster) WipeAndRestart(i int, boot ...string) error {
	nd := c.nodes[i]
	if err := c.Kill(i); err != nil {
		return err
	}
	if err := os.RemoveAll(nd.DataDir); err != nil {
		return fmt.Errorf("servertest: wipe %s: %w", nd.ID, err)
	}
	nd.mu.Lock()
	nd.started = false
	nd.boot = boot
	nd.mu.Unlock()
	return nd.start()
}

// JumpClock moves node i's lease clock forward by d (backward for a
// negative d) from where earlier jumps left it, by rewriting its
// --test-clock-offset-file; the node reads it within about 10 ms and the
// shift lasts, across restarts, until another jump. It needs
// ClusterOptions.TestClock. It returns the node's new total offset.
func (c *Cluster) JumpClock(i int, d time.Duration) (time.Duration, error) {
	nd := c.nodes[i]
	if nd.ClockOffsetFile == "" {
		return 0, fmt.Errorf("servertest: jump the clock of %s: the cluster was started without TestClock", nd.ID)
	}
	nd.mu.Lock()
	defer nd.mu.Unlock()
	nd.clockOffset += d
	tmp := nd.ClockOffsetFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(nd.clockOffset.String()+"\n"), 0o600); err != nil {
		return 0, fmt.Errorf("servertest: jump the clock of %s: %w", nd.ID, err)
	}
	if err := os.Rename(tmp, nd.ClockOffsetFile); err != nil {
		return 0, fmt.Errorf("servertest: jump the clock of %s: %w", nd.ID, err)
	}
	return nd.clockOffset, nil
}

// Exited returns a channel that receives the exit error of node i's current
// process once (nil when it is not running).
func (c *Cluster) Exited(i int) <-chan error {
	nd := c.nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.exited
}

// Pause stops node i with SIGSTOP (its sockets stay open, it answers
// nothing: a long GC pause or a VM freeze).
func (c *Cluster) Pause(i int) error {
	nd := c.nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return fmt.Errorf("servertest: pause %s: not running", nd.ID)
	}
	if err := syscall.Kill(nd.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("servertest: pause %s: %w", nd.ID, err)
	}
	nd.paused = true
	// SIGSTOP takes effect as each thread reaches the kernel: on a loaded
	// machine a thread could still answer a request sent right after the
	// kill. Return once every thread is stopped.
	waitStopped(nd.cmd.Process.Pid, 2*time.Second)
	return nil
}

// waitStopped waits up to limit until every thread of pid is in state T
// (stopped) in /proc, or pid is gone. Where /proc is missing it returns at
// once.
func waitStopped(pid int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return
		}
		stopped := true
		for _, tk := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, tk.Name()))
			if err != nil {
				continue // the thread ended
			}
			// The state follows the command name in parentheses.
			if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Resume continues node i after Pause with SIGCONT.
func (c *Cluster) Resume(i int) error {
	nd := c.nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return fmt.Errorf("servertest: resume %s: not running", nd.ID)
	}
	if err := syscall.Kill(nd.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		return fmt.Errorf("servertest: resume %s: %w", nd.ID, err)
	}
	nd.paused = false
	return nil
}

// links returns the proxies between nodes i and j, both directions, Raft
// and forwarding.
func (c *Cluster) links(i, j int) []*netproxy.Proxy {
	return []*netproxy.Proxy{c.raft[i][j], c.raft[j][i], c.fwd[i][j], c.fwd[j][i]}
}

// Partition splits the nodes into groups that cannot reach each other:
// every link between nodes of different groups is held (nothing delivered,
// new connections accepted and held, as a network that drops packets) and
// its open connections cut; links inside a group are healed. Nodes in no
// group form one more group together. Clients keep reaching every node's
// API (use Node.API to cut that too). Calls a node forwards to the leader
// cross the partition only through ForwardLink proxies, which the server
// uses only if it maps its forwarding dials through
// --test-raft-dial-rewrite; a server that dials the leader's advertised
// API directly reaches it through the leader's API proxy, as a client
// would.
func (c *Cluster) Partition(groups ...[]int) {
	group := make([]int, len(c.nodes))
	for i := range group {
		group[i] = -1
	}
	for g, ns := range groups {
		for _, i := range ns {
			group[i] = g
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.nodes {
		for j := i + 1; j < len(c.nodes); j++ {
			apart := group[i] != group[j]
			c.setCut(i, j, apart)
		}
	}
}

// setCut holds (and cuts) or heals the links between i and j; c.mu held.
func (c *Cluster) setCut(i, j int, cut bool) {
	k := [2]int{i, j}
	if c.cut[k] == cut {
		return
	}
	for _, p := range c.links(i, j) {
		if cut {
			p.Hold()
			p.Cut()
		} else {
			// Drop what was held: a partition loses packets, it does not
			// deliver them late.
			p.Cut()
			p.Release()
		}
	}
	if cut {
		c.cut[k] = true
	} else {
		delete(c.cut, k)
	}
}

// Isolate cuts node i off from every other node (Partition({i}, rest)).
func (c *Cluster) Isolate(i int) {
	var rest []int
	for j := range c.nodes {
		if j != i {
			rest = append(rest, j)
		}
	}
	c.Partition([]int{i}, rest)
}

// Heal ends every partition: every node-to-node link delivers again
// (bytes held while partitioned are dropped, their connections cut).
func (c *Cluster) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.cut {
		c.setCut(k[0], k[1], false)
	}
}

// Partitioned reports whether the links between i and j are cut.
func (c *Cluster) Partitioned(i, j int) bool {
	if i > j {
		i, j = j, i
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cut[[2]int{i, j}]
}

// DelayLinks delays every chunk on every node-to-node link (both
// directions, Raft and forwarding) by a random duration in [lo, hi];
// DelayLinks(0, 0) removes the delay.
func (c *Cluster) DelayLinks(lo, hi time.Duration) {
	for i := range c.nodes {
		for j := range c.nodes {
			if i == j {
				continue
			}
			for _, p := range []*netproxy.Proxy{c.raft[i][j], c.fwd[i][j]} {
				p.SetDelay(netproxy.Upstream, lo, hi)
				p.SetDelay(netproxy.Downstream, lo, hi)
			}
		}
	}
}

// ClusterStatus is what a node answers on GET /v1/cluster/status, as far as
// the kit reads it.
type ClusterStatus struct {
	// NodeID is the answering node's ID (empty when the answer does not
	// say), LeaderID the leader's ID as it knows it (empty: unknown).
	NodeID, LeaderID string
	// Term is the answering node's current term (0 when not given).
	Term uint64
	// Members are the IDs of the Raft configuration's servers and whether
	// each is a voter.
	Members map[string]bool
	// Raw is the whole JSON answer.
	Raw map[string]any
}

// errNoStatus is returned by Status when the node has no cluster status
// endpoint.
var errNoStatus = errors.New("servertest: no /v1/cluster/status endpoint")

// httpClient is the kit's client for its own queries: short timeouts, no
// redirects followed.
var httpClient = &http.Client{
	Timeout:       2 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// Status asks node i (its real API address, not the proxy) for the cluster
// status as it sees it: members (with each one's own state, which it asks
// them for), leader and term.
func (c *Cluster) Status(ctx context.Context, i int) (ClusterStatus, error) {
	return c.status(ctx, i, false)
}

// LocalStatus is Status with ?local=true: node i's own view (its leader and
// term) and its own entry only, without asking the other members.
func (c *Cluster) LocalStatus(ctx context.Context, i int) (ClusterStatus, error) {
	return c.status(ctx, i, true)
}

func (c *Cluster) status(ctx context.Context, i int, local bool) (ClusterStatus, error) {
	var st ClusterStatus
	path := "/v1/cluster/status"
	if local {
		path += "?local=true"
	}
	body, code, err := c.Do(ctx, i, http.MethodGet, path, nil)
	if err != nil {
		return st, err
	}
	if code == http.StatusNotFound || code == http.StatusMethodNotAllowed {
		return st, errNoStatus
	}
	if code != http.StatusOK {
		return st, fmt.Errorf("servertest: %s cluster status: HTTP %d: %s", c.nodes[i].ID, code, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, &st.Raw); err != nil {
		return st, fmt.Errorf("servertest: %s cluster status: %w: %s", c.nodes[i].ID, err, body)
	}
	st.NodeID = str(st.Raw, "node_id", "self_id", "id", "self", "nodeId")
	st.LeaderID = str(st.Raw, "leader_id", "leaderId", "leader")
	if lm, ok := st.Raw["leader"].(map[string]any); ok && st.LeaderID == "" {
		st.LeaderID = str(lm, "id", "node_id")
	}
	st.Term = num(st.Raw, "term", "current_term")
	st.Members = map[string]bool{}
	if ms, ok := st.Raw["members"].([]any); ok {
		for _, m := range ms {
			mm, ok := m.(map[string]any)
			if !ok {
				continue
			}
			id := str(mm, "id", "node_id")
			voter := true
			if v, ok := mm["voter"].(bool); ok {
				voter = v
			} else if s := str(mm, "suffrage"); s != "" {
				voter = strings.EqualFold(s, "voter")
			}
			if id != "" {
				st.Members[id] = voter
			}
		}
	}
	return st, nil
}

func str(m map[string]any, keys ...string) string {
	for _, k := range keys {
		if s, ok := m[k].(string); ok && s != "" {
			return s
		}
	}
	return ""
}

func num(m map[string]any, keys ...string) uint64 {
	for _, k := range keys {
		switch v := m[k].(type) {
		case float64:
			return uint64(v)
		case string: // protojson writes 64-bit integers as strings
			if n, err := strconv.ParseUint(v, 10, 64); err == nil {
				return n
			}
		}
	}
	return 0
}

// Do sends an HTTP request to node i's real API address with header
// Dlock-No-Forward: 1 (a follower redirects a call it would forward, and
// Do does not follow redirects), and returns the body and status code.
// body, when not nil, is encoded as JSON.
func (c *Cluster) Do(ctx context.Context, i int, method, path string, body any) ([]byte, int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.nodes[i].Listen+path, rd)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Dlock-No-Forward", "1")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return b, resp.StatusCode, err
}

// IndexOf returns the index of the node with ID id, or -1.
func (c *Cluster) IndexOf(id string) int {
	for i, nd := range c.nodes {
		if nd.ID == id {
			return i
		}
	}
	return -1
}

// ErrNoLeader is returned by Leader when no node that answers knows of a
// leader.
var ErrNoLeader = errors.New("servertest: no leader")

// Leader returns the index of the leader: it asks every running, unpaused
// node for its cluster status (each within 500ms) and returns the leader
// named by the answer with the highest term (a deposed leader in a
// minority answers with its old term). Before the status endpoint exists
// it falls back on /readyz, which only the leader answers 200. It returns
// ErrNoLeader when no answer names one.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	type answer struct {
		i     int
		st    ClusterStatus
		err   error
		ready bool
	}
	var run []int
	for i, nd := range c.nodes {
		if nd.PID() != 0 && !nd.Paused() {
			run = append(run, i)
		}
	}
	ch := make(chan answer, len(run))
	for _, i := range run {
		go func() {
			qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			st, err := c.LocalStatus(qctx, i)
			a := answer{i: i, st: st, err: err}
			if errors.Is(err, errNoStatus) {
				_, code, rerr := c.Do(qctx, i, http.MethodGet, "/readyz", nil)
				a.ready = rerr == nil && code == http.StatusOK
			}
			ch <- a
		}()
	}
	best, bestTerm, ready := -1, uint64(0), []int{}
	for range run {
		a := <-ch
		if a.ready {
			ready = append(ready, a.i)
		}
		if a.err != nil || a.st.LeaderID == "" {
			continue
		}
		if li := c.IndexOf(a.st.LeaderID); li >= 0 && (best < 0 || a.st.Term > bestTerm) {
			best, bestTerm = li, a.st.Term
		}
	}
	if best >= 0 {
		return best, nil
	}
	if len(ready) == 1 {
		return ready[0], nil
	}
	if err := ctx.Err(); err != nil {
		return -1, err
	}
	return -1, ErrNoLeader
}

// WaitLeader polls until a leader not in exclude is elected and serves
// writes (its /readyz answers 200), and returns its index. It returns
// ctx's error, wrapped with the last thing it saw, when ctx ends first.
func (c *Cluster) WaitLeader(ctx context.Context, exclude ...int) (int, error) {
	var last error
	for {
		i, err := c.Leader(ctx)
		if err == nil && slices.Contains(exclude, i) {
			err = fmt.Errorf("leader is %s, excluded", c.nodes[i].ID)
		}
		if err == nil {
			qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			_, code, rerr := c.Do(qctx, i, http.MethodGet, "/readyz", nil)
			cancel()
			switch {
			case rerr != nil:
				err = rerr
			case code != http.StatusOK:
				err = fmt.Errorf("%s named leader but /readyz answers %d", c.nodes[i].ID, code)
			default:
				return i, nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("servertest: wait for a leader: %w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TransferLeader asks the leader to hand leadership to node to (to < 0:
// any voter) through POST /v1/cluster/transfer-leader, and returns the
// error of the request (an HTTP status other than 200 included).
func (c *Cluster) TransferLeader(ctx context.Context, to int) error {
	l, err := c.Leader(ctx)
	if err != nil {
		return err
	}
	body := map[string]any{}
	if to >= 0 {
		body["id"] = c.nodes[to].ID
	}
	return c.post(ctx, l, "/v1/cluster/transfer-leader", body)
}

// AddVoter asks the leader to add node i as a voter (POST
// /v1/cluster/add with its ID, Raft and API addresses).
func (c *Cluster) AddVoter(ctx context.Context, i int) error {
	l, err := c.Leader(ctx)
	if err != nil {
		return err
	}
	nd := c.nodes[i]
	return c.post(ctx, l, "/v1/cluster/add", map[string]any{"id": nd.ID, "raft_addr": nd.RaftAddr, "api_addr": nd.Addr})
}

// RemoveServer asks the leader to remove node i from the configuration
// (POST /v1/cluster/remove).
func (c *Cluster) RemoveServer(ctx context.Context, i int) error {
	l, err := c.Leader(ctx)
	if err != nil {
		return err
	}
	return c.post(ctx, l, "/v1/cluster/remove", map[string]any{"id": c.nodes[i].ID})
}

func (c *Cluster) post(ctx context.Context, i int, path string, body any) error {
	b, code, err := c.Do(ctx, i, http.MethodPost, path, body)
	if err != nil {
		return fmt.Errorf("servertest: POST %s to %s: %w", path, c.nodes[i].ID, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("servertest: POST %s to %s: HTTP %d: %s", path, c.nodes[i].ID, code, bytes.TrimSpace(b))
	}
	return nil
}

// WaitMembers polls node i's status until its configuration has exactly
// the voters ids (node indexes), and returns ctx's error when it ends
// first.
func (c *Cluster) WaitMembers(ctx context.Context, voters ...int) error {
	want := map[string]bool{}
	for _, i := range voters {
		want[c.nodes[i].ID] = true
	}
	var last string
	for {
		if l, err := c.Leader(ctx); err == nil {
			if st, err := c.Status(ctx, l); err == nil {
				got := map[string]bool{}
				for id, v := range st.Members {
					if v {
						got[id] = true
					}
				}
				if fmt.Sprint(got) == fmt.Sprint(want) {
					return nil
				}
				last = fmt.Sprint(got)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("servertest: wait for voters %v: %w (last seen %s)", want, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logSays reports whether the file at path contains text.
// logTail returns the last n lines of the file at path (a node's log
// outlives nothing: a harness removes it with its temp dir, so an error
// carries what it said).
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func logSays(path, text string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), text)
}
