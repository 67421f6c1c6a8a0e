package consuldriver

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.Resumer = (*Driver)(nil)

// Resume implements driver.Resumer. A grant is a Consul session (with a
// TTL on the servers, no health checks) that holds the key's entry, and a
// session can be renewed by any client that knows its ID, so a restarted
// process resumes its grant: Resume reads the entry, requires it to be
// held by a session, to name req.Owner, and to have been taken at fence
// (its ModifyIndex: the entry is never written while held); then it
// renews that session (PUT /v1/session/renew) and reads the entry again,
// as Renew does, to check that the same session still holds it at the
// same index. An entry that is missing, free, held for another owner or
// at another index is driver.ErrLeaseLost before anything is written; a
// session Consul no longer knows (404 on renew) or an entry that changed
// during the renewal is ErrLeaseLost too. The driver then knows the
// session, as if it had made the grant: Renew and Release work on it
// without reading the entry first.
//
// A session keeps the TTL it was created with, recorded in the entry:
// req.TTL longer than that TTL would let the client trust the grant after
// Consul may have ended it, and is driver.ErrInvalidTTL. The holder
// description stays as stored (the entry is never rewritten while held).
// A fence of 0 (never issued) is driver.ErrInvalidArgument.
func (d *Driver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("consuldriver: resume: %w", err)
	}
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("consuldriver: resume: %w: fence 0 (no grant has it)", driver.ErrInvalidArgument)
	}
	if d.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	lk := d.lockKey(req.Key)
	kv, _, err := d.read(ctx, lk)
	if err != nil {
		return driver.Grant{}, d.storeErr("resume", err)
	}
	if kv == nil || kv.Session == "" {
		return driver.Grant{}, fmt.Errorf("consuldriver: resume %q: %w (the key is not held)", req.Key, driver.ErrLeaseLost)
	}
	if kv.ModifyIndex != fence {
		return driver.Grant{}, fmt.Errorf("consuldriver: resume %q: %w (its grant has fence %d, not %d)", req.Key, driver.ErrLeaseLost, kv.ModifyIndex, fence)
	}
	rec, ok := decodeRecord(kv.Value)
	if !ok || rec.Owner != req.Owner {
		return driver.Grant{}, fmt.Errorf("consuldriver: resume %q: %w (another owner holds it)", req.Key, driver.ErrLeaseLost)
	}
	if granted := time.Duration(rec.TTLns); granted > 0 && req.TTL > granted {
		return driver.Grant{}, fmt.Errorf("consuldriver: resume: %w: TTL %v is longer than the grant's session TTL %v (a Consul session keeps the TTL it was created with)",
			driver.ErrInvalidTTL, req.TTL, granted)
	}
	id := kv.Session
	entry, _, err := d.sess.Renew(id, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return driver.Grant{}, d.storeErr("resume", err)
	}
	if entry == nil { // 404: the session has ended
		return driver.Grant{}, fmt.Errorf("consuldriver: resume %q: %w (its session %s has ended)", req.Key, driver.ErrLeaseLost, id)
	}
	kv, _, err = d.read(ctx, lk)
	if err != nil {
		return driver.Grant{}, d.storeErr("resume", err)
	}
	if kv == nil || kv.Session != id || kv.ModifyIndex != fence {
		return driver.Grant{}, fmt.Errorf("consuldriver: resume %q: %w (the grant ended during the resume)", req.Key, driver.ErrLeaseLost)
	}
	ttl := time.Duration(rec.TTLns)
	if ttl <= 0 {
		ttl = req.TTL
	}
	d.remember(req.Owner, id, ttl)
	return driver.Grant{Fence: fence}, nil
}
