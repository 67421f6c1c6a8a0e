package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server/servertest"
)

// These tests run the library against a real dlockd (embedded, on free
// loopback ports, its data in a temporary directory), stopped and started
// again on the same port and data.

func openDlockd(t *testing.T, addr string, opts ...dlock.Option) *dlock.Locker {
	t.Helper()
	l, err := dlock.Open(t.Context(), "dlockd://"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// retryLog is a RetryObserver that keeps the retried errors' messages.
type retryLog struct{ retryRecorder }

func (r *retryLog) messages() []string {
	_, retries := r.results()
	out := make([]string, 0, len(retries))
	for _, e := range retries {
		out = append(out, e.Err.Error())
	}
	return out
}

func anyContains(msgs []string, sub string) bool {
	for _, m := range msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

// TestDlockd_WaitSurvivesARestart: an Acquire waiting on a held key while
// dlockd shuts down (SHUTTING_DOWN, then connection refused) and starts
// again on the same data and port (NOT_LEADER during its election, with the
// default 1 s Raft timings) rides through it (the driver re-attaches, or
// the root retries) and gets the key once the holder lets go, within its
// ctx.
func TestDlockd_WaitSurvivesARestart(t *testing.T) {
	cfg := servertest.Config(t, t.TempDir())
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = time.Second, time.Second, 500*time.Millisecond
	srv := servertest.StartEmbedded(t, cfg)
	holder := openDlockd(t, srv.Addr())
	rec := &retryLog{}
	waiter := openDlockd(t, srv.Addr(), dlock.WithObserver(rec), dlock.WithOpTimeout(2*time.Second))

	held, err := holder.TryAcquire(t.Context(), "job", dlock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	type result struct {
		ls  *dlock.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		ls, err := waiter.Acquire(ctx, "job")
		got <- result{ls, err}
	}()
	// The wait reaches the server: the key has a waiter.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if info, err := holder.Inspect(t.Context(), "job"); err == nil && info.Waiters == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiting Acquire never queued on the server")
		}
	}

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	_ = held.Release(t.Context()) // held, or lost during the outage: either way let go

	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("waiting Acquire across a restart = %v, want the key (retries: %q)", r.err, rec.messages())
		}
		defer r.ls.Release(t.Context())
		if r.ls.Fence() <= held.Fence() || r.ls.Degraded() {
			t.Fatalf("fence %d after the restart, want > %d", r.ls.Fence(), held.Fence())
		}
		t.Logf("acquired %v after the restart; retried errors: %q", time.Since(restarted), rec.messages())
	case <-ctx.Done():
		t.Fatalf("the waiting Acquire did not return within its ctx (retries: %q)", rec.messages())
	}
	// The driver's Wait re-attaches to the restarted server itself (same
	// owner token, so the queue entry keeps its place), and the root
	// retries only what the driver gives up on: either may carry the wait
	// across. What the root did retry must be the outage.
	msgs := rec.messages()
	if len(msgs) > 0 && !anyContains(msgs, "SHUTTING_DOWN") && !anyContains(msgs, "connection refused") && !anyContains(msgs, "NOT_LEADER") {
		t.Fatalf("retried errors %q name neither the shutdown, a refused connection nor an election", msgs)
	}
}

// TestDlockd_AcquireStartedWhileDown: an Acquire started while dlockd is
// down gets the key once dlockd is back (during its election it answers
// NOT_LEADER, which is retried too).
func TestDlockd_AcquireStartedWhileDown(t *testing.T) {
	cfg := servertest.Config(t, t.TempDir())
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = time.Second, time.Second, 500*time.Millisecond
	srv := servertest.StartEmbedded(t, cfg)
	rec := &retryLog{}
	l := openDlockd(t, srv.Addr(), dlock.WithObserver(rec))
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	start := time.Now()
	time.AfterFunc(time.Second, func() {
		if err := srv.Start(); err != nil {
			t.Errorf("restart: %v", err)
		}
	})
	ls, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatalf("Acquire started while dlockd was down = %v (retries: %q)", err, rec.messages())
	}
	defer ls.Release(t.Context())
	if took := time.Since(start); took < time.Second {
		t.Fatalf("acquired after %v, before dlockd was started again", took)
	}
	msgs := rec.messages()
	if !anyContains(msgs, "connection refused") {
		t.Fatalf("retried errors %q, want a refused connection among them", msgs)
	}
	t.Logf("acquired after %v, %d retries; NOT_LEADER seen: %v", time.Since(start), len(msgs), anyContains(msgs, "NOT_LEADER"))
}

// TestDlockd_TryAcquireRetryFor: TryAcquire with WithRetryFor(3s) gets the
// key from a dlockd that comes up 1 s later; without it, and with
// WithRetryFor(0), it fails at once with ErrUnavailable, naming the store's
// address.
func TestDlockd_TryAcquireRetryFor(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	l := openDlockd(t, srv.Addr())
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]dlock.Option{nil, {dlock.WithRetryFor(0)}} {
		start := time.Now()
		_, err := l.TryAcquire(t.Context(), "job", opts...)
		took := time.Since(start)
		if !errors.Is(err, dlock.ErrUnavailable) || took > time.Second {
			t.Fatalf("TryAcquire with dlockd down = %v after %v, want ErrUnavailable at once", err, took)
		}
		prefix := `dlock: acquire "job" on dlockd://` + srv.Addr() + `: store unavailable: `
		// Refused, or reset when the stopped server's socket was still
		// closing.
		if !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), "connect") {
			t.Fatalf("error %q, want it to start %q and say the connection failed", err, prefix)
		}
	}

	start := time.Now()
	time.AfterFunc(time.Second, func() {
		if err := srv.Start(); err != nil {
			t.Errorf("restart: %v", err)
		}
	})
	ls, err := l.TryAcquire(t.Context(), "job", dlock.WithRetryFor(3*time.Second))
	if err != nil {
		t.Fatalf("TryAcquire with WithRetryFor(3s), dlockd up 1 s later = %v", err)
	}
	defer ls.Release(t.Context())
	if took := time.Since(start); took < time.Second {
		t.Fatalf("acquired after %v, before dlockd was started", took)
	}
}

// TestDlockd_InvalidInputNeverFailsOpen: with the key held on a real
// dlockd, a 300-byte holder with WithFailOpen is ErrInvalidHolder, not a
// degraded lease; so are a bad key and TTL.
func TestDlockd_InvalidInputNeverFailsOpen(t *testing.T) {
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	l := openDlockd(t, srv.Addr(), dlock.WithFailOpen())
	held, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(t.Context())
	for _, c := range []struct {
		key      string
		opt      dlock.Option
		sentinel error
	}{
		{"job", dlock.WithHolder(strings.Repeat("x", 300)), dlock.ErrInvalidHolder},
		{"job", dlock.WithHolder(strings.Repeat("x", 5000)), dlock.ErrInvalidHolder},
		{strings.Repeat("k", 600), dlock.WithHolder("ok"), dlock.ErrInvalidKey},
		{"job", dlock.WithTTL(time.Millisecond), dlock.ErrInvalidTTL},
	} {
		for _, wait := range []bool{false, true} {
			var ls *dlock.Lease
			if wait {
				ls, err = l.Acquire(t.Context(), c.key, c.opt)
			} else {
				ls, err = l.TryAcquire(t.Context(), c.key, c.opt)
			}
			if ls != nil || !errors.Is(err, c.sentinel) || !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
				t.Fatalf("acquire (wait=%v) = %v, %v; want %v, no lease", wait, ls, err, c.sentinel)
			}
		}
	}
}
