//go:build pgexample

package main

import (
	"context"
	"database/sql"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// ForUpdate is the pessimistic form, on PostgreSQL only (SQLite has no
// SELECT … FOR UPDATE: a SQLite write transaction locks the whole
// database instead). Every contender locks the merchant's row in its
// transaction; the first one pays and commits, the others wait on the row
// lock and, at READ COMMITTED, then read the committed row and find the
// merchant settled. Built with -tags pgexample; see forupdate_pg_test.go.
var ForUpdate = Strategy{Name: "for-update", How: "SELECT … FOR UPDATE, then UPDATE, in one transaction",
	Conflict: "waited on the row lock, then read the row settled", Settle: settleForUpdate}

func settleForUpdate(ctx context.Context, db *sql.DB, merchant, date string, barrier func()) (outcome, error) {
	var out outcome
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return out, err
	}
	defer tx.Rollback()
	// Before the SELECT: the first contender to lock the row must not wait
	// for the others, who are waiting for its lock.
	barrier()
	var through string
	if err := tx.QueryRowContext(ctx, `SELECT settled_through FROM accounts WHERE merchant = $1 FOR UPDATE`, merchant).
		Scan(&through); err != nil {
		return out, err
	}
	if through >= date {
		out.conflict = true
		return out, tx.Commit()
	}
	if _, err := tx.ExecContext(ctx,
		`UPDATE accounts SET paid_cents = paid_cents + amount_cents, settled_through = $2 WHERE merchant = $1`,
		merchant, date); err != nil {
		return out, err
	}
	if err := tx.Commit(); err != nil {
		return out, err
	}
	out.won = true
	return out, nil
}
