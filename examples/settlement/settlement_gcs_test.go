package main

import (
	"path/filepath"
	"testing"

	"github.com/dlock-dev/dlock/internal/testservers/gcsfake"
)

// TestSettlement_GCSStoreSQLiteLedger runs on Cloud Storage generation
// preconditions (fake-gcs-server, in-process): the paused worker's key is
// taken over by a worker that has seen its record unchanged for a lease.
func TestSettlement_GCSStoreSQLiteLedger(t *testing.T) {
	fake := gcsfake.Start(t, "settlement")
	run(t, fake.URL("settlement", "locks"), "sqlite:"+filepath.Join(t.TempDir(), "ledger.db"))
}
