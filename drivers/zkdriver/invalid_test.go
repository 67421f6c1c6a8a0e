package zkdriver_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/drivers/zkdriver"
)

// TestOpen_InvalidURLIsInvalidArgument: URLs the driver refuses match
// driver.ErrInvalidArgument, never driver.ErrUnavailable, and are refused
// before any connection is tried.
func TestOpen_InvalidURLIsInvalidArgument(t *testing.T) {
	urls := []string{
		"zk://127.0.0.1:99999/dlock",
		"zk://127.0.0.1:2181,127.0.0.1:0/dlock",
		"zk:///dlock",
		"zk://127.0.0.1:2181/dlock?no_such=1",
		"zk://127.0.0.1:2181/dlock?session_timeout=soon",
		"zk://127.0.0.1:2181/dlock?op_timeout=0s",
		"zk://127.0.0.1:2181/.locks",
		"etcd://127.0.0.1:2181/dlock",
		// No server defaults its host, nor an empty port (issue 13 F5).
		"zk://:2181/dlock",
		"zk://127.0.0.1:/dlock",
		"zk://127.0.0.1:2181,:2182/dlock",
		"zk://127.0.0.1:2181,,127.0.0.1:2182/dlock",
	}
	open := func(ctx context.Context, u *url.URL) (*zkdriver.Driver, error) { return zkdriver.Open(ctx, u, nil) }
	dlocktest.OpenURLRefuses(t, open, urls...)
	dlocktest.RootOpenNotUnavailable(t, urls...)
}
