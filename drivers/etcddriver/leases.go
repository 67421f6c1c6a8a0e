package etcddriver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Shared leases
//
// A Driver puts every entry it creates (grants and waiters, plain and
// read-write) on one etcd lease per lease TTL in whole seconds, shared by
// all of them, as etcd's concurrency.Session shares one lease between the
// mutexes of a session. A sharedLease is granted by the first entry that
// needs it, kept alive by one loop (a KeepAliveOnce every third of its
// TTL, and one for every batch of renewals, see keepAlive), and revoked
// once it has had no entry for a whole TTL, or at Close when it has none.
// The package doc says what this means for loss.

// testHookExpiring, when set by a test, runs in a lease's loop after it
// marked expired grants and before it deletes their entries.
var testHookExpiring atomic.Pointer[func()]

// testHookNoLoopKeepAlive, when set by a test, stops the leases' loops from
// sending their periodic keepalives (as when they time out unanswered).
var testHookNoLoopKeepAlive atomic.Bool

// sharedLease is one etcd lease shared by the driver's entries of one TTL.
type sharedLease struct {
	d    *Driver
	id   clientv3.LeaseID
	secs int64         // the lease's TTL on the store, in seconds
	ttl  time.Duration // secs as a Duration
	dead chan struct{} // closed when etcd no longer knows the lease, or it was retired

	// Guarded by d.mu.
	gone      bool              // dead closed; no new entry may use the lease
	users     int               // grants, waiters and enqueues in flight on it
	idleSince time.Time         // when users last fell to 0
	grants    map[string]*grant // entry key → grant, for expiry
	orphans   map[string]int64  // entry key → create revision (0: unknown) still to delete

	// The keepalive batch: callers join next, which is sent only after
	// they joined (so its confirmation covers their request), by one of
	// at most maxKeepAliveSenders senders.
	kmu     sync.Mutex
	next    *keepCall
	senders int
	// confirmed is when the last confirmed keepalive (or the grant of
	// the lease) was sent: etcd keeps the lease at least secs from then.
	confirmed time.Time
}

// keepCall is one KeepAliveOnce of a shared lease, shared by its callers.
type keepCall struct {
	done chan struct{}
	err  error
}

// leaseCreate is a lease grant in flight, shared by the entries that wait
// for it.
type leaseCreate struct {
	done    chan struct{}
	err     error
	waiting int // callers still waiting (guarded by d.mu); 0 at the answer: revoke
}

