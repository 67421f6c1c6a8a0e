// Package dlock is a distributed lock whose grants are leases with fencing
// tokens: many processes on many machines agree that only one of them runs a
// piece of work at a time, and the work can be made safe to act on.
//
//	locker, err := dlock.Open(ctx, "redis://127.0.0.1:6379")
//	lease, err := locker.Acquire(ctx, "settle:42:2026-09-30", dlock.WithTTL(10*time.Second))
//	defer lease.Release(context.Background())
//	err = settle(lease.Context(), lease.Fence()) // stops when the lease is lost
//
// # Guarantees
//
// Every grant is a lease: an owner token (128 random bits, unique per grant)
// and a TTL that the store enforces. While the lease is held, a heartbeat
// renews it every TTL/3 (WithHeartbeat). The client measures validity on its
// own monotonic clock and never compares wall clocks across machines: a lease
// is valid until sent + TTL − drift, where sent is the moment the acquisition
// (or the last confirmed renewal) request was sent, so the time spent
// acquiring is subtracted. Drift defaults to 1% of the TTL plus 2 ms. Until
// its first renewal, a grant the store keeps less than a TTL from the
// request is valid only as long as the store keeps it (dlockd's claim
// window for a handed-over key, an etcd grant on a shared lease: see
// Lease.Deadline), and the first renewal comes sooner.
//
// Renewals, releases and acquisitions compare the owner token atomically on
// the store; a bare delete never happens, so a holder whose lease expired can
// never remove its successor's grant.
//
// # Lost leases
//
// A lease is lost when a renewal answers that the owner no longer holds the
// key, when the validity deadline passes without a confirmed renewal, or
// when the store pushes the loss (a ZooKeeper session expiry, a dropped
// PostgreSQL session). Loss is prompt: at the validity deadline, never
// later. A renewal the store refuses for its credentials (ErrPermissionDenied:
// dlockd's auth file was reloaded without the token, or without its
// permission on the key) loses the lease at once: no later renewal could be
// allowed, so none is sent. On loss Lease.Done closes and Lease.Context is
// cancelled with cause ErrLeaseLost (which also matches ErrPermissionDenied
// in that case); work running under that context must stop (self-fencing).
//
// # Fencing
//
// A lock alone cannot stop a holder that was paused (GC, swap, SIGSTOP) past
// its TTL from writing after its successor started. Every grant therefore
// carries a fencing token (Lease.Fence): a uint64 > 0, strictly greater than
// every fence issued earlier for the same key. Pass it to the protected
// resource and let the resource reject a stale one; package dlock/fence does
// that for SQL tables and Redis keys. Each driver's documentation says when
// its store can break fence monotonicity (Redis without persistence, for
// example).
//
// # Bounded holds and resumed leases
//
// WithMaxHold(d) bounds a hold: no renewal is sent once d has passed since
// the grant, and the lease ends at grant + d with cause ErrMaxHoldReached
// (which matches ErrLeaseLost); the store expires the grant by its TTL, so a
// stuck holder loses its lease at a time known in advance.
//
// Lease.Token returns a LeaseToken (key, owner token, fence, TTL; JSON), and
// Locker.Resume re-attaches a restarted process to that grant while the
// store still holds it, after the store confirms the owner and the fence:
// the resumed lease has the same fence and behaves as a fresh one. Stores
// whose grants outlive their client's connection resume (driver.Resumer:
// dlockd, Redis, Redlock, mem, and the others their packages name);
// ZooKeeper and PostgreSQL advisory locks, whose grants end with their
// session, report ErrUnsupported.
//
// # Store outages
//
// dlock fails closed. A store that cannot be reached, is restarting or
// shutting down, is electing a leader, or does not answer within the op
// timeout (WithOpTimeout, default 5 s) is a transient error
// (ErrUnavailable), and an acquisition retries it with full-jitter
// exponential backoff for its retry budget (WithRetryFor): a waiting Acquire
// until its ctx ends, TryAcquire not at all unless WithRetryFor gives it a
// budget. Only when the budget is spent (or ctx ends) does it return an
// error matching ErrUnavailable, which wraps the last store error and says
// how long it retried; nothing is left held on the store. WithFailOpen
// returns a degraded lease without a fence instead, once the budget is
// spent, for efficiency locks only.
//
// Input dlock or the store refuses as invalid (a key, TTL, holder, option
// or store URL) is ErrInvalidArgument, or the specific ErrInvalidKey,
// ErrInvalidTTL or ErrInvalidHolder that match it: never ErrUnavailable,
// never retried, and never turned into a degraded lease by WithFailOpen.
// Keys, TTLs and holders are checked before any store is called. A call the
// store refuses for its credentials (a token dlockd does not know, or an
// identity without the permission on the key) is ErrPermissionDenied,
// which matches ErrInvalidArgument too.
//
// # Stores
//
// A store is chosen by URL (Open), or by constructing a driver directly
// (New). Drivers live under dlock/drivers: dlockddriver (dlockd://, the
// default), redisdriver (redis://), redlockdriver (redlock://), etcddriver
// (etcd://), zkdriver (zk://), pgdriver (postgres://), pgadvisory
// (pgadvisory://) and memdriver (mem://, in-process). Each driver's package
// documentation states its safety assumptions.
package dlock

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

