package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
)

// syncBuffer is a log destination for one server.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logTo makes the server log at info into buf.
func logTo(buf *syncBuffer) func(*server.Config) {
	return func(c *server.Config) {
		c.Logger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
}

// refusals returns dlockd_limit_refusals_total{limit=...}, 0 when absent.
func refusals(t *testing.T, addr, limit string) int {
	t.Helper()
	v := metric(t, addr, `dlockd_limit_refusals_total{limit="`+limit+`"}`)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("refusals %s: %q", limit, v)
	}
	return n
}

// wantRefused checks that err is RESOURCE_EXHAUSTED with reason.
func wantRefused(t *testing.T, what string, err error, reason string) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "("+reason+")") {
		t.Errorf("%s: %v, want RESOURCE_EXHAUSTED (%s)", what, err, reason)
	}
}

// dialStatic is a gRPC client connection with static 64 KiB flow-control
// windows (no BDP growth), so that a client that does not read pushes back
// on the server as soon as 64 KiB are unread.
func dialStatic(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestLimits_MaxConnections: a connection beyond MaxConnections is closed
// at once (it used to be served however many were open) and counted; once
// a connection closes, its slot serves a new one.
func TestLimits_MaxConnections(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.MaxConnections = 3 })
	var open []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	extra, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = extra.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("4th connection: read %v, want it closed by the server at once", err)
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("4th connection: read %v, want EOF or reset", err)
	}
	for _, c := range open {
		_ = c.Close()
	}
	// The slots free as the server notices the closes.
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	waitFor(t, func() bool {
		resp, err := client.Get("http://" + srv.Addr() + "/healthz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	client.CloseIdleConnections()
	if n := refusals(t, srv.Addr(), "connections"); n < 1 {
		t.Fatalf("connections refused: %d, want at least 1", n)
	}
}

// TestLimits_StreamAndWaitCaps: Session, Wait and Watch streams and waiting
// requests are capped per node: one more is answered RESOURCE_EXHAUSTED
// (HTTP 429) with its reason, counted, and logged at info; a freed slot
// serves again.
func TestLimits_StreamAndWaitCaps(t *testing.T) {
	logs := &syncBuffer{}
	srv := start(t, func(c *server.Config) {
		c.MaxSessionStreams, c.MaxWatchStreams, c.MaxWaitStreams, c.MaxWaitingRequests = 1, 1, 1, 2
		logTo(logs)(c)
	})
	a := srv.Addr()
	c := grpcClient(t, a)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// Watch.
	wctx, wcancel := context.WithCancel(ctx)
	w1, err := c.Watch(wctx, &dlockv1.WatchRequest{Session: "session-1-0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := w1.Recv(); err != nil || ev.GetType() != dlockv1.WatchEvent_READY {
		t.Fatalf("1st Watch: %v %v", ev, err)
	}
	w2, err := c.Watch(ctx, &dlockv1.WatchRequest{Session: "session-2-0123456789"})
	if err == nil {
		_, err = w2.Recv()
	}
	wantRefused(t, "2nd Watch", err, server.ReasonTooManyStreams)
	wcancel()
	waitFor(t, func() bool { // the slot frees when the first stream's handler returns
		w, err := c.Watch(ctx, &dlockv1.WatchRequest{Session: "session-3-0123456789"})
		if err != nil {
			return false
		}
		_, err = w.Recv()
		return err == nil
	})

	// Session.
	s1, err := c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Send(&dlockv1.SessionRequest{Id: 1, Call: &dlockv1.SessionRequest_Acquire{Acquire: &dlockv1.AcquireRequest{Key: "held", Owner: "owner-held-0123456789", Ttl: durationpb.New(time.Minute)}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := s1.Recv(); err != nil || r.GetCode() != 0 {
		t.Fatalf("1st Session: %v %v", r, err)
	}
	s2, err := c.Session(ctx)
	if err == nil {
		_, err = s2.Recv()
	}
	wantRefused(t, "2nd Session", err, server.ReasonTooManyStreams)

	// Wait streams, and waiting requests: the first Wait stream is one of
	// the two waiting requests allowed.
	ws1, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws1.Send(&dlockv1.AcquireRequest{Key: "held", Owner: "owner-w1-0123456789"}); err != nil {
		t.Fatal(err)
	}
	if ev, err := ws1.Recv(); err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED {
		t.Fatalf("1st Wait: %v %v", ev, err)
	}
	ws2, err := c.Wait(ctx)
	if err == nil {
		_ = ws2.Send(&dlockv1.AcquireRequest{Key: "held", Owner: "owner-w2-0123456789"})
		_, err = ws2.Recv()
	}
	wantRefused(t, "2nd Wait stream", err, server.ReasonTooManyStreams)

	uctx, ucancel := context.WithCancel(ctx)
	defer ucancel()
	unaryDone := make(chan error, 1)
	go func() {
		_, err := c.Acquire(uctx, &dlockv1.AcquireRequest{Key: "held", Owner: "owner-u1-0123456789", Wait: true})
		unaryDone <- err
	}()
	waitFor(t, func() bool {
		r, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "held"})
		return err == nil && r.GetWaiters() == 2
	})
	_, err = c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "held", Owner: "owner-u2-0123456789", Wait: true})
	wantRefused(t, "3rd waiting request (gRPC)", err, server.ReasonTooManyWaitingRequests)
	code, m := post(t, a, "/v1/acquire", `{"key":"held","wait":true}`)
	if code != http.StatusTooManyRequests || m["reason"] != server.ReasonTooManyWaitingRequests || m["code"] != "RESOURCE_EXHAUSTED" {
		t.Errorf("3rd waiting request (HTTP): %d %v, want 429 %s", code, m, server.ReasonTooManyWaitingRequests)
	}
	// A try (no wait) is not a waiting request.
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "free", Owner: "owner-t-0123456789"}); err != nil {
		t.Errorf("try while the waits are full: %v", err)
	}
	ucancel()
	if err := <-unaryDone; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled waiter: %v", err)
	}
	// Its slot serves a new wait, which waits (until its deadline).
	waitFor(t, func() bool {
		dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer dcancel()
		_, err := c.Acquire(dctx, &dlockv1.AcquireRequest{Key: "held", Owner: "owner-u3-0123456789", Wait: true})
		return status.Code(err) == codes.DeadlineExceeded
	})

	for _, limit := range []string{"watch_streams", "session_streams", "wait_streams", "waiting_requests"} {
		if n := refusals(t, a, limit); n < 1 {
			t.Errorf("dlockd_limit_refusals_total{limit=%q} = %d, want at least 1", limit, n)
		}
	}
	out := logs.String()
	for _, limit := range []string{"watch_streams", "session_streams", "wait_streams", "waiting_requests"} {
		if !strings.Contains(out, "limit="+limit) {
			t.Errorf("no log line for limit %s", limit)
		}
	}
	// Two waiting requests were refused within 10s: one line only.
	if n := strings.Count(out, "limit=waiting_requests"); n != 1 {
		t.Errorf("%d log lines for limit waiting_requests, want 1 (rate-limited):\n%s", n, out)
	}
}

