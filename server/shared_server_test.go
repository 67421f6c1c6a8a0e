package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
)

// TestServer_SharedOverGRPCHTTPSession: Shared grants of one key through
// gRPC Acquire, POST /v1/acquire and a Session call; a refused permit
// (409), another limit (400, LIMIT_MISMATCH naming the key's), Inspect and
// List of the Shared key, CheckFence of each grant, and a force release
// that removes every grant and hands the key to a waiting writer.
func TestServer_SharedOverGRPCHTTPSession(t *testing.T) {
	srv := start(t, nil)
	a := srv.Addr()
	c := grpcClient(t, a)
	ctx := t.Context()
	g1, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "sem", Owner: "owner-grpc-0001", Ttl: durationpb.New(time.Minute), Holder: "grpc", Shared: true, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	code, m := post(t, a, "/v1/acquire", `{"key":"sem","owner":"owner-http-0001","ttl":"60s","holder":"curl","shared":true,"limit":3}`)
	if code != 200 {
		t.Fatalf("acquire over HTTP: %d %v", code, m)
	}
	httpFence := m["fence"].(string)
	sess, err := c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Send(&dlockv1.SessionRequest{Id: 1, Call: &dlockv1.SessionRequest_Acquire{Acquire: &dlockv1.AcquireRequest{Key: "sem", Owner: "owner-sess-0001", Ttl: durationpb.New(time.Minute), Shared: true, Limit: 3}}}); err != nil {
		t.Fatal(err)
	}
	sr, err := sess.Recv()
	if err != nil || sr.GetCode() != 0 || sr.GetAcquire().GetFence() <= g1.GetFence() {
		t.Fatalf("session acquire: %v %v", sr, err)
	}
	_ = sess.CloseSend()
	code, m = post(t, a, "/v1/acquire", `{"key":"sem","ttl":"60s","shared":true,"limit":3}`)
	if code != http.StatusConflict || m["reason"] != "LOCK_HELD" || !strings.Contains(fmt.Sprint(m["message"]), "all 3 permits taken") {
		t.Fatalf("fourth permit of 3: %d %v", code, m)
	}
	code, m = post(t, a, "/v1/acquire", `{"key":"sem","ttl":"60s","shared":true,"limit":4}`)
	if code != http.StatusBadRequest || m["reason"] != "LIMIT_MISMATCH" || !strings.Contains(fmt.Sprint(m["message"]), "limit of 3") {
		t.Fatalf("another limit: %d %v", code, m)
	}
	code, m = post(t, a, "/v1/acquire", `{"key":"sem","ttl":"60s","limit":4}`)
	if code != http.StatusBadRequest || m["reason"] != "INVALID_REQUEST" {
		t.Fatalf("limit without shared: %d %v", code, m)
	}
	code, m = post(t, a, "/v1/acquire", `{"key":"x","ttl":"60s","shared":true,"limit":10001}`)
	if code != http.StatusBadRequest || m["reason"] != "INVALID_REQUEST" {
		t.Fatalf("limit over the maximum: %d %v", code, m)
	}
	ins, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "sem"})
	if err != nil || !ins.GetHeld() || !ins.GetInfo().GetShared() || ins.GetInfo().GetLimit() != 3 || ins.GetInfo().GetHolders() != 3 || ins.GetInfo().GetFence() != g1.GetFence() || ins.GetInfo().GetHolder() != "grpc" || len(ins.GetGrants()) != 3 {
		t.Fatalf("inspect: %v %v", ins, err)
	}
	if ins.GetGrants()[1].GetHolder() != "curl" || ins.GetGrants()[1].GetRemaining() == nil {
		t.Fatalf("inspect's second grant: %v", ins.GetGrants()[1])
	}
	l, err := c.List(ctx, &dlockv1.ListRequest{Prefix: "sem"})
	if err != nil || len(l.GetHolders()) != 3 || l.GetHolders()[0].GetHolders() != 3 || l.GetHolders()[0].GetFence() != g1.GetFence() || l.GetHolders()[1].GetHolder() != "curl" || l.GetHolders()[2].GetFence() != sr.GetAcquire().GetFence() {
		t.Fatalf("list: %v %v, want one entry per grant, by fence", l, err)
	}
	code, m = post(t, a, "/v1/check-fence", fmt.Sprintf(`{"key":"sem","fence":%q}`, httpFence))
	if code != 200 || m["current"] != true {
		t.Fatalf("check-fence of the second grant: %d %v", code, m)
	}
	// A writer waits behind the permits; a force release removes them all.
	ws, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Send(&dlockv1.AcquireRequest{Key: "sem", Owner: "owner-writer-01", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if ev, err := ws.Recv(); err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED {
		t.Fatalf("writer: %v %v", ev, err)
	}
	fr, err := c.ForceRelease(ctx, &dlockv1.ForceReleaseRequest{Key: "sem", Reason: "test"})
	if err != nil || fr.GetRemovedGrants() != 3 || fr.GetRemoved().GetFence() != g1.GetFence() || fr.GetNextFence() <= sr.GetAcquire().GetFence() {
		t.Fatalf("force release: %v %v", fr, err)
	}
	ev, err := ws.Recv()
	if err != nil || ev.GetType() != dlockv1.WaitEvent_GRANTED || ev.GetGrant().GetFence() != fr.GetNextFence() {
		t.Fatalf("writer after the force release: %v %v", ev, err)
	}
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "sem", Ttl: durationpb.New(time.Minute), Shared: true, Limit: 4}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("permit while the writer holds: %v", err)
	}
}

