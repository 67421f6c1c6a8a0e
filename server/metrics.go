package server

import (
	"context"
	"errors"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// metrics are the server's Prometheus collectors, in a registry of its own
// so that several servers can run in one process.
type metrics struct {
	reg          *prometheus.Registry
	applySeconds prometheus.Histogram
	requests     *prometheus.CounterVec
	expired      prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.applySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "dlockd_raft_apply_seconds",
		Help:    "Time from proposing a command to Raft until it was committed and applied, in seconds.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
	})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dlockd_requests_total",
		Help: "API requests by method and gRPC code.",
	}, []string{"method", "code"})
	m.expired = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dlockd_leases_expired_total",
		Help: "Grants ended by expiry (applied on this node).",
	})
	m.reg.MustRegister(m.applySeconds, m.requests, m.expired,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dlockd_raft_state",
			Help: "Raft state of this node: 0 follower, 1 candidate, 2 leader, 3 shutdown, -1 not started.",
		}, func() float64 {
			if s.raft == nil {
				return -1
			}
			return float64(s.raft.State())
		}),
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
	return m
}

func (m *metrics) count(method string, err error) {
	code := "OK"
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			code = ae.code.String()
		} else {
			code = status.Code(err).String()
		}
	}
	m.requests.WithLabelValues(method, code).Inc()
}

func (m *metrics) countHTTP(method string, err error) { m.count("http:"+method, err) }

func (m *metrics) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	m.count(info.FullMethod, err)
	return resp, err
}

func (m *metrics) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	err := h(srv, ss)
	m.count(info.FullMethod, err)
	return err
}
