package dlocktest_test

import (
	"testing"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// soloReaders is a SharedLocker whose readers do not share: every view is
// the plain driver.
type soloReaders struct{ *memdriver.Driver }

func (d soloReaders) SharedView(driver.SharedKind) (driver.Driver, error) { return d.Driver, nil }

// blindReaders is a SharedLocker whose readers never see writers: they
// take their grants in a store of their own.
type blindReaders struct {
	*memdriver.Driver
	other *memdriver.Driver
}

func (d blindReaders) SharedView(k driver.SharedKind) (driver.Driver, error) {
	if k.Mode == driver.Shared {
		return d.other.SharedView(k)
	}
	return d.Driver.SharedView(k)
}

// TestRecipeRWLock_CatchesBrokenStores: Recipe_RWLock fails against a store
// whose readers exclude each other and one whose readers ignore writers,
// and passes against memdriver intact.
func TestRecipeRWLock_CatchesBrokenStores(t *testing.T) {
	other := memdriver.NewStore()
	for name, wrap := range map[string]func(*memdriver.Driver) driver.Driver{
		"readers do not share": func(d *memdriver.Driver) driver.Driver { return soloReaders{d} },
		"readers ignore writers": func(d *memdriver.Driver) driver.Driver {
			return blindReaders{Driver: d, other: memdriver.New(other)}
		},
	} {
		res := runSubtest(t, harness("mem-broken", wrap), "Recipe_RWLock")
		if !res.failed {
			t.Errorf("Recipe_RWLock passed against a store whose %s:\n%s", name, res.log)
		} else {
			t.Logf("Recipe_RWLock caught the store whose %s:\n%s", name, firstLines(res.log, 3))
		}
	}
	if res := runSubtest(t, harness("mem", func(d *memdriver.Driver) driver.Driver { return d }), "Recipe_RWLock"); res.failed || res.skipped {
		t.Errorf("Recipe_RWLock against memdriver intact: failed %v skipped %v:\n%s", res.failed, res.skipped, res.log)
	}
	if res := runSubtest(t, harness("postgres", func(d *memdriver.Driver) driver.Driver { return plainOnly{d} }), "Recipe_RWLock"); res.failed || res.skipped {
		t.Errorf("Recipe_RWLock against a store without read-write locks (ErrUnsupported expected): failed %v skipped %v:\n%s", res.failed, res.skipped, res.log)
	}
	if res := runSubtest(t, harness("etcd", func(d *memdriver.Driver) driver.Driver { return plainOnly{d} }), "Recipe_RWLock"); !res.failed {
		t.Errorf("Recipe_RWLock passed against a store listed with read-write locks whose driver has none:\n%s", res.log)
	}
}

// plainOnly hides every optional capability of the driver.
type plainOnly struct{ driver.Driver }
