package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestRunOncePer_LedgerPathMistakesAre64: --ledger naming a directory, or
// a file in a directory that does not exist, is a configuration error
// (exit 64, said on stderr), not an unavailable ledger (69); the command
// does not run.
func TestRunOncePer_LedgerPathMistakesAre64(t *testing.T) {
	store := testservers.StartRedis(t).URL()
	dir := t.TempDir()
	ran := filepath.Join(dir, "ran")
	for _, ledger := range []string{"sqlite:" + dir, "sqlite:" + filepath.Join(dir, "missing", "x.db")} {
		r := dlock(t, store, "run", "--once-per", "day", "--ledger", ledger, "once:path", "--", "touch", ran)
		wantCode(t, r, 64)
		if !strings.Contains(r.stderr, "director") {
			t.Errorf("--ledger %s: stderr does not name the directory:\n%s", ledger, r.stderr)
		}
		if _, err := os.Stat(ran); err == nil {
			t.Fatalf("--ledger %s ran the command", ledger)
		}
	}
}

// TestRunOncePer_TimeZone: --once-per takes a period as once.Period.String
// prints it, time zone included ("day Europe/Paris": the window is the
// local date there); "Local", which can differ between nodes, is exit 64.
func TestRunOncePer_TimeZone(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip(err)
	}
	store := testservers.StartRedis(t).URL()
	dir := t.TempDir()
	ledger := "sqlite:" + filepath.Join(dir, "ledger.db")
	report := filepath.Join(dir, "report.json")
	before := time.Now().In(paris).Format("2006-01-02")
	r := dlock(t, store, "run", "--once-per", "day Europe/Paris", "--ledger", ledger, "--report", report, "once:tz", "--", "true")
	wantCode(t, r, 0)
	after := time.Now().In(paris).Format("2006-01-02")
	if rep := readOnceReport(t, report); rep.Result != "ran" || (rep.Window != before && rep.Window != after) {
		t.Fatalf("report %+v, want ran in window %s", rep, before)
	}
	r = dlock(t, store, "run", "--once-per", "day Local", "--ledger", ledger, "once:tz", "--", "touch", filepath.Join(dir, "ran"))
	wantCode(t, r, 64)
}