// useLease returns the shared lease for ttl, granting it when the driver has
// none, and counts the caller as one of its users (unuse undoes that). The
// grant runs under the op timeout, not ctx: a caller whose ctx ends gets
// ctx's error at once, and a lease etcd grants after every waiting caller
// gave up is revoked when its answer arrives, so no caller who gave up
// leaves a lease nobody uses.
func (d *Driver) useLease(ctx context.Context, ttl time.Duration) (*sharedLease, error) {
	secs := leaseSeconds(ttl)
	for {
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return nil, errClosed
		}
		if s := d.leases[secs]; s != nil && !s.gone {
			s.users++
			d.mu.Unlock()
			return s, nil
		}
		c := d.creating[secs]
		if c == nil {
			c = &leaseCreate{done: make(chan struct{})}
			d.creating[secs] = c
			d.wg.Add(1) // under d.mu: never concurrently with Close's Wait
			go d.createLease(secs, c)
		}
		c.waiting++
		d.mu.Unlock()
		select {
		case <-c.done:
			d.mu.Lock()
			c.waiting--
			d.mu.Unlock()
			if c.err != nil {
				return nil, c.err
			}
			// The lease is in d.leases now (or already gone: ask again).
		case <-ctx.Done():
			d.mu.Lock()
			c.waiting--
			d.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// errClosed is returned by useLease on a closed driver.
var errClosed = errors.New("driver closed")

// createLease grants the shared lease of secs and records it, or revokes it
// when nobody waits for it any more (or the driver closed meanwhile).
func (d *Driver) createLease(secs int64, c *leaseCreate) {
	defer d.wg.Done()
	gctx, cancel := context.WithTimeout(d.closeCtx, d.opTimeout)
	sent := time.Now()
	lg, err := d.cli.Grant(gctx, secs)
	cancel()
	d.mu.Lock()
	delete(d.creating, secs)
	if err != nil {
		c.err = err
		close(c.done)
		d.mu.Unlock()
		return
	}
	if d.closed || c.waiting == 0 {
		c.err = errors.New("etcd lease granted after every caller gave up")
		if d.closed {
			c.err = errClosed
		}
		close(c.done)
		d.mu.Unlock()
		d.revoke(context.Background(), lg.ID)
		return
	}
	s := &sharedLease{
		d: d, id: lg.ID, secs: secs, ttl: time.Duration(secs) * time.Second,
		dead: make(chan struct{}), idleSince: time.Now(),
		grants: map[string]*grant{}, orphans: map[string]int64{},
		confirmed: sent,
	}
	d.leases[secs] = s
	d.wg.Add(1)
	close(c.done)
	d.mu.Unlock()
	go s.loop()
}

// unuse counts one user of s fewer. Call with d.mu held.
func (s *sharedLease) unuseLocked() {
	s.users--
	if s.users <= 0 {
		s.users = 0
		s.idleSince = time.Now()
	}
}

// unuse is unuseLocked taking d.mu.
func (s *sharedLease) unuse() {
	s.d.mu.Lock()
	s.unuseLocked()
	s.d.mu.Unlock()
}

// retireLocked marks s unusable and takes it out of the driver's map. Call
// with d.mu held; it reports whether s was still in use by nobody's
// choice (false when already gone).
func (s *sharedLease) retireLocked() bool {
	if s.gone {
		return false
	}
	s.gone = true
	close(s.dead)
	if s.d.leases[s.secs] == s {
		delete(s.d.leases, s.secs)
	}
	return true
}

// markDead records that etcd no longer knows s: every entry on it is gone
// (their watchers report the loss), and the next entry gets a new lease.
func (s *sharedLease) markDead() {
	s.d.mu.Lock()
	s.retireLocked()
	s.d.mu.Unlock()
}

// maxKeepAliveSenders is how many KeepAliveOnce calls of one lease may be
// in flight at once. With one, a caller that arrives just after a call was
// sent waits for it and then for the next, up to two round trips; with
// two, the next is sent at once, and callers wait about one.
const maxKeepAliveSenders = 2

// keepAlive returns once a KeepAliveOnce of s sent after the call began
// has been confirmed (so the lease lives at least its TTL from then on the
// store), or with its error. Concurrent callers share one KeepAliveOnce:
// those that arrive while maxKeepAliveSenders are in flight share the
// next. An answer that etcd does not know the lease marks s dead and
// matches rpctypes.ErrLeaseNotFound.
func (s *sharedLease) keepAlive(ctx context.Context) error {
	s.kmu.Lock()
	c := s.next
	if c == nil {
		c = &keepCall{done: make(chan struct{})}
		s.next = c
	}
	start := s.senders < maxKeepAliveSenders
	if start {
		s.senders++
	}
	s.kmu.Unlock()
	if start {
		s.d.mu.Lock()
		if s.d.closed {
			s.d.mu.Unlock()
			// Fail the batch, and everyone who joined it, at once, unless
			// the other sender took it already (it answers then).
			s.kmu.Lock()
			s.senders--
			mine := s.next == c
			if mine {
				s.next = nil
			}
			s.kmu.Unlock()
			if mine {
				c.err = errClosed
				close(c.done)
				return errClosed
			}
		} else {
			s.d.wg.Add(1)
			s.d.mu.Unlock()
			go s.send()
		}
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// confirmedSince reports whether a keepalive (or the lease's grant) sent
// at or after t was confirmed already: etcd then keeps the lease at least
// its TTL from t.
func (s *sharedLease) confirmedSince(t time.Time) bool {
	s.kmu.Lock()
	defer s.kmu.Unlock()
	return !s.confirmed.Before(t)
}

// keptFrom returns how long from t etcd keeps the lease at least with no
// further keepalive: its TTL from the send of the last confirmed keepalive
// (or of its grant), less the time from that send to t.
func (s *sharedLease) keptFrom(t time.Time) time.Duration {
	s.kmu.Lock()
	defer s.kmu.Unlock()
	return s.confirmed.Add(s.ttl).Sub(t)
}

// send sends the pending keepalive batches, one after the other, until
// none is pending (another sender may take some of them).
func (s *sharedLease) send() {
	defer s.d.wg.Done()
	for {
		s.kmu.Lock()
		c := s.next
		s.next = nil
		if c == nil {
			s.senders--
			s.kmu.Unlock()
			return
		}
		s.kmu.Unlock()
		kctx, cancel := context.WithTimeout(s.d.closeCtx, s.d.opTimeout)
		sent := time.Now()
		_, c.err = s.d.cli.KeepAliveOnce(kctx, s.id)
		cancel()
		if errors.Is(c.err, rpctypes.ErrLeaseNotFound) {
			s.markDead()
		}
		if c.err == nil {
			s.kmu.Lock()
			if sent.After(s.confirmed) {
				s.confirmed = sent
			}
			s.kmu.Unlock()
		}
		close(c.done)
	}
}

// loop keeps s alive every third of its TTL, expires the driver's grants on
// it that were not renewed within the lease TTL, deletes orphaned entries,
// and retires s (revoking it) once it has had no user for a whole TTL.
func (s *sharedLease) loop() {
	d := s.d
	defer d.wg.Done()
	t := time.NewTicker(s.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-d.closeCtx.Done():
			return
		case <-s.dead:
			return
		case <-t.C:
		}
		now := time.Now()
		d.mu.Lock()
		if s.users == 0 && len(s.orphans) == 0 && now.Sub(s.idleSince) >= s.ttl {
			s.retireLocked()
			d.mu.Unlock()
			d.revoke(d.closeCtx, s.id)
			return
		}
		type entry struct {
			k   string
			rev int64
			g   *grant
		}
		var del []entry
		for k, g := range s.grants {
			if now.After(g.deadline) {
				g.expiring = true // a renewal in flight now reports the grant lost
				del = append(del, entry{k, g.fence, g})
			}
		}
		orphans := make([]entry, 0, len(s.orphans))
		for k, rev := range s.orphans {
			orphans = append(orphans, entry{k, rev, nil})
		}
		d.mu.Unlock()
		if h := testHookExpiring.Load(); h != nil && len(del) > 0 {
			(*h)()
		}
		// A grant its holder stopped renewing ends as its own etcd lease
		// would have: the delete is seen by its loss watcher. One whose
		// entry is on another lease now (resumed by another process) is
		// left alone there, and lost here.
		for _, e := range del {
			if deleted, err := d.deleteEntry(d.closeCtx, e.k, e.rev, s.id); err == nil && !deleted {
				d.markLost(e.k, e.g)
			}
		}
		for _, e := range orphans {
			if _, err := d.deleteEntry(d.closeCtx, e.k, e.rev, s.id); err == nil {
				d.mu.Lock()
				delete(s.orphans, e.k)
				d.mu.Unlock()
			}
		}
		if testHookNoLoopKeepAlive.Load() {
			continue
		}
		kctx, cancel := context.WithTimeout(d.closeCtx, min(d.opTimeout, s.ttl/3))
		_ = s.keepAlive(kctx)
		cancel()
	}
}

// deleteEntry deletes entry k only if it is on lease id and its create
// revision is rev (any revision when rev is 0: k names a unique owner
// token, so it is never another grant's), bounded by the op timeout. It
// reports whether it deleted the entry.
func (d *Driver) deleteEntry(ctx context.Context, k string, rev int64, id clientv3.LeaseID) (bool, error) {
	dctx, cancel := context.WithTimeout(ctx, d.opTimeout)
	defer cancel()
	cmp := []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(k), "=", id)}
	if rev != 0 {
		cmp = append(cmp, clientv3.Compare(clientv3.CreateRevision(k), "=", rev))
	}
	resp, err := d.cli.Txn(dctx).If(cmp...).Then(clientv3.OpDelete(k)).Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// abandon deletes the entry k (create revision rev, 0 when unknown) that an
// attempt put on s and will not keep, then counts the attempt off s. An
// entry that cannot be deleted now is deleted by s's loop later; until then
// it is a waiter at most (never granted to anyone), or a grant nobody holds
// that ends when the delete succeeds or the lease ends.
func (d *Driver) abandon(ctx context.Context, s *sharedLease, k string, rev int64) {
	_, err := d.deleteEntry(context.WithoutCancel(ctx), k, rev, s.id)
	d.mu.Lock()
	if err != nil && !s.gone {
		s.orphans[k] = rev
	}
	s.unuseLocked()
	d.mu.Unlock()
}

// closeLeases is Close's part: it retires every shared lease and returns
// those without a user, to revoke (a lease with a grant or an orphan is
// left to expire on the store with its TTL). Call with d.mu held.
func (d *Driver) closeLeasesLocked() []clientv3.LeaseID {
	var idle []clientv3.LeaseID
	for _, s := range d.leases {
		if s.users == 0 && len(s.grants) == 0 && len(s.orphans) == 0 {
			idle = append(idle, s.id)
		}
		s.retireLocked()
	}
	return idle
}
