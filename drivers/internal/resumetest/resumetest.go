// Package resumetest checks a driver's driver.Resumer against its real
// store, at driver level (below the root package's Locker.Resume, whose
// conformance case is dlocktest's Lease_Resume). Each driver's resume test
// starts its server and calls Run; every check opens its drivers through
// Harness.Open, so that two drivers act as two processes: one makes a
// grant and exits (or keeps running), the other resumes it by owner token
// and fence.
//
// The checks follow the driver.Resumer contract: a resumed grant keeps its
// fence and is renewed to a full TTL (the key stays held past the TTL while
// the resuming process renews, and its release frees the key); a grant that
// was released, expired or taken over, a wrong fence and a wrong owner are
// driver.ErrLeaseLost and change nothing; invalid input is
// driver.ErrInvalidArgument; an ended context returns promptly with an
// error matching ctx.Err().
package resumetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

// Harness says how to reach one store.
type Harness struct {
	// Open opens a new driver on the store, as another process would.
	// Required. Run closes every driver it opens.
	Open func(ctx context.Context) (driver.Driver, error)
	// TTL is the TTL of the grants the checks make. Zero: 1 s.
	TTL time.Duration
	// StoreExpires says that the store ends an unrenewed grant by itself
	// (a server-side TTL: PostgreSQL's clock, an etcd lease, a Consul
	// session) and that the driver is a driver.Inspector, so that a grant
	// can be seen expired without anyone taking it over. Stores whose
	// expiry is a waiter's observation (DynamoDB, Cloud Storage) leave it
	// false: there, an unrenewed grant nobody took over is still the
	// owner's, and resuming it is as safe as a late renewal.
	StoreExpires bool
	// NoStoreExpiryReason, when StoreExpires is false, says why (shown in
	// the skip of AfterStoreExpiryIsLost). Zero value: the store does not
	// expire an unrenewed grant by itself.
	NoStoreExpiryReason string
	// End, when set, ends req's grant on the store without its owner (for
	// stores whose shortest expiry is too long for a test: an Azure blob
	// lease lasts at least 15 s). When nil, the grant is ended by expiry:
	// another driver polls TryAcquire until it takes the key over.
	End func(t *testing.T, req driver.AcquireRequest)
	// MaxExpiry bounds how long the expiry checks wait for a grant to end.
	// Zero: 20 s.
	MaxExpiry time.Duration
	// Freeze makes the store stop answering while it keeps its
	// connections (SIGSTOP, testservers.Freezer) and Thaw undoes it; with
	// both set, a Resume against the frozen store must end with its
	// context. Required: every store the tests start can be frozen.
	Freeze, Thaw func() error
}

// Run runs every check against the store behind h.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil || h.Freeze == nil || h.Thaw == nil {
		t.Fatal("resumetest: Harness.Open, Freeze and Thaw are required")
	}
	if h.TTL == 0 {
		h.TTL = time.Second
	}
	if h.MaxExpiry == 0 {
		h.MaxExpiry = 20 * time.Second
	}
	s := &suite{h: h}
	t.Run("KeepsFenceAndRenews", s.testKeepsFence)
	t.Run("OwnerInBothProcesses", s.testBothProcesses)
	t.Run("AfterReleaseIsLost", s.testAfterRelease)
	t.Run("AfterTakeoverIsLost", s.testAfterTakeover)
	t.Run("AfterStoreExpiryIsLost", s.testAfterExpiry)
	t.Run("WrongFenceOrOwnerIsLost", s.testWrongFence)
	t.Run("EndedContextReturnsPromptly", s.testEndedContext)
	t.Run("FrozenStoreBoundedByContext", s.testFrozen)
	t.Run("InvalidInput", s.testInvalid)
}

type suite struct{ h Harness }

// open opens a driver that is a driver.Resumer, closed when t ends.
func (s *suite) open(t *testing.T) (driver.Driver, driver.Resumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	d, err := s.h.Open(ctx)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	r, ok := d.(driver.Resumer)
	if !ok {
		t.Fatalf("%T is not a driver.Resumer", d)
	}
	return d, r
}

