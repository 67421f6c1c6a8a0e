package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// countingDriver counts renewals and can answer them with a chosen error.
type countingDriver struct {
	driver.Driver
	mu       sync.Mutex
	renews   []time.Time
	renewErr error
}

func (c *countingDriver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	c.mu.Lock()
	c.renews = append(c.renews, time.Now())
	err := c.renewErr
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.Driver.Renew(ctx, key, owner, ttl)
}

func (c *countingDriver) renewCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.renews)
}

// recorder is an Observer that keeps every event.
type recorder struct {
	mu       sync.Mutex
	acquires []dlock.AcquireEvent
	renews   []dlock.RenewEvent
	ends     []dlock.EndEvent
}

func (r *recorder) AcquireDone(e dlock.AcquireEvent) {
	r.mu.Lock()
	r.acquires = append(r.acquires, e)
	r.mu.Unlock()
}
func (r *recorder) Renewed(e dlock.RenewEvent) {
	r.mu.Lock()
	r.renews = append(r.renews, e)
	r.mu.Unlock()
}
func (r *recorder) LeaseEnded(e dlock.EndEvent) {
	r.mu.Lock()
	r.ends = append(r.ends, e)
	r.mu.Unlock()
}

func TestLease_RenewsEveryThirdOfTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cd := &countingDriver{Driver: memdriver.New(memdriver.NewStore())}
		rec := &recorder{}
		l := dlock.New(cd, dlock.WithObserver(rec))
		defer l.Close()
		start := time.Now()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		// Validity: sent + TTL − drift, drift = 1% of TTL + 2 ms.
		if want := start.Add(3*time.Second - 32*time.Millisecond); !ls.Deadline().Equal(want) {
			t.Fatalf("deadline %v after start, want %v", ls.Deadline().Sub(start), want.Sub(start))
		}
		time.Sleep(10*time.Second + time.Millisecond)
		synctest.Wait()
		if n := cd.renewCount(); n != 10 {
			t.Fatalf("%d renewals in 10 s with TTL 3 s, want 10 (every 1 s)", n)
		}
		if want := time.Now().Add(-time.Millisecond).Add(2*time.Second + 968*time.Millisecond); !ls.Deadline().Equal(want) {
			t.Fatalf("deadline after renewals = now%+v, want now%+v", ls.Deadline().Sub(time.Now()), want.Sub(time.Now()))
		}
		if err := ls.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		n := cd.renewCount()
		time.Sleep(5 * time.Second)
		if cd.renewCount() != n {
			t.Fatal("renewals continued after Release")
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.renews) != 10 || rec.renews[0].Err != nil {
			t.Fatalf("observer saw %d renewals", len(rec.renews))
		}
		// At each renewal 2 s of the 2.968 s validity were left.
		if m := rec.renews[3].Margin; m != 1968*time.Millisecond {
			t.Errorf("renewal margin %v, want 1.968s", m)
		}
		if len(rec.ends) != 1 || rec.ends[0].Lost || rec.ends[0].Held != 10*time.Second+time.Millisecond {
			t.Errorf("end events %+v", rec.ends)
		}
	})
}

func TestLease_LostExactlyAtDeadlineWhenRenewalsHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fd := dlocktest.NewFaultDriver(memdriver.New(memdriver.NewStore()), t.Logf)
		rec := &recorder{}
		l := dlock.New(fd, dlock.WithObserver(rec), dlock.WithOpTimeout(time.Minute))
		defer l.Close()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		dlocktest.Faults(fd).BlockRenewals(true)
		deadline := ls.Deadline()
		<-ls.Done()
		if !time.Now().Equal(deadline) {
			t.Fatalf("lost %v after the deadline, want exactly at it", time.Since(deadline))
		}
		if !errors.Is(ls.Err(), dlock.ErrLeaseLost) || !errors.Is(context.Cause(ls.Context()), dlock.ErrLeaseLost) {
			t.Fatalf("Err %v, cause %v", ls.Err(), context.Cause(ls.Context()))
		}
		if err := ls.Release(t.Context()); !errors.Is(err, dlock.ErrLeaseLost) {
			t.Fatalf("Release after loss = %v, want ErrLeaseLost", err)
		}
		synctest.Wait()
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.ends) != 1 || !rec.ends[0].Lost || rec.ends[0].LostReason != dlock.LostExpired {
			t.Fatalf("end events %+v, want one loss by expiry", rec.ends)
		}
	})
}

