// Package pgdriver is the dlock driver for PostgreSQL lease tables: each
// grant is a row of a table, written by one atomic statement, and expired by
// the database's clock.
//
//	locker, err := dlock.Open(ctx, "postgres://app@db:5432/app?dlock_schema=locks")
//
// or, with a pool you already have (the driver never closes it):
//
//	d, err := pgdriver.New(pool, &pgdriver.Options{Schema: "locks"})
//	locker := dlock.New(d)
//
// # How it works
//
// One table (default "dlock_locks") holds a row per key: name (the key,
// passed as a parameter, so no escaping is needed), owner token, fence,
// expires_at, TTL and holder. An acquisition is one statement,
//
//	INSERT INTO dlock_locks … SELECT $key, $owner, nextval(seq), clock_timestamp() + ttl, …
//	  WHERE NOT EXISTS (… the key held, read without a lock: a cheap pre-check …)
//	ON CONFLICT (name) DO UPDATE SET owner = …, fence = nextval(seq), expires_at = …
//	  WHERE dlock_locks.expires_at <= clock_timestamp() OR dlock_locks.owner = ''
//	RETURNING fence
//
// so the grant and its fence commit together. Renewal and release are
// owner-checked UPDATEs (… WHERE name = $1 AND owner = $2 AND expires_at >
// clock_timestamp()); no matching row means driver.ErrLeaseLost and nothing
// changed. A release marks the row free (empty owner, expires_at now) rather
// than deleting it, and sends pg_notify on the table's channel in the
// same statement.
//
// The table and its sequence are created on first use (CREATE … IF NOT
// EXISTS under a transaction-scoped advisory lock, so concurrent first uses
// are safe), or beforehand by Migrate (set Options.NoMigrate when the
// application's role may not run DDL). Options.Schema, or the URL parameter
// dlock_schema, puts them in a schema of the caller's choice.
//
// # Capabilities
//
//   - driver.Hinter: LISTEN/NOTIFY wakes a polling Acquire early when a key
//     is released. Hints are only hints: waiting is backoff polling
//     (there is no driver.Waiter), and a lost notification costs latency.
//     Hints need a connection config: the pool's, when the DB given to New
//     is a *pgxpool.Pool or the driver was opened by URL, or
//     Options.ListenConfig.
//   - driver.Inspector: Inspect and List read the table.
//   - Grant.Lost is not set: a lease table cannot push loss; the root
//     package relies on renewals and the validity deadline.
//   - driver.Resumer: a grant is a row, not a connection, so a restarted
//     process resumes it (Locker.Resume) by owner token and fence with one
//     owner- and fence-checked UPDATE (see Resume).
//
// # Safety assumptions
//
//   - The database clock decides expiry. The statements compare
//     expires_at with clock_timestamp() only; the client's wall clock is
//     never used. The database server's clock must not jump forward by more
//     than the lease drift (run NTP in slewing mode); a forward step expires
//     leases early.
//   - Fences come from one PostgreSQL sequence, drawn in the statement that
//     grants (on the update path, after the row lock is held), so fences of
//     a key increase in grant order. They are as durable as the commit of the
//     grant, which waits for the WAL flush: a crash cannot reissue a fence
//     that a holder has seen. Grants and renewals raise synchronous_commit
//     from off to on for their own transaction, so a server or role
//     default of off does not weaken them.
//   - Replicas and failover: every statement must reach the primary. After
//     a failover to an asynchronous standby, recently committed grants (and
//     sequence values) may be lost, so two holders and repeated fences
//     become possible; with synchronous replication (synchronous_commit = on
//     or remote_apply and synchronous_standby_names set; not local, which
//     the driver leaves alone) the promoted standby has every acknowledged
//     grant. Never point the driver at a
//     read replica.
//   - A release commits asynchronously (synchronous_commit = off for that
//     one transaction, so it does not wait for a WAL flush). A crash right
//     after it can undo the release; the key then stays held by the old
//     owner, who has stopped using it, until the TTL runs out: later, never
//     less safe. Grants and renewals commit synchronously (see above),
//     since losing one of those would let a client believe in a lease (or
//     a fence) the database has forgotten.
//   - Rows of released keys stay in the table (they keep the fence order
//     strict under any interleaving). Prune deletes rows that have been free
//     for a while; pruning is safe as long as no acquisition statement stalls
//     on the server for longer than the idle time given to Prune.
//
// # Measured guarantees
//
// dlock verify (package verify) runs this driver's store under every fault
// it can take and counts double grants, fence violations and stale writes
// accepted: the postgres sections of docs/GUARANTEES.md hold the figures,
// for one server. make verify regenerates them.
package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/pgcommon"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

