package server

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// The fuzz tests feed request decoding and validation with arbitrary input
// through a real, started server: JSON bodies into each /v1/ route's
// handler (the HTTP handler with its recovery, as served), and protobuf
// bytes decoded into each request type and passed to the API methods the
// gRPC server and Session calls use. They check that no input panics or is
// answered with a server error other than 503, that an input refused with
// a client error (4xx, or a gRPC code other than OK) leaves the lock table
// as it was, and that a malformed one (400 or 413, INVALID_ARGUMENT) does
// not even reach the Raft log. (A well-formed request can be refused by
// the lock table itself, a release by a stranger for one, after its log
// entry is applied.)
//
// The server keeps its state from one input to the next, so that releases,
// renewals and checks meet real grants. It cannot wait (MaxWaitersPerKey 0:
// a wait on a held key is refused at once) and nothing expires while the
// fuzzer runs (MinTTL 1h), so every change of state is the doing of the
// input at hand.
//
// Seeds: f.Add below, and testdata/fuzz/<name>/ (the inputs of the bugs of
// the hardening issue), run by plain go test. Fuzz with
//
//	go test -run '^$' -fuzz FuzzHTTPRequest -fuzztime 60s ./server

// fuzzRoutes are the JSON routes, by the fuzzer's route number (mod len).
var fuzzRoutes = []string{
	"/v1/acquire", "/v1/renew", "/v1/release", "/v1/cancel-wait",
	"/v1/check-fence", "/v1/inspect", "/v1/list", "/v1/force-release",
}

// fuzzServer starts the server of a fuzz test.
func fuzzServer(f *testing.F) *Server {
	f.Helper()
	cfg, _ := internalConfig(f)
	cfg.NoSync = true
	cfg.MinTTL, cfg.DefaultTTL, cfg.MaxTTL = time.Hour, time.Hour, 24*time.Hour
	cfg.ClaimWindow = time.Hour
	cfg.MaxWaitersPerKey = 0
	cfg.MaxLeases = 100
	cfg.MaxRequestBytes = 16 << 10
	return startInternal(f, cfg)
}

