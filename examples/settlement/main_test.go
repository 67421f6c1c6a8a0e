package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines. fake-gcs-server (the GCS test's
// in-process server) links OpenCensus, whose package init starts a worker
// that runs for the life of the process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}
