// Package dlocktest is the conformance suite every dlock driver passes
// against a real store: each line of the contract in DESIGN.md section 2 is
// a named subtest. A driver's test file starts its real server and calls Run
// with a Harness (go-cloud's drivertest is the model). A capability the
// driver lacks is skipped by name, with the reason, never passed silently.
//
// The suite can fail: its own tests run it against deliberately broken
// drivers (one that releases without checking the owner, one that grants a
// held key, one that reuses a fence, one that never reports a lost lease)
// and check that the subtest named for the broken line fails. Subtests
// therefore take a TB, which *testing.T satisfies and a recorder can too.
package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// TB is the part of testing.TB the suite uses. *testing.T satisfies it; the
// suite's own tests pass a recorder, so that they can run a subtest that is
// meant to fail and look at the result.
type TB interface {
	Helper()
	Name() string
	Context() context.Context
	Cleanup(func())
	Error(args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Skipf(format string, args ...any)
	Log(args ...any)
	Logf(format string, args ...any)
	Failed() bool
}

// Subtest is one named conformance check.
type Subtest struct {
	// Name is the subtest's name under Run, e.g.
	// "Release_LostLeaseLeavesSuccessor".
	Name string
	// Run runs the check; t is the subtest's own TB.
	Run func(t TB)
}

// Subtests returns the conformance subtests against the store behind h, in
// the order Run runs them. h.NewDriver must be set.
func Subtests(h Harness) []Subtest {
	if h.TTL == 0 {
		h.TTL = time.Second
	}
	s := &suite{h: h}
	return []Subtest{
		{"TryAcquire_HeldKeyIsNotAcquired", s.testTryAcquireHeld},
		{"MutualExclusion_Counter", s.testMutualExclusion},
		{"Fence_IncreasesInGrantOrder", s.testFenceIncreases},
		{"Renewal_KeepsLeasePastTTL", s.testRenewalKeepsLease},
		{"Renewal_AfterTakeoverIsLeaseLost", s.testRenewAfterTakeover},
		{"Expiry_TakeoverAfterBlockedRenewals", s.testExpiryTakeover},
		{"Release_Idempotent", s.testReleaseIdempotent},
		{"Release_LostLeaseLeavesSuccessor", s.testReleaseLost},
		{"Release_ReplayedDoesNotTouchNewGrant", s.testReleaseReplayed},
		{"Acquire_CancelRacingGrant", s.testCancelRace},
		{"Acquire_InvalidInput", s.testInvalidInput},
		{"Driver_InvalidInputIsInvalidArgument", s.testDriverInvalidInput},
		{"Keys_AnyCharacterWorks", s.testKeysWork},
		{"Waiters_FIFO", s.testFIFO},
		{"Store_DownIsUnavailable", s.testStoreDown},
		{"Store_DownLosesHeldLease", s.testStoreDownLosesLease},
		{"Store_DownFailOpenIsDegraded", s.testFailOpen},
		{"Store_RestartKeepsFencesIncreasing", s.testRestartFences},
		{"Store_FrozenIsBoundedByOpTimeout", s.testFrozen},
		{"Driver_CutOffIsUnavailable", s.testCutOff},
		{"Link_ResetWithinTTLKeepsLease", s.testLinkReset},
		{"Link_HeldPastTTLThenHealedAcquiresAgain", s.testLinkHealed},
		{"AcquireAll_OppositeOrdersNoDeadlock", s.testAcquireAllOrder},
		{"AcquireAll_OneLostLosesSet", s.testAcquireAllLost},
		{"Close_EndsLeasesAndAcquisitions", s.testClose},
		{"Lease_MaxHoldStopsRenewing", s.testMaxHold},
		{"Lease_Resume", s.testResume},
		{"Recipe_Election", s.testElection},
		{"Recipe_Semaphore", s.testSemaphore},
		{"Recipe_RWLock", s.testRWLock},
		{"Recipe_Once", s.testOnce},
		{"Goroutines_NoLeak", s.testNoLeak},
	}
}

// Run runs every conformance subtest against the store behind h.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.NewDriver == nil {
		t.Fatal("dlocktest: Harness.NewDriver is required")
	}
	for _, st := range Subtests(h) {
		t.Run(st.Name, func(t *testing.T) { st.Run(t) })
	}
}

type suite struct {
	h Harness
}

