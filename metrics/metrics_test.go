package metrics_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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
