// Package sqlledger is a once.Ledger in a SQL table, on PostgreSQL or
// SQLite, through database/sql: one row per (job, window) with the state
// and fence of its latest attempt. Its starts and finishes are guarded
// writes of package fence/fencesql (an upsert that changes the row only
// when the new fence is greater; an update only with the recorded fence),
// so a stale holder's write changes nothing and reports ErrStaleFence.
//
// # The clock
//
// Now is the database's clock: PostgreSQL's clock_timestamp(), one clock
// for every node, whatever their own clocks say. SQLite has no server: its
// clock is that of the host running the statement, which the nodes sharing
// a SQLite file share (they run on one host, or one VM).
//
// # Drivers
//
// The package imports no database/sql driver. Import the one you use:
// github.com/jackc/pgx/v5/stdlib (driver "pgx") for PostgreSQL,
// modernc.org/sqlite (driver "sqlite") for SQLite. Open picks it from the
// data source name. A program with a *pgxpool.Pool passes
// stdlib.OpenDBFromPool(pool) to New.
//
// # The table
//
//	CREATE TABLE IF NOT EXISTS dlock_once (
//		job text NOT NULL, window_id text NOT NULL,
//		state text NOT NULL, fence bigint NOT NULL,
//		owner text NOT NULL, node text NOT NULL, attempt integer NOT NULL,
//		started_us bigint NOT NULL, finished_us bigint NOT NULL DEFAULT 0,
//		error text NOT NULL DEFAULT '',
//		PRIMARY KEY (job, window_id))
//
// Times are microseconds since the Unix epoch on the database's clock.
package sqlledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/fence/fencesql"
	"github.com/dlock-dev/dlock/recipe/once"
)

// DefaultTable is the table's name when none is given.
const DefaultTable = "dlock_once"

// Dialect is the SQL database behind a Ledger.
type Dialect int

const (
	// Postgres is PostgreSQL (9.5 or later), e.g. through pgx's
	// database/sql driver "pgx".
	Postgres Dialect = iota + 1
	// SQLite is SQLite (3.24 or later), e.g. modernc.org/sqlite's driver
	// "sqlite".
	SQLite
)

// String returns "postgres" or "sqlite".
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Ledger is a once.Ledger in a SQL table. Safe for concurrent use.
type Ledger struct {
	db      *sql.DB
	dialect Dialect
	table   string
	owned   bool // Close closes db (Open)
	now     string
}

var _ once.Ledger = (*Ledger)(nil)

var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// New returns a Ledger in table (DefaultTable when empty; a plain or
// schema-qualified SQL identifier, letters, digits and underscores) of db,
// whose database is dialect. It does not create the table (Create does)
// and never closes db. An unknown dialect or a bad table name is an error
// matching dlock.ErrInvalidArgument.
func New(db *sql.DB, dialect Dialect, table string) (*Ledger, error) {
	if table == "" {
		table = DefaultTable
	}
	if db == nil {
		return nil, fmt.Errorf("sqlledger: nil *sql.DB: %w", dlock.ErrInvalidArgument)
	}
	if !tableName.MatchString(table) {
		return nil, fmt.Errorf("sqlledger: table name %q: want letters, digits and underscores (schema.table allowed): %w", table, dlock.ErrInvalidArgument)
	}
	l := &Ledger{db: db, dialect: dialect, table: table}
	switch dialect {
	case Postgres:
		l.now = `(extract(epoch from clock_timestamp()) * 1000000)::bigint`
	case SQLite:
		l.now = `CAST(ROUND((julianday('now') - 2440587.5) * 86400000000.0) AS INTEGER)`
	default:
		return nil, fmt.Errorf("sqlledger: unknown dialect %d: %w", int(dialect), dlock.ErrInvalidArgument)
	}
	return l, nil
}

