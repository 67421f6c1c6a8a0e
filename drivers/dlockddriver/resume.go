package dlockddriver

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/driver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

var _ driver.Resumer = (*Driver)(nil)

// Resume implements driver.Resumer. dlockd's grants live in the server's
// replicated state, not in the client's connection or session, so another
// Driver (a restarted process) can re-attach to one while it is held.
// Three steps:
//
//  0. An Inspect of the key (a linearizable read): driver.ErrLeaseLost,
//     having changed nothing, when the key holds no grant of fence of the
//     kind asked (a plain lock for the Driver, a Shared grant of the
//     view's limit for a SharedView), so that a token for an ended or
//     another grant never renews anything. Without the read permission on
//     the key (PERMISSION_DENIED) this check is skipped: the steps below
//     still refuse such a token, after renewing the owner token's own
//     grant, if it holds one.
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
	if err := d.resumeCheck(ctx, req.Key, fence, grantKind{}); err != nil {
		return driver.Grant{}, err
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

// resumeCheck is step 0 of Resume: nil when key holds a grant of fence of
// kind k (or when the caller may not read the key, and the check is left to
// the owner-checked steps), else driver.ErrLeaseLost; it changes nothing.
func (d *Driver) resumeCheck(ctx context.Context, key string, fence uint64, k grantKind) error {
	var resp *dlockv1.InspectResponse
	_, err := d.call(ctx, callOpts{}, func(ctx context.Context, c dlockv1.LockClient) (err error) {
		resp, err = c.Inspect(ctx, &dlockv1.InspectRequest{Key: key})
		return err
	})
	if err != nil {
		if c := status.Code(err); c == codes.PermissionDenied || c == codes.Unauthenticated {
			return nil
		}
		return mapErr(ctx, "resume", key, err)
	}
	lost := func(why string) error {
		return fmt.Errorf("dlockd: resume %q: %w (%s; nothing was changed)", key, driver.ErrLeaseLost, why)
	}
	if !resp.GetHeld() {
		return lost("the key is not held")
	}
	info := resp.GetInfo()
	switch {
	case !k.shared && info.GetShared():
		return lost("the key holds shared grants (permits or read locks), not a plain lock: resume it through the view that made it")
	case k.shared && !info.GetShared():
		return lost("the key is held by a plain (exclusive) lock, not by shared grants")
	case k.shared && info.GetLimit() != k.limit:
		return lost(fmt.Sprintf("the key's shared grants have limit %d, not %d", info.GetLimit(), k.limit))
	case !k.shared:
		if info.GetFence() != fence {
			return lost(fmt.Sprintf("its grant has fence %d, not %d", info.GetFence(), fence))
		}
		return nil
	}
	if info.GetFence() == fence {
		return nil
	}
	for _, g := range resp.GetGrants() {
		if g.GetFence() == fence {
			return nil
		}
	}
	if int(info.GetHolders()) > len(resp.GetGrants()) {
		return nil // not all grants listed: the owner-checked steps decide
	}
	return lost(fmt.Sprintf("no grant of fence %d among its %d shared grants", fence, info.GetHolders()))
}
