package redlockdriver_test

import (
	"strconv"
	"strings"
	"testing"

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
