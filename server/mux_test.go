package server

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// faultyListener is a listener whose Accept fails with EMFILE ("too many
// open files") on demand: once armed with n faults, the next connection
// that arrives is held back while Accept fails n times, then accepted. That
// is what a process out of file descriptors sees: a pending connection it
// cannot take yet.
type faultyListener struct {
	net.Listener
	t *testing.T

	mu       sync.Mutex
	faults   int      // Accept errors still to return
	injected int      // Accept errors returned
	held     net.Conn // the pending connection, when faults remain
}

var errEMFILE = &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}

func (l *faultyListener) arm(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Logf("faultyListener: the next connection waits behind %d EMFILE errors of Accept", n)
	l.faults = n
}

func (l *faultyListener) injectedErrors() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.injected
}

func (l *faultyListener) fail() (net.Conn, error) {
	l.faults--
	l.injected++
	return nil, errEMFILE
}

func (l *faultyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if l.held != nil {
		defer l.mu.Unlock()
		if l.faults > 0 {
			return l.fail()
		}
		c := l.held
		l.held = nil
		return c, nil
	}
	l.mu.Unlock()
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.faults > 0 {
		l.held = c
		return l.fail()
	}
	return c, nil
}

func (l *faultyListener) Close() error {
	l.mu.Lock()
	if l.held != nil {
		_ = l.held.Close()
		l.held = nil
	}
	l.mu.Unlock()
	return l.Listener.Close()
}

// TestConnMux_AcceptErrorsAreRetried: Accept failing with EMFILE (out of
// file descriptors) no longer closes the API port: the mux pauses (5ms
// doubling), logs, retries, and the waiting connection is served, over
// HTTP and gRPC alike.
func TestConnMux_AcceptErrorsAreRetried(t *testing.T) {
	var fl *faultyListener
	wrap := func(ln net.Listener) net.Listener {
		fl = &faultyListener{Listener: ln, t: t}
		return fl
	}
	listenerHook.Store(&wrap)
	cfg, logs := internalConfig(t)
	s := startInternal(t, cfg)
	listenerHook.Store(nil)

	fl.arm(6) // 5+10+20+40+80+160ms of pauses
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + s.Addr() + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz behind EMFILE errors: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %d", resp.StatusCode)
	}
	if n := fl.injectedErrors(); n != 6 {
		t.Fatalf("%d EMFILE errors injected, want 6", n)
	}
	if out := logs.String(); !strings.Contains(out, "accept failed; retrying") || !strings.Contains(out, "too many open files") {
		t.Errorf("no warning about the Accept error in the log:\n%s", out)
	}

	// And again, for a gRPC connection.
	fl.arm(3)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	g, err := internalClient(t, s.Addr()).Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Ttl: durationpb.New(time.Minute)})
	if err != nil || g.GetFence() == 0 {
		t.Fatalf("gRPC acquire behind EMFILE errors: %v %v", g, err)
	}
	if n := fl.injectedErrors(); n != 9 {
		t.Fatalf("%d EMFILE errors injected, want 9", n)
	}
}
