package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dlock-dev/dlock/internal/authtoken"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// authFixture is a server started with an auth file of four identities:
// locker (lock on "payout:"), reader (read on "payout:"), admin (admin on
// "", lock on "") and nobody (no rules).
type authFixture struct {
	e        *servertest.Embedded
	ids      map[string]*servertest.Identity
	authFile string
	audit    string
	logs     *lockedBuffer
	dir      string
}

func (f *authFixture) tok(name string) string { return f.ids[name].Token }

// lockedBuffer is a bytes.Buffer safe for the server's concurrent logging.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func authIdentities() []servertest.Identity {
	return []servertest.Identity{
		{Name: "locker", Rules: map[string][]string{"payout:": {"lock"}}},
		{Name: "reader", Rules: map[string][]string{"payout:": {"read"}}},
		{Name: "admin", Rules: map[string][]string{"": {"admin", "lock"}}},
		{Name: "nobody", Rules: map[string][]string{}},
	}
}

func startAuth(t *testing.T, edit func(*server.Config)) *authFixture {
	t.Helper()
	dir := t.TempDir()
	ids := authIdentities()
	f := &authFixture{ids: map[string]*servertest.Identity{}, dir: dir, logs: &lockedBuffer{}}
	f.authFile = servertest.WriteAuthFile(t, dir, ids)
	for i := range ids {
		f.ids[ids[i].Name] = &ids[i]
	}
	f.audit = filepath.Join(dir, "audit.log")
	f.e = start(t, func(c *server.Config) {
		c.AuthFile = f.authFile
		c.AuditLogFile = f.audit
		c.Pprof = true
		c.Logger = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		if edit != nil {
			edit(c)
		}
	})
	return f
}

