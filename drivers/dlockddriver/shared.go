package dlockddriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

// grantKind is the kind of grant an acquisition asks dlockd for: the zero
// value is the Exclusive grant (a plain lock); shared asks for one of up to
// limit Shared grants (0: any number).
type grantKind struct {
	shared bool
	limit  uint32
}

var _ driver.SharedLocker = (*Driver)(nil)

// SharedView implements driver.SharedLocker with dlockd's native Shared
// grants, kept in the server's replicated state machine: a semaphore's
// permits (driver.Shared with a Limit of 1 to driver.MaxPermits) and the
// two sides of a read-write lock (driver.Shared with Limit 0 for readers,
// driver.Exclusive for the writer).
//
// The views share the key space of the Driver's plain locks: an Exclusive
// grant of key K is a plain lock of K (TryAcquire of the Driver and of an
// Exclusive view are the same request), and it excludes every Shared grant
// of K. Each grant has its own owner token, TTL and fencing token; fences of
// one key strictly increase in grant order across both kinds (and stay
// unique across the server: several grants made by one log entry get
// consecutive fences above its index).
//
// The view implements driver.Waiter: waits queue in the key's FIFO queue on
// the server, over Shared and Exclusive requests alike, and a release or
// expiry hands the key to as many waiters at the head as the grants held
// allow, in one log entry, so a waiting Exclusive request holds back every
// later Shared one (writer preference, as Curator's
// InterProcessReadWriteLock). Handed-over grants are claimed within the
// server's claim window as plain ones are (Wait). It also implements
// driver.Inspector: Inspect of a key with Shared grants describes its
// oldest live grant (the one with the lowest fence), and List returns one
// entry per live grant of such a key, by fence (the Driver's Inspect and
// List do the same).
//
// Renew and Release act by (key, owner) as the Driver's own do, and a Shared
// grant's loss (expiry, force release, an unclaimed handover) is pushed to
// Grant.Lost on the Driver's Watch stream as a plain grant's. The
// server's lock-delay (--lock-delay, or the Driver's lock_delay parameter)
// applies to Shared grants too: a Shared grant lost without a release keeps
// its permit taken, and the key closed to Exclusive grants, for its
// lock-delay. A force release of a key removes every grant it holds.
//
// Requests for one key with different Limits are refused with an error
// matching driver.ErrInvalidArgument that names the key's limit, while
// the key has Shared grants or waiters of the other limit. The view's Close
// closes nothing: the Driver owns the connection. SharedView returns an
// error matching driver.ErrInvalidArgument for an invalid kind
// (driver.SharedKind.Check). It needs a dlockd that knows Shared grants
// (this module's, from issue 15); an older server ignores the request's
// shared field and would grant the key exclusively.
func (d *Driver) SharedView(kind driver.SharedKind) (driver.Driver, error) {
	if err := kind.Check(); err != nil {
		return nil, fmt.Errorf("dlockd: shared view: %w", err)
	}
	v := &sharedView{d: d, kind: kind}
	if kind.Mode == driver.Shared {
		v.k = grantKind{shared: true, limit: uint32(kind.Limit)}
	}
	return v, nil
}

// sharedView is a Driver's view of one kind of grant (SharedView).
type sharedView struct {
	d    *Driver
	kind driver.SharedKind
	k    grantKind
}

var (
	_ driver.Waiter    = (*sharedView)(nil)
	_ driver.Inspector = (*sharedView)(nil)
	_ driver.Resumer   = (*sharedView)(nil)
)

// Resume implements driver.Resumer for grants of the view's kind, as the
// Driver's Resume does for plain locks (resume.go): a read that the key
// holds a grant of fence of the view's kind (else driver.ErrLeaseLost,
// nothing changed), a renewal to a full
// req.TTL (driver.ErrLeaseLost when the owner token no longer holds the
// key), then the holder's repeated acquisition of the view's kind, which
// answers the grant's own fence and binds the grant to this Driver's
// session for pushed loss. A fence other than fence is driver.ErrLeaseLost.
func (v *sharedView) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	if v.d.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("dlockd: resume: %w", err)
	}
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("dlockd: resume: %w: fence 0", driver.ErrInvalidArgument)
	}
	if err := v.d.resumeCheck(ctx, req.Key, fence, v.k); err != nil {
		return driver.Grant{}, err
	}
	if err := v.d.Renew(ctx, req.Key, req.Owner, req.TTL); err != nil {
		return driver.Grant{}, err
	}
	g, err := v.d.tryAcquire(ctx, req, v.k)
	switch {
	case errors.Is(err, driver.ErrNotAcquired):
		return driver.Grant{}, fmt.Errorf("%w (the grant ended while it was being resumed)", driver.ErrLeaseLost)
	case err != nil:
		return driver.Grant{}, err
	case g.Fence != fence:
		v.d.forget(req.Key, req.Owner)
		return driver.Grant{}, fmt.Errorf("%w (the owner token's grant has fence %d, not %d)", driver.ErrLeaseLost, g.Fence, fence)
	}
	return g, nil
}

// TryAcquire implements driver.Driver: one attempt at a grant of the view's
// kind; driver.ErrNotAcquired when the key is held exclusively, all its
// permits are taken, or (FIFO) requests wait for it already.
func (v *sharedView) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return v.d.tryAcquire(ctx, req, v.k)
}

// Wait implements driver.Waiter: it queues for a grant of the view's kind
// in the key's FIFO queue on the server (see SharedView).
func (v *sharedView) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return v.d.wait(ctx, req, v.k, false)
}

// WaitUnconfirmed implements driver.UnconfirmedWaiter: Wait for a grant of
// the view's kind without the claim (see Driver.WaitUnconfirmed).
func (v *sharedView) WaitUnconfirmed(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return v.d.wait(ctx, req, v.k, true)
}

// Renew implements driver.Driver (the Driver's Renew: grants are renewed
// by key and owner token whatever their kind).
func (v *sharedView) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	return v.d.Renew(ctx, key, owner, ttl)
}

// Release implements driver.Driver (the Driver's Release).
func (v *sharedView) Release(ctx context.Context, key, owner string) error {
	return v.d.Release(ctx, key, owner)
}

// Inspect implements driver.Inspector (the Driver's Inspect: of a key with
// Shared grants, its oldest live grant).
func (v *sharedView) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	return v.d.Inspect(ctx, key)
}

// List implements driver.Inspector (the Driver's List: a key with Shared
// grants has one entry per live grant, by fence).
func (v *sharedView) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	return v.d.List(ctx, prefix)
}

// Close implements driver.Driver. It closes nothing: the Driver owns the
// connections.
func (v *sharedView) Close() error { return nil }

// String names the view, for messages.
func (v *sharedView) String() string {
	if v.kind.Mode == driver.Shared {
		return fmt.Sprintf("dlockd shared view (limit %d)", v.kind.Limit)
	}
	return "dlockd exclusive view"
}
