package historytest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// acquireShared is caller.acquire for a grant of a kind: Shared of limit
// permits, or Exclusive.
func (c *caller) acquireShared(ctx context.Context, cl dlockv1.LockClient, key, owner string, ttl time.Duration, wait, shared bool, limit int) (Op, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*ttl)
	defer cancel()
	op := Op{Client: c.id, Kind: Acquire, Key: key, Owner: owner, TTL: ttl, Shared: shared, Limit: limit}
	op.Invoke = c.rec.Now()
	resp, err := cl.Acquire(ctx, &dlockv1.AcquireRequest{Key: key, Owner: owner, Ttl: durationpb.New(ttl), Wait: wait, Shared: shared, Limit: uint32(limit)})
	op.Complete = c.rec.Now()
	op.Outcome = outcome(err)
	if err != nil {
		op.Note = errNote(err)
	} else {
		op.Fence = resp.GetFence()
		op.GrantTTL = resp.GetTtl().AsDuration()
		op.ClaimWithin = resp.GetClaimWithin().AsDuration()
	}
	op.ID = c.rec.Add(op)
	return op, err
}

// TestHistory_SharedGrantsNeverOverLimit: clients of a semaphore of 2
// permits and of a read-write lock (readers and writers) on a real dlockd
// try and wait, claim handed-over grants, renew, sometimes stop renewing
// past the TTL, and release; the checked history has no permit holder
// over the limit, no writer granted while another grant is valid, and no
// fence regression or reuse.
func TestHistory_SharedGrantsNeverOverLimit(t *testing.T) {
	srv := startServer(t)
	rec := NewRecorder()
	s := seed(t)
	t.Logf("seed %d", s)
	ctx := t.Context()
	const clients = 8
	deadline := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	for i := range clients {
		cl := dial(t, srv.Addr())
		c := &caller{t: t, id: i, rec: rec, badArg: new(atomic.Int64)}
		rng := rand.New(rand.NewPCG(s, uint64(i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, shared, limit := "sem", true, 2
			if i >= clients/2 {
				key, limit = "rw", 0
				shared = i%3 != 0 // some writers
			}
			for n := 0; time.Now().Before(deadline); n++ {
				ttl := time.Duration(200+rng.IntN(300)) * time.Millisecond
				owner := fmt.Sprintf("owner-%d-%06d", i, n)
				op, err := c.acquireShared(ctx, cl, key, owner, ttl, rng.IntN(3) > 0, shared, limit)
				if err != nil {
					time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
					continue
				}
				pause := rng.IntN(6) == 0
				if op.ClaimWithin > 0 && !pause {
					c.renew(ctx, cl, key, owner, ttl, "claim")
				}
				hold := time.Duration(rng.IntN(int(2 * ttl)))
				for end := time.Now().Add(hold); time.Now().Before(end); {
					time.Sleep(ttl / 3)
					if !pause && c.renew(ctx, cl, key, owner, ttl, "").Outcome != OK {
						break
					}
				}
				c.release(ctx, cl, key, owner)
			}
		}()
	}
	wg.Wait()
	rep, err := Check(rec.Ops())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", rep.Stats.Summary())
	if rep.Stats.Grants < 20 {
		t.Fatalf("only %d grants in the history", rep.Stats.Grants)
	}
	if err := rep.Err(10); err != nil {
		t.Fatal(err)
	}
}
