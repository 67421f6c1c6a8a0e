package zkdriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-dev/dlock/driver"
)

// Read-write locks (driver.SharedLocker)
//
// SharedView gives the two kinds of a read-write lock: Exclusive (the
// writer) and Shared with Limit 0 (the readers). It is Curator's
// InterProcessReadWriteLock (and the shared-lock recipe of "ZooKeeper
// Recipes and Solutions") on the driver's layout:
//
//   - Every request, reader or writer, creates one ephemeral sequential
//     node "<owner token>-<sequence>" in the key's container, as a plain
//     lock does; the node's data says "mode":"shared" for a reader and
//     nothing for a writer.
//   - A writer holds the key when its node has the lowest sequence number:
//     that is exactly a plain lock, so an Exclusive grant of K IS a plain
//     lock of K (the views share the plain locks' key space: a plain lock
//     excludes readers and a reader excludes plain locks).
//   - A reader holds the key when no writer node (held or waiting) has a
//     lower sequence number than its own; it waits, watching only the last
//     earlier writer node, until there is none. Readers that arrive after a
//     waiting writer queue behind it: writer preference, and no writer is
//     starved.
//
// Fences are creation zxids as for plain locks: a writer's fence is greater
// than that of every grant made before it, and every grant after a writer
// has a greater one. Readers released by the same writer may see their
// grants in any order; their fences are distinct and greater than the
// writer's.
//
// Renew, Release, loss push (Grant.Lost, per session), the deletion of
// unrenewed grants and the op timeout are the plain driver's. Inspect and
// List on the parent show a read-locked key's earliest node as its holder
// and count every other node as a waiter. Shared with a Limit (a counted
// semaphore) is not supported: SharedView returns an error matching
// errors.ErrUnsupported, and the semaphore recipe uses its portable permit
// slots.

var _ driver.SharedLocker = (*Driver)(nil)

// sharedMode is the mode a reader's node data gives.
const sharedMode = "shared"

// SharedView returns the view of a read-write lock kind: for Exclusive, a
// driver whose grants are plain locks (the writer); for Shared with Limit
// 0, a driver of readers (a driver.Waiter, pushing loss like plain grants).
// It returns an error matching driver.ErrInvalidArgument for an invalid
// kind, and one matching errors.ErrUnsupported for Shared with a Limit.
func (d *Driver) SharedView(kind driver.SharedKind) (driver.Driver, error) {
	if err := kind.Check(); err != nil {
		return nil, fmt.Errorf("zkdriver: shared view: %w", err)
	}
	if kind.Mode == driver.Shared && kind.Limit > 0 {
		return nil, fmt.Errorf("zkdriver: shared view: ZooKeeper keeps read-write locks, not counted permits (limit %d): %w", kind.Limit, errors.ErrUnsupported)
	}
	if kind.Mode == driver.Exclusive {
		return writerView{d}, nil
	}
	return readerView{d}, nil
}

// writerView is the Exclusive view: plain locks.
type writerView struct{ *Driver }

// Close closes nothing: the parent driver owns the session.
func (writerView) Close() error { return nil }

// readerView is the Shared (Limit 0) view.
type readerView struct{ d *Driver }

var (
	_ driver.Waiter = readerView{}
	_ driver.Waiter = writerView{}
)

// Close closes nothing: the parent driver owns the session.
func (readerView) Close() error { return nil }

// Renew is the plain driver's Renew.
func (v readerView) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	return v.d.Renew(ctx, key, owner, ttl)
}

// Release is the plain driver's Release.
func (v readerView) Release(ctx context.Context, key, owner string) error {
	return v.d.Release(ctx, key, owner)
}

