package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/recipe/rwlock"
)

// rwlockStores are the harness names (or name prefixes) of the stores that
// have read-write locks (recipe/rwlock): every other store must refuse with
// ErrUnsupported.
var rwlockStores = []string{"dlockd", "mem", "etcd", "zk", "redis"}

func rwlockExpected(name string) bool {
	for _, s := range rwlockStores {
		if name == s || strings.HasPrefix(name, s+"-") {
			return true
		}
	}
	return false
}

// rwLocker opens a Locker over a new driver (another process), without the
// fault wrapper: the read-write lock needs the driver's SharedLocker.
func (s *suite) rwLocker(t TB) *dlock.Locker {
	t.Helper()
	d, err := s.h.NewDriver(t.Context())
	if err != nil {
		t.Fatalf("%s: NewDriver: %v", s.h.Name, err)
	}
	l := dlock.New(d, dlock.WithStoreName(s.h.Name), dlock.WithTTL(10*time.Second),
		dlock.WithBackoff(time.Millisecond, 25*time.Millisecond), dlock.WithOpTimeout(2*time.Second))
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// testRWLock: on stores with read-write locks, readers share, a writer
// excludes everyone, a waiting writer holds back later readers (writer
// preference), fences order writers after every earlier grant, a cancelled
// writer leaves nothing queued, and a short random run shows no reader
// overlapping a writer; elsewhere rwlock.New reports ErrUnsupported.
func (s *suite) testRWLock(t TB) {
	l1 := s.rwLocker(t)
	name := key(t, "rw")
	rw1, err := rwlock.New(l1, name)
	if !rwlockExpected(s.h.Name) {
		if err == nil {
			rw1.Close()
			t.Logf("%s is not listed as a store with read-write locks, but rwlock.New works: running the checks", s.h.Name)
		} else if !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("rwlock.New on %s = %v, want an error matching ErrUnsupported", s.h.Name, err)
		} else {
			t.Logf("%s: %v (as expected)", s.h.Name, err)
			return
		}
		rw1, err = rwlock.New(l1, name)
	}
	if err != nil {
		t.Fatalf("rwlock.New on %s: %v (this store has read-write locks)", s.h.Name, err)
	}
	defer rw1.Close()
	newRW := func() *rwlock.RWLock {
		rw, err := rwlock.New(s.rwLocker(t), name)
		if err != nil {
			t.Fatalf("rwlock.New: %v", err)
		}
		t.Cleanup(func() { rw.Close() })
		return rw
	}
	rw2, rw3 := newRW(), newRW()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	// Readers share.
	r1, err := rw1.TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock on a free lock: %v", err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	r2, err := rw2.RLock(rctx)
	rcancel()
	if err != nil {
		t.Fatalf("RLock beside another reader: %v", err)
	}
	if r1.Fence() == 0 || r2.Fence() == 0 || r1.Fence() == r2.Fence() {
		t.Fatalf("reader fences %d and %d: want distinct and > 0", r1.Fence(), r2.Fence())
	}
	if w, err := rw3.TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		if w != nil {
			_ = w.Release(ctx)
		}
		t.Fatalf("TryLock while read-locked = %v, want ErrNotAcquired", err)
	}

	// A writer that gives up leaves nothing queued: readers still get in.
	gctx, gcancel := context.WithTimeout(ctx, 150*time.Millisecond)
	_, err = rw3.Lock(gctx)
	gcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with a short deadline while read-locked = %v, want DeadlineExceeded", err)
	}
	if r, err := rw3.TryRLock(ctx); err != nil {
		t.Fatalf("TryRLock after a writer gave up: %v (the writer left something queued)", err)
	} else {
		release(t, r)
	}

	if !rw3.WriterPreference() {
		// Waiters poll with TryAcquire, which never queues: writers compete
		// with readers by backoff (and a stream of readers could starve
		// them), so only exclusion is checked.
		t.Logf("%s: the driver hides its queue (waiters poll): no writer preference to check", s.h.Name)
		release(t, r1)
		release(t, r2)
		w, err := rw3.Lock(ctx)
		if err != nil {
			t.Fatalf("Lock on a free lock: %v", err)
		}
		if w.Fence() <= max(r1.Fence(), r2.Fence()) {
			t.Fatalf("writer fence %d not above the earlier readers' %d and %d", w.Fence(), r1.Fence(), r2.Fence())
		}
		if _, err := rw1.TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryRLock while write-locked = %v, want ErrNotAcquired", err)
		}
		release(t, w)
		return
	}
	// A waiting writer holds back later readers.
	type got struct {
		ls  *dlock.Lease
		err error
	}
	wch := make(chan got, 1)
	go func() {
		ls, err := rw3.Lock(ctx)
		wch <- got{ls, err}
	}()
	queued := false
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		r, err := rw1.TryRLock(ctx)
		if errors.Is(err, dlock.ErrNotAcquired) {
			queued = true
			break
		}
		if err != nil {
			t.Fatalf("TryRLock while a writer queues: %v", err)
		}
		release(t, r) // the writer is not queued yet
		time.Sleep(5 * time.Millisecond)
	}
	if !queued {
		t.Fatal("TryRLock kept succeeding for 5 s while a writer waited: no writer preference")
	}
	lateCh := make(chan got, 1)
	go func() {
		ls, err := rw2.RLock(ctx)
		lateCh <- got{ls, err}
	}()
	time.Sleep(50 * time.Millisecond)
	release(t, r1)
	release(t, r2)
	var w got
	select {
	case w = <-wch:
	case l := <-lateCh:
		if l.ls != nil {
			_ = l.ls.Release(ctx)
		}
		t.Fatalf("a reader that came after a waiting writer was served first (%v)", l.err)
	case <-ctx.Done():
		t.Fatal("the writer was not granted after the readers released")
	}
	if w.err != nil {
		t.Fatalf("Lock: %v", w.err)
	}
	if w.ls.Fence() <= max(r1.Fence(), r2.Fence()) {
		t.Fatalf("writer fence %d not above the earlier readers' %d and %d", w.ls.Fence(), r1.Fence(), r2.Fence())
	}
	select {
	case l := <-lateCh:
		t.Fatalf("a reader was granted while the writer held the lock (%v)", l.err)
	case <-time.After(100 * time.Millisecond):
	}
	release(t, w.ls)
	var late got
	select {
	case late = <-lateCh:
	case <-ctx.Done():
		t.Fatal("the late reader was not granted after the writer released")
	}
	if late.err != nil {
		t.Fatalf("RLock after the writer: %v", late.err)
	}
	if late.ls.Fence() <= w.ls.Fence() {
		t.Fatalf("reader fence %d after writer fence %d: want greater", late.ls.Fence(), w.ls.Fence())
	}
	release(t, late.ls)

	// A short random run under the overlap detector.
	f := RWLockOverlap(t, []*rwlock.RWLock{rw1, rw2, rw3}, 2, 600*time.Millisecond)
	t.Logf("%s: %v", s.h.Name, f)
}

