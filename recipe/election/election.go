// Package election is leader election over a dlock lease: one leader per
// election name at a time, each with a term that fences its work.
//
//	lead, err := election.Campaign(ctx, locker, "billing-scheduler", "host-3 pid 4121")
//	if err != nil { ... }
//	defer lead.Resign(context.Background())
//	err = runAsLeader(lead.Context(), lead.Term()) // stops when leadership is lost
//
// The shape follows etcd's concurrency recipes (Election.Campaign, Resign,
// Leader, Observe) and Kubernetes' leader election, built on the portable
// root API, so it works on every store dlock has.
//
// # Terms
//
// An election named N is the lock on key N: Campaign waits for the lease
// (by the store's own queue where it has one, else by jittered polling) and
// the leader is its holder. The term is the lease's fencing token, so every
// new leader's term is strictly greater than every earlier one's (with the
// exceptions each driver documents for its fences: Redis without
// persistence, Redlock). Pass the term to the resources the leader writes,
// and let them refuse a smaller one (package dlock/fence): that, not the
// election, is what makes a deposed leader harmless.
//
// # Losing leadership
//
// Leadership is a dlock.Lease and ends the way a lease does: Done closes and
// Context is cancelled with cause dlock.ErrLeaseLost when a renewal is
// refused, when the store pushes the loss, or when the lease's validity
// deadline passes without a confirmed renewal. Every renewal is bounded by
// the time left before that deadline (and by the op timeout), and a timer
// fires at the deadline whatever a renewal in flight is doing, so a leader
// whose store stops answering learns of its loss no later than its deadline:
// sent + TTL − drift, which on a store that counts the TTL from receipt
// comes before the store can grant the key to anyone else. (The Kubernetes
// bug where a leader kept acting for a minute because one renewal had no
// timeout cannot happen here.) A leader must stop acting on its own, as
// soon as its Context ends.
//
// # Value
//
// The leader's value (at most MaxValueBytes bytes of UTF-8 without control
// characters, as dlock.WithHolder) is stored as the grant's holder
// description, so `dlock inspect NAME` shows it too. Leader and Observe read
// it with the store's inspection (driver.Inspector) and return an error
// matching dlock.ErrUnsupported on stores without one (Redlock).
//
// # Observing
//
// Observe delivers the leader after each change. It is pushed where the
// driver is a driver.KeyWatcher (dlockd's key watch, etcd watch, ZooKeeper
// watch) and polled with jittered intervals elsewhere, woken early by
// release hints where the driver is a driver.Hinter (Redis). Per store:
// dlockd, etcd and zk push; mem, redis (with hints), postgres, pgadvisory,
// dynamodb, gs, azblob and consul poll; redlock cannot inspect
// (ErrUnsupported).
package election

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// MaxValueBytes is the longest leader value, in bytes of UTF-8: the
// holder description's limit (dlock.MaxHolderBytes, 256).
const MaxValueBytes = dlock.MaxHolderBytes

// ErrNoLeader is returned by Leader when the election has no leader: its
// key is not held. The error also matches dlock.ErrNotAcquired.
var ErrNoLeader = errors.New("election: no leader")

// LeaderInfo is the leader of an election as the store describes it.
type LeaderInfo struct {
	// Value is the value the leader campaigned with.
	Value string
	// Term is the leader's term: the fencing token of its grant, > 0.
	// The zero LeaderInfo (Term 0), sent by Observe, means no leader.
	Term uint64
}

// Leadership is a won election: the lease that makes its holder the
// leader. All methods are safe for concurrent use.
type Leadership struct {
	name  string
	value string
	lease *dlock.Lease
}

// Campaign waits until the caller is the leader of the election name, or
// ctx ends, and returns its Leadership. name is the election's lock key
// (dlock.ValidateKey: 1 to 512 bytes); value (at most MaxValueBytes bytes,
// as dlock.WithHolder) describes the leader to observers and is stored as
// the grant's holder description; it overrides any WithHolder in opts.
// opts are the lease's options (WithTTL: how long the store keeps a leader
// that stopped renewing, which bounds how long an election stays leaderless
// after a leader crashed; WithHeartbeat, WithOpTimeout...).
//
// Errors: dlock.ErrInvalidKey for a bad name, dlock.ErrInvalidHolder for a
// bad value, and the other errors of dlock.Locker.Acquire (ErrUnavailable,
// ErrClosed, ctx.Err()). WithFailOpen has no place in an election: a store
// that is unavailable yields ErrUnavailable, never a degraded leader
// without a term. A store that issues no fencing tokens cannot give terms:
// Campaign then releases the lease and returns an error matching
// dlock.ErrUnsupported naming the store. When an error is returned the
// caller holds nothing.
func Campaign(ctx context.Context, l *dlock.Locker, name, value string, opts ...dlock.Option) (*Leadership, error) {
	if l == nil {
		return nil, fmt.Errorf("election: campaign %q: %w: nil Locker", name, dlock.ErrInvalidArgument)
	}
	if err := dlock.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("election: campaign %q: name: %w", name, err)
	}
	if err := dlock.ValidateHolder(value); err != nil {
		return nil, fmt.Errorf("election: campaign %q: value: %w", name, err)
	}
	lease, err := l.Acquire(ctx, name, append(opts[:len(opts):len(opts)], dlock.WithHolder(value))...)
	if err != nil {
		return nil, fmt.Errorf("election: campaign %q: %w", name, err)
	}
	if lease.Degraded() {
		_ = lease.Release(ctx)
		return nil, fmt.Errorf("election: campaign %q: %w: the store is unavailable, and a degraded lease (WithFailOpen) has no term", name, dlock.ErrUnavailable)
	}
	if lease.Fence() == 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlock.DefaultOpTimeout)
		_ = lease.Release(rctx)
		cancel()
		return nil, fmt.Errorf("election: campaign %q: %w: the store issues no fencing tokens, so a leader would have no term", name, dlock.ErrUnsupported)
	}
	return &Leadership{name: name, value: value, lease: lease}, nil
}

