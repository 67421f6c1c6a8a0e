// Package fencesql makes SQL writes conditional on a dlock fence (see
// package fence for why), on database/sql or pgx handles.
//
// It imports neither a database/sql driver nor pgx: database/sql handles
// fit SQLDB, and pgx handles (*pgx.Conn, pgx.Tx, *pgxpool.Pool,
// *pgxpool.Conn) fit PgxDB, whose Exec result only has to report the rows
// it changed.
//
// # Guarded writes
//
// ExecSQL and ExecPgx run a guarded write that the caller writes with the
// fence in its WHERE clause:
//
//	err := fencesql.ExecPgx(ctx, pool,
//		`UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence < $2`,
//		balance, int64(lease.Fence()), id)
//	if errors.Is(err, dlock.ErrStaleFence) { … a newer holder has written: stop … }
//
// Zero rows changed means stale (so the row must exist: create it with fence
// 0, or use Table).
//
// # A fence table
//
// Table keeps one fence per resource name in a small table
// (dlock_fences(resource text primary key, fence bigint)); Advance, called
// inside the caller's transaction, raises the stored fence or fails with
// ErrStaleFence, so the check and the protected write commit (or roll back)
// together:
//
//	tx, err := pool.Begin(ctx)
//	…
//	if err := (fencesql.Table{}).Advance(ctx, fencesql.Pgx(tx), "ledger:42", lease.Fence()); err != nil {
//		tx.Rollback(ctx); return err
//	}
//	… the protected writes, in tx …
//	err = tx.Commit(ctx)
//
// The row lock Advance takes on the resource's fence row also serializes
// concurrent writers of that resource until the transaction ends.
package fencesql

import (
	"context"
	"database/sql"
	"fmt"
	"math"

	"github.com/dlock-dev/dlock/fence"
)

// ErrStaleFence is fence.ErrStaleFence (and dlock.ErrStaleFence), the same
// value: the write was refused because the resource has already accepted an
// equal or greater fence.
var ErrStaleFence = fence.ErrStaleFence

// Execer runs one statement and reports how many rows it changed. SQL and
// Pgx adapt database/sql and pgx handles (connections, pools,
// transactions) to it.
type Execer interface {
	ExecRows(ctx context.Context, query string, args ...any) (int64, error)
}

// SQLDB is what SQL needs: *sql.DB, *sql.Conn and *sql.Tx implement it.
type SQLDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// RowsAffecter is the result of one statement that reports how many rows
// it changed, as pgx's pgconn.CommandTag does.
type RowsAffecter interface {
	RowsAffected() int64
}

// PgxDB is what Pgx needs: *pgx.Conn, pgx.Tx, *pgxpool.Pool and
// *pgxpool.Conn implement it, with T = pgconn.CommandTag (inferred from the
// argument: write fencesql.Pgx(pool)).
type PgxDB[T RowsAffecter] interface {
	Exec(ctx context.Context, sql string, args ...any) (T, error)
}

// SQL adapts a database/sql handle to Execer.
func SQL(db SQLDB) Execer { return sqlExecer{db} }

// Pgx adapts a pgx handle to Execer.
func Pgx[T RowsAffecter](db PgxDB[T]) Execer { return pgxExecer[T]{db} }

type sqlExecer struct{ db SQLDB }