// TestLimits_StreamsPerConnection: a connection runs at most
// MaxStreamsPerConnection streams at once; grpc-go clients queue the next
// one until a stream ends. Another connection is not affected.
func TestLimits_StreamsPerConnection(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.MaxStreamsPerConnection = 2 })
	c := grpcClient(t, srv.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	watch := func(c dlockv1.LockClient, ctx context.Context, session string) error {
		w, err := c.Watch(ctx, &dlockv1.WatchRequest{Session: session})
		if err != nil {
			return err
		}
		_, err = w.Recv()
		return err
	}
	firstCtx, cancelFirst := context.WithCancel(ctx)
	if err := watch(c, firstCtx, "session-1-0123456789"); err != nil {
		t.Fatal(err)
	}
	if err := watch(c, ctx, "session-2-0123456789"); err != nil {
		t.Fatal(err)
	}
	shortCtx, shortCancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := watch(c, shortCtx, "session-3-0123456789")
	shortCancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("3rd stream on one connection: %v, want it queued by the client until its deadline", err)
	}
	if err := watch(grpcClient(t, srv.Addr()), ctx, "session-4-0123456789"); err != nil {
		t.Fatalf("a stream on another connection: %v", err)
	}
	cancelFirst()
	if err := watch(c, ctx, "session-5-0123456789"); err != nil {
		t.Fatalf("a stream after one ended: %v", err)
	}
}