func TestLease_NotOwnerLosesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cd := &countingDriver{Driver: memdriver.New(memdriver.NewStore())}
		rec := &recorder{}
		l := dlock.New(cd, dlock.WithObserver(rec))
		defer l.Close()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		cd.mu.Lock()
		cd.renewErr = driver.ErrLeaseLost
		cd.mu.Unlock()
		start := time.Now()
		<-ls.Done()
		if d := time.Since(start); d != time.Second {
			t.Fatalf("lost after %v, want at the first renewal (1 s)", d)
		}
		synctest.Wait()
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.ends) != 1 || rec.ends[0].LostReason != dlock.LostNotOwner {
			t.Fatalf("end events %+v, want one loss by not_owner", rec.ends)
		}
	})
}

func TestLease_TransientRenewalErrorIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cd := &countingDriver{Driver: memdriver.New(memdriver.NewStore())}
		l := dlock.New(cd)
		defer l.Close()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		cd.mu.Lock()
		cd.renewErr = errors.New("connection reset")
		cd.mu.Unlock()
		time.Sleep(1500 * time.Millisecond) // first renewal fails, retries follow
		cd.mu.Lock()
		cd.renewErr = nil
		cd.mu.Unlock()
		time.Sleep(5 * time.Second)
		if ls.Err() != nil {
			t.Fatalf("lease lost despite a renewal that recovered in time: %v", ls.Err())
		}
		if n := cd.renewCount(); n < 3 {
			t.Fatalf("%d renewals, want retries after the failure", n)
		}
		if err := ls.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// slowWaiter grants through memdriver's queue and then delays the answer,
// as a notification that arrives long after the request was sent.
type slowWaiter struct {
	*countingDriver
	delay time.Duration
}

func (s *slowWaiter) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := s.Driver.(driver.Waiter).Wait(ctx, req)
	time.Sleep(s.delay)
	return g, err
}

func TestAcquire_WaitedGrantIsReanchoredByRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sw := &slowWaiter{countingDriver: &countingDriver{Driver: memdriver.New(memdriver.NewStore())}, delay: 2 * time.Second}
		l := dlock.New(sw)
		defer l.Close()
		ls, err := l.Acquire(t.Context(), "k", dlock.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if sw.renewCount() != 1 {
			t.Fatalf("%d renewals, want one confirming renewal after a slow grant", sw.renewCount())
		}
		if left := time.Until(ls.Deadline()); left != 3*time.Second-32*time.Millisecond {
			t.Fatalf("validity left %v, want a full TTL minus drift from the confirmation", left)
		}
		_ = ls.Release(t.Context())
	})
}

func TestAcquire_ErrorsNameKeyAndStore(t *testing.T) {
	l := dlock.New(memdriver.New(memdriver.NewStore()), dlock.WithStoreName("mem"))
	defer l.Close()
	ls, err := l.TryAcquire(t.Context(), "settle:42")
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(t.Context())
	_, err = l.TryAcquire(t.Context(), "settle:42")
	if got, want := err.Error(), `dlock: acquire "settle:42" on mem: lock held`; got != want {
		t.Fatalf("error %q, want %q", got, want)
	}
}

func TestAcquire_CanceledContextMatches(t *testing.T) {
	l := dlock.New(dlocktest.WithoutWaiter(memdriver.New(memdriver.NewStore())))
	defer l.Close()
	ls, err := l.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(t.Context())
	ctx, cancel := context.WithCancelCause(t.Context())
	cause := errors.New("shutting down")
	time.AfterFunc(20*time.Millisecond, func() { cancel(cause) })
	_, err = l.Acquire(ctx, "k")
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
		t.Fatalf("Acquire = %v, want to match context.Canceled and the cause", err)
	}
}

