package dlocktest_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// errRecorder is a testing.TB that keeps what Errorf reports instead of
// failing the test.
type errRecorder struct {
	testing.TB
	errs []string
}

func (r *errRecorder) Helper() {}

func (r *errRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestOpenRefuses_ReportsAcceptedAndOutages: OpenRefuses passes a URL
// refused as ErrInvalidArgument, and reports one that open accepts (closing
// the driver) or refuses as an outage; it returns open's errors in order.
func TestOpenRefuses_ReportsAcceptedAndOutages(t *testing.T) {
	closed := 0
	open := func(_ context.Context, raw string) (*closeCounter, error) {
		switch raw {
		case "ok://":
			return &closeCounter{Driver: memdriver.New(memdriver.NewStore()), n: &closed}, nil
		case "down://":
			return nil, fmt.Errorf("down: %w", driver.ErrUnavailable)
		case "both://":
			return nil, fmt.Errorf("both: %w %w", driver.ErrInvalidArgument, driver.ErrUnavailable)
		}
		return nil, fmt.Errorf("bad: %w", driver.ErrInvalidArgument)
	}
	r := &errRecorder{TB: t}
	errs := dlocktest.OpenRefuses(r, open, "bad://", "ok://", "down://", "both://")
	if len(errs) != 4 || errs[0] == nil || errs[1] != nil || errs[2] == nil || errs[3] == nil {
		t.Fatalf("errors = %v; want [bad, nil, down, both]", errs)
	}
	if closed != 1 {
		t.Errorf("accepted driver closed %d times, want 1", closed)
	}
	want := []string{`Open("ok://") accepted`, `Open("down://")`, `Open("both://")`}
	if len(r.errs) != len(want) {
		t.Fatalf("reported %q; want %d reports", r.errs, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(r.errs[i], w) {
			t.Errorf("report %d = %q; want it to start with %q", i, r.errs[i], w)
		}
	}
}

// TestOpenURLRefuses_PassesParsedURL: OpenURLRefuses hands open the parsed
// form of each URL.
func TestOpenURLRefuses_PassesParsedURL(t *testing.T) {
	var hosts []string
	open := func(_ context.Context, u *url.URL) (*memdriver.Driver, error) {
		hosts = append(hosts, u.Host)
		return nil, fmt.Errorf("bad: %w", driver.ErrInvalidArgument)
	}
	r := &errRecorder{TB: t}
	dlocktest.OpenURLRefuses(r, open, "x://a:1", "x://b:2")
	if len(r.errs) != 0 || strings.Join(hosts, ",") != "a:1,b:2" {
		t.Errorf("reports %q, hosts %q; want none and a:1,b:2", r.errs, hosts)
	}
}

func init() {
	driver.Register("dlocktest-down", func(context.Context, *url.URL) (driver.Driver, error) {
		return nil, fmt.Errorf("store down: %w", driver.ErrUnavailable)
	})
	driver.Register("dlocktest-up", func(context.Context, *url.URL) (driver.Driver, error) {
		return memdriver.New(memdriver.NewStore()), nil
	})
}

// TestRootOpenNotUnavailable_ReportsOutage: a URL whose driver reports an
// outage is reported; a URL with an unknown scheme, or one dlock.Open
// accepts, is not.
func TestRootOpenNotUnavailable_ReportsOutage(t *testing.T) {
	r := &errRecorder{TB: t}
	dlocktest.RootOpenNotUnavailable(r, "nosuchscheme://x", "dlocktest-down://x", "dlocktest-up://x")
	if len(r.errs) != 1 || !strings.Contains(r.errs[0], "dlocktest-down://x") {
		t.Errorf("reported %q; want one report, for dlocktest-down://x", r.errs)
	}
}

type closeCounter struct {
	driver.Driver
	n *int
}

func (c *closeCounter) Close() error { *c.n++; return c.Driver.Close() }
