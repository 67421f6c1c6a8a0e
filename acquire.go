package dlock

import (
	"context"
	"errors"
	"fmt"
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

func (l *Locker) acquire(ctx context.Context, key string, wait bool, o *options) (lease *Lease, err error) {
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
	if ctx == nil {
		return nil, l.wrap("acquire", key, errNilContext)
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
	unconfirmed, _ := l.drv.(driver.UnconfirmedWaiter)
	var hints <-chan struct{}
	budget := o.retryBudget(wait)
	var (
		outage  time.Time // when the current run of store errors began; zero: none
		tries   int       // attempts that failed in the current outage
		lastErr error     // the last store error of the current outage
		// streak counts the store errors of this whole acquisition: the
		// backoff grows with it, so a store that fails each Wait but
		// answers each probe (a full queue) is asked less and less
		// often, not every few milliseconds.
		streak int
	)
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		var g driver.Grant
		var err error
		// During an outage the store is probed with TryAcquire, bounded by
		// the op timeout, rather than queued on: a queue entry on a store
		// that is failing would have to be cancelled on it when ctx ends.
		waited := wait && canWait && outage.IsZero()
		if waited {
			wctx := driver.WithOpTimeout(actx, o.opTimeout)
			if unconfirmed != nil {
				g, err = unconfirmed.WaitUnconfirmed(wctx, req)
			} else {
				g, err = waiter.Wait(wctx, req)
			}
			if err == nil && (time.Since(sent) >= o.effectiveHeartbeat() || g.ConfirmWithin > 0 && !windowUsable(g.ConfirmWithin, sent, o)) {
				// The grant came by notification some time after the
				// request was sent; re-anchor validity with a renewal
				// (which also confirms a handed-over grant).
				sent, err = l.confirm(actx, req, o)
				g.ConfirmWithin, g.ValidFor = 0, 0
				if errors.Is(err, ErrLeaseLost) {
					continue
				}
			}
		} else {
			// An attempt during an outage gets only what is left of the
			// retry budget, so that the acquisition ends within it (not up
			// to an op timeout later); one the budget cut keeps the
			// outage's error as the cause.
			timeout, shortened := o.opTimeout, false
			if !outage.IsZero() && budget >= 0 {
				if left := budget - time.Since(outage); left < timeout {
					timeout, shortened = max(left, 0), true
				}
			}
			octx, ocancel := context.WithTimeout(actx, timeout)
			g, err = l.drv.TryAcquire(octx, req)
			cut := shortened && octx.Err() != nil
			ocancel()
			if err != nil && cut && lastErr != nil && ctxEnded(actx) == nil {
				err = lastErr
			}
		}
		if err == nil && g.ValidFor > 0 && !windowUsable(g.ValidFor, sent, o) {
			// Kept too little of the TTL for the drift and the time
			// the answer took: renew it first, so that its validity is
			// a TTL from a request sent now.
			sent, err = l.confirm(actx, req, o)
			g.ConfirmWithin, g.ValidFor = 0, 0
			if errors.Is(err, ErrLeaseLost) {
				continue
			}
		}
		if err == nil {
			return l.newLease(req, g, sent, o)
		}
		if errors.Is(err, ErrNotAcquired) && ctxEnded(actx) == nil {
			afterOutage := !outage.IsZero()
			outage, tries, lastErr = time.Time{}, 0, nil // the store answered
			contended++
			if !wait {
				return nil, l.wrap("acquire", key, err)
			}
			if afterOutage && canWait {
				continue // queue on the store again at once
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
		// a store error, or when ctx ends during an outage, it runs in the
		// background (Close waits for it), so that the caller gets its
		// error without another round trip of a store that may be down.
		ended := ctxEnded(actx)
		closing := context.Cause(actx) == ErrClosed && ctx.Err() == nil
		switch {
		case errors.Is(err, ErrPermissionDenied) && ended == nil:
			// Refused for its credentials before the store took anything:
			// nothing to release (and a release would be refused, and
			// audited, too).
		case ended != nil && closing && waited:
			// The Locker is closing: the driver's Wait has removed what it
			// left on the store before returning (its contract), within its
			// own bound; a second release would make the pending call wait
			// another op timeout on a store that may not answer.
		case ended != nil && outage.IsZero():
			l.cleanupNow(req, o)
		default:
			l.cleanup(req, o)
		}
		if ended != nil {
			return nil, l.ended(ctx, actx, key, ended, outage, tries, lastErr)
		}
		if !retryable(err) {
			// Invalid input, a lost grant, an unsupported operation: the
			// store answered, and asking again cannot help. Never
			// degraded by WithFailOpen.
			return nil, l.classify("acquire", key, ctx, err)
		}
		if outage.IsZero() {
			outage = sent
		}
		tries++
		streak++
		lastErr = err
		elapsed := time.Since(outage)
		if budget >= 0 && elapsed >= budget {
			if o.failOpen {
				return l.degradedLease(req, o), nil
			}
			if tries == 1 {
				return nil, l.classify("acquire", key, ctx, err)
			}
			return nil, l.wrap("acquire", key, gaveUp(err, elapsed, tries, nil))
		}
		pause := backoff(o.backoffMin, o.backoffMax, streak-1)
		if budget >= 0 {
			pause = min(pause, budget-elapsed)
		}
		if ro, ok := l.observer(o).(RetryObserver); ok {
			ro.AcquireRetry(RetryEvent{
				Store: l.store, KeyClass: o.keyClass, Attempt: tries,
				Elapsed: elapsed, Backoff: pause, Err: err,
			})
		}
		// A new owner token for the next attempt: the background release
		// of the old one must not remove a grant the next attempt gets.
		req.Owner = newOwnerToken()
		if !sleepCtx(actx, pause) {
			return nil, l.ended(ctx, actx, key, ctxEnded(actx), outage, tries, lastErr)
		}
	}
}

// ended returns the error of an acquisition whose ctx (the caller's, or the
// Locker's close) ended: ErrClosed when the Locker closed; otherwise an
// error matching ctx.Err() that, during an outage, also matches
// ErrUnavailable and wraps the last store error.
func (l *Locker) ended(ctx, actx context.Context, key string, ended error, outage time.Time, tries int, lastErr error) error {
	if context.Cause(actx) == ErrClosed && ctx.Err() == nil {
		return l.wrap("acquire", key, ErrClosed)
	}
	if outage.IsZero() || lastErr == nil {
		return l.classify("acquire", key, ctx, ended)
	}
	cerr := ended
	if cause := context.Cause(ctx); cause != nil && cause != ended {
		cerr = fmt.Errorf("%w (%w)", ended, cause)
	}
	return l.wrap("acquire", key, gaveUp(lastErr, time.Since(outage), tries, cerr))
}

// gaveUp is the error of an acquisition that retried a store outage for
// retried over attempts attempts, until its budget was spent (ended nil)
// or its ctx ended (ended set). It matches ErrUnavailable, last, and ended.
func gaveUp(last error, retried time.Duration, attempts int, ended error) error {
	d := retried.Round(time.Millisecond)
	if ended != nil {
		return fmt.Errorf("%w (retried for %v, %d attempts, until %w): %w", ErrUnavailable, d, attempts, ended, last)
	}
	return fmt.Errorf("%w (retried for %v, %d attempts): %w", ErrUnavailable, d, attempts, last)
}

// retryable reports whether an acquisition's store error is transient: it
// would be ErrUnavailable at the root. Invalid input, a lost grant, a held
// key, an unsupported operation, a stale fence and a closed driver are the
// store's answers and are never retried.
func retryable(err error) bool {
	for _, answer := range []error{
		ErrInvalidArgument, ErrNotAcquired, ErrLeaseLost, ErrUnsupported, ErrStaleFence, ErrClosed,
	} {
		if errors.Is(err, answer) {
			return false
		}
	}
	return true
}

// sleepCtx sleeps for d and returns true, or returns false when ctx ends
// first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// windowUsable reports whether a grant the store keeps only window from
// the request unless it is renewed or confirmed (Grant.ConfirmWithin,
// Grant.ValidFor) may become a lease before that renewal: the validity it
// gives, from the send to the send plus the window (or the TTL, if
// shorter) less the drift, must be at least half of that window, and less
// than half of it may have passed, so that the renewal has time to come
// back. Otherwise the grant is renewed before Acquire returns.
func windowUsable(window time.Duration, sent time.Time, o *options) bool {
	window = min(o.ttl, window)
	valid := window - o.effectiveDrift()
	return valid >= window/2 && time.Since(sent) < valid/2
}

// confirm renews a grant that arrived by notification, so that its validity
// is measured from a request sent now.
func (l *Locker) confirm(ctx context.Context, req driver.AcquireRequest, o *options) (time.Time, error) {
	sent := time.Now()
	octx, cancel := context.WithTimeout(ctx, o.opTimeout)
	defer cancel()
	return sent, l.drv.Renew(octx, req.Key, req.Owner, req.TTL)
}

// cleanupNow releases what the owner token may hold before returning.
func (l *Locker) cleanupNow(req driver.AcquireRequest, o *options) {
	ctx, cancel := context.WithTimeout(context.Background(), o.opTimeout)
	defer cancel()
	_ = l.drv.Release(ctx, req.Key, req.Owner)
}

// cleanupGrace bounds how long Close waits for a background release of an
// acquisition that failed (see cleanup).
const cleanupGrace = 500 * time.Millisecond

// cleanup releases, in the background, any grant the owner token may hold
// after an acquisition that failed in an ambiguous way, so that the caller
// gets its error without waiting another round trip of a store that may be
// down. Owner tokens are unique per attempt, so this can never touch
// another holder's grant, nor a later attempt's. Close waits for pending
// cleanups, each for at most cleanupGrace once Close has begun.
func (l *Locker) cleanup(req driver.AcquireRequest, o *options) {
	l.mu.Lock()
	if l.closed {
		// Close may already be waiting for the cleanups: release here
		// (best effort; the driver may be closing too).
		l.mu.Unlock()
		l.cleanupNow(req, o)
		return
	}
	l.cleanups.Add(1) // under l.mu, so never concurrently with Close's Wait
	l.mu.Unlock()
	go func() {
		defer l.cleanups.Done()
		ctx, cancel := context.WithTimeout(context.Background(), o.opTimeout)
		defer cancel()
		// Close waits for this release, but at most cleanupGrace: a store
		// that does not answer must not hold Close (and a program's exit)
		// up for another op timeout after the acquisition's budget; the
		// grant, if any, then ends with its TTL.
		stop := context.AfterFunc(l.closeCtx, func() {
			t := time.NewTimer(cleanupGrace)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
				cancel()
			}
		})
		defer stop()
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
func sleepBackoff(ctx context.Context, o *options, attempt int, hints <-chan struct{}) bool {
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

func (l *Locker) observer(o *options) Observer {
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
	case errors.Is(err, ErrInvalidArgument):
		return ResultInvalid
	case errors.Is(err, ErrClosed):
		return ResultClosed
	case errors.Is(err, ErrUnavailable): // also when ctx ended during an outage
		return ResultUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ResultCanceled
	default:
		return ResultUnavailable
	}
}
