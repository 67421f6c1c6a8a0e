// Package semaphore is a counting semaphore over any dlock store: up to N
// holders of one name at once, each holding a permit that is a full
// dlock.Lease, with its own owner token, TTL, heartbeat, fence and
// self-fencing context (the shape of Redisson's RPermitExpirableSemaphore
// and Curator's InterProcessSemaphoreV2: permits that expire with their
// holder).
//
//	sem, err := semaphore.New(locker, "backups", 3)
//	lease, err := sem.Acquire(ctx)
//	defer lease.Release(ctx)
//	// work under lease.Context(); lease.Fence() fences the resource
//
// # Native and portable
//
// Where the store keeps several grants of one key (the Locker's driver is a
// driver.SharedLocker whose SharedView accepts a Shared kind with Limit N:
// dlockd, mem), the semaphore is native: every permit is a Shared grant of
// the one key NativeKey(name), counted by the store, and Acquire waits in
// the store's FIFO queue (a release or an expiry hands the permit to the
// head waiter at once, in the same step). Elsewhere (Redis, Redlock, etcd,
// ZooKeeper, the SQL and cloud stores) it is portable: the name stands for
// N permit slots, the plain keys SlotKey(name, 0) .. SlotKey(name, N-1)
// ("NAME/permit-I", the scheme of dlock run --permits), each an ordinary
// lock; an acquisition tries the slots in random order and, when all are
// held, waits with full-jitter exponential backoff, woken early by release
// hints of the slots where the store gives them (driver.Hinter). Portable
// waiting is not FIFO. Native reports which one a Semaphore is.
//
// Every user of one name on one store must give the same N. Native
// semaphores refuse a different N while the key has permits
// (ErrInvalidArgument naming the key's limit); portable ones cannot tell,
// and a larger N simply adds slots. A store is native or portable for
// every client of this package, so clients never mix the two schemes
// (clients reaching one store through different drivers or versions
// could: keep them alike).
//
// # Guarantees
//
// At most N leases of a name are valid at any instant, even when a holder
// is paused past its TTL: a permit is a lease, whose context ends at its
// validity deadline (the moment its last confirmed renewal was sent, plus
// TTL minus drift, on the holder's monotonic clock), before the store can
// expire it and grant the permit again. Each permit's fence strictly
// increases per key (per NativeKey natively, per slot key portably): fence
// the protected resource by key and fence, as with any lease. A caller
// whose context ends while waiting leaves nothing held on the store.
package semaphore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// MaxPermits is the largest N: driver.MaxPermits (10,000) natively, and
// MaxPortablePermits on portable stores, where an attempt may try every
// slot.
const MaxPermits = driver.MaxPermits

// MaxPortablePermits is the largest N of a portable semaphore (one store
// round trip per slot per attempt when all are held).
const MaxPortablePermits = 1024

// Backoff bounds of the portable wait: full jitter ("Exponential Backoff
// And Jitter", AWS Architecture Blog, 2015), uniform in [0, d] with d
// doubling from backoffMin up to backoffMax after each round that found
// every slot held.
const (
	backoffMin = 20 * time.Millisecond
	backoffMax = time.Second
	// maxHintSlots bounds the release-hint subscriptions of one wait.
	maxHintSlots = 64
)

// NativeKey returns the key whose Shared grants are the permits of the
// native semaphore name: "NAME/permit-shared". It lies under the slot
// prefix "NAME/permit-", so `dlock list NAME/permit-` shows the holders of
// either kind.
func NativeKey(name string) string { return name + "/permit-shared" }

// SlotKey returns the key of slot i of the portable semaphore name:
// "NAME/permit-I", I from 0 to N-1 (dlock run --permits's scheme).
func SlotKey(name string, i int) string { return name + "/permit-" + strconv.Itoa(i) }

// Semaphore is N permits of one name on one store. It is safe for
// concurrent use and holds nothing by itself: each Acquire returns a lease
// that its caller releases.
type Semaphore struct {
	l       *dlock.Locker
	name    string
	permits int
	view    driver.Driver // the store's Shared view when native, else nil
	outage  outagePolicy
}

type outagePolicy struct {
	noRetry bool
	notify  func(error)
}

// Option configures a Semaphore (New).
type Option func(*outagePolicy)

// WithOutages sets how a portable Acquire treats a store that cannot be
// reached (an error matching dlock.ErrUnavailable): with retry (the
// default, as Locker.Acquire does) it tries again with backoff until ctx
// ends, calling notify (when not nil) with each error it retries; without,
// it returns the error at once (a WithRetryFor budget given to Acquire
// still applies to each slot's attempt). A native Acquire is
// Locker.Acquire on the store's view: outages are retried as Locker.Acquire
// retries them, and reported to the Locker's observer.
func WithOutages(retry bool, notify func(err error)) Option {
	return func(p *outagePolicy) { p.noRetry, p.notify = !retry, notify }
}

