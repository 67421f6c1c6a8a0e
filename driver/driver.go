// Package driver defines the interface that every dlock store implements.
//
// A driver performs exactly one attempt of one store operation per call and
// never retries, sleeps or renews on its own: validation, the heartbeat,
// validity deadlines, backoff, error wrapping and metrics all live in the root
// package dlock, once for every store. This split follows database/sql and
// database/sql/driver, and go-cloud's "portable types and drivers".
//
// # Required behaviour
//
//   - TryAcquire grants the key to the owner token in the request when the key
//     is free (or its previous grant has expired on the store) and returns a
//     fencing token strictly greater than every fence the store issued earlier
//     for that key. When the key is held it returns ErrNotAcquired.
//   - Renew extends the grant held by the owner token to a full TTL, measured by
//     the store. When the owner token no longer holds the key (expired, taken
//     over, released) it returns ErrLeaseLost and changes nothing.
//   - Release removes the grant only if the owner token still holds it, in one
//     atomic step on the store; otherwise it returns ErrLeaseLost and changes
//     nothing. A bare delete never happens.
//   - Any other error means the store could not be asked or did not answer; the
//     root package reports it as ErrUnavailable with the store error wrapped.
//   - Every call returns promptly once its context ends.
//
// # Optional capabilities
//
// A driver may implement, and the root package discovers by type assertion:
//
//   - Waiter: waits for a key by the store's own notification (a server-side
//     queue or a watch on the predecessor) instead of backoff polling.
//   - Inspector: reports the current holder of a key and lists held keys.
//
// A driver that can push loss (a ZooKeeper session expiry, a dropped
// PostgreSQL session, a revoked etcd lease) sets Grant.Lost.
package driver

import (
	"context"
	"errors"
	"time"
)

// The sentinel errors of dlock, defined once here so that drivers can return
// them without importing the root package. The root package re-exports each by
// identity (dlock.ErrNotAcquired == driver.ErrNotAcquired), so errors.Is works
// at every layer.
var (
	// ErrNotAcquired: the key is held by another owner.
	ErrNotAcquired = errors.New("lock held")
	// ErrLeaseLost: the owner token no longer holds the key (expired, taken
	// over, released, or the store said so).
	ErrLeaseLost = errors.New("lease lost")
	// ErrUnavailable: the store could not be reached or did not answer in
	// time. Only that: a request the store answered by refusing it as
	// invalid is ErrInvalidArgument, never ErrUnavailable.
	ErrUnavailable = errors.New("store unavailable")
	// ErrInvalidArgument: the caller's input (a key, TTL, holder, owner
	// token, option or store URL) was refused as invalid, by dlock before
	// any store was called or by the store itself. Retrying cannot help.
	// ErrInvalidKey, ErrInvalidTTL and ErrInvalidHolder match it too.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrInvalidKey: the key is empty, longer than MaxKeyBytes, not valid
	// UTF-8, or contains NUL. It matches ErrInvalidArgument.
	ErrInvalidKey error = &invalidError{"invalid key"}
	// ErrInvalidTTL: the TTL is outside [MinTTL, MaxTTL]. It matches
	// ErrInvalidArgument.
	ErrInvalidTTL error = &invalidError{"invalid TTL"}
	// ErrInvalidHolder: the holder description is longer than
	// MaxHolderBytes, not valid UTF-8, or contains a control character. It
	// matches ErrInvalidArgument.
	ErrInvalidHolder error = &invalidError{"invalid holder"}
	// ErrStaleFence: a resource refused a write because a greater fencing
	// token has already been seen.
	ErrStaleFence = errors.New("stale fencing token")
	// ErrClosed: the locker or driver has been closed.
	ErrClosed = errors.New("closed")
	// ErrReleased: the lease was released by its holder.
	ErrReleased = errors.New("lease released")
)

// invalidError is a sentinel that also matches ErrInvalidArgument.
type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalidArgument }

// Limits of the contract, shared by every store.
const (
	// MaxKeyBytes is the longest valid key, in bytes of UTF-8.
	MaxKeyBytes = 512
	// MinTTL is the shortest valid lease TTL.
	MinTTL = 100 * time.Millisecond
	// MaxTTL is the longest valid lease TTL.
	MaxTTL = 24 * time.Hour
	// MaxHolderBytes is the longest valid holder description, in bytes of
	// UTF-8.
	MaxHolderBytes = 256
)

// AcquireRequest is one acquisition attempt.
type AcquireRequest struct {
	// Key is the lock name, already validated by the root package: 1 to
	// MaxKeyBytes bytes of UTF-8 without NUL. The driver escapes it as its
	// store needs.
	Key string
	// Owner is the owner token of this grant: at least 128 random bits,
	// hex-encoded, unique per acquisition.
	Owner string
	// TTL is the lease time to live, in [MinTTL, MaxTTL]; the store owns
	// expiry.
	TTL time.Duration
	// Holder is a human-readable description of the holder (host, pid,
	// job), stored where the store can keep it for inspection. May be empty.
	Holder string
}

