package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
)

// badHolders are holder descriptions the server refuses (issue 13 F10):
// the client's rule (driver.CheckHolder), at most 256 bytes of UTF-8
// without control characters, on every transport.
var badHolders = map[string]string{
	"ESC and newline": "evil\u001b[31mred\nline",
	"newline":         "host-1\nforged line",
	"carriage return": "host-1\rx",
	"tab":             "host-1\tpid 1",
	"NUL":             "host-1\x00",
	"DEL":             "host-1\u007f",
	"C1 NEL":          "host-1\u0085",
	"257 bytes":       strings.Repeat("h", 257),
}

// TestServer_HolderRuleSameOverHTTPAndGRPC: a holder with a control
// character (ESC, newline, ...) or over 256 bytes is refused with
// InvalidArgument / HTTP 400, reason INVALID_REQUEST and a message naming
// the holder and the rule, over HTTP, unary gRPC, the Wait stream and the
// Session stream alike; nothing is granted or queued. A holder of 256 bytes
// with non-ASCII letters is accepted.
func TestServer_HolderRuleSameOverHTTPAndGRPC(t *testing.T) {
	srv := start(t, nil)
	a := srv.Addr()
	c := grpcClient(t, a)
	ttl := durationpb.New(30e9)
	for name, h := range badHolders {
		body, _ := json.Marshal(map[string]any{"key": "hh1", "ttl": "20s", "holder": h})
		code, m := post(t, a, "/v1/acquire", string(body))
		msg, _ := m["message"].(string)
		if code != http.StatusBadRequest || m["reason"] != server.ReasonInvalidRequest || m["code"] != "INVALID_ARGUMENT" ||
			!strings.Contains(msg, "invalid holder") || !strings.Contains(msg, "without control characters") {
			t.Errorf("HTTP %s: %d %v; want 400 INVALID_ARGUMENT INVALID_REQUEST \"invalid holder ... without control characters\"", name, code, m)
		}
		check := func(via string, err error) {
			t.Helper()
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "invalid holder") ||
				!strings.HasSuffix(st.Message(), "("+server.ReasonInvalidRequest+")") {
				t.Errorf("%s %s: %v; want InvalidArgument \"invalid holder ...\" (INVALID_REQUEST)", via, name, err)
			}
		}
		_, err := c.Acquire(t.Context(), &dlockv1.AcquireRequest{Key: "hh1", Ttl: ttl, Holder: h})
		check("gRPC Acquire", err)
		ws, err := c.Wait(t.Context())
		if err == nil {
			if err = ws.Send(&dlockv1.AcquireRequest{Key: "hh1", Ttl: ttl, Holder: h, Wait: true}); err == nil {
				_, err = ws.Recv()
			}
		}
		check("gRPC Wait", err)
		ss, err := c.Session(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := ss.Send(&dlockv1.SessionRequest{Id: 1, Call: &dlockv1.SessionRequest_Acquire{Acquire: &dlockv1.AcquireRequest{Key: "hh1", Ttl: ttl, Holder: h}}}); err != nil {
			t.Fatal(err)
		}
		r, err := ss.Recv()
		if err != nil {
			t.Fatal(err)
		}
		check("Session", status.Error(codes.Code(r.GetCode()), r.GetMessage()))
		_ = ss.CloseSend()
	}
	// Nothing was granted or queued.
	if _, m := post(t, a, "/v1/list", `{}`); len(m["holders"].([]any)) != 0 {
		t.Fatalf("holders after the refused requests: %v", m)
	}
	if r, err := c.Inspect(t.Context(), &dlockv1.InspectRequest{Key: "hh1"}); err != nil || r.GetHeld() || r.GetWaiters() != 0 {
		t.Fatalf("Inspect hh1 = %v, %v; want free with no waiter", r, err)
	}
	// The limit itself is accepted: 256 bytes, letters of any script.
	ok := strings.Repeat("é", 128)
	if _, err := c.Acquire(t.Context(), &dlockv1.AcquireRequest{Key: "hh1", Ttl: ttl, Holder: ok}); err != nil {
		t.Fatalf("256-byte holder: %v", err)
	}
}

// TestServer_ForceReleaseReasonRule: a force release's reason follows the
// same rule as a holder (UTF-8 without control characters, here at most
// 1024 bytes): a newline cannot forge a line in the server's log, and the
// grant stays.
func TestServer_ForceReleaseReasonRule(t *testing.T) {
	srv := start(t, nil)
	c := grpcClient(t, srv.Addr())
	if _, err := c.Acquire(t.Context(), &dlockv1.AcquireRequest{Key: "fr", Ttl: durationpb.New(30e9), Holder: "host-1"}); err != nil {
		t.Fatal(err)
	}
	for _, reason := range []string{"", "line one\nforged log line", "\u001b[2J", strings.Repeat("r", 1025)} {
		_, err := c.ForceRelease(t.Context(), &dlockv1.ForceReleaseRequest{Key: "fr", Reason: reason})
		st, _ := status.FromError(err)
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "reason") || !strings.HasSuffix(st.Message(), "(INVALID_REQUEST)") {
			t.Errorf("ForceRelease reason %q: %v; want InvalidArgument about the reason (INVALID_REQUEST)", reason, err)
		}
	}
	if r, err := c.Inspect(t.Context(), &dlockv1.InspectRequest{Key: "fr"}); err != nil || !r.GetHeld() {
		t.Fatalf("Inspect fr = %v, %v; want still held", r, err)
	}
	if _, err := c.ForceRelease(t.Context(), &dlockv1.ForceReleaseRequest{Key: "fr", Reason: "host-1 is dead (ticket 42)"}); err != nil {
		t.Fatalf("ForceRelease with a plain reason: %v", err)
	}
}
