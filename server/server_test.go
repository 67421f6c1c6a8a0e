package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(probeAddrEnv); addr != "" {
		os.Exit(runProbe(addr)) // the unrelated client of the load test, in a process of its own
	}
	code := m.Run()
	servertest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func start(t *testing.T, edit func(*server.Config)) *servertest.Embedded {
	t.Helper()
	cfg := servertest.Config(t, t.TempDir())
	if edit != nil {
		edit(&cfg)
	}
	return servertest.StartEmbedded(t, cfg)
}

func grpcClient(t *testing.T, addr string) dlockv1.LockClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return dlockv1.NewLockClient(cc)
}

// post sends a JSON request as curl -d would and decodes the answer.
func post(t *testing.T, addr, path, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: answer %q is not JSON: %v", path, b, err)
	}
	return resp.StatusCode, m
}

func TestConfig_Validate(t *testing.T) {
	if err := server.DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
	d := server.DefaultConfig()
	if d.Listen != "127.0.0.1:7450" || d.DataDir != "./dlockd-data" || server.DefaultStoreURL != "dlockd://127.0.0.1:7450" {
		t.Fatalf("defaults: %s %s %s", d.Listen, d.DataDir, server.DefaultStoreURL)
	}
	cases := map[string]func(*server.Config){
		"no node":        func(c *server.Config) { c.NodeID = "" },
		"bad listen":     func(c *server.Config) { c.Listen = "nope" },
		"no data":        func(c *server.Config) { c.DataDir = "" },
		"peers":          func(c *server.Config) { c.InitialCluster = []server.Peer{{ID: "b", RaftAddr: "127.0.0.1:1"}} },
		"key size":       func(c *server.Config) { c.MaxKeyBytes = 513 },
		"ttl range":      func(c *server.Config) { c.MinTTL, c.MaxTTL = time.Second, time.Millisecond },
		"default ttl":    func(c *server.Config) { c.DefaultTTL = 48 * time.Hour },
		"lease timeout":  func(c *server.Config) { c.LeaderLeaseTimeout = 2 * c.HeartbeatTimeout },
		"append entries": func(c *server.Config) { c.MaxAppendEntries = 5000 },
		"log level":      func(c *server.Config) { c.RaftLogLevel = "loud" },
	}
	for name, edit := range cases {
		c := server.DefaultConfig()
		edit(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate() = nil", name)
		}
		if _, err := server.New(c); err == nil {
			t.Errorf("%s: New() = nil error", name)
		}
	}
}