// The sentinel errors. Every error of an acquisition, renewal, release or
// inspection matches one of them (or the context's error) with errors.Is,
// and carries the operation, key and store in its message. They are the
// same values as the driver package's (ErrUnsupported is the standard
// library's errors.ErrUnsupported), so errors.Is works at every layer.
var (
	// ErrNotAcquired: TryAcquire found the key held by another owner.
	ErrNotAcquired = driver.ErrNotAcquired
	// ErrLeaseLost: the lease can no longer be trusted (renewal refused,
	// validity deadline passed, or store-reported loss), or Release was
	// called on a lease that was already lost.
	ErrLeaseLost = driver.ErrLeaseLost
	// ErrUnavailable: the store could not be reached or did not answer
	// within the op timeout (for an acquisition: through its whole retry
	// budget, see WithRetryFor). The store's own error is wrapped too.
	ErrUnavailable = driver.ErrUnavailable
	// ErrInvalidArgument: an input (key, TTL, holder, owner, option, store
	// URL) was refused as invalid, by dlock or by the store. Never
	// ErrUnavailable, so WithFailOpen never runs work because of bad input;
	// retrying cannot help. ErrInvalidKey, ErrInvalidTTL and
	// ErrInvalidHolder match it too.
	ErrInvalidArgument = driver.ErrInvalidArgument
	// ErrInvalidKey: the key is empty, longer than MaxKeyBytes (512) bytes,
	// not valid UTF-8, or contains NUL. Matches ErrInvalidArgument.
	ErrInvalidKey = driver.ErrInvalidKey
	// ErrInvalidTTL: the TTL is outside [MinTTL, MaxTTL], or the heartbeat
	// interval is shorter than MinHeartbeat or not shorter than the TTL
	// minus drift. Matches ErrInvalidArgument.
	ErrInvalidTTL = driver.ErrInvalidTTL
	// ErrInvalidHolder: the WithHolder description is longer than
	// MaxHolderBytes (256) bytes, not valid UTF-8, or contains a control
	// character. Matches ErrInvalidArgument.
	ErrInvalidHolder = driver.ErrInvalidHolder
	// ErrPermissionDenied: the store refused the call for its credentials
	// (dlockd with --auth-file: the token's identity lacks the permission
	// on the key, or the token is missing, unknown or revoked). Matches
	// ErrInvalidArgument, never ErrUnavailable; retrying cannot help. The
	// dlock CLI exits 77 (EX_NOPERM).
	ErrPermissionDenied = driver.ErrPermissionDenied
	// ErrStaleFence: a resource refused a write whose fencing token is not
	// greater than one it has already seen (package dlock/fence).
	ErrStaleFence = driver.ErrStaleFence
	// ErrClosed: the Locker has been closed.
	ErrClosed = driver.ErrClosed
	// ErrReleased: the lease was released by its holder; the cause of its
	// context after Release.
	ErrReleased = driver.ErrReleased
	// ErrUnsupported: the store cannot do the operation at all (Inspect or
	// List on a store without an inspector, ForceRelease on a store without
	// an override, Resume on a store whose grants die with their session);
	// retrying cannot help. It is errors.ErrUnsupported itself,
	// so errors.Is matches either name.
	ErrUnsupported = errors.ErrUnsupported
	// ErrMaxHoldReached: the lease ended because its WithMaxHold bound
	// passed; the cause of its context and its Err then. It matches
	// ErrLeaseLost too (errors.Is), so code that stops on a lost lease stops
	// on it as well; test ErrMaxHoldReached first to tell them apart.
	ErrMaxHoldReached error = maxHoldError{}
)

