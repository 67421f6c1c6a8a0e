package testservers

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// ConsulVersion is the Consul release scripts/test-deps/consul.sh builds:
// the last one under the MPL-2.0 licence.
const ConsulVersion = "1.16.0"

// consulInstallHint is shown when the Consul binary is missing.
const consulInstallHint = "run make test-deps (or scripts/test-deps/consul.sh, which builds Consul v" + ConsulVersion +
	" from the Go module proxy into ${DLOCK_TEST_CACHE:-$HOME/.cache/dlock-test}/bin/consul-" + ConsulVersion + "; it takes several minutes)"

// ConsulBinary returns the path where scripts/test-deps/consul.sh puts the
// Consul binary: ${DLOCK_TEST_CACHE:-$HOME/.cache/dlock-test}/bin/consul-1.16.0.
func ConsulBinary() string {
	cache := os.Getenv("DLOCK_TEST_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "dlock-test")
	}
	return filepath.Join(cache, "bin", "consul-"+ConsulVersion)
}

// Consul is a single Consul server agent (v1.16.0) started by a test: a
// server with bootstrap_expect 1, Raft and serf on free loopback ports, its
// data in a directory that survives Stop and Start (under /dev/shm when it
// exists, as for etcd: Raft fsyncs each write), DNS and gRPC off, no update
// check. It is not "consul agent -dev": a dev agent keeps Raft in memory, so
// a restart would lose every key and restart Raft indexes (the fences).
// Raft timings are the dev agent's (election timeout 52 ms), and
// session_ttl_min is 100 ms, so that sessions can have the short TTLs of
// the conformance suite. All methods are safe for concurrent use.
type Consul struct {
	bin     string
	dataDir string
	logPath string
	node    string
	http    int
	serfLAN int
	serfWAN int
	server  int

	mu   sync.Mutex
	proc *Process
}

// StartConsul starts a Consul server for t and waits until it has a leader
// and its own node is in the catalog (sessions need it). A missing binary
// fails the test with the install command. The server is stopped by PID in
// t.Cleanup; its log is printed when the test failed.
func StartConsul(t TB) *Consul {
	t.Helper()
	bin := ConsulBinary()
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		t.Fatalf("testservers: consul v%s not found at %s; install it: %s", ConsulVersion, bin, consulInstallHint)
	}
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "dlocktest-consul-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			dataDir = d
		}
	}
	c := &Consul{
		bin: bin, dataDir: dataDir,
		logPath: filepath.Join(dir, "consul.log"),
		node:    "dlocktest",
		http:    FreePort(t), serfLAN: FreePort(t), serfWAN: FreePort(t), server: FreePort(t),
	}
	t.Cleanup(func() {
		c.Kill()
		logTailOnFailure(t, "consul "+c.Addr(), c.logPath)
	})
	// A port found free may be taken by another process before the agent
	// binds it (four ports here, on a machine running other tests): then
	// start again on new ports.
	for attempt := 1; ; attempt++ {
		err := c.Start()
		if err == nil {
			return c
		}
		log, _ := os.ReadFile(c.logPath)
		if attempt == 3 || !strings.Contains(string(log), "address already in use") {
			t.Fatalf("testservers: %v", err)
		}
		t.Logf("testservers: consul could not bind its ports, starting again on new ones: %v", err)
		c.http, c.serfLAN, c.serfWAN, c.server = FreePort(t), FreePort(t), FreePort(t), FreePort(t)
		_ = os.Remove(c.logPath)
		// Raft's configuration names the old server port: start afresh.
		if err := os.RemoveAll(c.dataDir); err != nil {
			t.Fatalf("testservers: %v", err)
		}
	}
}

// Addr returns "127.0.0.1:port" of the HTTP API.
func (c *Consul) Addr() string { return fmt.Sprintf("127.0.0.1:%d", c.http) }

// URL returns the dlock store URL, "consul://127.0.0.1:port/dlock".
func (c *Consul) URL() string { return "consul://" + c.Addr() + "/dlock" }

// PID returns the server's process id, or 0 when it is stopped.
func (c *Consul) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return 0
	}
	return c.proc.PID()
}

// consulHCL is the agent configuration beyond the command-line flags.
const consulHCL = `
disable_update_check = true
disable_anonymous_signature = true
session_ttl_min = "100ms"
ui_config { enabled = false }
ports {
  dns = -1
  grpc = -1
  grpc_tls = -1
  https = -1
}
performance { raft_multiplier = 1 }
consul {
  raft {
    election_timeout = "52ms"
    heartbeat_timeout = "35ms"
    leader_lease_timeout = "20ms"
  }
  server { health_interval = "10ms" }
}
`

// Start (re)starts the server on the same ports with the same data and
// waits until it is ready. Starting a running server is a no-op.
func (c *Consul) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil {
		return nil
	}
	cmd := exec.Command(c.bin, "agent",
		"-server", "-bootstrap-expect=1",
		"-node="+c.node, "-datacenter=dc1",
		"-data-dir="+c.dataDir,
		"-bind=127.0.0.1", "-advertise=127.0.0.1", "-client=127.0.0.1",
		"-http-port="+Itoa(c.http),
		"-serf-lan-port="+Itoa(c.serfLAN),
		"-serf-wan-port="+Itoa(c.serfWAN),
		"-server-port="+Itoa(c.server),
		"-dns-port=-1", "-grpc-port=-1",
		"-log-level=warn",
		"-hcl", consulHCL,
	)
	cmd.Env = append(os.Environ(), "CHECKPOINT_DISABLE=1")
	p, err := StartProcess(cmd, c.logPath)
	if err != nil {
		return fmt.Errorf("start consul: %w", err)
	}
	if err := c.waitReady(p, 30*time.Second); err != nil {
		p.Kill()
		return fmt.Errorf("%w (log: %s)", err, c.logPath)
	}
	c.proc = p
	return nil
}

// waitReady waits until the agent reports a leader and its own node is
// registered in the catalog.
func (c *Consul) waitReady(p *Process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second}
	base := "http://" + c.Addr()
	var last string
	for {
		select {
		case <-p.Exited():
			return fmt.Errorf("consul exited during startup")
		default:
		}
		ok, why := c.ready(hc, base)
		if ok {
			return nil
		}
		last = why
		if time.Now().After(deadline) {
			return fmt.Errorf("consul not ready after %v: %s", timeout, last)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (c *Consul) ready(hc *http.Client, base string) (bool, string) {
	var leader string
	if err := getJSON(hc, base+"/v1/status/leader", &leader); err != nil {
		return false, err.Error()
	}
	if leader == "" {
		return false, "no leader yet"
	}
	var node map[string]any
	if err := getJSON(hc, base+"/v1/catalog/node/"+c.node, &node); err != nil {
		return false, err.Error()
	}
	if node == nil {
		return false, "node not registered yet"
	}
	return true, ""
}

func getJSON(hc *http.Client, url string, out any) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Stop stops the server (SIGTERM, then SIGKILL) and waits for it to exit.
// Stopping a stopped server is a no-op.
func (c *Consul) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return nil
	}
	c.proc.Stop(10 * time.Second)
	c.proc = nil
	return nil
}

// Kill stops the server with SIGKILL (a crash) and waits for it to exit.
func (c *Consul) Kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return
	}
	c.proc.Kill()
	c.proc = nil
}

// Version returns the first line of "consul version" of the binary.
func (c *Consul) Version() (string, error) {
	out, err := exec.Command(c.bin, "version").Output()
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return line, nil
}
