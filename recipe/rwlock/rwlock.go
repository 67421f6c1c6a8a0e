// Package rwlock is a distributed read-write lock over a dlock store: many
// readers or one writer at a time, with writer preference, each grant a
// *dlock.Lease of its own (owner token, TTL, heartbeat, validity deadline,
// fencing token, self-fencing context).
//
//	rw, err := rwlock.New(locker, "catalog")
//	if err != nil { ... } // dlock.ErrUnsupported on stores without read-write locks
//	defer rw.Close()
//
//	r, err := rw.RLock(ctx) // shared with other readers
//	...
//	err = r.Release(ctx)
//
//	w, err := rw.Lock(ctx) // alone: no reader, no other writer
//	err = writeCatalog(w.Context(), w.Fence())
//	err = w.Release(ctx)
//
// # Where it works
//
// A read-write lock needs the store to keep several grants of one key and
// to order waiters, so it is built on the store's own read-write lock,
// reached through driver.SharedLocker (Shared with Limit 0 for readers,
// Exclusive for writers), never emulated:
//
//   - dlockd: native, in the server's state machine (FIFO queue over both
//     kinds).
//   - mem: native (the in-process reference).
//   - etcd: etcd's RWMutex recipe (go.etcd.io/etcd/client/v3/experimental/
//     recipes): entries ordered by create revision, a reader waits for the
//     last earlier writer, a writer for every earlier entry.
//   - ZooKeeper: Curator's InterProcessReadWriteLock: sequential ephemeral
//     nodes, each waiter watching the node that blocks it.
//   - Redis: owner-checked Lua over a hash of grants (a TTL per grant) and
//     a FIFO wait list.
//   - Redlock, PostgreSQL (lease table and advisory locks), DynamoDB, GCS,
//     Azure Blob, Consul: unsupported. New returns an error matching
//     dlock.ErrUnsupported that names the store. (Their drivers keep one
//     grant per key; a portable read-write lock over plain locks could not
//     give each reader a fenced grant of its own without a counter the
//     store updates atomically with the grants.)
//
// On dlockd, mem, etcd and ZooKeeper the writer's grant is a plain lock of
// the same key (Locker.Acquire(ctx, name) excludes readers too); on Redis
// the read-write lock has keys of its own.
//
// # Writer preference
//
// Requests are served in arrival order over both kinds: a reader is granted
// when no writer holds the lock and no writer waits before it, a writer when
// nothing holds the lock and nothing waits before it. So a writer that waits
// holds back every reader that comes after it: a stream of readers never
// starves a writer, and readers that came before a writer are not
// overtaken. TryRLock and TryLock never wait and never jump the queue:
// TryRLock fails with dlock.ErrNotAcquired while a writer holds or waits,
// TryLock while anyone holds (and, where the store queues, waits).
//
// # Fences and loss
//
// Every grant has its own fencing token. A writer's fence is greater than
// that of every grant made before it, and every grant made after a writer
// has a greater fence than the writer's, so a resource that refuses a fence
// smaller than the greatest it has seen (package dlock/fence) refuses a
// stale writer, and a reader's fence tells which write it read after.
// Readers granted together may hold fences in any order among themselves.
// Each lease is renewed and lost like any other: its Context ends with
// cause dlock.ErrLeaseLost when it can no longer be trusted.
//
// Locks are not reentrant: a holder that asks again gets a new grant (a
// reader) or waits for itself (a writer).
package rwlock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// RWLock is one named read-write lock on a store. It is safe for concurrent
// use; make one per name and Close it when done (closing its Locker closes
// it too).
type RWLock struct {
	name    string
	readers *dlock.Locker // view of Shared (Limit 0) grants
	writers *dlock.Locker // view of Exclusive grants
	queued  bool          // both views are driver.Waiters
}