// notHeldError is Inspect's answer for a key nobody holds: it matches
// ErrNotAcquired without printing that sentinel's text ("lock held"),
// which would contradict it.
type notHeldError string

func (e notHeldError) Error() string        { return string(e) }
func (e notHeldError) Is(target error) bool { return target == ErrNotAcquired }

// maxHoldError is ErrMaxHoldReached: a loss by the holder's own bound.
type maxHoldError struct{}

func (maxHoldError) Error() string        { return "maximum hold time reached" }
func (maxHoldError) Is(target error) bool { return target == ErrLeaseLost }

// Limits of keys and TTLs, the same for every store.
const (
	MaxKeyBytes = driver.MaxKeyBytes // longest key, in bytes
	MinTTL      = driver.MinTTL      // shortest TTL: 100 ms
	MaxTTL      = driver.MaxTTL      // longest TTL: 24 h
	// MaxHolderBytes is the longest WithHolder description, in bytes.
	MaxHolderBytes = driver.MaxHolderBytes

	// MinHeartbeat is the shortest renewal interval (WithHeartbeat), so a
	// mistake cannot flood the store.
	MinHeartbeat = 10 * time.Millisecond
)

// HolderInfo describes the current grant of a key (see Locker.Inspect).
type HolderInfo = driver.HolderInfo

// Locker acquires leases from one store. It is safe for concurrent use; make
// one per process and store, and Close it at shutdown.
type Locker struct {
	drv   driver.Driver
	store string // the observer's store label
	addr  string // names the store in errors: its redacted URL, or the label
	opts  options

	closeCtx    context.Context
	closeCancel context.CancelCauseFunc

	cleanups sync.WaitGroup // background releases after ambiguous failures

	mu     sync.Mutex
	closed bool
	leases map[*Lease]struct{}

	parent *Locker              // set on a view (View): closes with it, does not own drv
	views  map[*Locker]struct{} // open views of this Locker
}

