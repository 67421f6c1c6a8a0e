package dlock

import (
	"context"

	"github.com/dlock-dev/dlock/driver"
)

// View returns a Locker that acquires through d with l's defaults (the
// options l was made with, its store name and address in errors, its
// observer), and that ends with l: closing l closes the view (its leases
// end with ErrClosed) before l's driver is closed. d is a view of l's store
// made by l's driver, such as a driver.SharedLocker's SharedView; the
// recipes in dlock/recipe use it to give shared grants (semaphore permits,
// read locks) the heartbeat, validity deadline and fence of every Lease.
//
// Closing the view ends its own leases but closes neither d nor l. When l
// is already closed, the view is returned closed: its calls return
// ErrClosed.
func (l *Locker) View(d driver.Driver) *Locker {
	ctx, cancel := context.WithCancelCause(context.Background())
	v := &Locker{
		drv: d, store: l.store, addr: l.addr, opts: l.opts,
		closeCtx: ctx, closeCancel: cancel,
		leases: map[*Lease]struct{}{},
		parent: l,
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		v.closed = true
		cancel(ErrClosed)
		return v
	}
	if l.views == nil {
		l.views = map[*Locker]struct{}{}
	}
	l.views[v] = struct{}{}
	l.mu.Unlock()
	return v
}
