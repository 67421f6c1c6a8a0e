package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// lockMetrics counts what the lock table's safety mechanisms do: force
// releases, unclaimed handovers, lock-delays; and what its users live
// through: grants, contention, renewals refused, how long grants are held
// and how long waiters wait. They live beside the request metrics
// (metrics.go) in the server's registry; the dashboard (ui.go) reads them.
type lockMetrics struct {
	forceReleased prometheus.Counter
	unclaimed     prometheus.Counter
	lockDelays    prometheus.Counter

	grants        prometheus.Counter // applied on this node
	contended     prometheus.Counter // answered by this node (the leader)
	renewFailures prometheus.Counter // answered by this node (the leader)
	holdSeconds   prometheus.Histogram
	waitSeconds   prometheus.Histogram
}

// lockBuckets are the upper bounds, in seconds, of the hold-time and
// wait-time histograms: from a millisecond (a try that found the key free
// and released it at once) to an hour (a nightly job's lock).
var lockBuckets = []float64{
	0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
	120, 300, 600, 1800, 3600,
}

func newLockMetrics(reg *prometheus.Registry) *lockMetrics {
	m := &lockMetrics{
		forceReleased: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dlockd_force_releases_total",
			Help: "Grants removed by an operator's force release (answered by this node).",
		}),
		unclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dlockd_unclaimed_handovers_total",
			Help: "Grants handed to a waiter that did not confirm them within the claim window, released to the next waiter (applied on this node).",
		}),
		lockDelays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dlockd_lock_delays_total",
			Help: "Keys that entered a lock-delay after a grant was lost without a release (applied on this node).",
		}),
		grants: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dlockd_grants_total",
			Help: "Grants made, to a free key or to the head of its queue (applied on this node).",
		}),
		contended: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dlockd_acquires_contended_total",
			Help: "Acquisitions that found the key held or in its lock-delay: refused tries and queued waits (answered by this node).",
		}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dlockd_renew_failures_total",
			Help: "Renewals answered lease lost: the grant had expired, was force-released or handed on (answered by this node).",
		}),
		holdSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dlockd_lease_hold_seconds",
			Help:    "Time from a grant to its end (release, expiry, force release, unclaimed handover), in seconds, observed by the leader from when it applied the grant.",
			Buckets: lockBuckets,
		}),
		waitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dlockd_acquire_wait_seconds",
			Help:    "Time from a queue entry to its grant, in seconds, observed by the leader from when it applied the queue entry.",
			Buckets: lockBuckets,
		}),
	}
	reg.MustRegister(m.forceReleased, m.unclaimed, m.lockDelays, m.grants, m.contended, m.renewFailures, m.holdSeconds, m.waitSeconds)
	return m
}

// held observes one grant's hold time when this node is the leader.
func (m *lockMetrics) held(leader bool, d time.Duration) {
	if leader {
		m.holdSeconds.Observe(d.Seconds())
	}
}