func init() {
	driver.Register("postgres", openURL)
	driver.Register("postgresql", openURL)
}

// DB is what the driver needs from a database handle: *pgxpool.Pool
// implements it. It must be safe for concurrent use (a single *pgx.Conn is
// not) and must reach the primary.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Default names of the lock table and the schema.
const (
	DefaultSchema = "public"
	DefaultTable  = "dlock_locks"
)

// Options configure a Driver. A nil *Options is the zero value.
type Options struct {
	// Schema is the schema of the lock table and its sequence. It is
	// created on first use when missing. Zero value: "public".
	Schema string
	// Table is the lock table's name; its sequence is Table + "_fence_seq".
	// Zero value: "dlock_locks".
	Table string
	// NoMigrate skips creating the table and sequence on first use: run
	// Migrate (or have an administrator run its DDL) beforehand. Zero
	// value: create them on first use when missing.
	NoMigrate bool
	// ListenConfig is the connection config of the LISTEN connection that
	// receives release hints (one per Driver, open only while an Acquire is
	// waiting); it must come from pgx.ParseConfig. Zero value: the pool's
	// config when the DB is a *pgxpool.Pool, otherwise hints are off.
	ListenConfig *pgx.ConnConfig
}

// Driver is a dlock driver over a PostgreSQL lease table. It implements
// driver.Driver, driver.Hinter, driver.Inspector and driver.Resumer, and
// is safe for concurrent use.
type Driver struct {
	db      DB
	ownPool *pgxpool.Pool         // created by Open; closed by Close
	conns   *pgcommon.ConnTracker // ownPool's sockets, cut short by Close
	schema  string
	table   string // qualified, quoted
	seq     string // qualified, quoted
	channel string
	hub     *pgcommon.Hub // nil: no hints

	noMigrate  bool
	migrated   atomic.Bool
	migrateSem chan struct{}
	closed     atomic.Bool
	closeOnce  sync.Once

	mu      sync.Mutex
	pending map[string]*attempt // acquisitions in flight, by owner token
	bg      sync.WaitGroup      // their goroutines

	detached pgcommon.Detacher // the statements' contexts, ended by Close

	sqlAcquire, sqlRenew, sqlRelease, sqlInspect, sqlList, sqlPrune string
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Hinter    = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)
)

// New returns a driver that keeps its leases in db. It does no I/O: the
// table is created on first use (see Options.NoMigrate). Close does not
// close db. It returns an error when Options name an invalid schema or
// table (1 to 63 bytes, no NUL, quote or backslash).
func New(db DB, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if err := pgcommon.ValidateName("schema", o.Schema); err != nil {
		return nil, urlparam.Wrap("pgdriver", err)
	}
	if err := pgcommon.ValidateName("table", o.Table); err != nil {
		return nil, urlparam.Wrap("pgdriver", err)
	}
	if err := pgcommon.ValidateName("sequence", o.Table+"_fence_seq"); err != nil {
		return nil, urlparam.Wrap("pgdriver", err)
	}
	d := &Driver{
		db:         db,
		schema:     o.Schema,
		table:      pgcommon.Ident(o.Schema, o.Table),
		seq:        pgcommon.Ident(o.Schema, o.Table+"_fence_seq"),
		noMigrate:  o.NoMigrate,
		migrateSem: make(chan struct{}, 1),
		pending:    map[string]*attempt{},
	}
	d.channel = pgcommon.Channel(d.table)
	cfg := o.ListenConfig
	if cfg == nil {
		if p, ok := db.(interface{ Config() *pgxpool.Config }); ok {
			cfg = p.Config().ConnConfig
		}
	}
	if cfg != nil {
		d.hub = pgcommon.NewHub(cfg.Copy(), d.channel)
	}
	d.buildSQL()
	return d, nil
}

