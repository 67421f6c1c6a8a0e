package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// ErrCutOff is the store error a FaultDriver returns while it is cut off, as
// a dropped network would.
var ErrCutOff = errors.New("dlocktest: driver cut off from the store")

// FaultDriver wraps a driver and injects faults into its calls, the way
// pebble's errorfs wraps a filesystem. Faults compose: each injector can be
// switched on and off while the driver is in use, and each one logs its plan
// through the Logf given to NewFaultDriver. It forwards the wrapped driver's
// optional capabilities Waiter and Inspector (not Hinter: hints only
// shorten waits) unless built with WithoutWaiter.
//
// It also forwards driver.SharedLocker, driver.Resumer and
// driver.KeyWatcher, always implementing them: when the wrapped driver
// lacks one, the call returns an error matching errors.ErrUnsupported, as a
// store without the capability does. A view returned by SharedView goes
// through the same injectors (BlockRenewals, BlockRenewalsOf, CutOff,
// Delay, Freeze, DropReleaseReplies) and counters (Refused, Waiting) as the
// FaultDriver's own calls, and Faults of the view returns the FaultDriver.
type FaultDriver struct {
	inner driver.Driver
	logf  func(format string, args ...any)

	mu          sync.Mutex
	blockRenew  bool
	blockKeys   map[string]bool // renewals of these keys only are blocked
	cut         bool
	delay       time.Duration
	dropRelease bool
	frozen      chan struct{}  // non-nil while frozen; closed by the thaw
	noWaiter    bool           // built by WithoutWaiter: views hide Waiter too
	refused     map[string]int // TryAcquire answers of ErrNotAcquired, by key
	waiting     map[string]int // Wait calls in flight, by key
}

// NewFaultDriver wraps d. logf (for example t.Logf) receives each
// injector's plan; nil discards it.
func NewFaultDriver(d driver.Driver, logf func(format string, args ...any)) driver.Driver {
	f := &FaultDriver{inner: d, logf: logf}
	if f.logf == nil {
		f.logf = func(string, ...any) {}
	}
	return f.withCapabilities()
}

// Faults returns the FaultDriver behind a driver made by NewFaultDriver or
// WithoutWaiter, or nil.
func Faults(d driver.Driver) *FaultDriver {
	switch x := d.(type) {
	case *FaultDriver:
		return x
	case *faultWaiter:
		return x.FaultDriver
	case *faultFull:
		return x.FaultDriver
	case *faultInspector:
		return x.FaultDriver
	case *faultView:
		return x.f
	case *faultViewWaiter:
		return x.f
	case *faultViewInspector:
		return x.f
	case *faultViewFull:
		return x.f
	}
	return nil
}

// WithoutWaiter wraps d so that it hides the Waiter capability: the root
// package then waits by backoff polling. Used to run the suite over both
// waiting paths of one store.
func WithoutWaiter(d driver.Driver) driver.Driver {
	f := &FaultDriver{inner: d, logf: func(string, ...any) {}, noWaiter: true}
	if _, ok := d.(driver.Inspector); ok {
		return &faultInspector{f}
	}
	return f
}

type faultWaiter struct{ *FaultDriver }
type faultInspector struct{ *FaultDriver }
type faultFull struct{ *FaultDriver }

func (f *FaultDriver) withCapabilities() driver.Driver {
	_, w := f.inner.(driver.Waiter)
	_, i := f.inner.(driver.Inspector)
	switch {
	case w && i:
		return &faultFull{f}
	case w:
		return &faultWaiter{f}
	case i:
		return &faultInspector{f}
	}
	return f
}

// BlockRenewals makes every renewal hang until its context ends (a store
// that stops answering one client's heartbeats), or undoes it.
func (f *FaultDriver) BlockRenewals(on bool) {
	f.mu.Lock()
	f.blockRenew = on
	f.mu.Unlock()
	f.logf("faults: renewals %s", onOff(on, "blocked until their context ends", "pass through"))
}

// BlockRenewalsOf makes the renewals of key alone hang until their context
// ends, or undoes it; the driver's other keys renew as usual (one member of
// a set losing its lease).
func (f *FaultDriver) BlockRenewalsOf(key string, on bool) {
	f.mu.Lock()
	if f.blockKeys == nil {
		f.blockKeys = map[string]bool{}
	}
	if on {
		f.blockKeys[key] = true
	} else {
		delete(f.blockKeys, key)
	}
	f.mu.Unlock()
	f.logf("faults: renewals of %q %s", key, onOff(on, "blocked until their context ends", "pass through"))
}

