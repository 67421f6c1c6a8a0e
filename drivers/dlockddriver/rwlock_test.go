package dlockddriver_test

import (
	"context"
	"testing"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestRWLock runs the read-write lock checks of recipe/rwlock (native in
// dlockd's state machine) against an embedded dlockd: kinds, an overlap
// detector, a writer behind a stream of readers, per-grant TTLs.
func TestRWLock(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	dlocktest.RunRWLock(t, "dlockd", func(ctx context.Context) (driver.Driver, error) {
		return openURL(ctx, srv.Addr())
	})
}
