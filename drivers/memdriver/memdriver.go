// Package memdriver is an in-process lock store with the full semantics of
// dlock's contract, for users' own unit tests and for examples. Drivers made
// on the same Store act as separate processes sharing one store.
//
// It registers the URL scheme "mem": dlock.Open(ctx, "mem://name") opens a
// driver on the process-wide store called name ("mem://" is the store
// "default"), so two Opens of the same URL share locks. The URL takes no
// query parameters; one with any is refused (ErrInvalidArgument).
//
// Input outside the contract (a key, owner token, TTL or holder that
// driver.CheckRequest refuses) is refused with an error matching
// driver.ErrInvalidArgument, as a real store's driver does.
//
// # Capabilities
//
// Waiter (a FIFO queue per key; a release or expiry hands the key to the head
// waiter at once), Inspector, ForceReleaser, and driver.SharedLocker natively
// (semaphore permits and read-write locks: several grants of one key, each
// with its own owner token, TTL and fence, one FIFO queue over every kind
// with writer preference; see Driver.SharedView), and driver.Resumer (a
// grant outlives the Driver that made it, as on a real store: another
// Driver on the same Store re-attaches to it, dlock's Locker.Resume). It
// pushes no loss: a grant ends only by release or expiry, and expiry is the
// store's own timer.
//
// # Guarantees
//
// Fences are strictly increasing per store (so per key) for the life of the
// Store value; nothing is persisted. Expiry uses the process's monotonic
// clock, so it works under testing/synctest.
package memdriver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

func init() {
	driver.Register("mem", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		if err := urlparam.Known("memdriver", u.Query()); err != nil {
			return nil, err
		}
		name := u.Host
		if name == "" {
			name = u.Opaque
		}
		if name == "" {
			name = "default"
		}
		return New(Named(name)), nil
	})
}

// ErrStoreDown is returned by every operation while the store is marked
// down with SetDown, as a network error would be.
var ErrStoreDown = errors.New("memdriver: store down")

var (
	namedMu sync.Mutex
	named   = map[string]*Store{}
)

// Named returns the process-wide Store called name, creating it on first use.
func Named(name string) *Store {
	namedMu.Lock()
	defer namedMu.Unlock()
	s, ok := named[name]
	if !ok {
		s = NewStore()
		named[name] = s
	}
	return s
}

// Store is an in-memory lock table. The zero value is not usable; call
// NewStore.
type Store struct {
	mu        sync.Mutex
	keys      map[string]*entry
	lastFence uint64
	down      bool
}

// entry is one key: its live grants (one Exclusive grant, or Shared grants
// up to limit) and its FIFO queue of waiters of every kind.
type entry struct {
	grants  []*grant // in grant order
	limit   int      // the SharedKind.Limit of the Shared grants, while there are any
	waiters []*waiter
}

// grant is one holder of a key. Plain locks are Exclusive grants.
type grant struct {
	owner, holder string
	mode          driver.Mode
	fence         uint64
	ttl           time.Duration
	expires       time.Time
	timer         *time.Timer
}

type waiter struct {
	req     driver.AcquireRequest
	kind    driver.SharedKind
	granted chan driver.Grant // buffered 1
}

// exclusive is the kind of a plain lock.
var exclusive = driver.SharedKind{Mode: driver.Exclusive}

// NewStore returns an empty Store.
func NewStore() *Store { return &Store{keys: map[string]*entry{}} }

// SetDown marks the store unreachable (every call returns ErrStoreDown) or
// reachable again; grants keep expiring meanwhile. Tests use it to simulate
// an outage.
func (s *Store) SetDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// Driver is one client of a Store.
type Driver struct {
	s      *Store
	mu     sync.Mutex
	closed bool
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Waiter    = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)

	_ driver.ForceReleaser = (*Driver)(nil)
)

// New returns a driver on s.
func New(s *Store) *Driver { return &Driver{s: s} }

// Close marks the driver closed; later calls return driver.ErrClosed. Grants
// it made stay until released or expired, as with a real store.
func (d *Driver) Close() error {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	return nil
}

// lock takes the store mutex after checking the driver and the store.
func (d *Driver) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return fmt.Errorf("memdriver: %w", driver.ErrClosed)
	}
	d.s.mu.Lock()
	if d.s.down {
		d.s.mu.Unlock()
		return ErrStoreDown
	}
	return nil
}

// TryAcquire grants req.Key when it is free or its grant expired, else
// returns driver.ErrNotAcquired. A key with queued waiters is not free.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.tryAcquire(ctx, req, exclusive, "acquire")
}

func (d *Driver) tryAcquire(ctx context.Context, req driver.AcquireRequest, kind driver.SharedKind, op string) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("memdriver: %s: %w", op, err)
	}
	if err := d.lock(ctx); err != nil {
		return driver.Grant{}, err
	}
	defer d.s.mu.Unlock()
	e := d.s.live(req.Key)
	if err := e.checkLimit(req.Key, kind); err != nil {
		return driver.Grant{}, fmt.Errorf("memdriver: %s: %w", op, err)
	}
	if e != nil && (len(e.waiters) > 0 || !e.admits(kind)) {
		return driver.Grant{}, driver.ErrNotAcquired
	}
	return d.s.grant(req, kind), nil
}

