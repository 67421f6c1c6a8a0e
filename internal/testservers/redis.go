package testservers

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// redisInstallHint is shown when redis-server is missing.
const redisInstallHint = "apt-get install redis-server (make test installs it)"

// redisReadyTimeout bounds how long StartRedis and Redis.Start wait for the
// server to answer PING (it answers -LOADING while it replays its AOF).
const redisReadyTimeout = 15 * time.Second

// Redis is a redis-server process started by a test: listening on
// 127.0.0.1 on a port chosen once, with its data (an append-only file,
// appendfsync everysec, no RDB snapshots) in a directory of t.TempDir().
// Stop and Start take it down and bring it back on the same port with the
// same data. All methods are safe for concurrent use.
type Redis struct {
	bin  string
	port int
	dir  string
	log  string

	cluster bool // cluster-enabled, one node owning every slot

	mu   sync.Mutex
	proc *Process
}

// StartRedis starts a redis-server for t and waits until it answers PING.
// It fails the test when redis-server is missing (with the command that
// installs it) or does not start. The server is stopped by PID in
// t.Cleanup; its log is printed when the test failed.
func StartRedis(t TB) *Redis {
	t.Helper()
	return startRedis(t, false)
}

// StartRedisCluster starts a redis-server in cluster mode as a one-node
// Redis Cluster that owns all 16384 slots, so cluster-only rules (every key
// of a command or script in one slot, or CROSSSLOT) apply. It is otherwise
// like StartRedis; Stop and Start keep the cluster configuration.
func StartRedisCluster(t TB) *Redis {
	t.Helper()
	return startRedis(t, true)
}

func startRedis(t TB, cluster bool) *Redis {
	t.Helper()
	r := &Redis{
		cluster: cluster,
		bin:     Binary(t, "redis-server", redisInstallHint, "/usr/bin", "/usr/local/bin", "/usr/sbin"),
		port:    FreePort(t),
		dir:     t.TempDir(),
	}
	r.log = filepath.Join(r.dir, "redis.log")
	t.Cleanup(func() {
		r.Kill()
		if t.Failed() {
			if b, err := os.ReadFile(r.log); err == nil {
				t.Logf("redis-server %s log:\n%s", r.Addr(), logTail(string(b), 4000))
			}
		}
	})
	if err := r.Start(); err != nil {
		t.Fatalf("testservers: %v", err)
	}
	return r
}

// StartRedisN starts n independent redis-servers (for Redlock), each as
// StartRedis does.
func StartRedisN(t TB, n int) []*Redis {
	t.Helper()
	rs := make([]*Redis, n)
	for i := range rs {
		rs[i] = StartRedis(t)
	}
	return rs
}

// redisReplicaTimeout bounds how long StartRedisReplica waits for the
// replica's link to its primary to come up.
const redisReplicaTimeout = 15 * time.Second

