package etcddriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-dev/dlock/driver"
)

var _ driver.Resumer = (*Driver)(nil)

// Resume implements driver.Resumer. A restarted process resumes its grant
// by putting its entry on its own shared lease (see the package doc).
// Resume reads, in one transaction conditioned on the entry
// <prefix>/.locks/<key>/<owner> having create revision fence, that entry
// and the key's first entry by create revision: the entry must exist with
// that revision and be the holder (the first), not a waiter. Then it
// renews the entry's lease (KeepAliveOnce, which restores the TTL the
// lease was granted with) and reads the entry back, as Renew does. A
// missing entry, another revision, an entry that is still a waiter, a
// reader's entry (a read lock of the rwlock recipe: the Driver resumes
// plain locks only, and a read lock shares its key), or an entry gone with
// its lease is driver.ErrLeaseLost; the refusals before the move write
// nothing. The move is a put of the entry on this driver's shared lease for
// req.TTL (confirmed alive by a keepalive sent after the call began),
// conditioned on the entry's create revision, which the put keeps: the
// fence stays. The stopped process's lease no longer holds the grant; if
// that process is in fact still running, its Renew renews the lease the
// entry is on now, and its driver stops expiring the grant.
//
// The resumed grant is tracked as a fresh one: Grant.Lost is closed when
// the entry is deleted (lease expired or revoked, entry deleted), by the
// same watch, and Release deletes the entry conditioned on its revision
// and revokes the lease. Resuming a grant this driver already tracks
// returns the same Lost channel.
//
// req.TTL longer than the grant's TTL (recorded in the entry) is
// driver.ErrInvalidTTL, as when each grant kept the lease it was granted
// with; the resumed entry records req.TTL. The holder description stays as stored. A
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
	// Move the entry to this driver's shared lease for req.TTL (a put
	// conditioned on the create revision, which it keeps), once that lease
	// is confirmed alive from now: the old lease (the stopped process's)
	// then holds nothing of this grant.
	sl, err := d.useLease(ctx, req.TTL)
	if errors.Is(err, errClosed) {
		err = driver.ErrClosed
	}
	if err != nil {
		return driver.Grant{}, storeErr("resume", err)
	}
	if err := sl.keepAlive(ctx); err != nil {
		sl.unuse()
		if errors.Is(err, errClosed) {
			err = driver.ErrClosed
		}
		return driver.Grant{}, storeErr("resume", err)
	}
	val, _ := json.Marshal(value{Holder: v.Holder, TTL: req.TTL})
	moved, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", rev)).
		Then(clientv3.OpPut(k, string(val), clientv3.WithLease(sl.id))).
		Commit()
	if err != nil {
		sl.unuse()
		return driver.Grant{}, storeErr("resume", err)
	}
	if !moved.Succeeded {
		sl.unuse()
		return driver.Grant{}, storeErr("resume", fmt.Errorf("%w: entry deleted (its etcd lease %x ended, or it was released)", driver.ErrLeaseLost, int64(id)))
	}
	return d.track(k, sl, rev, v.Holder)
}

// track records a resumed grant on sl (counted as its user) and starts its
// loss watcher, as granted does for a new one (but a driver closed
// meanwhile leaves the entry alone: the grant is the caller's, resumed
// elsewhere perhaps).
func (d *Driver) track(k string, sl *sharedLease, rev int64, holder string) (driver.Grant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		sl.unuseLocked()
		return driver.Grant{}, storeErr("resume", driver.ErrClosed)
	}
	if old, ok := d.grants[k]; ok && old.fence == rev {
		if err := d.reuseExpiringLocked(k, old, sl, rev); err != nil {
			return driver.Grant{}, storeErr("resume", err)
		}
		if old.sl != sl { // the entry moved to sl
			if old.sl.grants[k] == old {
				delete(old.sl.grants, k)
				old.sl.unuseLocked()
			}
			old.sl = sl
			sl.grants[k] = old
		} else {
			sl.unuseLocked() // the grant counts once
		}
		old.deadline = time.Now().Add(sl.ttl)
		return driver.Grant{Fence: uint64(rev), Lost: old.lost}, nil
	}
	g := d.trackLocked(k, sl, rev, holder)
	return driver.Grant{Fence: uint64(rev), Lost: g.lost}, nil
}
