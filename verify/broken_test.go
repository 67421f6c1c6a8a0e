package verify

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// The verifier's own proof: each checker catches a driver broken its way,
// and a correct driver passes. The drivers wrap memdriver (a correct
// in-process store) under the "broken" scheme, one store per test.

type brokenKind int

const (
	correct      brokenKind = iota
	grantsTwice             // grants a held key anyway, with a fresh fence
	reusesFence             // every grant of a key gets fence 7
	fencesShrink            // fences go down: every newer holder's writes are refused
)

type brokenDriver struct {
	driver.Driver
	kind brokenKind
	host string

	mu   sync.Mutex
	next uint64
}

func (b *brokenDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := b.Driver.TryAcquire(ctx, req)
	switch {
	case errors.Is(err, driver.ErrNotAcquired) && (b.kind == grantsTwice || takeJump(b.host)):
		b.mu.Lock()
		b.next++
		g, err = driver.Grant{Fence: 1<<30 + b.next}, nil
		b.mu.Unlock()
	case b.kind == reusesFence && err == nil:
		g.Fence = 7
	case b.kind == fencesShrink && err == nil:
		g.Fence = 1<<40 - g.Fence
	}
	return g, err
}

// Renew and Release of a grant the store never made (grantsTwice)
// answer OK: the broken store believes its own lie.
func (b *brokenDriver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	err := b.Driver.Renew(ctx, key, owner, ttl)
	if b.kind == grantsTwice && errors.Is(err, driver.ErrLeaseLost) {
		return nil
	}
	return err
}

var (
	brokenMu    sync.Mutex
	brokenKinds = map[string]brokenKind{}
	// brokenJumps counts, per store, the held keys its jumped clock lets it
	// grant again (jumpTarget).
	brokenJumps = map[string]int{}
)

// takeJump uses up one early grant of host's jumped clock, if any is left.
func takeJump(host string) bool {
	brokenMu.Lock()
	defer brokenMu.Unlock()
	if brokenJumps[host] > 0 {
		brokenJumps[host]--
		return true
	}
	return false
}

func init() {
	driver.Register("broken", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		brokenMu.Lock()
		kind := brokenKinds[u.Host]
		brokenMu.Unlock()
		return &brokenDriver{Driver: memdriver.New(memdriver.Named("broken-" + u.Host)), kind: kind, host: u.Host}, nil
	})
}

// brokenTarget is a Target over a broken store.
type brokenTarget struct{ host string }

func (t brokenTarget) Name() string { return "broken" }
func (t brokenTarget) URL() string  { return "broken://" + t.host }
func (t brokenTarget) Close() error { return nil }

// jumpTarget is a broken store whose clock the verifier can move: after
// each jump it grants a held key again once, as a store whose expiry clock
// leapt past its grants' deadlines would.
type jumpTarget struct{ brokenTarget }

func (t jumpTarget) JumpClock(_ context.Context, d time.Duration) (string, error) {
	brokenMu.Lock()
	brokenJumps[t.host]++
	brokenMu.Unlock()
	return "the store", nil
}

func runBroken(t *testing.T, kind brokenKind, faults string) *Result {
	t.Helper()
	return runBrokenOn(t, kind, faults, false)
}

func runBrokenOn(t *testing.T, kind brokenKind, faults string, jumps bool) *Result {
	t.Helper()
	host := strings.NewReplacer("/", "-", "_", "-").Replace(strings.ToLower(t.Name()))
	brokenMu.Lock()
	brokenKinds[host] = kind
	brokenMu.Unlock()
	var target Target = brokenTarget{host: host}
	if jumps {
		target = jumpTarget{brokenTarget{host: host}}
	}
	res, err := Run(context.Background(), Config{
		Faults: faults, Duration: 4 * time.Second, TTL: 250 * time.Millisecond, Clients: 4, Keys: 1, Seed: 7, Dir: t.TempDir(),
	}, target)
	if err != nil {
		t.Fatal(err)
	}
	f := res.Findings
	t.Logf("grants %d, writes %d, double grants %d (store %d), fence violations %d, stale accepted %d refused %d, linearizable %s",
		f.Grants, f.WritesAccepted, f.DoubleGrants, f.EarlyGrants, f.FenceViolations, f.StaleWritesAccepted, f.StaleWritesRefused, f.Linearizable)
	if f.Grants < 5 || f.WritesAccepted < 5 {
		t.Fatalf("the run did too little to judge: %d grants, %d writes accepted", f.Grants, f.WritesAccepted)
	}
	return res
}

func TestRun_CorrectDriverPasses(t *testing.T) {
	f := runBroken(t, correct, "none").Findings
	if f.Unsafe() || f.DoubleGrants != 0 || f.StaleWritesRefused != 0 || f.Linearizable != "ok" {
		t.Fatalf("a correct store was found wanting: %+v", f)
	}
}

