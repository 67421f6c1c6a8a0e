package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

type leaseState int

const (
	stateHeld leaseState = iota
	stateLost
	stateReleased
	stateClosed
	// stateMaxHold: ended by WithMaxHold; the grant is still on the store
	// (it expires by its TTL), so Release and Close still release it.
	stateMaxHold
)

// Lease is one grant of one key. It renews itself in the background until it
// is released or lost. All methods are safe for concurrent use.
type Lease struct {
	locker   *Locker
	key      string
	owner    string
	fence    uint64
	degraded bool
	// unconfirmed: handed over by the store without confirmation
	// (Grant.ConfirmWithin); the heartbeat's first renewal is sent at once.
	unconfirmed bool
	// firstBeat is the time from start to the first renewal when the
	// store keeps the grant less than the TTL (Grant.ValidFor): a third
	// of that, when sooner than the heartbeat interval; 0: the interval.
	firstBeat time.Duration
	opts      *options // the call's own (callOptions), shared with nothing that changes it
	start     time.Time

	// ctx is the lease's context: cancelled, with the reason as its cause,
	// the moment the lease ends (its Done is the lease's Done).
	ctx    context.Context
	cancel context.CancelCauseFunc

	hbStart *time.Timer // starts the heartbeat goroutine; nil: degraded
	// The heartbeat's state, set under mu when hbStart's function starts
	// the heartbeat of a lease still held; nil before (and for ever for a
	// lease that ends first, as most leases of a busy lock do, or a
	// degraded one). hbCtx is cancelled to stop the heartbeat (and any
	// renewal in flight); hbDone is closed when its goroutine ends.
	hbCtx    context.Context
	hbCancel context.CancelFunc
	hbDone   chan struct{}

	ended chan struct{} // closed when Release or Close has finished with the store

	mu        sync.Mutex
	state     leaseState
	err       error
	relErr    error       // the store release's result, reported to every Release
	deadline  time.Time   // monotonic validity deadline
	lossTimer *time.Timer // fires at deadline; nil until the heartbeat starts

	maxHoldAt time.Time   // start + WithMaxHold; zero: no bound
	holdTimer *time.Timer // fires at maxHoldAt
}

func (l *Locker) newLease(req driver.AcquireRequest, g driver.Grant, sent time.Time, o *options) (*Lease, error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ls := &Lease{
		locker: l, key: req.Key, owner: req.Owner, fence: g.Fence, opts: o,
		start: sent, ctx: ctx, cancel: cancel, ended: make(chan struct{}),
		deadline: sent.Add(o.ttl - o.effectiveDrift()),
	}
	if g.ConfirmWithin > 0 {
		// Handed over unconfirmed (Grant.ConfirmWithin): valid to the
		// store's confirmation deadline until the first renewal, which
		// the heartbeat sends as soon as it starts.
		ls.deadline = sent.Add(min(o.ttl, g.ConfirmWithin) - o.effectiveDrift())
		ls.unconfirmed = true
	}
	if g.ValidFor > 0 && g.ValidFor < o.ttl {
		// Kept by the store to the request plus ValidFor unless renewed
		// (an etcd entry on a shared lease kept alive before the
		// request): valid to that until the first renewal, which the
		// heartbeat sends a third of the way into it, so that the renewal
		// has two thirds of it to get through, as a renewal at the
		// default interval has two thirds of the TTL.
		if d := sent.Add(g.ValidFor - o.effectiveDrift()); d.Before(ls.deadline) {
			ls.deadline = d
		}
		if third := g.ValidFor / 3; third < o.effectiveHeartbeat() {
			ls.firstBeat = third
		}
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		cancel(ErrClosed)
		l.cleanup(req, o)
		return nil, l.wrap("acquire", req.Key, ErrClosed)
	}
	l.leases[ls] = struct{}{}
	ls.mu.Lock()
	if o.maxHold > 0 {
		ls.maxHoldAt = sent.Add(o.maxHold)
		ls.holdTimer = time.AfterFunc(time.Until(ls.maxHoldAt), ls.onMaxHold)
	}
	// The heartbeat goroutine and the loss timer start heartbeatStart
	// after the grant (never later than the validity deadline; the first
	// renewal is due much later, except a handover's confirmation, which
	// the heartbeat sends as soon as it starts): a lease released sooner,
	// as most leases of a busy lock are, starts neither.
	start := min(heartbeatStart, o.effectiveHeartbeat(), time.Until(ls.deadline))
	ls.hbStart = time.AfterFunc(start, func() {
		ls.mu.Lock()
		if ls.state != stateHeld {
			// Ended before its heartbeat started: the end has already
			// stopped a heartbeat it saw none of (stopHeartbeat).
			ls.mu.Unlock()
			return
		}
		ls.lossTimer = time.AfterFunc(time.Until(ls.deadline), ls.onDeadline)
		ls.hbCtx, ls.hbCancel = context.WithCancel(context.Background())
		ls.hbDone = make(chan struct{})
		ls.mu.Unlock()
		ls.heartbeat(g.Lost, g.Recheck)
	})
	ls.mu.Unlock()
	l.mu.Unlock()
	return ls, nil
}

