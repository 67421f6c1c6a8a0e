package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
	"github.com/dlock-dev/dlock/recipe/semaphore"
	"github.com/dlock-dev/dlock/server/servertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { servertest.Cleanup() }))
}

// plainOnly hides every optional capability of a driver (SharedLocker,
// Waiter, ...): the semaphore on it is portable.
type plainOnly struct{ driver.Driver }

func memLocker(t *testing.T, s *memdriver.Store, portable bool) *dlock.Locker {
	t.Helper()
	var d driver.Driver = memdriver.New(s)
	if portable {
		d = plainOnly{d}
	}
	l := dlock.New(d, dlock.WithStoreName("mem"), dlock.WithTTL(5*time.Second))
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestNew_InvalidArguments(t *testing.T) {
	s := memdriver.NewStore()
	native, portable := memLocker(t, s, false), memLocker(t, s, true)
	for _, c := range []struct {
		name    string
		l       *dlock.Locker
		sem     string
		permits int
		want    string
	}{
		{"nil locker", nil, "s", 1, "nil *dlock.Locker"},
		{"zero permits", native, "s", 0, "0 permits"},
		{"negative permits", portable, "s", -3, "-3 permits"},
		{"too many permits", native, "s", semaphore.MaxPermits + 1, "10001 permits"},
		{"too many portable permits", portable, "s", semaphore.MaxPortablePermits + 1, "without native semaphores"},
		{"empty name", native, "", 2, "invalid key"},
		{"NUL in name", portable, "a\x00b", 2, "invalid key"},
		{"slot key too long", portable, strings.Repeat("k", 505), 2, "slot key"},
		{"native key too long", native, strings.Repeat("k", 500), 2, "permit-shared"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := semaphore.New(c.l, c.sem, c.permits)
			if s != nil || !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want ErrInvalidArgument saying %q", err, c.want)
			}
		})
	}
	if _, err := semaphore.Acquire(t.Context(), native, "s", 0); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Acquire with 0 permits: %v", err)
	}
	sem, err := semaphore.New(native, "s", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.Acquire(t.Context(), dlock.WithTTL(time.Millisecond)); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("Acquire with a 1ms TTL: %v, want ErrInvalidTTL", err)
	}
}

// Both schemes: N holders at once, the next one refused, a waiter gets the
// freed permit, every permit its own fence.
func TestSemaphore_PermitsOnMem(t *testing.T) {
	for _, portable := range []bool{false, true} {
		t.Run(fmt.Sprintf("portable=%v", portable), func(t *testing.T) {
			s := memdriver.NewStore()
			l := memLocker(t, s, portable)
			sem, err := semaphore.New(l, "jobs", 3)
			if err != nil {
				t.Fatal(err)
			}
			if sem.Native() == portable || sem.Permits() != 3 || sem.Name() != "jobs" {
				t.Fatalf("Native %v Permits %d Name %q", sem.Native(), sem.Permits(), sem.Name())
			}
			var held []*dlock.Lease
			slots := map[int]bool{}
			for range 3 {
				ls, err := sem.TryAcquire(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, ls)
				slots[sem.Slot(ls)] = true
			}
			if portable && (len(slots) != 3 || slots[-1]) || !portable && (len(slots) != 1 || !slots[-1]) {
				t.Fatalf("slots %v", slots)
			}
			if _, err := sem.TryAcquire(t.Context()); !errors.Is(err, dlock.ErrNotAcquired) || !strings.Contains(err.Error(), "all 3 permits") {
				t.Fatalf("fourth holder: %v, want ErrNotAcquired saying all 3 permits are held", err)
			}
			got := make(chan *dlock.Lease, 1)
			go func() {
				ls, err := sem.Acquire(t.Context())
				if err != nil {
					t.Error(err)
				}
				got <- ls
			}()
			time.Sleep(50 * time.Millisecond)
			freed := held[1]
			if err := freed.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			var w *dlock.Lease
			select {
			case w = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("waiter not granted the freed permit")
			}
			if w.Key() != freed.Key() || w.Fence() <= freed.Fence() {
				t.Fatalf("waiter got %s fence %d, want %s after fence %d", w.Key(), w.Fence(), freed.Key(), freed.Fence())
			}
			for _, ls := range []*dlock.Lease{held[0], held[2], w} {
				if err := ls.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			if infos, err := memLocker(t, s, false).List(t.Context(), "jobs/"); err != nil || len(infos) != 0 {
				t.Fatalf("after every release: %v %v", infos, err)
			}
		})
	}
}

// Natively, waiters are granted in arrival order.
func TestSemaphore_NativeFIFO(t *testing.T) {
	fifo(t, memLocker(t, memdriver.NewStore(), false))
}

func fifo(t *testing.T, l *dlock.Locker) {
	t.Helper()
	sem, err := semaphore.New(l, "fifo", 1)
	if err != nil {
		t.Fatal(err)
	}
	if !sem.Native() {
		t.Fatal("not native")
	}
	first, err := sem.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan int, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ls, err := sem.Acquire(t.Context())
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			_ = ls.Release(t.Context())
		}()
		waitQueued(t, l, semaphore.NativeKey("fifo"), i+1)
	}
	_ = first.Release(t.Context())
	wg.Wait()
	close(order)
	want := 0
	for i := range order {
		if i != want {
			t.Fatalf("waiter %d granted in place %d", i, want)
		}
		want++
	}
}

