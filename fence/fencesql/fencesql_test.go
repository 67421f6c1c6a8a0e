package fencesql_test

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/pgdriver"
	"github.com/dlock-dev/dlock/fence"
	"github.com/dlock-dev/dlock/fence/fencesql"
	"github.com/dlock-dev/dlock/fence/internal/fencetest"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openPG opens drivers on pg for fencetest.PausedHolder: the lock and the
// fenced rows in the same PostgreSQL, as a SQL user would have them.
func openPG(pg *testservers.Postgres) func(t *testing.T) driver.Driver {
	return func(t *testing.T) driver.Driver {
		d, err := pgdriver.Open(t.Context(), pg.URL())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
}

func TestExecPgx_LateWriteOfPausedHolderIsStale(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool, err := pgxpool.New(t.Context(), pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mustExec(t, pool, `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, fence bigint NOT NULL DEFAULT 0)`)
	mustExec(t, pool, `INSERT INTO accounts (id, balance) VALUES (1, 100)`)
	const update = `UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence < $2`

	a, b := fencetest.PausedHolder(t, openPG(pg), "account:1")
	if err := fencesql.ExecPgx(t.Context(), pool, update, 200, int64(b.Fence()), 1); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	err = fencesql.ExecPgx(t.Context(), pool, update, 999, int64(a.Fence()), 1)
	if !errors.Is(err, dlock.ErrStaleFence) || !errors.Is(err, fencesql.ErrStaleFence) {
		t.Fatalf("A's late write = %v, want ErrStaleFence", err)
	}
	var balance int
	var stored int64
	if err := pool.QueryRow(t.Context(), "SELECT balance, fence FROM accounts WHERE id = 1").Scan(&balance, &stored); err != nil {
		t.Fatal(err)
	}
	if balance != 200 || uint64(stored) != b.Fence() {
		t.Fatalf("after A's late write: balance %d fence %d; want B's 200 and %d", balance, stored, b.Fence())
	}
	// A's lease is lost by then, as the root package promises.
	select {
	case <-a.Done():
	case <-time.After(time.Second):
		t.Fatal("A's lease not lost")
	}
}

func TestTable_AdvanceRejectsPausedHolderInItsTransaction(t *testing.T) {
	pg := testservers.StartPostgres(t)
	db, err := sql.Open("pgx", pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tbl := fencesql.Table{}
	if err := tbl.Create(t.Context(), fencesql.SQL(db)); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Create(t.Context(), fencesql.SQL(db)); err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE ledger (id serial PRIMARY KEY, entry text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	write := func(f uint64, entry string) error {
		tx, err := db.BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := tbl.Advance(t.Context(), fencesql.SQL(tx), "ledger", f); err != nil {
			return err
		}
		if _, err := tx.ExecContext(t.Context(), `INSERT INTO ledger (entry) VALUES ($1)`, entry); err != nil {
			t.Fatal(err)
		}
		return tx.Commit()
	}

	a, b := fencetest.PausedHolder(t, openPG(pg), "ledger")
	if err := write(b.Fence(), "B"); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	if err := write(a.Fence(), "A late"); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("A's late write = %v, want ErrStaleFence", err)
	}
	if err := write(b.Fence(), "B again"); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("Advance with an equal fence = %v, want ErrStaleFence", err)
	}
	var entries []string
	rows, err := db.QueryContext(t.Context(), `SELECT entry FROM ledger ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var e string
		if err := rows.Scan(&e); err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
	}
	if len(entries) != 1 || entries[0] != "B" {
		t.Fatalf("ledger = %q, want only B's entry", entries)
	}
	var stored int64
	if err := db.QueryRowContext(t.Context(), `SELECT fence FROM dlock_fences WHERE resource = 'ledger'`).Scan(&stored); err != nil || uint64(stored) != b.Fence() {
		t.Fatalf("stored fence %d, %v; want %d", stored, err, b.Fence())
	}

	// AdvanceOrSame lets the same grant write again, never an older one.
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tbl.AdvanceOrSame(t.Context(), fencesql.SQL(tx), "ledger", b.Fence()); err != nil {
		t.Fatalf("AdvanceOrSame with B's fence: %v", err)
	}
	if err := tbl.AdvanceOrSame(t.Context(), fencesql.SQL(tx), "ledger", a.Fence()); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("AdvanceOrSame with A's fence = %v, want ErrStaleFence", err)
	}
}

func TestExecSQL_ZeroRowsIsStale(t *testing.T) {
	pg := testservers.StartPostgres(t)
	db, err := sql.Open("pgx", pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE r (id int PRIMARY KEY, v text, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), `INSERT INTO r VALUES (1, 'x', 10)`); err != nil {
		t.Fatal(err)
	}
	const q = `UPDATE r SET v = $1, fence = $2 WHERE id = 1 AND fence < $2`
	for _, tc := range []struct {
		fence int64
		stale bool
	}{{9, true}, {10, true}, {11, false}, {11, true}, {12, false}} {
		err := fencesql.ExecSQL(t.Context(), db, q, "w", tc.fence)
		if stale := errors.Is(err, fencesql.ErrStaleFence); stale != tc.stale || (err != nil && !stale) {
			t.Errorf("write with fence %d = %v, want stale %v", tc.fence, err, tc.stale)
		}
	}
	if err := fencesql.ExecSQL(t.Context(), db, `UPDATE missing SET x = 1`); err == nil || errors.Is(err, fencesql.ErrStaleFence) {
		t.Errorf("a failing statement = %v, want the database error, not ErrStaleFence", err)
	}
	if _, err := fencesql.Param(1 << 63); err == nil {
		t.Error("Param(2^63) succeeded")
	}
}

// TestErrStaleFence_IsTheRootSentinel: one value at every layer, so
// errors.Is works whichever package the caller names.
func TestErrStaleFence_IsTheRootSentinel(t *testing.T) {
	if fencesql.ErrStaleFence != fence.ErrStaleFence || fencesql.ErrStaleFence != dlock.ErrStaleFence {
		t.Fatal("fencesql.ErrStaleFence is not fence.ErrStaleFence and dlock.ErrStaleFence")
	}
}

func mustExec(t *testing.T, pool *pgxpool.Pool, q string) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), q); err != nil {
		t.Fatal(err)
	}
}

// TestExamples_RunAsWritten runs the package's examples, as written,
// against a real PostgreSQL (go test only compiles them: they need one).
func TestExamples_RunAsWritten(t *testing.T) {
	pg := testservers.StartPostgres(t)
	t.Setenv("DATABASE_URL", pg.URL())
	pool, err := pgxpool.New(t.Context(), pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mustExec(t, pool, `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, fence bigint NOT NULL DEFAULT 0)`)
	mustExec(t, pool, `INSERT INTO accounts (id, balance) VALUES (42, 1000)`)
	mustExec(t, pool, `CREATE TABLE ledger (entry text NOT NULL)`)

	if out := fencetest.Output(t, ExampleExecPgx); out != "debited account 42\n" {
		t.Fatalf("ExampleExecPgx printed %q", out)
	}
	var balance int
	var stored int64
	if err := pool.QueryRow(t.Context(), `SELECT balance, fence FROM accounts WHERE id = 42`).Scan(&balance, &stored); err != nil {
		t.Fatal(err)
	}
	if balance != 900 || stored <= 0 {
		t.Fatalf("after ExampleExecPgx: balance %d, fence %d; want 900 and the lease's fence", balance, stored)
	}
	// Twice: the second run's lease has a greater fence, so it is admitted.
	for range 2 {
		if out := fencetest.Output(t, ExampleTable_Advance); out != "settled\n" {
			t.Fatalf("ExampleTable_Advance printed %q", out)
		}
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM ledger`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("ledger has %d entries (%v), want 2", n, err)
	}
}
