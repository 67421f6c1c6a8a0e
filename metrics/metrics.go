// Package metrics reports dlock's lock metrics to Prometheus: a Collector
// that is both a dlock.Observer (give it to dlock.WithObserver) and a
// prometheus.Collector (register it with a prometheus.Registerer).
//
// Metrics, all labelled by store and key_class (never by raw key):
//
//	dlock_acquire_duration_seconds{result}  histogram: time to acquire, by result
//	dlock_acquire_contended_total           counter: attempts that found the key held
//	dlock_hold_duration_seconds             histogram: time from grant to release or loss
//	dlock_hold_ttl_ratio                    histogram: that time divided by the lease's TTL
//	dlock_renewals_total{result}            counter: renewals, result "ok" or "error"
//	dlock_renewal_margin_seconds            histogram: validity left when a renewal was confirmed
//	dlock_leases_lost_total{reason}         counter: leases lost while held ("expired", "not_owner", "store_reported", "permission_denied")
//
// The renewal margin is the early warning that a TTL is too short for the
// store's latency: when it approaches zero, leases are about to be lost.
//
// # Hold time against the TTL
//
// dlock_hold_ttl_ratio is each lease's hold time divided by its own TTL
// (dlock.EndEvent.TTL), so leases of different TTLs share one histogram and
// its quantiles compare with the TTL directly: a p99 above 0.5 says that
// 1% of the work outlives half its TTL, so it rests on renewals arriving
// in time, and one stalled renewal (a GC pause, a slow store) can end the
// lease mid-work. deploy/prometheus/alerts.yaml alerts on it
// (DlockHoldTimeNearTTL):
//
//	histogram_quantile(0.99, sum by (store, key_class, le) (rate(dlock_hold_ttl_ratio_bucket[10m]))) > 0.5
//
// Its buckets have a bound at 0.5 (and 0.25, 0.75, 1), so that quantile is
// exact at the threshold rather than interpolated across it.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlock-dev/dlock"
)

// HoldTTLBuckets are the upper bounds of dlock_hold_ttl_ratio (hold time
// divided by the lease's TTL, no unit). 0.5 is a bound: the alert on the
// p99 above half the TTL reads it without interpolation.
var HoldTTLBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2, 5, 10, 100}

// Collector gathers dlock's metrics. It is safe for concurrent use.
type Collector struct {
	acquire   *prometheus.HistogramVec
	contended *prometheus.CounterVec
	hold      *prometheus.HistogramVec
	holdTTL   *prometheus.HistogramVec
	renewals  *prometheus.CounterVec
	margin    *prometheus.HistogramVec
	lost      *prometheus.CounterVec
}

var (
	_ dlock.Observer       = (*Collector)(nil)
	_ prometheus.Collector = (*Collector)(nil)
)

// NewCollector returns a Collector with its metric names under the "dlock"
// namespace. Register it once per registry.
func NewCollector() *Collector {
	labels := []string{"store", "key_class"}
	with := func(extra string) []string { return append(append([]string{}, labels...), extra) }
	return &Collector{
		acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "dlock", Name: "acquire_duration_seconds",
			Help:    "Time from the start of an acquisition to its result, in seconds, by result.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 12), // 100µs .. ~7min
		}, with("result")),
		contended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dlock", Name: "acquire_contended_total",
			Help: "Acquisition attempts that found the key held by another owner.",
		}, labels),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "dlock", Name: "hold_duration_seconds",
			Help:    "Time from grant to release or loss, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 12), // 1ms .. ~70min
		}, labels),
		holdTTL: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "dlock", Name: "hold_ttl_ratio",
			Help:    "Time from grant to release or loss divided by the lease's TTL (above 1: the lease lived on renewals).",
			Buckets: HoldTTLBuckets,
		}, labels),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dlock", Name: "renewals_total",
			Help: "Lease renewals by result (ok, error).",
		}, with("result")),
		margin: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "dlock", Name: "renewal_margin_seconds",
			Help:    "Validity left on the previous deadline when a renewal was confirmed, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16), // 1ms .. ~33s
		}, labels),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dlock", Name: "leases_lost_total",
			Help: "Leases lost while held (expiries while working), by reason.",
		}, with("reason")),
	}
}

// AcquireDone implements dlock.Observer.
func (c *Collector) AcquireDone(e dlock.AcquireEvent) {
	c.acquire.WithLabelValues(e.Store, e.KeyClass, e.Result).Observe(e.Latency.Seconds())
	if e.Contended > 0 {
		c.contended.WithLabelValues(e.Store, e.KeyClass).Add(float64(e.Contended))
	}
}

// Renewed implements dlock.Observer.
func (c *Collector) Renewed(e dlock.RenewEvent) {
	if e.Err != nil {
		c.renewals.WithLabelValues(e.Store, e.KeyClass, "error").Inc()
		return
	}
	c.renewals.WithLabelValues(e.Store, e.KeyClass, "ok").Inc()
	c.margin.WithLabelValues(e.Store, e.KeyClass).Observe(e.Margin.Seconds())
}

// LeaseEnded implements dlock.Observer.
func (c *Collector) LeaseEnded(e dlock.EndEvent) {
	c.hold.WithLabelValues(e.Store, e.KeyClass).Observe(e.Held.Seconds())
	if e.TTL > 0 { // an Observer event built without a TTL has no ratio
		c.holdTTL.WithLabelValues(e.Store, e.KeyClass).Observe(e.Held.Seconds() / e.TTL.Seconds())
	}
	if e.Lost {
		c.lost.WithLabelValues(e.Store, e.KeyClass, e.LostReason).Inc()
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.acquire.Describe(ch)
	c.contended.Describe(ch)
	c.hold.Describe(ch)
	c.holdTTL.Describe(ch)
	c.renewals.Describe(ch)
	c.margin.Describe(ch)
	c.lost.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.acquire.Collect(ch)
	c.contended.Collect(ch)
	c.hold.Collect(ch)
	c.holdTTL.Collect(ch)
	c.renewals.Collect(ch)
	c.margin.Collect(ch)
	c.lost.Collect(ch)
}

// Contended returns the contention counter of one store and key class, for
// tests and dashboards built in Go.
func (c *Collector) Contended(store, keyClass string) prometheus.Counter {
	return c.contended.WithLabelValues(store, keyClass)
}

// Lost returns the counter of leases lost for one reason.
func (c *Collector) Lost(store, keyClass, reason string) prometheus.Counter {
	return c.lost.WithLabelValues(store, keyClass, reason)
}

// Renewals returns the renewal counter for one result ("ok" or "error").
func (c *Collector) Renewals(store, keyClass, result string) prometheus.Counter {
	return c.renewals.WithLabelValues(store, keyClass, result)
}