// Open opens a driver on a PostgreSQL URL (postgres:// or postgresql://,
// as pgx accepts it, pool_max_conns and the other pgxpool parameters
// included), with its own pool that Close closes. The dlock parameters
// dlock_schema and dlock_table set Options.Schema and Options.Table and are
// removed before the URL reaches pgx. It pings the database and returns an
// error wrapping driver.ErrUnavailable when it cannot be reached.
//
// The host follows libpq, as pgx reads it: an empty host (postgres://u@/db,
// postgres://u@:5432/db) is not a default address but PGHOST, else the local
// Unix socket, as for psql; the port defaults to PGPORT, else 5432. A
// "host:" with an empty port is an invalid URL.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, urlparam.Wrap("pgdriver", err)
	}
	return open(ctx, u)
}

func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) { return open(ctx, u) }

func open(ctx context.Context, u *url.URL) (*Driver, error) {
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, urlparam.Invalid("pgdriver: URL scheme %q is not postgres or postgresql", u.Scheme)
	}
	if err := urlparam.Ports("pgdriver", u.Host); err != nil {
		return nil, err
	}
	pgURL, params := pgcommon.TakeParams(u, "dlock_schema", "dlock_table")
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		return nil, urlparam.Wrap("pgdriver", err)
	}
	conns := pgcommon.NewConnTracker()
	cfg.ConnConfig.DialFunc = conns.Wrap(cfg.ConnConfig.DialFunc)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgdriver: %w", err)
	}
	d, err := New(pool, &Options{Schema: params["dlock_schema"], Table: params["dlock_table"]})
	if err != nil {
		pool.Close()
		return nil, err
	}
	d.ownPool, d.conns = pool, conns
	if err := pool.Ping(ctx); err != nil {
		d.Close()
		if pgcommon.Refused(err) { // bad credentials, no such database, an unknown setting
			return nil, urlparam.Wrap("pgdriver: PostgreSQL refused the connection", err)
		}
		return nil, fmt.Errorf("pgdriver: %w: %w", driver.ErrUnavailable, err)
	}
	return d, nil
}

// storeErr wraps an error of op. An answer in which PostgreSQL refused the
// request itself (see pgcommon.Refused) matches driver.ErrInvalidArgument:
// retrying cannot help, and it must never pass for an outage.
func storeErr(op string, err error) error {
	if pgcommon.Refused(err) {
		return urlparam.Wrap("pgdriver: "+op+": PostgreSQL refused the request", err)
	}
	return fmt.Errorf("pgdriver: %s: %w", op, err)
}