// TryAcquire creates a reader node and keeps it only when no writer node
// is earlier; otherwise it deletes it and returns driver.ErrNotAcquired.
func (v readerView) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	d := v.d
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	e, err := d.enqueueAs(ctx, req, sharedMode)
	if err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	w, err := v.lastWriter(ctx, d.dir(req.Key), e, map[string]bool{})
	if err != nil || w != "" {
		d.dropNode(ctx, e)
		if err == nil {
			err = driver.ErrNotAcquired
		}
		return driver.Grant{}, storeErr("acquire", err)
	}
	g, err := d.granted(ctx, req, e)
	if err != nil {
		return driver.Grant{}, storeErr("acquire", err)
	}
	return g, nil
}

// Wait creates a reader node and waits, watching only the last writer node
// before it, until no writer node is earlier. It stops with an error when
// the session (or the connection) is lost; when ctx ends it deletes its
// node and returns an error matching ctx.Err().
func (v readerView) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	d := v.d
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, storeErr("wait", err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(d.closeCtx, func() { cancel(driver.ErrClosed) })
	defer stop()
	octx, ocancel := context.WithTimeout(ctx, d.opTimeout)
	e, err := d.enqueueAs(octx, req, sharedMode)
	ocancel()
	if err != nil {
		return driver.Grant{}, d.waitErr(ctx, req.Key, err)
	}
	fail := func(err error) (driver.Grant, error) {
		d.dropNode(ctx, e)
		return driver.Grant{}, d.waitErr(ctx, req.Key, err)
	}
	dir := d.dir(req.Key)
	modes := map[string]bool{} // node name → is a writer
	for {
		octx, ocancel := context.WithTimeout(ctx, d.opTimeout)
		w, err := v.lastWriter(octx, dir, e, modes)
		ocancel()
		if err != nil {
			return fail(err)
		}
		if w == "" {
			g, err := d.granted(ctx, req, e)
			if err != nil {
				return driver.Grant{}, d.waitErr(ctx, req.Key, err)
			}
			return g, nil
		}
		octx, ocancel = context.WithTimeout(ctx, d.opTimeout)
		watch, err := do(octx, d, func() (<-chan zk.Event, error) {
			ok, _, ch, err := d.conn.ExistsW(dir + "/" + w)
			if err == nil && !ok {
				return nil, nil
			}
			return ch, err
		}, nil)
		ocancel()
		if err != nil {
			return fail(err)
		}
		if watch != nil {
			select {
			case <-watch:
			case <-e.gen.lost:
				return fail(fmt.Errorf("%w: ZooKeeper session lost while waiting", driver.ErrUnavailable))
			case <-ctx.Done():
				return fail(ctx.Err())
			}
		}
		octx, ocancel = context.WithTimeout(ctx, d.opTimeout)
		e.children, err = d.children(octx, dir)
		ocancel()
		if err != nil {
			return fail(err)
		}
	}
}

// lastWriter returns the name of the last writer node before e's node in
// e.children (sorted), or "" when every earlier node is a reader's (or is
// gone). It reads the data of earlier nodes, newest first, caching each
// node's mode in modes. It returns an error matching driver.ErrLeaseLost
// when e's own node is no longer listed.
func (v readerView) lastWriter(ctx context.Context, dir string, e enqueued, modes map[string]bool) (string, error) {
	idx := -1
	for i, c := range e.children {
		if c == e.name {
			idx = i
			break
		}
	}
	if idx < 0 {
		return "", fmt.Errorf("%w: own node %s is gone", driver.ErrLeaseLost, e.path)
	}
	for i := idx - 1; i >= 0; i-- {
		name := e.children[i]
		writer, known := modes[name]
		if !known {
			data, err := do(ctx, v.d, func() ([]byte, error) {
				b, _, err := v.d.conn.Get(dir + "/" + name)
				return b, err
			}, nil)
			if errors.Is(err, zk.ErrNoNode) {
				continue // released meanwhile
			}
			if err != nil {
				return "", err
			}
			var val value
			writer = json.Unmarshal(data, &val) != nil || val.Mode != sharedMode
			modes[name] = writer
		}
		if writer {
			return name, nil
		}
	}
	return "", nil
}