// Owner returns a new owner token: 128 random bits in hex, as the root
// package makes them.
func Owner() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *suite) req(t *testing.T, holder string) driver.AcquireRequest {
	return driver.AcquireRequest{
		Key:    "resumetest/" + t.Name() + "/" + Owner()[:8],
		Owner:  Owner(),
		TTL:    s.h.TTL,
		Holder: holder,
	}
}

// ctx returns a context bounded for one call.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustGrant(t *testing.T, d driver.Driver, req driver.AcquireRequest) driver.Grant {
	t.Helper()
	g, err := d.TryAcquire(ctx(t), req)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", req.Key, err)
	}
	if g.Fence == 0 {
		t.Fatalf("TryAcquire(%q): fence 0", req.Key)
	}
	return g
}

// mustHeld checks, from d, that key is held by someone else.
func mustHeld(t *testing.T, d driver.Driver, key string) {
	t.Helper()
	other := driver.AcquireRequest{Key: key, Owner: Owner(), TTL: time.Second}
	g, err := d.TryAcquire(ctx(t), other)
	if err == nil {
		_ = d.Release(ctx(t), key, other.Owner)
		t.Fatalf("key %q should be held, but another owner got it (fence %d)", key, g.Fence)
	}
	if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) of a held key = %v, want ErrNotAcquired", key, err)
	}
}

func mustLost(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("%s = %v, want ErrLeaseLost", what, err)
	}
}

// notClosed checks that a Lost channel (when the driver pushes loss) is
// still open.
func notClosed(t *testing.T, g driver.Grant) {
	t.Helper()
	if g.Lost == nil {
		return
	}
	select {
	case <-g.Lost:
		t.Fatal("Grant.Lost of a held grant is closed")
	default:
	}
}

// testKeepsFence: A grants and exits without releasing; B resumes with the
// same fence, keeps the key past its TTL by renewing, and its release
// frees the key for a greater fence.
func (s *suite) testKeepsFence(t *testing.T) {
	a, _ := s.open(t)
	b, rb := s.open(t)
	c, _ := s.open(t)
	req := s.req(t, "process A")
	g := mustGrant(t, a, req)
	_ = a.Close() // the process exits; its grant stays on the store

	res := req
	res.Holder = "process B"
	rg, err := rb.Resume(ctx(t), res, g.Fence)
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if rg.Fence != g.Fence {
		t.Fatalf("Resume: fence %d, want the grant's %d", rg.Fence, g.Fence)
	}
	notClosed(t, rg)
	// Renewed by B for two TTLs: still held.
	end := time.Now().Add(2 * s.h.TTL)
	for time.Now().Before(end) {
		if err := b.Renew(ctx(t), req.Key, req.Owner, req.TTL); err != nil {
			t.Fatalf("Renew after Resume: %v", err)
		}
		time.Sleep(s.h.TTL / 4)
	}
	mustHeld(t, c, req.Key)
	notClosed(t, rg)
	if in, ok := c.(driver.Inspector); ok {
		info, err := in.Inspect(ctx(t), req.Key)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		if info.Fence != g.Fence {
			t.Fatalf("Inspect after Resume: fence %d, want %d", info.Fence, g.Fence)
		}
	}
	// Resuming again (the same process, or yet another) is idempotent.
	rg2, err := rb.Resume(ctx(t), res, g.Fence)
	if err != nil || rg2.Fence != g.Fence {
		t.Fatalf("second Resume = %d, %v; want %d, nil", rg2.Fence, err, g.Fence)
	}
	if err := b.Release(ctx(t), req.Key, req.Owner); err != nil {
		t.Fatalf("Release after Resume: %v", err)
	}
	g2 := mustGrant(t, c, driver.AcquireRequest{Key: req.Key, Owner: Owner(), TTL: req.TTL})
	if g2.Fence <= g.Fence {
		t.Fatalf("fence after the resumed grant's release: %d, want > %d", g2.Fence, g.Fence)
	}
}

