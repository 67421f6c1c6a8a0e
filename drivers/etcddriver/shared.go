package etcddriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-dev/dlock/driver"
)

// Read-write locks (driver.SharedLocker)
//
// SharedView gives the two kinds of a read-write lock: Exclusive (the
// writer) and Shared with Limit 0 (the readers). It is etcd's own
// RWMutex recipe (go.etcd.io/etcd/client/v3/experimental/recipes,
// rwmutex.go) on the driver's layout, with the driver's shared leases
// (one per TTL, see leases.go) in the place of the session's:
//
//   - Every request, reader or writer, puts one entry in the key's
//     directory <prefix>/.locks/<escaped K>/<owner token>, as a plain lock
//     does; the entry's value says "mode":"shared" for a reader and nothing
//     for a writer. Entries are ordered by create revision (FIFO).
//   - A writer holds the key when its entry is the lowest of the directory:
//     it waits for every earlier entry, readers included. That is exactly a
//     plain lock, so an Exclusive grant of K IS a plain lock of K (the
//     views share the plain locks' key space: a plain lock excludes readers
//     and a reader excludes plain locks).
//   - A reader holds the key when no writer entry (held or waiting) is
//     earlier than its own; it waits, by a watch on the last earlier writer
//     entry, until there is none. Readers arriving after a waiting writer
//     queue behind it: writer preference, and no writer is starved.
//
// Fences are create revisions as for plain locks: a writer's fence is
// greater than that of every grant made before it, and every grant made
// after a writer has a greater fence than the writer's. Readers granted
// together (released by the same writer) may see their grants in any order;
// their fences are distinct and all greater than the writer's.
//
// Renew, Release, loss push (Grant.Lost) and the op timeout of Wait are the
// plain driver's. Inspect and List on the parent show a read-locked key's
// earliest entry as its holder and count every other entry as a waiter.
// Shared with a Limit (a counted semaphore) is not supported: SharedView
// returns an error matching errors.ErrUnsupported, and the semaphore recipe
// uses its portable permit slots.

var _ driver.SharedLocker = (*Driver)(nil)

// sharedMode is the mode an entry's value gives a reader.
const sharedMode = "shared"

// SharedView returns the view of a read-write lock kind: for Exclusive, a
// driver whose grants are plain locks (the writer); for Shared with Limit
// 0, a driver of readers (a driver.Waiter, pushing loss like plain grants).
// It returns an error matching driver.ErrInvalidArgument for an invalid
// kind, and one matching errors.ErrUnsupported for Shared with a Limit.
func (d *Driver) SharedView(kind driver.SharedKind) (driver.Driver, error) {
	if err := kind.Check(); err != nil {
		return nil, fmt.Errorf("etcddriver: shared view: %w", err)
	}
	if kind.Mode == driver.Shared && kind.Limit > 0 {
		return nil, fmt.Errorf("etcddriver: shared view: etcd keeps read-write locks, not counted permits (limit %d): %w", kind.Limit, errors.ErrUnsupported)
	}
	if kind.Mode == driver.Exclusive {
		return writerView{d}, nil
	}
	return readerView{d}, nil
}

// writerView is the Exclusive view: plain locks.
type writerView struct{ *Driver }

// Close closes nothing: the parent driver owns the client.
func (writerView) Close() error { return nil }

// readerView is the Shared (Limit 0) view.
type readerView struct{ d *Driver }

var (
	_ driver.Waiter = readerView{}
	_ driver.Waiter = writerView{}
)

// Close closes nothing: the parent driver owns the client.
func (readerView) Close() error { return nil }

// Renew is the plain driver's Renew.
func (v readerView) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	return v.d.Renew(ctx, key, owner, ttl)
}

// Release is the plain driver's Release.
func (v readerView) Release(ctx context.Context, key, owner string) error {
	return v.d.Release(ctx, key, owner)
}

// TryAcquire puts a reader entry and keeps it only when no writer entry is
// earlier; otherwise it deletes the entry and returns
// driver.ErrNotAcquired.
func (v readerView) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	d := v.d
	if d.isClosed() {
		return driver.Grant{}, storeErr("acquire", driver.ErrClosed)
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	q, err := v.enqueue(ctx, req)
	if err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	if q.pred != "" {
		d.abandon(ctx, q.sl, d.entry(req.Key, req.Owner), q.rev)
		return driver.Grant{}, storeErr("acquire", driver.ErrNotAcquired)
	}
	return d.granted(req, q)
}

