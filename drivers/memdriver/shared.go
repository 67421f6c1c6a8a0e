package memdriver

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.SharedLocker = (*Driver)(nil)

// SharedView returns a view of the store whose grants are of kind: Shared
// grants, at most kind.Limit of them per key at once (a semaphore's
// permits) or any number when kind.Limit is 0 (a read-write lock's
// readers), or Exclusive grants (the writer), which are the plain locks of
// this driver: views share the key space of the plain locks, so a plain
// lock of K excludes every Shared grant of K and the other way round.
//
// Every grant has its own owner token, TTL and fence (fences come from the
// store's one counter, so they strictly increase per key in grant order
// across kinds). The view implements driver.Waiter with the key's single
// FIFO queue over every kind: a release or expiry grants the head waiters
// as long as each is admitted (several Shared waiters in one step), and a
// queued Exclusive request holds back every later Shared one (writer
// preference); TryAcquire too refuses a key with queued waiters. It
// implements driver.Inspector as the driver does (Inspect describes a key
// held by several Shared grants by its oldest grant; List shows one entry
// per grant).
//
// A Shared request whose Limit differs from that of the key's current
// Shared grants or waiters is refused with an error matching
// driver.ErrInvalidArgument. SharedView returns an error matching
// driver.ErrInvalidArgument for an invalid kind (driver.SharedKind.Check).
// The view's Close closes nothing; calls through a view of a closed driver
// return driver.ErrClosed.
func (d *Driver) SharedView(kind driver.SharedKind) (driver.Driver, error) {
	if err := kind.Check(); err != nil {
		return nil, fmt.Errorf("memdriver: shared view: %w", err)
	}
	return &view{d: d, kind: kind}, nil
}

// view is a SharedView of a Driver.
type view struct {
	d    *Driver
	kind driver.SharedKind
}

var (
	_ driver.Driver    = (*view)(nil)
	_ driver.Waiter    = (*view)(nil)
	_ driver.Inspector = (*view)(nil)
	_ driver.Resumer   = (*view)(nil)
)

func (v *view) op(name string) string {
	return fmt.Sprintf("%s %s", v.kind.Mode, name)
}

// TryAcquire grants req.Key of the view's kind when it is admitted and no
// waiter is queued, else returns driver.ErrNotAcquired.
func (v *view) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return v.d.tryAcquire(ctx, req, v.kind, v.op("acquire"))
}

// Wait queues req (FIFO over every kind) until it is granted or ctx ends.
func (v *view) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return v.d.wait(ctx, req, v.kind, v.op("wait"))
}

// Renew extends owner's grant of key to a full ttl, or returns
// driver.ErrLeaseLost.
func (v *view) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	return v.d.Renew(ctx, key, owner, ttl)
}

// Release removes owner's grant of key and grants the head waiters, or
// returns driver.ErrLeaseLost.
func (v *view) Release(ctx context.Context, key, owner string) error {
	return v.d.Release(ctx, key, owner)
}

// Resume re-attaches to a grant of the view's kind by owner and fence, as
// Driver.Resume does to plain grants; a grant of another kind is
// driver.ErrLeaseLost.
func (v *view) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	return v.d.resume(ctx, req, fence, v.kind)
}

// Inspect describes key's oldest grant, as Driver.Inspect.
func (v *view) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	return v.d.Inspect(ctx, key)
}

// List lists held keys, as Driver.List.
func (v *view) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	return v.d.List(ctx, prefix)
}

// Close closes nothing: the parent driver owns the store connection.
func (v *view) Close() error { return nil }
