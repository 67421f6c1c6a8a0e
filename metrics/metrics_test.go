package metrics_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/drivers/memdriver"
	"github.com/dlock-dev/dlock/metrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCollector_ReportsLockFigures(t *testing.T) {
	c := metrics.NewCollector()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	store := memdriver.NewStore()
	fd := dlocktest.NewFaultDriver(memdriver.New(store), t.Logf)
	a := dlock.New(fd, dlock.WithStoreName("mem"), dlock.WithObserver(c), dlock.WithKeyClass("settlement"))
	defer a.Close()
	b := dlock.New(memdriver.New(store), dlock.WithStoreName("mem"), dlock.WithObserver(c), dlock.WithKeyClass("settlement"))
	defer b.Close()

	// Renewals every 100 ms, but a TTL with room for a loaded machine's
	// scheduling delay: the lease is lost only when renewals are blocked.
	ls, err := a.Acquire(t.Context(), "settle:1", dlock.WithTTL(time.Second), dlock.WithHeartbeat(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(t.Context(), "settle:1"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	// Await two confirmed renewals rather than sleep for them.
	for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(c.Renewals("mem", "settlement", "ok")) < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 2 renewals within 10 s; lease: %v", ls.Err())
		}
	}
	dlocktest.Faults(fd).BlockRenewals(true)
	<-ls.Done()
	ls2, err := b.Acquire(t.Context(), "settle:1")
	if err != nil {
		t.Fatal(err)
	}
	_ = ls2.Release(t.Context())

	if got := testutil.ToFloat64(c.Contended("mem", "settlement")); got != 1 {
		t.Errorf("contended = %v, want 1", got)
	}
	if got := testutil.ToFloat64(c.Lost("mem", "settlement", dlock.LostExpired)); got != 1 {
		t.Errorf("lost(expired) = %v, want 1", got)
	}
	if got := testutil.ToFloat64(c.Renewals("mem", "settlement", "ok")); got < 2 {
		t.Errorf("renewals ok = %v, want ≥ 2", got)
	}
	if n := testutil.CollectAndCount(c, "dlock_acquire_duration_seconds"); n != 2 {
		t.Errorf("%d acquire histograms, want 2 (acquired, not_acquired)", n)
	}
	if n := testutil.CollectAndCount(c, "dlock_hold_duration_seconds", "dlock_renewal_margin_seconds"); n != 2 {
		t.Errorf("%d hold/margin series, want 2", n)
	}
	out, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, "dlock_acquire_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "settle:1") {
		t.Error("a raw key appears as a label")
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", err, problems)
	}
}

// TestCollector_HoldTTLRatio checks dlock_hold_ttl_ratio: each lease's hold
// time over its own TTL, for a released lease and one held past its TTL on
// renewals, and that a lost lease is counted too.
func TestCollector_HoldTTLRatio(t *testing.T) {
	c := metrics.NewCollector()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	l := dlock.New(memdriver.New(memdriver.NewStore()), dlock.WithStoreName("mem"), dlock.WithObserver(c), dlock.WithKeyClass("job"))
	defer l.Close()

	short, err := l.Acquire(t.Context(), "job:1", dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := short.Release(t.Context()); err != nil { // held ≪ 2.5 s: ratio below 0.25
		t.Fatal(err)
	}
	long, err := l.Acquire(t.Context(), "job:2", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(450 * time.Millisecond) // renewals keep it: ratio ≥ 2.25
	if err := long.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var h *dto.Histogram
	for _, mf := range mfs {
		if mf.GetName() == "dlock_hold_ttl_ratio" {
			if len(mf.GetMetric()) != 1 {
				t.Fatalf("%d series, want 1 (store mem, key_class job)", len(mf.GetMetric()))
			}
			h = mf.GetMetric()[0].GetHistogram()
		}
	}
	if h == nil {
		t.Fatal("no dlock_hold_ttl_ratio after two leases")
	}
	if h.GetSampleCount() != 2 {
		t.Errorf("sample count %d, want 2", h.GetSampleCount())
	}
	for _, b := range h.GetBucket() {
		var want uint64
		switch ub := b.GetUpperBound(); {
		case ub < 0.25:
			continue // the short lease's exact ratio depends on the machine
		case ub < 2:
			want = 1 // the short lease only
		case ub >= 5:
			want = 2
		default:
			continue // 2: the long one's ratio is about 2.25, on a slow machine more
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("bucket le=%v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
	if sum := h.GetSampleSum(); sum < 2.25 || sum > 4.5 {
		t.Errorf("sum of ratios %.3f, want about 2.25 (0.45 s held / 0.2 s TTL, plus a near-0 one)", sum)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", err, problems)
	}

	// A lease lost at its validity deadline: a ratio of about 1.
	fd := dlocktest.NewFaultDriver(memdriver.New(memdriver.NewStore()), t.Logf)
	lc := metrics.NewCollector()
	ll := dlock.New(fd, dlock.WithStoreName("mem"), dlock.WithObserver(lc), dlock.WithKeyClass("job"))
	defer ll.Close()
	lost, err := ll.Acquire(t.Context(), "job:3", dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	dlocktest.Faults(fd).BlockRenewals(true)
	<-lost.Done()
	// The observer hears of the loss just after Done closes.
	var out []byte
	var count, sum float64
	for deadline := time.Now().Add(5 * time.Second); count == 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if out, err = testutil.CollectAndFormat(lc, expfmt.TypeTextPlain, "dlock_hold_ttl_ratio"); err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, `dlock_hold_ttl_ratio_count{key_class="job",store="mem"} `); ok {
				_, _ = fmt.Sscan(v, &count)
			}
			if v, ok := strings.CutPrefix(line, `dlock_hold_ttl_ratio_sum{key_class="job",store="mem"} `); ok {
				_, _ = fmt.Sscan(v, &sum)
			}
		}
	}
	if count != 1 || sum < 0.9 || sum > 2 {
		t.Errorf("lost lease: ratio count %v sum %v, want 1 of about 1 (lost at the deadline)\n%s", count, sum, out)
	}
}
