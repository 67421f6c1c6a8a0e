package pgdriver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/pgdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the dlock conformance suite against a real
// PostgreSQL, each driver opened by URL with its own pool, as a process
// would.
func TestConformance(t *testing.T) {
	pg := testservers.StartPostgres(t)
	// Frozen: SIGSTOP of the postmaster's process group, every backend
	// included.
	freezer := testservers.NewFreezer(t, func() []int { return []int{pg.PID()} })
	dlocktest.Run(t, dlocktest.Harness{
		Name: "postgres",
		NewDriver: func(ctx context.Context) (driver.Driver, error) {
			return pgdriver.Open(ctx, pg.URL())
		},
		StopStore:   pg.Stop,
		StartStore:  pg.Start,
		FreezeStore: freezer.Freeze,
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return pgdriver.Open(ctx, strings.Replace(pg.URL(), pg.Addr(), via(pg.Addr()), 1))
		},
		TTL: 500 * time.Millisecond,
	})
}

// The focused tests below check what the suite cannot see from outside: the
// statements, the schema, the sequence.

// awaitListening waits until a backend of pg has run LISTEN and is idle,
// waiting for notifications: the release-hint listener is up. It queries
// pg_stat_activity over a connection of its own.
func awaitListening(t *testing.T, pg *testservers.Postgres) {
	t.Helper()
	awaitActivity(t, pg, "a backend idle after LISTEN", `SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND query LIKE 'LISTEN %'`)
}

// awaitActivity waits (at most 10 s) until the query, a count, answers at
// least 1.
func awaitActivity(t *testing.T, pg *testservers.Postgres, what, query string, args ...any) {
	t.Helper()
	c, err := pgx.Connect(t.Context(), pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.WithoutCancel(t.Context()))
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := c.QueryRow(t.Context(), query, args...).Scan(&n); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newPool(t *testing.T, pg *testservers.Postgres) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newDriver(t *testing.T, pool *pgxpool.Pool, opts *pgdriver.Options) *pgdriver.Driver {
	t.Helper()
	d, err := pgdriver.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// plainDB hides everything of a pool but the DB methods.
type plainDB struct{ p *pgxpool.Pool }

func (db plainDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return db.p.Exec(ctx, sql, args...)
}

func (db plainDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return db.p.Query(ctx, sql, args...)
}

func (db plainDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return db.p.QueryRow(ctx, sql, args...)
}

func req(key, owner string, ttl time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl, Holder: "test " + owner}
}

func mustGrant(t *testing.T, d driver.Driver, r driver.AcquireRequest) driver.Grant {
	t.Helper()
	g, err := d.TryAcquire(t.Context(), r)
	if err != nil {
		t.Fatalf("TryAcquire(%q, %s): %v", r.Key, r.Owner, err)
	}
	if g.Fence == 0 {
		t.Fatal("fence 0")
	}
	return g
}

func TestDriver_FenceFromSequenceSurvivesCrash(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	a := newDriver(t, pool, nil)
	var last uint64
	for i := range 10 {
		owner := fmt.Sprintf("owner-%02d-0123456789abcdef", i)
		g := mustGrant(t, a, req("k", owner, time.Second))
		if g.Fence <= last {
			t.Fatalf("grant %d: fence %d not greater than %d", i, g.Fence, last)
		}
		last = g.Fence
		if err := a.Release(t.Context(), "k", owner); err != nil {
			t.Fatal(err)
		}
	}
	var seq int64
	if err := pool.QueryRow(t.Context(), "SELECT last_value FROM dlock_locks_fence_seq").Scan(&seq); err != nil {
		t.Fatal(err)
	}
	if uint64(seq) < last {
		t.Fatalf("sequence at %d, below the last fence %d", seq, last)
	}
	// A crash (SIGQUIT, no checkpoint) and crash recovery: the next fence is
	// still greater.
	pg.Kill()
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	pool2 := newPool(t, pg)
	b := newDriver(t, pool2, nil)
	// Releases commit asynchronously: the crash may have undone the last
	// one, and then the key is free only when its 1 s TTL has run out.
	var g driver.Grant
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		g, err = b.TryAcquire(t.Context(), req("k", "after-crash-0123456789abcdef", time.Minute))
		if !errors.Is(err, driver.ErrNotAcquired) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("TryAcquire after the crash: %v", err)
	}
	if g.Fence <= last {
		t.Fatalf("fence %d after a crash is not greater than %d", g.Fence, last)
	}
}

