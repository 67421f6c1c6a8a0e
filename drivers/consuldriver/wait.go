package consuldriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/dlock-dev/dlock/driver"
)

// blockWait is the longest a blocking query waits for a change before the
// waiter looks again (Consul caps it at 10 minutes). A change answers at
// once; this only bounds how long a waiter trusts one unchanged answer.
const blockWait = time.Minute

// waiter is one Wait in progress.
type waiter struct {
	d      *Driver
	req    driver.AcquireRequest
	op     time.Duration
	ctx    context.Context // the wait's context: the caller's, Close, the keepalive
	cancel context.CancelCauseFunc
	id     string // the waiter's session, which becomes the grant's
	lk     string // the key's lock entry
	qdir   string // the key's queue directory
	qk     string // the waiter's queue entry
	value  []byte
	// ambiguous is set when a lock transaction was sent and its answer
	// lost: the session may hold the key, so the clean-up releases it.
	ambiguous bool
}

// Wait implements driver.Waiter: it queues the request behind the key's
// earlier waiters and waits by blocking queries until it is at the head of
// the queue and the key is free, then takes the key (see "Capabilities" in
// the package doc). When ctx ends, the driver is closed or the waiter's
// session cannot be kept alive, it removes what it put on the store (its
// queue entry, its session, and a grant that raced the end) within the op
// timeout, then returns an error matching ctx.Err(), driver.ErrClosed or
// the store error.
func (d *Driver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("consuldriver: wait: %w", err)
	}
	if d.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	op := driver.OpTimeout(ctx)
	if op <= 0 {
		op = d.opTimeout
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(d.closeCtx, func() { cancel(driver.ErrClosed) })
	defer stop()
	w := &waiter{
		d: d, req: req, op: op, ctx: wctx, cancel: cancel,
		lk:    d.lockKey(req.Key),
		qdir:  d.queueDirOf(req.Key),
		qk:    d.queueKey(req.Key, req.Owner),
		value: encodeRecord(req.Owner, req.Holder, req.TTL),
	}
	sctx, scancel := context.WithTimeout(wctx, op)
	id, err := d.createSession(sctx, req.TTL)
	scancel()
	if err != nil {
		return driver.Grant{}, w.fail(ctx, err)
	}
	w.id = id

	stopKA := make(chan struct{})
	kaDone := make(chan struct{})
	go w.keepAlive(stopKA, kaDone)
	fence, err := w.run()
	close(stopKA)
	<-kaDone
	if err != nil {
		err = w.fail(ctx, err)
		w.abandon()
		return driver.Grant{}, err
	}
	d.remember(req.Owner, id, req.TTL)
	return driver.Grant{Fence: fence}, nil
}

// fail returns the error a failed wait reports: the caller's context's,
// ErrClosed, the keepalive's, or err.
func (w *waiter) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("consuldriver: wait %q: %w", w.req.Key, ctx.Err())
	}
	if w.ctx.Err() != nil {
		if cause := context.Cause(w.ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return cause
		}
	}
	return err
}

// bounded returns a context for one round trip of the wait.
func (w *waiter) bounded() (context.Context, context.CancelFunc) {
	return context.WithTimeout(w.ctx, w.op)
}

