package dlock_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// TestOpen_BadURLIsInvalidArgument: every store URL Open refuses is
// ErrInvalidArgument (never ErrUnavailable), and the message says what to
// write instead, with credentials redacted.
func TestOpen_BadURLIsInvalidArgument(t *testing.T) {
	supported := "supported schemes: azblob, consul, dlockd, dynamodb, etcd, gs, mem, pgadvisory, postgres, postgresql, redis, rediss, redlock, zk"
	cases := []struct {
		url  string
		want []string // substrings of the message
	}{
		{"", []string{"empty store URL", "dlockd://127.0.0.1:7450", supported}},
		{"   ", []string{"empty store URL"}},
		{"127.0.0.1:7450", []string{`"127.0.0.1:7450" has no scheme: did you mean dlockd://127.0.0.1:7450?`, supported}},
		{"localhost:7450", []string{`did you mean dlockd://localhost:7450?`}},
		{"lock.internal:7450", []string{`did you mean dlockd://lock.internal:7450?`}},
		{"[::1]:7450", []string{`did you mean dlockd://[::1]:7450?`}},
		{"lock.internal", []string{`did you mean dlockd://lock.internal?`}},
		{"http://127.0.0.1:7450", []string{`unknown store scheme "http"`, supported}},
		{"mongodb://127.0.0.1:27017", []string{`unknown store scheme "mongodb"`, supported}},
		{"consul://127.0.0.1:8500", []string{`no driver registered for scheme "consul"`, `import _ "github.com/dlock-dev/dlock/drivers/consuldriver"`}},
		{"dlockd://127.0.0.1:99999", []string{`dlockd://127.0.0.1:99999`, `port "99999"`, "1..65535"}},
		{"dlockd://127.0.0.1:0", []string{`port "0"`}},
		{"dlockd://127.0.0.1:x", []string{`invalid port`}},
		// An empty host or port is never 127.0.0.1:7450 (issue 13 F5):
		// dlockd://$LOCKHOST:7450 with LOCKHOST unset must not lock locally.
		{"dlockd://", []string{"names no host", "dlockd://HOST:PORT"}},
		{"dlockd://127.0.0.1", []string{`"127.0.0.1" has no port`, "dlockd://HOST:PORT"}},
		{"dlockd://:7450", []string{`":7450" has an empty host`, "dlockd://HOST:PORT"}},
		{"dlockd://127.0.0.1:", []string{`"127.0.0.1:" has an empty port`}},
		{"redis://127.0.0.1:", []string{`"127.0.0.1:" has an empty port`}},
		{"redlock://127.0.0.1:6379,127.0.0.1:70000,127.0.0.1:6381", []string{`port "70000"`}},
		{"dlockd://127.0.0.1:7450?bogus=1", []string{"dlockd://127.0.0.1:7450?bogus=1", "bogus"}},
		{"/var/run/dlockd.sock", []string{"has no scheme", "dlockd://127.0.0.1:7450"}},
		// Registered by no imported driver: name the package to import.
		{"redis://127.0.0.1:6379", []string{`no driver registered for scheme "redis": import _ "github.com/dlock-dev/dlock/drivers/redisdriver"`}},
		{"rediss://127.0.0.1:6379", []string{`import _ "github.com/dlock-dev/dlock/drivers/redisdriver"`}},
		{"redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", []string{`import _ "github.com/dlock-dev/dlock/drivers/redlockdriver"`}},
		{"etcd://127.0.0.1:2379", []string{`import _ "github.com/dlock-dev/dlock/drivers/etcddriver"`}},
		{"zk://127.0.0.1:2181", []string{`import _ "github.com/dlock-dev/dlock/drivers/zkdriver"`}},
		{"postgres://u@127.0.0.1/db", []string{`import _ "github.com/dlock-dev/dlock/drivers/pgdriver"`}},
		{"postgresql://u@127.0.0.1/db", []string{`import _ "github.com/dlock-dev/dlock/drivers/pgdriver"`}},
		{"pgadvisory://u@127.0.0.1/db", []string{`import _ "github.com/dlock-dev/dlock/drivers/pgadvisory"`}},
		// Credentials never appear.
		{"redis://user:hunter2@127.0.0.1:6379/0", []string{"redis://user:xxxxx@127.0.0.1:6379/0"}},
		{"dlockd://127.0.0.1:7450?password=hunter2", []string{"password=xxxxx"}},
		{"dlockd://127.0.0.1:99999?token=hunter2", []string{"token=xxxxx"}},
		{"redis://user:hunter2@127.0.0.1:6379:bad", []string{"user:xxxxx@"}},
		{"postgres://u:hunter2@127.0.0.1/db?sslmode=disable&password=hunter2", []string{"u:xxxxx@", "password=xxxxx"}},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			if scheme, _, ok := strings.Cut(c.url, "://"); ok && scheme != "dlockd" && scheme != "mem" && contains(driver.Schemes(), scheme) {
				t.Fatalf("scheme %q is registered in this test binary; the case expects it is not", scheme)
			}
			l, err := dlock.Open(t.Context(), c.url)
			if err == nil {
				l.Close()
				t.Fatalf("Open(%q) = nil error", c.url)
			}
			if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
				t.Fatalf("Open(%q) = %v, want ErrInvalidArgument and not ErrUnavailable", c.url, err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "dlock: open") {
				t.Errorf("message %q does not start with \"dlock: open\"", msg)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q does not contain %q", msg, w)
				}
			}
			if strings.Contains(msg, "hunter2") {
				t.Errorf("message %q shows a credential", msg)
			}
		})
	}
}

// TestOpen_ErrorsNameTheStoreAddress: a Locker made by Open names its store
// by URL (credentials redacted) in its errors; the observer's label stays
// the scheme.
func TestOpen_ErrorsNameTheStoreAddress(t *testing.T) {
	rec := &recorder{}
	a, err := dlock.Open(t.Context(), "mem://u:hunter2@errs-addr", dlock.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ls, err := a.TryAcquire(t.Context(), "settle:42")
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(t.Context())
	_, err = a.TryAcquire(t.Context(), "settle:42")
	if got, want := err.Error(), `dlock: acquire "settle:42" on mem://u:xxxxx@errs-addr: lock held`; got != want {
		t.Fatalf("error %q, want %q", got, want)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, e := range rec.acquires {
		if e.Store != "mem" {
			t.Fatalf("observer store label %q, want the scheme", e.Store)
		}
	}
}

// TestOpen_ThirdPartyDialErrorIsUnavailable: a driver's Open error that is
// neither sentinel is classified by what it is: a network error (a
// third-party driver's raw dial error) is ErrUnavailable, retried and
// failed open like any outage; anything else is a configuration error,
// ErrInvalidArgument.
func TestOpen_ThirdPartyDialErrorIsUnavailable(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	driver.Register("test-dialfail", func(context.Context, *url.URL) (driver.Driver, error) { return nil, dial })
	driver.Register("test-badconfig", func(context.Context, *url.URL) (driver.Driver, error) {
		return nil, errors.New("unknown option frobnicate")
	})
	_, err := dlock.Open(t.Context(), "test-dialfail://127.0.0.1:1")
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrInvalidArgument) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Open with a raw dial error: %v; want ErrUnavailable wrapping it", err)
	}
	_, err = dlock.Open(t.Context(), "test-badconfig://127.0.0.1:1")
	if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("Open with an untagged configuration error: %v; want ErrInvalidArgument", err)
	}
}
