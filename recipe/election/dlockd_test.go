package election_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	_ "github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/recipe/election"
	"github.com/dlock-dev/dlock/server/servertest"
)

// dlockdLockers starts an embedded dlockd (durable: fsync on) and returns
// n Lockers on it, each over its own driver (its own session and Watch
// stream) wrapped in a FaultDriver.
func dlockdLockers(t *testing.T, n int) ([]*dlock.Locker, []*dlocktest.FaultDriver) {
	t.Helper()
	srv := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	var ls []*dlock.Locker
	var fs []*dlocktest.FaultDriver
	for range n {
		l, fd, err := dlocktest.OpenFaulty(t.Context(), "dlockd://"+srv.Addr(),
			dlock.WithBackoff(time.Millisecond, 20*time.Millisecond), dlock.WithOpTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
		fs = append(fs, fd)
	}
	return ls, fs
}

func TestElection_500Rounds_Dlockd(t *testing.T) {
	ls, fs := dlockdLockers(t, 3)
	start := time.Now()
	h := runRounds(t, ls, fs, roundsConfig{rounds: 500, ttl: 150 * time.Millisecond, pauseEvery: 15})
	t.Logf("dlockd: %v", time.Since(start))
	if h.pauses == 0 {
		t.Error("no leadership was paused")
	}
}

func TestElection_Dlockd_LeaderAndObserve(t *testing.T) {
	ls, _ := dlockdLockers(t, 2)
	ctx := t.Context()
	ch, err := election.Observe(ctx, ls[1], "dlockd-observe", election.WithPollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	nextLeader(t, ch, election.LeaderInfo{}, 5*time.Second)
	var last uint64
	for i := range 3 {
		value := fmt.Sprintf("node-%d", i)
		lead, err := election.Campaign(ctx, ls[i%2], "dlockd-observe", value, dlock.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if lead.Term() <= last {
			t.Fatalf("term %d not greater than %d", lead.Term(), last)
		}
		last = lead.Term()
		got, err := election.Leader(ctx, ls[(i+1)%2], "dlockd-observe")
		if err != nil || got != (election.LeaderInfo{Value: value, Term: lead.Term()}) {
			t.Fatalf("Leader = %+v, %v; want %q term %d", got, err, value, lead.Term())
		}
		nextLeader(t, ch, got, 5*time.Second)
		if err := lead.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		nextLeader(t, ch, election.LeaderInfo{}, 5*time.Second)
	}
}
