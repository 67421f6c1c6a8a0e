package server

// metrics.go owns the server's Prometheus collectors and the helpers that
// count API calls. It reads the server's state (Raft, FSM, sessions) only
// through GaugeFuncs and collectors evaluated at scrape time.
//
// # Request metrics
//
// dlockd_requests_total{method,transport,code} counts finished API calls and
// dlockd_request_duration_seconds{method,transport} times them. method is
// the RPC's name in the proto ("Acquire", "CancelWait", ...) whichever way
// the call came: gRPC /dlock.v1.Lock/Acquire, HTTP POST /v1/acquire and a
// Session stream's acquire call are all method="Acquire", told apart by
// transport="grpc", "http" or "session". code is the gRPC code's Go name
// ("OK", "FailedPrecondition", "Unavailable", ...).
//
// A call the client ended is counted as code="Canceled" (gRPC's CANCELLED,
// HTTP 499), never as Unknown or Internal: a cancelled context, a stream the
// client closed or half-closed before its answer (io.EOF), a Wait the client
// cancelled (its stream answered CANCELLED), or any error of a stream whose
// client went away. Error-rate alerts should leave out "OK" and "Canceled"
// (and the client-caused codes: InvalidArgument, FailedPrecondition,
// NotFound).
//
// The long-lived streams, Watch and Session, are counted when they end but
// not timed: their lifetimes would swamp the histogram. A Session's calls
// are counted and timed one by one under their unary twins' names.

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/internal/buildinfo"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// Values of the transport label of the request metrics.
const (
	transportGRPC    = "grpc"
	transportHTTP    = "http"
	transportSession = "session"
)

// codeCanceled is the code label of a call the client ended.
const codeCanceled = "Canceled" // codes.Canceled.String()

// requestBuckets are the upper bounds of the request-duration histogram, in
// seconds: a committed write on a local disk takes about a millisecond, a
// wait in a queue up to minutes.
var requestBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
}

// metrics are the server's Prometheus collectors, in a registry of its own
// so that several servers can run in one process.
type metrics struct {
	s              *Server
	reg            *prometheus.Registry
	applySeconds   prometheus.Histogram
	requests       *prometheus.CounterVec   // method, transport, code
	requestSeconds *prometheus.HistogramVec // method, transport
	expired        prometheus.Counter
	limitRefusals  *prometheus.CounterVec // limit; see limits.go
	heartbeats     heartbeats             // failing heartbeats of this leader; membermetrics.go
}

func newMetrics(s *Server) *metrics {
	m := &metrics{s: s, reg: prometheus.NewRegistry()}
	m.applySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "dlockd_raft_apply_seconds",
		Help:    "Time from proposing a command to Raft until it was committed and applied, in seconds.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
	})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dlockd_requests_total",
		Help: `API calls by method (the proto's RPC name, for gRPC, HTTP and Session calls alike), transport (grpc, http, session) and gRPC code; a call the client ended is code="Canceled".`,
	}, []string{"method", "transport", "code"})
	m.requestSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "dlockd_request_duration_seconds",
		Help:    "Duration of API calls by method and transport, in seconds (Watch and Session streams are not timed; a Session's calls are).",
		Buckets: requestBuckets,
	}, []string{"method", "transport"})
	m.expired = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dlockd_leases_expired_total",
		Help: "Grants ended by expiry (applied on this node).",
	})
	bi := buildinfo.Read()
	m.reg.MustRegister(m.applySeconds, m.requests, m.requestSeconds, m.expired,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		raftStateCollector{s},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "dlockd_build_info",
			Help:        "Always 1; the labels say which build of dlockd runs (as dlockd --version does).",
			ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "go": bi.Go},
		}, func() float64 { return 1 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dlockd_raft_is_leader",
			Help: "1 when this node is the Raft leader.",
		}, func() float64 {
			if s.raft != nil && s.raft.State() == raft.Leader {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dlockd_raft_has_leader",
			Help: "1 when this node knows a Raft leader (itself or another member), 0 when it knows none (an election, no quorum, or not started).",
		}, func() float64 {
			if !s.raftUp.Load() {
				return 0
			}
			if _, id := s.raft.LeaderWithID(); id != "" {
				return 1
			}
			return 0
		}),
		memberCollector{m},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dlockd_raft_term",
			Help: "This node's current Raft term (0 before Start); a term that keeps rising means repeated elections.",
		}, func() float64 {
			if !s.raftUp.Load() {
				return 0
			}
			return float64(s.raft.CurrentTerm())
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "dlockd_raft_batching_mode",
			Help:        "Always 1; the label is this node's --batching (auto, on or off), which takes effect while it leads: a downgrade starts once every member reports off.",
			ConstLabels: prometheus.Labels{"mode": string(s.batchMode())},
		}, func() float64 { return 1 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dlockd_raft_batching",
			Help: "1 when this node is the leader and writes several commands per log entry (see --batching); 0 on every other node, and on a leader with --batching off or whose batch gate is shut (with --batching auto, its log names the members that keep it so).",
		}, func() float64 {
			if s.raftUp.Load() && s.isLeader() && s.batchEntries() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dlockd_raft_applied_index",
			Help: "Index of the last log entry applied to the lock table.",
		}, func() float64 { a, _ := s.fsm.appliedIndex(); return float64(a) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dlockd_ready",
			Help: "1 when this node serves writes.",
		}, func() float64 {
			if s.ready.Load() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dlockd_held_leases",
			Help: "Keys currently held.",
		}, func() float64 { h, _ := s.fsm.counts(); return float64(h) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dlockd_watch_sessions",
			Help: "Client sessions with an open Watch stream on this node.",
		}, func() float64 { return float64(s.sessions.count()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dlockd_waiters",
			Help: "Queue entries waiting for a key.",
		}, func() float64 { _, w := s.fsm.counts(); return float64(w) }),
	)
	m.limitRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dlockd_limit_refusals_total",
		Help: "Requests, streams and connections refused (or Session reads paused) by a limit of limits.go, by limit.",
	}, []string{"limit"})
	m.reg.MustRegister(m.limitRefusals)
	return m
}

