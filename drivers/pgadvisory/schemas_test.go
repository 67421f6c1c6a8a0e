package pgadvisory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/pgadvisory"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func listKeys(t *testing.T, d *pgadvisory.Driver) []string {
	t.Helper()
	infos, err := d.List(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{}
	for _, in := range infos {
		keys = append(keys, in.Key)
	}
	return keys
}

// TestSchemas_AreIndependent: advisory lock ids are shared by the whole
// database, and earlier versions took the same id for a key whatever the
// schema, so schema "b" found the key "k" held by schema "a" (and its
// Inspect said "free"). Drivers on different schemas or tables are now
// independent, also for keys named like the other schema.
func TestSchemas_AreIndependent(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	a := newDriver(t, pool, &pgadvisory.Options{Schema: "a"})
	b := newDriver(t, newPool(t, pg), &pgadvisory.Options{Schema: "b"})
	public := newDriver(t, newPool(t, pg), nil)
	otherTable := newDriver(t, newPool(t, pg), &pgadvisory.Options{Schema: "a", Table: "other"})
	keys := []string{"k", "a", "b", "public", "dlock_advisory"}
	owner := func(d *pgadvisory.Driver, k string) string { return fmt.Sprintf("owner-%p-%s-0123456789abcdef", d, k) }
	fences := map[*pgadvisory.Driver]map[string]uint64{}
	for _, d := range []*pgadvisory.Driver{a, b, public, otherTable} {
		fences[d] = map[string]uint64{}
		for _, k := range keys {
			g, err := d.TryAcquire(t.Context(), req(k, owner(d, k), time.Minute))
			if err != nil {
				t.Fatalf("TryAcquire(%q) while other schemas or tables hold it: %v", k, err)
			}
			fences[d][k] = g.Fence
		}
	}
	for _, d := range []*pgadvisory.Driver{a, b, public, otherTable} {
		if got := listKeys(t, d); fmt.Sprint(got) != "[a b dlock_advisory k public]" {
			t.Errorf("List = %q, want each key once", got)
		}
		for _, k := range keys {
			info, err := d.Inspect(t.Context(), k)
			if err != nil || info.Fence != fences[d][k] || info.Holder != "test "+owner(d, k) {
				t.Errorf("Inspect(%q) = %+v, %v; want the driver's own grant, fence %d", k, info, err, fences[d][k])
			}
		}
	}
	// Each schema has its own key table and index (the index is named
	// without a schema in the DDL).
	var schemas []string
	rows, err := pool.Query(t.Context(), "SELECT schemaname FROM pg_indexes WHERE indexname = 'dlock_advisory_key_idx' ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		schemas = append(schemas, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(schemas) != "[a b public]" {
		t.Errorf("key index in schemas %q, want [a b public]", schemas)
	}
	for _, d := range []*pgadvisory.Driver{a, b, public, otherTable} {
		for _, k := range keys {
			if err := d.Release(t.Context(), k, owner(d, k)); err != nil {
				t.Fatalf("Release(%q): %v", k, err)
			}
		}
	}
}

// lockIDOf returns the advisory lock id d took for key, read from its key
// table after a grant.
func lockIDOf(t *testing.T, pool *pgxpool.Pool, d *pgadvisory.Driver, table, key string) int64 {
	t.Helper()
	const owner = "probe-0123456789abcdef"
	mustGrant(t, d, req(key, owner, time.Minute))
	var id int64
	if err := pool.QueryRow(t.Context(), "SELECT lock_id FROM "+table+" WHERE key = $1", key).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(t.Context(), key, owner); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestInspect_NeverFreeForAKeyItCannotAcquire: when a key's lock id is held
// by a session without a grant of the key in the driver's key table
// (another schema of an earlier version, other code, a hash collision),
// TryAcquire refuses the key, so Inspect must not call it free.
func TestInspect_NeverFreeForAKeyItCannotAcquire(t *testing.T) {
	pg := testservers.StartPostgres(t)
	pool := newPool(t, pg)
	b := newDriver(t, pool, &pgadvisory.Options{Schema: "b"})
	a := newDriver(t, newPool(t, pg), &pgadvisory.Options{Schema: "a"})
	id := lockIDOf(t, pool, b, "b.dlock_advisory", "k")

	// Schema a (in earlier versions, same id) holds k, or, now, another
	// session holds b's id of k.
	mustGrant(t, a, req("k", "owner-a-0123456789abcdef", time.Minute))
	c, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	var pid int32
	if err := c.QueryRow(t.Context(), "SELECT pg_backend_pid() FROM (SELECT pg_try_advisory_lock($1::bigint)) l", id).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	defer c.Exec(t.Context(), "SELECT pg_advisory_unlock_all()")

	if _, err := b.TryAcquire(t.Context(), req("k", "owner-b-0123456789abcdef", time.Minute)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire from schema b = %v, want ErrNotAcquired", err)
	}
	info, err := b.Inspect(t.Context(), "k")
	if errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect from schema b says k is free, but TryAcquire cannot take it: %v", err)
	}
	if err != nil || info.Key != "k" || info.Fence != 0 || !strings.Contains(info.Holder, fmt.Sprint(pid)) {
		t.Fatalf("Inspect = %+v, %v; want k held, fence 0, by backend pid %d", info, err, pid)
	}
	// Listing shows the table's own grants only.
	if got := listKeys(t, b); len(got) != 0 {
		t.Errorf("List from schema b = %q", got)
	}
	// Once the id is free again, so is the key.
	if _, err := c.Exec(t.Context(), "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Inspect(t.Context(), "k"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect of a free key = %v, want ErrNotAcquired", err)
	}
	mustGrant(t, b, req("k", "owner-b-0123456789abcdef", time.Minute))
}

// TestDriver_KeyMigrateDoesNotBlockMigrations: the DDL of both PostgreSQL
// drivers runs under a transaction-scoped advisory lock, in the same id
// space as the keys' session locks. Its id was SHA-256("dlock:migrate"),
// which is also LockID("migrate"), so holding the key "migrate" blocked the
// first use of every new schema or table in the database.
func TestDriver_KeyMigrateDoesNotBlockMigrations(t *testing.T) {
	pg := testservers.StartPostgres(t)
	holder := newDriver(t, newPool(t, pg), nil)
	mustGrant(t, holder, req("migrate", "owner-migrate-0123456789abcdef", time.Minute))
	fresh := newDriver(t, newPool(t, pg), &pgadvisory.Options{Schema: "fresh"})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := fresh.TryAcquire(ctx, req("k", "owner-k-0123456789abcdef", time.Minute)); err != nil {
		t.Fatalf("first use of a new schema while the key \"migrate\" is held: %v", err)
	}
}
