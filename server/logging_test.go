package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// logBuffer collects log output; the server writes while the test reads.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns every JSON line written so far, decoded.
func (l *logBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// find returns the first line with msg whose fields include want.
func (l *logBuffer) find(t *testing.T, msg string, want map[string]any) map[string]any {
	t.Helper()
next:
	for _, m := range l.lines(t) {
		if m["msg"] != msg {
			continue
		}
		for k, v := range want {
			if fmt.Sprint(m[k]) != fmt.Sprint(v) {
				continue next
			}
		}
		return m
	}
	return nil
}

// await waits until a line with msg and the fields of want is logged.
func (l *logBuffer) await(t *testing.T, msg string, want map[string]any) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := l.find(t, msg, want); m != nil {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q with %v; log:\n%s", msg, want, l.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// noWarnings fails the test for every WARN or ERROR line.
func (l *logBuffer) noWarnings(t *testing.T) {
	t.Helper()
	for _, m := range l.lines(t) {
		if lv := m["level"]; lv == "WARN" || lv == "ERROR" {
			t.Errorf("a normal start and run logged %v: %v", lv, m)
		}
	}
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// logTestConfig is a single node on free loopback ports with data in dir,
// logging JSON at level into buf, Raft following that level.
func logTestConfig(t *testing.T, dir string, level slog.Level, buf *logBuffer) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen, cfg.RaftBind, cfg.DataDir = freePortT(t), freePortT(t), dir
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	cfg.CommitTimeout = 5 * time.Millisecond
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.Logger = slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: level}))
	return cfg
}

// startLogged starts a server with cfg, waits until it is ready and closes
// it when the test ends.
func startLogged(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestServer_LogsJSON runs a normal start (and restart) of a single node
// logging JSON at info, hands a key to a waiter and lets a lease expire, and
// checks the lines: Raft's in the same format, the events at info, no
// warning, no owner token.
func TestServer_LogsJSON(t *testing.T) {
	buf := &logBuffer{}
	dir := t.TempDir()
	cfg := logTestConfig(t, dir, slog.LevelInfo, buf)
	s := startLogged(t, cfg)

	buf.await(t, "dlockd listening", map[string]any{"level": "INFO", "listen": s.Addr(), "data": dir})
	buf.await(t, "dlockd: leader and ready", map[string]any{"level": "INFO", "node": "dlockd-1"})
	// Raft's lines arrive through the same handler, named by component.
	buf.await(t, "entering leader state", map[string]any{"level": "INFO", "component": "raft"})
	buf.await(t, "heartbeat timeout reached, starting election", map[string]any{"level": "INFO", "component": "raft"})

	ctx := t.Context()
	const ownerA, ownerB = "owner-a-0123456789", "owner-b-0123456789"
	if _, err := s.acquire(ctx, acquireIn{key: "k", owner: ownerA, holder: "job-a", ttl: time.Minute}, nil, nil); err != nil {
		t.Fatal(err)
	}
	queued := make(chan struct{})
	granted := make(chan error, 1)
	go func() {
		_, err := s.acquire(ctx, acquireIn{key: "k", owner: ownerB, holder: "job-b", ttl: time.Minute, wait: true}, nil,
			func(int) { close(queued) })
		granted <- err
	}()
	<-queued
	if _, err := s.release("k", ownerA); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatal(err)
	}
	h := buf.await(t, "dlockd: key handed to waiter", map[string]any{"level": "INFO", "key": "k", "holder": "job-b"})
	if h["fence"] == nil || h["ttl"] == nil {
		t.Errorf("handoff line without fence or ttl: %v", h)
	}

	if _, err := s.acquire(ctx, acquireIn{key: "e", owner: ownerA, holder: "job-e", ttl: 200 * time.Millisecond}, nil, nil); err != nil {
		t.Fatal(err)
	}
	e := buf.await(t, "dlockd: lease expired", map[string]any{"level": "INFO", "key": "e", "holder": "job-e"})
	if e["fence"] == nil {
		t.Errorf("expiry line without fence: %v", e)
	}
	// A plain release and a plain grant are the holder's own doing: no
	// line at info.
	if m := buf.find(t, "dlockd: request", nil); m != nil {
		t.Errorf("request line at info: %v", m)
	}

	// A normal restart of a single node warns no more than a first start.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	startLogged(t, cfg)
	buf.await(t, "dlockd: leader and ready", nil)
	buf.noWarnings(t)
	for _, m := range buf.lines(t) {
		for k, v := range m {
			if s, ok := v.(string); ok && (strings.Contains(s, ownerA) || strings.Contains(s, ownerB)) {
				t.Errorf("line logs an owner token in %s: %v", k, m)
			}
		}
	}
}

