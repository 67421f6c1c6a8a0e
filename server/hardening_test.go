package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
)

// queue starts a Wait stream for (key, owner) and returns it once the
// server answered QUEUED.
func queue(t *testing.T, ctx context.Context, c dlockv1.LockClient, key, owner string, ttl time.Duration) dlockv1.Lock_WaitClient {
	t.Helper()
	stream, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&dlockv1.AcquireRequest{Key: key, Owner: owner, Ttl: durationpb.New(ttl)}); err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED {
		t.Fatalf("wait of %s: %v %v, want QUEUED", owner, ev, err)
	}
	return stream
}

// granted reads the next event of a Wait stream and wants GRANTED.
func granted(t *testing.T, stream dlockv1.Lock_WaitClient) *dlockv1.AcquireResponse {
	t.Helper()
	ev, err := stream.Recv()
	if err != nil || ev.GetType() != dlockv1.WaitEvent_GRANTED {
		t.Fatalf("wait: %v %v, want GRANTED", ev, err)
	}
	return ev.GetGrant()
}

// TestServer_TryOfQueuedOwnerIsRefused: a non-waiting Acquire by an owner
// token that is queued on the key used to crash dlockd (the FSM answered
// "queued" without a registered wait). It is refused, and the server goes
// on serving.
func TestServer_TryOfQueuedOwnerIsRefused(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000"}); err != nil {
		t.Fatal(err)
	}
	queue(t, ctx, c, "k", "owner-b-0000", time.Second)
	_, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-b-0000"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("try of a queued owner: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "other", Owner: "owner-c-0000"}); err != nil {
		t.Fatalf("server no longer serves: %v", err)
	}
	if v, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"}); err != nil || v.GetWaiters() != 1 {
		t.Fatalf("inspect: %v %v, want b still queued", v, err)
	}
}

// TestServer_RetriedAcquireHonoursItsTTL: a repeated Acquire by the current
// owner answers with the TTL it asked for, and the server honours it: a
// waiter is not granted when the first TTL runs out.
func TestServer_RetriedAcquireHonoursItsTTL(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	first, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(300 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	retry, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(time.Hour)})
	if err != nil || retry.GetFence() != first.GetFence() || retry.GetTtl().AsDuration() != time.Hour {
		t.Fatalf("retried acquire = %v %v, want fence %d and ttl 1h", retry, err, first.GetFence())
	}
	wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	stream := queue(t, wctx, c, "k", "owner-b-0000", time.Second)
	if ev, err := stream.Recv(); err == nil {
		t.Fatalf("b was granted %v while a's answered TTL of 1h runs", ev)
	}
	r, err := c.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "k", Owner: "owner-a-0000"}}})
	if err != nil || !r.GetResults()[0].GetOk() {
		t.Fatalf("a's renewal after 1.5 s: %v %v, want ok", r, err)
	}
}

// TestServer_RefusedTryWritesNothing: a try of a held key is answered from
// the leader's state: no log entry, no fsync.
func TestServer_RefusedTryWritesNothing(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000"}); err != nil {
		t.Fatal(err)
	}
	before := metric(t, srv.Addr(), "dlockd_raft_applied_index")
	for range 50 {
		_, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-b-0000"})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "LOCK_HELD") {
			t.Fatalf("try of a held key: %v", err)
		}
	}
	if after := metric(t, srv.Addr(), "dlockd_raft_applied_index"); after != before {
		t.Fatalf("50 refused tries moved the applied index from %s to %s", before, after)
	}
}

