package dlocktest

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// resumeLocker opens a Locker over a new, unwrapped driver of the store (a
// restarted process), with the suite's usual options.
func (s *suite) resumeLocker(t TB) (*dlock.Locker, driver.Driver) {
	t.Helper()
	d, err := s.h.NewDriver(t.Context())
	if err != nil {
		t.Fatalf("%s: NewDriver: %v", s.h.Name, err)
	}
	l := dlock.New(d, dlock.WithStoreName(s.h.Name), dlock.WithTTL(10*time.Second),
		dlock.WithBackoff(time.Millisecond, 25*time.Millisecond), dlock.WithOpTimeout(2*time.Second))
	t.Cleanup(func() { _ = l.Close() })
	return l, d
}

// testResume: Locker.Resume (issue 15 item 6). On a store whose driver is a
// driver.Resumer, a lease acquired by one process (A, which then stops
// renewing, as a killed process does) is resumed by another (B, its own
// driver): B gets the same key, owner token and fence, keeps the key past
// the TTL by its own heartbeat, with a validity deadline measured from the
// Resume request's send time, and releases it; a token with another fence,
// a released grant and an expired grant taken over by a third client are
// ErrLeaseLost (and change nothing); a malformed token is
// ErrInvalidArgument. On other stores Resume is ErrUnsupported.
func (s *suite) testResume(t TB) {
	ttl := s.h.TTL
	a, fa := s.locker(t)
	b, bd := s.resumeLocker(t)
	c, _ := s.locker(t)
	k, k2 := key(t, "k"), key(t, "expired")
	ctx, cancel := context.WithTimeout(t.Context(), 10*ttl+20*time.Second)
	defer cancel()

	la := mustAcquire(t, a, k, dlock.WithTTL(ttl))
	if _, ok := bd.(driver.Resumer); !ok {
		_, err := b.Resume(ctx, la.Token())
		if !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("%s has no driver.Resumer: Resume = %v, want ErrUnsupported", s.h.Name, err)
		}
		t.Logf("%s: Resume is ErrUnsupported, as its driver has no driver.Resumer: %v", s.h.Name, err)
		release(t, la)
		return
	}
	// k2's holder is another process, whose grant is made to expire (its
	// renewals blocked, and ForceExpiry where the harness has it).
	a2, fa2 := s.locker(t)
	la2 := mustAcquire(t, a2, k2, dlock.WithTTL(ttl))
	s.expireA(t, fa2)
	tok, tok2 := la.Token(), la2.Token()
	if tok.Key != k || tok.Owner != la.Owner() || tok.Fence != la.Fence() || tok.TTL != ttl {
		t.Fatalf("Token() = %+v, want key %q owner %q fence %d TTL %v", tok, k, la.Owner(), la.Fence(), ttl)
	}
	// A "dies": it sends no more renewals (and, lost at its deadline, never
	// touches the store again).
	fa.BlockRenewals(true)

	// Malformed tokens are refused before the store is asked.
	for _, bad := range []dlock.LeaseToken{
		{Key: "", Owner: tok.Owner, Fence: tok.Fence, TTL: ttl},
		{Key: k, Owner: "", Fence: tok.Fence, TTL: ttl},
		{Key: k, Owner: tok.Owner, Fence: 0, TTL: ttl},
		{Key: k, Owner: tok.Owner, Fence: tok.Fence, TTL: 0},
	} {
		if _, err := b.Resume(ctx, bad); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("Resume(%+v) = %v, want ErrInvalidArgument", bad, err)
		}
	}

	// A token of the same owner with another fence names no live grant.
	wrong := tok
	wrong.Fence = tok.Fence + 1
	if lw, err := b.Resume(ctx, wrong); !errors.Is(err, dlock.ErrLeaseLost) {
		if err == nil {
			_ = lw.Release(ctx)
		}
		t.Fatalf("Resume with fence %d of a grant of fence %d = %v, want ErrLeaseLost", wrong.Fence, tok.Fence, err)
	}

	sent := time.Now()
	lb, err := b.Resume(ctx, tok)
	if err != nil {
		t.Fatalf("Resume(%+v) from another driver: %v", tok, err)
	}
	if lb.Key() != k || lb.Owner() != tok.Owner || lb.Fence() != tok.Fence || lb.TTL() != ttl {
		t.Errorf("resumed lease: key %q owner %q fence %d TTL %v; want the token's %+v", lb.Key(), lb.Owner(), lb.Fence(), lb.TTL(), tok)
	}
	if dl := lb.Deadline(); dl.Before(sent) || dl.After(sent.Add(ttl)) {
		t.Errorf("resumed lease's deadline %v after the Resume was sent, want within (0, TTL %v]", dl.Sub(sent), ttl)
	}
	assertHeld(t, c, k)

	// k2's grant expires and C takes it over (on some stores expiry is
	// only a waiter's observation, so the takeover is what makes the grant
	// gone): resuming it now must fail, and leave C's grant alone.
	lc2, err := c.Acquire(ctx, k2, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatalf("C could not take over the expired grant: %v", err)
	}
	if _, err := b.Resume(ctx, tok2); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Resume of an expired grant taken over = %v, want ErrLeaseLost", err)
	}
	if !s.h.NoFence && lc2.Fence() <= tok2.Fence {
		t.Errorf("C's fence %d not greater than the expired grant's %d", lc2.Fence(), tok2.Fence)
	}
	release(t, lc2)

	// Past a TTL since the resume (and since A's last renewal): the key is
	// still held, by B's own heartbeat.
	if since := time.Since(sent); since < ttl+ttl/4 {
		time.Sleep(ttl + ttl/4 - since)
	}
	if err := lb.Err(); err != nil {
		t.Fatalf("resumed lease ended: %v", err)
	}
	assertHeld(t, c, k)
	select {
	case <-la.Done():
	case <-time.After(2 * ttl):
		t.Errorf("A's lease, renewals blocked, still not lost %v after its TTL", 2*ttl)
	}
	if !errors.Is(la.Err(), dlock.ErrLeaseLost) {
		t.Errorf("A's lease: Err %v, want ErrLeaseLost", la.Err())
	}
	assertHeld(t, c, k) // A's loss changed nothing on the store

	release(t, lb)
	if _, err := b.Resume(ctx, tok); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Resume of a released grant = %v, want ErrLeaseLost", err)
	}
	assertFree(t, c, k)
}
