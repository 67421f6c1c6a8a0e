// Package pgadvisory is the dlock driver for PostgreSQL session advisory
// locks: a grant is pg_try_advisory_lock held by a dedicated connection for
// the life of the lease, and the lease ends the moment that session does.
//
//	locker, err := dlock.Open(ctx, "pgadvisory://app@db:5432/app?dlock_schema=locks")
//
// or, with a pool you already have (the driver never closes it):
//
//	d, err := pgadvisory.New(pool, nil)
//	locker := dlock.New(d)
//
// # How it works
//
// Each key maps to a 64-bit advisory lock id (Driver.LockID): the first 8
// bytes of SHA-256("dlock:" + key), read as a big-endian int64 (LockID), for
// the default key table; for any other key table the hash also covers the
// table's qualified name, so each key table has its own ids. An
// acquisition takes a connection from the pool and runs one statement on it
// that calls pg_try_advisory_lock(id) and, only when that succeeded, writes
// the key, owner token, holder, backend pid and a fence drawn from a
// sequence into a small key table (default "dlock_advisory"), and sets the
// session's idle_session_timeout to the TTL. The connection then stays out
// of the pool, idle, until the lease is released.
//
//   - Renewal is a query on that connection: it checks in pg_locks that
//     the session still holds the lock, and resets idle_session_timeout.
//   - Release runs pg_advisory_unlock and deletes the key row on that
//     connection, restores idle_session_timeout, and returns the connection
//     to the pool. The unlock takes effect at once (advisory locks are not
//     transactional); the row's deletion commits asynchronously
//     (synchronous_commit = off for that transaction), since a crash that
//     undid it would leave only a stale row, which Inspect ignores.
//   - The store owns expiry: a session that sends nothing for a TTL (a
//     client stopped, paused or partitioned past its TTL) is terminated by
//     the server's idle_session_timeout, which releases the lock. This needs
//     PostgreSQL 14 or later.
//   - Loss is pushed: a goroutine per lease blocks reading the idle
//     connection, so the moment the session ends (terminated by an
//     administrator, by idle_session_timeout, by a server restart) Grant.Lost
//     closes and the root package cancels the lease at once. A network that
//     drops packets silently is noticed only when TCP gives up; until then
//     the renewals fail and the root package's validity deadline ends the
//     lease, while the server ends the idle session by its timeout. The
//     goroutine ends when the lease is released or lost.
//
// Each held lease occupies one pool connection: the pool's MaxConns
// (pool_max_conns in the URL; Open defaults it to 64) bounds the number of
// leases a Driver can hold at once, and the server's max_connections bounds
// all of them. An acquisition that cannot get a connection before its
// context ends fails as unavailable.
//
// # Capabilities
//
//   - Grant.Lost: pushed loss of the session, as described above.
//   - driver.Inspector: Inspect and List read the key table joined with
//     pg_locks, so only locks that are really held are reported.
//   - driver.Hinter: release runs pg_notify on the key table's channel;
//     LISTEN wakes a polling Acquire early. Waiting is backoff polling
//     (there is no driver.Waiter).
//   - No driver.Resumer (dlock's Locker.Resume answers ErrUnsupported): an
//     advisory lock belongs to the database session that took it and ends
//     with it, and no other connection can renew or release it, so a grant
//     can never outlive the process that made it. Use the lease table
//     (pgdriver, postgres://) for leases a restarted process resumes.
//
// # Safety assumptions
//
//   - Session locks need sessions. A transaction-pooling proxy (PgBouncer
//     in pool_mode = transaction or statement, and similar proxies) hands
//     each statement to any server session: the lock is taken in one
//     session and checked or released in another, and idle_session_timeout
//     kills sessions the proxy shares. Connect directly to PostgreSQL, or
//     through a proxy in session mode.
//   - Advisory lock ids belong to the database, not to a schema. Drivers
//     with different key tables (Options.Schema or Options.Table) are
//     independent all the same, because a key's id depends on its table
//     (Driver.LockID): the key "k" of schema "a" and the key "k" of schema
//     "b" are two locks, each with its own fences. Drivers that must
//     exclude each other must use the same schema and table.
//   - Hash collisions: two different keys (of one key table or of two) can
//     map to the same lock id (for n keys in use at once, the chance is
//     about n²/2⁶⁵), and other code taking advisory locks in the same
//     database shares the id space. They never share a grant silently: the
//     second key simply finds the id held; TryAcquire reports
//     ErrNotAcquired (naming the key that holds the id when the holder is
//     in the same key table), and Inspect reports the key held, by the
//     holder's backend pid, rather than free. The two keys then exclude
//     each other, which is safe but may surprise.
//   - Fences come from a sequence drawn after the lock is held, in the same
//     statement, so a key's fences increase in grant order. They are as
//     durable as the commit of that statement, which waits for the WAL
//     flush (the statement raises synchronous_commit from off to on for its
//     own transaction). See pgdriver for replicas and failover; session
//     locks do not survive a failover at all, so every lease is lost, as it
//     should be.
//   - The database server's timer decides expiry (idle_session_timeout);
//     the client's wall clock is never used.
//
// # Upgrading from versions with one id space per database
//
// Earlier versions took the id SHA-256("dlock:" + key) whatever the key
// table, so drivers on different schemas contended for the same keys (and
// Inspect in one schema said "free" for a key held in another). The default
// key table ("public"."dlock_advisory") keeps exactly those ids, so its
// clients upgrade one by one, old and new side by side, with nothing to do.
// Any other key table gets new ids: old and new clients of it do not
// exclude each other, so they must not run side by side; stop every old
// client of that table (or wait until it holds no lease) before starting
// new ones. Its rows of the old ids stay in the key table, never reported
// (their sessions hold no lock), until deleted (DELETE FROM the key table
// WHERE pid NOT IN (SELECT pid FROM pg_stat_activity) removes them and any
// other row of a dead session). Fences come from the table's own sequence
// and keep increasing across the upgrade.
//
// # Measured guarantees
//
// This store is not yet in the dlock verify matrix (docs/GUARANTEES.md): no
// fault has been measured on it; dlock verify --store with its URL runs the
// client faults (pause, clock-jump) against a server you run, and the link
// faults (blackhole, reply-loss) where the URL's host is the server's
// address.
package pgadvisory

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/pgcommon"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