// TestServer_UnclaimedHandoverGoesToNextWaiter: a waiter that is handed the
// key but never confirms it (a vanished client) loses it after the claim
// window, not after its TTL; a waiter that renews keeps it.
func TestServer_UnclaimedHandoverGoesToNextWaiter(t *testing.T) {
	window := 300 * time.Millisecond
	srv := start(t, func(cfg *server.Config) { cfg.ClaimWindow = window })
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	vanished := queue(t, ctx, c, "k", "owner-b-0000", 10*time.Minute)
	next := queue(t, ctx, c, "k", "owner-c-0000", 10*time.Minute)
	if _, err := c.Release(ctx, &dlockv1.ReleaseRequest{Key: "k", Owner: "owner-a-0000"}); err != nil {
		t.Fatal(err)
	}
	gb := granted(t, vanished)
	if gb.GetClaimWithin().AsDuration() != window {
		t.Fatalf("handed-over grant claim_within = %v, want %v", gb.GetClaimWithin(), window)
	}
	handed := time.Now()
	gc := granted(t, next) // b never renews
	if waited := time.Since(handed); waited > 5*time.Second {
		t.Fatalf("next waiter granted after %v", waited)
	}
	if gc.GetFence() <= gb.GetFence() {
		t.Fatalf("fence %d after %d", gc.GetFence(), gb.GetFence())
	}
	r, err := c.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "k", Owner: "owner-b-0000"}, {Key: "k", Owner: "owner-c-0000"}}})
	if err != nil || r.GetResults()[0].GetOk() || !r.GetResults()[1].GetOk() {
		t.Fatalf("renewals after the claim window: %v %v, want b lost and c claimed", r, err)
	}
	if m := metric(t, srv.Addr(), "dlockd_unclaimed_handovers_total"); m != "1" {
		t.Fatalf("unclaimed handovers = %s, want 1", m)
	}
	// c claimed its grant: it keeps the key past the window.
	time.Sleep(2 * window)
	v, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
	if err != nil || v.GetInfo().GetFence() != gc.GetFence() {
		t.Fatalf("after c's claim: %v %v, want c still holding", v, err)
	}
}