// withToken returns ctx sending tok as a bearer token.
func withToken(ctx context.Context, tok string) context.Context {
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// wantCode fails unless err is a gRPC status of code c whose message
// contains every string of want.
func wantCode(t *testing.T, what string, err error, c codes.Code, want ...string) {
	t.Helper()
	st, _ := status.FromError(err)
	if c == codes.OK {
		if err != nil {
			t.Fatalf("%s: %v, want success", what, err)
		}
		return
	}
	if st.Code() != c {
		t.Fatalf("%s: %v (code %v), want %v", what, err, st.Code(), c)
	}
	for _, w := range want {
		if !strings.Contains(st.Message(), w) {
			t.Fatalf("%s: message %q lacks %q", what, st.Message(), w)
		}
	}
}

func acquireReq(key string) *dlockv1.AcquireRequest {
	return &dlockv1.AcquireRequest{Key: key, Owner: "owner-" + strings.ReplaceAll(key, ":", "-") + "-0123456789", Ttl: durationpb.New(30 * time.Second)}
}

// TestAuth_GRPCPermissions: each permission allowed and denied over gRPC,
// on the right and the wrong prefix; missing and unknown tokens are
// UNAUTHENTICATED.
func TestAuth_GRPCPermissions(t *testing.T) {
	f := startAuth(t, nil)
	c := grpcClient(t, f.e.Addr())
	ctx := t.Context()
	// lock
	g, err := c.Acquire(withToken(ctx, f.tok("locker")), acquireReq("payout:1"))
	wantCode(t, "locker acquires payout:1", err, codes.OK)
	_, err = c.Acquire(withToken(ctx, f.tok("locker")), acquireReq("settle:1"))
	wantCode(t, "locker acquires settle:1", err, codes.PermissionDenied, `"settle:1"`, "lock", "locker")
	_, err = c.Acquire(withToken(ctx, f.tok("reader")), acquireReq("payout:2"))
	wantCode(t, "reader acquires", err, codes.PermissionDenied, `"payout:2"`, "lock")
	_, err = c.Renew(withToken(ctx, f.tok("locker")), &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "payout:1", Owner: g.GetOwner()}, {Key: "settle:9", Owner: g.GetOwner()}}})
	wantCode(t, "locker renews payout:1 and settle:9", err, codes.PermissionDenied, `"settle:9"`)
	_, err = c.Renew(withToken(ctx, f.tok("locker")), &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "payout:1", Owner: g.GetOwner()}}})
	wantCode(t, "locker renews payout:1", err, codes.OK)
	_, err = c.CancelWait(withToken(ctx, f.tok("reader")), &dlockv1.CancelWaitRequest{Key: "payout:1", Owner: g.GetOwner()})
	wantCode(t, "reader cancels a wait", err, codes.PermissionDenied, "lock")
	// read
	_, err = c.Inspect(withToken(ctx, f.tok("reader")), &dlockv1.InspectRequest{Key: "payout:1"})
	wantCode(t, "reader inspects payout:1", err, codes.OK)
	_, err = c.Inspect(withToken(ctx, f.tok("reader")), &dlockv1.InspectRequest{Key: "settle:1"})
	wantCode(t, "reader inspects settle:1", err, codes.PermissionDenied, `"settle:1"`, "read")
	_, err = c.Inspect(withToken(ctx, f.tok("locker")), &dlockv1.InspectRequest{Key: "payout:1"})
	wantCode(t, "locker inspects", err, codes.PermissionDenied, "read")
	_, err = c.CheckFence(withToken(ctx, f.tok("reader")), &dlockv1.CheckFenceRequest{Key: "payout:1", Fence: g.GetFence()})
	wantCode(t, "reader checks a fence", err, codes.OK)
	_, err = c.CheckFence(withToken(ctx, f.tok("locker")), &dlockv1.CheckFenceRequest{Key: "payout:1", Fence: g.GetFence()})
	wantCode(t, "locker checks a fence", err, codes.PermissionDenied, "read")
	// admin (implies read, not lock)
	_, err = c.ForceRelease(withToken(ctx, f.tok("reader")), &dlockv1.ForceReleaseRequest{Key: "payout:1", Reason: "test"})
	wantCode(t, "reader force-releases", err, codes.PermissionDenied, "admin", `"payout:1"`)
	_, err = c.Inspect(withToken(ctx, f.tok("admin")), &dlockv1.InspectRequest{Key: "payout:1"})
	wantCode(t, "admin inspects", err, codes.OK)
	_, err = c.ForceRelease(withToken(ctx, f.tok("admin")), &dlockv1.ForceReleaseRequest{Key: "payout:1", Reason: "stuck job"})
	wantCode(t, "admin force-releases", err, codes.OK)
	_, err = c.Release(withToken(ctx, f.tok("locker")), &dlockv1.ReleaseRequest{Key: "settle:1", Owner: g.GetOwner()})
	wantCode(t, "locker releases settle:1", err, codes.PermissionDenied, "lock")
	// authentication
	_, err = c.Acquire(ctx, acquireReq("payout:3"))
	wantCode(t, "no token", err, codes.Unauthenticated, "no credentials")
	_, err = c.Acquire(withToken(ctx, "dlk_not-a-real-token"), acquireReq("payout:3"))
	wantCode(t, "unknown token", err, codes.Unauthenticated, "unknown token")
	_, err = c.Acquire(metadata.AppendToOutgoingContext(ctx, "authorization", "Basic dXNlcjpwYXNz"), acquireReq("payout:3"))
	wantCode(t, "basic auth", err, codes.Unauthenticated, "Bearer")
	_, err = c.Acquire(withToken(ctx, f.tok("nobody")), acquireReq("payout:3"))
	wantCode(t, "nobody", err, codes.PermissionDenied, "nobody")
	// A client cannot claim an identity by the forwarding header.
	_, err = c.Acquire(metadata.AppendToOutgoingContext(ctx, "dlock-identity", "admin"), acquireReq("payout:3"))
	wantCode(t, "dlock-identity without a member certificate", err, codes.Unauthenticated)
	_, err = c.Acquire(metadata.AppendToOutgoingContext(withToken(ctx, f.tok("locker")), "dlock-identity", "admin"), acquireReq("settle:3"))
	wantCode(t, "locker naming admin", err, codes.PermissionDenied, "locker")
}

// httpDo sends method path with body and token; it returns the status, the
// decoded JSON body (nil if not JSON) and the response headers.
func httpDo(t *testing.T, addr, method, path, body, tok string) (int, map[string]any, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m, resp.Header
}

