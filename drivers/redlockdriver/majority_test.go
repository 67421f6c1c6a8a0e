package redlockdriver_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/redlockdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// The tests in this file replay a public bug report of another Redlock
// implementation against dlock: a renewal that re-created a vanished lock
// key counted that node toward its majority, so a holder never learned that
// someone else had held the lock in between. A node where the key is
// missing is evidence that the lease may have been taken: it may be
// repaired, but it counts only when the key was found holding the owner
// token.

const (
	majorityTTL = 3 * time.Second
	// heartbeat is the root package's default renewal interval, TTL/3.
	heartbeat = majorityTTL / 3
)

// lockKey is the Redis name of key's lock on every node.
func lockKey(key string) string { return "dlock:redlock:lock:" + key }

// openLocker opens a Locker over the nodes by URL, as an application would.
func openLocker(t *testing.T, rs []*testservers.Redis) *dlock.Locker {
	t.Helper()
	l, err := dlock.Open(t.Context(), redlockURL(rs), dlock.WithTTL(majorityTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// deleteOn deletes key's lock on the given nodes, as an eviction, a FLUSHALL
// or a restart without persistence would.
func deleteOn(t *testing.T, key string, rs ...*testservers.Redis) {
	t.Helper()
	for _, r := range rs {
		if n, err := client(t, r).Del(t.Context(), lockKey(key)).Result(); err != nil || n != 1 {
			t.Fatalf("DEL %s on %s = %d, %v; want 1", lockKey(key), r.Addr(), n, err)
		}
	}
}

// holderOn returns the owner token of key's lock on r, or "" when absent.
func holderOn(t *testing.T, r *testservers.Redis, key string) string {
	t.Helper()
	v, err := client(t, r).Get(t.Context(), lockKey(key)).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// watchLost returns a channel that receives the time done closes, timed
// from now on: start it before whatever may delay the check.
func watchLost(done <-chan struct{}) <-chan time.Time {
	at := make(chan time.Time, 1)
	go func() { <-done; at <- time.Now() }()
	return at
}

// awaitLost waits until the lease whose loss lost (from watchLost) times
// is lost, at most until its validity deadline: a loss reported by the
// store is prompt, not the deadline's. It checks that the loss came from a
// renewal that found no majority (a QuorumError matching ErrLeaseLost),
// not from the deadline.
func awaitLost(t *testing.T, lost <-chan time.Time, err func() error, deadline time.Time, since time.Time) {
	t.Helper()
	var at time.Time
	select {
	case at = <-lost:
	case <-time.After(time.Until(deadline) - 100*time.Millisecond):
		t.Fatalf("lease still held %v after its key vanished from a majority (Err = %v); want it lost at the next renewal", time.Since(since), err())
	}
	took := at.Sub(since)
	if !errors.Is(err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err after Done = %v, want ErrLeaseLost", err())
	}
	var qe *redlockdriver.QuorumError
	if !errors.As(err(), &qe) || !errors.Is(qe.Err, driver.ErrLeaseLost) {
		t.Fatalf("Err = %v; want the renewal's QuorumError (lost by the store's answer, not by the deadline)", err())
	}
	if took > heartbeat+time.Second {
		t.Fatalf("lease lost %v after the deletion; want within a heartbeat (%v) and slack", took, heartbeat)
	}
}

// TestRenew_VanishedKeyDoesNotCountTowardMajority: A holds k; its key
// vanishes from some nodes; B takes k through them, works and releases
// before A's next renewal. A must learn at that renewal that it no longer
// had a majority, whatever its repairs would have re-created.
func TestRenew_VanishedKeyDoesNotCountTowardMajority(t *testing.T) {
	for _, tc := range []struct {
		name    string
		deleted []int // nodes whose key vanishes
	}{
		{"TwoOfThree", []int{1, 2}},
		{"AllThree", []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := testservers.StartRedisN(t, 3)
			a, b := openLocker(t, rs), openLocker(t, rs)
			ctx := t.Context()
			const k = "k"
			start := time.Now()
			la, err := a.TryAcquire(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			// Just after A's first renewal (at TTL/3), so that B's whole
			// tenure falls between two renewals of A.
			time.Sleep(time.Until(start.Add(heartbeat + 150*time.Millisecond)))
			var gone []*testservers.Redis
			for _, i := range tc.deleted {
				gone = append(gone, rs[i])
			}
			lost := watchLost(la.Done())
			deleteOn(t, k, gone...)
			deleted := time.Now()
			lb, err := b.TryAcquire(ctx, k)
			if err != nil {
				t.Fatalf("B's TryAcquire on a key vanished from a majority = %v", err)
			}
			if lb.Fence() <= la.Fence() {
				t.Fatalf("B's fence %d not greater than A's %d", lb.Fence(), la.Fence())
			}
			time.Sleep(200 * time.Millisecond) // B works
			if err := lb.Release(ctx); err != nil {
				t.Fatal(err)
			}
			awaitLost(t, lost, la.Err, la.Deadline(), deleted)
			if err := la.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
				t.Fatalf("A.Release after the loss = %v, want ErrLeaseLost", err)
			}
			// A's loss left nothing behind: k is free on every node.
			for i, r := range rs {
				if h := holderOn(t, r, k); h != "" {
					t.Errorf("node %d still holds k for %q after A's loss", i, h)
				}
			}
			if lc, err := b.TryAcquire(ctx, k); err != nil {
				t.Fatalf("TryAcquire after A's loss = %v", err)
			} else {
				_ = lc.Release(ctx)
			}
		})
	}
}

// TestRenew_VanishedOnMinorityIsRepaired: a key missing on one node of three
// leaves a majority where it was found: the lease stays held and the node is
// repaired with the owner token.
func TestRenew_VanishedOnMinorityIsRepaired(t *testing.T) {
	rs := testservers.StartRedisN(t, 3)
	a, b := openLocker(t, rs), openLocker(t, rs)
	ctx := t.Context()
	const k = "k"
	la, err := a.TryAcquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	deleteOn(t, k, rs[1])
	if _, err := b.TryAcquire(ctx, k); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("B's TryAcquire with A on 2 of 3 nodes = %v, want ErrNotAcquired", err)
	}
	before := la.Deadline()
	// Await the repair by A's next renewal.
	for holderOn(t, rs[1], k) != la.Owner() {
		select {
		case <-la.Done():
			t.Fatalf("lease lost with its key missing on 1 node of 3: %v", la.Err())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(before) > majorityTTL {
			t.Fatal("node 1 not repaired within a TTL")
		}
	}
	// The renewal that repaired it is confirmed just after the write.
	for !la.Deadline().After(before) {
		if la.Err() != nil {
			t.Fatalf("lease lost: %v", la.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if la.Err() != nil {
		t.Fatalf("Err = %v, want nil", la.Err())
	}
	if _, err := b.TryAcquire(ctx, k); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("B's TryAcquire after the repair = %v, want ErrNotAcquired", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("A.Release = %v, want nil", err)
	}
}

// TestAcquireAll_MemberVanishedLosesSet: one member's key vanishing from a
// majority loses the whole set, as on every other store, and releasing the
// set frees the other key.
func TestAcquireAll_MemberVanishedLosesSet(t *testing.T) {
	rs := testservers.StartRedisN(t, 3)
	a, b := openLocker(t, rs), openLocker(t, rs)
	ctx := t.Context()
	set, err := a.AcquireAll(ctx, []string{"set/b", "set/a"})
	if err != nil {
		t.Fatal(err)
	}
	lost := watchLost(set.Done())
	deleteOn(t, "set/a", rs[0], rs[2])
	deleted := time.Now()
	lead := set.Leases()[0]
	awaitLost(t, lost, set.Err, lead.Deadline(), deleted)
	if err := set.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("set.Release = %v, want ErrLeaseLost", err)
	}
	for i, r := range rs {
		for _, k := range []string{"set/a", "set/b"} {
			if h := holderOn(t, r, k); h != "" {
				t.Errorf("node %d still holds %s for %q after the set was lost and released", i, k, h)
			}
		}
	}
	lb, err := b.TryAcquire(ctx, "set/b")
	if err != nil {
		t.Fatalf("TryAcquire of the other key after the set's release = %v", err)
	}
	_ = lb.Release(ctx)
}

// TestRenew_RepairNeedsAMajorityFound checks the driver's rule directly on
// five nodes: the key missing on three is a loss at once (nothing repaired,
// the rest removed); a node that does not answer is no evidence either way,
// and a node missing the key is not repaired while no majority was found,
// so a later renewal cannot count a key re-created in a window where
// another owner might have held it.
func TestRenew_RepairNeedsAMajorityFound(t *testing.T) {
	rs := testservers.StartRedisN(t, nodes)
	d := openDriver(t, redlockURL(rs))
	ctx := t.Context()

	t.Run("MissingOnMajorityIsLost", func(t *testing.T) {
		r := req("missing3", 5*time.Second)
		if _, err := d.TryAcquire(ctx, r); err != nil {
			t.Fatal(err)
		}
		deleteOn(t, r.Key, rs[0], rs[1], rs[2])
		err := d.Renew(ctx, r.Key, r.Owner, 5*time.Second)
		if !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew with the key on 2 of 5 = %v, want ErrLeaseLost", err)
		}
		for i, n := range rs {
			if h := holderOn(t, n, r.Key); h != "" {
				t.Errorf("node %d holds %q after the loss; want nothing repaired and the rest removed", i, h)
			}
		}
	})

	t.Run("UnansweredIsNoEvidence", func(t *testing.T) {
		r := req("unanswered", 5*time.Second)
		if _, err := d.TryAcquire(ctx, r); err != nil {
			t.Fatal(err)
		}
		// Found on 2, missing on 1, no answer from 2: neither a majority
		// found nor a majority against.
		deleteOn(t, r.Key, rs[0])
		if err := each(rs[3:], (*testservers.Redis).Stop); err != nil {
			t.Fatal(err)
		}
		err := d.Renew(ctx, r.Key, r.Owner, 5*time.Second)
		if !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew with 2 found, 1 missing, 2 silent = %v, want ErrUnavailable", err)
		}
		if h := holderOn(t, rs[0], r.Key); h != "" {
			t.Fatalf("node 0 repaired to %q without a majority found", h)
		}
		if err := each(rs[3:], (*testservers.Redis).Start); err != nil {
			t.Fatal(err)
		}
		// Back: found on 4 (AOF kept the key), so node 0 is repaired.
		if err := d.Renew(ctx, r.Key, r.Owner, 5*time.Second); err != nil {
			t.Fatalf("Renew with the nodes back = %v", err)
		}
		if h := holderOn(t, rs[0], r.Key); h != r.Owner {
			t.Fatalf("node 0 holds %q after a renewal that found a majority; want the owner token", h)
		}
		if err := d.Release(ctx, r.Key, r.Owner); err != nil {
			t.Fatal(err)
		}
	})
}