// heartbeatStart is how long after a grant its heartbeat goroutine starts.
// Until then a pushed loss (Grant.Lost) or a recheck hint waits for it, so
// this bounds the delay it adds to either, only in a lease's first moments.
const heartbeatStart = 5 * time.Millisecond

// stopHeartbeat stops the heartbeat (and any renewal in flight), or keeps
// it from starting; call it without ls.mu, after the lease left stateHeld
// (so that hbStart's function, if it runs now, starts nothing).
// waitHeartbeat then waits for a heartbeat that had started to end.
func (ls *Lease) stopHeartbeat() {
	if ls.hbStart != nil {
		ls.hbStart.Stop()
	}
	ls.mu.Lock()
	stop := ls.hbCancel
	ls.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// waitHeartbeat returns once the heartbeat goroutine has ended, at once
// when it never started; call it after stopHeartbeat, without ls.mu.
func (ls *Lease) waitHeartbeat() {
	ls.mu.Lock()
	done := ls.hbDone
	ls.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (l *Locker) degradedLease(req driver.AcquireRequest, o *options) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	ls := &Lease{
		locker: l, key: req.Key, owner: req.Owner, degraded: true, opts: o,
		start: time.Now(), ctx: ctx, cancel: cancel, ended: make(chan struct{}),
	}
	if o.maxHold > 0 { // the work is bounded even without a store
		ls.mu.Lock()
		ls.maxHoldAt = ls.start.Add(o.maxHold)
		ls.holdTimer = time.AfterFunc(o.maxHold, ls.onMaxHold)
		ls.mu.Unlock()
	}
	return ls
}

// Key returns the lock name.
func (ls *Lease) Key() string { return ls.key }

// Fence returns the fencing token of the grant: > 0 and strictly greater than
// every fence the store issued earlier for this key (see the driver's docs
// for when its store cannot promise that). It is 0 for a degraded lease.
func (ls *Lease) Fence() uint64 { return ls.fence }

// Owner returns the owner token: 128 random bits, hex-encoded, unique to
// this grant.
func (ls *Lease) Owner() string { return ls.owner }

// Degraded reports whether the lease was granted without the store, by
// WithFailOpen; a degraded lease has no fence and protects nothing.
func (ls *Lease) Degraded() bool { return ls.degraded }

// TTL returns the lease's time to live.
func (ls *Lease) TTL() time.Duration {
	if ls.opts == nil { // a zero Lease, not made by a Locker
		return 0
	}
	return ls.opts.ttl
}

// Deadline returns the conservative local validity deadline: the moment the
// last confirmed acquisition or renewal request was sent, plus TTL minus
// drift, on this process's monotonic clock. A grant handed over by a store
// that asks the new holder to confirm it (dlockd's claim window) is valid,
// until its first renewal, only to the wait request's sending plus that
// window, when the window is shorter than the TTL; the lease renews it
// within milliseconds. A grant the store keeps less than the TTL from the
// request (driver.Grant.ValidFor: an etcd entry on a shared lease kept
// alive shortly before) is valid, until its first renewal, to the
// request's sending plus that time, at least three fifths of the TTL; the
// lease renews it a third of the way in. Work that must finish under the
// lease should finish before it. It is the zero time for a degraded lease.
func (ls *Lease) Deadline() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.deadline
}