// Wait queues req behind the current holder and earlier waiters (FIFO) and
// returns when the key is handed to it or ctx ends; in the latter case the
// queue entry, or a grant that raced the cancellation, is removed.
func (d *Driver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.wait(ctx, req, exclusive, "wait")
}

func (d *Driver) wait(ctx context.Context, req driver.AcquireRequest, kind driver.SharedKind, op string) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("memdriver: %s: %w", op, err)
	}
	if err := d.lock(ctx); err != nil {
		return driver.Grant{}, err
	}
	e := d.s.live(req.Key)
	if err := e.checkLimit(req.Key, kind); err != nil {
		d.s.mu.Unlock()
		return driver.Grant{}, fmt.Errorf("memdriver: %s: %w", op, err)
	}
	if e == nil || len(e.waiters) == 0 && e.admits(kind) {
		g := d.s.grant(req, kind)
		d.s.mu.Unlock()
		return g, nil
	}
	w := &waiter{req: req, kind: kind, granted: make(chan driver.Grant, 1)}
	e.waiters = append(e.waiters, w)
	d.s.mu.Unlock()

	select {
	case g := <-w.granted:
		return g, nil
	case <-ctx.Done():
	}
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	select {
	case <-w.granted: // handed over just as ctx ended: give it back
		if e, g := d.s.holding(req.Key, req.Owner); g != nil {
			d.s.drop(req.Key, e, g)
		}
	default:
		if e := d.s.keys[req.Key]; e != nil {
			for i, x := range e.waiters {
				if x == w {
					e.waiters = append(e.waiters[:i], e.waiters[i+1:]...)
					break
				}
			}
			// A Shared waiter behind this one may now be grantable
			// (writer preference no longer holds it back).
			d.s.dispatch(req.Key, e)
		}
	}
	return driver.Grant{}, ctx.Err()
}

// Renew extends owner's grant to a full ttl, or returns driver.ErrLeaseLost.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("memdriver: renew: %w", err)
	}
	if err := d.lock(ctx); err != nil {
		return err
	}
	defer d.s.mu.Unlock()
	_, g := d.s.holding(key, owner)
	if g == nil {
		return driver.ErrLeaseLost
	}
	d.s.renewGrant(g, ttl)
	return nil
}

// Release removes owner's grant and hands the key to the head waiter, or
// returns driver.ErrLeaseLost when owner does not hold key.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("memdriver: release: %w", err)
	}
	if err := d.lock(ctx); err != nil {
		return err
	}
	defer d.s.mu.Unlock()
	e, g := d.s.holding(key, owner)
	if g == nil {
		return driver.ErrLeaseLost
	}
	d.s.drop(key, e, g)
	return nil
}

// Inspect returns key's current grant, or driver.ErrNotAcquired wrapped
// when it is free. A key held by several Shared grants is described by its
// oldest grant (lowest fence).
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("memdriver: inspect: %w", err)
	}
	if err := d.lock(ctx); err != nil {
		return driver.HolderInfo{}, err
	}
	defer d.s.mu.Unlock()
	e := d.s.live(key)
	if e == nil {
		return driver.HolderInfo{}, fmt.Errorf("memdriver: %q is free: %w", key, driver.ErrNotAcquired)
	}
	return e.info(key), nil
}

// ForceRelease removes every grant of key whoever holds it (all of a
// semaphore's permits or a read-write lock's readers) and hands the key to
// the head waiters; driver.ErrNotAcquired wrapped when key is free. It
// returns the oldest grant removed. reason is not kept: the in-process store
// has no audit log (the root package logs it).
func (d *Driver) ForceRelease(ctx context.Context, key, reason string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("memdriver: force-release: %w", err)
	}
	if err := d.lock(ctx); err != nil {
		return driver.HolderInfo{}, err
	}
	defer d.s.mu.Unlock()
	e := d.s.live(key)
	if e == nil {
		return driver.HolderInfo{}, fmt.Errorf("memdriver: %q is free: %w", key, driver.ErrNotAcquired)
	}
	info := e.info(key)
	for _, g := range e.grants {
		g.timer.Stop()
	}
	e.grants = nil
	d.s.dispatch(key, e)
	return info, nil
}

// List returns the held keys starting with prefix, sorted by key, one
// HolderInfo per grant: a key with several Shared grants (a semaphore's
// permits, a read-write lock's readers) appears once per grant, in fence
// order.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	if err := d.lock(ctx); err != nil {
		return nil, err
	}
	defer d.s.mu.Unlock()
	var out []driver.HolderInfo
	for k := range d.s.keys {
		if e := d.s.live(k); e != nil && strings.HasPrefix(k, prefix) {
			for _, g := range e.grants {
				out = append(out, e.grantInfo(k, g))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Fence < out[j].Fence
	})
	return out, nil
}