// testBothProcesses: A keeps running while B resumes A's grant; the owner
// token is the grant's identity, so A's release ends it for both.
func (s *suite) testBothProcesses(t *testing.T) {
	a, _ := s.open(t)
	b, rb := s.open(t)
	c, _ := s.open(t)
	req := s.req(t, "process A")
	g := mustGrant(t, a, req)
	rg, err := rb.Resume(ctx(t), req, g.Fence)
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := a.Renew(ctx(t), req.Key, req.Owner, req.TTL); err != nil {
		t.Fatalf("A's Renew after B's Resume: %v", err)
	}
	if err := a.Release(ctx(t), req.Key, req.Owner); err != nil {
		t.Fatalf("A's Release after B's Resume: %v", err)
	}
	if rg.Lost != nil {
		// A driver that pushes loss tells the resumer too.
		select {
		case <-rg.Lost:
		case <-time.After(10 * time.Second):
			t.Fatal("the resumed grant's Lost did not close within 10 s of the grant's release by the other process")
		}
	}
	mustLost(t, "B's Renew after A's Release", b.Renew(ctx(t), req.Key, req.Owner, req.TTL))
	_, err = rb.Resume(ctx(t), req, g.Fence)
	mustLost(t, "B's Resume after A's Release", err)
	mustLost(t, "B's Release after A's Release", b.Release(ctx(t), req.Key, req.Owner))
	mustGrant(t, c, driver.AcquireRequest{Key: req.Key, Owner: Owner(), TTL: req.TTL})
}

// testAfterRelease: a released grant is not resumed, and the resume
// attempt leaves the next holder alone.
func (s *suite) testAfterRelease(t *testing.T) {
	a, _ := s.open(t)
	_, rb := s.open(t)
	c, _ := s.open(t)
	req := s.req(t, "")
	g := mustGrant(t, a, req)
	if err := a.Release(ctx(t), req.Key, req.Owner); err != nil {
		t.Fatal(err)
	}
	_, err := rb.Resume(ctx(t), req, g.Fence)
	mustLost(t, "Resume of a released grant (key free)", err)
	// Free, and then held by another.
	next := driver.AcquireRequest{Key: req.Key, Owner: Owner(), TTL: req.TTL}
	g2 := mustGrant(t, c, next)
	_, err = rb.Resume(ctx(t), req, g.Fence)
	mustLost(t, "Resume of a released grant (key held by another)", err)
	if err := c.Renew(ctx(t), next.Key, next.Owner, next.TTL); err != nil {
		t.Fatalf("the next holder's Renew after a refused Resume: %v", err)
	}
	if in, ok := c.(driver.Inspector); ok {
		info, err := in.Inspect(ctx(t), req.Key)
		if err != nil || info.Fence != g2.Fence {
			t.Fatalf("Inspect after a refused Resume = fence %d, %v; want %d", info.Fence, err, g2.Fence)
		}
	}
}

// end ends req's grant: by Harness.End, or by letting it expire until c
// takes the key over. It returns the taker's request when c took it.
func (s *suite) end(t *testing.T, c driver.Driver, req driver.AcquireRequest) (driver.AcquireRequest, bool) {
	t.Helper()
	if s.h.End != nil {
		s.h.End(t, req)
		return driver.AcquireRequest{}, false
	}
	next := driver.AcquireRequest{Key: req.Key, Owner: Owner(), TTL: req.TTL}
	deadline := time.Now().Add(s.h.MaxExpiry)
	for {
		_, err := c.TryAcquire(ctx(t), next)
		if err == nil {
			return next, true
		}
		if !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("TryAcquire while waiting for expiry: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unrenewed grant of %q was not taken over within %v", req.Key, s.h.MaxExpiry)
		}
		time.Sleep(s.h.TTL / 5)
	}
}

// testAfterTakeover: a grant that expired (or was ended without its owner)
// and was taken over is not resumed, and the new holder keeps its grant.
func (s *suite) testAfterTakeover(t *testing.T) {
	a, _ := s.open(t)
	_, rb := s.open(t)
	c, _ := s.open(t)
	req := s.req(t, "")
	g := mustGrant(t, a, req)
	_ = a.Close()
	next, took := s.end(t, c, req)
	if !took {
		next = driver.AcquireRequest{Key: req.Key, Owner: Owner(), TTL: req.TTL}
		mustGrant(t, c, next)
	}
	_, err := rb.Resume(ctx(t), req, g.Fence)
	mustLost(t, "Resume after expiry and takeover", err)
	if err := c.Renew(ctx(t), next.Key, next.Owner, next.TTL); err != nil {
		t.Fatalf("the new holder's Renew after a refused Resume: %v", err)
	}
	mustHeld(t, a2(t, s), req.Key)
}