// Grant is what a store returns for a successful acquisition.
type Grant struct {
	// Fence is the fencing token: > 0 and strictly greater than every fence
	// issued earlier for the same key (see the driver's docs for the cases
	// where its store cannot promise this).
	Fence uint64
	// Lost, when not nil, is closed by the driver the moment the store tells
	// it that this grant is gone (session expiry, lost connection). Drivers
	// that cannot push loss leave it nil; the root package then relies on the
	// validity deadline alone.
	Lost <-chan struct{}
}

// Driver is one connection to one store. All methods are safe for concurrent
// use. Two Driver values opened on the same store behave as two processes.
type Driver interface {
	// TryAcquire makes one acquisition attempt. It returns the grant, or
	// ErrNotAcquired when the key is held, or a store error.
	TryAcquire(ctx context.Context, req AcquireRequest) (Grant, error)
	// Renew extends the grant of owner on key to a full ttl. It returns
	// ErrLeaseLost when owner no longer holds key, or a store error.
	Renew(ctx context.Context, key, owner string, ttl time.Duration) error
	// Release removes owner's grant on key, atomically and only if owner
	// still holds it. It returns ErrLeaseLost when owner did not hold key,
	// or a store error.
	Release(ctx context.Context, key, owner string) error
	// Close releases the driver's connections. It does not release grants:
	// the store expires them. Closing twice returns nil.
	Close() error
}

// Waiter is implemented by drivers whose store can queue a waiter and tell
// it when the key is granted (dlockd's queue, etcd's and ZooKeeper's watch on
// the predecessor).
type Waiter interface {
	// Wait blocks until req.Key is granted to req.Owner or ctx ends. When
	// ctx ends first, Wait removes everything it left on the store (queue
	// entry, node, or a grant that raced the cancellation) before it
	// returns an error that matches ctx.Err().
	//
	// ctx has no deadline of its own for the wait, but carries the
	// caller's op timeout (OpTimeout): a store that has not acknowledged
	// the wait (queued it or granted the key) within it does not answer,
	// and Wait returns a store error, as any other call would.
	Wait(ctx context.Context, req AcquireRequest) (Grant, error)
}

type opTimeoutKey struct{}

// WithOpTimeout returns a copy of ctx that carries the caller's op timeout:
// how long one store round trip may take before the store counts as
// unavailable. The root package sets it on the context of Waiter.Wait.
func WithOpTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, opTimeoutKey{}, d)
}

// OpTimeout returns the op timeout ctx carries (see WithOpTimeout), or 0
// when it carries none.
func OpTimeout(ctx context.Context) time.Duration {
	d, _ := ctx.Value(opTimeoutKey{}).(time.Duration)
	return d
}

// HolderInfo describes the current grant of a key.
type HolderInfo struct {
	// Key is the lock name as the caller gave it (unescaped).
	Key string
	// Fence is the fencing token of the current grant.
	Fence uint64
	// Holder is the holder description given at acquisition.
	Holder string
	// TTL is the lease's time to live.
	TTL time.Duration
	// Remaining is the store's estimate of the time left before expiry;
	// zero when the store does not know.
	Remaining time.Duration
	// Waiters is the number of queued waiters, or -1 when the store does not
	// keep a queue.
	Waiters int
}

// Inspector is implemented by drivers that can describe holders.
type Inspector interface {
	// Inspect returns the current grant of key, or ErrNotAcquired wrapped
	// when the key is free.
	Inspect(ctx context.Context, key string) (HolderInfo, error)
	// List returns the held keys that start with prefix, sorted by key.
	List(ctx context.Context, prefix string) ([]HolderInfo, error)
}

// Hinter is implemented by polling drivers that can hint that a key may have
// just been released (Redis pub/sub, PostgreSQL LISTEN/NOTIFY). A hint only
// wakes a backoff wait early; it is never taken as a grant, and a lost hint
// costs nothing but latency.
type Hinter interface {
	// Hint subscribes to release hints for key. The returned channel
	// receives a value (sent without blocking) whenever key may have been
	// released. stop ends the subscription; the caller must call it.
	Hint(ctx context.Context, key string) (hints <-chan struct{}, stop func(), err error)
}

// ForceReleaser is implemented by stores that let an operator remove a grant
// without its owner token (dlock release --force). It is an administrative
// override for a holder known to be dead; the next grant still gets a
// greater fence, so a holder that was in fact alive is fenced out.
type ForceReleaser interface {
	// ForceRelease removes key's current grant whoever holds it and returns
	// what it removed, or ErrNotAcquired wrapped when key was free. reason
	// (not blank; the root package checks) says why, for the store's own
	// log where it keeps one; a store without one may ignore it.
	ForceRelease(ctx context.Context, key, reason string) (HolderInfo, error)
}