// Refused returns how many TryAcquire calls on key the store answered with
// ErrNotAcquired: a polling acquisition has found the key held at least that
// many times.
func (f *FaultDriver) Refused(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused[key]
}

// Waiting returns how many Wait calls on key are in flight in the store
// driver (a waiter queued by the store, or on its way to be).
func (f *FaultDriver) Waiting(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiting[key]
}

// CutOff makes every call fail at once with ErrCutOff (a partition between
// this client and the store), or undoes it.
func (f *FaultDriver) CutOff(on bool) {
	f.mu.Lock()
	f.cut = on
	f.mu.Unlock()
	f.logf("faults: driver %s", onOff(on, "cut off from the store", "reconnected"))
}

// Delay adds d before every call (zero removes it).
func (f *FaultDriver) Delay(d time.Duration) {
	f.mu.Lock()
	f.delay = d
	f.mu.Unlock()
	f.logf("faults: every call delayed by %v", d)
}

// DropReleaseReplies makes Release perform the release on the store but
// report a store error, as if the reply was lost, or undoes it.
func (f *FaultDriver) DropReleaseReplies(on bool) {
	f.mu.Lock()
	f.dropRelease = on
	f.mu.Unlock()
	f.logf("faults: release replies %s", onOff(on, "dropped after the store acted", "delivered"))
}

// Freeze makes every call hang (a client process paused by SIGSTOP or a
// long GC, with its requests in flight) until Freeze(false) thaws it, when
// each hung call goes on to the store late, as a resumed process's would;
// a call whose context ends first returns its error without reaching the
// store.
func (f *FaultDriver) Freeze(on bool) {
	f.mu.Lock()
	switch {
	case on && f.frozen == nil:
		f.frozen = make(chan struct{})
	case !on && f.frozen != nil:
		close(f.frozen)
		f.frozen = nil
	}
	f.mu.Unlock()
	f.logf("faults: driver %s", onOff(on, "frozen: calls hang until thawed", "thawed: hung calls go on to the store"))
}

func onOff(on bool, yes, no string) string {
	if on {
		return yes
	}
	return no
}

func (f *FaultDriver) before(ctx context.Context) error {
	f.mu.Lock()
	cut, delay, frozen := f.cut, f.delay, f.frozen
	f.mu.Unlock()
	if frozen != nil {
		select {
		case <-frozen:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if cut {
		return ErrCutOff
	}
	return nil
}

// TryAcquire implements driver.Driver.
func (f *FaultDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return f.tryAcquire(ctx, f.inner, req)
}

func (f *FaultDriver) tryAcquire(ctx context.Context, inner driver.Driver, req driver.AcquireRequest) (driver.Grant, error) {
	if err := f.before(ctx); err != nil {
		return driver.Grant{}, err
	}
	g, err := inner.TryAcquire(ctx, req)
	if errors.Is(err, driver.ErrNotAcquired) {
		f.mu.Lock()
		if f.refused == nil {
			f.refused = map[string]int{}
		}
		f.refused[req.Key]++
		f.mu.Unlock()
	}
	return g, err
}

// Renew implements driver.Driver.
func (f *FaultDriver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	return f.renew(ctx, f.inner, key, owner, ttl)
}

// renewBlocked hangs until ctx ends when renewals of key are blocked, and
// reports whether they were.
func (f *FaultDriver) renewBlocked(ctx context.Context, key string) (bool, error) {
	f.mu.Lock()
	block := f.blockRenew || f.blockKeys[key]
	f.mu.Unlock()
	if !block {
		return false, nil
	}
	<-ctx.Done()
	return true, fmt.Errorf("dlocktest: renewal blocked: %w", ctx.Err())
}

func (f *FaultDriver) renew(ctx context.Context, inner driver.Driver, key, owner string, ttl time.Duration) error {
	if err := f.before(ctx); err != nil {
		return err
	}
	if blocked, err := f.renewBlocked(ctx, key); blocked {
		return err
	}
	return inner.Renew(ctx, key, owner, ttl)
}

// Release implements driver.Driver.
func (f *FaultDriver) Release(ctx context.Context, key, owner string) error {
	return f.release(ctx, f.inner, key, owner)
}

func (f *FaultDriver) release(ctx context.Context, inner driver.Driver, key, owner string) error {
	if err := f.before(ctx); err != nil {
		return err
	}
	err := inner.Release(ctx, key, owner)
	f.mu.Lock()
	drop := f.dropRelease
	f.mu.Unlock()
	if drop {
		return fmt.Errorf("dlocktest: release reply lost (store said %v)", err)
	}
	return err
}

// Close implements driver.Driver.
func (f *FaultDriver) Close() error { return f.inner.Close() }

// Inner returns the wrapped driver.
func (f *FaultDriver) Inner() driver.Driver { return f.inner }

func (f *FaultDriver) wait(ctx context.Context, req driver.AcquireRequest, unconfirmed bool) (driver.Grant, error) {
	return f.waitVia(ctx, f.inner, req, unconfirmed)
}

// waitVia waits on inner through the faults; unconfirmed calls inner's
// WaitUnconfirmed when it has one (driver.UnconfirmedWaiter), and its Wait
// otherwise (a grant that needs no confirmation is a valid answer of
// WaitUnconfirmed).
func (f *FaultDriver) waitVia(ctx context.Context, inner driver.Driver, req driver.AcquireRequest, unconfirmed bool) (driver.Grant, error) {
	if err := f.before(ctx); err != nil {
		return driver.Grant{}, err
	}
	f.mu.Lock()
	if f.waiting == nil {
		f.waiting = map[string]int{}
	}
	f.waiting[req.Key]++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.waiting[req.Key]--
		f.mu.Unlock()
	}()
	if u, ok := inner.(driver.UnconfirmedWaiter); ok && unconfirmed {
		return u.WaitUnconfirmed(ctx, req)
	}
	return inner.(driver.Waiter).Wait(ctx, req)
}

func (f *FaultDriver) inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	return f.inspectVia(ctx, f.inner, key)
}

