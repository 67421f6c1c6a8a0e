package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/drivers/pgdriver"
	"github.com/dlock-dev/dlock/fence"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ttl = 300 * time.Millisecond

// pausedHolder is the scenario every test below plays out with real
// leases: holder A acquires key through pgdriver with a short TTL and is
// then paused (its renewals never reach the store, as if the process were
// stopped), the store expires A's grant, B acquires with a greater fence and
// writes, and A wakes up and writes late with its old fence.
type pausedHolder struct {
	a, b *dlock.Lease
}

func playPausedHolder(t *testing.T, pg *testservers.Postgres, key string) pausedHolder {
	t.Helper()
	open := func() (*dlock.Locker, *dlocktest.FaultDriver) {
		d, err := pgdriver.Open(t.Context(), pg.URL())
		if err != nil {
			t.Fatal(err)
		}
		fd := dlocktest.NewFaultDriver(d, t.Logf)
		l := dlock.New(fd, dlock.WithTTL(ttl), dlock.WithBackoff(time.Millisecond, 20*time.Millisecond))
		t.Cleanup(func() { _ = l.Close() })
		return l, dlocktest.Faults(fd)
	}
	la, fa := open()
	lb, _ := open()
	a, err := la.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	fa.BlockRenewals(true) // A is paused: its lease runs out on the store
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	b, err := lb.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("B could not acquire after A's TTL: %v", err)
	}
	t.Cleanup(func() { _ = b.Release(context.Background()) })
	if b.Fence() <= a.Fence() {
		t.Fatalf("B's fence %d not greater than A's %d", b.Fence(), a.Fence())
	}
	return pausedHolder{a: a, b: b}
}