// Open opens a Locker on the store named by rawURL, choosing the driver by
// the URL's scheme ("mem", "redis", "dlockd", ...) from the drivers
// registered with driver.Register (import the driver package for its side
// effect, e.g. _ "github.com/dlock-dev/dlock/drivers/dlockddriver"). opts set
// the defaults of every acquisition. Errors name the URL with its password
// and secret query parameters (password=, token=, …) redacted, and so do
// the Locker's later errors ("dlock: acquire "k" on dlockd://host:7450: …").
//
// It returns an error wrapping ErrUnavailable when the driver could not
// reach the store (most drivers connect at Open; dlockd connects lazily, so
// an outage shows at the first call), and an error matching
// ErrInvalidArgument for everything else: an empty URL, one without a scheme
// (for "127.0.0.1:7450" the message suggests "dlockd://127.0.0.1:7450"), a
// scheme no registered driver serves (the message names the package to
// import for the schemes of this module's drivers, and lists the supported
// schemes for any other), a port outside 1..65535, and any URL or
// configuration the driver refuses. So bad configuration is never taken for
// an outage (WithFailOpen degrades only on ErrUnavailable).
func Open(ctx context.Context, rawURL string, opts ...Option) (*Locker, error) {
	if ctx == nil {
		return nil, fmt.Errorf("dlock: open: %w", errNilContext)
	}
	u, err := parseStoreURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("dlock: open: %w", err)
	}
	addr := redactURL(u)
	open, err := driver.Lookup(u.Scheme)
	if err != nil {
		return nil, fmt.Errorf("dlock: open %s: %w", addr, noDriver(u))
	}
	d, err := open(ctx, u)
	if err != nil {
		// Drivers report an unreachable store as ErrUnavailable; an
		// untagged network error (a third-party driver's dial error) is
		// one too. Anything else is a configuration error (a bad URL,
		// too few nodes) and must not pass for an outage (fail-open
		// would then run unlocked).
		var nerr net.Error
		switch {
		case errors.Is(err, ErrUnavailable), errors.Is(err, ErrInvalidArgument), ctxEnded(ctx) != nil:
		case errors.As(err, &nerr), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		default:
			err = fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
		return nil, fmt.Errorf("dlock: open %s: %w", addr, err)
	}
	if d == nil {
		return nil, fmt.Errorf("dlock: open %s: the driver for %q returned no driver and no error", addr, u.Scheme)
	}
	return New(d, append([]Option{WithStoreName(u.Scheme), withStoreAddr(addr)}, opts...)...), nil
}

// withStoreAddr sets the store's redacted URL, which names the store in
// error messages (Open).
func withStoreAddr(addr string) Option { return func(o *options) { o.storeAddr = addr } }

// WithStoreName sets the store name used as the observer's store label,
// and in error messages of a Locker made by New (a Locker made by Open names
// its store by URL there). Open sets it to the URL scheme; New defaults to
// "store". It only has an effect on New and Open.
func WithStoreName(name string) Option {
	return func(o *options) { o.storeName = name }
}

// New returns a Locker over a driver constructed directly. The Locker takes
// ownership of d: Close closes it. opts set the defaults of every
// acquisition.
func New(d driver.Driver, opts ...Option) *Locker {
	o := defaultOptions()
	o.storeName = "store"
	o.apply(opts)
	if d == nil {
		d = nilDriver{}
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Locker{
		drv:         d,
		store:       o.storeName,
		addr:        cmp.Or(o.storeAddr, o.storeName),
		opts:        o,
		closeCtx:    ctx,
		closeCancel: cancel,
		leases:      map[*Lease]struct{}{},
	}
}

// Driver returns the driver the Locker uses, for optional capabilities.
func (l *Locker) Driver() driver.Driver { return l.drv }

// Acquire waits until key is granted or ctx ends, and returns the lease. On
// stores that queue waiters (driver.Waiter) it waits by notification; on the
// others it polls with full-jitter exponential backoff (WithBackoff), woken
// early by release hints where the store gives them. Transient store errors
// (ErrUnavailable: the store down, restarting, electing a leader) are
// retried, with the same backoff, until ctx ends or for WithRetryFor's
// budget (the op timeout with WithFailOpen); pass a ctx with a deadline.
//
// Errors: ErrInvalidKey, ErrInvalidTTL, ErrInvalidHolder and
// ErrInvalidArgument for invalid input (before any store call, never
// degraded by WithFailOpen); ErrUnavailable once the retry budget is spent
// (fail closed; see WithFailOpen), wrapping the last store error; ErrClosed;
// an error matching ctx.Err() when ctx ends first, which also matches
// ErrUnavailable (and wraps the last store error) when ctx ended during an
// outage. When an error is returned, nothing is left held on the store.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...Option) (*Lease, error) {
	return l.acquire(ctx, key, true, l.callOptions(opts))
}

// TryAcquire makes one attempt and returns the lease, or an error matching
// ErrNotAcquired at once when key is held. A transient store error
// (ErrUnavailable) is not retried unless WithRetryFor gives a budget; then
// attempts are repeated, with backoff, until one gets an answer from the
// store (the lease, or ErrNotAcquired) or the budget is spent. Other errors
// are as for Acquire.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...Option) (*Lease, error) {
	return l.acquire(ctx, key, false, l.callOptions(opts))
}

