package memdriver

import (
	"context"
	"fmt"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.Resumer = (*Driver)(nil)

// Resume implements driver.Resumer: grants of a Store outlive the Driver
// that made them (as a real store's outlive their client), so any Driver on
// the same Store can re-attach to one. In one step under the store's lock
// it checks that req.Owner holds req.Key by the grant of fence and renews
// it to a full req.TTL; otherwise it returns driver.ErrLeaseLost and
// changes nothing. The holder description is kept. The Driver resumes
// plain (Exclusive) grants only: a Shared grant (a permit, a read lock) is
// resumed through a view of its kind (SharedView), and a plain Driver does
// not find it (ErrLeaseLost), as on dlockd.
func (d *Driver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	return d.resume(ctx, req, fence, exclusive)
}

// resume is Resume of a grant of kind.
func (d *Driver) resume(ctx context.Context, req driver.AcquireRequest, fence uint64, kind driver.SharedKind) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("memdriver: resume: %w", err)
	}
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("memdriver: resume: %w: fence 0", driver.ErrInvalidArgument)
	}
	if err := d.lock(ctx); err != nil {
		return driver.Grant{}, err
	}
	defer d.s.mu.Unlock()
	e, g := d.s.holding(req.Key, req.Owner)
	switch {
	case g == nil:
		return driver.Grant{}, fmt.Errorf("memdriver: resume %q: %w (the owner holds no grant of it: expired, released or taken over)", req.Key, driver.ErrLeaseLost)
	case g.mode != kind.Mode || (kind.Mode == driver.Shared && e.limit != kind.Limit):
		return driver.Grant{}, fmt.Errorf("memdriver: resume %q: %w (the owner's grant is %s, not %s: resume it through the view that made it)", req.Key, driver.ErrLeaseLost, kindText(g.mode, e.limit), kindText(kind.Mode, kind.Limit))
	case g.fence != fence:
		return driver.Grant{}, fmt.Errorf("memdriver: resume %q: %w (the owner holds fence %d, not %d)", req.Key, driver.ErrLeaseLost, g.fence, fence)
	}
	d.s.renewGrant(g, req.TTL)
	return driver.Grant{Fence: g.fence}, nil
}

// kindText names a kind of grant, for messages.
func kindText(m driver.Mode, limit int) string {
	if m == driver.Shared {
		return fmt.Sprintf("a shared grant (limit %d)", limit)
	}
	return "a plain (exclusive) grant"
}