func TestDriver_ExpiryByDatabaseClockLetsSecondOwnerIn(t *testing.T) {
	pg := testservers.StartPostgres(t)
	a := newDriver(t, newPool(t, pg), nil)
	b := newDriver(t, newPool(t, pg), nil)
	const ttl = 300 * time.Millisecond
	ga := mustGrant(t, a, req("k", "owner-a-0123456789abcdef", ttl))
	if _, err := b.TryAcquire(t.Context(), req("k", "owner-b-0123456789abcdef", ttl)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("second owner before expiry: %v, want ErrNotAcquired", err)
	}
	info, err := a.Inspect(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if info.Fence != ga.Fence || info.TTL != ttl || info.Remaining <= 0 || info.Remaining > ttl || info.Holder != "test owner-a-0123456789abcdef" {
		t.Fatalf("Inspect = %+v", info)
	}
	time.Sleep(ttl + 100*time.Millisecond)
	if err := a.Renew(t.Context(), "k", "owner-a-0123456789abcdef", ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after expiry = %v, want ErrLeaseLost", err)
	}
	gb := mustGrant(t, b, req("k", "owner-b-0123456789abcdef", time.Minute))
	if gb.Fence <= ga.Fence {
		t.Fatalf("B's fence %d not greater than A's %d", gb.Fence, ga.Fence)
	}
	if err := a.Release(t.Context(), "k", "owner-a-0123456789abcdef"); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("A's late Release = %v, want ErrLeaseLost", err)
	}
	if info, err := a.Inspect(t.Context(), "k"); err != nil || info.Fence != gb.Fence {
		t.Fatalf("after A's late release: Inspect = %+v, %v; want B's grant", info, err)
	}
}

func TestDriver_RenewAndReleaseAreOwnerChecked(t *testing.T) {
	pg := testservers.StartPostgres(t)
	d := newDriver(t, newPool(t, pg), nil)
	const owner, other = "owner-0123456789abcdef", "other-0123456789abcdef"
	g := mustGrant(t, d, req("k", owner, time.Minute))
	if err := d.Renew(t.Context(), "k", other, time.Minute); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew by another owner = %v, want ErrLeaseLost", err)
	}
	if err := d.Release(t.Context(), "k", other); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Release by another owner = %v, want ErrLeaseLost", err)
	}
	if err := d.Renew(t.Context(), "missing", owner, time.Minute); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew of a key never held = %v, want ErrLeaseLost", err)
	}
	if info, err := d.Inspect(t.Context(), "k"); err != nil || info.Fence != g.Fence {
		t.Fatalf("grant changed by another owner: %+v, %v", info, err)
	}
	if err := d.Renew(t.Context(), "k", owner, time.Minute); err != nil {
		t.Fatalf("Renew by the owner: %v", err)
	}
	if err := d.Release(t.Context(), "k", owner); err != nil {
		t.Fatalf("Release by the owner: %v", err)
	}
	if err := d.Release(t.Context(), "k", owner); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second Release = %v, want ErrLeaseLost", err)
	}
	if err := d.Renew(t.Context(), "k", owner, time.Minute); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after Release = %v, want ErrLeaseLost", err)
	}
	if _, err := d.Inspect(t.Context(), "k"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect of a released key = %v, want ErrNotAcquired", err)
	}
}