func (d *Driver) buildSQL() {
	ttl := "$3::bigint * interval '1 microsecond'"
	// Contended polling is kept cheap in two ways. The NOT EXISTS pre-check
	// reads without locking: an attempt on a key that is plainly held
	// writes nothing. An attempt that passes it but then finds the key
	// taken (the authoritative check is ON CONFLICT … WHERE, under the row
	// lock) has still locked the row, which is a WAL write: the CTE s turns
	// synchronous_commit off for the statement's transaction first, and
	// only a grant, in RETURNING, turns it back on (on when it was off, else
	// as it was), so only grants wait for a WAL flush.
	d.sqlAcquire = `WITH s AS MATERIALIZED (
	SELECT current_setting('synchronous_commit') AS orig, set_config('synchronous_commit', 'off', true) AS off
)
INSERT INTO ` + d.table + ` AS l (name, owner, fence, expires_at, ttl_us, holder, acquired_at)
SELECT $1::text, $2::text, nextval(` + pgcommon.Literal(d.seq) + `), clock_timestamp() + ` + ttl + `, $3::bigint, $4::text, clock_timestamp()
FROM s
WHERE NOT EXISTS (SELECT 1 FROM ` + d.table + ` h WHERE h.name = $1::text AND h.owner <> '' AND h.expires_at > clock_timestamp())
ON CONFLICT (name) DO UPDATE SET
	owner = EXCLUDED.owner,
	fence = nextval(` + pgcommon.Literal(d.seq) + `),
	expires_at = clock_timestamp() + ` + ttl + `,
	ttl_us = EXCLUDED.ttl_us,
	holder = EXCLUDED.holder,
	acquired_at = clock_timestamp()
WHERE l.expires_at <= clock_timestamp() OR l.owner = ''
RETURNING fence, set_config('synchronous_commit', (SELECT CASE orig WHEN 'off' THEN 'on' ELSE orig END FROM s), true)`
	d.sqlRenew = `UPDATE ` + d.table + ` SET expires_at = clock_timestamp() + ` + ttl + `, ttl_us = $3
WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()
RETURNING ` + pgcommon.SyncCommitOn
	d.sqlRelease = `UPDATE ` + d.table + ` SET owner = '', holder = '', expires_at = clock_timestamp()
WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()
RETURNING pg_notify(` + pgcommon.Literal(d.channel) + `, name), set_config('synchronous_commit', 'off', true)`
	cols := `SELECT name, fence, holder, ttl_us,
	greatest(0, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint)
FROM ` + d.table
	d.sqlInspect = cols + ` WHERE name = $1 AND expires_at > clock_timestamp()`
	d.sqlList = cols + ` WHERE name LIKE $1 AND expires_at > clock_timestamp() ORDER BY name`
	d.sqlPrune = `DELETE FROM ` + d.table + ` WHERE expires_at < clock_timestamp() - $1::bigint * interval '1 microsecond'`
}

// DDL returns the statements that Migrate runs (after taking its advisory
// lock and creating the schema when missing), for administrators who create
// the table themselves.
func (d *Driver) DDL() string {
	return `CREATE SEQUENCE IF NOT EXISTS ` + d.seq + ` AS bigint MINVALUE 1;
CREATE TABLE IF NOT EXISTS ` + d.table + ` (
	name        text COLLATE "C" PRIMARY KEY,
	owner       text NOT NULL,
	fence       bigint NOT NULL,
	expires_at  timestamptz NOT NULL,
	ttl_us      bigint NOT NULL,
	holder      text NOT NULL DEFAULT '',
	acquired_at timestamptz NOT NULL
);
`
}

// Migrate creates the schema (when missing), the fence sequence and the lock
// table, if they do not exist. It is safe to run concurrently from many
// processes and to run again.
func (d *Driver) Migrate(ctx context.Context) error {
	if err := pgcommon.MigrateNow(ctx, d.db, d.schema, d.DDL()); err != nil {
		return storeErr("migrate "+d.table, err)
	}
	d.migrated.Store(true)
	return nil
}

// ensure creates the table on first use, once per Driver (retried on the
// next call after a failure).
func (d *Driver) ensure(ctx context.Context) error {
	if d.closed.Load() {
		return driver.ErrClosed
	}
	if d.noMigrate || d.migrated.Load() {
		return nil
	}
	select {
	case d.migrateSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-d.migrateSem }()
	if d.migrated.Load() {
		return nil
	}
	if err := pgcommon.Migrate(ctx, d.db, d.schema, d.DDL(), d.table, d.seq); err != nil {
		return storeErr("migrate "+d.table, err)
	}
	d.migrated.Store(true)
	return nil
}