// TestSession_Backpressure: a client that pipelines many calls on one
// Session stream without reading the answers no longer makes the server
// read them all (it used to start a goroutine per call: 300k calls grew it
// to 1.5 GB): the server stops reading at MaxInflightPerStream calls in
// flight, so its goroutines and memory stay bounded and the client's sends
// block; once the client reads, every call is answered.
func TestSession_Backpressure(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.MaxInflightPerStream = 32 })
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c := dlockv1.NewLockClient(dialStatic(t, srv.Addr()))
	const owner = "owner-pipe-0123456789"
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "pipe", Owner: owner, Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	st, err := c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Let the stream start before the baseline.
	if err := st.Send(&dlockv1.SessionRequest{Id: 0, Call: &dlockv1.SessionRequest_Renew{Renew: &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "pipe", Owner: owner}}}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || r.GetCode() != 0 {
		t.Fatalf("first renew: %v %v", r, err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	base := runtime.NumGoroutine()

	const n = 20000 // 1.2 MB of calls: many times the flow-control windows
	var sent atomic.Int64
	sendDone := make(chan error, 1)
	go func() {
		for i := 1; i <= n; i++ {
			req := &dlockv1.SessionRequest{Id: uint64(i), Call: &dlockv1.SessionRequest_Renew{Renew: &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "pipe", Owner: owner}}}}}
			if err := st.Send(req); err != nil {
				sendDone <- err
				return
			}
			sent.Add(1)
		}
		sendDone <- st.CloseSend()
	}()

	// Await the client's sends being held back, watching the goroutines
	// meanwhile.
	bound := base + 200
	last, still := int64(-1), 0
	deadline := time.Now().Add(30 * time.Second)
	for still < 20 {
		if g := runtime.NumGoroutine(); g > bound {
			t.Fatalf("%d goroutines with %d calls sent, want at most %d (%d before)", g, sent.Load(), bound, base)
		}
		select {
		case err := <-sendDone:
			t.Fatalf("all %d calls sent without the server reading them (%v): no backpressure", n, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the client's sends never stalled")
		}
		if s := sent.Load(); s == last {
			still++
		} else {
			last, still = s, 0
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := refusals(t, srv.Addr(), "session_inflight"); n < 1 {
		t.Errorf("session_inflight pauses: %d, want at least 1", n)
	}
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	if grown := int64(during.HeapAlloc) - int64(before.HeapAlloc); grown > 32<<20 {
		t.Errorf("heap grew by %d MB with %d calls sent, want less than 32 MB", grown>>20, last)
	}
	t.Logf("stalled after %d of %d calls; %d goroutines (%d before)", last, n, runtime.NumGoroutine(), base)

	// Now read: every call is answered, once.
	seen := make([]bool, n+1)
	for range n {
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if id := r.GetId(); id == 0 || id > n || seen[id] || r.GetCode() != 0 {
			t.Fatalf("answer %v", r)
		}
		seen[r.GetId()] = true
	}
	if err := <-sendDone; err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v", err)
	}
}

// TestWatch_BacklogEndsStream: a Watch client that does not read its loss
// events gets its stream ended with RESOURCE_EXHAUSTED (WATCH_BACKLOG_FULL)
// once MaxWatchBacklog events wait, after the events sent so far, rather
// than events being dropped in silence (they used to be, beyond a fixed
// buffer of 1,024 per stream).
func TestWatch_BacklogEndsStream(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.MaxWatchBacklog = 8 })
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c := dlockv1.NewLockClient(dialStatic(t, srv.Addr()))
	const session = "session-backlog-0123456789"
	w, err := c.Watch(ctx, &dlockv1.WatchRequest{Session: session})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := w.Recv(); err != nil || ev.GetType() != dlockv1.WatchEvent_READY {
		t.Fatalf("READY: %v %v", ev, err)
	}
	// 400 leases of the session with long keys and owners (about 650
	// bytes per event: more than the 64 KiB windows and grpc-go's 64 KiB
	// write quota hold) expire at once, and the client does not read.
	const leases = 400
	st, err := c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range leases {
		key := fmt.Sprintf("%03d-%s", i, strings.Repeat("k", 500))
		owner := fmt.Sprintf("%03d-%s", i, strings.Repeat("o", 120))
		if err := st.Send(&dlockv1.SessionRequest{Id: uint64(i + 1), Call: &dlockv1.SessionRequest_Acquire{Acquire: &dlockv1.AcquireRequest{
			Key: key, Owner: owner, Session: session, Ttl: durationpb.New(100 * time.Millisecond)}}}); err != nil {
			t.Fatal(err)
		}
	}
	for range leases {
		if r, err := st.Recv(); err != nil || r.GetCode() != 0 {
			t.Fatalf("acquire: %v %v", r, err)
		}
	}
	_ = st.CloseSend()
	waitFor(t, func() bool { return refusals(t, srv.Addr(), "watch_backlog") >= 1 })
	lost := 0
	for {
		ev, err := w.Recv()
		if err != nil {
			wantRefused(t, "Watch after its backlog overflowed", err, server.ReasonWatchBacklogFull)
			break
		}
		if ev.GetType() != dlockv1.WatchEvent_LOST {
			t.Fatalf("event %v", ev)
		}
		lost++
	}
	if lost == 0 || lost >= leases {
		t.Fatalf("%d LOST events before the end, want some but not all %d", lost, leases)
	}
	t.Logf("%d LOST events, then WATCH_BACKLOG_FULL", lost)
}

