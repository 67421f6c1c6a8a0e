package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// scriptedDriver is a memdriver (without its Waiter, so Acquire polls)
// whose TryAcquire answers with fail's error while fail returns one. It
// counts attempts and records the owner tokens they used and the ones
// released.
type scriptedDriver struct {
	driver.Driver
	fail func(n int) error // n counts TryAcquire calls from 1; nil: no fault

	mu       sync.Mutex
	tries    int
	owners   []string
	released []string
}

func newScripted(fail func(n int) error) *scriptedDriver {
	return &scriptedDriver{Driver: memdriver.New(memdriver.NewStore()), fail: fail}
}

func (s *scriptedDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	s.mu.Lock()
	s.tries++
	n := s.tries
	s.owners = append(s.owners, req.Owner)
	s.mu.Unlock()
	if s.fail != nil {
		if err := s.fail(n); err != nil {
			return driver.Grant{}, err
		}
	}
	return s.Driver.TryAcquire(ctx, req)
}

func (s *scriptedDriver) Release(ctx context.Context, key, owner string) error {
	s.mu.Lock()
	s.released = append(s.released, owner)
	s.mu.Unlock()
	return s.Driver.Release(ctx, key, owner)
}

func (s *scriptedDriver) counts() (tries int, owners, released []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tries, append([]string(nil), s.owners...), append([]string(nil), s.released...)
}

// errRefused stands for a store that refuses connections.
var errRefused = errors.New("dial tcp 127.0.0.1:7999: connect: connection refused")

func always(err error) func(int) error { return func(int) error { return err } }

// retryRecorder is a recorder that also implements RetryObserver.
type retryRecorder struct {
	recorder
	retries []dlock.RetryEvent
}

func (r *retryRecorder) AcquireRetry(e dlock.RetryEvent) {
	r.mu.Lock()
	r.retries = append(r.retries, e)
	r.mu.Unlock()
}

func (r *retryRecorder) results() (acquires []string, retries []dlock.RetryEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.acquires {
		acquires = append(acquires, e.Result)
	}
	return acquires, append([]dlock.RetryEvent(nil), r.retries...)
}

// acquireCalls are the four ways to acquire, each returning the lease (or
// the first member of a set) and the error.
var acquireCalls = []struct {
	name string
	call func(ctx context.Context, l *dlock.Locker, key string, opts ...dlock.Option) (*dlock.Lease, error)
}{
	{"TryAcquire", func(ctx context.Context, l *dlock.Locker, key string, opts ...dlock.Option) (*dlock.Lease, error) {
		return l.TryAcquire(ctx, key, opts...)
	}},
	{"Acquire", func(ctx context.Context, l *dlock.Locker, key string, opts ...dlock.Option) (*dlock.Lease, error) {
		return l.Acquire(ctx, key, opts...)
	}},
	{"AcquireAll", func(ctx context.Context, l *dlock.Locker, key string, opts ...dlock.Option) (*dlock.Lease, error) {
		set, err := l.AcquireAll(ctx, []string{key}, opts...)
		if err != nil {
			return nil, err
		}
		return set.Leases()[0], nil
	}},
	{"Do", func(ctx context.Context, l *dlock.Locker, key string, opts ...dlock.Option) (*dlock.Lease, error) {
		ran := false
		err := l.Do(ctx, key, func(context.Context) error { ran = true; return nil }, opts...)
		if err == nil && ran {
			return nil, errors.New("Do ran its function")
		}
		return nil, err
	}},
}

