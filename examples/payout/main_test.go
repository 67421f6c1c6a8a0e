package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestRun_OneWorkerRunsAndStaleWriteIsFenced runs the demo end to end on the
// in-process store: run returns an error unless exactly one of six workers
// ran the payout and the paused holder's late write was rejected.
func TestRun_OneWorkerRunsAndStaleWriteIsFenced(t *testing.T) {
	if err := run(t.Context(), "mem://payout-test", 6, "2026-09", 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
