package dlock

import (
	"fmt"
	"time"
)

// Default values of the acquisition options.
const (
	// DefaultTTL is the lease TTL when WithTTL is not given.
	DefaultTTL = 30 * time.Second
	// DefaultBackoffMin and DefaultBackoffMax bound the full-jitter
	// exponential backoff of polling waits and of retries after transient
	// store errors.
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
	retryFor   time.Duration // with retrySet; see retryBudget
	retrySet   bool
	holder     string
	keyClass   string
	observer   Observer
	storeName  string
	storeAddr  string        // the store's redacted URL, for error messages (Open)
	maxHold    time.Duration // 0: no bound (WithMaxHold)
	// bad is the first invalid option given (a nil Option, a negative op
	// timeout, backoff bounds out of order): validateOptions returns it,
	// so the acquisition fails before any store call.
	bad error
}

// apply applies opts to o in order, recording a nil Option in o.bad.
func (o *options) apply(opts []Option) {
	for _, opt := range opts {
		if opt == nil {
			o.invalid(fmt.Errorf("%w: a nil Option", ErrInvalidArgument))
			continue
		}
		opt(o)
	}
}

// invalid records err as o's first invalid option.
func (o *options) invalid(err error) {
	if o.bad == nil {
		o.bad = err
	}
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
// interval shorter than MinHeartbeat (10 ms), negative ones included, or
// not shorter than the TTL minus drift (the lease would lapse between
// renewals), fails the acquisition with ErrInvalidTTL.
func WithHeartbeat(interval time.Duration) Option {
	return func(o *options) { o.heartbeat = interval }
}

// WithDrift sets the margin subtracted from the TTL when computing the local
// validity deadline (sent + TTL − drift), covering clock-rate differences
// between client and store. Default: 1% of the TTL plus 2 ms. Negative values
// select the default.
func WithDrift(drift time.Duration) Option { return func(o *options) { o.drift = drift } }

// WithBackoff bounds the full-jitter exponential backoff between polling
// attempts of Acquire on stores that cannot queue waiters, and between
// retries of transient store errors (WithRetryFor): the n-th sleep is
// uniform in [0, min(max, min·2ⁿ)). Zero values keep the defaults (5 ms and
// 1 s). A negative bound, or a min above the max (after the defaults are
// filled in), fails the acquisition with ErrInvalidArgument.
func WithBackoff(min, max time.Duration) Option {
	return func(o *options) {
		if min < 0 || max < 0 {
			o.invalid(fmt.Errorf("%w: backoff bounds %v and %v: negative", ErrInvalidArgument, min, max))
			return
		}
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
// DefaultOpTimeout (5 s). A negative d fails the acquisition with
// ErrInvalidArgument.
func WithOpTimeout(d time.Duration) Option {
	return func(o *options) {
		switch {
		case d < 0:
			o.invalid(fmt.Errorf("%w: op timeout %v is negative", ErrInvalidArgument, d))
		case d > 0:
			o.opTimeout = d
		}
	}
}

// WithFailOpen makes an acquisition that finds the store unavailable return a
// degraded lease instead of ErrUnavailable, once its retry budget for
// transient store errors is spent (see WithRetryFor): TryAcquire degrades
// after its one attempt (or after WithRetryFor's budget); Acquire, Do and
// AcquireAll retry for WithRetryFor's budget, or for the op timeout
// (WithOpTimeout, default 5 s) when WithRetryFor is not given, then degrade.
// Only ErrUnavailable degrades: invalid input (ErrInvalidArgument and the
// specific ErrInvalidKey, ErrInvalidTTL, ErrInvalidHolder), a held key,
// ErrClosed, ErrUnsupported and the end of ctx are returned as errors, never
// as a degraded lease. A degraded lease has no fence (Fence returns 0), is not
// renewed and protects nothing: use it only for efficiency locks, where a
// rare double run is acceptable. The default is to fail closed.
func WithFailOpen() Option { return func(o *options) { o.failOpen = true } }

// WithRetryFor sets the retry budget of an acquisition for transient store
// errors (ErrUnavailable: a store that refused the connection, is shutting
// down or restarting, is electing a leader, or did not answer within the op
// timeout). While the budget lasts the acquisition retries with full-jitter
// exponential backoff within WithBackoff's bounds; each retry uses a new
// owner token, and whatever an ambiguous attempt may have left on the store
// is released in the background. The budget counts from the first store
// error of an outage; any answer from the store (for example "the key is
// held" while Acquire waits) ends the outage, and the next error starts a
// new budget. No new attempt starts after the budget is spent, and each
// attempt is bounded by the op timeout, so an acquisition that finds the
// store down gives up within d plus one op timeout. It then returns an error
// matching ErrUnavailable that wraps the last store error and says how long
// it retried (or, with WithFailOpen, a degraded lease).
//
// Zero value (the option not given): TryAcquire makes one attempt (no
// retry); Acquire, Do and AcquireAll retry until their ctx ends (and then
// return an error matching both ErrUnavailable and ctx.Err()), except with
// WithFailOpen, where they retry for the op timeout. WithRetryFor(0) makes
// one attempt, waiting acquisitions included: a waiting Acquire then returns
// ErrUnavailable at its first store error. A negative d fails the
// acquisition with ErrInvalidArgument. Invalid input, ErrNotAcquired (for
// TryAcquire), ErrLeaseLost, ErrUnsupported, ErrClosed and the end of ctx
// are never retried.
func WithRetryFor(d time.Duration) Option {
	return func(o *options) { o.retryFor, o.retrySet = d, true }
}

// WithHolder sets a human-readable description of the holder (for example
// "host-3 pid 4121 nightly-settlement"), stored with the grant where the
// store can keep it and shown by inspection. It must be at most
// MaxHolderBytes (256) bytes of valid UTF-8 without control characters
// (tabs and newlines included); otherwise the acquisition fails with
// ErrInvalidHolder (which matches ErrInvalidArgument) before any store is
// called, and WithFailOpen does not apply. Zero value: no description.
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

// WithMaxHold bounds how long a lease is held: its heartbeat sends no
// renewal once d has passed since the grant (measured, like validity, from
// the moment the acquisition request was sent, on this process's monotonic
// clock), and at grant + d at the latest the lease ends: Done closes and
// Context is cancelled with cause ErrMaxHoldReached (which matches
// ErrLeaseLost, so loss handling that already exists stops the work). A
// holder that is stuck, or a job that runs away, so loses its lease at a
// time known in advance instead of keeping it as long as its process lives.
// No anchor (Chubby, ZooKeeper, etcd, Redisson) offers this; it is dlock's.
//
// On the store the grant is not released at that moment: renewals stop and
// it expires by its TTL, at most a TTL after the last renewal sent before
// grant + d. A successor therefore starts no earlier than that, which leaves
// a holder that has not yet noticed the cancelled context at least a TTL
// minus a heartbeat interval to stop (or to have its late writes land
// before the successor's), as after any other loss; a stuck process cannot
// be trusted to send a release anyway. A holder that did stop can call
// Release: it still removes the grant on the store (owner-checked, so never
// a successor's), letting the next holder in at once, and returns the
// ErrMaxHoldReached error, so that the caller learns its work was cut
// short.
//
// Zero value: no bound. A negative d fails the acquisition with
// ErrInvalidArgument. Given to Resume, d counts from the resumption (the
// original grant's time is not known to a new process without comparing
// wall clocks).
func WithMaxHold(d time.Duration) Option { return func(o *options) { o.maxHold = d } }

// retryBudget returns how long an acquisition retries transient store
// errors after the first one of an outage; negative: until ctx ends.
func (o *options) retryBudget(wait bool) time.Duration {
	switch {
	case o.retrySet:
		return o.retryFor
	case !wait:
		return 0
	case o.failOpen:
		return o.opTimeout
	default:
		return -1
	}
}

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
