package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/dlock-dev/dlock/fence/fencesql"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"
)

// fences is the per-resource fence table: one row per (merchant, date) with
// the greatest fence that has written it.
var fences = fencesql.Table{Name: "settlement_fences"}

// errDuplicate: the (merchant, date) unique constraint refused a second
// settlement — the second line of defence behind the fence.
var errDuplicate = errors.New("settlement already recorded (unique constraint)")

// openLedger opens the ledger database: "postgres://…" (pgx) or
// "sqlite:PATH" (an embedded SQLite file, no server).
func openLedger(ctx context.Context, raw string) (*sql.DB, error) {
	var db *sql.DB
	var err error
	switch {
	case strings.HasPrefix(raw, "postgres://"), strings.HasPrefix(raw, "postgresql://"):
		db, err = sql.Open("pgx", raw)
	case strings.HasPrefix(raw, "sqlite:"):
		path := strings.TrimPrefix(strings.TrimPrefix(raw, "sqlite:"), "//")
		db, err = sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err == nil {
			db.SetMaxOpenConns(1) // one connection per worker, as a pod would have
		}
	default:
		return nil, fmt.Errorf("settlement: ledger %q: want postgres://… or sqlite:PATH", raw)
	}
	if err != nil {
		return nil, fmt.Errorf("settlement: open ledger: %w", err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("settlement: ledger %s unreachable: %w", redactURL(raw), err)
	}
	return db, nil
}

func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	return raw
}

// migrate creates the settlements table, whose unique (merchant, date)
// constraint is the second line of defence, and the fence table.
func migrate(ctx context.Context, db *sql.DB) error {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS settlements (
			merchant     TEXT   NOT NULL,
			date         TEXT   NOT NULL,
			amount_cents BIGINT NOT NULL,
			fence        BIGINT NOT NULL,
			worker       INT    NOT NULL,
			UNIQUE (merchant, date))`,
		fences.DDL(),
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("settlement: migrate: %w", err)
		}
	}
	return nil
}

func isSettled(ctx context.Context, db *sql.DB, merchant, date string) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM settlements WHERE merchant = $1 AND date = $2`, merchant, date).Scan(&n)
	return n > 0, err
}

// writeSettlement records one settlement, fenced: in one transaction it
// advances the merchant's fence (refusing a fence not greater than the
// stored one, ErrStaleFence) and inserts the row (refused by the unique
// constraint as errDuplicate).
func writeSettlement(ctx context.Context, db *sql.DB, merchant, date string, amount int64, fence uint64, worker int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fences.Advance(ctx, fencesql.SQL(tx), "settlement:"+merchant+":"+date, fence); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx,
		`INSERT INTO settlements (merchant, date, amount_cents, fence, worker) VALUES ($1, $2, $3, $4, $5)`,
		merchant, date, amount, int64(fence), worker)
	if isUniqueViolation(err) {
		return errDuplicate
	}
	if err != nil {
		return err
	}
	return tx.Commit()
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "23505"
	}
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

// count returns the settled merchants and the duplicate settlements (rows
// beyond one per merchant and date; the constraint keeps it at zero).
func count(ctx context.Context, db *sql.DB, date string) (settled, duplicates int, err error) {
	var rows int
	err = db.QueryRowContext(ctx,
		`SELECT count(DISTINCT merchant), count(*) FROM settlements WHERE date = $1`, date).Scan(&settled, &rows)
	return settled, rows - settled, err
}
