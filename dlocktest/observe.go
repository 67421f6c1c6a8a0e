package dlocktest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/recipe/election"
)

// CheckObservePushed checks that election.Observe, run from b with a poll
// interval of an hour, learns of each new leader and of each resignation
// within 5 s: three campaigns, alternately from a and b, each resigned. It
// passes only on a store whose driver pushes key changes
// (driver.KeyWatcher: dlockd, etcd, ZooKeeper), since a polled Observe
// would not look again within the test. Terms must strictly increase. a and
// b are two Lockers on the store (two processes); the caller closes them.
func CheckObservePushed(t *testing.T, a, b *dlock.Locker) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	name := fmt.Sprintf("leader/%d", time.Now().UnixNano())
	ch, err := election.Observe(ctx, b, name, election.WithPollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := func(w election.LeaderInfo) {
		t.Helper()
		timer := time.NewTimer(5 * time.Second)
		defer timer.Stop()
		for {
			select {
			case got, ok := <-ch:
				if !ok {
					t.Fatal("Observe channel closed")
				}
				if got == w {
					return
				}
			case <-timer.C:
				t.Fatalf("Observe did not deliver %+v in 5 s", w)
			}
		}
	}
	want(election.LeaderInfo{})
	ls := []*dlock.Locker{a, b}
	var last uint64
	for i := range 3 {
		v := fmt.Sprintf("node-%d", i)
		lead, err := election.Campaign(ctx, ls[i%2], name, v, dlock.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if lead.Term() <= last {
			t.Fatalf("term %d not greater than %d", lead.Term(), last)
		}
		last = lead.Term()
		want(election.LeaderInfo{Value: v, Term: lead.Term()})
		if err := lead.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		want(election.LeaderInfo{})
	}
	cancel()
	for range ch {
	}
}