// info describes e's oldest grant; e has at least one.
func (e *entry) info(key string) driver.HolderInfo { return e.grantInfo(key, e.grants[0]) }

// grantInfo describes grant g of e.
func (e *entry) grantInfo(key string, g *grant) driver.HolderInfo {
	return driver.HolderInfo{
		Key: key, Fence: g.fence, Holder: g.holder, TTL: g.ttl,
		Remaining: time.Until(g.expires), Waiters: len(e.waiters),
	}
}

// admits reports whether a grant of kind is compatible with e's grants
// (the queue aside). A nil entry admits everything.
func (e *entry) admits(kind driver.SharedKind) bool {
	if e == nil || len(e.grants) == 0 {
		return true
	}
	if kind.Mode == driver.Exclusive || e.grants[0].mode == driver.Exclusive {
		return false
	}
	return e.limit == 0 || len(e.grants) < e.limit
}

// checkLimit refuses a Shared request whose Limit differs from that of the
// key's Shared grants or waiters. A nil entry accepts every kind.
func (e *entry) checkLimit(key string, kind driver.SharedKind) error {
	if e == nil || kind.Mode != driver.Shared {
		return nil
	}
	limit := -1
	if len(e.grants) > 0 && e.grants[0].mode == driver.Shared {
		limit = e.limit
	}
	for _, w := range e.waiters {
		if limit < 0 && w.kind.Mode == driver.Shared {
			limit = w.kind.Limit
		}
	}
	if limit >= 0 && limit != kind.Limit {
		return fmt.Errorf("%w: key %q has shared grants with limit %d, not %d", driver.ErrInvalidArgument, key, limit, kind.Limit)
	}
	return nil
}

// live returns key's entry when it has an unexpired grant or a waiter,
// dropping expired grants (and handing the key over) first; nil when the key
// is free. s.mu is held.
func (s *Store) live(key string) *entry {
	e := s.keys[key]
	if e == nil {
		return nil
	}
	now := time.Now()
	expired := false
	kept := e.grants[:0]
	for _, g := range e.grants {
		if now.Before(g.expires) {
			kept = append(kept, g)
		} else {
			g.timer.Stop()
			expired = true
		}
	}
	clear(e.grants[len(kept):])
	e.grants = kept
	if expired {
		s.dispatch(key, e)
	}
	if len(e.grants) == 0 {
		return nil
	}
	return s.keys[key]
}

// holding returns key's entry and the live grant owner holds of it, or a
// nil grant. s.mu is held.
func (s *Store) holding(key, owner string) (*entry, *grant) {
	e := s.live(key)
	if e == nil {
		return nil, nil
	}
	for _, g := range e.grants {
		if g.owner == owner {
			return e, g
		}
	}
	return e, nil
}

// renewGrant extends g to a full ttl from now. s.mu is held.
func (s *Store) renewGrant(g *grant, ttl time.Duration) {
	g.ttl = ttl
	g.expires = time.Now().Add(ttl)
	g.timer.Reset(ttl)
}

// grant adds req as a holder of key of the given kind; the caller checked
// that kind is admitted. s.mu is held.
func (s *Store) grant(req driver.AcquireRequest, kind driver.SharedKind) driver.Grant {
	s.lastFence++
	e := s.keys[req.Key]
	if e == nil {
		e = &entry{}
		s.keys[req.Key] = e
	}
	g := &grant{
		owner: req.Owner, holder: req.Holder, mode: kind.Mode, fence: s.lastFence,
		ttl: req.TTL, expires: time.Now().Add(req.TTL),
	}
	key, owner := req.Key, req.Owner
	g.timer = time.AfterFunc(req.TTL, func() { s.expire(key, owner) })
	if len(e.grants) == 0 {
		e.limit = kind.Limit
	}
	e.grants = append(e.grants, g)
	return driver.Grant{Fence: g.fence}
}

// drop ends grant g of key and hands the key over, in the same step. s.mu
// is held.
func (s *Store) drop(key string, e *entry, g *grant) {
	g.timer.Stop()
	for i, x := range e.grants {
		if x == g {
			e.grants = append(e.grants[:i], e.grants[i+1:]...)
			break
		}
	}
	s.dispatch(key, e)
}

// dispatch grants e's head waiters, in queue order, as long as the head is
// admitted (several Shared waiters at once; FIFO stops at the first that is
// not, so a waiting Exclusive request holds back later Shared ones), and
// deletes e when it is left with no grant and no waiter. s.mu is held.
func (s *Store) dispatch(key string, e *entry) {
	for len(e.waiters) > 0 && e.admits(e.waiters[0].kind) {
		w := e.waiters[0]
		e.waiters = e.waiters[1:]
		w.granted <- s.grant(w.req, w.kind)
	}
	if len(e.grants) == 0 && len(e.waiters) == 0 && s.keys[key] == e {
		delete(s.keys, key)
	}
}

func (s *Store) expire(key, owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live(key)
	_ = owner
}