// keepAlive renews the waiter's session every TTL/3 until stop closes. A
// renewal that fails, or finds the session gone, ends the wait.
func (w *waiter) keepAlive(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(max(w.req.TTL/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-w.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := w.bounded()
		entry, _, err := w.d.sess.Renew(w.id, (&api.WriteOptions{}).WithContext(ctx))
		cancel()
		select {
		case <-stop:
			return
		default:
		}
		if w.ctx.Err() != nil {
			return
		}
		switch {
		case err != nil:
			w.cancel(w.d.storeErr("wait: renew the waiter's session", err))
			return
		case entry == nil:
			w.cancel(fmt.Errorf("consuldriver: wait: the waiter's session ended on the store"))
			return
		}
	}
}

// run queues the waiter and waits until it holds the key; it returns the
// grant's fence.
func (w *waiter) run() (uint64, error) {
	d := w.d
	ctx, cancel := w.bounded()
	ok, resp, _, err := d.txn.Txn(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVLock, Key: w.qk, Value: w.value, Session: w.id}}},
		(&api.QueryOptions{}).WithContext(ctx))
	cancel()
	if err != nil {
		return 0, d.storeErr("wait: queue", err)
	}
	if !ok {
		return 0, fmt.Errorf("consuldriver: wait: Consul refused the queue entry: %s", txnErrors(resp))
	}
	head := false // at the head of the queue: it stays there
	refusals := 0 // lock transactions refused in a row for lock-delay
	for {
		if !head {
			pred, err := w.predecessor()
			if err != nil {
				return 0, err
			}
			if pred != nil {
				// Not at the head: wait for the entry just before this
				// one to change (its waiter got the key, or left).
				if err := w.block(pred.Key, pred.ModifyIndex); err != nil {
					return 0, err
				}
				continue
			}
			head = true
		}
		ctx, cancel := w.bounded()
		fence, err := d.lockTxn(ctx, w.lk, w.id, w.value, w.qk)
		cancel()
		if err == nil {
			return fence, nil
		}
		if !errors.Is(err, driver.ErrNotAcquired) {
			if !errors.Is(err, driver.ErrPermissionDenied) {
				w.ambiguous = true
			}
			return 0, err
		}
		if errors.Is(err, errLockDelay) {
			// Consul does not tell when a lock-delay ends: look again
			// after a growing pause.
			refusals++
			if !sleepCtx(w.ctx, min(time.Duration(25<<min(refusals, 6))*time.Millisecond, time.Second)) {
				return 0, w.ctx.Err()
			}
			continue
		}
		refusals = 0
		ctx, cancel = w.bounded()
		kv, _, err := d.read(ctx, w.lk)
		cancel()
		if err != nil {
			return 0, d.storeErr("wait: read the key", err)
		}
		if kv != nil && kv.Session != "" {
			// Held (by a TryAcquire that came first, or the holder the
			// wait began behind): wait for its entry to change.
			if err := w.block(w.lk, kv.ModifyIndex); err != nil {
				return 0, err
			}
		}
		// Free again already (released since the transaction): try again.
	}
}

// predecessor returns the live queue entry just before the waiter's own
// (nil at the head), or an error when the waiter's entry is gone.
func (w *waiter) predecessor() (*api.KVPair, error) {
	ctx, cancel := w.bounded()
	entries, _, err := w.d.kv.List(w.qdir, (&api.QueryOptions{}).WithContext(ctx))
	cancel()
	if err != nil {
		return nil, w.d.storeErr("wait: read the queue", err)
	}
	var mine, pred *api.KVPair
	for _, e := range entries {
		if e.Key == w.qk {
			mine = e
		}
	}
	if mine == nil || mine.Session != w.id {
		return nil, fmt.Errorf("consuldriver: wait: the waiter's queue entry is gone (its session ended)")
	}
	for _, e := range entries {
		if e.Session != "" && e.CreateIndex < mine.CreateIndex && (pred == nil || e.CreateIndex > pred.CreateIndex) {
			pred = e
		}
	}
	return pred, nil
}

// block waits until the entry k changes from index (or is deleted), for at
// most blockWait, by a blocking query.
func (w *waiter) block(k string, index uint64) error {
	q := &api.QueryOptions{WaitIndex: index, WaitTime: blockWait}
	_, _, err := w.d.kv.Get(k, q.WithContext(w.ctx))
	if err != nil {
		if w.ctx.Err() != nil {
			return w.ctx.Err()
		}
		return w.d.storeErr("wait: blocking query", err)
	}
	return nil
}

// abandon removes what the wait left on the store, within the op timeout:
// a grant whose answer was lost (released first, so that no lock-delay
// applies), the queue entry and the session.
func (w *waiter) abandon() {
	d := w.d
	ctx, cancel := context.WithTimeout(context.Background(), w.op)
	defer cancel()
	if w.ambiguous {
		_, _, _, _ = d.txn.Txn(d.releaseOps(w.lk, w.id), (&api.QueryOptions{}).WithContext(ctx))
	}
	if d.behavior == BehaviorRelease {
		// Destroying the session would only release the queue entry.
		_, _ = d.kv.Delete(w.qk, (&api.WriteOptions{}).WithContext(ctx))
	}
	_, _ = d.sess.Destroy(w.id, (&api.WriteOptions{}).WithContext(ctx))
}

// sleepCtx sleeps for d or until ctx ends; it reports whether it slept.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