// New returns the semaphore of permits permits (1 to MaxPermits; 1 to
// MaxPortablePermits on a portable store) called name on l's store. It
// calls no store: it asks l's driver whether it can keep counted Shared
// grants (driver.SharedLocker) and picks the native or the portable scheme
// (see the package doc).
//
// Errors match dlock.ErrInvalidArgument for a nil l, a permits count out
// of range, or a name whose keys (NativeKey, or every SlotKey) are not
// valid lock keys (dlock.ErrInvalidKey); an error the driver's SharedView
// returns other than errors.ErrUnsupported is returned as is.
func New(l *dlock.Locker, name string, permits int, opts ...Option) (*Semaphore, error) {
	if l == nil {
		return nil, fmt.Errorf("semaphore: new %q: %w: nil *dlock.Locker", name, dlock.ErrInvalidArgument)
	}
	if permits < 1 || permits > MaxPermits {
		return nil, fmt.Errorf("semaphore: new %q: %w: %d permits, want 1 to %d", name, dlock.ErrInvalidArgument, permits, MaxPermits)
	}
	if err := dlock.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("semaphore: new %q: name: %w", name, err)
	}
	s := &Semaphore{l: l, name: name, permits: permits}
	for _, o := range opts {
		if o != nil {
			o(&s.outage)
		}
	}
	if sl, ok := l.Driver().(driver.SharedLocker); ok {
		v, err := sl.SharedView(driver.SharedKind{Mode: driver.Shared, Limit: permits})
		switch {
		case err == nil:
			if err := dlock.ValidateKey(NativeKey(name)); err != nil {
				return nil, fmt.Errorf("semaphore: new %q: the key %q: %w", name, NativeKey(name), err)
			}
			s.view = v
			return s, nil
		case !errors.Is(err, errors.ErrUnsupported):
			return nil, fmt.Errorf("semaphore: new %q: %w", name, err)
		}
	}
	if permits > MaxPortablePermits {
		return nil, fmt.Errorf("semaphore: new %q: %w: %d permits, want at most %d on a store without native semaphores (each attempt may try every slot)", name, dlock.ErrInvalidArgument, permits, MaxPortablePermits)
	}
	if err := dlock.ValidateKey(SlotKey(name, permits-1)); err != nil {
		return nil, fmt.Errorf("semaphore: new %q: the slot key %q: %w", name, SlotKey(name, permits-1), err)
	}
	return s, nil
}

// Acquire is New(l, name, permits) then Acquire(ctx, opts...): it waits
// for one of the permits permits of name and returns its lease. Errors as
// New's and Semaphore.Acquire's.
func Acquire(ctx context.Context, l *dlock.Locker, name string, permits int, opts ...dlock.Option) (*dlock.Lease, error) {
	s, err := New(l, name, permits)
	if err != nil {
		return nil, err
	}
	return s.Acquire(ctx, opts...)
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns N, the most holders at once.
func (s *Semaphore) Permits() int { return s.permits }

// Native reports whether the store keeps the permits itself (counted
// Shared grants of NativeKey, FIFO waiting), rather than portable slots.
func (s *Semaphore) Native() bool { return s.view != nil }

// Slot returns the slot index (0 to N-1) of a lease of a portable
// semaphore, from its key; -1 for a native permit (which has none) or a
// lease of another key.
func (s *Semaphore) Slot(lease *dlock.Lease) int {
	if lease == nil || s.view != nil {
		return -1
	}
	rest, ok := strings.CutPrefix(lease.Key(), s.name+"/permit-")
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= s.permits || SlotKey(s.name, i) != lease.Key() {
		return -1
	}
	return i
}

// Acquire waits until a permit is free and returns its lease, or returns
// when ctx ends. opts are dlock's acquisition options (WithTTL,
// WithHolder, WithRetryFor, WithFailOpen, ...), as Locker.Acquire takes.
// Natively it waits in the store's FIFO queue; portably it tries the slots
// in random order, then backs off with full jitter (20 ms doubling to 1 s),
// woken early by the slots' release hints where the store gives them.
//
// Errors, wrapped with the name: those of Locker.Acquire (ErrInvalidTTL
// and other ErrInvalidArgument before any store call, ErrUnavailable,
// ErrClosed, an error matching ctx.Err() when ctx ends first; portably it
// also matches ErrNotAcquired when every slot was held at the last try).
// When an error is returned, nothing is left held on the store.
func (s *Semaphore) Acquire(ctx context.Context, opts ...dlock.Option) (*dlock.Lease, error) {
	if s.view != nil {
		return s.native(ctx, true, opts)
	}
	return s.waitSlots(ctx, opts)
}

// TryAcquire makes one attempt (natively one request; portably one try of
// each slot, in random order) and returns a permit's lease, or an error
// matching dlock.ErrNotAcquired at once when all N are held (natively also
// when waiters are queued: FIFO). Other errors as Acquire's.
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...dlock.Option) (*dlock.Lease, error) {
	if s.view != nil {
		return s.native(ctx, false, opts)
	}
	return s.trySlots(ctx, opts)
}

