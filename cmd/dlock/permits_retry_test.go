package main_test

import (
	"testing"

	"github.com/dlock-dev/dlock/server/servertest"
)

// TestRun_PermitsWaitRetriesStoreThatComesUp: `run --permits N --wait`
// retries a store that cannot be reached for the whole wait, as a plain
// --wait does (it exited 69 at its first store error: each slot's attempt
// had no retry budget and the slot loop gave up on anything but "held").
func TestRun_PermitsWaitRetriesStoreThatComesUp(t *testing.T) {
	p := servertest.StartProcess(t)
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	testComesUp(t, "dlockd://"+p.Addr(), []string{"--permits", "2", "--wait", "--wait-timeout", "60s"}, p.Start)
}