// a2 opens one more driver, for a look from outside.
func a2(t *testing.T, s *suite) driver.Driver {
	d, _ := s.open(t)
	return d
}

// testAfterExpiry: on a store that expires grants by itself, a grant past
// its TTL that nobody took is not resumed either.
func (s *suite) testAfterExpiry(t *testing.T) {
	if !s.h.StoreExpires {
		why := s.h.NoStoreExpiryReason
		if why == "" {
			why = "the store does not expire an unrenewed grant by itself (expiry is a waiter's observation): see AfterTakeoverIsLost"
		}
		t.Skip(why)
	}
	a, _ := s.open(t)
	b, rb := s.open(t)
	in, ok := b.(driver.Inspector)
	if !ok {
		t.Fatalf("%T: StoreExpires needs a driver.Inspector", b)
	}
	req := s.req(t, "")
	g := mustGrant(t, a, req)
	_ = a.Close()
	deadline := time.Now().Add(s.h.MaxExpiry)
	for {
		_, err := in.Inspect(ctx(t), req.Key)
		if errors.Is(err, driver.ErrNotAcquired) {
			break
		}
		if err != nil {
			t.Fatalf("Inspect while waiting for expiry: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unrenewed grant of %q did not expire within %v", req.Key, s.h.MaxExpiry)
		}
		time.Sleep(s.h.TTL / 5)
	}
	_, err := rb.Resume(ctx(t), req, g.Fence)
	mustLost(t, "Resume after expiry", err)
	c, _ := s.open(t)
	g2 := mustGrant(t, c, driver.AcquireRequest{Key: req.Key, Owner: Owner(), TTL: req.TTL})
	if g2.Fence <= g.Fence {
		t.Fatalf("fence after expiry %d, want > %d", g2.Fence, g.Fence)
	}
}

// testWrongFence: a fence or owner token that is not the grant's is
// refused, and the grant is untouched: it still expires when its owner
// stops renewing (on stores that expire by themselves), and its owner
// still renews and releases it.
func (s *suite) testWrongFence(t *testing.T) {
	a, _ := s.open(t)
	_, rb := s.open(t)
	req := s.req(t, "")
	g := mustGrant(t, a, req)
	_, err := rb.Resume(ctx(t), req, g.Fence+1)
	mustLost(t, "Resume with fence+1", err)
	if g.Fence > 1 {
		_, err = rb.Resume(ctx(t), req, g.Fence-1)
		mustLost(t, "Resume with fence-1", err)
	}
	other := req
	other.Owner = Owner()
	_, err = rb.Resume(ctx(t), other, g.Fence)
	mustLost(t, "Resume by another owner token", err)
	missing := req
	missing.Key += "/never-acquired"
	_, err = rb.Resume(ctx(t), missing, g.Fence)
	mustLost(t, "Resume of a key never acquired", err)
	if err := a.Renew(ctx(t), req.Key, req.Owner, req.TTL); err != nil {
		t.Fatalf("the owner's Renew after refused Resumes: %v", err)
	}
	if s.h.StoreExpires {
		// Refused resumes, every TTL/3 for two TTLs, must not have kept
		// the grant alive.
		in := a.(driver.Inspector)
		deadline := time.Now().Add(s.h.MaxExpiry)
		for {
			_, _ = rb.Resume(ctx(t), req, g.Fence+1)
			_, _ = rb.Resume(ctx(t), other, g.Fence)
			_, err := in.Inspect(ctx(t), req.Key)
			if errors.Is(err, driver.ErrNotAcquired) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("refused Resumes kept the grant of %q alive past %v", req.Key, s.h.MaxExpiry)
			}
			time.Sleep(s.h.TTL / 3)
		}
		return
	}
	if err := a.Release(ctx(t), req.Key, req.Owner); err != nil {
		t.Fatalf("the owner's Release after refused Resumes: %v", err)
	}
}