// TestServer_SharedExpiryHandsOffAndPushesLoss: an expired Shared grant
// is pushed as LOST to its session and its permit handed to the waiter.
func TestServer_SharedExpiryHandsOffAndPushesLoss(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch, err := c.Watch(wctx, &dlockv1.WatchRequest{Session: "session-shared"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := watch.Recv(); err != nil || ev.GetType() != dlockv1.WatchEvent_READY {
		t.Fatalf("watch: %v %v", ev, err)
	}
	keep, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-keep-0000", Ttl: durationpb.New(time.Minute), Shared: true, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	g, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(300 * time.Millisecond), Session: "session-shared", Shared: true, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&dlockv1.AcquireRequest{Key: "k", Owner: "owner-b-0000", Ttl: durationpb.New(time.Second), Shared: true, Limit: 2}); err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED {
		t.Fatalf("wait: %v %v", ev, err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetType() != dlockv1.WaitEvent_GRANTED || ev.GetGrant().GetFence() <= g.GetFence() || ev.GetGrant().GetClaimWithin() == nil {
		t.Fatalf("wait: %v %v", ev, err)
	}
	lost, err := watch.Recv()
	if err != nil || lost.GetType() != dlockv1.WatchEvent_LOST || lost.GetOwner() != "owner-a-0000" || lost.GetFence() != g.GetFence() || lost.GetReason() != "EXPIRED" {
		t.Fatalf("loss push: %v %v", lost, err)
	}
	r, err := c.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "k", Owner: "owner-a-0000"}, {Key: "k", Owner: "owner-b-0000"}, {Key: "k", Owner: keep.GetOwner()}}})
	if err != nil || r.GetResults()[0].GetOk() || !r.GetResults()[1].GetOk() || !r.GetResults()[2].GetOk() {
		t.Fatalf("renew after expiry: %v %v", r, err)
	}
}

// TestServer_SharedSnapshotRestoreOnRestart: Shared grants, made several
// per log entry, survive a snapshot and a restart with their fences, and
// the first fence after the restart is above every earlier one.
func TestServer_SharedSnapshotRestoreOnRestart(t *testing.T) {
	srv := start(t, func(c *server.Config) {
		c.SnapshotThreshold = 30
		c.SnapshotInterval = 50 * time.Millisecond
		c.TrailingLogs = 5
	})
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	var maxFence uint64
	held := 0
	for round := range 10 {
		key := fmt.Sprintf("snap/%d", round)
		w := fmt.Sprintf("owner-w-%08d", round)
		g, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: key, Owner: w, Ttl: durationpb.New(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		maxFence = max(maxFence, g.GetFence())
		var streams []dlockv1.Lock_WaitClient
		for i := range 3 {
			s, err := c.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(&dlockv1.AcquireRequest{Key: key, Owner: fmt.Sprintf("owner-r-%d-%06d", i, round), Ttl: durationpb.New(time.Minute), Shared: true}); err != nil {
				t.Fatal(err)
			}
			if ev, err := s.Recv(); err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED {
				t.Fatalf("reader: %v %v", ev, err)
			}
			streams = append(streams, s)
		}
		if _, err := c.Release(ctx, &dlockv1.ReleaseRequest{Key: key, Owner: w}); err != nil {
			t.Fatal(err)
		}
		for i, s := range streams {
			ev, err := s.Recv()
			if err != nil || ev.GetType() != dlockv1.WaitEvent_GRANTED || ev.GetGrant().GetFence() <= g.GetFence() {
				t.Fatalf("reader %d: %v %v", i, ev, err)
			}
			// Claim the handed-over grant.
			if r, err := c.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: key, Owner: ev.GetGrant().GetOwner()}}}); err != nil || !r.GetResults()[0].GetOk() {
				t.Fatalf("claim: %v %v", r, err)
			}
			maxFence = max(maxFence, ev.GetGrant().GetFence())
			held++
		}
	}
	waitFor(t, func() bool {
		m, _ := filepath.Glob(filepath.Join(srv.Cfg.DataDir, "snapshots", "*", "state.bin"))
		return len(m) > 0
	})
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	l, err := c.List(ctx, &dlockv1.ListRequest{Prefix: "snap/"}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, h := range l.GetHolders() {
		if !h.GetShared() {
			t.Fatalf("%s not shared after the restart: %v", h.GetKey(), h)
		}
		n++
	}
	if n != held {
		t.Fatalf("%d shared grants after the restart, want %d", n, held)
	}
	g, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "snap/0", Owner: "owner-new-0000", Ttl: durationpb.New(time.Minute), Shared: true})
	if err != nil || g.GetFence() <= maxFence {
		t.Fatalf("fence after the restart %d, %v; want > %d", g.GetFence(), err, maxFence)
	}
	resp, err := http.Get("http://" + srv.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf("dlockd_held_leases %d", held+1); !bytes.Contains(b, []byte(want)) {
		t.Errorf("/metrics lacks %q (each shared grant is a lease)", want)
	}
}

