package redlockdriver_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestResume_QuorumKeepsFence: against 5 real redis-servers, a grant made
// by driver A is resumed by driver B: same fence; a key missing on a
// minority of nodes is repaired (set again with the owner token) so a later
// renewal counts them; a token whose fence was never issued, another
// owner, a key missing on a majority, and a released grant are
// driver.ErrLeaseLost, and a refused resume renews no node's key.
func TestResume_QuorumKeepsFence(t *testing.T) {
	rs := testservers.StartRedisN(t, nodes)
	a, b := openDriver(t, redlockURL(rs)), openDriver(t, redlockURL(rs))
	ctx := t.Context()
	clients := make([]*redis.Client, len(rs))
	for i, r := range rs {
		clients[i] = redis.NewClient(&redis.Options{Addr: r.Addr()})
		defer clients[i].Close()
	}
	const key, owner = "resume/k", "0123456789abcdef0123456789abcdef"
	lockKey := "dlock:redlock:lock:" + key
	req := driver.AcquireRequest{Key: key, Owner: owner, TTL: 2 * time.Second}
	g, err := a.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	long := req
	long.TTL = 24 * time.Hour // a refused resume must not renew to it
	if _, err := b.Resume(ctx, long, g.Fence+1_000_000); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("Resume with a fence never issued = %v, want ErrLeaseLost", err)
	}
	other := long
	other.Owner = "fedcba9876543210fedcba9876543210"
	if _, err := b.Resume(ctx, other, g.Fence); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("Resume by another owner = %v, want ErrLeaseLost", err)
	}
	for i, c := range clients {
		if left, err := c.PTTL(ctx, lockKey).Result(); err != nil || left > req.TTL {
			t.Errorf("node %d: the key's expiry after refused resumes = %v, %v; want at most the grant's TTL %v (a refusal renews nothing)", i, left, err, req.TTL)
		}
	}

	// A minority (2 of 5) lost the key: the resume succeeds and repairs it.
	for _, c := range clients[:2] {
		if err := c.Del(ctx, lockKey).Err(); err != nil {
			t.Fatal(err)
		}
	}
	rg, err := b.Resume(ctx, req, g.Fence)
	if err != nil {
		t.Fatalf("Resume with the key on 3 of 5 nodes: %v", err)
	}
	if rg.Fence != g.Fence {
		t.Errorf("resumed fence %d, want %d", rg.Fence, g.Fence)
	}
	for i, c := range clients {
		v, err := c.Get(ctx, lockKey).Result()
		if err != nil || v != owner {
			t.Errorf("node %d after the resume: %q, %v; want the owner token (repaired)", i, v, err)
		}
		if ttl := c.PTTL(ctx, lockKey).Val(); ttl < time.Second {
			t.Errorf("node %d: key expires in %v, want about the 2 s TTL", i, ttl)
		}
	}
	if err := b.Renew(ctx, key, owner, 2*time.Second); err != nil {
		t.Fatalf("Renew by the resuming driver: %v", err)
	}
	// The next grant of the key after this one gets a greater fence.
	if err := b.Release(ctx, key, owner); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Resume(ctx, req, g.Fence); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("Resume of a released grant = %v, want ErrLeaseLost", err)
	}
	req.Owner = "11111111111111111111111111111111"
	g2, err := a.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if g2.Fence <= g.Fence {
		t.Errorf("next grant's fence %d not greater than the resumed %d", g2.Fence, g.Fence)
	}
	// A majority (3 of 5) lost the key: no resume.
	for _, c := range clients[:3] {
		if err := c.Del(ctx, lockKey).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Resume(ctx, req, g2.Fence); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("Resume with the key missing on 3 of 5 nodes = %v, want ErrLeaseLost", err)
	}
	_ = a.Release(ctx, key, req.Owner)
}
