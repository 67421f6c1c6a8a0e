package pgadvisory_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/pgadvisory"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func advisoryURL(pg *testservers.Postgres) string {
	return "pgadvisory" + strings.TrimPrefix(pg.URL(), "postgres")
}

// TestConformance runs the dlock conformance suite against a real
// PostgreSQL, each driver opened by URL with its own pool, as a process
// would.
func TestConformance(t *testing.T) {
	pg := testservers.StartPostgres(t)
	// Frozen: SIGSTOP of the postmaster's process group, every backend
	// included.
	freezer := testservers.NewFreezer(t, func() []int { return []int{pg.PID()} })
	dlocktest.Run(t, dlocktest.Harness{
		Name: "pgadvisory",
		NewDriver: func(ctx context.Context) (driver.Driver, error) {
			return pgadvisory.Open(ctx, advisoryURL(pg))
		},
		StopStore:   pg.Stop,
		StartStore:  pg.Start,
		FreezeStore: freezer.Freeze,
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return pgadvisory.Open(ctx, strings.Replace(advisoryURL(pg), pg.Addr(), via(pg.Addr()), 1))
		},
		ResetEndsLease:       true,
		ResetEndsLeaseReason: "an advisory lock lives and dies with its session: a connection reset ends the session and so the lock",
		TTL:                  500 * time.Millisecond,
	})
}

func newPool(t *testing.T, pg *testservers.Postgres) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), pg.URL()+"&pool_max_conns=16")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newDriver(t *testing.T, pool *pgxpool.Pool, opts *pgadvisory.Options) *pgadvisory.Driver {
	t.Helper()
	d, err := pgadvisory.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
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
	if g.Fence == 0 || g.Lost == nil {
		t.Fatalf("grant %+v: want a fence and a Lost channel", g)
	}
	return g
}

func backendPID(t *testing.T, pool *pgxpool.Pool, key string) int32 {
	t.Helper()
	var pid int32
	if err := pool.QueryRow(t.Context(), "SELECT pid FROM dlock_advisory WHERE key = $1", key).Scan(&pid); err != nil {
		t.Fatalf("pid of %q's session: %v", key, err)
	}
	return pid
}