// TestServer_ForceRelease: an operator removes a grant with a reason; the
// holder hears LOST at once, the next waiter gets a greater fence; a free
// key and a missing reason are refused. Over gRPC and HTTP.
func TestServer_ForceRelease(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	watch, err := c.Watch(ctx, &dlockv1.WatchRequest{Session: "session-a"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := watch.Recv(); err != nil || ev.GetType() != dlockv1.WatchEvent_READY {
		t.Fatalf("watch: %v %v", ev, err)
	}
	ga, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Session: "session-a", Holder: "host-a", Ttl: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	stream := queue(t, ctx, c, "k", "owner-b-0000", time.Minute)
	if _, err := c.ForceRelease(ctx, &dlockv1.ForceReleaseRequest{Key: "k", Reason: "  "}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("force release without a reason: %v, want INVALID_ARGUMENT", err)
	}
	r, err := c.ForceRelease(ctx, &dlockv1.ForceReleaseRequest{Key: "k", Reason: "host-a is dead"})
	if err != nil || r.GetRemoved().GetFence() != ga.GetFence() || r.GetRemoved().GetHolder() != "host-a" || r.GetNextFence() <= ga.GetFence() {
		t.Fatalf("force release = %v %v", r, err)
	}
	lost, err := watch.Recv()
	if err != nil || lost.GetType() != dlockv1.WatchEvent_LOST || lost.GetReason() != "FORCE_RELEASED" || lost.GetFence() != ga.GetFence() {
		t.Fatalf("holder's loss push: %v %v", lost, err)
	}
	if gb := granted(t, stream); gb.GetFence() != r.GetNextFence() {
		t.Fatalf("waiter granted fence %d, force release said %d", gb.GetFence(), r.GetNextFence())
	}
	code, body := post(t, srv.Addr(), "/v1/force-release", `{"key":"free","reason":"cleanup"}`)
	if code != 404 || body["reason"] != server.ReasonNotHeld {
		t.Fatalf("HTTP force release of a free key: %d %v", code, body)
	}
	code, body = post(t, srv.Addr(), "/v1/force-release", `{"key":"k","reason":"b too"}`)
	if code != 200 || body["removed"].(map[string]any)["fence"] != strconv.FormatUint(r.GetNextFence(), 10) {
		t.Fatalf("HTTP force release: %d %v", code, body)
	}
	if m := metric(t, srv.Addr(), "dlockd_force_releases_total"); m != "2" {
		t.Fatalf("force releases counted %s, want 2", m)
	}
}

// TestServer_LockDelay: a grant lost without a release keeps its key from
// everybody for its lock-delay (the request's, or the server's default);
// a waiter is granted when the delay ends; a release never delays.
func TestServer_LockDelay(t *testing.T) {
	srv := start(t, func(cfg *server.Config) { cfg.LockDelay = 400 * time.Millisecond })
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	ttl, delay := 200*time.Millisecond, 600*time.Millisecond
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(ttl), LockDelay: durationpb.New(2 * ttl)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("lock_delay above the TTL: %v, want INVALID_ARGUMENT", err)
	}
	sent := time.Now()
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(time.Second), LockDelay: durationpb.New(delay)}); err != nil {
		t.Fatal(err)
	}
	stream := queue(t, ctx, c, "k", "owner-b-0000", time.Minute)
	sawDelay := false
	for {
		_, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-c-0000"})
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("try during hold or delay: %v", err)
		}
		if strings.Contains(err.Error(), "lock-delay") {
			sawDelay = true
			v, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
			if err != nil || v.GetHeld() || v.GetLockDelayRemaining() == nil || v.GetWaiters() != 1 {
				t.Fatalf("inspect during the lock-delay: %v %v", v, err)
			}
			break
		}
		if time.Since(sent) > 10*time.Second {
			t.Fatal("the grant never expired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gb := granted(t, stream)
	if since := time.Since(sent); since < time.Second+delay {
		t.Fatalf("waiter granted %v after a's acquire: before TTL + lock-delay (%v)", since, time.Second+delay)
	}
	if !sawDelay {
		t.Fatal("never saw the lock-delay")
	}
	// The server default applies to requests without lock_delay, and a
	// force release delays too; a release does not.
	forced := time.Now() // before the call: the delay starts when it is applied, before the answer
	if _, err := c.ForceRelease(ctx, &dlockv1.ForceReleaseRequest{Key: "k", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if gb.GetFence() == 0 {
		t.Fatal("no fence")
	}
	for {
		_, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-d-0000", Ttl: durationpb.New(time.Second)})
		if err == nil {
			break
		}
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if since := time.Since(forced); since < 400*time.Millisecond {
		t.Fatalf("granted %v after a force release, before the default lock-delay of 400ms", since)
	}
	if _, err := c.Release(ctx, &dlockv1.ReleaseRequest{Key: "k", Owner: "owner-d-0000"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-e-0000"}); err != nil {
		t.Fatalf("acquire right after a release: %v", err)
	}
}

// TestServer_ListPages: List follows page tokens over the ordered index.
func TestServer_ListPages(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	for i := range 25 {
		if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: fmt.Sprintf("job/%02d", i), Owner: "owner-a-0000"}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("too many pages")
		}
		r, err := c.List(ctx, &dlockv1.ListRequest{Prefix: "job/", Limit: 10, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range r.GetHolders() {
			got = append(got, h.GetKey())
		}
		if token = r.GetNextPageToken(); token == "" {
			break
		}
	}
	if len(got) != 25 || got[0] != "job/00" || got[24] != "job/24" {
		t.Fatalf("listed %v", got)
	}
	_, err := c.List(ctx, &dlockv1.ListRequest{PageToken: "!!"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad page token: %v", err)
	}
}

// TestServer_LargeHeadersAreRefused: a call's header list is bounded (gRPC's
// own 16 MiB default let 60 streams hold a gigabyte of metadata), and so
// are HTTP request headers.
func TestServer_LargeHeadersAreRefused(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-big", strings.Repeat("x", 256<<10))
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k"}); err == nil {
		t.Fatal("a call with 256 KiB of metadata was served")
	}
	if _, err := c.Acquire(t.Context(), &dlockv1.AcquireRequest{Key: "k"}); err != nil {
		t.Fatalf("a normal call after the refusal: %v", err)
	}
	req, err := http.NewRequest("GET", "http://"+srv.Addr()+"/healthz", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Big", strings.Repeat("x", 256<<10))
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("HTTP request with 256 KiB of headers: %d", resp.StatusCode)
		}
	}
}

// TestServer_WaitClosedBeforeItsRequestIsInvalidArgument: a Wait stream
// half-closed before it sends its request is answered INVALID_ARGUMENT
// (INVALID_REQUEST), not UNKNOWN "EOF", and the server goes on serving.
func TestServer_WaitClosedBeforeItsRequestIsInvalidArgument(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	stream, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "INVALID_REQUEST") {
		t.Fatalf("a Wait closed before its request: %v, want INVALID_ARGUMENT (INVALID_REQUEST)", err)
	}
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "after", Owner: "owner-after-00"}); err != nil {
		t.Fatalf("the server after it: %v", err)
	}
}