// TestAuth_HTTPPermissions: the same over the JSON API: 401 without or
// with an unknown token, 403 naming the key and the permission, public
// health and metrics routes, pprof for admins only.
func TestAuth_HTTPPermissions(t *testing.T) {
	f := startAuth(t, nil)
	a := f.e.Addr()
	cases := []struct {
		name, method, path, body, who string
		want                          int
		msg                           []string
	}{
		{"locker acquires payout", "POST", "/v1/acquire", `{"key":"payout:1","owner":"owner-payout-1-abcdef","ttl":"30s"}`, "locker", 200, nil},
		{"locker acquires settle", "POST", "/v1/acquire", `{"key":"settle:1","owner":"owner-settle-1-abcdef","ttl":"30s"}`, "locker", 403, []string{`\"settle:1\"`, "lock"}},
		{"reader acquires payout", "POST", "/v1/acquire", `{"key":"payout:2","owner":"owner-payout-2-abcdef","ttl":"30s"}`, "reader", 403, []string{"lock"}},
		{"locker renews settle", "POST", "/v1/renew", `{"items":[{"key":"settle:1","owner":"owner-settle-1-abcdef"}]}`, "locker", 403, []string{"lock"}},
		{"locker releases settle", "POST", "/v1/release", `{"key":"settle:1","owner":"owner-settle-1-abcdef"}`, "locker", 403, []string{"lock"}},
		{"locker cancels settle", "POST", "/v1/cancel-wait", `{"key":"settle:1","owner":"owner-settle-1-abcdef"}`, "locker", 403, []string{"lock"}},
		{"reader inspects payout", "POST", "/v1/inspect", `{"key":"payout:1"}`, "reader", 200, nil},
		{"reader GET inspect payout", "GET", "/v1/inspect?key=payout:1", "", "reader", 200, nil},
		{"reader GET inspect settle", "GET", "/v1/inspect?key=settle:1", "", "reader", 403, []string{"read", `\"settle:1\"`}},
		{"locker inspects payout", "POST", "/v1/inspect", `{"key":"payout:1"}`, "locker", 403, []string{"read"}},
		{"reader checks fence", "POST", "/v1/check-fence", `{"key":"payout:1","fence":"1"}`, "reader", 200, nil},
		{"locker checks fence", "POST", "/v1/check-fence", `{"key":"payout:1","fence":"1"}`, "locker", 403, []string{"read"}},
		{"reader lists settle", "GET", "/v1/list?prefix=settle:", "", "reader", 403, []string{"read"}},
		{"reader force-releases", "POST", "/v1/force-release", `{"key":"payout:1","reason":"x"}`, "reader", 403, []string{"admin"}},
		{"admin force-releases", "POST", "/v1/force-release", `{"key":"payout:1","reason":"stuck"}`, "admin", 200, nil},
		{"reader cluster status", "GET", "/v1/cluster/status", "", "reader", 403, []string{"read"}},
		{"admin cluster status", "GET", "/v1/cluster/status", "", "admin", 200, nil},
		{"reader cluster add", "POST", "/v1/cluster/add", `{"id":"n9","raft_addr":"127.0.0.1:9"}`, "reader", 403, []string{"admin"}},
		{"locker cluster remove", "POST", "/v1/cluster/remove", `{"id":"n9"}`, "locker", 403, []string{"admin"}},
		{"locker cluster transfer", "POST", "/v1/cluster/transfer-leader", `{}`, "locker", 403, []string{"admin"}},
		{"admin cluster transfer (one voter)", "POST", "/v1/cluster/transfer-leader", `{}`, "admin", 409, []string{"no other voter"}},
		{"no token", "POST", "/v1/acquire", `{"key":"payout:3","owner":"owner-payout-3-abcdef"}`, "", 401, []string{"no credentials"}},
		{"unknown token", "POST", "/v1/acquire", `{"key":"payout:3","owner":"owner-payout-3-abcdef"}`, "bogus", 401, []string{"unknown token"}},
		{"no token, unknown route", "GET", "/v1/nothing", "", "", 401, nil},
		{"healthz public", "GET", "/healthz", "", "", 200, nil},
		{"readyz public", "GET", "/readyz", "", "", 200, nil},
		{"metrics public", "GET", "/metrics", "", "", 200, nil},
		{"pprof without token", "GET", "/debug/pprof/", "", "", 401, nil},
		{"pprof reader", "GET", "/debug/pprof/", "", "reader", 403, []string{"admin"}},
		{"pprof admin", "GET", "/debug/pprof/", "", "admin", 200, nil},
	}
	for _, c := range cases {
		tok := ""
		switch c.who {
		case "":
		case "bogus":
			tok = "dlk_bogus"
		default:
			tok = f.tok(c.who)
		}
		code, body, hdr := httpDo(t, a, c.method, c.path, c.body, tok)
		if code != c.want {
			t.Errorf("%s: HTTP %d %v, want %d", c.name, code, body, c.want)
			continue
		}
		raw, _ := json.Marshal(body)
		for _, m := range c.msg {
			if !strings.Contains(string(raw), m) {
				t.Errorf("%s: body %s lacks %s", c.name, raw, m)
			}
		}
		switch code {
		case 401:
			if hdr.Get("WWW-Authenticate") == "" {
				t.Errorf("%s: 401 without WWW-Authenticate", c.name)
			}
			if body != nil && body["code"] != "UNAUTHENTICATED" {
				t.Errorf("%s: code %v, want UNAUTHENTICATED", c.name, body["code"])
			}
		case 403:
			if body["code"] != "PERMISSION_DENIED" || body["reason"] != "PERMISSION_DENIED" {
				t.Errorf("%s: code %v reason %v, want PERMISSION_DENIED", c.name, body["code"], body["reason"])
			}
		}
	}
}

