package fenceredis_test

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/redisdriver"
	"github.com/dlock-dev/dlock/fence"
	"github.com/dlock-dev/dlock/fence/fenceredis"
	"github.com/dlock-dev/dlock/fence/internal/fencetest"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSet_LateWriteOfPausedHolderIsStale(t *testing.T) {
	r := testservers.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer client.Close()

	// The lock and the fenced value in the same Redis, as a Redis user
	// would have them.
	a, b := fencetest.PausedHolder(t, func(t *testing.T) driver.Driver {
		d, err := redisdriver.Open(t.Context(), r.URL())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}, "report")
	if err := fenceredis.Set(t.Context(), client, "report:value", "B's report", b.Fence()); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	err := fenceredis.Set(t.Context(), client, "report:value", "A's late report", a.Fence())
	if !errors.Is(err, dlock.ErrStaleFence) || !errors.Is(err, fence.ErrStaleFence) {
		t.Fatalf("A's late write = %v, want ErrStaleFence", err)
	}
	v, f, err := fenceredis.Get(t.Context(), client, "report:value")
	if err != nil || v != "B's report" || f != b.Fence() {
		t.Fatalf("Get = %q, %d, %v; want B's report with fence %d", v, f, err, b.Fence())
	}
}

func TestSet_ComparesFencesExactly(t *testing.T) {
	r := testservers.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer client.Close()
	ctx := t.Context()
	if _, _, err := fenceredis.Get(ctx, client, "k"); !errors.Is(err, fenceredis.ErrNoValue) {
		t.Fatalf("Get of a missing key = %v, want ErrNoValue", err)
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
		err := fenceredis.Set(ctx, client, "k", s.fence, s.fence)
		if errors.Is(err, fenceredis.ErrStaleFence) != s.stale || (err != nil && !s.stale) {
			t.Fatalf("Set with fence %d = %v, want stale %v", s.fence, err, s.stale)
		}
	}
	v, f, err := fenceredis.Get(ctx, client, "k")
	if err != nil || f != 18446744073709551615 || v != "18446744073709551615" {
		t.Fatalf("Get = %q, %d, %v", v, f, err)
	}
	if err := fenceredis.Set(ctx, client, "k", "x", 0); err == nil {
		t.Fatal("Set with fence 0 succeeded")
	}
}

// TestExamples_RunAsWritten runs the package's example, as written, against
// a real Redis (go test only compiles it: it needs one).
func TestExamples_RunAsWritten(t *testing.T) {
	r := testservers.StartRedis(t)
	t.Setenv("REDIS_URL", r.URL())
	for range 2 { // the second run's lease has a greater fence: admitted
		if out := fencetest.Output(t, ExampleSet); out != "report: monthly totals\n" {
			t.Fatalf("ExampleSet printed %q", out)
		}
	}
}
