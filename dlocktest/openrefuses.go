package dlocktest

import (
	"context"
	"errors"
	"net/url"
	"testing"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
)

// OpenRefuses checks that open refuses each of urls as bad input: its error
// must match driver.ErrInvalidArgument and must not match
// driver.ErrUnavailable (an outage would let WithFailOpen run work
// unlocked). A driver that open returns all the same is closed and
// reported. Failures are reported with t.Errorf, naming the URL, and the
// remaining URLs are still tried.
//
// It returns open's errors in the order of urls (nil where open accepted
// the URL), for checks of the messages themselves.
func OpenRefuses[D driver.Driver](t testing.TB, open func(ctx context.Context, rawURL string) (D, error), urls ...string) []error {
	t.Helper()
	errs := make([]error, len(urls))
	for i, raw := range urls {
		d, err := open(t.Context(), raw)
		errs[i] = err
		if err == nil {
			_ = d.Close()
			t.Errorf("Open(%q) accepted", raw)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
			t.Errorf("Open(%q) = %v; want ErrInvalidArgument, not ErrUnavailable", raw, err)
		}
	}
	return errs
}

// OpenURLRefuses is OpenRefuses for a driver whose Open takes a parsed
// URL: each of urls must parse with url.Parse (else the test stops with
// t.Fatalf), then open must refuse it as OpenRefuses says.
func OpenURLRefuses[D driver.Driver](t testing.TB, open func(ctx context.Context, u *url.URL) (D, error), urls ...string) []error {
	t.Helper()
	parsed := make(map[string]*url.URL, len(urls))
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("url.Parse(%q): %v", raw, err)
		}
		parsed[raw] = u
	}
	return OpenRefuses(t, func(ctx context.Context, raw string) (D, error) {
		return open(ctx, parsed[raw])
	}, urls...)
}

// RootOpenNotUnavailable checks that dlock.Open never reports any of urls
// as an outage (dlock.ErrUnavailable): an invalid URL is bad input,
// whichever driver its scheme names. A URL that dlock.Open accepts (one
// that is valid for another driver) passes; the Locker is closed.
func RootOpenNotUnavailable(t testing.TB, urls ...string) {
	t.Helper()
	for _, raw := range urls {
		l, err := dlock.Open(t.Context(), raw)
		if err == nil {
			_ = l.Close()
			continue
		}
		if errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("dlock.Open(%q) = %v; must not be ErrUnavailable", raw, err)
		}
	}
}