// TestAuth_ListFiltered: a list answers only the keys the caller may read;
// a list of a prefix under which it may read nothing is denied.
func TestAuth_ListFiltered(t *testing.T) {
	f := startAuth(t, nil)
	c := grpcClient(t, f.e.Addr())
	ctx := t.Context()
	for _, k := range []string{"payout:1", "payout:2", "settle:1", "zz"} {
		if _, err := c.Acquire(withToken(ctx, f.tok("admin")), acquireReq(k)); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(r *dlockv1.ListResponse) string {
		var ks []string
		for _, h := range r.GetHolders() {
			ks = append(ks, h.GetKey())
		}
		return strings.Join(ks, ",")
	}
	r, err := c.List(withToken(ctx, f.tok("reader")), &dlockv1.ListRequest{})
	wantCode(t, "reader lists everything", err, codes.OK)
	if got := keys(r); got != "payout:1,payout:2" {
		t.Fatalf("reader's list of \"\": %q, want payout:1,payout:2", got)
	}
	r, err = c.List(withToken(ctx, f.tok("reader")), &dlockv1.ListRequest{Prefix: "payout:1"})
	wantCode(t, "reader lists payout:1", err, codes.OK)
	if got := keys(r); got != "payout:1" {
		t.Fatalf("reader's list of payout:1: %q", got)
	}
	_, err = c.List(withToken(ctx, f.tok("reader")), &dlockv1.ListRequest{Prefix: "settle:"})
	wantCode(t, "reader lists settle:", err, codes.PermissionDenied, "read", `"settle:"`)
	_, err = c.List(withToken(ctx, f.tok("locker")), &dlockv1.ListRequest{})
	wantCode(t, "locker lists", err, codes.PermissionDenied, "read")
	r, err = c.List(withToken(ctx, f.tok("admin")), &dlockv1.ListRequest{})
	wantCode(t, "admin lists", err, codes.OK)
	if got := keys(r); got != "payout:1,payout:2,settle:1,zz" {
		t.Fatalf("admin's list: %q", got)
	}
	// HTTP too.
	code, body, _ := httpDo(t, f.e.Addr(), "GET", "/v1/list", "", f.tok("reader"))
	raw, _ := json.Marshal(body)
	if code != 200 || !strings.Contains(string(raw), "payout:2") || strings.Contains(string(raw), "settle:1") || strings.Contains(string(raw), `"zz"`) {
		t.Fatalf("reader's HTTP list: %d %s", code, raw)
	}
}

// TestAuth_SessionStreamPerCall: on one Session stream, a call on a denied
// key is answered PERMISSION_DENIED while calls on allowed keys succeed,
// before and after it.
func TestAuth_SessionStreamPerCall(t *testing.T) {
	f := startAuth(t, nil)
	c := grpcClient(t, f.e.Addr())
	st, err := c.Session(withToken(t.Context(), f.tok("locker")))
	if err != nil {
		t.Fatal(err)
	}
	call := func(id uint64, key string) *dlockv1.SessionResponse {
		t.Helper()
		if err := st.Send(&dlockv1.SessionRequest{Id: id, Call: &dlockv1.SessionRequest_Acquire{Acquire: acquireReq(key)}}); err != nil {
			t.Fatal(err)
		}
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := call(1, "payout:a"); r.GetCode() != 0 {
		t.Fatalf("payout:a on the stream: %d %s", r.GetCode(), r.GetMessage())
	}
	r := call(2, "settle:a")
	if codes.Code(r.GetCode()) != codes.PermissionDenied || !strings.Contains(r.GetMessage(), `"settle:a"`) || !strings.Contains(r.GetMessage(), "lock") {
		t.Fatalf("settle:a on the stream: %d %s, want PERMISSION_DENIED naming the key and lock", r.GetCode(), r.GetMessage())
	}
	if r := call(3, "payout:b"); r.GetCode() != 0 {
		t.Fatalf("payout:b after the denial: %d %s", r.GetCode(), r.GetMessage())
	}
	// A release of a denied key on the same stream is denied too.
	if err := st.Send(&dlockv1.SessionRequest{Id: 4, Call: &dlockv1.SessionRequest_Release{Release: &dlockv1.ReleaseRequest{Key: "settle:a", Owner: "owner-settle-a-0123456789"}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || codes.Code(r.GetCode()) != codes.PermissionDenied {
		t.Fatalf("release of settle:a on the stream: %v %v", r, err)
	}
	_ = st.CloseSend()
	// A Session stream without a token is refused as a whole.
	st2, err := c.Session(t.Context())
	if err == nil {
		_, err = st2.Recv()
	}
	wantCode(t, "session without a token", err, codes.Unauthenticated)
}

// TestAuth_WaitAndWatchStreams: a Wait stream on a denied key is refused;
// a Watch stream sends only the loss events of keys the caller may lock or
// read.
func TestAuth_WaitAndWatchStreams(t *testing.T) {
	f := startAuth(t, nil)
	c := grpcClient(t, f.e.Addr())
	ctx := t.Context()
	ws, err := c.Wait(withToken(ctx, f.tok("locker")))
	if err != nil {
		t.Fatal(err)
	}
	req := acquireReq("settle:w")
	req.Wait = true
	if err := ws.Send(req); err != nil {
		t.Fatal(err)
	}
	_, err = ws.Recv()
	wantCode(t, "wait on settle:w", err, codes.PermissionDenied, `"settle:w"`, "lock")

	ws, err = c.Wait(withToken(ctx, f.tok("locker")))
	if err != nil {
		t.Fatal(err)
	}
	req = acquireReq("payout:w")
	req.Wait = true
	if err := ws.Send(req); err != nil {
		t.Fatal(err)
	}
	ev, err := ws.Recv()
	if err != nil || ev.GetType() != dlockv1.WaitEvent_GRANTED {
		t.Fatalf("wait on payout:w: %v %v", ev, err)
	}
	_ = ws.CloseSend()

	// Watch: the admin holds payout:x and settle:x in one session; the
	// locker watching that session hears only of payout:x.
	const session = "0123456789abcdef0123456789abcdef"
	wctx, cancel := context.WithCancel(withToken(ctx, f.tok("locker")))
	defer cancel()
	w, err := c.Watch(wctx, &dlockv1.WatchRequest{Session: session})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := w.Recv(); err != nil || ev.GetType() != dlockv1.WatchEvent_READY {
		t.Fatalf("watch: %v %v", ev, err)
	}
	for _, k := range []string{"settle:x", "payout:x"} {
		r := acquireReq(k)
		r.Session = session
		r.Ttl = durationpb.New(200 * time.Millisecond)
		if _, err := c.Acquire(withToken(ctx, f.tok("admin")), r); err != nil {
			t.Fatal(err)
		}
	}
	ev2, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ev2.GetKey() != "payout:x" || ev2.GetType() != dlockv1.WatchEvent_LOST {
		t.Fatalf("first watch event %v, want the loss of payout:x (settle:x is not the locker's)", ev2)
	}
	// A watch without a token is refused.
	w2, err := c.Watch(ctx, &dlockv1.WatchRequest{Session: session})
	if err == nil {
		_, err = w2.Recv()
	}
	wantCode(t, "watch without a token", err, codes.Unauthenticated)
}

// TestAuth_ReloadRevokesAndKeepsOnError: a token removed from the file is
// refused after Reload; a file that does not parse keeps the rules in
// force, and both reloads are audited.
func TestAuth_ReloadRevokesAndKeepsOnError(t *testing.T) {
	f := startAuth(t, nil)
	c := grpcClient(t, f.e.Addr())
	ctx := t.Context()
	if _, err := c.Acquire(withToken(ctx, f.tok("locker")), acquireReq("payout:r1")); err != nil {
		t.Fatal(err)
	}
	// A broken file: the old rules stay.
	if err := os.WriteFile(f.authFile, []byte("identities:\n  - name: x\n    bogus: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := f.e.Server().Reload()
	if err == nil || !strings.Contains(err.Error(), f.authFile) {
		t.Fatalf("reload of a broken file: %v, want an error naming %s", err, f.authFile)
	}
	if _, err := c.Acquire(withToken(ctx, f.tok("locker")), acquireReq("payout:r2")); err != nil {
		t.Fatalf("locker after a failed reload: %v", err)
	}
	// The file without locker: revoked.
	ids := authIdentities()[1:]
	ids[0].Token = f.tok("reader")
	ids[1].Token = f.tok("admin")
	ids[2].Token = f.tok("nobody")
	servertest.WriteAuthFile(t, f.dir, ids)
	if err := f.e.Server().Reload(); err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(withToken(ctx, f.tok("locker")), acquireReq("payout:r3"))
	wantCode(t, "revoked locker", err, codes.Unauthenticated, "unknown token")
	if _, err := c.Inspect(withToken(ctx, f.tok("reader")), &dlockv1.InspectRequest{Key: "payout:r1"}); err != nil {
		t.Fatalf("reader after the reload: %v", err)
	}
	lines := waitAudit(t, f.audit, func(ls []map[string]any) bool {
		n := 0
		for _, l := range ls {
			if l["action"] == "auth-reload" {
				n++
			}
		}
		return n >= 2
	})
	var results []string
	for _, l := range lines {
		if l["action"] == "auth-reload" {
			results = append(results, l["result"].(string))
		}
	}
	if strings.Join(results, ",") != "failed,ok" {
		t.Fatalf("auth-reload audit results %v, want failed,ok", results)
	}
}

// TestAuth_BadFileRefusesToStart: Start fails with one line naming the
// file, the line and the problem; the port is not served.
func TestAuth_BadFileRefusesToStart(t *testing.T) {
	cases := []struct {
		name, content string
		want          []string
	}{
		{"unknown permission", "identities:\n  - name: a\n    token_sha256: " + strings.Repeat("ab", 32) + "\n    rules:\n      \"p:\": [lock, write]\n", []string{"line 5", `"write"`, "lock, read or admin"}},
		{"unknown field", "identities:\n  - name: a\n    token: dlk_secret\n", []string{"line 3", `"token"`}},
		{"short hash", "identities:\n  - name: a\n    token_sha256: abc123\n", []string{"line 2", "64 hex"}},
		{"YAML syntax", "identities:\n  - name: [a\n", []string{"line"}},
		{"JSON syntax", "{\n \"identities\": [\n  {\"name\": \"a\",}\n ]\n}\n", []string{"line 3", "JSON"}},
		{"duplicate name", "identities:\n  - name: a\n    token_sha256: " + strings.Repeat("ab", 32) + "\n  - name: a\n    token_sha256: " + strings.Repeat("cd", 32) + "\n", []string{"line 4", "twice"}},
		{"empty", "\n", []string{"empty"}},
		{"no credentials", "identities:\n  - name: a\n    rules: {\"\": [read]}\n", []string{"no token_sha256"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "auth.yaml")
			if err := os.WriteFile(file, []byte(c.content), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := servertest.Config(t, filepath.Join(dir, "data"))
			cfg.AuthFile = file
			s, err := server.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = s.Start()
			_ = s.Close()
			if err == nil {
				t.Fatal("started with a bad auth file")
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || !strings.Contains(msg, file) {
				t.Fatalf("error %q: want one line naming %s", msg, file)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Fatalf("error %q lacks %q", msg, w)
				}
			}
			if strings.Contains(msg, "dlk_secret") {
				t.Fatalf("error %q quotes a token", msg)
			}
		})
	}
	// A missing file.
	cfg := servertest.Config(t, t.TempDir())
	cfg.AuthFile = filepath.Join(t.TempDir(), "missing.yaml")
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Start()
	_ = s.Close()
	if err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("missing auth file: %v", err)
	}
}

// TestAuth_YAMLFile: a YAML file as the documentation writes it (one hash
// or a list, CN and DNS lists, quoted prefixes) is read.
func TestAuth_YAMLFile(t *testing.T) {
	dir := t.TempDir()
	tok1, tok2 := "dlk_one_0123456789abcdefghijklmnopqrstuvwxyzABCD", "dlk_two_0123456789abcdefghijklmnopqrstuvwxyzABCD"
	yml := "# dlockd auth file\nidentities:\n" +
		"  - name: payout-worker\n    token_sha256: " + authtoken.Hash(tok1) + "\n    rules:\n      \"payout:\": [lock]\n" +
		"  - name: ops\n    token_sha256: [" + strings.ToUpper(authtoken.Hash(tok2)) + "]\n    cert_cn: [ops.example.com]\n    cert_dns: ops.internal\n    rules:\n      \"\": [admin]\n"
	file := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(file, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	e := start(t, func(c *server.Config) { c.AuthFile = file })
	c := grpcClient(t, e.Addr())
	if _, err := c.Acquire(withToken(t.Context(), tok1), acquireReq("payout:y")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Inspect(withToken(t.Context(), tok2), &dlockv1.InspectRequest{Key: "payout:y"}); err != nil {
		t.Fatalf("ops (admin implies read): %v", err)
	}
	_, err := c.Acquire(withToken(t.Context(), tok2), acquireReq("payout:z"))
	wantCode(t, "ops acquires (admin does not imply lock)", err, codes.PermissionDenied, "lock")
}

// TestAuth_NoFileNoChange: without an auth file a call with or without a
// token is served, as before.
func TestAuth_NoFileNoChange(t *testing.T) {
	e := start(t, nil)
	c := grpcClient(t, e.Addr())
	if _, err := c.Acquire(t.Context(), acquireReq("k:1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(withToken(t.Context(), "anything"), acquireReq("k:2")); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := httpDo(t, e.Addr(), "POST", "/v1/force-release", `{"key":"k:1","reason":"r"}`, ""); code != 200 {
		t.Fatalf("force release without auth: %d", code)
	}
}

// TestConfig_AuthOnClusterNeedsTLS: an auth file on a cluster without peer
// and API TLS is refused in one line; negative rotation bounds too.
func TestConfig_AuthOnClusterNeedsTLS(t *testing.T) {
	cfg := servertest.Config(t, t.TempDir())
	cfg.AuthFile = "/etc/dlockd/auth.yaml"
	cfg.Join = "127.0.0.1:7450"
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "--auth-file") || !strings.Contains(err.Error(), "--tls-cert") || !strings.Contains(err.Error(), "--peer-cert") {
		t.Fatalf("auth on a cluster without TLS: %v", err)
	}
	cfg = servertest.Config(t, t.TempDir())
	cfg.AuditLogMaxBytes = -1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "AuditLogMaxBytes") {
		t.Fatalf("negative AuditLogMaxBytes: %v", err)
	}
}

// waitAudit reads the audit file until cond holds on its lines (each
// parsed as JSON), for up to 5s.
func waitAudit(t *testing.T, path string, cond func([]map[string]any) bool) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var lines []map[string]any
		b, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if l == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("audit line %q is not JSON: %v", l, err)
			}
			lines = append(lines, m)
		}
		if cond(lines) {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit file %s: condition not met; lines: %v", path, lines)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