// TestAcquire_InvalidInputNeverFailsOpen: input dlock refuses is
// ErrInvalidArgument (and its specific sentinel), never ErrUnavailable, is
// refused before any store call, and WithFailOpen gives no degraded lease
// for it — on every way to acquire.
func TestAcquire_InvalidInputNeverFailsOpen(t *testing.T) {
	cases := []struct {
		name     string
		key      string
		opts     []dlock.Option
		sentinel error
	}{
		{"holder 300 bytes", "k", []dlock.Option{dlock.WithHolder(strings.Repeat("x", 300))}, dlock.ErrInvalidHolder},
		{"holder 5000 bytes", "k", []dlock.Option{dlock.WithHolder(strings.Repeat("x", 5000))}, dlock.ErrInvalidHolder},
		{"holder newline", "k", []dlock.Option{dlock.WithHolder("host-3\npid 1")}, dlock.ErrInvalidHolder},
		{"holder escape", "k", []dlock.Option{dlock.WithHolder("\x1b[31mred")}, dlock.ErrInvalidHolder},
		{"holder not UTF-8", "k", []dlock.Option{dlock.WithHolder("host\xff")}, dlock.ErrInvalidHolder},
		{"holder DEL", "k", []dlock.Option{dlock.WithHolder("a\x7fb")}, dlock.ErrInvalidHolder},
		{"holder C1", "k", []dlock.Option{dlock.WithHolder("a\u0085b")}, dlock.ErrInvalidHolder},
		{"key empty", "", nil, dlock.ErrInvalidKey},
		{"key 600 bytes", strings.Repeat("k", 600), nil, dlock.ErrInvalidKey},
		{"key NUL", "a\x00b", nil, dlock.ErrInvalidKey},
		{"TTL zero", "k", []dlock.Option{dlock.WithTTL(0)}, dlock.ErrInvalidTTL},
		{"TTL 25h", "k", []dlock.Option{dlock.WithTTL(25 * time.Hour)}, dlock.ErrInvalidTTL},
		{"heartbeat 1ms", "k", []dlock.Option{dlock.WithHeartbeat(time.Millisecond)}, dlock.ErrInvalidTTL},
		{"retry budget negative", "k", []dlock.Option{dlock.WithRetryFor(-time.Second)}, dlock.ErrInvalidArgument},
	}
	for _, c := range cases {
		for _, ac := range acquireCalls {
			t.Run(c.name+"/"+ac.name, func(t *testing.T) {
				sd := newScripted(always(errRefused)) // a store call would be "unavailable"
				l := dlock.New(sd)
				defer l.Close()
				opts := append([]dlock.Option{dlock.WithFailOpen()}, c.opts...)
				ls, err := ac.call(t.Context(), l, c.key, opts...)
				if ls != nil {
					t.Fatalf("got a lease (degraded %v) for invalid input", ls.Degraded())
				}
				if !errors.Is(err, c.sentinel) || !errors.Is(err, dlock.ErrInvalidArgument) {
					t.Fatalf("err = %v, want %v matching ErrInvalidArgument", err, c.sentinel)
				}
				if errors.Is(err, dlock.ErrUnavailable) {
					t.Fatalf("err = %v matches ErrUnavailable", err)
				}
				if tries, _, _ := sd.counts(); tries != 0 {
					t.Fatalf("the store was called %d times for invalid input", tries)
				}
			})
		}
	}
}

func TestAcquire_HolderAtTheLimitIsValid(t *testing.T) {
	l := dlock.New(memdriver.New(memdriver.NewStore()))
	defer l.Close()
	holder := strings.Repeat("é", dlock.MaxHolderBytes/2) // 256 bytes, 128 runes
	ls, err := l.TryAcquire(t.Context(), "k", dlock.WithHolder(holder))
	if err != nil {
		t.Fatalf("TryAcquire with a %d-byte holder: %v", len(holder), err)
	}
	defer ls.Release(t.Context())
	info, err := l.Inspect(t.Context(), "k")
	if err != nil || info.Holder != holder {
		t.Fatalf("Inspect = %+v, %v; want the holder kept", info, err)
	}
	if err := dlock.ValidateHolder(holder + "x"); !errors.Is(err, dlock.ErrInvalidHolder) {
		t.Fatalf("ValidateHolder(257 bytes) = %v, want ErrInvalidHolder", err)
	}
	if err := dlock.ValidateHolder(""); err != nil {
		t.Fatalf("ValidateHolder(\"\") = %v, want nil", err)
	}
}

// TestAcquire_StoreRefusalNeverFailsOpen: a store that answers "invalid"
// (or "unsupported") is not retried and not degraded by WithFailOpen.
func TestAcquire_StoreRefusalNeverFailsOpen(t *testing.T) {
	for _, refusal := range []error{
		fmt.Errorf("store: %w (server: holder too long)", driver.ErrInvalidHolder),
		fmt.Errorf("store: %w: unknown option", driver.ErrInvalidArgument),
		fmt.Errorf("store: %w", driver.ErrInvalidTTL),
		fmt.Errorf("store: %w", errors.ErrUnsupported),
	} {
		for _, ac := range acquireCalls {
			t.Run(refusal.Error()+"/"+ac.name, func(t *testing.T) {
				sd := newScripted(always(refusal))
				l := dlock.New(sd)
				defer l.Close()
				ls, err := ac.call(t.Context(), l, "k", dlock.WithFailOpen())
				if ls != nil {
					t.Fatalf("got a lease (degraded %v) for a refused request", ls.Degraded())
				}
				if !errors.Is(err, refusal) || errors.Is(err, dlock.ErrUnavailable) {
					t.Fatalf("err = %v, want the refusal and not ErrUnavailable", err)
				}
				if tries, _, _ := sd.counts(); tries != 1 {
					t.Fatalf("%d attempts, want 1 (a refusal is not retried)", tries)
				}
			})
		}
	}
}

