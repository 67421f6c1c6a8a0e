package oncetest_test

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	_ "modernc.org/sqlite" // database/sql driver "sqlite"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/recipe/once/internal/oncetest"
	"github.com/dlock-dev/dlock/recipe/once/sqlledger"
	"github.com/dlock-dev/dlock/server/servertest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	servertest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestRun_EightSkewedNodesOnDlockd: the 8-node scenario with dlockd as the
// lock store (each node its own dlockd client) and a SQLite ledger file
// shared by the nodes (each its own handle).
func TestRun_EightSkewedNodesOnDlockd(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	ledgerDSN := "sqlite:" + filepath.Join(t.TempDir(), "ledger.db")
	oncetest.EightNodes(t, func(t *testing.T, i int) oncetest.Node {
		u, _ := url.Parse("dlockd://" + srv.Addr())
		d, err := dlockddriver.Open(t.Context(), u)
		if err != nil {
			t.Fatal(err)
		}
		fd := dlocktest.NewFaultDriver(d, t.Logf)
		l := dlock.New(fd, dlock.WithStoreName("dlockd"), dlock.WithBackoff(5*time.Millisecond, 100*time.Millisecond))
		t.Cleanup(func() { _ = l.Close() })
		ledger, err := sqlledger.Open(t.Context(), ledgerDSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ledger.Close() })
		return oncetest.Node{Locker: l, Faults: dlocktest.Faults(fd), Ledger: ledger}
	})
}