// Do acquires key (waiting, as Acquire), runs fn with the lease's context,
// and releases the lease when fn returns or panics. It returns fn's error;
// when the lease was lost while fn ran, the error also matches ErrLeaseLost.
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context) error, opts ...Option) (err error) {
	if fn == nil {
		return l.wrap("acquire", key, fmt.Errorf("%w: Do was given a nil function", ErrInvalidArgument))
	}
	lease, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	// Released even when fn panics (the panic then goes on).
	defer func() {
		relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lease.opts.opTimeout)
		defer cancel()
		relErr := lease.Release(relCtx)
		switch {
		case errors.Is(relErr, ErrLeaseLost):
			err = errors.Join(err, relErr)
		case err == nil:
			err = relErr
		}
	}()
	return fn(lease.Context())
}

// Inspect returns the current grant of key. It returns an error wrapping
// ErrNotAcquired when the key is not held, and ErrUnsupported when the store
// cannot inspect. With ErrNotAcquired the HolderInfo still describes the
// key as far as the store knows: its waiters queued (dlockd) and, when the
// key is in a lock-delay after its holder was lost (dlockd's lock-delay),
// HolderInfo.LockDelay, the time for which new grants are refused; the
// error then says so.
func (l *Locker) Inspect(ctx context.Context, key string) (HolderInfo, error) {
	if err := ValidateKey(key); err != nil {
		return HolderInfo{}, l.wrap("inspect", key, err)
	}
	if ctx == nil {
		return HolderInfo{}, l.wrap("inspect", key, errNilContext)
	}
	in, ok := l.drv.(driver.Inspector)
	if !ok {
		return HolderInfo{}, l.wrap("inspect", key, ErrUnsupported)
	}
	octx, cancel := l.opContext(ctx, &l.opts)
	defer cancel()
	info, err := in.Inspect(octx, key)
	if errors.Is(err, ErrNotAcquired) {
		if info.LockDelay > 0 {
			return info, l.wrap("inspect", key, notHeldError(fmt.Sprintf("key is not held, but in its lock-delay for %v more", info.LockDelay.Round(time.Millisecond))))
		}
		return info, l.wrap("inspect", key, notHeldError("key is free"))
	}
	return info, l.classify("inspect", key, ctx, err)
}

// List returns the held keys that start with prefix, sorted by key, or
// ErrUnsupported when the store cannot list. A prefix must be valid UTF-8
// without NUL and at most MaxKeyBytes long, as keys are ("" lists every
// key); any other fails with ErrInvalidKey before the store is asked.
func (l *Locker) List(ctx context.Context, prefix string) ([]HolderInfo, error) {
	if prefix != "" {
		if err := ValidateKey(prefix); err != nil {
			return nil, l.wrap("list", prefix, fmt.Errorf("prefix: %w", err))
		}
	}
	if ctx == nil {
		return nil, l.wrap("list", prefix, errNilContext)
	}
	in, ok := l.drv.(driver.Inspector)
	if !ok {
		return nil, l.wrap("list", prefix, ErrUnsupported)
	}
	octx, cancel := l.opContext(ctx, &l.opts)
	defer cancel()
	infos, err := in.List(octx, prefix)
	return infos, l.classify("list", prefix, ctx, err)
}