// TestTryAcquire_RetryForOutlastsAnOutage: a store that is down for 1 s is
// retried through by TryAcquire with WithRetryFor(3s); each retry uses a
// new owner token and the failed attempts' tokens are released.
func TestTryAcquire_RetryForOutlastsAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		sd := newScripted(func(int) error {
			if time.Since(start) < time.Second {
				return errRefused
			}
			return nil
		})
		rec := &retryRecorder{}
		l := dlock.New(sd, dlock.WithObserver(rec))
		defer l.Close()
		ls, err := l.TryAcquire(t.Context(), "k", dlock.WithRetryFor(3*time.Second))
		took := time.Since(start)
		if err != nil {
			t.Fatalf("TryAcquire with WithRetryFor(3s) through a 1 s outage: %v", err)
		}
		defer ls.Release(t.Context())
		if took < time.Second || took > 2*time.Second {
			t.Fatalf("took %v, want between the outage (1s) and 1s + the largest backoff", took)
		}
		synctest.Wait() // background releases of the failed attempts
		tries, owners, released := sd.counts()
		if tries < 3 {
			t.Fatalf("%d attempts, want retries", tries)
		}
		seen := map[string]bool{}
		for _, o := range owners {
			if seen[o] {
				t.Fatalf("owner token %s used by two attempts", o)
			}
			seen[o] = true
		}
		if owners[len(owners)-1] != ls.Owner() {
			t.Fatalf("the lease's owner is not the last attempt's")
		}
		for _, o := range owners[:len(owners)-1] {
			if !contains(released, o) {
				t.Fatalf("failed attempt's owner %s was not released (released %v)", o, released)
			}
		}
		if contains(released, ls.Owner()) {
			t.Fatalf("the granted owner token was released")
		}
		acquires, retries := rec.results()
		if len(retries) != tries-1 {
			t.Fatalf("%d retry events for %d attempts, want one per failed attempt", len(retries), tries)
		}
		for i, e := range retries {
			if e.Attempt != i+1 || !errors.Is(e.Err, errRefused) || e.Backoff < 0 || e.Backoff > time.Second {
				t.Fatalf("retry event %d = %+v", i, e)
			}
		}
		if len(acquires) != 1 || acquires[0] != dlock.ResultAcquired {
			t.Fatalf("acquire events %v, want one acquired", acquires)
		}
	})
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestTryAcquire_NoRetryByDefault: TryAcquire without WithRetryFor, and
// with WithRetryFor(0), makes one attempt and reports ErrUnavailable at
// once; with WithFailOpen it degrades at once.
func TestTryAcquire_NoRetryByDefault(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []dlock.Option
	}{
		{"default", nil},
		{"WithRetryFor(0)", []dlock.Option{dlock.WithRetryFor(0)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sd := newScripted(always(errRefused))
				l := dlock.New(sd, dlock.WithStoreName("dlockd"))
				defer l.Close()
				start := time.Now()
				_, err := l.TryAcquire(t.Context(), "k", c.opts...)
				if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, errRefused) {
					t.Fatalf("err = %v, want ErrUnavailable wrapping the store error", err)
				}
				if want := `dlock: acquire "k" on dlockd: store unavailable: ` + errRefused.Error(); err.Error() != want {
					t.Fatalf("err = %q, want %q", err, want)
				}
				if took := time.Since(start); took != 0 {
					t.Fatalf("took %v, want at once", took)
				}
				ls, err := l.TryAcquire(t.Context(), "k", append(c.opts, dlock.WithFailOpen())...)
				if err != nil || !ls.Degraded() || ls.Fence() != 0 {
					t.Fatalf("fail-open TryAcquire = %v, %v; want a degraded lease", ls, err)
				}
				_ = ls.Release(t.Context())
				if tries, _, _ := sd.counts(); tries != 2 {
					t.Fatalf("%d attempts for two TryAcquire calls, want 2", tries)
				}
			})
		})
	}
}

