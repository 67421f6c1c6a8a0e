package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// LeaseSet is a group of leases acquired together by AcquireAll. It is lost
// as a whole: when any member is lost, Done closes, Context is cancelled
// with that member's ErrLeaseLost, and the other members are released on
// the store at once (in the background).
type LeaseSet struct {
	leases []*Lease

	ctx    context.Context
	cancel context.CancelCauseFunc
	stops  []func() bool

	once sync.Once
	err  error
}

// AcquireAll acquires every key, as Acquire does, in sorted order with
// duplicates removed — so two callers naming the same keys in any order
// cannot deadlock — and returns them as one LeaseSet. When any acquisition
// fails it releases what it took, in reverse order, and returns that
// failure (errors as for Acquire). An empty key list is ErrInvalidKey.
func (l *Locker) AcquireAll(ctx context.Context, keys []string, opts ...Option) (*LeaseSet, error) {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	if len(sorted) == 0 {
		return nil, fmt.Errorf("dlock: acquire all on %s: %w: no keys given", l.addr, ErrInvalidKey)
	}
	for _, k := range sorted {
		if err := ValidateKey(k); err != nil {
			return nil, l.wrap("acquire", k, err)
		}
	}
	o := l.callOptions(opts)
	leases := make([]*Lease, 0, len(sorted))
	for _, k := range sorted {
		ls, err := l.acquire(ctx, k, true, o)
		if err != nil {
			for i := len(leases) - 1; i >= 0; i-- {
				relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.opTimeout)
				_ = leases[i].Release(relCtx)
				cancel()
			}
			return nil, err
		}
		leases = append(leases, ls)
	}
	set := &LeaseSet{leases: leases}
	set.ctx, set.cancel = context.WithCancelCause(context.Background())
	for _, ls := range leases {
		set.stops = append(set.stops, context.AfterFunc(ls.Context(), func() {
			cause := context.Cause(ls.Context())
			set.cancel(cause)
			if errors.Is(cause, ErrLeaseLost) {
				set.releaseOthers(l, ls)
			}
		}))
	}
	return set, nil
}

// releaseOthers releases, in the background and in reverse key order,
// every member but lost: the set is lost as a whole, so its other keys must
// not stay held (and renewed) until the caller gets round to Release. The
// Locker's Close waits for it. Their Release then returns nil (or what the
// store said), and the set's Release still reports the loss.
func (s *LeaseSet) releaseOthers(l *Locker, lost *Lease) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return // Close ends every lease itself
	}
	l.cleanups.Add(1) // under l.mu, so never concurrently with Close's Wait
	l.mu.Unlock()
	go func() {
		defer l.cleanups.Done()
		for i := len(s.leases) - 1; i >= 0; i-- {
			if ls := s.leases[i]; ls != lost {
				_ = ls.Release(context.Background()) // bounded by the op timeout
			}
		}
	}()
}

// Leases returns the members, sorted by key.
func (s *LeaseSet) Leases() []*Lease { return slices.Clone(s.leases) }

// Keys returns the keys, sorted.
func (s *LeaseSet) Keys() []string {
	out := make([]string, len(s.leases))
	for i, ls := range s.leases {
		out[i] = ls.Key()
	}
	return out
}

// Done is closed when the first member ends (lost, released or closed).
func (s *LeaseSet) Done() <-chan struct{} { return s.ctx.Done() }

// Context is cancelled when the first member ends, with that member's
// error as its cause.
func (s *LeaseSet) Context() context.Context { return s.ctx }

// Err returns nil while every member is held, else the cause of the first
// member that ended.
func (s *LeaseSet) Err() error { return context.Cause(s.ctx) }

// Release releases every member in reverse key order and returns their
// errors joined (matching ErrLeaseLost when any member was lost). Calling it
// again returns the same result.
func (s *LeaseSet) Release(ctx context.Context) error {
	s.once.Do(func() {
		var errs []error
		for i := len(s.leases) - 1; i >= 0; i-- {
			errs = append(errs, s.leases[i].Release(ctx))
		}
		for _, stop := range s.stops {
			stop()
		}
		s.cancel(ErrReleased)
		s.err = errors.Join(errs...)
	})
	return s.err
}
