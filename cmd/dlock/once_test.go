package main_test

// dlock run --once-per: black-box tests with a SQLite ledger (and one with
// PostgreSQL), on each store of the CLI tests.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestRunOncePer(t *testing.T) { eachStore(t, testRunOncePer) }

// onceReport is the part of run's JSON report these tests read.
type onceReport struct {
	Key      string `json:"key"`
	Result   string `json:"result"`
	Window   string `json:"window"`
	ExitCode int    `json:"exit_code"`
	Error    string `json:"error"`
}

func readOnceReport(t *testing.T, path string) onceReport {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r onceReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("report %q: %v", b, err)
	}
	return r
}

func testRunOncePer(t *testing.T, store string) {
	dir := t.TempDir()
	ledger := "sqlite:" + filepath.Join(dir, "ledger.db")
	count := filepath.Join(dir, "count")
	report := filepath.Join(dir, "report.json")
	appendAttempt := `echo "$DLOCK_WINDOW $DLOCK_ATTEMPT $DLOCK_KEY" >> '` + count + `'`
	lines := func() []string {
		b, _ := os.ReadFile(count)
		return strings.Fields(strings.TrimSpace(string(b)))
	}

	t.Run("runs once per window, then done", func(t *testing.T) {
		r := dlock(t, store, "run", "--once-per", "day", "--ledger", ledger, "--report", report, "once:daily", "-c", appendAttempt)
		wantCode(t, r, 0)
		rep := readOnceReport(t, report)
		if _, err := time.Parse("2006-01-02", rep.Window); rep.Result != "ran" || err != nil || rep.Key != "once:daily" {
			t.Fatalf("report %+v, want ran in a day's window", rep)
		}
		if got := lines(); len(got) != 3 || got[1] != "1" || got[2] != "once/once:daily" {
			t.Fatalf("command saw %q, want one attempt 1 with DLOCK_KEY once/once:daily", got)
		}
		for range 2 {
			r = dlock(t, store, "run", "--once-per", "day", "--ledger", ledger, "--report", report, "once:daily", "-c", appendAttempt)
			wantCode(t, r, 0)
			if !strings.Contains(r.stderr, "already ran this day") || readOnceReport(t, report).Result != "done" {
				t.Fatalf("second run: stderr %q, report %+v; want done", r.stderr, readOnceReport(t, report))
			}
		}
		if got := lines(); len(got) != 3 {
			t.Fatalf("the command ran again: %q", got)
		}
		// The plain key is another lock: once/KEY is the job's.
		wantCode(t, dlock(t, store, "run", "once:daily", "--", "true"), 0)
	})

	t.Run("a failed run is retried in its window", func(t *testing.T) {
		os.Remove(count)
		wantCode(t, dlock(t, store, "run", "--once-per", "1h", "--ledger", ledger, "once:failing", "-c", appendAttempt+"; exit 3"), 3)
		wantCode(t, dlock(t, store, "run", "--once-per", "1h", "--ledger", ledger, "once:failing", "-c", appendAttempt), 0)
		r := dlock(t, store, "run", "--once-per", "1h", "--ledger", ledger, "once:failing", "-c", appendAttempt)
		wantCode(t, r, 0)
		if got := lines(); len(got) != 6 || got[1] != "1" || got[4] != "2" {
			t.Fatalf("attempts %q, want 1 (exit 3) then 2", got)
		}
	})

	t.Run("a crashed run is retried once its lease expired", func(t *testing.T) {
		os.Remove(count)
		started := filepath.Join(dir, "started")
		a := command(store, "run", "--once-per", "day", "--ledger", ledger, "--ttl", "1s", "once:crash", "-c", appendAttempt+"; touch '"+started+"'; sleep 30")
		if err := a.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(started); err == nil {
				break
			}
			if time.Now().After(deadline) {
				_ = a.Process.Kill()
				_ = a.Wait()
				t.Fatal("the first run never started")
			}
		}
		_ = a.Process.Signal(syscall.SIGKILL) // dlock dies: no release, no finish
		_ = a.Wait()
		// Without --wait the key is still held (until its TTL runs out).
		wantCode(t, dlock(t, store, "run", "--once-per", "day", "--ledger", ledger, "--ttl", "1s", "once:crash", "-c", appendAttempt), 75)
		r := dlock(t, store, "run", "--once-per", "day", "--ledger", ledger, "--ttl", "1s", "--wait-timeout", "20s", "once:crash", "-c", appendAttempt)
		wantCode(t, r, 0)
		if got := lines(); len(got) != 6 || got[1] != "1" || got[4] != "2" {
			t.Fatalf("attempts %q, want the crashed 1 then the retry 2", got)
		}
		r = dlock(t, store, "run", "--once-per", "day", "--ledger", ledger, "once:crash", "-c", appendAttempt)
		if wantCode(t, r, 0); !strings.Contains(r.stderr, "already ran") {
			t.Fatalf("after the retry: %q", r.stderr)
		}
	})

	t.Run("invalid flags are 64", func(t *testing.T) {
		for _, args := range [][]string{
			{"--once-per", "yearly", "--ledger", ledger},
			{"--once-per", "500ms", "--ledger", ledger},
			{"--once-per", "day"},
			{"--ledger", ledger},
			{"--once-per", "day", "--ledger", ledger, "--permits", "2"},
			{"--once-per", "day", "--ledger", ledger, "--fail-open"},
			{"--once-per", "day", "--ledger", ledger, "--resume-file", filepath.Join(dir, "tok")},
			{"--once-per", "day", "--ledger", "mysql://db/x"},
		} {
			args = append(append([]string{"run"}, args...), "once:bad", "--", "touch", filepath.Join(dir, "bad"))
			r := dlock(t, store, args...)
			wantCode(t, r, 64)
			if _, err := os.Stat(filepath.Join(dir, "bad")); err == nil {
				t.Fatalf("%q ran the command", args)
			}
		}
	})
}

// TestRunOncePer_ServerLedgers: the ledger in PostgreSQL or in Redis, its
// clock the server's.
func TestRunOncePer_ServerLedgers(t *testing.T) {
	store := testservers.StartRedis(t).URL()
	for name, start := range map[string]func(t *testing.T) string{
		"postgres": func(t *testing.T) string { return testservers.StartPostgres(t).URL() },
		"redis":    func(t *testing.T) string { return testservers.StartRedis(t).URL() },
	} {
		t.Run(name, func(t *testing.T) {
			ledger := start(t)
			out := filepath.Join(t.TempDir(), "out")
			for i := range 2 {
				r := dlock(t, store, "run", "--once-per", "week", "--ledger", ledger, "-o", "json", "once:"+name, "-c", `echo "$DLOCK_WINDOW" >> '`+out+`'`)
				wantCode(t, r, 0)
				if want := []string{"ran", "done"}[i]; !strings.Contains(r.stderr, `"result":"`+want+`"`) {
					t.Fatalf("run %d: %q, want result %s", i, r.stderr, want)
				}
			}
			b, _ := os.ReadFile(out)
			if strings.Count(string(b), "\n") != 1 || !strings.Contains(string(b), "-W") {
				t.Fatalf("the command ran %q, want once with a week window", b)
			}
		})
	}
}