func (f *FaultDriver) inspectVia(ctx context.Context, inner driver.Driver, key string) (driver.HolderInfo, error) {
	if err := f.before(ctx); err != nil {
		return driver.HolderInfo{}, err
	}
	return inner.(driver.Inspector).Inspect(ctx, key)
}

func (f *FaultDriver) list(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	return f.listVia(ctx, f.inner, prefix)
}

func (f *FaultDriver) listVia(ctx context.Context, inner driver.Driver, prefix string) ([]driver.HolderInfo, error) {
	if err := f.before(ctx); err != nil {
		return nil, err
	}
	return inner.(driver.Inspector).List(ctx, prefix)
}

func (f *faultWaiter) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return f.wait(ctx, req, false)
}

// WaitUnconfirmed implements driver.UnconfirmedWaiter: the wrapped
// driver's, through the faults (its Wait when it has none).
func (f *faultWaiter) WaitUnconfirmed(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return f.wait(ctx, req, true)
}
func (f *faultFull) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return f.wait(ctx, req, false)
}

// WaitUnconfirmed implements driver.UnconfirmedWaiter (see faultWaiter's).
func (f *faultFull) WaitUnconfirmed(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return f.wait(ctx, req, true)
}
func (f *faultFull) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	return f.inspect(ctx, key)
}
func (f *faultFull) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	return f.list(ctx, prefix)
}
func (f *faultInspector) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	return f.inspect(ctx, key)
}
func (f *faultInspector) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	return f.list(ctx, prefix)
}

// OpenFaulty opens a Locker on the store named by rawURL, as dlock.Open
// does, with its driver wrapped in a FaultDriver, and returns both. Examples
// and tests use it to freeze one client's heartbeats (a GC pause, SIGSTOP) or
// cut it off from a real store.
func OpenFaulty(ctx context.Context, rawURL string, opts ...dlock.Option) (*dlock.Locker, *FaultDriver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("dlocktest: open %q: %w", rawURL, err)
	}
	open, err := driver.Lookup(u.Scheme)
	if err != nil {
		return nil, nil, err
	}
	d, err := open(ctx, u)
	if err != nil {
		return nil, nil, fmt.Errorf("dlocktest: open %s: %w", u.Redacted(), err)
	}
	fd := NewFaultDriver(d, nil)
	l := dlock.New(fd, append([]dlock.Option{dlock.WithStoreName(u.Scheme)}, opts...)...)
	return l, Faults(fd), nil
}
