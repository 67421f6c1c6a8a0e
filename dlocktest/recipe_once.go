package dlocktest

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/recipe/once"
)

// testOnce checks recipe/once on the store: a run that crashes mid-way
// (its renewals stop) is retried by another client only once its lease
// ended, with a greater fence; the crashed run's late finish is refused by
// the ledger; a finished window never runs again. The ledger is a
// once.MemLedger (this is the store's part of the recipe: its lock, expiry
// and fences; the SQL ledgers are tested against PostgreSQL and SQLite in
// recipe/once/sqlledger). A store without fences must be refused with
// ErrUnsupported.
func (s *suite) testOnce(t TB) {
	a, fa := s.locker(t)
	b, _ := s.locker(t)
	ledger := once.NewMemLedger(nil)
	job := key(t, "job")
	lockTTL := once.WithLockOptions(dlock.WithTTL(s.h.TTL))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if s.h.NoFence {
		_, err := once.Run(ctx, a, ledger, job, once.Monthly, func(context.Context, once.Attempt) error { return nil }, lockTTL)
		if !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("once.Run on a store without fences = %v, want ErrUnsupported", err)
		}
		return
	}

	started := make(chan *dlock.Lease, 1)
	resume := make(chan struct{})
	aErr := make(chan error, 1)
	go func() {
		_, err := once.Run(ctx, a, ledger, job, once.Monthly, func(_ context.Context, at once.Attempt) error {
			s.expireA(t, fa) // A crashes mid-run: the store hears no more of it
			started <- at.Lease
			<-resume // ... and wakes up late, its work done
			return nil
		}, lockTTL, once.WithNode("a"))
		aErr <- err
	}()
	var aLease *dlock.Lease
	select {
	case aLease = <-started:
	case err := <-aErr:
		t.Fatalf("A's Run ended before its fn ran: %v", err)
	}
	defer close(resume)

	var retried once.Attempt
	res, err := once.Run(ctx, b, ledger, job, once.Monthly, func(_ context.Context, at once.Attempt) error {
		retried = at
		select {
		case <-aLease.Done():
		default:
			t.Errorf("B's retry runs while A's lease is valid until %v", aLease.Deadline())
		}
		return nil
	}, lockTTL, once.WithNode("b"))
	if err != nil || res.Outcome != once.OutcomeRan || retried.Number != 2 || res.Record.State != once.Finished {
		t.Fatalf("B's retry of the crashed run: %+v, %v (attempt %d)", res, err, retried.Number)
	}
	if retried.Fence <= aLease.Fence() {
		t.Fatalf("the retry's fence %d is not greater than the crashed run's %d", retried.Fence, aLease.Fence())
	}

	resume <- struct{}{}
	if err := <-aErr; !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("the crashed run's late finish = %v, want ErrStaleFence", err)
	}
	if rec, err := ledger.Get(ctx, job, res.Window.ID); err != nil || rec.State != once.Finished || rec.Fence != retried.Fence || rec.Node != "b" {
		t.Fatalf("ledger after the late finish: %+v, %v; want B's finish", rec, err)
	}

	// A finished window never runs again, from either client.
	for _, l := range []*dlock.Locker{a, b} {
		res, err := once.Run(ctx, l, ledger, job, once.Monthly, func(context.Context, once.Attempt) error {
			t.Error("a finished window ran again")
			return nil
		}, lockTTL, once.NoWait())
		if err != nil || res.Outcome != once.OutcomeDone {
			t.Fatalf("Run of a finished window: %+v, %v; want done", res, err)
		}
	}
}
