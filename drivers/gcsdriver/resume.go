package gcsdriver

import (
	"context"
	"fmt"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.Resumer = (*Driver)(nil)

// Resume implements driver.Resumer. The record is the whole grant (the
// driver's memory of its own grants only saves a read), so any process
// resumes it: Resume reads the record, and when it names req.Owner with
// fence, writes it again as Renew does (a new version, the TTL req.TTL)
// conditioned on the generation it read; on 412 it reads again (at most
// three rounds, as Renew). A record that names another owner or none
// (released, taken over), another fence, or no record at all, is
// driver.ErrLeaseLost, and nothing is written. From then on the driver's
// Renew and Release of the grant start from the generation it wrote.
//
// As with Renew, a grant left unrenewed past its TTL that nobody took over
// is still the owner's on the record and is resumed: a waiter that has
// watched its version for a TTL takes over with a write conditioned on
// that generation, which the resume's write makes fail.
//
// req.Holder, when not empty, replaces the holder description; empty
// keeps the stored one. A fence of 0 (never issued) is
// driver.ErrInvalidArgument.
func (d *Driver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("gcsdriver: resume: %w", err)
	}
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("gcsdriver: resume: %w: fence 0 (no grant has it)", driver.ErrInvalidArgument)
	}
	ctx, done, err := d.call(ctx)
	if err != nil {
		return driver.Grant{}, err
	}
	defer done()
	id := grantID{req.Key, req.Owner}
	for range maxRewrites {
		rec, found, err := d.read(ctx, req.Key)
		if err != nil {
			return driver.Grant{}, d.storeErr("resume", req.Key, err)
		}
		if !found || rec.owner != req.Owner || rec.fence != fence {
			d.forget(id)
			return driver.Grant{}, driver.ErrLeaseLost
		}
		holder := rec.holder
		if req.Holder != "" {
			holder = req.Holder
		}
		newGen, err := d.write(ctx, req.Key, rec.generation, grantMeta(req.Key, req.Owner, fence, req.TTL, holder))
		if err == nil {
			d.obs.Forget(req.Key)
			d.mu.Lock()
			d.held[id] = grantState{generation: newGen, fence: fence, holder: holder}
			d.mu.Unlock()
			return driver.Grant{Fence: fence}, nil
		}
		if !preconditionFailed(err) {
			return driver.Grant{}, d.storeErr("resume", req.Key, err)
		}
	}
	return driver.Grant{}, fmt.Errorf("gcsdriver: resume %q: the record changed under its owner %d times in a row", req.Key, maxRewrites)
}