// Done returns a channel that is closed when the lease ends: lost, released,
// or its Locker closed. Err says which.
//
// It is the lease context's Done. A zero Lease (not made by a Locker) has
// none: nil, a channel that never closes.
func (ls *Lease) Done() <-chan struct{} {
	if ls.ctx == nil {
		return nil
	}
	return ls.ctx.Done()
}

// Err returns nil while the lease is held; after Done is closed it returns an
// error matching ErrLeaseLost (lost), ErrReleased (released), ErrClosed
// (Locker closed) or ErrMaxHoldReached (WithMaxHold). A Release or Close
// that finds the grant already gone from the store (expired, taken over)
// turns it into ErrLeaseLost once the store has answered.
func (ls *Lease) Err() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.err
}

// Context returns a context that is cancelled when the lease ends, with
// context.Cause returning the error Err returned at that moment
// (ErrLeaseLost on loss, ErrReleased, ErrClosed, ErrMaxHoldReached). Run the
// protected work under it. A Release cancels it before it asks the store,
// so that the work stops first: when the store then says the grant was
// already gone, Release and Err report ErrLeaseLost while the cause stays
// ErrReleased (or ErrClosed).
func (ls *Lease) Context() context.Context { return ls.ctx }

// Release stops the heartbeat, then removes the grant from the store,
// atomically and only if this lease still holds it. The store release is
// attempted even when ctx has already ended, bounded by the op timeout. It
// returns nil on success; an error matching ErrLeaseLost, with nothing
// changed on the store, when the lease was already lost (or expired on the
// store); ErrUnavailable when the store could not be asked (the grant then
// expires by its TTL); ErrClosed when the Locker was closed. Calling it
// again, or concurrently, waits for the first call and returns its result.
//
// A nil ctx counts as context.Background(). Release of a nil *Lease, or of
// one not made by a Locker (a zero Lease), returns ErrInvalidArgument.
func (ls *Lease) Release(ctx context.Context) error {
	if ls == nil || ls.locker == nil {
		return fmt.Errorf("dlock: release: %w: not a lease made by a Locker (nil or zero Lease)", ErrInvalidArgument)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	return ls.end(ctx, ErrReleased)
}

// end moves a held lease to released (reason ErrReleased) or closed
// (ErrClosed), stopping the heartbeat before touching the store.
func (ls *Lease) end(ctx context.Context, reason error) error {
	l := ls.locker
	ls.mu.Lock()
	switch ls.state {
	case stateLost:
		err := ls.err
		ls.mu.Unlock()
		// lose cancels the context right after it sets the state: wait
		// for it, so that Release never returns while Done is still open.
		<-ls.ctx.Done()
		return err
	case stateMaxHold:
		return ls.endMaxHeld(ctx, reason) // unlocks ls.mu
	case stateReleased, stateClosed:
		// A release is under way or done: wait for it and report its
		// result, so that every caller learns whether the store let go.
		ended := ls.ended
		ls.mu.Unlock()
		<-ended
		if reason == ErrClosed {
			return nil
		}
		ls.mu.Lock()
		defer ls.mu.Unlock()
		if ls.state == stateClosed && ls.relErr == nil {
			return l.wrap("release", ls.key, ErrClosed)
		}
		return ls.relErr
	}
	if reason == ErrClosed {
		ls.state = stateClosed
	} else {
		ls.state = stateReleased
	}
	ls.err = l.wrap("release", ls.key, reason)
	if ls.lossTimer != nil {
		ls.lossTimer.Stop()
	}
	if ls.holdTimer != nil {
		ls.holdTimer.Stop()
	}
	ls.mu.Unlock()
	defer close(ls.ended)

	ls.stopHeartbeat()
	ls.waitHeartbeat()
	ls.cancel(ls.err)

	var err error
	if !ls.degraded {
		// The store release runs even when ctx has already ended (bounded by
		// the op timeout): a caller that gives up must not leave the grant
		// held until its TTL.
		// Classified against the caller's ctx: the op timeout running out
		// is the store not answering (ErrUnavailable), not the caller
		// giving up.
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ls.opts.opTimeout)
		err = l.classify("release", ls.key, ctx, l.drv.Release(octx, ls.key, ls.owner))
		cancel()
	}
	l.observer(ls.opts).LeaseEnded(EndEvent{Store: l.store, KeyClass: ls.opts.keyClass, Held: time.Since(ls.start), TTL: ls.opts.ttl})
	ls.mu.Lock()
	ls.relErr = err
	if errors.Is(err, ErrLeaseLost) {
		ls.err = err
	}
	ls.mu.Unlock()
	// Forgotten only now: a Close of the Locker meanwhile finds the lease
	// still among its own, waits for this release (ls.ended) and closes
	// the driver after it, not under it.
	l.forget(ls)
	if reason == ErrClosed {
		return nil
	}
	return err
}

