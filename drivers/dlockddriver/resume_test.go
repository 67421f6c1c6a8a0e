package dlockddriver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/server/servertest"
)

func resumeLocker(t *testing.T, addr string, opts ...dlock.Option) (*dlock.Locker, driver.Driver) {
	t.Helper()
	d, err := openURL(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	l := dlock.New(d, opts...)
	t.Cleanup(func() { _ = l.Close() })
	return l, d
}

// TestResume_AnotherDriverKeepsFence: against a real dlockd, a grant made
// by one Driver is resumed by another (a restarted process): same fence
// (the server's CheckFence agrees), renewals by the second work, a wrong
// fence changes nothing, and after the release the token is ErrLeaseLost.
func TestResume_AnotherDriverKeepsFence(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	first, _ := resumeLocker(t, srv.Addr(), dlock.WithTTL(time.Second))
	second, sd := resumeLocker(t, srv.Addr())
	ctx := t.Context()
	const key = "resume/dlockd ✓"
	ls, err := first.Acquire(ctx, key, dlock.WithHolder("first run"))
	if err != nil {
		t.Fatal(err)
	}
	tok := ls.Token()
	wrong := tok
	wrong.Fence++
	if _, err := second.Resume(ctx, wrong); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Resume with a wrong fence = %v, want ErrLeaseLost", err)
	}
	rs, err := second.Resume(ctx, tok)
	if err != nil {
		t.Fatalf("Resume from another driver: %v", err)
	}
	if rs.Fence() != ls.Fence() {
		t.Errorf("resumed fence %d, want %d", rs.Fence(), ls.Fence())
	}
	cur, err := sd.(interface {
		CheckFence(context.Context, string, uint64) (bool, error)
	}).CheckFence(ctx, key, tok.Fence)
	if err != nil || !cur {
		t.Errorf("CheckFence(%d) after the resume = %v, %v; want current", tok.Fence, cur, err)
	}
	// The first process is gone: its lease object must not release the
	// grant now, so end it by closing its locker only after the resumed
	// lease has renewed past the TTL on its own.
	time.Sleep(1500 * time.Millisecond)
	if err := rs.Err(); err != nil {
		t.Fatalf("resumed lease ended: %v", err)
	}
	if err := rs.Release(ctx); err != nil {
		t.Fatalf("Release of the resumed lease: %v", err)
	}
	if _, err := second.Resume(ctx, tok); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Resume of a released grant = %v, want ErrLeaseLost", err)
	}
	// The first lease renews against a released grant: lost, nothing else.
	select {
	case <-ls.Done():
	case <-time.After(5 * time.Second):
		t.Error("the first lease still held 5 s after its grant was released by the resumed one")
	}
}

// TestResume_PushedLoss: a lease resumed on dlockd hears of its loss by
// push, as a fresh grant does: force-released by an operator, it ends
// within a second, long before its next renewal (TTL 30 s).
func TestResume_PushedLoss(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	first, fd := resumeLocker(t, srv.Addr(), dlock.WithTTL(30*time.Second))
	second, _ := resumeLocker(t, srv.Addr())
	admin, _ := resumeLocker(t, srv.Addr())
	ctx := t.Context()
	const key = "resume/pushed"
	ls, err := first.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// The first process dies: its driver (and session) closes.
	_ = fd.Close()
	rs, err := second.Resume(ctx, ls.Token())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the Watch stream is up
	start := time.Now()
	if _, err := admin.ForceRelease(ctx, key, "test: resumed holder presumed dead"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rs.Done():
		t.Logf("resumed lease lost %v after the force release", time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("resumed lease not lost 5 s after a force release: its loss was not pushed to the resuming driver's session")
	}
	if !errors.Is(rs.Err(), dlock.ErrLeaseLost) {
		t.Errorf("Err = %v, want ErrLeaseLost", rs.Err())
	}
}

// TestResume_RefusedChangesNothing: a Resume the server must refuse (a
// wrong fence, a grant of another kind) is ErrLeaseLost and renews
// nothing: the grant keeps the time it had, never the token's TTL.
func TestResume_RefusedChangesNothing(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	first, fd := resumeLocker(t, srv.Addr())
	second, _ := resumeLocker(t, srv.Addr())
	ctx := t.Context()
	remaining := func(key string) time.Duration {
		t.Helper()
		info, err := first.Inspect(ctx, key)
		if err != nil {
			t.Fatalf("Inspect %q: %v", key, err)
		}
		return info.Remaining
	}

	ls, err := first.Acquire(ctx, "resume/refused", dlock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(ctx)
	forged := ls.Token()
	forged.Fence++
	forged.TTL = dlock.MaxTTL
	if _, err := second.Resume(ctx, forged); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Resume with a wrong fence = %v, want ErrLeaseLost", err)
	}
	if left := remaining("resume/refused"); left > 2*time.Second {
		t.Errorf("a refused Resume renewed the grant: %v left, TTL 2s", left)
	}

	// A Shared grant (a permit) is not found by a plain Driver's Resume,
	// and a plain grant not by a Shared view's.
	view, err := fd.(driver.SharedLocker).SharedView(driver.SharedKind{Mode: driver.Shared, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	owner := "owner-permit-resume-0123456789"
	g, err := view.TryAcquire(ctx, driver.AcquireRequest{Key: "resume/permit", Owner: owner, TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer view.Release(ctx, "resume/permit", owner)
	tok := dlock.LeaseToken{Key: "resume/permit", Owner: owner, Fence: g.Fence, TTL: dlock.MaxTTL}
	if _, err := second.Resume(ctx, tok); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("plain Resume of a permit = %v, want ErrLeaseLost", err)
	}
	if left := remaining("resume/permit"); left > 2*time.Second {
		t.Errorf("a refused Resume of a permit renewed it: %v left, TTL 2s", left)
	}
	plain := ls.Token()
	plain.TTL = dlock.MaxTTL
	if _, err := view.(driver.Resumer).Resume(ctx, driver.AcquireRequest{Key: plain.Key, Owner: plain.Owner, TTL: plain.TTL}, plain.Fence); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("shared-view Resume of a plain grant = %v, want ErrLeaseLost", err)
	}
	if left := remaining("resume/refused"); left > 2*time.Second {
		t.Errorf("a refused shared-view Resume renewed the plain grant: %v left, TTL 2s", left)
	}
}
