package dlock

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

// Acquisition results reported in AcquireEvent.Result.
const (
	ResultAcquired    = "acquired"
	ResultNotAcquired = "not_acquired"
	ResultUnavailable = "unavailable"
	ResultCanceled    = "canceled"
	ResultInvalid     = "invalid"
	ResultClosed      = "closed"
	ResultDegraded    = "degraded"
)

func (l *Locker) acquire(ctx context.Context, key string, wait bool, o options) (lease *Lease, err error) {
	start := time.Now()
	contended := 0
	defer func() {
		l.observer(o).AcquireDone(AcquireEvent{
			Store: l.store, KeyClass: o.keyClass, Result: resultOf(lease, err),
			Latency: time.Since(start), Contended: contended,
		})
	}()
	if err := ValidateKey(key); err != nil {
		return nil, l.wrap("acquire", key, err)
	}
	if err := validateOptions(o); err != nil {
		return nil, l.wrap("acquire", key, err)
	}
	if l.isClosed() {
		return nil, l.wrap("acquire", key, ErrClosed)
	}
	// The acquisition ends when the caller's ctx ends or the Locker closes.
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.closeCtx, func() { cancel(ErrClosed) })
	defer stop()

	req := driver.AcquireRequest{Key: key, Owner: newOwnerToken(), TTL: o.ttl, Holder: o.holder}
	waiter, canWait := l.drv.(driver.Waiter)
	var hints <-chan struct{}
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		var g driver.Grant
		var err error
		if wait && canWait {
			g, err = waiter.Wait(driver.WithOpTimeout(actx, o.opTimeout), req)
			if err == nil && time.Since(sent) >= o.effectiveHeartbeat() {
				// The grant came by notification some time after the
				// request was sent; re-anchor validity with a renewal.
				sent, err = l.confirm(actx, req, o)
				if errors.Is(err, ErrLeaseLost) {
					continue
				}
			}
		} else {
			octx, ocancel := context.WithTimeout(actx, o.opTimeout)
			g, err = l.drv.TryAcquire(octx, req)
			ocancel()
		}
		if err == nil {
			return l.newLease(req, g, sent, o)
		}
		if errors.Is(err, ErrNotAcquired) && ctxEnded(actx) == nil {
			contended++
			if !wait {
				return nil, l.wrap("acquire", key, err)
			}
			if hints == nil {
				hints = l.subscribeHints(actx, key)
			}
			if !sleepBackoff(actx, o, attempt, hints) {
				return nil, l.classify("acquire", key, ctx, actx.Err())
			}
			continue
		}
		// A store error or the end of ctx may hide a grant that raced it:
		// release whatever the owner token may hold. When ctx ended the
		// store is likely healthy, so this is done before returning (a
		// nil error must mean "held", an error "nothing left behind"); after
		// a store error it runs in the background, so that the caller gets
		// ErrUnavailable within the op timeout.
		ended := ctxEnded(actx)
		closing := context.Cause(actx) == ErrClosed && ctx.Err() == nil
		switch {
		case ended != nil && closing && wait && canWait:
			// The Locker is closing: the driver's Wait has removed what it
			// left on the store before returning (its contract), within its
			// own bound; a second release would make the pending call wait
			// another op timeout on a store that may not answer.
		case ended != nil:
			l.cleanupNow(req, o)
		default:
			l.cleanup(req, o)
		}
		if ended != nil {
			if context.Cause(actx) == ErrClosed && ctx.Err() == nil {
				return nil, l.wrap("acquire", key, ErrClosed)
			}
			return nil, l.classify("acquire", key, ctx, ended)
		}
		if o.failOpen {
			return l.degradedLease(req, o), nil
		}
		return nil, l.classify("acquire", key, ctx, err)
	}
}

// confirm renews a grant that arrived by notification, so that its validity
// is measured from a request sent now.
func (l *Locker) confirm(ctx context.Context, req driver.AcquireRequest, o options) (time.Time, error) {
	sent := time.Now()
	octx, cancel := context.WithTimeout(ctx, o.opTimeout)
	defer cancel()
	return sent, l.drv.Renew(octx, req.Key, req.Owner, req.TTL)
}

// cleanupNow releases what the owner token may hold before returning.
func (l *Locker) cleanupNow(req driver.AcquireRequest, o options) {
	ctx, cancel := context.WithTimeout(context.Background(), o.opTimeout)
	defer cancel()
	_ = l.drv.Release(ctx, req.Key, req.Owner)
}

// cleanup releases, in the background, any grant the owner token may hold
// after an acquisition that failed in an ambiguous way, so that the caller
// gets its error without waiting another round trip of a store that may be
// down. Owner tokens are unique per acquisition, so this can never touch
// another holder's grant. Close waits for pending cleanups.
func (l *Locker) cleanup(req driver.AcquireRequest, o options) {
	l.cleanups.Add(1)
	go func() {
		defer l.cleanups.Done()
		ctx, cancel := context.WithTimeout(context.Background(), o.opTimeout)
		defer cancel()
		_ = l.drv.Release(ctx, req.Key, req.Owner)
	}()
}

func (l *Locker) subscribeHints(ctx context.Context, key string) <-chan struct{} {
	h, ok := l.drv.(driver.Hinter)
	if !ok {
		return nil
	}
	ch, stop, err := h.Hint(ctx, key)
	if err != nil {
		return nil
	}
	context.AfterFunc(ctx, stop)
	return ch
}

// sleepBackoff sleeps for a full-jitter exponential backoff ("Exponential
// Backoff And Jitter", AWS Architecture Blog, 2015): uniform in
// [0, min(max, min·2^attempt)). A release hint ends the sleep early. It
// returns false when ctx ends.
func sleepBackoff(ctx context.Context, o options, attempt int, hints <-chan struct{}) bool {
	t := time.NewTimer(backoff(o.backoffMin, o.backoffMax, attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	case <-hints:
		return true
	}
}

func backoff(min, max time.Duration, attempt int) time.Duration {
	ceiling := max
	if attempt < 62 {
		if c := min << attempt; c > 0 && c < max {
			ceiling = c
		}
	}
	if ceiling <= 0 {
		return 0
	}
	return rand.N(ceiling)
}

func (l *Locker) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

func (l *Locker) observer(o options) Observer {
	if o.observer != nil {
		return o.observer
	}
	return nopObserver{}
}

func resultOf(lease *Lease, err error) string {
	switch {
	case err == nil && lease != nil && lease.degraded:
		return ResultDegraded
	case err == nil:
		return ResultAcquired
	case errors.Is(err, ErrNotAcquired):
		return ResultNotAcquired
	case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrInvalidTTL):
		return ResultInvalid
	case errors.Is(err, ErrClosed):
		return ResultClosed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ResultCanceled
	default:
		return ResultUnavailable
	}
}