// locker opens a Locker over a new driver wrapped in a FaultDriver.
func (s *suite) locker(t TB, opts ...dlock.Option) (*dlock.Locker, *FaultDriver) {
	t.Helper()
	d, err := s.h.NewDriver(t.Context())
	if err != nil {
		t.Fatalf("%s: NewDriver: %v", s.h.Name, err)
	}
	fd := NewFaultDriver(d, t.Logf)
	base := []dlock.Option{
		dlock.WithStoreName(s.h.Name), dlock.WithTTL(10 * time.Second),
		dlock.WithBackoff(time.Millisecond, 25*time.Millisecond), dlock.WithOpTimeout(2 * time.Second),
	}
	l := dlock.New(fd, append(base, opts...)...)
	t.Cleanup(func() { _ = l.Close() })
	return l, Faults(fd)
}

// key returns a key unique to this subtest and run.
func key(t TB, suffix string) string {
	return fmt.Sprintf("dlocktest:%s:%d:%s", t.Name(), time.Now().UnixNano(), suffix)
}

func mustAcquire(t TB, l *dlock.Locker, key string, opts ...dlock.Option) *dlock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ls, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return ls
}

func release(t TB, ls *dlock.Lease) {
	t.Helper()
	if err := ls.Release(t.Context()); err != nil {
		t.Fatalf("Release(%q): %v", ls.Key(), err)
	}
}

// assertHeld checks, from another client, that key is held.
func assertHeld(t TB, other *dlock.Locker, key string) {
	t.Helper()
	ls, err := other.TryAcquire(t.Context(), key)
	if err == nil {
		_ = ls.Release(t.Context())
		t.Fatalf("key %q should be held, but another client acquired it (fence %d)", key, ls.Fence())
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) on a held key = %v, want ErrNotAcquired", key, err)
	}
}

// assertFree checks, from another client, that key can be acquired.
func assertFree(t TB, other *dlock.Locker, key string) {
	t.Helper()
	ls, err := other.TryAcquire(t.Context(), key)
	if err != nil {
		t.Fatalf("key %q should be free, TryAcquire = %v", key, err)
	}
	release(t, ls)
}

func (s *suite) skipNoFence(t TB) {
	t.Helper()
	if s.h.NoFence {
		t.Skipf("%s issues no fencing tokens: %s", s.h.Name, s.h.NoFenceReason)
	}
}

func (s *suite) testTryAcquireHeld(t TB) {
	a, _ := s.locker(t)
	b, _ := s.locker(t)
	k := key(t, "k")
	ls, err := a.TryAcquire(t.Context(), k)
	if err != nil {
		t.Fatalf("TryAcquire on a free key: %v", err)
	}
	if ls.Key() != k || len(ls.Owner()) < 32 || ls.Err() != nil || ls.Degraded() {
		t.Fatalf("lease: key %q owner %q err %v degraded %v", ls.Key(), ls.Owner(), ls.Err(), ls.Degraded())
	}
	if !s.h.NoFence && ls.Fence() == 0 {
		t.Fatal("fence is 0")
	}
	start := time.Now()
	_, err = b.TryAcquire(t.Context(), k)
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire = %v, want ErrNotAcquired", err)
	}
	if !strings.Contains(err.Error(), k) {
		t.Errorf("error %q does not name the key", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("TryAcquire on a held key took %v, want at once", d)
	}
	release(t, ls)
	assertFree(t, b, k)
}

