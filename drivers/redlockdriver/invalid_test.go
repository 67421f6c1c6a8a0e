package redlockdriver_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/drivers/redlockdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestOpen_InvalidURLIsInvalidArgument: URLs the driver refuses, and URLs
// whose credentials or database number every node refuses, match
// driver.ErrInvalidArgument, never driver.ErrUnavailable.
func TestOpen_InvalidURLIsInvalidArgument(t *testing.T) {
	rs := testservers.StartRedisN(t, 3)
	hosts := rs[0].Addr() + "," + rs[1].Addr() + "," + rs[2].Addr()
	urls := []string{
		"redlock://" + rs[0].Addr() + "," + rs[1].Addr(),
		"redlock://127.0.0.1:99999," + rs[1].Addr() + "," + rs[2].Addr(),
		"redlock://" + hosts + "?db=x",
		"redlock://" + hosts + "?db=-1",
		"redlock://" + hosts + "?node_timeout=soon",
		"redlock://" + hosts + "?no_such=1",
		"redlock://" + hosts + "?db=99",               // beyond each node's 16 databases
		"redlock://nobody:secret@" + hosts,            // a user no node knows
		"redis://" + strings.SplitN(hosts, ",", 2)[0], // another scheme
		// No node defaults its host or port (issue 13 F5).
		"redlock://",
		"redlock://:" + strconv.Itoa(rs[0].Port()) + "," + rs[1].Addr() + "," + rs[2].Addr(),
		"redlock://127.0.0.1," + rs[1].Addr() + "," + rs[2].Addr(),
		"redlock://127.0.0.1:," + rs[1].Addr() + "," + rs[2].Addr(),
		"redlock://" + rs[0].Addr() + ",," + rs[1].Addr() + "," + rs[2].Addr(),
	}
	dlocktest.OpenURLRefuses(t, redlockdriver.Open, urls...)
	dlocktest.RootOpenNotUnavailable(t, urls...)
}

// TestOpen_NodesNotRedisIsInvalidArgument (issue 13 F6): when enough nodes
// of a redlock:// URL point at servers that answer but do not speak Redis's
// protocol (here plain HTTP/1.1 servers) that no majority is possible, Open
// returns driver.ErrInvalidArgument saying so, never driver.ErrUnavailable,
// and the root package with WithFailOpen gives no lease.
func TestOpen_NodesNotRedisIsInvalidArgument(t *testing.T) {
	r := testservers.StartRedis(t)
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello\n") })
	h1, h2 := httptest.NewServer(handler), httptest.NewServer(handler)
	defer h1.Close()
	defer h2.Close()
	raw := "redlock://" + r.Addr() + "," + strings.TrimPrefix(h1.URL, "http://") + "," + strings.TrimPrefix(h2.URL, "http://")
	errs := dlocktest.OpenURLRefuses(t, redlockdriver.Open, raw)
	if errs[0] != nil && !strings.Contains(errs[0].Error(), "does not speak the Redis protocol (is it Redis?)") {
		t.Errorf("Open(%q) = %q; want it to say the nodes are not Redis", raw, errs[0])
	}
	l, err := dlock.Open(t.Context(), raw)
	if err == nil {
		ls, aerr := l.TryAcquire(t.Context(), "k", dlock.WithFailOpen())
		_ = l.Close()
		if aerr == nil {
			t.Fatalf("root TryAcquire with WithFailOpen: a lease (degraded %v), want an error", ls.Degraded())
		}
		err = aerr
	}
	if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("root = %v; want ErrInvalidArgument, not ErrUnavailable", err)
	}
}
