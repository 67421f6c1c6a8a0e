package dlock

import (
	"context"
	"fmt"
	"time"
)

// LostMaxHold is the EndEvent.LostReason of a lease ended by WithMaxHold.
const LostMaxHold = "max_hold"

// onMaxHold runs when the WithMaxHold bound passes: the lease ends with
// ErrMaxHoldReached, the heartbeat stops, and the grant is left on the store
// to expire by its TTL (Release or the Locker's Close still release it).
func (ls *Lease) onMaxHold() {
	l := ls.locker
	ls.mu.Lock()
	if ls.state != stateHeld {
		ls.mu.Unlock()
		return
	}
	ls.state = stateMaxHold
	ls.err = l.wrap("lease", ls.key, fmt.Errorf("%w: held for %v (WithMaxHold); renewals stopped, the grant expires by its TTL", ErrMaxHoldReached, ls.opts.maxHold))
	if ls.lossTimer != nil { // nil for a degraded lease
		ls.lossTimer.Stop()
	}
	err := ls.err
	ls.mu.Unlock()

	ls.stopHeartbeat()
	ls.cancel(err)
	l.observer(ls.opts).LeaseEnded(EndEvent{
		Store: l.store, KeyClass: ls.opts.keyClass, Held: time.Since(ls.start), TTL: ls.opts.ttl,
		Lost: true, LostReason: LostMaxHold,
	})
}

// endMaxHeld is end for a lease in stateMaxHold (ls.mu held, unlocked
// here): the grant may still be on the store until its TTL, so it is
// released there (owner-checked) once. Release returns the lease's
// ErrMaxHoldReached error; Close returns nil.
func (ls *Lease) endMaxHeld(ctx context.Context, reason error) error {
	l := ls.locker
	if reason == ErrClosed {
		ls.state = stateClosed
	} else {
		ls.state = stateReleased
	}
	ls.relErr = ls.err
	ls.mu.Unlock()
	defer close(ls.ended)
	// onMaxHold cancels the context right after it sets the state: wait
	// for it, so that Release never returns while Done is still open.
	<-ls.ctx.Done()
	ls.waitHeartbeat()
	if !ls.degraded {
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ls.opts.opTimeout)
		_ = l.drv.Release(octx, ls.key, ls.owner) // ErrLeaseLost: it had expired already
		cancel()
	}
	// Forgotten only after the store release, as in end: a Close meanwhile
	// waits for it.
	l.forget(ls)
	if reason == ErrClosed {
		return nil
	}
	return ls.relErr
}
