package dlocktest

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// invalidCall is one call of a driver with input the contract refuses.
type invalidCall struct {
	name string
	want error // the specific sentinel, or driver.ErrInvalidArgument
	call func(ctx context.Context) error
}

// invalidCalls lists the calls of d, bypassing the root package's
// validation, with every input a store or driver can refuse: keys, owner
// tokens, TTLs and holders outside the contract, through every method and
// capability d has. good is a valid free key and owner a valid owner token.
func invalidCalls(d driver.Driver, good, owner string) []invalidCall {
	ttl := 10 * time.Second
	keys := map[string]string{
		"empty key": "", "513-byte key": strings.Repeat("k", 513), "1 MiB key": strings.Repeat("k", 1<<20),
		"key with NUL": "a\x00b", "key not UTF-8": "a\xff\xfeb",
	}
	owners := map[string]string{
		"empty owner": "", "129-byte owner": strings.Repeat("o", 129), "5000-byte owner": strings.Repeat("o", 5000),
		"owner with a space": "owner token", "owner with NUL": "owner\x00token", "owner with a newline": "owner\ntoken",
		"non-ASCII owner": "owner-é-token", "owner with a slash": "owner/token", "owner with a brace": "owner{token}",
	}
	ttls := map[string]time.Duration{
		"zero TTL": 0, "negative TTL": -time.Second, "99ms TTL": 99 * time.Millisecond,
		"25h TTL": 25 * time.Hour, "TTL of 2^62 ns": 1 << 62,
	}
	holders := map[string]string{
		"257-byte holder": strings.Repeat("h", 257), "5000-byte holder": strings.Repeat("x", 5000),
		"holder not UTF-8": "host\xff", "holder with a newline": "host\npid 1", "holder with NUL": "host\x00",
		"holder with ESC": "host\x1b[31m",
	}
	req := func(k, o string, ttl time.Duration, h string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: k, Owner: o, TTL: ttl, Holder: h}
	}
	var calls []invalidCall
	add := func(name string, want error, call func(ctx context.Context) error) {
		calls = append(calls, invalidCall{name, want, call})
	}
	w, _ := d.(driver.Waiter)
	acquireCalls := func(what string, want error, r driver.AcquireRequest) {
		add("TryAcquire "+what, want, func(ctx context.Context) error { _, err := d.TryAcquire(ctx, r); return err })
		if w != nil {
			add("Wait "+what, want, func(ctx context.Context) error { _, err := w.Wait(ctx, r); return err })
		}
	}
	for what, k := range keys {
		acquireCalls("with "+what, driver.ErrInvalidKey, req(k, owner, ttl, "h"))
		add("Renew with "+what, driver.ErrInvalidKey, func(ctx context.Context) error { return d.Renew(ctx, k, owner, ttl) })
		add("Release with "+what, driver.ErrInvalidKey, func(ctx context.Context) error { return d.Release(ctx, k, owner) })
		if in, ok := d.(driver.Inspector); ok {
			add("Inspect with "+what, driver.ErrInvalidKey, func(ctx context.Context) error { _, err := in.Inspect(ctx, k); return err })
		}
		if fr, ok := d.(driver.ForceReleaser); ok {
			add("ForceRelease with "+what, driver.ErrInvalidKey, func(ctx context.Context) error {
				_, err := fr.ForceRelease(ctx, k, "dlocktest: invalid key")
				return err
			})
		}
		if h, ok := d.(driver.Hinter); ok {
			add("Hint with "+what, driver.ErrInvalidKey, func(ctx context.Context) error {
				_, stop, err := h.Hint(ctx, k)
				if err == nil {
					stop()
				}
				if errors.Is(err, errors.ErrUnsupported) {
					return driver.ErrInvalidKey // hints off: nothing to refuse
				}
				return err
			})
		}
	}
	for what, o := range owners {
		acquireCalls("with "+what, driver.ErrInvalidArgument, req(good, o, ttl, "h"))
		add("Renew with "+what, driver.ErrInvalidArgument, func(ctx context.Context) error { return d.Renew(ctx, good, o, ttl) })
		add("Release with "+what, driver.ErrInvalidArgument, func(ctx context.Context) error { return d.Release(ctx, good, o) })
	}
	for what, tt := range ttls {
		acquireCalls("with "+what, driver.ErrInvalidTTL, req(good, owner, tt, "h"))
		add("Renew with "+what, driver.ErrInvalidTTL, func(ctx context.Context) error { return d.Renew(ctx, good, owner, tt) })
	}
	for what, h := range holders {
		acquireCalls("with "+what, driver.ErrInvalidHolder, req(good, owner, ttl, h))
	}
	return calls
}

