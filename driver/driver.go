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
//   - KeyWatcher: notifies a reader that holds nothing when a key's grant
//     may have changed (dlockd's key watch, etcd and ZooKeeper watches;
//     watch.go).
//   - Resumer: confirms and renews a grant that another process made, by
//     owner token and fence, so that a restarted process keeps its lease
//     (shared.go). Every store but ZooKeeper and pgadvisory, whose grants
//     end with the session that made them.
//
// A driver that can push loss sets Grant.Lost; one that can only hint that
// a grant may be gone sets Grant.Recheck, which the root package answers by
// renewing at once. Per store:
//
//   - dlockd: Lost, from the driver's Watch stream (expiry, force release,
//     a handover not claimed).
//   - etcd: Lost, from a watch on the grant's entry (lease expired or
//     revoked, entry deleted).
//   - ZooKeeper: Lost, when the session expires or the connection drops.
//   - PostgreSQL advisory locks (pgadvisory): Lost, when the lease's
//     session ends.
//   - Redis (redis://, with release hints on, as by URL): Recheck, from a
//     pub/sub message on the key's channel that a release or force
//     release publishes; expiry publishes nothing.
//   - PostgreSQL lease table (pgdriver), Redlock, mem: neither; loss is
//     found by the next renewal or the validity deadline.
//
// # Invalid input
//
// The root package validates keys, TTLs and holders before any driver is
// called, but a driver is also called directly (tests, tools). Every
// driver refuses input outside the contract itself (CheckRequest, CheckKey,
// CheckOwner, CheckTTL), and maps every answer in which its store refused a
// request as invalid to an error matching ErrInvalidArgument (or
// ErrInvalidKey, ErrInvalidTTL, ErrInvalidHolder), never to a plain error
// (which the root package reports as ErrUnavailable). An OpenFunc given an
// invalid URL (unknown parameter, bad port, bad database number) returns an
// error matching ErrInvalidArgument too.
package driver

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"
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
	// ErrPermissionDenied: the store refused the call for its credentials:
	// the caller's identity lacks the permission on the key, or the store
	// does not know the caller (no token, an unknown or revoked one). It
	// matches ErrInvalidArgument (the request was refused and retrying
	// cannot help; never ErrUnavailable, so WithFailOpen never runs work
	// because of it): test ErrPermissionDenied first to tell it apart.
	ErrPermissionDenied error = &invalidError{"permission denied"}
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
	// MaxOwnerBytes is the longest valid owner token, in bytes.
	MaxOwnerBytes = 128
)

// CheckKey returns nil when key is a valid lock name (1 to MaxKeyBytes bytes
// of UTF-8 without NUL), else an error matching ErrInvalidKey that says why.
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidKey, len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return fmt.Errorf("%w: contains NUL at byte %d", ErrInvalidKey, i)
		}
	}
	return nil
}

// CheckTTL returns nil when ttl lies in [MinTTL, MaxTTL], else an error
// matching ErrInvalidTTL that says why.
func CheckTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return fmt.Errorf("%w: %v is outside [%v, %v]", ErrInvalidTTL, ttl, MinTTL, MaxTTL)
	}
	return nil
}

// CheckHolder returns nil when holder is a valid holder description (at
// most MaxHolderBytes bytes of UTF-8 without control characters; empty is
// valid), else an error matching ErrInvalidHolder that says why.
func CheckHolder(holder string) error {
	if len(holder) > MaxHolderBytes {
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidHolder, len(holder), MaxHolderBytes)
	}
	if !utf8.ValidString(holder) {
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidHolder)
	}
	for i, r := range holder {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character %U at byte %d", ErrInvalidHolder, r, i)
		}
	}
	return nil
}

// CheckOwner returns nil when owner is a valid owner token: 1 to
// MaxOwnerBytes bytes of ASCII letters, digits, '-', '_', '.' and ':' (the
// root package sends 32 hex digits; stores put the token in key paths and
// node names, where '/' or a space would not survive), else an error
// matching ErrInvalidArgument that says why.
func CheckOwner(owner string) error {
	if owner == "" || len(owner) > MaxOwnerBytes {
		return fmt.Errorf("%w: owner token of %d bytes, want 1 to %d", ErrInvalidArgument, len(owner), MaxOwnerBytes)
	}
	for i := 0; i < len(owner); i++ {
		c := owner[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return fmt.Errorf("%w: owner token byte %d is %q, want letters, digits, '-', '_', '.' or ':'", ErrInvalidArgument, i, c)
		}
	}
	return nil
}

// CheckRequest returns nil when every field of req is valid (CheckKey,
// CheckOwner, CheckTTL, CheckHolder), else the first field's error, which
// matches ErrInvalidArgument.
func CheckRequest(req AcquireRequest) error {
	if err := CheckKey(req.Key); err != nil {
		return err
	}
	if err := CheckOwner(req.Owner); err != nil {
		return err
	}
	if err := CheckTTL(req.TTL); err != nil {
		return err
	}
	return CheckHolder(req.Holder)
}

