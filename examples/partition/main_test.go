package main

import (
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun_EveryMerchantSettledOnceByItsOwner starts 8 workers at the same
// moment on one ledger whose table has no unique constraint: only the
// partition can keep a merchant from being settled twice.
func TestRun_EveryMerchantSettledOnceByItsOwner(t *testing.T) {
	cfg := Config{Path: filepath.Join(t.TempDir(), "ledger.db"), Merchants: 500, Workers: 8, Date: "2026-09-30"}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.Settled != cfg.Merchants || rep.Duplicates != 0 || rep.Missing != 0 {
		t.Fatalf("settled %d of %d, duplicates %d, missing %d", rep.Settled, cfg.Merchants, rep.Duplicates, rep.Missing)
	}
	if rep.WrongOwner != 0 {
		t.Errorf("%d merchants settled by a worker that does not own them", rep.WrongOwner)
	}
	total := 0
	for i, n := range rep.PerWorker {
		if n == 0 {
			t.Errorf("worker %d settled nothing: the hash does not spread 500 merchants over 8 workers", i)
		}
		total += n
	}
	if total != cfg.Merchants {
		t.Errorf("per-worker settlements sum to %d, want %d", total, cfg.Merchants)
	}
}

// TestRun_DeadWorkersShareWaits is the limit: with worker 2 down, exactly
// its merchants stay unsettled (nobody else may take them), and they are
// settled once it comes back, without touching anyone else's.
func TestRun_DeadWorkersShareWaits(t *testing.T) {
	cfg := Config{Path: filepath.Join(t.TempDir(), "ledger.db"), Merchants: 300, Workers: 4, Date: "2026-09-30", Down: []int{2}}
	owned := 0
	for m := range cfg.Merchants {
		if Owner(merchantName(m), cfg.Workers) == 2 {
			owned++
		}
	}
	if owned == 0 {
		t.Fatal("worker 2 owns no merchant: the test shows nothing")
	}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Waiting != owned || rep.Missing != 0 || rep.Settled != cfg.Merchants-owned || rep.PerWorker[2] != 0 {
		t.Fatalf("with worker 2 down: %+v, want its %d merchants waiting and every other one settled", rep, owned)
	}

	// Worker 2 restarts; the others run again too (a rerun must not settle twice).
	cfg.Down = nil
	rep, err = Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Settled != cfg.Merchants || rep.Duplicates != 0 || rep.WrongOwner != 0 || rep.PerWorker[2] != owned {
		t.Fatalf("after worker 2 came back: %+v, want every merchant settled once, %d by worker 2", rep, owned)
	}
}

// TestOwner_Pinned pins a few owners: a change of hash would move merchants
// to other owners while workers of the old build still run with the old one,
// and both would settle them.
func TestOwner_Pinned(t *testing.T) {
	for _, tc := range []struct {
		merchant      string
		workers, want int
	}{{"m00000", 8, 0}, {"m00001", 8, 3}, {"m12345", 3, 0}} {
		if got := Owner(tc.merchant, tc.workers); got != tc.want {
			t.Errorf("Owner(%q, %d) = %d, want %d", tc.merchant, tc.workers, got, tc.want)
		}
	}
}
