package server

// recover.go owns panic recovery: a bug in one handler must fail that one
// call, never take the process down with every lease it serves. The gRPC
// interceptors (unary and stream), the HTTP middleware and the Session call
// runner (session.go) recover a panic, log it at error with its stack
// through the server's logger, and answer INTERNAL (HTTP 500) with reason
// INTERNAL. Goroutines a handler starts must recover on their own.

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// panicHook, when set, is called where handlers start, with where the call
// goes: a gRPC full method, an HTTP route ("POST /v1/acquire") or a Session
// call's unary method. It exists for tests only, which make it panic to
// check the recovery; it is nil in production.
var panicHook atomic.Pointer[func(where string)]

// callPanicHook calls panicHook when it is set.
func callPanicHook(where string) {
	if h := panicHook.Load(); h != nil {
		(*h)(where)
	}
}

// recovered logs the panic p of a handler serving where, with the stack of
// the panicking goroutine, and returns the INTERNAL error to answer. Call
// it from the deferred function that recovered p.
func (s *Server) recovered(where string, p any) error {
	var stack []byte
	if wp, ok := p.(*workerPanic); ok { // raised again by callPool.do: the worker's stack
		p, stack = wp.value, wp.stack
	} else {
		stack = debug.Stack()
	}
	s.log.Error("dlockd: panic in a handler, recovered; please report this bug",
		"where", where, "panic", fmt.Sprint(p), "stack", string(stack))
	return apiErr(codes.Internal, ReasonInternal, "internal error serving %s (the server logged it)", where)
}

// recoverUnary is the gRPC unary interceptor that turns a panic into
// INTERNAL.
func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, s.recovered(info.FullMethod, p)
		}
	}()
	return h(ctx, req)
}

// recoverStream is the gRPC stream interceptor that turns a panic of the
// handler's goroutine into INTERNAL.
func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = s.recovered(info.FullMethod, p)
		}
	}()
	return h(srv, ss)
}

// recoverHTTP wraps the HTTP handler: a panic is answered 500 INTERNAL when
// no header was written yet (else the connection is cut, as net/http
// does). http.ErrAbortHandler passes through: it is net/http's way to
// abort a response on purpose.
func (s *Server) recoverHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &trackingWriter{ResponseWriter: w}
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p == http.ErrAbortHandler {
				panic(p)
			}
			err := s.recovered(r.Method+" "+r.URL.Path, p)
			if tw.wroteHeader {
				panic(http.ErrAbortHandler) // half an answer is out: cut the connection
			}
			writeReply(tw, nil, err)
		}()
		next.ServeHTTP(tw, r)
	})
}

// trackingWriter notes whether the header was written. Unwrap lets
// http.ResponseController reach the connection (read deadlines, flush).
type trackingWriter struct {
	http.ResponseWriter
	wroteHeader bool
}

// WriteHeader implements http.ResponseWriter.
func (w *trackingWriter) WriteHeader(code int) {
	w.wroteHeader = true
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *trackingWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher, for handlers that assert it.
func (w *trackingWriter) Flush() { _ = w.FlushError() }

// FlushError flushes and returns the error, for http.ResponseController
// (which prefers it to Flush): a handler must learn that its answer did
// not go out (a handed-over grant is then released at once).
func (w *trackingWriter) FlushError() error {
	w.wroteHeader = true
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *trackingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
