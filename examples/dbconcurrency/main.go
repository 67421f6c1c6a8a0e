// Command dbconcurrency settles merchants with no lock at all: the database's
// own concurrency control decides who wins. Unique: a unique constraint on
// (merchant, date) refuses a second settlement insert, and the money moves in
// the same transaction. Optimistic: `UPDATE … SET version = version + 1 WHERE
// merchant = $1 AND version = $2` changes zero rows for everyone who read an
// old version; they re-read and find the work done. On PostgreSQL, `SELECT …
// FOR UPDATE` in the transaction does the same with a row lock (SQLite has no
// FOR UPDATE: its writers lock the whole database; the PostgreSQL variant is
// in forupdate_pg.go, built with -tags pgexample). See docs/CHOOSING.md.
//
//	go run ./examples/dbconcurrency                          # 16 contenders on each of 50 merchants, SQLite in a temp dir
//	go run ./examples/dbconcurrency --contenders 4 --merchants 200
//
// It exits 1 when a merchant is unsettled or paid twice.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

func main() {
	merchants := flag.Int("merchants", 50, "merchants to settle")
	contenders := flag.Int("contenders", 16, "goroutines that all try to settle every merchant")
	date := flag.String("date", "2026-09-30", "settlement date")
	flag.Parse()
	dir, err := os.MkdirTemp("", "dbconcurrency-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	ok := true
	for _, s := range []Strategy{Unique, Optimistic} {
		db, err := openSQLite(filepath.Join(dir, s.Name+".db"), *contenders)
		if err != nil {
			fail(err)
		}
		rep, err := Run(context.Background(), db, Config{Strategy: s, Merchants: *merchants, Contenders: *contenders, Date: *date})
		db.Close()
		if err != nil {
			fail(err)
		}
		fmt.Printf(`%s: %s
  %d contenders × %d merchants = %d attempts
  settled          %d / %d, paid exactly once %d, paid twice or more %d
  lost, conflict   %d   (%s)
  lost, found done %d   (re-read after the conflict: already settled)
`, s.Name, s.How, rep.Contenders, rep.Merchants, rep.Attempts, rep.Settled, rep.Merchants, rep.PaidOnce, rep.PaidMore,
			rep.Conflicts, s.Conflict, rep.FoundSettled)
		ok = ok && rep.Settled == rep.Merchants && rep.PaidOnce == rep.Merchants
	}
	if !ok {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "dbconcurrency:", err)
	os.Exit(1)
}

// Strategy is which of the database's mechanisms decides the winner.
type Strategy struct {
	Name     string // for the report
	How      string // the mechanism, one line
	Conflict string // what a loser sees, one line
	// Settle is one contender's attempt at one merchant. It must call
	// barrier exactly once, before its first write (Run holds every
	// contender there until all have arrived), and report whether it won,
	// was refused by the database, or found the merchant settled on a
	// re-read after a refusal.
	Settle func(ctx context.Context, db *sql.DB, merchant, date string, barrier func()) (outcome, error)
}

var (
	// Unique: every contender inserts its settlement row; the unique
	// constraint on (merchant, date) refuses all but the first, and the
	// payment in the same transaction rolls back with it.
	Unique = Strategy{Name: "unique", How: "unique constraint on (merchant, date)",
		Conflict: "INSERT refused: UNIQUE constraint failed", Settle: settleUnique}
	// Optimistic: every contender reads the merchant's row and version, then
	// updates it only if the version is unchanged; zero rows updated means
	// another contender won, so it re-reads (and finds the merchant settled).
	Optimistic = Strategy{Name: "optimistic", How: "UPDATE … WHERE merchant = $1 AND version = $2",
		Conflict: "UPDATE changed 0 rows: the version had moved", Settle: settleOptimistic}
)

// Config is one run.
type Config struct {
	Strategy   Strategy
	Merchants  int    // merchants m00000 …
	Contenders int    // goroutines, each with its own connection, that all try every merchant
	Date       string // settlement date
}

// Report is what a run counts: outcomes as the contenders saw them, and
// payments as the ledger holds them.
type Report struct {
	Merchants, Contenders, Attempts int
	Won                             int64 // attempts that settled a merchant
	Conflicts                       int64 // attempts the database refused: unique violation, or zero rows updated
	FoundSettled                    int64 // optimistic losers whose re-read found the merchant settled
	Settled                         int   // merchants marked settled for the date
	PaidOnce                        int   // merchants whose paid_cents is exactly their amount
	PaidMore                        int   // merchants paid more than once
}

// Run creates the tables in db and makes cfg.Contenders goroutines settle
// every merchant, each merchant by all of them at once: they meet at a
// barrier per merchant and go together, so every merchant is a race, every
// time. db needs a connection per contender.
func Run(ctx context.Context, db *sql.DB, cfg Config) (Report, error) {
	if cfg.Merchants <= 0 || cfg.Contenders <= 0 {
		return Report{}, fmt.Errorf("--merchants and --contenders must be positive (got %d, %d)", cfg.Merchants, cfg.Contenders)
	}
	if err := migrate(ctx, db, cfg.Merchants); err != nil {
		return Report{}, err
	}
	rep := Report{Merchants: cfg.Merchants, Contenders: cfg.Contenders, Attempts: cfg.Merchants * cfg.Contenders}
	var won, conflicts, found atomic.Int64
	// ready[m]: every contender has read merchant m (optimistic) or is
	// about to insert (unique). Nobody writes m before all are there.
	ready := make([]sync.WaitGroup, cfg.Merchants)
	for m := range ready {
		ready[m].Add(cfg.Contenders)
	}
	var wg sync.WaitGroup
	errs := make([]error, cfg.Contenders)
	for c := range cfg.Contenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range cfg.Merchants {
				arrived := false
				barrier := func() { arrived = true; ready[m].Done(); ready[m].Wait() }
				out, err := cfg.Strategy.Settle(ctx, db, merchantName(m), cfg.Date, barrier)
				if err != nil {
					errs[c] = fmt.Errorf("contender %d, merchant %d: %w", c, m, err)
					// Let the others past the barriers this one will not reach.
					if !arrived {
						ready[m].Done()
					}
					for rest := m + 1; rest < cfg.Merchants; rest++ {
						ready[rest].Done()
					}
					return
				}
				switch {
				case out.won:
					won.Add(1)
				case out.conflict:
					conflicts.Add(1)
				}
				if out.foundSettled {
					found.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Report{}, err
	}
	rep.Won, rep.Conflicts, rep.FoundSettled = won.Load(), conflicts.Load(), found.Load()
	err := db.QueryRowContext(ctx, `SELECT
		count(*) FILTER (WHERE settled_through = $1),
		count(*) FILTER (WHERE paid_cents = amount_cents),
		count(*) FILTER (WHERE paid_cents > amount_cents)
		FROM accounts`, cfg.Date).Scan(&rep.Settled, &rep.PaidOnce, &rep.PaidMore)
	return rep, err
}

// outcome is one contender's attempt at one merchant.
type outcome struct {
	won          bool // it settled the merchant
	conflict     bool // the database refused it
	foundSettled bool // a re-read after the refusal found the merchant settled
}

// settleUnique inserts the settlement row and pays the merchant in one
// transaction. The unique constraint refuses the insert of every contender
// but the first; its transaction rolls back, so it pays nothing. No
// contender checks first: the constraint is the check.
func settleUnique(ctx context.Context, db *sql.DB, merchant, date string, barrier func()) (outcome, error) {
	barrier()
	var out outcome
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return out, err
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `INSERT INTO settlements (merchant, date) VALUES ($1, $2)`, merchant, date)
	if isUniqueViolation(err) {
		out.conflict = true
		return out, nil
	}
	if err != nil {
		return out, err
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

// settleOptimistic reads the merchant's row and version, waits until every
// contender has read the same version (the worst case), then pays only if
// the version is still the one it read. Zero rows updated is the conflict:
// someone else changed the row, so it re-reads and decides again, here
// finding the merchant settled.
func settleOptimistic(ctx context.Context, db *sql.DB, merchant, date string, barrier func()) (outcome, error) {
	var out outcome
	for attempt := 0; ; attempt++ {
		var version int64
		var through string
		if err := db.QueryRowContext(ctx, `SELECT version, settled_through FROM accounts WHERE merchant = $1`, merchant).
			Scan(&version, &through); err != nil {
			return out, err
		}
		if attempt == 0 {
			barrier()
		}
		if through >= date {
			out.foundSettled = attempt > 0
			return out, nil
		}
		res, err := db.ExecContext(ctx, `UPDATE accounts
			SET paid_cents = paid_cents + amount_cents, settled_through = $2, version = version + 1
			WHERE merchant = $1 AND version = $3`, merchant, date, version)
		if err != nil {
			return out, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return out, err
		}
		if n == 1 {
			out.won = true
			return out, nil
		}
		out.conflict = true // lost: retry from the read
	}
}

func migrate(ctx context.Context, db *sql.DB, merchants int) error {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS accounts (
			merchant        TEXT   PRIMARY KEY,
			amount_cents    BIGINT NOT NULL,
			paid_cents      BIGINT NOT NULL DEFAULT 0,
			settled_through TEXT   NOT NULL DEFAULT '',
			version         BIGINT NOT NULL DEFAULT 0)`,
		`CREATE TABLE IF NOT EXISTS settlements (
			merchant TEXT NOT NULL,
			date     TEXT NOT NULL,
			UNIQUE (merchant, date))`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	for m := range merchants {
		if _, err := db.ExecContext(ctx, `INSERT INTO accounts (merchant, amount_cents) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
			merchantName(m), 1000+int64(m)*7); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	return nil
}

func merchantName(i int) string { return fmt.Sprintf("m%05d", i) }

// isUniqueViolation: SQLite's constraint error, or PostgreSQL's SQLSTATE
// 23505 as pgx words it (examples/settlement/ledger.go matches pgconn's
// error type instead; this package keeps pgx out of its SQLite build).
func isUniqueViolation(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "UNIQUE constraint failed") ||
		strings.Contains(err.Error(), "(SQLSTATE 23505)"))
}

// openSQLite opens an embedded SQLite file as examples/settlement does, with
// conns connections so the contenders really run at once; SQLite serializes
// their writes, the busy timeout makes each wait its turn.
func openSQLite(path string, conns int) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db, nil
}
