package dlocktest_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The suite can fail: each broken driver below wraps memdriver and breaks
// one line of the contract, and the subtest named for that line must fail
// against it, while the same subtest passes against memdriver intact.

// ignoresOwner releases a key whoever holds it: a bare delete.
type ignoresOwner struct{ *memdriver.Driver }

func (d ignoresOwner) Release(ctx context.Context, key, owner string) error {
	_, err := d.ForceRelease(ctx, key, "broken driver: release ignores the owner")
	if errors.Is(err, driver.ErrNotAcquired) {
		return driver.ErrLeaseLost
	}
	return err
}

// grantsTwice sometimes grants a key that is held (one attempt in ten that
// finds it held), with a fresh fence, as a store with a racy check-then-set
// would; renewals and releases of such a grant succeed. It hides the
// Waiter, so waiters poll TryAcquire.
type grantsTwice struct {
	inner *memdriver.Driver
	mu    sync.Mutex
	fence uint64
	fake  map[string]bool // owners granted a held key
}

func (d *grantsTwice) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := d.inner.TryAcquire(ctx, req)
	if errors.Is(err, driver.ErrNotAcquired) && rand.N(10) == 0 {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.fence++
		d.fake[req.Owner] = true
		return driver.Grant{Fence: 1<<40 + d.fence}, nil
	}
	return g, err
}

func (d *grantsTwice) isFake(owner string, forget bool) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	fake := d.fake[owner]
	if forget {
		delete(d.fake, owner)
	}
	return fake
}

func (d *grantsTwice) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if d.isFake(owner, false) {
		return nil
	}
	return d.inner.Renew(ctx, key, owner, ttl)
}

func (d *grantsTwice) Release(ctx context.Context, key, owner string) error {
	if d.isFake(owner, true) {
		return nil
	}
	return d.inner.Release(ctx, key, owner)
}

func (d *grantsTwice) Close() error { return d.inner.Close() }

// reusesFence hands every other grant of a key the fence of the grant
// before it, as a store that forgets its counter would.
type reusesFence struct {
	*memdriver.Driver
	mu   sync.Mutex
	n    map[string]int
	last map[string]uint64
}

func (d *reusesFence) grant(key string, g driver.Grant) driver.Grant {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n[key]++
	if last, ok := d.last[key]; ok && d.n[key]%2 == 0 {
		g.Fence = last
	}
	d.last[key] = g.Fence
	return g
}

func (d *reusesFence) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := d.Driver.TryAcquire(ctx, req)
	if err != nil {
		return g, err
	}
	return d.grant(req.Key, g), nil
}

func (d *reusesFence) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := d.Driver.Wait(ctx, req)
	if err != nil {
		return g, err
	}
	return d.grant(req.Key, g), nil
}

// neverReportsLoss answers every renewal with success, even when the owner
// no longer holds the key.
type neverReportsLoss struct{ *memdriver.Driver }

func (d neverReportsLoss) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := d.Driver.Renew(ctx, key, owner, ttl); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		return err
	}
	return nil
}

func TestSuite_CatchesBrokenDrivers(t *testing.T) {
	cases := []struct {
		name    string
		wrap    func(d *memdriver.Driver) driver.Driver
		catches []string // each must fail
	}{
		{
			name:    "release ignores the owner",
			wrap:    func(d *memdriver.Driver) driver.Driver { return ignoresOwner{d} },
			catches: []string{"Release_LostLeaseLeavesSuccessor", "Release_ReplayedDoesNotTouchNewGrant"},
		},
		{
			name:    "grants a held key",
			wrap:    func(d *memdriver.Driver) driver.Driver { return &grantsTwice{inner: d, fake: map[string]bool{}} },
			catches: []string{"MutualExclusion_Counter"},
		},
		{
			name: "reuses a fence",
			wrap: func(d *memdriver.Driver) driver.Driver {
				return &reusesFence{Driver: d, n: map[string]int{}, last: map[string]uint64{}}
			},
			catches: []string{"Fence_IncreasesInGrantOrder"},
		},
		{
			name:    "never reports loss",
			wrap:    func(d *memdriver.Driver) driver.Driver { return neverReportsLoss{d} },
			catches: []string{"Renewal_AfterTakeoverIsLeaseLost"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			broken := harness("broken", tc.wrap)
			intact := harness("intact", func(d *memdriver.Driver) driver.Driver { return d })
			for _, name := range tc.catches {
				res := runSubtest(t, broken, name)
				if !res.failed {
					t.Errorf("%s passed against a driver that %s:\n%s", name, tc.name, res.log)
				} else {
					t.Logf("%s caught the driver that %s:\n%s", name, tc.name, firstLines(res.log, 4))
				}
				if ctrl := runSubtest(t, intact, name); ctrl.failed || ctrl.skipped {
					t.Errorf("%s against memdriver intact: failed %v skipped %v:\n%s", name, ctrl.failed, ctrl.skipped, ctrl.log)
				}
			}
		})
	}
}