func init() {
	driver.Register("pgadvisory", openURL)
}

// Pool is what the driver needs from a connection pool: dedicated
// connections, one per held lease, that go back to the pool on release.
// *pgxpool.Pool implements it. Its connections must reach the primary
// directly (not through a transaction-pooling proxy).
type Pool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Default names of the key table and the schema.
const (
	DefaultSchema = "public"
	DefaultTable  = "dlock_advisory"
)

// DefaultMaxConns is the pool size Open uses when the URL has no
// pool_max_conns: the number of leases one Driver can hold at once.
const DefaultMaxConns = 64

// Options configure a Driver. A nil *Options is the zero value.
type Options struct {
	// Schema is the schema of the key table and its fence sequence. It is
	// created on first use when missing. Zero value: "public".
	Schema string
	// Table is the key table's name; its sequence is Table + "_fence_seq".
	// Zero value: "dlock_advisory".
	Table string
	// NoMigrate skips creating the key table and sequence on first use: run
	// Migrate beforehand. Zero value: create them on first use when missing.
	NoMigrate bool
	// ListenConfig is the connection config of the LISTEN connection that
	// receives release hints; it must come from pgx.ParseConfig. Zero
	// value: the pool's config when the Pool is a *pgxpool.Pool, otherwise
	// hints are off.
	ListenConfig *pgx.ConnConfig
}

