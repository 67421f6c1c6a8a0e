package dlock

import "time"

// Observer receives a locker's events, for metrics and logs. Methods are
// called synchronously from the acquiring goroutine or the lease's
// heartbeat and must return quickly. Labels are the store name and the
// caller-chosen key class (WithKeyClass), never the raw key. Package
// dlock/metrics implements it as a Prometheus collector.
type Observer interface {
	// AcquireDone reports one finished Acquire, TryAcquire or AcquireAll
	// member: how long it took, its result ("acquired", "not_acquired",
	// "unavailable", "canceled", "invalid", "closed", "degraded") and how
	// many attempts found the key held (contention). An acquisition whose
	// ctx ended while it retried a store outage is "unavailable"; invalid
	// input (ErrInvalidArgument) is "invalid".
	AcquireDone(e AcquireEvent)
	// Renewed reports a confirmed renewal and the validity margin that was
	// left when it was confirmed (the early warning that the TTL is too
	// short), or a failed renewal (Err set).
	Renewed(e RenewEvent)
	// LeaseEnded reports a lease that ended, by release or by loss, with how
	// long it was held and, for a loss, its reason ("expired",
	// "not_owner", "store_reported", "permission_denied").
	LeaseEnded(e EndEvent)
}

// AcquireEvent is given to Observer.AcquireDone.
type AcquireEvent struct {
	Store, KeyClass string
	Result          string
	Latency         time.Duration
	Contended       int // attempts that found the key held
}

// RenewEvent is given to Observer.Renewed.
type RenewEvent struct {
	Store, KeyClass string
	// Margin is the validity left on the previous deadline when the renewal
	// was confirmed; meaningful when Err is nil.
	Margin time.Duration
	// Err is nil for a confirmed renewal, else the renewal's error.
	Err error
}

// EndEvent is given to Observer.LeaseEnded.
type EndEvent struct {
	Store, KeyClass string
	Held            time.Duration
	// TTL is the lease's TTL (WithTTL, or the default): Held/TTL says how
	// much of the work relied on renewals, which is what the "hold time
	// above half the TTL" alert of package metrics watches.
	TTL time.Duration
	// Lost is true when the lease was lost rather than released;
	// LostReason then says why.
	Lost       bool
	LostReason string
}

// Reasons a lease is lost, as reported in EndEvent.LostReason.
const (
	LostExpired       = "expired"        // validity deadline passed without a confirmed renewal
	LostNotOwner      = "not_owner"      // a renewal said the owner token no longer holds the key
	LostStoreReported = "store_reported" // the store pushed the loss (session expiry, dropped connection)
	// LostPermissionDenied: a renewal was refused for its credentials
	// (ErrPermissionDenied: a revoked token, a permission taken away).
	LostPermissionDenied = "permission_denied"
)

type nopObserver struct{}

func (nopObserver) AcquireDone(AcquireEvent) {}
func (nopObserver) Renewed(RenewEvent)       {}
func (nopObserver) LeaseEnded(EndEvent)      {}

// RetryObserver is an optional extension of Observer: an Observer that also
// implements it is told of every retry of a transient store error by an
// acquisition (see WithRetryFor), just before the backoff sleep. It is
// found by type assertion, so Observers written without it keep working.
type RetryObserver interface {
	AcquireRetry(e RetryEvent)
}

// RetryEvent is given to RetryObserver.AcquireRetry.
type RetryEvent struct {
	Store, KeyClass string
	// Attempt counts the failed attempts of this outage so far (≥ 1).
	Attempt int
	// Elapsed is the time since the outage's first attempt was sent.
	Elapsed time.Duration
	// Backoff is the sleep before the next attempt.
	Backoff time.Duration
	// Err is the store error being retried.
	Err error
}