func TestExecPgx_LateWriteOfPausedHolderIsStale(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool, err := pgxpool.New(t.Context(), pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mustExec(t, pool, `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, fence bigint NOT NULL DEFAULT 0)`)
	mustExec(t, pool, `INSERT INTO accounts (id, balance) VALUES (1, 100)`)
	const update = `UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence < $2`

	h := playPausedHolder(t, pg, "account:1")
	if err := fence.ExecPgx(t.Context(), pool, update, 200, int64(h.b.Fence()), 1); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	err = fence.ExecPgx(t.Context(), pool, update, 999, int64(h.a.Fence()), 1)
	if !errors.Is(err, dlock.ErrStaleFence) || !errors.Is(err, fence.ErrStaleFence) {
		t.Fatalf("A's late write = %v, want ErrStaleFence", err)
	}
	var balance int
	var stored int64
	if err := pool.QueryRow(t.Context(), "SELECT balance, fence FROM accounts WHERE id = 1").Scan(&balance, &stored); err != nil {
		t.Fatal(err)
	}
	if balance != 200 || uint64(stored) != h.b.Fence() {
		t.Fatalf("after A's late write: balance %d fence %d; want B's 200 and %d", balance, stored, h.b.Fence())
	}
	// A's lease is lost by then, as the root package promises.
	select {
	case <-h.a.Done():
	case <-time.After(time.Second):
		t.Fatal("A's lease not lost")
	}
}

func TestTable_AdvanceRejectsPausedHolderInItsTransaction(t *testing.T) {
	pg := testservers.StartPostgres(t)
	db, err := sql.Open("pgx", pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tbl := fence.Table{}
	if err := tbl.Create(t.Context(), fence.SQL(db)); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Create(t.Context(), fence.SQL(db)); err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE ledger (id serial PRIMARY KEY, entry text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	write := func(f uint64, entry string) error {
		tx, err := db.BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := tbl.Advance(t.Context(), fence.SQL(tx), "ledger", f); err != nil {
			return err
		}
		if _, err := tx.ExecContext(t.Context(), `INSERT INTO ledger (entry) VALUES ($1)`, entry); err != nil {
			t.Fatal(err)
		}
		return tx.Commit()
	}

	h := playPausedHolder(t, pg, "ledger")
	if err := write(h.b.Fence(), "B"); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	if err := write(h.a.Fence(), "A late"); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("A's late write = %v, want ErrStaleFence", err)
	}
	if err := write(h.b.Fence(), "B again"); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("Advance with an equal fence = %v, want ErrStaleFence", err)
	}
	var entries []string
	rows, err := db.QueryContext(t.Context(), `SELECT entry FROM ledger ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var e string
		if err := rows.Scan(&e); err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
	}
	if len(entries) != 1 || entries[0] != "B" {
		t.Fatalf("ledger = %q, want only B's entry", entries)
	}
	var stored int64
	if err := db.QueryRowContext(t.Context(), `SELECT fence FROM dlock_fences WHERE resource = 'ledger'`).Scan(&stored); err != nil || uint64(stored) != h.b.Fence() {
		t.Fatalf("stored fence %d, %v; want %d", stored, err, h.b.Fence())
	}

	// AdvanceOrSame lets the same grant write again, never an older one.
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tbl.AdvanceOrSame(t.Context(), fence.SQL(tx), "ledger", h.b.Fence()); err != nil {
		t.Fatalf("AdvanceOrSame with B's fence: %v", err)
	}
	if err := tbl.AdvanceOrSame(t.Context(), fence.SQL(tx), "ledger", h.a.Fence()); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("AdvanceOrSame with A's fence = %v, want ErrStaleFence", err)
	}
}

func TestExecSQL_ZeroRowsIsStale(t *testing.T) {
	pg := testservers.StartPostgres(t)
	db, err := sql.Open("pgx", pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE r (id int PRIMARY KEY, v text, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), `INSERT INTO r VALUES (1, 'x', 10)`); err != nil {
		t.Fatal(err)
	}
	const q = `UPDATE r SET v = $1, fence = $2 WHERE id = 1 AND fence < $2`
	for _, tc := range []struct {
		fence int64
		stale bool
	}{{9, true}, {10, true}, {11, false}, {11, true}, {12, false}} {
		err := fence.ExecSQL(t.Context(), db, q, "w", tc.fence)
		if stale := errors.Is(err, fence.ErrStaleFence); stale != tc.stale || (err != nil && !stale) {
			t.Errorf("write with fence %d = %v, want stale %v", tc.fence, err, tc.stale)
		}
	}
	if err := fence.ExecSQL(t.Context(), db, `UPDATE missing SET x = 1`); err == nil || errors.Is(err, fence.ErrStaleFence) {
		t.Errorf("a failing statement = %v, want the database error, not ErrStaleFence", err)
	}
	if _, err := fence.Param(1 << 63); err == nil {
		t.Error("Param(2^63) succeeded")
	}
}

func TestRedisSet_LateWriteOfPausedHolderIsStale(t *testing.T) {
	pg := testservers.StartPostgres(t)
	r := testservers.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer client.Close()

	h := playPausedHolder(t, pg, "report")
	if err := fence.RedisSet(t.Context(), client, "report", "B's report", h.b.Fence()); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	err := fence.RedisSet(t.Context(), client, "report", "A's late report", h.a.Fence())
	if !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("A's late write = %v, want ErrStaleFence", err)
	}
	v, f, err := fence.RedisGet(t.Context(), client, "report")
	if err != nil || v != "B's report" || f != h.b.Fence() {
		t.Fatalf("RedisGet = %q, %d, %v; want B's report with fence %d", v, f, err, h.b.Fence())
	}
}

func TestRedisSet_ComparesFencesExactly(t *testing.T) {
	r := testservers.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer client.Close()
	ctx := t.Context()
	if _, _, err := fence.RedisGet(ctx, client, "k"); !errors.Is(err, fence.ErrNoValue) {
		t.Fatalf("RedisGet of a missing key = %v, want ErrNoValue", err)
	}
	// Near 2^64, where Lua's doubles cannot tell neighbours apart.
	steps := []struct {
		fence uint64
		stale bool
	}{
		{9, false}, {10, false}, {10, true}, {9, true}, {100, false},
		{1<<53 + 1, false}, {1 << 53, true}, {1<<53 + 2, false},
		{18446744073709551614, false}, {18446744073709551615, false}, {18446744073709551614, true},
	}
	for _, s := range steps {
		err := fence.RedisSet(ctx, client, "k", s.fence, s.fence)
		if errors.Is(err, fence.ErrStaleFence) != s.stale || (err != nil && !s.stale) {
			t.Fatalf("RedisSet with fence %d = %v, want stale %v", s.fence, err, s.stale)
		}
	}
	v, f, err := fence.RedisGet(ctx, client, "k")
	if err != nil || f != 18446744073709551615 || v != "18446744073709551615" {
		t.Fatalf("RedisGet = %q, %d, %v", v, f, err)
	}
	if err := fence.RedisSet(ctx, client, "k", "x", 0); err == nil {
		t.Fatal("RedisSet with fence 0 succeeded")
	}
}

func mustExec(t *testing.T, pool *pgxpool.Pool, q string) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), q); err != nil {
		t.Fatal(err)
	}
}
