package dlockddriver

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/driver"
)

// TestMapErr_Classes: every answer of the server maps to its class: refusals
// of the request are ErrInvalidArgument (or the specific sentinel), never a
// plain error (ErrUnavailable at the root); transient answers (NOT_LEADER,
// SHUTTING_DOWN, capacity) stay plain, so the root retries them.
func TestMapErr_Classes(t *testing.T) {
	apiErr := func(c codes.Code, msg string) error { return status.Error(c, "dlockd: "+msg) }
	cases := []struct {
		name string
		err  error
		want error // nil: a plain error (ErrUnavailable at the root)
	}{
		{"INVALID_KEY", apiErr(codes.InvalidArgument, "invalid key: empty (INVALID_KEY)"), driver.ErrInvalidKey},
		{"INVALID_TTL", apiErr(codes.InvalidArgument, "invalid TTL 2h: outside [1s, 1h] (INVALID_TTL)"), driver.ErrInvalidTTL},
		{"INVALID_OWNER", apiErr(codes.InvalidArgument, "invalid owner: 3 bytes, want 8 to 128 (INVALID_OWNER)"), driver.ErrInvalidArgument},
		{"invalid holder", apiErr(codes.InvalidArgument, "invalid holder: 300 bytes (at most 256 bytes of UTF-8 without control characters) (INVALID_REQUEST)"), driver.ErrInvalidHolder},
		{"holder with ESC", apiErr(codes.InvalidArgument, "invalid holder: control character U+001B at byte 4 (at most 256 bytes of UTF-8 without control characters) (INVALID_REQUEST)"), driver.ErrInvalidHolder},
		{"reason with newline", apiErr(codes.InvalidArgument, "invalid reason: control character U+000A at byte 8 (at most 1024 bytes of UTF-8 without control characters) (INVALID_REQUEST)"), driver.ErrInvalidArgument},
		{"INVALID_REQUEST", apiErr(codes.InvalidArgument, "session: empty call (INVALID_REQUEST)"), driver.ErrInvalidArgument},
		{"InvalidArgument without reason", status.Error(codes.InvalidArgument, "bad"), driver.ErrInvalidArgument},
		{"OutOfRange", status.Error(codes.OutOfRange, "page token"), driver.ErrInvalidArgument},
		{"DUPLICATE_WAIT", apiErr(codes.AlreadyExists, "acquire \"k\": owner is already waiting (DUPLICATE_WAIT)"), driver.ErrInvalidArgument},
		{"REQUEST_TOO_LARGE", apiErr(codes.ResourceExhausted, "renew: 3 items > 2 (REQUEST_TOO_LARGE)"), driver.ErrInvalidArgument},
		{"gRPC size limit", status.Error(codes.ResourceExhausted, "grpc: received message larger than max (9 vs. 4)"), driver.ErrInvalidArgument},
		{"PermissionDenied", status.Error(codes.PermissionDenied, `dlockd: permission denied: identity "w" lacks lock on key "k" (PERMISSION_DENIED)`), driver.ErrPermissionDenied},
		{"Unauthenticated", status.Error(codes.Unauthenticated, "dlockd: unauthenticated: unknown token (not in the auth file, or revoked) (UNAUTHENTICATED)"), driver.ErrPermissionDenied},
		{"LOCK_HELD", apiErr(codes.FailedPrecondition, "acquire \"k\": lock held (LOCK_HELD)"), driver.ErrNotAcquired},
		{"LEASE_LOST", apiErr(codes.NotFound, "release \"k\": not the holder (LEASE_LOST)"), driver.ErrLeaseLost},
		{"NOT_LEADER", apiErr(codes.Unavailable, "not the leader (leader: \"\") (NOT_LEADER)"), nil},
		{"SHUTTING_DOWN", apiErr(codes.Unavailable, "shutting down (SHUTTING_DOWN)"), nil},
		{"TOO_MANY_WAITERS", apiErr(codes.ResourceExhausted, "acquire \"k\": 10 waiters already queued on the key (TOO_MANY_WAITERS)"), nil},
		{"TOO_MANY_LEASES", apiErr(codes.ResourceExhausted, "acquire \"k\": server holds its maximum of 5 leases (TOO_MANY_LEASES)"), nil},
		{"connection refused", status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:7999: connect: connection refused\""), nil},
		{"DeadlineExceeded", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), nil},
		{"Internal", apiErr(codes.Internal, "boom (INTERNAL)"), nil},
		// A peer that is not dlockd (issue 13 F6): a configuration error.
		{"Redis answers", status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: http2: frame too large"`), driver.ErrInvalidArgument},
		{"HTTP/1.1 answers", status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: http2: failed reading the frame payload: http2: frame too large, note that the frame header looked like an HTTP/1.1 header"`), driver.ErrInvalidArgument},
		{"not a settings frame", status.Error(codes.Unavailable, `connection error: desc = "initial http2 frame from server is not a settings frame: *http2.DataFrame"`), driver.ErrInvalidArgument},
		{"TLS client, plain server", status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: first record does not look like a TLS handshake"`), driver.ErrInvalidArgument},
		{"HTTP/1.1 proxy", status.Error(codes.Unavailable, `connection error: desc = "transport: malformed HTTP response \"\\x00\\x00\""`), driver.ErrInvalidArgument},
		// A server answer quotes the caller's key: its text is never read
		// as a transport's (a key naming a transport error stays held).
		{"key quoting a transport error", apiErr(codes.FailedPrecondition, `acquire "job malformed HTTP response": lock held (LOCK_HELD)`), driver.ErrNotAcquired},
		{"key quoting the preface error", apiErr(codes.NotFound, `release "error reading server preface: http2: frame too large": not the holder (LEASE_LOST)`), driver.ErrLeaseLost},
		{"key quoting the size limit", apiErr(codes.ResourceExhausted, `acquire "larger than max": 10 waiters already queued on the key (TOO_MANY_WAITERS)`), nil},
		{"capacity quoting a transport error", apiErr(codes.ResourceExhausted, `acquire "x frame too large": 10 waiters already queued on the key (TOO_MANY_WAITERS)`), nil},
		// A dlockd restarting closes or resets connections: an outage.
		{"preface EOF", status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: EOF"`), nil},
		{"preface reset", status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: read tcp 127.0.0.1:1->127.0.0.1:2: read: connection reset by peer"`), nil},
		{"proxy 503", status.Error(codes.Unavailable, `unexpected HTTP status code received from server: 503 (Service Unavailable)`), nil},
	}
	for _, c := range cases {
		got := mapErr(context.Background(), "acquire", "k", c.err)
		if c.want == nil {
			for _, s := range []error{driver.ErrInvalidArgument, driver.ErrNotAcquired, driver.ErrLeaseLost} {
				if errors.Is(got, s) {
					t.Errorf("%s: %v matches %v, want a plain (transient) error", c.name, got, s)
				}
			}
			continue
		}
		if !errors.Is(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