func waitQueued(t *testing.T, l *dlock.Locker, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if info, err := l.Inspect(t.Context(), key); err == nil && info.Waiters == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %d waiters on %s", n, key)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A waiter whose context ends leaves nothing behind, in both schemes.
func TestSemaphore_GivingUpLeavesNothing(t *testing.T) {
	for _, portable := range []bool{false, true} {
		t.Run(fmt.Sprintf("portable=%v", portable), func(t *testing.T) {
			s := memdriver.NewStore()
			l := memLocker(t, s, portable)
			sem, err := semaphore.New(l, "g", 1)
			if err != nil {
				t.Fatal(err)
			}
			ls, err := sem.Acquire(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
			defer cancel()
			if _, err := sem.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("waiter past its deadline: %v", err)
			}
			_ = ls.Release(t.Context())
			if infos, err := memLocker(t, s, false).List(t.Context(), "g/"); err != nil || len(infos) != 0 {
				t.Fatalf("left held: %v %v", infos, err)
			}
		})
	}
}

// interval is one permit's validity as its holder saw it.
type interval struct {
	worker       int
	start, end   time.Time
	key          string
	fence        uint64
	paused, lost bool
}

// overlap runs workers holders (each its own Locker over a FaultDriver: a
// separate process) against a semaphore of permits permits for about dur,
// pausing some holders past their TTL (renewals blocked, or the whole
// driver frozen), and checks from the recorded validity intervals that no
// more than permits were valid at any instant and that each key's fences
// increase in grant order.
func overlap(t *testing.T, open func(t *testing.T, i int) (*dlock.Locker, *dlocktest.FaultDriver), wantNative bool, permits, workers int, ttl, dur time.Duration) {
	t.Helper()
	name := fmt.Sprintf("sem-%d", time.Now().UnixNano())
	var mu sync.Mutex
	var ivs []interval
	var wg sync.WaitGroup
	end := time.Now().Add(dur)
	for w := range workers {
		l, fd := open(t, w)
		sem, err := semaphore.New(l, name, permits)
		if err != nil {
			t.Fatal(err)
		}
		if sem.Native() != wantNative {
			t.Fatalf("Native() = %v, want %v", sem.Native(), wantNative)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for round := 0; time.Now().Before(end); round++ {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				ls, err := sem.Acquire(ctx, dlock.WithTTL(ttl))
				cancel()
				if err != nil {
					t.Errorf("worker %d: Acquire: %v", w, err)
					return
				}
				iv := interval{worker: w, start: time.Now(), key: ls.Key(), fence: ls.Fence()}
				// Workers 0 and 1 pause every third round past the TTL:
				// 0 with its renewals blocked, 1 frozen whole.
				if w < 2 && round%3 == 0 {
					iv.paused = true
					if w == 0 {
						fd.BlockRenewals(true)
					} else {
						fd.Freeze(true)
					}
					select {
					case <-ls.Done():
					case <-time.After(20 * ttl):
						t.Errorf("worker %d: paused lease not lost 20 TTLs later", w)
					}
					iv.end, iv.lost = ls.Deadline(), true
					if late := time.Since(iv.end); late > max(ttl, 2*time.Second) {
						t.Errorf("worker %d: loss noticed %v after the validity deadline", w, late)
					}
					time.Sleep(ttl / 2) // still "paused" while others take the permit
					fd.BlockRenewals(false)
					fd.Freeze(false)
					if err := ls.Release(t.Context()); !errors.Is(err, dlock.ErrLeaseLost) {
						t.Errorf("worker %d: releasing the lost permit: %v, want ErrLeaseLost", w, err)
					}
				} else {
					time.Sleep(time.Duration(rng.Int64N(int64(ttl / 4))))
					iv.end = time.Now()
					if ls.Err() != nil { // lost under load: valid until its deadline
						iv.lost = true
						iv.end = minTime(iv.end, ls.Deadline())
					}
					_ = ls.Release(t.Context())
				}
				mu.Lock()
				ivs = append(ivs, iv)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	checkIntervals(t, ivs, permits)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// violations is the overlap detector: a sweep over the start and end events
// of ivs (an end before a start at the same instant) counting valid
// holders; it returns each instant more than permits were valid, each fence
// granted twice for one key, and each slot key (a lock of its own) whose
// fences do not increase in holding order; and the peak count.
func violations(ivs []interval, permits int) (out []string, peak int) {
	type ev struct {
		at    time.Time
		delta int
		iv    interval
	}
	var evs []ev
	for _, iv := range ivs {
		evs = append(evs, ev{iv.start, +1, iv}, ev{iv.end, -1, iv})
	}
	sort.Slice(evs, func(i, j int) bool {
		if !evs[i].at.Equal(evs[j].at) {
			return evs[i].at.Before(evs[j].at)
		}
		return evs[i].delta < evs[j].delta
	})
	cur := 0
	for _, e := range evs {
		cur += e.delta
		if cur > permits {
			out = append(out, fmt.Sprintf("%d holders of %d permits at %v (worker %d took %s fence %d)", cur, permits, e.at.Format("15:04:05.000000"), e.iv.worker, e.iv.key, e.iv.fence))
		}
		peak = max(peak, cur)
	}
	byKey := map[string][]interval{}
	for _, iv := range ivs {
		byKey[iv.key] = append(byKey[iv.key], iv)
	}
	for k, list := range byKey {
		sort.Slice(list, func(i, j int) bool { return list[i].start.Before(list[j].start) })
		exclusive := permits == 1 || !strings.HasSuffix(k, "/permit-shared")
		for i := 1; i < len(list) && exclusive; i++ {
			if list[i].fence <= list[i-1].fence {
				out = append(out, fmt.Sprintf("%s: fence %d held after fence %d", k, list[i].fence, list[i-1].fence))
			}
		}
		seen := map[uint64]bool{}
		for _, iv := range list {
			if seen[iv.fence] {
				out = append(out, fmt.Sprintf("%s: fence %d granted twice", k, iv.fence))
			}
			seen[iv.fence] = true
		}
	}
	return out, peak
}

// checkIntervals fails t on every violation of ivs and logs the figures.
func checkIntervals(t *testing.T, ivs []interval, permits int) {
	t.Helper()
	bad, peak := violations(ivs, permits)
	for _, v := range bad {
		t.Error(v)
	}
	paused, lost := 0, 0
	for _, iv := range ivs {
		if iv.paused {
			paused++
		}
		if iv.lost {
			lost++
		}
	}
	t.Logf("%d permit grants, peak %d of %d holders at once, %d paused past their TTL, %d lost", len(ivs), peak, permits, paused, lost)
	if paused == 0 || len(ivs) <= permits {
		t.Errorf("too little exercised: %d grants, %d paused", len(ivs), paused)
	}
}

// The detector itself catches a third holder of two permits, a reused
// fence, and a slot whose fence went back.
func TestViolations_DetectorCatchesOverlap(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ok := []interval{
		{key: "s/permit-0", fence: 1, start: at(0), end: at(10)},
		{key: "s/permit-1", fence: 2, start: at(5), end: at(20)},
		{key: "s/permit-0", fence: 3, start: at(10), end: at(30)}, // starts as the first ends
	}
	if bad, peak := violations(ok, 2); len(bad) != 0 || peak != 2 {
		t.Fatalf("clean history: %v, peak %d", bad, peak)
	}
	three := append(ok[:3:3], interval{key: "s/permit-shared", fence: 9, start: at(15), end: at(16)})
	if bad, _ := violations(three, 2); len(bad) != 1 || !strings.Contains(bad[0], "3 holders of 2 permits") {
		t.Fatalf("a third holder: %v", bad)
	}
	reused := append(ok[:3:3], interval{key: "s/permit-1", fence: 2, start: at(40), end: at(50)})
	if bad, _ := violations(reused, 2); len(bad) != 2 {
		t.Fatalf("a reused fence on a slot: %v, want fence order and reuse", bad)
	}
}

func memOpener(portable bool) func(t *testing.T, i int) (*dlock.Locker, *dlocktest.FaultDriver) {
	s := memdriver.NewStore()
	return func(t *testing.T, i int) (*dlock.Locker, *dlocktest.FaultDriver) {
		var d driver.Driver = memdriver.New(s)
		if portable {
			d = plainOnly{d}
		}
		fd := dlocktest.NewFaultDriver(d, nil)
		l := dlock.New(fd, dlock.WithStoreName("mem"), dlock.WithOpTimeout(2*time.Second))
		t.Cleanup(func() { _ = l.Close() })
		return l, dlocktest.Faults(fd)
	}
}

// TestSemaphore_NeverExceedsN_Mem: the overlap detector over the native
// and the portable scheme on the in-process store, with holders paused past
// their TTL.
func TestSemaphore_NeverExceedsN_Mem(t *testing.T) {
	t.Run("native", func(t *testing.T) { overlap(t, memOpener(false), true, 2, 6, 300*time.Millisecond, 3*time.Second) })
	t.Run("portable", func(t *testing.T) { overlap(t, memOpener(true), false, 2, 6, 300*time.Millisecond, 3*time.Second) })
}

// A semaphore of a closed Locker refuses with ErrClosed; closing the Locker
// ends the permits it holds.
func TestSemaphore_LockerClosed(t *testing.T) {
	for _, portable := range []bool{false, true} {
		t.Run(fmt.Sprintf("portable=%v", portable), func(t *testing.T) {
			s := memdriver.NewStore()
			l := memLocker(t, s, portable)
			sem, err := semaphore.New(l, "c", 2)
			if err != nil {
				t.Fatal(err)
			}
			ls, err := sem.Acquire(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			_ = l.Close()
			select {
			case <-ls.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("permit still held after its Locker closed")
			}
			if _, err := sem.Acquire(t.Context()); !errors.Is(err, dlock.ErrClosed) {
				t.Fatalf("Acquire on a closed Locker: %v, want ErrClosed", err)
			}
			if infos, err := memLocker(t, s, false).List(t.Context(), "c/"); err != nil || len(infos) != 0 {
				t.Fatalf("left held after Close: %v %v", infos, err)
			}
		})
	}
}

// TestSemaphore_NativeMaxHoldKeepsPermitUntilTTL: a native permit ended by
// dlock.WithMaxHold is not released on the store at once (the semaphore's
// cleanup used to close its view, which released it): like any max-held
// lease, it expires by its TTL, so a stuck holder is not overlapped before.
func TestSemaphore_NativeMaxHoldKeepsPermitUntilTTL(t *testing.T) {
	l := memLocker(t, memdriver.NewStore(), false)
	sem, err := semaphore.New(l, "maxhold", 1)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	lease, err := sem.Acquire(t.Context(), dlock.WithTTL(ttl), dlock.WithMaxHold(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-lease.Done()
	ended := time.Now()
	if !errors.Is(lease.Err(), dlock.ErrMaxHoldReached) {
		t.Fatalf("lease ended with %v, want ErrMaxHoldReached", lease.Err())
	}
	time.Sleep(200 * time.Millisecond) // the cleanup goroutine has run by now
	if ls, err := sem.TryAcquire(t.Context()); !errors.Is(err, dlock.ErrNotAcquired) {
		if ls != nil {
			_ = ls.Release(t.Context())
		}
		if time.Since(ended) < ttl-ttl/3 { // the store may expire it from one TTL after the last renewal
			t.Fatalf("permit free %v after max hold (TTL %v): %v; want it kept until the TTL runs out", time.Since(ended), ttl, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	next, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatalf("permit never came back after the TTL: %v", err)
	}
	_ = next.Release(t.Context())
}