// LockID returns the advisory lock id of key in the default key table
// ("public"."dlock_advisory"), which is also the id of every key table in
// earlier versions: the first 8 bytes of SHA-256("dlock:" + key), as a
// big-endian int64. pg_locks shows it as classid (high 32 bits) and objid
// (low 32 bits) with objsubid 1. Driver.LockID gives a driver's own ids.
func LockID(key string) int64 {
	sum := sha256.Sum256([]byte("dlock:" + key))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// Driver is a dlock driver over PostgreSQL session advisory locks. It
// implements driver.Driver, driver.Inspector and driver.Hinter, sets
// Grant.Lost, and is safe for concurrent use.
type Driver struct {
	pool    Pool
	ownPool *pgxpool.Pool
	conns   *pgcommon.ConnTracker // ownPool's sockets, cut short by Close
	schema  string
	table   string // qualified, quoted
	seq     string
	index   string
	hub     *pgcommon.Hub

	noMigrate  bool
	migrated   atomic.Bool
	migrateSem chan struct{}

	mu       sync.Mutex
	sessions map[string]*session // held, by owner token
	pending  map[string]*attempt // acquisitions in flight, by owner token
	closed   bool
	watchers sync.WaitGroup
	bg       sync.WaitGroup // detached acquisitions and renewals still running
	detached pgcommon.Detacher

	sqlAcquire, sqlRenew, sqlRelease, sqlInspect, sqlList string
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)
	_ driver.Hinter    = (*Driver)(nil)
)

// New returns a driver that takes its dedicated connections from pool. It
// does no I/O: the key table is created on first use (see
// Options.NoMigrate). Close does not close pool. It returns an error when
// Options name an invalid schema or table.
func New(pool Pool, opts *Options) (*Driver, error) {
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
	for kind, name := range map[string]string{"schema": o.Schema, "table": o.Table, "sequence": o.Table + "_fence_seq", "index": o.Table + "_key_idx"} {
		if err := pgcommon.ValidateName(kind, name); err != nil {
			return nil, urlparam.Wrap("pgadvisory", err)
		}
	}
	d := &Driver{
		pool:       pool,
		schema:     o.Schema,
		table:      pgcommon.Ident(o.Schema, o.Table),
		seq:        pgcommon.Ident(o.Schema, o.Table+"_fence_seq"),
		index:      pgcommon.Ident(o.Table + "_key_idx"),
		noMigrate:  o.NoMigrate,
		migrateSem: make(chan struct{}, 1),
		sessions:   map[string]*session{},
		pending:    map[string]*attempt{},
	}
	channel := pgcommon.Channel(d.table)
	cfg := o.ListenConfig
	if cfg == nil {
		if p, ok := pool.(interface{ Config() *pgxpool.Config }); ok {
			cfg = p.Config().ConnConfig
		}
	}
	if cfg != nil {
		d.hub = pgcommon.NewHub(cfg.Copy(), channel)
	}
	d.buildSQL(channel)
	return d, nil
}

// Open opens a driver on a pgadvisory URL, pgadvisory://user@host:port/db?…,
// which is a postgres:// URL under another scheme (pgx and pgxpool
// parameters included; pool_max_conns defaults to DefaultMaxConns), with
// its own pool that Close closes. The dlock parameters dlock_schema and
// dlock_table set Options.Schema and Options.Table. It pings the database
// and returns an error wrapping driver.ErrUnavailable when it cannot be
// reached.
//
// The host follows libpq, as pgx reads it: an empty host (pgadvisory://u@/db,
// pgadvisory://u@:5432/db) is not a default address but PGHOST, else the local
// Unix socket, as for psql; the port defaults to PGPORT, else 5432. A
// "host:" with an empty port is an invalid URL.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, urlparam.Wrap("pgadvisory", err)
	}
	return open(ctx, u)
}

func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) { return open(ctx, u) }