// testMutualExclusion: 16 contenders, each its own client, 50 acquisitions
// each, increment a counter (not atomically) with a yield and a short random
// sleep (up to 300 µs, so that an overlap has a window to happen in)
// between read and write; any overlap loses an increment or trips the
// overlap detector.
func (s *suite) testMutualExclusion(t TB) {
	const contenders, rounds = 16, 50
	k := key(t, "counter")
	// A read-modify-write that is not atomic: the lock is its only
	// protection, so an overlap loses an increment. Load and Store are
	// atomic each only so that the race detector does not end the run when
	// a broken driver lets holders overlap (the suite's own tests do that).
	var counter atomic.Int64
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, contenders)
	for i := range contenders {
		l, _ := s.locker(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				ls, err := l.Acquire(ctx, k)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("contender %d: %w", i, err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				v := counter.Load()
				runtime.Gosched()
				time.Sleep(rand.N(300 * time.Microsecond))
				counter.Store(v + 1)
				inside.Add(-1)
				if err := ls.Release(t.Context()); err != nil {
					errs <- fmt.Errorf("contender %d release: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if overlaps.Load() != 0 {
		t.Errorf("%d acquisitions overlapped another holder", overlaps.Load())
	}
	if got := counter.Load(); got != contenders*rounds {
		t.Errorf("counter = %d, want %d", got, contenders*rounds)
	}
}

func (s *suite) testFenceIncreases(t TB) {
	s.skipNoFence(t)
	a, _ := s.locker(t)
	b, _ := s.locker(t)
	k := key(t, "k")
	var last uint64
	for i := range 20 {
		l := a
		if i%2 == 1 {
			l = b
		}
		ls := mustAcquire(t, l, k)
		if ls.Fence() <= last {
			t.Fatalf("grant %d: fence %d not greater than previous %d", i, ls.Fence(), last)
		}
		last = ls.Fence()
		release(t, ls)
	}
	// Another key's grants do not make this key's fences go back.
	other := mustAcquire(t, a, key(t, "other"))
	release(t, other)
	ls := mustAcquire(t, b, k)
	if ls.Fence() <= last {
		t.Fatalf("fence %d after another key's grant is not greater than %d", ls.Fence(), last)
	}
	release(t, ls)
}

func (s *suite) testRenewalKeepsLease(t TB) {
	ttl := s.h.TTL
	a, _ := s.locker(t)
	b, _ := s.locker(t)
	k := key(t, "k")
	ls := mustAcquire(t, a, k, dlock.WithTTL(ttl))
	first := ls.Deadline()
	timer := time.NewTimer(3 * ttl)
	select {
	case <-ls.Done():
		t.Fatalf("lease lost while renewing: %v", ls.Err())
	case <-timer.C:
	}
	if !ls.Deadline().After(first) {
		t.Errorf("deadline did not move: first %v, now %v", first, ls.Deadline())
	}
	assertHeld(t, b, k)
	release(t, ls)
	assertFree(t, b, k)
}

// expireA makes the store end a's grant: renewals are blocked, and where the
// harness can force expiry, it does.
func (s *suite) expireA(t TB, fd *FaultDriver) {
	t.Helper()
	fd.BlockRenewals(true)
	if s.h.ForceExpiry != nil {
		if err := s.h.ForceExpiry(t.Context(), fd.Inner()); err != nil {
			t.Fatalf("ForceExpiry: %v", err)
		}
	}
}

// testExpiryTakeover: holder A's renewals are blocked; A must see Done close
// by its own deadline, and B must be granted only after that, with a greater
// fence.
func (s *suite) testExpiryTakeover(t TB) {
	ttl := s.h.TTL
	a, fa := s.locker(t)
	b, _ := s.locker(t)
	k := key(t, "k")
	la := mustAcquire(t, a, k, dlock.WithTTL(ttl))
	probe := startProbe(t)
	s.expireA(t, fa)

	doneAt := make(chan time.Time, 1)
	go func() {
		<-la.Done()
		doneAt <- time.Now()
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*ttl+10*time.Second)
	defer cancel()
	lb, err := b.Acquire(ctx, k, dlock.WithTTL(ttl))
	grantedB := time.Now()
	if err != nil {
		t.Fatalf("B could not take over after A's expiry: %v", err)
	}
	defer release(t, lb)
	var aDone time.Time
	select {
	case aDone = <-doneAt:
	case <-time.After(time.Second):
		t.Fatal("A's Done() still open after B was granted")
	}
	if !errors.Is(la.Err(), dlock.ErrLeaseLost) {
		t.Errorf("A.Err() = %v, want ErrLeaseLost", la.Err())
	}
	if cause := context.Cause(la.Context()); !errors.Is(cause, dlock.ErrLeaseLost) {
		t.Errorf("A's context cause = %v, want ErrLeaseLost", cause)
	}
	// A's own deadline, final now that the lease is lost (a renewal that
	// was in flight when renewals were blocked may have moved it).
	deadline := la.Deadline()
	// Timers fire a little after their time; the slack scales with the
	// scheduling delay measured meanwhile. Safety is checked strictly below.
	slack := probe.slack(lossBase)
	t.Logf("A's Done observed %v after A's deadline, %v after B's grant (allowed %v: scheduling delay up to %v)",
		aDone.Sub(deadline), aDone.Sub(grantedB), slack, probe.Worst())
	if late := aDone.Sub(deadline); late > slack {
		t.Errorf("A's Done closed %v after A's deadline, more than the %v allowed", late, slack)
	}
	if !deadline.Before(grantedB) {
		t.Errorf("B was granted %v before A's deadline", deadline.Sub(grantedB))
	}
	// A's Done is observed by another goroutine, so on a loaded machine the
	// observation may land a little after B's grant even when the timer
	// fired in time; the deadline check above is the strict one.
	if late := aDone.Sub(grantedB); late > slack {
		t.Errorf("A's Done closed %v after B's grant, more than the %v allowed", late, slack)
	}
	if !s.h.NoFence && lb.Fence() <= la.Fence() {
		t.Errorf("B's fence %d not greater than A's %d", lb.Fence(), la.Fence())
	}
}

func (s *suite) testReleaseIdempotent(t TB) {
	a, _ := s.locker(t)
	b, _ := s.locker(t)
	k := key(t, "k")
	ls := mustAcquire(t, a, k)
	release(t, ls)
	if err := ls.Release(t.Context()); err != nil {
		t.Fatalf("second Release = %v, want nil", err)
	}
	select {
	case <-ls.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	if !errors.Is(ls.Err(), dlock.ErrReleased) || !errors.Is(context.Cause(ls.Context()), dlock.ErrReleased) {
		t.Errorf("after Release: Err %v, cause %v; want ErrReleased", ls.Err(), context.Cause(ls.Context()))
	}
	assertFree(t, b, k)
}

func (s *suite) testReleaseLost(t TB) {
	ttl := s.h.TTL
	a, fa := s.locker(t)
	b, _ := s.locker(t)
	c, _ := s.locker(t)
	k := key(t, "k")
	la := mustAcquire(t, a, k, dlock.WithTTL(ttl))
	s.expireA(t, fa)
	lb := mustAcquire(t, b, k, dlock.WithTTL(ttl))
	<-la.Done()
	fa.BlockRenewals(false)
	err := la.Release(t.Context())
	if !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of a lost lease = %v, want ErrLeaseLost", err)
	}
	// The Lease answered from what it knew: the store was not asked. Ask
	// the driver itself, with A's owner token, as a release sent just
	// before A learnt of the loss would: it must leave B's grant alone.
	err = storeAnswer(t, func(ctx context.Context) error { return fa.Inner().Release(ctx, k, la.Owner()) })
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("driver Release with the lost owner's token = %v, want ErrLeaseLost", err)
	}
	assertHeld(t, c, k)
	if lb.Err() != nil {
		t.Fatalf("B's lease ended: %v", lb.Err())
	}
	release(t, lb)
}

// testRenewAfterTakeover: once A's grant has expired and B holds the key,
// a renewal with A's owner token is refused with ErrLeaseLost (the answer
// that makes the root declare the lease lost) and changes nothing.
func (s *suite) testRenewAfterTakeover(t TB) {
	ttl := s.h.TTL
	a, fa := s.locker(t)
	b, _ := s.locker(t)
	c, _ := s.locker(t)
	k := key(t, "k")
	la := mustAcquire(t, a, k, dlock.WithTTL(ttl))
	s.expireA(t, fa)
	lb := mustAcquire(t, b, k, dlock.WithTTL(ttl))
	<-la.Done()
	err := storeAnswer(t, func(ctx context.Context) error { return fa.Inner().Renew(ctx, k, la.Owner(), ttl) })
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("driver Renew with the expired owner's token = %v, want ErrLeaseLost", err)
	}
	assertHeld(t, c, k)
	if lb.Err() != nil {
		t.Fatalf("B's lease ended: %v", lb.Err())
	}
	release(t, lb)
}

// storeAnswer calls fn until the store answers (nil or an error that is not
// a store error: a client cut off by ForceExpiry may need a moment to get
// its link and session back), at most 20 s, and returns that answer.
func storeAnswer(t TB, fn func(ctx context.Context) error) error {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err := fn(ctx)
		cancel()
		if err == nil || errors.Is(err, driver.ErrLeaseLost) || errors.Is(err, driver.ErrNotAcquired) {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store did not answer within 20 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testReleaseReplayed: a release of an earlier grant (a lost reply, retried
// late) by the same client, after it acquired the key again, must not
// touch the new grant: owner tokens are per grant.
func (s *suite) testReleaseReplayed(t TB) {
	a, fa := s.locker(t)
	c, _ := s.locker(t)
	k := key(t, "k")
	first := mustAcquire(t, a, k)
	fa.DropReleaseReplies(true)
	err := first.Release(t.Context())
	fa.DropReleaseReplies(false)
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Release with a lost reply = %v, want ErrUnavailable", err)
	}
	second := mustAcquire(t, a, k)
	if first.Owner() == second.Owner() {
		t.Fatal("two grants share an owner token")
	}
	err = fa.Inner().Release(t.Context(), k, first.Owner())
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("replayed Release = %v, want ErrLeaseLost", err)
	}
	assertHeld(t, c, k)
	release(t, second)
	assertFree(t, c, k)
}

// testCancelRace: a waiter's context ends at random moments around the
// holder's release. A nil error must mean the waiter holds the key; an error
// must match the context's and leave nothing behind.
func (s *suite) testCancelRace(t TB) {
	const rounds = 500
	h, _ := s.locker(t)
	w, _ := s.locker(t)
	c, _ := s.locker(t)
	k := key(t, "k")
	// The window scales with the store's speed, so that both outcomes
	// happen on a slow store too: 3 ms or three acquire+release cycles.
	began := time.Now()
	release(t, mustAcquire(t, h, k))
	window := max(3*time.Millisecond, 3*time.Since(began))
	granted, canceled := 0, 0
	for i := range rounds {
		hl := mustAcquire(t, h, k)
		ctx, cancel := context.WithTimeout(t.Context(), rand.N(window))
		result := make(chan error, 1)
		var wl *dlock.Lease
		go func() {
			var err error
			wl, err = w.Acquire(ctx, k)
			result <- err
		}()
		time.Sleep(rand.N(window))
		release(t, hl)
		err := <-result
		cancel()
		if err == nil {
			granted++
			assertHeld(t, c, k)
			release(t, wl)
		} else {
			canceled++
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("round %d: error %v does not match the context's", i, err)
			}
		}
		// Nothing may be left behind: a third client gets the key at once.
		ls, err := c.TryAcquire(t.Context(), k)
		if err != nil {
			t.Fatalf("round %d: key left held after the waiter returned (granted=%v): %v", i, wl != nil, err)
		}
		release(t, ls)
	}
	t.Logf("%d rounds, window %v: %d granted, %d cancelled", rounds, window, granted, canceled)
	if granted == 0 || canceled == 0 {
		t.Errorf("the race was not exercised: %d granted, %d cancelled", granted, canceled)
	}
}

func (s *suite) testInvalidInput(t TB) {
	l, _ := s.locker(t)
	k := key(t, "k")
	keys := []struct {
		name, key string
	}{
		{"empty", ""},
		{"1MiB", strings.Repeat("k", 1<<20)},
		{"513 bytes", strings.Repeat("k", 513)},
		{"NUL", "a\x00b"},
		{"invalid UTF-8", "a\xff\xfeb"},
	}
	for _, tc := range keys {
		_, err := l.TryAcquire(t.Context(), tc.key)
		if !errors.Is(err, dlock.ErrInvalidKey) {
			t.Errorf("TryAcquire(%s key) = %v, want ErrInvalidKey", tc.name, err)
		}
		_, err = l.Acquire(t.Context(), tc.key)
		if !errors.Is(err, dlock.ErrInvalidKey) {
			t.Errorf("Acquire(%s key) = %v, want ErrInvalidKey", tc.name, err)
		}
	}
	ttls := []struct {
		name string
		opts []dlock.Option
	}{
		{"zero TTL", []dlock.Option{dlock.WithTTL(0)}},
		{"negative TTL", []dlock.Option{dlock.WithTTL(-time.Second)}},
		{"below floor", []dlock.Option{dlock.WithTTL(99 * time.Millisecond)}},
		{"above 24h", []dlock.Option{dlock.WithTTL(25 * time.Hour)}},
		{"heartbeat not below TTL", []dlock.Option{dlock.WithTTL(time.Second), dlock.WithHeartbeat(time.Second)}},
	}
	for _, tc := range ttls {
		_, err := l.TryAcquire(t.Context(), k, tc.opts...)
		if !errors.Is(err, dlock.ErrInvalidTTL) {
			t.Errorf("TryAcquire with %s = %v, want ErrInvalidTTL", tc.name, err)
		}
	}
	if _, err := l.AcquireAll(t.Context(), nil); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Errorf("AcquireAll(no keys) = %v, want ErrInvalidKey", err)
	}
	if _, err := l.AcquireAll(t.Context(), []string{k, ""}); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Errorf("AcquireAll with an empty key = %v, want ErrInvalidKey", err)
	}
	assertFree(t, l, k) // nothing was taken by the failed calls
}