func (e sqlExecer) ExecRows(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

type pgxExecer[T RowsAffecter] struct{ db PgxDB[T] }

func (e pgxExecer[T]) ExecRows(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := e.db.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// Exec runs a guarded write: query must change rows only when the fence it
// carries is greater than the stored one (an UPDATE … WHERE … AND fence <
// $n, or an INSERT … ON CONFLICT … DO UPDATE … WHERE stored.fence < $n). It
// returns an error wrapping ErrStaleFence when the write changed no row, and
// the database's error, wrapped, when it failed.
func Exec(ctx context.Context, db Execer, query string, args ...any) error {
	n, err := db.ExecRows(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("fencesql: guarded write: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("fencesql: guarded write changed no row: %w", ErrStaleFence)
	}
	return nil
}

// ExecSQL is Exec on a database/sql handle (*sql.DB, *sql.Conn, *sql.Tx).
func ExecSQL(ctx context.Context, db SQLDB, query string, args ...any) error {
	return Exec(ctx, SQL(db), query, args...)
}

// ExecPgx is Exec on a pgx handle (*pgx.Conn, pgx.Tx, *pgxpool.Pool,
// *pgxpool.Conn).
func ExecPgx[T RowsAffecter](ctx context.Context, db PgxDB[T], query string, args ...any) error {
	return Exec(ctx, Pgx(db), query, args...)
}

// Param converts a fence to the int64 that a bigint column stores. Fence 0
// (no grant has it) and fences above math.MaxInt64 (no dlock store issues
// them) are an error.
func Param(f uint64) (int64, error) {
	if f == 0 || f > math.MaxInt64 {
		return 0, fmt.Errorf("fencesql: fence %d is outside [1, %d]", f, int64(math.MaxInt64))
	}
	return int64(f), nil
}

// DefaultTable is the name of the fence table when Table.Name is empty.
const DefaultTable = "dlock_fences"

// Table is a per-resource fence table in PostgreSQL (or a database with the
// same INSERT … ON CONFLICT syntax and $n placeholders, such as SQLite): one
// row per resource name with the greatest fence accepted for it.
type Table struct {
	// Name is the table's name, used as written in SQL (quote it yourself
	// if it needs quoting; it may be schema-qualified). Zero value:
	// "dlock_fences".
	Name string
}

func (t Table) name() string {
	if t.Name == "" {
		return DefaultTable
	}
	return t.Name
}

// DDL returns the CREATE TABLE IF NOT EXISTS statement of the table.
func (t Table) DDL() string {
	return `CREATE TABLE IF NOT EXISTS ` + t.name() + ` (resource text PRIMARY KEY, fence bigint NOT NULL)`
}

// Create creates the table when it does not exist; it returns the
// database's error, wrapped, when that fails.
func (t Table) Create(ctx context.Context, db Execer) error {
	if _, err := db.ExecRows(ctx, t.DDL()); err != nil {
		return fmt.Errorf("fencesql: create %s: %w", t.name(), err)
	}
	return nil
}

// Advance records fence f for resource, inside the caller's transaction tx:
// it inserts the resource's row, or raises its fence, only when f is
// greater than the stored fence. Otherwise it changes nothing and returns
// an error wrapping ErrStaleFence; the caller then rolls back. The row
// stays locked until tx ends, so concurrent writers of one resource are
// serialized and a stale one cannot slip between the check and the commit.
// A failing statement returns the database's error, wrapped; a fence Param
// refuses, Param's error.
//
// A holder that writes several times under one grant should call Advance
// once per transaction with a new grant, or use AdvanceOrSame.
func (t Table) Advance(ctx context.Context, tx Execer, resource string, f uint64) error {
	return t.advance(ctx, tx, resource, f, "<")
}

// AdvanceOrSame is Advance that also accepts a fence equal to the stored
// one: the same grant writing again. Fences are unique per grant of a key,
// so this admits only the latest holder. Use one lock key per resource
// name: fences of different keys are not comparable.
func (t Table) AdvanceOrSame(ctx context.Context, tx Execer, resource string, f uint64) error {
	return t.advance(ctx, tx, resource, f, "<=")
}

func (t Table) advance(ctx context.Context, tx Execer, resource string, f uint64, op string) error {
	p, err := Param(f)
	if err != nil {
		return err
	}
	q := `INSERT INTO ` + t.name() + ` AS f (resource, fence) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence WHERE f.fence ` + op + ` EXCLUDED.fence`
	n, err := tx.ExecRows(ctx, q, resource, p)
	if err != nil {
		return fmt.Errorf("fencesql: advance %q to %d: %w", resource, f, err)
	}
	if n == 0 {
		return fmt.Errorf("fencesql: advance %q to %d: %w", resource, f, ErrStaleFence)
	}
	return nil
}