// testEndedContext: Resume with an ended context returns promptly with an
// error matching ctx.Err(), and the grant stays its owner's.
func (s *suite) testEndedContext(t *testing.T) {
	a, _ := s.open(t)
	_, rb := s.open(t)
	req := s.req(t, "")
	g := mustGrant(t, a, req)
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	start := time.Now()
	_, err := rb.Resume(cancelled, req, g.Fence)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Resume with a cancelled context = %v, want context.Canceled", err)
	}
	expired, cancel2 := context.WithTimeout(t.Context(), time.Nanosecond)
	defer cancel2()
	<-expired.Done()
	_, err = rb.Resume(expired, req, g.Fence)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Resume with an expired context = %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Resume with ended contexts took %v", took)
	}
	if err := a.Renew(ctx(t), req.Key, req.Owner, req.TTL); err != nil {
		t.Fatalf("the owner's Renew: %v", err)
	}
	if err := a.Release(ctx(t), req.Key, req.Owner); err != nil {
		t.Fatalf("the owner's Release: %v", err)
	}
}

// testFrozen: a Resume sent to a store that does not answer ends when its
// context does (within a loaded machine's slack), with an error matching
// the context's, and the grant is still its owner's once the store is
// back.
func (s *suite) testFrozen(t *testing.T) {
	a, _ := s.open(t)
	_, rb := s.open(t)
	req := s.req(t, "")
	req.TTL = max(req.TTL, 5*time.Second) // outlives the freeze
	g := mustGrant(t, a, req)
	if err := s.h.Freeze(); err != nil {
		t.Fatalf("Freeze: %v", err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := s.h.Thaw(); err != nil {
				t.Fatalf("Thaw: %v", err)
			}
		}
	}
	defer thaw()
	c, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := rb.Resume(c, req, g.Fence)
	took := time.Since(start)
	thaw()
	if err == nil || errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Resume against a frozen store = %v, want a store error", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Resume against a frozen store = %v, want an error matching context.DeadlineExceeded", err)
	}
	if took > 3*time.Second {
		t.Fatalf("Resume against a frozen store took %v with a 300 ms context", took)
	}
	if err := a.Renew(ctx(t), req.Key, req.Owner, req.TTL); err != nil {
		t.Fatalf("the owner's Renew after the thaw: %v", err)
	}
	if err := a.Release(ctx(t), req.Key, req.Owner); err != nil {
		t.Fatalf("the owner's Release after the thaw: %v", err)
	}
}

// testInvalid: input outside the contract is ErrInvalidArgument (the
// matching sentinel), and touches nothing.
func (s *suite) testInvalid(t *testing.T) {
	a, _ := s.open(t)
	_, rb := s.open(t)
	req := s.req(t, "")
	g := mustGrant(t, a, req)
	cases := []struct {
		name  string
		mod   func(r *driver.AcquireRequest)
		fence uint64
		want  error
	}{
		{"empty key", func(r *driver.AcquireRequest) { r.Key = "" }, g.Fence, driver.ErrInvalidKey},
		{"NUL in key", func(r *driver.AcquireRequest) { r.Key += "\x00" }, g.Fence, driver.ErrInvalidKey},
		{"empty owner", func(r *driver.AcquireRequest) { r.Owner = "" }, g.Fence, driver.ErrInvalidArgument},
		{"owner with a slash", func(r *driver.AcquireRequest) { r.Owner = "a/b" }, g.Fence, driver.ErrInvalidArgument},
		{"TTL 0", func(r *driver.AcquireRequest) { r.TTL = 0 }, g.Fence, driver.ErrInvalidTTL},
		{"TTL over 24h", func(r *driver.AcquireRequest) { r.TTL = 25 * time.Hour }, g.Fence, driver.ErrInvalidTTL},
		{"holder with a newline", func(r *driver.AcquireRequest) { r.Holder = "a\nb" }, g.Fence, driver.ErrInvalidHolder},
		{"fence 0", func(r *driver.AcquireRequest) {}, 0, driver.ErrInvalidArgument},
	}
	for _, tc := range cases {
		r := req
		tc.mod(&r)
		_, err := rb.Resume(ctx(t), r, tc.fence)
		if !errors.Is(err, tc.want) || !errors.Is(err, driver.ErrInvalidArgument) {
			t.Errorf("Resume with %s = %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := a.Release(ctx(t), req.Key, req.Owner); err != nil {
		t.Fatalf("the owner's Release after invalid Resumes: %v", err)
	}
}