func (s *suite) testKeysWork(t TB) {
	a, _ := s.locker(t)
	b, _ := s.locker(t)
	base := key(t, "")
	// 512 bytes exactly, ending in a 4-byte rune.
	long := base + strings.Repeat("x", 512-len(base)-4) + "🔒"
	keys := []string{
		base + "a/b/c", base + "/leading", base + "with space", base + "a:b:c", base + "{tag}",
		base + "}{", base + "emoji 🔒🗝", base + "a%2Fb", base + "a%b", base + "*?[]", base + `back\slash`,
		base + "quote'\"", base + "\n\t", long,
	}
	if len(long) != 512 {
		t.Fatalf("test bug: long key is %d bytes", len(long))
	}
	leases := map[string]*dlock.Lease{}
	for _, k := range keys {
		ls, err := a.TryAcquire(t.Context(), k)
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", k, err)
		}
		leases[k] = ls
	}
	// Every key is its own lock: all are held at once, none blocks another.
	for _, k := range keys {
		assertHeld(t, b, k)
	}
	for _, k := range keys {
		release(t, leases[k])
	}
	for _, k := range keys {
		assertFree(t, b, k)
	}
}

func (s *suite) testFIFO(t TB) {
	probe, _ := s.locker(t)
	if _, ok := probe.Driver().(driver.Waiter); !ok {
		t.Skipf("%s has no Waiter capability: waiters poll with backoff, no order is promised", s.h.Name)
	}
	if _, ok := probe.Driver().(driver.Inspector); !ok {
		t.Skipf("%s has no Inspector capability: the suite cannot see the queue to order waiters", s.h.Name)
	}
	k := key(t, "k")
	holder := mustAcquire(t, probe, k)
	const n = 5
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		l, _ := s.locker(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ls, err := l.Acquire(t.Context(), k)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i
			_ = ls.Release(t.Context())
		}()
		// Wait until waiter i is queued before starting the next one.
		waitFor(t, 10*time.Second, func() bool {
			info, err := probe.Inspect(t.Context(), k)
			return err == nil && info.Waiters == i+1
		}, fmt.Sprintf("waiter %d to be queued", i))
	}
	release(t, holder)
	wg.Wait()
	close(order)
	next := 0
	for i := range order {
		if i != next {
			t.Fatalf("waiter %d was served in place %d", i, next)
		}
		next++
	}
	if next != n {
		t.Fatalf("%d of %d waiters served", next, n)
	}
}

