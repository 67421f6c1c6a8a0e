package server

// limits.go owns the node's connection, stream and request limits (the
// Config section "Connection and stream limits"): the counts of open
// Session, Wait and Watch streams and of waiting requests, the gRPC
// interceptors and the HTTP check that enforce them, and the refusal
// bookkeeping every limit shares: a RESOURCE_EXHAUSTED answer with a
// reason, dlockd_limit_refusals_total{limit} and an info line at most once
// per limit per logEvery. It touches no lock-table state: a refused request
// never reaches Raft.
//
// The connection cap is enforced by the mux (mux.go), the in-flight cap of a
// Session stream by session.go, the Watch backlog by hub.go and the HTTP
// body deadline by http.go; they report refusals here.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// Reasons of the limits of this file, next to those of core.go.
const (
	// ReasonTooManyStreams: the node has its maximum of Session, Wait or
	// Watch streams open (Config.MaxSessionStreams, MaxWaitStreams,
	// MaxWatchStreams). Retry later, or reuse a stream.
	ReasonTooManyStreams = "TOO_MANY_STREAMS"
	// ReasonTooManyWaitingRequests: the node has its maximum of
	// acquisitions with wait in flight (Config.MaxWaitingRequests).
	ReasonTooManyWaitingRequests = "TOO_MANY_WAITING_REQUESTS"
	// ReasonWatchBacklogFull ends a Watch stream whose client left more
	// than Config.MaxWatchBacklog loss events unread: reconnect, and treat
	// every lease of the session as possibly lost until renewed.
	ReasonWatchBacklogFull = "WATCH_BACKLOG_FULL"
	// ReasonBodyTimeout: an HTTP request body took longer than
	// Config.HTTPBodyTimeout to arrive (answered 408).
	ReasonBodyTimeout = "BODY_TIMEOUT"
)

// Values of the limit label of dlockd_limit_refusals_total.
const (
	limitConnections     = "connections"
	limitConnectionsIP   = "connections_per_ip"
	limitSessionStreams  = "session_streams"
	limitWaitStreams     = "wait_streams"
	limitWatchStreams    = "watch_streams"
	limitWaitingRequests = "waiting_requests"
	limitSessionInflight = "session_inflight"
	limitSessionRate     = "session_rate"
	// Bytes of Session calls in flight, of one stream and of the node.
	limitSessionInflightBytes = "session_inflight_bytes"
	limitInflightBytes        = "inflight_bytes"
	limitWatchBacklog         = "watch_backlog"
	limitHTTPBodyTimeout      = "http_body_timeout"
)

// logEvery is the shortest interval between two log lines of one limit;
// the refusals in between are counted in the next line's "suppressed".
const logEvery = 10 * time.Second

// limits holds the node's counts of capped resources and the refusal
// bookkeeping. The zero value counts nothing and refuses nothing until
// bind; every method is safe for concurrent use.
//
// The Server owns it (Server.lim, made by New); the connection mux, the
// gRPC server, the HTTP handlers and the Session streams all count through
// it.
type limits struct {
	s *Server // set once by bind, in New

	sessionStreams, waitStreams, watchStreams, waiting atomic.Int64

	// inflight holds the bytes of the node's Session calls in flight
	// (Config.MaxInflightBytes); session.go takes and gives them back.
	inflight *byteBudget

	now   func() time.Time // time.Now; tests replace it
	logMu sync.Mutex
	logs  map[string]*refusalLog
}

// refusalLog is the rate limiter of one limit's log lines.
type refusalLog struct {
	last       time.Time // of the last line; zero: none yet
	suppressed int       // refusals since, not logged
}

// bind attaches l to s. New calls it.
func (l *limits) bind(s *Server) {
	l.s = s
	l.now = time.Now
	l.inflight = newByteBudget(int64(s.cfg.MaxInflightBytes))
}

// limits returns the node's limits; see the limits type.
func (s *Server) limits() *limits { return s.lim }

// refused counts one refusal of limit and logs it at info unless a line for
// the same limit was logged less than logEvery ago; msg says what was
// refused, in words.
func (l *limits) refused(limit, msg string) {
	if l.s == nil {
		return
	}
	l.s.metrics.limitRefusals.WithLabelValues(limit).Inc()
	if suppressed, ok := l.logTurn(limit); ok {
		l.s.log.Info("dlockd: limit reached", "limit", limit, "detail", msg, "suppressed", suppressed)
	}
}

// logTurn is the rate limit of log lines of one kind (a limit's name, or
// another event's, e.g. "tls_handshake"): ok when a line of kind may be
// logged now (none was less than logEvery ago), with the number of events
// suppressed since the last line; otherwise it counts this one as
// suppressed.
func (l *limits) logTurn(kind string) (suppressed int, ok bool) {
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	l.logMu.Lock()
	defer l.logMu.Unlock()
	if l.logs == nil {
		l.logs = make(map[string]*refusalLog)
	}
	r := l.logs[kind]
	if r == nil {
		r = &refusalLog{}
		l.logs[kind] = r
	}
	if !r.last.IsZero() && now.Sub(r.last) < logEvery {
		r.suppressed++
		return 0, false
	}
	suppressed = r.suppressed
	r.last, r.suppressed = now, 0
	return suppressed, true
}