func micros(ttl time.Duration) int64 { return (ttl + time.Microsecond - 1).Microseconds() }

// TryAcquire implements driver.Driver with one INSERT … ON CONFLICT DO
// UPDATE … WHERE expired statement.
//
// The statement is never abandoned half-way: pgx would close the
// connection, and the server could still commit the grant afterwards, too
// late for the caller's clean-up to release it. So when ctx ends while the
// statement runs, TryAcquire returns ctx's error at once and the statement
// finishes in the background (given at least 5 s, or until ctx's deadline
// when later). Until it has, the owner token is pending: a Release for it
// waits for the outcome first, so the clean-up never misses a grant.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("pgdriver: acquire: %w", err)
	}
	if err := d.ensure(ctx); err != nil {
		return driver.Grant{}, err
	}
	a := &attempt{done: make(chan struct{})}
	d.mu.Lock()
	d.pending[req.Owner] = a
	d.bg.Add(1)
	d.mu.Unlock()
	qctx, cancel := d.detached.Detach(ctx)
	go func() {
		defer d.bg.Done()
		defer cancel()
		a.grant, a.err = d.tryAcquire(qctx, req)
		d.mu.Lock()
		delete(d.pending, req.Owner)
		d.mu.Unlock()
		close(a.done)
	}()
	select {
	case <-a.done:
		return a.grant, a.err
	case <-ctx.Done():
		return driver.Grant{}, ctx.Err()
	}
}

// attempt is an acquisition statement in flight.
type attempt struct {
	done  chan struct{}
	grant driver.Grant
	err   error
}

func (d *Driver) tryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	var (
		fence int64
		sync  string
	)
	err := d.db.QueryRow(ctx, d.sqlAcquire, req.Key, req.Owner, micros(req.TTL), req.Holder).Scan(&fence, &sync)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return driver.Grant{}, driver.ErrNotAcquired
	case err != nil:
		return driver.Grant{}, storeErr("acquire", err)
	case fence <= 0:
		return driver.Grant{}, fmt.Errorf("pgdriver: acquire: sequence %s returned fence %d", d.seq, fence)
	}
	return driver.Grant{Fence: uint64(fence)}, nil
}

// awaitPending waits until no acquisition by owner is in flight.
func (d *Driver) awaitPending(ctx context.Context, owner string) error {
	d.mu.Lock()
	a := d.pending[owner]
	d.mu.Unlock()
	if a == nil {
		return nil
	}
	select {
	case <-a.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Renew implements driver.Driver: an owner-checked UPDATE that extends
// expires_at to the database's clock_timestamp() + ttl.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("pgdriver: renew: %w", err)
	}
	if err := d.ensure(ctx); err != nil {
		return err
	}
	tag, err := d.db.Exec(ctx, d.sqlRenew, key, owner, micros(ttl))
	if err != nil {
		return storeErr("renew", err)
	}
	if tag.RowsAffected() == 0 {
		return driver.ErrLeaseLost
	}
	return nil
}

// Release implements driver.Driver: an owner-checked UPDATE that marks the
// row free and notifies the table's channel.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("pgdriver: release: %w", err)
	}
	if err := d.ensure(ctx); err != nil {
		return err
	}
	if err := d.awaitPending(ctx, owner); err != nil {
		return err
	}
	tag, err := d.db.Exec(ctx, d.sqlRelease, key, owner)
	if err != nil {
		return storeErr("release", err)
	}
	if tag.RowsAffected() == 0 {
		return driver.ErrLeaseLost
	}
	return nil
}

