package server_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
)

// TestHTTP_SlowBodyTimesOut: a request body trickled one byte at a time is
// no longer read forever: after HTTPBodyTimeout the server answers 408
// (BODY_TIMEOUT), closes the connection and counts the refusal.
func TestHTTP_SlowBodyTimesOut(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.HTTPBodyTimeout = 500 * time.Millisecond })
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"key":"slow","ttl":"30s","holder":"trickle"}`
	if _, err := conn.Write([]byte("POST /v1/acquire HTTP/1.1\r\nHost: dlockd\r\nContent-Type: application/json\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	// One byte every 250ms: the whole body would take 11s.
	stop := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for i := range len(body) {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); <-trickled }()
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within 5s to a trickled body: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d, want 408", resp.StatusCode)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("answered after %v, want about 500ms", took)
	}
	if n := refusals(t, srv.Addr(), "http_body_timeout"); n != 1 {
		t.Errorf("http_body_timeout refusals: %d, want 1", n)
	}
	code, m := post(t, srv.Addr(), "/v1/inspect", `{"key":"slow"}`)
	if code != http.StatusOK || m["held"] == true {
		t.Errorf("the slow request changed the state: %d %v", code, m)
	}
}

// TestHTTP_DeclaredTooLargeAnsweredAtOnce: a request whose Content-Length
// exceeds MaxRequestBytes is answered 413 (REQUEST_TOO_LARGE) at once,
// without its body (it used to wait HTTPBodyTimeout for the body and answer
// 408), and its connection is closed.
func TestHTTP_DeclaredTooLargeAnsweredAtOnce(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.HTTPBodyTimeout = 20 * time.Second })
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("POST /v1/acquire HTTP/1.1\r\nHost: dlockd\r\nContent-Type: application/json\r\n" +
		"Content-Length: " + strconv.Itoa(srv.Cfg.MaxRequestBytes+1) + "\r\n\r\n{")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within 10s to a declared oversized body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "REQUEST_TOO_LARGE") {
		t.Fatalf("status %d %s, want 413 REQUEST_TOO_LARGE", resp.StatusCode, b)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("answered after %v, want at once", took)
	}
	if !resp.Close {
		t.Errorf("connection not closed after an unread body (Connection: %q)", resp.Header.Get("Connection"))
	}
}

// TestHTTP_LongPollOutlivesBodyTimeout: the body deadline is cleared before
// the wait: an HTTP acquisition with wait still waits longer than
// HTTPBodyTimeout and is granted on release.
func TestHTTP_LongPollOutlivesBodyTimeout(t *testing.T) {
	srv := start(t, func(c *server.Config) { c.HTTPBodyTimeout = 200 * time.Millisecond })
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	const holder = "owner-holder-0123456789"
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "poll", Owner: holder, Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code int
		m    map[string]any
	}
	done := make(chan answer, 1)
	go func() {
		code, m := post(t, srv.Addr(), "/v1/acquire", `{"key":"poll","owner":"owner-waiter-0123456789","ttl":"30s","wait":true}`)
		done <- answer{code, m}
	}()
	waitFor(t, func() bool {
		r, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "poll"})
		return err == nil && r.GetWaiters() == 1
	})
	// Wait for several body timeouts while queued.
	timer := time.NewTimer(5 * 200 * time.Millisecond)
	select {
	case a := <-done:
		t.Fatalf("the wait ended early: %d %v", a.code, a.m)
	case <-timer.C:
	}
	if _, err := c.Release(ctx, &dlockv1.ReleaseRequest{Key: "poll", Owner: holder}); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.code != http.StatusOK || a.m["owner"] != "owner-waiter-0123456789" {
		t.Fatalf("waiter: %d %v, want the grant", a.code, a.m)
	}
}

// TestHTTP_JSONDecoding: JSON requests ignore unknown fields, as gRPC does
// (they used to be refused), and a malformed duration or a zero TTL is
// refused with a message that says what is wrong.
func TestHTTP_JSONDecoding(t *testing.T) {
	srv := start(t, nil)
	a := srv.Addr()
	code, m := post(t, a, "/v1/acquire", `{"key":"fwd","ttl":"30s","field_of_a_newer_proto":{"x":[1,2]},"another":7}`)
	if code != http.StatusOK || m["key"] != "fwd" {
		t.Errorf("unknown fields: %d %v, want the grant", code, m)
	}
	cases := []struct {
		name, path, body string
		reason           string
		msg              []string // substrings of the message
	}{
		{"Go duration", "/v1/acquire", `{"key":"k","ttl":"1ms"}`, server.ReasonInvalidTTL,
			[]string{`invalid "ttl" "1ms"`, `decimal number of seconds with an "s" suffix`, `"0.001s"`}},
		{"minutes", "/v1/acquire", `{"key":"k", "ttl" : "1m"}`, server.ReasonInvalidTTL, []string{`"60s"`}},
		{"no unit", "/v1/acquire", `{"key":"k","ttl":"30"}`, server.ReasonInvalidTTL, []string{`"s" suffix`}},
		{"renew item", "/v1/renew", "{\"items\":[\n {\"key\":\"k\",\"owner\":\"0123456789\",\"ttl\":\"2h\"}]}", server.ReasonInvalidTTL, []string{`"7200s"`, "line 2:"}},
		{"lock delay", "/v1/acquire", `{"key":"k","lock_delay":"5ms"}`, server.ReasonInvalidRequest, []string{`"lock_delay"`, `"0.005s"`}},
		{"zero TTL", "/v1/acquire", `{"key":"k","ttl":"0s"}`, server.ReasonInvalidTTL, []string{"invalid TTL 0s: zero or negative"}},
		{"negative TTL", "/v1/acquire", `{"key":"k","ttl":"-2s"}`, server.ReasonInvalidTTL, []string{"zero or negative"}},
		{"TTL past time.Duration", "/v1/acquire", `{"key":"k","ttl":"315576000000s"}`, server.ReasonInvalidTTL, []string{"invalid TTL of 315576000000 s: longer than any TTL"}},
		{"zero renew TTL", "/v1/renew", `{"items":[{"key":"k","owner":"0123456789","ttl":"0s"}]}`, server.ReasonInvalidTTL, []string{"zero or negative"}},
		{"syntax", "/v1/acquire", `{"key":`, server.ReasonInvalidRequest, []string{"malformed JSON"}},
	}
	for _, tc := range cases {
		code, m := post(t, a, tc.path, tc.body)
		msg, _ := m["message"].(string)
		if code != http.StatusBadRequest || m["reason"] != tc.reason {
			t.Errorf("%s: %d %v, want 400 %s", tc.name, code, m, tc.reason)
			continue
		}
		for _, want := range tc.msg {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: message %q lacks %q", tc.name, msg, want)
			}
		}
	}
	// gRPC says the same about a zero TTL and a malformed one.
	c := grpcClient(t, a)
	_, err := c.Acquire(t.Context(), &dlockv1.AcquireRequest{Key: "k", Ttl: &durationpb.Duration{}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "zero or negative") {
		t.Errorf("gRPC zero TTL: %v", err)
	}
	_, err = c.Acquire(t.Context(), &dlockv1.AcquireRequest{Key: "k", Ttl: &durationpb.Duration{Seconds: 1, Nanos: -5}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "seconds 1, nanos -5") {
		t.Errorf("gRPC malformed TTL: %v", err)
	}
	// Nothing but the first grant was made.
	_, m = post(t, a, "/v1/list", `{}`)
	if hs, _ := m["holders"].([]any); len(hs) != 1 {
		t.Fatalf("holders after the refused requests: %v", m)
	}
}