// native acquires a Shared grant of NativeKey through a Locker view of the
// store's Shared view; the view lives as long as the lease.
func (s *Semaphore) native(ctx context.Context, wait bool, opts []dlock.Option) (*dlock.Lease, error) {
	v := s.l.View(s.view)
	var lease *dlock.Lease
	var err error
	if wait {
		lease, err = v.Acquire(ctx, NativeKey(s.name), opts...)
	} else {
		lease, err = v.TryAcquire(ctx, NativeKey(s.name), opts...)
	}
	if err != nil {
		_ = v.Close()
		if errors.Is(err, dlock.ErrNotAcquired) {
			return nil, fmt.Errorf("semaphore: all %d permits of %q are held: %w", s.permits, s.name, err)
		}
		return nil, fmt.Errorf("semaphore: %q: %w", s.name, err)
	}
	go closeAfter(lease, v)
	return lease, nil
}

// closeAfter closes the view v once lease has ended and any release of it
// in flight has finished (Release waits for a concurrent one). A lease
// ended by dlock.WithMaxHold keeps its grant on the store until the TTL
// runs out (a stuck holder gets that long to stop): closing the view would
// release it at once, so the view is closed only a TTL later (or with its
// parent Locker, whichever comes first).
func closeAfter(lease *dlock.Lease, v *dlock.Locker) {
	<-lease.Done()
	err := lease.Err()
	switch {
	case errors.Is(err, dlock.ErrMaxHoldReached):
		time.AfterFunc(lease.TTL(), func() { _ = v.Close() })
		return
	case errors.Is(err, dlock.ErrReleased) || errors.Is(err, dlock.ErrClosed):
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = lease.Release(ctx) // waits for the release under way
		cancel()
	}
	_ = v.Close()
}

// trySlots tries every slot once, in random order.
func (s *Semaphore) trySlots(ctx context.Context, opts []dlock.Option) (*dlock.Lease, error) {
	for _, i := range rand.Perm(s.permits) {
		lease, err := s.l.TryAcquire(ctx, SlotKey(s.name, i), opts...)
		if err == nil {
			return lease, nil
		}
		if !errors.Is(err, dlock.ErrNotAcquired) {
			return nil, fmt.Errorf("semaphore: %q: %w", s.name, err)
		}
	}
	return nil, fmt.Errorf("semaphore: all %d permits of %q (%s .. %s) are held: %w", s.permits, s.name, SlotKey(s.name, 0), SlotKey(s.name, s.permits-1), dlock.ErrNotAcquired)
}

// waitSlots tries the slots until one is granted or ctx ends.
func (s *Semaphore) waitSlots(ctx context.Context, opts []dlock.Option) (*dlock.Lease, error) {
	var hints <-chan struct{}
	stop := func() {}
	defer func() { stop() }()
	d := backoffMin
	for {
		lease, err := s.trySlots(ctx, opts)
		outage := errors.Is(err, dlock.ErrUnavailable) && !errors.Is(err, dlock.ErrInvalidArgument) &&
			!errors.Is(err, dlock.ErrClosed) && ctx.Err() == nil
		switch {
		case err == nil:
			return lease, nil
		case outage && !s.outage.noRetry:
			if s.outage.notify != nil {
				s.outage.notify(err)
			}
		case !errors.Is(err, dlock.ErrNotAcquired):
			return nil, err
		case hints == nil:
			hints, stop = s.subscribe(ctx)
		}
		t := time.NewTimer(rand.N(d) + time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("semaphore: %q: %w (%w)", s.name, ctx.Err(), err)
		case <-hints:
			t.Stop()
		case <-t.C:
		}
		d = min(2*d, backoffMax)
	}
}

// subscribe merges the release hints of the first maxHintSlots slots into
// one channel, where the driver is a driver.Hinter; a nil channel (never
// ready) where it is not. stop ends the subscriptions and their goroutines.
func (s *Semaphore) subscribe(ctx context.Context) (<-chan struct{}, func()) {
	h, ok := s.l.Driver().(driver.Hinter)
	if !ok {
		return nil, func() {}
	}
	hctx, cancel := context.WithCancel(ctx)
	out := make(chan struct{}, 1)
	var stops []func()
	done := make(chan struct{})
	n := 0
	for i := range min(s.permits, maxHintSlots) {
		ch, stop, err := h.Hint(hctx, SlotKey(s.name, i))
		if err != nil {
			continue
		}
		stops = append(stops, stop)
		n++
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-hctx.Done():
					return
				case _, ok := <-ch:
					if !ok {
						return
					}
					select {
					case out <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	return out, func() {
		cancel()
		for _, stop := range stops {
			stop()
		}
		for range n {
			<-done
		}
	}
}
