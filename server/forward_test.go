package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
)

// forwardCluster starts 3 nodes, waits for a ready leader whose API
// address every node knows, and returns the nodes, the leader's index and
// a follower's.
func forwardCluster(t *testing.T, edit func(i int, c *server.Config)) (nodes []*node, leader, follower int) {
	t.Helper()
	nodes = startCluster(t, 3, edit)
	leader = waitLeader(t, nodes, -1)
	lid := nodes[leader].cfg.NodeID
	fwWaitFor(t, "the leader's API address known everywhere", func() bool {
		for _, nd := range nodes {
			ok := false
			for _, m := range nd.server().Members() {
				ok = ok || (m.ID == lid && m.APIAddr != "")
			}
			if !ok {
				return false
			}
		}
		return true
	})
	// The leader may have changed meanwhile (a slow machine): take the
	// ready one again.
	leader = waitLeader(t, nodes, -1)
	return nodes, leader, (leader + 1) % 3
}

// fwWaitFor polls cond until it holds, failing the test after 20s.
func fwWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leaderHint returns the NOT_LEADER ErrorInfo metadata of err (nil when
// there is none).
func leaderHint(err error) map[string]string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == server.ReasonNotLeader && ei.GetDomain() == server.ErrorDomain {
			return ei.GetMetadata()
		}
	}
	return nil
}

// TestForward_FollowerServesUnaryGRPC: Acquire, Renew, CheckFence,
// Inspect, List and Release sent to a follower are forwarded: the grant
// and its fence come from the leader.
func TestForward_FollowerServesUnaryGRPC(t *testing.T) {
	nodes, l, f := forwardCluster(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	fc := dlockv1.NewLockClient(dial(t, nodes[f].cfg.Listen))
	lc := dlockv1.NewLockClient(dial(t, nodes[l].cfg.Listen))

	g, err := fc.Acquire(ctx, &dlockv1.AcquireRequest{Key: "fw", Owner: "owner-0001", Ttl: durationpb.New(20 * time.Second), Holder: "via follower"})
	if err != nil {
		t.Fatalf("acquire via follower: %v", err)
	}
	in, err := lc.Inspect(ctx, &dlockv1.InspectRequest{Key: "fw"})
	if err != nil || !in.GetHeld() || in.GetInfo().GetFence() != g.GetFence() || in.GetInfo().GetHolder() != "via follower" {
		t.Fatalf("leader's view: %v %v, want held with fence %d", in, err, g.GetFence())
	}
	if _, err := fc.Acquire(ctx, &dlockv1.AcquireRequest{Key: "fw", Owner: "owner-0002"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second acquire via follower: %v, want FAILED_PRECONDITION", err)
	}
	rn, err := fc.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "fw", Owner: "owner-0001"}}})
	if err != nil || !rn.GetResults()[0].GetOk() {
		t.Fatalf("renew via follower: %v %v", rn, err)
	}
	cf, err := fc.CheckFence(ctx, &dlockv1.CheckFenceRequest{Key: "fw", Fence: g.GetFence()})
	if err != nil || !cf.GetCurrent() {
		t.Fatalf("check fence via follower: %v %v", cf, err)
	}
	fin, err := fc.Inspect(ctx, &dlockv1.InspectRequest{Key: "fw"})
	if err != nil || fin.GetInfo().GetFence() != g.GetFence() || fin.GetInfo().GetRemaining() == nil {
		t.Fatalf("inspect via follower: %v %v (want the leader's view, with time remaining)", fin, err)
	}
	ls, err := fc.List(ctx, &dlockv1.ListRequest{Prefix: "fw"})
	if err != nil || len(ls.GetHolders()) != 1 {
		t.Fatalf("list via follower: %v %v", ls, err)
	}
	if _, err := fc.Release(ctx, &dlockv1.ReleaseRequest{Key: "fw", Owner: "owner-0001"}); err != nil {
		t.Fatalf("release via follower: %v", err)
	}
	if in, err := lc.Inspect(ctx, &dlockv1.InspectRequest{Key: "fw"}); err != nil || in.GetHeld() {
		t.Fatalf("after release: %v %v", in, err)
	}
}

