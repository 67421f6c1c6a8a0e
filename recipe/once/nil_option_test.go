package once_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/drivers/memdriver"
	"github.com/dlock-dev/dlock/recipe/once"
)

// TestRun_NilOptionIgnored: a nil Option (and a nil dlock.Option in
// WithLockOptions) is skipped by Run, Peek and Begin, as in the other
// recipes, instead of panicking.
func TestRun_NilOptionIgnored(t *testing.T) {
	l, _ := memLocker(t, memdriver.NewStore())
	ledger := once.NewMemLedger(nil)
	opts := []once.Option{nil, once.WithNode("n1"), once.WithLockOptions(nil, dlock.WithTTL(time.Second)), nil}
	ran := 0
	res, err := once.Run(t.Context(), l, ledger, "nil-opt", once.Daily, func(context.Context, once.Attempt) error {
		ran++
		return nil
	}, opts...)
	if err != nil || res.Outcome != once.OutcomeRan || ran != 1 || res.Record.Node != "n1" {
		t.Fatalf("Run = %+v, %v (ran %d); want ran on node n1", res, err, ran)
	}
	if res, err := once.Peek(t.Context(), ledger, "nil-opt", once.Daily, opts...); err != nil || res.Outcome != once.OutcomeDone {
		t.Fatalf("Peek = %+v, %v; want done", res, err)
	}
	lease, err := l.Acquire(t.Context(), once.Key("nil-opt-2"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	res, err = once.Begin(t.Context(), ledger, lease, "nil-opt-2", once.Daily, opts...)
	if err != nil || res.Outcome != once.OutcomeRan {
		t.Fatalf("Begin = %+v, %v; want ran", res, err)
	}
	if _, err := once.End(t.Context(), ledger, lease, res, nil); err != nil {
		t.Fatalf("End: %v", err)
	}
}