// TestAcquire_RetriesUntilItsContextEnds: a waiting Acquire on a store that
// stays down retries until its ctx ends, then reports an error matching
// both ErrUnavailable and the ctx's error, wrapping the last store error
// and saying how long it retried.
func TestAcquire_RetriesUntilItsContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sd := newScripted(always(errRefused))
		rec := &retryRecorder{}
		l := dlock.New(sd, dlock.WithObserver(rec), dlock.WithStoreName("dlockd"))
		defer l.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		start := time.Now()
		_, err := l.Acquire(ctx, "k")
		if took := time.Since(start); took != 10*time.Second {
			t.Fatalf("Acquire returned after %v, want when its ctx ended (10s)", took)
		}
		for _, target := range []error{dlock.ErrUnavailable, context.DeadlineExceeded, errRefused} {
			if !errors.Is(err, target) {
				t.Fatalf("err = %v, want it to match %v", err, target)
			}
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, `dlock: acquire "k" on dlockd: store unavailable (retried for 10s, `) ||
			!strings.Contains(msg, "until context deadline exceeded") || !strings.HasSuffix(msg, errRefused.Error()) {
			t.Fatalf("message %q does not say how long it retried, why it stopped and the store error", msg)
		}
		tries, _, _ := sd.counts()
		if tries < 10 {
			t.Fatalf("%d attempts in 10 s, want retries with backoff bounded by 1 s", tries)
		}
		acquires, retries := rec.results()
		if len(acquires) != 1 || acquires[0] != dlock.ResultUnavailable {
			t.Fatalf("acquire events %v, want one unavailable", acquires)
		}
		if len(retries) != tries {
			t.Fatalf("%d retry events for %d failed attempts", len(retries), tries)
		}
	})
}

// TestAcquire_RetryForBoundsTheWait: with WithRetryFor(2s) a waiting
// Acquire gives up on an outage after 2 s, with ErrUnavailable (not the
// ctx's error); WithRetryFor(0) gives up at the first store error.
func TestAcquire_RetryForBoundsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sd := newScripted(always(errRefused))
		l := dlock.New(sd)
		defer l.Close()
		start := time.Now()
		_, err := l.Acquire(t.Context(), "k", dlock.WithRetryFor(2*time.Second))
		if took := time.Since(start); took != 2*time.Second {
			t.Fatalf("gave up after %v, want 2s", took)
		}
		if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want ErrUnavailable only", err)
		}
		if !strings.Contains(err.Error(), "store unavailable (retried for 2s, ") {
			t.Fatalf("err = %v, want it to say it retried for 2s", err)
		}
		before, _, _ := sd.counts()
		start = time.Now()
		_, err = l.Acquire(t.Context(), "k", dlock.WithRetryFor(0))
		after, _, _ := sd.counts()
		if !errors.Is(err, dlock.ErrUnavailable) || time.Since(start) != 0 || after-before != 1 {
			t.Fatalf("Acquire with WithRetryFor(0) = %v after %v and %d attempts; want ErrUnavailable at once after 1", err, time.Since(start), after-before)
		}
	})
}

// TestAcquire_FailOpenAfterTheBudget: a waiting Acquire with WithFailOpen
// degrades once its budget is spent: the op timeout without WithRetryFor,
// WithRetryFor's budget with it. A store that comes back within the budget
// gives a real lease.
func TestAcquire_FailOpenAfterTheBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sd := newScripted(always(errRefused))
		l := dlock.New(sd, dlock.WithOpTimeout(3*time.Second))
		defer l.Close()
		for _, c := range []struct {
			opts []dlock.Option
			want time.Duration
		}{
			{nil, 3 * time.Second},
			{[]dlock.Option{dlock.WithRetryFor(time.Second)}, time.Second},
			{[]dlock.Option{dlock.WithRetryFor(0)}, 0},
		} {
			start := time.Now()
			ls, err := l.Acquire(t.Context(), "k", append(c.opts, dlock.WithFailOpen())...)
			if err != nil || !ls.Degraded() {
				t.Fatalf("fail-open Acquire = %v, %v; want a degraded lease", ls, err)
			}
			if took := time.Since(start); took != c.want {
				t.Fatalf("degraded after %v, want %v", took, c.want)
			}
			_ = ls.Release(t.Context())
		}

		start := time.Now()
		back := newScripted(func(int) error {
			if time.Since(start) < 2*time.Second {
				return errRefused
			}
			return nil
		})
		l2 := dlock.New(back, dlock.WithOpTimeout(3*time.Second))
		defer l2.Close()
		ls, err := l2.Acquire(t.Context(), "k", dlock.WithFailOpen())
		if err != nil || ls.Degraded() || ls.Fence() == 0 {
			t.Fatalf("fail-open Acquire through a 2 s outage = %v, %v; want a real lease", ls, err)
		}
		_ = ls.Release(t.Context())
	})
}

