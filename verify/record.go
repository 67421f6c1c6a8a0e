package verify

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/server/historytest"
)

// RecordingDriver wraps a driver and records each TryAcquire, Wait, Renew
// and Release in a historytest.Recorder, as one client. Invoke is read just
// before the wrapped call and Complete just after, so the recorded times
// bound what the root client measures from (it reads its clock before
// calling the driver): the checker's validity ends are at most
// microseconds later than the client's own, the strict side.
type RecordingDriver struct {
	d      driver.Driver
	rec    *historytest.Recorder
	client int
}

// recordingWaiter is a RecordingDriver over a driver.Waiter.
type recordingWaiter struct {
	*RecordingDriver
	w driver.Waiter
}

// recordingUnconfirmedWaiter is a RecordingDriver over a
// driver.UnconfirmedWaiter.
type recordingUnconfirmedWaiter struct {
	*recordingWaiter
	u driver.UnconfirmedWaiter
}

// Record returns d wrapped in a RecordingDriver that records as client in
// rec. The result implements driver.Waiter and driver.UnconfirmedWaiter
// exactly when d does, so the root client waits the way it would on d.
func Record(d driver.Driver, rec *historytest.Recorder, client int) driver.Driver {
	r := &RecordingDriver{d: d, rec: rec, client: client}
	w, ok := d.(driver.Waiter)
	if !ok {
		return r
	}
	rw := &recordingWaiter{RecordingDriver: r, w: w}
	if u, ok := d.(driver.UnconfirmedWaiter); ok {
		return &recordingUnconfirmedWaiter{recordingWaiter: rw, u: u}
	}
	return rw
}

// outcome classifies a driver error: nil is OK, a refusal that leaves the
// client holding nothing new (ErrNotAcquired, ErrLeaseLost) is Failed, and
// anything else (a timeout, a broken connection) may hide a success:
// Unknown.
func outcome(err error) historytest.Outcome {
	switch {
	case err == nil:
		return historytest.OK
	case errors.Is(err, driver.ErrNotAcquired), errors.Is(err, driver.ErrLeaseLost):
		return historytest.Failed
	}
	return historytest.Unknown
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TryAcquire implements driver.Driver.
func (r *RecordingDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	inv := r.rec.Now()
	g, err := r.d.TryAcquire(ctx, req)
	r.grant(req, inv, g, err, "try")
	return g, err
}

// Wait implements driver.Waiter.
func (r *recordingWaiter) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	inv := r.rec.Now()
	g, err := r.w.Wait(ctx, req)
	r.grant(req, inv, g, err, "wait")
	return g, err
}

// WaitUnconfirmed implements driver.UnconfirmedWaiter; the grant's claim
// window (Grant.ConfirmWithin) is recorded as the Op's ClaimWithin (as for
// every grant, the shorter of it and Grant.ValidFor: Grant.Window).
func (r *recordingUnconfirmedWaiter) WaitUnconfirmed(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	inv := r.rec.Now()
	g, err := r.u.WaitUnconfirmed(ctx, req)
	r.grant(req, inv, g, err, "wait")
	return g, err
}

func (r *RecordingDriver) grant(req driver.AcquireRequest, inv time.Duration, g driver.Grant, err error, how string) {
	op := historytest.Op{
		Client: r.client, Kind: historytest.Acquire, Key: req.Key, Owner: req.Owner, TTL: req.TTL,
		Invoke: inv, Complete: r.rec.Now(), Outcome: outcome(err), Note: how,
	}
	if err == nil {
		op.Fence, op.GrantTTL, op.ClaimWithin = g.Fence, req.TTL, g.Window()
	} else {
		op.Note += ": " + errText(err)
	}
	r.rec.Add(op)
}

// Renew implements driver.Driver.
func (r *RecordingDriver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	inv := r.rec.Now()
	err := r.d.Renew(ctx, key, owner, ttl)
	r.rec.Add(historytest.Op{
		Client: r.client, Kind: historytest.Renew, Key: key, Owner: owner, TTL: ttl,
		Invoke: inv, Complete: r.rec.Now(), Outcome: outcome(err), Note: errText(err),
	})
	return err
}

// Release implements driver.Driver (a Release ends the owner's validity at
// its send time, whatever the answer).
func (r *RecordingDriver) Release(ctx context.Context, key, owner string) error {
	inv := r.rec.Now()
	err := r.d.Release(ctx, key, owner)
	r.rec.Add(historytest.Op{
		Client: r.client, Kind: historytest.Release, Key: key, Owner: owner,
		Invoke: inv, Complete: r.rec.Now(), Outcome: outcome(err), Note: errText(err),
	})
	return err
}

// Close closes the wrapped driver.
func (r *RecordingDriver) Close() error { return r.d.Close() }
