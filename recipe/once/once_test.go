package once_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/drivers/memdriver"
	"github.com/dlock-dev/dlock/recipe/once"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memLocker returns a Locker on store through a FaultDriver, as one node.
func memLocker(t *testing.T, store *memdriver.Store, opts ...dlock.Option) (*dlock.Locker, *dlocktest.FaultDriver) {
	t.Helper()
	fd := dlocktest.NewFaultDriver(memdriver.New(store), t.Logf)
	base := []dlock.Option{dlock.WithBackoff(time.Millisecond, 20*time.Millisecond), dlock.WithTTL(300 * time.Millisecond)}
	l := dlock.New(fd, append(base, opts...)...)
	t.Cleanup(func() { _ = l.Close() })
	return l, dlocktest.Faults(fd)
}

func TestRun_FinishedWindowNeverRunsAgain(t *testing.T) {
	store := memdriver.NewStore()
	a, _ := memLocker(t, store)
	b, _ := memLocker(t, store)
	ledger := once.NewMemLedger(nil)
	var runs atomic.Int32
	fn := func(ctx context.Context, at once.Attempt) error {
		runs.Add(1)
		if at.Fence == 0 || at.Number != 1 || at.Lease == nil || at.Lease.Key() != once.Key(at.Job) {
			t.Errorf("attempt %+v", at)
		}
		return nil
	}
	res, err := once.Run(t.Context(), a, ledger, "report", once.Daily, fn)
	if err != nil || res.Outcome != once.OutcomeRan || res.Record.State != once.Finished || res.Record.Attempt != 1 {
		t.Fatalf("first Run = %+v, %v; want ran and finished", res, err)
	}
	if want := once.Daily.Window(time.Now()); res.Window.ID != want.ID && time.Until(want.Start) > -time.Minute {
		t.Fatalf("window %q, want %q", res.Window.ID, want.ID)
	}
	for _, l := range []*dlock.Locker{a, b} {
		res, err := once.Run(t.Context(), l, ledger, "report", once.Daily, fn)
		if err != nil || res.Outcome != once.OutcomeDone || res.Record.State != once.Finished {
			t.Fatalf("second Run = %+v, %v; want done", res, err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	// Another job, and the lock is free.
	if res, err := once.Run(t.Context(), b, ledger, "other", once.Daily, fn); err != nil || res.Outcome != once.OutcomeRan {
		t.Fatalf("other job: %+v, %v", res, err)
	}
	if _, err := b.TryAcquire(t.Context(), once.Key("report")); err != nil {
		t.Fatalf("the job's key is still held: %v", err)
	}
}

func TestRun_FailedAttemptIsRetried(t *testing.T) {
	a, _ := memLocker(t, memdriver.NewStore())
	ledger := once.NewMemLedger(nil)
	boom := errors.New("boom")
	res, err := once.Run(t.Context(), a, ledger, "j", once.Hourly, func(context.Context, once.Attempt) error { return boom })
	if !errors.Is(err, boom) || res.Outcome != once.OutcomeRan || res.Record.State != once.Failed || res.Record.Error != "boom" {
		t.Fatalf("failing Run = %+v, %v", res, err)
	}
	var number int
	res, err = once.Run(t.Context(), a, ledger, "j", once.Hourly, func(_ context.Context, at once.Attempt) error { number = at.Number; return nil })
	if err != nil || res.Record.State != once.Finished || number != 2 || res.Record.Attempt != 2 {
		t.Fatalf("retry = %+v, %v, attempt %d", res, err, number)
	}
}

func TestRun_InvalidInput(t *testing.T) {
	l, _ := memLocker(t, memdriver.NewStore())
	ledger := once.NewMemLedger(nil)
	fn := func(context.Context, once.Attempt) error { return nil }
	cases := []struct {
		name   string
		l      *dlock.Locker
		ledger once.Ledger
		job    string
		period once.Period
		fn     func(context.Context, once.Attempt) error
		opts   []once.Option
		want   string
	}{
		{"nil locker", nil, ledger, "j", once.Daily, fn, nil, "nil Locker"},
		{"nil ledger", l, nil, "j", once.Daily, fn, nil, "nil Ledger"},
		{"nil fn", l, ledger, "j", once.Daily, nil, nil, "nil fn"},
		{"empty job", l, ledger, "", once.Daily, fn, nil, "empty job"},
		{"long job", l, ledger, strings.Repeat("j", once.MaxJobBytes+1), once.Daily, fn, nil, "at most 256"},
		{"bad key", l, ledger, "a\x00b", once.Daily, fn, nil, `"a\x00b"`},
		{"zero period", l, ledger, "j", once.Period{}, fn, nil, "zero Period"},
		{"long node", l, ledger, "j", once.Daily, fn, []once.Option{once.WithNode(strings.Repeat("n", 300))}, "node name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := once.Run(t.Context(), c.l, c.ledger, c.job, c.period, c.fn, c.opts...)
			if !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) || res.Outcome != once.OutcomeNone {
				t.Fatalf("Run = %+v, %v; want ErrInvalidArgument naming %q", res, err, c.want)
			}
		})
	}
	for _, s := range []string{"", "yearly", "0s", "500ms", "400d", "-1h"} {
		if _, err := once.ParsePeriod(s); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("ParsePeriod(%q) = %v, want ErrInvalidArgument", s, err)
		}
	}
}