// Open opens the ledger named by dsn and creates its table (DefaultTable)
// when missing:
//   - "postgres://…" or "postgresql://…": PostgreSQL through database/sql
//     driver "pgx" (import github.com/jackc/pgx/v5/stdlib);
//   - "sqlite:PATH", "sqlite://PATH" or "file:PATH": a SQLite file through
//     driver "sqlite" (import modernc.org/sqlite), in WAL mode with a 10 s
//     busy timeout, so several processes can share it.
//
// A plain path is refused: a mistyped DSN ("localhost:5432", "postgres:/db")
// taken for a file would give each node a ledger of its own, and every node
// would run the job. Close closes the database. A DSN of no known form, a
// driver not imported, or a SQLite path that is a directory or in a
// directory that does not exist, is an error matching
// dlock.ErrInvalidArgument; a database that cannot be reached, one matching
// dlock.ErrUnavailable.
func Open(ctx context.Context, dsn string) (*Ledger, error) {
	var driverName, source string
	var dialect Dialect
	switch {
	case dsn == "":
		return nil, fmt.Errorf("sqlledger: empty ledger DSN (want postgres://… or sqlite:PATH): %w", dlock.ErrInvalidArgument)
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		driverName, source, dialect = "pgx", dsn, Postgres
	default:
		path, known := "", false
		for _, p := range []string{"sqlite://", "sqlite:", "file:"} {
			if rest, ok := strings.CutPrefix(dsn, p); ok {
				path, known = rest, true
				break
			}
		}
		if !known || path == "" || strings.Contains(path, "://") {
			return nil, fmt.Errorf("sqlledger: ledger %q: want postgres://… or sqlite:PATH: %w", redact(dsn), dlock.ErrInvalidArgument)
		}
		path, _, _ = strings.Cut(path, "?")
		if err := checkSQLitePath(path); err != nil {
			return nil, fmt.Errorf("sqlledger: ledger %q: %w: %w", redact(dsn), err, dlock.ErrInvalidArgument)
		}
		driverName, dialect = "sqlite", SQLite
		source = "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
	}
	if !slices.Contains(sql.Drivers(), driverName) {
		pkg := map[string]string{"pgx": "github.com/jackc/pgx/v5/stdlib", "sqlite": "modernc.org/sqlite"}[driverName]
		return nil, fmt.Errorf("sqlledger: ledger %q needs the database/sql driver %q: import _ %q: %w", redact(dsn), driverName, pkg, dlock.ErrInvalidArgument)
	}
	db, err := sql.Open(driverName, source)
	if err != nil {
		return nil, fmt.Errorf("sqlledger: open %s: %w: %w", redact(dsn), dlock.ErrInvalidArgument, err)
	}
	l, _ := New(db, dialect, "")
	l.owned = true
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlledger: ledger %s cannot be reached: %w: %w", redact(dsn), dlock.ErrUnavailable, err)
	}
	if err := l.Create(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return l, nil
}

// checkSQLitePath refuses a SQLite path that cannot be a database file: a
// directory, or a file in a directory that does not exist. These are
// mistakes in the DSN, not an unavailable database.
func checkSQLitePath(path string) error {
	if strings.HasPrefix(path, ":memory:") {
		return nil
	}
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return fmt.Errorf("%s is a directory, not a database file", path)
	case err == nil || !(errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)):
		return nil // a file, or a problem that opening reports
	}
	dir := filepath.Dir(path)
	fi, err = os.Stat(dir)
	switch {
	case err == nil && !fi.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("the directory %s does not exist", dir)
	}
	return nil
}

func redact(dsn string) string {
	// postgres://user:secret@host/db: hide the password.
	if i := strings.Index(dsn, "://"); i >= 0 {
		rest := dsn[i+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if c := strings.Index(rest[:at], ":"); c >= 0 {
				return dsn[:i+3] + rest[:c] + ":xxxxx" + rest[at:]
			}
		}
	}
	return dsn
}

// Dialect returns the ledger's dialect.
func (l *Ledger) Dialect() Dialect { return l.dialect }

// DB returns the ledger's database handle.
func (l *Ledger) DB() *sql.DB { return l.db }

// Close closes the database when Open opened it; a Ledger from New leaves
// its db open.
func (l *Ledger) Close() error {
	if l.owned {
		return l.db.Close()
	}
	return nil
}

// DDL returns the ledger's CREATE TABLE IF NOT EXISTS statement.
func (l *Ledger) DDL() string {
	return `CREATE TABLE IF NOT EXISTS ` + l.table + ` (
	job text NOT NULL, window_id text NOT NULL,
	state text NOT NULL, fence bigint NOT NULL,
	owner text NOT NULL, node text NOT NULL, attempt integer NOT NULL,
	started_us bigint NOT NULL, finished_us bigint NOT NULL DEFAULT 0,
	error text NOT NULL DEFAULT '',
	PRIMARY KEY (job, window_id))`
}

// Create creates the ledger's table when it does not exist (run it once,
// e.g. at deployment; concurrent first runs on PostgreSQL can collide on
// the catalog, and the loser's error says so).
func (l *Ledger) Create(ctx context.Context) error {
	if _, err := l.db.ExecContext(ctx, l.DDL()); err != nil {
		return fmt.Errorf("sqlledger: create %s: %w", l.table, err)
	}
	return nil
}

// Now implements once.Ledger: the database's clock (see the package doc).
func (l *Ledger) Now(ctx context.Context) (time.Time, error) {
	var us int64
	if err := l.db.QueryRowContext(ctx, `SELECT `+l.now).Scan(&us); err != nil {
		return time.Time{}, fmt.Errorf("sqlledger: now: %w", err)
	}
	return time.UnixMicro(us).UTC(), nil
}