// raftStates are the values of dlockd_raft_state's state label.
var raftStates = [...]raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown}

var raftStateDesc = prometheus.NewDesc("dlockd_raft_state",
	`Raft state of this node: 1 for the current state, 0 for the others (all 0 before Start).`,
	[]string{"state"}, nil)

// raftStateCollector exports dlockd_raft_state{state="leader|follower|
// candidate|shutdown"}, read from Raft at scrape time.
type raftStateCollector struct{ s *Server }

// Describe implements prometheus.Collector.
func (c raftStateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- raftStateDesc }

// Collect implements prometheus.Collector.
func (c raftStateCollector) Collect(ch chan<- prometheus.Metric) {
	cur := raft.RaftState(255) // not started: no state is current
	if c.s.raft != nil {
		cur = c.s.raft.State()
	}
	for _, st := range raftStates {
		v := 0.0
		if st == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(raftStateDesc, prometheus.GaugeValue, v, strings.ToLower(st.String()))
	}
}

// methodName returns the method label of a call: the last element of a
// gRPC full method ("/dlock.v1.Lock/Acquire" is "Acquire"), the RPC name of
// an HTTP route name ("cancel-wait" is "CancelWait"), or the name itself.
func methodName(m string) string {
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		return m[i+1:]
	}
	if n, ok := httpMethodNames[m]; ok {
		return n
	}
	if strings.ContainsRune(m, '-') { // a route added since: kebab to camel case
		var b strings.Builder
		for part := range strings.SplitSeq(m, "-") {
			if part != "" {
				b.WriteString(strings.ToUpper(part[:1]))
				b.WriteString(part[1:])
			}
		}
		return b.String()
	}
	if m != "" && m[0] >= 'a' && m[0] <= 'z' {
		return strings.ToUpper(m[:1]) + m[1:]
	}
	return m
}

// httpMethodNames maps the route names of http.go to RPC names.
var httpMethodNames = map[string]string{
	"acquire":       "Acquire",
	"wait":          "Wait",
	"renew":         "Renew",
	"release":       "Release",
	"cancel-wait":   "CancelWait",
	"check-fence":   "CheckFence",
	"inspect":       "Inspect",
	"list":          "List",
	"watch":         "Watch",
	"session":       "Session",
	"force-release": "ForceRelease",
}

// codeOf returns the code label of a call that ended with err; clientGone
// says the call's context was cancelled (the client went away), which makes
// any error but an API error of the server code="Canceled".
func codeOf(err error, clientGone bool) string {
	if err == nil {
		return codes.OK.String()
	}
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.code.String()
	}
	if clientGone || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return codeCanceled
	}
	return status.Code(err).String()
}

// record counts one call and, when d >= 0, times it.
func (m *metrics) record(transport, method, code string, d time.Duration) {
	m.requests.WithLabelValues(method, transport, code).Inc()
	if d >= 0 {
		m.requestSeconds.WithLabelValues(method, transport).Observe(d.Seconds())
	}
}