func TestOpen_SchemeRegistry(t *testing.T) {
	_, err := dlock.Open(t.Context(), "nosuch://x")
	if !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), `unknown store scheme "nosuch"`) || !strings.Contains(err.Error(), "mem") {
		t.Fatalf("Open(unknown scheme) = %v", err)
	}
	a, err := dlock.Open(t.Context(), "mem://open-test")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := dlock.Open(t.Context(), "mem://open-test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ls, err := a.TryAcquire(t.Context(), "shared")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(t.Context(), "shared"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a second Open of the same mem:// URL does not share the store: %v", err)
	}
	_ = ls.Release(t.Context())
	defer func() {
		if recover() == nil {
			t.Error("registering a scheme twice did not panic")
		}
	}()
	driver.Register("mem", func(context.Context, *url.URL) (driver.Driver, error) { return nil, nil })
}

func TestDo_ReleasesAndReportsLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fd := dlocktest.NewFaultDriver(memdriver.New(memdriver.NewStore()), t.Logf)
		l := dlock.New(fd)
		defer l.Close()
		ran := false
		if err := l.Do(t.Context(), "k", func(ctx context.Context) error { ran = true; return nil }); err != nil || !ran {
			t.Fatalf("Do = %v, ran %v", err, ran)
		}
		if _, err := l.TryAcquire(t.Context(), "k"); err != nil {
			t.Fatalf("Do did not release: %v", err)
		}
		dlocktest.Faults(fd).BlockRenewals(true)
		err := l.Do(t.Context(), "k2", func(ctx context.Context) error {
			<-ctx.Done() // work that stops when the lease is lost
			return context.Cause(ctx)
		}, dlock.WithTTL(time.Second))
		if !errors.Is(err, dlock.ErrLeaseLost) {
			t.Fatalf("Do with a lost lease = %v, want ErrLeaseLost", err)
		}
	})
}

func TestBackoff_FullJitterPollingIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cd := &tryCounter{Driver: dlocktest.WithoutWaiter(memdriver.New(memdriver.NewStore()))}
		l := dlock.New(cd, dlock.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
		defer l.Close()
		ls, err := l.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err = l.Acquire(ctx, "k")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		// Sleeps are uniform in [0, min(100ms, 10ms·2ⁿ)): about 50 ms on
		// average once capped, so ~200 attempts in 10 s; a fixed 100 ms
		// interval would give 100, and no backoff would give thousands.
		if n := cd.count(); n < 120 || n > 400 {
			t.Fatalf("%d attempts in 10 s, want full-jitter backoff capped at 100 ms", n)
		}
		_ = ls.Release(t.Context())
	})
}

type tryCounter struct {
	driver.Driver
	mu sync.Mutex
	n  int
}

func (c *tryCounter) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.Driver.TryAcquire(ctx, req)
}