func open(ctx context.Context, u *url.URL) (*Driver, error) {
	if u.Scheme != "pgadvisory" {
		return nil, urlparam.Invalid("pgadvisory: URL scheme %q is not pgadvisory", u.Scheme)
	}
	if err := urlparam.Ports("pgadvisory", u.Host); err != nil {
		return nil, err
	}
	pu := *u
	pu.Scheme = "postgres"
	if !pu.Query().Has("pool_max_conns") {
		q := pu.Query()
		q.Set("pool_max_conns", strconv.Itoa(DefaultMaxConns))
		pu.RawQuery = q.Encode()
	}
	pgURL, params := pgcommon.TakeParams(&pu, "dlock_schema", "dlock_table")
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		return nil, urlparam.Wrap("pgadvisory", err)
	}
	conns := pgcommon.NewConnTracker()
	cfg.ConnConfig.DialFunc = conns.Wrap(cfg.ConnConfig.DialFunc)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgadvisory: %w", err)
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
			return nil, urlparam.Wrap("pgadvisory: PostgreSQL refused the connection", err)
		}
		return nil, fmt.Errorf("pgadvisory: %w: %w", driver.ErrUnavailable, err)
	}
	return d, nil
}

// storeErr wraps an error of op. An answer in which PostgreSQL refused the
// request itself (see pgcommon.Refused) matches driver.ErrInvalidArgument:
// retrying cannot help, and it must never pass for an outage.
func storeErr(op string, err error) error {
	if pgcommon.Refused(err) {
		return urlparam.Wrap("pgadvisory: "+op+": PostgreSQL refused the request", err)
	}
	return fmt.Errorf("pgadvisory: %s: %w", op, err)
}

func (d *Driver) buildSQL(channel string) {
	// $1 lock id, $2 key, $3 owner, $4 holder, $5 ttl_us, $6 idle_session_timeout.
	// The CTE l is evaluated once, before anything else; the insert and
	// its nextval run only when the lock was taken. When it was not, the
	// last column names the key that holds the id (a hash collision when
	// it differs from $2).
	d.sqlAcquire = `WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock($1::bigint) AS ok),
ins AS (
	INSERT INTO ` + d.table + ` AS k (lock_id, key, owner, fence, holder, ttl_us, pid, acquired_at)
	SELECT $1, $2, $3, nextval(` + pgcommon.Literal(d.seq) + `), $4, $5, pg_backend_pid(), clock_timestamp() FROM l WHERE l.ok
	ON CONFLICT (lock_id) DO UPDATE SET key = EXCLUDED.key, owner = EXCLUDED.owner, fence = EXCLUDED.fence,
		holder = EXCLUDED.holder, ttl_us = EXCLUDED.ttl_us, pid = EXCLUDED.pid, acquired_at = EXCLUDED.acquired_at
	RETURNING fence, set_config('idle_session_timeout', $6, false) AS timeout, ` + pgcommon.SyncCommitOn + ` AS sync
)
SELECT (SELECT ok FROM l), (SELECT fence FROM ins), (SELECT key FROM ` + d.table + ` WHERE lock_id = $1)`
	// $1 idle_session_timeout, $2 classid, $3 objid.
	d.sqlRenew = `SELECT set_config('idle_session_timeout', $1, false) IS NOT NULL AND EXISTS (
	SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
		AND classid = $2::bigint::oid AND objid = $3::bigint::oid AND objsubid = 1)`
	// $1 lock id, $2 owner.
	d.sqlRelease = `WITH d AS (DELETE FROM ` + d.table + ` WHERE lock_id = $1 AND owner = $2 RETURNING key)
SELECT pg_advisory_unlock($1::bigint),
	set_config('idle_session_timeout', (SELECT reset_val FROM pg_settings WHERE name = 'idle_session_timeout'), false),
	(SELECT count(*) FROM (SELECT pg_notify(` + pgcommon.Literal(channel) + `, key) FROM d) n),
	set_config('synchronous_commit', 'off', true)`
	// Rows of sessions that died without releasing stay in the table until
	// the id is taken again: join pg_locks to report only real holders.
	held := `EXISTS (SELECT 1 FROM pg_locks p WHERE p.locktype = 'advisory' AND p.granted AND p.pid = k.pid
		AND p.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND p.classid = ((k.lock_id >> 32) & 4294967295)::oid AND p.objid = (k.lock_id & 4294967295)::oid AND p.objsubid = 1)`
	// Remaining: idle_session_timeout counts from the end of the session's
	// last statement, which pg_stat_activity.state_change shows (NULL when
	// the role may not see other sessions: Remaining is then 0, unknown).
	row := `k.key, k.fence, k.holder, k.ttl_us,
	coalesce(CASE WHEN a.state = 'idle' THEN greatest(0, k.ttl_us - (extract(epoch FROM clock_timestamp() - a.state_change) * 1000000)::bigint) ELSE k.ttl_us END, 0)`
	cols := `SELECT ` + row + `
FROM ` + d.table + ` k LEFT JOIN pg_stat_activity a ON a.pid = k.pid`
	d.sqlInspect = d.inspectSQL(row)
	d.sqlList = cols + ` WHERE k.key LIKE $1 AND ` + held + ` ORDER BY k.key`
}