func waitFor(t TB, timeout time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (s *suite) skipNoStoreControl(t TB) {
	t.Helper()
	if s.h.StopStore == nil || s.h.StartStore == nil {
		t.Skipf("%s harness cannot stop and start the store", s.h.Name)
	}
}

// stopStore stops the store and makes sure it is started again when the
// subtest ends, whatever happens.
func (s *suite) stopStore(t TB) (start func()) {
	t.Helper()
	if err := s.h.StopStore(); err != nil {
		t.Fatalf("StopStore: %v", err)
	}
	var once sync.Once
	start = func() {
		once.Do(func() {
			if err := s.h.StartStore(); err != nil {
				t.Fatalf("StartStore: %v", err)
			}
		})
	}
	t.Cleanup(start)
	return start
}

func (s *suite) testStoreDown(t TB) {
	s.skipNoStoreControl(t)
	l, _ := s.locker(t, dlock.WithOpTimeout(time.Second))
	k := key(t, "k")
	start := s.stopStore(t)
	// TryAcquire makes one attempt; a waiting Acquire with no retry budget
	// (WithRetryFor(0)) too: both report the outage within the op timeout.
	for _, wait := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		began := time.Now()
		var ls *dlock.Lease
		var err error
		if wait {
			ls, err = l.Acquire(ctx, k, dlock.WithRetryFor(0))
		} else {
			ls, err = l.TryAcquire(ctx, k)
		}
		took := time.Since(began)
		cancel()
		if !errors.Is(err, dlock.ErrUnavailable) || ls != nil {
			t.Fatalf("acquire (wait=%v) with the store down = %v, %v; want ErrUnavailable and no lease", wait, ls, err)
		}
		if took > 5*time.Second {
			t.Errorf("acquire (wait=%v) took %v to report the outage, want within the op timeout", wait, took)
		}
	}
	// A waiting Acquire by default retries the outage until its ctx ends,
	// then reports both. (5 s: longer than any driver's own op timeout, so
	// that at least one attempt has failed by then.)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	began := time.Now()
	waited, err := l.Acquire(ctx, k)
	took := time.Since(began)
	cancel()
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || waited != nil {
		t.Fatalf("waiting Acquire with the store down = %v, %v; want ErrUnavailable and DeadlineExceeded, no lease", waited, err)
	}
	if took < 4500*time.Millisecond || took > 9*time.Second {
		t.Errorf("waiting Acquire with the store down took %v, want about its ctx's 5s", took)
	}
	start()
	// Back: acquisitions work again (the client may need a moment to reconnect).
	var ls *dlock.Lease
	waitFor(t, 20*time.Second, func() bool {
		var err error
		ls, err = l.TryAcquire(t.Context(), k)
		return err == nil
	}, "acquisitions to work after the store came back")
	release(t, ls)
}