// Get implements once.Ledger.
func (l *Ledger) Get(ctx context.Context, job, window string) (once.Record, error) {
	r := once.Record{Job: job, Window: window}
	var state string
	var fence, started, finished int64
	err := l.db.QueryRowContext(ctx, `SELECT state, fence, owner, node, attempt, started_us, finished_us, error FROM `+l.table+
		` WHERE job = $1 AND window_id = $2`, job, window).Scan(&state, &fence, &r.Owner, &r.Node, &r.Attempt, &started, &finished, &r.Error)
	if errors.Is(err, sql.ErrNoRows) {
		return once.Record{}, fmt.Errorf("sqlledger: %q window %q: %w", job, window, once.ErrNoRecord)
	}
	if err != nil {
		return once.Record{}, fmt.Errorf("sqlledger: get %q window %q: %w", job, window, err)
	}
	r.State, r.Fence = once.State(state), uint64(fence)
	r.StartedAt = time.UnixMicro(started).UTC()
	if finished != 0 {
		r.FinishedAt = time.UnixMicro(finished).UTC()
	}
	return r, nil
}

// Start implements once.Ledger: one guarded upsert (fencesql.ExecSQL) that
// inserts the window's row, or replaces a Started or Failed row with a
// smaller fence.
func (l *Ledger) Start(ctx context.Context, req once.StartRequest) (once.Record, error) {
	f, err := fencesql.Param(req.Fence)
	if err != nil {
		return once.Record{}, fmt.Errorf("sqlledger: start %q window %q: %w: %w", req.Job, req.Window, dlock.ErrInvalidArgument, err)
	}
	q := `INSERT INTO ` + l.table + ` AS t (job, window_id, state, fence, owner, node, attempt, started_us, finished_us, error)
VALUES ($1, $2, 'started', $3, $4, $5, 1, ` + l.now + `, 0, '')
ON CONFLICT (job, window_id) DO UPDATE SET state = 'started', fence = EXCLUDED.fence, owner = EXCLUDED.owner,
	node = EXCLUDED.node, attempt = t.attempt + 1, started_us = EXCLUDED.started_us, finished_us = 0, error = ''
WHERE t.fence < EXCLUDED.fence AND t.state <> 'finished'`
	err = fencesql.ExecSQL(ctx, l.db, q, req.Job, req.Window, f, req.Owner, req.Node)
	if err != nil && !errors.Is(err, fencesql.ErrStaleFence) {
		return once.Record{}, fmt.Errorf("sqlledger: start %q window %q: %w", req.Job, req.Window, err)
	}
	r, gerr := l.Get(ctx, req.Job, req.Window)
	switch {
	case gerr != nil:
		return once.Record{}, gerr
	case err == nil:
		return r, nil
	case r.State == once.Finished:
		return r, fmt.Errorf("sqlledger: start %q window %q: %w", req.Job, req.Window, once.ErrFinished)
	}
	return r, fmt.Errorf("sqlledger: start %q window %q with fence %d: the ledger has fence %d: %w", req.Job, req.Window, req.Fence, r.Fence, err)
}

// Finish implements once.Ledger: one guarded update (fencesql.ExecSQL) of
// the row that is Started with exactly this fence.
func (l *Ledger) Finish(ctx context.Context, job, window string, fence uint64, runErr string) (once.Record, error) {
	f, err := fencesql.Param(fence)
	if err != nil {
		return once.Record{}, fmt.Errorf("sqlledger: finish %q window %q: %w: %w", job, window, dlock.ErrInvalidArgument, err)
	}
	state := once.Finished
	if runErr != "" {
		state = once.Failed
	}
	err = fencesql.ExecSQL(ctx, l.db, `UPDATE `+l.table+` SET state = $4, finished_us = `+l.now+`, error = $5
WHERE job = $1 AND window_id = $2 AND fence = $3 AND state = 'started'`, job, window, f, string(state), runErr)
	if err != nil && !errors.Is(err, fencesql.ErrStaleFence) {
		return once.Record{}, fmt.Errorf("sqlledger: finish %q window %q: %w", job, window, err)
	}
	r, gerr := l.Get(ctx, job, window)
	if err != nil {
		what := "no record"
		if gerr == nil {
			what = fmt.Sprintf("a %s attempt with fence %d", r.State, r.Fence)
		}
		return r, fmt.Errorf("sqlledger: finish %q window %q with fence %d: the ledger has %s: %w", job, window, fence, what, err)
	}
	return r, gerr
}
