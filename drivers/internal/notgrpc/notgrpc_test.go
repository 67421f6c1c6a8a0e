package notgrpc

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// TestIs: the transport messages of a peer that is not gRPC match; those of
// an outage (refused, reset, EOF, a proxy's 503) do not.
func TestIs(t *testing.T) {
	for msg, want := range map[string]bool{
		`connection error: desc = "error reading server preface: http2: frame too large"`:                                                                                                     true,
		`connection error: desc = "error reading server preface: http2: failed reading the frame payload: http2: frame too large, note that the frame header looked like an HTTP/1.1 header"`: true,
		`connection error: desc = "transport: authentication handshake failed: tls: first record does not look like a TLS handshake"`:                                                         true,
		`connection error: desc = "initial http2 frame from server is not a settings frame: *http2.DataFrame"`:                                                                                true,
		`connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:7999: connect: connection refused"`:                                                                     false,
		`connection error: desc = "error reading server preface: EOF"`:                                                                                                                        false,
		`connection error: desc = "error reading server preface: read tcp 127.0.0.1:1->127.0.0.1:2: read: connection reset by peer"`:                                                          false,
		`unexpected HTTP status code received from server: 503 (Service Unavailable)`:                                                                                                         false,
	} {
		if got := Is(msg); got != want {
			t.Errorf("Is(%q) = %v, want %v", msg, got, want)
		}
	}
	if got := Detail(`connection error: desc = "error reading server preface: EOF"`); got != "error reading server preface: EOF" {
		t.Errorf("Detail = %q", got)
	}
}

// TestProbe: an HTTP/1.1 server is not gRPC; a gRPC server (without the
// health service) and a closed port are not reported.
func TestProbe(t *testing.T) {
	h1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello\n") }))
	defer h1.Close()
	if detail, ok := Probe(t.Context(), strings.TrimPrefix(h1.URL, "http://"), 2*time.Second); !ok || !strings.Contains(detail, "HTTP/1.1") {
		t.Errorf("Probe(HTTP/1.1 server) = %q, %v; want true", detail, ok)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()
	if detail, ok := Probe(t.Context(), ln.Addr().String(), 2*time.Second); ok {
		t.Errorf("Probe(gRPC server) = %q, true; want false", detail)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := closed.Addr().String()
	_ = closed.Close()
	if detail, ok := Probe(t.Context(), addr, time.Second); ok {
		t.Errorf("Probe(closed port) = %q, true; want false", detail)
	}
}
