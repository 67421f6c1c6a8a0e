package pgdriver_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/drivers/pgdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestSchemas_AreIndependent: drivers on different schemas (or tables) of
// one database are independent deployments, also for keys named like the
// other schema or table: each holds every key at once, and lists and
// inspects only its own grants.
func TestSchemas_AreIndependent(t *testing.T) {
	pg := testservers.StartPostgres(t)
	a := newDriver(t, newPool(t, pg), &pgdriver.Options{Schema: "a"})
	b := newDriver(t, newPool(t, pg), &pgdriver.Options{Schema: "b"})
	public := newDriver(t, newPool(t, pg), nil)
	otherTable := newDriver(t, newPool(t, pg), &pgdriver.Options{Schema: "a", Table: "other"})
	drivers := []*pgdriver.Driver{a, b, public, otherTable}
	keys := []string{"k", "a", "b", "public", "dlock_locks", "a.dlock_locks", `"a"."dlock_locks"`}
	owner := func(i int, k string) string { return fmt.Sprintf("owner-%d-%x-0123456789abcdef", i, k) }
	fences := map[int]map[string]uint64{}
	for i, d := range drivers {
		fences[i] = map[string]uint64{}
		for _, k := range keys {
			fences[i][k] = mustGrant(t, d, req(k, owner(i, k), time.Minute)).Fence
		}
	}
	for i, d := range drivers {
		infos, err := d.List(t.Context(), "")
		if err != nil || len(infos) != len(keys) {
			t.Fatalf("driver %d: List = %d keys, %v; want its own %d", i, len(infos), err, len(keys))
		}
		for _, k := range keys {
			info, err := d.Inspect(t.Context(), k)
			if err != nil || info.Fence != fences[i][k] || info.Holder != "test "+owner(i, k) {
				t.Errorf("driver %d: Inspect(%q) = %+v, %v; want its own grant, fence %d", i, k, info, err, fences[i][k])
			}
		}
	}
	for i, d := range drivers {
		for _, k := range keys {
			if err := d.Release(t.Context(), k, owner(i, k)); err != nil {
				t.Fatalf("driver %d: Release(%q): %v", i, k, err)
			}
		}
	}
}