// tableState returns the lock table as the API lists it (without the
// countdowns, which move) and the index of the last applied log entry.
func tableState(t *testing.T, s *Server) (table string, applied uint64) {
	t.Helper()
	a := &api{s: s}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	token := ""
	for {
		resp, err := a.List(ctx, &dlockv1.ListRequest{Limit: uint32(s.cfg.MaxListLimit), PageToken: token})
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		for _, h := range resp.GetHolders() {
			h.Remaining = nil
			out, _ := protojson.Marshal(h)
			b.Write(out)
			b.WriteByte('\n')
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	applied, _ = s.fsm.appliedIndex()
	return b.String(), applied
}

func FuzzHTTPRequest(f *testing.F) {
	for i, body := range []string{
		`{"key":"a","ttl":"3600s","holder":"fuzz"}`,
		`{"items":[{"key":"a","owner":"0123456789abcdef"}]}`,
		`{"key":"a","owner":"0123456789abcdef"}`,
		`{"key":"a","owner":"0123456789abcdef"}`,
		`{"key":"a","fence":"5"}`,
		`{"key":"a"}`,
		`{"prefix":"a","limit":10}`,
		`{"key":"a","reason":"fuzz"}`,
	} {
		f.Add(uint8(i), []byte(body))
	}
	f.Add(uint8(0), []byte(`{"key":"b","owner":"0123456789abcdef","ttl":"7200s","wait":true,"session":"session-0123456789","lock_delay":"1s"}`))
	f.Add(uint8(0), []byte(`{"key":"c","ttl":"1ms","bogus":[1,{"x":null}]}`))
	f.Add(uint8(0), []byte(`{"key":"s","owner":"0123456789abcdef","shared":true,"limit":2}`))
	f.Add(uint8(0), []byte(`{"key":"s","shared":true,"limit":3}`))
	s := fuzzServer(f)
	h := s.httpSrv.Handler
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		path := fuzzRoutes[int(route)%len(fuzzRoutes)]
		before, appliedBefore := tableState(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		code := rec.Code
		if code >= 500 && code != http.StatusServiceUnavailable {
			t.Fatalf("POST %s %q: %d %s", path, body, code, rec.Body)
		}
		if !bytes.HasPrefix(bytes.TrimSpace(rec.Body.Bytes()), []byte("{")) {
			t.Fatalf("POST %s %q: %d, answer is not a JSON object: %q", path, body, code, rec.Body)
		}
		if code < 400 {
			return
		}
		after, appliedAfter := tableState(t, s)
		if after != before {
			t.Fatalf("POST %s %q was refused (%d %s) but changed the lock table:\nbefore:\n%s\nafter:\n%s", path, body, code, rec.Body, before, after)
		}
		if (code == http.StatusBadRequest || code == http.StatusRequestEntityTooLarge) && appliedAfter != appliedBefore {
			t.Fatalf("POST %s %q was malformed (%d %s) but reached the log: applied index %d, then %d", path, body, code, rec.Body, appliedBefore, appliedAfter)
		}
	})
}

// fuzzCall decodes data as the request of route (mod 9) and calls the API
// method serving it; ok is false when data does not decode.
func fuzzCall(ctx context.Context, a *api, route uint8, data []byte) (name string, err error, ok bool) {
	dec := func(m proto.Message) bool { return proto.Unmarshal(data, m) == nil }
	switch route % 9 {
	case 0:
		m := new(dlockv1.AcquireRequest)
		if !dec(m) {
			return "", nil, false
		}
		_, err = a.Acquire(ctx, m)
		return "Acquire", err, true
	case 1:
		m := new(dlockv1.RenewRequest)
		if !dec(m) {
			return "", nil, false
		}
		_, err = a.Renew(ctx, m)
		return "Renew", err, true
	case 2:
		m := new(dlockv1.ReleaseRequest)
		if !dec(m) {
			return "", nil, false
		}
		_, err = a.Release(ctx, m)
		return "Release", err, true
	case 3:
		m := new(dlockv1.CancelWaitRequest)
		if !dec(m) {
			return "", nil, false
		}
		_, err = a.CancelWait(ctx, m)
		return "CancelWait", err, true
	case 4:
		m := new(dlockv1.CheckFenceRequest)
		if !dec(m) {
			return "", nil, false
		}
		_, err = a.CheckFence(ctx, m)
		return "CheckFence", err, true
	case 5:
		m := new(dlockv1.InspectRequest)
		if !dec(m) {
			return "", nil, false
		}
		_, err = a.Inspect(ctx, m)
		return "Inspect", err, true
	case 6:
		m := new(dlockv1.ListRequest)
		if !dec(m) {
			return "", nil, false
		}
		_, err = a.List(ctx, m)
		return "List", err, true
	case 7:
		m := new(dlockv1.ForceReleaseRequest)
		if !dec(m) {
			return "", nil, false
		}
		_, err = a.ForceRelease(ctx, m)
		return "ForceRelease", err, true
	default: // a Session call, as the Session stream runs it
		m := new(dlockv1.SessionRequest)
		if !dec(m) {
			return "", nil, false
		}
		resp := (&sessionStream{a: a}).safeCall(ctx, m)
		if resp.GetId() != m.GetId() {
			return "Session", status.Errorf(codes.Internal, "answer id %d, want %d", resp.GetId(), m.GetId()), true
		}
		if c := codes.Code(resp.GetCode()); c != codes.OK {
			err = status.Error(c, resp.GetMessage())
		}
		return "Session", err, true
	}
}

func FuzzProtoRequest(f *testing.F) {
	add := func(route uint8, m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(route, b)
	}
	add(0, &dlockv1.AcquireRequest{Key: "a", Holder: "fuzz"})
	add(0, &dlockv1.AcquireRequest{Key: "s", Owner: "0123456789abcdef", Shared: true, Limit: 2})
	add(0, &dlockv1.AcquireRequest{Key: "s", Shared: true, Limit: 3})
	add(0, &dlockv1.AcquireRequest{Key: "r", Shared: true})
	add(1, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "a", Owner: "0123456789abcdef"}}})
	add(2, &dlockv1.ReleaseRequest{Key: "a", Owner: "0123456789abcdef"})
	add(3, &dlockv1.CancelWaitRequest{Key: "a", Owner: "0123456789abcdef"})
	add(4, &dlockv1.CheckFenceRequest{Key: "a", Fence: 5})
	add(5, &dlockv1.InspectRequest{Key: "a"})
	add(6, &dlockv1.ListRequest{Prefix: "a", Limit: 3})
	add(7, &dlockv1.ForceReleaseRequest{Key: "a", Reason: "fuzz"})
	add(8, &dlockv1.SessionRequest{Id: 9, Call: &dlockv1.SessionRequest_Acquire{Acquire: &dlockv1.AcquireRequest{Key: "s", Owner: "0123456789abcdef"}}})
	add(8, &dlockv1.SessionRequest{Id: 10})
	s := fuzzServer(f)
	a := &api{s: s}
	f.Fuzz(func(t *testing.T, route uint8, data []byte) {
		before, appliedBefore := tableState(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		name, err, ok := fuzzCall(ctx, a, route, data)
		if !ok {
			return // not a request of this type: gRPC refuses it before any handler
		}
		if err == nil {
			return
		}
		switch c := status.Code(err); c {
		case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unimplemented:
			t.Fatalf("%s %x: %v", name, data, err)
		}
		after, appliedAfter := tableState(t, s)
		if after != before {
			t.Fatalf("%s %x was refused (%v) but changed the lock table:\nbefore:\n%s\nafter:\n%s", name, data, err, before, after)
		}
		if status.Code(err) == codes.InvalidArgument && appliedAfter != appliedBefore {
			t.Fatalf("%s %x was malformed (%v) but reached the log: applied index %d, then %d", name, data, err, appliedBefore, appliedAfter)
		}
	})
}
