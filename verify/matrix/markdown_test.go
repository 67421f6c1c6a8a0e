package matrix

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/verify"
)

// TestUpdateChoosing: the summary block of CHOOSING.md is replaced by one
// row per store listing its faults by verdict, and the hand-written text
// around it is kept.
func TestUpdateChoosing(t *testing.T) {
	rep := &Report{
		Started: time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC),
		Stores:  []Store{{Name: "a"}, {Name: "b"}, {Name: "unused"}},
		Cells: []*Cell{
			{Store: "a", Fault: "pause", Verdict: SafeFenced},
			{Store: "a", Fault: "kill", Verdict: Safe},
			{Store: "a", Fault: "blackhole", Verdict: Safe},
			{Store: "b", Fault: "failover", Verdict: UnsafeExpected},
			{Store: "b", Fault: "partition", Verdict: NotApplicable},
		},
	}
	path := filepath.Join(t.TempDir(), "CHOOSING.md")
	before := "# Choosing\n\nintro\n\n" + summaryBegin + "\nold summary\n" + summaryEnd + "\n\nadvice after\n"
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := updateChoosing(path, rep); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{
		"# Choosing\n\nintro\n\n" + summaryBegin + "\n",
		"| a | kill, blackhole | pause | — | — | — |\n",
		"| b | — | — | failover | — | — |\n",
		summaryEnd + "\n\nadvice after\n",
		"on 2026-12-03",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("CHOOSING.md lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "old summary") || strings.Contains(got, "| unused |") {
		t.Errorf("old block or a store without cells kept:\n%s", got)
	}
	// A file without the block is left alone.
	plain := filepath.Join(t.TempDir(), "CHOOSING.md")
	if err := os.WriteFile(plain, []byte("no block\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := updateChoosing(plain, rep); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(plain); string(b) != "no block\n" {
		t.Errorf("a file without the block was changed: %q", b)
	}
}

// TestRunTTL: the CLI's single runs get a managed store's minimum TTL (gcs:
// 3 s, the run scaled with it); other stores and unknown names keep theirs.
func TestRunTTL(t *testing.T) {
	for _, c := range []struct {
		name             string
		ttl, d           time.Duration
		wantTTL, wantDur time.Duration
	}{
		{"gcs", time.Second, 12 * time.Second, 3 * time.Second, 36 * time.Second},
		{"gcs", 5 * time.Second, 12 * time.Second, 5 * time.Second, 12 * time.Second},
		{"redis", time.Second, 12 * time.Second, time.Second, 12 * time.Second},
		{"no-such-store", time.Second, 12 * time.Second, time.Second, 12 * time.Second},
	} {
		ttl, d := RunTTL(c.name, c.ttl, c.d)
		if ttl != c.wantTTL || d != c.wantDur {
			t.Errorf("RunTTL(%s, %v, %v) = %v, %v; want %v, %v", c.name, c.ttl, c.d, ttl, d, c.wantTTL, c.wantDur)
		}
	}
}

// A cell whose run granted nothing measured nothing: it is an error, not
// safe; so is a cell with no run.
func TestJudge_NothingGrantedIsAnError(t *testing.T) {
	c := &Cell{Store: "s", Fault: "pause", Runs: []*verify.Result{{Duration: time.Second, Findings: &verify.Findings{FailedAcquires: 9}}}}
	judge(c, Store{})
	if c.Verdict != Failed || !strings.Contains(c.Reason, "granted nothing") {
		t.Fatalf("a run with no grant: %s %q, want %s", c.Verdict, c.Reason, Failed)
	}
	c = &Cell{Store: "s", Fault: "pause"}
	judge(c, Store{})
	if c.Verdict != Failed {
		t.Fatalf("a cell with no run: %s %q, want %s", c.Verdict, c.Reason, Failed)
	}
	c = &Cell{Store: "s", Fault: "pause", Runs: []*verify.Result{{Findings: &verify.Findings{Grants: 3, WritesAccepted: 3}}}}
	judge(c, Store{})
	if c.Verdict != Safe {
		t.Fatalf("a run with grants and no finding: %s %q, want %s", c.Verdict, c.Reason, Safe)
	}
}