// TestWatch_IdleStreamsAreCheap: a Watch stream's event queue is allocated
// as events arrive (each stream used to allocate a 1,024-event channel, 80
// KB, at once): 1,000 idle Watch streams cost well under 20 KB each of
// heap, client and server together.
func TestWatch_IdleStreamsAreCheap(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.MaxStreamsPerConnection = 2000 })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c := grpcClient(t, srv.Addr())
	if _, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "warm-up"}); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	const streams = 1000
	ws := make([]dlockv1.Lock_WatchClient, streams)
	for i := range ws {
		w, err := c.Watch(ctx, &dlockv1.WatchRequest{Session: fmt.Sprintf("session-%04d-0123456789", i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatal(err)
		}
		ws[i] = w
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / streams
	t.Logf("%d bytes of heap per idle Watch stream (client and server)", per)
	if per > 20<<10 {
		t.Fatalf("%d bytes of heap per idle Watch stream, want under 20 KB", per)
	}
	runtime.KeepAlive(ws)
}

// bigRenew is a Session renewal of about 0.9 MB: 1,700 items with 512-byte
// keys that are not held (each answered LEASE_LOST, so its answer is as
// large).
func bigRenew(id uint64) *dlockv1.SessionRequest {
	items := make([]*dlockv1.RenewItem, 1700)
	pad := strings.Repeat("k", 500)
	for i := range items {
		items[i] = &dlockv1.RenewItem{Key: fmt.Sprintf("big-%06d-%s", i, pad), Owner: "owner-big-0123456789"}
	}
	return &dlockv1.SessionRequest{Id: id, Call: &dlockv1.SessionRequest_Renew{Renew: &dlockv1.RenewRequest{Items: items}}}
}

// pipeline sends n copies of req on st (ids 1..n) without reading, counting
// them in sent, then half-closes; the result goes to done.
func pipeline(st dlockv1.Lock_SessionClient, req *dlockv1.SessionRequest, n int, sent *atomic.Int64, done chan<- error) {
	for i := 1; i <= n; i++ {
		r := &dlockv1.SessionRequest{Id: uint64(i), Call: req.GetCall()}
		if err := st.Send(r); err != nil {
			done <- err
			return
		}
		sent.Add(1)
	}
	done <- st.CloseSend()
}

// awaitStall waits until none of sent has moved for 300 ms: every client's
// sends are held back.
func awaitStall(t *testing.T, sent []*atomic.Int64, done []chan error) {
	t.Helper()
	sum := func() (s int64) {
		for _, x := range sent {
			s += x.Load()
		}
		return s
	}
	last, still := int64(-1), 0
	deadline := time.Now().Add(60 * time.Second)
	for still < 30 {
		for i, d := range done {
			select {
			case err := <-d:
				t.Fatalf("stream %d sent all its calls without the server reading them (%v): no backpressure", i, err)
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the clients' sends never stalled")
		}
		if s := sum(); s == last {
			still++
		} else {
			last, still = s, 0
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSession_InflightBytes: four Session streams pipelining 0.9 MB
// renewals without reading the answers no longer grow the server by a
// gigabyte (MaxInflightPerStream counted calls, not bytes: 256 calls of
// 0.9 MB per stream): the node stops reading them once MaxInflightBytes of
// calls are in flight, so its heap stays within the budget (calls and
// their answers) plus one waiting call per stream and slack; once the
// clients read, every call is answered. Streams stalled on the budget end
// with their client or with the server, leaving no goroutine behind.
func TestSession_InflightBytes(t *testing.T) {
	const budget = 8 << 20
	srv := start(t, func(c *server.Config) { c.MaxInflightBytes = budget })
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	req := bigRenew(0)
	const streams, n = 4, 40 // 144 MB of calls, 18 times the budget
	open := func(ctx context.Context) []dlockv1.Lock_SessionClient {
		var sts []dlockv1.Lock_SessionClient
		for range streams {
			st, err := dlockv1.NewLockClient(dialStatic(t, srv.Addr())).Session(ctx)
			if err != nil {
				t.Fatal(err)
			}
			sts = append(sts, st)
		}
		return sts
	}
	sts := open(ctx)
	for _, st := range sts { // let the streams start before the baseline
		if err := st.Send(&dlockv1.SessionRequest{Id: 0, Call: &dlockv1.SessionRequest_Renew{Renew: &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "x", Owner: "owner-big-0123456789"}}}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	base := runtime.NumGoroutine()

	sent := make([]*atomic.Int64, streams)
	done := make([]chan error, streams)
	for i, st := range sts {
		sent[i], done[i] = new(atomic.Int64), make(chan error, 1)
		go pipeline(st, req, n, sent[i], done[i])
	}
	awaitStall(t, sent, done)
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	grown := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	// The budget's calls and their answers, a call waiting for the
	// budget per stream, the clients' blocked sends, and slack.
	limit := int64(2*budget + 2*streams*(1<<20) + 24<<20)
	t.Logf("stalled after %v calls sent; heap %d MB before, %d MB during (+%d MB, limit +%d MB); %d goroutines (%d before)",
		[]int64{sent[0].Load(), sent[1].Load(), sent[2].Load(), sent[3].Load()}, before.HeapAlloc>>20, during.HeapAlloc>>20, grown>>20, limit>>20, runtime.NumGoroutine(), base)
	if grown > limit {
		t.Errorf("heap grew by %d MB, want at most %d MB", grown>>20, limit>>20)
	}
	if r := refusals(t, srv.Addr(), "inflight_bytes") + refusals(t, srv.Addr(), "session_inflight_bytes"); r < 1 {
		t.Errorf("inflight byte pauses: %d, want at least 1", r)
	}

	// Now read: every call is answered, once.
	var wg sync.WaitGroup
	for i, st := range sts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seen := make([]bool, n+1)
			for range n {
				r, err := st.Recv()
				if err != nil {
					t.Errorf("stream %d: %v", i, err)
					return
				}
				if id := r.GetId(); id == 0 || id > n || seen[id] || r.GetCode() != 0 || len(r.GetRenew().GetResults()) != len(req.GetRenew().GetItems()) {
					t.Errorf("stream %d: answer id %d code %d message %q", i, r.GetId(), r.GetCode(), r.GetMessage())
					return
				}
				seen[r.GetId()] = true
			}
			if err := <-done[i]; err != nil {
				t.Errorf("stream %d: send: %v", i, err)
			}
			if _, err := st.Recv(); !errors.Is(err, io.EOF) {
				t.Errorf("stream %d: end: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// Stall them again; end two with their clients, the others with the
	// server: the waits for the budget are abandoned.
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	first, second := open(sctx)[:2], open(ctx)[2:]
	sts = append(first, second...)
	for i, st := range sts {
		sent[i], done[i] = new(atomic.Int64), make(chan error, 1)
		go pipeline(st, req, n, sent[i], done[i])
	}
	awaitStall(t, sent, done)
	scancel()
	for _, st := range first {
		if _, err := st.Recv(); status.Code(err) != codes.Canceled {
			t.Errorf("cancelled stream: %v", err)
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Stop() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("stop: %v", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the server did not stop with Session streams waiting for the byte budget")
	}
	for _, st := range second {
		for {
			if _, err := st.Recv(); err != nil {
				if status.Code(err) != codes.Unavailable {
					t.Errorf("stream at shutdown: %v, want UNAVAILABLE", err)
				}
				break
			}
		}
	}
	for i := range sts {
		<-done[i] // the clients' sends end too
	}
}

// TestLimits_SessionCallRate: a Session stream's calls are read no faster
// than MaxSessionCallRate allows (here 400 a second: 1 call each 2.5 ms),
// the pacing counted as limit "session_rate"; every call is still
// answered, and another client is not held back. The bound is a lower one
// (the calls cannot be answered sooner than the rate allows), which a
// loaded machine cannot make fail.
func TestLimits_SessionCallRate(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.MaxSessionCallRate = 400 })
	c := grpcClient(t, srv.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-k-0123456789", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	s, err := c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const calls = 400
	start := time.Now()
	go func() {
		for i := range calls {
			_ = s.Send(&dlockv1.SessionRequest{Id: uint64(i + 1), Call: &dlockv1.SessionRequest_Renew{Renew: &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "k", Owner: "owner-k-0123456789"}}}}})
		}
	}()
	// Another client meanwhile: its unary calls are not paced.
	other := time.Now()
	for range 20 {
		if _, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	otherTook := time.Since(other)
	for i := range calls {
		r, err := s.Recv()
		if err != nil || r.GetCode() != 0 || !r.GetRenew().GetResults()[0].GetOk() {
			t.Fatalf("answer %d: %v %v", i, r, err)
		}
	}
	took := time.Since(start)
	// 400 calls at 400 a second: the first is read at once, the last no
	// sooner than 399 × 2.5 ms.
	if min := 399 * 2500 * time.Microsecond; took < min {
		t.Errorf("%d calls answered in %v, sooner than the rate allows (%v)", calls, took, min)
	}
	if n := refusals(t, srv.Addr(), "session_rate"); n < 1 {
		t.Errorf("session_rate counted %d times, want at least 1", n)
	}
	t.Logf("%d paced calls in %v; 20 unary calls of another client meanwhile in %v", calls, took, otherTook)
	_ = s.CloseSend()
}
