package pgdriver

import (
	"context"
	"fmt"
	"math"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/pgcommon"
)

var _ driver.Resumer = (*Driver)(nil)

// resumeSQL is Renew's owner-checked UPDATE with one more condition: the
// row's fence is the grant's. A new holder description replaces the old
// one only when one is given.
func (d *Driver) resumeSQL() string {
	return `UPDATE ` + d.table + ` SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond', ttl_us = $3,
	holder = CASE WHEN $5::text = '' THEN holder ELSE $5::text END
WHERE name = $1 AND owner = $2 AND fence = $4 AND expires_at > clock_timestamp()
RETURNING ` + pgcommon.SyncCommitOn
}

// Resume implements driver.Resumer: one UPDATE, owner- and fence-checked
// under the database's clock (… WHERE name = $key AND owner = $owner AND
// fence = $fence AND expires_at > clock_timestamp()), that extends the row
// to clock_timestamp() + req.TTL, as Renew does. A grant lives in the table,
// not in a connection, so any process may resume it. No matching row
// (released, expired by the database's clock, taken over, or another fence)
// is driver.ErrLeaseLost and changes nothing. The grant it returns is the
// one TryAcquire returns: Fence only (a lease table pushes no loss).
//
// req.Holder, when not empty, replaces the holder description (a restarted
// process has a new pid); empty keeps the stored one. A fence of 0 (never
// issued) is driver.ErrInvalidArgument.
func (d *Driver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("pgdriver: resume: %w", err)
	}
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("pgdriver: resume: %w: fence 0 (no grant has it)", driver.ErrInvalidArgument)
	}
	if fence > math.MaxInt64 {
		// The fence column is a bigint: no grant has this fence.
		return driver.Grant{}, fmt.Errorf("pgdriver: resume %q: %w (no grant has fence %d)", req.Key, driver.ErrLeaseLost, fence)
	}
	if err := d.ensure(ctx); err != nil {
		return driver.Grant{}, err
	}
	tag, err := d.db.Exec(ctx, d.resumeSQL(), req.Key, req.Owner, micros(req.TTL), int64(fence), req.Holder)
	if err != nil {
		return driver.Grant{}, storeErr("resume", err)
	}
	if tag.RowsAffected() == 0 {
		return driver.Grant{}, fmt.Errorf("pgdriver: resume %q: %w (the owner holds no live grant of it with fence %d: expired, released, taken over, or another fence)", req.Key, driver.ErrLeaseLost, fence)
	}
	return driver.Grant{Fence: fence}, nil
}
