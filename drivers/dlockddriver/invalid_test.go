package dlockddriver_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestServerRefusalsAreInvalidArgument: requests that pass the driver's
// own checks but that a real dlockd with stricter limits refuses (a key
// longer than its MaxKeyBytes, a TTL beyond its MaxTTL or under its MinTTL,
// an owner token shorter than its 8 bytes, a renew batch over its limit)
// come back matching driver.ErrInvalidArgument (and the specific sentinel),
// never driver.ErrUnavailable, through every call; through the root
// package, WithFailOpen does not turn them into a degraded lease.
func TestServerRefusalsAreInvalidArgument(t *testing.T) {
	cfg := servertest.Config(t, t.TempDir())
	cfg.MaxKeyBytes = 64
	cfg.MinTTL = time.Second
	cfg.MaxTTL = time.Hour
	cfg.MaxRenewBatch = 2
	srv := servertest.StartEmbedded(t, cfg)
	u, _ := url.Parse("dlockd://" + srv.Addr())
	d, err := dlockddriver.Open(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const owner = "owner-a-0000"
	long := strings.Repeat("k", 100)
	req := func(k, o string, ttl time.Duration) driver.AcquireRequest {
		return driver.AcquireRequest{Key: k, Owner: o, TTL: ttl}
	}
	type call struct {
		name string
		want error
		fn   func(ctx context.Context) error
	}
	calls := []call{
		{"TryAcquire 100-byte key", driver.ErrInvalidKey, func(ctx context.Context) error {
			_, err := d.TryAcquire(ctx, req(long, owner, 10*time.Second))
			return err
		}},
		{"Wait 100-byte key", driver.ErrInvalidKey, func(ctx context.Context) error { _, err := d.Wait(ctx, req(long, owner, 10*time.Second)); return err }},
		{"Renew 100-byte key", driver.ErrInvalidKey, func(ctx context.Context) error { return d.Renew(ctx, long, owner, 10*time.Second) }},
		{"Release 100-byte key", driver.ErrInvalidKey, func(ctx context.Context) error { return d.Release(ctx, long, owner) }},
		{"Inspect 100-byte key", driver.ErrInvalidKey, func(ctx context.Context) error { _, err := d.Inspect(ctx, long); return err }},
		{"ForceRelease 100-byte key", driver.ErrInvalidKey, func(ctx context.Context) error { _, err := d.ForceRelease(ctx, long, "test"); return err }},
		{"TryAcquire TTL 2h", driver.ErrInvalidTTL, func(ctx context.Context) error { _, err := d.TryAcquire(ctx, req("k", owner, 2*time.Hour)); return err }},
		{"TryAcquire TTL 500ms", driver.ErrInvalidTTL, func(ctx context.Context) error {
			_, err := d.TryAcquire(ctx, req("k", owner, 500*time.Millisecond))
			return err
		}},
		{"Wait TTL 2h", driver.ErrInvalidTTL, func(ctx context.Context) error { _, err := d.Wait(ctx, req("k", owner, 2*time.Hour)); return err }},
		{"TryAcquire 3-byte owner", driver.ErrInvalidArgument, func(ctx context.Context) error {
			_, err := d.TryAcquire(ctx, req("k", "abc", 10*time.Second))
			return err
		}},
		{"Wait 3-byte owner", driver.ErrInvalidArgument, func(ctx context.Context) error { _, err := d.Wait(ctx, req("k", "abc", 10*time.Second)); return err }},
		{"Renew 3-byte owner", driver.ErrInvalidArgument, func(ctx context.Context) error { return d.Renew(ctx, "k", "abc", 10*time.Second) }},
		{"Release 3-byte owner", driver.ErrInvalidArgument, func(ctx context.Context) error { return d.Release(ctx, "k", "abc") }},
		{"RenewBatch over the server's limit", driver.ErrInvalidArgument, func(ctx context.Context) error {
			_, err := d.RenewBatch(ctx, []dlockddriver.RenewItem{{Key: "a", Owner: owner}, {Key: "b", Owner: owner}, {Key: "c", Owner: owner}})
			return err
		}},
	}
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := c.fn(driver.WithOpTimeout(ctx, 2*time.Second))
		cancel()
		if !errors.Is(err, c.want) || !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
			t.Errorf("%s = %v; want %v, not ErrUnavailable", c.name, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), "rpc error") || strings.Contains(err.Error(), "\n")) {
			t.Errorf("%s: %q: want one line in plain words", c.name, err)
		}
	}
	// Through the root package, with WithFailOpen: an error, never a
	// degraded lease.
	l := dlock.New(d, dlock.WithStoreName("dlockd"))
	for name, opts := range map[string][]dlock.Option{
		"TTL 2h":    {dlock.WithTTL(2 * time.Hour)},
		"long key":  nil,
		"TTL 500ms": {dlock.WithTTL(500 * time.Millisecond), dlock.WithHeartbeat(100 * time.Millisecond)},
	} {
		k := "root"
		if name == "long key" {
			k = long
		}
		ls, err := l.TryAcquire(t.Context(), k, append(opts, dlock.WithFailOpen())...)
		if err == nil {
			t.Errorf("%s: a lease (degraded %v)", name, ls.Degraded())
			_ = ls.Release(t.Context())
			continue
		}
		if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("%s with WithFailOpen = %v; want ErrInvalidArgument, not ErrUnavailable", name, err)
		}
	}
}

