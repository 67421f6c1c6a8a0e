// Package testservers starts real store servers (redis-server, postgres,
// etcd, ZooKeeper, ...) for tests: each on a free loopback port, with its
// data in a temp dir, stopped by PID in t.Cleanup. A missing binary fails the
// test with the command that installs it; nothing is skipped.
package testservers

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// TB is the part of testing.TB that this package, gcsfake and
// server/servertest use, so that their servers can be started outside go
// test too (see Harness). *testing.T, *testing.B and *testing.F satisfy it.
type TB interface {
	Cleanup(f func())
	Failed() bool
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Helper()
	Logf(format string, args ...any)
	Setenv(key, value string)
	TempDir() string
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testservers: no free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Binary returns the path of the named server binary, searching PATH and the
// extra directories given (Debian puts some servers outside PATH). When it is
// missing the test fails with installHint, e.g. "apt-get install redis-server
// (or run make test, which installs it)".
func Binary(t TB, name, installHint string, extraDirs ...string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range extraDirs {
		matches, _ := filepath.Glob(filepath.Join(dir, name))
		for _, m := range matches {
			if st, err := os.Stat(m); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return m
			}
		}
	}
	t.Fatalf("testservers: %s not found; install it: %s", name, installHint)
	return ""
}

// WaitTCP waits until addr accepts TCP connections or the timeout passes.
func WaitTCP(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testservers: %s not accepting connections after %v: %w", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ChildAttr sets a's parent-death signal to SIGKILL (Linux's
// PR_SET_PDEATHSIG) and returns it: the server dies with the process that
// started it, even one killed -9, whose cleanups never run. (The signal
// follows the OS thread that forked; the Go runtime keeps its threads
// unless a goroutine exits locked to one, which nothing here does.)
func ChildAttr(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	a.Pdeathsig = syscall.SIGKILL
	return a
}

// Process is a server process started by a test.
type Process struct {
	Cmd  *exec.Cmd
	done chan struct{}
}

// StartProcess starts cmd in its own process group, with its output
// appended to logPath. The process is killed when the process that started
// it dies (ChildAttr), so a test binary or dlock verify killed -9 leaves no
// server running.
func StartProcess(cmd *exec.Cmd, logPath string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = ChildAttr(&syscall.SysProcAttr{Setpgid: true})
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process id.
func (p *Process) PID() int { return p.Cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Stop sends SIGTERM to the process group, then SIGKILL after grace, and
// waits for the process to exit. Stopping a stopped process is a no-op.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		<-p.done
	}
}

// Kill sends SIGKILL to the process group and waits for the exit.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	<-p.done
}

// Itoa is strconv.Itoa, for building command lines.
func Itoa(n int) string { return strconv.Itoa(n) }