func TestDriver_SchemaOption(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	const schema = `Odd "schema" name`
	d := newDriver(t, pool, &pgdriver.Options{Schema: schema, Table: "Locks"})
	mustGrant(t, d, req("k", "owner-0123456789abcdef", time.Minute))

	// The URL parameter does the same, and is not passed on to pgx.
	u, err := pgdriver.Open(t.Context(), pg.URL()+"&dlock_schema=url_schema&dlock_table=url_locks")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	mustGrant(t, u, req("k", "owner-0123456789abcdef", time.Minute)) // another table: not held there

	for _, tc := range []struct{ schema, table string }{{schema, "Locks"}, {"url_schema", "url_locks"}} {
		var n int
		err := pool.QueryRow(t.Context(), "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name = $2", tc.schema, tc.table).Scan(&n)
		if err != nil || n != 1 {
			t.Fatalf("table %s.%s: count %d, %v", tc.schema, tc.table, n, err)
		}
	}
	var public bool
	if err := pool.QueryRow(t.Context(), "SELECT to_regclass('public.dlock_locks') IS NOT NULL").Scan(&public); err != nil || public {
		t.Fatalf("a table was created in public: %v %v", public, err)
	}
	for _, bad := range []string{"", "a'b", `a\b`, string(make([]byte, 64))} {
		if bad == "" {
			continue // the zero value selects the default
		}
		if _, err := pgdriver.New(pool, &pgdriver.Options{Schema: bad}); err == nil {
			t.Errorf("New with schema %q succeeded", bad)
		}
	}
}

