// Package notgrpc recognises, in the errors of grpc-go, a peer that
// answered but does not speak gRPC over HTTP/2: a store URL that points at
// the port of another kind of server (Redis, an HTTP/1.1 server, a
// plain-text server when TLS was asked). The drivers over gRPC (dlockd,
// etcd) report it as a configuration error, driver.ErrInvalidArgument,
// never as an outage: WithFailOpen must not run work unlocked because of a
// wrong port.
//
// grpc-go reports these failures as codes.Unavailable with its transport's
// text and no code or type of their own, so they are matched by message.
package notgrpc

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// signs are texts of grpc-go's transport errors (and of the packages under
// it: x/net/http2, crypto/tls, net/http) that mean the peer answered with
// bytes that are not HTTP/2: Redis's "-ERR ..." or an HTTP/1.1 status line
// read as an HTTP/2 frame header, a first frame that is not SETTINGS, a
// plain-text answer read by a TLS client. A peer that closes or resets the
// connection ("error reading server preface: EOF", "connection reset by
// peer") is not among them: a server that is restarting does that too, and
// that is an outage. Neither is an HTTP status such as 503 from a proxy.
var signs = []string{
	"http2: frame too large",
	"failed reading the frame payload",
	"frame header looked like an HTTP/1.1 header",
	"initial http2 frame from server is not a settings frame",
	"first record does not look like a TLS handshake",
	"malformed HTTP response",
	"tls: record overflow",
}

// Is reports whether msg, the message of a gRPC status or error, says the
// peer does not speak gRPC over HTTP/2 (see the package documentation).
func Is(msg string) bool {
	for _, s := range signs {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// Detail returns msg without grpc-go's `connection error: desc = "…"`
// wrapping, for messages.
func Detail(msg string) string {
	return strings.TrimSuffix(strings.TrimPrefix(msg, `connection error: desc = "`), `"`)
}

// Probe dials the plain-text (insecure) gRPC endpoint addr (host:port) and
// makes one health-check call, failing fast, within timeout (bounded by
// ctx too). It returns the transport's message and true when the peer
// answered but does not speak gRPC (Is); "" and false otherwise: a gRPC
// server, whatever its answer, or no answer at all. It is for a client
// library that hides the transport's error behind a deadline (etcd's waits
// for a ready connection); it leaves no connection or goroutine behind.
func Probe(ctx context.Context, addr string, timeout time.Duration) (string, bool) {
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", false
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err = grpc_health_v1.NewHealthClient(cc).Check(ctx, &grpc_health_v1.HealthCheckRequest{})
	if err == nil {
		return "", false
	}
	msg := status.Convert(err).Message()
	if !Is(msg) {
		return "", false
	}
	return Detail(msg), true
}