func TestServer_JSONOverHTTP(t *testing.T) {
	srv := start(t, nil)
	a := srv.Addr()
	code, m := post(t, a, "/v1/acquire", `{"key":"k","ttl":"30s","holder":"curl"}`)
	if code != 200 || m["fence"] == "" || m["owner"] == "" {
		t.Fatalf("acquire: %d %v", code, m)
	}
	owner, fence := m["owner"].(string), m["fence"].(string)
	code, m = post(t, a, "/v1/acquire", `{"key":"k","ttl":"30s"}`)
	if code != http.StatusConflict || m["reason"] != "LOCK_HELD" || m["code"] != "FAILED_PRECONDITION" {
		t.Fatalf("acquire of a held key: %d %v", code, m)
	}
	code, m = post(t, a, "/v1/check-fence", fmt.Sprintf(`{"key":"k","fence":%q}`, fence))
	if code != 200 || m["current"] != true {
		t.Fatalf("check-fence: %d %v", code, m)
	}
	code, m = post(t, a, "/v1/renew", fmt.Sprintf(`{"items":[{"key":"k","owner":%q},{"key":"k","owner":"someone-else"}]}`, owner))
	res, _ := m["results"].([]any)
	if code != 200 || len(res) != 2 || res[0].(map[string]any)["ok"] != true || res[1].(map[string]any)["reason"] != "LEASE_LOST" {
		t.Fatalf("renew: %d %v", code, m)
	}
	resp, err := http.Get("http://" + a + "/v1/inspect?key=k")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(b, []byte(`"holder":"curl"`)) || !bytes.Contains(b, []byte(`"held":true`)) {
		t.Fatalf("inspect: %s", b)
	}
	code, m = post(t, a, "/v1/list", `{"prefix":"k"}`)
	if hs, _ := m["holders"].([]any); code != 200 || len(hs) != 1 {
		t.Fatalf("list: %d %v", code, m)
	}
	code, m = post(t, a, "/v1/release", `{"key":"k","owner":"someone-else"}`)
	if code != http.StatusNotFound || m["reason"] != "LEASE_LOST" {
		t.Fatalf("release by a stranger: %d %v", code, m)
	}
	code, _ = post(t, a, "/v1/release", fmt.Sprintf(`{"key":"k","owner":%q}`, owner))
	if code != 200 {
		t.Fatalf("release: %d", code)
	}
	code, m = post(t, a, "/v1/check-fence", fmt.Sprintf(`{"key":"k","fence":%q}`, fence))
	if code != 200 || m["current"] != false {
		t.Fatalf("check-fence after release: %d %v", code, m)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + a + path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	resp, err = http.Get("http://" + a + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`dlockd_raft_state{state="leader"} 1`, "dlockd_held_leases 0", "dlockd_waiters 0", "dlockd_raft_apply_seconds_count", `dlockd_requests_total{code="FailedPrecondition",method="Acquire",transport="http"} 1`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestServer_BadInputNeverChangesState(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.MaxRequestBytes = 4096 })
	a := srv.Addr()
	cases := []struct {
		name, path, body string
		code             int
		reason           string
	}{
		{"empty key", "/v1/acquire", `{"key":""}`, 400, "INVALID_KEY"},
		{"long key", "/v1/acquire", `{"key":"` + strings.Repeat("k", 513) + `"}`, 400, "INVALID_KEY"},
		{"NUL key", "/v1/acquire", `{"key":"a\u0000b"}`, 400, "INVALID_KEY"},
		{"short TTL", "/v1/acquire", `{"key":"k","ttl":"0.099s"}`, 400, "INVALID_TTL"},
		{"long TTL", "/v1/acquire", `{"key":"k","ttl":"86401s"}`, 400, "INVALID_TTL"},
		{"negative TTL", "/v1/acquire", `{"key":"k","ttl":"-1s"}`, 400, "INVALID_TTL"},
		{"bad owner", "/v1/acquire", `{"key":"k","owner":"has space"}`, 400, "INVALID_OWNER"},
		{"guessable owner", "/v1/acquire", `{"key":"k","owner":"x"}`, 400, "INVALID_OWNER"},
		{"malformed JSON", "/v1/acquire", `{"key":`, 400, "INVALID_REQUEST"},
		{"wrong type", "/v1/acquire", `{"key":5}`, 400, "INVALID_REQUEST"},
		{"too large", "/v1/acquire", `{"key":"` + strings.Repeat("k", 5000) + `"}`, 413, "REQUEST_TOO_LARGE"},
		{"renew with one bad item", "/v1/renew", `{"items":[{"key":"a","owner":"0123456789"},{"key":""}]}`, 400, "INVALID_KEY"},
		{"fence zero", "/v1/check-fence", `{"key":"k","fence":"0"}`, 400, "INVALID_REQUEST"},
		{"release no owner", "/v1/release", `{"key":"k"}`, 400, "INVALID_OWNER"},
	}
	// The leader's own first entry (a no-op command) is the only proposal
	// before the bad requests.
	before := metric(t, a, "dlockd_raft_apply_seconds_count")
	for _, tc := range cases {
		code, m := post(t, a, tc.path, tc.body)
		if code != tc.code || m["reason"] != tc.reason {
			t.Errorf("%s: %d %v, want %d %s", tc.name, code, m, tc.code, tc.reason)
		}
	}
	// gRPC gives the same answers with gRPC codes.
	c := grpcClient(t, a)
	// Invalid UTF-8 in a key: over JSON, refused as malformed; over gRPC,
	// protobuf itself refuses to carry it (proto3 strings are UTF-8).
	code, m := post(t, a, "/v1/acquire", "{\"key\":\"a\xffb\"}")
	if code != 400 {
		t.Errorf("JSON invalid UTF-8 key: %d %v", code, m)
	}
	_, err := c.Acquire(t.Context(), &dlockv1.AcquireRequest{Key: strings.Repeat("k", 8000)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("gRPC message over the limit: %v", err)
	}
	_, err = c.Acquire(t.Context(), &dlockv1.AcquireRequest{Key: "k", Ttl: &durationpb.Duration{Seconds: 1, Nanos: -5}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("gRPC malformed duration: %v", err)
	}
	code, m = post(t, a, "/v1/list", `{}`)
	if hs, _ := m["holders"].([]any); code != http.StatusOK || len(hs) != 0 {
		t.Fatalf("bad requests left state behind: %v", m)
	}
	if after := metric(t, a, "dlockd_raft_apply_seconds_count"); after != before {
		t.Fatalf("bad requests reached the log: %s proposals before them, %s after", before, after)
	}
}

func metric(t *testing.T, addr, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

func TestServer_Limits(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.MaxWaitersPerKey = 1; c.MaxLeases = 2; c.MaxRenewBatch = 2 })
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	for _, k := range []string{"a", "b"} {
		if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "c"})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "TOO_MANY_LEASES") {
		t.Fatalf("3rd lease: %v", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(wctx, &dlockv1.AcquireRequest{Key: "a", Wait: true})
		done <- err
	}()
	waitFor(t, func() bool {
		r, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "a"})
		return err == nil && r.GetWaiters() == 1
	})
	_, err = c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "a", Wait: true})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "TOO_MANY_WAITERS") {
		t.Fatalf("2nd waiter: %v", err)
	}
	code, m := post(t, srv.Addr(), "/v1/acquire", `{"key":"a","wait":true}`)
	if code != http.StatusTooManyRequests {
		t.Fatalf("2nd waiter over HTTP: %d %v", code, m)
	}
	_, err = c.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "a", Owner: "xxxxxxxx"}, {Key: "a", Owner: "xxxxxxxx"}, {Key: "a", Owner: "xxxxxxxx"}}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("renew batch over the limit: %v", err)
	}
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled waiter: %v", err)
	}
	waitFor(t, func() bool {
		r, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "a"})
		return err == nil && r.GetWaiters() == 0
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestServer_ExpiryHandsOffAndPushesLoss(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch, err := c.Watch(wctx, &dlockv1.WatchRequest{Session: "session-1"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := watch.Recv(); err != nil || ev.GetType() != dlockv1.WatchEvent_READY {
		t.Fatalf("watch: %v %v", ev, err)
	}
	ttl := 300 * time.Millisecond
	// The holder's validity runs from when it sent the request (the
	// server's countdown starts when the grant is applied, before the
	// answer arrives), so that is what the expiry is measured against.
	sent := time.Now()
	g, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(ttl), Session: "session-1"})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&dlockv1.AcquireRequest{Key: "k", Owner: "owner-b-0000", Ttl: durationpb.New(time.Second)}); err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED || ev.GetPosition() != 1 {
		t.Fatalf("wait: %v %v", ev, err)
	}
	ev, err = stream.Recv()
	if err != nil || ev.GetType() != dlockv1.WaitEvent_GRANTED {
		t.Fatalf("wait: %v %v", ev, err)
	}
	if since := time.Since(sent); since < ttl {
		t.Fatalf("expired %v after the acquisition was sent, before the TTL %v", since, ttl)
	}
	if ev.GetGrant().GetFence() <= g.GetFence() {
		t.Fatalf("handoff fence %d not greater than %d", ev.GetGrant().GetFence(), g.GetFence())
	}
	lost, err := watch.Recv()
	if err != nil || lost.GetType() != dlockv1.WatchEvent_LOST || lost.GetKey() != "k" || lost.GetOwner() != "owner-a-0000" || lost.GetFence() != g.GetFence() {
		t.Fatalf("loss push: %v %v", lost, err)
	}
	r, err := c.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "k", Owner: "owner-a-0000"}, {Key: "k", Owner: "owner-b-0000"}}})
	if err != nil || r.GetResults()[0].GetOk() || !r.GetResults()[1].GetOk() {
		t.Fatalf("renew after expiry: %v %v", r, err)
	}
}