func TestRun_CatchesDoubleGrants(t *testing.T) {
	res := runBroken(t, grantsTwice, "none")
	f := res.Findings
	if f.DoubleGrants == 0 || f.EarlyGrants == 0 {
		t.Fatalf("a store that grants held keys was not caught: double grants %d, early %d", f.DoubleGrants, f.EarlyGrants)
	}
	if f.Linearizable != "illegal" {
		t.Fatalf("porcupine said %q of a store that grants held keys", f.Linearizable)
	}
	if res.Visualization == "" {
		t.Fatal("no porcupine visualisation written for an illegal history")
	}
}

func TestRun_CatchesFenceReuse(t *testing.T) {
	f := runBroken(t, reusesFence, "none").Findings
	if f.FenceViolations == 0 {
		t.Fatal("a store that reuses fences was not caught by the fence checker")
	}
	if f.Linearizable != "illegal" {
		t.Fatalf("porcupine said %q of a store that reuses fences", f.Linearizable)
	}
}

// A store whose fences shrink: the fence checker catches it, and the
// register refuses every newer holder (the first fence is the greatest).
func TestRun_CatchesShrinkingFences(t *testing.T) {
	f := runBroken(t, fencesShrink, "none").Findings
	if f.FenceViolations == 0 || f.StaleWritesRefused == 0 {
		t.Fatalf("shrinking fences not caught: fence violations %d, refused %d", f.FenceViolations, f.StaleWritesRefused)
	}
}

// A paused holder on a store that reuses fences: it wakes after the next
// holder (same fence) wrote, and its late write is accepted.
func TestRun_CatchesPausedHolderWrite(t *testing.T) {
	f := runBroken(t, reusesFence, "pause").Findings
	if f.StaleWritesAccepted == 0 {
		t.Fatalf("no stale write accepted found, though fences shrink under pauses (double grants %d, refused %d)", f.DoubleGrants, f.StaleWritesRefused)
	}
}

// A pause on a correct store makes two holders act at once (the paused
// one wakes and writes), and fencing refuses the stale write: double
// grants without an early grant, no stale write accepted.
func TestRun_PauseOnCorrectStoreIsFenced(t *testing.T) {
	f := runBroken(t, correct, "pause").Findings
	if f.DoubleGrants == 0 || f.StaleWritesRefused == 0 {
		t.Fatalf("the pause left no trace: double grants %d, refused %d", f.DoubleGrants, f.StaleWritesRefused)
	}
	if f.Unsafe() {
		t.Fatalf("a correct store under pauses judged unsafe: %+v", f)
	}
}

func TestRun_ClockJumpOnCorrectStoreIsFenced(t *testing.T) {
	f := runBroken(t, correct, "clock-jump").Findings
	if f.DoubleGrants == 0 {
		t.Fatal("the clock jump left no double grant")
	}
	if f.Unsafe() {
		t.Fatalf("a correct store under clock jumps judged unsafe: %+v", f)
	}
}

// A store whose clock jumps and which then grants held keys again is
// caught granting early: the grant came while its holder still counted on
// its lease.
func TestRun_CatchesStoreClockJump(t *testing.T) {
	f := runBrokenOn(t, correct, "store-clock-jump", true).Findings
	if f.EarlyGrants == 0 || !f.Unsafe() {
		t.Fatalf("a store granting held keys after its clock jumped was not caught: early grants %d, %+v", f.EarlyGrants, f)
	}
}

func TestRun_RefusesWhatTheTargetCannotDo(t *testing.T) {
	_, err := Run(context.Background(), Config{Faults: "kill", Duration: 2 * time.Second, TTL: 100 * time.Millisecond}, brokenTarget{host: "x"})
	if !errors.Is(err, ErrUnsupportedFault) || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("kill on a store the verifier did not start: %v, want ErrUnsupportedFault", err)
	}
	_, err = Run(context.Background(), Config{Faults: "store-clock-jump", Duration: 2 * time.Second, TTL: 100 * time.Millisecond}, brokenTarget{host: "x"})
	if !errors.Is(err, ErrUnsupportedFault) || !strings.Contains(err.Error(), "cannot move its clock") {
		t.Fatalf("store-clock-jump on a store without a clock hook: %v, want ErrUnsupportedFault", err)
	}
	_, err = Run(context.Background(), Config{Faults: "nonsense"}, brokenTarget{host: "x"})
	if err == nil || !strings.Contains(err.Error(), "unknown fault") {
		t.Fatalf("unknown fault: %v", err)
	}
	_, err = Run(context.Background(), Config{Duration: time.Second, TTL: time.Second}, brokenTarget{host: "x"})
	if err == nil {
		t.Fatal("a run shorter than 5 TTLs was accepted")
	}
}