// TestServer_DebugLogsEveryRequest checks the debug line of gRPC calls: one
// per call with method, key, code and duration, and the error of a failed
// call.
func TestServer_DebugLogsEveryRequest(t *testing.T) {
	buf := &logBuffer{}
	s := startLogged(t, logTestConfig(t, t.TempDir(), slog.LevelDebug, buf))
	cc, err := grpc.NewClient("passthrough:///"+s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := dlockv1.NewLockClient(cc)
	ctx := t.Context()
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "dbg", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "dbg", Ttl: durationpb.New(time.Minute)}); err == nil {
		t.Fatal("second acquire of a held key succeeded")
	}
	ok := buf.await(t, "dlockd: request", map[string]any{"level": "DEBUG", "method": "Acquire", "key": "dbg", "code": "OK"})
	if _, has := ok["duration"]; !has {
		t.Errorf("request line without duration: %v", ok)
	}
	held := buf.await(t, "dlockd: request", map[string]any{"level": "DEBUG", "method": "Acquire", "key": "dbg", "code": "FailedPrecondition"})
	if e, _ := held["err"].(string); !strings.Contains(e, "LOCK_HELD") {
		t.Errorf("failed request's line: err %q, want the LOCK_HELD error", e)
	}
	buf.noWarnings(t)
}

// TestServer_RemovesInterruptedSnapshots plants the directory of a snapshot
// whose writing was interrupted, starts the server, and checks that it is
// gone, logged at info, and that Raft did not warn about it.
func TestServer_RemovesInterruptedSnapshots(t *testing.T) {
	buf := &logBuffer{}
	dir := t.TempDir()
	tmp := filepath.Join(dir, "snapshots", "2-15-1700000000000.tmp")
	if err := os.MkdirAll(tmp, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "state.bin"), []byte("half a snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(dir, "snapshots", "notes.tmp") // a file, not a snapshot directory
	if err := os.WriteFile(keep, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	startLogged(t, logTestConfig(t, dir, slog.LevelInfo, buf))
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("interrupted snapshot %s still there: %v", tmp, err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("file %s removed: %v", keep, err)
	}
	buf.await(t, "dlockd: removed interrupted snapshot", map[string]any{"level": "INFO", "path": tmp})
	buf.await(t, "dlockd: leader and ready", nil)
	buf.noWarnings(t)
}

// TestHclogSlog maps hclog's levels, names, implied arguments and
// overrides onto a slog handler.
func TestHclogSlog(t *testing.T) {
	buf := &logBuffer{}
	h := slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})

	l := newHclogSlog(h, "raft", "")
	if l.IsDebug() || !l.IsInfo() || l.GetLevel() != hclog.Info {
		t.Errorf("following an info handler: IsDebug %v IsInfo %v GetLevel %v", l.IsDebug(), l.IsInfo(), l.GetLevel())
	}
	l.Debug("hidden")
	l.Named("snapshot").With("id", "x").Warn("w", "n", 3, "f", hclog.Fmt("%02d", 7), "odd")
	l.Error("e", "err", fmt.Errorf("boom"))
	l.Info("s", "node", stringer{n: 1}, "d", time.Second)
	l.StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true}).Write([]byte("[ERR] from std\n"))
	if buf.find(t, "hidden", nil) != nil {
		t.Error("debug line passed an info handler")
	}
	w := buf.find(t, "w", map[string]any{"level": "WARN", "component": "raft.snapshot", "id": "x", "n": 3, "f": "07", "EXTRA_VALUE_AT_END": "odd"})
	if w == nil {
		t.Errorf("warn line: %s", buf)
	}
	if buf.find(t, "e", map[string]any{"level": "ERROR", "err": "boom"}) == nil {
		t.Errorf("error line: %s", buf)
	}
	if buf.find(t, "s", map[string]any{"node": "node 1", "d": float64(time.Second)}) == nil {
		t.Errorf("a struct with a String method is its string, a duration stays one: %s", buf)
	}
	if buf.find(t, "from std", map[string]any{"level": "ERROR"}) == nil {
		t.Errorf("standard writer line: %s", buf)
	}

	// The heartbeat warning of a node that never had a leader (every
	// start) is info; after losing a known leader it stays a warning.
	l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
	l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "127.0.0.1:1", "last-leader-id", "n2")
	if buf.find(t, "heartbeat timeout reached, starting election", map[string]any{"level": "INFO", "last-leader-id": ""}) == nil ||
		buf.find(t, "heartbeat timeout reached, starting election", map[string]any{"level": "WARN", "last-leader-id": "n2"}) == nil {
		t.Errorf("heartbeat warnings: %s", buf)
	}

	// An override decides alone, below or above the handler's level.
	over := newHclogSlog(h, "raft", "debug")
	if !over.IsDebug() || over.IsTrace() || over.GetLevel() != hclog.Debug {
		t.Errorf("override debug: IsDebug %v IsTrace %v GetLevel %v", over.IsDebug(), over.IsTrace(), over.GetLevel())
	}
	over.Debug("shown by override")
	if buf.find(t, "shown by override", map[string]any{"level": "DEBUG"}) == nil {
		t.Errorf("override debug line: %s", buf)
	}
	over.SetLevel(hclog.Error)
	over.Named("x").Warn("quiet by override")
	if buf.find(t, "quiet by override", nil) != nil {
		t.Error("warn line passed an error override (SetLevel must reach derived loggers)")
	}
	over.SetLevel(hclog.NoLevel)
	if over.GetLevel() != hclog.Info {
		t.Errorf("after SetLevel(NoLevel): GetLevel %v, want the handler's info", over.GetLevel())
	}
}