// take counts one more of a resource capped at max, or refuses it with
// RESOURCE_EXHAUSTED and reason, counted and logged as limit. The caller
// calls the returned release exactly once when the resource is freed.
func (l *limits) take(n *atomic.Int64, max int, limit, reason, what string) (release func(), err error) {
	if n.Add(1) > int64(max) {
		n.Add(-1)
		msg := fmt.Sprintf("%s: this node has its maximum of %d open", what, max)
		l.refused(limit, msg)
		return nil, apiErr(codes.ResourceExhausted, reason, "%s", msg)
	}
	return func() { n.Add(-1) }, nil
}

// takeWaiting counts one acquisition with wait, or refuses it
// (TOO_MANY_WAITING_REQUESTS).
func (l *limits) takeWaiting() (release func(), err error) {
	return l.take(&l.waiting, l.s.cfg.MaxWaitingRequests, limitWaitingRequests, ReasonTooManyWaitingRequests, "acquisitions with wait")
}

// takeStream counts one stream of a capped method (Session, Wait, Watch),
// and a Wait stream as a waiting request too; other methods are not
// counted. It refuses with TOO_MANY_STREAMS or TOO_MANY_WAITING_REQUESTS.
func (l *limits) takeStream(fullMethod string) (release func(), err error) {
	cfg := &l.s.cfg
	switch fullMethod {
	case dlockv1.Lock_Session_FullMethodName:
		return l.take(&l.sessionStreams, cfg.MaxSessionStreams, limitSessionStreams, ReasonTooManyStreams, "Session streams")
	case dlockv1.Lock_Watch_FullMethodName:
		return l.take(&l.watchStreams, cfg.MaxWatchStreams, limitWatchStreams, ReasonTooManyStreams, "Watch streams")
	case dlockv1.Lock_Wait_FullMethodName:
		rs, err := l.take(&l.waitStreams, cfg.MaxWaitStreams, limitWaitStreams, ReasonTooManyStreams, "Wait streams")
		if err != nil {
			return nil, err
		}
		rw, err := l.takeWaiting()
		if err != nil {
			rs()
			return nil, err
		}
		return func() { rw(); rs() }, nil
	}
	return func() {}, nil
}

// unaryInterceptor enforces MaxWaitingRequests on gRPC Acquire with wait.
// It runs inside the recovery interceptor, so it also calls the test-only
// panic hook, standing for the handler it precedes.
func (l *limits) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	callPanicHook(info.FullMethod)
	if r, ok := req.(*dlockv1.AcquireRequest); ok && r.GetWait() {
		release, err := l.takeWaiting()
		if err != nil {
			return nil, err
		}
		defer release()
	}
	return h(ctx, req)
}

// streamInterceptor enforces MaxSessionStreams, MaxWaitStreams,
// MaxWatchStreams and, for Wait streams, MaxWaitingRequests. Like
// unaryInterceptor, it calls the test-only panic hook.
func (l *limits) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	callPanicHook(info.FullMethod)
	release, err := l.takeStream(info.FullMethod)
	if err != nil {
		return err
	}
	defer release()
	return h(srv, ss)
}

// byteBudget is a weighted semaphore of bytes whose waits can be abandoned,
// served first come, first served: a heavy call is not starved by light
// ones that keep fitting in the gaps.
type byteBudget struct {
	size int64

	mu      sync.Mutex
	used    int64
	waiters []*budgetWaiter // FIFO
}

type budgetWaiter struct {
	n     int64
	ready chan struct{} // closed when n is taken for this waiter
}

func newByteBudget(size int64) *byteBudget { return &byteBudget{size: size} }

// weight is what taking n costs: n, but at most the whole budget, so that
// a call heavier than the budget runs once it is alone in it.
func (b *byteBudget) weight(n int64) int64 { return min(n, b.size) }

// tryTake takes weight(n) bytes if they are free and nobody waits before
// it; the caller gives back weight(n).
func (b *byteBudget) tryTake(n int64) bool {
	n = b.weight(n)
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.waiters) == 0 && b.used+n <= b.size {
		b.used += n
		return true
	}
	return false
}

// take waits for weight(n) bytes and takes them, or gives up when done1 or
// done2 closes first (then it takes nothing and returns false).
func (b *byteBudget) take(n int64, done1, done2 <-chan struct{}) bool {
	n = b.weight(n)
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used+n <= b.size {
		b.used += n
		b.mu.Unlock()
		return true
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return true
	case <-done1:
	case <-done2:
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // granted meanwhile: give it back
		b.used -= n
	default:
		for i, x := range b.waiters {
			if x == w {
				b.waiters = append(b.waiters[:i:i], b.waiters[i+1:]...)
				break
			}
		}
	}
	b.grant() // the waiters behind w may fit now
	return false
}

// give gives back weight(n) bytes taken with take or tryTake.
func (b *byteBudget) give(n int64) {
	n = b.weight(n)
	b.mu.Lock()
	b.used -= n
	b.grant()
	b.mu.Unlock()
}

// grant hands free bytes to the waiters in order, stopping at the first
// that does not fit. b.mu is held.
func (b *byteBudget) grant() {
	for len(b.waiters) > 0 {
		w := b.waiters[0]
		if b.used+w.n > b.size {
			return
		}
		b.used += w.n
		close(w.ready)
		b.waiters[0] = nil
		b.waiters = b.waiters[1:]
	}
}
