package verify

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/dlock-dev/dlock/fence"
	"github.com/dlock-dev/dlock/fence/fencesql"
	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// Register is the fenced register the clients write to: an embedded SQLite
// database (a store of its own, which no fault touches) guarded by package
// fence/fencesql, as a careful user's resource would be. A write stores
// (key, fence, owner) in one transaction with fencesql's AdvanceOrSame, so
// it is refused with fence.ErrStaleFence once a greater fence has written
// the key; the same holder may write again.
type Register struct {
	db     *sql.DB
	fences fencesql.Table
}

// OpenRegister creates the register's database in dir.
func OpenRegister(ctx context.Context, dir string) (*Register, error) {
	path := filepath.Join(dir, "register.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(OFF)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("verify: open register: %w", err)
	}
	// One connection: SQLite serialises writers anyway, and one
	// connection never answers SQLITE_BUSY.
	db.SetMaxOpenConns(1)
	r := &Register{db: db, fences: fencesql.Table{Name: "verify_fences"}}
	if err := r.fences.Create(ctx, fencesql.SQL(db)); err != nil {
		db.Close()
		return nil, fmt.Errorf("verify: create register: %w", err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS verify_writes (seq INTEGER PRIMARY KEY, key TEXT NOT NULL, fence INTEGER NOT NULL, owner TEXT NOT NULL)`); err != nil {
		db.Close()
		return nil, fmt.Errorf("verify: create register: %w", err)
	}
	return r, nil
}

// Write stores fence f of owner for key. It returns fence.ErrStaleFence
// (wrapped) when a greater fence has written key, or the database's error.
func (r *Register) Write(ctx context.Context, key, owner string, f uint64) error {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := r.fences.AdvanceOrSame(ctx, fencesql.SQL(tx), key, f); err != nil {
		return err
	}
	p, err := fencesql.Param(f)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO verify_writes (key, fence, owner) VALUES (?, ?, ?)`, key, p, owner); err != nil {
		return err
	}
	return tx.Commit()
}

// Accepted returns the number of writes the register stored.
func (r *Register) Accepted(ctx context.Context) (int, error) {
	var n int
	err := r.db.QueryRowContext(ctx, `SELECT count(*) FROM verify_writes`).Scan(&n)
	return n, err
}

// Close closes the database.
func (r *Register) Close() error { return r.db.Close() }

func isStale(err error) bool { return errors.Is(err, fence.ErrStaleFence) }