// DDL returns the statements that Migrate runs (after taking its advisory
// lock and creating the schema when missing).
func (d *Driver) DDL() string {
	return `CREATE SEQUENCE IF NOT EXISTS ` + d.seq + ` AS bigint MINVALUE 1;
CREATE TABLE IF NOT EXISTS ` + d.table + ` (
	lock_id     bigint PRIMARY KEY,
	key         text COLLATE "C" NOT NULL,
	owner       text NOT NULL,
	fence       bigint NOT NULL,
	holder      text NOT NULL DEFAULT '',
	ttl_us      bigint NOT NULL,
	pid         integer NOT NULL,
	acquired_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS ` + d.index + ` ON ` + d.table + ` (key);
`
}

// Migrate creates the schema (when missing), the fence sequence and the key
// table, if they do not exist. It is safe to run concurrently and again.
func (d *Driver) Migrate(ctx context.Context) error {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return storeErr("migrate", err)
	}
	defer c.Release()
	if err := pgcommon.MigrateNow(ctx, c, d.schema, d.DDL()); err != nil {
		return storeErr("migrate "+d.table, err)
	}
	d.migrated.Store(true)
	return nil
}

func (d *Driver) ensure(ctx context.Context, c *pgxpool.Conn) error {
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
	if err := pgcommon.Migrate(ctx, c, d.schema, d.DDL(), d.table, d.seq); err != nil {
		return storeErr("migrate "+d.table, err)
	}
	d.migrated.Store(true)
	return nil
}

func (d *Driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// timeoutSetting renders ttl for idle_session_timeout, rounded up to whole
// milliseconds so that the server never expires a session early.
func timeoutSetting(ttl time.Duration) string {
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	return strconv.FormatInt(int64(ms), 10) + "ms"
}

// TryAcquire implements driver.Driver: one statement on a connection taken
// from the pool, kept for the lease when the lock was granted.
//
// Abandoning the statement half-way would close the connection, and the
// server would drop a lock it may have granted only when it notices, some
// time later. So the statement is not abandoned: when ctx ends while it
// runs, TryAcquire returns ctx's error at once and the statement finishes
// in the background (given at least 5 s, or until ctx's deadline when
// later). Until it has, the owner token is pending: a Release for it waits
// for the outcome and then releases whatever was granted, so nothing is
// left behind.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if d.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	if err := driver.CheckRequest(req); err != nil {
		return driver.Grant{}, fmt.Errorf("pgadvisory: acquire: %w", err)
	}
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return driver.Grant{}, storeErr("acquire: connection", err)
	}
	if err := d.ensure(ctx, c); err != nil {
		c.Release()
		return driver.Grant{}, err
	}
	a := &attempt{done: make(chan struct{})}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		c.Release()
		return driver.Grant{}, driver.ErrClosed
	}
	d.pending[req.Owner] = a
	d.bg.Add(1)
	d.mu.Unlock()
	qctx, cancel := d.detached.Detach(ctx)
	go func() {
		defer d.bg.Done()
		defer cancel()
		a.grant, a.err = d.tryAcquire(qctx, c, req)
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

func (d *Driver) tryAcquire(ctx context.Context, c *pgxpool.Conn, req driver.AcquireRequest) (driver.Grant, error) {
	id := d.LockID(req.Key)
	var (
		ok     bool
		fence  *int64
		holder *string
	)
	err := c.QueryRow(ctx, d.sqlAcquire, id, req.Key, req.Owner, req.Holder, req.TTL.Microseconds(), timeoutSetting(req.TTL)).
		Scan(&ok, &fence, &holder)
	if err != nil {
		// The lock may have been taken before the error.
		dropLocks(c)
		return driver.Grant{}, storeErr("acquire", err)
	}
	if !ok {
		c.Release()
		if holder != nil && *holder != req.Key {
			return driver.Grant{}, fmt.Errorf("%w: advisory lock id %d of key %q is held, last by key %q (a hash collision if that key still holds it)",
				driver.ErrNotAcquired, id, req.Key, *holder)
		}
		return driver.Grant{}, driver.ErrNotAcquired
	}
	if fence == nil || *fence <= 0 {
		destroy(c)
		return driver.Grant{}, fmt.Errorf("pgadvisory: acquire: no fence from %s", d.seq)
	}
	s := newSession(d, c, req.Key, req.Owner, id)
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		destroy(c)
		return driver.Grant{}, driver.ErrClosed
	}
	d.sessions[req.Owner] = s
	d.watchers.Add(1)
	d.mu.Unlock()
	go s.watch()
	return driver.Grant{Fence: uint64(*fence), Lost: s.lost}, nil
}

