package election_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
	"github.com/dlock-dev/dlock/recipe/election"
)

// renewCall is one renewal as the store saw it.
type renewCall struct {
	start, deadline time.Time // deadline: the renewal ctx's; zero when it had none
}

// hangingDriver records every renewal's context deadline and, once told
// to, makes renewals hang: until their context ends (a store that stops
// answering), or, with ignoreCtx, until release is closed (a client whose
// renewal has no timeout at all: the Kubernetes bug).
type hangingDriver struct {
	*memdriver.Driver
	mu        sync.Mutex
	calls     []renewCall
	hang      bool
	ignoreCtx bool
	release   chan struct{}
}

func (h *hangingDriver) Renew(ctx context.Context, key, owner string, ttl time.Duration) error {
	c := renewCall{start: time.Now()}
	c.deadline, _ = ctx.Deadline()
	h.mu.Lock()
	h.calls = append(h.calls, c)
	hang, ignore := h.hang, h.ignoreCtx
	h.mu.Unlock()
	if !hang {
		return h.Driver.Renew(ctx, key, owner, ttl)
	}
	if ignore {
		<-h.release
		return errors.New("hangingDriver: renewal answered too late")
	}
	<-ctx.Done()
	return ctx.Err()
}

func (h *hangingDriver) snapshot() []renewCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]renewCall(nil), h.calls...)
}

// TestLeadership_HungRenewalLosesAtDeadline checks the root heartbeat's
// bound: every renewal's context ends no later than the lease's validity
// deadline (the time left, not the op timeout), and leadership ends at the
// deadline even when a renewal ignores its context and never returns, so
// a leader whose store stops answering cannot keep acting past its lease.
func TestLeadership_HungRenewalLosesAtDeadline(t *testing.T) {
	for _, ignoreCtx := range []bool{false, true} {
		name := "RenewalHonoursCtx"
		if ignoreCtx {
			name = "RenewalNeverReturns"
		}
		t.Run(name, func(t *testing.T) {
			const ttl = 300 * time.Millisecond
			const opTimeout = 20 * time.Second // far beyond the TTL: the bound must come from the deadline
			st := memdriver.NewStore()
			hd := &hangingDriver{Driver: memdriver.New(st), release: make(chan struct{})}
			defer close(hd.release)
			l := dlock.New(hd, dlock.WithOpTimeout(opTimeout))
			defer l.Close()
			other := dlock.New(memdriver.New(st), dlock.WithBackoff(time.Millisecond, 5*time.Millisecond))
			defer other.Close()

			lead, err := election.Campaign(t.Context(), l, "e", "a", dlock.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			// Let a few renewals pass, then make them hang.
			time.Sleep(ttl)
			if lead.Err() != nil {
				t.Fatalf("lost before the fault: %v", lead.Err())
			}
			hd.mu.Lock()
			hd.hang, hd.ignoreCtx = true, ignoreCtx
			hd.mu.Unlock()
			faultAt := time.Now()

			won := make(chan time.Time, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				b, err := election.Campaign(ctx, other, "e", "b", dlock.WithTTL(ttl))
				if err != nil {
					won <- time.Time{}
					return
				}
				won <- time.Now()
				_ = b.Resign(context.Background())
			}()

			select {
			case <-lead.Done():
			case <-time.After(5 * time.Second):
				t.Fatalf("leadership still held 5 s after renewals hung (TTL %v, op timeout %v)", ttl, opTimeout)
			}
			doneAt := time.Now()
			deadline := lead.Lease().Deadline()
			if !errors.Is(lead.Err(), dlock.ErrLeaseLost) || !errors.Is(context.Cause(lead.Context()), dlock.ErrLeaseLost) {
				t.Fatalf("Err %v, cause %v: want ErrLeaseLost", lead.Err(), context.Cause(lead.Context()))
			}
			const slack = 250 * time.Millisecond // timer and scheduling delay on a loaded machine
			if late := doneAt.Sub(deadline); late > slack {
				t.Errorf("Done closed %v after the lease deadline (allowed %v)", late, slack)
			}
			if held := doneAt.Sub(faultAt); held > ttl+slack {
				t.Errorf("leadership lasted %v after the renewals hung, more than TTL %v (+%v)", held, ttl, slack)
			}
			wonAt := <-won
			if wonAt.IsZero() {
				t.Fatal("the other campaigner never won")
			}
			if !deadline.Before(wonAt) {
				t.Errorf("another campaigner won %v before the leader's deadline", deadline.Sub(wonAt))
			}
			calls := hd.snapshot()
			if len(calls) < 2 {
				t.Fatalf("only %d renewals seen", len(calls))
			}
			for i, c := range calls {
				if c.deadline.IsZero() {
					t.Errorf("renewal %d had no deadline", i)
					continue
				}
				if left := c.deadline.Sub(c.start); left > ttl {
					t.Errorf("renewal %d was given %v, more than the TTL %v (the time left)", i, left, ttl)
				}
			}
			if last := calls[len(calls)-1]; last.deadline.After(deadline) {
				t.Errorf("the hung renewal's deadline is %v after the lease deadline", last.deadline.Sub(deadline))
			}
			t.Logf("renewals %d; Done %v after the deadline, %v after the fault; other campaigner won %v after the deadline",
				len(calls), doneAt.Sub(deadline), doneAt.Sub(faultAt), wonAt.Sub(deadline))
		})
	}
}

var _ driver.Driver = (*hangingDriver)(nil)