// Wait puts a reader entry and waits, watching only the last writer entry
// earlier than its own, until there is none. Its shared lease is kept alive while
// it waits, a cancelled waiter deletes its entry, and store round trips are
// bounded by the op timeout, as in the plain driver's Wait.
func (v readerView) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	d := v.d
	if d.isClosed() {
		return driver.Grant{}, storeErr("wait", driver.ErrClosed)
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, storeErr("wait", err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(d.closeCtx, func() { cancel(driver.ErrClosed) })
	defer stop()

	octx, ocancel := context.WithTimeout(ctx, d.opTimeout)
	q, err := v.enqueue(octx, req)
	ocancel()
	if err != nil {
		return driver.Grant{}, d.waitErr(ctx, req.Key, err)
	}
	if q.pred == "" {
		return d.granted(req, q)
	}
	k := d.entry(req.Key, req.Owner)
	fail := func(err error) (driver.Grant, error) {
		d.abandon(ctx, q.sl, k, q.rev)
		return driver.Grant{}, d.waitErr(ctx, req.Key, err)
	}
	ownCtx, ownCancel := context.WithCancel(ctx)
	defer ownCancel()
	ownCh := d.cli.Watch(ownCtx, k, clientv3.WithRev(q.rev+1), clientv3.WithFilterPut())
	keep := time.NewTicker(q.sl.ttl / 3)
	kept := &keeper{ttl: q.sl.ttl, last: time.Now()}
	defer keep.Stop()
	for {
		predCtx, predCancel := context.WithCancel(ctx)
		predCh := d.cli.Watch(predCtx, q.pred, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
		_, err := d.waitDelete(ctx, q, predCh, &ownCh, keep.C, kept)
		predCancel()
		if err != nil {
			return fail(err)
		}
		octx, ocancel := context.WithTimeout(ctx, d.opTimeout)
		q, err = v.writerAhead(octx, req.Key, k, q)
		ocancel()
		if err != nil {
			return fail(err)
		}
		if q.pred == "" {
			return d.granted(req, q)
		}
	}
}

// enqueue puts req's reader entry on the driver's shared lease for req.TTL,
// in a transaction that first reads every earlier entry of the key; q.pred
// is the last earlier writer entry, "" when there is none. An entry that
// exists already (the same owner token retried) is put again on the shared
// lease, keeping its create revision. On an error, an entry the
// transaction may have put is deleted (see abandon).
func (v readerView) enqueue(ctx context.Context, req driver.AcquireRequest) (queued, error) {
	d := v.d
	val, _ := json.Marshal(sharedValue{Holder: req.Holder, TTL: req.TTL, Mode: sharedMode})
	k := d.entry(req.Key, req.Owner)
	dir := d.dir(req.Key)
	resp, sl, validFor, err := d.putEntry(ctx, req.TTL, k, string(val),
		clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend)))
	if err != nil {
		return queued{}, err
	}
	if !resp.Succeeded {
		kvs := resp.Responses[1].GetResponseRange().Kvs
		if len(kvs) == 0 {
			sl.unuse()
			return queued{}, fmt.Errorf("entry %q vanished", k)
		}
		q, err := v.writerAhead(ctx, req.Key, k, queued{sl: sl, rev: kvs[0].CreateRevision, validFor: validFor})
		if err != nil {
			sl.unuse()
		}
		return q, err
	}
	q := queued{sl: sl, rev: resp.Header.Revision, seen: resp.Header.Revision, validFor: validFor}
	q.pred = lastWriter(resp.Responses[0].GetResponseRange().Kvs)
	return q, nil
}

// writerAhead re-reads, in one transaction, that q's entry k still exists
// and which writer entry is the last one before it. It returns an error
// matching driver.ErrLeaseLost when the entry is gone.
func (v readerView) writerAhead(ctx context.Context, key, k string, q queued) (queued, error) {
	resp, err := v.d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", q.rev)).
		Then(clientv3.OpGet(v.d.dir(key), clientv3.WithPrefix(), clientv3.WithMaxCreateRev(q.rev-1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))).
		Commit()
	if err != nil {
		return q, err
	}
	if !resp.Succeeded {
		return q, fmt.Errorf("%w: %w", driver.ErrLeaseLost, errWaiterLost)
	}
	q.pred, q.seen = lastWriter(resp.Responses[0].GetResponseRange().Kvs), resp.Header.Revision
	q.ahead = 0 // unused by readers: every wake-up re-reads
	return q, nil
}

// lastWriter returns the key of the first writer entry of kvs (sorted by
// create revision, newest first), or "" when every entry is a reader's.
func lastWriter(kvs []*mvccpb.KeyValue) string {
	for _, kv := range kvs {
		var sv sharedValue
		if json.Unmarshal(kv.Value, &sv) != nil || sv.Mode != sharedMode {
			return string(kv.Key)
		}
	}
	return ""
}

// sharedValue is the value of an entry, plain (Mode "") or reader.
type sharedValue struct {
	Holder string        `json:"holder,omitempty"`
	TTL    time.Duration `json:"ttl"`
	Mode   string        `json:"mode,omitempty"`
}
