package main

import (
	"path/filepath"
	"testing"

	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestSettlement_ConsulStoreSQLiteLedger(t *testing.T) {
	c := testservers.StartConsul(t)
	run(t, c.URL(), "sqlite:"+filepath.Join(t.TempDir(), "ledger.db"))
}
