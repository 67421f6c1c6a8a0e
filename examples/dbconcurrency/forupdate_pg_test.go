//go:build pgexample

package main

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
)

// pgDB opens the PostgreSQL server named by DLOCK_EXAMPLE_PG_URL with a
// schema of its own, dropped at the end. The build tag is the opt-in, so a
// missing URL fails rather than skips:
//
//	DLOCK_EXAMPLE_PG_URL=postgres://user@127.0.0.1:5432/db go test -tags pgexample ./examples/dbconcurrency/
func pgDB(t *testing.T) *sql.DB {
	t.Helper()
	raw := os.Getenv("DLOCK_EXAMPLE_PG_URL")
	if raw == "" {
		t.Fatal("-tags pgexample needs DLOCK_EXAMPLE_PG_URL=postgres://… (a database the test may create a schema in)")
	}
	admin, err := sql.Open("pgx", raw)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	b := make([]byte, 6)
	rand.Read(b)
	schema := "dbconcurrency_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(t.Context(), `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if db, err := sql.Open("pgx", raw); err == nil {
			db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
			db.Close()
		}
	})
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema) // pgx sends unknown parameters as run-time settings
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(testContenders)
	t.Cleanup(func() { db.Close() })
	return db
}

func runPG(t *testing.T, s Strategy) Report {
	t.Helper()
	rep, err := Run(t.Context(), pgDB(t), Config{Strategy: s, Merchants: testMerchants, Contenders: testContenders, Date: "2026-09-30"})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestRun_PostgresForUpdate: the row lock makes every loser wait for the
// winner's commit and then read the merchant settled.
func TestRun_PostgresForUpdate(t *testing.T) {
	check(t, runPG(t, ForUpdate))
}

// TestRun_PostgresUnique: the constraint on PostgreSQL, where a loser's
// INSERT waits for the winner's transaction and then fails.
func TestRun_PostgresUnique(t *testing.T) {
	check(t, runPG(t, Unique))
}

// TestRun_PostgresOptimistic: the version check on PostgreSQL, where the
// losers' UPDATEs block on the winner's row lock and then match no row.
func TestRun_PostgresOptimistic(t *testing.T) {
	check(t, runPG(t, Optimistic))
}
