package zkdriver_test

import (
	"errors"
	"net/url"
	"testing"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/zkdriver"
)

// TestOpen_InvalidURLIsInvalidArgument: URLs the driver refuses match
// driver.ErrInvalidArgument, never driver.ErrUnavailable, and are refused
// before any connection is tried.
func TestOpen_InvalidURLIsInvalidArgument(t *testing.T) {
	for _, raw := range []string{
		"zk://127.0.0.1:99999/dlock",
		"zk://127.0.0.1:2181,127.0.0.1:0/dlock",
		"zk:///dlock",
		"zk://127.0.0.1:2181/dlock?no_such=1",
		"zk://127.0.0.1:2181/dlock?session_timeout=soon",
		"zk://127.0.0.1:2181/dlock?op_timeout=0s",
		"zk://127.0.0.1:2181/.locks",
		"etcd://127.0.0.1:2181/dlock",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		d, err := zkdriver.Open(t.Context(), u, nil)
		if err == nil {
			_ = d.Close()
			t.Errorf("Open(%q) accepted", raw)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
			t.Errorf("Open(%q) = %v; want ErrInvalidArgument, not ErrUnavailable", raw, err)
		}
		if _, err := dlock.Open(t.Context(), raw); errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("dlock.Open(%q) = %v; must not be ErrUnavailable", raw, err)
		}
	}
}