func TestPeriod_Windows(t *testing.T) {
	at := time.Date(2026, 12, 31, 23, 30, 15, 0, time.UTC) // a Thursday
	every15, _ := once.Every(15 * time.Minute)
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skipf("no tzdata: %v", err) // the UTC cases below do not need it
	}
	cases := []struct {
		p           once.Period
		id          string
		start, end  time.Time
		parsed, str string
	}{
		{once.Hourly, "2026-12-31T23Z", time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), "hour", "hour"},
		{once.Daily, "2026-12-31", time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), "daily", "day"},
		{once.Weekly, "2026-W53", time.Date(2026, 12, 28, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 4, 0, 0, 0, 0, time.UTC), "week", "week"},
		{once.Monthly, "2026-12", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), "month", "month"},
		{every15, "2026-12-31T23:30:00Z/15m0s", time.Date(2026, 12, 31, 23, 30, 0, 0, time.UTC), time.Date(2026, 12, 31, 23, 45, 0, 0, time.UTC), "15m", "15m0s"},
		{once.Daily.In(paris), "2027-01-01", time.Date(2027, 1, 1, 0, 0, 0, 0, paris), time.Date(2027, 1, 2, 0, 0, 0, 0, paris), "", "day Europe/Paris"},
	}
	for _, c := range cases {
		w := c.p.Window(at)
		if w.ID != c.id || !w.Start.Equal(c.start) || !w.End.Equal(c.end) {
			t.Errorf("%v: window %+v, want %s [%v, %v)", c.p, w, c.id, c.start, c.end)
		}
		if c.p.String() != c.str {
			t.Errorf("String() = %q, want %q", c.p.String(), c.str)
		}
		if c.parsed != "" {
			if p, err := once.ParsePeriod(c.parsed); err != nil || p != c.p {
				t.Errorf("ParsePeriod(%q) = %v, %v", c.parsed, p, err)
			}
		}
	}
}

// TestRun_CrashedAttemptRetriedAfterExpiry: node A's attempt stops
// renewing mid-run (a crash, or a pause); node B waits for the job's lock,
// gets it only once A's lease expired, retries the window, and A's late
// finish is refused by its fence.
func TestRun_CrashedAttemptRetriedAfterExpiry(t *testing.T) {
	store := memdriver.NewStore()
	a, fa := memLocker(t, store)
	b, _ := memLocker(t, store)
	ledger := once.NewMemLedger(nil)
	started := make(chan *dlock.Lease)
	resume := make(chan struct{})
	aErr := make(chan error, 1)
	go func() {
		_, err := once.Run(context.Background(), a, ledger, "j", once.Daily, func(ctx context.Context, at once.Attempt) error {
			fa.BlockRenewals(true) // A "crashes": the store hears no more of it
			started <- at.Lease
			<-resume // a paused process wakes up and finishes its work late
			return nil
		})
		aErr <- err
	}()
	aLease := <-started
	var bAt once.Attempt
	res, err := once.Run(t.Context(), b, ledger, "j", once.Daily, func(_ context.Context, at once.Attempt) error {
		bAt = at
		select {
		case <-aLease.Done():
		default:
			t.Error("B runs while A's lease is still valid")
		}
		return nil
	})
	if err != nil || res.Outcome != once.OutcomeRan || bAt.Number != 2 || bAt.Fence <= aLease.Fence() {
		t.Fatalf("B's retry = %+v, %v, attempt %+v; A's fence %d", res, err, bAt, aLease.Fence())
	}
	close(resume)
	err = <-aErr
	if !errors.Is(err, once.ErrStaleFence) || !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("A's late finish: %v, want ErrStaleFence and ErrLeaseLost", err)
	}
	rec, _ := ledger.Get(t.Context(), "j", res.Window.ID)
	if rec.State != once.Finished || rec.Fence != bAt.Fence || rec.Attempt != 2 {
		t.Fatalf("record %+v, want B's finish", rec)
	}
}