// TestSuite_LostSetMemberReleasesTheOthers: AcquireAll_OneLostLosesSet
// fails against a driver wrapper that cannot lose one key alone; here it
// runs against memdriver intact and must pass (the per-key fault is the
// FaultDriver's), which the root's set only does when it lets the other
// members go.
func TestSuite_LostSetMemberReleasesTheOthers(t *testing.T) {
	res := runSubtest(t, harness("intact", func(d *memdriver.Driver) driver.Driver { return d }), "AcquireAll_OneLostLosesSet")
	if res.failed || res.skipped {
		t.Fatalf("AcquireAll_OneLostLosesSet against memdriver: failed %v skipped %v:\n%s", res.failed, res.skipped, res.log)
	}
}

// TestSuite_SkipsByName: a harness without a capability skips the
// subtests that need it, with the reason in the message.
func TestSuite_SkipsByName(t *testing.T) {
	h := harness("nofaults", func(d *memdriver.Driver) driver.Driver { return d })
	h.NoFreezeReason = "a reason for the freeze"
	for name, want := range map[string]string{
		"Store_FrozenIsBoundedByOpTimeout":        "cannot freeze the store: a reason for the freeze",
		"Link_HeldPastTTLThenHealedAcquiresAgain": "cannot put a proxy on one client's link: no NewDriverVia",
	} {
		res := runSubtest(t, h, name)
		if !res.skipped || res.failed || !strings.Contains(res.log, want) {
			t.Errorf("%s: skipped %v failed %v, log %q; want a skip saying %q", name, res.skipped, res.failed, res.log, want)
		}
	}
}

func harness(name string, wrap func(*memdriver.Driver) driver.Driver) dlocktest.Harness {
	s := memdriver.NewStore()
	return dlocktest.Harness{
		Name:      name,
		NewDriver: func(context.Context) (driver.Driver, error) { return wrap(memdriver.New(s)), nil },
		TTL:       300 * time.Millisecond,
	}
}

type result struct {
	failed, skipped bool
	log             string
}

func runSubtest(t *testing.T, h dlocktest.Harness, name string) result {
	t.Helper()
	i := slices.IndexFunc(dlocktest.Subtests(h), func(st dlocktest.Subtest) bool { return st.Name == name })
	if i < 0 {
		t.Fatalf("no subtest %q", name)
	}
	r := newRecorder(t.Name() + "/" + h.Name + "/" + name)
	r.run(dlocktest.Subtests(h)[i].Run)
	return result{failed: r.Failed(), skipped: r.skipped, log: r.String()}
}

// recorder is a dlocktest.TB that records instead of reporting: Fatal and
// Skip end the subtest's goroutine (runtime.Goexit, as testing does), and
// cleanups run after the subtest, last first, with the context cancelled
// just before.
type recorder struct {
	name   string
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	failed   bool
	skipped  bool
	log      strings.Builder
	cleanups []func()
}

var _ dlocktest.TB = (*recorder)(nil)

func newRecorder(name string) *recorder {
	r := &recorder{name: name}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r
}

func (r *recorder) run(fn func(dlocktest.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	r.cancel()
	for {
		r.mu.Lock()
		if len(r.cleanups) == 0 {
			r.mu.Unlock()
			return
		}
		f := r.cleanups[len(r.cleanups)-1]
		r.cleanups = r.cleanups[:len(r.cleanups)-1]
		r.mu.Unlock()
		done := make(chan struct{})
		go func() { // a cleanup may call Fatal too
			defer close(done)
			f()
		}()
		<-done
	}
}

func (r *recorder) logLine(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log.WriteString(s)
	r.log.WriteByte('\n')
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.String()
}

func (r *recorder) Helper()                           {}
func (r *recorder) Name() string                      { return r.name }
func (r *recorder) Context() context.Context          { return r.ctx }
func (r *recorder) Log(args ...any)                   { r.logLine(fmt.Sprint(args...)) }
func (r *recorder) Logf(format string, args ...any)   { r.logLine(fmt.Sprintf(format, args...)) }
func (r *recorder) Error(args ...any)                 { r.fail(fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }
func (r *recorder) Fatal(args ...any)                 { r.fail(fmt.Sprint(args...)); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any)                 { r.skip(fmt.Sprint(args...)) }
func (r *recorder) Skipf(format string, args ...any) { r.skip(fmt.Sprintf(format, args...)) }

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}

func (r *recorder) fail(s string) {
	r.logLine("FAIL: " + s)
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
}

func (r *recorder) skip(s string) {
	r.logLine("SKIP: " + s)
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