// New returns the read-write lock name (a key: 1 to 512 bytes of UTF-8
// without NUL) on l's store. It returns an error matching
// dlock.ErrInvalidKey for an invalid name, dlock.ErrInvalidArgument for a
// nil Locker, and one matching dlock.ErrUnsupported, naming the store, when
// the store has no read-write locks (its driver is no driver.SharedLocker,
// or refuses Shared with Limit 0 or Exclusive grants). It does not contact
// the store.
func New(l *dlock.Locker, name string) (*RWLock, error) {
	if l == nil {
		return nil, fmt.Errorf("rwlock: new %q: %w: nil Locker", name, dlock.ErrInvalidArgument)
	}
	if err := dlock.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("rwlock: new %q: %w", name, err)
	}
	d := l.Driver()
	sl, ok := d.(driver.SharedLocker)
	if !ok {
		return nil, fmt.Errorf("rwlock: new %q: the store %s has no read-write locks (its driver is no driver.SharedLocker; use dlockd, mem, etcd, zk or redis): %w",
			name, storeName(d), dlock.ErrUnsupported)
	}
	rv, err := sl.SharedView(driver.SharedKind{Mode: driver.Shared})
	if err != nil {
		return nil, viewErr(name, d, "readers", err)
	}
	wv, err := sl.SharedView(driver.SharedKind{Mode: driver.Exclusive})
	if err != nil {
		_ = rv.Close()
		return nil, viewErr(name, d, "writers", err)
	}
	_, rq := rv.(driver.Waiter)
	_, wq := wv.(driver.Waiter)
	return &RWLock{name: name, readers: l.View(rv), writers: l.View(wv), queued: rq && wq}, nil
}

func viewErr(name string, d driver.Driver, kind string, err error) error {
	if errors.Is(err, errors.ErrUnsupported) {
		return fmt.Errorf("rwlock: new %q: the store %s has no read-write locks (%s): %w", name, storeName(d), kind, err)
	}
	return fmt.Errorf("rwlock: new %q: %s view of the store %s: %w", name, kind, storeName(d), err)
}

// storeName names a driver by its package ("pgdriver", "redlockdriver").
func storeName(d driver.Driver) string {
	t := strings.TrimLeft(fmt.Sprintf("%T", d), "*")
	if pkg, _, ok := strings.Cut(t, "."); ok {
		return pkg
	}
	return t
}

// WriterPreference reports whether a waiting writer holds back the readers
// that come after it: true when the store queues waiters (its views are
// driver.Waiters: dlockd, mem, etcd, ZooKeeper, Redis). It is false only
// for a driver that hides its queue (a test wrapper that makes waiters poll
// with TryAcquire, which never queues): writers then compete with readers
// by backoff and can be starved.
func (rw *RWLock) WriterPreference() bool { return rw.queued }

// Name returns the lock's name (its key on the store).
func (rw *RWLock) Name() string { return rw.name }

// RLock waits until the lock is granted for reading (no writer holds it and
// none waits before this request) or ctx ends, and returns the read lease.
// opts are the Locker's (dlock.WithTTL, WithHolder, ...). Errors are those
// of dlock.Locker.Acquire; after Close, dlock.ErrClosed.
func (rw *RWLock) RLock(ctx context.Context, opts ...dlock.Option) (*dlock.Lease, error) {
	return rw.readers.Acquire(ctx, rw.name, opts...)
}

// TryRLock makes one attempt to read-lock and returns the lease, or an
// error matching dlock.ErrNotAcquired at once while a writer holds the lock
// or waits for it. Other errors are those of dlock.Locker.TryAcquire.
func (rw *RWLock) TryRLock(ctx context.Context, opts ...dlock.Option) (*dlock.Lease, error) {
	return rw.readers.TryAcquire(ctx, rw.name, opts...)
}

// Lock waits until the lock is granted for writing (no holder at all, and
// no request waiting before this one) or ctx ends, and returns the write
// lease. Errors are those of dlock.Locker.Acquire; after Close,
// dlock.ErrClosed.
func (rw *RWLock) Lock(ctx context.Context, opts ...dlock.Option) (*dlock.Lease, error) {
	return rw.writers.Acquire(ctx, rw.name, opts...)
}

// TryLock makes one attempt to write-lock and returns the lease, or an
// error matching dlock.ErrNotAcquired at once while the lock is held (by
// readers or a writer) or, on stores that queue, waited for. Other errors
// are those of dlock.Locker.TryAcquire.
func (rw *RWLock) TryLock(ctx context.Context, opts ...dlock.Option) (*dlock.Lease, error) {
	return rw.writers.TryAcquire(ctx, rw.name, opts...)
}

// Close ends the leases this RWLock still holds (releasing them on the
// store, best effort; their contexts end with cause dlock.ErrClosed) and
// makes later calls fail with dlock.ErrClosed. It closes neither the
// Locker nor its driver. Closing twice returns nil.
func (rw *RWLock) Close() error {
	return errors.Join(rw.readers.Close(), rw.writers.Close())
}
