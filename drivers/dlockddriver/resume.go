package dlockddriver

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.Resumer = (*Driver)(nil)

// Resume implements driver.Resumer. dlockd's grants live in the server's
// replicated state, not in the client's connection or session, so another
// Driver (a restarted process) can re-attach to one while it is held. Two
// steps, both needing only the lock permission on the key:
//
//  1. Renew(req.Owner) to a full req.TTL: driver.ErrLeaseLost when the
//     owner token no longer holds the key (expired, released, force-released,
//     taken over), having changed nothing.
//  2. The holder's repeated acquisition (as a retry after a lost answer is):
//     the server answers the grant's own fence and restarts its TTL through
//     the log, and the request carries this Driver's session, to which the
//     server rebinds the grant (server/doc.go), so that the grant's later
//     loss (expiry, force release) is pushed on this Driver's Watch stream
//     and Grant.Lost closes, as for a fresh grant. (A dlockd older than
//     the rebind keeps pushing to the dead process's session: the resumed
//     grant's loss is then found by renewals and the validity deadline.)
//
// When the answered fence is not fence, the owner token holds another
// grant than the one named (a token altered by hand: owner tokens are unique
// per grant), and Resume returns driver.ErrLeaseLost, leaving that grant as
// it was (renewed). One race is left: a grant force-released between the
// two steps makes step 2 a fresh grant of the key to the same owner token,
// which Resume then reports as ErrLeaseLost too and leaves to expire by
// its TTL (as a crashed client's grant would), since it cannot tell it from
// the first case without the read permission.
func (d *Driver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	if d.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("dlockd: resume: %w", err)
	}
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("dlockd: resume: %w: fence 0", driver.ErrInvalidArgument)
	}
	if err := d.Renew(ctx, req.Key, req.Owner, req.TTL); err != nil {
		return driver.Grant{}, err
	}
	g, err := d.TryAcquire(ctx, req)
	switch {
	case errors.Is(err, driver.ErrNotAcquired):
		// Ended between the steps, and someone else holds the key now.
		return driver.Grant{}, fmt.Errorf("%w (the grant ended while it was being resumed)", driver.ErrLeaseLost)
	case err != nil:
		return driver.Grant{}, err
	case g.Fence != fence:
		d.forget(req.Key, req.Owner)
		return driver.Grant{}, fmt.Errorf("%w (the owner token's grant has fence %d, not %d)", driver.ErrLeaseLost, g.Fence, fence)
	}
	return g, nil
}
