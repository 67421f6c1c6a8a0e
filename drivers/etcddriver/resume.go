package etcddriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.Resumer = (*Driver)(nil)

// Resume implements driver.Resumer. Each grant has an etcd lease of its
// own (not a client session's), and any client may keep a lease alive by
// its ID, so a restarted process resumes its grant by the lease ID the
// entry names. Resume reads, in one transaction conditioned on the entry
// <prefix>/.locks/<key>/<owner> having create revision fence, that entry
// and the key's first entry by create revision: the entry must exist with
// that revision and be the holder (the first), not a waiter. Then it
// renews the entry's lease (KeepAliveOnce, which restores the TTL the
// lease was granted with) and reads the entry back, as Renew does. A
// missing entry, another revision, an entry that is still a waiter, a
// reader's entry (a read lock of the rwlock recipe: the Driver resumes
// plain locks only, and a read lock shares its key), or a lease etcd no
// longer knows is driver.ErrLeaseLost; the refusals before the keepalive
// write nothing.
//
// The resumed grant is tracked as a fresh one: Grant.Lost is closed when
// the entry is deleted (lease expired or revoked, entry deleted), by the
// same watch, and Release deletes the entry conditioned on its revision
// and revokes the lease. Resuming a grant this driver already tracks
// returns the same Lost channel.
//
// The lease keeps the TTL it was granted with (the grant's TTL, in whole
// seconds rounded up, recorded in the entry): req.TTL longer than that
// would let the client trust the grant after etcd may have ended it, and
// is driver.ErrInvalidTTL. The holder description stays as stored. A
// fence of 0 (never issued) is driver.ErrInvalidArgument.
func (d *Driver) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	if d.isClosed() {
		return driver.Grant{}, storeErr("resume", driver.ErrClosed)
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, storeErr("resume", err)
	}
	if fence == 0 {
		return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: fence 0 (no grant has it)", driver.ErrInvalidArgument))
	}
	if fence > math.MaxInt64 {
		return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: no revision is %d", driver.ErrLeaseLost, fence))
	}
	rev := int64(fence)
	k := d.entry(req.Key, req.Owner)
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", rev)).
		Then(clientv3.OpGet(k), clientv3.OpGet(d.dir(req.Key), append(clientv3.WithFirstCreate(), clientv3.WithPrefix(), clientv3.WithKeysOnly())...)).
		Commit()
	if err != nil {
		return driver.Grant{}, storeErr("resume", err)
	}
	if !resp.Succeeded {
		return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: no entry of the owner with create revision %d", driver.ErrLeaseLost, rev))
	}
	own := resp.Responses[0].GetResponseRange().Kvs
	first := resp.Responses[1].GetResponseRange().Kvs
	if len(own) == 0 || len(first) == 0 {
		return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: entry vanished", driver.ErrLeaseLost))
	}
	if string(first[0].Key) != k {
		return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: the owner's entry is a waiter, not the holder", driver.ErrLeaseLost))
	}
	id := clientv3.LeaseID(own[0].Lease)
	if id == 0 {
		return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: the entry has no lease", driver.ErrLeaseLost))
	}
	var v sharedValue
	if json.Unmarshal(own[0].Value, &v) == nil && v.Mode == sharedMode {
		return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: the owner's entry is a read lock's (a shared grant), not a plain lock's", driver.ErrLeaseLost))
	}
	if v.TTL > 0 {
		if granted := time.Duration(leaseSeconds(v.TTL)) * time.Second; req.TTL > granted {
			return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: TTL %v is longer than the grant's etcd lease of %v (a lease keeps the TTL it was granted with)",
				driver.ErrInvalidTTL, req.TTL, granted))
		}
	}
	if _, err := d.cli.KeepAliveOnce(ctx, id); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: etcd lease %x not found", driver.ErrLeaseLost, int64(id)))
		}
		return driver.Grant{}, storeErr("resume", err)
	}
	back, err := d.cli.Get(ctx, k)
	if err != nil {
		return driver.Grant{}, storeErr("resume", err)
	}
	if len(back.Kvs) == 0 || back.Kvs[0].CreateRevision != rev {
		return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: entry deleted", driver.ErrLeaseLost))
	}
	return d.track(k, id, rev)
}

// track records a resumed grant and starts its loss watcher, as granted
// does for a new one (but a driver closed meanwhile leaves the lease
// alone: the grant is the caller's, resumed elsewhere perhaps).
func (d *Driver) track(k string, id clientv3.LeaseID, rev int64) (driver.Grant, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return driver.Grant{}, storeErr("resume", driver.ErrClosed)
	}
	if old, ok := d.grants[k]; ok && old.fence == rev {
		d.mu.Unlock()
		return driver.Grant{Fence: uint64(rev), Lost: old.lost}, nil
	}
	ctx, cancel := context.WithCancel(d.closeCtx)
	g := &grant{lease: id, fence: rev, lost: make(chan struct{}), cancel: cancel}
	d.grants[k] = g
	d.wg.Add(1)
	d.mu.Unlock()
	go d.watchLoss(ctx, k, g)
	return driver.Grant{Fence: uint64(rev), Lost: g.lost}, nil
}