func (c *tryCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// TestInspect_FreeKeyMessage: Inspect of a free key matches ErrNotAcquired
// and says the key is free, without the sentinel's own "lock held".
func TestInspect_FreeKeyMessage(t *testing.T) {
	l := dlock.New(memdriver.New(memdriver.NewStore()))
	defer l.Close()
	_, err := l.Inspect(context.Background(), "nobody-holds-this")
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("Inspect of a free key = %v, want ErrNotAcquired", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "key is free") || strings.Contains(msg, "lock held") {
		t.Errorf("Inspect of a free key says %q; want \"key is free\", never \"lock held\"", msg)
	}
}

// TestLease_EndsAsItsHeartbeatStarts: leases released, or lost to their
// Locker's Close, around the moment their heartbeat goroutine starts (5 ms
// after the grant) end cleanly: Release reports success once, Done is
// closed, the key is free again, and no heartbeat is left running (the
// package's goleak check).
func TestLease_EndsAsItsHeartbeatStarts(t *testing.T) {
	st := memdriver.NewStore()
	other := dlock.New(memdriver.New(st))
	defer other.Close()
	ctx := context.Background()
	for i := range 120 {
		l := dlock.New(memdriver.New(st))
		key := fmt.Sprintf("hbstart/%d", i)
		lease, err := l.TryAcquire(ctx, key, dlock.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(4*time.Millisecond + time.Duration(i%20)*100*time.Microsecond)
		if i%3 == 2 {
			if err := l.Close(); err != nil {
				t.Fatalf("lease %d: Close: %v", i, err)
			}
			if !errors.Is(lease.Err(), dlock.ErrClosed) {
				t.Fatalf("lease %d: Err after Close = %v, want ErrClosed", i, lease.Err())
			}
		} else {
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("lease %d: Release: %v", i, err)
			}
			if !errors.Is(lease.Err(), dlock.ErrReleased) {
				t.Fatalf("lease %d: Err after Release = %v, want ErrReleased", i, lease.Err())
			}
			_ = l.Close()
		}
		select {
		case <-lease.Done():
		default:
			t.Fatalf("lease %d: Done not closed after its end", i)
		}
		if lease.Context().Err() == nil {
			t.Fatalf("lease %d: context not cancelled after its end", i)
		}
		next, err := other.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("lease %d: the key is still held after its end: %v", i, err)
		}
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// gatedRelease is a driver whose Release waits for its gate, after saying
// it has begun.
type gatedRelease struct {
	driver.Driver
	begun chan struct{}
	gate  chan struct{}
}

func (g *gatedRelease) Release(ctx context.Context, key, owner string) error {
	close(g.begun)
	<-g.gate
	return g.Driver.Release(ctx, key, owner)
}

// TestLease_CloseWaitsForAReleaseUnderWay: the Locker's Close while a
// Release is asking the store waits for that release, and closes the
// driver after it: the release succeeds and the key is free. (Close used
// to skip a lease whose release had begun and close the driver under it:
// the release failed and the grant stayed on the store until its TTL.)
func TestLease_CloseWaitsForAReleaseUnderWay(t *testing.T) {
	st := memdriver.NewStore()
	drv := &gatedRelease{Driver: memdriver.New(st), begun: make(chan struct{}), gate: make(chan struct{})}
	l := dlock.New(drv)
	ctx := context.Background()
	lease, err := l.TryAcquire(ctx, "close/under-release", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctx) }()
	<-drv.begun
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a release was still asking the store", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(drv.gate)
	if err := <-released; err != nil {
		t.Fatalf("Release under a concurrent Close: %v, want nil", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	other := dlock.New(memdriver.New(st))
	defer other.Close()
	next, err := other.TryAcquire(ctx, "close/under-release")
	if err != nil {
		t.Fatalf("the key is still held after Release and Close: %v", err)
	}
	_ = next.Release(ctx)
}

// TestLease_EndedBeforeReleaseReturns: a Release of a lease that WithMaxHold
// has just ended returns only once Done is closed, with the error Err
// reports (it could return ErrMaxHoldReached while Done was still open).
func TestLease_EndedBeforeReleaseReturns(t *testing.T) {
	st := memdriver.NewStore()
	l := dlock.New(memdriver.New(st))
	defer l.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 400 {
				key := fmt.Sprintf("ended/%d/%d", g, i)
				hold := time.Duration(200+(i%30)*100) * time.Microsecond
				lease, err := l.TryAcquire(ctx, key, dlock.WithTTL(time.Minute), dlock.WithMaxHold(hold))
				if err != nil {
					errs <- err
					return
				}
				time.Sleep(hold - 150*time.Microsecond + time.Duration(i%7)*50*time.Microsecond)
				err = lease.Release(ctx)
				select {
				case <-lease.Done():
				default:
					errs <- fmt.Errorf("lease %s: Release returned %v with Done still open", key, err)
					return
				}
				if err != nil && (!errors.Is(err, dlock.ErrMaxHoldReached) || !errors.Is(lease.Err(), dlock.ErrMaxHoldReached)) {
					errs <- fmt.Errorf("lease %s: Release: %v, Err: %v; want nil or ErrMaxHoldReached for both", key, err, lease.Err())
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
}
