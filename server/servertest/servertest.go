// Package servertest starts real dlockd servers for tests: embedded in the
// test process (Embedded) or as the built binary in a subprocess (Process),
// each on free loopback ports with its data in a temporary directory, and
// each able to stop and start again on the same ports and data.
package servertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/server"
)

// FreePort returns a loopback host:port that was free a moment ago.
func FreePort(t testservers.TB) string {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("servertest: free port: %v", err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		// A port closed here can be handed out again by the next call:
		// never return one twice in this process (two servers, or one
		// server's API and Raft ports, would collide).
		if _, dup := handedOut.LoadOrStore(addr, true); !dup {
			return addr
		}
	}
}

// handedOut holds the addresses FreePort returned in this process.
var handedOut sync.Map

// Config returns a server configuration for tests: free loopback ports,
// data in dir, fast Raft timings, Raft and server logs discarded.
func Config(t testservers.TB, dir string) server.Config {
	cfg := server.DefaultConfig()
	cfg.Listen = FreePort(t)
	cfg.RaftBind = FreePort(t)
	cfg.DataDir = dir
	cfg.HeartbeatTimeout = 100 * time.Millisecond
	cfg.ElectionTimeout = 100 * time.Millisecond
	cfg.LeaderLeaseTimeout = 100 * time.Millisecond
	cfg.CommitTimeout = 5 * time.Millisecond
	cfg.RaftLogLevel = "off"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.ShutdownTimeout = 5 * time.Second
	return cfg
}

// Embedded is a dlockd running in the test process.
type Embedded struct {
	t   testservers.TB
	Cfg server.Config

	mu  sync.Mutex
	srv *server.Server
}

// StartEmbedded starts a server with cfg (see Config), waits until it is
// ready, and stops it when the test ends.
func StartEmbedded(t testservers.TB, cfg server.Config) *Embedded {
	t.Helper()
	e := &Embedded{t: t, Cfg: cfg}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	return e
}

// Addr returns host:port of the API.
func (e *Embedded) Addr() string { return e.Cfg.Listen }

// Server returns the running server, or nil when stopped.
func (e *Embedded) Server() *server.Server {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.srv
}

// Start starts the server (again) on the same ports and data, and waits
// until it is ready.
func (e *Embedded) Start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		return nil
	}
	srv, err := server.New(e.Cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = srv.Start()
		if err == nil {
			break
		}
		// The port may still be held by a connection of the previous run.
		if time.Now().After(deadline) {
			return fmt.Errorf("servertest: start: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
		if srv, err = server.New(e.Cfg); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.WaitReady(ctx); err != nil {
		_ = srv.Close()
		return err
	}
	e.srv = srv
	return nil
}

// Stop shuts the server down gracefully. Stopping a stopped server returns
// nil.
func (e *Embedded) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv == nil {
		return nil
	}
	err := e.srv.Close()
	e.srv = nil
	return err
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
	buildDir  string
)

// Binary builds cmd/dlockd once per test binary and returns its path. The
// build directory is removed by Cleanup.
func Binary(t testservers.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "dlockd-bin-")
		if buildErr != nil {
			return
		}
		buildPath = filepath.Join(buildDir, "dlockd")
		cmd := exec.Command("go", "build", "-o", buildPath, "github.com/dlock-dev/dlock/cmd/dlockd")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build cmd/dlockd: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// Cleanup removes the binary built by Binary. Call it from TestMain after
// m.Run.
func Cleanup() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

// Process is a dlockd binary running in a subprocess.
type Process struct {
	t        testservers.TB
	bin      string
	Listen   string
	RaftBind string
	DataDir  string
	Args     []string // extra flags
	Log      *os.File // the subprocess's stderr, appended across restarts

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result once
}

// StartProcess builds (once) and starts dlockd on free ports with its data
// in a temporary directory, waits until /readyz answers, and kills it when
// the test ends.
func StartProcess(t testservers.TB, args ...string) *Process {
	t.Helper()
	dir := t.TempDir()
	logf, err := os.Create(filepath.Join(dir, "dlockd.log"))
	if err != nil {
		t.Fatal(err)
	}
	p := &Process{
		t: t, bin: Binary(t), Listen: FreePort(t), RaftBind: FreePort(t),
		DataDir: filepath.Join(dir, "data"), Args: args, Log: logf,
	}
	t.Cleanup(func() {
		_ = p.Kill()
		_ = logf.Close()
	})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	return p
}

// Addr returns host:port of the API.
func (p *Process) Addr() string { return p.Listen }

// PID returns the running process's ID, or 0.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Start starts the process (again) on the same ports and data and waits
// until it is ready.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return nil
	}
	args := append([]string{
		"--listen", p.Listen, "--data", p.DataDir, "--raft-bind", p.RaftBind,
		"--raft-heartbeat-timeout", "100ms", "--raft-election-timeout", "100ms",
		"--raft-leader-lease-timeout", "100ms", "--log-level", "warn",
	}, p.Args...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		cmd := exec.Command(p.bin, args...)
		cmd.Stdout = p.Log
		cmd.Stderr = p.Log
		cmd.SysProcAttr = testservers.ChildAttr(&syscall.SysProcAttr{})
		if err := cmd.Start(); err != nil {
			return err
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		err, gone := waitReady(p.Listen, exited, deadline)
		if err == nil {
			p.cmd = cmd
			p.exited = exited
			return nil
		}
		if !gone {
			_ = cmd.Process.Kill()
			<-exited
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("servertest: dlockd not ready: %w (log: %s)", err, p.Log.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitReady polls /readyz until it answers 200; gone says the process
// exited (and its exit was consumed).
func waitReady(addr string, exited <-chan error, deadline time.Time) (err error, gone bool) {
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("exited: %v", err), true
		default:
		}
		resp, err := client.Get("http://" + addr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil, false
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("timed out"), false
}

// Stop sends SIGTERM to the process by PID and waits for it to exit (a
// graceful shutdown), killing it after 10s. Stopping a stopped process
// returns nil.
func (p *Process) Stop() error { return p.signal(syscall.SIGTERM, 10*time.Second) }

// Kill sends SIGKILL to the process by PID (kill -9) and waits for it to be
// reaped.
func (p *Process) Kill() error { return p.signal(syscall.SIGKILL, 10*time.Second) }

func (p *Process) signal(sig syscall.Signal, grace time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	pid := p.cmd.Process.Pid
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("servertest: kill -%d %d: %w", sig, pid, err)
	}
	var err error
	select {
	case err = <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		err = <-p.exited
		err = fmt.Errorf("servertest: dlockd %d did not stop within %v after signal %d: %v", pid, grace, sig, err)
		p.cmd = nil
		return err
	}
	p.cmd = nil
	if sig == syscall.SIGTERM && err != nil {
		return fmt.Errorf("servertest: dlockd %d exited with %v after SIGTERM", pid, err)
	}
	return nil
}
