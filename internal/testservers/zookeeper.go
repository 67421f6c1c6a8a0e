package testservers

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

const zkInstallHint = "apt-get install zookeeper (make test installs it)"

// ZooKeeper is a standalone ZooKeeper server started by a test.
type ZooKeeper struct {
	t    TB
	port int
	zkProc
}

// zkBaseConfig is the zoo.cfg every test server and ensemble member
// shares: tickTime 200 ms (sessions as short as 400 ms), loopback only,
// the srvr command for readiness, and forceSync=no (see StartZooKeeper).
const zkBaseConfig = `tickTime=200
clientPortAddress=127.0.0.1
admin.enableServer=false
minSessionTimeout=400
maxSessionTimeout=60000
4lw.commands.whitelist=ruok,srvr
maxClientCnxns=0
forceSync=no
`

// zkProc is one ZooKeeper JVM: how to start it and the running process.
// StartZooKeeper's server and each member of a ZooKeeperEnsemble have one.
type zkProc struct {
	java, cp         string
	main             string // the main class
	cfgPath, logPath string

	mu   sync.Mutex
	proc *Process
}

// pid returns the process id, or 0 when it is stopped.
func (z *zkProc) pid() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.proc == nil {
		return 0
	}
	return z.proc.PID()
}

// spawn starts the JVM, unless it runs; ready, when not nil, is waited
// for (and the process killed when it fails) before spawn returns.
func (z *zkProc) spawn(ready func(*Process) error) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.proc != nil {
		return nil
	}
	cmd := exec.Command(z.java,
		"-Xms16m", "-Xmx256m", "-Xss512k",
		"-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
		"-Djava.net.preferIPv4Stack=true",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
		"-cp", z.cp, z.main, z.cfgPath)
	p, err := StartProcess(cmd, z.logPath)
	if err != nil {
		return fmt.Errorf("start zookeeper: %w", err)
	}
	if ready != nil {
		if err := ready(p); err != nil {
			p.Kill()
			return fmt.Errorf("%w (log: %s)", err, z.logPath)
		}
	}
	z.proc = p
	return nil
}

// stop ends the process: SIGTERM, then SIGKILL after grace (0: SIGKILL at
// once); it waits until the process has exited.
func (z *zkProc) stop(grace time.Duration) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.proc == nil {
		return
	}
	if grace == 0 {
		z.proc.Kill()
	} else {
		z.proc.Stop(grace)
	}
	z.proc = nil
}

// running returns the process, or nil when it is stopped.
func (z *zkProc) running() *Process {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.proc
}

// zkJars lists the jar directories searched for zookeeper.jar (Debian puts
// it in /usr/share/java; its manifest's Class-Path names the dependencies).
var zkJarDirs = []string{"/usr/share/java", "/usr/share/zookeeper", "/usr/share/zookeeper/lib", "/opt/zookeeper/lib"}

// StartZooKeeper starts a standalone ZooKeeper (ZooKeeperServerMain, small
// JVM heap, tickTime 200 ms so sessions can be as short as 400 ms, and
// forceSync=no: the log is written but not fsynced, which survives a
// Stop/Start of the process but not of the machine) on a free
// loopback port with its data in a temp dir, waits until it answers "ruok",
// and stops it by PID when the test ends. A missing java or zookeeper.jar
// fails the test with the install command.
func StartZooKeeper(t TB) *ZooKeeper {
	t.Helper()
	java, cp := zkClasspath(t)
	dir := t.TempDir()
	z := &ZooKeeper{t: t, port: FreePort(t), zkProc: zkProc{
		java: java, cp: cp, main: "org.apache.zookeeper.server.ZooKeeperServerMain",
		cfgPath: filepath.Join(dir, "zoo.cfg"), logPath: filepath.Join(dir, "zookeeper.log"),
	}}
	dataDir := filepath.Join(dir, "data")
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatalf("testservers: %v", err)
	}
	cfg := fmt.Sprintf("%sdataDir=%s\nclientPort=%d\n", zkBaseConfig, dataDir, z.port)
	if err := os.WriteFile(z.cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatalf("testservers: %v", err)
	}
	t.Cleanup(func() {
		z.Stop()
		logTailOnFailure(t, "zookeeper "+z.Addr(), z.logPath)
	})
	if err := z.Start(); err != nil {
		t.Fatalf("testservers: %v", err)
	}
	return z
}

// Addr returns "127.0.0.1:port".
func (z *ZooKeeper) Addr() string { return fmt.Sprintf("127.0.0.1:%d", z.port) }

// URL returns the dlock store URL, "zk://127.0.0.1:port/dlock".
func (z *ZooKeeper) URL() string { return "zk://" + z.Addr() + "/dlock" }

// DataDir returns the server's dataDir (snapshots and transaction log, in
// version-2/): the directory "data" beside zoo.cfg, where StartZooKeeper
// puts it. Its contents may be replaced only while the server is stopped;
// Start then runs ZooKeeper on whatever the directory holds.
func (z *ZooKeeper) DataDir() string { return filepath.Join(filepath.Dir(z.cfgPath), "data") }

// PID returns the server's process id, or 0 when it is stopped.
func (z *ZooKeeper) PID() int { return z.pid() }

// Start (re)starts the server on the same port with the same data and waits
// until it serves requests. Starting a running server is a no-op.
func (z *ZooKeeper) Start() error {
	return z.spawn(func(p *Process) error { return waitZKReady(z.Addr(), p, 30*time.Second) })
}

// Stop stops the server (SIGTERM, then SIGKILL) and waits for it to exit.
// Stopping a stopped server is a no-op.
func (z *ZooKeeper) Stop() { z.stop(5 * time.Second) }

func waitZKReady(addr string, p *Process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		select {
		case <-p.Exited():
			return fmt.Errorf("zookeeper exited during startup")
		default:
		}
		if lastErr = zkServing(addr); lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("zookeeper not ready after %v: %v", timeout, lastErr)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// zkServing asks "srvr", which, unlike "ruok", says whether the server
// serves requests yet (it reports its Mode once it does).
func zkServing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return err
	}
	out, _ := io.ReadAll(c)
	if !strings.Contains(string(out), "Mode:") {
		return fmt.Errorf("srvr answered %q", out)
	}
	return nil
}
