package azblobdriver

import (
	"context"
	"fmt"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.Resumer = (*Driver)(nil)

// Resume implements driver.Resumer. A grant is a blob lease whose ID is
// derived from the owner token (LeaseID), so any process that has the
// token can renew it. Resume reads the blob's properties and requires the
// lease to be held (leased, not breaking, not expired) with the fence
// counter equal to fence; then it renews the lease by the owner's lease ID
// (Lease Blob, renew) conditioned on If-Match on the ETag it read, so a
// grant that changed in between (a new grant always writes the metadata)
// is refused. A blob that is not leased, another fence, a lease held by
// another ID, or a changed ETag is driver.ErrLeaseLost; in each case
// nothing is renewed (a resume refused after the renewal cannot happen:
// the renewal is the last step).
//
// Unlike Renew, Resume never renews a lease that has expired on the
// service, even one the service would still renew (Azure renews an expired
// lease by its ID while the blob is untouched): an expired grant is lost,
// as the contract says. (Azurite renews an expired lease whatever its ID,
// one more reason to look at the state first.)
//
// The service lease keeps the duration it was acquired with (the grant's
// TTL, see ServiceLease), so req.TTL must not be longer than the grant's
// service lease: a longer TTL would let the client trust the lease after
// the service ended it, and is driver.ErrInvalidTTL. The holder
// description stays as stored (rewriting it would change the ETag that
// the grant's chain of conditions relies on). A fence of 0 (never issued)
// is driver.ErrInvalidArgument.
func (d *Driver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("azblobdriver: resume: %w", err)
	}
	if _, err := leaseSeconds(req.TTL); err != nil {
		return driver.Grant{}, fmt.Errorf("azblobdriver: resume: %w", err)
	}
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("azblobdriver: resume: %w: fence 0 (no grant has it)", driver.ErrInvalidArgument)
	}
	if d.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	bc := d.c.NewBlobClient(blobName(req.Key))
	props, err := bc.GetProperties(ctx, nil)
	if err != nil {
		if bloberror.HasCode(err, lostCodes...) {
			return driver.Grant{}, driver.ErrLeaseLost
		}
		return driver.Grant{}, storeErr("resume", err)
	}
	if props.LeaseState == nil || *props.LeaseState != lease.StateTypeLeased || props.ETag == nil {
		return driver.Grant{}, driver.ErrLeaseLost
	}
	if f, err := fenceOf(props.Metadata); err != nil || f != fence {
		return driver.Grant{}, driver.ErrLeaseLost
	}
	hi := info(req.Key, props.Metadata)
	if hi.TTL > 0 {
		service, _ := ServiceLease(hi.TTL)
		if service > 0 && req.TTL > service {
			return driver.Grant{}, fmt.Errorf("azblobdriver: resume: %w: TTL %v is longer than the grant's service lease of %v (TTL %v): the lease keeps the duration it was acquired with",
				driver.ErrInvalidTTL, req.TTL, service, hi.TTL)
		}
	}
	lc, err := lease.NewBlobClient(bc, &lease.BlobClientOptions{LeaseID: to.Ptr(LeaseID(req.Owner))})
	if err != nil {
		return driver.Grant{}, fmt.Errorf("azblobdriver: resume: %w", err)
	}
	_, err = lc.RenewLease(ctx, &lease.BlobRenewOptions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: props.ETag}})
	if err != nil {
		if bloberror.HasCode(err, append(lostCodes, bloberror.ConditionNotMet)...) {
			return driver.Grant{}, driver.ErrLeaseLost
		}
		return driver.Grant{}, storeErr("resume", err)
	}
	return driver.Grant{Fence: fence}, nil
}
