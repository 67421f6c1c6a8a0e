package dynamodbdriver

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.Resumer = (*Driver)(nil)

// Resume implements driver.Resumer: Renew's write (a new record version
// and the lease req.TTL) conditioned on the item naming req.Owner AND
// holding fence, so a grant made by another process (the item is the
// whole grant; the driver keeps nothing a restart loses) is resumed by one
// conditional UpdateItem. A refused condition (the item names another
// owner or none: released, taken over; or another fence) is
// driver.ErrLeaseLost and writes nothing.
//
// As with Renew, a grant that went unrenewed past its TTL but that nobody
// took over is still the owner's on the item and is resumed: DynamoDB has
// no clock that ended it, and a waiter that has watched its record version
// for a lease takes over with a write conditioned on that version, which
// the resume's new version makes fail. The waiter then looks again from
// the new version, as it does after any renewal.
//
// req.Holder, when not empty, replaces the holder description; empty
// keeps the stored one. A fence of 0 (never issued) is
// driver.ErrInvalidArgument.
func (d *Driver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("dynamodbdriver: resume: %w", err)
	}
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("dynamodbdriver: resume: %w: fence 0 (no grant has it)", driver.ErrInvalidArgument)
	}
	if d.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	c := condOwner(req.Owner)
	c.expr += " AND #fence = :fence"
	c.values[":fence"] = unum(fence)
	expr := "SET #rvn = :rvn, #lease = :lease, #renewed = :now"
	values := map[string]types.AttributeValue{
		":rvn": str(newRVN()), ":lease": num(int64(req.TTL)), ":now": num(time.Now().UnixMilli()),
	}
	if req.Holder != "" {
		expr += ", #holder = :holder"
		values[":holder"] = str(req.Holder)
	}
	_, err := d.api.UpdateItem(ctx, d.update(req.Key, expr, c, values))
	if isConditionFailed(err) {
		return driver.Grant{}, driver.ErrLeaseLost
	}
	if err != nil {
		return driver.Grant{}, storeErr("resume", err)
	}
	d.seen.forget(req.Key)
	return driver.Grant{Fence: fence}, nil
}
