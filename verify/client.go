package verify

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/server/historytest"
)

// clientFault is a fault armed on one client for its next hold.
type clientFault struct {
	kind string // "pause" or "clock-jump"
	// amount says, for the n-th client to take the fault (from 0), how
	// long its process stops or how far its clock falls behind.
	amount func(n int) time.Duration
	// budget is how many more holds may take it; shared by every client
	// it is armed on, so that the next holders take it, whoever they are.
	budget *atomic.Int32
	total  int32
}

// taken is one client's share of an armed fault.
type taken struct {
	kind   string
	amount time.Duration
}

// client is one lock user: a Locker of its own (a process), over a
// FaultDriver and a RecordingDriver.
type client struct {
	id     int
	locker *dlock.Locker
	faults *dlocktest.FaultDriver
	rec    *recorder
	reg    *Register
	keys   []string
	ttl    time.Duration
	rng    *rand.Rand

	mu    sync.Mutex
	armed *clientFault
}

func (c *client) arm(f *clientFault) {
	c.mu.Lock()
	c.armed = f
	c.mu.Unlock()
}

// take returns the armed fault for this hold, if the budget has room.
func (c *client) take() *taken {
	c.mu.Lock()
	f := c.armed
	c.mu.Unlock()
	if f == nil {
		return nil
	}
	left := f.budget.Add(-1)
	if left < 0 {
		return nil
	}
	return &taken{kind: f.kind, amount: f.amount(int(f.total - 1 - left))}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// loop acquires, works and releases until ctx ends.
func (c *client) loop(ctx context.Context) {
	for ctx.Err() == nil {
		key := c.keys[c.rng.IntN(len(c.keys))]
		actx, cancel := context.WithTimeout(ctx, 3*c.ttl)
		inv := c.rec.now()
		lease, err := c.locker.Acquire(actx, key)
		cancel()
		a := Attempt{Client: c.id, Key: key, Invoke: inv, Complete: c.rec.now()}
		if err != nil {
			if ctx.Err() != nil {
				return // the run ended, not the store
			}
			a.Err = err.Error()
			c.rec.attempt(a)
			sleep(ctx, c.ttl/10)
			continue
		}
		c.rec.attempt(a)
		c.hold(ctx, lease)
	}
}

// margin is the validity a client wants left before it sends a write.
func (c *client) margin() time.Duration { return c.ttl / 5 }

// hold works under lease: while the lease is valid (by the client's own
// clock, with a write's margin left), it writes the fence to the register
// every TTL/10, for 0.3 to 1.2 TTLs (renewals keep it), then releases. An
// armed fault changes what "valid by its own clock" means: a paused
// process checks, stops (its driver frozen: no heartbeat leaves), and
// writes on waking without looking again; a client whose clock fell
// behind by amount stops renewing (its timers are late too) and keeps
// writing until its clock says the lease ended.
func (c *client) hold(ctx context.Context, lease *dlock.Lease) {
	h := Hold{Client: c.id, Key: lease.Key(), Owner: lease.Owner(), Fence: lease.Fence(), Granted: c.rec.now()}
	h.LastAct = h.Granted
	fault := c.take()
	work := time.Duration(float64(c.ttl) * (0.3 + 0.9*c.rng.Float64()))
	stop := time.Now().Add(work)
	var jump time.Duration
	if fault != nil {
		h.Fault = fault.kind
		switch fault.kind {
		case "clock-jump":
			jump = fault.amount
			c.faults.BlockRenewalsOf(lease.Key(), true)
			defer c.faults.BlockRenewalsOf(lease.Key(), false)
			stop = lease.Deadline().Add(jump)
		case "pause":
			h.Fault = fmt.Sprintf("pause %.1fx TTL", float64(fault.amount)/float64(c.ttl))
		}
	}
	if fault == nil {
		// The moment the holder learns its lease ended (pushed loss, a
		// refused renewal, its deadline) ends its claim on the key, as a
		// release would: the checkers must not count a grant made after
		// that against it. A faulted holder (paused, clock behind) is not
		// told in time, by design, so its claim runs to its validity end.
		stopWatch := make(chan struct{})
		defer close(stopWatch)
		go func() {
			select {
			case <-lease.Done():
				t := c.rec.now()
				if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
					return // released (or the Locker closed): the Release is recorded
				}
				c.rec.ops.Add(historytest.Op{Client: c.id, Kind: historytest.Lost, Key: lease.Key(), Owner: lease.Owner(), Invoke: t, Complete: t, Outcome: historytest.OK, Note: "holder told"})
			case <-stopWatch:
			}
		}()
	}
	paused := false
	for ctx.Err() == nil {
		if jump == 0 && lease.Err() != nil {
			break
		}
		if time.Until(lease.Deadline())+jump <= c.margin() {
			break
		}
		if fault != nil && fault.kind == "pause" && !paused {
			paused = true
			c.faults.Freeze(true)
			sleep(ctx, fault.amount)
			c.faults.Freeze(false)
		}
		w := c.write(ctx, lease)
		h.LastAct = w.Invoke
		if time.Now().After(stop) {
			break
		}
		sleep(ctx, c.ttl/10)
	}
	h.Ended, h.EndReason = c.rec.now(), "released"
	if lease.Err() != nil {
		h.EndReason = "lost"
	}
	rctx, cancel := context.WithTimeout(context.Background(), c.ttl)
	_ = lease.Release(rctx)
	cancel()
	c.rec.hold(h)
}

func (c *client) write(ctx context.Context, lease *dlock.Lease) Write {
	w := Write{Client: c.id, Key: lease.Key(), Owner: lease.Owner(), Fence: lease.Fence(), Invoke: c.rec.now()}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	err := c.reg.Write(wctx, w.Key, w.Owner, w.Fence)
	cancel()
	w.Complete = c.rec.now()
	switch {
	case err == nil:
		w.Accepted = true
	case isStale(err):
		w.Refused = true
	default:
		w.Err = err.Error()
	}
	c.rec.write(w)
	return w
}