func (s *suite) testStoreDownLosesLease(t TB) {
	s.skipNoStoreControl(t)
	ttl := s.h.TTL
	l, _ := s.locker(t, dlock.WithOpTimeout(time.Second))
	k := key(t, "k")
	ls := mustAcquire(t, l, k, dlock.WithTTL(ttl))
	probe := startProbe(t)
	// Watched from before the stop, which may take longer than the TTL
	// (a server that flushes before it exits).
	lost := watchDone(t, ls)
	s.stopStore(t)
	awaitLost(t, probe, ls, "lease with the store gone", 10*time.Second, lost)
}

func (s *suite) testFailOpen(t TB) {
	s.skipNoStoreControl(t)
	l, _ := s.locker(t, dlock.WithOpTimeout(time.Second))
	k := key(t, "k")
	s.stopStore(t)
	ls, err := l.TryAcquire(t.Context(), k, dlock.WithFailOpen())
	if err != nil {
		t.Fatalf("TryAcquire with fail-open and the store down = %v", err)
	}
	if !ls.Degraded() || ls.Fence() != 0 {
		t.Fatalf("fail-open lease: degraded %v fence %d; want degraded, no fence", ls.Degraded(), ls.Fence())
	}
	if err := ls.Release(t.Context()); err != nil {
		t.Fatalf("Release of a degraded lease = %v", err)
	}
}

