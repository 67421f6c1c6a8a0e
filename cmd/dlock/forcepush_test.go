package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestRun_ForceReleaseOnRedisIsPushedToTheHolder is issue 13 item 6: after
// release --force on Redis, the old holder learned of the loss only at its
// next renewal (up to TTL/3 later) and still said it held the key. The
// driver now pushes a recheck hint: the holder's job is stopped at once
// (exit 70, reported "lost"), well before the 10 s a TTL/3 renewal of a
// 30 s lease would take, and status no longer shows the key held.
func TestRun_ForceReleaseOnRedisIsPushedToTheHolder(t *testing.T) {
	r := testservers.StartRedis(t)
	store := r.URL()
	report := filepath.Join(t.TempDir(), "report.json")
	holder := command(store, "run", "-o", "json", "--report", report, "--ttl", "30s", "push:key", "--", "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = holder.Wait(); close(exited) }()
	t.Cleanup(func() { _ = holder.Process.Kill(); <-exited })
	waitHeld(t, store, "push:key")

	forced := time.Now()
	wantCode(t, dlock(t, store, "release", "--force", "push:key", "--reason", "test of the pushed loss"), 0)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatalf("holder still running 5 s after the force release: the loss was not pushed (a 30 s lease renews every 10 s)")
	}
	took := time.Since(forced)
	if code := holder.ProcessState.ExitCode(); code != 70 {
		t.Fatalf("holder exit %d after the force release, want 70 (lease lost)", code)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var res struct{ Result string }
	if err := json.Unmarshal(b, &res); err != nil || res.Result != "lost" {
		t.Fatalf("report %q (%v): want result lost", b, err)
	}
	st := dlock(t, store, "status", "-o", "json", "push:key")
	var s struct{ Held bool }
	if err := json.Unmarshal([]byte(st.stdout), &s); err != nil || s.Held {
		t.Fatalf("status after the force release %q (%v): want held false", st.stdout, err)
	}
	t.Logf("holder stopped %v after the force release", took.Round(time.Millisecond))
}
