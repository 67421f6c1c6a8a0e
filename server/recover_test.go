package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// The tests of this package that need unexported hooks start servers
// themselves: package servertest imports package server, so they cannot
// use it.

// capturedLogs collects a server's log lines for assertions.
type capturedLogs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *capturedLogs) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *capturedLogs) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// internalConfig is servertest.Config for the tests of this package: free
// loopback ports, data in a temporary directory, fast Raft timings, logs
// (at debug) into the returned buffer.
func internalConfig(tb testing.TB) (Config, *capturedLogs) {
	tb.Helper()
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	logs := &capturedLogs{}
	cfg := DefaultConfig()
	cfg.Listen, cfg.RaftBind, cfg.DataDir = free(), free(), tb.TempDir()
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	cfg.CommitTimeout = 5 * time.Millisecond
	cfg.RaftLogLevel = "off"
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.ShutdownTimeout = 5 * time.Second
	return cfg, logs
}

// startInternal starts a server with cfg, waits until it is ready and
// closes it when the test ends.
func startInternal(tb testing.TB, cfg Config) *Server {
	tb.Helper()
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		tb.Fatal(err)
	}
	return s
}

func internalClient(tb testing.TB, addr string) dlockv1.LockClient {
	tb.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	return dlockv1.NewLockClient(cc)
}

// setPanicHook makes every handler serving one of where panic, until the
// test ends.
func setPanicHook(t *testing.T, where ...string) {
	t.Helper()
	h := func(w string) {
		for _, x := range where {
			if w == x {
				panic("test panic in " + w)
			}
		}
	}
	panicHook.Store(&h)
	t.Cleanup(func() { panicHook.Store(nil) })
}

// TestRecover_HandlerPanics: a panic in a gRPC unary handler, a stream
// handler, a Session call or an HTTP handler fails that call with INTERNAL
// (HTTP 500, reason INTERNAL), is logged with its stack, and the server goes
// on serving.
func TestRecover_HandlerPanics(t *testing.T) {
	cfg, logs := internalConfig(t)
	s := startInternal(t, cfg)
	c := internalClient(t, s.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	setPanicHook(t, dlockv1.Lock_Acquire_FullMethodName, dlockv1.Lock_Watch_FullMethodName, "Session call", "POST /v1/acquire")

	_, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k"})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "(INTERNAL)") {
		t.Errorf("unary: %v, want INTERNAL", err)
	}

	w, err := c.Watch(ctx, &dlockv1.WatchRequest{Session: "session-0123456789"})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.Internal {
		t.Errorf("stream: %v, want INTERNAL", err)
	}

	st, err := c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&dlockv1.SessionRequest{Id: 7, Call: &dlockv1.SessionRequest_Acquire{Acquire: &dlockv1.AcquireRequest{Key: "k"}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil || resp.GetId() != 7 || codes.Code(resp.GetCode()) != codes.Internal {
		t.Errorf("Session call: %v %v, want id 7 INTERNAL", resp, err)
	}
	_ = st.CloseSend()

	hresp, err := http.Post("http://"+s.Addr()+"/v1/acquire", "application/json", strings.NewReader(`{"key":"k"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(hresp.Body)
	_ = hresp.Body.Close()
	var m map[string]string
	_ = json.Unmarshal(body, &m)
	if hresp.StatusCode != http.StatusInternalServerError || m["code"] != "INTERNAL" || m["reason"] != "INTERNAL" {
		t.Errorf("HTTP: %d %s, want 500 INTERNAL", hresp.StatusCode, body)
	}

	out := logs.String()
	for _, where := range []string{dlockv1.Lock_Acquire_FullMethodName, dlockv1.Lock_Watch_FullMethodName, "Session call", "POST /v1/acquire"} {
		if !strings.Contains(out, "where="+where) && !strings.Contains(out, `where="`+where+`"`) {
			t.Errorf("no log line for the panic in %s", where)
		}
	}
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "recover_test.go") {
		t.Errorf("the panic's log line lacks level ERROR or the stack:\n%s", out)
	}

	// The server still serves, by every path.
	panicHook.Store(nil)
	g, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Ttl: durationpb.New(time.Minute)})
	if err != nil || g.GetFence() == 0 {
		t.Fatalf("acquire after the panics: %v %v", g, err)
	}
	hresp, err = http.Get("http://" + s.Addr() + "/v1/inspect?key=k")
	if err != nil {
		t.Fatal(err)
	}
	_ = hresp.Body.Close()
	if hresp.StatusCode != http.StatusOK {
		t.Fatalf("inspect after the panics: %d", hresp.StatusCode)
	}
}

// TestRecover_WaitWorkerPanics: the first part of a Wait stream's
// acquisition of a held key runs on a pooled worker (Server.acquire,
// callPool.do); a panic there
// is raised again in the stream's goroutine, so the stream is answered
// INTERNAL, the log line carries the worker's stack, and the server (and
// the key) go on serving.
func TestRecover_WaitWorkerPanics(t *testing.T) {
	cfg, logs := internalConfig(t)
	s := startInternal(t, cfg)
	c := internalClient(t, s.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// A wait for a held key runs its first part on the worker (a free
	// key's is granted at once, inline).
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-holder-0123456789abcdef", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	setPanicHook(t, "beginAcquire")

	w, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Send(&dlockv1.AcquireRequest{Key: "k", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); status.Code(err) != codes.Internal {
		t.Fatalf("wait: %v, want INTERNAL", err)
	}
	out := logs.String()
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "beginAcquire") || !strings.Contains(out, "callPool") {
		t.Errorf("the panic's log line lacks the worker's stack:\n%s", out)
	}

	panicHook.Store(nil)
	w, err = c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Send(&dlockv1.AcquireRequest{Key: "k", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	ev, err := w.Recv()
	if err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED {
		t.Fatalf("wait after the panic: %v %v, want QUEUED", ev, err)
	}
}

// TestRecover_PanicInOnQueuedLeavesNothing: a panic in acquire's onQueued
// (the QUEUED send of a Wait stream, on a pooled worker), raised again as a
// *workerPanic for the caller's recovery, leaves neither the request's
// wait registration (the owner would be refused DUPLICATE_WAIT on the key
// until the process restarted) nor its queue entry (the key would be
// handed to a request nobody hears) behind. Found by a breaker review.
func TestRecover_PanicInOnQueuedLeavesNothing(t *testing.T) {
	cfg, _ := internalConfig(t)
	s := startInternal(t, cfg)
	c := internalClient(t, s.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const owner = "owner-queued-0123456789abcdef"
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-holder-0123456789abcdef", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if _, ok := recover().(*workerPanic); !ok {
				t.Fatal("no *workerPanic raised in the caller")
			}
		}()
		_, _ = s.acquire(ctx, acquireIn{key: "k", owner: owner, ttl: time.Minute, wait: true}, make(chan struct{}), func(int) {
			panic("test panic in onQueued")
		})
	}()
	if in, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"}); err != nil || in.GetWaiters() != 0 {
		t.Fatalf("after the panic: %v %v, want the key held with no waiter", in, err)
	}
	w, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Send(&dlockv1.AcquireRequest{Key: "k", Owner: owner, Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if ev, err := w.Recv(); err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED {
		t.Fatalf("the same owner waits again: %v %v, want QUEUED", ev, err)
	}
}