// testRestartFences: fences keep growing across a clean restart of the
// store (the harness's StopStore/StartStore).
func (s *suite) testRestartFences(t TB) {
	s.skipNoFence(t)
	s.skipNoStoreControl(t)
	l, _ := s.locker(t)
	k := key(t, "k")
	before := mustAcquire(t, l, k)
	release(t, before)
	start := s.stopStore(t)
	start()
	var after *dlock.Lease
	waitFor(t, 20*time.Second, func() bool {
		var err error
		after, err = l.TryAcquire(t.Context(), k)
		return err == nil
	}, "acquisitions to work after the restart")
	defer release(t, after)
	if after.Fence() <= before.Fence() {
		t.Fatalf("fence %d after the restart is not greater than %d before it", after.Fence(), before.Fence())
	}
}

// testCutOff uses the FaultDriver, so it runs on every store: a client cut
// off from the store fails closed, and loses a held lease by its deadline.
func (s *suite) testCutOff(t TB) {
	ttl := s.h.TTL
	l, fd := s.locker(t, dlock.WithOpTimeout(time.Second))
	k := key(t, "k")
	ls := mustAcquire(t, l, k, dlock.WithTTL(ttl))
	probe := startProbe(t)
	lost := watchDone(t, ls)
	fd.CutOff(true)
	_, err := l.TryAcquire(t.Context(), key(t, "other"))
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, ErrCutOff) {
		t.Fatalf("TryAcquire while cut off = %v, want ErrUnavailable wrapping the store error", err)
	}
	awaitLost(t, probe, ls, "lease while cut off", 10*time.Second, lost)
	fd.CutOff(false)
}