// session returns the held session of owner on key, after waiting for an
// acquisition of owner still in flight. It returns nil when owner holds
// nothing (or ctx ended first).
func (d *Driver) session(ctx context.Context, key, owner string) *session {
	d.mu.Lock()
	a := d.pending[owner]
	d.mu.Unlock()
	if a != nil {
		select {
		case <-a.done:
		case <-ctx.Done():
			return nil
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sessions[owner]
	if s == nil || s.key != key {
		return nil
	}
	return s
}

func (d *Driver) forget(s *session) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sessions[s.owner] == s {
		delete(d.sessions, s.owner)
	}
}

// Renew implements driver.Driver: on the lease's connection, it checks in
// pg_locks that the session still holds the lock and resets its
// idle_session_timeout to ttl. A dead connection, or any failure on it, is
// ErrLeaseLost: the session is closed, which drops the lock.
//
// Abandoning a query half-way closes the connection, so when ctx is
// cancelled while the query runs, Renew returns ctx's error at once but
// lets the query finish in the background (for at least 5 s, or until
// ctx's deadline when later); a Release that follows waits for it.
func (d *Driver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := driver.CheckGrant(key, owner, ttl); err != nil {
		return fmt.Errorf("pgadvisory: renew: %w", err)
	}
	s := d.session(ctx, key, owner)
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil {
		return driver.ErrLeaseLost
	}
	qctx, cancel := d.detached.Detach(ctx)
	result := make(chan error, 1)
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		defer cancel()
		result <- s.renew(qctx, ttl)
	}()
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Release implements driver.Driver: pg_advisory_unlock on the lease's
// connection, which then goes back to the pool. It returns ErrLeaseLost
// when the session was already gone; on any other failure the connection is
// closed (which drops the lock on the server) and the error returned.
func (d *Driver) Release(ctx context.Context, key, owner string) error {
	if err := driver.CheckOwned(key, owner); err != nil {
		return fmt.Errorf("pgadvisory: release: %w", err)
	}
	s := d.session(ctx, key, owner)
	if s == nil {
		if err := ctx.Err(); err != nil {
			return err
		}
		return driver.ErrLeaseLost
	}
	return s.release(ctx)
}

// Close closes the connection of every lease still held, which ends their
// sessions and so releases their locks (advisory locks cannot outlive a
// session), stops the hint listener, waits for the per-lease goroutines,
// and closes the pool that Open created. Every step that waits for the
// server gives it pgcommon.CloseGrace (100 ms) and then closes the socket
// instead, so Close returns promptly even when the server does not answer;
// a closed session releases its locks all the same. Closing twice returns
// nil.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	sessions := make([]*session, 0, len(d.sessions))
	for _, s := range d.sessions {
		sessions = append(sessions, s)
	}
	d.mu.Unlock()
	var kills sync.WaitGroup
	for _, s := range sessions {
		kills.Add(1)
		go func() {
			defer kills.Done()
			s.kill()
		}()
	}
	kills.Wait()
	if !pgcommon.WaitGrace(&d.bg, pgcommon.CloseGrace) {
		d.detached.Abort()
		d.bg.Wait()
	}
	d.watchers.Wait()
	if d.hub != nil {
		d.hub.Close()
	}
	if d.ownPool != nil {
		d.conns.Abort(pgcommon.CloseGrace)
		d.ownPool.Close()
	}
	return nil
}