// CheckGrant returns nil when key, owner and ttl are valid for Renew
// (CheckKey, CheckOwner, CheckTTL), else the first one's error, which
// matches ErrInvalidArgument.
func CheckGrant(key, owner string, ttl time.Duration) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if err := CheckOwner(owner); err != nil {
		return err
	}
	return CheckTTL(ttl)
}

// CheckOwned returns nil when key and owner are valid for Release
// (CheckKey, CheckOwner), else the first one's error, which matches
// ErrInvalidArgument.
func CheckOwned(key, owner string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	return CheckOwner(owner)
}

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
	// ConfirmWithin, when > 0, says that the store handed the key over to
	// this waiter without the waiter's confirmation yet (dlockd's claim
	// window): until a Renew of the grant succeeds, the grant is valid only
	// to the request's sending plus ConfirmWithin (less the drift), and the
	// store passes the key to its next waiter when no Renew reaches it
	// within ConfirmWithin of the handover. Only
	// UnconfirmedWaiter.WaitUnconfirmed returns it; it is 0 for every other
	// grant.
	ConfirmWithin time.Duration
	// ValidFor, when > 0, says that the store keeps the grant less than
	// the TTL from the request unless it is renewed: until a Renew
	// succeeds, the grant is valid only to the request's sending plus
	// ValidFor (less the drift), and the caller must renew it before that
	// (the root package renews a third of the way into ValidFor). An
	// etcd entry put on a shared lease whose last confirmed keepalive was
	// sent before the request lives that lease's TTL from the keepalive,
	// not from the request. Unlike ConfirmWithin, the store does not wait
	// for a renewal to keep the grant. TryAcquire, Wait and
	// WaitUnconfirmed may return it; it is 0 when the grant lasts its TTL
	// from the request.
	ValidFor time.Duration
	// Recheck, when not nil, receives a value (sent without blocking) when
	// the store hints that this grant may be gone (a Redis pub/sub message
	// published by a release or force release of the key). A hint is never
	// a loss by itself: it may be forged, stale or meant for another grant.
	// The root package answers it by renewing at once; only a refused
	// renewal (ErrLeaseLost) ends the lease. Drivers stop sending when the
	// grant is released, found lost, or has gone a TTL without renewal.
	Recheck <-chan struct{}
}

// Window returns how long from its request g is valid until its first
// renewal succeeds, when the store keeps it less than the TTL: the shorter
// of ConfirmWithin and ValidFor of those set, 0 when neither is (the grant
// is valid for the TTL from the request, less the drift).
func (g Grant) Window() time.Duration {
	switch {
	case g.ConfirmWithin > 0 && g.ValidFor > 0:
		return min(g.ConfirmWithin, g.ValidFor)
	case g.ConfirmWithin > 0:
		return g.ConfirmWithin
	default:
		return g.ValidFor
	}
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

// UnconfirmedWaiter is implemented by Waiters whose store hands a released
// key to its head waiter and then asks the new holder to confirm the grant
// within a window, or passes the key on (dlockd's claim window, which
// frees a key handed to a waiter that vanished without closing its
// connection). Wait confirms such a grant before it returns, one more
// round trip on a contended key's handoff; WaitUnconfirmed leaves that to
// the caller. The root package calls it instead of Wait when the driver
// implements it, so a wrapper that forwards only Wait keeps the root on
// Wait, which is always safe.
type UnconfirmedWaiter interface {
	Waiter
	// WaitUnconfirmed is Wait, except that a grant the store asks the
	// holder to confirm is returned before the confirmation, with
	// Grant.ConfirmWithin set to the store's window. The caller must then
	// Renew the grant within that window, and until a Renew succeeds the
	// grant is valid only to the moment the caller called WaitUnconfirmed
	// plus ConfirmWithin, less the drift: the store's window starts at the
	// handover, which is later. A grant that needs no confirmation has
	// ConfirmWithin 0, as from Wait.
	WaitUnconfirmed(ctx context.Context, req AcquireRequest) (Grant, error)
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
	// LockDelay is set only for a key that is free (Inspect returns it with
	// ErrNotAcquired): the key is held by nobody but refuses grants for this
	// long, counted from the read, because its holder was lost without a
	// release (an expiry or a force release: dlockd's lock-delay, as
	// Chubby's). It is 0 when the key is in no lock-delay, for a held key,
	// and on stores that have no lock-delay.
	LockDelay time.Duration
}

// Inspector is implemented by drivers that can describe holders.
type Inspector interface {
	// Inspect returns the current grant of key, or ErrNotAcquired wrapped
	// when the key is free. With ErrNotAcquired the HolderInfo may still
	// describe the free key: Key, Waiters (waiters queued on a free key,
	// where the store keeps a queue) and LockDelay.
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