func (s *suite) testAcquireAllOrder(t TB) {
	a, _ := s.locker(t)
	b, _ := s.locker(t)
	k1, k2, k3 := key(t, "1"), key(t, "2"), key(t, "3")
	orders := [][]string{{k1, k2, k3, k1}, {k3, k2, k1}}
	var wg sync.WaitGroup
	for i, l := range []*dlock.Locker{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range 20 {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				set, err := l.AcquireAll(ctx, orders[i])
				cancel()
				if err != nil {
					t.Errorf("client %d round %d: AcquireAll: %v", i, r, err)
					return
				}
				if got := set.Keys(); len(got) != 3 || got[0] != k1 || got[2] != k3 {
					t.Errorf("Keys() = %v, want sorted and de-duplicated", got)
				}
				if err := set.Release(t.Context()); err != nil {
					t.Errorf("client %d round %d: Release: %v", i, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func (s *suite) testAcquireAllLost(t TB) {
	ttl := s.h.TTL
	a, fa := s.locker(t)
	b, _ := s.locker(t)
	keys := []string{key(t, "1"), key(t, "2")}
	set, err := a.AcquireAll(t.Context(), keys, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	held := mustAcquire(t, b, key(t, "3"))
	// A failure part-way releases what was taken.
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err = b.AcquireAll(ctx, []string{key(t, "0"), keys[0]})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireAll on a held key = %v, want the context's error", err)
	}
	assertFree(t, a, key(t, "0"))
	release(t, held)

	// One member alone is lost: the renewals of keys[0] are blocked while
	// keys[1] renews as usual. The whole set must be lost by that member's
	// deadline, and keys[1] let go on the store, not kept renewing.
	probe := startProbe(t)
	members := set.Leases()
	lost := watchDone(t, members[0])
	fa.BlockRenewalsOf(keys[0], true)
	awaitLost(t, probe, members[0], "the member whose renewals were blocked", 3*ttl, lost)
	// The set follows its member through context.AfterFunc, a moment later.
	select {
	case <-set.Done():
	case <-time.After(probe.slack(lossBase)):
		t.Fatalf("set.Done() still open %v after a member was lost", probe.slack(lossBase))
	}
	if !errors.Is(set.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("set.Err() = %v, want ErrLeaseLost", set.Err())
	}
	// The other member is released in the background: its key comes free
	// within a few round trips (kept renewing, it never would).
	var ls *dlock.Lease
	lostAt := time.Now()
	waitFor(t, 10*time.Second, func() bool {
		var err error
		ls, err = b.TryAcquire(t.Context(), keys[1])
		return err == nil
	}, "the set's other key to be released after the set was lost")
	t.Logf("the set's other key was free %v after the loss was observed", time.Since(lostAt))
	release(t, ls)
	if err := members[1].Err(); err == nil {
		t.Errorf("the set's other member is still held after the set was lost")
	}
	if err := set.Release(t.Context()); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("set.Release() = %v, want ErrLeaseLost", err)
	}
}

func (s *suite) testClose(t TB) {
	a, fa := s.locker(t)
	b, _ := s.locker(t)
	k := key(t, "k")
	ls := mustAcquire(t, a, k)
	blocked := mustAcquire(t, b, key(t, "blocked"))
	waitErr := make(chan error, 1)
	go func() {
		_, err := a.Acquire(t.Context(), blocked.Key())
		waitErr <- err
	}()
	awaitWaiting(t, fa, b, blocked.Key())
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-waitErr:
		if !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("pending Acquire after Close = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pending Acquire did not return after Close")
	}
	if !errors.Is(ls.Err(), dlock.ErrClosed) {
		t.Fatalf("lease Err after Close = %v, want ErrClosed", ls.Err())
	}
	assertFree(t, b, k) // Close released the lease on the store
	if _, err := a.TryAcquire(t.Context(), k); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryAcquire after Close = %v, want ErrClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close = %v, want nil", err)
	}
	release(t, blocked)
}

func (s *suite) testNoLeak(t TB) {
	ignore := goleak.IgnoreCurrent()
	func() {
		d, err := s.h.NewDriver(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		l := dlock.New(d, dlock.WithTTL(s.h.TTL))
		k := key(t, "k")
		for range 3 {
			ls := mustAcquire(t, l, k)
			release(t, ls)
		}
		kept := mustAcquire(t, l, key(t, "kept")) // ended by Close
		_ = kept
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	if err := goleak.Find(ignore); err != nil {
		t.Fatalf("goroutines outlived a released lease and a closed locker: %v", err)
	}
}