func TestServer_RenewKeepsLease(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	// Renewals every TTL/5 for two TTLs: the lease outlives its TTL only
	// by renewals, with room for a loaded machine's scheduling delays.
	ttl := time.Second
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(ttl)}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		time.Sleep(ttl / 5)
		r, err := c.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "k", Owner: "owner-a-0000"}}})
		if err != nil || !r.GetResults()[0].GetOk() {
			t.Fatalf("renew: %v %v", r, err)
		}
	}
	// A renewal with a longer TTL goes through the log and sticks.
	r, err := c.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(time.Minute)}}})
	if err != nil || !r.GetResults()[0].GetOk() {
		t.Fatalf("renew with a new TTL: %v %v", r, err)
	}
	time.Sleep(2 * ttl)
	in, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
	if err != nil || !in.GetHeld() || in.GetInfo().GetTtl().AsDuration() != time.Minute {
		t.Fatalf("inspect: %v %v", in, err)
	}
}

// TestServer_RestartRestartsCountdowns: a grant that had 750 ms left when
// the server stopped is held for a full TTL after it starts again. (It was
// renewed 250 ms before the stop, less than 2/5 of its TTL: a grant
// unrenewed for longer is suspect, and restarts at the time left it logged;
// see TestCluster_SuspectLeaseFreesUnderLeaderChurn.)
func TestServer_RestartRestartsCountdowns(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	ttl := time.Second
	g, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(ttl)})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond)
	if r, err := c.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "k", Owner: "owner-a-0000"}}}); err != nil || !r.GetResults()[0].GetOk() {
		t.Fatalf("renew: %v %v", r, err)
	}
	time.Sleep(250 * time.Millisecond)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now() // before Start, which restarts the countdowns
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	in, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"}, grpc.WaitForReady(true))
	if err != nil || !in.GetHeld() || in.GetInfo().GetFence() != g.GetFence() {
		t.Fatalf("after restart: %v %v", in, err)
	}
	if rem := in.GetInfo().GetRemaining().AsDuration(); rem < ttl-time.Since(restarted)-50*time.Millisecond {
		t.Fatalf("remaining %v after restart, want about the full TTL %v", rem, ttl)
	}
	r, err := c.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "k", Owner: "owner-a-0000"}}})
	if err != nil || !r.GetResults()[0].GetOk() {
		t.Fatalf("renew after restart: %v %v", r, err)
	}
	g2, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "other"})
	if err != nil || g2.GetFence() <= g.GetFence() {
		t.Fatalf("fence after restart %d, %v; want > %d", g2.GetFence(), err, g.GetFence())
	}
}

