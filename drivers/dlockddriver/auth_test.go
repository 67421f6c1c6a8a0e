package dlockddriver_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server/servertest"
)

// authServer starts a dlockd with an auth file: "worker" may lock
// "payout:", "viewer" may read "payout:", "ops" has admin and lock on "".
// It returns the server and a token file for each identity.
func authServer(t *testing.T) (*servertest.Embedded, map[string]string, string) {
	t.Helper()
	dir := t.TempDir()
	ids := []servertest.Identity{
		{Name: "worker", Rules: map[string][]string{"payout:": {"lock"}}},
		{Name: "viewer", Rules: map[string][]string{"payout:": {"read"}}},
		{Name: "ops", Rules: map[string][]string{"": {"admin", "lock"}}},
	}
	authFile := servertest.WriteAuthFile(t, dir, ids)
	files := map[string]string{}
	for _, id := range ids {
		p := filepath.Join(dir, id.Name+".token")
		if err := os.WriteFile(p, []byte(id.Token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		files[id.Name] = p
	}
	cfg := servertest.Config(t, filepath.Join(dir, "data"))
	cfg.AuthFile = authFile
	cfg.AuditLogFile = filepath.Join(dir, "audit.log")
	return servertest.StartEmbedded(t, cfg), files, dir
}

// openLocker opens a Locker on addr with the token in tokenFile ("" for
// none).
func openLocker(t *testing.T, ctx context.Context, addr, tokenFile string) *dlock.Locker {
	t.Helper()
	u := "dlockd://" + addr
	if tokenFile != "" {
		u += "?token_file=" + url.QueryEscape(tokenFile)
	}
	l, err := dlock.Open(ctx, u, dlock.WithTTL(2*time.Second), dlock.WithRetryFor(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// wantDenied fails unless err matches dlock.ErrPermissionDenied (and not
// ErrUnavailable) and its text contains every string of want.
func wantDenied(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, dlock.ErrPermissionDenied) || errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("%s: %v, want ErrPermissionDenied and not ErrUnavailable", what, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %q lacks %q", what, err, w)
		}
	}
}

// TestAuth_DriverPermissions: through the real driver and the root
// package, each permission allowed and denied on the right and the wrong
// prefix, a missing and an unknown token: ErrPermissionDenied, never
// ErrUnavailable, at once (no retrying through the retry budget).
func TestAuth_DriverPermissions(t *testing.T) {
	srv, files, dir := authServer(t)
	ctx := t.Context()
	worker := openLocker(t, ctx, srv.Addr(), files["worker"])
	viewer := openLocker(t, ctx, srv.Addr(), files["viewer"])
	ops := openLocker(t, ctx, srv.Addr(), files["ops"])
	anon := openLocker(t, ctx, srv.Addr(), "")

	lease, err := worker.TryAcquire(ctx, "payout:1")
	if err != nil {
		t.Fatalf("worker on payout:1: %v", err)
	}
	start := time.Now()
	_, err = worker.TryAcquire(ctx, "settle:1")
	wantDenied(t, "worker on settle:1", err, `"settle:1"`, "lock")
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("denial took %v: retried as an outage?", d)
	}
	// One denial, one audit line: no clean-up release of a grant that
	// cannot exist follows the refused acquisition.
	time.Sleep(100 * time.Millisecond)
	if b, _ := os.ReadFile(filepath.Join(dir, "audit.log")); strings.Count(string(b), `"key":"settle:1"`) != 1 {
		t.Fatalf("audit lines for settle:1:\n%s\nwant exactly one (the refused acquire)", b)
	}
	_, err = worker.Acquire(ctx, "settle:2") // a wait: the Wait stream
	wantDenied(t, "worker waits on settle:2", err, "lock")
	_, err = viewer.TryAcquire(ctx, "payout:2")
	wantDenied(t, "viewer acquires", err, "lock")
	if _, err := viewer.Inspect(ctx, "payout:1"); err != nil {
		t.Fatalf("viewer inspects payout:1: %v", err)
	}
	_, err = viewer.Inspect(ctx, "settle:1")
	wantDenied(t, "viewer inspects settle:1", err, "read")
	_, err = worker.Inspect(ctx, "payout:1")
	wantDenied(t, "worker inspects", err, "read")
	hs, err := viewer.List(ctx, "")
	if err != nil || len(hs) != 1 || hs[0].Key != "payout:1" {
		t.Fatalf("viewer lists: %v %v", hs, err)
	}
	_, err = viewer.List(ctx, "settle:")
	wantDenied(t, "viewer lists settle:", err, "read")
	_, err = viewer.ForceRelease(ctx, "payout:1", "test")
	wantDenied(t, "viewer force-releases", err, "admin")
	_, err = anon.TryAcquire(ctx, "payout:3")
	wantDenied(t, "no token", err, "no credentials")

	// An unknown token.
	bogus := filepath.Join(dir, "bogus.token")
	if err := os.WriteFile(bogus, []byte("dlk_bogus\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = openLocker(t, ctx, srv.Addr(), bogus).TryAcquire(ctx, "payout:4")
	wantDenied(t, "unknown token", err, "unknown token")

	// The admin's force release pushes the loss to the worker's Watch
	// stream (which carries the worker's token).
	if _, err := ops.ForceRelease(ctx, "payout:1", "test"); err != nil {
		t.Fatalf("ops force-releases: %v", err)
	}
	select {
	case <-lease.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the worker's lease was not told of the force release (Watch stream without the token?)")
	}
}

// TestConformance_WithToken runs the conformance suite against a dlockd
// with an auth file, with a token that may do everything: every call,
// Session, Wait and Watch streams included, carries the token.
func TestConformance_WithToken(t *testing.T) {
	srv, files, _ := authServer(t)
	open := func(ctx context.Context, addr string) (driver.Driver, error) {
		u, err := url.Parse("dlockd://" + addr + "?token_file=" + url.QueryEscape(files["ops"]))
		if err != nil {
			return nil, err
		}
		return dlockddriver.Open(ctx, u)
	}
	dlocktest.Run(t, dlocktest.Harness{
		Name:       "dlockd",
		NewDriver:  func(ctx context.Context) (driver.Driver, error) { return open(ctx, srv.Addr()) },
		StopStore:  srv.Stop,
		StartStore: srv.Start,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return open(ctx, via(srv.Addr()))
		},
		NoFreezeReason: "the embedded server runs in the test process",
		TTL:            time.Second,
	})
}

// TestAuth_RevokedAfterReload: a token removed from the auth file is
// refused by a Driver that was working, after the server reloads.
func TestAuth_RevokedAfterReload(t *testing.T) {
	dir := t.TempDir()
	ids := []servertest.Identity{{Name: "worker", Rules: map[string][]string{"payout:": {"lock"}}}}
	authFile := servertest.WriteAuthFile(t, dir, ids)
	tf := filepath.Join(dir, "worker.token")
	if err := os.WriteFile(tf, []byte(ids[0].Token), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := servertest.Config(t, filepath.Join(dir, "data"))
	cfg.AuthFile = authFile
	srv := servertest.StartEmbedded(t, cfg)
	l := openLocker(t, t.Context(), srv.Addr(), tf)
	lease, err := l.TryAcquire(t.Context(), "payout:1")
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(t.Context())
	servertest.WriteAuthFile(t, dir, []servertest.Identity{{Name: "other", Rules: map[string][]string{"": {"read"}}}})
	if err := srv.Server().Reload(); err != nil {
		t.Fatal(err)
	}
	_, err = l.TryAcquire(t.Context(), "payout:2")
	wantDenied(t, "revoked token", err, "revoked")
}

// TestOpen_TokenFileErrors: token_file that is missing, empty or holds two
// lines is a configuration error naming the file and never quoting the
// token; a trailing newline is trimmed; a token over plaintext to a host
// that is not loopback is refused; token_file with a context token is
// ambiguous.
func TestOpen_TokenFileErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "dlk_secret_value\r\n")
	cases := []struct {
		name, url string
		ctxTok    string
		want      []string // nil: Open succeeds
	}{
		{"missing", "dlockd://127.0.0.1:7450?token_file=" + filepath.Join(dir, "nope"), "", []string{"token_file", "nope"}},
		{"empty", "dlockd://127.0.0.1:7450?token_file=" + write("empty", "\n"), "", []string{"token_file", "empty"}},
		{"empty parameter", "dlockd://127.0.0.1:7450?token_file=", "", []string{"token_file"}},
		{"two lines", "dlockd://127.0.0.1:7450?token_file=" + write("two", "dlk_secret_value\nsecond\n"), "", []string{"one token on one line"}},
		{"good with CRLF", "dlockd://127.0.0.1:7450?token_file=" + good, "", nil},
		{"localhost", "dlockd://localhost:7450?token_file=" + good, "", nil},
		{"plaintext off loopback", "dlockd://10.1.2.3:7450?token_file=" + good, "", []string{"in clear", "tls=1"}},
		{"two tokens", "dlockd://127.0.0.1:7450?token_file=" + good, "dlk_other", []string{"two tokens"}},
		{"context token", "dlockd://127.0.0.1:7450", "dlk_other", nil},
		{"context token off loopback", "dlockd://192.0.2.1:7450", "dlk_other", []string{"in clear"}},
		{"context token with a space", "dlockd://127.0.0.1:7450", "dlk other", []string{"space"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			if c.ctxTok != "" {
				ctx = dlockddriver.ContextWithToken(ctx, c.ctxTok)
			}
			l, err := dlock.Open(ctx, c.url)
			if c.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				_ = l.Close()
				return
			}
			if err == nil {
				_ = l.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
				t.Fatalf("%v: want ErrInvalidArgument", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("%q lacks %q", err, w)
				}
			}
			for _, secret := range []string{"dlk_secret_value", "second", "dlk_other", "dlk other"} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("%q quotes the token", err)
				}
			}
		})
	}
}

// TestAuth_ContextToken: ContextWithToken (how the dlock CLI passes
// --token) authenticates like token_file.
func TestAuth_ContextToken(t *testing.T) {
	srv, files, _ := authServer(t)
	b, err := os.ReadFile(files["worker"])
	if err != nil {
		t.Fatal(err)
	}
	ctx := dlockddriver.ContextWithToken(t.Context(), strings.TrimSpace(string(b)))
	l, err := dlock.Open(ctx, "dlockd://"+srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.TryAcquire(t.Context(), "payout:c"); err != nil {
		t.Fatal(err)
	}
	_, err = l.TryAcquire(t.Context(), "settle:c")
	wantDenied(t, "settle:c", err, "lock")
}
