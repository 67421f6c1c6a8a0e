package dlocktest

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/recipe/election"
)

// testElection is the conformance check of package election on this
// store, for every store: two campaigners A and B (two processes) on one
// election.
//
//   - A wins; its term is its lease's fence (> 0); Leader, from B, shows
//     A's value and term (or is ErrUnsupported, as Observe is, on a store
//     that cannot inspect).
//   - B's Campaign waits while A leads and wins once A resigns, with a
//     greater term; Observe (from A's Locker) delivers B.
//   - B's renewals hang (the store stops answering it): B's leadership ends
//     with ErrLeaseLost no later than its deadline (plus scheduling
//     slack), and A, campaigning meanwhile, wins only after B's deadline,
//     with a greater term.
//   - Invalid names and values are ErrInvalidArgument before any store
//     call.
func (s *suite) testElection(t TB) {
	ttl := s.h.TTL
	if ttl == 0 {
		ttl = time.Second
	}
	a, _ := s.locker(t)
	b, fb := s.locker(t)
	name := key(t, "election")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second+10*ttl)
	defer cancel()

	if _, err := election.Campaign(ctx, a, "", "a"); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("Campaign with an empty name = %v, want ErrInvalidKey", err)
	}
	if _, err := election.Campaign(ctx, a, name, "bad\nvalue"); !errors.Is(err, dlock.ErrInvalidHolder) {
		t.Fatalf("Campaign with a newline in the value = %v, want ErrInvalidHolder", err)
	}

	la, err := election.Campaign(ctx, a, name, "node-a", dlock.WithTTL(ttl))
	if s.h.NoFence {
		if !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("Campaign on a store without fences = %v (%v), want ErrUnsupported: a leader needs a term", la, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	if la.Term() == 0 || la.Term() != la.Lease().Fence() || la.Value() != "node-a" {
		t.Fatalf("leadership: term %d, fence %d, value %q", la.Term(), la.Lease().Fence(), la.Value())
	}
	_, inspects := b.Driver().(driver.Inspector)
	if inspects {
		got, err := election.Leader(ctx, b, name)
		if err != nil || got != (election.LeaderInfo{Value: "node-a", Term: la.Term()}) {
			t.Fatalf("Leader from another process = %+v, %v; want node-a, term %d", got, err, la.Term())
		}
	} else {
		if _, err := election.Leader(ctx, b, name); !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("Leader on a store that cannot inspect = %v, want ErrUnsupported", err)
		}
		if _, err := election.Observe(ctx, b, name); !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("Observe on a store that cannot inspect = %v, want ErrUnsupported", err)
		}
	}
	var observed <-chan election.LeaderInfo
	if inspects {
		observed, err = election.Observe(ctx, a, name, election.WithPollInterval(20*time.Millisecond))
		if err != nil {
			t.Fatalf("Observe: %v", err)
		}
	}

	type result struct {
		lead *election.Leadership
		at   time.Time
		err  error
	}
	campaign := func(l *dlock.Locker, value string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			lead, err := election.Campaign(ctx, l, name, value, dlock.WithTTL(ttl))
			ch <- result{lead, time.Now(), err}
		}()
		return ch
	}
	bWon := campaign(b, "node-b")
	select {
	case r := <-bWon:
		if r.err == nil {
			t.Fatalf("B won term %d while A leads term %d", r.lead.Term(), la.Term())
		}
		t.Fatalf("B's Campaign: %v", r.err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	r := <-bWon
	if r.err != nil {
		t.Fatalf("B's Campaign after A resigned: %v", r.err)
	}
	lb := r.lead
	if lb.Term() <= la.Term() {
		t.Fatalf("B's term %d not greater than A's %d", lb.Term(), la.Term())
	}
	if observed != nil {
		want := election.LeaderInfo{Value: "node-b", Term: lb.Term()}
		timer := time.NewTimer(10 * time.Second)
		defer timer.Stop()
	observe:
		for {
			select {
			case got, ok := <-observed:
				if !ok {
					t.Fatal("Observe channel closed while the election goes on")
				}
				if got == want {
					break observe
				}
			case <-timer.C:
				t.Fatalf("Observe did not deliver %+v within 10 s", want)
			}
		}
	}

	// B's store stops answering its renewals while A campaigns again.
	probe := startProbe(t)
	aWon := campaign(a, "node-a")
	s.expireA(t, fb)
	bDone := watchDone(t, lb.Lease())
	r = <-aWon
	if r.err != nil {
		t.Fatalf("A's Campaign after B stopped renewing: %v", r.err)
	}
	defer func() { _ = r.lead.Resign(context.WithoutCancel(ctx)) }()
	awaitLost(t, probe, lb.Lease(), "B's leadership", 5*time.Second+2*ttl, bDone)
	deadline := lb.Lease().Deadline()
	if !deadline.Before(r.at) {
		t.Errorf("A won %v before B's deadline", deadline.Sub(r.at))
	}
	if r.lead.Term() <= lb.Term() {
		t.Errorf("A's new term %d not greater than B's %d", r.lead.Term(), lb.Term())
	}
	if !errors.Is(context.Cause(lb.Context()), dlock.ErrLeaseLost) {
		t.Errorf("B's leadership context ended with cause %v, want ErrLeaseLost", context.Cause(lb.Context()))
	}
	fb.BlockRenewals(false)
}
