package sqlledger_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite" // database/sql driver "sqlite"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/drivers/pgdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/recipe/once/internal/oncetest"
	"github.com/dlock-dev/dlock/recipe/once/sqlledger"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ledgers returns, for each dialect, a function that opens a new handle on
// one ledger database (as another process would).
func ledgers(t *testing.T, pg *testservers.Postgres) map[string]func(t *testing.T) *sqlledger.Ledger {
	sqlitePath := filepath.Join(t.TempDir(), "ledger.db")
	open := func(dsn string) func(t *testing.T) *sqlledger.Ledger {
		return func(t *testing.T) *sqlledger.Ledger {
			t.Helper()
			l, err := sqlledger.Open(t.Context(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l
		}
	}
	return map[string]func(t *testing.T) *sqlledger.Ledger{
		"postgres": open(pg.URL()),
		"sqlite":   open("sqlite:" + sqlitePath),
	}
}

func TestLedger_Rules(t *testing.T) {
	pg := testservers.StartPostgres(t)
	for name, open := range ledgers(t, pg) {
		t.Run(name, func(t *testing.T) { oncetest.LedgerRules(t, open(t)) })
	}
}

func TestOpen_Invalid(t *testing.T) {
	for _, dsn := range []string{"", "mysql://x", "sqlite:", "redis://localhost:6379", "localhost:5432", "db.example.com", "postgres:/app@db/app", "postgres//app@db/app", "ledger.db"} {
		if _, err := sqlledger.Open(t.Context(), dsn); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("Open(%q) = %v, want ErrInvalidArgument", dsn, err)
		}
	}
	if _, err := sqlledger.New(nil, sqlledger.SQLite, ""); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("New(nil) = %v", err)
	}
	l, err := sqlledger.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "l.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := sqlledger.New(l.DB(), sqlledger.SQLite, "x; DROP TABLE y"); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("New with a bad table name = %v", err)
	}
	if _, err := sqlledger.Open(t.Context(), "postgres://u:secret@127.0.0.1:1/db"); !errors.Is(err, dlock.ErrUnavailable) || strings.Contains(err.Error(), "secret") {
		t.Errorf("Open of a closed port = %v; want ErrUnavailable without the password", err)
	}
}

// TestRun_EightSkewedNodesOncePerWindow: 8 nodes, each with its own
// PostgreSQL lock driver and its own ledger handle, their clocks skewed
// from −2 to +2 periods, call Run for one job in a loop for 5 periods. One
// attempt crashes mid-run (its renewals stop; it wakes up after the retry
// finished). Every window runs exactly once: one completed fn, a Finished
// record, no gap; the crashed window is retried only after the crashed
// lease expired, and the crashed attempt's late finish is refused.
func TestRun_EightSkewedNodesOncePerWindow(t *testing.T) {
	pg := testservers.StartPostgres(t)
	for name, open := range ledgers(t, pg) {
		t.Run(name, func(t *testing.T) { eightNodes(t, pg, open) })
	}
}

func eightNodes(t *testing.T, pg *testservers.Postgres, openLedger func(t *testing.T) *sqlledger.Ledger) {
	oncetest.EightNodes(t, func(t *testing.T, i int) oncetest.Node {
		d, err := pgdriver.Open(t.Context(), pg.URL())
		if err != nil {
			t.Fatal(err)
		}
		fd := dlocktest.NewFaultDriver(d, t.Logf)
		l := dlock.New(fd, dlock.WithStoreName("postgres"), dlock.WithBackoff(5*time.Millisecond, 100*time.Millisecond))
		t.Cleanup(func() { _ = l.Close() })
		return oncetest.Node{Locker: l, Faults: dlocktest.Faults(fd), Ledger: openLedger(t)}
	})
}
