package redisdriver

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestResume_AnotherDriverKeepsFence: a grant made by driver A is resumed
// by driver B (another process) against a real redis-server: same fence,
// a full TTL again, renewals by B work, A's owner-checked Release after
// the resume releases the same grant (one grant, one owner token), and a
// wrong fence, a wrong owner, a released grant and an expired one are
// driver.ErrLeaseLost that change nothing.
func TestResume_AnotherDriverKeepsFence(t *testing.T) {
	r := testservers.StartRedis(t)
	a, b := openDriver(t, r.URL()), openDriver(t, r.URL())
	ctx := t.Context()
	const key, owner = "resume/{k} ✓", "0123456789abcdef0123456789abcdef"
	req := driver.AcquireRequest{Key: key, Owner: owner, TTL: 300 * time.Millisecond, Holder: "first run"}
	g, err := a.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		owner string
		fence uint64
	}{
		{"wrong fence", owner, g.Fence + 1},
		{"wrong owner", "fedcba9876543210fedcba9876543210", g.Fence},
	} {
		r2 := req
		r2.Owner = tc.owner
		if _, err := b.Resume(ctx, r2, tc.fence); !errors.Is(err, driver.ErrLeaseLost) {
			t.Errorf("%s: Resume = %v, want ErrLeaseLost", tc.name, err)
		}
	}
	req.TTL = 2 * time.Second
	rg, err := b.Resume(ctx, req, g.Fence)
	if err != nil {
		t.Fatalf("Resume from another driver: %v", err)
	}
	if rg.Fence != g.Fence || rg.Recheck == nil {
		t.Errorf("resumed grant: fence %d (want %d), Recheck %v (want a channel: hints are on)", rg.Fence, g.Fence, rg.Recheck)
	}
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Fence != g.Fence || info.Holder != "first run" || info.TTL != 2*time.Second {
		t.Errorf("after Resume, Inspect = %+v, %v; want fence %d, holder kept, TTL 2s", info, err, g.Fence)
	}
	time.Sleep(500 * time.Millisecond) // past the first TTL: the resume extended it
	if err := b.Renew(ctx, key, owner, 2*time.Second); err != nil {
		t.Fatalf("Renew by the resuming driver: %v", err)
	}
	if err := a.Release(ctx, key, owner); err != nil {
		t.Fatalf("Release by the first driver after the resume: %v", err)
	}
	if _, err := b.Resume(ctx, req, g.Fence); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("Resume of a released grant = %v, want ErrLeaseLost", err)
	}

	req.TTL = 200 * time.Millisecond
	g, err = a.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if _, err := b.Resume(ctx, req, g.Fence); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("Resume of an expired grant = %v, want ErrLeaseLost", err)
	}
	if _, err := b.Resume(ctx, driver.AcquireRequest{Key: key, Owner: "bad owner", TTL: time.Second}, 1); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Errorf("Resume with an invalid owner token = %v, want ErrInvalidArgument", err)
	}
}

// TestResume_ForceReleaseRechecksResumedLease: a lease resumed through
// Locker.Resume gets the recheck subscription of a fresh grant: when an
// operator force-releases it, the resumed holder learns of the loss within
// a second, long before its next renewal (TTL 30 s).
func TestResume_ForceReleaseRechecksResumedLease(t *testing.T) {
	r := testservers.StartRedis(t)
	first := dlock.New(openDriver(t, r.URL()), dlock.WithTTL(30*time.Second))
	defer first.Close()
	bd := openDriver(t, r.URL())
	second := dlock.New(bd)
	defer second.Close()
	admin := dlock.New(openDriver(t, r.URL()))
	defer admin.Close()
	ctx := t.Context()
	const key = "resume/{recheck}"
	ls, err := first.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	tok := ls.Token()
	rs, err := second.Resume(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Fence() != ls.Fence() {
		t.Fatalf("resumed fence %d, want %d", rs.Fence(), ls.Fence())
	}
	awaitSubscribers(t, r, bd, key, 2)
	if _, err := admin.ForceRelease(ctx, key, "test: resumed holder presumed dead"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rs.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("resumed lease not lost 5 s after a force release")
	}
	if !errors.Is(rs.Err(), dlock.ErrLeaseLost) {
		t.Errorf("resumed lease Err = %v, want ErrLeaseLost", rs.Err())
	}
	_ = ls.Release(context.Background())
}