// testDriverInvalidInput drives every input the contract refuses straight
// at a driver, bypassing the root package's validation: each call must come
// back matching driver.ErrInvalidArgument (and the specific sentinel for
// keys, TTLs and holders), never driver.ErrUnavailable, and must take
// nothing on the store. Through the root package, the same inputs with
// WithFailOpen must never become a degraded lease.
func (s *suite) testDriverInvalidInput(t TB) {
	d, err := s.h.NewDriver(t.Context())
	if err != nil {
		t.Fatalf("%s: NewDriver: %v", s.h.Name, err)
	}
	t.Cleanup(func() { _ = d.Close() })
	good := key(t, "k")
	const owner = "dlocktest-valid-owner-0001"
	for _, c := range invalidCalls(d, good, owner) {
		// A driver that accepted a Wait would block: bound every call.
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		ctx = driver.WithOpTimeout(ctx, 2*time.Second)
		err := c.call(ctx)
		cancel()
		switch {
		case err == nil:
			t.Errorf("%s: accepted, want an error matching %v", c.name, c.want)
		case errors.Is(err, driver.ErrUnavailable):
			t.Errorf("%s = %v: invalid input reported as ErrUnavailable", c.name, err)
		case !errors.Is(err, driver.ErrInvalidArgument) || !errors.Is(err, c.want):
			t.Errorf("%s = %v, want an error matching %v and ErrInvalidArgument", c.name, err, c.want)
		case strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: error of more than one line: %q", c.name, err)
		}
	}

	// Nothing was taken: the valid key is free, and a valid owner gets it.
	g, err := d.TryAcquire(t.Context(), driver.AcquireRequest{Key: good, Owner: owner, TTL: 10 * time.Second, Holder: "dlocktest"})
	if err != nil {
		t.Fatalf("TryAcquire(valid) after the refused calls = %v, want a grant", err)
	}
	_ = g
	if err := d.Release(t.Context(), good, owner); err != nil {
		t.Fatalf("Release(valid) = %v", err)
	}

	// Through the root package: bad input fails closed even with
	// WithFailOpen.
	l, _ := s.locker(t)
	for name, opts := range map[string][]dlock.Option{
		"300-byte holder":       {dlock.WithHolder(strings.Repeat("x", 300))},
		"5000-byte holder":      {dlock.WithHolder(strings.Repeat("x", 5000))},
		"holder not UTF-8":      {dlock.WithHolder("host\xff")},
		"holder with a newline": {dlock.WithHolder("host\npid")},
	} {
		ls, err := l.TryAcquire(t.Context(), good, append(opts, dlock.WithFailOpen())...)
		if err == nil {
			_ = ls.Release(t.Context())
			t.Errorf("TryAcquire with a %s and WithFailOpen: a lease (degraded %v), want ErrInvalidHolder", name, ls.Degraded())
			continue
		}
		if !errors.Is(err, dlock.ErrInvalidHolder) || !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("TryAcquire with a %s and WithFailOpen = %v, want ErrInvalidHolder, not ErrUnavailable", name, err)
		}
	}
	assertFree(t, l, good)
}
