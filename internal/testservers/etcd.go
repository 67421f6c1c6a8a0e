package testservers

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// Etcd is a single-member etcd server started by a test.
type Etcd struct {
	t          TB
	bin        string
	dataDir    string
	logPath    string
	clientPort int
	peerPort   int

	mu   sync.Mutex
	proc *Process
}

// StartEtcd starts a single-member etcd (heartbeat 50 ms, election timeout
// 500 ms) on free loopback client and peer ports, waits until it answers
// /health, and stops it by PID when the test ends. Its data lives in a temp
// dir under /dev/shm when that exists (etcd fsyncs every write, ~4 ms on a
// disk, which dominates lock handoffs; tmpfs keeps the data across Stop and
// Start of the process, not of the machine), else in t.TempDir(). A missing
// etcd binary fails the test with the install command.
func StartEtcd(t TB) *Etcd {
	t.Helper()
	bin := Binary(t, "etcd", "apt-get install etcd-server (make test installs it)", "/usr/lib/etcd", "/usr/local/bin")
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		// etcd fsyncs its WAL on every write; on a disk that costs ~4 ms a
		// write. tmpfs makes fsync free while the data still survives a
		// Stop/Start of the process (not of the machine).
		if d, err := os.MkdirTemp("/dev/shm", "dlocktest-etcd-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			dataDir = d
		}
	}
	e := &Etcd{
		t: t, bin: bin,
		dataDir:    dataDir,
		logPath:    filepath.Join(dir, "etcd.log"),
		clientPort: FreePort(t),
		peerPort:   FreePort(t),
	}
	t.Cleanup(func() {
		e.Stop()
		logTailOnFailure(t, "etcd "+e.Addr(), e.logPath)
	})
	if err := e.Start(); err != nil {
		t.Fatalf("testservers: %v", err)
	}
	return e
}

// Addr returns "127.0.0.1:port" of the client endpoint.
func (e *Etcd) Addr() string { return fmt.Sprintf("127.0.0.1:%d", e.clientPort) }

// URL returns the dlock store URL, "etcd://127.0.0.1:port".
func (e *Etcd) URL() string { return "etcd://" + e.Addr() }

// DataDir returns the server's --data-dir (under /dev/shm when it exists,
// see StartEtcd). Its contents may be replaced only while the server is
// stopped; Start then runs etcd on whatever the directory holds.
func (e *Etcd) DataDir() string { return e.dataDir }

// PID returns the server's process id, or 0 when it is stopped.
func (e *Etcd) PID() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proc == nil {
		return 0
	}
	return e.proc.PID()
}

// Start (re)starts the server on the same ports with the same data and waits
// until it is healthy. Starting a running server is a no-op.
func (e *Etcd) Start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proc != nil {
		return nil
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", e.clientPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", e.peerPort)
	cmd := exec.Command(e.bin,
		"--name", "dlocktest",
		"--data-dir", e.dataDir,
		"--listen-client-urls", client,
		"--advertise-client-urls", client,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "dlocktest="+peer,
		"--initial-cluster-state", "new",
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--log-level", "warn",
	)
	p, err := StartProcess(cmd, e.logPath)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	if err := waitEtcdHealthy(client+"/health", p, 20*time.Second); err != nil {
		p.Kill()
		return fmt.Errorf("%w (log: %s)", err, e.logPath)
	}
	e.proc = p
	return nil
}

// Stop stops the server (SIGTERM, then SIGKILL) and waits for it to exit.
// Stopping a stopped server is a no-op.
func (e *Etcd) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proc == nil {
		return
	}
	e.proc.Stop(5 * time.Second)
	e.proc = nil
}

func waitEtcdHealthy(url string, p *Process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: 500 * time.Millisecond}
	for {
		select {
		case <-p.Exited():
			return fmt.Errorf("etcd exited during startup")
		default:
		}
		resp, err := c.Get(url)
		if err == nil {
			ok := resp.StatusCode == http.StatusOK
			resp.Body.Close()
			if ok {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not healthy after %v: %v", timeout, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// logTailOnFailure prints the end of a server's log when the test failed.
func logTailOnFailure(t TB, name, path string) {
	if !t.Failed() {
		return
	}
	if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
		t.Logf("%s log:\n%s", name, logTail(string(b), 4000))
	}
}
