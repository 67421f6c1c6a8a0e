package clustertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/drivers/memdriver"
	"github.com/dlock-dev/dlock/server/historytest"
)

// TestRegister checks the fenced register's rule: equal or greater fences
// are accepted, a smaller one is refused with ErrStaleWrite, per key.
func TestRegister(t *testing.T) {
	r := NewRegister()
	for _, f := range []uint64{3, 3, 7} {
		if err := r.Write("k", f); err != nil {
			t.Fatalf("write %d: %v", f, err)
		}
	}
	if err := r.Write("k", 5); !errors.Is(err, ErrStaleWrite) {
		t.Fatalf("write 5 after 7: %v, want ErrStaleWrite", err)
	}
	if err := r.Write("other", 1); err != nil {
		t.Fatalf("another key: %v", err)
	}
	if a, f := r.Counts(); a != 4 || f != 1 {
		t.Fatalf("counts %d accepted, %d refused; want 4, 1", a, f)
	}
}

// TestRecordingDriver records a root client's calls on the in-memory store
// and checks that the history has them with their outcomes, and that a
// history where a second owner is granted a held key is caught.
func TestRecordingDriver(t *testing.T) {
	rec := historytest.NewRecorder()
	st := memdriver.NewStore()
	open := func(id int) *dlock.Locker {
		rd, err := Record(memdriver.New(st), rec, id)
		if err != nil {
			t.Fatal(err)
		}
		l := dlock.New(rd, dlock.WithTTL(300*time.Millisecond))
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	a, b := open(1), open(2)
	ctx := context.Background()
	ls, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	time.Sleep(250 * time.Millisecond) // a renewal at TTL/3
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb, err := b.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	_ = lb.Release(ctx)
	ops := rec.Ops()
	rep, err := historytest.Check(ops)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(0); err != nil {
		t.Fatal(err)
	}
	s := rep.Stats
	if s.Grants != 2 || s.AcquireFailed != 1 || s.RenewOK == 0 || s.Releases != 2 {
		t.Fatalf("stats %s; want 2 grants, 1 refused, renewals, 2 releases", s.Summary())
	}
	// Forge a second grant of the key to client 2 while client 1 was
	// valid: the checker must see it.
	first := ops[0]
	forged := historytest.Op{Client: 2, Kind: historytest.Acquire, Key: "k", Owner: "forged", TTL: first.TTL,
		Invoke: first.Complete, Complete: first.Complete + time.Millisecond, Outcome: historytest.OK,
		Fence: first.Fence + 100, GrantTTL: first.GrantTTL}
	rep, err = historytest.Check(append(ops, forged))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Violations) == 0 {
		t.Fatal("a grant to another owner while the holder was valid was not reported")
	}
}