func lockHeld(t *testing.T, pool *pgxpool.Pool, key string) bool {
	t.Helper()
	id := uint64(pgadvisory.LockID(key))
	var n int
	err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`, int64(id>>32), int64(uint32(id))).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

func TestLockID_IsDocumentedHash(t *testing.T) {
	for _, k := range []string{"a", "settle:42:2026-09-30", "emoji 🔒"} {
		sum := sha256.Sum256([]byte("dlock:" + k))
		if want := int64(binary.BigEndian.Uint64(sum[:8])); pgadvisory.LockID(k) != want {
			t.Errorf("LockID(%q) = %d, want %d", k, pgadvisory.LockID(k), want)
		}
	}
}

func TestDriver_GrantHoldsSessionLock(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	a := newDriver(t, pool, nil)
	b := newDriver(t, newPool(t, pg), nil)
	const owner = "owner-a-0123456789abcdef"
	var last uint64
	for i := range 5 {
		g := mustGrant(t, a, req("k", owner, time.Minute))
		if g.Fence <= last {
			t.Fatalf("grant %d: fence %d not greater than %d", i, g.Fence, last)
		}
		last = g.Fence
		if !lockHeld(t, pool, "k") {
			t.Fatal("no advisory lock in pg_locks while granted")
		}
		if _, err := b.TryAcquire(t.Context(), req("k", "owner-b-0123456789abcdef", time.Minute)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("second client: %v, want ErrNotAcquired", err)
		}
		if err := a.Renew(t.Context(), "k", owner, time.Minute); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if err := a.Renew(t.Context(), "k", "other-0123456789abcdef", time.Minute); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew by another owner = %v, want ErrLeaseLost", err)
		}
		if err := a.Release(t.Context(), "k", "other-0123456789abcdef"); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Release by another owner = %v, want ErrLeaseLost", err)
		}
		if err := a.Release(t.Context(), "k", owner); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := a.Release(t.Context(), "k", owner); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("second Release = %v, want ErrLeaseLost", err)
		}
		if lockHeld(t, pool, "k") {
			t.Fatal("advisory lock still held after Release")
		}
	}
	// Released connections went back to the pool clean: no lock, no
	// idle_session_timeout.
	conns := pool.AcquireAllIdle(t.Context())
	for _, c := range conns {
		var timeout string
		if err := c.QueryRow(t.Context(), "SHOW idle_session_timeout").Scan(&timeout); err != nil {
			t.Fatal(err)
		}
		if timeout != "0" {
			t.Errorf("pooled connection has idle_session_timeout %s", timeout)
		}
		c.Release()
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still out of the pool", n)
	}
}

func TestDriver_ConnectionKilledLosesLeaseAtOnce(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	a := newDriver(t, pool, nil)
	b := newDriver(t, newPool(t, pg), nil)
	const owner = "owner-a-0123456789abcdef"
	g := mustGrant(t, a, req("k", owner, time.Minute))
	pid := backendPID(t, pool, "k")
	killed := time.Now()
	var ok bool
	if err := pool.QueryRow(t.Context(), "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
	select {
	case <-g.Lost:
		t.Logf("Lost closed %v after pg_terminate_backend", time.Since(killed))
	case <-time.After(2 * time.Second):
		t.Fatal("Grant.Lost still open 2 s after the session was terminated")
	}
	if err := a.Renew(t.Context(), "k", owner, time.Minute); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after the kill = %v, want ErrLeaseLost", err)
	}
	if err := a.Release(t.Context(), "k", owner); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Release after the kill = %v, want ErrLeaseLost", err)
	}
	// The loss was declared before the server let go: a terminated
	// backend exits, and its advisory locks go, only a moment later (on a
	// loaded machine, a noticeable one). Wait for that, bounded, before
	// another owner takes the key.
	awaitBackendGone(t, pool, pid, "k", 5*time.Second)
	gb := mustGrant(t, b, req("k", "owner-b-0123456789abcdef", time.Minute))
	if gb.Fence <= g.Fence {
		t.Fatalf("fence %d after the kill not greater than %d", gb.Fence, g.Fence)
	}

	// Through the root package: the lease ends at once, long before its
	// 30 s validity deadline.
	l := dlock.New(pgadvisoryDriver(t, pg))
	defer l.Close()
	ls, err := l.TryAcquire(t.Context(), "rooted", dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	pid = backendPID(t, pool, "rooted")
	killed = time.Now()
	if _, err := pool.Exec(t.Context(), "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ls.Done():
		t.Logf("lease Done %v after pg_terminate_backend", time.Since(killed))
	case <-time.After(2 * time.Second):
		t.Fatal("lease still held 2 s after its session was terminated")
	}
	if !errors.Is(ls.Err(), dlock.ErrLeaseLost) || !errors.Is(context.Cause(ls.Context()), dlock.ErrLeaseLost) {
		t.Fatalf("Err %v, cause %v; want ErrLeaseLost", ls.Err(), context.Cause(ls.Context()))
	}
	if err := ls.Release(t.Context()); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of the lost lease = %v, want ErrLeaseLost", err)
	}
}

// awaitBackendGone waits until the server backend pid has exited (it is no
// longer in pg_stat_activity) and the advisory lock of key is no longer
// held, failing the test after within.
func awaitBackendGone(t *testing.T, pool *pgxpool.Pool, pid int32, key string, within time.Duration) {
	t.Helper()
	began := time.Now()
	for {
		var n int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 && !lockHeld(t, pool, key) {
			t.Logf("backend %d gone %v after the loss was seen", pid, time.Since(began))
			return
		}
		if time.Since(began) > within {
			t.Fatalf("backend %d still running %v after pg_terminate_backend", pid, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func pgadvisoryDriver(t *testing.T, pg *testservers.Postgres) driver.Driver {
	t.Helper()
	d, err := pgadvisory.Open(t.Context(), advisoryURL(pg))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDriver_SilentHolderExpiresByServerTimeout(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	a := newDriver(t, pool, nil)
	b := newDriver(t, newPool(t, pg), nil)
	const ttl = 300 * time.Millisecond
	granted := time.Now()
	g := mustGrant(t, a, req("k", "owner-a-0123456789abcdef", ttl))
	// No renewals: the server ends the idle session after the TTL.
	select {
	case <-g.Lost:
		if took := time.Since(granted); took < ttl {
			t.Fatalf("session ended %v after the grant, before the TTL %v", took, ttl)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("session not ended by idle_session_timeout")
	}
	mustGrant(t, b, req("k", "owner-b-0123456789abcdef", ttl))
	if err := b.Release(t.Context(), "k", "owner-b-0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
}

func TestDriver_HashCollisionIsReported(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	d := newDriver(t, pool, nil)
	if err := d.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Stage a collision: another session holds the lock id of "victim",
	// recorded in the key table under a different key, as a real SHA-256
	// prefix collision would be.
	c, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	id := pgadvisory.LockID("victim")
	if _, err := c.Exec(t.Context(), "SELECT pg_advisory_lock($1::bigint)", id); err != nil {
		t.Fatal(err)
	}
	defer c.Exec(context.Background(), "SELECT pg_advisory_unlock_all()")
	if _, err := c.Exec(t.Context(), `INSERT INTO dlock_advisory (lock_id, key, owner, fence, holder, ttl_us, pid, acquired_at)
		VALUES ($1, 'colliding key', 'o', 1, '', 1000000, pg_backend_pid(), now())`, id); err != nil {
		t.Fatal(err)
	}
	_, err = d.TryAcquire(t.Context(), req("victim", "owner-0123456789abcdef", time.Minute))
	if !errors.Is(err, driver.ErrNotAcquired) || !strings.Contains(err.Error(), "colliding key") || !strings.Contains(err.Error(), "collision") {
		t.Fatalf("TryAcquire on a colliding id = %v, want ErrNotAcquired naming the colliding key", err)
	}
	// Inspect does not call the key free (TryAcquire cannot take it): it
	// names the colliding key, with no fence of its own.
	info, err := d.Inspect(t.Context(), "victim")
	if err != nil || info.Fence != 0 || !strings.Contains(info.Holder, "colliding key") || !strings.Contains(info.Holder, "collision") {
		t.Fatalf("Inspect(victim) = %+v, %v; want held by the colliding key, fence 0", info, err)
	}
}

func TestDriver_InspectAndList(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	d := newDriver(t, pool, &pgadvisory.Options{Schema: "adv"})
	keys := []string{"job/a%", "job/a_", "job/b", "other", `'; DROP TABLE x; --`}
	fences := map[string]uint64{}
	for _, k := range keys {
		fences[k] = mustGrant(t, d, req(k, fmt.Sprintf("owner-%x-0123456789abcdef", k), 2*time.Second)).Fence
	}
	info, err := d.Inspect(t.Context(), "job/b")
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "job/b" || info.Fence != fences["job/b"] || info.TTL != 2*time.Second || info.Waiters != -1 ||
		info.Remaining <= 0 || info.Remaining > 2*time.Second || !strings.HasPrefix(info.Holder, fmt.Sprintf("test owner-%x", "job/b")) {
		t.Fatalf("Inspect = %+v", info)
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"job/a%", []string{"job/a%"}},
		{"job/", []string{"job/a%", "job/a_", "job/b"}},
		{"", []string{`'; DROP TABLE x; --`, "job/a%", "job/a_", "job/b", "other"}},
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
	// A holder whose session died is not listed, although its row stays.
	var pid int
	if err := pool.QueryRow(t.Context(), "SELECT pid FROM adv.dlock_advisory WHERE key = 'other'").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	// Await the end of the session's locks, not a guessed time.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_locks WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminated session %d still holds %d locks after 10 s", pid, n)
		}
	}
	if _, err := d.Inspect(t.Context(), "other"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect of a dead session's key = %v, want ErrNotAcquired", err)
	}
}

