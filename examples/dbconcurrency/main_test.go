package main

import (
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testMerchants  = 25
	testContenders = 8
)

// check asserts the outcome every strategy must reach: each merchant
// settled and paid exactly once, one winner per merchant, and every other
// contender refused by the database.
func check(t *testing.T, rep Report) {
	t.Helper()
	t.Logf("%+v", rep)
	if rep.Settled != testMerchants || rep.PaidOnce != testMerchants || rep.PaidMore != 0 {
		t.Fatalf("settled %d, paid once %d, paid more than once %d; want all %d settled and paid once",
			rep.Settled, rep.PaidOnce, rep.PaidMore, testMerchants)
	}
	if rep.Won != testMerchants {
		t.Errorf("%d winners, want one per merchant (%d)", rep.Won, testMerchants)
	}
	if want := int64(testMerchants * (testContenders - 1)); rep.Conflicts != want {
		t.Errorf("%d losers saw the conflict, want every loser: %d", rep.Conflicts, want)
	}
}

func runSQLite(t *testing.T, s Strategy) Report {
	t.Helper()
	db, err := openSQLite(filepath.Join(t.TempDir(), "ledger.db"), testContenders)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	rep, err := Run(t.Context(), db, Config{Strategy: s, Merchants: testMerchants, Contenders: testContenders, Date: "2026-09-30"})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestRun_UniqueConstraintRefusesSecondSettlement: the losers' inserts are
// refused and their payments roll back with them.
func TestRun_UniqueConstraintRefusesSecondSettlement(t *testing.T) {
	rep := runSQLite(t, Unique)
	check(t, rep)
	if rep.FoundSettled != 0 {
		t.Errorf("found settled %d: the unique strategy never re-reads", rep.FoundSettled)
	}
}

// TestRun_OptimisticLosersUpdateZeroRows: every contender read the same
// version, one update matched it, the rest changed zero rows, re-read and
// found the merchant settled.
func TestRun_OptimisticLosersUpdateZeroRows(t *testing.T) {
	rep := runSQLite(t, Optimistic)
	check(t, rep)
	if want := int64(testMerchants * (testContenders - 1)); rep.FoundSettled != want {
		t.Errorf("%d losers found the merchant settled on their re-read, want %d", rep.FoundSettled, want)
	}
}

// TestRun_RerunSettlesNothing: a second run of the same strategy over the
// same ledger (a cron job firing twice) pays nobody again. (The two
// strategies guard different writes: a ledger must use one of them for
// all its writers.)
func TestRun_RerunSettlesNothing(t *testing.T) {
	for _, s := range []Strategy{Unique, Optimistic} {
		t.Run(s.Name, func(t *testing.T) {
			db, err := openSQLite(filepath.Join(t.TempDir(), "ledger.db"), testContenders)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			cfg := Config{Strategy: s, Merchants: testMerchants, Contenders: testContenders, Date: "2026-09-30"}
			for run := range 2 {
				rep, err := Run(t.Context(), db, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if want := int64(testMerchants * (1 - run)); rep.Won != want || rep.PaidOnce != testMerchants || rep.PaidMore != 0 {
					t.Errorf("run %d: %+v, want %d winners and every merchant paid once", run+1, rep, want)
				}
			}
		})
	}
}