// TestAcquire_OutageBudgetRestartsAfterAnAnswer: the budget counts per
// outage: a waiting Acquire with WithRetryFor(1s) lives through two
// outages of 700 ms separated by answers ("held"), and gets the key when
// it is released.
func TestAcquire_OutageBudgetRestartsAfterAnAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		sd := newScripted(func(int) error {
			e := time.Since(start)
			if (e >= 100*time.Millisecond && e < 800*time.Millisecond) || (e >= 1500*time.Millisecond && e < 2200*time.Millisecond) {
				return errRefused
			}
			return nil
		})
		holder := dlock.New(sd.Driver) // the same store, no faults
		defer holder.Close()
		held, err := holder.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(3*time.Second, func() { _ = held.Release(context.Background()) })
		l := dlock.New(sd, dlock.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
		defer l.Close()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithRetryFor(time.Second))
		if err != nil {
			t.Fatalf("Acquire through two 700 ms outages with a 1 s budget each: %v", err)
		}
		if took := time.Since(start); took < 3*time.Second {
			t.Fatalf("acquired after %v, before the holder released (3s)", took)
		}
		_ = ls.Release(t.Context())
	})
}

// TestAcquire_CloseEndsARetryingAcquire: Close ends an Acquire that is
// retrying an outage with ErrClosed, at once.
func TestAcquire_CloseEndsARetryingAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sd := newScripted(always(errRefused))
		l := dlock.New(sd)
		done := make(chan error, 1)
		go func() {
			_, err := l.Acquire(t.Context(), "k")
			done <- err
		}()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		start := time.Now()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		err := <-done
		if !errors.Is(err, dlock.ErrClosed) || time.Since(start) != 0 {
			t.Fatalf("Acquire after Close = %v after %v; want ErrClosed at once", err, time.Since(start))
		}
	})
}

// TestAcquire_CanceledDuringAnOutageIsNotRetried: a ctx cancelled before
// the call makes no store call; one cancelled mid-outage ends it with an
// error matching context.Canceled and ErrUnavailable.
func TestAcquire_CanceledDuringAnOutageIsNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sd := newScripted(always(errRefused))
		l := dlock.New(sd)
		defer l.Close()
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(2*time.Second, cancel)
		_, err := l.Acquire(ctx, "k")
		if !errors.Is(err, context.Canceled) || !errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("err = %v, want context.Canceled and ErrUnavailable", err)
		}
		before, _, _ := sd.counts()
		_, err = l.Acquire(ctx, "k")
		after, _, _ := sd.counts()
		if !errors.Is(err, context.Canceled) || errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("Acquire with an ended ctx = %v, want context.Canceled only", err)
		}
		if after-before > 1 {
			t.Fatalf("%d store calls with an ended ctx", after-before)
		}
	})
}

func TestForceRelease_BlankReasonIsInvalidArgument(t *testing.T) {
	l := dlock.New(memdriver.New(memdriver.NewStore()))
	defer l.Close()
	for _, reason := range []string{"", "  \t"} {
		_, err := l.ForceRelease(t.Context(), "k", reason)
		if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("ForceRelease(reason %q) = %v, want ErrInvalidArgument", reason, err)
		}
	}
}