func TestDriver_HintOnRelease(t *testing.T) {
	pg := testservers.StartPostgres(t)
	holder := newDriver(t, newPool(t, pg), nil)
	waiter := newDriver(t, newPool(t, pg), nil)
	observer := newPool(t, pg)
	mustGrant(t, holder, req("k", "owner-0123456789abcdef", time.Minute))
	hints, stop, err := waiter.Hint(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// LISTEN starts asynchronously: await it in pg_stat_activity.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		err := observer.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND query LIKE 'LISTEN %'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hint listener did not LISTEN within 10 s")
		}
	}
	if err := holder.Release(t.Context(), "k", "owner-0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hints:
	case <-time.After(5 * time.Second):
		t.Fatal("no hint within 5 s of the release")
	}
}

func TestDriver_CloseEndsSessionsAndKeepsCallersPool(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	d, err := pgadvisory.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := mustGrant(t, d, req("k", "owner-0123456789abcdef", time.Minute))
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	select {
	case <-g.Lost:
	default:
		t.Fatal("Lost open after Close ended the session")
	}
	if err := pool.Ping(t.Context()); err != nil {
		t.Fatalf("the caller's pool was closed: %v", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for lockHeld(t, pool, "k") {
		if time.Now().After(deadline) {
			t.Fatal("lock still held after Close")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := d.TryAcquire(t.Context(), req("k", "owner-0123456789abcdef", time.Minute)); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("TryAcquire after Close = %v, want ErrClosed", err)
	}
}

func TestOpen_ByURL(t *testing.T) {
	pg := testservers.StartPostgres(t)
	l, err := dlock.Open(t.Context(), advisoryURL(pg)+"&dlock_schema=via_url")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ls, err := l.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	info, err := l.Inspect(t.Context(), "k")
	if err != nil || info.Fence != ls.Fence() {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	if err := ls.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, pg)
	var ok bool
	if err := pool.QueryRow(t.Context(), "SELECT to_regclass('via_url.dlock_advisory') IS NOT NULL").Scan(&ok); err != nil || !ok {
		t.Fatalf("key table not in the URL's schema: %v %v", ok, err)
	}
}
