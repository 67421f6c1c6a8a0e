package dlock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/server/servertest"
)

// renewCounter is an Observer that counts renewals and keeps the loss
// reasons of ended leases.
type renewCounter struct {
	mu      sync.Mutex
	renewed int
	failed  int
	lost    []string
}

func (r *renewCounter) AcquireDone(dlock.AcquireEvent) {}
func (r *renewCounter) Renewed(e dlock.RenewEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.renewed++
	if e.Err != nil {
		r.failed++
	}
}
func (r *renewCounter) LeaseEnded(e dlock.EndEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Lost {
		r.lost = append(r.lost, e.LostReason)
	}
}

func (r *renewCounter) counts() (renewed, failed int, lost []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.renewed, r.failed, append([]string(nil), r.lost...)
}

// TestDlockd_RevokedTokenEndsTheLease: after dlockd's auth file is reloaded
// without the holder's token, the next renewal is refused
// (UNAUTHENTICATED) and the lease is lost at once, its context cancelled
// with a cause matching ErrLeaseLost and ErrPermissionDenied; no renewal is
// sent after it (they used to be retried, ~10 a second, until the validity
// deadline).
func TestDlockd_RevokedTokenEndsTheLease(t *testing.T) {
	dir := t.TempDir()
	ids := []servertest.Identity{
		{Name: "worker", Rules: map[string][]string{"job:": {"lock"}}},
		{Name: "ops", Rules: map[string][]string{"": {"admin", "lock"}}},
	}
	cfg := servertest.Config(t, t.TempDir())
	cfg.AuthFile = servertest.WriteAuthFile(t, dir, ids)
	srv := servertest.StartEmbedded(t, cfg)
	tokFile := filepath.Join(dir, "worker.token")
	if err := os.WriteFile(tokFile, []byte(ids[0].Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, revoke := range []string{"token", "permission"} {
		t.Run(revoke, func(t *testing.T) {
			cur := []servertest.Identity{ids[0], ids[1]}
			cur[0].Rules = map[string][]string{"job:": {"lock"}}
			servertest.WriteAuthFile(t, dir, cur)
			if err := srv.Server().Reload(); err != nil {
				t.Fatal(err)
			}
			obs := &renewCounter{}
			l := openDlockd(t, srv.Addr()+"?token_file="+tokFile, dlock.WithObserver(obs))
			lease, err := l.TryAcquire(t.Context(), "job:"+revoke, dlock.WithTTL(20*time.Second), dlock.WithHeartbeat(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if n, _, _ := obs.counts(); n >= 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no renewal in 5 s")
				}
			}
			switch revoke {
			case "token": // the identity is gone: UNAUTHENTICATED
				cur = cur[1:]
			case "permission": // it stays, without lock on job:
				cur[0].Rules = map[string][]string{"other:": {"lock"}}
			}
			servertest.WriteAuthFile(t, dir, cur)
			if err := srv.Server().Reload(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-lease.Done():
			case <-time.After(3 * time.Second):
				_, failed, _ := obs.counts()
				t.Fatalf("lease still held 3 s after its token was revoked (%d renewals refused meanwhile)", failed)
			}
			cause := context.Cause(lease.Context())
			if !errors.Is(cause, dlock.ErrLeaseLost) || !errors.Is(cause, dlock.ErrPermissionDenied) || !errors.Is(lease.Err(), dlock.ErrPermissionDenied) {
				t.Fatalf("cause %v; want ErrLeaseLost and ErrPermissionDenied", cause)
			}
			// The observer hears of the end just after Done closes.
			_, failed, lost := obs.counts()
			for deadline := time.Now().Add(2 * time.Second); len(lost) == 0 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
				_, failed, lost = obs.counts()
			}
			time.Sleep(500 * time.Millisecond) // five heartbeats
			renewed2, failed2, _ := obs.counts()
			if failed != 1 || failed2 != 1 || len(lost) != 1 || lost[0] != dlock.LostPermissionDenied {
				t.Fatalf("%d refused renewals at the loss, %d (of %d) after; lost %v; want 1, 1 and [%s]", failed, failed2, renewed2, lost, dlock.LostPermissionDenied)
			}
		})
	}
}