// ForceRelease removes key's current grant whoever holds it — an operator's
// override for a holder known to be dead — and returns what it removed. The
// next grant still gets a greater fence, so a holder that was in fact alive
// is fenced out at the resource. reason is required: it is passed to the
// store (dlockd logs it too) and logged with the removed grant through
// log/slog. Errors: ErrInvalidKey; ErrInvalidArgument when reason is blank;
// ErrNotAcquired when key is free; ErrUnsupported when the store has no
// override (see each driver's docs); ErrUnavailable.
func (l *Locker) ForceRelease(ctx context.Context, key, reason string) (HolderInfo, error) {
	if err := ValidateKey(key); err != nil {
		return HolderInfo{}, l.wrap("force-release", key, err)
	}
	if strings.TrimSpace(reason) == "" {
		return HolderInfo{}, l.wrap("force-release", key, fmt.Errorf("%w: a reason is required", ErrInvalidArgument))
	}
	if ctx == nil {
		return HolderInfo{}, l.wrap("force-release", key, errNilContext)
	}
	fr, ok := l.drv.(driver.ForceReleaser)
	if !ok {
		return HolderInfo{}, l.wrap("force-release", key, fmt.Errorf("%w: the store has no force release", ErrUnsupported))
	}
	octx, cancel := l.opContext(ctx, &l.opts)
	defer cancel()
	info, err := fr.ForceRelease(octx, key, reason)
	if errors.Is(err, ErrNotAcquired) {
		return HolderInfo{}, l.wrap("force-release", key, notHeldError("key is free: nothing to release"))
	}
	if err != nil {
		return HolderInfo{}, l.classify("force-release", key, ctx, err)
	}
	slog.Warn("dlock: grant force-released", "store", l.store, "key", key, "fence", info.Fence, "holder", info.Holder, "reason", reason)
	return info, nil
}

// Close ends every lease the Locker still holds (releasing them on the
// store concurrently, best effort within the op timeout; their contexts are
// cancelled with cause ErrClosed), makes pending and later acquisitions fail with
// ErrClosed, and closes the driver. Closing twice returns nil.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	leases := make([]*Lease, 0, len(l.leases))
	for ls := range l.leases {
		leases = append(leases, ls)
	}
	views := make([]*Locker, 0, len(l.views))
	for v := range l.views {
		views = append(views, v)
	}
	l.mu.Unlock()
	l.closeCancel(ErrClosed)
	var wg sync.WaitGroup
	for _, v := range views {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v.Close()
		}()
	}
	for _, ls := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ls.end(context.Background(), ErrClosed)
		}()
	}
	wg.Wait()
	l.cleanups.Wait()
	if l.parent != nil {
		l.parent.mu.Lock()
		delete(l.parent.views, l)
		l.parent.mu.Unlock()
		return nil // a view does not own its driver
	}
	return l.drv.Close()
}

func (l *Locker) callOptions(opts []Option) *options {
	o := new(options)
	*o = l.opts
	o.apply(opts)
	return o
}

// ValidateKey reports whether key is a valid lock name: 1 to MaxKeyBytes
// bytes of valid UTF-8 without NUL. It returns nil or ErrInvalidKey wrapped
// with the reason.
func ValidateKey(key string) error {
	return driver.CheckKey(key)
}

// ValidateHolder reports whether description is a valid WithHolder
// description: at most MaxHolderBytes bytes of valid UTF-8 without control
// characters (unicode.IsControl: C0, DEL and C1, so no tab or newline). The
// empty description is valid. It returns nil or ErrInvalidHolder (which
// matches ErrInvalidArgument) wrapped with the reason.
func ValidateHolder(description string) error {
	return driver.CheckHolder(description)
}

// ValidateTTL reports whether ttl lies in [MinTTL, MaxTTL]. It returns nil
// or ErrInvalidTTL wrapped with the reason.
func ValidateTTL(ttl time.Duration) error {
	return driver.CheckTTL(ttl)
}