// TestTryAcquire_RetryForEndsAtAnAnswer: TryAcquire with a retry budget
// stops at the store's first answer: a held key is ErrNotAcquired at once,
// not retried for the rest of the budget.
func TestTryAcquire_RetryForEndsAtAnAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sd := newScripted(func(n int) error {
			if n <= 3 {
				return errRefused
			}
			return nil
		})
		other := dlock.New(sd.Driver)
		defer other.Close()
		held, err := other.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(t.Context())
		l := dlock.New(sd)
		defer l.Close()
		start := time.Now()
		_, err = l.TryAcquire(t.Context(), "k", dlock.WithRetryFor(time.Minute))
		if !errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("err = %v, want ErrNotAcquired", err)
		}
		if tries, _, _ := sd.counts(); tries != 4 {
			t.Fatalf("%d attempts, want 3 failures and the answer", tries)
		}
		if took := time.Since(start); took > 100*time.Millisecond {
			t.Fatalf("took %v, want the three short backoffs only", took)
		}
	})
}

// fullQueueDriver refuses every Wait with a transient error (a queue at
// its capacity), while TryAcquire answers: the key is held.
type fullQueueDriver struct {
	driver.Driver
	mu    sync.Mutex
	waits int
}

func (f *fullQueueDriver) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	f.mu.Lock()
	f.waits++
	f.mu.Unlock()
	return driver.Grant{}, errors.New("dlockd acquire: ResourceExhausted: 10 waiters already queued on the key (TOO_MANY_WAITERS)")
}

// TestAcquire_FullQueueIsAskedLessAndLessOften: a waiting Acquire whose
// every Wait fails while every probe answers "held" backs off as the
// failures go on. It re-queued every 0–5 ms before, for ever (about 420
// calls a second per waiter against a server that was already full).
func TestAcquire_FullQueueIsAskedLessAndLessOften(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memdriver.NewStore()
		holder := dlock.New(memdriver.New(store))
		defer holder.Close()
		if _, err := holder.TryAcquire(t.Context(), "k", dlock.WithTTL(time.Hour)); err != nil {
			t.Fatal(err)
		}
		f := &fullQueueDriver{Driver: memdriver.New(store)}
		l := dlock.New(f)
		defer l.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := l.Acquire(ctx, "k")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire of a held key with a full queue: %v, want the ctx's deadline", err)
		}
		f.mu.Lock()
		waits := f.waits
		f.mu.Unlock()
		// The backoff (5 ms to 1 s, full jitter) doubles with each
		// failure: a few dozen Waits in 10 s, not thousands.
		if waits > 100 {
			t.Fatalf("%d Waits in 10 s on a full queue: the retries do not back off", waits)
		}
		t.Logf("%d Waits in 10 s", waits)
	})
}

// hangingDriver is a memdriver whose TryAcquire fails after slow (the
// first call) or hangs until its ctx ends (later calls), and whose Release
// hangs until its ctx ends: a store that stopped answering during an
// outage.
type hangingDriver struct {
	driver.Driver
	slow  time.Duration
	mu    sync.Mutex
	tries int
}

func (h *hangingDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	h.mu.Lock()
	h.tries++
	n := h.tries
	h.mu.Unlock()
	if n == 1 {
		select {
		case <-time.After(h.slow):
			return driver.Grant{}, errRefused
		case <-ctx.Done():
			return driver.Grant{}, ctx.Err()
		}
	}
	<-ctx.Done()
	return driver.Grant{}, fmt.Errorf("no answer: %w", ctx.Err())
}

func (h *hangingDriver) Release(ctx context.Context, key, owner string) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestTryAcquire_RetryForBoundsTheTotalTime: WithRetryFor(5s) with the
// default 5 s op timeout against a store that fails slowly and then stops
// answering ends within the budget: an attempt started near its end gets
// only what is left, and the error keeps the outage's cause; Close then
// waits for the background release of the failed attempts only briefly,
// not another op timeout.
func TestTryAcquire_RetryForBoundsTheTotalTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hd := &hangingDriver{Driver: memdriver.New(memdriver.NewStore()), slow: 4500 * time.Millisecond}
		l := dlock.New(hd)
		start := time.Now()
		_, err := l.TryAcquire(t.Context(), "k", dlock.WithRetryFor(5*time.Second), dlock.WithTTL(5*time.Second))
		took := time.Since(start)
		if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("err = %v; want ErrUnavailable with the outage's cause", err)
		}
		// The outage, and so the budget, counts from the first failed
		// attempt's start.
		if took > 5*time.Second {
			t.Errorf("TryAcquire took %v; want at most the 5s budget", took)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if total, limit := time.Since(start), 5*time.Second+time.Second; total > limit {
			t.Errorf("TryAcquire and Close took %v; want at most %v", total, limit)
		}
	})
}
