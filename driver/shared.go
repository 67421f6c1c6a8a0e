package driver

import (
	"context"
	"fmt"
)

// Mode is how a grant made through a SharedLocker's view holds its key.
type Mode int

const (
	// Exclusive: the only grant of the key while it lasts (the write side
	// of a read-write lock).
	Exclusive Mode = iota + 1
	// Shared: one of several grants of the key, at most SharedKind.Limit
	// at once (a semaphore's permit), or any number when Limit is 0 (the
	// read side of a read-write lock). No Shared grant is made while an
	// Exclusive grant holds the key.
	Shared
)

// String returns "exclusive" or "shared".
func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// SharedKind names one kind of grant a SharedLocker's view makes.
type SharedKind struct {
	// Mode is Exclusive or Shared.
	Mode Mode
	// Limit, for Shared only, is the most Shared grants a key has at once:
	// N for a semaphore of N permits (1 to MaxPermits), or 0 for no limit
	// (the read side of a read-write lock, where only Exclusive grants
	// exclude). It must be 0 for Exclusive.
	Limit int
}

// MaxPermits is the largest SharedKind.Limit.
const MaxPermits = 10000

// Check returns nil when k is a valid kind, else an error matching
// ErrInvalidArgument that says why.
func (k SharedKind) Check() error {
	switch {
	case k.Mode != Exclusive && k.Mode != Shared:
		return fmt.Errorf("%w: shared grant mode %v, want exclusive or shared", ErrInvalidArgument, k.Mode)
	case k.Mode == Exclusive && k.Limit != 0:
		return fmt.Errorf("%w: an exclusive grant has no permit limit (got %d)", ErrInvalidArgument, k.Limit)
	case k.Limit < 0 || k.Limit > MaxPermits:
		return fmt.Errorf("%w: permit limit %d outside 0..%d", ErrInvalidArgument, k.Limit, MaxPermits)
	}
	return nil
}

// SharedLocker is implemented by drivers whose store keeps several grants
// of one key natively: a semaphore's permits (Shared with a Limit) and a
// read-write lock (Shared with Limit 0 for readers, Exclusive for the
// writer). The recipes in dlock/recipe use it where it exists and fall back
// to portable constructions (or report ErrUnsupported) where it does not.
type SharedLocker interface {
	// SharedView returns a Driver whose TryAcquire, Renew and Release
	// (and Wait, when the view also implements Waiter: FIFO over Shared
	// and Exclusive requests alike, so a waiting Exclusive request holds
	// back later Shared ones: writer preference) act on grants of kind.
	// Every grant, Shared ones included, has its own owner token, TTL and
	// fence; fences of one key strictly increase in grant order across
	// kinds. TryAcquire returns ErrNotAcquired when the grant would exceed
	// the limit or meet an Exclusive grant (or, for Exclusive, any grant).
	// Requests on one key with different Limits are refused with
	// ErrInvalidArgument while the key has grants of the other limit.
	//
	// The driver's documentation says whether its views share the key
	// space of its plain locks (on dlockd an Exclusive grant of key K is a
	// plain lock of K). The view's Close closes nothing: the parent driver
	// owns the connections.
	//
	// SharedView returns an error matching errors.ErrUnsupported when the
	// store cannot keep grants of that kind (a store with read-write locks
	// but no counted semaphores, say), naming the store, and one matching
	// ErrInvalidArgument for an invalid kind (SharedKind.Check).
	SharedView(kind SharedKind) (Driver, error)
}

// Resumer is implemented by drivers whose grants outlive the connection
// (and process) that made them, so that a restarted process can re-attach
// to a lease it still holds (dlock's Locker.Resume).
type Resumer interface {
	// Resume confirms on the store that req.Owner still holds req.Key by
	// the grant whose fencing token is fence, renews it to a full req.TTL,
	// and returns that grant (Fence equal to fence; Lost and Recheck set
	// as TryAcquire sets them). It returns ErrLeaseLost when the owner no
	// longer holds the key (expired, released, taken over) or holds it by
	// another fence, and changes nothing then.
	Resume(ctx context.Context, req AcquireRequest, fence uint64) (Grant, error)
}
