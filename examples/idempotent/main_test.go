package main

import (
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func run(t *testing.T, cfg Config) Report {
	t.Helper()
	if cfg.Path == "" {
		cfg.Path = filepath.Join(t.TempDir(), "ledger.db")
	}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	return rep
}

// TestRun_TwoWorkersWithRetriesMoveMoneyOnce: 2 workers at once, each
// applying every payment 3 times; each amount leaves the treasury once and
// reaches its vendor once.
func TestRun_TwoWorkersWithRetriesMoveMoneyOnce(t *testing.T) {
	cfg := Config{Vendors: 30, Workers: 2, Retries: 2, Month: "2026-09"}
	rep := run(t, cfg)
	if rep.PaidOnce != cfg.Vendors || rep.PaidMore != 0 {
		t.Errorf("vendors paid exactly once %d of %d, paid more %d", rep.PaidOnce, cfg.Vendors, rep.PaidMore)
	}
	if rep.TreasuryCents != rep.WantTreasuryCents {
		t.Errorf("treasury %d cents, want %d", rep.TreasuryCents, rep.WantTreasuryCents)
	}
	if rep.Applied != int64(cfg.Vendors) || rep.AlreadyApplied != int64(rep.Applications-cfg.Vendors) {
		t.Errorf("applied %d, already applied %d; want %d and %d", rep.Applied, rep.AlreadyApplied, cfg.Vendors, rep.Applications-cfg.Vendors)
	}
}

// TestRun_RerunNextDayMovesNothing: running the month's payout again later
// (a cron job fired twice) finds every key and moves nothing.
func TestRun_RerunNextDayMovesNothing(t *testing.T) {
	cfg := Config{Path: filepath.Join(t.TempDir(), "ledger.db"), Vendors: 10, Workers: 2, Retries: 0, Month: "2026-09"}
	first := run(t, cfg)
	again := run(t, cfg)
	if again.Applied != 0 || again.TreasuryCents != first.TreasuryCents || again.PaidOnce != cfg.Vendors {
		t.Errorf("rerun applied %d, treasury %d (was %d), paid once %d; want nothing moved", again.Applied, again.TreasuryCents, first.TreasuryCents, again.PaidOnce)
	}
	// The next month has other keys: it pays again.
	cfg.Month = "2026-10"
	next := run(t, cfg)
	if next.Applied != int64(cfg.Vendors) {
		t.Errorf("next month applied %d, want %d", next.Applied, cfg.Vendors)
	}
}

// TestRun_WithoutKeyMovesMoneyEveryTime is the control: the same run
// without the key table pays every vendor 2 × 3 times, so the balance
// checks above are the ones that catch a double payment.
func TestRun_WithoutKeyMovesMoneyEveryTime(t *testing.T) {
	cfg := Config{Vendors: 10, Workers: 2, Retries: 2, Month: "2026-09", NoKey: true}
	rep := run(t, cfg)
	if rep.PaidOnce != 0 || rep.PaidMore != cfg.Vendors || rep.TreasuryCents == rep.WantTreasuryCents {
		t.Errorf("without the key: %+v, want every vendor paid more than once", rep)
	}
	var sum int64
	for _, p := range Payments(cfg.Month, cfg.Vendors) {
		sum += p.AmountCents
	}
	if got, want := TreasuryOpeningCents-rep.TreasuryCents, 6*sum; got != want {
		t.Errorf("treasury paid out %d cents, want %d (6 × %d)", got, want, sum)
	}
}