// stringer is a struct JSON would encode as {}, with a String method.
type stringer struct{ n int }

func (s stringer) String() string { return fmt.Sprintf("node %d", s.n) }

// BenchmarkUnaryInterceptor_Overhead measures what the metrics and the
// debug-log check add to every unary call at the default level (info): no
// allocation, a couple of hundred nanoseconds.
func BenchmarkUnaryInterceptor_Overhead(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Logger = slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	req := &dlockv1.AcquireRequest{Key: "k"}
	info := &grpc.UnaryServerInfo{FullMethod: dlockv1.Lock_Acquire_FullMethodName}
	h := func(context.Context, any) (any, error) { return nil, nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.metrics.unaryInterceptor(ctx, req, info, h)
	}
}

// TestServer_RequestDone: the helper of the HTTP handlers and Session's
// calls counts and times the call under the RPC's name and its transport,
// and logs it at debug with its key.
func TestServer_RequestDone(t *testing.T) {
	buf := &logBuffer{}
	cfg := logTestConfig(t, t.TempDir(), slog.LevelDebug, buf)
	s, err := New(cfg) // not started: the helper needs only the metrics and the logger
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	start := time.Now().Add(-3 * time.Millisecond)
	s.requestDone(transportHTTP, "cancel-wait", keyOf(&dlockv1.CancelWaitRequest{Key: "h"}), nil, start)
	s.requestDone(transportSession, methodAcquire, keyOf(&dlockv1.SessionRequest{Call: &dlockv1.SessionRequest_Acquire{
		Acquire: &dlockv1.AcquireRequest{Key: "s"}}}), apiErr(codes.FailedPrecondition, ReasonLockHeld, "held"), start)

	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, lp.GetName()+"="+lp.GetValue())
			}
			k := mf.GetName() + "{" + strings.Join(ls, ",") + "}"
			switch {
			case m.Counter != nil:
				got[k] = m.GetCounter().GetValue()
			case m.Histogram != nil:
				got[k] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	for k, min := range map[string]float64{
		"dlockd_requests_total{code=OK,method=CancelWait,transport=http}":                 1,
		"dlockd_requests_total{code=FailedPrecondition,method=Acquire,transport=session}": 1,
		"dlockd_request_duration_seconds{method=CancelWait,transport=http}":               0.003,
		"dlockd_request_duration_seconds{method=Acquire,transport=session}":               0.003,
	} {
		if got[k] < min {
			t.Errorf("%s = %v, want >= %v", k, got[k], min)
		}
	}
	buf.await(t, "dlockd: request", map[string]any{"method": "CancelWait", "key": "h", "code": "OK"})
	buf.await(t, "dlockd: request", map[string]any{"method": "Acquire", "key": "s", "code": "FailedPrecondition"})
}

// TestServer_RaftLogger: Raft logs into Config.Logger at its level by
// default, at RaftLogLevel when set, nowhere with "off", and as text into
// RaftLogOutput when set.
func TestServer_RaftLogger(t *testing.T) {
	for _, tc := range []struct {
		name, level string
		output      bool
		want        string // in the server's log or in RaftLogOutput
		wantDebug   bool
	}{
		{name: "follows the logger", want: `"msg":"raft info"`},
		{name: "override", level: "debug", want: `"msg":"raft info"`, wantDebug: true},
		{name: "off", level: "off"},
		{name: "own output", output: true, want: `msg="raft info"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf, out := &logBuffer{}, &logBuffer{}
			cfg := logTestConfig(t, t.TempDir(), slog.LevelInfo, buf)
			cfg.RaftLogLevel = tc.level
			if tc.output {
				cfg.RaftLogOutput = out
			}
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			l := s.raftLogger()
			l.Info("raft info")
			l.Debug("raft debug")
			got := buf.String()
			if tc.output {
				if got != "" {
					t.Errorf("server log got Raft's lines: %s", got)
				}
				got = out.String()
			}
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("log %q, want %q", got, tc.want)
			}
			if strings.Contains(got, "raft debug") != tc.wantDebug {
				t.Errorf("log %q: debug line shown %v, want %v", got, !tc.wantDebug, tc.wantDebug)
			}
		})
	}
}