func validateOptions(o *options) error {
	if o.bad != nil {
		return o.bad
	}
	if err := ValidateTTL(o.ttl); err != nil {
		return err
	}
	if err := ValidateHolder(o.holder); err != nil {
		return err
	}
	if o.maxHold < 0 {
		return fmt.Errorf("%w: max hold %v is negative", ErrInvalidArgument, o.maxHold)
	}
	if o.retrySet && o.retryFor < 0 {
		return fmt.Errorf("%w: retry budget %v is negative", ErrInvalidArgument, o.retryFor)
	}
	if o.backoffMin > o.backoffMax {
		return fmt.Errorf("%w: backoff min %v is above its max %v", ErrInvalidArgument, o.backoffMin, o.backoffMax)
	}
	if o.heartbeat < 0 {
		return fmt.Errorf("%w: heartbeat %v is negative", ErrInvalidTTL, o.heartbeat)
	}
	hb := o.effectiveHeartbeat()
	if hb < MinHeartbeat {
		return fmt.Errorf("%w: heartbeat %v is shorter than %v", ErrInvalidTTL, hb, MinHeartbeat)
	}
	if hb >= o.ttl-o.effectiveDrift() {
		return fmt.Errorf("%w: heartbeat %v is not shorter than TTL %v minus drift %v", ErrInvalidTTL, hb, o.ttl, o.effectiveDrift())
	}
	return nil
}

// newOwnerToken returns 128 random bits, hex-encoded.
func newOwnerToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error (Go ≥ 1.24)
	return hex.EncodeToString(b[:])
}

// opContext bounds one store round trip by the op timeout and the locker's
// close.
func (l *Locker) opContext(ctx context.Context, o *options) (context.Context, context.CancelFunc) {
	octx, cancel := context.WithTimeout(ctx, o.opTimeout)
	stop := context.AfterFunc(l.closeCtx, cancel)
	return octx, func() { stop(); cancel() }
}

func (l *Locker) wrap(op, key string, err error) error {
	return &opError{op: op, key: key, addr: l.addr, err: err}
}

// opError is the error of an operation on a key: its text is
// `dlock: OP "KEY" on STORE: ERR`, formatted only when asked for (most
// are matched with errors.Is and never printed: a refused try, a release).
type opError struct {
	op, key, addr string
	err           error
}

func (e *opError) Error() string {
	return fmt.Sprintf("dlock: %s %q on %s: %v", e.op, e.key, e.addr, e.err)
}

func (e *opError) Unwrap() error { return e.err }

// classify turns a driver error into this package's errors: sentinels pass
// through, the caller's context ending matches ctx.Err(), a closed locker is
// ErrClosed, and anything else is ErrUnavailable wrapping the store error.
func (l *Locker) classify(op, key string, ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotAcquired), errors.Is(err, ErrLeaseLost),
		errors.Is(err, ErrInvalidArgument),
		errors.Is(err, ErrStaleFence), errors.Is(err, ErrUnsupported):
		return l.wrap(op, key, err)
	case ctxEnded(ctx) != nil:
		cerr := ctxEnded(ctx)
		if cause := context.Cause(ctx); cause != nil && cause != cerr {
			return l.wrap(op, key, fmt.Errorf("%w (%w)", cerr, cause))
		}
		return l.wrap(op, key, cerr)
	case l.closeCtx.Err() != nil:
		return l.wrap(op, key, ErrClosed)
	case errors.Is(err, ErrUnavailable):
		return l.wrap(op, key, err)
	default:
		return l.wrap(op, key, fmt.Errorf("%w: %w", ErrUnavailable, err))
	}
}

// ctxEnded returns ctx.Err(), or context.DeadlineExceeded when ctx's
// deadline has passed but its timer has not fired yet (a store client may
// notice the deadline first and fail with an I/O timeout).
func ctxEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// errNilContext is the error of a call given a nil context.
var errNilContext = fmt.Errorf("%w: a nil context (pass context.Background() for none)", ErrInvalidArgument)

// nilDriver stands in for the nil driver given to New: every call fails
// with ErrInvalidArgument (so the Locker is usable, and says what is wrong,
// rather than panicking at its first call).
type nilDriver struct{}

var errNilDriver = fmt.Errorf("%w: dlock.New was given a nil driver", ErrInvalidArgument)

func (nilDriver) TryAcquire(context.Context, driver.AcquireRequest) (driver.Grant, error) {
	return driver.Grant{}, errNilDriver
}
func (nilDriver) Renew(context.Context, string, string, time.Duration) error { return errNilDriver }
func (nilDriver) Release(context.Context, string, string) error              { return errNilDriver }
func (nilDriver) Close() error                                               { return nil }