// StartRedisReplica starts a redis-server as StartRedis does, makes it a
// replica of primary (REPLICAOF 127.0.0.1 <primary port>) and waits, up to
// 15 s, until INFO replication on it shows master_link_status:up. It fails
// t otherwise. The replica is read-only (redis's default) until it is sent
// REPLICAOF NO ONE. Replication is not in its command line: after Stop and
// Start (or Kill and Start) it comes back as a primary with its data, and
// REPLICAOF must be sent again to make it follow.
func StartRedisReplica(t TB, primary *Redis) *Redis {
	t.Helper()
	r := startRedis(t, false)
	if _, err := r.Command("REPLICAOF", "127.0.0.1", Itoa(primary.Port())); err != nil {
		t.Fatalf("testservers: redis-server %s: REPLICAOF %s: %v", r.Addr(), primary.Addr(), err)
	}
	deadline := time.Now().Add(redisReplicaTimeout)
	for {
		info, err := r.Command("INFO", "replication")
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("testservers: redis-server %s: link to primary %s not up after %v: %v\n%s",
				r.Addr(), primary.Addr(), redisReplicaTimeout, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Command sends one command to the server and returns its simple, integer
// or bulk string reply (a nil reply, as GET of a missing key, is ""); an
// error reply is an error. Array replies are not parsed: their element
// count is returned. Each call uses its own connection, with a 2 s
// deadline.
func (r *Redis) Command(args ...string) (string, error) {
	return redisCommand(r.Addr(), args...)
}

// RedisCommand is Redis.Command for the server at addr (host:port).
func RedisCommand(addr string, args ...string) (string, error) {
	return redisCommand(addr, args...)
}

// Addr returns "127.0.0.1:port".
func (r *Redis) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

// URL returns "redis://127.0.0.1:port".
func (r *Redis) URL() string { return "redis://" + r.Addr() }

// Port returns the TCP port.
func (r *Redis) Port() int { return r.port }

// Dir returns the data directory.
func (r *Redis) Dir() string { return r.dir }

// PID returns the process id of the running server, or 0 when it is stopped.
func (r *Redis) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return 0
	}
	return r.proc.PID()
}

// Start starts the server when it is stopped, on the same port with the same
// data directory, and waits until it answers PING. Starting a running
// server is a no-op. It returns an error (with the log's tail) when the
// server does not come up.
func (r *Redis) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		select {
		case <-r.proc.Exited():
		default:
			return nil
		}
	}
	args := []string{
		"--port", Itoa(r.port),
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--daemonize", "no",
		"--dir", r.dir,
		"--appendonly", "yes",
		"--appendfsync", "everysec",
		"--save", "",
		"--logfile", "",
		"--loglevel", "warning",
		"--enable-debug-command", "local",
		// A replica (StartRedisReplica) syncs at once, not after 5 s.
		"--repl-diskless-sync-delay", "0",
	}
	if r.cluster {
		args = append(args, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(r.dir, "nodes.conf"))
	}
	p, err := StartProcess(exec.Command(r.bin, args...), r.log)
	if err != nil {
		return fmt.Errorf("start redis-server on %s: %w", r.Addr(), err)
	}
	r.proc = p
	err = waitRedis(r.Addr(), p, redisReadyTimeout)
	if err == nil && r.cluster {
		err = waitRedisCluster(r.Addr(), redisReadyTimeout)
	}
	if err != nil {
		p.Kill()
		b, _ := os.ReadFile(r.log)
		return fmt.Errorf("redis-server on %s: %w\n%s", r.Addr(), err, logTail(string(b), 2000))
	}
	return nil
}

// waitRedisCluster assigns every slot to the node (once; a restarted node
// keeps them in nodes.conf) and waits for cluster_state:ok.
func waitRedisCluster(addr string, timeout time.Duration) error {
	info, err := redisCommand(addr, "CLUSTER", "INFO")
	if err != nil {
		return err
	}
	if strings.Contains(info, "cluster_slots_assigned:0") {
		if _, err := redisCommand(addr, "CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		info, err = redisCommand(addr, "CLUSTER", "INFO")
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not ok after %v: %q %v", timeout, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisCommand sends one command and returns a simple, integer or bulk
// string reply (an error reply is an error).
func redisCommand(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	rd := bufio.NewReader(c)
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case line == "":
		return "", fmt.Errorf("empty reply to %v", args)
	case line[0] == '-':
		return "", fmt.Errorf("%v: %s", args, line[1:])
	case line[0] == '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	default:
		return line[1:], nil
	}
}

// Stop shuts the server down gracefully (SIGTERM, which flushes the AOF;
// SIGKILL after 10 s) and waits for it to exit. The port and the data
// directory are kept for Start. Stopping a stopped server is a no-op; the
// error is always nil (it fits dlocktest.Harness.StopStore).
func (r *Redis) Stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		r.proc.Stop(10 * time.Second)
	}
	return nil
}

// Kill stops the server with SIGKILL, as a crash would: writes of the last
// second that the AOF had not fsynced yet (appendfsync everysec) may be
// lost. Start brings it back.
func (r *Redis) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		r.proc.Kill()
	}
}

// waitRedis waits until the server at addr answers PING with PONG.
func waitRedis(addr string, p *Process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-p.Exited():
			return fmt.Errorf("exited while starting (%v)", p.Cmd.ProcessState)
		default:
		}
		if last = pingRedis(addr); last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %w", timeout, last)
}

// pingRedis sends one inline PING and expects +PONG.
func pingRedis(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// logTail returns the last n bytes of s (a server's log), marked as cut.
func logTail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
