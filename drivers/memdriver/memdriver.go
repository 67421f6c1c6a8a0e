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
// waiter at once), Inspector and ForceReleaser. It pushes no loss: a grant ends only by
// release or expiry, and expiry is the store's own timer.
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

type entry struct {
	owner, holder string
	fence         uint64
	ttl           time.Duration
	expires       time.Time
	timer         *time.Timer
	waiters       []*waiter
}

type waiter struct {
	req     driver.AcquireRequest
	granted chan driver.Grant // buffered 1
}

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
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("memdriver: acquire: %w", err)
	}
	if err := d.lock(ctx); err != nil {
		return driver.Grant{}, err
	}
	defer d.s.mu.Unlock()
	e := d.s.live(req.Key)
	if e != nil {
		return driver.Grant{}, driver.ErrNotAcquired
	}
	return d.s.grant(req), nil
}

// Wait queues req behind the current holder and earlier waiters (FIFO) and
// returns when the key is handed to it or ctx ends; in the latter case the
// queue entry, or a grant that raced the cancellation, is removed.
func (d *Driver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("memdriver: wait: %w", err)
	}
	if err := d.lock(ctx); err != nil {
		return driver.Grant{}, err
	}
	e := d.s.live(req.Key)
	if e == nil {
		g := d.s.grant(req)
		d.s.mu.Unlock()
		return g, nil
	}
	w := &waiter{req: req, granted: make(chan driver.Grant, 1)}
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
		if e := d.s.keys[req.Key]; e != nil && e.owner == req.Owner {
			d.s.free(req.Key)
		}
	default:
		if e := d.s.keys[req.Key]; e != nil {
			for i, x := range e.waiters {
				if x == w {
					e.waiters = append(e.waiters[:i], e.waiters[i+1:]...)
					break
				}
			}
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
	e := d.s.live(key)
	if e == nil || e.owner != owner {
		return driver.ErrLeaseLost
	}
	e.ttl = ttl
	e.expires = time.Now().Add(ttl)
	e.timer.Reset(ttl)
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
	e := d.s.live(key)
	if e == nil || e.owner != owner {
		return driver.ErrLeaseLost
	}
	d.s.free(key)
	return nil
}

// Inspect returns key's current grant, or driver.ErrNotAcquired wrapped
// when it is free.
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

// ForceRelease removes key's grant whoever holds it and hands the key to the
// head waiter; driver.ErrNotAcquired wrapped when key is free. reason is not
// kept: the in-process store has no audit log (the root package logs it).
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
	d.s.free(key)
	return info, nil
}

// List returns the held keys starting with prefix, sorted.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	if err := d.lock(ctx); err != nil {
		return nil, err
	}
	defer d.s.mu.Unlock()
	var out []driver.HolderInfo
	for k := range d.s.keys {
		if e := d.s.live(k); e != nil && strings.HasPrefix(k, prefix) {
			out = append(out, e.info(k))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (e *entry) info(key string) driver.HolderInfo {
	return driver.HolderInfo{
		Key: key, Fence: e.fence, Holder: e.holder, TTL: e.ttl,
		Remaining: time.Until(e.expires), Waiters: len(e.waiters),
	}
}

// live returns key's entry when it is held by an unexpired grant, expiring
// it (and handing it over) otherwise. s.mu is held.
func (s *Store) live(key string) *entry {
	e := s.keys[key]
	if e == nil {
		return nil
	}
	if time.Now().Before(e.expires) {
		return e
	}
	s.free(key)
	return s.keys[key] // the head waiter may have been granted
}

// grant makes req the holder of a free key. s.mu is held.
func (s *Store) grant(req driver.AcquireRequest) driver.Grant {
	s.lastFence++
	e := s.keys[req.Key]
	if e == nil {
		e = &entry{}
		s.keys[req.Key] = e
	}
	e.owner, e.holder, e.fence, e.ttl = req.Owner, req.Holder, s.lastFence, req.TTL
	e.expires = time.Now().Add(req.TTL)
	key, owner := req.Key, req.Owner
	if e.timer != nil {
		e.timer.Stop()
	}
	e.timer = time.AfterFunc(req.TTL, func() { s.expire(key, owner) })
	return driver.Grant{Fence: e.fence}
}

// free ends key's grant and hands the key to the head waiter, in the same
// step. s.mu is held.
func (s *Store) free(key string) {
	e := s.keys[key]
	if e == nil {
		return
	}
	e.timer.Stop()
	if len(e.waiters) == 0 {
		delete(s.keys, key)
		return
	}
	w := e.waiters[0]
	e.waiters = e.waiters[1:]
	w.granted <- s.grant(w.req)
}

func (s *Store) expire(key, owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.keys[key]; e != nil && e.owner == owner && !time.Now().Before(e.expires) {
		s.free(key)
	}
}
