package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

var (
	_ driver.SharedLocker = (*FaultDriver)(nil)
	_ driver.Resumer      = (*FaultDriver)(nil)
	_ driver.KeyWatcher   = (*FaultDriver)(nil)
)

// SharedView implements driver.SharedLocker: it returns the wrapped
// driver's view of kind, wrapped so that this FaultDriver's injectors and
// counters apply to its calls. The view has the Waiter and Inspector
// capabilities of the wrapped view (not Waiter when the FaultDriver was
// built by WithoutWaiter). When the wrapped driver is no SharedLocker it
// returns an error matching errors.ErrUnsupported; an invalid kind is
// ErrInvalidArgument (driver.SharedKind.Check), whatever the driver.
func (f *FaultDriver) SharedView(kind driver.SharedKind) (driver.Driver, error) {
	if err := kind.Check(); err != nil {
		return nil, fmt.Errorf("dlocktest: shared view: %w", err)
	}
	sl, ok := f.inner.(driver.SharedLocker)
	if !ok {
		return nil, fmt.Errorf("dlocktest: shared view: the wrapped driver %T keeps no shared grants: %w", f.inner, errors.ErrUnsupported)
	}
	v, err := sl.SharedView(kind)
	if err != nil {
		return nil, err
	}
	fv := &faultView{f: f, inner: v}
	_, w := v.(driver.Waiter)
	_, i := v.(driver.Inspector)
	w = w && !f.noWaiter
	switch {
	case w && i:
		return &faultViewFull{fv}, nil
	case w:
		return &faultViewWaiter{fv}, nil
	case i:
		return &faultViewInspector{fv}, nil
	}
	return fv, nil
}

// Resume implements driver.Resumer by forwarding to the wrapped driver,
// through the injectors (a resume is a renewal: BlockRenewals blocks it),
// or returns an error matching errors.ErrUnsupported when the wrapped
// driver is no Resumer.
func (f *FaultDriver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	return f.resume(ctx, f.inner, req, fence)
}

func (f *FaultDriver) resume(ctx context.Context, inner driver.Driver, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	r, ok := inner.(driver.Resumer)
	if !ok {
		return driver.Grant{}, fmt.Errorf("dlocktest: resume: the wrapped driver %T cannot resume a grant: %w", inner, errors.ErrUnsupported)
	}
	if err := f.before(ctx); err != nil {
		return driver.Grant{}, err
	}
	if blocked, err := f.renewBlocked(ctx, req.Key); blocked {
		return driver.Grant{}, err
	}
	return r.Resume(ctx, req, fence)
}

// WatchKey implements driver.KeyWatcher by forwarding to the wrapped
// driver (CutOff, Delay and Freeze apply to the start of the watch), or
// returns an error matching errors.ErrUnsupported when the wrapped driver
// is no KeyWatcher.
func (f *FaultDriver) WatchKey(ctx context.Context, key string) (<-chan struct{}, error) {
	kw, ok := f.inner.(driver.KeyWatcher)
	if !ok {
		return nil, fmt.Errorf("dlocktest: watch: the wrapped driver %T cannot watch a key: %w", f.inner, errors.ErrUnsupported)
	}
	if err := f.before(ctx); err != nil {
		return nil, err
	}
	return kw.WatchKey(ctx, key)
}

// faultView is a shared view of the wrapped driver, whose calls go through
// its FaultDriver's injectors.
type faultView struct {
	f     *FaultDriver
	inner driver.Driver
}

type faultViewWaiter struct{ *faultView }
type faultViewInspector struct{ *faultView }
type faultViewFull struct{ *faultView }

func (v *faultView) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return v.f.tryAcquire(ctx, v.inner, req)
}

func (v *faultView) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	return v.f.renew(ctx, v.inner, key, owner, ttl)
}

func (v *faultView) Release(ctx context.Context, key, owner string) error {
	return v.f.release(ctx, v.inner, key, owner)
}

// Resume forwards to the wrapped view when it is a Resumer, else returns
// an error matching errors.ErrUnsupported.
func (v *faultView) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	return v.f.resume(ctx, v.inner, req, fence)
}

// Close closes the wrapped view (which closes nothing of its parent).
func (v *faultView) Close() error { return v.inner.Close() }

func (v *faultViewWaiter) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return v.f.waitVia(ctx, v.inner, req, false)
}

// WaitUnconfirmed implements driver.UnconfirmedWaiter: the wrapped view's,
// through the faults (its Wait when it has none).
func (v *faultViewWaiter) WaitUnconfirmed(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return v.f.waitVia(ctx, v.inner, req, true)
}

func (v *faultViewFull) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return v.f.waitVia(ctx, v.inner, req, false)
}

// WaitUnconfirmed implements driver.UnconfirmedWaiter (see faultViewWaiter's).
func (v *faultViewFull) WaitUnconfirmed(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return v.f.waitVia(ctx, v.inner, req, true)
}

func (v *faultViewFull) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	return v.f.inspectVia(ctx, v.inner, key)
}

func (v *faultViewFull) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	return v.f.listVia(ctx, v.inner, prefix)
}

func (v *faultViewInspector) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	return v.f.inspectVia(ctx, v.inner, key)
}

func (v *faultViewInspector) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	return v.f.listVia(ctx, v.inner, prefix)
}
