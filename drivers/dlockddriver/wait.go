package dlockddriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/dlock-dev/dlock/driver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// Wait implements driver.Waiter over the server's Wait stream: it queues
// on the key's FIFO queue and returns when the server grants the key.
//
// A grant handed over to a waiter comes with a claim window
// (AcquireResponse.claim_within): the receiver must confirm it with a
// Renew within that time, or the server releases it to the next waiter, so
// that a waiter that vanished without closing its connection cannot keep
// the key for a whole TTL. Wait sends that Renew (with req.TTL) as soon as
// the grant arrives and returns the grant only once the renewal is
// acknowledged. When the renewal answers that the grant is gone (the window
// passed first), Wait queues again with the same owner token, until ctx
// ends. When ctx ends during the claim, Wait releases what the owner token
// may hold before it returns ctx's error; on any other failure of the
// renewal it returns that error, and the root package releases in the
// background.
//
// Claiming does not weaken the validity the root package computes: the root
// measures it from the moment it sent the wait request, which is before the
// server made the grant and so before the server's countdown started; the
// claim renewal then restarts that countdown at a full TTL later still. The
// client's deadline therefore always falls before the server's expiry. And
// the grant is returned only after the server acknowledged the claim, which
// it does only while the window is open and the owner token still holds the
// key: a grant already passed to the next waiter is never returned.
func (d *Driver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("dlockd: wait: %w", err)
	}
	for {
		if d.isClosed() {
			return driver.Grant{}, driver.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return driver.Grant{}, err
		}
		resp, err := d.waitOnce(ctx, req)
		if err != nil {
			return driver.Grant{}, err
		}
		g := d.grant(req, resp.GetFence())
		if resp.GetClaimWithin() == nil {
			return g, nil
		}
		err = d.claim(ctx, req, resp.GetClaimWithin().AsDuration())
		switch {
		case err == nil:
			return g, nil
		case ctx.Err() != nil:
			d.forget(req.Key, req.Owner)
			return driver.Grant{}, d.releaseRaced(ctx, req)
		case errors.Is(err, driver.ErrLeaseLost):
			continue // not claimed in time: the next waiter has it; queue again
		default:
			d.forget(req.Key, req.Owner)
			return driver.Grant{}, err
		}
	}
}

// claimMargin is how much longer than the claim window Wait waits for the
// claim renewal's answer before it gives up (a store error).
const claimMargin = time.Second

// claim confirms a handed-over grant with a renewal to a full TTL. It
// returns nil when the server acknowledged it, an error matching
// driver.ErrLeaseLost when the grant is gone, and another error when the
// renewal failed or was not answered within the claim window plus
// claimMargin (that error never matches a context error unless ctx ended).
func (d *Driver) claim(ctx context.Context, req driver.AcquireRequest, within time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, within+claimMargin)
	defer cancel()
	err := d.Renew(cctx, req.Key, req.Owner, req.TTL)
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		return fmt.Errorf("dlockd: wait %q: the claim of a handed-over grant (claim window %v) was not answered in time", req.Key, within)
	}
	return err
}

// waitOnce queues once on the Wait stream and returns the grant, or an
// error; when ctx ends it cancels on the server first (cancelWait).
func (d *Driver) waitOnce(ctx context.Context, req driver.AcquireRequest) (*dlockv1.AcquireResponse, error) {
	// The stream outlives ctx so that a cancellation can be confirmed by the
	// server; until the request is sent, ctx still cuts the stream.
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	defer scancel()
	var sentMu sync.Mutex
	sent := false
	stopEarly := context.AfterFunc(ctx, func() {
		sentMu.Lock()
		defer sentMu.Unlock()
		if !sent {
			scancel()
		}
	})
	defer stopEarly()

	stream, err := d.client.Wait(sctx)
	if err == nil {
		sentMu.Lock()
		if sctx.Err() == nil {
			err = stream.Send(d.acquireReq(req, true))
			sent = err == nil
		} else {
			err = sctx.Err()
		}
		sentMu.Unlock()
	}
	if err != nil { // the stream broke; the server cleans up what it got when the stream ends
		return nil, mapErr(ctx, "wait", req.Key, err)
	}

	// The server answers at once: QUEUED, or GRANTED when the key is
	// free. One that does not answer within the caller's op timeout is not
	// answering at all (frozen, or the network silently dropping packets):
	// give up with a store error rather than wait for the keepalive.
	first := time.NewTimer(answerTimeout(ctx))
	defer first.Stop()
	answered := false

	events := make(chan recvd, 4)
	go func() {
		for {
			ev, err := stream.Recv()
			select {
			case events <- recvd{ev, err}:
			case <-sctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	for {
		select {
		case <-first.C:
			if !answered {
				return nil, fmt.Errorf("dlockd: wait %q: %w: the server did not acknowledge the wait within %v", req.Key, driver.ErrUnavailable, answerTimeout(ctx))
			}
		case r := <-events:
			answered = true
			if r.err != nil {
				return nil, mapErr(ctx, "wait", req.Key, r.err)
			}
			switch r.ev.GetType() {
			case dlockv1.WaitEvent_GRANTED:
				return r.ev.GetGrant(), nil
			case dlockv1.WaitEvent_CANCELLED: // not asked for: treat as an outage
				return nil, fmt.Errorf("dlockd: wait %q: cancelled by the server", req.Key)
			}
		case <-ctx.Done():
			return nil, d.cancelWait(ctx, req, stream, events)
		}
	}
}

// answerTimeout is how long Wait waits for the server's first answer: the
// caller's op timeout (driver.OpTimeout), or 5 s.
func answerTimeout(ctx context.Context) time.Duration {
	if d := driver.OpTimeout(ctx); d > 0 {
		return d
	}
	return 5 * time.Second
}

// recvd is one result of a Wait stream's Recv.
type recvd struct {
	ev  *dlockv1.WaitEvent
	err error
}

// cancelWait asks the server, on the wait's own stream, to remove the queue
// entry, and waits for its answer. A grant that arrives first is released.
func (d *Driver) cancelWait(ctx context.Context, req driver.AcquireRequest, stream dlockv1.Lock_WaitClient, events <-chan recvd) error {
	why := ctx.Err()
	_ = stream.CloseSend()
	timer := time.NewTimer(d.cleanup)
	defer timer.Stop()
	for {
		select {
		case r := <-events:
			if r.err != nil {
				if errors.Is(r.err, io.EOF) {
					return why
				}
				return errors.Join(why, fmt.Errorf("dlockd: wait %q: cancel not confirmed: %w", req.Key, r.err))
			}
			switch r.ev.GetType() {
			case dlockv1.WaitEvent_CANCELLED:
				return why
			case dlockv1.WaitEvent_GRANTED:
				return d.releaseRaced(ctx, req)
			}
		case <-timer.C:
			return errors.Join(why, fmt.Errorf("dlockd: wait %q: cancel not confirmed within %v", req.Key, d.cleanup))
		}
	}
}

// releaseRaced releases, within the cleanup timeout, a grant the owner token
// may hold after ctx ended, and returns ctx's error (joined with the
// release's failure, if any).
func (d *Driver) releaseRaced(ctx context.Context, req driver.AcquireRequest) error {
	why := ctx.Err()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cleanup)
	defer cancel()
	err := d.Release(rctx, req.Key, req.Owner)
	if err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		return errors.Join(why, fmt.Errorf("dlockd: wait %q: release of a grant that raced the cancellation: %w", req.Key, err))
	}
	return why
}