// TestOpen_InvalidURLIsInvalidArgument: URLs the driver refuses match
// driver.ErrInvalidArgument, never driver.ErrUnavailable.
func TestOpen_InvalidURLIsInvalidArgument(t *testing.T) {
	urls := []string{
		"dlockd://127.0.0.1:99999",
		"dlockd://127.0.0.1:0",
		"dlockd://127.0.0.1:65536",
		"dlockd://127.0.0.1:7450,127.0.0.1:7450",  // a member named twice
		"dlockd://127.0.0.1:7450,,127.0.0.1:7451", // an empty entry
		"dlockd://127.0.0.1:7450,:7451",           // a member without a host
		"dlockd://127.0.0.1:7450,127.0.0.1:70000", // a port out of range
		"dlockd://127.0.0.1:7450?lock_delay=-1s",
		"dlockd://127.0.0.1:7450?lock_delay=soon",
		"dlockd://127.0.0.1:7450?ttl=1s",
		"dlockd://user:pw@127.0.0.1:7450",
		"dlockd://127.0.0.1:7450/db",
		"redis://127.0.0.1:7450",
		// An empty host or port is never a default (issue 13 F5).
		"dlockd://",
		"dlockd:///",
		"dlockd://127.0.0.1",
		"dlockd://127.0.0.1:",
		"dlockd://:7450",
		"dlockd://:47937",
		"dlockd://[::1]",
		"dlockd://:",
	}
	for i, err := range dlocktest.OpenURLRefuses(t, dlockddriver.Open, urls...) {
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("Open(%q) = %q shows the password", urls[i], err)
		}
	}
	for raw, want := range map[string]string{
		"dlockd://":          "names no host",
		"dlockd://127.0.0.1": "has no port",
		"dlockd://:7450":     "empty host",
	} {
		u, _ := url.Parse(raw)
		if _, err := dlockddriver.Open(t.Context(), u); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "dlockd://HOST:PORT") {
			t.Errorf("Open(%q) = %v; want a message with %q and dlockd://HOST:PORT", raw, err, want)
		}
	}
	for _, target := range []string{":7450", "127.0.0.1", "127.0.0.1:", "", "127.0.0.1:7450,", "127.0.0.1:7450,127.0.0.1", "127.0.0.1:1, 127.0.0.1:1"} {
		if d, err := dlockddriver.Dial(target, nil); err == nil {
			_ = d.Close()
			t.Errorf("Dial(%q) accepted", target)
		} else if !errors.Is(err, driver.ErrInvalidArgument) {
			t.Errorf("Dial(%q) = %v; want ErrInvalidArgument", target, err)
		}
	}
	if d, err := dlockddriver.Dial("127.0.0.1:99999", nil); err == nil {
		_ = d.Close()
		t.Error("Dial(127.0.0.1:99999) accepted")
	} else if !errors.Is(err, driver.ErrInvalidArgument) {
		t.Errorf("Dial(127.0.0.1:99999) = %v; want ErrInvalidArgument", err)
	}
}