// pausingLedger pauses the Start of the node it belongs to until resume
// closes, as a process stopped between its grant and its ledger write.
type pausingLedger struct {
	once.Ledger
	paused chan struct{}
	resume chan struct{}
}

func (p pausingLedger) Start(ctx context.Context, req once.StartRequest) (once.Record, error) {
	close(p.paused)
	<-p.resume
	return p.Ledger.Start(ctx, req)
}

// TestRun_PausedBeforeStartDoesNotRun: A acquires and is paused past its
// TTL before it records its start; B runs and finishes the window; A's late
// start is refused and A's fn never runs.
func TestRun_PausedBeforeStartDoesNotRun(t *testing.T) {
	store := memdriver.NewStore()
	a, fa := memLocker(t, store)
	b, _ := memLocker(t, store)
	ledger := once.NewMemLedger(nil)
	pl := pausingLedger{ledger, make(chan struct{}), make(chan struct{})}
	type result struct {
		res once.Result
		err error
	}
	aDone := make(chan result, 1)
	var aRan atomic.Bool
	go func() {
		res, err := once.Run(context.Background(), a, pl, "j", once.Daily, func(context.Context, once.Attempt) error { aRan.Store(true); return nil })
		aDone <- result{res, err}
	}()
	<-pl.paused
	fa.BlockRenewals(true)
	res, err := once.Run(t.Context(), b, ledger, "j", once.Daily, func(context.Context, once.Attempt) error { return nil })
	if err != nil || res.Outcome != once.OutcomeRan || res.Record.Attempt != 1 {
		t.Fatalf("B = %+v, %v", res, err)
	}
	close(pl.resume)
	r := <-aDone
	if r.err != nil || r.res.Outcome != once.OutcomeDone || aRan.Load() {
		t.Fatalf("A after its pause = %+v, %v, fn ran %v; want done, fn not run", r.res, r.err, aRan.Load())
	}
}

func TestRun_NoWaitIsBusy(t *testing.T) {
	store := memdriver.NewStore()
	a, _ := memLocker(t, store)
	b, _ := memLocker(t, store)
	ledger := once.NewMemLedger(nil)
	in, out := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := once.Run(t.Context(), a, ledger, "j", once.Daily, func(context.Context, once.Attempt) error {
			close(in)
			<-out
			return nil
		})
		done <- err
	}()
	<-in
	res, err := once.Run(t.Context(), b, ledger, "j", once.Daily, func(context.Context, once.Attempt) error { return nil }, once.NoWait())
	if !errors.Is(err, dlock.ErrNotAcquired) || res.Outcome != once.OutcomeBusy {
		t.Fatalf("NoWait while A runs = %+v, %v; want busy", res, err)
	}
	close(out)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Waiting instead: B gets the lock after A and finds the window done.
	res, err = once.Run(t.Context(), b, ledger, "j", once.Daily, func(context.Context, once.Attempt) error { return nil })
	if err != nil || res.Outcome != once.OutcomeDone {
		t.Fatalf("after A = %+v, %v", res, err)
	}
}

