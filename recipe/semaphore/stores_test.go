package semaphore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	_ "github.com/dlock-dev/dlock/drivers/dlockddriver" // registers dlockd://
	"github.com/dlock-dev/dlock/drivers/memdriver"
	_ "github.com/dlock-dev/dlock/drivers/redisdriver" // registers redis://
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/recipe/semaphore"
	"github.com/dlock-dev/dlock/server/servertest"
)

// urlOpener opens each worker's Locker on the store at url through a
// FaultDriver, as a separate process would.
func urlOpener(url string) func(t *testing.T, i int) (*dlock.Locker, *dlocktest.FaultDriver) {
	return func(t *testing.T, i int) (*dlock.Locker, *dlocktest.FaultDriver) {
		l, fd, err := dlocktest.OpenFaulty(t.Context(), url, dlock.WithOpTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l, fd
	}
}

// nativeOn reports whether the store at url keeps counted Shared grants
// (its driver's SharedView accepts a semaphore kind).
func nativeOn(t *testing.T, url string) bool {
	t.Helper()
	_, fd, err := dlocktest.OpenFaulty(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	sl, ok := fd.Inner().(driver.SharedLocker)
	if !ok {
		return false
	}
	_, err = sl.SharedView(driver.SharedKind{Mode: driver.Shared, Limit: 2})
	return err == nil
}

// TestSemaphore_NeverExceedsN_Dlockd: the overlap detector against a real
// dlockd (native FIFO permits once the driver has SharedView), holders
// paused past their TTL.
func TestSemaphore_NeverExceedsN_Dlockd(t *testing.T) {
	url := "dlockd://" + servertest.StartProcess(t).Addr()
	native := nativeOn(t, url)
	t.Logf("dlockd semaphore native: %v", native)
	overlap(t, urlOpener(url), native, 2, 5, 600*time.Millisecond, 4*time.Second)
}

// TestSemaphore_NeverExceedsN_Redis: the same against a real redis-server,
// where the semaphore is portable (permit slots, backoff and release
// hints).
func TestSemaphore_NeverExceedsN_Redis(t *testing.T) {
	url := testservers.StartRedis(t).URL()
	overlap(t, urlOpener(url), false, 2, 5, 600*time.Millisecond, 4*time.Second)
}

// TestSemaphore_NativeFIFO_Dlockd: dlockd hands permits to waiters in
// arrival order.
func TestSemaphore_NativeFIFO_Dlockd(t *testing.T) {
	l, err := dlock.Open(t.Context(), "dlockd://"+servertest.StartProcess(t).Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	fifo(t, l)
}

// handoff holds the one permit of a semaphore for hold, releases it while a
// waiter waits, and returns how long the waiter took to get it after the
// release (a figure: the assertion is only that it gets it).
func handoff(t *testing.T, l *dlock.Locker, hold time.Duration) time.Duration {
	t.Helper()
	sem, err := semaphore.New(l, fmt.Sprintf("handoff-%d", time.Now().UnixNano()), 1)
	if err != nil {
		t.Fatal(err)
	}
	first, err := sem.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		ls, err := sem.Acquire(t.Context())
		got <- time.Now()
		if err != nil {
			t.Error(err)
			return
		}
		_ = ls.Release(t.Context())
	}()
	time.Sleep(hold)
	released := time.Now()
	if err := first.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		return at.Sub(released)
	case <-time.After(30 * time.Second):
		t.Fatal("waiter never got the released permit")
	}
	return 0
}

// TestSemaphore_Handoff: a waiter gets a released permit, natively on
// dlockd (FIFO handoff in the log entry of the release), and portably on
// Redis (woken by the slot's release hint, not by its backoff, which has
// grown to about a second after a 1.2 s wait) and on mem without hints. The
// latencies are logged as figures.
func TestSemaphore_Handoff(t *testing.T) {
	open := func(t *testing.T, url string) *dlock.Locker {
		l, err := dlock.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	dl := open(t, "dlockd://"+servertest.StartProcess(t).Addr())
	rd := open(t, testservers.StartRedis(t).URL())
	mem := memLocker(t, memdriver.NewStore(), true)
	for _, c := range []struct {
		name string
		l    *dlock.Locker
	}{{"dlockd native", dl}, {"redis portable+hints", rd}, {"mem portable, no hints", mem}} {
		var worst, sum time.Duration
		const rounds = 2
		for range rounds {
			d := handoff(t, c.l, 1200*time.Millisecond)
			worst, sum = max(worst, d), sum+d
		}
		t.Logf("%s: release-to-grant mean %v, worst %v over %d rounds", c.name, (sum / rounds).Round(time.Millisecond), worst.Round(time.Millisecond), rounds)
	}
}