// Hint implements driver.Hinter with LISTEN on the key table's channel. It
// returns errors.ErrUnsupported when the driver has no connection config
// to listen with (see Options.ListenConfig).
func (d *Driver) Hint(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if d.isClosed() {
		return nil, nil, driver.ErrClosed
	}
	if err := driver.CheckKey(key); err != nil {
		return nil, nil, fmt.Errorf("pgadvisory: hint: %w", err)
	}
	if d.hub == nil {
		return nil, nil, fmt.Errorf("pgadvisory: release hints need Options.ListenConfig: %w", errors.ErrUnsupported)
	}
	ch, stop, err := d.hub.Subscribe(key)
	if err != nil {
		return nil, nil, driver.ErrClosed
	}
	return ch, stop, nil
}

func (d *Driver) query(ctx context.Context, fn func(c *pgxpool.Conn) error) error {
	if d.isClosed() {
		return driver.ErrClosed
	}
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	if err := d.ensure(ctx, c); err != nil {
		return err
	}
	return fn(c)
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

// Inspect implements driver.Inspector. Remaining is the server's
// idle_session_timeout left on the holder's session (0 when the role may
// not see that session in pg_stat_activity); Waiters is -1. It returns
// driver.ErrNotAcquired only when no session holds key's lock id
// (d.LockID), so never for a key that TryAcquire would refuse: when the id
// is held by a session without a grant of key in this key table (a hash
// collision, another key table or schema, an earlier dlock version during
// an upgrade, other code taking advisory locks), it returns a HolderInfo
// with Fence 0, TTL 0 and a Holder that names that session's backend pid.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	if err := driver.CheckKey(key); err != nil {
		return driver.HolderInfo{}, fmt.Errorf("pgadvisory: inspect: %w", err)
	}
	var info driver.HolderInfo
	err := d.query(ctx, func(c *pgxpool.Conn) error {
		var err error
		info, err = d.inspect(ctx, c, key)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.HolderInfo{}, fmt.Errorf("pgadvisory: inspect %q: %w", key, driver.ErrNotAcquired)
	}
	if err != nil {
		return driver.HolderInfo{}, storeErr("inspect", err)
	}
	return info, nil
}

// List implements driver.Inspector: the held keys that start with prefix,
// sorted by key bytes.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	var out []driver.HolderInfo
	err := d.query(ctx, func(c *pgxpool.Conn) error {
		rows, err := c.Query(ctx, d.sqlList, pgcommon.LikePrefix(prefix))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			info, err := scanHolder(rows)
			if err != nil {
				return err
			}
			out = append(out, info)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, storeErr("list", err)
	}
	return out, nil
}

// dropLocks releases every advisory lock of the connection's session and
// returns it to the pool; when the connection is broken or does not answer
// within a second, it is closed instead (which drops the locks on the
// server as soon as the server notices).
func dropLocks(c *pgxpool.Conn) {
	if !c.Conn().IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Exec(ctx, "SELECT pg_advisory_unlock_all()")
		cancel()
		if err == nil {
			c.Release()
			return
		}
	}
	destroy(c)
}

// destroy closes a pooled connection's session and hands the dead
// connection back, so the pool drops it.
func destroy(c *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Conn().Close(ctx)
	c.Release()
}