// RWLockFigures are what RWLockOverlap measured.
type RWLockFigures struct {
	Reads, Writes int           // grants taken
	MaxReaders    int           // most readers seen holding at once
	Elapsed       time.Duration // how long the run took
}

// String sums the figures up in one line, for test logs.
func (f RWLockFigures) String() string {
	return fmt.Sprintf("%d read grants (up to %d at once), %d write grants in %v", f.Reads, f.MaxReaders, f.Writes, f.Elapsed.Round(time.Millisecond))
}

// RWLockOverlap runs perLock goroutines on each of rws (read-write locks of
// one name, typically through different drivers: different processes) for
// about d: each takes a read lock (3 times in 4) or a write lock, holds it
// a few milliseconds and releases it. An overlap detector checks, on every
// grant, that no writer holds while a reader or another writer does, and
// fails t otherwise. Run it under -race. It returns what it measured.
func RWLockOverlap(t TB, rws []*rwlock.RWLock, perLock int, d time.Duration) RWLockFigures {
	t.Helper()
	var (
		mu               sync.Mutex
		readers, writers int
		f                RWLockFigures
		bad              atomic.Value
	)
	enter := func(write bool) {
		mu.Lock()
		defer mu.Unlock()
		if write {
			writers++
			f.Writes++
			if writers > 1 || readers > 0 {
				bad.CompareAndSwap(nil, fmt.Sprintf("a writer was granted while %d readers and %d other writers held", readers, writers-1))
			}
			return
		}
		readers++
		f.Reads++
		f.MaxReaders = max(f.MaxReaders, readers)
		if writers > 0 {
			bad.CompareAndSwap(nil, fmt.Sprintf("a reader was granted while %d writers held", writers))
		}
	}
	leave := func(write bool) {
		mu.Lock()
		defer mu.Unlock()
		if write {
			writers--
		} else {
			readers--
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), d+30*time.Second)
	defer cancel()
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	errs := make(chan error, len(rws)*perLock)
	for _, rw := range rws {
		for range perLock {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					write := rand.IntN(4) == 0
					var ls *dlock.Lease
					var err error
					if write {
						ls, err = rw.Lock(ctx)
					} else {
						ls, err = rw.RLock(ctx)
					}
					if err != nil {
						errs <- fmt.Errorf("acquire (write %v): %w", write, err)
						return
					}
					enter(write)
					time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
					lost := ls.Err()
					leave(write)
					if err := ls.Release(ctx); err != nil || lost != nil {
						errs <- fmt.Errorf("release (write %v): %v (lease error before: %v)", write, err, lost)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	f.Elapsed = time.Since(start)
	for err := range errs {
		t.Errorf("%v", err)
	}
	if msg := bad.Load(); msg != nil {
		t.Fatalf("overlap: %v (%v)", msg, f)
	}
	return f
}

// RWLockWriterNotStarved runs a stream of overlapping readers (each of
// readers read-locks, holds for hold, releases, and at once read-locks
// again; they start hold/len(readers) apart so that the lock is never free
// of readers) and then asks writer for the write lock. It fails t when the
// writer is not granted within limit while the stream goes on (a writer
// starved by readers), when more than 3 reader grants per reader are made
// while it waits (later readers overtook it), or when a reader holds beside
// it. It returns how long the writer waited, and how many reader grants
// were made while it waited.
func RWLockWriterNotStarved(t TB, readers []*rwlock.RWLock, writer *rwlock.RWLock, hold, limit time.Duration) (time.Duration, int) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var (
		writing    atomic.Bool
		waiting    atomic.Bool
		grants     atomic.Int64 // reader grants while the writer waited
		started    atomic.Int64 // reader grants so far
		overlapMsg atomic.Value
	)
	var wg sync.WaitGroup
	for i, rw := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * hold / time.Duration(len(readers)))
			for ctx.Err() == nil {
				ls, err := rw.RLock(ctx)
				if err != nil {
					return // ctx ended
				}
				if writing.Load() {
					overlapMsg.CompareAndSwap(nil, "a reader was granted while the writer held")
				}
				started.Add(1)
				if waiting.Load() {
					grants.Add(1)
				}
				select {
				case <-time.After(hold):
				case <-ctx.Done():
				}
				_ = ls.Release(context.WithoutCancel(ctx))
			}
		}()
	}
	defer wg.Wait()
	defer cancel()
	// Let the stream run: readers overlap, the lock is never free.
	for started.Load() < int64(2*len(readers)) {
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the reader stream did not start")
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, limit)
	defer wcancel()
	waiting.Store(true)
	t0 := time.Now()
	w, err := writer.Lock(wctx)
	waited := time.Since(t0)
	waiting.Store(false)
	if err != nil {
		t.Fatalf("the writer was not granted within %v while readers streamed (%d reader grants meanwhile): %v", limit, grants.Load(), err)
	}
	writing.Store(true)
	time.Sleep(hold)
	writing.Store(false)
	_ = w.Release(ctx)
	if msg := overlapMsg.Load(); msg != nil {
		t.Fatalf("overlap: %v", msg)
	}
	// Readers that asked before the writer arrived may go first (FIFO):
	// about one per reader, a few more while the writer's request is on
	// its way. A stream that kept going past the writer is starvation.
	if n := grants.Load(); n > int64(3*len(readers)) {
		t.Fatalf("%d reader grants while the writer waited %v, more than 3 per reader (%d readers): later readers overtook the waiting writer", n, waited, len(readers))
	}
	return waited, int(grants.Load())
}