// Close stops the release-hint listener, gives acquisition statements
// still finishing in the background pgcommon.CloseGrace (100 ms) before it
// interrupts them, and closes the pool that Open created, giving each of
// its connections as long again; a DB given to New stays open. So Close
// returns promptly even when the server does not answer (frozen, or the
// network silently dropping packets). Grants stay in the table and expire
// by their TTL. Closing twice returns nil.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		d.closed.Store(true)
		if d.hub != nil {
			d.hub.Close()
		}
		if !pgcommon.WaitGrace(&d.bg, pgcommon.CloseGrace) {
			d.detached.Abort()
			d.bg.Wait()
		}
		if d.ownPool != nil {
			d.conns.Abort(pgcommon.CloseGrace)
			d.ownPool.Close()
		}
	})
	return nil
}

// Hint implements driver.Hinter with LISTEN on the table's channel. It
// returns errors.ErrUnsupported when the driver has no connection config
// to listen with (see Options.ListenConfig).
func (d *Driver) Hint(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if d.closed.Load() {
		return nil, nil, driver.ErrClosed
	}
	if err := driver.CheckKey(key); err != nil {
		return nil, nil, fmt.Errorf("pgdriver: hint: %w", err)
	}
	if d.hub == nil {
		return nil, nil, fmt.Errorf("pgdriver: release hints need Options.ListenConfig: %w", errors.ErrUnsupported)
	}
	ch, stop, err := d.hub.Subscribe(key)
	if err != nil {
		return nil, nil, driver.ErrClosed
	}
	return ch, stop, nil
}

func scanHolder(row pgx.Row) (driver.HolderInfo, error) {
	var (
		info             driver.HolderInfo
		fence, ttl, left int64
	)
	if err := row.Scan(&info.Key, &fence, &info.Holder, &ttl, &left); err != nil {
		return driver.HolderInfo{}, err
	}
	info.Fence = uint64(fence)
	info.TTL = time.Duration(ttl) * time.Microsecond
	info.Remaining = time.Duration(left) * time.Microsecond
	info.Waiters = -1
	return info, nil
}

// Inspect implements driver.Inspector. Remaining is measured by the
// database clock; Waiters is -1 (polling waiters are not recorded).
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("pgdriver: inspect: %w", err)
	}
	if err := d.ensure(ctx); err != nil {
		return driver.HolderInfo{}, err
	}
	info, err := scanHolder(d.db.QueryRow(ctx, d.sqlInspect, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.HolderInfo{}, fmt.Errorf("pgdriver: inspect %q: %w", key, driver.ErrNotAcquired)
	}
	if err != nil {
		return driver.HolderInfo{}, storeErr("inspect", err)
	}
	return info, nil
}

// List implements driver.Inspector: the unexpired grants whose key starts
// with prefix, sorted by key bytes.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	if err := d.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := d.db.Query(ctx, d.sqlList, pgcommon.LikePrefix(prefix))
	if err != nil {
		return nil, storeErr("list", err)
	}
	defer rows.Close()
	var out []driver.HolderInfo
	for rows.Next() {
		info, err := scanHolder(rows)
		if err != nil {
			return nil, storeErr("list", err)
		}
		out = append(out, info)
	}
	if err := rows.Err(); err != nil {
		return nil, storeErr("list", err)
	}
	return out, nil
}

// Prune deletes the rows of keys that have been free (released, or expired
// and not taken) for longer than idle, and returns how many it deleted.
// Keep idle well above any statement stall you expect (a minute or more):
// see "Safety assumptions".
func (d *Driver) Prune(ctx context.Context, idle time.Duration) (int64, error) {
	if idle < 0 {
		return 0, fmt.Errorf("pgdriver: prune: negative idle time %v", idle)
	}
	if err := d.ensure(ctx); err != nil {
		return 0, err
	}
	tag, err := d.db.Exec(ctx, d.sqlPrune, idle.Microseconds())
	if err != nil {
		return 0, storeErr("prune", err)
	}
	return tag.RowsAffected(), nil
}