// TestForward_FollowerServesHTTP: curl against a follower works (the
// request is forwarded, the fence is the leader's); with Dlock-No-Forward
// it is redirected (307) to the leader instead; health endpoints answer
// for the follower itself.
func TestForward_FollowerServesHTTP(t *testing.T) {
	nodes, l, f := forwardCluster(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	fURL, lAPI := "http://"+nodes[f].cfg.Listen, nodes[l].cfg.Listen
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(c *http.Client, method, url, body string, hdr ...string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	resp, body := do(noRedirect, "POST", fURL+"/v1/acquire", `{"key":"h","owner":"owner-0001","ttl":"20s"}`)
	var g struct {
		Fence string `json:"fence"`
	}
	if err := json.Unmarshal([]byte(body), &g); resp.StatusCode != http.StatusOK || err != nil || g.Fence == "" {
		t.Fatalf("acquire via follower: %d %s", resp.StatusCode, body)
	}
	in, err := dlockv1.NewLockClient(dial(t, lAPI)).Inspect(ctx, &dlockv1.InspectRequest{Key: "h"})
	if err != nil || fmt.Sprint(in.GetInfo().GetFence()) != g.Fence {
		t.Fatalf("leader's view: %v %v, want fence %s", in, err, g.Fence)
	}
	if resp, body = do(noRedirect, "GET", fURL+"/v1/inspect?key=h", ""); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"fence":"`+g.Fence+`"`) {
		t.Fatalf("GET inspect via follower: %d %s", resp.StatusCode, body)
	}
	if resp, body = do(noRedirect, "POST", fURL+"/v1/acquire", `{"key":"h","owner":"owner-0002"}`); resp.StatusCode != http.StatusConflict {
		t.Fatalf("second acquire via follower: %d %s, want 409", resp.StatusCode, body)
	}
	if resp, body = do(noRedirect, "POST", fURL+"/v1/renew", `{"items":[{"key":"h","owner":"owner-0001"}]}`); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"ok":true`) {
		t.Fatalf("renew via follower: %d %s", resp.StatusCode, body)
	}
	if resp, body = do(noRedirect, "POST", fURL+"/v1/release", `{"key":"h","owner":"owner-0001"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("release via follower: %d %s", resp.StatusCode, body)
	}

	// Dlock-No-Forward: 307 to the leader, and a client that follows it
	// (with its body: 307 keeps the method) gets the grant.
	resp, body = do(noRedirect, "POST", fURL+"/v1/acquire", `{"key":"r","owner":"owner-0003"}`, server.HeaderNoForward, "1")
	if resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != "http://"+lAPI+"/v1/acquire" || resp.Header.Get(server.HeaderLeader) != lAPI {
		t.Fatalf("no-forward: %d Location %q %s %q; want 307 to %s", resp.StatusCode, resp.Header.Get("Location"), server.HeaderLeader, resp.Header.Get(server.HeaderLeader), lAPI)
	}
	if resp, body = do(http.DefaultClient, "POST", fURL+"/v1/acquire", `{"key":"r","owner":"owner-0003"}`, server.HeaderNoForward, "1"); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"fence"`) {
		t.Fatalf("following the redirect: %d %s", resp.StatusCode, body)
	}

	// Health endpoints are the follower's own.
	if resp, _ = do(noRedirect, "GET", fURL+"/readyz", ""); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz on a follower: %d, want 503 (not forwarded)", resp.StatusCode)
	}
	if resp, _ = do(noRedirect, "GET", fURL+"/healthz", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz on a follower: %d", resp.StatusCode)
	}
	if resp, body = do(noRedirect, "GET", fURL+"/metrics", ""); resp.StatusCode != http.StatusOK || !strings.Contains(body, "dlockd_") {
		t.Fatalf("/metrics on a follower: %d", resp.StatusCode)
	}
}