func TestDriver_ConcurrentFirstUseMigratesOnce(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		d := newDriver(t, pool, &pgdriver.Options{Schema: "fresh"})
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := d.TryAcquire(t.Context(), req(fmt.Sprintf("k%d", i), "owner-0123456789abcdef", time.Minute))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestDriver_NoMigrateNeedsMigrate(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	d := newDriver(t, pool, &pgdriver.Options{Schema: "manual", NoMigrate: true})
	if _, err := d.TryAcquire(t.Context(), req("k", "owner-0123456789abcdef", time.Minute)); err == nil {
		t.Fatal("TryAcquire without a table succeeded")
	}
	if err := d.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(t.Context()); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	mustGrant(t, d, req("k", "owner-0123456789abcdef", time.Minute))
}

func TestDriver_KeysArePassedAsParameters(t *testing.T) {
	pg := testservers.StartPostgres(t)
	d := newDriver(t, newPool(t, pg), nil)
	keys := []string{"a%b", "a_b", "axb", `a\b`, "a'b", `'; DROP TABLE dlock_locks; --`, "ab", "b"}
	for _, k := range keys {
		mustGrant(t, d, req(k, "owner-0123456789abcdef", time.Minute))
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"a%", []string{"a%b"}},
		{"a_", []string{"a_b"}},
		{`a\`, []string{`a\b`}},
		{"a", []string{"a%b", "a'b", `a\b`, "a_b", "ab", "axb"}}, // byte order
		{"'", []string{`'; DROP TABLE dlock_locks; --`}},
		{"zzz", nil},
	} {
		infos, err := d.List(t.Context(), tc.prefix)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range infos {
			got = append(got, in.Key)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
	all, err := d.List(t.Context(), "")
	if err != nil || len(all) != len(keys) {
		t.Fatalf("List(\"\") = %d keys, %v; want %d", len(all), err, len(keys))
	}
}

func TestDriver_HintOnRelease(t *testing.T) {
	pg := testservers.StartPostgres(t)
	holder := newDriver(t, newPool(t, pg), nil)
	waiter := newDriver(t, newPool(t, pg), nil)
	mustGrant(t, holder, req("k", "owner-0123456789abcdef", time.Minute))
	mustGrant(t, holder, req("other", "owner-0123456789abcdef", time.Minute))
	hints, stop, err := waiter.Hint(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// LISTEN is set up asynchronously: once it is up, a release of another
	// key must not wake this key's waiter.
	awaitListening(t, pg)
	if err := holder.Release(t.Context(), "other", "owner-0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hints:
		t.Fatal("hint for another key's release")
	case <-time.After(200 * time.Millisecond):
	}
	if err := holder.Release(t.Context(), "k", "owner-0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hints:
	case <-time.After(5 * time.Second):
		t.Fatal("no hint within 5 s of the release")
	}

	// A driver over a DB that is not a pool has no hints unless given a
	// config.
	nd, err := pgdriver.New(plainDB{newPool(t, pg)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	if _, _, err := nd.Hint(t.Context(), "k"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Hint without a config = %v, want ErrUnsupported", err)
	}
}

func TestDriver_CloseLeavesCallersPoolOpen(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	d := newDriver(t, pool, nil)
	mustGrant(t, d, req("k", "owner-0123456789abcdef", time.Minute))
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if err := pool.Ping(t.Context()); err != nil {
		t.Fatalf("the caller's pool was closed: %v", err)
	}
	if _, err := d.TryAcquire(t.Context(), req("k2", "owner-0123456789abcdef", time.Minute)); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("TryAcquire after Close = %v, want ErrClosed", err)
	}
}

func TestDriver_PruneDeletesOnlyLongFreeRows(t *testing.T) {
	pg := testservers.StartPostgres(t)
	d := newDriver(t, newPool(t, pg), nil)
	mustGrant(t, d, req("held", "owner-0123456789abcdef", time.Minute))
	mustGrant(t, d, req("freed", "owner-0123456789abcdef", time.Minute))
	if err := d.Release(t.Context(), "freed", "owner-0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
	if n, err := d.Prune(t.Context(), time.Hour); err != nil || n != 0 {
		t.Fatalf("Prune(1h) = %d, %v; want 0", n, err)
	}
	time.Sleep(50 * time.Millisecond)
	if n, err := d.Prune(t.Context(), 10*time.Millisecond); err != nil || n != 1 {
		t.Fatalf("Prune(10ms) = %d, %v; want 1 (the freed key)", n, err)
	}
	if _, err := d.Inspect(t.Context(), "held"); err != nil {
		t.Fatalf("held key pruned: %v", err)
	}
}

func TestOpen_ByURL(t *testing.T) {
	pg := testservers.StartPostgres(t)
	for _, scheme := range []string{"postgres", "postgresql"} {
		u := scheme + pg.URL()[len("postgres"):]
		l, err := dlock.Open(t.Context(), u)
		if err != nil {
			t.Fatalf("dlock.Open(%s): %v", u, err)
		}
		ls, err := l.TryAcquire(t.Context(), "k "+scheme)
		if err != nil {
			t.Fatal(err)
		}
		if err := ls.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	down := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", testservers.FreePort(t))
	if _, err := dlock.Open(t.Context(), down); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Open with no server = %v, want ErrUnavailable", err)
	}
}

// TestDriver_HintsSurviveServerRestart: the LISTEN connection reconnects
// after the server comes back, wakes its subscribers once (releases may
// have been missed), and then carries hints again.
func TestDriver_HintsSurviveServerRestart(t *testing.T) {
	pg := testservers.StartPostgres(t)
	holder := newDriver(t, newPool(t, pg), nil)
	waiter := newDriver(t, newPool(t, pg), nil)
	hints, stop, err := waiter.Hint(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	awaitListening(t, pg)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hints: // the wake-up after reconnecting
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up after the listener reconnected")
	}
	// The holder's pool reconnects on its own; retry until it has.
	var g driver.Grant
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, err = holder.TryAcquire(t.Context(), req("k", "owner-0123456789abcdef", time.Minute))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || g.Fence == 0 {
		t.Fatalf("TryAcquire after the restart: %v", err)
	}
	if err := holder.Release(t.Context(), "k", "owner-0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hints:
	case <-time.After(5 * time.Second):
		t.Fatal("no hint for a release after the restart")
	}
}