// RunRWLock runs the read-write lock checks of a store whose driver is a
// driver.SharedLocker with read-write kinds, through drivers opened by
// open (each one another process), as subtests:
//
//   - SharedView_Kinds: Shared with a Limit is ErrUnsupported or works,
//     an invalid kind is ErrInvalidArgument, the views' Close closes no
//     connection, and a view's Renew and Release of a grant it does not
//     hold are ErrLeaseLost.
//   - Overlap: RWLockOverlap over 3 drivers × 2 goroutines for 2 s.
//   - WriterNotStarved: RWLockWriterNotStarved with 6 readers holding
//     100 ms each, limit 10 s.
//   - PausedReaderFencedBeforeWriter: a reader whose renewals hang has
//     lost its lease (Done, Context cancelled) before a waiting writer is
//     granted.
//   - PerGrantTTL: a reader whose renewals stop loses its grant after its
//     own TTL while another reader's lease goes on, and a writer then gets
//     the lock.
//
// Figures are logged. Run it under -race.
func RunRWLock(t *testing.T, name string, open func(ctx context.Context) (driver.Driver, error)) {
	t.Helper()
	locker := func(t *testing.T, opts ...dlock.Option) (*dlock.Locker, *FaultDriver) {
		d, err := open(t.Context())
		if err != nil {
			t.Fatalf("%s: open: %v", name, err)
		}
		fd := NewFaultDriver(d, t.Logf)
		base := []dlock.Option{dlock.WithStoreName(name), dlock.WithTTL(10 * time.Second),
			dlock.WithBackoff(time.Millisecond, 25*time.Millisecond), dlock.WithOpTimeout(2 * time.Second)}
		l := dlock.New(fd, append(base, opts...)...)
		t.Cleanup(func() { l.Close() })
		return l, Faults(fd)
	}
	rws := func(t *testing.T, n int, key string) []*rwlock.RWLock {
		var out []*rwlock.RWLock
		for range n {
			l, _ := locker(t)
			rw, err := rwlock.New(l, key)
			if err != nil {
				t.Fatalf("%s: rwlock.New: %v", name, err)
			}
			t.Cleanup(func() { rw.Close() })
			out = append(out, rw)
		}
		return out
	}
	t.Run("SharedView_Kinds", func(t *testing.T) {
		d, err := open(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		sl, ok := d.(driver.SharedLocker)
		if !ok {
			t.Fatalf("%s: %T is no driver.SharedLocker", name, d)
		}
		if v, err := sl.SharedView(driver.SharedKind{Mode: driver.Shared, Limit: 3}); err == nil {
			v.Close()
		} else if !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("SharedView(Shared, 3) = %v, want a view or ErrUnsupported", err)
		}
		for _, k := range []driver.SharedKind{{}, {Mode: driver.Exclusive, Limit: 2}, {Mode: driver.Shared, Limit: -1}, {Mode: 9}} {
			if _, err := sl.SharedView(k); !errors.Is(err, driver.ErrInvalidArgument) {
				t.Errorf("SharedView(%+v) = %v, want ErrInvalidArgument", k, err)
			}
		}
		key := fmt.Sprintf("rw-kinds:%d", time.Now().UnixNano())
		for _, k := range []driver.SharedKind{{Mode: driver.Shared}, {Mode: driver.Exclusive}} {
			v, err := sl.SharedView(k)
			if err != nil {
				t.Fatalf("SharedView(%v): %v", k.Mode, err)
			}
			if err := v.Release(t.Context(), key, "0123456789abcdef0123456789abcdef"); !errors.Is(err, driver.ErrLeaseLost) {
				t.Errorf("%v view: Release of a grant never made = %v, want ErrLeaseLost", k.Mode, err)
			}
			if err := v.Renew(t.Context(), key, "0123456789abcdef0123456789abcdef", time.Second); !errors.Is(err, driver.ErrLeaseLost) {
				t.Errorf("%v view: Renew of a grant never made = %v, want ErrLeaseLost", k.Mode, err)
			}
			if _, err := v.TryAcquire(t.Context(), driver.AcquireRequest{Key: "", Owner: "0123456789abcdef0123456789abcdef", TTL: time.Second}); !errors.Is(err, driver.ErrInvalidArgument) {
				t.Errorf("%v view: TryAcquire with an empty key = %v, want ErrInvalidArgument", k.Mode, err)
			}
			if err := v.Close(); err != nil {
				t.Errorf("view Close: %v", err)
			}
		}
		// The views closed nothing: the parent still works.
		req := driver.AcquireRequest{Key: key, Owner: "owner-after-view-close", TTL: time.Second}
		if _, err := d.TryAcquire(t.Context(), req); err != nil {
			t.Fatalf("parent TryAcquire after the views' Close: %v", err)
		}
		if err := d.Release(t.Context(), key, req.Owner); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Overlap", func(t *testing.T) {
		f := RWLockOverlap(t, rws(t, 3, fmt.Sprintf("rw-overlap:%d", time.Now().UnixNano())), 2, 2*time.Second)
		t.Logf("%s: %v", name, f)
		if f.Reads == 0 || f.Writes == 0 || f.MaxReaders < 2 {
			t.Fatalf("the run did not exercise both kinds and shared reads: %v", f)
		}
	})
	t.Run("WriterNotStarved", func(t *testing.T) {
		all := rws(t, 7, fmt.Sprintf("rw-starve:%d", time.Now().UnixNano()))
		waited, during := RWLockWriterNotStarved(t, all[:6], all[6], 100*time.Millisecond, 10*time.Second)
		t.Logf("%s: a writer behind a stream of 6 overlapping readers (100 ms each) waited %v; %d reader grants meanwhile", name, waited, during)
	})
	t.Run("PausedReaderFencedBeforeWriter", func(t *testing.T) {
		// A reader whose renewals hang (a paused process) must have lost
		// its lease (Done closed, Context cancelled) before a waiting
		// writer is granted: the store expires the grant no earlier than
		// the client's validity deadline.
		key := fmt.Sprintf("rw-paused:%d", time.Now().UnixNano())
		la, fa := locker(t, dlock.WithTTL(time.Second))
		lw, _ := locker(t)
		a, err := rwlock.New(la, key)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		w, err := rwlock.New(lw, key)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		ra, err := a.RLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		fa.BlockRenewals(true)
		defer fa.BlockRenewals(false)
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		wl, err := w.Lock(ctx)
		if err != nil {
			t.Fatalf("Lock while the only reader is paused: %v", err)
		}
		select {
		case <-ra.Done():
		default:
			t.Fatalf("the writer was granted (fence %d) while the paused reader's lease was still valid (deadline in %v)", wl.Fence(), time.Until(ra.Deadline()))
		}
		if ra.Context().Err() == nil || !errors.Is(ra.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("paused reader: context %v, lease error %v; want cancelled with ErrLeaseLost", ra.Context().Err(), ra.Err())
		}
		if wl.Fence() <= ra.Fence() {
			t.Fatalf("writer fence %d not above the paused reader's %d", wl.Fence(), ra.Fence())
		}
		release(t, wl)
	})
	t.Run("PerGrantTTL", func(t *testing.T) {
		key := fmt.Sprintf("rw-ttl:%d", time.Now().UnixNano())
		la, fa := locker(t, dlock.WithTTL(time.Second))
		lb, _ := locker(t, dlock.WithTTL(3*time.Second)) // renewed throughout: slack for a loaded machine
		lw, _ := locker(t)
		a, err := rwlock.New(la, key)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := rwlock.New(lb, key)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		w, err := rwlock.New(lw, key)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		ra, err := a.RLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		rb, err := b.RLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		fa.BlockRenewals(true)
		select {
		case <-ra.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a reader whose renewals hang kept its lease past its TTL")
		}
		fa.BlockRenewals(false)
		time.Sleep(1500 * time.Millisecond) // past a's TTL on the store; b renewed meanwhile
		if rb.Err() != nil {
			t.Fatalf("the other reader's lease ended with the first's: %v", rb.Err())
		}
		if _, err := w.TryLock(t.Context()); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryLock beside a live reader = %v, want ErrNotAcquired", err)
		}
		if err := rb.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
		defer cancel()
		wl, err := w.Lock(ctx)
		if err != nil {
			t.Fatalf("Lock after one reader expired and the other released: %v", err)
		}
		if wl.Fence() <= max(ra.Fence(), rb.Fence()) {
			t.Fatalf("writer fence %d not above the readers' %d, %d", wl.Fence(), ra.Fence(), rb.Fence())
		}
		release(t, wl)
	})
}