// onDeadline runs when the validity deadline passes without a confirmed
// renewal.
func (ls *Lease) onDeadline() {
	ls.mu.Lock()
	if ls.state != stateHeld {
		ls.mu.Unlock()
		return
	}
	if left := time.Until(ls.deadline); left > 0 {
		ls.lossTimer.Reset(left) // a renewal moved the deadline
		ls.mu.Unlock()
		return
	}
	ls.mu.Unlock()
	ls.lose(LostExpired, fmt.Errorf("validity deadline passed without a confirmed renewal"))
}

// lose declares the lease lost, once.
func (ls *Lease) lose(reason string, cause error) {
	l := ls.locker
	ls.mu.Lock()
	if ls.state != stateHeld {
		ls.mu.Unlock()
		return
	}
	ls.state = stateLost
	ls.err = l.wrap("lease", ls.key, fmt.Errorf("%w (%s): %w", ErrLeaseLost, reason, cause))
	if ls.lossTimer != nil {
		ls.lossTimer.Stop()
	}
	if ls.holdTimer != nil {
		ls.holdTimer.Stop()
	}
	err := ls.err
	ls.mu.Unlock()

	ls.cancel(err)
	ls.stopHeartbeat()
	l.forget(ls)
	l.observer(ls.opts).LeaseEnded(EndEvent{
		Store: l.store, KeyClass: ls.opts.keyClass, Held: time.Since(ls.start), TTL: ls.opts.ttl,
		Lost: true, LostReason: reason,
	})
}

// recheckGap is the shortest time from the start of one renewal to a
// renewal asked for by a recheck hint, so that a flood of (possibly forged)
// hints costs the store at most one renewal per gap.
const recheckGap = 20 * time.Millisecond