// TestForward_WaitCancelledAtFollowerLeavesNoQueueEntry: an acquisition
// with wait sent to a follower queues on the leader; its cancellation (a
// gRPC cancel, an HTTP client that hangs up) reaches the leader, which
// removes the queue entry.
func TestForward_WaitCancelledAtFollowerLeavesNoQueueEntry(t *testing.T) {
	nodes, l, f := forwardCluster(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	lc := dlockv1.NewLockClient(dial(t, nodes[l].cfg.Listen))
	fc := dlockv1.NewLockClient(dial(t, nodes[f].cfg.Listen))
	if _, err := lc.Acquire(ctx, &dlockv1.AcquireRequest{Key: "q", Owner: "holder-001", Ttl: durationpb.New(30 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	waiters := func(want uint32) func() bool {
		return func() bool {
			in, err := lc.Inspect(ctx, &dlockv1.InspectRequest{Key: "q"})
			return err == nil && in.GetWaiters() == want
		}
	}

	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := fc.Acquire(wctx, &dlockv1.AcquireRequest{Key: "q", Owner: "waiter-001", Wait: true})
		done <- err
	}()
	fwWaitFor(t, "the gRPC waiter queued on the leader", waiters(1))
	wcancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled wait: %v", err)
	}
	fwWaitFor(t, "the gRPC waiter's queue entry removed on the leader", waiters(0))

	hctx, hcancel := context.WithCancel(ctx)
	go func() {
		req, _ := http.NewRequestWithContext(hctx, "POST", "http://"+nodes[f].cfg.Listen+"/v1/acquire", strings.NewReader(`{"key":"q","owner":"waiter-002","wait":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	fwWaitFor(t, "the HTTP waiter queued on the leader", waiters(1))
	hcancel()
	<-done
	fwWaitFor(t, "the HTTP waiter's queue entry removed on the leader", waiters(0))

	// A forwarded wait that is granted: the holder releases, the waiter
	// gets the key from the leader's handover, with a greater fence.
	type result struct {
		g   *dlockv1.AcquireResponse
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := fc.Acquire(ctx, &dlockv1.AcquireRequest{Key: "q", Owner: "waiter-003", Wait: true, Ttl: durationpb.New(20 * time.Second)})
		got <- result{g, err}
	}()
	fwWaitFor(t, "the third waiter queued on the leader", waiters(1))
	held, err := lc.Inspect(ctx, &dlockv1.InspectRequest{Key: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lc.Release(ctx, &dlockv1.ReleaseRequest{Key: "q", Owner: "holder-001"}); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.g.GetOwner() != "waiter-003" || r.g.GetFence() <= held.GetInfo().GetFence() || r.g.GetClaimWithin() == nil {
		t.Fatalf("forwarded wait after the release: %v %v; want a handover grant with a fence above %d", r.g, r.err, held.GetInfo().GetFence())
	}
}

// TestForward_StreamsOnFollowerAnswerNotLeaderWithHint: Session and Wait
// streams are not forwarded: a follower ends them at once with NOT_LEADER
// and the leader's API address as ErrorInfo detail. Watch works on a
// follower, and hears the loss of a lease applied from the log there.
func TestForward_StreamsOnFollowerAnswerNotLeaderWithHint(t *testing.T) {
	nodes, l, f := forwardCluster(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	fc := dlockv1.NewLockClient(dial(t, nodes[f].cfg.Listen))
	want := map[string]string{server.MetaLeaderID: nodes[l].cfg.NodeID, server.MetaLeaderAPI: nodes[l].cfg.Listen}
	check := func(what string, err error) {
		t.Helper()
		h := leaderHint(err)
		if status.Code(err) != codes.Unavailable || h[server.MetaLeaderID] != want[server.MetaLeaderID] || h[server.MetaLeaderAPI] != want[server.MetaLeaderAPI] {
			t.Fatalf("%s on a follower: %v, hint %v; want UNAVAILABLE with hint %v", what, err, h, want)
		}
	}
	ss, err := fc.Session(ctx)
	if err == nil {
		_, err = ss.Recv()
	}
	check("Session", err)
	ws, err := fc.Wait(ctx)
	if err == nil {
		_ = ws.Send(&dlockv1.AcquireRequest{Key: "w", Owner: "waiter-001"})
		_, err = ws.Recv()
	}
	check("Wait", err)

	const session = "session-fw-0001"
	wt, err := fc.Watch(ctx, &dlockv1.WatchRequest{Session: session})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := wt.Recv(); err != nil || ev.GetType() != dlockv1.WatchEvent_READY {
		t.Fatalf("Watch on a follower: %v %v, want READY", ev, err)
	}
	lc := dlockv1.NewLockClient(dial(t, nodes[l].cfg.Listen))
	g, err := lc.Acquire(ctx, &dlockv1.AcquireRequest{Key: "wk", Owner: "owner-0001", Session: session, Ttl: durationpb.New(20 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.ForceRelease(ctx, &dlockv1.ForceReleaseRequest{Key: "wk", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	ev, err := wt.Recv()
	if err != nil || ev.GetType() != dlockv1.WatchEvent_LOST || ev.GetKey() != "wk" || ev.GetFence() != g.GetFence() {
		t.Fatalf("Watch on a follower: %v %v, want LOST wk fence %d", ev, err, g.GetFence())
	}
}

// TestForward_NoDoubleForward: a call already forwarded (marked) that
// reaches a node which is not the leader (a stale view of the leader) is
// answered NOT_LEADER with that node's hint, and changes nothing.
func TestForward_NoDoubleForward(t *testing.T) {
	nodes, l, f := forwardCluster(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	fc := dlockv1.NewLockClient(dial(t, nodes[f].cfg.Listen))
	mctx := metadata.AppendToOutgoingContext(ctx, "dlock-forwarded", "1")
	_, err := fc.Acquire(mctx, &dlockv1.AcquireRequest{Key: "dd", Owner: "owner-0001"})
	if h := leaderHint(err); status.Code(err) != codes.Unavailable || h[server.MetaLeaderAPI] != nodes[l].cfg.Listen {
		t.Fatalf("marked call at a follower: %v (hint %v), want NOT_LEADER naming %s", err, h, nodes[l].cfg.Listen)
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+nodes[f].cfg.Listen+"/v1/acquire", strings.NewReader(`{"key":"dd","owner":"owner-0001"}`))
	req.Header.Set(server.HeaderForwarded, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Reason, Leader string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusServiceUnavailable || body.Reason != server.ReasonNotLeader || body.Leader != nodes[l].cfg.Listen || resp.Header.Get(server.HeaderLeader) != nodes[l].cfg.Listen {
		t.Fatalf("marked HTTP call at a follower: %d %+v, want 503 NOT_LEADER leader %s", resp.StatusCode, body, nodes[l].cfg.Listen)
	}
	in, err := dlockv1.NewLockClient(dial(t, nodes[l].cfg.Listen)).Inspect(ctx, &dlockv1.InspectRequest{Key: "dd"})
	if err != nil || in.GetHeld() || in.GetWaiters() != 0 {
		t.Fatalf("leader's view of dd: %v %v, want untouched", in, err)
	}
}

// TestForward_LeaderUnreachable: when the leader's advertised API does not
// answer (here every node advertises an address that accepts connections
// and never speaks), a follower answers UNAVAILABLE (NOT_LEADER) with the
// hint within the call's deadline, rather than hang.
func TestForward_LeaderUnreachable(t *testing.T) {
	var silent []net.Listener
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, ln)
		go func() {
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				held = append(held, c)
			}
		}()
	}
	t.Cleanup(func() {
		for _, ln := range silent {
			ln.Close()
		}
	})
	nodes, l, f := forwardCluster(t, func(i int, c *server.Config) { c.Advertise = silent[i].Addr().String() })
	fc := dlockv1.NewLockClient(dial(t, nodes[f].cfg.Listen))
	for _, deadline := range []time.Duration{time.Second, 0} {
		ctx := t.Context()
		if deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, deadline)
			defer cancel()
		}
		start := time.Now()
		_, err := fc.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
		took := time.Since(start)
		h := leaderHint(err)
		if status.Code(err) != codes.Unavailable || h[server.MetaLeaderAPI] != silent[l].Addr().String() {
			t.Fatalf("deadline %v: %v (hint %v), want UNAVAILABLE naming %s", deadline, err, h, silent[l].Addr())
		}
		if limit := max(deadline, 5*time.Second); took >= limit {
			t.Fatalf("deadline %v: answered after %v", deadline, took)
		}
		t.Logf("deadline %v: %v after %v", deadline, err, took.Round(time.Millisecond))
	}
	// HTTP: the follower's dial of a silent address succeeds; the call is
	// bounded by the forwarding cap. A refused one is answered at once:
	// covered by the internal test.
}
