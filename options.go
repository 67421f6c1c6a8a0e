package dlock

import (
	"time"
)

// Default values of the acquisition options.
const (
	// DefaultTTL is the lease TTL when WithTTL is not given.
	DefaultTTL = 30 * time.Second
	// DefaultBackoffMin and DefaultBackoffMax bound the full-jitter
	// exponential backoff of polling waits.
	DefaultBackoffMin = 5 * time.Millisecond
	DefaultBackoffMax = 1 * time.Second
	// DefaultOpTimeout bounds one store round trip (an acquisition attempt,
	// a renewal, a release) when the caller's context has no earlier
	// deadline; past it the store counts as unavailable.
	DefaultOpTimeout = 5 * time.Second
)

// Option configures a Locker (given to New or Open, where it sets the
// defaults of every call) or a single acquisition (given to Acquire,
// TryAcquire, AcquireAll or Do, where it overrides the Locker's default).
type Option func(*options)

type options struct {
	ttl        time.Duration
	heartbeat  time.Duration // 0: ttl/3
	drift      time.Duration // <0: default 1% of ttl + 2ms
	backoffMin time.Duration
	backoffMax time.Duration
	opTimeout  time.Duration
	failOpen   bool
	holder     string
	keyClass   string
	observer   Observer
	storeName  string
}

func defaultOptions() options {
	return options{
		ttl:        DefaultTTL,
		drift:      -1,
		backoffMin: DefaultBackoffMin,
		backoffMax: DefaultBackoffMax,
		opTimeout:  DefaultOpTimeout,
		keyClass:   "default",
	}
}

// WithTTL sets the lease time to live: how long the store keeps a grant that
// is not renewed. It must lie in [MinTTL, MaxTTL] (100 ms to 24 h), else the
// acquisition fails with ErrInvalidTTL (zero included). Without this option
// the TTL is DefaultTTL (30 s).
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithHeartbeat sets the interval between renewals. Zero value: TTL/3. An
// interval shorter than MinHeartbeat (10 ms), or not shorter than the TTL
// minus drift (the lease would lapse between renewals), fails the
// acquisition with ErrInvalidTTL.
func WithHeartbeat(interval time.Duration) Option {
	return func(o *options) { o.heartbeat = interval }
}

// WithDrift sets the margin subtracted from the TTL when computing the local
// validity deadline (sent + TTL − drift), covering clock-rate differences
// between client and store. Default: 1% of the TTL plus 2 ms. Negative values
// select the default.
func WithDrift(drift time.Duration) Option { return func(o *options) { o.drift = drift } }

// WithBackoff bounds the full-jitter exponential backoff between polling
// attempts of Acquire on stores that cannot queue waiters: the n-th sleep is
// uniform in [0, min(max, min·2ⁿ)). Zero values keep the defaults (5 ms and
// 1 s).
func WithBackoff(min, max time.Duration) Option {
	return func(o *options) {
		if min > 0 {
			o.backoffMin = min
		}
		if max > 0 {
			o.backoffMax = max
		}
	}
}

// WithOpTimeout bounds each store round trip (one attempt, one renewal, one
// release). Past it the store counts as unavailable. Zero value:
// DefaultOpTimeout (5 s).
func WithOpTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.opTimeout = d
		}
	}
}

// WithFailOpen makes an acquisition that finds the store unavailable return a
// degraded lease instead of ErrUnavailable. A degraded lease has no fence
// (Fence returns 0), is not renewed and protects nothing: use it only for
// efficiency locks, where a rare double run is acceptable. The default is to
// fail closed.
func WithFailOpen() Option { return func(o *options) { o.failOpen = true } }

// WithHolder sets a human-readable description of the holder (for example
// "host-3 pid 4121 nightly-settlement"), stored with the grant where the
// store can keep it and shown by inspection.
func WithHolder(description string) Option {
	return func(o *options) { o.holder = description }
}

// WithKeyClass sets the label under which the observer reports this
// acquisition (for example "settlement"); raw keys are never used as metric
// labels. Zero value: "default".
func WithKeyClass(class string) Option {
	return func(o *options) {
		if class != "" {
			o.keyClass = class
		}
	}
}

// WithObserver sets the Observer that receives this locker's or call's
// events; see package dlock/metrics for a Prometheus collector. Zero value:
// no observer.
func WithObserver(obs Observer) Option { return func(o *options) { o.observer = obs } }

func (o *options) effectiveDrift() time.Duration {
	if o.drift >= 0 {
		return o.drift
	}
	return o.ttl/100 + 2*time.Millisecond
}

func (o *options) effectiveHeartbeat() time.Duration {
	if o.heartbeat > 0 {
		return o.heartbeat
	}
	return o.ttl / 3
}
