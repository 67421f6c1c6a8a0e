package server

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// startNode starts a single-voter node and waits until it is ready.
func startNode(t *testing.T) *Server {
	t.Helper()
	s, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// hintOf returns the NOT_LEADER ErrorInfo detail of err, or nil.
func hintOf(err error) *errdetails.ErrorInfo {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == ReasonNotLeader && ei.GetDomain() == ErrorDomain {
			return ei
		}
	}
	return nil
}

func dialNode(t *testing.T, addr string) dlockv1.LockClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return dlockv1.NewLockClient(cc)
}

// TestNotLeader_HintOnEveryTransport: a node that is not ready (here the
// leader made unready, as while it catches up) answers NOT_LEADER with the
// ErrorInfo detail over gRPC (unary and both streams) and with the leader
// field and Dlock-Leader header over HTTP; the hint names the node itself.
func TestNotLeader_HintOnEveryTransport(t *testing.T) {
	s := startNode(t)
	s.ready.Store(false) // stays unready: no new election on a single voter
	c := dialNode(t, s.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()

	check := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "NOT_LEADER") {
			t.Fatalf("%s: %v, want UNAVAILABLE (NOT_LEADER)", what, err)
		}
		ei := hintOf(err)
		if ei == nil {
			t.Fatalf("%s: %v: no NOT_LEADER ErrorInfo detail", what, err)
		}
		if ei.GetMetadata()[MetaLeaderID] != s.cfg.NodeID || ei.GetMetadata()[MetaLeaderAPI] != s.Addr() {
			t.Fatalf("%s: hint %v, want itself (%s at %s)", what, ei.GetMetadata(), s.cfg.NodeID, s.Addr())
		}
	}
	_, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-0001"})
	check("Acquire", err)
	_, err = c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
	check("Inspect", err)
	ss, err := c.Session(ctx)
	if err == nil {
		_, err = ss.Recv()
	}
	check("Session at stream start", err)
	ws, err := c.Wait(ctx)
	if err == nil {
		_ = ws.Send(&dlockv1.AcquireRequest{Key: "k", Owner: "owner-0002"})
		_, err = ws.Recv()
	}
	check("Wait at stream start", err)

	// Watch does not need the leader: it is served, READY first.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wt, err := c.Watch(wctx, &dlockv1.WatchRequest{Session: "session-0001"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := wt.Recv(); err != nil || ev.GetType() != dlockv1.WatchEvent_READY {
		t.Fatalf("Watch on an unready node: %v, %v; want READY", ev, err)
	}

	// HTTP.
	resp, err := http.Post("http://"+s.Addr()+"/v1/acquire", "application/json", strings.NewReader(`{"key":"k"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Code, Reason, Leader, LeaderID string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusServiceUnavailable || body.Reason != ReasonNotLeader || body.Leader != s.Addr() || resp.Header.Get(HeaderLeader) != s.Addr() {
		t.Fatalf("HTTP: %d %+v header %q; want 503 NOT_LEADER leader %s", resp.StatusCode, body, resp.Header.Get(HeaderLeader), s.Addr())
	}
	// Health endpoints answer for this node.
	if r, err := http.Get("http://" + s.Addr() + "/healthz"); err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %v %v", r, err)
	} else {
		r.Body.Close()
	}
	if r, err := http.Get("http://" + s.Addr() + "/readyz"); err != nil || r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz: %v %v, want 503", r, err)
	} else {
		r.Body.Close()
	}
}

// TestGRPCForward_Mechanics forwards calls through one node's forwarder to
// a leader: replies and fences come from the leader, the leader's errors
// keep their code, and a forwarded call reaching a node that is not ready
// is answered NOT_LEADER there, not forwarded again.
func TestGRPCForward_Mechanics(t *testing.T) {
	leader := startNode(t)
	via := startNode(t)
	f := newGRPCForwarder(via)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	r, err := f.forward(ctx, leader.Addr(), dlockv1.Lock_Acquire_FullMethodName, &dlockv1.AcquireRequest{Key: "fw", Owner: "owner-0001", Ttl: durationpb.New(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	g := r.(*dlockv1.AcquireResponse)
	if g.GetFence() == 0 {
		t.Fatalf("grant %v", g)
	}
	if v, ok := leader.fsm.get("fw"); !ok || !v.held || v.grant.fence != g.GetFence() {
		t.Fatalf("leader's table: %+v %v, want fw held with fence %d", v, ok, g.GetFence())
	}
	if _, ok := via.fsm.get("fw"); ok {
		t.Fatal("the forwarding node granted the key itself")
	}
	// The leader's refusal comes back with its code and reason.
	_, err = f.forward(ctx, leader.Addr(), dlockv1.Lock_Acquire_FullMethodName, &dlockv1.AcquireRequest{Key: "fw", Owner: "owner-0002"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), ReasonLockHeld) {
		t.Fatalf("second acquire: %v, want FAILED_PRECONDITION LOCK_HELD", err)
	}
	// Renew, Inspect, Release.
	r, err = f.forward(ctx, leader.Addr(), dlockv1.Lock_Renew_FullMethodName, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "fw", Owner: "owner-0001"}}})
	if err != nil || !r.(*dlockv1.RenewResponse).GetResults()[0].GetOk() {
		t.Fatalf("renew: %v %v", r, err)
	}
	r, err = f.forward(ctx, leader.Addr(), dlockv1.Lock_Inspect_FullMethodName, &dlockv1.InspectRequest{Key: "fw"})
	if err != nil || r.(*dlockv1.InspectResponse).GetInfo().GetFence() != g.GetFence() {
		t.Fatalf("inspect: %v %v", r, err)
	}
	if _, err = f.forward(ctx, leader.Addr(), dlockv1.Lock_Release_FullMethodName, &dlockv1.ReleaseRequest{Key: "fw", Owner: "owner-0001"}); err != nil {
		t.Fatal(err)
	}
	// A forwarded call reaching a node that is not ready: NOT_LEADER with
	// that node's hint, and nothing done.
	stale := startNode(t)
	stale.ready.Store(false)
	_, err = f.forward(ctx, stale.Addr(), dlockv1.Lock_Acquire_FullMethodName, &dlockv1.AcquireRequest{Key: "st", Owner: "owner-0003"})
	if ei := hintOf(err); ei == nil || ei.GetMetadata()[MetaLeaderAPI] != stale.Addr() {
		t.Fatalf("forwarded to an unready node: %v, want NOT_LEADER with its hint", err)
	}
	if _, ok := stale.fsm.get("st"); ok {
		t.Fatal("an unready node served a forwarded call")
	}
	// The mark is what stops it: the interceptor answers before the
	// handler, whatever the node would do otherwise.
	md := metadata.Pairs(mdForwarded, "1")
	via.ready.Store(false)
	_, err = f.unaryInterceptor(metadata.NewIncomingContext(ctx, md), &dlockv1.InspectRequest{Key: "x"},
		&grpc.UnaryServerInfo{FullMethod: dlockv1.Lock_Inspect_FullMethodName}, func(context.Context, any) (any, error) {
			return nil, errors.New("handler ran")
		})
	via.ready.Store(true)
	if hintOf(err) == nil {
		t.Fatalf("forwarded call at an unready node: %v, want NOT_LEADER with hint", err)
	}
	_ = via.Close()
	f.mu.Lock()
	n, closed := len(f.conns), f.closed
	f.mu.Unlock()
	for i := 0; i < 100 && !closed; i++ { // the closing goroutine runs at stop
		time.Sleep(10 * time.Millisecond)
		f.mu.Lock()
		n, closed = len(f.conns), f.closed
		f.mu.Unlock()
	}
	if !closed || n != 0 {
		t.Fatalf("after stop: %d connections, closed %v", n, closed)
	}
}

// TestGRPCForward_WaitCancelReachesLeader: a forwarded acquisition with
// wait queues on the leader; cancelling it at the forwarding node removes
// the queue entry on the leader.
func TestGRPCForward_WaitCancelReachesLeader(t *testing.T) {
	leader := startNode(t)
	via := startNode(t)
	f := newGRPCForwarder(via)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := f.forward(ctx, leader.Addr(), dlockv1.Lock_Acquire_FullMethodName, &dlockv1.AcquireRequest{Key: "q", Owner: "holder-001", Ttl: durationpb.New(30 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := f.forward(wctx, leader.Addr(), dlockv1.Lock_Acquire_FullMethodName, &dlockv1.AcquireRequest{Key: "q", Owner: "waiter-001", Wait: true})
		done <- err
	}()
	waiters := func() int {
		v, _ := leader.fsm.get("q")
		return v.waiters
	}
	for waiters() != 1 {
		if ctx.Err() != nil {
			t.Fatal("the forwarded wait never queued on the leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	wcancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled wait: %v, want CANCELED", err)
	}
	for waiters() != 0 {
		if ctx.Err() != nil {
			t.Fatal("the cancelled wait's queue entry stayed on the leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGRPCForward_LeaderUnreachable: a leader whose API refuses
// connections, or accepts them and never answers, yields UNAVAILABLE
// (NOT_LEADER) with the hint within the call's deadline, not a hang.
func TestGRPCForward_LeaderUnreachable(t *testing.T) {
	via := startNode(t)
	f := newGRPCForwarder(via)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	ln.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() { // accept and say nothing
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	for _, tc := range []struct {
		name, addr string
		deadline   time.Duration
	}{{"refused", refused, 5 * time.Second}, {"silent, 1s deadline", silent.Addr().String(), time.Second}, {"silent, no deadline", silent.Addr().String(), 0}} {
		ctx := t.Context()
		if tc.deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, tc.deadline)
			defer cancel()
		}
		start := time.Now()
		_, err := f.forward(ctx, tc.addr, dlockv1.Lock_Inspect_FullMethodName, &dlockv1.InspectRequest{Key: "k"})
		took := time.Since(start)
		if status.Code(err) != codes.Unavailable || hintOf(err) == nil {
			t.Fatalf("%s: %v, want UNAVAILABLE with the hint", tc.name, err)
		}
		limit := tc.deadline
		if limit == 0 {
			limit = forwardDialTimeout + time.Second
		}
		if took >= limit {
			t.Fatalf("%s: answered after %v, want within %v", tc.name, took, limit)
		}
		t.Logf("%s: %v after %v", tc.name, err, took.Round(time.Millisecond))
	}
}

// TestHTTPForward_Mechanics forwards JSON requests through one node's
// HTTP forwarder to a leader, and checks the body limit applies before
// forwarding.
func TestHTTPForward_Mechanics(t *testing.T) {
	leader := startNode(t)
	via := startNode(t)
	f := newHTTPForwarder(via, http.NewServeMux())

	post := func(path, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "http://"+via.Addr()+path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		f.forward(w, r, leader.Addr())
		return w
	}
	w := post("/v1/acquire", `{"key":"h","owner":"owner-0001","ttl":"10s"}`)
	var g struct {
		Fence string `json:"fence"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &g); w.Code != http.StatusOK || err != nil || g.Fence == "" {
		t.Fatalf("acquire: %d %s", w.Code, w.Body)
	}
	if v, ok := leader.fsm.get("h"); !ok || !v.held {
		t.Fatal("the leader does not hold the key")
	}
	w = post("/v1/acquire", `{"key":"h","owner":"owner-0002"}`)
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), ReasonLockHeld) {
		t.Fatalf("second acquire: %d %s, want 409 LOCK_HELD", w.Code, w.Body)
	}
	r := httptest.NewRequest(http.MethodGet, "http://"+via.Addr()+"/v1/inspect?key=h", nil)
	w = httptest.NewRecorder()
	f.forward(w, r, leader.Addr())
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), g.Fence) {
		t.Fatalf("inspect: %d %s", w.Code, w.Body)
	}
	w = post("/v1/release", `{"key":"h","owner":"owner-0001"}`)
	if w.Code != http.StatusOK {
		t.Fatalf("release: %d %s", w.Code, w.Body)
	}
	big := `{"key":"h","holder":"` + strings.Repeat("x", via.cfg.MaxRequestBytes) + `"}`
	w = post("/v1/acquire", big)
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("too large: %d %s, want 413", w.Code, w.Body)
	}
	// An unreachable leader: 503 NOT_LEADER with the leader field.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	r = httptest.NewRequest(http.MethodPost, "http://"+via.Addr()+"/v1/inspect", strings.NewReader(`{"key":"h"}`))
	w = httptest.NewRecorder()
	f.forward(w, r, dead)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), `"leader"`) {
		t.Fatalf("unreachable: %d %s, want 503 with leader", w.Code, w.Body)
	}
}
