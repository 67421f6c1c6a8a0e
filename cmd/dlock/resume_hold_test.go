package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestRun_ResumeFutureGrantKeepsMaxHold: a resume file whose grant time is
// in the future (the clock was stepped back, the file edited) counts from
// now: the resumed hold ends at --max-hold, not --max-hold plus the time
// to that future grant.
func TestRun_ResumeFutureGrantKeepsMaxHold(t *testing.T) {
	store := testservers.StartRedis(t).URL()
	file := filepath.Join(t.TempDir(), "job.lease")
	startKilled(t, store, file, "maxhold:future", "30s")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("resume file %q: %v", b, err)
	}
	st["granted"] = time.Now().Add(time.Hour).Format(time.RFC3339Nano)
	if b, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := dlock(t, store, "run", "--resume-file", file, "--max-hold", "2s", "--ttl", "30s", "--grace", "1s", "maxhold:future", "--", "sleep", "25")
	took := time.Since(start)
	wantCode(t, r, 70)
	if took > 15*time.Second {
		t.Errorf("run took %v with --max-hold 2s", took)
	}
	if !strings.Contains(r.stderr, "in the future") || !strings.Contains(r.stderr, "--max-hold") {
		t.Errorf("stderr does not say the grant was in the future and --max-hold was reached:\n%s", r.stderr)
	}
}
