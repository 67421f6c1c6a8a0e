// Package clustertest proves a dlockd cluster's safety and liveness under
// faults (issue 10): its tests start real dlockd processes with
// servertest.StartCluster, drive them with the dlock root client (one
// Locker per client, on the dlockd:// URL listing the members), inject
// partitions, pauses (SIGSTOP), kill -9, restarts, membership changes and
// leader transfers, and check what the clients saw.
//
// Every call a client makes to the store goes through a RecordingDriver,
// which records it in a historytest.Recorder with the time its request was
// sent and the time its answer came back; historytest.Check then checks
// the whole history exactly: no grant of a key while another client could
// still believe its own grant valid, fences strictly increasing. A
// Register, a resource that keeps the greatest fence written to it
// (package dlock/fence's rule), shows the same from the resource's side: a
// client writes only while its lease is valid by its own clock, so a write
// refused as stale then is a violation.
//
// The nemesis run (TestNemesis) lasts DLOCK_NEMESIS_DURATION (or
// -nemesis.duration; default 60s, the run make test does in CI).
package clustertest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server/historytest"
)

// RecordingDriver is a driver.Driver and driver.Waiter that records every
// TryAcquire, Wait, Renew and Release of the driver it wraps, as client
// Client, in a historytest.Recorder. Each call's Invoke is read just before
// the wrapped call and its Complete just after, so the recorded times
// bound what the root client measures from (it reads its clock before
// calling the driver): the checker's validity ends are at most a few
// microseconds later than the client's own, the strict side.
type RecordingDriver struct {
	d      driver.Driver
	w      driver.Waiter
	rec    *historytest.Recorder
	client int
}

var (
	_ driver.Driver            = (*RecordingDriver)(nil)
	_ driver.Waiter            = (*RecordingDriver)(nil)
	_ driver.UnconfirmedWaiter = (*RecordingDriver)(nil)
)

// Record returns a RecordingDriver over d, which must implement
// driver.Waiter too (dlockd's driver does), recording as client.
func Record(d driver.Driver, rec *historytest.Recorder, client int) (*RecordingDriver, error) {
	w, ok := d.(driver.Waiter)
	if !ok {
		return nil, fmt.Errorf("clustertest: driver %T does not implement driver.Waiter", d)
	}
	return &RecordingDriver{d: d, w: w, rec: rec, client: client}, nil
}

// outcome classifies a driver error: nil is OK, a refusal that leaves the
// client holding nothing new (ErrNotAcquired, ErrLeaseLost) is Failed, and
// anything else (a timeout, a broken connection, a cancelled call) may hide
// a success: Unknown.
func outcome(err error) historytest.Outcome {
	switch {
	case err == nil:
		return historytest.OK
	case errors.Is(err, driver.ErrNotAcquired), errors.Is(err, driver.ErrLeaseLost):
		return historytest.Failed
	}
	return historytest.Unknown
}

func note(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TryAcquire records an Acquire without wait.
func (r *RecordingDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	inv := r.rec.Now()
	g, err := r.d.TryAcquire(ctx, req)
	r.grant(req, inv, g, err, "try")
	return g, err
}

// Wait records an Acquire with wait (the wrapped Wait claims a handed-over
// grant before it returns, so no claim window applies to what it answers).
func (r *RecordingDriver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	inv := r.rec.Now()
	g, err := r.w.Wait(ctx, req)
	r.grant(req, inv, g, err, "wait")
	return g, err
}

// WaitUnconfirmed records an Acquire with wait whose handed-over grant may
// come unclaimed: its claim window (Grant.ConfirmWithin) is recorded as
// the Op's ClaimWithin, which bounds its validity until a renewal (as for
// every grant, the shorter of it and Grant.ValidFor: Grant.Window). Over a
// driver that is not a driver.UnconfirmedWaiter it is Wait.
func (r *RecordingDriver) WaitUnconfirmed(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	u, ok := r.w.(driver.UnconfirmedWaiter)
	if !ok {
		return r.Wait(ctx, req)
	}
	inv := r.rec.Now()
	g, err := u.WaitUnconfirmed(ctx, req)
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
		op.Note += ": " + note(err)
	}
	r.rec.Add(op)
}

// Renew records a Renew.
func (r *RecordingDriver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	inv := r.rec.Now()
	err := r.d.Renew(ctx, key, owner, ttl)
	r.rec.Add(historytest.Op{
		Client: r.client, Kind: historytest.Renew, Key: key, Owner: owner, TTL: ttl,
		Invoke: inv, Complete: r.rec.Now(), Outcome: outcome(err), Note: note(err),
	})
	return err
}

// Release records a Release (which ends the owner's validity at its send
// time, whatever the answer).
func (r *RecordingDriver) Release(ctx context.Context, key, owner string) error {
	inv := r.rec.Now()
	err := r.d.Release(ctx, key, owner)
	r.rec.Add(historytest.Op{
		Client: r.client, Kind: historytest.Release, Key: key, Owner: owner,
		Invoke: inv, Complete: r.rec.Now(), Outcome: outcome(err), Note: note(err),
	})
	return err
}

// Close closes the wrapped driver.
func (r *RecordingDriver) Close() error { return r.d.Close() }

// Inspect passes through to the wrapped driver's Inspector, unrecorded.
func (r *RecordingDriver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	in, ok := r.d.(driver.Inspector)
	if !ok {
		return driver.HolderInfo{}, errors.ErrUnsupported
	}
	return in.Inspect(ctx, key)
}

// List passes through to the wrapped driver's Inspector, unrecorded.
func (r *RecordingDriver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	in, ok := r.d.(driver.Inspector)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return in.List(ctx, prefix)
}

// OpenLocker opens the dlockd driver on storeURL (dlockd://h1:p1,h2:p2,...)
// and returns a dlock Locker over it whose store calls are recorded in rec
// as client. opts are the Locker's defaults. Close the Locker when done.
func OpenLocker(ctx context.Context, storeURL string, rec *historytest.Recorder, client int, opts ...dlock.Option) (*dlock.Locker, error) {
	u, err := url.Parse(storeURL)
	if err != nil {
		return nil, fmt.Errorf("clustertest: store URL %q: %w", storeURL, err)
	}
	d, err := dlockddriver.Open(ctx, u)
	if err != nil {
		return nil, err
	}
	rd, err := Record(d, rec, client)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return dlock.New(rd, append([]dlock.Option{dlock.WithStoreName("dlockd")}, opts...)...), nil
}

// ErrStaleWrite is returned by Register.Write for a fence smaller than the
// greatest the register has accepted for the key.
var ErrStaleWrite = errors.New("clustertest: stale fence")

// Register is a fenced register: per key, it accepts a write only with a
// fence at least the greatest it has accepted (as package dlock/fence's
// guarded writes do), and counts what it accepted and refused. It is safe
// for concurrent use.
type Register struct {
	mu       sync.Mutex
	max      map[string]uint64
	accepted int
	refused  int
}

// NewRegister returns an empty register.
func NewRegister() *Register { return &Register{max: map[string]uint64{}} }

// Write stores fence for key, or returns ErrStaleWrite (wrapped with the
// fences) when a greater fence was accepted before.
func (r *Register) Write(key string, fence uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.max[key]; fence < m {
		r.refused++
		return fmt.Errorf("%w: key %q fence %d < %d", ErrStaleWrite, key, fence, m)
	}
	r.max[key] = fence
	r.accepted++
	return nil
}

// Counts returns the writes accepted and refused so far.
func (r *Register) Counts() (accepted, refused int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted, r.refused
}
