package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// TestBadInput_ClearErrorsNoPanic: nil and out-of-range inputs to the
// public API fail with the documented sentinel, before any store call,
// and never panic; nothing is left held.
func TestBadInput_ClearErrorsNoPanic(t *testing.T) {
	st := memdriver.NewStore()
	l := dlock.New(memdriver.New(st))
	defer l.Close()
	ctx := t.Context()
	var nilCtx context.Context
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"a nil Option", func() error { _, err := l.TryAcquire(ctx, "k", nil); return err }, dlock.ErrInvalidArgument},
		{"a nil Option to Acquire", func() error { _, err := l.Acquire(ctx, "k", dlock.WithTTL(time.Second), nil); return err }, dlock.ErrInvalidArgument},
		{"a nil context", func() error { _, err := l.TryAcquire(nilCtx, "k"); return err }, dlock.ErrInvalidArgument},
		{"a nil context to Acquire", func() error { _, err := l.Acquire(nilCtx, "k"); return err }, dlock.ErrInvalidArgument},
		{"a nil context to Inspect", func() error { _, err := l.Inspect(nilCtx, "k"); return err }, dlock.ErrInvalidArgument},
		{"a nil context to List", func() error { _, err := l.List(nilCtx, ""); return err }, dlock.ErrInvalidArgument},
		{"a nil context to ForceRelease", func() error { _, err := l.ForceRelease(nilCtx, "k", "test"); return err }, dlock.ErrInvalidArgument},
		{"a nil context to AcquireAll", func() error { _, err := l.AcquireAll(nilCtx, []string{"a", "b"}); return err }, dlock.ErrInvalidArgument},
		{"a nil context to Open", func() error { _, err := dlock.Open(nilCtx, "mem://x"); return err }, dlock.ErrInvalidArgument},
		{"Do with a nil function", func() error { return l.Do(ctx, "k", nil) }, dlock.ErrInvalidArgument},
		{"a negative heartbeat", func() error { _, err := l.TryAcquire(ctx, "k", dlock.WithHeartbeat(-time.Second)); return err }, dlock.ErrInvalidTTL},
		{"a negative op timeout", func() error { _, err := l.TryAcquire(ctx, "k", dlock.WithOpTimeout(-time.Second)); return err }, dlock.ErrInvalidArgument},
		{"a negative backoff", func() error { _, err := l.TryAcquire(ctx, "k", dlock.WithBackoff(-time.Millisecond, 0)); return err }, dlock.ErrInvalidArgument},
		{"a backoff min above its max", func() error {
			_, err := l.Acquire(ctx, "k", dlock.WithBackoff(time.Second, time.Millisecond))
			return err
		}, dlock.ErrInvalidArgument},
		{"a backoff min above the default max", func() error { _, err := l.Acquire(ctx, "k", dlock.WithBackoff(2*time.Second, 0)); return err }, dlock.ErrInvalidArgument},
		{"a List prefix that is not UTF-8", func() error { _, err := l.List(ctx, "\xff"); return err }, dlock.ErrInvalidKey},
		{"a List prefix with NUL", func() error { _, err := l.List(ctx, "a\x00"); return err }, dlock.ErrInvalidKey},
		{"a List prefix too long", func() error { _, err := l.List(ctx, strings.Repeat("p", dlock.MaxKeyBytes+1)); return err }, dlock.ErrInvalidKey},
		{"AcquireAll with no keys", func() error { _, err := l.AcquireAll(ctx, nil); return err }, dlock.ErrInvalidKey},
		{"Release of a nil Lease", func() error { var ls *dlock.Lease; return ls.Release(ctx) }, dlock.ErrInvalidArgument},
		{"Release of a zero Lease", func() error { return new(dlock.Lease).Release(ctx) }, dlock.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("panicked: %v", p)
					}
				}()
				err = tc.call()
			}()
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want one matching %v", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q has a newline", err)
			}
		})
	}
	if infos, err := l.List(ctx, ""); err != nil || len(infos) != 0 {
		t.Fatalf("after the bad calls: List = %v, %v; want nothing held", infos, err)
	}
	// Valid options still work, and a ForceRelease of a free key says so.
	ls, err := l.TryAcquire(ctx, "k", dlock.WithBackoff(time.Millisecond, time.Millisecond), dlock.WithOpTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Release(nilCtx); err != nil {
		t.Fatalf("Release with a nil context: %v", err)
	}
	_, err = l.ForceRelease(ctx, "k", "test")
	if !errors.Is(err, dlock.ErrNotAcquired) || strings.Contains(err.Error(), "lock held") {
		t.Fatalf("ForceRelease of a free key: %v; want ErrNotAcquired saying the key is free", err)
	}
}

// TestNew_NilDriverFailsEveryCall: New(nil) gives a Locker whose calls fail
// with ErrInvalidArgument instead of panicking, and closes cleanly.
func TestNew_NilDriverFailsEveryCall(t *testing.T) {
	l := dlock.New(nil)
	if _, err := l.TryAcquire(t.Context(), "k"); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "nil driver") {
		t.Fatalf("TryAcquire on New(nil): %v", err)
	}
	if _, err := l.Acquire(t.Context(), "k", dlock.WithTTL(time.Second)); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Acquire on New(nil): %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// A nil Option given to New fails every acquisition of the Locker.
	l2 := dlock.New(memdriver.New(memdriver.NewStore()), nil)
	defer l2.Close()
	if _, err := l2.TryAcquire(t.Context(), "k"); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "nil Option") {
		t.Fatalf("TryAcquire on a Locker made with a nil Option: %v", err)
	}
}

// TestBadInput_ZeroLeaseAccessors: the accessors of a zero Lease (not made
// by a Locker) answer zero values instead of panicking.
func TestBadInput_ZeroLeaseAccessors(t *testing.T) {
	ls := new(dlock.Lease)
	if ls.Done() != nil || ls.TTL() != 0 || ls.Key() != "" || ls.Fence() != 0 || ls.Owner() != "" ||
		ls.Err() != nil || ls.Context() != nil || !ls.Deadline().IsZero() || ls.Degraded() {
		t.Fatal("a zero Lease's accessors did not answer zero values")
	}
	if tok := ls.Token(); tok != (dlock.LeaseToken{}) {
		t.Fatalf("a zero Lease's Token = %+v, want the zero token", tok)
	}
}