func TestRun_MaxSkew(t *testing.T) {
	l, _ := memLocker(t, memdriver.NewStore())
	ledger := once.NewMemLedger(nil)
	ahead := func() time.Time { return time.Now().Add(time.Hour) }
	fn := func(context.Context, once.Attempt) error { return nil }
	res, err := once.Run(t.Context(), l, ledger, "j", once.Daily, fn, once.WithClock(ahead), once.WithMaxSkew(time.Minute))
	if !errors.Is(err, once.ErrClockSkew) || !errors.Is(err, dlock.ErrInvalidArgument) || res.Skew < 59*time.Minute {
		t.Fatalf("Run on a node an hour ahead = %+v, %v; want ErrClockSkew", res, err)
	}
	res, err = once.Run(t.Context(), l, ledger, "j", once.Daily, fn, once.WithClock(ahead))
	if err != nil || res.Outcome != once.OutcomeRan || res.Skew < 59*time.Minute {
		t.Fatalf("without WithMaxSkew = %+v, %v", res, err)
	}
}

// nodeClockLedger is the ShedLock design: each node's ledger reads the
// node's own clock. TestRun_NodeClocksRunTwice shows what it breaks.
type nodeClockLedger struct {
	*once.MemLedger
	now func() time.Time
}

func (n nodeClockLedger) Now(context.Context) (time.Time, error) { return n.now(), nil }

// TestRun_NodeClocksRunTwice is the control of the skew tests: when the
// window comes from each node's clock (ShedLock), two nodes whose clocks
// differ by a period both run the "same" job, each for its own window. With
// the ledger's clock (the rest of this package's tests) they agree.
func TestRun_NodeClocksRunTwice(t *testing.T) {
	store := memdriver.NewStore()
	shared := once.NewMemLedger(nil)
	var runs sync.Map
	fn := func(_ context.Context, at once.Attempt) error { runs.Store(at.Window.ID, true); return nil }
	for i, skew := range []time.Duration{-24 * time.Hour, 24 * time.Hour} {
		l, _ := memLocker(t, store)
		clock := func() time.Time { return time.Now().Add(skew) }
		naive := nodeClockLedger{shared, clock}
		if res, err := once.Run(t.Context(), l, naive, "naive", once.Daily, fn); err != nil || res.Outcome != once.OutcomeRan {
			t.Fatalf("node %d: %+v, %v", i, res, err)
		}
		if res, err := once.Run(t.Context(), l, shared, "shared", once.Daily, fn, once.WithClock(clock)); err != nil || res.Outcome != once.OutcomeRan && i == 0 || res.Outcome != once.OutcomeDone && i == 1 {
			t.Fatalf("node %d with the ledger's clock: %+v, %v", i, res, err)
		}
	}
	n := 0
	runs.Range(func(any, any) bool { n++; return true })
	if n != 3 { // two windows for "naive" (the bug), one for "shared"
		t.Fatalf("%d windows ran, want 2 (node clocks) + 1 (ledger clock)", n)
	}
}

// TestRun_FnContextEndsWithLease: fn's context ends with the lease, cause
// ErrLeaseLost; the attempt is recorded Failed (nobody took over, so its
// fence still holds) and the next Run retries it.
func TestRun_FnContextEndsWithLease(t *testing.T) {
	a, fa := memLocker(t, memdriver.NewStore())
	ledger := once.NewMemLedger(nil)
	res, err := once.Run(t.Context(), a, ledger, "j", once.Daily, func(ctx context.Context, _ once.Attempt) error {
		fa.BlockRenewals(true)
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("fn's context did not end with its lease")
		}
		if !errors.Is(context.Cause(ctx), dlock.ErrLeaseLost) {
			t.Errorf("cause %v, want ErrLeaseLost", context.Cause(ctx))
		}
		return context.Cause(ctx)
	})
	if !errors.Is(err, dlock.ErrLeaseLost) || res.Record.State != once.Failed {
		t.Fatalf("Run = %+v, %v; want a failed attempt", res, err)
	}
	fa.BlockRenewals(false)
	res, err = once.Run(t.Context(), a, ledger, "j", once.Daily, func(context.Context, once.Attempt) error { return nil })
	if err != nil || res.Record.State != once.Finished || res.Record.Attempt != 2 {
		t.Fatalf("retry = %+v, %v", res, err)
	}
}