// heartbeat renews the lease every heartbeat interval while it is held (the
// first renewal of a grant handed over unconfirmed, its confirmation, at
// once). A renewal refused for its credentials (ErrPermissionDenied) loses
// the lease at once. A renewal that fails with a store error is retried with
// jittered backoff until the deadline; the loss timer, not this loop,
// declares expiry, so a store that hangs cannot delay the loss. A value on recheck (the driver's
// hint that the grant may be gone) renews at once, at most once per
// recheckGap: a refused renewal loses the lease then, a confirmed one keeps
// it, so a forged or stale hint ends nothing.
func (ls *Lease) heartbeat(pushedLoss, recheck <-chan struct{}) {
	defer close(ls.hbDone)
	l := ls.locker
	o := ls.opts
	interval := o.effectiveHeartbeat()
	next := ls.start.Add(interval)
	if ls.firstBeat > 0 {
		next = ls.start.Add(ls.firstBeat)
	}
	if ls.unconfirmed {
		next = time.Now() // the renewal is the store's confirmation
	}
	failures := 0
	var lastSent time.Time // the last renewal's start
	for {
		var beat <-chan time.Time
		var t *time.Timer
		if ls.maxHoldAt.IsZero() || next.Before(ls.maxHoldAt) {
			t = time.NewTimer(time.Until(next))
			beat = t.C
		} else {
			// WithMaxHold: no renewal is sent at or after grant + d; the
			// hold timer ends the lease, which stops this loop.
			t = time.NewTimer(time.Hour)
			t.Stop()
		}
		select {
		case <-ls.hbCtx.Done():
			t.Stop()
			return
		case <-pushedLoss:
			t.Stop()
			ls.lose(LostStoreReported, errors.New("the store reported the grant gone"))
			return
		case <-recheck:
			t.Stop()
			if !ls.maxHoldAt.IsZero() && !time.Now().Before(ls.maxHoldAt) {
				continue
			}
			if wait := time.Until(lastSent.Add(recheckGap)); wait > 0 {
				// Hints come too fast: renew at the end of the gap (or
				// at the next beat, if that comes first).
				if at := time.Now().Add(wait); at.Before(next) {
					next = at
				}
				continue
			}
		case <-beat:
		}
		sent := time.Now()
		lastSent = sent
		ls.mu.Lock()
		deadline := ls.deadline
		ls.mu.Unlock()
		rctx, cancel := context.WithDeadline(ls.hbCtx, minTime(deadline, sent.Add(o.opTimeout)))
		err := l.drv.Renew(rctx, ls.key, ls.owner, o.ttl)
		cancel()
		if ls.hbCtx.Err() != nil {
			return // released, closed or lost while renewing
		}
		switch {
		case err == nil:
			failures = 0
			ls.mu.Lock()
			if ls.state != stateHeld {
				ls.mu.Unlock()
				return
			}
			margin := time.Until(ls.deadline)
			if margin <= 0 {
				// Confirmed, but only after the old deadline passed: the
				// loss timer owns this case and the lease is lost.
				ls.mu.Unlock()
				ls.lose(LostExpired, errors.New("renewal confirmed after the validity deadline"))
				return
			}
			ls.deadline = sent.Add(o.ttl - o.effectiveDrift())
			ls.lossTimer.Reset(time.Until(ls.deadline))
			ls.mu.Unlock()
			l.observer(o).Renewed(RenewEvent{Store: l.store, KeyClass: o.keyClass, Margin: margin})
			next = sent.Add(interval)
		case errors.Is(err, ErrPermissionDenied):
			// The store refused the renewal for its credentials (a
			// revoked token, a rule taken away): no retry can confirm
			// the grant, so it cannot be trusted to the deadline, and
			// retrying would only flood the store with refusals.
			l.observer(o).Renewed(RenewEvent{Store: l.store, KeyClass: o.keyClass, Err: err})
			ls.lose(LostPermissionDenied, err)
			return
		case errors.Is(err, ErrLeaseLost):
			l.observer(o).Renewed(RenewEvent{Store: l.store, KeyClass: o.keyClass, Err: err})
			ls.lose(LostNotOwner, err)
			return
		default:
			l.observer(o).Renewed(RenewEvent{Store: l.store, KeyClass: o.keyClass, Err: err})
			failures++
			// Retry soon, but never busy-loop: jittered, at most a quarter
			// of the interval, at least 1 ms.
			next = time.Now().Add(time.Millisecond + backoff(o.backoffMin, interval/4, failures))
		}
	}
}

func (l *Locker) forget(ls *Lease) {
	l.mu.Lock()
	delete(l.leases, ls)
	l.mu.Unlock()
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