// TestServer_WatchKeysChanged: a Watch stream with keys hears CHANGED for
// each watched key whose grants change (grant, release, handover), once
// per applied batch, and nothing for other keys; too many or invalid keys
// are refused.
func TestServer_WatchKeysChanged(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch, err := c.Watch(wctx, &dlockv1.WatchRequest{Session: "session-keys", Keys: []string{"leader", "rw"}})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := watch.Recv(); err != nil || ev.GetType() != dlockv1.WatchEvent_READY {
		t.Fatalf("watch: %v %v", ev, err)
	}
	next := func(want string) {
		t.Helper()
		ev, err := watch.Recv()
		if err != nil || ev.GetType() != dlockv1.WatchEvent_CHANGED || ev.GetKey() != want {
			t.Fatalf("watch: %v %v, want CHANGED %s", ev, err, want)
		}
	}
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "other", Owner: "owner-other-01", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "leader", Owner: "owner-lead-001", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	next("leader")
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "rw", Owner: "owner-read-001", Ttl: durationpb.New(time.Minute), Shared: true}); err != nil {
		t.Fatal(err)
	}
	next("rw")
	if _, err := c.Release(ctx, &dlockv1.ReleaseRequest{Key: "leader", Owner: "owner-lead-001"}); err != nil {
		t.Fatal(err)
	}
	next("leader")
	for _, bad := range []*dlockv1.WatchRequest{
		{Session: "session-keys", Keys: []string{""}},
		{Session: "session-keys", Keys: make([]string, 101)},
	} {
		for i := range bad.Keys {
			if bad.Keys[i] == "" && len(bad.Keys) > 1 {
				bad.Keys[i] = fmt.Sprint("k", i)
			}
		}
		w, err := c.Watch(ctx, bad)
		if err == nil {
			_, err = w.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("watch of %d keys: %v, want InvalidArgument", len(bad.Keys), err)
		}
	}
}

// TestServer_SharedLockDelay: a Shared grant lost by expiry keeps its
// permit taken for its lock-delay: Inspect says so, a try is refused
// naming the lost grant, and a waiting writer is granted after it.
func TestServer_SharedLockDelay(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "ld", Owner: "owner-lost-0001", Ttl: durationpb.New(200 * time.Millisecond), LockDelay: durationpb.New(200 * time.Millisecond), Shared: true, Limit: 1}); err != nil {
		t.Fatal(err)
	}
	var ins *dlockv1.InspectResponse
	waitFor(t, func() bool {
		var err error
		ins, err = c.Inspect(ctx, &dlockv1.InspectRequest{Key: "ld"})
		return err == nil && !ins.GetHeld()
	})
	expired := time.Now()
	if ins.GetLockDelayRemaining() == nil || ins.GetLockDelayRemaining().AsDuration() <= 0 {
		t.Fatalf("inspect of a key whose only grant is lost, in its lock-delay: %v", ins)
	}
	_, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "ld", Owner: "owner-next-0001", Ttl: durationpb.New(time.Minute), Shared: true, Limit: 1})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "lock-delay") {
		t.Fatalf("permit during the lost grant's lock-delay: %v", err)
	}
	ws, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Send(&dlockv1.AcquireRequest{Key: "ld", Owner: "owner-writer-01", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetType() == dlockv1.WaitEvent_GRANTED {
			break
		}
	}
	if since := time.Since(expired); since < 100*time.Millisecond {
		t.Fatalf("writer granted %v after the expiry, before the lock-delay ran", since)
	}
}
