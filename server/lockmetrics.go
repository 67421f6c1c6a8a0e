package server

import "github.com/prometheus/client_golang/prometheus"

// lockMetrics counts what the lock table's safety mechanisms do: force
// releases, unclaimed handovers, lock-delays. They live beside the
// request metrics (metrics.go) in the server's registry.
type lockMetrics struct {
	forceReleased prometheus.Counter
	unclaimed     prometheus.Counter
	lockDelays    prometheus.Counter
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
	}
	reg.MustRegister(m.forceReleased, m.unclaimed, m.lockDelays)
	return m
}