// TestServer_ShutdownEndsWaiters: a graceful shutdown answers waiting
// requests UNAVAILABLE; grants stay, and so do the queue entries, for their
// grace (their TTL) after the restart, then they are purged.
func TestServer_ShutdownEndsWaiters(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: fmt.Sprintf("owner-w-%04d", i), Wait: true, Ttl: durationpb.New(3 * time.Second)})
			errs <- err
		}()
	}
	waitFor(t, func() bool {
		r, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
		return err == nil && r.GetWaiters() == 3
	})
	began := time.Now()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Errorf("shutdown took %v", d)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if status.Code(err) != codes.Unavailable {
			t.Errorf("waiter after shutdown: %v, want UNAVAILABLE", err)
		}
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	r, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"}, grpc.WaitForReady(true))
	if err != nil || !r.GetHeld() || r.GetWaiters() != 3 {
		t.Fatalf("right after restart: %v %v; want held, the 3 waiters kept for their grace", r, err)
	}
	waitFor(t, func() bool {
		r, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
		return err == nil && r.GetHeld() && r.GetWaiters() == 0
	})
}

// TestServer_WaitStreamCancel: half-closing a Wait stream removes the queue
// entry before the server answers CANCELLED.
func TestServer_WaitStreamCancel(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000"}); err != nil {
		t.Fatal(err)
	}
	stream, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&dlockv1.AcquireRequest{Key: "k", Owner: "owner-b-0000"}); err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED {
		t.Fatalf("%v %v", ev, err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err != nil || ev.GetType() != dlockv1.WaitEvent_CANCELLED {
		t.Fatalf("%v %v", ev, err)
	}
	r, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
	if err != nil || r.GetWaiters() != 0 {
		t.Fatalf("after cancel: %v %v", r, err)
	}
	if _, err := c.Release(ctx, &dlockv1.ReleaseRequest{Key: "k", Owner: "owner-a-0000"}); err != nil {
		t.Fatal(err)
	}
	r, err = c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
	if err != nil || r.GetHeld() {
		t.Fatalf("cancelled waiter was granted: %v %v", r, err)
	}
}

func TestServer_StartErrors(t *testing.T) {
	srv := start(t, nil)
	// A second server on the same data directory fails clearly, no hang.
	cfg := servertest.Config(t, srv.Cfg.DataDir)
	s2, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	err = s2.Start()
	if err == nil || time.Since(began) > 5*time.Second {
		t.Fatalf("second server on the same data: %v after %v", err, time.Since(began))
	}
	_ = s2.Close()
	if err := s2.Start(); !errors.Is(err, server.ErrServerClosed) {
		t.Fatalf("Start after Close = %v", err)
	}
}

// TestServer_HTTPWaiterGoneIsRemoved: a curl-style waiting acquire whose
// client goes away leaves no queue entry.
func TestServer_HTTPWaiterGoneIsRemoved(t *testing.T) {
	srv := start(t, nil)
	a := srv.Addr()
	code, _ := post(t, a, "/v1/acquire", `{"key":"k","owner":"owner-a-0000"}`)
	if code != 200 {
		t.Fatal(code)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+a+"/v1/acquire", strings.NewReader(`{"key":"k","owner":"owner-w-0000","wait":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
	}()
	c := grpcClient(t, a)
	waitFor(t, func() bool {
		r, err := c.Inspect(t.Context(), &dlockv1.InspectRequest{Key: "k"})
		return err == nil && r.GetWaiters() == 1
	})
	cancel()
	<-done
	waitFor(t, func() bool {
		r, err := c.Inspect(t.Context(), &dlockv1.InspectRequest{Key: "k"})
		return err == nil && r.GetWaiters() == 0
	})
	code, _ = post(t, a, "/v1/release", `{"key":"k","owner":"owner-a-0000"}`)
	if code != 200 {
		t.Fatal(code)
	}
	r, err := c.Inspect(t.Context(), &dlockv1.InspectRequest{Key: "k"})
	if err != nil || r.GetHeld() {
		t.Fatalf("the gone waiter was granted: %v %v", r, err)
	}
	http.DefaultClient.CloseIdleConnections()
}

// TestServer_SnapshotRestoreOnRestart: with a tiny snapshot threshold Raft
// snapshots the table and truncates the log; a restart restores from the
// snapshot plus the log tail, keeping grants, queue-free keys and fences.
func TestServer_SnapshotRestoreOnRestart(t *testing.T) {
	srv := start(t, func(c *server.Config) {
		c.SnapshotThreshold = 50
		c.SnapshotInterval = 50 * time.Millisecond
		c.TrailingLogs = 5
	})
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	fences := map[string]uint64{}
	for i := range 200 {
		k := fmt.Sprintf("snap/%03d", i)
		g, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: k, Owner: fmt.Sprintf("owner-%08d", i), Ttl: durationpb.New(time.Minute), Holder: "h"})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := c.Release(ctx, &dlockv1.ReleaseRequest{Key: k, Owner: fmt.Sprintf("owner-%08d", i)}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		fences[k] = g.GetFence()
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
	if len(l.GetHolders()) != len(fences) {
		t.Fatalf("%d keys held after restart, want %d", len(l.GetHolders()), len(fences))
	}
	var maxFence uint64
	for _, h := range l.GetHolders() {
		if fences[h.GetKey()] != h.GetFence() || h.GetHolder() != "h" {
			t.Fatalf("%s: fence %d holder %q after restart, want %d", h.GetKey(), h.GetFence(), h.GetHolder(), fences[h.GetKey()])
		}
		maxFence = max(maxFence, h.GetFence())
	}
	g, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "snap/000", Owner: "owner-new-0000"})
	if err != nil || g.GetFence() <= maxFence {
		t.Fatalf("fence after restart %d, %v; want > %d", g.GetFence(), err, maxFence)
	}
}

// TestServer_ManyExpiries: 2,000 short leases all expire, in batched expire
// entries, and the table empties.
func TestServer_ManyExpiries(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 2000; i += 8 {
				if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: fmt.Sprintf("exp/%d", i), Ttl: durationpb.New(200 * time.Millisecond)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	waitFor(t, func() bool {
		l, err := c.List(ctx, &dlockv1.ListRequest{Prefix: "exp/"})
		return err == nil && len(l.GetHolders()) == 0
	})
	if v := metric(t, srv.Addr(), "dlockd_leases_expired_total"); v != "2000" {
		t.Fatalf("expired counter %s, want 2000", v)
	}
}