// Name returns the election's name (its lock key).
func (ld *Leadership) Name() string { return ld.name }

// Value returns the value the leader campaigned with.
func (ld *Leadership) Value() string { return ld.value }

// Term returns the leadership's term: the fencing token of its lease, > 0
// and strictly greater than the term of every earlier leader of the
// election. Pass it to the resources the leader writes.
func (ld *Leadership) Term() uint64 { return ld.lease.Fence() }

// Done returns a channel that is closed when the leadership ends: lost,
// resigned, or its Locker closed. Err says which.
func (ld *Leadership) Done() <-chan struct{} { return ld.lease.Done() }

// Context returns a context cancelled when the leadership ends, with the
// cause Err returns. Run the leader's work under it.
func (ld *Leadership) Context() context.Context { return ld.lease.Context() }

// Err returns nil while the caller leads; after Done is closed, an error
// matching dlock.ErrLeaseLost (leadership lost: a renewal refused, the
// store's push, or the validity deadline passed), dlock.ErrReleased
// (resigned) or dlock.ErrClosed (the Locker was closed).
func (ld *Leadership) Err() error { return ld.lease.Err() }

// Lease returns the lease behind the leadership, for its Deadline, TTL and
// Owner.
func (ld *Leadership) Lease() *dlock.Lease { return ld.lease }

// Resign gives up the leadership: it stops the heartbeat, ends Context
// (cause dlock.ErrReleased) and releases the lease on the store, so that the
// next campaigner wins at once instead of after the TTL. It returns nil on
// success, an error matching dlock.ErrLeaseLost (nothing changed on the
// store) when leadership had already been lost, and dlock.ErrUnavailable
// when the store could not be asked (the lease then expires by its TTL).
// Calling it again returns the first call's result.
func (ld *Leadership) Resign(ctx context.Context) error {
	if err := ld.lease.Release(ctx); err != nil {
		return fmt.Errorf("election: resign %q: %w", ld.name, err)
	}
	return nil
}

// Leader returns the current leader of the election name: its value and
// term, read from the store (dlock.Locker.Inspect). Errors: an error
// matching ErrNoLeader (and dlock.ErrNotAcquired) when nobody leads;
// dlock.ErrUnsupported, naming the store, when the store cannot inspect
// (Redlock); dlock.ErrInvalidKey; dlock.ErrUnavailable; ctx.Err().
func Leader(ctx context.Context, l *dlock.Locker, name string) (LeaderInfo, error) {
	if l == nil {
		return LeaderInfo{}, fmt.Errorf("election: leader %q: %w: nil Locker", name, dlock.ErrInvalidArgument)
	}
	if err := dlock.ValidateKey(name); err != nil {
		return LeaderInfo{}, fmt.Errorf("election: leader %q: name: %w", name, err)
	}
	return leader(ctx, l, "leader", name)
}

// leader is Leader, its errors prefixed "election: op name:".
func leader(ctx context.Context, l *dlock.Locker, op, name string) (LeaderInfo, error) {
	if _, ok := l.Driver().(driver.Inspector); !ok {
		return LeaderInfo{}, fmt.Errorf("election: %s %q: %w: the store (%T) cannot inspect a key's holder", op, name, dlock.ErrUnsupported, l.Driver())
	}
	info, err := l.Inspect(ctx, name)
	switch {
	case errors.Is(err, dlock.ErrNotAcquired):
		return LeaderInfo{}, fmt.Errorf("election: %s %q: %w (%w)", op, name, ErrNoLeader, err)
	case err != nil:
		return LeaderInfo{}, fmt.Errorf("election: %s %q: %w", op, name, err)
	}
	return LeaderInfo{Value: info.Holder, Term: info.Fence}, nil
}