// observe counts and times one finished call: transport is transportGRPC,
// transportHTTP or transportSession, method a gRPC full method, an RPC name
// or an HTTP route name (see methodName), err the call's error and d its
// duration (negative: not timed). The HTTP handlers and Session's calls
// call it when they answer, with logRequest.
func (m *metrics) observe(transport, method string, err error, d time.Duration) {
	m.record(transport, methodName(method), codeOf(err, false), d)
}

// requestDone counts, times and (at debug) logs one finished call that
// started at start: transport is transportHTTP or transportSession, method
// an RPC name, a gRPC full method or an HTTP route name, key the call's key
// (keyOf(req); "" for none). It is the one line the HTTP handlers and
// Session's calls need; gRPC calls are handled by the interceptors.
func (s *Server) requestDone(transport, method, key string, err error, start time.Time) {
	d := time.Since(start)
	s.metrics.observe(transport, method, err, d)
	s.logRequest(method, key, err, d)
}

// count counts one call of a Session stream, without its duration.
//
// Deprecated: call observe(transportSession, method, err, d), which times
// the call too.
func (m *metrics) count(method string, err error) {
	m.observe(transportSession, method, err, -1)
}

// countHTTP counts one call of the JSON API, without its duration.
//
// Deprecated: call observe(transportHTTP, method, err, d), which times the
// call too.
func (m *metrics) countHTTP(method string, err error) {
	m.observe(transportHTTP, method, err, -1)
}

// keyOf returns the key of a request message for the debug log: its key,
// the one key of a one-item renewal, the key of a Session call's request,
// or "".
func keyOf(req any) string {
	switch r := req.(type) {
	case interface{ GetKey() string }:
		return r.GetKey()
	case *dlockv1.RenewRequest:
		if items := r.GetItems(); len(items) == 1 {
			return items[0].GetKey()
		}
	case *dlockv1.SessionRequest:
		switch c := r.GetCall().(type) {
		case *dlockv1.SessionRequest_Acquire:
			return keyOf(c.Acquire)
		case *dlockv1.SessionRequest_Release:
			return keyOf(c.Release)
		case *dlockv1.SessionRequest_Renew:
			return keyOf(c.Renew)
		}
	}
	return ""
}

// unaryInterceptor counts, times and (at debug) logs every unary gRPC call.
func (m *metrics) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	d := time.Since(start)
	code := codeOf(err, err != nil && errors.Is(ctx.Err(), context.Canceled))
	method := methodName(info.FullMethod)
	m.record(transportGRPC, method, code, d)
	if m.s.debugEnabled() {
		m.s.logCall(method, keyOf(req), code, err, d)
	}
	return resp, err
}

// streamInterceptor counts and (at debug) logs every gRPC stream when it
// ends, and times Wait streams (the time to the grant, or to the wait's
// end).
func (m *metrics) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	obs := &observedStream{ServerStream: ss, wantKey: info.FullMethod == dlockv1.Lock_Wait_FullMethodName}
	err := h(srv, obs)
	d := time.Since(start)
	code := codeOf(err, err != nil && errors.Is(ss.Context().Err(), context.Canceled))
	if err == nil && obs.cancelled {
		code = codeCanceled
	}
	method := methodName(info.FullMethod)
	timed := d
	if info.FullMethod == dlockv1.Lock_Watch_FullMethodName || info.FullMethod == dlockv1.Lock_Session_FullMethodName {
		timed = -1
	}
	m.record(transportGRPC, method, code, timed)
	if m.s.debugEnabled() {
		m.s.logCall(method, obs.key, code, err, d)
	}
	return err
}

// observedStream notes, for the metrics and the debug log, the key of a
// Wait stream's request and whether it answered CANCELLED. Only Wait's
// handler goroutine writes the fields, before it returns: its first Recv
// precedes the goroutine it starts to read further messages.
type observedStream struct {
	grpc.ServerStream
	wantKey   bool // a Wait stream: note the key of its first request
	key       string
	cancelled bool
}

// RecvMsg implements grpc.ServerStream.
func (o *observedStream) RecvMsg(msg any) error {
	err := o.ServerStream.RecvMsg(msg)
	if err == nil && o.wantKey {
		o.wantKey = false
		o.key = keyOf(msg)
	}
	return err
}

// SendMsg implements grpc.ServerStream.
func (o *observedStream) SendMsg(msg any) error {
	if ev, ok := msg.(*dlockv1.WaitEvent); ok && ev.GetType() == dlockv1.WaitEvent_CANCELLED {
		o.cancelled = true
	}
	return o.ServerStream.SendMsg(msg)
}
